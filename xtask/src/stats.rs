//! Statistics for comparing two sets of benchmark samples (std only).
//!
//! # Verdict rule
//!
//! Samples are **latencies** (lower is better). `compare` reports
//!
//! * **Regression** when *all* of these hold:
//!   - `rel_change = median(new) / median(base) - 1 > +th.rel_change`
//!   - Mann-Whitney two-sided `p < th.p_value`
//!   - `|cliffs_delta| >= th.min_abs_delta`
//!   - the bootstrap CI of the relative median difference lies above 0
//!     (`ci_lo > 0`);
//! * **Improvement** symmetrically: `rel_change < -th.rel_change`,
//!   `p < th.p_value`, `|cliffs_delta| >= th.min_abs_delta` and the CI lies
//!   below 0 (`ci_hi < 0`);
//! * **NoChange** otherwise. Any NaN (empty samples, zero base median) makes
//!   its comparison false, so undefined statistics never flag anything.
//!
//! Why each threshold (defaults in [`Thresholds::default`]):
//!
//! * `rel_change = 0.03`: GPU kernel timings routinely wander by 1–2 %
//!   between runs (clocks, thermals, co-tenants); a 3 % median move is the
//!   smallest change that is both practically relevant and above that drift.
//! * `p_value = 0.05`: the conventional false-positive rate for the
//!   Mann-Whitney U test, which is rank-based and so robust to the heavy
//!   right tail (outliers) typical of latency samples.
//! * `min_abs_delta = 0.147`: Cliff's delta below 0.147 is "negligible" in
//!   Romano et al. (2006), whose bounds are 0.147 / 0.33 / 0.474 for
//!   small / medium / large. With many samples a tiny but consistent shift
//!   gets a small p; requiring at least a "small" effect size stops that
//!   from being flagged.
//! * CI excludes 0 (`confidence = 0.95`, `resamples = 2000`): the median
//!   difference itself, not only the rank statistics, must be clearly
//!   non-zero and of the right sign; 2000 percentile-bootstrap resamples keep
//!   the 2.5 % / 97.5 % endpoints stable to well under 1 %.
//!
//! The rel_change sign alone decides the direction, so a slower `new`
//! (higher latency) can only ever be a Regression, never an Improvement.

/// Median of unsorted samples; NaN on empty input.
pub fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    sort_f64(&mut v);
    quantile(&v, 0.5)
}

/// Quantile `q` (clamped to [0, 1]) of already **sorted** samples, with
/// linear interpolation between the closest ranks; NaN on empty input.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() || q.is_nan() {
        return f64::NAN;
    }
    // Position on the 0..n-1 index scale ("type 7" quantile).
    let pos = q.clamp(0.0, 1.0) * (sorted.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    let frac = pos - lo as f64;
    sorted[lo] + (sorted[hi] - sorted[lo]) * frac
}

/// Sort with a total order so NaN cannot make the sort panic or misbehave.
fn sort_f64(v: &mut [f64]) {
    v.sort_unstable_by(|a, b| a.total_cmp(b));
}

/// Cliff's delta = P(new > base) - P(new < base), in [-1, 1].
///
/// Positive means `new` tends to be larger (slower, for latencies). Ties
/// count for neither side. O((n + m) log n): base is sorted once, then each
/// `new` value is located with two binary searches. NaN on empty input.
pub fn cliffs_delta(base: &[f64], new: &[f64]) -> f64 {
    if base.is_empty() || new.is_empty() {
        return f64::NAN;
    }
    let mut b = base.to_vec();
    sort_f64(&mut b);
    let (mut greater, mut less) = (0u64, 0u64);
    for &x in new {
        // Number of base values strictly below x: new > base pairs.
        greater += b.partition_point(|&v| v < x) as u64;
        // Number of base values strictly above x: new < base pairs.
        less += (b.len() - b.partition_point(|&v| v <= x)) as u64;
    }
    let pairs = (b.len() * new.len()) as f64;
    (greater as f64 - less as f64) / pairs
}

/// Result of a Mann-Whitney U test.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MannWhitney {
    /// U of `new`: #(new > base) + 0.5 * #(ties). Related to Cliff's delta
    /// by `delta = 2U / (n*m) - 1`.
    pub u: f64,
    /// Normal-approximation z score (continuity corrected, tie corrected).
    pub z: f64,
    /// Two-sided p value.
    pub p_two_sided: f64,
}

/// Mann-Whitney U test of `new` against `base`.
///
/// Average ranks for ties, tie-corrected variance, normal approximation
/// with a 0.5 continuity correction. All values tied gives z = 0, p = 1.
/// Empty input gives NaN everywhere.
pub fn mann_whitney_u(base: &[f64], new: &[f64]) -> MannWhitney {
    let (n1, n2) = (base.len() as f64, new.len() as f64);
    if base.is_empty() || new.is_empty() {
        let nan = f64::NAN;
        return MannWhitney {
            u: nan,
            z: nan,
            p_two_sided: nan,
        };
    }
    let (rank_sum_new, tie_term) = rank_sum_of_new(base, new);
    let u = rank_sum_new - n2 * (n2 + 1.0) / 2.0;
    let n = n1 + n2;
    let mean = n1 * n2 / 2.0;
    // Var(U) = n1 n2 / 12 * ((N + 1) - sum(t^3 - t) / (N (N - 1))).
    let var = n1 * n2 / 12.0 * ((n + 1.0) - tie_term / (n * (n - 1.0)));
    let z = continuity_corrected_z(u - mean, var);
    let p = erfc(z.abs() / std::f64::consts::SQRT_2).min(1.0);
    MannWhitney {
        u,
        z,
        p_two_sided: p,
    }
}

/// z = (|U - mean| - 0.5) / sd with the sign of U - mean. The correction
/// never crosses zero, and zero variance (all tied) means no evidence: 0.
fn continuity_corrected_z(dev: f64, var: f64) -> f64 {
    if var.is_nan() || var <= 0.0 {
        return 0.0;
    }
    let corrected = (dev.abs() - 0.5).max(0.0);
    corrected.copysign(dev) / var.sqrt()
}

/// Sum of the (average) ranks held by `new` in the pooled sample, and the
/// tie term sum(t^3 - t) over groups of t equal values.
fn rank_sum_of_new(base: &[f64], new: &[f64]) -> (f64, f64) {
    // Pool as (value, is_new) so ranks can be attributed after sorting.
    let mut pooled: Vec<(f64, bool)> = base.iter().map(|&v| (v, false)).collect();
    pooled.extend(new.iter().map(|&v| (v, true)));
    pooled.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));

    let (mut rank_sum, mut tie_term) = (0.0, 0.0);
    let mut start = 0;
    while start < pooled.len() {
        // Find the group [start, end) of equal values.
        let mut end = start + 1;
        while end < pooled.len() && pooled[end].0 == pooled[start].0 {
            end += 1;
        }
        // Ranks are 1-based: the group holds ranks start+1 ..= end.
        let avg_rank = (start + 1 + end) as f64 / 2.0;
        let news_in_group = pooled[start..end].iter().filter(|p| p.1).count();
        rank_sum += avg_rank * news_in_group as f64;
        let t = (end - start) as f64;
        tie_term += t * t * t - t;
        start = end;
    }
    (rank_sum, tie_term)
}

/// Complementary error function, relative error ~1e-13 or better.
///
/// Small |x|: 1 - erf(x) from the Maclaurin series of erf (cancellation
/// costs at most ~3 digits below the switch point). Large x: Laplace's
/// continued fraction (Abramowitz & Stegun 7.1.14),
/// sqrt(pi) e^{x^2} erfc(x) = 1/(x + (1/2)/(x + 1/(x + (3/2)/(x + ...)))),
/// which converges fast there and keeps full relative accuracy in the tail.
pub fn erfc(x: f64) -> f64 {
    if x.is_nan() {
        return f64::NAN;
    }
    if x < 0.0 {
        // Reflection: erfc(-x) = 2 - erfc(x).
        return 2.0 - erfc(-x);
    }
    if x < ERFC_SWITCH {
        1.0 - erf_series(x)
    } else {
        erfc_continued_fraction(x)
    }
}

/// Below this the series is used, above it the continued fraction.
const ERFC_SWITCH: f64 = 2.5;
/// 2 / sqrt(pi).
const TWO_OVER_SQRT_PI: f64 = std::f64::consts::FRAC_2_SQRT_PI;

/// erf(x) = 2/sqrt(pi) * sum_{k>=0} (-1)^k x^(2k+1) / (k! (2k+1)).
fn erf_series(x: f64) -> f64 {
    let x2 = x * x;
    let mut power = x; // (-1)^k x^(2k+1) / k!
    let mut sum = x;
    for k in 1..200 {
        power *= -x2 / k as f64;
        let term = power / (2 * k + 1) as f64;
        sum += term;
        // Stop once terms no longer change the double-precision sum.
        if term.abs() <= 1e-17 * sum.abs() {
            break;
        }
    }
    TWO_OVER_SQRT_PI * sum
}

/// erfc(x) for x >= ERFC_SWITCH, continued fraction evaluated backwards
/// from a fixed depth (stable, no division-by-zero guards needed for x > 0).
fn erfc_continued_fraction(x: f64) -> f64 {
    const DEPTH: u32 = 80;
    let mut tail = x;
    for k in (1..=DEPTH).rev() {
        tail = x + (k as f64 / 2.0) / tail;
    }
    (-x * x).exp() / (std::f64::consts::PI.sqrt() * tail)
}

/// splitmix64 (Steele, Lea & Flood 2014): tiny, fast, and well mixed enough
/// for bootstrap index draws; deterministic for a given seed.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform index in 0..n by multiply-shift (bias ~n / 2^64, negligible).
    fn below(&mut self, n: usize) -> usize {
        ((self.next_u64() as u128 * n as u128) >> 64) as usize
    }
}

/// Percentile-bootstrap CI for median(new) - median(base), in the units of
/// the samples. Each resample draws both groups with replacement,
/// independently. NaN bounds when a group is empty, `resamples` is 0, or
/// `confidence` is not inside (0, 1).
pub fn bootstrap_median_diff_ci(
    base: &[f64],
    new: &[f64],
    resamples: usize,
    confidence: f64,
    seed: u64,
) -> (f64, f64) {
    let usable = !base.is_empty() && !new.is_empty() && resamples > 0;
    let valid_confidence = confidence > 0.0 && confidence < 1.0;
    if !(usable && valid_confidence) {
        return (f64::NAN, f64::NAN);
    }
    let mut rng = SplitMix64(seed);
    // Scratch buffers reused across resamples to avoid reallocating.
    let (mut b, mut n) = (vec![0.0; base.len()], vec![0.0; new.len()]);
    let mut diffs = Vec::with_capacity(resamples);
    for _ in 0..resamples {
        let mb = resampled_median(base, &mut b, &mut rng);
        let mn = resampled_median(new, &mut n, &mut rng);
        diffs.push(mn - mb);
    }
    sort_f64(&mut diffs);
    let alpha = 1.0 - confidence;
    (
        quantile(&diffs, alpha / 2.0),
        quantile(&diffs, 1.0 - alpha / 2.0),
    )
}

/// Fill `buf` (same length as `xs`) with a with-replacement draw from `xs`
/// and return its median.
fn resampled_median(xs: &[f64], buf: &mut [f64], rng: &mut SplitMix64) -> f64 {
    for slot in buf.iter_mut() {
        *slot = xs[rng.below(xs.len())];
    }
    sort_f64(buf);
    quantile(buf, 0.5)
}

/// Outcome for one benchmark, for latency samples (lower is better).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Regression,
    Improvement,
    NoChange,
}

/// Decision thresholds; see the module doc for why each default.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Thresholds {
    /// Minimum |median(new)/median(base) - 1| to flag.
    pub rel_change: f64,
    /// Mann-Whitney two-sided p must be below this.
    pub p_value: f64,
    /// Minimum |Cliff's delta| (0.147 = Romano et al.'s "small").
    pub min_abs_delta: f64,
    /// Bootstrap resamples for the CI.
    pub resamples: usize,
    /// Bootstrap CI confidence level.
    pub confidence: f64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            rel_change: 0.03,
            p_value: 0.05,
            min_abs_delta: 0.147,
            resamples: 2000,
            confidence: 0.95,
        }
    }
}

/// Everything `compare` computed for one benchmark.
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    pub name: String,
    pub base_median: f64,
    pub new_median: f64,
    /// new_median / base_median - 1.
    pub rel_change: f64,
    /// Bootstrap CI of median(new) - median(base), divided by base_median.
    pub ci_lo: f64,
    pub ci_hi: f64,
    /// P(new > base) - P(new < base).
    pub cliffs_delta: f64,
    /// Mann-Whitney two-sided p.
    pub p_value: f64,
    pub verdict: Verdict,
}

/// Fixed bootstrap seed so the same inputs always give the same report.
const BOOTSTRAP_SEED: u64 = 0x5EED_B007_57A7_0001;

/// Compare latency samples of one benchmark; see the module doc for the rule.
pub fn compare(name: &str, base: &[f64], new: &[f64], th: &Thresholds) -> Comparison {
    let base_median = median(base);
    let new_median = median(new);
    let (lo, hi) = bootstrap_median_diff_ci(base, new, th.resamples, th.confidence, BOOTSTRAP_SEED);
    let mut c = Comparison {
        name: name.to_string(),
        base_median,
        new_median,
        rel_change: new_median / base_median - 1.0,
        ci_lo: lo / base_median,
        ci_hi: hi / base_median,
        cliffs_delta: cliffs_delta(base, new),
        p_value: mann_whitney_u(base, new).p_two_sided,
        verdict: Verdict::NoChange,
    };
    c.verdict = verdict(&c, th);
    c
}

/// Apply the rule. Written as positive conditions so NaN fails them all.
fn verdict(c: &Comparison, th: &Thresholds) -> Verdict {
    let significant = c.p_value < th.p_value && c.cliffs_delta.abs() >= th.min_abs_delta;
    // A non-positive (or NaN) base median makes relative numbers meaningless.
    let positive_base = c.base_median > 0.0;
    if !(positive_base && significant) {
        return Verdict::NoChange;
    }
    if c.rel_change > th.rel_change && c.ci_lo > 0.0 {
        Verdict::Regression
    } else if c.rel_change < -th.rel_change && c.ci_hi < 0.0 {
        Verdict::Improvement
    } else {
        Verdict::NoChange
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, rel: f64) -> bool {
        (a - b).abs() <= rel * b.abs().max(f64::MIN_POSITIVE)
    }

    /// Deterministic latency-like samples: `center` with ±3 % uniform noise
    /// and a 1-in-10 chance of a +15 % outlier (the heavy right tail).
    fn samples(center: f64, count: usize, seed: u64) -> Vec<f64> {
        let mut rng = SplitMix64(seed);
        (0..count)
            .map(|_| {
                let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
                let outlier = if rng.below(10) == 0 { 1.15 } else { 1.0 };
                center * (1.0 + 0.06 * (u - 0.5)) * outlier
            })
            .collect()
    }

    #[test]
    fn median_and_quantile() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&[]).is_nan());
        let s = [10.0, 20.0, 30.0, 40.0, 50.0];
        assert_eq!(quantile(&s, 0.0), 10.0);
        assert_eq!(quantile(&s, 1.0), 50.0);
        // pos = 0.1 * 4 = 0.4 -> 10 + 0.4 * 10.
        assert!(close(quantile(&s, 0.1), 14.0, 1e-12));
        assert!(quantile(&[], 0.5).is_nan());
    }

    #[test]
    fn erfc_known_values() {
        let cases = [
            (0.0, 1.0),
            (0.5, 0.4795001221869535),
            (1.0, 0.157299207050285),
            (2.0, 0.004677734981047266),
            (2.5, 0.0004069520174449589),
            (3.0, 2.2090496998585438e-05),
            (5.0, 1.5374597944280351e-12),
            (-1.0, 1.842700792949715),
        ];
        for (x, want) in cases {
            let got = erfc(x);
            assert!(close(got, want, 1e-7), "erfc({x}) = {got}, want {want}");
        }
        assert!(erfc(f64::NAN).is_nan());
        assert_eq!(erfc(40.0), 0.0);
        assert_eq!(erfc(-40.0), 2.0);
    }

    #[test]
    fn mann_whitney_hand_example() {
        // base = [1, 2, 4], new = [3, 5, 6]. Pooled, sorted:
        //   1b 2b 3n 4b 5n 6n -> ranks of new: 3 + 5 + 6 = 14.
        //   U_new = 14 - 3*4/2 = 8 (pairs new > base: 2 + 3 + 3 = 8).
        //   mean = 3*3/2 = 4.5, var = 3*3*(6+1)/12 = 5.25 (no ties).
        //   z = (8 - 4.5 - 0.5) / sqrt(5.25) = 3 / 2.291288 = 1.3093073
        //   p = erfc(z / sqrt 2) = 2 * (1 - Phi(1.3093)) = 0.1904303.
        let r = mann_whitney_u(&[1.0, 2.0, 4.0], &[3.0, 5.0, 6.0]);
        assert_eq!(r.u, 8.0);
        assert!(close(r.z, 1.3093073414159544, 1e-12));
        assert!(close(r.p_two_sided, 0.19043026382552414, 1e-9));
        // Swapping the groups mirrors U and z; p is unchanged.
        let s = mann_whitney_u(&[3.0, 5.0, 6.0], &[1.0, 2.0, 4.0]);
        assert_eq!(s.u, 1.0);
        assert!(close(s.z, -1.3093073414159544, 1e-12));
        assert!(close(s.p_two_sided, r.p_two_sided, 1e-12));
    }

    #[test]
    fn mann_whitney_ties_hand_example() {
        // base = [1, 1, 2], new = [1, 2, 2]. Pooled, sorted:
        //   1b 1b 1n (ranks 1,2,3 -> avg 2), 2b 2n 2n (ranks 4,5,6 -> avg 5).
        //   R_new = 2 + 5 + 5 = 12, U_new = 12 - 3*4/2 = 6.
        //   Ties: two groups of t = 3, sum(t^3 - t) = 24 + 24 = 48.
        //   var = 9/12 * (7 - 48/(6*5)) = 0.75 * 5.4 = 4.05.
        //   z = (6 - 4.5 - 0.5) / sqrt(4.05) = 0.4969040, p = 0.6192568.
        let r = mann_whitney_u(&[1.0, 1.0, 2.0], &[1.0, 2.0, 2.0]);
        assert_eq!(r.u, 6.0);
        assert!(close(r.z, 0.4969039949999533, 1e-12));
        assert!(close(r.p_two_sided, 0.6192567541768621, 1e-9));
    }

    #[test]
    fn mann_whitney_all_tied_and_empty() {
        let r = mann_whitney_u(&[2.0, 2.0], &[2.0, 2.0, 2.0]);
        assert_eq!(r.u, 3.0); // n*m/2: every pair is a tie.
        assert_eq!(r.z, 0.0);
        assert_eq!(r.p_two_sided, 1.0);
        assert!(mann_whitney_u(&[], &[1.0]).p_two_sided.is_nan());
    }

    #[test]
    fn mann_whitney_separated_is_significant() {
        let base: Vec<f64> = (0..20).map(|i| i as f64).collect();
        let new: Vec<f64> = (0..20).map(|i| 100.0 + i as f64).collect();
        let r = mann_whitney_u(&base, &new);
        assert_eq!(r.u, 400.0);
        assert!(r.z > 5.0 && r.p_two_sided < 1e-6);
    }

    #[test]
    fn cliffs_delta_extremes_and_ties() {
        let a = [1.0, 2.0, 3.0];
        let b = [10.0, 11.0, 12.0, 13.0];
        assert_eq!(cliffs_delta(&a, &b), 1.0);
        assert_eq!(cliffs_delta(&b, &a), -1.0);
        assert_eq!(cliffs_delta(&a, &a), 0.0);
        // base [1,1,2], new [1,2,2]: new>base pairs = 0 + 2 + 2 = 4,
        // new<base pairs = 1 + 0 + 0 = 1 (ties count for neither): 3/9.
        assert!(close(
            cliffs_delta(&[1.0, 1.0, 2.0], &[1.0, 2.0, 2.0]),
            1.0 / 3.0,
            1e-15
        ));
        assert!(cliffs_delta(&[], &a).is_nan());
    }

    #[test]
    fn cliffs_delta_matches_u_statistic() {
        // delta = 2U/(n m) - 1 must hold for any data, ties included.
        let base = samples(1.0, 37, 11);
        let mut new = samples(1.01, 23, 12);
        new.extend_from_slice(&base[..5]); // force some exact ties
        let u = mann_whitney_u(&base, &new).u;
        let from_u = 2.0 * u / (base.len() * new.len()) as f64 - 1.0;
        assert!(close(cliffs_delta(&base, &new), from_u, 1e-12));
    }

    #[test]
    fn bootstrap_ci_is_deterministic_and_brackets_shift() {
        let base = samples(1.0, 50, 1);
        let new: Vec<f64> = base.iter().map(|x| x + 0.5).collect();
        let ci = bootstrap_median_diff_ci(&base, &new, 2000, 0.95, 7);
        assert_eq!(ci, bootstrap_median_diff_ci(&base, &new, 2000, 0.95, 7));
        assert!(
            ci.0 < 0.5 && 0.5 < ci.1 && ci.0 > 0.4 && ci.1 < 0.6,
            "{ci:?}"
        );
        let bad = bootstrap_median_diff_ci(&base, &new, 2000, 1.0, 7);
        assert!(bad.0.is_nan() && bad.1.is_nan());
    }

    #[test]
    fn ten_percent_slower_is_regression() {
        let base = samples(0.40, 50, 101);
        let new: Vec<f64> = samples(0.40, 50, 202).iter().map(|x| x * 1.10).collect();
        let c = compare("k", &base, &new, &Thresholds::default());
        assert_eq!(c.verdict, Verdict::Regression, "{c:?}");
        assert!(c.rel_change > 0.05 && c.ci_lo > 0.0 && c.cliffs_delta > 0.474);
    }

    #[test]
    fn ten_percent_faster_is_improvement() {
        let base = samples(0.40, 50, 303);
        let new: Vec<f64> = samples(0.40, 50, 404).iter().map(|x| x * 0.90).collect();
        let c = compare("k", &base, &new, &Thresholds::default());
        assert_eq!(c.verdict, Verdict::Improvement, "{c:?}");
        assert!(c.rel_change < -0.05 && c.ci_hi < 0.0 && c.cliffs_delta < -0.474);
    }

    #[test]
    fn same_distribution_is_no_change() {
        let th = Thresholds::default();
        for seed in 0..20u64 {
            let base = samples(0.40, 50, 1000 + seed);
            let new = samples(0.40, 50, 2000 + seed);
            let c = compare("k", &base, &new, &th);
            assert_eq!(c.verdict, Verdict::NoChange, "seed {seed}: {c:?}");
        }
    }

    #[test]
    fn higher_latency_is_never_improvement() {
        // Across shifts from tiny to large, slower `new` is only ever
        // NoChange or Regression, and large shifts are Regression.
        let th = Thresholds::default();
        for (i, factor) in [1.001, 1.01, 1.02, 1.05, 1.10, 1.5, 3.0].iter().enumerate() {
            let base = samples(1.0, 50, 500 + i as u64);
            let new: Vec<f64> = samples(1.0, 50, 600 + i as u64)
                .iter()
                .map(|x| x * factor)
                .collect();
            let c = compare("k", &base, &new, &th);
            assert_ne!(c.verdict, Verdict::Improvement, "x{factor}: {c:?}");
            if *factor >= 1.10 {
                assert_eq!(c.verdict, Verdict::Regression, "x{factor}: {c:?}");
            }
        }
    }

    #[test]
    fn small_but_consistent_shift_is_not_flagged() {
        // 1 % slower: far below rel_change = 3 %, so NoChange even though
        // with a fully separated (noise-free) sample p would be tiny.
        let base: Vec<f64> = (0..50).map(|i| 1.0 + i as f64 * 1e-5).collect();
        let new: Vec<f64> = base.iter().map(|x| x * 1.01).collect();
        let c = compare("k", &base, &new, &Thresholds::default());
        assert!(c.p_value < 1e-6 && c.cliffs_delta == 1.0);
        assert_eq!(c.verdict, Verdict::NoChange);
    }

    #[test]
    fn degenerate_inputs_are_no_change() {
        let th = Thresholds::default();
        assert_eq!(compare("k", &[], &[1.0], &th).verdict, Verdict::NoChange);
        let zeros = compare("k", &[0.0; 10], &[1.0; 10], &th);
        assert_eq!(zeros.verdict, Verdict::NoChange);
    }
}
