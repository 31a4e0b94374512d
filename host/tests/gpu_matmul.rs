//! GPU matmul against the CPU reference in f64: f16/bf16 (the tensor-core kernels `matmul_tc_*`, and
//! `matmul_tma_*` on compute capability 9.0) and
//! f32 in each [`Precision`] (3xTF32 and TF32 on tensor cores: `matmul_wg_tf32x3_*_f32` and
//! `matmul_wg_tf32_*_f32` on compute capability 9.0, TF32 also on 128 x 256 tiles
//! (`matmul_wg_tf32w_*_f32`) where they fill the GPU, `matmul_tf32x3_*_f32` and `matmul_tf32_*_f32`
//! elsewhere and through a `Build::Portable` handle; IEEE on CUDA cores, `matmul_simt_*_f32`),
//! through the same shape grids.
//!
//! f32 bounds (docs/math/matmul.md): `Ieee` as above with `u = 2^-24`; `Tf32x3` adds the split's
//! `5 2^-22 abs` and its k-tile chains' truncation, `12 2^-23 abs`; `Tf32` rounds each operand to
//! 11 significant bits or truncates it (on sm_90 an operand stored k-contiguous: A `M x K`, B
//! `N x K`), `4 2^-11 abs` with both truncated (plus the same accumulation terms). The relative
//! 2-norm must
//! be under 1e-5 (`Ieee`, `Tf32x3`) or 2e-3 (`Tf32`).
//!
//! Tolerance, per element: the kernel multiplies f16/bf16 values exactly (a product of two 11- or
//! 8-bit significands fits fp32's 24), sums them in fp32 and rounds the sum once to the output dtype.
//! With `ref` the exact (f64) sum and `abs = sum_k |a_ik| |b_kj|`:
//! `|out - ref| <= u |ref| + (1 + u) gamma abs + tiny`, where `u` is the output dtype's unit roundoff
//! (2^-11 f16, 2^-8 bf16), `gamma = 2 K 2^-24` bounds fp32 accumulation over K terms (the textbook
//! `K u32` doubled, because the tensor cores' internal adds are not documented as round-to-nearest),
//! and `tiny = 2^-24` covers f16 outputs in the subnormal range. NaN fails this check (comparisons with
//! NaN are false), so unwritten, poisoned outputs never pass. On top, the relative 2-norm error must be
//! under 1e-3 (f16) / 8e-3 (bf16) (`docs/math/ops.md`, Tolerances).
//!
//! Inputs are uniform in [-1, 1) rounded to the dtype, fresh every run (seed printed; replay with
//! `RGK_SEED`). Outputs are poisoned (0xFF bytes = NaN) before every launch. Products too large for a
//! full CPU reference are checked on sampled rows (first, last, tile boundaries, random).
mod common;
use common::*;
use host::ops::matmul::{self, Precision, Transpose, reference};
use host::{DType, Gpu, HostTensor, Tensor};
use rand::Rng;
use rand::rngs::StdRng;

const DTYPES: [DType; 2] = [DType::F16, DType::BF16];
const TRANSPOSES: [(Transpose, Transpose); 4] = [
    (Transpose::No, Transpose::No),
    (Transpose::No, Transpose::Yes),
    (Transpose::Yes, Transpose::No),
    (Transpose::Yes, Transpose::Yes),
];

/// One product: `op(A)` is `m x k`, `op(B)` is `k x n`; a batch on either or both operands.
#[derive(Clone, Copy, Debug)]
struct Case {
    m: usize,
    n: usize,
    k: usize,
    batch_a: Option<usize>,
    batch_b: Option<usize>,
    ta: Transpose,
    tb: Transpose,
    dtype: DType,
    /// Ignored for f16/bf16.
    precision: Precision,
}

const PRECISIONS: [Precision; 3] = [Precision::Tf32x3, Precision::Tf32, Precision::Ieee];

fn case(m: usize, n: usize, k: usize, ta: Transpose, tb: Transpose, dtype: DType) -> Case {
    Case {
        m,
        n,
        k,
        batch_a: None,
        batch_b: None,
        ta,
        tb,
        dtype,
        precision: Precision::default(),
    }
}

/// Stored shape of an operand whose `op()` is `rows x cols`.
fn stored(batch: Option<usize>, rows: usize, cols: usize, t: Transpose) -> Vec<usize> {
    let (r, c) = match t {
        Transpose::No => (rows, cols),
        Transpose::Yes => (cols, rows),
    };
    batch.map_or(vec![r, c], |b| vec![b, r, c])
}

fn unit_roundoff(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => (2.0f64).powi(-11),
        DType::BF16 => (2.0f64).powi(-8),
        DType::F32 => (2.0f64).powi(-24),
    }
}

fn abs_of(t: &HostTensor) -> HostTensor {
    HostTensor::new(t.data.iter().map(|v| v.abs()).collect(), &t.shape, t.dtype).unwrap()
}

/// The inputs of `c` (random, in the dtype), the GPU product, and the inputs kept for the reference.
fn run(gpu: &Gpu, rng: &mut StdRng, c: &Case) -> (HostTensor, HostTensor, HostTensor) {
    let a = uniform(rng, &stored(c.batch_a, c.m, c.k, c.ta), -1.0, 1.0, c.dtype);
    let b = uniform(rng, &stored(c.batch_b, c.k, c.n, c.tb), -1.0, 1.0, c.dtype);
    let (da, db) = (
        Tensor::from_host(gpu, &a).unwrap(),
        Tensor::from_host(gpu, &b).unwrap(),
    );
    let out = matmul::matmul_with(&da, &db, c.ta, c.tb, c.precision)
        .unwrap_or_else(|e| panic!("{c:?}: {e}"))
        .to_host()
        .unwrap();
    (a, b, out)
}

/// Checks rows `rows` (as (batch, row) pairs) of `out` against the f64 reference: the per-element
/// bound of the module doc and the relative 2-norm.
fn check_rows(c: &Case, a: &HostTensor, b: &HostTensor, out: &HostTensor, rows: &[(usize, usize)]) {
    let batch = c.batch_a.or(c.batch_b);
    let want_shape = match batch {
        Some(bt) => vec![bt, c.m, c.n],
        None => vec![c.m, c.n],
    };
    assert_eq!(out.shape, want_shape, "{c:?}");
    assert_eq!(out.dtype, c.dtype, "{c:?}");
    let (aa, ba) = (abs_of(a), abs_of(b));
    let u = unit_roundoff(c.dtype);
    let split = match (c.dtype, c.precision) {
        (DType::F32, Precision::Tf32x3) => 5.0 * (2.0f64).powi(-22) + 12.0 * (2.0f64).powi(-23),
        (DType::F32, Precision::Tf32) => 4.0 * (2.0f64).powi(-11) + 12.0 * (2.0f64).powi(-23),
        _ => 0.0,
    };
    let gamma = 2.0 * c.k as f64 * (2.0f64).powi(-24) + split;
    let tiny = (2.0f64).powi(-24);
    let (mut got_all, mut want_all) = (vec![], vec![]);
    for &(z, i) in rows {
        let want = reference::matmul_row(a, b, c.ta, c.tb, z, i).unwrap();
        let abs = reference::matmul_row(&aa, &ba, c.ta, c.tb, z, i).unwrap();
        let got = &out.data[(z * c.m + i) * c.n..][..c.n];
        for j in 0..c.n {
            let bound = u * want[j].abs() + (1.0 + u) * gamma * abs[j] + tiny;
            let err = (got[j] as f64 - want[j]).abs();
            assert!(
                err <= bound,
                "{c:?}: C[{z}][{i}][{j}] = {} but the f64 reference is {} (error {err:.3e} > bound \
                 {bound:.3e})",
                got[j],
                want[j]
            );
        }
        got_all.extend_from_slice(got);
        want_all.extend(want.iter().map(|&v| v as f32));
    }
    let norm_tol = match (c.dtype, c.precision) {
        (DType::F32, Precision::Tf32) => 2e-3,
        _ => tol(c.dtype),
    };
    assert_close(&format!("{c:?}"), &got_all, &want_all, norm_tol);
}

/// Each case, checked on five sampled rows plus the edges.
fn check_on_sampled_rows(gpu: &Gpu, rng: &mut StdRng, cases: &[Case]) {
    for c in cases {
        let (a, b, out) = run(gpu, rng, c);
        let rows = sampled_rows(rng, c.m, 5);
        check_rows(c, &a, &b, &out, &rows);
    }
}

fn all_rows(c: &Case) -> Vec<(usize, usize)> {
    let nb = c.batch_a.or(c.batch_b).unwrap_or(1);
    (0..nb)
        .flat_map(|z| (0..c.m).map(move |i| (z, i)))
        .collect()
}

/// First and last rows, both sides of the 128-row tile boundaries nearby, and `extra` random rows.
fn sampled_rows(rng: &mut StdRng, m: usize, extra: usize) -> Vec<(usize, usize)> {
    let mut rows = vec![0, 1, 127, 128, m / 2, m - 2, m - 1];
    rows.extend((0..extra).map(|_| rng.random_range(0..m)));
    rows.retain(|&r| r < m);
    rows.sort();
    rows.dedup();
    rows.into_iter().map(|r| (0, r)).collect()
}

/// Small and odd shapes (1, primes, one past a tile, exact tiles, aligned rows with tails, K = 0), every
/// transpose combination, every dtype, checked on every element. Row alignment decides the load path:
/// for f16/bf16 a stored row of a multiple of 8 elements takes `cp.async`, anything else the
/// element-wise path; for f32 a multiple of 4 takes 16-byte loads, anything else scalar copies; the
/// list covers both for A, B and C.
#[test]
fn matmul_matches_f64_reference_on_odd_shapes() {
    let Some(gpu) = gpu_or_skip_tma_stores("matmul_matches_f64_reference_on_odd_shapes") else {
        return;
    };
    let mut rng = rng("matmul_matches_f64_reference_on_odd_shapes");
    let shapes = [
        (1, 1, 1),
        (17, 33, 9),
        (127, 129, 65),
        (255, 64, 1000),
        (8, 8, 8),
        (128, 256, 64),
        (136, 264, 72),
        (129, 257, 65),
        (300, 520, 200),
        (64, 1, 128),
        (1, 300, 17),
        (256, 512, 192),
        (3, 5, 0),
        // Tails of every tile size (256 and 128 rows, 64-deep k) and a long K on 16-byte rows (many
        // trips through the register-pipelined loop).
        (257, 129, 65),
        (264, 136, 136),
        (256, 256, 128),
        (392, 264, 1032),
        // The f32 kernel's 8- and 16-deep k-tiles and a long odd K (scalar copy path).
        (257, 129, 17),
        (128, 128, 8),
        (128, 128, 16),
        (255, 131, 1000),
    ];
    let n = fuzz_cases(shapes.len()).min(shapes.len());
    for &(m, nn, k) in &shapes[..n] {
        for dtype in DType::ALL {
            let precisions: &[Precision] = if dtype == DType::F32 {
                &PRECISIONS
            } else {
                &[Precision::Tf32x3]
            };
            for &precision in precisions {
                for (ta, tb) in TRANSPOSES {
                    let c = Case {
                        precision,
                        ..case(m, nn, k, ta, tb, dtype)
                    };
                    let (a, b, out) = run(&gpu, &mut rng, &c);
                    check_rows(&c, &a, &b, &out, &all_rows(&c));
                }
            }
        }
    }
}

/// Large products on sampled rows: the benchmark's odd shape (N = 4097 forces the element-wise path
/// for B and C) and an aligned one with tails in every dim and a long K (many pipeline trips).
#[test]
fn matmul_large_products_match_on_sampled_rows() {
    let Some(gpu) = gpu_or_skip_tma_stores("matmul_large_products_match_on_sampled_rows") else {
        return;
    };
    let mut rng = rng("matmul_large_products_match_on_sampled_rows");
    let big = scaled(4095, 300);
    let long_k = scaled(4104, 520);
    let cases = [
        case(big, big + 2, 1000, Transpose::No, Transpose::No, DType::F16),
        case(
            big,
            big + 2,
            1000,
            Transpose::Yes,
            Transpose::Yes,
            DType::BF16,
        ),
        case(
            big,
            big + 2,
            1000,
            Transpose::No,
            Transpose::Yes,
            DType::BF16,
        ),
        case(520, 776, long_k, Transpose::No, Transpose::No, DType::F16),
        case(520, 776, long_k, Transpose::Yes, Transpose::No, DType::BF16),
        case(520, 776, long_k, Transpose::No, Transpose::Yes, DType::F16),
        case(1032, 1160, long_k, Transpose::No, Transpose::No, DType::F16),
        // f32: B and C rows unaligned at N = 4097 (scalar copies for B, scalar stores for C), and
        // aligned with tails and a long K (many trips through both stages).
        case(big, big + 2, 1000, Transpose::No, Transpose::No, DType::F32),
        case(
            big,
            big + 2,
            1000,
            Transpose::Yes,
            Transpose::Yes,
            DType::F32,
        ),
        case(520, 776, long_k, Transpose::Yes, Transpose::No, DType::F32),
        case(
            scaled(1032, 136),
            scaled(1160, 264),
            long_k,
            Transpose::Yes,
            Transpose::Yes,
            DType::BF16,
        ),
    ];
    check_on_sampled_rows(&gpu, &mut rng, &cases);
}

/// Batched products: both operands batched, or one 2-D operand broadcast over the other's batch;
/// unaligned (odd) and aligned (multiple-of-8) rows, every transpose, both dtypes.
#[test]
fn matmul_batched_matches_f64_reference() {
    let Some(gpu) = gpu_or_skip_tma_stores("matmul_batched_matches_f64_reference") else {
        return;
    };
    let mut rng = rng("matmul_batched_matches_f64_reference");
    for (m, n, k, bt) in [(65, 47, 33, 3), (136, 264, 72, 2)] {
        for (batch_a, batch_b) in [(Some(bt), Some(bt)), (Some(bt), None), (None, Some(bt))] {
            for dtype in DType::ALL {
                for (ta, tb) in TRANSPOSES {
                    let c = Case {
                        batch_a,
                        batch_b,
                        ..case(m, n, k, ta, tb, dtype)
                    };
                    let (a, b, out) = run(&gpu, &mut rng, &c);
                    check_rows(&c, &a, &b, &out, &all_rows(&c));
                }
            }
        }
    }
}

/// Random shapes from sizes that catch indexing bugs, random transposes, dtype and batching.
#[test]
fn matmul_random_shapes_fuzz() {
    let Some(gpu) = gpu_or_skip_tma_stores("matmul_random_shapes_fuzz") else {
        return;
    };
    let mut rng = rng("matmul_random_shapes_fuzz");
    const DIMS: [usize; 17] = [
        1, 2, 3, 7, 8, 9, 16, 17, 63, 64, 65, 127, 128, 129, 255, 256, 257,
    ];
    for _ in 0..fuzz_cases(24) {
        let mut pick = || DIMS[rng.random_range(0..DIMS.len())];
        let (m, n, k) = (pick(), pick(), pick());
        let batched = rng.random_range(0..4);
        let bt = rng.random_range(1..4);
        let c = Case {
            batch_a: (batched & 1 == 1).then_some(bt),
            batch_b: (batched & 2 == 2).then_some(bt),
            ..case(
                m,
                n,
                k,
                TRANSPOSES[rng.random_range(0..4)].0,
                TRANSPOSES[rng.random_range(0..4)].1,
                DTYPES[rng.random_range(0..2)],
            )
        };
        let (a, b, out) = run(&gpu, &mut rng, &c);
        check_rows(&c, &a, &b, &out, &all_rows(&c));
    }
}

/// Same inputs, same bits: no atomics, a fixed k order per element (and split-K slices summed in
/// slice order). Compared bit for bit
/// (f16/bf16 -> f32 is exact and one-to-one), on an aligned and an unaligned shape.
#[test]
fn matmul_repeated_runs_are_bit_identical() {
    let Some(gpu) = gpu_or_skip_tma_stores("matmul_repeated_runs_are_bit_identical") else {
        return;
    };
    let mut rng = rng("matmul_repeated_runs_are_bit_identical");
    // The f32 shape has 16 output tiles and a deep K: split along the depth (the default 3xTF32).
    for (m, n, k, dtype) in [
        (scaled(1024, 256), 1024, 1024, DType::F16),
        (scaled(777, 129), 1029, 515, DType::BF16),
        (512, 512, scaled(8192, 2048), DType::F32),
    ] {
        let a = uniform(&mut rng, &[m, k], -1.0, 1.0, dtype);
        let b = uniform(&mut rng, &[k, n], -1.0, 1.0, dtype);
        let (da, db) = (
            Tensor::from_host(&gpu, &a).unwrap(),
            Tensor::from_host(&gpu, &b).unwrap(),
        );
        let bits = || -> Vec<u32> {
            matmul::matmul(&da, &db, Transpose::No, Transpose::No)
                .unwrap()
                .to_vec()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect()
        };
        let first = bits();
        for run in 1..4 {
            assert!(
                first == bits(),
                "{m}x{n}x{k} {dtype}: run {run} differs from run 0"
            );
        }
    }
}

/// Each f32 precision runs the kernel it names: on a shape with tails, `Ieee` and `Tf32x3` stay
/// within fp32's 1e-5 relative 2-norm (docs/math/ops.md), and `Tf32` is measurably coarser (above
/// 1e-5: 10-bit mantissas give 3e-4 to 7e-4 on uniform inputs), so no precision is silently
/// swapped.
#[test]
fn matmul_f32_precisions_run_what_they_name() {
    let Some(gpu) = gpu_or_skip("matmul_f32_precisions_run_what_they_name") else {
        return;
    };
    let mut rng = rng("matmul_f32_precisions_run_what_they_name");
    for precision in PRECISIONS {
        for (ta, tb) in TRANSPOSES {
            let c = Case {
                precision,
                // Leading dims 132 and 260 (multiples of 4: the tensor-core kernels run), with
                // tails past the 128-wide tiles and the 32-deep k-tiles.
                ..case(132, 260, 132, ta, tb, DType::F32)
            };
            let (a, b, out) = run(&gpu, &mut rng, &c);
            let want = reference::matmul(&a, &b, ta, tb).unwrap();
            let err = rel_l2(&out.data, &want.data);
            if precision == Precision::Tf32 {
                assert!(
                    err > 1e-5 && err < 2e-3,
                    "{c:?}: relative error {err:.3e}, expected TF32's (1e-5, 2e-3)"
                );
            } else {
                assert!(err < 1e-5, "{c:?}: relative error {err:.3e} >= 1e-5");
            }
        }
    }
}

fn rel_l2(got: &[f32], want: &[f32]) -> f64 {
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&g, &w) in got.iter().zip(want) {
        num += (g as f64 - w as f64).powi(2);
        den += (w as f64).powi(2);
    }
    if num.is_nan() {
        f64::INFINITY
    } else {
        (num / den.max(1e-300)).sqrt()
    }
}

/// The error table of docs/PERF_NOTES.md: every precision on the matrix products of the Clifford
/// layers at the bench grid (a linear map `(C B, N) x (N, N)`, its weight gradient
/// `(N, C B) x (C B, N)` with the depth split, and the transposed input gradient), measured on sampled
/// rows against f64: the largest `|err| / sum_k |a_ik b_kj|` and the relative 2-norm. Each row is
/// also held to the bound of [`check_rows`].
#[test]
fn matmul_f32_precision_error_table() {
    let Some(gpu) = gpu_or_skip("matmul_f32_precision_error_table") else {
        return;
    };
    let mut rng = rng("matmul_f32_precision_error_table");
    let batches = [1024, 4096, 8192];
    let features = [128, 512, 1024];
    println!("precision | product | M x N x K | max err / abs | rel 2-norm");
    for (bi, &bt) in batches.iter().enumerate() {
        for (fi, &n) in features.iter().enumerate() {
            if fuzz_cases(9) < 9 && (bi + fi) % 4 != 0 {
                continue;
            }
            // Grade-1 slab of the 2D layer: 2 components.
            let rows = 2 * bt;
            let products = [
                (
                    "linear",
                    case(rows, n, n, Transpose::No, Transpose::No, DType::F32),
                ),
                (
                    "grad_in",
                    case(rows, n, n, Transpose::No, Transpose::Yes, DType::F32),
                ),
                (
                    "grad_weight",
                    case(n, n, rows, Transpose::Yes, Transpose::No, DType::F32),
                ),
            ];
            for (what, base) in products {
                for precision in PRECISIONS {
                    let c = Case { precision, ..base };
                    let (a, b, out) = run(&gpu, &mut rng, &c);
                    let sample = sampled_rows(&mut rng, c.m, 6);
                    check_rows(&c, &a, &b, &out, &sample);
                    let (aa, ba) = (abs_of(&a), abs_of(&b));
                    let (mut worst, mut got_all, mut want_all) = (0.0f64, vec![], vec![]);
                    for &(z, i) in &sample {
                        let want = reference::matmul_row(&a, &b, c.ta, c.tb, z, i).unwrap();
                        let abs = reference::matmul_row(&aa, &ba, c.ta, c.tb, z, i).unwrap();
                        let got = &out.data[i * c.n..][..c.n];
                        for j in 0..c.n {
                            let e = (got[j] as f64 - want[j]).abs() / abs[j].max(1e-30);
                            worst = worst.max(e);
                        }
                        got_all.extend_from_slice(got);
                        want_all.extend(want.iter().map(|&v| v as f32));
                    }
                    println!(
                        "{precision:?} | {what} | {} x {} x {} | {worst:.2e} | {:.2e}",
                        c.m,
                        c.n,
                        c.k,
                        rel_l2(&got_all, &want_all)
                    );
                }
            }
        }
    }
}

/// C's bits after `matmul_f32_into(a, b)` with `bias`: accumulating, C starts as `c0` (and its old
/// values are added); otherwise it is a fresh tensor of `c0`'s shape, poisoned (NaN) in tests.
fn f32_into_bits(
    gpu: &Gpu,
    (a, b): (&Tensor, &Tensor),
    (ta, tb): (Transpose, Transpose),
    bias: Option<&Tensor>,
    (c0, accumulate): (&HostTensor, bool),
    precision: Precision,
    what: &str,
) -> Vec<u32> {
    let out = if accumulate {
        Tensor::from_host(gpu, c0).unwrap()
    } else {
        Tensor::empty(gpu, &c0.shape, DType::F32).unwrap()
    };
    matmul::matmul_f32_into(a, b, ta, tb, bias, &out, accumulate, precision)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    out.to_vec().unwrap().iter().map(|x| x.to_bits()).collect()
}

/// The overwrite, bias-row and accumulate paths the Clifford layers use (`matmul_f32_into`) against
/// the f64 reference (product + bias + old C), on an aligned and an odd shape, every transpose,
/// batched; and the same bits on a second run.
#[test]
fn matmul_f32_into_bias_and_accumulate_match_f64_reference() {
    let Some(gpu) = gpu_or_skip("matmul_f32_into_bias_and_accumulate_match_f64_reference") else {
        return;
    };
    let mut rng = rng("matmul_f32_into_bias_and_accumulate_match_f64_reference");
    // The last two shapes have 15 output tiles and a deep K: the tensor-core precisions split it.
    // The finishing pass sums the slices four columns at a time where N is a multiple of 4 (516),
    // column by column otherwise (514, reached with B transposed: B's rows are then K long).
    let shapes = [
        (scaled(520, 136), 392, 1040, None),
        (131, 257, 67, Some(2)),
        (260, 516, scaled(8200, 2056), None),
        (260, 514, scaled(8200, 2056), None),
    ];
    for (m, n, k, batch) in shapes {
        for (ta, tb) in TRANSPOSES {
            for (with_bias, accumulate, precision) in [
                (false, false, Precision::Tf32x3),
                (true, false, Precision::Tf32x3),
                (true, true, Precision::Tf32x3),
                (true, true, Precision::Ieee),
                (true, true, Precision::Tf32),
            ] {
                let a = uniform(&mut rng, &stored(batch, m, k, ta), -1.0, 1.0, DType::F32);
                let b = uniform(&mut rng, &stored(batch, k, n, tb), -1.0, 1.0, DType::F32);
                let bias = uniform(&mut rng, &[n], -1.0, 1.0, DType::F32);
                let out_shape = batch.map_or(vec![m, n], |bt| vec![bt, m, n]);
                let c0 = uniform(&mut rng, &out_shape, -1.0, 1.0, DType::F32);
                let (da, db, dbias) = (
                    Tensor::from_host(&gpu, &a).unwrap(),
                    Tensor::from_host(&gpu, &b).unwrap(),
                    Tensor::from_host(&gpu, &bias).unwrap(),
                );
                let what = format!(
                    "{m}x{n}x{k} batch {batch:?} {ta:?} {tb:?} bias {with_bias} accumulate \
                     {accumulate} {precision:?}"
                );
                let bits = || {
                    let bias = with_bias.then_some(&dbias);
                    f32_into_bits(
                        &gpu,
                        (&da, &db),
                        (ta, tb),
                        bias,
                        (&c0, accumulate),
                        precision,
                        &what,
                    )
                };
                let want = bits();
                let product = reference::matmul(&a, &b, ta, tb).unwrap();
                let reference: Vec<f32> = product
                    .data
                    .iter()
                    .enumerate()
                    .map(|(i, &p)| {
                        let mut r = p as f64;
                        if with_bias {
                            r += bias.data[i % n] as f64;
                        }
                        if accumulate {
                            r += c0.data[i] as f64;
                        }
                        r as f32
                    })
                    .collect();
                let got: Vec<f32> = want.iter().map(|&w| f32::from_bits(w)).collect();
                let norm_tol = if precision == Precision::Tf32 {
                    2e-3
                } else {
                    tol(DType::F32)
                };
                assert_close(&what, &got, &reference, norm_tol);
                assert!(bits() == want, "{what}: a second run changed bits");
            }
        }
    }
}

/// TF32 products at least 2048 deep whose 128 x 256 tiles of C take fewer waves of the device's SMs
/// take the wide kernels on compute capability 9.0 (`matmul_wg_tf32w_*`,
/// `params::matmul_wg_tf32::wide`; the premise is asserted for each shape). One product with tails in M, N (the last tile's second
/// column block 4 columns wide) and K, on sampled rows; batches of small products whose N ends inside
/// a tile's first column block, on sampled rows of three entries, with B batched or broadcast; every
/// transpose; then with a bias and the old C added, and the same bits on a second run. Under
/// compute-sanitizer, the first batched shape with both orientations of A.
#[test]
fn matmul_tf32_wide_tiles_match_f64_reference() {
    use gpu::params::matmul_wg_tf32::wide;
    let Some(gpu) = gpu_or_skip("matmul_tf32_wide_tiles_match_f64_reference") else {
        return;
    };
    let mut rng = rng("matmul_tf32_wide_tiles_match_f64_reference");
    let sms = gpu.sm_count().unwrap() as usize;
    // One wave of wide tiles against two of narrow ones: 10 wide (19 narrow) tiles a row block of
    // the first shape, 4 (6) an entry of the others.
    let n1: usize = 2308;
    let m1 = 128 * (sms / 10 - 1) + 3;
    let bt = sms / 4;
    // (m, n, k, batch of A, batch of B)
    let shapes = [
        (m1, n1, 2068, None, None),
        (129, 300, 2052, Some(bt), Some(bt)),
        (131, 260, 2100, Some(bt), None),
    ];
    // Under compute-sanitizer (each launch many times slower): the first batched shape, one wide
    // tile an SM, with both orientations of A (the `n` and `t` kernels).
    let (shapes, transposes) = if sanitizing() {
        (&shapes[1..2], &[TRANSPOSES[0], TRANSPOSES[3]][..])
    } else {
        (&shapes[..], &TRANSPOSES[..])
    };
    for &(m, n, k, batch_a, batch_b) in shapes {
        let entries = batch_a.or(batch_b).unwrap_or(1);
        assert!(
            wide(m as u64, n as u64, k as u64, entries as u64, sms as u64),
            "{m}x{n} x{entries} on {sms} SMs: the shape does not take the wide tiles"
        );
        for &(ta, tb) in transposes {
            let c = Case {
                batch_a,
                batch_b,
                precision: Precision::Tf32,
                ..case(m, n, k, ta, tb, DType::F32)
            };
            let (a, b, out) = run(&gpu, &mut rng, &c);
            // Sampled rows of the first, a middle and the last entry.
            let rows: Vec<(usize, usize)> = sampled_rows(&mut rng, m, 3)
                .into_iter()
                .flat_map(|(_, i)| {
                    let mut zs = vec![0, entries / 2, entries - 1];
                    zs.dedup();
                    zs.into_iter().map(move |z| (z, i))
                })
                .collect();
            check_rows(&c, &a, &b, &out, &rows);
        }
    }
    // Bias and accumulate through the store warps' second column block. Not under the sanitizer,
    // for time: those adds are the narrow kernels' (`store_element4`), which
    // `matmul_f32_into_bias_and_accumulate_match_f64_reference` runs there.
    if sanitizing() {
        return;
    }
    let (m, n, k) = (m1, n1, 2068);
    for (ta, tb) in TRANSPOSES {
        let a = uniform(&mut rng, &stored(None, m, k, ta), -1.0, 1.0, DType::F32);
        let b = uniform(&mut rng, &stored(None, k, n, tb), -1.0, 1.0, DType::F32);
        let bias = uniform(&mut rng, &[n], -1.0, 1.0, DType::F32);
        let c0 = uniform(&mut rng, &[m, n], -1.0, 1.0, DType::F32);
        let (da, db, dbias) = (
            Tensor::from_host(&gpu, &a).unwrap(),
            Tensor::from_host(&gpu, &b).unwrap(),
            Tensor::from_host(&gpu, &bias).unwrap(),
        );
        let what = format!("{m}x{n}x{k} {ta:?} {tb:?} Tf32, bias and accumulate");
        let bits = || {
            f32_into_bits(
                &gpu,
                (&da, &db),
                (ta, tb),
                Some(&dbias),
                (&c0, true),
                Precision::Tf32,
                &what,
            )
        };
        let first = bits();
        let (mut got, mut want) = (vec![], vec![]);
        for (_, i) in sampled_rows(&mut rng, m, 5) {
            let row = reference::matmul_row(&a, &b, ta, tb, 0, i).unwrap();
            for j in 0..n {
                want.push((row[j] + bias.data[j] as f64 + c0.data[i * n + j] as f64) as f32);
                got.push(f32::from_bits(first[i * n + j]));
            }
        }
        assert_close(&what, &got, &want, 2e-3);
        assert!(bits() == first, "{what}: a second run changed bits");
    }
}

/// Which kernel a 16-bit product takes: on compute capability 9.0 with the default build, the Hopper
/// kernel (`matmul_tma_*`: TMA, mbarrier pipeline, wgmma) wherever every row (A's, B's, C's) is
/// 16-byte aligned, the `mma.sync` kernel (`matmul_tc_*`) elsewhere and always with `Build::Portable`. The
/// Hopper kernel is then checked against the f64 reference on products with more output tiles than
/// the device has SMs (each persistent CTA walks several tiles, across batch entries, with tails in
/// M, N and K), both operands batched or one broadcast, every transpose, both dtypes.
#[test]
fn matmul_hopper_kernel_takes_aligned_products() {
    let Some(gpu) = gpu_or_skip_tma_stores("matmul_hopper_kernel_takes_aligned_products") else {
        return;
    };
    let mut rng = rng("matmul_hopper_kernel_takes_aligned_products");
    let hopper = gpu.ptx_arch() == "sm_90";
    if !hopper {
        println!(
            "SKIP matmul_hopper_kernel_takes_aligned_products (Hopper part): {} runs the {} build",
            gpu.name(),
            gpu.ptx_arch()
        );
    }
    let portable = Gpu::with_build(0, host::Build::Portable).unwrap();
    let kernel = |g: &Gpu, c: &Case| {
        let a = Tensor::empty(g, &stored(c.batch_a, c.m, c.k, c.ta), c.dtype).unwrap();
        let b = Tensor::empty(g, &stored(c.batch_b, c.k, c.n, c.tb), c.dtype).unwrap();
        matmul::matmul_kernel(&a, &b, c.ta, c.tb).unwrap()
    };
    let sms = gpu.sm_count().unwrap() as usize;
    // 9 x 3 tiles of 128 x 256 a product; enough batch entries for about 1.5 tiles per SM.
    let batch = (3 * sms / 2).div_ceil(27).max(2);
    for dtype in DTYPES {
        for (ta, tb) in TRANSPOSES {
            let aligned = case(1032, 520, 136, ta, tb, dtype);
            for (batch_a, batch_b) in [(Some(batch), Some(batch)), (Some(batch), None)] {
                let c = Case {
                    batch_a,
                    batch_b,
                    ..aligned
                };
                let name = kernel(&gpu, &c);
                let want = if hopper { "matmul_tma_" } else { "matmul_tc_" };
                assert!(
                    name.starts_with(want),
                    "{c:?} takes {name}, expected {want}*"
                );
                assert!(
                    kernel(&portable, &c).starts_with("matmul_tc_"),
                    "{c:?}: portable build"
                );
                let (a, b, out) = run(&gpu, &mut rng, &c);
                let mut rows: Vec<(usize, usize)> = vec![(0, 0), (batch - 1, c.m - 1)];
                for z in 0..batch {
                    rows.push((z, rng.random_range(0..c.m)));
                    rows.push((z, 1024 + rng.random_range(0..8)));
                }
                check_rows(&c, &a, &b, &out, &rows);
            }
            // Rows the copy engine cannot read (K = 100: a 200-byte row of A or B), and an odd N.
            for c in [
                case(1032, 520, 100, ta, tb, dtype),
                case(1032, 521, 136, ta, tb, dtype),
            ] {
                let name = kernel(&gpu, &c);
                let lda_ok = if ta == Transpose::No {
                    c.k % 8 == 0
                } else {
                    c.m % 8 == 0
                };
                let ldb_ok = if tb == Transpose::No {
                    c.n % 8 == 0
                } else {
                    c.k % 8 == 0
                };
                let want = if hopper && lda_ok && ldb_ok && c.n % 2 == 0 {
                    "matmul_tma_"
                } else {
                    "matmul_tc_"
                };
                assert!(
                    name.starts_with(want),
                    "{c:?} takes {name}, expected {want}*"
                );
            }
        }
    }
    // f32 products choose by precision: no single answer.
    let a = Tensor::empty(&gpu, &[4, 4], DType::F32).unwrap();
    assert!(matmul::matmul_kernel(&a, &a, Transpose::No, Transpose::No).is_err());
}

/// The sm_80 build's f32 tensor-core kernels (`matmul_tf32x3_*_f32`, `matmul_tf32_*_f32`: `mma.sync`),
/// which a 9.0 device runs only through a `Build::Portable` handle (its own build takes the wgmma
/// kernels): both precisions, every transpose with tails in M, N and K, a depth split, and a batch
/// broadcasting B, against the f64 reference on sampled rows. On a device below 9.0 the two handles
/// run the same build, so this repeats part of the other tests.
#[test]
fn matmul_f32_portable_build_matches_f64_reference() {
    let Some(gpu) = gpu_or_skip("matmul_f32_portable_build_matches_f64_reference") else {
        return;
    };
    let portable = portable_build(&gpu);
    let mut rng = rng("matmul_f32_portable_build_matches_f64_reference");
    let mut cases = Vec::new();
    for precision in [Precision::Tf32x3, Precision::Tf32] {
        for (ta, tb) in TRANSPOSES {
            cases.push(Case {
                precision,
                ..case(200, 132, 72, ta, tb, DType::F32)
            });
        }
        // 4 output tiles and a deep K: split along the depth.
        cases.push(Case {
            precision,
            ..case(
                256,
                256,
                scaled(4096, 1024),
                Transpose::No,
                Transpose::No,
                DType::F32,
            )
        });
        cases.push(Case {
            precision,
            batch_a: Some(3),
            ..case(65, 48, 40, Transpose::Yes, Transpose::Yes, DType::F32)
        });
    }
    check_on_sampled_rows(&portable, &mut rng, &cases);
}
