//! Relevance propagation through a linear layer `y = W x + b` (docs/math/lrp.md), for all rows
//! in one launch sequence, as two matrix-shaped passes:
//!
//! 1. `lrp_sums`: per (row r, output j) `A = sum_i |x_ri| |W_ji|` and `S = sum_i x_ri W_ji` — two FMAs per
//!    product on the same operand tiles. Then `P = (A + S) / 2` and `N = (A - S) / 2` are the sums of the
//!    positive and negative parts of `c_i = x_i W_ji` (exactly: when every `c_i` has one sign, A = -S or
//!    A = S bit for bit, so the other sum is exactly 0).
//! 2. `lrp_coeffs` (elementwise, f64): saturation and aggregation in the order of docs/math/lrp.md, giving
//!    `coef_rj = R_rj * Pa / P'` (= `R_rj * Na / N'`: both reduce to `R_rj / (P' + N' + pb + nb)`, and
//!    the kernel stores their mean).
//! 3. `lrp_spread`: `G_ri = sum_j coef_rj |W_ji|` — one GEMM with |W| — and `lrp_finish`:
//!    `relevance_in_ri = |x_ri| G_ri`, which is `sum_j R_j |c_i| / D'_j`, the redistribution of docs/math/lrp.md.
//!
//! The GEMM passes tile `BM x BN` outputs per block over `BK`-deep stages held in shared memory (double
//! buffered from registers, one barrier per stage); each warp computes a 32 x 32 piece with tensor-core
//! `mma.m16n8k8` in "3xTF32" form (below). Each split of the depth writes its own partial tile; the
//! finishing kernels add the splits in split order. No atomics, no shared scalar written by many
//! threads, the same bits on every run (an mma is a fixed circuit: same inputs, same bits).
//!
//! # 3xTF32 and its error
//! Each f32 operand is split `v = hi + lo + e` with `hi = tf32(v)`, `lo = tf32(v - hi)`, `|e| <= 2^-22 |v|`
//! (`dev::mma::split_tf32`), and `a b` is taken as `a_lo b_hi + a_hi b_lo + a_hi b_hi` (three mma, the
//! small terms first), within `3 * 2^-22 |a b|` ~ `7.2e-7 |a b|` per product. The mma adds its 8
//! products and the incoming accumulator with truncation (not round-to-nearest), so a long chain of mma
//! on one accumulator would drift low by up to an ulp per step (~`K/8 * 6e-8` relative over a depth K:
//! 3e-5 at K = 4096). Instead every depth step of 8 starts a fresh fragment from zero, and that 8-term
//! partial is added to the f32 accumulator with a round-to-nearest `add`: the truncation then costs at
//! most ~2 ulp of each 8-term partial (`2.4e-7` relative, not growing with K), and the accumulation over
//! K/8 partials has the error of an ordinary f32 sum. Altogether, with `A = sum |x_i W_ji|`:
//! `|error of A or S| <= (1e-6 + (K/8) 2^-24) A` in the worst case (the second term is the f32 sum's
//! bound, as for the FFMA loop it replaces; typical errors are ~sqrt of it), well inside the tests'
//! 1e-5 relative tolerance and, from K = 16 on, inside the saturation slack `margin(K) A` of
//! tests/gpu_lrp.rs. The abs sum uses the split of `|v|`, which is `(|hi|, sign(v) lo)`
//! (`dev::mma::split_abs`), not `|lo|`.
//!
//! # The pipelined passes (`lrp_sums_v5_f32`, `lrp_spread_v5_f32`, `dense_v5_f32`; module `v3`)
//! What runs wherever the operands allow (the register-staged kernels above are the fallback). The same
//! block tile, warps, 3xTF32 products and split-K; what changes is how stages arrive and how long a
//! fresh fragment runs (layouts, bank analysis and CPU-emulated checks: `params::lrp::v3`):
//! - Stages are `v3::BK = 32` deep (four k-steps) and arrive by 16-byte `cp.async.cg` copies in a
//!   pipeline of `v3::STAGES = 4` buffers of dynamic shared memory, so three stages of loads are in
//!   flight while one is computed and no register holds a load. Per stage `kt`, one barrier: wait until
//!   stage kt has landed (at most 2 newer groups pending), barrier (which also means every warp is done
//!   with stage kt - 1), start stage kt + 3's copies into kt - 1's buffer, commit, compute stage kt.
//!   Tiles keep the global orientation: `[row][k]` (x, coef, and `W` as `[N][K]` in the sums and dense
//!   passes) at a row stride of 40 floats, the spread pass's `W` as `[k][n]` at 132.
//! - Chunks outside the matrix (rows, columns, depth past the split's end) are zero-filled by the copy
//!   itself (`src_size = 0`); zeros add nothing to either sum. Copies need 16-byte rows: `I` and `O`
//!   multiples of 4 and 16-byte aligned bases. The host checks that per pass and otherwise runs the
//!   register-staged kernel (with its own split), so a pass's kernel and summation order follow from the shape
//!   and the buffers' alignment, never from timing.
//! - The depths of a k-step are dealt to the fragment slots so that a lane's two values of a row (A) or
//!   a column (B `[n][k]`) are adjacent depths (`v3::slot_depth`): one `ld.shared.v2` each. The mma
//!   adds its 8 products in a fixed circuit whatever depth feeds which slot; A and B agree on the deal.
//! - A fresh fragment covers a whole stage: per tile and product, a chain of 4 k-steps x 3 mma (the
//!   small terms first within each k-step) from zero, then one round-to-nearest `add` into the f32
//!   accumulator: a quarter of the register-staged kernels' adds.
//! - The 3xTF32 split is done by integer operations (`params::lrp::v5`: `hi` rounded as
//!   `cvt.rna.tf32.f32` rounds it, `lo` truncated): sm_90 has no tf32 conversion instruction and ptxas
//!   expands each `cvt.rna` into about four, which made half of the issue slots (SASS per warp and
//!   stage: sums 995 instructions for 192 HMMA, spread 745 for 96; with the integer split 738 and 488).
//!
//! Error: a product's split costs `5 2^-22 |a b|` (with `cvt.rna`'s split it would be `3 2^-22`; bound
//! in `params::lrp::v5`); the analysis below is written for `3 2^-22` and holds with that substitution. A chain of `3 s` mma
//! (`s <= 4` k-steps of the stage) truncates once per mma, each time by up to about an ulp of the
//! running partial (the model above), which never exceeds `Σ`, the stage's sum of `|a b|` over its 32
//! depths: at most `12 * 2^-23 Σ ~ 1.4e-6 Σ` per stage partial (the default: about 2 ulp of an 8-term
//! partial), relative to the partial and not growing with K; it is one-sided (low), so about half of it
//! is a bias. The K/32 partials are added with round-to-nearest, an ordinary f32 sum of half the
//! default's length. Altogether `|error of A or S| <= (2.2e-6 + (K/32) 2^-24) A` in the worst case:
//! below the default's bound from K = 64 on (K = 4096: `9.8e-6 A`, the default `3.2e-5 A`), and inside
//! the saturation slack `margin(K) A` of tests/gpu_lrp.rs from K = 64 on; at K = 16..32 the worst case
//! (every truncation a full ulp, all of one sign) exceeds `margin(K)` by up to 0.4e-6 A, where the
//! default's exceeds it below K = 16. Typical errors are far smaller (the f32 sum's ~sqrt, a bias of
//! ~0.7e-6 A at most). Determinism is unchanged: each output is one thread's fixed sequence of mma and
//! adds, the splits are added in split order by the finishing kernels.
//!
//! Occupancy: the sums pass holds 64 accumulators and 64 stage partials a thread, so it runs one block
//! of 8 warps per SM (up to 255 registers); the spread and dense passes (32 + 32) are bounded to 128
//! registers for two blocks per SM. (Other pipelines measured and deleted: docs/PERF_NOTES.md,
//! "Deleted kernels".)
use crate::dev::mem::{Slice, SliceMut};
use crate::dev::mma::{FragC, mma_tf32, split_abs, split_tf32};
use crate::dev::shared::SharedScalar;
use crate::dev::sync::sync_threads;
use crate::dev::thread::{
    block_idx_x, block_idx_y, block_idx_z, global_index_x, grid_threads_x, thread_idx_x,
};
use crate::dev::{block, math64};
use crate::dev::{opaque_u32, opaque_u64};
use crate::params::lrp::*;
use crate::params::{LrpCoeff, LrpFinish, LrpGemm};

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
/// segments; the transposed shared stores below (stride 8 mod 32 words) conflict at most 2-way.
#[inline(always)]
fn fetch_a(a: &Slice<f32>, p: &LrpGemm, t: &Tile, k0: u64, tid: u64, ra: &mut [f32; A_LOADS]) {
    let (m, k) = (t.m0 + tid / 8, k0 + (tid & 7));
    // Element index of quarter q: base + (q & 1) 32 rows + (q >> 1) 8 deep.
    let base = m * p.depth + k;
    let rows32 = 32 * p.depth;
    crate::unroll!(q in [0, 1, 2, 3] {
        let (dm, dk) = (32 * (q as u64 & 1), 8 * (q as u64 >> 1));
        let at = base + if q & 1 == 1 { rows32 } else { 0 } + dk;
        ra[q] = if m + dm < p.rows && k + dk < t.k_end { a.get_ro(at) } else { 0.0 };
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
    if MODE == SPREAD {
        let (n, k) = (t.n0 + (tid & 127), k0 + (tid >> 7));
        // Quarter q is 2q depth rows further: a running index, one add per load.
        let mut at = k * p.cols + n;
        crate::unroll!(q in [0, 1, 2, 3, 4, 5, 6, 7] {
            let v = if n < p.cols && k + 2 * (q as u64) < t.k_end { b.get_ro(at) } else { 0.0 };
            rb[q] = v.abs();
            at += 2 * p.cols;
        });
        let _ = at; // the last trip's step is not used
    } else {
        let (n, k) = (t.n0 + tid / 8, k0 + (tid & 7));
        // Quarter q: base + (q & 3) 32 rows + (q >> 2) 8 deep.
        let base = n * p.depth + k;
        let rows32 = 32 * p.depth;
        crate::unroll!(q in [0, 1, 2, 3, 4, 5, 6, 7] {
            let (dn, dk) = (32 * (q as u64 & 3), 8 * (q as u64 >> 2));
            let at = base + (q as u64 & 3) * rows32 + dk;
            rb[q] = if n + dn < p.cols && k + dk < t.k_end { b.get_ro(at) } else { 0.0 };
        });
    }
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

/// An operand fragment split for 3xTF32: the high parts and the remainders.
#[derive(Clone, Copy)]
struct Split<const N: usize> {
    hi: [u32; N],
    lo: [u32; N],
}

impl<const N: usize> Split<N> {
    #[inline(always)]
    fn of(v: [f32; N]) -> Self {
        let mut s = Split {
            hi: [0; N],
            lo: [0; N],
        };
        crate::unroll_lt!(r < N, {
            (s.hi[r], s.lo[r]) = split_tf32(v[r]);
        });
        s
    }

    /// [`Split::of`] by integer operations (the pipelined passes, `params::lrp::v5`): `hi` the same, `lo`
    /// truncated instead of rounded; about four instructions a value instead of nine.
    #[inline(always)]
    fn of_fast(v: [f32; N]) -> Self {
        let mut s = Split {
            hi: [0; N],
            lo: [0; N],
        };
        crate::unroll_lt!(r < N, {
            (s.hi[r], s.lo[r]) = crate::params::lrp::v5::split_tf32_fast(v[r]);
        });
        s
    }

    /// The split of the absolute values.
    #[inline(always)]
    fn abs(&self) -> Self {
        let mut s = *self;
        crate::unroll_lt!(r < N, {
            (s.hi[r], s.lo[r]) = split_abs(self.hi[r], self.lo[r]);
        });
        s
    }
}

/// `acc += a b` for one 16x8x8 tile in 3xTF32: a fresh fragment from zero takes the two correction
/// terms and then the main product, and is added to `acc` with round-to-nearest (see the module doc).
#[inline(always)]
fn mma3(acc: &mut FragC, a: &Split<4>, b: &Split<2>) {
    let mut t = mma_tf32([0.0; 4], &a.lo, &b.hi);
    t = mma_tf32(t, &a.hi, &b.lo);
    t = mma_tf32(t, &a.hi, &b.hi);
    crate::unroll!(r in [0, 1, 2, 3] {
        acc[r] += t[r];
    });
}

/// Accumulators of a warp's 32 x 32 piece: `M_TILES x N_TILES` mma tiles.
type Acc = [[FragC; N_TILES]; M_TILES];

/// One shared stage through the tensor cores: per depth step of 8, the warp's A fragments (`M_TILES`,
/// four scalar `ld.shared` each) and B fragments (`N_TILES`, two each) at conflict-free addresses
/// (`params::lrp::frag_a_offset`), split once, then 3 mma per tile and product (SUMS: two products,
/// `|a||b|` into `acc0` and `a b` into `acc1`). `a_addr` / `b_addr` are this thread's fragment bases
/// in the stage (shared addresses); every load is base + a constant.
#[inline(always)]
fn compute<const MODE: u32>(a_addr: u32, b_addr: u32, acc0: &mut Acc, acc1: &mut Acc) {
    // SAFETY (loads below): base + delta is `frag_*_offset(..) < STAGE_*` floats into the stage the
    // caller's address points at, inside the static arrays (unit-tested in params); written before the
    // barrier that precedes this call.
    let lda = |d: usize| unsafe { f32::ld_shared(a_addr + 4 * d as u32) };
    let ldb = |d: usize| unsafe { f32::ld_shared(b_addr + 4 * d as u32) };
    crate::unroll!(step in [0, 1] {
        let ks = step * MMA_K as usize;
        let mut a = [Split::<4> { hi: [0; 4], lo: [0; 4] }; M_TILES];
        crate::unroll_lt!(mi < M_TILES, {
            let mut v = [0.0f32; 4];
            crate::unroll!(r in [0, 1, 2, 3] {
                v[r] = lda(frag_a_delta(mi, ks, r));
            });
            a[mi] = Split::of(v);
        });
        let mut b = [Split::<2> { hi: [0; 2], lo: [0; 2] }; N_TILES];
        crate::unroll_lt!(ni < N_TILES, {
            let mut v = [0.0f32; 2];
            crate::unroll!(r in [0, 1] {
                v[r] = ldb(frag_b_delta(ni, ks, r));
            });
            b[ni] = Split::of(v);
        });
        crate::unroll_lt!(mi < M_TILES, {
            crate::unroll_lt!(ni < N_TILES, {
                if MODE == SUMS {
                    mma3(&mut acc0[mi][ni], &a[mi].abs(), &b[ni].abs());
                    mma3(&mut acc1[mi][ni], &a[mi], &b[ni]);
                } else {
                    mma3(&mut acc0[mi][ni], &a[mi], &b[ni]);
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
    let split = block_idx_z() as u64;
    let k_begin = split * p.k_per_split;
    let t = Tile {
        m0: block_idx_y() as u64 * BM,
        n0: block_idx_x() as u64 * BN,
        k_begin,
        k_end: (k_begin + p.k_per_split).min(p.depth),
    };
    let stages = t.k_end.saturating_sub(t.k_begin).div_ceil(BK);
    // This thread's fragment bases in stage 0, hidden from the optimiser (see `opaque_u32`).
    let a_frag = opaque_u32(tile_a().addr(frag_a_base(warp, lane)));
    let b_frag = opaque_u32(tile_b().addr(frag_b_base(warp, lane)));
    let mut acc0: Acc = [[[0.0; 4]; N_TILES]; M_TILES];
    let mut acc1: Acc = [[[0.0; 4]; N_TILES]; M_TILES];
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
            // Opaque: addresses are recomputed from k0 each stage rather than kept as one 64-bit
            // induction variable per load (see PERF_NOTES).
            let k0 = opaque_u64(t.k_begin + (s + 1) * BK);
            fetch_a(&a, &p, &t, k0, tid as u64, &mut ra);
            fetch_b::<MODE>(&b, &p, &t, k0, tid as u64, &mut rb);
        }
        let buf = (s & 1) as u32;
        compute::<MODE>(
            a_frag + buf * (4 * STAGE_A) as u32,
            b_frag + buf * (4 * STAGE_B) as u32,
            &mut acc0,
            &mut acc1,
        );
        if more {
            store_a(((s + 1) & 1) as usize, tid, &ra);
            store_b::<MODE>(((s + 1) & 1) as usize, tid, &rb);
        }
        sync_threads();
        s += 1;
    }
    let base = split * p.rows * p.cols;
    crate::unroll_lt!(mi < M_TILES, {
        crate::unroll_lt!(ni < N_TILES, {
            crate::unroll!(r in [0, 1, 2, 3] {
                let (dm, dn) = acc_coords(warp, lane, mi, ni, r);
                let (m, n) = (t.m0 + dm, t.n0 + dn);
                if m < p.rows && n < p.cols {
                    out0.set(base + m * p.cols + n, acc0[mi][ni][r]);
                    if MODE == SUMS {
                        out1.set(base + m * p.cols + n, acc1[mi][ni][r]);
                    }
                }
            });
        });
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
/// order of docs/math/lrp.md (f64), and the coefficient `R_j Pa / P'` (= `R_j Na / N'`) as f32.
#[inline(always)]
fn coefficient(a: f32, s: f32, bias: f32, rel: f32, p: &LrpCoeff) -> f32 {
    let (a, s) = (a as f64, s as f64);
    let mut pos = ((a + s) * 0.5).max(0.0);
    let mut neg = ((a - s) * 0.5).max(0.0);
    let b = bias as f64;
    let (pb, nb) = (b.max(0.0), (-b).max(0.0));
    if p.kind != KIND_NULL {
        let t = pos + pb - neg - nb;
        // An `if`, not `bool::then` with a closure: the closure is not `inline(always)`, and with two
        // kernels calling `coefficient` (lrp_coeffs_f32, lrp_sums_v6_coef_f32) LLVM made it a
        // called function with a 160-byte stack frame.
        let f = if p.kind == KIND_NON_MONO {
            Some((
                act_fn(p.func, t),
                act_fn(p.func, pos + pb),
                act_fn(p.func, -(neg + nb)),
            ))
        } else {
            None
        };
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
    // The reference formula's `Pa / P'` (docs/math/lrp.md) is `((P' + pb) / d) (P' / (P' + pb)) / P'`, which is exactly `1 / d` for
    // every finite `P' > 0` (`P' + pb > 0`, `d > 0`), and so is `Na / N'`: one f64 division instead of
    // six (the f64 divisions made this pass compute bound: 72 us at 1024 x 4096 on an H200). An
    // infinite sum keeps the reference formula's value, `inf / inf` = NaN.
    if d.is_infinite() {
        return f32::NAN;
    }
    (rel as f64 / d) as f32
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
    // The bias index `e % cols` with a 32-bit remainder where every index fits (a 64-bit `rem` is
    // a long software sequence on the GPU).
    let small = numel <= u32::MAX as u64;
    let mut e = global_index_x();
    while e < numel {
        let a = split_sum(&ws_a, e, numel, p.splits);
        let s = split_sum(&ws_s, e, numel, p.splits);
        let b = if p.has_bias != 0 {
            let j = if small {
                (e as u32 % p.cols as u32) as u64
            } else {
                e % p.cols
            };
            bias.get_ro(j)
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

// The register-staged passes: one 256-thread block per SM lets ptxas use up to 255 registers.
crate::launch_bounds!(lrp_sums_f32, THREADS, 1);
crate::launch_bounds!(lrp_spread_f32, THREADS, 1);
crate::launch_bounds!(dense_f32, THREADS, 1);

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

/// GEMM-pass variant 3 (module doc, "Variant 3"; layouts in `params::lrp::v3`): 32-deep stages through
/// a 4-buffer `cp.async` pipeline in dynamic shared memory, a fresh 3xTF32 partial per tile and stage.
mod v3 {
    use super::{Acc, SPREAD, SUMS, Split};
    use crate::dev::copy::{cp_async_16, cp_async_commit, cp_async_wait};
    use crate::dev::mem::{Slice, SliceMut};
    use crate::dev::mma::{FragC, mma_tf32};
    use crate::dev::opaque_u32;
    use crate::dev::shared::{SharedScalar, dynamic_base, ld_shared_v2_f32};
    use crate::dev::sync::sync_threads;
    use crate::dev::thread::{block_idx_x, block_idx_y, block_idx_z, thread_idx_x};
    use crate::params::LrpGemm;
    use crate::params::lrp::v3::*;
    use crate::params::lrp::{BM, BN, M_TILES, N_TILES, acc_coords};

    /// This thread's `cp.async` copies of a stage: the first chunk's source (at depth `k_begin`) and
    /// destination (bytes into a stage) per operand, the step between copy rounds, and which rounds
    /// lie inside the matrix. A chunk is 4 floats of one row; the host guarantees 16-byte rows, and
    /// every stage boundary and `k_end` is a multiple of 4, so a chunk is wholly in or out.
    struct Copies {
        a_src: *const u8,
        b_src: *const u8,
        /// Source bytes between copy rounds: 32 rows of A; 32 rows (`[n][k]`) or 8 depth rows
        /// (`[k][n]`) of B.
        a_round: u64,
        b_round: u64,
        /// Source bytes from one stage of B to the next: `BK` floats (`[n][k]`) or `BK` rows.
        b_stage: u64,
        a_dst: u32,
        b_dst: u32,
        /// Bit `i`: round `i`'s row (A; B `[n][k]`) or column chunk (B `[k][n]`) is inside the matrix.
        a_in: u32,
        b_in: u32,
        /// Depth of this thread's chunks from a stage's start: `4 c` (`[row][k]` tiles) or the depth
        /// row of round 0 (`[k][n]`).
        a_depth: u64,
        b_depth: u64,
        k_begin: u64,
        k_end: u64,
    }

    impl Copies {
        #[inline(always)]
        fn new<const MODE: u32>(a: &Slice<f32>, b: &Slice<f32>, p: &LrpGemm, tid: usize) -> Self {
            let (m0, n0) = (block_idx_y() as u64 * BM, block_idx_x() as u64 * BN);
            let k_begin = block_idx_z() as u64 * p.k_per_split;
            let k_end = (k_begin + p.k_per_split).min(p.depth);
            let (ar, ac) = nk_copy(tid, 0);
            let (ar, ac) = (ar as u64, ac as u64);
            let mut a_in = 0;
            crate::unroll_lt!(i < A_COPIES, {
                if m0 + ar + 32 * (i as u64) < p.rows {
                    a_in |= 1 << i;
                }
            });
            let a_src = (a.ptr as *const u8)
                .wrapping_add((4 * ((m0 + ar) * p.depth + k_begin + 4 * ac)) as usize);
            let a_dst = 4 * (ar * NK_STRIDE + 4 * ac) as u32;
            let (b_src, b_round, b_stage, b_dst, b_in, b_depth);
            if MODE == SPREAD {
                // B is [K][N]: rows of `cols` floats.
                let (br, bc) = kn_copy(tid, 0);
                let (br, bc) = (br as u64, bc as u64);
                b_src = (b.ptr as *const u8)
                    .wrapping_add((4 * ((k_begin + br) * p.cols + n0 + 4 * bc)) as usize);
                b_round = 4 * 8 * p.cols;
                b_stage = 4 * BK * p.cols;
                b_dst = 4 * (STAGE_A as u64 + br * KN_STRIDE + 4 * bc) as u32;
                b_in = if n0 + 4 * bc < p.cols { u32::MAX } else { 0 };
                b_depth = br;
            } else {
                // B is [N][K]: rows of `depth` floats, like A.
                let (br, bc) = nk_copy(tid, 0);
                let (br, bc) = (br as u64, bc as u64);
                b_src = (b.ptr as *const u8)
                    .wrapping_add((4 * ((n0 + br) * p.depth + k_begin + 4 * bc)) as usize);
                b_round = 4 * 32 * p.depth;
                b_stage = 4 * BK;
                b_dst = 4 * (STAGE_A as u64 + br * NK_STRIDE + 4 * bc) as u32;
                let mut bits = 0;
                crate::unroll_lt!(i < B_COPIES, {
                    if n0 + br + 32 * (i as u64) < p.cols {
                        bits |= 1 << i;
                    }
                });
                b_in = bits;
                b_depth = 4 * bc;
            }
            Copies {
                a_src,
                b_src,
                a_round: 4 * 32 * p.depth,
                b_round,
                b_stage,
                a_dst,
                b_dst,
                a_in,
                b_in,
                a_depth: 4 * ac,
                b_depth,
                k_begin,
                k_end,
            }
        }

        /// Starts this thread's copies of stage `kt` (depth `k_begin + 32 kt`) into the stage buffer at
        /// shared address `stage`; chunks outside the matrix or past `k_end` are zero-filled.
        ///
        /// # Safety
        /// The buffer is idle: no thread reads it until the group holding these copies has been waited
        /// for and a barrier has followed (pipeline order in [`gemm`]); `stage` is a buffer of the
        /// launch's dynamic shared memory (`smem_bytes`).
        #[inline(always)]
        unsafe fn issue<const MODE: u32>(&self, kt: u32, stage: u32) {
            // Opaque: every address is recomputed from `kt` rather than kept as its own 64-bit
            // induction variable (see PERF_NOTES).
            let kt = opaque_u32(kt) as u64;
            let k0 = self.k_begin + kt * BK;
            let a_depth_in = k0 + self.a_depth < self.k_end;
            let a_src = self.a_src.wrapping_add((kt * 4 * BK) as usize);
            crate::unroll_lt!(i < A_COPIES, {
                let fill = a_depth_in && self.a_in & (1 << i) != 0;
                let dst = stage + self.a_dst + (4 * 32 * NK_STRIDE) as u32 * i as u32;
                let src = a_src.wrapping_add((i as u64 * self.a_round) as usize);
                // SAFETY: `dst` is this thread's 16-byte aligned chunk of the idle buffer (caller;
                // strides are multiples of 4 floats). When `fill`, `src` is 4 floats of row
                // m0 + r < rows at depth k < k_end of A ([rows][depth], 16-byte rows and base: host),
                // which nothing writes during the kernel.
                unsafe { cp_async_16(dst, src, fill) };
            });
            let b_src = self.b_src.wrapping_add((kt * self.b_stage) as usize);
            let b_depth_in = k0 + self.b_depth < self.k_end;
            crate::unroll_lt!(i < B_COPIES, {
                let (fill, dst) = if MODE == SPREAD {
                    (
                        k0 + self.b_depth + 8 * (i as u64) < self.k_end && self.b_in != 0,
                        stage + self.b_dst + (4 * 8 * KN_STRIDE) as u32 * i as u32,
                    )
                } else {
                    (
                        b_depth_in && self.b_in & (1 << i) != 0,
                        stage + self.b_dst + (4 * 32 * NK_STRIDE) as u32 * i as u32,
                    )
                };
                let src = b_src.wrapping_add((i as u64 * self.b_round) as usize);
                // SAFETY: as for A: an in-matrix chunk of B ([cols][depth], or [depth][cols] for the
                // spread pass; 16-byte rows and base checked by the host) into this thread's chunk
                // of the idle buffer.
                unsafe { cp_async_16(dst, src, fill) };
            });
        }
    }

    /// `t += a b` in 3xTF32 without a rounding step: the two correction terms, then the main product
    /// (the chain's truncation is bounded in the module doc).
    #[inline(always)]
    fn mma3_chain(t: &mut FragC, a: &Split<4>, b: &Split<2>) {
        *t = mma_tf32(*t, &a.lo, &b.hi);
        *t = mma_tf32(*t, &a.hi, &b.lo);
        *t = mma_tf32(*t, &a.hi, &b.hi);
    }

    /// One stage through the tensor cores: per k-step the warp's A fragments (`M_TILES`, two
    /// `ld.shared.v2` each) and B fragments (`N_TILES`, one `ld.shared.v2` or, `[k][n]`, two scalar
    /// loads), split once, 3 mma per tile and product into fresh per-stage partials (SUMS: `|a||b|` into
    /// `t0`, `a b` into `t1`), which are then added to the accumulators with round-to-nearest.
    /// `a_addr` / `b_addr` are this thread's fragment bases in the stage (shared addresses); every load
    /// is base + a constant.
    #[inline(always)]
    fn compute<const MODE: u32>(a_addr: u32, b_addr: u32, acc0: &mut Acc, acc1: &mut Acc) {
        // SAFETY (loads below): base + delta is a `v3::frag_*_offset` (< the stage's floats, even for
        // the pairs: unit-tested in params) of the stage the caller's address points at, inside the
        // launch's dynamic shared memory, written by copies that were waited for before the barrier
        // that precedes this call.
        let ld2 = |addr: u32, d: usize| unsafe { ld_shared_v2_f32(addr + 4 * d as u32) };
        let ld1 = |addr: u32, d: usize| unsafe { f32::ld_shared(addr + 4 * d as u32) };
        let mut t0: Acc = [[[0.0; 4]; N_TILES]; M_TILES];
        let mut t1: Acc = [[[0.0; 4]; N_TILES]; M_TILES];
        crate::unroll!(s in [0, 1, 2, 3] {
            let mut a = [Split::<4> { hi: [0; 4], lo: [0; 4] }; M_TILES];
            crate::unroll_lt!(mi < M_TILES, {
                // (a0, a2) of row g, (a1, a3) of row g + 8: slots t and t + 4 are adjacent depths.
                let [a0, a2] = ld2(a_addr, frag_a_delta(mi, s, 0));
                let [a1, a3] = ld2(a_addr, frag_a_delta(mi, s, 1));
                a[mi] = Split::of_fast([a0, a1, a2, a3]);
            });
            let mut b = [Split::<2> { hi: [0; 2], lo: [0; 2] }; N_TILES];
            crate::unroll_lt!(ni < N_TILES, {
                let v = if MODE == SPREAD {
                    // The spread multiplies by |W|; the split of |v| is that of v made positive.
                    [
                        ld1(b_addr, frag_b_kn_delta(ni, s, 0)).abs(),
                        ld1(b_addr, frag_b_kn_delta(ni, s, 1)).abs(),
                    ]
                } else {
                    ld2(b_addr, frag_b_nk_delta(ni, s))
                };
                b[ni] = Split::of_fast(v);
            });
            crate::unroll_lt!(mi < M_TILES, {
                crate::unroll_lt!(ni < N_TILES, {
                    if MODE == SUMS {
                        mma3_chain(&mut t0[mi][ni], &a[mi].abs(), &b[ni].abs());
                        mma3_chain(&mut t1[mi][ni], &a[mi], &b[ni]);
                    } else {
                        mma3_chain(&mut t0[mi][ni], &a[mi], &b[ni]);
                    }
                });
            });
        });
        crate::unroll_lt!(mi < M_TILES, {
            crate::unroll_lt!(ni < N_TILES, {
                crate::unroll!(r in [0, 1, 2, 3] {
                    acc0[mi][ni][r] += t0[mi][ni][r];
                    if MODE == SUMS {
                        acc1[mi][ni][r] += t1[mi][ni][r];
                    }
                });
            });
        });
    }

    /// The tiled pass: block (x, y, z) = (column tile, row tile, depth split), `smem_bytes(MODE ==
    /// SPREAD)` of dynamic shared memory. Writes the split's partial tile to `out0[split][rows][cols]`
    /// (and `out1` for SUMS), like the default.
    ///
    /// # Safety
    /// The launcher's contract of the default pass, plus: A's and B's bases are 16-byte aligned and
    /// their rows (`depth` floats; B of the spread pass: `cols` floats) a multiple of 4 floats.
    ///
    ///
    /// `FINISH` (SPREAD with one split only): the epilogue writes `|scale| * G` (the relevance,
    /// `lrp_finish`'s product) to `out0` instead of the partial `G`, saving the finishing pass.
    #[inline(always)]
    pub(super) unsafe fn gemm<const MODE: u32, const FINISH: bool>(
        a: Slice<f32>,
        b: Slice<f32>,
        out0: SliceMut<f32>,
        out1: SliceMut<f32>,
        scale: Slice<f32>,
        p: LrpGemm,
    ) {
        const { assert!(!FINISH || MODE == SPREAD) };
        // SAFETY: the caller's contract is the main loop's.
        let (acc0, acc1) = unsafe { mainloop::<MODE>(a, b, &p) };
        let tid = thread_idx_x() as usize;
        let (lane, warp) = (tid & 31, tid >> 5);
        let split = block_idx_z() as u64;
        let (m0, n0) = (block_idx_y() as u64 * BM, block_idx_x() as u64 * BN);
        let base = split * p.rows * p.cols;
        crate::unroll_lt!(mi < M_TILES, {
            crate::unroll_lt!(ni < N_TILES, {
                crate::unroll!(r in [0, 1, 2, 3] {
                    let (dm, dn) = acc_coords(warp, lane, mi, ni, r);
                    let (m, n) = (m0 + dm, n0 + dn);
                    if m < p.rows && n < p.cols {
                        let at = base + m * p.cols + n;
                        if FINISH {
                            // One split (the launcher's contract): base is 0 and `at` indexes
                            // `scale` (x, `[rows, cols]`) too.
                            out0.set(at, scale.get_ro(at).abs() * acc0[mi][ni][r]);
                        } else {
                            out0.set(at, acc0[mi][ni][r]);
                        }
                        if MODE == SUMS {
                            out1.set(at, acc1[mi][ni][r]);
                        }
                    }
                });
            });
        });
    }

    /// [`gemm`]'s pipeline and tensor-core loop over this block's tile and split: the accumulators
    /// (`acc1` only for SUMS), for an epilogue to write.
    ///
    /// # Safety
    /// As [`gemm`].
    #[inline(always)]
    pub(super) unsafe fn mainloop<const MODE: u32>(
        a: Slice<f32>,
        b: Slice<f32>,
        p: &LrpGemm,
    ) -> (Acc, Acc) {
        const { assert!(STAGES == 4) }; // the wait counts below
        let p = *p;
        let tid = thread_idx_x() as usize;
        let (lane, warp) = (tid & 31, tid >> 5);
        let copies = Copies::new::<MODE>(&a, &b, &p, tid);
        let stages = copies.k_end.saturating_sub(copies.k_begin).div_ceil(BK) as u32;
        let stage_bytes = 4 * stage_floats(MODE == SPREAD);
        let smem = dynamic_base();
        // Prologue: stages 0..STAGES - 1 in flight, one commit group each (empty past the end, so the
        // group count per stage stays fixed).
        crate::unroll!(s in [0, 1, 2] {
            if (s as u32) < stages {
                // SAFETY: nothing has read the buffers yet.
                unsafe { copies.issue::<MODE>(s as u32, smem + s as u32 * stage_bytes) };
            }
            cp_async_commit();
        });
        // This thread's fragment bases in stage 0, hidden from the optimiser (see `opaque_u32`).
        let a_frag = opaque_u32(smem + 4 * frag_a_base(warp, lane) as u32);
        let b_base = if MODE == SPREAD {
            frag_b_kn_base(warp, lane)
        } else {
            frag_b_nk_base(warp, lane)
        };
        let b_frag = opaque_u32(smem + 4 * (STAGE_A as usize + b_base) as u32);
        let mut acc0: Acc = [[[0.0; 4]; N_TILES]; M_TILES];
        let mut acc1: Acc = [[[0.0; 4]; N_TILES]; M_TILES];
        let (mut read, mut write) = (0u32, STAGES - 1);
        let mut kt = 0u32;
        while kt < stages {
            // Stage kt has landed once at most STAGES - 2 newer groups are pending; after the barrier
            // every thread's copies of it are visible, and every warp is done with stage kt - 1, whose
            // buffer (`write`) takes stage kt + STAGES - 1.
            cp_async_wait::<{ STAGES - 2 }>();
            sync_threads();
            if kt + STAGES - 1 < stages {
                // SAFETY: buffer `write` was last read in stage kt - 1, finished by the barrier above.
                unsafe { copies.issue::<MODE>(kt + STAGES - 1, smem + write * stage_bytes) };
            }
            cp_async_commit();
            compute::<MODE>(
                a_frag + read * stage_bytes,
                b_frag + read * stage_bytes,
                &mut acc0,
                &mut acc1,
            );
            read = if read + 1 == STAGES { 0 } else { read + 1 };
            write = if write + 1 == STAGES { 0 } else { write + 1 };
            kt += 1;
        }
        // Only empty groups can be pending; no copy may outlive the block.
        cp_async_wait::<0>();
        (acc0, acc1)
    }
}

// The GEMM passes (3xTF32 mma): 64 accumulators (sums: two sets of 32) and the split fragments of a
// depth step. The sums pass keeps one block per SM (two accumulator sets and two stage partials: 128
// registers before any operand); spread and dense ask for two (at most 128 registers).
crate::launch_bounds!(
    lrp_sums_v5_f32,
    THREADS,
    crate::params::lrp::v3::SUMS_BLOCKS_PER_SM
);
crate::launch_bounds!(
    lrp_spread_v5_f32,
    THREADS,
    crate::params::lrp::v3::SPREAD_BLOCKS_PER_SM
);
crate::launch_bounds!(
    lrp_spread_v5_finish_f32,
    THREADS,
    crate::params::lrp::v3::SPREAD_BLOCKS_PER_SM
);
crate::launch_bounds!(
    dense_v5_f32,
    THREADS,
    crate::params::lrp::v3::SPREAD_BLOCKS_PER_SM
);

/// The sums pass on the `cp.async` pipeline (`v3`) with the 3xTF32 split by integer operations
/// (`params::lrp::v5`).
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn lrp_sums_v5_f32(
    x: Slice<f32>,
    w: Slice<f32>,
    ws_a: SliceMut<f32>,
    ws_s: SliceMut<f32>,
    p: LrpGemm,
) {
    unsafe { v3::gemm::<SUMS, false>(x, w, ws_a, ws_s, x, p) }
}

/// The spread pass on the `cp.async` pipeline with the integer split.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn lrp_spread_v5_f32(
    coef: Slice<f32>,
    w: Slice<f32>,
    ws_g: SliceMut<f32>,
    p: LrpGemm,
) {
    unsafe { v3::gemm::<SPREAD, false>(coef, w, ws_g, ws_g, coef, p) }
}

/// [`lrp_spread_v5_f32`] with `lrp_finish_f32` fused into its epilogue: `relevance_in = |x| G`
/// written directly. Only for a pass of one split (`p.k_per_split >= p.depth`, the launcher checks).
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn lrp_spread_v5_finish_f32(
    coef: Slice<f32>,
    w: Slice<f32>,
    x: Slice<f32>,
    relevance_in: SliceMut<f32>,
    p: LrpGemm,
) {
    unsafe { v3::gemm::<SPREAD, true>(coef, w, relevance_in, relevance_in, x, p) }
}

/// The dense pass on the `cp.async` pipeline with the integer split.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn dense_v5_f32(
    x: Slice<f32>,
    w: Slice<f32>,
    ws: SliceMut<f32>,
    p: LrpGemm,
) {
    unsafe { v3::gemm::<DENSE, false>(x, w, ws, ws, x, p) }
}
