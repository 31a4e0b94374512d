//! CPU tests of the reference against hand-computed values, one per branch of the rules in docs/math/lrp.md, and of the
//! shape rules the GPU launcher shares.
use super::reference as r;
use super::*;
use crate::Error;

fn t(data: &[f32], shape: &[usize]) -> HostTensor {
    HostTensor::new(data.to_vec(), shape, DType::F32).unwrap()
}

/// One row, one output: `x`, `W = [w]`, bias `b`, relevance 1 for that output.
fn one(x: &[f32], w: &[f32], b: Option<f32>, act: Activation) -> Vec<f32> {
    let n = x.len();
    let bias = b.map(|v| t(&[v], &[1]));
    r::relevance(
        &t(x, &[1, n]),
        &t(&[1.0], &[1, 1]),
        &t(w, &[1, n]),
        bias.as_ref(),
        &act,
    )
    .unwrap()
    .data
}

fn close(got: &[f32], want: &[f64]) {
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert!(
            (*g as f64 - w).abs() <= 1e-6 * w.abs().max(1.0),
            "{got:?} vs {want:?}"
        );
    }
}

fn mono(lower: Option<f32>, upper: Option<f32>) -> Activation {
    Activation {
        kind: Kind::Mono,
        lower,
        upper,
        func: Func::Identity,
    }
}

fn non_mono(func: Func) -> Activation {
    Activation {
        kind: Kind::NonMono,
        lower: None,
        upper: None,
        func,
    }
}

#[test]
fn unsaturated_split_is_abs_contribution_over_total() {
    // c = [1, -2, -2]: P = 1, N = 4, Pa = 1/5, Na = 4/5: [1 * 1/5, 2/4 * 4/5, 2/4 * 4/5].
    close(
        &one(
            &[1.0, 2.0, -1.0],
            &[1.0, -1.0, 2.0],
            None,
            Activation::null(),
        ),
        &[0.2, 0.4, 0.4],
    );
    // A zero contribution gets nothing.
    close(
        &one(
            &[0.0, 2.0, 3.0],
            &[5.0, -1.0, 1.0],
            None,
            Activation::null(),
        ),
        &[0.0, 0.4, 0.6],
    );
}

#[test]
fn mono_low_saturation_zeroes_p() {
    // c = [0.5, -3, -2]: P = 0.5, N = 5, T = -4.5 < -2 -> P = 0 -> P' = 1: |c| / (1 + 5).
    let (x, w) = ([0.5f32, 3.0, -1.0], [1.0f32, -1.0, 2.0]);
    close(
        &one(&x, &w, None, Activation::tanh()),
        &[0.5 / 6.0, 3.0 / 6.0, 2.0 / 6.0],
    );
    // Without saturation the denominator is P + N = 5.5.
    close(
        &one(&x, &w, None, Activation::null()),
        &[0.5 / 5.5, 3.0 / 5.5, 2.0 / 5.5],
    );
    // At the bound exactly nothing saturates (strict comparison).
    close(
        &one(&x, &w, None, mono(Some(-4.5), None)),
        &[0.5 / 5.5, 3.0 / 5.5, 2.0 / 5.5],
    );
}

#[test]
fn mono_high_saturation_zeroes_n() {
    // c = [3, 2, -0.5]: P = 5, N = 0.5, T = 4.5 > 2 -> N = 0 -> N' = 1: |c| / 6.
    let (x, w) = ([3.0f32, -2.0, -0.5], [1.0f32, -1.0, 1.0]);
    close(
        &one(&x, &w, None, Activation::tanh()),
        &[0.5, 2.0 / 6.0, 0.5 / 6.0],
    );
    // relu (lower 0 only) does not clamp the top.
    close(
        &one(&x, &w, None, Activation::relu()),
        &[3.0 / 5.5, 2.0 / 5.5, 0.5 / 5.5],
    );
}

#[test]
fn bias_enters_the_denominator_and_the_bounds() {
    // c = [1, -2, -2], b = 1: pb = 1, D = 1 + 4 + 1 = 6.
    let (x, w) = ([1.0f32, 2.0, -1.0], [1.0f32, -1.0, 2.0]);
    close(
        &one(&x, &w, Some(1.0), Activation::null()),
        &[1.0 / 6.0, 2.0 / 6.0, 2.0 / 6.0],
    );
    // b = -1: nb = 1, same denominator.
    close(
        &one(&x, &w, Some(-1.0), Activation::null()),
        &[1.0 / 6.0, 2.0 / 6.0, 2.0 / 6.0],
    );
    // T = 1 + 3 - 4 = 0 with b = 3: inside [-2, 2]; without bias T = -3 saturates. With b = 3 and
    // the tanh preset nothing saturates: D = 1 + 4 + 3 = 8.
    close(
        &one(&x, &w, Some(3.0), Activation::tanh()),
        &[1.0 / 8.0, 2.0 / 8.0, 2.0 / 8.0],
    );
    // b = -3: T = 1 - 4 - 3 = -6 < -2: P' = 1, D = 1 + 4 + 3 = 8 again, positive part 1/1 * Pa.
    let pa = ((1.0 + 0.0) / 8.0) * (1.0 / 1.0);
    let na = ((4.0 + 3.0) / 8.0) * (4.0 / 7.0);
    close(
        &one(&x, &w, Some(-3.0), Activation::tanh()),
        &[pa, 2.0 / 4.0 * na, 2.0 / 4.0 * na],
    );
}

#[test]
fn p_or_n_zero_is_stabilised_to_one() {
    // Only negative contributions: P = 0 -> P' = 1, N = 6, D = 7: |c| / 7.
    close(
        &one(&[1.0, 2.0], &[-2.0, -2.0], None, Activation::null()),
        &[2.0 / 7.0, 4.0 / 7.0],
    );
    // Only positive: N' = 1.
    close(
        &one(&[1.0, 2.0], &[2.0, 2.0], None, Activation::null()),
        &[2.0 / 7.0, 4.0 / 7.0],
    );
    // All zero: nothing to share.
    close(
        &one(&[0.0, 2.0], &[1.0, 0.0], None, Activation::null()),
        &[0.0, 0.0],
    );
    // P = N = 0 with a bias: still zero relevance in.
    close(&one(&[0.0], &[1.0], Some(5.0), Activation::tanh()), &[0.0]);
}

#[test]
fn non_mono_ties_zero_the_other_side() {
    // tanh: c = [30, -2]: T = 28, tanh(28) == tanh(30) == 1 exactly -> N = 0, N' = 1: |c| / 31.
    close(
        &one(&[30.0, 2.0], &[1.0, -1.0], None, non_mono(Func::Tanh)),
        &[30.0 / 31.0, 2.0 / 31.0],
    );
    // Without activation information the denominator is 32.
    close(
        &one(&[30.0, 2.0], &[1.0, -1.0], None, Activation::null()),
        &[30.0 / 32.0, 2.0 / 32.0],
    );
    // t == n: c = [2, -30], T = -28, tanh(-28) == tanh(-30) == -1 -> P = 0, P' = 1: |c| / 31.
    close(
        &one(&[2.0, 30.0], &[1.0, -1.0], None, non_mono(Func::Tanh)),
        &[2.0 / 31.0, 30.0 / 31.0],
    );
    // No tie away from saturation: identity with N > 0.
    close(
        &one(&[3.0, 1.0], &[1.0, -1.0], None, non_mono(Func::Identity)),
        &[0.75, 0.25],
    );
}

#[test]
fn saturation_rules_branch_by_branch() {
    let s = |act: &Activation, p, n, pb, nb| r::saturate(act, p, n, pb, nb);
    // Null: untouched even far outside any range.
    assert_eq!(s(&Activation::null(), 100.0, 1.0, 0.0, 0.0), (100.0, 1.0));
    // Mono: low, high, inside, missing bounds.
    assert_eq!(s(&Activation::tanh(), 1.0, 4.0, 0.0, 0.0), (0.0, 4.0));
    assert_eq!(s(&Activation::tanh(), 4.0, 1.0, 0.0, 0.0), (4.0, 0.0));
    assert_eq!(s(&Activation::tanh(), 2.0, 1.0, 0.0, 0.0), (2.0, 1.0));
    assert_eq!(s(&mono(None, None), 100.0, 1.0, 0.0, 0.0), (100.0, 1.0));
    // Non-mono identity: T == P + pb exactly in f64 when N is below half an ulp of P.
    assert_eq!(
        s(&non_mono(Func::Identity), 1e17, 2.0, 0.0, 0.0),
        (1e17, 0.0)
    );
    // t == n for identity needs P + pb below half an ulp of N + nb.
    assert_eq!(
        s(&non_mono(Func::Identity), 2.0, 1e17, 0.0, 0.0),
        (0.0, 1e17)
    );
    // Ties only when both P > 0 and N > 0 (after the clamps).
    assert_eq!(s(&non_mono(Func::Tanh), 30.0, 0.0, 0.0, 0.0), (30.0, 0.0));
    // hard_sigmoid saturates at 1 past x = 2.5: T = 3, P + pb = 4 -> tie -> N = 0.
    assert_eq!(
        s(&non_mono(Func::HardSigmoid), 4.0, 1.0, 0.0, 0.0),
        (4.0, 0.0)
    );
    // ... and at 0 below -2.5: T = -3, -(N + nb) = -4 -> t == n -> P = 0.
    assert_eq!(
        s(&non_mono(Func::HardSigmoid), 1.0, 4.0, 0.0, 0.0),
        (0.0, 4.0)
    );
    // Pulse is even: t == p is checked first, so pulse(T) == pulse(P + pb) wins over t == n.
    assert_eq!(s(&non_mono(Func::Pulse), 40.0, 20.0, 0.0, 0.0), (40.0, 0.0));
    // Clamps apply before ties: T = -3 < -2 zeroes P, so no tie test.
    let nm_range = Activation {
        kind: Kind::NonMono,
        lower: Some(-2.0),
        upper: Some(2.0),
        func: Func::Tanh,
    };
    assert_eq!(s(&nm_range, 1.0, 4.0, 0.0, 0.0), (0.0, 4.0));
    // Bias shifts T: P = 1, N = 4, pb = 4 -> T = 1 inside [-2, 2].
    assert_eq!(s(&Activation::tanh(), 1.0, 4.0, 4.0, 0.0), (1.0, 4.0));
}

#[test]
fn activation_functions_at_known_points() {
    let ln3 = 3f64.ln();
    let ath = 0.5f64.atanh();
    let e = std::f64::consts::E;
    let cases: [(Func, f64, f64); 16] = [
        (Func::Identity, 2.5, 2.5),
        (Func::Identity, -1.0, -1.0),
        (Func::Sigmoid, 0.0, 0.5),
        (Func::Sigmoid, ln3, 0.75),
        (Func::Swish, 0.0, 0.0),
        (Func::Swish, 4.0 / 3.0 * ln3, ln3),
        (Func::Wave, 0.0, 0.0),
        (Func::Wave, 1.0, e / (1.0 / e + e)),
        (Func::Pulse, 0.0, 1.0),
        (Func::Pulse, ath, 0.75),
        (Func::Absolute, ath, 0.5 * ath),
        (Func::Absolute, -ath, 0.5 * ath),
        (Func::HardSigmoid, -3.0, 0.0),
        (Func::HardSigmoid, 1.0, 0.7),
        (Func::HardSigmoid, 3.0, 1.0),
        (Func::Tanh, ath, 0.5),
    ];
    for (f, x, want) in cases {
        assert!(
            (f.eval(x) - want).abs() < 1e-14,
            "{f:?}({x}) = {} vs {want}",
            f.eval(x)
        );
    }
}

/// Tiny deterministic generator for CPU tests (no seed to replay: fixed).
fn lcg(state: &mut u64) -> f32 {
    *state = state
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    ((*state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

#[test]
fn conservation_identity_holds_without_saturation() {
    let (rows, ni, no) = (3usize, 17usize, 5usize);
    let mut s = 7u64;
    let mut v = |n: usize| (0..n).map(|_| lcg(&mut s)).collect::<Vec<f32>>();
    let (x, w, b, rel) = (v(rows * ni), v(no * ni), v(no), v(rows * no));
    let (x, w, b, rel) = (
        t(&x, &[rows, ni]),
        t(&w, &[no, ni]),
        t(&b, &[no]),
        t(&rel, &[rows, no]),
    );
    let rin = r::relevance(&x, &rel, &w, Some(&b), &Activation::null()).unwrap();
    for row in 0..rows {
        let got: f64 = rin.data[row * ni..(row + 1) * ni]
            .iter()
            .map(|&v| v as f64)
            .sum();
        let mut want = 0.0;
        for j in 0..no {
            let (mut p, mut n) = (0.0f64, 0.0f64);
            for i in 0..ni {
                let c = x.data[row * ni + i] as f64 * w.data[j * ni + i] as f64;
                p += c.max(0.0);
                n += (-c).max(0.0);
            }
            let bj = b.data[j] as f64;
            want += rel.data[row * no + j] as f64 * (p + n) / (p + n + bj.abs());
        }
        assert!(
            (got - want).abs() < 1e-6 * want.abs().max(1.0),
            "row {row}: {got} vs {want}"
        );
    }
}

#[test]
fn positive_and_negative_coefficients_agree() {
    // The GPU merges Pa/P' and Na/N' into one coefficient: both are 1 / (P' + N' + pb + nb).
    let mut s = 11u64;
    for _ in 0..10_000 {
        let mut v = || (lcg(&mut s) as f64 + 1.0) * 10.0;
        let (p, n, b) = (v(), v(), v() - 10.0);
        let zero = (s >> 20) % 4;
        let (p, n) = (
            if zero == 1 { 0.0 } else { p },
            if zero == 2 { 0.0 } else { n },
        );
        let (pp, nn, pa, na) = r::aggregate(p, n, b.max(0.0), (-b).max(0.0));
        let (cp, cn) = (pa / pp, na / nn);
        let d = 1.0 / (pp + nn + b.abs());
        assert!(
            (cp - cn).abs() <= 4e-15 * d && (cp - d).abs() <= 4e-15 * d,
            "{p} {n} {b}"
        );
    }
}

#[test]
fn rows_are_independent_and_leading_dims_flatten() {
    let mut s = 3u64;
    let mut v = |n: usize| (0..n).map(|_| lcg(&mut s)).collect::<Vec<f32>>();
    let (x, w, rel) = (v(2 * 3 * 4), v(5 * 4), v(2 * 3 * 5));
    let act = Activation::sigmoid();
    let all = r::relevance(
        &t(&x, &[2, 3, 4]),
        &t(&rel, &[2, 3, 5]),
        &t(&w, &[5, 4]),
        None,
        &act,
    )
    .unwrap();
    assert_eq!(all.shape, vec![2, 3, 4]);
    for row in 0..6 {
        let one = r::relevance(
            &t(&x[row * 4..row * 4 + 4], &[1, 4]),
            &t(&rel[row * 5..row * 5 + 5], &[1, 5]),
            &t(&w, &[5, 4]),
            None,
            &act,
        )
        .unwrap();
        assert_eq!(&all.data[row * 4..row * 4 + 4], one.data.as_slice());
    }
}

#[test]
fn ambiguity_flags_only_near_decisions() {
    let act = Activation::tanh();
    // T = -2 + 1e-9: inside by less than the margin.
    assert!(r::ambiguous(&act, 1.0, 3.0 - 1e-9, 0.0, 0.0, 1e-6));
    assert!(!r::ambiguous(&act, 1.0, 2.0, 0.0, 0.0, 1e-6));
    assert!(!r::ambiguous(&Activation::null(), 1.0, 3.0, 0.0, 0.0, 1e-6));
    // Saturated ties stay ties under perturbation.
    assert!(!r::ambiguous(
        &non_mono(Func::Tanh),
        30.0,
        2.0,
        0.0,
        0.0,
        1e-6
    ));
}

#[test]
fn shapes_and_bounds_are_validated() {
    let act = Activation::null();
    let x = t(&[1.0; 6], &[2, 3]);
    let w = t(&[1.0; 12], &[4, 3]);
    let rel = t(&[1.0; 8], &[2, 4]);
    assert!(r::relevance(&x, &rel, &w, None, &act).is_ok());
    // x's I vs W's I.
    let e = r::relevance(&t(&[1.0; 4], &[2, 2]), &rel, &w, None, &act).unwrap_err();
    assert!(
        matches!(e, Error::Shape { .. }) && e.to_string().contains("in_features"),
        "{e}"
    );
    // relevance_out's O vs W's O, and its leading dims vs x's.
    let e = r::relevance(&x, &t(&[1.0; 6], &[2, 3]), &w, None, &act).unwrap_err();
    assert!(
        matches!(e, Error::Shape { .. }) && e.to_string().contains("[2, 4]"),
        "{e}"
    );
    let e = r::relevance(&x, &t(&[1.0; 4], &[1, 4]), &w, None, &act).unwrap_err();
    assert!(matches!(e, Error::Shape { .. }), "{e}");
    // Bias length.
    let e = r::relevance(&x, &rel, &w, Some(&t(&[0.0; 3], &[3])), &act).unwrap_err();
    assert!(
        matches!(e, Error::Shape { .. }) && e.to_string().contains("bias"),
        "{e}"
    );
    // Weight rank.
    let e = r::relevance(&x, &rel, &t(&[1.0; 12], &[12]), None, &act).unwrap_err();
    assert!(matches!(e, Error::Shape { .. }), "{e}");
    // Bounds.
    let bad = Activation {
        kind: Kind::Mono,
        lower: Some(2.0),
        upper: Some(-2.0),
        func: Func::Tanh,
    };
    let e = r::relevance(&x, &rel, &w, None, &bad).unwrap_err();
    assert!(
        matches!(e, Error::Invalid { .. }) && e.to_string().contains("lower 2 > upper -2"),
        "{e}"
    );
    let nan = Activation {
        lower: Some(f32::NAN),
        ..Activation::tanh()
    };
    assert!(matches!(nan.validate("t"), Err(Error::Invalid { .. })));
    assert!(
        Activation::tanh().validate("t").is_ok()
            && mono(Some(1.0), Some(1.0)).validate("t").is_ok()
    );
}

#[test]
fn split_k_depends_on_shape_only_and_covers_the_depth() {
    for &(m, n, k) in &[
        (1u64, 1u64, 1u64),
        (64, 4096, 4096),
        (1024, 4096, 4096),
        (3, 5, 8191),
        (4096, 8192, 17),
    ] {
        let (splits, kps) = gpu::params::lrp::split_k(m, n, k);
        assert!(
            (1..=gpu::params::lrp::MAX_SPLITS).contains(&splits),
            "{m} {n} {k}"
        );
        assert_eq!(kps % gpu::params::lrp::BK, 0);
        assert!(
            splits * kps >= k && (splits - 1) * kps < k,
            "{m} {n} {k}: every split non-empty"
        );
    }
    assert_eq!(gpu::params::lrp::split_k(1024, 4096, 4096).0, 1);
    let (splits, _) = gpu::params::lrp::split_k(64, 4096, 4096);
    assert!(
        splits * 32 >= gpu::params::lrp::TARGET_BLOCKS,
        "R=64 fills the target grid: {splits}"
    );
}

#[test]
fn mlp_reference_chains_layers() {
    let mut s = 5u64;
    let mut v = |n: usize| (0..n).map(|_| lcg(&mut s)).collect::<Vec<f32>>();
    let layers = [
        r::HostLayer::new(
            t(&v(6 * 4), &[6, 4]),
            Some(t(&v(6), &[6])),
            Nonlinearity::Tanh,
        ),
        r::HostLayer::new(t(&v(3 * 6), &[3, 6]), None, Nonlinearity::Softmax),
    ];
    let x = t(&v(2 * 4), &[2, 4]);
    let (acts, rels) = r::explain(&layers, &x, None).unwrap();
    assert_eq!(acts.len(), 3);
    assert_eq!(rels.len(), 3);
    assert_eq!(rels[0].shape, vec![2, 4]);
    assert_eq!(rels[2], acts[2]);
    for row in acts[2].data.chunks(3) {
        assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    }
    let r1 = r::relevance(
        &acts[1],
        &rels[2],
        &layers[1].weight,
        None,
        &Activation::softmax(),
    )
    .unwrap();
    assert_eq!(r1, rels[1]);
}

/// The GPU's algebra, step for step in f32/f64 on the CPU: split-K `A = sum |x||w|`, `S = sum x w` (fma,
/// depth order within a split, splits added in order), `P = (A+S)/2`, `N = (A-S)/2`, the merged f64
/// coefficient, `relevance_in = |x| * sum_j coef |W|`. Checks the transformation, not the kernels.
fn emulate(
    rows: usize,
    ni: usize,
    no: usize,
    x: &[f32],
    w: &[f32],
    b: Option<&[f32]>,
    rel: &[f32],
    act: &Activation,
) -> Vec<f32> {
    let (s1, k1) = gpu::params::lrp::split_k(rows as u64, no as u64, ni as u64);
    let (s1, k1) = (s1 as usize, k1 as usize);
    let mut coef = vec![0.0f32; rows * no];
    for r in 0..rows {
        for j in 0..no {
            let (mut at, mut st) = (0.0f32, 0.0f32);
            for s in 0..s1 {
                let (mut a, mut sm) = (0.0f32, 0.0f32);
                for i in s * k1..((s + 1) * k1).min(ni) {
                    let (xv, wv) = (x[r * ni + i], w[j * ni + i]);
                    a = xv.abs().mul_add(wv.abs(), a);
                    sm = xv.mul_add(wv, sm);
                }
                at += a;
                st += sm;
            }
            let (a, s) = (at as f64, st as f64);
            let (p, n) = (((a + s) * 0.5).max(0.0), ((a - s) * 0.5).max(0.0));
            let bv = b.map_or(0.0, |b| b[j] as f64);
            let (pb, nb) = (bv.max(0.0), (-bv).max(0.0));
            let (p, n) = r::saturate(act, p, n, pb, nb);
            let (pp, nn, pa, na) = r::aggregate(p, n, pb, nb);
            coef[r * no + j] = (rel[r * no + j] as f64 * (0.5 * (pa / pp + na / nn))) as f32;
        }
    }
    let (s2, k2) = gpu::params::lrp::split_k(rows as u64, ni as u64, no as u64);
    let (s2, k2) = (s2 as usize, k2 as usize);
    let mut out = vec![0.0f32; rows * ni];
    for r in 0..rows {
        for i in 0..ni {
            let mut g = 0.0f32;
            for s in 0..s2 {
                let mut acc = 0.0f32;
                for j in s * k2..((s + 1) * k2).min(no) {
                    acc = coef[r * no + j].mul_add(w[j * ni + i].abs(), acc);
                }
                g += acc;
            }
            out[r * ni + i] = x[r * ni + i].abs() * g;
        }
    }
    out
}

#[test]
fn gpu_algebra_matches_the_reference() {
    let acts = [
        Activation::null(),
        Activation::tanh(),
        Activation::sigmoid(),
        Activation::relu(),
        Activation::softmax(),
        non_mono(Func::Tanh),
        non_mono(Func::Pulse),
        Activation {
            kind: Kind::NonMono,
            lower: Some(-3.0),
            upper: Some(3.0),
            func: Func::Swish,
        },
        non_mono(Func::HardSigmoid),
        non_mono(Func::Wave),
        non_mono(Func::Absolute),
        non_mono(Func::Sigmoid),
    ];
    let shapes = [
        (1usize, 1usize, 1usize),
        (3, 4, 5),
        (2, 100, 7),
        (5, 1021, 3),
        (2, 9, 700),
        (1, 1300, 2),
        (17, 33, 65),
    ];
    let mut s = 99u64;
    let (mut flagged, mut total) = (0, 0);
    for (case, &(rows, ni, no)) in shapes.iter().enumerate() {
        for (k, act) in acts.iter().enumerate() {
            let mut v =
                |n: usize, scale: f32| (0..n).map(|_| lcg(&mut s) * scale).collect::<Vec<f32>>();
            let (x, w, b, rel) = (
                v(rows * ni, 2.0),
                v(no * ni, 1.0),
                v(no, 3.0),
                v(rows * no, 1.0),
            );
            let bias = (k % 2 == 0).then(|| t(&b, &[no]));
            let (want, slack) = r::relevance_with_slack(
                &t(&x, &[rows, ni]),
                &t(&rel, &[rows, no]),
                &t(&w, &[no, ni]),
                bias.as_ref(),
                act,
                3e-5,
            )
            .unwrap();
            let got = emulate(
                rows,
                ni,
                no,
                &x,
                &w,
                bias.as_ref().map(|b| b.data.as_slice()),
                &rel,
                act,
            );
            total += 1;
            flagged += slack.iter().any(|&s| s > 0.0) as usize;
            let e = r::slack_rel_err(&got, &want.data, &slack);
            assert!(
                e <= 1e-5,
                "case {case} {act:?} [{rows},{ni}]x[{no}]: rel err {e:.2e}"
            );
        }
    }
    assert!(
        flagged * 4 <= total,
        "{flagged} of {total} cases near a branch decision"
    );
}

/// Variant 3's `cp.async` copies need 16-byte rows: A's rows are `k` floats, B's `k` (`W` as
/// `[N][K]`) or, in the spread pass, `n` (`W` as `[K][N]`); bases 16-byte aligned. Anything else
/// falls back to the default kernel.
#[test]
fn v3_runs_only_on_16_byte_rows() {
    let fits = |pass: Pass, a: u64, b: u64, n: u64, k: u64| pass.v3_rows_fit(a, b, n, k);
    for pass in [Pass::Sums, Pass::Dense, Pass::Spread] {
        assert!(fits(pass, 0, 256, 4096, 4096), "{pass:?}");
        assert!(fits(pass, 4096, 16, 128, 4), "{pass:?}");
        // Depth (A's rows) not a multiple of 4, or an unaligned base.
        assert!(!fits(pass, 0, 0, 4096, 4098), "{pass:?}");
        assert!(!fits(pass, 0, 0, 4096, 4097), "{pass:?}");
        assert!(!fits(pass, 4, 0, 4096, 4096), "{pass:?}");
        assert!(!fits(pass, 0, 8, 4096, 4096), "{pass:?}");
    }
    // B's rows: `n` long only in the spread pass.
    assert!(fits(Pass::Sums, 0, 0, 4097, 4096));
    assert!(fits(Pass::Dense, 0, 0, 30, 4096));
    assert!(!fits(Pass::Spread, 0, 0, 4097, 4096));
    assert!(!fits(Pass::Spread, 0, 0, 30, 4096));
    // The kernels a pass names.
    use GemmVariant::{Staged, V5};
    assert_eq!(Pass::Sums.kernel(Staged), "lrp_sums_f32");
    assert_eq!(Pass::Spread.kernel(Staged), "lrp_spread_f32");
    assert_eq!(Pass::Dense.kernel(Staged), "dense_f32");
    assert_eq!(Pass::Sums.kernel(V5), "lrp_sums_v5_f32");
    assert_eq!(Pass::Spread.kernel(V5), "lrp_spread_v5_f32");
    assert_eq!(Pass::Dense.kernel(V5), "dense_v5_f32");
    // The spread kernel with a fused finish, and when it runs: one split.
    assert_eq!(
        finish_kernel("lrp_spread_v5_f32"),
        Some("lrp_spread_v5_finish_f32")
    );
    assert_eq!(finish_kernel("lrp_spread_f32"), None);
    assert!(finishes_in_epilogue(
        "lrp_spread_v5_f32",
        (1024, 4096, 4096)
    ));
    assert!(!finishes_in_epilogue("lrp_spread_v5_f32", (64, 4096, 4096)));
    assert!(!finishes_in_epilogue("lrp_spread_f32", (1024, 4096, 4096)));
}

/// The GEMM grid covers the output with whole tiles and refuses rows past the grid's y limit by name.
#[test]
fn tile_grid_covers_the_output_and_names_the_dimension_too_large() {
    assert_eq!(tile_grid(1, 1).unwrap(), (1, 1));
    assert_eq!(tile_grid(cfg::BM + 1, cfg::BN * 3).unwrap(), (3, 2));
    let most_rows = cfg::MAX_GRID_Y * cfg::BM;
    assert_eq!(
        tile_grid(most_rows, 1).unwrap(),
        (1, cfg::MAX_GRID_Y as u32)
    );
    match tile_grid(most_rows + 1, 1) {
        Err(Error::TooLarge {
            what: "rows",
            given,
            max,
            ..
        }) => {
            assert_eq!((given, max), (most_rows + 1, most_rows))
        }
        other => panic!("{other:?}"),
    }
}
