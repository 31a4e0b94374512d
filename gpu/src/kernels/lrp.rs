//! Relevance propagation through a linear layer `y = W x + b` (spec: shared/specs/lrp.md), for all rows
//! in one launch sequence, as two matrix-shaped passes:
//!
//! 1. `lrp_sums`: per (row r, output j) `A = sum_i |x_ri| |W_ji|` and `S = sum_i x_ri W_ji` — two FMAs per
//!    product on the same operand tiles. Then `P = (A + S) / 2` and `N = (A - S) / 2` are the sums of the
//!    positive and negative parts of `c_i = x_i W_ji` (exactly: when every `c_i` has one sign, A = -S or
//!    A = S bit for bit, so the other sum is exactly 0).
//! 2. `lrp_coeffs` (elementwise, f64): saturation and aggregation in the spec's order, giving
//!    `coef_rj = R_rj * Pa / P'` (= `R_rj * Na / N'`: both reduce to `R_rj / (P' + N' + pb + nb)`, and
//!    the kernel stores their mean).
//! 3. `lrp_spread`: `G_ri = sum_j coef_rj |W_ji|` — one GEMM with |W| — and `lrp_finish`:
//!    `relevance_in_ri = |x_ri| G_ri`, which is `sum_j R_j |c_i| / D'_j`, the spec's redistribution.
//!
//! The GEMM passes tile `BM x BN` outputs per block over `BK`-deep stages held in shared memory (double
//! buffered, one barrier per stage), a `TM x TN` register tile per thread. Each split of the depth
//! writes its own partial tile; the finishing kernels add the splits in split order. No atomics, no
//! shared scalar written by many threads, the same bits on every run.
use crate::dev::math::fma;
use crate::dev::mem::{Slice, SliceMut};
use crate::dev::shared::SharedArray;
use crate::dev::sync::sync_threads;
use crate::dev::thread::{
    block_idx_x, block_idx_y, block_idx_z, global_index_x, grid_threads_x, thread_idx_x,
};
use crate::dev::{block, math64};
use crate::params::lrp::*;
use crate::params::{LrpCoeff, LrpFinish, LrpGemm};

const STAGE_A: usize = (BK * A_STRIDE) as usize;
const STAGE_B: usize = (BK * B_STRIDE) as usize;
crate::static_shared!(fn tile_a() -> [f32; 2 * STAGE_A] as LRP_TILE_A);
crate::static_shared!(fn tile_b() -> [f32; 2 * STAGE_B] as LRP_TILE_B);

/// What a GEMM pass accumulates.
const SUMS: u32 = 0; // acc0 += |a||b|, acc1 += a b; B is [N, K] (K contiguous)
const DENSE: u32 = 1; // acc0 += a b; B is [N, K]
const SPREAD: u32 = 2; // acc0 += a |b|; B is [K, N] (N contiguous)

const A_LOADS: usize = (BM * BK / THREADS as u64) as usize;
const B_LOADS: usize = (BN * BK / THREADS as u64) as usize;
const _: () = assert!(A_LOADS == 4 && B_LOADS == 8);

/// Block-level view of one pass: the tile origin and this split's depth range.
#[derive(Clone, Copy)]
struct Tile {
    m0: u64,
    n0: u64,
    k_begin: u64,
    k_end: u64,
}

/// Loads stage `k0` of the A operand (`[rows, depth]`, depth contiguous) into registers. Thread `tid`
/// covers rows `tid / 8 + 32 (q & 1)` at depth `8 (q >> 1) + tid % 8`: each warp reads four 32-byte row
/// segments, and the transposed shared stores below fall in distinct banks.
#[inline(always)]
fn fetch_a(a: &Slice<f32>, p: &LrpGemm, t: &Tile, k0: u64, tid: u64, ra: &mut [f32; A_LOADS]) {
    crate::unroll!(q in [0, 1, 2, 3] {
        let m = t.m0 + tid / 8 + 32 * (q as u64 & 1);
        let k = k0 + 8 * (q as u64 >> 1) + (tid & 7);
        ra[q] = if m < p.rows && k < t.k_end { a.get_ro(m * p.depth + k) } else { 0.0 };
    });
}

#[inline(always)]
fn store_a(stage: usize, tid: usize, ra: &[f32; A_LOADS]) {
    let s = tile_a();
    crate::unroll!(q in [0, 1, 2, 3] {
        let m = tid / 8 + 32 * (q & 1);
        let k = 8 * (q >> 1) + (tid & 7);
        s.store(stage * STAGE_A + k * A_STRIDE as usize + m, ra[q]);
    });
}

/// Loads stage `k0` of the B operand. `[N, K]` (SUMS, DENSE): like A, 32 columns per quarter.
/// `[K, N]` (SPREAD): a warp reads 32 consecutive columns of one depth row.
#[inline(always)]
fn fetch_b<const MODE: u32>(
    b: &Slice<f32>,
    p: &LrpGemm,
    t: &Tile,
    k0: u64,
    tid: u64,
    rb: &mut [f32; B_LOADS],
) {
    crate::unroll!(q in [0, 1, 2, 3, 4, 5, 6, 7] {
        let (n, k) = if MODE == SPREAD {
            (t.n0 + (tid & 127), k0 + (tid >> 7) + 2 * q as u64)
        } else {
            (t.n0 + tid / 8 + 32 * (q as u64 & 3), k0 + 8 * (q as u64 >> 2) + (tid & 7))
        };
        let at = if MODE == SPREAD { k * p.cols + n } else { n * p.depth + k };
        let v = if n < p.cols && k < t.k_end { b.get_ro(at) } else { 0.0 };
        rb[q] = if MODE == SPREAD { v.abs() } else { v };
    });
}

#[inline(always)]
fn store_b<const MODE: u32>(stage: usize, tid: usize, rb: &[f32; B_LOADS]) {
    let s = tile_b();
    crate::unroll!(q in [0, 1, 2, 3, 4, 5, 6, 7] {
        let (n, k) = if MODE == SPREAD {
            (tid & 127, (tid >> 7) + 2 * q)
        } else {
            (tid / 8 + 32 * (q & 3), 8 * (q >> 2) + (tid & 7))
        };
        s.store(stage * STAGE_B + k * B_STRIDE as usize + n, rb[q]);
    });
}

/// One shared stage into the register tiles: per depth step two `ld.shared.v4` of A (8 rows; 4 distinct
/// addresses per warp, one wavefront) and one of B (4 columns; 8 distinct per warp, one wavefront).
#[inline(always)]
fn compute<const MODE: u32>(
    stage: usize,
    row: usize,
    col: usize,
    acc0: &mut [[f32; 4]; 8],
    acc1: &mut [[f32; 4]; 8],
) {
    let (sa, sb): (
        SharedArray<f32, { 2 * STAGE_A }>,
        SharedArray<f32, { 2 * STAGE_B }>,
    ) = (tile_a(), tile_b());
    crate::unroll!(kk in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
        let abase = stage * STAGE_A + kk * A_STRIDE as usize + row;
        let (lo, hi) = (sa.load4(abase), sa.load4(abase + 4));
        let a = [lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]];
        let b = sb.load4(stage * STAGE_B + kk * B_STRIDE as usize + col);
        crate::unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7] {
            crate::unroll!(j in [0, 1, 2, 3] {
                if MODE == SUMS {
                    acc0[i][j] = fma(a[i].abs(), b[j].abs(), acc0[i][j]);
                    acc1[i][j] = fma(a[i], b[j], acc1[i][j]);
                } else {
                    acc0[i][j] = fma(a[i], b[j], acc0[i][j]);
                }
            });
        });
    });
}

/// The tiled pass: block (x, y, z) = (column tile, row tile, depth split). Writes the split's partial
/// tile to `out0[split][rows][cols]` (and `out1` for SUMS).
#[inline(always)]
unsafe fn gemm<const MODE: u32>(
    a: Slice<f32>,
    b: Slice<f32>,
    out0: SliceMut<f32>,
    out1: SliceMut<f32>,
    p: LrpGemm,
) {
    let tid = thread_idx_x() as usize;
    let (lane, warp) = (tid & 31, tid >> 5);
    let row = ((warp as u64 / WARPS_N) * LANES_M * TM + (lane as u64 / LANES_N) * TM) as usize;
    let col = ((warp as u64 % WARPS_N) * LANES_N * TN + (lane as u64 % LANES_N) * TN) as usize;
    let split = block_idx_z() as u64;
    let k_begin = split * p.k_per_split;
    let t = Tile {
        m0: block_idx_y() as u64 * BM,
        n0: block_idx_x() as u64 * BN,
        k_begin,
        k_end: (k_begin + p.k_per_split).min(p.depth),
    };
    let stages = t.k_end.saturating_sub(t.k_begin).div_ceil(BK);
    let mut acc0 = [[0.0f32; 4]; 8];
    let mut acc1 = [[0.0f32; 4]; 8];
    let mut ra = [0.0f32; A_LOADS];
    let mut rb = [0.0f32; B_LOADS];
    fetch_a(&a, &p, &t, t.k_begin, tid as u64, &mut ra);
    fetch_b::<MODE>(&b, &p, &t, t.k_begin, tid as u64, &mut rb);
    store_a(0, tid, &ra);
    store_b::<MODE>(0, tid, &rb);
    sync_threads();
    let mut s = 0u64;
    while s < stages {
        // Stage s is in buffer s & 1. Stage s + 1 goes to the other buffer, last read during stage s - 1,
        // which the barrier closing that iteration has finished: one barrier per stage suffices.
        let more = s + 1 < stages;
        if more {
            let k0 = t.k_begin + (s + 1) * BK;
            fetch_a(&a, &p, &t, k0, tid as u64, &mut ra);
            fetch_b::<MODE>(&b, &p, &t, k0, tid as u64, &mut rb);
        }
        compute::<MODE>((s & 1) as usize, row, col, &mut acc0, &mut acc1);
        if more {
            store_a(((s + 1) & 1) as usize, tid, &ra);
            store_b::<MODE>(((s + 1) & 1) as usize, tid, &rb);
        }
        sync_threads();
        s += 1;
    }
    let base = split * p.rows * p.cols;
    crate::unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7] {
        let m = t.m0 + (row + i) as u64;
        if m < p.rows {
            crate::unroll!(j in [0, 1, 2, 3] {
                let n = t.n0 + (col + j) as u64;
                if n < p.cols {
                    out0.set(base + m * p.cols + n, acc0[i][j]);
                    if MODE == SUMS {
                        out1.set(base + m * p.cols + n, acc1[i][j]);
                    }
                }
            });
        }
    });
}

/// Split partials of element `e` of a `rows x cols` pass, added in split order.
#[inline(always)]
fn split_sum(ws: &Slice<f32>, e: u64, numel: u64, splits: u64) -> f32 {
    let mut v = 0.0f32;
    let mut s = 0;
    while s < splits {
        v += ws.get_ro(s * numel + e);
        s += 1;
    }
    v
}

/// The activation function `f` of a `non_mono` layer, in f64.
#[inline(always)]
fn act_fn(func: u32, x: f64) -> f64 {
    match func {
        FUNC_SIGMOID => math64::sigmoid(x),
        FUNC_SWISH => x * math64::sigmoid(0.75 * x),
        FUNC_WAVE => x * core::f64::consts::E / (math64::exp(-x) + math64::exp(x)),
        FUNC_PULSE => {
            let t = math64::tanh(x);
            1.0 - t * t
        }
        FUNC_ABSOLUTE => x * math64::tanh(x),
        FUNC_HARD_SIGMOID => {
            let y = 0.2 * x + 0.5;
            if y < 0.0 {
                0.0
            } else if y > 1.0 {
                1.0
            } else {
                y
            }
        }
        FUNC_TANH => math64::tanh(x),
        _ => x,
    }
}

/// Per (row, output): P and N from the split sums, saturation, stabilisation and aggregation in the
/// spec's order (f64), and the coefficient `R_j Pa / P'` (= `R_j Na / N'`) as f32.
#[inline(always)]
fn coefficient(a: f32, s: f32, bias: f32, rel: f32, p: &LrpCoeff) -> f32 {
    let (a, s) = (a as f64, s as f64);
    let mut pos = ((a + s) * 0.5).max(0.0);
    let mut neg = ((a - s) * 0.5).max(0.0);
    let b = bias as f64;
    let (pb, nb) = (b.max(0.0), (-b).max(0.0));
    if p.kind != KIND_NULL {
        let t = pos + pb - neg - nb;
        let f = (p.kind == KIND_NON_MONO).then(|| {
            (
                act_fn(p.func, t),
                act_fn(p.func, pos + pb),
                act_fn(p.func, -(neg + nb)),
            )
        });
        if t < p.lower as f64 {
            pos = 0.0;
        }
        if t > p.upper as f64 {
            neg = 0.0;
        }
        if let Some((ft, fp, fn_)) = f {
            if pos > 0.0 && neg > 0.0 {
                if ft == fp {
                    neg = 0.0;
                } else if ft == fn_ {
                    pos = 0.0;
                }
            }
        }
    }
    let pp = if pos == 0.0 { 1.0 } else { pos };
    let nn = if neg == 0.0 { 1.0 } else { neg };
    let d = pp + nn + pb + nb;
    let pa = ((pp + pb) / d) * (pp / (pp + pb));
    let na = ((nn + nb) / d) * (nn / (nn + nb));
    (rel as f64 * (0.5 * (pa / pp + na / nn))) as f32
}

#[inline(always)]
unsafe fn coeffs(
    ws_a: Slice<f32>,
    ws_s: Slice<f32>,
    rel: Slice<f32>,
    bias: Slice<f32>,
    coef: SliceMut<f32>,
    p: LrpCoeff,
) {
    let numel = p.rows * p.cols;
    let mut e = global_index_x();
    while e < numel {
        let a = split_sum(&ws_a, e, numel, p.splits);
        let s = split_sum(&ws_s, e, numel, p.splits);
        let b = if p.has_bias != 0 {
            bias.get_ro(e % p.cols)
        } else {
            0.0
        };
        coef.set(e, coefficient(a, s, b, rel.get_ro(e), &p));
        e += grid_threads_x();
    }
}

/// `relevance_in = |x| * sum over splits of G`.
#[inline(always)]
unsafe fn finish(ws_g: Slice<f32>, x: Slice<f32>, out: SliceMut<f32>, p: LrpFinish) {
    let numel = p.rows * p.cols;
    let mut e = global_index_x();
    while e < numel {
        let g = split_sum(&ws_g, e, numel, p.splits);
        out.set(e, x.get_ro(e).abs() * g);
        e += grid_threads_x();
    }
}

/// Dense forward epilogue: `y = f(sum over splits + b)`, the nonlinearity in f64.
#[inline(always)]
unsafe fn dense_finish(ws: Slice<f32>, bias: Slice<f32>, out: SliceMut<f32>, p: LrpFinish) {
    let numel = p.rows * p.cols;
    let mut e = global_index_x();
    while e < numel {
        let mut v = split_sum(&ws, e, numel, p.splits);
        if p.has_bias != 0 {
            v += bias.get_ro(e % p.cols);
        }
        let y = match p.func {
            FWD_RELU => {
                if v > 0.0 {
                    v
                } else {
                    0.0
                }
            }
            FWD_TANH => math64::tanh(v as f64) as f32,
            FWD_SIGMOID => math64::sigmoid(v as f64) as f32,
            _ => v,
        };
        out.set(e, y);
        e += grid_threads_x();
    }
}

/// Count of non-finite elements in this block's grid-stride share, one partial per block.
#[inline(always)]
unsafe fn nonfinite_partials(x: Slice<f32>, partials: SliceMut<f32>) {
    let mut count = 0.0f32;
    let mut e = global_index_x();
    while e < x.len {
        if !x.get_ro(e).is_finite() {
            count += 1.0;
        }
        e += grid_threads_x();
    }
    // Counts of non-negative values: a positive count stays positive however the block adds them.
    let total = block::reduce_sum(count);
    if thread_idx_x() == 0 {
        partials.set(block_idx_x() as u64, total);
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn lrp_sums_f32(
    x: Slice<f32>,
    w: Slice<f32>,
    ws_a: SliceMut<f32>,
    ws_s: SliceMut<f32>,
    p: LrpGemm,
) {
    unsafe { gemm::<SUMS>(x, w, ws_a, ws_s, p) }
}

#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn lrp_spread_f32(
    coef: Slice<f32>,
    w: Slice<f32>,
    ws_g: SliceMut<f32>,
    p: LrpGemm,
) {
    unsafe { gemm::<SPREAD>(coef, w, ws_g, ws_g, p) }
}

#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn dense_f32(
    x: Slice<f32>,
    w: Slice<f32>,
    ws: SliceMut<f32>,
    p: LrpGemm,
) {
    unsafe { gemm::<DENSE>(x, w, ws, ws, p) }
}

#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn lrp_coeffs_f32(
    ws_a: Slice<f32>,
    ws_s: Slice<f32>,
    rel: Slice<f32>,
    bias: Slice<f32>,
    coef: SliceMut<f32>,
    p: LrpCoeff,
) {
    unsafe { coeffs(ws_a, ws_s, rel, bias, coef, p) }
}

#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn lrp_finish_f32(
    ws_g: Slice<f32>,
    x: Slice<f32>,
    out: SliceMut<f32>,
    p: LrpFinish,
) {
    unsafe { finish(ws_g, x, out, p) }
}

#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn dense_finish_f32(
    ws: Slice<f32>,
    bias: Slice<f32>,
    out: SliceMut<f32>,
    p: LrpFinish,
) {
    unsafe { dense_finish(ws, bias, out, p) }
}

#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn nonfinite_partials_f32(x: Slice<f32>, partials: SliceMut<f32>) {
    unsafe { nonfinite_partials(x, partials) }
}
