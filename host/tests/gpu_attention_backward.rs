//! GPU attention backward vs the f64 CPU reference (`reference::backward`, itself checked against
//! finite differences in the library's unit tests).
//!
//! `flash_backward` (the `flash_*` tests): the forward's rule for each of dQ, dK and dV,
//! `max|g - ref| <= 2 max|naive - ref| + 1e-5` with `naive` the same-precision naive backward
//! (`reference::backward_and_naive`), on O and LSE from `flash_forward`; also within the relative
//! 2-norm tolerance below of `naive_backward` on the same inputs. Run-to-run bit identity over 100
//! runs, zero gradients of fully masked rows, empty sequences, custom scales, and the sm_80 build's
//! kernels (`Build::Portable`) on part of the grid. On tiny shapes, every gradient element against
//! central differences of the f64 forward, with the same rule (no shared code with the backward
//! reference).
//!
//! `naive_backward`: the rule for each of dQ, dK and dV, with the reference computed from the same
//! (dtype-rounded) inputs:
//! - relative 2-norm error `||g - ref|| / ||ref||` at most 1e-5 (f32), 1e-3 (f16), 8e-3 (bf16)
//!   (docs/math/ops.md; f16/bf16 outputs are rounded once from f32 math, half an ulp is 2^-11 / 2^-8);
//! - and max-norm error `max|g - ref| <= tol_max * max|ref|` with tol_max 1e-4 (f32), 1e-3 (f16),
//!   8e-3 (bf16), so an error confined to a few elements fails too.
//!
//! NaN never passes (outputs are poisoned with NaN before every launch; an unwritten element fails).
//! Seeds are printed; `RGK_FUZZ_CASES=n` runs only the first n cases of the grid.
mod common;
use common::*;
use host::ops::attention::{self, AttentionGrads, AttentionParams, Causal, reference};
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
    scale: Option<f32>,
}

#[allow(clippy::too_many_arguments)]
fn case(b: usize, h: usize, sq: usize, sk: usize, d: usize, causal: Causal, dtype: DType) -> Case {
    Case {
        batch: b,
        heads: h,
        seq_q: sq,
        seq_k: sk,
        head_dim: d,
        causal,
        dtype,
        scale: None,
    }
}

/// Head dim and dtype rotate over these so every length pair and mask meets several combinations.
const KINDS: [(usize, DType); 6] = [
    (64, DType::F32),
    (128, DType::F16),
    (64, DType::BF16),
    (128, DType::F32),
    (8, DType::F16),
    (3, DType::BF16),
];
const LENGTHS: [usize; 3] = [1, 17, 97];

/// A few diverse cases first (the sanitizer set), then every (seq_q, seq_k) pair of 1, 17, 97 with
/// both masks at B*H = 2*3, then larger and lopsided shapes, custom scales and the largest head dim.
fn cases() -> Vec<Case> {
    use Causal::{No, Yes};
    use DType::{BF16, F16, F32};
    let mut cases = vec![
        case(2, 3, 97, 17, 64, Yes, F32), // rows 0..79 see no key
        case(1, 3, 17, 97, 128, Yes, F16),
        case(3, 1, 97, 97, 64, No, BF16),
        case(1, 2, 1, 97, 8, Yes, F32),
    ];
    let mut n = 0;
    for sq in LENGTHS {
        for sk in LENGTHS {
            for causal in [No, Yes] {
                let (d, dtype) = KINDS[n % KINDS.len()];
                n += 1;
                cases.push(case(2, 3, sq, sk, d, causal, dtype));
            }
        }
    }
    cases.extend([
        case(1, 2, 200, 130, 128, Yes, F16),
        case(1, 2, 130, 200, 64, Yes, F32),
        case(1, 1, 300, 301, 256, No, F32),
        case(1, 1, 33, 300, 256, Yes, BF16),
        case(5, 1, 64, 64, 1, Yes, F32),
        case(1, 7, 31, 45, 40, No, F16),
    ]);
    let mut scaled = case(2, 2, 45, 31, 64, Yes, F32);
    scaled.scale = Some(0.5);
    cases.push(scaled);
    scaled = case(1, 3, 31, 45, 32, No, F16);
    scaled.scale = Some(-0.3);
    cases.push(scaled);
    cases
}

/// Q and K uniform in [-2, 2) (peaked and flat score rows both occur), V and dO in [-1, 1).
fn inputs(rng: &mut rand::rngs::StdRng, c: &Case) -> [HostTensor; 4] {
    let qs = [c.batch, c.heads, c.seq_q, c.head_dim];
    let ks = [c.batch, c.heads, c.seq_k, c.head_dim];
    [
        uniform(rng, &qs, -2.0, 2.0, c.dtype),
        uniform(rng, &ks, -2.0, 2.0, c.dtype),
        uniform(rng, &ks, -1.0, 1.0, c.dtype),
        uniform(rng, &qs, -1.0, 1.0, c.dtype),
    ]
}

fn params(c: &Case) -> AttentionParams<'static> {
    AttentionParams {
        causal: c.causal,
        scale: c.scale,
        ..Default::default()
    }
}

fn upload(gpu: &Gpu, x: &[HostTensor; 4]) -> [Tensor; 4] {
    x.each_ref().map(|t| Tensor::from_host(gpu, t).unwrap())
}

fn backward(x: &[Tensor; 4], p: &AttentionParams) -> AttentionGrads {
    attention::naive_backward(&x[0], &x[1], &x[2], &x[3], p).unwrap()
}

/// Max-norm tolerance relative to `max|ref|`.
fn tol_max(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-4,
        DType::F16 => 1e-3,
        DType::BF16 => 8e-3,
    }
}

/// `max|out - ref| / max|ref|` (the absolute error when ref is all zero); +inf on any NaN or
/// infinity in `out`.
fn max_rel(out: &[f32], reference: &[f32]) -> f64 {
    assert_eq!(out.len(), reference.len());
    let (mut num, mut den) = (0f64, 0f64);
    for (&o, &r) in out.iter().zip(reference) {
        if !o.is_finite() {
            return f64::INFINITY;
        }
        num = num.max((o as f64 - r as f64).abs());
        den = den.max((r as f64).abs());
    }
    if den == 0.0 { num } else { num / den }
}

fn check(gpu: &Gpu, rng: &mut rand::rngs::StdRng, c: &Case) {
    let x = inputs(rng, c);
    let p = params(c);
    let g = backward(&upload(gpu, &x), &p);
    let kv = [c.batch, c.heads, c.seq_k, c.head_dim];
    assert_eq!(g.dq.shape(), x[0].shape.as_slice());
    assert_eq!((g.dk.shape(), g.dv.shape()), (&kv[..], &kv[..]));
    for t in [&g.dq, &g.dk, &g.dv] {
        assert_eq!(t.dtype(), c.dtype);
    }
    let want = reference::backward(&x[0], &x[1], &x[2], &x[3], &p).unwrap();
    for (what, out, reference) in [
        ("dQ", &g.dq, &want.dq),
        ("dK", &g.dk, &want.dk),
        ("dV", &g.dv, &want.dv),
    ] {
        let out = out.to_vec().unwrap();
        if reference.data.iter().all(|&r| r == 0.0) {
            // E.g. dQ with one visible key per row (P = 1, dS = P (dP - P dP) = 0): only f32 noise
            // from the fast exp may remain, far below 1e-5.
            let worst = out.iter().fold(0f32, |m, &v| m.max(v.abs()));
            assert!(
                worst <= 1e-5,
                "{c:?} {what}: reference is 0, max|g| = {worst:e}"
            );
            continue;
        }
        assert_close(
            &format!("{c:?} {what}"),
            &out,
            &reference.data,
            tol(c.dtype),
        );
        let e = max_rel(&out, &reference.data);
        assert!(
            e <= tol_max(c.dtype),
            "{c:?} {what}: max|g - ref| / max|ref| = {e:.3e} > {:.0e}",
            tol_max(c.dtype)
        );
    }
}

#[test]
fn naive_backward_matches_reference_over_the_grid() {
    let Some(gpu) = gpu_or_skip("naive_backward_matches_reference_over_the_grid") else {
        return;
    };
    let mut rng = rng("naive_backward_grid");
    let cases = cases();
    for c in cases.iter().take(fuzz_cases(cases.len())) {
        check(&gpu, &mut rng, c);
    }
}

#[test]
fn naive_backward_is_bit_identical_over_repeated_runs() {
    let Some(gpu) = gpu_or_skip("naive_backward_is_bit_identical_over_repeated_runs") else {
        return;
    };
    let mut rng = rng("naive_backward_repeat");
    for c in [
        case(2, 3, 130, 97, 128, Causal::Yes, DType::BF16),
        case(1, 2, 97, 130, 64, Causal::No, DType::F32),
    ] {
        let x = upload(&gpu, &inputs(&mut rng, &c));
        let g0 = backward(&x, &params(&c));
        let first = [bits(&g0.dq), bits(&g0.dk), bits(&g0.dv)];
        for run in 1..fuzz_cases(20) {
            let g = backward(&x, &params(&c));
            assert!(
                [bits(&g.dq), bits(&g.dk), bits(&g.dv)] == first,
                "{c:?}: run {run} differs from run 0"
            );
        }
    }
}

#[test]
fn naive_backward_fully_masked_rows_have_zero_gradients() {
    let Some(gpu) = gpu_or_skip("naive_backward_fully_masked_rows_have_zero_gradients") else {
        return;
    };
    let mut rng = rng("naive_backward_masked");
    // Causal with seq_q = 200 > seq_k = 17: query i sees key j iff j <= i - 183, so rows 0..183 see
    // nothing: their dQ is exactly 0 (and they add exactly 0 to dK and dV).
    for (d, dtype) in [(64, DType::F32), (128, DType::F16), (8, DType::BF16)] {
        let c = case(2, 3, 200, 17, d, Causal::Yes, dtype);
        let x = inputs(&mut rng, &c);
        let g = backward(&upload(&gpu, &x), &params(&c));
        let (dq, dk, dv) = (
            g.dq.to_vec().unwrap(),
            g.dk.to_vec().unwrap(),
            g.dv.to_vec().unwrap(),
        );
        assert!(
            dq.iter().chain(&dk).chain(&dv).all(|v| v.is_finite()),
            "{c:?}: non-finite gradient"
        );
        for head in 0..c.batch * c.heads {
            let rows = &dq[head * c.seq_q * d..(head * c.seq_q + 183) * d];
            assert!(rows.iter().all(|&v| v == 0.0), "{c:?}: masked dQ not 0");
        }
        check(&gpu, &mut rng, &c);
    }

    // No keys: dQ = 0. No queries: dK = dV = 0 (written, not left poisoned).
    let q = Tensor::from_f32(&gpu, &[0.5; 2 * 3 * 64], &[1, 2, 3, 64], DType::F16).unwrap();
    let none = Tensor::from_f32(&gpu, &[], &[1, 2, 0, 64], DType::F16).unwrap();
    let kv = Tensor::from_f32(&gpu, &[0.25; 2 * 5 * 64], &[1, 2, 5, 64], DType::F16).unwrap();
    for causal in [Causal::No, Causal::Yes] {
        let p = AttentionParams {
            causal,
            scale: None,
            ..Default::default()
        };
        let g = attention::naive_backward(&q, &none, &none, &q, &p).unwrap();
        assert!(g.dq.to_vec().unwrap().iter().all(|&v| v == 0.0));
        assert_eq!(g.dk.shape(), &[1, 2, 0, 64]);
        let g = attention::naive_backward(&none, &kv, &kv, &none, &p).unwrap();
        assert_eq!(g.dq.shape(), &[1, 2, 0, 64]);
        for t in [&g.dk, &g.dv] {
            assert!(t.to_vec().unwrap().iter().all(|&v| v == 0.0), "{causal:?}");
        }
    }
}

/// 9 heads of 4096 x 4096 scores need two f32 scratch matrices of 9 * 2^24 elements, more than the
/// 2^28 the launcher allows at once, so it launches the heads in chunks (8, then 1). Each head's
/// result must be bit-identical to a run of that head alone (the kernels do not depend on the chunk).
#[test]
fn naive_backward_chunked_heads_match_single_head_runs() {
    let Some(gpu) = gpu_or_skip("naive_backward_chunked_heads_match_single_head_runs") else {
        return;
    };
    if sanitizing() {
        println!(
            "SKIP naive_backward_chunked_heads_match_single_head_runs: too slow under the sanitizer"
        );
        return;
    }
    let mut rng = rng("naive_backward_chunks");
    let c = case(3, 3, 4096, 4096, 8, Causal::Yes, DType::F16);
    let x = inputs(&mut rng, &c);
    let g = backward(&upload(&gpu, &x), &params(&c));
    let all = [bits(&g.dq), bits(&g.dk), bits(&g.dv)];
    let per_head = c.seq_q * c.head_dim; // seq_q == seq_k
    for head in [0, 7, 8] {
        let one = |t: &HostTensor| {
            let shape = [1, 1, t.shape[2], t.shape[3]];
            HostTensor::new(
                t.data[head * per_head..(head + 1) * per_head].to_vec(),
                &shape,
                t.dtype,
            )
            .unwrap()
        };
        let xh = [one(&x[0]), one(&x[1]), one(&x[2]), one(&x[3])];
        let gh = backward(&upload(&gpu, &xh), &params(&c));
        for (what, whole, alone) in [
            ("dQ", &all[0], bits(&gh.dq)),
            ("dK", &all[1], bits(&gh.dk)),
            ("dV", &all[2], bits(&gh.dv)),
        ] {
            assert!(
                whole[head * per_head..(head + 1) * per_head] == alone[..],
                "head {head}: {what} of the chunked launch differs from the single-head run"
            );
        }
    }
}

#[test]
fn naive_backward_rejects_bad_input_before_launch() {
    let Some(gpu) = gpu_or_skip("naive_backward_rejects_bad_input_before_launch") else {
        return;
    };
    let t = |shape: &[usize], dtype| {
        Tensor::from_f32(&gpu, &vec![0.1; shape.iter().product()], shape, dtype).unwrap()
    };
    let p = AttentionParams::default();
    let q = t(&[1, 2, 8, 64], DType::F16);
    let kv = t(&[1, 2, 5, 64], DType::F16);
    assert!(attention::naive_backward(&q, &kv, &kv, &q, &p).is_ok());
    // dO of K's shape, of another dtype, not contiguous.
    let e = attention::naive_backward(&q, &kv, &kv, &kv, &p).unwrap_err();
    assert!(
        matches!(e, host::Error::Shape { .. }) && e.to_string().contains("d_o"),
        "{e}"
    );
    let e =
        attention::naive_backward(&q, &kv, &kv, &t(&[1, 2, 8, 64], DType::BF16), &p).unwrap_err();
    assert!(
        matches!(
            e,
            host::Error::DType {
                got: DType::BF16,
                ..
            }
        ),
        "{e}"
    );
    let strided = t(&[1, 8, 2, 64], DType::F16).transpose(1, 2).unwrap();
    let e = attention::naive_backward(&q, &kv, &kv, &strided, &p).unwrap_err();
    assert!(
        matches!(e, host::Error::NotContiguous { what: "d_o", .. }),
        "{e}"
    );
    // The forward's rules: q not contiguous, mixed dtypes, head dim too large, heads disagree,
    // non-finite scale.
    let e = attention::naive_backward(&strided, &kv, &kv, &q, &p).unwrap_err();
    assert!(
        matches!(e, host::Error::NotContiguous { what: "q", .. }),
        "{e}"
    );
    let kv32 = t(&[1, 2, 5, 64], DType::F32);
    let e = attention::naive_backward(&q, &kv32, &kv32, &q, &p).unwrap_err();
    assert!(matches!(e, host::Error::DType { .. }), "{e}");
    let q512 = t(&[1, 1, 3, 512], DType::F32);
    let e = attention::naive_backward(&q512, &q512, &q512, &q512, &p).unwrap_err();
    assert!(e.to_string().contains("1..=256"), "{e}");
    let k3 = t(&[1, 3, 5, 64], DType::F16);
    let e = attention::naive_backward(&q, &k3, &k3, &q, &p).unwrap_err();
    assert!(matches!(e, host::Error::Shape { .. }), "{e}");
    let bad_scale = AttentionParams {
        scale: Some(f32::NAN),
        ..p
    };
    let e = attention::naive_backward(&q, &kv, &kv, &q, &bad_scale).unwrap_err();
    assert!(e.to_string().contains("finite"), "{e}");
}

// ------------------------------------------------------------------------------ flash_backward

/// The flash kernels' head dims and dtypes; they rotate over the length pairs like [`KINDS`].
const FLASH_KINDS: [(usize, DType); 4] = [
    (64, DType::F16),
    (128, DType::BF16),
    (128, DType::F16),
    (64, DType::BF16),
];
const FLASH_LENGTHS: [usize; 4] = [1, 17, 97, 200];

/// Diverse cases first (the sanitizer runs the first three), then every (seq_q, seq_k) pair of
/// 1, 17, 97, 200 with both masks at B*H = 2*3, then long and lopsided shapes.
fn flash_cases() -> Vec<Case> {
    use Causal::{No, Yes};
    use DType::{BF16, F16};
    let mut cases = vec![
        case(2, 3, 97, 200, 64, Yes, F16),
        case(2, 3, 200, 97, 128, Yes, BF16), // rows 0..103 see no key
        case(1, 2, 65, 193, 128, No, F16),   // 64-row query blocks, a ragged 128-key block
        case(3, 1, 1, 17, 64, Yes, BF16),
        case(1, 2, 129, 64, 64, Yes, F16), // one whole key block; rows 0..65 see no key
        case(1, 1, 17, 1025, 128, No, BF16),
        case(1, 2, 256, 256, 128, Yes, F16), // whole blocks, the causal diagonal on block edges
    ];
    let mut n = 0;
    for sq in FLASH_LENGTHS {
        for sk in FLASH_LENGTHS {
            for causal in [No, Yes] {
                let (d, dtype) = FLASH_KINDS[n % FLASH_KINDS.len()];
                n += 1;
                cases.push(case(2, 3, sq, sk, d, causal, dtype));
            }
        }
    }
    cases.extend([
        case(1, 2, 1025, 1025, 64, Yes, F16),
        case(1, 2, 1025, 1025, 128, No, BF16),
        case(1, 2, 1025, 200, 128, Yes, BF16),
        case(1, 2, 200, 1025, 64, Yes, F16),
        case(1, 1, 1025, 17, 64, No, BF16),
        case(1, 1, 17, 1025, 128, Yes, F16),
        case(1, 2, 1, 1025, 128, No, F16),
        case(1, 2, 1025, 1, 64, Yes, BF16),
        // 68 key blocks of 128: more than half of an H100's 132 SMs, so the deterministic dQ
        // takes the ascending order (shorter heads take the rotated one).
        case(1, 2, 200, 8600, 128, No, F16),
        case(1, 1, 1025, 8600, 64, Yes, BF16),
    ]);
    cases
}

/// `max |out - ref|`; +inf on any NaN or infinity in `out`.
/// The forward on the GPU (its O and LSE are what the backward takes), then the backward.
fn flash_run(x: &[Tensor; 4], p: &AttentionParams) -> AttentionGrads {
    let (o, lse) = attention::flash_forward(&x[0], &x[1], &x[2], p).unwrap();
    attention::flash_backward(&x[0], &x[1], &x[2], &o, &lse, &x[3], p).unwrap()
}

/// Runs one case through `flash_backward` on `gpu` and applies the rule to dQ, dK and dV; also
/// compares with `naive_backward` (relative 2-norm within the naive test's tolerance, twice it in
/// bf16: see below). Returns the gradients' bits (dQ, dK, dV).
fn check_flash(gpu: &Gpu, rng: &mut rand::rngs::StdRng, c: &Case) -> [Vec<u32>; 3] {
    let x = inputs(rng, c);
    let p = params(c);
    let dev = upload(gpu, &x);
    let g = flash_run(&dev, &p);
    let kv = [c.batch, c.heads, c.seq_k, c.head_dim];
    assert_eq!(g.dq.shape(), x[0].shape.as_slice());
    assert_eq!((g.dk.shape(), g.dv.shape()), (&kv[..], &kv[..]));
    for t in [&g.dq, &g.dk, &g.dv] {
        assert_eq!(t.dtype(), c.dtype);
    }
    let naive_gpu = backward(&dev, &p);
    let want = reference::backward_and_naive(&x[0], &x[1], &x[2], &x[3], &p).unwrap();
    let mut ratios = Vec::new();
    for (what, out, naive_gpu, exact, naive) in [
        ("dQ", &g.dq, &naive_gpu.dq, &want.exact.dq, &want.naive.dq),
        ("dK", &g.dk, &naive_gpu.dk, &want.exact.dk, &want.naive.dk),
        ("dV", &g.dv, &naive_gpu.dv, &want.exact.dv, &want.naive.dv),
    ] {
        let out = out.to_vec().unwrap();
        let err = max_abs_err(&out, &exact.data);
        let bound = 2.0 * max_abs_err(&naive.data, &exact.data) + 1e-5;
        if err > bound {
            let i = out
                .iter()
                .zip(&exact.data)
                .position(|(&o, &r)| !o.is_finite() || (o as f64 - r as f64).abs() > bound)
                .unwrap_or(0);
            panic!(
                "{c:?} {what}: max|g - ref| = {err:.3e} > 2 max|naive - ref| + 1e-5 = {bound:.3e}; \
                 first bad element {i} (row {} of all heads, column {}): got {} want {}",
                i / c.head_dim,
                i % c.head_dim,
                out[i],
                exact.data[i]
            );
        }
        ratios.push(format!("{what} {:.2}", err / bound));
        // The flash kernels round P and dS to the input type before their products (as
        // FlashAttention does); `naive_backward` keeps them in f32. In bf16 (2^-8 relative) that
        // moves single elements by several ulps, and a case of one query row has too few
        // elements for the 2-norm to average it: 64 dQ values of a bf16 row differed by 8.96e-3
        // against `tol`'s 8e-3 (sm_80 build, seed 1795825430216865787; worst element 5 ulps)
        // while meeting the exact reference's rule above. So twice `tol` in bf16.
        let scale = if c.dtype == DType::BF16 { 2.0 } else { 1.0 };
        assert_close(
            &format!("{c:?} {what} vs naive_backward"),
            &out,
            &naive_gpu.to_vec().unwrap(),
            scale * tol(c.dtype),
        );
    }
    println!("{c:?}: error / bound: {}", ratios.join(", "));
    [bits(&g.dq), bits(&g.dk), bits(&g.dv)]
}

#[test]
fn flash_backward_matches_reference_over_the_grid() {
    let Some(gpu) = gpu_or_skip("flash_backward_matches_reference_over_the_grid") else {
        return;
    };
    let mut rng = rng("flash_backward_grid");
    let cases = flash_cases();
    for c in cases.iter().take(fuzz_cases(cases.len())) {
        check_flash(&gpu, &mut rng, c);
    }
}

/// The sm_80 build's kernels (what Ampere and Ada run) on part of the grid, on any device through a
/// `Build::Portable` handle; the default handle on a 9.0 device runs the sm_90 build's.
#[test]
fn flash_backward_sm80_build_matches_reference() {
    let Some(gpu) = gpu_or_skip("flash_backward_sm80_build_matches_reference") else {
        return;
    };
    let portable = portable_build(&gpu);
    let mut rng = rng("flash_backward_sm80");
    let cases = flash_cases();
    for c in cases.iter().take(fuzz_cases(7)) {
        check_flash(&portable, &mut rng, c);
    }
}

#[test]
fn flash_backward_is_bit_identical_over_100_runs() {
    let Some(gpu) = gpu_or_skip("flash_backward_is_bit_identical_over_100_runs") else {
        return;
    };
    let mut rng = rng("flash_backward_repeat");
    // 17 key blocks add to every query block of the second case: the turn order is exercised
    // (the rotated order on a GPU of at least 34 SMs); the third has 68 key blocks, which take the
    // ascending order on an H100 (more than half its SMs).
    for c in [
        case(
            2,
            3,
            scaled(1025, 130),
            scaled(1025, 130),
            128,
            Causal::Yes,
            DType::BF16,
        ),
        case(
            1,
            4,
            scaled(700, 97),
            scaled(2100, 300),
            64,
            Causal::No,
            DType::F16,
        ),
        case(
            1,
            2,
            scaled(600, 97),
            scaled(8600, 300),
            128,
            Causal::No,
            DType::F16,
        ),
    ] {
        let x = upload(&gpu, &inputs(&mut rng, &c));
        let p = params(&c);
        let (o, lse) = attention::flash_forward(&x[0], &x[1], &x[2], &p).unwrap();
        let run = || {
            let g = attention::flash_backward(&x[0], &x[1], &x[2], &o, &lse, &x[3], &p).unwrap();
            [bits(&g.dq), bits(&g.dk), bits(&g.dv)]
        };
        let first = run();
        for r in 1..fuzz_cases(100) {
            let again = run();
            for (what, a, b) in [
                ("dQ", &again[0], &first[0]),
                ("dK", &again[1], &first[1]),
                ("dV", &again[2], &first[2]),
            ] {
                let at = a.iter().zip(b).position(|(x, y)| x != y);
                assert!(
                    at.is_none(),
                    "{c:?}: run {r}: {what} differs from run 0 at element {at:?}"
                );
            }
        }
        println!("{c:?}: {} runs bit-identical", fuzz_cases(100));
    }
}

/// `BackwardMode::Nondeterministic` (dQ summed in arrival order): dK and dV are the deterministic
/// mode's bits (only dQ's order changes), dQ keeps the backward's rule against the f64 reference.
/// Both masks and dtypes, S_q != S_k both ways, several key blocks per query block.
#[test]
fn flash_backward_nondeterministic_mode_keeps_the_rule() {
    let Some(gpu) = gpu_or_skip("flash_backward_nondeterministic_mode_keeps_the_rule") else {
        return;
    };
    let mut rng = rng("flash_backward_nondeterministic");
    for c in [
        case(
            2,
            3,
            scaled(300, 97),
            scaled(700, 200),
            64,
            Causal::No,
            DType::F16,
        ),
        case(
            1,
            2,
            scaled(700, 200),
            scaled(300, 97),
            128,
            Causal::Yes,
            DType::BF16,
        ),
        case(
            1,
            2,
            scaled(513, 65),
            scaled(513, 65),
            128,
            Causal::No,
            DType::F16,
        ),
        case(
            2,
            1,
            scaled(257, 80),
            scaled(600, 130),
            64,
            Causal::Yes,
            DType::BF16,
        ),
    ] {
        let x = inputs(&mut rng, &c);
        let p = params(&c);
        let dev = upload(&gpu, &x);
        let (o, lse) = attention::flash_forward(&dev[0], &dev[1], &dev[2], &p).unwrap();
        let det =
            attention::flash_backward(&dev[0], &dev[1], &dev[2], &o, &lse, &dev[3], &p).unwrap();
        let fast = attention::flash_backward_with(
            &dev[0],
            &dev[1],
            &dev[2],
            &o,
            &lse,
            &dev[3],
            &p,
            attention::BackwardMode::Nondeterministic,
        )
        .unwrap();
        assert_eq!(bits(&fast.dk), bits(&det.dk), "{c:?} dK");
        assert_eq!(bits(&fast.dv), bits(&det.dv), "{c:?} dV");
        let want = reference::backward_and_naive(&x[0], &x[1], &x[2], &x[3], &p).unwrap();
        let dq = fast.dq.to_vec().unwrap();
        let err = max_abs_err(&dq, &want.exact.dq.data);
        let bound = 2.0 * max_abs_err(&want.naive.dq.data, &want.exact.dq.data) + 1e-5;
        assert!(
            err <= bound,
            "{c:?} dQ: max|g - ref| = {err:.3e} > {bound:.3e}"
        );
        println!(
            "{c:?}: nondeterministic dQ error / bound {:.2}",
            err / bound
        );
    }
}

#[test]
fn flash_backward_fully_masked_rows_and_empty_sequences() {
    let Some(gpu) = gpu_or_skip("flash_backward_fully_masked_rows_and_empty_sequences") else {
        return;
    };
    let mut rng = rng("flash_backward_masked");
    // Causal with seq_q = 200 > seq_k = 17: query i sees key j iff j <= i - 183, so rows 0..183 see
    // nothing (the first two 64-row query blocks see no key at all): their dQ is exactly 0.
    for (d, dtype) in FLASH_KINDS {
        let c = case(2, 3, 200, 17, d, Causal::Yes, dtype);
        let x = inputs(&mut rng, &c);
        let g = flash_run(&upload(&gpu, &x), &params(&c));
        let dq = g.dq.to_vec().unwrap();
        for head in 0..c.batch * c.heads {
            let rows = &dq[head * c.seq_q * d..(head * c.seq_q + 183) * d];
            assert!(rows.iter().all(|&v| v == 0.0), "{c:?}: masked dQ not 0");
        }
        check_flash(&gpu, &mut rng, &c);
    }

    // No keys: dQ = 0. No queries: dK = dV = 0 (written, not left poisoned).
    for (d, dtype) in FLASH_KINDS {
        let q = Tensor::from_f32(&gpu, &vec![0.5; 2 * 3 * d], &[1, 2, 3, d], dtype).unwrap();
        let none = Tensor::from_f32(&gpu, &[], &[1, 2, 0, d], dtype).unwrap();
        let kv = Tensor::from_f32(&gpu, &vec![0.25; 2 * 5 * d], &[1, 2, 5, d], dtype).unwrap();
        for causal in [Causal::No, Causal::Yes] {
            let p = AttentionParams {
                causal,
                scale: None,
                ..Default::default()
            };
            let (o, lse) = attention::flash_forward(&q, &none, &none, &p).unwrap();
            let g = attention::flash_backward(&q, &none, &none, &o, &lse, &q, &p).unwrap();
            assert!(g.dq.to_vec().unwrap().iter().all(|&v| v == 0.0));
            assert_eq!(g.dk.shape(), &[1, 2, 0, d]);
            let (o, lse) = attention::flash_forward(&none, &kv, &kv, &p).unwrap();
            let g = attention::flash_backward(&none, &kv, &kv, &o, &lse, &none, &p).unwrap();
            assert_eq!(g.dq.shape(), &[1, 2, 0, d]);
            for t in [&g.dk, &g.dv] {
                assert!(
                    t.to_vec().unwrap().iter().all(|&v| v == 0.0),
                    "D{d} {dtype:?} {causal:?}"
                );
            }
        }
    }
}

#[test]
fn flash_backward_custom_scales() {
    let Some(gpu) = gpu_or_skip("flash_backward_custom_scales") else {
        return;
    };
    let mut rng = rng("flash_backward_scales");
    for (i, scale) in [0.5f32, -0.3, 0.0].into_iter().enumerate() {
        let (d, dtype) = FLASH_KINDS[i];
        for causal in [Causal::No, Causal::Yes] {
            let mut c = case(1, 3, 130, 70, d, causal, dtype);
            c.scale = Some(scale);
            check_flash(&gpu, &mut rng, &c);
        }
    }
}

#[test]
fn flash_backward_rejects_bad_input_before_launch() {
    let Some(gpu) = gpu_or_skip("flash_backward_rejects_bad_input_before_launch") else {
        return;
    };
    let t = |shape: &[usize], dtype| {
        Tensor::from_f32(&gpu, &vec![0.1; shape.iter().product()], shape, dtype).unwrap()
    };
    let p = AttentionParams::default();
    let q = t(&[1, 2, 8, 64], DType::F16);
    let kv = t(&[1, 2, 5, 64], DType::F16);
    let (o, lse) = attention::flash_forward(&q, &kv, &kv, &p).unwrap();
    assert!(attention::flash_backward(&q, &kv, &kv, &o, &lse, &q, &p).is_ok());
    // dO of K's shape; O of another dtype; LSE of the wrong shape, dtype, or strided.
    let e = attention::flash_backward(&q, &kv, &kv, &o, &lse, &kv, &p).unwrap_err();
    assert!(
        matches!(e, host::Error::Shape { .. }) && e.to_string().contains("d_o"),
        "{e}"
    );
    let o16 = t(&[1, 2, 8, 64], DType::BF16);
    let e = attention::flash_backward(&q, &kv, &kv, &o16, &lse, &q, &p).unwrap_err();
    assert!(
        matches!(
            e,
            host::Error::DType {
                got: DType::BF16,
                ..
            }
        ) && e.to_string().contains("o"),
        "{e}"
    );
    let e = attention::flash_backward(&q, &kv, &kv, &o, &t(&[1, 2, 5], DType::F32), &q, &p)
        .unwrap_err();
    assert!(
        matches!(e, host::Error::Shape { .. }) && e.to_string().contains("lse"),
        "{e}"
    );
    let e = attention::flash_backward(&q, &kv, &kv, &o, &t(&[1, 2, 8], DType::F16), &q, &p)
        .unwrap_err();
    assert!(
        matches!(
            e,
            host::Error::DType {
                got: DType::F16,
                ..
            }
        ),
        "{e}"
    );
    let lse_t = t(&[1, 8, 2], DType::F32).transpose(1, 2).unwrap();
    let e = attention::flash_backward(&q, &kv, &kv, &o, &lse_t, &q, &p).unwrap_err();
    assert!(
        matches!(e, host::Error::NotContiguous { what: "lse", .. }),
        "{e}"
    );
    // The forward's rules: f32, an unsupported head dim, heads that disagree.
    let q32 = t(&[1, 2, 8, 64], DType::F32);
    let l32 = t(&[1, 2, 8], DType::F32);
    let e = attention::flash_backward(&q32, &q32, &q32, &q32, &l32, &q32, &p).unwrap_err();
    assert!(matches!(e, host::Error::DType { .. }), "{e}");
    let q100 = t(&[1, 2, 8, 100], DType::F16);
    let e = attention::flash_backward(&q100, &q100, &q100, &q100, &l32, &q100, &p).unwrap_err();
    assert!(e.to_string().contains("multiples of 8"), "{e}");
    let k3 = t(&[1, 3, 5, 64], DType::F16);
    let e = attention::flash_backward(&q, &k3, &k3, &o, &lse, &q, &p).unwrap_err();
    assert!(matches!(e, host::Error::Shape { .. }), "{e}");
}

// ------------------------------------------------ flash_backward against finite differences

/// `flash_backward` against central differences of the f64 forward (`reference::forward_f64`), an
/// oracle that shares no code with `reference::backward`: loss `L = sum(dO * O)`, differentiated
/// for each checked element of Q, K and V at the dtype-rounded inputs the GPU sees (perturbed in f64,
/// where a step is not lost to rounding). Tiny shapes, D 64, both dtypes and masks, `Sq != Sk` both
/// ways, causal rows that see no key; fresh inputs each run (seed printed).
///
/// Tolerance: the flash backward's own rule with the difference quotient in the place of the
/// exact gradient, `max|g - fd| <= 2 max|naive - fd| + 1e-5` per gradient, `naive` the
/// same-precision naive backward (`reference::backward_and_naive`): the GPU rounds P and dS to the
/// input dtype and its gradients once, a naive f16/bf16 backward rounds at least as often, so twice
/// its distance bounds a correct kernel (the rule the grid test applies against the f64 backward).
/// On these tiny shapes a gradient has a few dozen elements, and the two backwards round at different
/// places (the naive one S and dP too, the kernel only P and dS), so the worst element of one is a
/// noisy scale for the other: measured on an H100 (2026-11-26), one bf16 dQ of a 17 x 3 causal
/// case came to 1.03 of that bound. The rule adds `u max|fd|` (`u` the dtype's unit roundoff,
/// [`DType::epsilon`]: one rounding, relative to the gradient's scale), 0.4% of the largest
/// element in bf16, so an element off by 3% of the largest still fails (the test below).
/// The difference quotient itself is exact to ~1e-9 here (step `1e-4 max(1, |x|)`: truncation
/// `h^2 |L^(3)| / 6` ~1e-8 with `|L^(3)|` ~1e0, f64 rounding `1e-16 |L| / h` ~1e-11), far below the
/// 1e-5 floor. A gradient that is 0 everywhere (dQ of rows that see one key) must be at most 1e-5.
#[test]
fn flash_backward_matches_central_differences_on_tiny_shapes() {
    let Some(gpu) = gpu_or_skip("flash_backward_matches_central_differences_on_tiny_shapes") else {
        return;
    };
    let mut rng = rng("flash_backward_finite_differences");
    let mut checked = 0;
    for c in finite_difference_cases(&mut rng) {
        let x = inputs(&mut rng, &c);
        let g = flash_run(&upload(&gpu, &x), &params(&c));
        let out = [&g.dq, &g.dk, &g.dv].map(|t| t.to_vec().unwrap());
        checked +=
            check_against_central_differences(&c, &x, &out).unwrap_or_else(|e| panic!("{e}"));
    }
    println!("{checked} gradient elements checked against central differences");
}

/// The check above can fail, and passes a correct result: on the CPU, the f64 backward's gradients
/// rounded to the dtype (a correct kernel's result, up to its own roundings) pass it on every case
/// of the GPU test, and the same gradients with one element off by 3% of the largest, or NaN, are
/// rejected, for every gradient and dtype.
#[test]
fn central_difference_check_accepts_rounded_exact_gradients_and_rejects_a_wrong_one() {
    let mut rng = rng("central_difference_check");
    use rand::Rng;
    let rounded_exact = |c: &Case, x: &[HostTensor; 4]| {
        let exact = reference::backward(&x[0], &x[1], &x[2], &x[3], &params(c)).unwrap();
        [&exact.dq, &exact.dk, &exact.dv].map(|t| {
            t.data
                .iter()
                .map(|&v| c.dtype.round(v))
                .collect::<Vec<f32>>()
        })
    };
    for c in finite_difference_cases(&mut rng) {
        let x = inputs(&mut rng, &c);
        check_against_central_differences(&c, &x, &rounded_exact(&c, &x))
            .unwrap_or_else(|e| panic!("rounded exact gradients rejected: {e}"));
    }
    for dtype in [DType::F16, DType::BF16] {
        let c = case(2, 1, 9, 6, 64, Causal::Yes, dtype);
        let x = inputs(&mut rng, &c);
        let rounded = rounded_exact(&c, &x);
        for which in 0..3 {
            let mut wrong = rounded.clone();
            let n = wrong[which].len();
            let big = wrong[which].iter().fold(0f32, |m, v| m.max(v.abs()));
            let i = rng.random_range(0..n);
            wrong[which][i] += 0.03 * big;
            let e = check_against_central_differences(&c, &x, &wrong)
                .expect_err("an element off by 3% of the largest must fail");
            println!("{dtype:?} gradient {which}: rejected: {e}");
            wrong[which][i] = f32::NAN;
            assert!(check_against_central_differences(&c, &x, &wrong).is_err());
        }
    }
}

/// Tiny shapes at D 64: fixed (batch, heads, seq_q, seq_k) pairs and two drawn from 1..=20 each run,
/// each with both masks and both dtypes.
fn finite_difference_cases(rng: &mut rand::rngs::StdRng) -> Vec<Case> {
    use rand::Rng;
    let mut shapes = vec![
        (1, 1, 1, 1),
        (1, 2, 5, 9),
        (2, 1, 17, 3), // causal: rows 0..13 see no key
        (2, 2, 20, 13),
        (1, 1, 13, 20),
    ];
    for _ in 0..2 {
        shapes.push((
            rng.random_range(1..=2),
            rng.random_range(1..=2),
            rng.random_range(1..=20),
            rng.random_range(1..=20),
        ));
    }
    let mut cases = Vec::new();
    for (b, h, sq, sk) in shapes {
        for causal in [Causal::No, Causal::Yes] {
            for dtype in [DType::F16, DType::BF16] {
                cases.push(case(b, h, sq, sk, 64, causal, dtype));
            }
        }
    }
    cases
}

/// Checks every element of `out` (dQ, dK, dV of case `c` at inputs `x`, as f32 values) against
/// central differences with the rule above; returns how many elements it checked, or what failed.
fn check_against_central_differences(
    c: &Case,
    x: &[HostTensor; 4],
    out: &[Vec<f32>; 3],
) -> Result<usize, String> {
    let p = params(c);
    let naive = reference::backward_and_naive(&x[0], &x[1], &x[2], &x[3], &p)
        .unwrap()
        .naive;
    let f64s = |t: &HostTensor| t.data.iter().map(|&v| v as f64).collect::<Vec<_>>();
    let [q, k, v, d_o] = x.each_ref().map(f64s);
    let (sq, sk, d) = (c.seq_q, c.seq_k, c.head_dim);
    let one_head = attention::Dims {
        batch: 1,
        heads: 1,
        kv_heads: 1,
        seq_q: sq,
        seq_k: sk,
        head_dim: d,
    };
    // L of one head from its Q, K, V rows (the other heads do not depend on them).
    let loss = |head: usize, q: &[f64], k: &[f64], v: &[f64]| -> f64 {
        let o = reference::forward_f64(one_head, q, k, v, &p).unwrap();
        let g = &d_o[head * sq * d..(head + 1) * sq * d];
        o.iter().zip(g).map(|(o, g)| o * g).sum()
    };
    let mut checked = 0;
    for (what, out, naive, per) in [
        ("dQ", &out[0], &naive.dq, sq * d),
        ("dK", &out[1], &naive.dk, sk * d),
        ("dV", &out[2], &naive.dv, sk * d),
    ] {
        let n = out.len();
        if n != naive.data.len() {
            return Err(format!(
                "{c:?} {what}: {n} elements, want {}",
                naive.data.len()
            ));
        }
        let (mut err, mut naive_err, mut largest) = (0f64, 0f64, 0f64);
        let mut worst = (0, 0f32, 0f64);
        for i in 0..n {
            let (head, at) = (i / per, i % per);
            let rows = |t: &[f64], len: usize| t[head * len..(head + 1) * len].to_vec();
            let (mut qp, mut kp, mut vp) = (rows(&q, sq * d), rows(&k, sk * d), rows(&v, sk * d));
            let (mut qm, mut km, mut vm) = (qp.clone(), kp.clone(), vp.clone());
            let (xp, xm) = match what {
                "dQ" => (&mut qp[at], &mut qm[at]),
                "dK" => (&mut kp[at], &mut km[at]),
                _ => (&mut vp[at], &mut vm[at]),
            };
            let step = 1e-4 * xp.abs().max(1.0);
            *xp += step;
            *xm -= step;
            let fd = (loss(head, &qp, &kp, &vp) - loss(head, &qm, &km, &vm)) / (2.0 * step);
            // NaN or infinity in the output never passes.
            let e = if out[i].is_finite() {
                (out[i] as f64 - fd).abs()
            } else {
                f64::INFINITY
            };
            if e >= err {
                err = e;
                worst = (i, out[i], fd);
            }
            naive_err = naive_err.max((naive.data[i] as f64 - fd).abs());
            largest = largest.max(fd.abs());
            checked += 1;
        }
        let bound = 2.0 * naive_err + c.dtype.epsilon() * largest + 1e-5;
        if err > bound {
            return Err(format!(
                "{c:?} {what}: max|g - fd| = {err:.3e} > 2 max|naive - fd| + u max|fd| + 1e-5 \
                 = {bound:.3e}; \
                 worst element {} (head {}): got {:.6e}, central difference {:.6e}",
                worst.0,
                worst.0 / per,
                worst.1,
                worst.2
            ));
        }
    }
    Ok(checked)
}

/// `flash_backward_add` adds the unrounded gradients into f32 accumulators: accumulator after minus
/// before meets the backward's rule against the f64 reference, in both builds; accumulators of the
/// wrong dtype or shape are refused before any launch.
#[test]
fn flash_backward_add_adds_gradients_into_f32_accumulators() {
    let Some(gpu) = gpu_or_skip("flash_backward_add_adds_gradients_into_f32_accumulators") else {
        return;
    };
    let portable = portable_build(&gpu);
    let mut rng = rng("flash_backward_add");
    let cases = [
        case(1, 2, 97, 130, 64, Causal::Yes, DType::F16),
        case(2, 1, 64, 64, 128, Causal::No, DType::BF16),
        case(1, 1, 200, 77, 128, Causal::Yes, DType::F16),
    ];
    for g in [&gpu, &portable] {
        for c in &cases {
            let x = inputs(&mut rng, c);
            let p = params(c);
            let dev = upload(g, &x);
            let (o, lse) = attention::flash_forward(&dev[0], &dev[1], &dev[2], &p).unwrap();
            let kv = [c.batch, c.heads, c.seq_k, c.head_dim];
            let before = [
                uniform(&mut rng, &x[0].shape, -1.0, 1.0, DType::F32),
                uniform(&mut rng, &kv, -1.0, 1.0, DType::F32),
                uniform(&mut rng, &kv, -1.0, 1.0, DType::F32),
            ];
            let acc = AttentionGrads {
                dq: Tensor::from_host(g, &before[0]).unwrap(),
                dk: Tensor::from_host(g, &before[1]).unwrap(),
                dv: Tensor::from_host(g, &before[2]).unwrap(),
            };
            attention::flash_backward_add(&dev[0], &dev[1], &dev[2], &o, &lse, &dev[3], &p, &acc)
                .unwrap();
            let want = reference::backward_and_naive(&x[0], &x[1], &x[2], &x[3], &p).unwrap();
            for (what, t, b, exact, naive) in [
                ("dQ", &acc.dq, &before[0], &want.exact.dq, &want.naive.dq),
                ("dK", &acc.dk, &before[1], &want.exact.dk, &want.naive.dk),
                ("dV", &acc.dv, &before[2], &want.exact.dv, &want.naive.dv),
            ] {
                let added: Vec<f32> = t
                    .to_vec()
                    .unwrap()
                    .iter()
                    .zip(&b.data)
                    .map(|(a, b)| a - b)
                    .collect();
                let err = max_abs_err(&added, &exact.data);
                let bound = 2.0 * max_abs_err(&naive.data, &exact.data) + 1e-5;
                assert!(
                    err <= bound,
                    "{} {c:?} {what}: max|added - ref| = {err:.3e} > {bound:.3e}",
                    g.ptx_arch()
                );
            }
            // Refused before any launch: a half accumulator, a dQ accumulator of K's shape.
            let half = AttentionGrads {
                dq: Tensor::empty(g, &x[0].shape, c.dtype).unwrap(),
                ..acc.clone()
            };
            let e = attention::flash_backward_add(
                &dev[0], &dev[1], &dev[2], &o, &lse, &dev[3], &p, &half,
            )
            .unwrap_err();
            assert!(matches!(e, host::Error::DType { .. }), "{e}");
            let wrong = AttentionGrads {
                dq: Tensor::empty(g, &kv, DType::F32).unwrap(),
                ..acc.clone()
            };
            if kv != x[0].shape.as_slice() {
                let e = attention::flash_backward_add(
                    &dev[0], &dev[1], &dev[2], &o, &lse, &dev[3], &p, &wrong,
                )
                .unwrap_err();
                assert!(matches!(e, host::Error::Shape { .. }), "{e}");
            }
        }
    }
}
