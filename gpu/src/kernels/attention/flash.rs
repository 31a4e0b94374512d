//! FlashAttention-2 forward on tensor cores (`mma.sync.m16n8k16`, f16/bf16 in, f32 accumulation).
//!
//! One CTA per (block of `BQ` query rows, head, batch); `BQ / 16` warps, each owning 16 query rows.
//! - Q's block is copied to shared memory once; its `mma` A fragments stay in registers
//!   ([`QInRegisters`], the default) or are re-read from the resident tile for every K tile
//!   ([`QInShared`], tuning variants that trade `ldmatrix` traffic for 32 registers at D = 128).
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
//! The default kernels (`flash_fwd_d{64,128}_*`) and the tuning variants (`flash_fwd_v{N}_*`,
//! `params::attention::FLASH_VARIANTS`) are this one body with different const parameters.
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
use crate::dev::{opaque_u32, opaque_u64};
use crate::layout::Xor8;
use crate::params::attention::{
    AttentionShape, FLASH_D64, FLASH_D128, FLASH_VARIANTS, FlashConfig, FlashVariant, MaskKind,
    QFrags, flash_variant,
};
use crate::{unroll, unroll_lt};

/// A `ROWS x D` tile of 16-bit elements with swizzled rows: Q, K and V tiles alike.
type Tile<T, const ROWS: usize, const D: usize> = SharedTile<T, ROWS, D, Xor8>;

/// The forward kernel of variant `VAR` (1 = default). `KD = D / 16` (k-steps of `Q K^T`),
/// `NS = BK / 8` (8-key tiles of S) and `NO = D / 8` (8-column tiles of O) size the register
/// fragments; `Q` says where Q's fragments live. All are checked against the variant's config.
///
/// `LEAN` (the variants, which run under a register bound from `LAUNCH_BOUNDS`): copy offsets are
/// recomputed per tile instead of held, and P is rounded to the input type before the V barrier
/// (16 words live across it instead of 32 floats). The default (`!LEAN`) keeps its measured code.
#[inline(always)]
unsafe fn flash_fwd<
    T: MmaElem,
    Q: QOperand<T, BQ, D>,
    const VAR: u32,
    const LEAN: bool,
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
) {
    let cfg: FlashConfig = const { checked_config::<T, Q, VAR, D, BQ, BK, KD, NS, NO>() };
    const { assert!(LEAN == (VAR != 1)) };

    let (sq, sk) = (p.seq_q, p.seq_k);
    let causal = p.mask == MaskKind::Causal;
    // Query block, heaviest first: under a causal mask later blocks see more keys.
    let m0 = (sq.div_ceil(BQ as u32) - 1 - block_idx_x()) * BQ as u32;
    let bh = (block_idx_z() * p.heads + block_idx_y()) as u64;
    let diag = sk as i32 - sq as i32; // query i sees key j iff j <= i + diag (causal)
    let rows_here = (sq - m0).min(BQ as u32);
    let key_end = if causal {
        (m0 as i32 + rows_here as i32 + diag).clamp(0, sk as i32) as u32
    } else {
        sk
    };
    let n_tiles = key_end.div_ceil(BK as u32);
    // Device-side asserts (checked builds): this head's rows lie inside the buffers.
    check_index(
        ((bh + 1) * sq as u64 * D as u64) as usize,
        q.len as usize + 1,
    );
    check_index(
        ((bh + 1) * sk as u64 * D as u64) as usize,
        k.len.min(v.len) as usize + 1,
    );
    // SAFETY: the launcher validated that q/o hold batch*heads*seq_q rows and k/v batch*heads*seq_k
    // rows of D elements (checked builds re-check above), so these are the starts of this head's rows.
    let (q_src, k_src, v_src) = unsafe {
        (
            q.ptr.add((bh * sq as u64 * D as u64) as usize),
            k.ptr.add((bh * sk as u64 * D as u64) as usize),
            v.ptr.add((bh * sk as u64 * D as u64) as usize),
        )
    };

    let mut smem = SharedCarve::dynamic();
    let q_tile: Tile<T, BQ, D> = smem.take(1);
    let k_tiles: Tile<T, BK, D> = smem.take(cfg.stages as u32);
    let v_tiles: Tile<T, BK, D> = smem.take(cfg.stages as u32);
    check_index(smem.used(), cfg.smem_bytes() + 1);

    // SAFETY (all `load_rows` calls): row offsets stay inside this head's rows (rows past the end
    // are zero-filled without reading); every copied-into stage is idle per the pipeline above.
    unsafe {
        load_rows::<T, BQ, D, BQ, LEAN>(q_tile, q_src, m0, sq);
        if n_tiles > 0 {
            load_rows::<T, BK, D, BQ, LEAN>(k_tiles, k_src, 0, sk);
        }
        cp_async_commit();
        if n_tiles > 0 {
            load_rows::<T, BK, D, BQ, LEAN>(v_tiles, v_src, 0, sk);
        }
        cp_async_commit();
    }
    cp_async_wait::<1>();
    sync_threads();

    let warp_row = warp_id() * 16;
    // s * scale == (-s) * |scale|: a negative scale negates Q (sign bits of f16 and bf16 alike).
    let sign = if p.scale < 0.0 { 0x8000_8000 } else { 0 };
    let q_frags = Q::new(q_tile, warp_row, sign);
    let first_row = m0 + warp_row + lane_id() / 4; // this thread's rows: first_row and first_row + 8
    let key_limit = key_limits(first_row, sk, diag, causal);
    // Clamped away from 0 so that masked scores stay -inf (not NaN) under scale = 0; a scale of
    // 1e-30 instead of 0 changes no f32 result.
    let mut softmax = OnlineSoftmax::new(max(p.scale.abs() * LOG2_E, 1e-30));
    let mut acc = [[0.0f32; 4]; NO];
    // A tile ending past this key (exclusive) needs masking: past sk, or (causal) past the
    // CTA's first row's last visible key.
    let mask_limit = match (LEAN, causal) {
        (false, _) => 0, // unused
        (true, true) => (m0 as i32 + diag + 1).min(sk as i32),
        (true, false) => sk as i32,
    };

    // Lean: this head's K and V rows as the kernel parameters (constant bank) plus one opaque offset
    // (two registers across the loop instead of two pointers' four).
    let kv_off = bh * sk as u64 * D as u64;
    let head_rows = |m: Slice<T>, src: *const T| -> *const T {
        if LEAN {
            // SAFETY: the same address as `k_src` / `v_src` above.
            unsafe { m.ptr.add(opaque_u64(kv_off) as usize) }
        } else {
            src
        }
    };

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
            unsafe {
                load_rows::<T, BK, D, BQ, LEAN>(
                    k_tiles.stage(next),
                    head_rows(k, k_src),
                    n0 + BK as u32,
                    sk,
                )
            };
        }
        cp_async_commit();

        let mut s = scores::<T, Q, BQ, BK, D, KD, NS>(&q_frags, k_tiles.stage(stage));
        let last_key = (n0 + BK as u32 - 1) as i32;
        let ragged = if LEAN {
            // One value live across the loop instead of sk, m0, diag and the mask kind.
            (n0 + BK as u32) as i32 > opaque_u32(mask_limit as u32) as i32
        } else {
            n0 + BK as u32 > sk || (causal && last_key > m0 as i32 + diag)
        };
        if ragged {
            let limit = if LEAN {
                // Recomputed from the launch indices and parameters: nothing held across the loop.
                let m0 = (sq.div_ceil(BQ as u32) - 1 - opaque_u32(block_idx_x())) * BQ as u32;
                let row = m0 + opaque_u32(warp_id()) * 16 + lane_id() / 4;
                key_limits(
                    row,
                    p.seq_k,
                    p.seq_k as i32 - p.seq_q as i32,
                    p.mask == MaskKind::Causal,
                )
            } else {
                key_limit
            };
            mask(&mut s, n0, limit);
        }
        let alpha = softmax.update(&mut s);
        // Only under LEAN: the default's packing must not be merged with (and moved up to) this one.
        let p_early = if LEAN {
            pack_p::<T, NS>(&s)
        } else {
            [[0; 2]; NS]
        };
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
            unsafe {
                load_rows::<T, BK, D, BQ, LEAN>(
                    v_tiles.stage(next),
                    head_rows(v, v_src),
                    n0 + BK as u32,
                    sk,
                )
            };
        }
        cp_async_commit();
        // The default packs each 16-key block of P next to its `mma`s (its measured code).
        let p_frag = |ks: usize| -> FragA {
            let (lo, hi) = if LEAN {
                (p_early[2 * ks], p_early[2 * ks + 1])
            } else {
                let (lo, hi) = (&s[2 * ks], &s[2 * ks + 1]);
                (
                    [T::pack2(lo[0], lo[1]), T::pack2(lo[2], lo[3])],
                    [T::pack2(hi[0], hi[1]), T::pack2(hi[2], hi[3])],
                )
            };
            [lo[0], lo[1], hi[0], hi[1]]
        };
        accumulate_pv::<T, BK, D, NO>(&mut acc, p_frag, NS / 2, v_tiles.stage(stage));
    }

    let (bh, m0, warp_row) = if LEAN {
        // Recomputed from the launch indices (a few integer ops) rather than held across the loop.
        let m0 = (sq.div_ceil(BQ as u32) - 1 - opaque_u32(block_idx_x())) * BQ as u32;
        let bh = (opaque_u32(block_idx_z()) * p.heads + block_idx_y()) as u64;
        (bh, m0, opaque_u32(warp_id()) * 16)
    } else {
        (bh, m0, warp_row)
    };
    let out_row0 = bh * sq as u64 + m0 as u64 + warp_row as u64;
    store_output::<T, BQ, D, NO>(&acc, &softmax, q_tile, warp_row, sq - m0, o, lse, out_row0);
}

/// The config of variant `VAR` for `D`, checked against the kernel's const parameters and the
/// placement of Q's fragments (evaluated at compile time).
const fn checked_config<
    T: MmaElem,
    Q: QOperand<T, BQ, D>,
    const VAR: u32,
    const D: usize,
    const BQ: usize,
    const BK: usize,
    const KD: usize,
    const NS: usize,
    const NO: usize,
>() -> FlashConfig {
    let Some(FlashVariant {
        config: cfg,
        q_frags,
        ..
    }) = flash_variant(VAR, D)
    else {
        panic!("no FlashAttention config for this variant and head dim")
    };
    assert!(matches!(
        (q_frags, Q::KIND),
        (QFrags::Registers, QFrags::Registers) | (QFrags::Shared, QFrags::Shared)
    ));
    assert!(cfg.block_q == BQ && cfg.block_k == BK && cfg.stages == 2);
    assert!(KD == D / 16 && NS == BK / 8 && NO == D / 8);
    assert!(BQ % 16 == 0 && BK % 16 == 0 && D % 16 == 0 && BQ <= 256);
    let planned = Tile::<T, BQ, D>::BYTES + 2 * cfg.stages * Tile::<T, BK, D>::BYTES;
    assert!(planned == cfg.smem_bytes());
    cfg
}

/// Issues this thread's share of the 16-byte copies of rows `row0..row0 + ROWS` of a `[rows, D]`
/// matrix at `src` into `tile`; rows at or past `rows` are zero-filled. `BQ / 16` warps share the work.
///
/// # Safety
/// `src` points at `rows` readable rows of `D` elements, 16-byte aligned; `tile` is idle.
#[inline(always)]
unsafe fn load_rows<
    T: MmaElem,
    const ROWS: usize,
    const D: usize,
    const BQ: usize,
    const LEAN: bool,
>(
    tile: Tile<T, ROWS, D>,
    src: *const T,
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
        // Lean: the thread index behind an opaque move, so the per-copy offsets are recomputed
        // (a few integer ops) rather than hoisted out of the K loop into registers.
        let tid = if LEAN {
            opaque_u32(thread_idx_x())
        } else {
            thread_idx_x()
        };
        let c = tid + (i * BQ * 2) as u32;
        let (r, chunk) = (c / chunks_per_row, c % chunks_per_row);
        let fill = row0 + r < rows;
        let at = if fill {
            (row0 + r) as usize * D + chunk as usize * 8
        } else {
            0
        };
        // SAFETY: `at` is inside the `rows` rows when `fill` (else not read); 8 elements = 16 bytes.
        unsafe { tile.copy_chunk_async(r, chunk, src.add(at) as *const u8, fill) };
    });
}

/// One warp's Q operand of `S = Q K^T`: the `mma` A fragment of its 16 rows and 16-dim step `kd`.
trait QOperand<T: MmaElem, const BQ: usize, const D: usize>: Sized {
    /// Which [`QFrags`] placement this is (checked against the variant's config).
    const KIND: QFrags;
    /// Prepares the operand of rows `warp_row..warp_row + 16` of `tile`; every element's sign bit is
    /// XORed with `sign` (0 or `0x8000_8000`, per 16-bit half). Called by the whole warp, converged,
    /// after Q's copies have landed and a CTA barrier has made them visible.
    fn new(tile: Tile<T, BQ, D>, warp_row: u32, sign: u32) -> Self;
    /// The A fragment of step `kd` (dims `16 kd..16 kd + 16`); the whole warp calls it together.
    fn frag(&self, kd: usize) -> FragA;
}

/// Q's fragments loaded once into registers (`KD = D / 16` fragments of 4 words).
struct QInRegisters<const KD: usize>([FragA; KD]);

impl<T: MmaElem, const BQ: usize, const D: usize, const KD: usize> QOperand<T, BQ, D>
    for QInRegisters<KD>
{
    const KIND: QFrags = QFrags::Registers;

    #[inline(always)]
    fn new(tile: Tile<T, BQ, D>, warp_row: u32, sign: u32) -> Self {
        const { assert!(KD == D / 16) };
        let mut qf = [[0u32; 4]; KD];
        unroll_lt!(kd < KD, {
            qf[kd] = tile.load_a(warp_row, 2 * kd as u32).map(|w| w ^ sign);
        });
        Self(qf)
    }

    #[inline(always)]
    fn frag(&self, kd: usize) -> FragA {
        self.0[kd]
    }
}

/// Q's fragments re-read from the resident shared tile at every use: one `ldmatrix.x4` per
/// 16-dim step of each K tile instead of `4 D / 16` registers held across the loop.
struct QInShared<T: MmaElem, const BQ: usize, const D: usize> {
    tile: Tile<T, BQ, D>,
    warp_row: u32,
}

impl<T: MmaElem, const BQ: usize, const D: usize> QOperand<T, BQ, D> for QInShared<T, BQ, D> {
    const KIND: QFrags = QFrags::Shared;

    /// A sign flip is applied to the warp's own 16 rows in place, once (only this warp reads them,
    /// here and in the epilogue's staging), so the loop's loads are plain `ldmatrix`.
    #[inline(always)]
    fn new(tile: Tile<T, BQ, D>, warp_row: u32, sign: u32) -> Self {
        if sign != 0 {
            let chunks_per_row = Tile::<T, BQ, D>::CHUNKS_PER_ROW as u32;
            unroll_lt!(i < 16 * D / 8 / 32, {
                let c = lane_id() + 32 * i as u32;
                let (r, chunk) = (warp_row + c / chunks_per_row, c % chunks_per_row);
                let words = tile.load_chunk(r, chunk).map(|w| w ^ sign);
                tile.store_chunk(r, chunk, words);
            });
            // Every lane's flip before any lane's `ldmatrix` of the rows.
            sync_warp(FULL_MASK);
        }
        Self { tile, warp_row }
    }

    #[inline(always)]
    fn frag(&self, kd: usize) -> FragA {
        self.tile.load_a(self.warp_row, 2 * kd as u32)
    }
}

/// `S = Q K^T` (unscaled) for this warp's 16 rows and the `BK` keys of `kt`.
#[inline(always)]
fn scores<
    T: MmaElem,
    Q: QOperand<T, BQ, D>,
    const BQ: usize,
    const BK: usize,
    const D: usize,
    const KD: usize,
    const NS: usize,
>(
    q: &Q,
    kt: Tile<T, BK, D>,
) -> [FragC; NS] {
    let mut s = [[0.0f32; 4]; NS];
    unroll_lt!(kd < KD, {
        let a = q.frag(kd);
        unroll_lt!(np < NS / 2, {
            let [b0, b1] = kt.load_b_pair_nk(16 * np as u32, 2 * kd as u32);
            T::mma(&mut s[2 * np], &a, b0);
            T::mma(&mut s[2 * np + 1], &a, b1);
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

/// P (this warp's 16 x `BK` probabilities) rounded to `T`: per 8-key tile, the words of rows
/// `g` and `g + 8` (two keys each).
#[inline(always)]
fn pack_p<T: MmaElem, const NS: usize>(p: &[FragC; NS]) -> [[u32; 2]; NS] {
    let mut out = [[0u32; 2]; NS];
    unroll_lt!(n < NS, {
        out[n] = [T::pack2(p[n][0], p[n][1]), T::pack2(p[n][2], p[n][3])];
    });
    out
}

/// `acc += P V`: `p_frag(ks)` is the A fragment of P's 16-key block `ks` (of `blocks = BK / 16`),
/// rounded to `T` (two 8-key tiles of S make one block).
#[inline(always)]
fn accumulate_pv<T: MmaElem, const BK: usize, const D: usize, const NO: usize>(
    acc: &mut [FragC; NO],
    p_frag: impl Fn(usize) -> FragA,
    blocks: usize,
    vt: Tile<T, BK, D>,
) {
    unroll_lt!(ks < BK / 16, {
        check_index(ks, blocks);
        let a = p_frag(ks);
        unroll_lt!(np < NO / 2, {
            let [b0, b1] = vt.load_b_pair_kn(16 * ks as u32, 2 * np as u32);
            T::mma(&mut acc[2 * np], &a, b0);
            T::mma(&mut acc[2 * np + 1], &a, b1);
        });
    });
}

/// Writes this warp's 16 rows of `O = acc / l` and their LSE. `rows_left` = valid rows from the
/// CTA's first row; `out_row0` = global row index (over batch*heads*seq_q) of the warp's first row.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn store_output<T: MmaElem, const BQ: usize, const D: usize, const NO: usize>(
    acc: &[FragC; NO],
    softmax: &OnlineSoftmax,
    staging: Tile<T, BQ, D>,
    warp_row: u32,
    rows_left: u32,
    o: SliceMut<T>,
    lse: SliceMut<f32>,
    out_row0: u64,
) {
    let (g, t) = (lane_id() / 4, lane_id() % 4);
    let mut inv = [0.0f32; 2];
    let mut row_lse = [f32::NEG_INFINITY; 2];
    unroll!(r in [0, 1] {
        let mut l = softmax.l[r];
        l += shfl_xor_f32(l, 1);
        l += shfl_xor_f32(l, 2);
        if l > 0.0 {
            inv[r] = 1.0 / l;
            row_lse[r] = fma(softmax.m[r], softmax.c, log2(l)) * LN_2;
        }
    });
    // The warp's rows of the Q tile are free (Q's fragments live in registers, or the loop that
    // re-read them is over) and only this warp touches them, so warp barriers order the staging: the first orders every lane's `ldmatrix` read
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
        if warp_row + r < rows_left {
            let at = (out_row0 + r as u64) * (D / 8) as u64 + chunk as u64;
            check_index(at as usize, o.len as usize / 8);
            // SAFETY: the row is < seq_q of this head (checked just above), so the chunk lies in `o`
            // (launcher-validated size, 16-byte aligned base); each chunk has one writer.
            unsafe {
                store_chunk(
                    o.ptr as *mut Chunk16,
                    at,
                    Chunk16(staging.load_chunk(warp_row + r, chunk)),
                )
            };
        }
    });
    if t == 0 {
        unroll!(r in [0, 1] {
            let row = warp_row + g + 8 * r as u32;
            if row < rows_left {
                lse.set(out_row0 + (g + 8 * r as u32) as u64, row_lse[r]);
            }
        });
    }
}

macro_rules! flash_entry_points {
    ($($name:ident: $t:ty, $var:expr, $cfg:expr, $q:ident;)*) => {$(
        /// FlashAttention forward; launch with the grid, block and shared memory of its config.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(
            q: Slice<$t>, k: Slice<$t>, v: Slice<$t>, o: SliceMut<$t>, lse: SliceMut<f32>, shape: AttentionShape,
        ) {
            const C: FlashConfig = $cfg;
            unsafe {
                flash_fwd::<
                    $t,
                    flash_entry_points!(@q $q, $t, C),
                    { $var },
                    { $var != 1 },
                    { C.head_dim },
                    { C.block_q },
                    { C.block_k },
                    { C.head_dim / 16 },
                    { C.block_k / 8 },
                    { C.head_dim / 8 },
                >(q, k, v, o, lse, shape)
            }
        }
    )*};
    (@q QInRegisters, $t:ty, $c:ident) => { QInRegisters<{ $c.head_dim / 16 }> };
    (@q QInShared, $t:ty, $c:ident) => { QInShared<$t, { $c.block_q }, { $c.head_dim }> };
}

flash_entry_points! {
    flash_fwd_d64_f16: F16, 1, FLASH_D64, QInRegisters;
    flash_fwd_d64_bf16: BF16, 1, FLASH_D64, QInRegisters;
    flash_fwd_d128_f16: F16, 1, FLASH_D128, QInRegisters;
    flash_fwd_d128_bf16: BF16, 1, FLASH_D128, QInRegisters;
    // Tuning variants (`FLASH_VARIANTS`; the index is the variant number minus 2).
    flash_fwd_v2_d128_f16: F16, 2, FLASH_VARIANTS[0].config, QInShared;
    flash_fwd_v2_d128_bf16: BF16, 2, FLASH_VARIANTS[0].config, QInShared;
    flash_fwd_v3_d128_f16: F16, 3, FLASH_VARIANTS[1].config, QInRegisters;
    flash_fwd_v3_d128_bf16: BF16, 3, FLASH_VARIANTS[1].config, QInRegisters;
    flash_fwd_v4_d64_f16: F16, 4, FLASH_VARIANTS[2].config, QInRegisters;
    flash_fwd_v4_d64_bf16: BF16, 4, FLASH_VARIANTS[2].config, QInRegisters;
}
