//! Shared test support: the GPU (or a visible SKIP), seeded random inputs, error norms.
#![allow(dead_code)]
use host::{DType, Gpu, HostTensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The GPU with poison mode on (every op output starts as NaN bytes), or `None` after printing a SKIP
/// line that says why. GPU tests call this first and return early on `None`.
pub fn gpu_or_skip(test: &str) -> Option<Gpu> {
    match Gpu::new(0) {
        Ok(gpu) => {
            gpu.set_poison_outputs(true);
            Some(gpu)
        }
        Err(e) => {
            println!("SKIP {test}: {e}");
            None
        }
    }
}

/// A random generator seeded from `RGK_SEED` if set (to replay a failure), else from the clock; the seed
/// is printed so every failure can be replayed.
pub fn rng(test: &str) -> StdRng {
    let seed = std::env::var("RGK_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
    });
    println!("{test}: seed {seed} (replay with RGK_SEED={seed})");
    StdRng::seed_from_u64(seed)
}

/// Fuzz cases per op: `RGK_FUZZ_CASES` (the sanitizer runs use fewer), default `default`.
pub fn fuzz_cases(default: usize) -> usize {
    std::env::var("RGK_FUZZ_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

/// Uniform values in [lo, hi), rounded to `dtype`, as a host tensor.
pub fn uniform(rng: &mut StdRng, shape: &[usize], lo: f32, hi: f32, dtype: DType) -> HostTensor {
    let n: usize = shape.iter().product();
    HostTensor::new((0..n).map(|_| rng.random_range(lo..hi)).collect(), shape, dtype).expect("shape and data agree")
}

/// `||out - ref|| / ||ref||` (2-norms, f64). Any NaN in `out` where `ref` is not NaN gives +inf, so NaN
/// (including unwritten poisoned outputs) never passes.
pub fn rel_err(out: &[f32], reference: &[f32]) -> f64 {
    assert_eq!(out.len(), reference.len(), "output and reference lengths differ");
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
    if den == 0.0 { num.sqrt() } else { (num / den).sqrt() }
}

/// Per-dtype relative-norm tolerance for elementwise results (ops.md): f32 1e-5, f16 1e-3, bf16 8e-3.
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
    assert!(e <= tol, "{case}: relative error {e:.3e} > {tol:.1e}");
}

/// Random shape of rank 1..=max_rank with dims from sizes that catch indexing bugs (1, odd, primes,
/// powers of two, non-multiples of the block), numel capped at `max_numel`.
pub fn random_shape(rng: &mut StdRng, max_rank: usize, max_numel: usize) -> Vec<usize> {
    const DIMS: [usize; 14] = [1, 2, 3, 5, 7, 17, 31, 64, 97, 128, 255, 257, 1000, 4099];
    loop {
        let rank = rng.random_range(1..=max_rank);
        let shape: Vec<usize> = (0..rank).map(|_| DIMS[rng.random_range(0..DIMS.len())]).collect();
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
