//! Shared test support: the GPU (or a visible SKIP), seeded random inputs, error norms.
#![allow(dead_code)]
use host::replace::{TrainStep, divergence};
use host::{DType, Gpu, HostTensor, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The GPU with poison mode on (every op output starts as NaN bytes), or `None` after printing a SKIP
/// line that says why. GPU tests call this first and return early on `None`.
///
/// Under compute-sanitizer's initcheck (`RGK_SANITIZE_TOOL=initcheck`) poisoning is off: a kernel that
/// reads memory nothing wrote is then reported by the tool itself, which poison would hide.
pub fn gpu_or_skip(test: &str) -> Option<Gpu> {
    match Gpu::new(0) {
        Ok(gpu) => {
            gpu.set_poison_outputs(
                std::env::var("RGK_SANITIZE_TOOL").map_or(true, |t| t != "initcheck"),
            );
            Some(gpu)
        }
        Err(e) => {
            println!("SKIP {test}: {e}");
            None
        }
    }
}

/// [`gpu_or_skip`] for tests with f16/bf16 products, which the Hopper matmul (`matmul_tma_*`) may
/// write: poison stays on under initcheck too. Those kernels store C with TMA bulk-tensor stores,
/// which initcheck does not count as writes: without the poison it reports every host copy of C as
/// a read of uninitialised memory (docs/PERF_NOTES.md, "The fc forward in two phases; initcheck and
/// TMA stores"). With the poison on, an element the kernel did not write stays NaN and fails the
/// test's comparison instead. The price: poison is a memset, so under initcheck these tests no
/// longer show a kernel reading an output buffer nothing wrote; the f32 tests keep that check.
pub fn gpu_or_skip_tma_stores(test: &str) -> Option<Gpu> {
    let gpu = gpu_or_skip(test)?;
    gpu.set_poison_outputs(true);
    Some(gpu)
}

/// A second handle on `gpu`'s device that runs the sm_80 build's kernels (`Build::Portable`: what
/// Ampere and Ada run; on a 9.0 device the default handle runs the sm_90 build's), poisoning outputs
/// as `gpu` does.
pub fn portable_build(gpu: &Gpu) -> Gpu {
    let portable = Gpu::with_build(0, host::Build::Portable).unwrap();
    portable.set_poison_outputs(gpu.poison_outputs());
    portable
}

/// A random generator seeded from `RGK_SEED` if set (to replay a failure), else from the clock; the seed
/// is printed so every failure can be replayed (`host::testing::seed`).
pub fn rng(test: &str) -> StdRng {
    StdRng::seed_from_u64(host::testing::seed(test))
}

/// Fuzz cases per op: `RGK_FUZZ_CASES` (the sanitizer runs use fewer), default `default`.
pub fn fuzz_cases(default: usize) -> usize {
    std::env::var("RGK_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// Uniform values in [lo, hi), rounded to `dtype`, as a host tensor.
pub fn uniform(rng: &mut StdRng, shape: &[usize], lo: f32, hi: f32, dtype: DType) -> HostTensor {
    let n: usize = shape.iter().product();
    HostTensor::new(
        (0..n).map(|_| rng.random_range(lo..hi)).collect(),
        shape,
        dtype,
    )
    .expect("shape and data agree")
}

/// `||out - ref|| / ||ref||` (2-norms, f64). Any NaN in `out` where `ref` is not NaN gives +inf, so NaN
/// (including unwritten poisoned outputs) never passes.
pub fn rel_err(out: &[f32], reference: &[f32]) -> f64 {
    assert_eq!(
        out.len(),
        reference.len(),
        "output and reference lengths differ"
    );
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&o, &r) in out.iter().zip(reference) {
        if r.is_nan() {
            if !o.is_nan() {
                return f64::INFINITY;
            }
            continue;
        }
        if !o.is_finite() && o != r {
            return f64::INFINITY;
        }
        if r.is_infinite() {
            continue; // equal infinities (checked above)
        }
        num += (o as f64 - r as f64).powi(2);
        den += (r as f64).powi(2);
    }
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

/// `max |out - ref|` (f64); a non-finite output gives +inf, so NaN (an unwritten poisoned element)
/// never passes. The attention kernels' rule compares it with the naive computation's.
pub fn max_abs_err(out: &[f32], reference: &[f32]) -> f64 {
    assert_eq!(out.len(), reference.len());
    out.iter().zip(reference).fold(0f64, |m, (&o, &r)| {
        if !o.is_finite() {
            f64::INFINITY
        } else {
            m.max((o as f64 - r as f64).abs())
        }
    })
}

/// Per-dtype relative-norm tolerance for elementwise results (docs/math/ops.md): f32 1e-5, f16 1e-3, bf16 8e-3.
pub fn tol(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-5,
        DType::F16 => 1e-3,
        DType::BF16 => 8e-3,
    }
}

/// Asserts `rel_err(out, reference) <= tol`, naming the case.
pub fn assert_close(case: &str, out: &[f32], reference: &[f32], tol: f64) {
    let e = rel_err(out, reference);
    if e > tol {
        // Name the worst elements (NaN first), so a failure says where, not only how much.
        let mut idx: Vec<usize> = (0..out.len()).collect();
        let dev = |i: usize| {
            if out[i].is_nan() != reference[i].is_nan() {
                f64::INFINITY
            } else {
                (out[i] as f64 - reference[i] as f64).abs()
            }
        };
        idx.sort_by(|&a, &b| dev(b).total_cmp(&dev(a)));
        let worst: Vec<String> = idx
            .iter()
            .take(4)
            .map(|&i| format!("[{i}] got {} want {}", out[i], reference[i]))
            .collect();
        panic!(
            "{case}: relative error {e:.3e} > {tol:.1e}; worst: {}",
            worst.join(", ")
        );
    }
}

/// The FlashAttention kernels (`FLASH_VARIANTS`) this build runs at head dim `d`, for tests that
/// cover every shipped kernel; panics (naming `case`) when there is none, so such a test cannot pass
/// having checked nothing.
pub fn flash_variants(gpu: &Gpu, d: usize, case: &str) -> Vec<u32> {
    use host::ops::attention::{FLASH_VARIANTS, flash_variant_supported};
    let v: Vec<u32> = FLASH_VARIANTS
        .into_iter()
        .filter(|&v| flash_variant_supported(gpu, v, d))
        .collect();
    assert!(
        !v.is_empty(),
        "{case}: no FlashAttention kernel at head dim {d}"
    );
    v
}

/// dQ, dK and dV of `g` each within `tol` (relative 2-norm) of its reference in `want`, named.
pub fn assert_grads_close(
    case: &str,
    g: &host::ops::attention::AttentionGrads,
    want: [&[f32]; 3],
    tol: f64,
) {
    for ((name, got), want) in [("dQ", &g.dq), ("dK", &g.dk), ("dV", &g.dv)]
        .into_iter()
        .zip(want)
    {
        assert_close(&format!("{case}: {name}"), &read(got), want, tol);
    }
}

/// Asserts an attention LSE against its reference: -inf exactly where the reference is (a row that
/// sees no key), else within `1e-3 (1 + |ref|)`; names the case and the row.
pub fn assert_lse_close(case: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{case}: LSE length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if w == f32::NEG_INFINITY {
            assert_eq!(g, w, "{case}: LSE row {i}");
        } else {
            assert!(
                (g as f64 - w as f64).abs() <= 1e-3 * (1.0 + (w as f64).abs()),
                "{case}: LSE row {i}: {g} vs {w}"
            );
        }
    }
}

/// Random shape of rank 1..=max_rank with dims from sizes that catch indexing bugs (1, odd, primes,
/// powers of two, non-multiples of the block), numel capped at `max_numel`.
pub fn random_shape(rng: &mut StdRng, max_rank: usize, max_numel: usize) -> Vec<usize> {
    const DIMS: [usize; 14] = [1, 2, 3, 5, 7, 17, 31, 64, 97, 128, 255, 257, 1000, 4099];
    loop {
        let rank = rng.random_range(1..=max_rank);
        let shape: Vec<usize> = (0..rank)
            .map(|_| DIMS[rng.random_range(0..DIMS.len())])
            .collect();
        if shape.iter().product::<usize>() <= max_numel {
            return shape;
        }
    }
}

/// Whether the tests run under compute-sanitizer (`cargo xtask sanitize` sets RGK_SANITIZE=1): the
/// sanitizer slows kernels 10-100x, so the largest sizes shrink (the shapes keep their odd tails).
pub fn sanitizing() -> bool {
    std::env::var("RGK_SANITIZE").is_ok_and(|v| v == "1")
}

/// `full` normally, `small` under the sanitizer.
pub fn scaled(full: usize, small: usize) -> usize {
    if sanitizing() { small } else { full }
}

/// A training run on the GPU against the all-reference run, step by step: each step's loss within
/// `loss_tol` relative, every named gradient within `grad_tol` max-norm relative (`max |g - r| / max
/// |r|`) and relative 2-norm (the norm of docs/math/ops.md). Prints the measured divergences, per step and overall.
pub fn assert_runs_match<S: TrainStep>(
    on_gpu: &[S],
    reference: &[S],
    loss_tol: f64,
    grad_tol: f64,
) {
    assert_eq!(on_gpu.len(), reference.len(), "runs of different lengths");
    for (step, (g, r)) in on_gpu.iter().zip(reference).enumerate() {
        let (gpu_loss, ref_loss) = (g.loss(), r.loss());
        let dl = (gpu_loss - ref_loss).abs() / ref_loss.abs();
        println!("step {step}: loss gpu {gpu_loss:.8} ref {ref_loss:.8} (rel {dl:.2e})");
        assert!(
            dl <= loss_tol,
            "step {step}: loss rel diff {dl:.3e} > {loss_tol:.0e}"
        );
        for ((name, gg), (_, rg)) in g.named_grads().into_iter().zip(r.named_grads()) {
            let e = host::replace::bisect::rel_max_diff(&gg.data, &rg.data);
            println!("step {step}: {name}: max-norm rel {e:.2e}");
            assert!(
                e <= grad_tol,
                "step {step}: gradient of {name} differs by {e:.3e} > {grad_tol:.0e}"
            );
            assert_close(
                &format!("step {step} grad {name}"),
                &gg.data,
                &rg.data,
                grad_tol,
            );
        }
    }
    let d = divergence(on_gpu, reference);
    println!(
        "all-GPU divergence: loss {:.2e}, grad {:.2e} ({})",
        d.loss, d.grad, d.worst_param
    );
}

/// The bit patterns of a tensor's values (as f32), for run-to-run and variant-to-variant identity.
pub fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec().unwrap().iter().map(|v| v.to_bits()).collect()
}

/// Attention options: causal or not, the default scale (`1 / sqrt(head_dim)`).
pub fn attention_params(causal: bool) -> host::ops::attention::AttentionParams<'static> {
    use host::ops::attention::{AttentionParams, Causal};
    AttentionParams {
        causal: if causal { Causal::Yes } else { Causal::No },
        scale: None,
        ..Default::default()
    }
}

/// A tensor's values as f32, read back.
pub fn read(t: &Tensor) -> Vec<f32> {
    t.to_vec().unwrap()
}

/// `x` `[B, H, S, D]` as `[B, S, H, D]` values.
pub fn to_bshd(x: &HostTensor) -> HostTensor {
    let [b, h, s, d] = x.shape[..] else {
        panic!("rank 4")
    };
    let mut out = vec![0f32; x.data.len()];
    for bi in 0..b {
        for hi in 0..h {
            for si in 0..s {
                let src = ((bi * h + hi) * s + si) * d;
                let dst = ((bi * s + si) * h + hi) * d;
                out[dst..dst + d].copy_from_slice(&x.data[src..src + d]);
            }
        }
    }
    HostTensor::new(out, &[b, s, h, d], x.dtype).unwrap()
}

/// `x` `[B, H, S, D]` uploaded as `[B, S, H, D]` memory, returned as its `[B, H, S, D]` view.
pub fn upload_bshd(gpu: &Gpu, x: &HostTensor) -> Tensor {
    Tensor::from_host(gpu, &to_bshd(x))
        .unwrap()
        .transpose(1, 2)
        .unwrap()
}

/// Whether `gpu` runs an attention feature of the sm_90 build (`what`: a sliding window, the
/// softcap); on another build checks that `call` (a forward asking for it) is refused by name, prints
/// a SKIP line for `test` and returns false.
pub fn sm90_feature_or_skip(
    gpu: &Gpu,
    test: &str,
    what: &str,
    call: impl FnOnce(&Tensor) -> host::Result<(Tensor, Tensor)>,
) -> bool {
    if gpu.ptx_arch() == "sm_90" {
        return true;
    }
    let q = Tensor::zeros(gpu, &[1, 1, 8, 64], DType::F16).unwrap();
    let e = call(&q).unwrap_err();
    assert!(e.to_string().contains("sm_90 build"), "{e}");
    println!("SKIP {test}: {what} needs the sm_90 build; this device refuses it by name");
    false
}

/// FlashAttention-2's `cu_seqlens` of packed sequences of lengths `lens`: `[0, l0, l0 + l1, ..]`.
pub fn offsets(lens: &[usize]) -> Vec<usize> {
    let mut cu = vec![0];
    for l in lens {
        cu.push(cu.last().unwrap() + l);
    }
    cu
}

/// Rows `r0..r1` of a packed contiguous `[T, H, D]` tensor as a `[1, H, r1 - r0, D]` view.
pub fn sequence_view(t: &Tensor, r0: usize, r1: usize) -> Tensor {
    let (h, d) = (t.shape()[1], t.shape()[2]);
    t.narrow(r0, r1 - r0)
        .unwrap()
        .reshape(&[1, r1 - r0, h, d])
        .unwrap()
        .transpose(1, 2)
        .unwrap()
}

/// Asserts a packed call against one dense call per sequence: O bit for bit, dQ, dK and dV within
/// `tol` (the packed and dense grids differ). `inputs`: the packed Q, K, V, dO (`[T, H, D]`);
/// `(o, g)`: the packed call's O and gradients; `per_seq(i, views)` runs sequence `i`'s dense
/// forward and backward on its `[1, H, S, D]` views ([`sequence_view`]) and returns its O and
/// gradients. Sequences without query rows are skipped.
pub fn assert_packed_matches_per_sequence(
    what: &str,
    inputs: [&Tensor; 4],
    (cu_q, cu_k): (&[usize], &[usize]),
    (o, g): (&Tensor, &host::ops::attention::AttentionGrads),
    tol: f64,
    per_seq: impl Fn(usize, [Tensor; 4]) -> (Tensor, host::ops::attention::AttentionGrads),
) {
    let [q, k, v, d_o] = inputs;
    let (o, gq, gk, gv) = (read(o), read(&g.dq), read(&g.dk), read(&g.dv));
    // [1, H, n, D] as the rows of [n, H, D] memory.
    let rows = |t: &Tensor| read(&t.transpose(1, 2).unwrap());
    for i in 0..cu_q.len() - 1 {
        let ((q0, q1), (k0, k1)) = ((cu_q[i], cu_q[i + 1]), (cu_k[i], cu_k[i + 1]));
        if q1 == q0 {
            continue;
        }
        let views = [
            sequence_view(q, q0, q1),
            sequence_view(k, k0, k1),
            sequence_view(v, k0, k1),
            sequence_view(d_o, q0, q1),
        ];
        let (os, gs) = per_seq(i, views);
        for (n, packed, per, (r0, r1), row) in [
            (
                "dQ",
                &gq,
                rows(&gs.dq),
                (q0, q1),
                q.shape()[1] * q.shape()[2],
            ),
            (
                "dK",
                &gk,
                rows(&gs.dk),
                (k0, k1),
                k.shape()[1] * k.shape()[2],
            ),
            (
                "dV",
                &gv,
                rows(&gs.dv),
                (k0, k1),
                v.shape()[1] * v.shape()[2],
            ),
        ] {
            assert_close(
                &format!("{what}: sequence {i} {n}"),
                &packed[r0 * row..r1 * row],
                &per,
                tol,
            );
        }
        let row = q.shape()[1] * q.shape()[2];
        assert_eq!(
            o[q0 * row..q1 * row]
                .iter()
                .map(|x| x.to_bits())
                .collect::<Vec<_>>(),
            rows(&os).iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            "{what}: sequence {i} O"
        );
    }
}

/// One case's packed batch: the offsets of its query and key lengths, the row totals, and fresh
/// Q, K, V and dO (`[T, H, D]`) on the host and uploaded.
#[allow(clippy::type_complexity)]
pub fn packed_inputs(
    gpu: &Gpu,
    r: &mut StdRng,
    (lq, lk, hq, hkv, d): (&[usize], &[usize], usize, usize, usize),
    dtype: DType,
) -> (
    (Vec<usize>, Vec<usize>),
    (usize, usize),
    [HostTensor; 4],
    [Tensor; 4],
) {
    let (cu_q, cu_k) = (offsets(lq), offsets(lk));
    let (tq, tk) = (cu_q[lq.len()], cu_k[lk.len()]);
    let host = [[tq, hq, d], [tk, hkv, d], [tk, hkv, d], [tq, hq, d]]
        .map(|shape| uniform(r, &shape, -1.0, 1.0, dtype));
    let dev = [0, 1, 2, 3].map(|i| Tensor::from_host(gpu, &host[i]).unwrap());
    ((cu_q, cu_k), (tq, tk), host, dev)
}
