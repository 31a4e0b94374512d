//! GPU attention vs the CPU references (f64 exact and same-precision naive). The rule for every output
//! (O and LSE): `max|out - ref| <= 2 * max|naive - ref| + 1e-5`, where `naive` is
//! `reference::naive_same_precision` in the input dtype; NaN never passes and infinities (LSE of fully
//! masked rows) must match exactly. Outputs are poisoned (NaN) before every launch; seeds are printed.
//! `RGK_FUZZ_CASES=n` runs only the first n cases of each grid (the first six are the sanitizer set).
//!
//! Every shipped FlashAttention kernel runs the whole grid, not only the shapes the default dispatch
//! sends it: the Hopper wgmma kernels (`flash_forward_variant(.., 4 | 5)`, the sm_90 build; SKIP
//! elsewhere) in the `wgmma_*` tests, and the `mma.sync` kernel of the sm_80 build (variant 0) in the
//! `mma_sync_*` tests, on a 9.0 device through a `Build::Portable` handle.
mod common;
use common::*;
use host::ops::attention::{self, AttentionParams, Causal, reference};
use host::{DType, Gpu, HostTensor, Tensor};

#[derive(Clone, Copy, Debug)]
struct Case {
    batch: usize,
    heads: usize,
    seq_q: usize,
    seq_k: usize,
    head_dim: usize,
    causal: Causal,
    dtype: DType,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Path {
    Flash,
    Naive,
    /// `flash_forward_variant(.., v)`: kernel `v` (see `attention::FLASH_VARIANTS`).
    Kernel(u32),
}

/// The wgmma kernels of `flash_forward_variant`: 4 (`cp.async`, P V overlapping softmax, one
/// warpgroup of 64 query rows a CTA, 128-key tiles, D = 64), 5 (warp-specialised: TMA producer, two
/// consumer warpgroups taking turns, D = 64 and 128).
const WGMMA_VARIANTS: [u32; 2] = [4, 5];

const SMALL: [usize; 5] = [1, 17, 97, 128, 200];
const KINDS: [(usize, DType); 4] = [
    (64, DType::F16),
    (128, DType::BF16),
    (128, DType::F16),
    (64, DType::BF16),
];

fn case(b: usize, h: usize, sq: usize, sk: usize, d: usize, causal: Causal, dtype: DType) -> Case {
    Case {
        batch: b,
        heads: h,
        seq_q: sq,
        seq_k: sk,
        head_dim: d,
        causal,
        dtype,
    }
}

/// The FlashAttention grid: six diverse configurations first (the sanitizer set), then every pair of
/// short lengths (incl. Sq != Sk) with both masks at B*H = 3*5, then long and lopsided lengths at
/// B*H = 1*2. Head dim and dtype rotate so each (length pair, mask) meets a different combination and
/// every combination meets every mask.
fn flash_cases() -> Vec<Case> {
    use Causal::{No, Yes};
    use DType::{BF16, F16};
    let mut cases = vec![
        case(2, 3, 97, 200, 64, Yes, F16),
        case(2, 3, 200, 97, 128, Yes, BF16), // rows 0..103 see no key
        case(3, 5, 128, 128, 128, No, F16),
        case(1, 3, 17, 1025, 64, No, BF16),
        case(3, 1, 1, 17, 128, Yes, BF16),
        case(1, 2, 1025, 1025, 64, Yes, F16),
        // 64-row query blocks (wgmma variant 4) just past a block edge; with Sq > Sk under the
        // causal mask the first two 64-row blocks (rows 0..128) see no key at all.
        case(2, 3, 65, 193, 64, Yes, F16),
        case(2, 3, 193, 65, 64, Yes, BF16),
    ];
    let mut n = 0;
    for &sq in &SMALL {
        for &sk in &SMALL {
            for causal in [No, Yes] {
                let (d, dtype) = KINDS[n % 4];
                n += 1;
                cases.push(case(3, 5, sq, sk, d, causal, dtype));
            }
        }
    }
    cases.extend([
        case(1, 2, 2048, 2048, 128, Yes, BF16),
        case(1, 2, 2048, 2048, 64, No, F16),
        case(1, 2, 1025, 2048, 128, No, F16),
        case(1, 2, 2048, 1025, 64, Yes, BF16),
        case(1, 2, 1025, 1025, 128, Yes, F16),
        case(1, 2, 17, 2048, 64, Yes, F16),
        case(1, 2, 2048, 17, 128, No, BF16),
        case(1, 2, 1, 2048, 128, No, BF16),
        case(1, 2, 2048, 1, 64, Yes, F16),
        case(1, 2, 1025, 97, 128, Yes, BF16),
        case(1, 2, 200, 1025, 64, No, BF16),
        case(1, 2, 97, 2048, 128, Yes, F16),
    ]);
    cases
}

/// Q and K uniform in [-2, 2) (scores of a few units: peaked and flat rows both occur), V in [-1, 1).
/// Drawn by SplitMix64 seeded from the test's printed-seed generator: tens of millions of values per
/// test, and a cheap generator keeps that fast in an unoptimised test build.
fn inputs(rng: &mut rand::rngs::StdRng, c: &Case) -> [HostTensor; 3] {
    use rand::Rng;
    let mut state: u64 = rng.random();
    let mut uniform = |shape: &[usize], lo: f32, hi: f32| {
        let n: usize = shape.iter().product();
        let data = (0..n)
            .map(|_| {
                state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let mut z = state;
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                z ^= z >> 31;
                lo + (hi - lo) * ((z >> 40) as f32 * (1.0 / (1u64 << 24) as f32))
            })
            .collect();
        HostTensor::new(data, shape, c.dtype).unwrap()
    };
    let qs = [c.batch, c.heads, c.seq_q, c.head_dim];
    let ks = [c.batch, c.heads, c.seq_k, c.head_dim];
    [
        uniform(&qs, -2.0, 2.0),
        uniform(&ks, -2.0, 2.0),
        uniform(&ks, -1.0, 1.0),
    ]
}

/// max |out - ref|; +inf if `out` has a NaN or an infinity that `ref` does not have at that place.
fn max_abs_err(out: &[f32], reference: &[f32]) -> f64 {
    assert_eq!(
        out.len(),
        reference.len(),
        "output and reference lengths differ"
    );
    let mut worst = 0f64;
    for (&o, &r) in out.iter().zip(reference) {
        if o.is_nan() || r.is_nan() || ((o.is_infinite() || r.is_infinite()) && o != r) {
            return f64::INFINITY;
        }
        if o != r {
            worst = worst.max((o as f64 - r as f64).abs());
        }
    }
    worst
}

/// Where the first element off by more than `bound` (or NaN / a wrong infinity) is, as
/// (flat index, head, row, column) for O (`per_row` = head_dim) or (index, head-row) for LSE.
fn first_bad(out: &[f32], reference: &[f32], bound: f64, head_dim: usize, is_o: bool) -> String {
    let bad = out.iter().zip(reference).position(|(&o, &r)| {
        o.is_nan()
            || r.is_nan()
            || ((o.is_infinite() || r.is_infinite()) && o != r)
            || (o as f64 - r as f64).abs() > bound
    });
    match bad {
        None => "no single element over the bound".into(),
        Some(i) if is_o => format!(
            "first bad element: index {i} (row {} of all heads, column {}): out {} ref {}",
            i / head_dim,
            i % head_dim,
            out[i],
            reference[i]
        ),
        Some(i) => format!(
            "first bad element: row {i} of all heads: out {} ref {}",
            out[i], reference[i]
        ),
    }
}

fn params(c: &Case) -> AttentionParams<'static> {
    AttentionParams {
        causal: c.causal,
        scale: None,
        ..Default::default()
    }
}

fn run(path: Path, gpu: &Gpu, inputs: &[HostTensor; 3], p: &AttentionParams) -> (Tensor, Tensor) {
    let [q, k, v] = inputs
        .each_ref()
        .map(|t| Tensor::from_host(gpu, t).unwrap());
    match path {
        Path::Flash => attention::flash_forward(&q, &k, &v, p),
        Path::Naive => attention::naive_forward(&q, &k, &v, p),
        Path::Kernel(variant) => attention::flash_forward_variant(&q, &k, &v, p, variant),
    }
    .unwrap()
}

/// Runs one case on `path` and applies the correctness rule to O and LSE.
fn check(path: Path, gpu: &Gpu, rng: &mut rand::rngs::StdRng, c: &Case) {
    check_paths(&[path], gpu, rng, c);
}

/// [`check`] for several paths on the same inputs (one CPU reference for all).
fn check_paths(paths: &[Path], gpu: &Gpu, rng: &mut rand::rngs::StdRng, c: &Case) {
    let x = inputs(rng, c);
    let p = params(c);
    let want = reference::forward_and_naive(&x[0], &x[1], &x[2], &p).unwrap();
    for &path in paths {
        if let Path::Kernel(v) = path
            && !attention::flash_variant_supported(gpu, v, c.head_dim)
        {
            continue;
        }
        let (o, lse) = run(path, gpu, &x, &p);
        assert_eq!(o.shape(), &[c.batch, c.heads, c.seq_q, c.head_dim]);
        assert_eq!(lse.shape(), &[c.batch, c.heads, c.seq_q]);
        assert_eq!((o.dtype(), lse.dtype()), (c.dtype, DType::F32));
        for (what, out, exact, naive) in [
            ("O", o.to_vec().unwrap(), &want.exact_o, &want.naive_o),
            (
                "LSE",
                lse.to_vec().unwrap(),
                &want.exact_lse,
                &want.naive_lse,
            ),
        ] {
            let err = max_abs_err(&out, &exact.data);
            let bound = 2.0 * max_abs_err(&naive.data, &exact.data) + 1e-5;
            assert!(
                err <= bound,
                "{path:?} {c:?}: {what} max|out - ref| = {err:.3e} > 2 max|naive - ref| + 1e-5 = {bound:.3e}; {}",
                first_bad(&out, &exact.data, bound, c.head_dim, what == "O")
            );
        }
    }
}

#[test]
fn flash_forward_matches_reference_over_the_grid() {
    let Some(gpu) = gpu_or_skip("flash_forward_matches_reference_over_the_grid") else {
        return;
    };
    let mut rng = rng("flash_grid");
    let cases = flash_cases();
    for c in cases.iter().take(fuzz_cases(cases.len())) {
        check(Path::Flash, &gpu, &mut rng, c);
    }
}

#[test]
fn naive_forward_matches_reference() {
    let Some(gpu) = gpu_or_skip("naive_forward_matches_reference") else {
        return;
    };
    let mut rng = rng("naive_grid");
    use Causal::{No, Yes};
    use DType::{BF16, F16, F32};
    let cases = [
        case(2, 3, 97, 200, 64, Yes, F32),
        case(2, 3, 200, 97, 128, Yes, BF16),
        case(3, 5, 17, 17, 40, No, F16),
        case(1, 2, 1, 1025, 256, No, F32),
        case(1, 1, 300, 1, 7, Yes, F16),
        case(3, 5, 128, 128, 128, No, BF16),
        case(1, 2, 1025, 1025, 64, Yes, F32),
    ];
    for c in cases.iter().take(fuzz_cases(cases.len())) {
        check(Path::Naive, &gpu, &mut rng, c);
    }
}

#[test]
fn flash_forward_is_bit_identical_over_100_runs() {
    let Some(gpu) = gpu_or_skip("flash_forward_is_bit_identical_over_100_runs") else {
        return;
    };
    let mut rng = rng("flash_repeat");
    let c = case(2, 3, 1025, 1025, 128, Causal::Yes, DType::BF16);
    let x = inputs(&mut rng, &c);
    let [q, k, v] = x.each_ref().map(|t| Tensor::from_host(&gpu, t).unwrap());
    let p = params(&c);
    let (o0, l0) = attention::flash_forward(&q, &k, &v, &p).unwrap();
    let (first_o, first_l) = (bits(&o0), bits(&l0));
    for run in 1..fuzz_cases(100) {
        let (o, l) = attention::flash_forward(&q, &k, &v, &p).unwrap();
        assert!(
            bits(&o) == first_o && bits(&l) == first_l,
            "run {run} differs from run 0"
        );
    }
}

#[test]
fn fully_masked_rows_are_zero_not_nan() {
    let Some(gpu) = gpu_or_skip("fully_masked_rows_are_zero_not_nan") else {
        return;
    };
    let mut rng = rng("fully_masked");
    // Causal with seq_q = 200 > seq_k = 17: query i sees key j iff j <= i - 183, so rows 0..183 see
    // nothing (and the first query block of 128 rows sees no key at all: no K tile is loaded).
    for (d, dtype) in KINDS {
        let c = case(2, 3, 200, 17, d, Causal::Yes, dtype);
        let x = inputs(&mut rng, &c);
        for path in [Path::Flash, Path::Naive] {
            let (o, lse) = run(path, &gpu, &x, &params(&c));
            let (o, lse) = (o.to_vec().unwrap(), lse.to_vec().unwrap());
            for head in 0..c.batch * c.heads {
                for i in 0..c.seq_q {
                    let row = head * c.seq_q + i;
                    let out = &o[row * d..(row + 1) * d];
                    assert!(
                        out.iter().all(|v| !v.is_nan()),
                        "{path:?} {c:?}: NaN in row {i}"
                    );
                    if i < 183 {
                        assert!(
                            out.iter().all(|&v| v == 0.0),
                            "{path:?} {c:?}: row {i} not 0"
                        );
                        assert_eq!(
                            lse[row],
                            f32::NEG_INFINITY,
                            "{path:?} {c:?}: LSE of row {i}"
                        );
                    } else {
                        assert!(lse[row].is_finite(), "{path:?} {c:?}: LSE of row {i}");
                    }
                }
            }
        }
    }
}

/// With no keys, every output element is 0 and every LSE is minus infinity.
fn assert_no_keys_output(o: &Tensor, lse: &Tensor) {
    assert!(o.to_vec().unwrap().iter().all(|&v| v == 0.0));
    assert!(
        lse.to_vec()
            .unwrap()
            .iter()
            .all(|&v| v == f32::NEG_INFINITY)
    );
}

#[test]
fn empty_key_sequence_gives_zero_and_minus_infinity() {
    let Some(gpu) = gpu_or_skip("empty_key_sequence_gives_zero_and_minus_infinity") else {
        return;
    };
    let q = Tensor::from_f32(&gpu, &[0.5; 2 * 3 * 64], &[1, 2, 3, 64], DType::F16).unwrap();
    let kv = Tensor::from_f32(&gpu, &[], &[1, 2, 0, 64], DType::F16).unwrap();
    for f in [attention::flash_forward, attention::naive_forward] {
        let (o, lse) = f(&q, &kv, &kv, &AttentionParams::default()).unwrap();
        assert_no_keys_output(&o, &lse);
    }
}

/// `path` with scales 0.5, -0.3 and 0 (all keys equal) against the f64 reference at D = `d`: O and the
/// LSE within twice the naive kernel's error (+1e-5).
fn check_custom_scales(
    path: Path,
    gpu: &Gpu,
    rng: &mut rand::rngs::StdRng,
    d: usize,
    dtype: DType,
    what: &str,
) {
    for scale in [0.5f32, -0.3, 0.0] {
        let c = case(1, 3, 130, 70, d, Causal::No, dtype);
        let x = inputs(rng, &c);
        let p = AttentionParams {
            causal: c.causal,
            scale: Some(scale),
            ..Default::default()
        };
        let (o, lse) = run(path, gpu, &x, &p);
        let want = reference::forward_and_naive(&x[0], &x[1], &x[2], &p).unwrap();
        for (out, exact, naive) in [
            (o.to_vec().unwrap(), &want.exact_o, &want.naive_o),
            (lse.to_vec().unwrap(), &want.exact_lse, &want.naive_lse),
        ] {
            let err = max_abs_err(&out, &exact.data);
            let bound = 2.0 * max_abs_err(&naive.data, &exact.data) + 1e-5;
            assert!(err <= bound, "{what}scale {scale}: {err:.3e} > {bound:.3e}");
        }
    }
}

#[test]
fn custom_scale_is_applied() {
    let Some(gpu) = gpu_or_skip("custom_scale_is_applied") else {
        return;
    };
    let mut rng = rng("custom_scale");
    check_custom_scales(Path::Flash, &gpu, &mut rng, 64, DType::F16, "");
}

#[test]
fn gpu_validation_errors_before_launch() {
    let Some(gpu) = gpu_or_skip("gpu_validation_errors_before_launch") else {
        return;
    };
    let t = |shape: &[usize], dtype| {
        Tensor::from_f32(&gpu, &vec![0.1; shape.iter().product()], shape, dtype).unwrap()
    };
    let p = AttentionParams::default();
    let q = t(&[1, 2, 8, 64], DType::F16);
    // f32 on the flash path.
    let q32 = t(&[1, 2, 8, 64], DType::F32);
    let e = attention::flash_forward(&q32, &q32, &q32, &p).unwrap_err();
    assert!(matches!(e, host::Error::DType { .. }), "{e}");
    // A [B, S, H, D] tensor viewed as [B, H, S, D] runs on the flash path (gpu_attention_layouts
    // tests its values); the naive path wants contiguous operands and says which.
    let bshd = t(&[1, 8, 2, 64], DType::F16).transpose(1, 2).unwrap();
    let e = attention::naive_forward(&bshd, &q, &q, &p).unwrap_err();
    assert!(
        matches!(e, host::Error::NotContiguous { what: "q", .. }),
        "{e}"
    );
    // head_dim not contiguous on the flash path.
    let dt = t(&[1, 2, 64, 64], DType::F16).transpose(2, 3).unwrap();
    let e = attention::flash_forward(&dt, &dt, &dt, &p).unwrap_err();
    assert!(e.to_string().contains("head_dim, is not contiguous"), "{e}");
    // Unsupported head dim (not a multiple of 8).
    let q100 = t(&[1, 2, 8, 100], DType::F16);
    let e = attention::flash_forward(&q100, &q100, &q100, &p).unwrap_err();
    assert!(e.to_string().contains("multiples of 8"), "{e}");
    // Mismatched heads.
    let k3 = t(&[1, 3, 8, 64], DType::F16);
    assert!(attention::flash_forward(&q, &k3, &k3, &p).is_err());
}

/// The GPU when it can run the wgmma kernels (an sm_90 device); otherwise prints SKIP.
fn wgmma_gpu_or_skip(test: &str) -> Option<Gpu> {
    let gpu = gpu_or_skip(test)?;
    if !attention::flash_variant_supported(&gpu, 5, 64) {
        println!(
            "SKIP {test}: the wgmma kernels need an sm_90 device (this one runs the {} build)",
            gpu.ptx_arch()
        );
        return None;
    }
    Some(gpu)
}

/// Every (wgmma kernel, head dim, dtype) of [`KINDS`] the kernel has.
fn wgmma_kinds(gpu: &Gpu) -> Vec<(u32, usize, DType)> {
    WGMMA_VARIANTS
        .into_iter()
        .flat_map(|v| KINDS.map(|(d, dtype)| (v, d, dtype)))
        .filter(|&(v, d, _)| attention::flash_variant_supported(gpu, v, d))
        .collect()
}

/// A handle on the sm_80 build, whose FlashAttention is the `mma.sync` kernel (on an sm_90 device its
/// PTX is JIT-compiled once).
fn portable_gpu_or_skip(test: &str) -> Option<Gpu> {
    gpu_or_skip(test)?;
    let gpu = Gpu::with_build(0, host::Build::Portable).unwrap();
    gpu.set_poison_outputs(true);
    Some(gpu)
}

#[test]
fn mma_sync_flash_forward_matches_reference_over_the_grid() {
    let Some(gpu) = portable_gpu_or_skip("mma_sync_flash_forward_matches_reference_over_the_grid")
    else {
        return;
    };
    let mut rng = rng("mma_sync_flash_grid");
    let cases = flash_cases();
    for c in cases.iter().take(fuzz_cases(cases.len())) {
        check(Path::Kernel(0), &gpu, &mut rng, c);
    }
}

#[test]
fn wgmma_flash_forward_matches_reference_over_the_grid() {
    let Some(gpu) = wgmma_gpu_or_skip("wgmma_flash_forward_matches_reference_over_the_grid") else {
        return;
    };
    let mut rng = rng("wgmma_flash_grid");
    let cases = flash_cases();
    let paths = WGMMA_VARIANTS.map(Path::Kernel);
    for c in cases.iter().take(fuzz_cases(cases.len())) {
        check_paths(&paths, &gpu, &mut rng, c);
    }
    println!("wgmma flash forward: grid ok for kernels {WGMMA_VARIANTS:?}");
}

#[test]
fn wgmma_flash_forward_is_bit_identical_over_100_runs() {
    let Some(gpu) = wgmma_gpu_or_skip("wgmma_flash_forward_is_bit_identical_over_100_runs") else {
        return;
    };
    let mut rng = rng("wgmma_flash_repeat");
    for (variant, c) in WGMMA_VARIANTS.into_iter().flat_map(|variant| {
        [
            (
                variant,
                case(2, 3, 1025, 1025, 128, Causal::Yes, DType::BF16),
            ),
            (variant, case(2, 3, 1025, 1025, 64, Causal::No, DType::F16)),
        ]
    }) {
        if !attention::flash_variant_supported(&gpu, variant, c.head_dim) {
            continue;
        }
        let x = inputs(&mut rng, &c);
        let [q, k, v] = x.each_ref().map(|t| Tensor::from_host(&gpu, t).unwrap());
        let p = params(&c);
        let (o0, l0) = attention::flash_forward_variant(&q, &k, &v, &p, variant).unwrap();
        let (first_o, first_l) = (bits(&o0), bits(&l0));
        for run in 1..fuzz_cases(100) {
            let (o, l) = attention::flash_forward_variant(&q, &k, &v, &p, variant).unwrap();
            let (o, l) = (bits(&o), bits(&l));
            let at = o.iter().zip(&first_o).position(|(a, b)| a != b);
            assert!(
                at.is_none() && l == first_l,
                "wgmma variant {variant} {c:?}: run {run} differs from run 0 (first differing O index {at:?})"
            );
        }
    }
}

#[test]
fn wgmma_fully_masked_rows_and_empty_keys() {
    let Some(gpu) = wgmma_gpu_or_skip("wgmma_fully_masked_rows_and_empty_keys") else {
        return;
    };
    let mut rng = rng("wgmma_fully_masked");
    for (variant, d, dtype) in wgmma_kinds(&gpu) {
        let c = case(2, 3, 200, 17, d, Causal::Yes, dtype);
        let x = inputs(&mut rng, &c);
        let (o, lse) = run(Path::Kernel(variant), &gpu, &x, &params(&c));
        let (o, lse) = (o.to_vec().unwrap(), lse.to_vec().unwrap());
        for head in 0..c.batch * c.heads {
            for i in 0..c.seq_q {
                let row = head * c.seq_q + i;
                let out = &o[row * d..(row + 1) * d];
                assert!(
                    out.iter().all(|v| !v.is_nan()),
                    "wgmma {c:?}: NaN in row {i}"
                );
                if i < 183 {
                    assert!(out.iter().all(|&v| v == 0.0), "wgmma {c:?}: row {i} not 0");
                    assert_eq!(lse[row], f32::NEG_INFINITY, "wgmma {c:?}: LSE of row {i}");
                } else {
                    assert!(lse[row].is_finite(), "wgmma {c:?}: LSE of row {i}");
                }
            }
        }
        let q = Tensor::from_f32(&gpu, &vec![0.5; 2 * 3 * d], &[1, 2, 3, d], dtype).unwrap();
        let kv = Tensor::from_f32(&gpu, &[], &[1, 2, 0, d], dtype).unwrap();
        let (o, lse) =
            attention::flash_forward_variant(&q, &kv, &kv, &AttentionParams::default(), variant)
                .unwrap();
        assert_no_keys_output(&o, &lse);
    }
}

/// A NaN in one key reaches exactly the rows that see it (docs/math/attention.md): under the causal
/// mask, head 0's rows from 150 on (whose O and LSE are all NaN) and head 1's from 131 on; every
/// other row, and all of head 2, keeps the bits of the call without the NaN (the mask replaces a NaN
/// score the row does not see). Keys 150 and 131 sit at offsets 22 and 3 of their 128-key tile: one
/// on the diagonal tile's masked band for rows 128..150, one near its start. Every forward that
/// writes an LSE: the wgmma kernels (sm_90 build), the `mma.sync` kernel (sm_80 build) and the naive
/// path.
#[test]
fn nan_key_reaches_only_the_rows_that_see_it() {
    let Some(gpu) = gpu_or_skip("nan_key_reaches_only_the_rows_that_see_it") else {
        return;
    };
    let portable = portable_build(&gpu);
    let mut rng = rng("nan_key");
    let mut runs: Vec<(Path, &Gpu, usize, DType)> = wgmma_kinds(&gpu)
        .into_iter()
        .map(|(v, d, dtype)| (Path::Kernel(v), &gpu, d, dtype))
        .collect();
    for (d, dtype) in KINDS {
        runs.push((Path::Kernel(0), &portable, d, dtype));
        runs.push((Path::Naive, &gpu, d, dtype));
    }
    for (path, on, d, dtype) in runs {
        let c = case(1, 3, 300, 300, d, Causal::Yes, dtype);
        let clean = inputs(&mut rng, &c);
        let mut with_nan = clean.clone();
        let nan_key = [(0usize, 150usize), (1, 131)];
        for (head, key) in nan_key {
            with_nan[1].data[(head * c.seq_k + key) * d + d / 2] = f32::NAN;
        }
        let (o0, l0) = run(path, on, &clean, &params(&c));
        let (o1, l1) = run(path, on, &with_nan, &params(&c));
        let (o0, l0, o1, l1) = (
            o0.to_vec().unwrap(),
            l0.to_vec().unwrap(),
            o1.to_vec().unwrap(),
            l1.to_vec().unwrap(),
        );
        let what = format!("{path:?} D{d} {dtype:?}");
        for head in 0..c.heads {
            let first_nan_row = nan_key
                .iter()
                .find(|&&(h, _)| h == head)
                .map_or(usize::MAX, |&(_, key)| key);
            for i in 0..c.seq_q {
                let row = head * c.seq_q + i;
                let (out0, out1) = (&o0[row * d..(row + 1) * d], &o1[row * d..(row + 1) * d]);
                if i >= first_nan_row {
                    assert!(
                        out1.iter().all(|v| v.is_nan()) && l1[row].is_nan(),
                        "{what}: head {head} row {i} sees the NaN key but is not all NaN (LSE {})",
                        l1[row]
                    );
                } else {
                    assert!(
                        out1.iter()
                            .map(|v| v.to_bits())
                            .eq(out0.iter().map(|v| v.to_bits()))
                            && l1[row].to_bits() == l0[row].to_bits(),
                        "{what}: head {head} row {i} does not see the NaN key but changed"
                    );
                    assert!(
                        out0.iter().all(|v| v.is_finite()),
                        "{what}: row {i} not finite"
                    );
                }
            }
        }
    }
}

#[test]
fn wgmma_custom_scale_is_applied() {
    let Some(gpu) = wgmma_gpu_or_skip("wgmma_custom_scale_is_applied") else {
        return;
    };
    let mut rng = rng("wgmma_custom_scale");
    for (variant, d, dtype) in wgmma_kinds(&gpu) {
        let what = format!("wgmma kernel {variant} D{d} {dtype:?} ");
        check_custom_scales(Path::Kernel(variant), &gpu, &mut rng, d, dtype, &what);
    }
}

#[test]
fn flash_kernel_selector_refuses_what_the_build_does_not_have() {
    let Some(gpu) = gpu_or_skip("flash_kernel_selector_refuses_what_the_build_does_not_have")
    else {
        return;
    };
    let t = |d: usize, dtype: DType| {
        Tensor::from_f32(&gpu, &vec![0.1; 2 * 8 * d], &[1, 2, 8, d], dtype).unwrap()
    };
    let (q, q128) = (t(64, DType::F16), t(128, DType::F16));
    let p = AttentionParams::default();
    let e = attention::flash_forward_variant(&q, &q, &q, &p, 7).unwrap_err();
    assert!(e.to_string().contains("kernel 7"), "{e}");
    if gpu.ptx_arch() == "sm_90" {
        for v in WGMMA_VARIANTS {
            attention::flash_forward_variant(&q, &q, &q, &p, v).unwrap();
        }
        attention::flash_forward_variant(&q128, &q128, &q128, &p, 5).unwrap();
        for v in [0, 4] {
            let e = attention::flash_forward_variant(&q128, &q128, &q128, &p, v).unwrap_err();
            assert!(e.to_string().contains("head dim 128"), "{e}");
        }
        // Same validation as the default path: f32 is refused.
        let q32 = t(64, DType::F32);
        let e = attention::flash_forward_variant(&q32, &q32, &q32, &p, 5).unwrap_err();
        assert!(matches!(e, host::Error::DType { .. }), "{e}");
    } else {
        attention::flash_forward_variant(&q, &q, &q, &p, 0).unwrap();
        let e = attention::flash_forward_variant(&q, &q, &q, &p, 5).unwrap_err();
        assert!(e.to_string().contains("sm_80 build"), "{e}");
    }
}
