//! FlashAttention-2 forward on tensor cores (`mma.sync.m16n8k16`, f16/bf16 in, f32 accumulation).
//!
//! One CTA per (block of `BQ` query rows, head, batch); `BQ / 16` warps, each owning 16 query rows.
//! - Q's block is copied to shared memory once and its `mma` A fragments stay in registers.
//! - K and V stream through shared memory in `BK`-key tiles, two stages each, by `cp.async` 16-byte
//!   copies in commit groups; rows past the end are zero-filled. Tiles use the [`Xor8`] swizzle, so
//!   the `ldmatrix` reads (and the copies) are bank-conflict free.
//! - `S = Q K^T` per warp: 16 x `BK` f32 in registers; masked entries become -inf. The online
//!   softmax keeps the running max `m` of the raw scores and the sum `l`, and folds the scale and
//!   log2(e) into one FMA per score: `p = exp2(s c - m c)` with `c = |scale| log2(e)`; the output
//!   accumulator is rescaled by `exp2(m_old c - m_new c)`. A negative scale flips the sign bits of
//!   Q's fragments once (exact), so `c` is always positive and the max commutes with scaling.
//! - P is rounded to the input type in registers and is directly the A operand of `P V` (the
//!   accumulator layout of two 8-column tiles is the A layout of one 16-column block); V's B
//!   fragments come from `ldmatrix.trans`.
//! - Causal: K tiles wholly above the diagonal are never loaded; only tiles crossing the diagonal
//!   (or the ragged last tile) are masked element by element.
//! - Epilogue: `O / l` rounded to the input type, staged through the warp's own (now unused) rows of
//!   the Q tile for 16-byte coalesced stores; `LSE = (m c + log2 l) ln 2` (natural log of the scaled
//!   scores' sum of exponentials). A row with no visible key has `l = 0`: O = 0, LSE = -inf.
//!
//! The pipeline per K/V tile `j` (groups are per thread; `wait 1` leaves only the newest pending):
//! ```text
//! wait 1, barrier      K(j) has landed; every warp is done with S(j-1)
//! load K(j+1), commit  into the stage S(j-1) used
//! S = Q K(j)^T, softmax
//! wait 1, barrier      V(j) has landed; every warp is done with P V(j-1)
//! load V(j+1), commit  into the stage P V(j-1) used
//! O += P V(j)
//! ```
use crate::dev::copy::{cp_async_commit, cp_async_wait};
use crate::dev::elem::{BF16, F16};
use crate::dev::math::{LN_2, LOG2_E, exp2, fma, log2, max};
use crate::dev::mem::{Chunk16, Slice, SliceMut, store_chunk};
use crate::dev::mma::{FragA, FragC, MmaElem};
use crate::dev::shared::check_index;
use crate::dev::sync::{sync_threads, sync_warp};
use crate::dev::thread::{block_idx_x, block_idx_y, block_idx_z, lane_id, thread_idx_x, warp_id};
use crate::dev::tile::{SharedCarve, SharedTile};
use crate::dev::warp::{FULL_MASK, shfl_xor_f32};
use crate::layout::Xor8;
use crate::params::attention::{
    AttentionLayout, AttentionShape, FLASH_D64, FLASH_D128, FlashConfig, MaskKind, flash_config,
};

use super::{HeadRows, HeadRowsMut, Sequence};
use crate::{unroll, unroll_lt};

/// A `ROWS x D` tile of 16-bit elements with swizzled rows: Q, K and V tiles alike.
type Tile<T, const ROWS: usize, const D: usize> = SharedTile<T, ROWS, D, Xor8>;

/// The forward kernel. `KD = D / 16` (k-steps of `Q K^T`), `NS = BK / 8` (8-key tiles of S) and
/// `NO = D / 8` (8-column tiles of O) size the register fragments; all are checked against the config.
#[inline(always)]
unsafe fn flash_fwd<
    T: MmaElem,
    const D: usize,
    const BQ: usize,
    const BK: usize,
    const KD: usize,
    const NS: usize,
    const NO: usize,
>(
    q: Slice<T>,
    k: Slice<T>,
    v: Slice<T>,
    o: SliceMut<T>,
    lse: SliceMut<f32>,
    p: AttentionShape,
    st: AttentionLayout,
) {
    let cfg: FlashConfig = const { checked_config::<T, D, BQ, BK, KD, NS, NO>() };
    // This CTA's query head (batch entry `b`, head `h`), the key/value head it reads (grouped-query
    // attention), and its sequences (a packed batch's grid covers the longest: CTAs past a shorter
    // one have no rows).
    let (b, h) = (block_idx_z(), block_idx_y());
    let hkv = h / p.group();
    let seq = Sequence::of(&st, &p, b);
    if block_idx_x() >= seq.sq.div_ceil(BQ as u32) {
        return;
    }
    let p = seq.shape(p);
    let (sq, sk) = (p.seq_q, p.seq_k);
    let causal = p.mask == MaskKind::Causal;
    // Query block, heaviest first: under a causal mask later blocks see more keys.
    let m0 = (sq.div_ceil(BQ as u32) - 1 - block_idx_x()) * BQ as u32;
    let diag = sk as i32 - sq as i32; // query i sees key j iff j <= i + diag (causal)
    let rows_here = (sq - m0).min(BQ as u32);
    let key_end = if causal {
        (m0 as i32 + rows_here as i32 + diag).clamp(0, sk as i32) as u32
    } else {
        sk
    };
    let n_tiles = key_end.div_ceil(BK as u32);
    // This head's rows (the launcher validated that every head's rows lie inside the operands;
    // checked builds re-check).
    let q_src = HeadRows::of(q, st.q, (seq.bi, h), (seq.q0, sq), p.head_dim);
    let k_src = HeadRows::of(k, st.k, (seq.bi, hkv), (seq.k0, sk), p.head_dim);
    let v_src = HeadRows::of(v, st.v, (seq.bi, hkv), (seq.k0, sk), p.head_dim);

    let mut smem = SharedCarve::dynamic();
    let q_tile: Tile<T, BQ, D> = smem.take(1);
    let k_tiles: Tile<T, BK, D> = smem.take(cfg.stages as u32);
    let v_tiles: Tile<T, BK, D> = smem.take(cfg.stages as u32);
    check_index(smem.used(), cfg.smem_bytes() + 1);

    // SAFETY (all `load_rows` calls): row offsets stay inside this head's rows (rows past the end
    // are zero-filled without reading); every copied-into stage is idle per the pipeline above.
    unsafe {
        load_rows::<T, BQ, D, BQ>(q_tile, q_src, m0, sq);
        if n_tiles > 0 {
            load_rows::<T, BK, D, BQ>(k_tiles, k_src, 0, sk);
        }
        cp_async_commit();
        if n_tiles > 0 {
            load_rows::<T, BK, D, BQ>(v_tiles, v_src, 0, sk);
        }
        cp_async_commit();
    }
    cp_async_wait::<1>();
    sync_threads();

    let warp_row = warp_id() * 16;
    // s * scale == (-s) * |scale|: a negative scale negates Q (sign bits of f16 and bf16 alike).
    let sign = if p.scale < 0.0 { 0x8000_8000 } else { 0 };
    let mut qf = [[0u32; 4]; KD];
    unroll_lt!(kd < KD, {
        qf[kd] = q_tile.load_a(warp_row, 2 * kd as u32).map(|w| w ^ sign);
    });
    let first_row = m0 + warp_row + lane_id() / 4; // this thread's rows: first_row and first_row + 8
    let key_limit = key_limits(first_row, sk, diag, causal);
    // Clamped away from 0 so that masked scores stay -inf (not NaN) under scale = 0; a scale of
    // 1e-30 instead of 0 changes no f32 result.
    let mut softmax = OnlineSoftmax::new(max(p.scale.abs() * LOG2_E, 1e-30));
    let mut acc = [[0.0f32; 4]; NO];

    for j in 0..n_tiles {
        let (stage, next) = (j % 2, (j + 1) % 2);
        let n0 = j * BK as u32;
        let more = j + 1 < n_tiles;
        if j > 0 {
            cp_async_wait::<1>();
            sync_threads();
        }
        if more {
            // SAFETY: see above.
            unsafe { load_rows::<T, BK, D, BQ>(k_tiles.stage(next), k_src, n0 + BK as u32, sk) };
        }
        cp_async_commit();

        let mut s = scores::<T, BK, D, KD, NS>(&qf, k_tiles.stage(stage));
        let last_key = (n0 + BK as u32 - 1) as i32;
        if n0 + BK as u32 > sk || (causal && last_key > m0 as i32 + diag) {
            mask(&mut s, n0, key_limit);
        }
        let alpha = softmax.update(&mut s);
        unroll_lt!(n < NO, {
            acc[n] = [
                acc[n][0] * alpha[0],
                acc[n][1] * alpha[0],
                acc[n][2] * alpha[1],
                acc[n][3] * alpha[1],
            ];
        });

        cp_async_wait::<1>();
        sync_threads();
        if more {
            // SAFETY: see above.
            unsafe { load_rows::<T, BK, D, BQ>(v_tiles.stage(next), v_src, n0 + BK as u32, sk) };
        }
        cp_async_commit();
        accumulate_pv::<T, BK, D, NS, NO>(&mut acc, &s, v_tiles.stage(stage));
    }

    let out = HeadRowsMut::of(o, st.o, (seq.bi, h), (seq.q0, sq), p.head_dim);
    let lse_row0 = seq.lse_at(&st, h, m0 + warp_row);
    store_output::<T, BQ, D, NO>(
        &acc,
        &softmax,
        q_tile,
        warp_row,
        (m0 + warp_row, sq - m0),
        (out, lse),
        lse_row0,
    );
}

/// The config for `D`, checked against the kernel's const parameters (evaluated at compile time).
const fn checked_config<
    T: MmaElem,
    const D: usize,
    const BQ: usize,
    const BK: usize,
    const KD: usize,
    const NS: usize,
    const NO: usize,
>() -> FlashConfig {
    let Some(cfg) = flash_config(D) else {
        panic!("no FlashAttention config for this head dim")
    };
    assert!(cfg.block_q == BQ && cfg.block_k == BK && cfg.stages == 2);
    assert!(KD == D / 16 && NS == BK / 8 && NO == D / 8);
    assert!(BQ % 16 == 0 && BK % 16 == 0 && D % 16 == 0 && BQ <= 256);
    let planned = Tile::<T, BQ, D>::BYTES + 2 * cfg.stages * Tile::<T, BK, D>::BYTES;
    assert!(planned == cfg.smem_bytes());
    cfg
}

/// Issues this thread's share of the 16-byte copies of rows `row0..row0 + ROWS` of the head `src`
/// into `tile`; rows at or past `rows` are zero-filled. `BQ / 16` warps share the work.
///
/// # Safety
/// `src` has `rows` readable rows of `D` elements, 16-byte aligned; `tile` is idle.
#[inline(always)]
unsafe fn load_rows<T: MmaElem, const ROWS: usize, const D: usize, const BQ: usize>(
    tile: Tile<T, ROWS, D>,
    src: HeadRows<T>,
    row0: u32,
    rows: u32,
) {
    let chunks_per_row = Tile::<T, ROWS, D>::CHUNKS_PER_ROW as u32;
    const {
        assert!(
            (ROWS * D / 8) % (BQ * 2) == 0,
            "copies must divide evenly among threads"
        )
    };
    unroll_lt!(i < ROWS * D / 8 / (BQ * 2), {
        let c = thread_idx_x() + (i * BQ * 2) as u32;
        let (r, chunk) = (c / chunks_per_row, c % chunks_per_row);
        let fill = row0 + r < rows && src.has_chunk(chunk);
        let at = if fill {
            src.at(row0 + r, 8 * chunk)
        } else {
            src.at(0, 0)
        };
        // SAFETY: `at` is inside the `rows` rows when `fill` (else not read); 8 elements = 16 bytes.
        unsafe { tile.copy_chunk_async(r, chunk, at as *const u8, fill) };
    });
}

/// `S = Q K^T` (unscaled) for this warp's 16 rows and the `BK` keys of `kt`.
#[inline(always)]
fn scores<T: MmaElem, const BK: usize, const D: usize, const KD: usize, const NS: usize>(
    qf: &[FragA; KD],
    kt: Tile<T, BK, D>,
) -> [FragC; NS] {
    let mut s = [[0.0f32; 4]; NS];
    unroll_lt!(kd < KD, {
        unroll_lt!(np < NS / 2, {
            let [b0, b1] = kt.load_b_pair_nk(16 * np as u32, 2 * kd as u32);
            T::mma(&mut s[2 * np], &qf[kd], b0);
            T::mma(&mut s[2 * np + 1], &qf[kd], b1);
        });
    });
    s
}

/// For this thread's two rows (`row`, `row + 8`): the first key index that row may not see.
#[inline(always)]
fn key_limits(row: u32, sk: u32, diag: i32, causal: bool) -> [i32; 2] {
    let limit = |r: u32| {
        if causal {
            (r as i32 + diag + 1).min(sk as i32)
        } else {
            sk as i32
        }
    };
    [limit(row), limit(row + 8)]
}

/// Sets scores of keys at or past each row's limit to -inf (tile keys start at `n0`).
#[inline(always)]
fn mask<const NS: usize>(s: &mut [FragC; NS], n0: u32, limit: [i32; 2]) {
    let first = (n0 + 2 * (lane_id() % 4)) as i32;
    unroll_lt!(n < NS, {
        unroll!(e in [0, 1] {
            let key = first + (8 * n + e) as i32;
            if key >= limit[0] {
                s[n][e] = f32::NEG_INFINITY;
            }
            if key >= limit[1] {
                s[n][2 + e] = f32::NEG_INFINITY;
            }
        });
    });
}

/// Running max (`m`, of the raw scores) and this thread's partial row sums (`l`) of its two rows;
/// `c = |scale| log2(e) > 0` turns raw scores into log2 units. The four lanes sharing a row agree
/// on `m`; `l` is summed across them at the end.
struct OnlineSoftmax {
    m: [f32; 2],
    l: [f32; 2],
    c: f32,
}

impl OnlineSoftmax {
    #[inline(always)]
    fn new(c: f32) -> Self {
        Self {
            m: [f32::NEG_INFINITY; 2],
            l: [0.0; 2],
            c,
        }
    }

    /// Folds a tile of raw scores in: replaces them with `exp2(s c - m_new c)` and returns each
    /// row's rescale factor `exp2(m_old c - m_new c)` for the output accumulator.
    #[inline(always)]
    fn update<const NS: usize>(&mut self, s: &mut [FragC; NS]) -> [f32; 2] {
        let mut alpha = [0.0f32; 2];
        unroll!(r in [0, 1] {
            let mut m = self.m[r];
            unroll_lt!(n < NS, {
                m = max(m, max(s[n][2 * r], s[n][2 * r + 1]));
            });
            m = max(m, shfl_xor_f32(m, 1));
            m = max(m, shfl_xor_f32(m, 2));
            // A row that has seen only masked keys keeps m = -inf; subtracting 0 instead makes its
            // exponentials 0 (not NaN from -inf - -inf).
            let base = if m == f32::NEG_INFINITY { 0.0 } else { m * self.c };
            alpha[r] = exp2(fma(self.m[r], self.c, -base));
            let mut sum = 0.0f32;
            unroll_lt!(n < NS, {
                unroll!(e in [0, 1] {
                    let x = exp2(fma(s[n][2 * r + e], self.c, -base));
                    s[n][2 * r + e] = x;
                    sum += x;
                });
            });
            self.l[r] = self.l[r] * alpha[r] + sum;
            self.m[r] = m;
        });
        alpha
    }
}

/// `acc += P V` with P (this warp's 16 x `BK` probabilities) rounded to `T` as A fragments.
#[inline(always)]
fn accumulate_pv<T: MmaElem, const BK: usize, const D: usize, const NS: usize, const NO: usize>(
    acc: &mut [FragC; NO],
    p: &[FragC; NS],
    vt: Tile<T, BK, D>,
) {
    unroll_lt!(ks < NS / 2, {
        let (lo, hi) = (&p[2 * ks], &p[2 * ks + 1]);
        let a: FragA = [
            T::pack2(lo[0], lo[1]),
            T::pack2(lo[2], lo[3]),
            T::pack2(hi[0], hi[1]),
            T::pack2(hi[2], hi[3]),
        ];
        unroll_lt!(np < NO / 2, {
            let [b0, b1] = vt.load_b_pair_kn(16 * ks as u32, 2 * np as u32);
            T::mma(&mut acc[2 * np], &a, b0);
            T::mma(&mut acc[2 * np + 1], &a, b1);
        });
    });
}

/// Writes this warp's 16 rows of `O = acc / l` and their LSE. `(o_row0, rows_left)`: the warp's
/// first row in the head, and the valid rows from the CTA's first row; `lse_row0` = the LSE index
/// (over batch*heads*seq_q) of the warp's first row.
#[inline(always)]
fn store_output<T: MmaElem, const BQ: usize, const D: usize, const NO: usize>(
    acc: &[FragC; NO],
    softmax: &OnlineSoftmax,
    staging: Tile<T, BQ, D>,
    warp_row: u32,
    (o_row0, rows_left): (u32, u32),
    (o, lse): (HeadRowsMut<T>, SliceMut<f32>),
    lse_row0: u64,
) {
    let (g, t) = (lane_id() / 4, lane_id() % 4);
    let mut inv = [0.0f32; 2];
    let mut row_lse = [f32::NEG_INFINITY; 2];
    unroll!(r in [0, 1] {
        let mut l = softmax.l[r];
        l += shfl_xor_f32(l, 1);
        l += shfl_xor_f32(l, 2);
        // As the wgmma forwards' `store_output`: no key seen gives 0 and -inf, a NaN sum NaN.
        if l != 0.0 {
            inv[r] = 1.0 / l;
            row_lse[r] = fma(softmax.m[r], softmax.c, log2(l)) * LN_2;
        }
    });
    // The warp's rows of the Q tile are free (Q's fragments live in registers) and only this warp
    // touches them, so warp barriers order the staging: the first orders every lane's `ldmatrix` read
    // of Q (long done in practice, but racecheck sees lanes, not instruction order) before any lane's
    // write; the second orders the writes before the reads below.
    sync_warp(FULL_MASK);
    unroll_lt!(n < NO, {
        let c = &acc[n];
        let col = (8 * n) as u32 + 2 * t;
        staging.store_word(warp_row + g, col, T::pack2(c[0] * inv[0], c[1] * inv[0]));
        staging.store_word(
            warp_row + g + 8,
            col,
            T::pack2(c[2] * inv[1], c[3] * inv[1]),
        );
    });
    sync_warp(FULL_MASK);
    let chunks_per_row = (D / 8) as u32;
    unroll_lt!(i < 16 * D / 8 / 32, {
        let c = lane_id() + 32 * i as u32;
        let (r, chunk) = (c / chunks_per_row, c % chunks_per_row);
        if warp_row + r < rows_left && o.has_chunk(chunk) {
            // SAFETY: the row is < seq_q of this head (checked just above), so the chunk lies in
            // O's head (launcher-validated strides, 16-byte aligned); each chunk has one writer.
            unsafe {
                store_chunk(
                    o.at(o_row0 + r, 8 * chunk) as *mut Chunk16,
                    0,
                    Chunk16(staging.load_chunk(warp_row + r, chunk)),
                )
            };
        }
    });
    if t == 0 {
        unroll!(r in [0, 1] {
            let row = warp_row + g + 8 * r as u32;
            if row < rows_left {
                lse.set(lse_row0 + (g + 8 * r as u32) as u64, row_lse[r]);
            }
        });
    }
}

macro_rules! flash_entry_points {
    ($($name:ident: $t:ty, $cfg:path;)*) => {$(
        /// FlashAttention forward; launch with the grid, block and shared memory of its config.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(
            q: Slice<$t>, k: Slice<$t>, v: Slice<$t>, o: SliceMut<$t>, lse: SliceMut<f32>, shape: AttentionShape,
            strides: AttentionLayout,
        ) {
            const C: FlashConfig = $cfg;
            unsafe {
                flash_fwd::<$t, { C.head_dim }, { C.block_q }, { C.block_k }, { C.head_dim / 16 }, { C.block_k / 8 }, { C.head_dim / 8 }>(
                    q, k, v, o, lse, shape, strides,
                )
            }
        }
    )*};
}

flash_entry_points! {
    flash_fwd_d64_f16: F16, FLASH_D64;
    flash_fwd_d64_bf16: BF16, FLASH_D64;
    flash_fwd_d128_f16: F16, FLASH_D128;
    flash_fwd_d128_bf16: BF16, FLASH_D128;
}
