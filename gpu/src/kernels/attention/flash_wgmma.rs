//! FlashAttention forward on Hopper warpgroup MMA (`wgmma`, sm_90a) with `cp.async` loads and one
//! warpgroup a CTA: entry points `flash_wg4_fwd_d64_{dtype}` (64 query rows a CTA, so that short
//! sequences fill the SMs with several CTAs each; the sm_90 build's forward where 128-row CTAs would
//! not fill the chip twice over). The semantics, outputs and masking contract are those of the sm_80
//! build's `mma.sync` kernel (`flash.rs`). This module also holds the pieces the warp-specialised
//! kernel (`flash_tma.rs`) shares: masking, online softmax, P packing, O rescaling and the epilogue.
//! Compiled only into the sm_90 PTX (`#[cfg(target_feature = "sm_90a")]` on the module).
//!
//! - Q's block is copied to shared memory once (`cp.async`) in the 128-byte-swizzle layout
//!   ([`SwizzledTile`]) and read by every `S = Q K^T` wgmma through a descriptor (K-major A).
//! - K and V stream through two stages each, by `cp.async` 16-byte copies in commit groups, in the same
//!   layout; rows past the end are zero-filled. K `[keys][D]` is the K-major B of `Q K^T`; V
//!   `[keys][D]` is the MN-major B (`imm-trans-b = 1`) of `P V`.
//! - `S` (64 x `BK`, `BK / 2` f32 a thread) = `D / 16` wgmma k-steps in one group. Its register
//!   layout is the `mma.m16n8` accumulator layout per warp, so the masking and the online softmax
//!   (running max of raw scores, `exp2(s c - m c)` with `c = |scale| log2 e`) are those of the
//!   `mma.sync` kernel; a negative scale negates Q's tile once in shared memory (sign bits, exact).
//! - P rounded to the input type in registers is the A operand (registers) of `O += P V`.
//! - Epilogue: `O / l` rounded to the input type, staged through the warp's own rows of the Q tile for
//!   16-byte stores; `LSE = (m c + log2 l) ln 2`; a row with no visible key gets O = 0, LSE = -inf.
//!
//! The schedule (FlashAttention-3's intra-warpgroup overlap) issues `P V(j-1)` right after `S(j)`
//! and waits only for `S(j)` (`wait_group 1`), so the tensor cores run `P V(j-1)` while the
//! warpgroup computes softmax(j); only then does it wait for `P V(j-1)`, rescale O and pack P(j).
//! One barrier a tile:
//! ```text
//! wait 0, proxy fence, barrier   K(j), V(j-1) landed; every warpgroup retired S(j-1), P V(j-2)
//! load K(j+1), V(j), commit      into the stages S(j-1) and P V(j-2) read
//! issue S(j), commit; issue P V(j-1), commit; wait 1 (S(j) retired)
//! mask, softmax(j); wait 0 (P V(j-1) retired); rescale O; P(j) = pack(S(j))
//! ... after the loop: wait 0, fence, barrier; issue P V(n-1); wait 0
//! ```

use crate::dev::copy::{cp_async_commit, cp_async_wait};
use crate::dev::elem::{BF16, F16};
use crate::dev::math::{LN_2, LOG2_E, abs, exp2, fma, log2, max, tanh};
use crate::dev::mem::{Chunk16, Slice, SliceMut, store_chunk};
use crate::dev::mma::MmaElem;
use crate::dev::shared::{SharedScalar, dynamic_base, ld_shared_v4, st_shared_v4};
use crate::dev::sync::{sync_threads, sync_warp};
use crate::dev::thread::{block_idx_x, block_idx_y, block_idx_z, lane_id, thread_idx_x};
use crate::dev::warp::{FULL_MASK, shfl_xor_f32};
use crate::dev::wgmma::{Accumulator, SwizzledTile, Wgmma, commit, fence, fence_proxy_async};
use crate::params::attention::{
    AttentionLayout, AttentionShape, Band, FLASH_WG_D64_Q64, FlashWgmmaConfig,
    flash_wgmma_config_of,
};
use crate::{unroll, unroll_lt};

use super::{HeadRows, HeadRowsMut, Sequence};

/// The forward kernel. `SN = BK / 2` and `ON = D / 2` are the f32 accumulators a thread holds for S
/// and O; both are checked against the config.
#[inline(always)]
unsafe fn flash_wg_fwd<
    T,
    const D: usize,
    const BQ: usize,
    const BK: usize,
    const TH: usize,
    const SN: usize,
    const ON: usize,
>(
    q: Slice<T>,
    k: Slice<T>,
    v: Slice<T>,
    o: SliceMut<T>,
    lse: SliceMut<f32>,
    p: AttentionShape,
    st: AttentionLayout,
) where
    T: Wgmma<[f32; SN]> + Wgmma<[f32; ON]>,
    [f32; SN]: Accumulator,
    [f32; ON]: Accumulator,
{
    let cfg: FlashWgmmaConfig = const { checked_config::<D, BQ, BK, TH, SN, ON>() };
    let qb = QueryBlock::of::<BQ, BK>(&p, &st);
    let p0 = p;
    let p = qb.seq.shape(p);
    let (sq, sk) = (p.seq_q, p.seq_k);
    let QueryBlock {
        m0,
        seq,
        h,
        hkv,
        diag,
        band,
        first_tile,
        n_tiles,
    } = qb;
    // Tiles are counted from the first the block sees (a window's left edge): tile `first_tile + t`
    // at step t.
    let steps = n_tiles - first_tile;
    // This head's rows (the launcher validated that every head's rows lie inside the operands;
    // checked builds re-check).
    let q_src = HeadRows::of(q, st.q, (seq.bi, h), (seq.q0, sq), p.head_dim);
    let k_src = HeadRows::of(k, st.k, (seq.bi, hkv), (seq.k0, sk), p.head_dim);
    let v_src = HeadRows::of(v, st.v, (seq.bi, hkv), (seq.k0, sk), p.head_dim);

    // Q, then the K stages, then the V stages; every tile is whole 1024-byte atoms (config asserts),
    // so all stay 1024-aligned in the 1024-aligned dynamic window.
    let q_tile = SwizzledTile::<BQ, D>::at(dynamic_base());
    let k_tiles = SwizzledTile::<BK, D>::at(dynamic_base() + SwizzledTile::<BQ, D>::BYTES as u32);
    let v_tiles = k_tiles.stage(cfg.stages as u32);

    // SAFETY (all `load_rows` calls): rows inside this head's rows (the rest zero-filled without
    // reading); every copied-into stage is idle per the pipeline above.
    unsafe {
        load_rows::<BQ, D, TH, T>(q_tile, q_src, m0, sq);
        if steps > 0 {
            load_rows::<BK, D, TH, T>(k_tiles, k_src, first_tile * BK as u32, sk);
        }
        cp_async_commit();
        // The loop loads V(j) in iteration j.
        cp_async_commit();
    }
    cp_async_wait::<1>();
    fence_proxy_async();
    sync_threads();
    if p.scale < 0.0 {
        // s * scale == (-s) * |scale|: negate Q (sign bits of f16 and bf16 alike), once.
        negate_tile::<BQ, D, TH>(q_tile);
        fence_proxy_async();
        sync_threads();
    }

    let tid = thread_idx_x();
    let wg_row = (tid / 128) * 64; // this warpgroup's first row in the block
    let warp_row = wg_row + ((tid / 32) % 4) * 16; // this warp's first row in the block
    let first_row = m0 + warp_row + lane_id() / 4; // this thread's rows: first_row and first_row + 8
    let key_limit = key_limits(first_row, sk, diag, band);
    // Clamped away from 0 so that masked scores stay -inf (not NaN) under scale = 0.
    let mut softmax = OnlineSoftmax::new(max(p.scale.abs() * LOG2_E, 1e-30));
    let mut acc = [0.0f32; ON];
    let mut s = [0.0f32; SN];

    // The overlapped schedule (see the module doc): P V(j-1) runs during softmax(j).
    let mut pf = [[0u32; 4]; 16];
    for t in 0..steps {
        let stage = t % 2;
        let n0 = (first_tile + t) * BK as u32;
        if t > 0 {
            // K(j) and V(j-1) (this thread's newest group) have landed; every warpgroup retired
            // S(j-1) and P V(j-2).
            cp_async_wait::<0>();
            fence_proxy_async();
            sync_threads();
        }
        // SAFETY: see above; K(j+1) goes into the stage S(j-1) read, V(j) into the stage
        // P V(j-2) read, both retired before the barrier above.
        unsafe {
            if t + 1 < steps {
                load_rows::<BK, D, TH, T>(k_tiles.stage(1 - stage), k_src, n0 + BK as u32, sk);
            }
            load_rows::<BK, D, TH, T>(v_tiles.stage(stage), v_src, n0, sk);
        }
        cp_async_commit();

        fence();
        // SAFETY: the whole warpgroup issues it (no divergence above); Q and K(j) landed and were
        // fenced before the barrier; `s` is untouched until the wait below.
        unsafe { issue_s::<T, BQ, BK, D, D, SN>(&mut s, q_tile, wg_row, k_tiles.stage(stage)) };
        if t > 0 {
            // P V(j-1): V(j-1) landed before the barrier above; P(j-1) and the rescaled O were
            // written before the fence above.
            // SAFETY: the whole warpgroup; see above.
            unsafe { issue_pv::<T, BK, D, ON>(&mut acc, &pf, v_tiles.stage(1 - stage)) };
            // S(j) retired (groups retire in order); P V(j-1) may still run.
            s.wait::<1>();
        } else {
            s.wait::<0>();
        }
        if p.softcap_k > 0.0 {
            softcap(&mut s, p.softcap_k);
        }
        if KeyLimits::tile_needs_mask::<BK>(n0, sk, (m0 + wg_row, diag, band)) {
            mask(&mut s, n0, key_limit);
        }
        // Eager rescale: a row here spans a few tiles (the seed shape's 512 keys are 4), where
        // the lazy form's branches cost more than the rescales they skip (docs/PERF_NOTES.md,
        // "The seed shape's forward rescales eagerly again").
        let alpha = softmax.update::<SN, false>(&mut s);
        acc.wait::<0>(); // P V(j-1) retired: O and P(j-1) are free
        rescale(&mut acc, alpha);
        pf = pack_p::<T, SN>(&s);
    }
    if steps > 0 {
        // The last P V: V(n-1) has landed (this thread's newest group); every warpgroup retired
        // its S(n-1) before the barrier, so the epilogue may reuse the Q tile.
        cp_async_wait::<0>();
        fence_proxy_async();
        sync_threads();
        fence();
        // SAFETY: the whole warpgroup; see above.
        unsafe { issue_pv::<T, BK, D, ON>(&mut acc, &pf, v_tiles.stage((steps - 1) % 2)) };
    }
    acc.wait::<0>();

    store_output::<T, BQ, D, ON>(&acc, &softmax, q_tile, warp_row, (&p0, &st), (o, lse));
}

/// The query block a CTA computes and the key tiles it visits: block `blockIdx.x` from the last
/// (heaviest first: under a causal mask later blocks see more keys), head `blockIdx.y`, batch
/// `blockIdx.z`; the tiles of `BK` keys from the one holding the first key its first row sees to
/// the one holding the last key its last row sees.
#[derive(Clone, Copy)]
pub(super) struct QueryBlock {
    /// The block's first query row (counted in its sequence).
    pub m0: u32,
    /// Its batch entry's sequences.
    pub seq: Sequence,
    /// Its query head, and the key/value head it reads (`head / group`).
    pub h: u32,
    pub hkv: u32,
    /// Query `i` sees keys `band.lo(i, diag)..band.hi(i, diag)` (within `0..seq_k`): `diag` aligns
    /// the causal mask and the window to the bottom-right corner.
    pub diag: i32,
    pub band: Band,
    /// The key tiles the block's rows see: `first_tile..n_tiles`.
    pub first_tile: u32,
    pub n_tiles: u32,
}

impl QueryBlock {
    /// This CTA's block under shape `p` and layout `l`. The grid of a packed batch covers the
    /// longest sequence: a CTA past its sequence's last block gets `m0 = sq` (no rows to store) and no
    /// key tile, and runs through without a branch of its own (an early exit, or a branch around
    /// the loop, made ptxas spill and serialise the wgmma of the warp-specialised kernel).
    #[inline(always)]
    pub(super) fn of<const BQ: usize, const BK: usize>(
        p: &AttentionShape,
        l: &AttentionLayout,
    ) -> Self {
        let h = block_idx_y();
        let seq = Sequence::of(l, p, block_idx_z());
        let (sq, sk) = (seq.sq, seq.sk);
        let blocks = sq.div_ceil(BQ as u32);
        let here = block_idx_x() < blocks;
        let m0 = if here {
            (blocks - 1 - block_idx_x()) * BQ as u32
        } else {
            sq
        };
        let diag = sk as i32 - sq as i32;
        let band = Band::of(p);
        let rows_here = (sq - m0).min(BQ as u32);
        // The last row's last key and the first row's first (rows see rising key ranges).
        let key_end = if !here {
            0
        } else {
            last_key_end(band, m0 + rows_here - 1, diag, sk)
        };
        let key_begin = band.lo(m0 as i32, diag).clamp(0, key_end as i32) as u32;
        Self {
            m0,
            seq,
            h,
            hkv: h / p.group(),
            diag,
            band,
            first_tile: key_begin / BK as u32,
            n_tiles: key_end.div_ceil(BK as u32),
        }
    }
}

/// One past the last key query row `row` sees (within `0..sk`): where the key tiles of a block, or
/// of a warpgroup, whose last row is `row` end.
#[inline(always)]
pub(super) fn last_key_end(band: Band, row: u32, diag: i32, sk: u32) -> u32 {
    band.hi(row as i32, diag).clamp(0, sk as i32) as u32
}

/// Issues `S = Q K^T` for the warpgroup whose query rows start at `wg_row` of `q_tile`: `COLS / 16`
/// wgmma k-steps (the head dim's columns, `COLS <= D`: the tile's columns past them are zeros and
/// add nothing) against `k_tile` in one committed group (the caller fenced and later waits).
///
/// # Safety
/// The whole warpgroup calls it; both tiles have landed and are fenced for the async proxy, and stay
/// until a wait covering this group; `s` is untouched until then.
#[inline(always)]
pub(super) unsafe fn issue_s<
    T,
    const BQ: usize,
    const BK: usize,
    const D: usize,
    const COLS: usize,
    const SN: usize,
>(
    s: &mut [f32; SN],
    q_tile: SwizzledTile<BQ, D>,
    wg_row: u32,
    k_tile: SwizzledTile<BK, D>,
) where
    T: Wgmma<[f32; SN]>,
{
    const { assert!(COLS <= D && COLS % 16 == 0) };
    unroll_lt!(kd < COLS / 16, {
        // SAFETY: the caller's.
        unsafe {
            T::mma_ss(
                s,
                q_tile.desc_k_major(wg_row, kd as u32),
                k_tile.desc_k_major(0, kd as u32),
                (kd > 0) as u32,
            )
        };
    });
    commit();
}

/// Issues `O += P V` from the packed P fragments `pf` and `v_tile`: `BK / 16` wgmma in one
/// committed group, over V's first `2 ON` columns (the head dim's; `2 ON <= D`).
///
/// # Safety
/// As for [`issue_s`], with `acc` for `s`; `pf` and `acc` were written before the caller's fence.
#[inline(always)]
pub(super) unsafe fn issue_pv<T, const BK: usize, const D: usize, const ON: usize>(
    acc: &mut [f32; ON],
    pf: &[[u32; 4]; 16],
    v_tile: SwizzledTile<BK, D>,
) where
    T: Wgmma<[f32; ON]>,
{
    const { assert!(2 * ON <= D) };
    unroll_lt!(ks < BK / 16, {
        // SAFETY: the caller's.
        unsafe { T::mma_rs_tb(acc, &pf[ks], v_tile.desc_mn_major(ks as u32)) };
    });
    commit();
}

/// The config for `D`, checked against the kernel's const parameters (evaluated at compile time).
const fn checked_config<
    const D: usize,
    const BQ: usize,
    const BK: usize,
    const TH: usize,
    const SN: usize,
    const ON: usize,
>() -> FlashWgmmaConfig {
    let Some(cfg) = flash_wgmma_config_of(D, BQ, BK) else {
        panic!("no wgmma FlashAttention config with these tile sizes")
    };
    assert!(cfg.stages == 2);
    assert!(SN == BK / 2 && ON == D / 2 && BK <= 128 && D <= 128 && TH == cfg.threads());
    assert!(SwizzledTile::<BQ, D>::BYTES % 1024 == 0 && SwizzledTile::<BK, D>::BYTES % 1024 == 0);
    let planned = SwizzledTile::<BQ, D>::BYTES + 2 * cfg.stages * SwizzledTile::<BK, D>::BYTES;
    assert!(planned == cfg.smem_bytes());
    cfg
}

/// Issues this thread's share of the 16-byte copies of rows `row0..row0 + ROWS` of the head `src`
/// into `tile`; rows at or past `rows` are zero-filled. `TH` threads share the work.
///
/// # Safety
/// `src` has `rows` readable rows of `D` elements, 16-byte aligned; `tile` is idle.
#[inline(always)]
pub(super) unsafe fn load_rows<const ROWS: usize, const D: usize, const TH: usize, T>(
    tile: SwizzledTile<ROWS, D>,
    src: HeadRows<T>,
    row0: u32,
    rows: u32,
) {
    // SAFETY: the caller's.
    unsafe { load_cols::<ROWS, D, D, TH, T>(tile, src, row0, rows) }
}

/// [`load_rows`] into the first `LD` columns of each row only (the columns a kernel's products
/// read; the rest of the tile is left as it was).
///
/// # Safety
/// As [`load_rows`].
#[inline(always)]
pub(super) unsafe fn load_cols<
    const ROWS: usize,
    const D: usize,
    const LD: usize,
    const TH: usize,
    T,
>(
    tile: SwizzledTile<ROWS, D>,
    src: HeadRows<T>,
    row0: u32,
    rows: u32,
) {
    let chunks_per_row = (LD / 8) as u32;
    const {
        assert!(
            (ROWS * LD / 8) % TH == 0 && LD <= D && LD % 8 == 0,
            "copies must divide evenly among threads"
        )
    };
    unroll_lt!(i < ROWS * LD / 8 / TH, {
        let c = thread_idx_x() + (i * TH) as u32;
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

/// Flips the sign bit of every element of `tile` (after its copies landed and a barrier).
#[inline(always)]
fn negate_tile<const ROWS: usize, const D: usize, const TH: usize>(tile: SwizzledTile<ROWS, D>) {
    let chunks_per_row = (D / 8) as u32;
    const { assert!((ROWS * D / 8) % TH == 0) };
    unroll_lt!(i < ROWS * D / 8 / TH, {
        let c = thread_idx_x() + (i * TH) as u32;
        let addr = tile.chunk_addr(c / chunks_per_row, c % chunks_per_row);
        // SAFETY: an aligned chunk of the tile; each chunk has one thread, and the barrier after this
        // orders the writes before any reader.
        unsafe {
            let w = ld_shared_v4(addr);
            st_shared_v4(addr, w.map(|x| x ^ 0x8000_8000));
        }
    });
}

/// `O *= alpha` per row (`acc[4n], acc[4n + 1]`: row g; `acc[4n + 2], acc[4n + 3]`: row g + 8).
#[inline(always)]
pub(super) fn rescale<const ON: usize>(acc: &mut [f32; ON], alpha: [f32; 2]) {
    // Pairs of 8-column blocks: up to D = 256 (32 blocks) in `unroll_lt!`'s 16 trips.
    unroll_lt!(n2 < ON / 8, {
        unroll!(h in [0, 1] {
            let n = 2 * n2 + h;
            acc[4 * n] *= alpha[0];
            acc[4 * n + 1] *= alpha[0];
            acc[4 * n + 2] *= alpha[1];
            acc[4 * n + 3] *= alpha[1];
        });
    });
}

/// P (the probabilities in `s`) rounded to `T` as the A fragments of the `SN / 8` k-steps of
/// `P V`: step `ks` is S's 8-column blocks `2 ks` and `2 ks + 1` (entries `8 ks..8 ks + 8`).
#[inline(always)]
pub(super) fn pack_p<T: MmaElem, const SN: usize>(s: &[f32; SN]) -> [[u32; 4]; 16] {
    let mut pf = [[0u32; 4]; 16];
    unroll_lt!(ks < SN / 8, {
        let b = 8 * ks;
        pf[ks] = [
            T::pack2(s[b], s[b + 1]),
            T::pack2(s[b + 2], s[b + 3]),
            T::pack2(s[b + 4], s[b + 5]),
            T::pack2(s[b + 6], s[b + 7]),
        ];
    });
    pf
}

/// The logit softcap on raw scores `s` (the softmax multiplies them by `|scale|`): with `k = c /
/// |scale|`, `s = k tanh(s / k)`, so that `|scale| s = c tanh(scale q . k / c)`. (A negative scale
/// was folded into Q's sign.) `k` is the shape's [`AttentionShape::softcap_k`], > 0.
#[inline(always)]
pub(super) fn softcap<const SN: usize>(s: &mut [f32; SN], k: f32) {
    let inv = 1.0 / k;
    unroll_lt!(n < SN / 4, {
        unroll!(e in [0, 1, 2, 3] {
            s[4 * n + e] = k * tanh(s[4 * n + e] * inv);
        });
    });
}

/// ALiBi on raw scores: subtracts `slope |pos[r] - key|` (`slope` from [`super::alibi_slope`],
/// `pos[r]` the aligned position `row + diag` of this thread's row `r`), with `s` laid out as in
/// [`mask`]. The distances are f32 offsets from the tile's first key (exact below 2^24), one add
/// and one fma an entry.
#[inline(always)]
pub(super) fn alibi<const SN: usize>(s: &mut [f32; SN], n0: u32, pos: [i32; 2], slope: f32) {
    let first = (n0 + 2 * (lane_id() % 4)) as i32;
    let base = [(pos[0] - first) as f32, (pos[1] - first) as f32];
    unroll_lt!(n < SN / 4, {
        unroll!(e in [0, 1] {
            let off = (8 * n + e) as f32;
            s[4 * n + e] = fma(-slope, abs(base[0] - off), s[4 * n + e]);
            s[4 * n + 2 + e] = fma(-slope, abs(base[1] - off), s[4 * n + 2 + e]);
        });
    });
}

/// For this thread's two rows (`row`, `row + 8`): the keys each sees, `lo[r]..hi[r]` (`hi` at
/// most `sk`).
#[inline(always)]
pub(super) fn key_limits(row: u32, sk: u32, diag: i32, band: Band) -> KeyLimits {
    let hi = |r: u32| band.hi(r as i32, diag).min(sk as i32);
    KeyLimits {
        lo: [band.lo(row as i32, diag), band.lo(row as i32 + 8, diag)],
        hi: [hi(row), hi(row + 8)],
    }
}

/// The keys a thread's two rows see: `lo[r]..hi[r]`.
#[derive(Clone, Copy)]
pub(super) struct KeyLimits {
    pub lo: [i32; 2],
    pub hi: [i32; 2],
}

impl KeyLimits {
    /// Whether a tile of keys `n0..n0 + BK` needs [`mask`] for a warpgroup whose 64 rows start at
    /// `row0`: past `sk`, or crossing the first row's last key or the last row's first.
    #[inline(always)]
    pub(super) fn tile_needs_mask<const BK: usize>(
        n0: u32,
        sk: u32,
        (row0, diag, band): (u32, i32, Band),
    ) -> bool {
        let last_key = (n0 + BK as u32 - 1) as i32;
        n0 + BK as u32 > sk
            || last_key >= band.hi(row0 as i32, diag)
            || (n0 as i32) < band.lo(row0 as i32 + 63, diag)
    }
}

/// Sets scores of keys outside each row's `lo..hi` to -inf (tile keys start at `n0`). `s[4n + e]` is
/// row `g`, key `n0 + 8n + 2q + e`; `s[4n + 2 + e]` row `g + 8`, same key.
#[inline(always)]
pub(super) fn mask<const SN: usize>(s: &mut [f32; SN], n0: u32, limit: KeyLimits) {
    let first = (n0 + 2 * (lane_id() % 4)) as i32;
    unroll_lt!(n < SN / 4, {
        unroll!(e in [0, 1] {
            let key = first + (8 * n + e) as i32;
            if key >= limit.hi[0] || key < limit.lo[0] {
                s[4 * n + e] = f32::NEG_INFINITY;
            }
            if key >= limit.hi[1] || key < limit.lo[1] {
                s[4 * n + 2 + e] = f32::NEG_INFINITY;
            }
        });
    });
}

/// How far (in log2 units of P) a row's maximum may grow past the base of its exponentials before
/// the base moves and O is rescaled: P then stays at most about 2^8 = 256, far inside f16's range
/// (65504; bf16's is f32's), and most tiles of a long row skip the rescale (FlashAttention-4's lazy
/// rescaling).
pub(super) const RESCALE_LOG2: f32 = 8.0;

/// The base of each row's exponentials (`m`, a raw score: the running max when it last moved, see
/// [`RESCALE_LOG2`]) and this thread's partial row sums (`l`) of its two rows, relative to that
/// base; `c = |scale| log2(e) > 0`.
pub(super) struct OnlineSoftmax {
    m: [f32; 2],
    l: [f32; 2],
    c: f32,
}

impl OnlineSoftmax {
    #[inline(always)]
    pub(super) fn new(c: f32) -> Self {
        Self {
            m: [f32::NEG_INFINITY; 2],
            l: [0.0; 2],
            c,
        }
    }

    /// Replaces the raw scores by `exp2(s c - m c)` and returns each row's rescale factor for the
    /// output accumulator. `LAZY`: exactly 1 while the row's maximum stays within [`RESCALE_LOG2`]
    /// of the base `m`, else `exp2(m_old c - m_new c)` with the base moved to the new maximum.
    /// Eager (`!LAZY`): the base is always the running maximum and the factor is computed every
    /// tile, with no branch; kernels whose rows span a few tiles keep it (see `flash_wg4`).
    #[inline(always)]
    pub(super) fn update<const SN: usize, const LAZY: bool>(
        &mut self,
        s: &mut [f32; SN],
    ) -> [f32; 2] {
        let mut alpha = [1.0f32; 2];
        unroll!(r in [0, 1] {
            let mut m = self.m[r];
            unroll_lt!(n < SN / 4, {
                m = max(m, max(s[4 * n + 2 * r], s[4 * n + 2 * r + 1]));
            });
            m = max(m, shfl_xor_f32(m, 1));
            m = max(m, shfl_xor_f32(m, 2));
            // Lazy: the base moves only past the threshold (a first finite maximum always moves
            // it: the growth from -inf is +inf; from -inf to -inf it is NaN, and nothing moves; a
            // NaN score makes the maximum NaN, moves nothing, and turns the row's sum, O and LSE
            // into NaN and -inf as before). The four threads of a row hold the same maxima, so
            // they decide alike.
            if LAZY && (m - self.m[r]) * self.c > RESCALE_LOG2 {
                alpha[r] = exp2(fma(self.m[r], self.c, -(m * self.c)));
                self.m[r] = m;
            }
            let m = if LAZY { self.m[r] } else { m };
            // A row that has seen only masked keys keeps m = -inf; subtracting 0 instead makes its
            // exponentials 0 (not NaN from -inf - -inf).
            let base = if m == f32::NEG_INFINITY { 0.0 } else { m * self.c };
            if !LAZY {
                alpha[r] = exp2(fma(self.m[r], self.c, -base));
            }
            let mut sum = 0.0f32;
            unroll_lt!(n < SN / 4, {
                unroll!(e in [0, 1] {
                    let x = exp2(fma(s[4 * n + 2 * r + e], self.c, -base));
                    s[4 * n + 2 * r + e] = x;
                    sum += x;
                });
            });
            self.l[r] = self.l[r] * alpha[r] + sum;
            if !LAZY {
                self.m[r] = m;
            }
        });
        alpha
    }
}

/// Writes this warp's 16 rows of `O = acc / l` and their LSE, staged through the warp's own rows of
/// the Q tile (free: the warpgroup's last S wgmma has retired). `warp_row` = the warp's first row in
/// the CTA's block (its [`QueryBlock`] under the launch's shape `p` and layout `st`, recomputed here:
/// kept from the start, its values would hold registers through the kernel's loop); O is written
/// with strides `st.o`, the LSE at `st.lse`.
#[inline(always)]
pub(super) fn store_output<T: MmaElem, const BQ: usize, const D: usize, const ON: usize>(
    acc: &[f32; ON],
    softmax: &OnlineSoftmax,
    staging: SwizzledTile<BQ, D>,
    warp_row: u32,
    (p, st): (&AttentionShape, &AttentionLayout),
    (o, lse): (SliceMut<T>, SliceMut<f32>),
) {
    // The caller's CTA has a block (it returned early otherwise).
    let QueryBlock { m0, seq, h, .. } = QueryBlock::of::<BQ, 64>(p, st);
    let sq = seq.sq;
    let rows_left = sq - m0;
    let out = HeadRowsMut::of(o, st.o, (seq.bi, h), (seq.q0, sq), p.head_dim);
    let lse_row0 = seq.lse_at(st, h, m0 + warp_row);
    let (g, t) = (lane_id() / 4, lane_id() % 4);
    let mut inv = [0.0f32; 2];
    let mut row_lse = [f32::NEG_INFINITY; 2];
    unroll!(r in [0, 1] {
        let mut l = softmax.l[r];
        l += shfl_xor_f32(l, 1);
        l += shfl_xor_f32(l, 2);
        // A row that saw no key keeps O = 0 and LSE = -inf; a NaN sum (a NaN score the row sees)
        // takes this branch, so its O and LSE both come out NaN.
        if l != 0.0 {
            inv[r] = 1.0 / l;
            row_lse[r] = fma(softmax.m[r], softmax.c, log2(l)) * LN_2;
        }
    });
    // Only this warp touches its rows of the Q tile from here on; the warp barriers order every
    // lane's writes before the reads (and racecheck sees lanes, not instruction order).
    sync_warp(FULL_MASK);
    // Pairs of 8-column blocks, as in `rescale`.
    unroll_lt!(n2 < ON / 8, {
        unroll!(h in [0, 1] {
            let n = 2 * n2 + h;
            let col = (8 * n) as u32 + 2 * t;
            let c = &acc[4 * n..4 * n + 4];
            // SAFETY: 4-byte aligned addresses (even column) inside the tile.
            unsafe {
                u32::st_shared(
                    staging.elem_addr(warp_row + g, col),
                    T::pack2(c[0] * inv[0], c[1] * inv[0]),
                );
                u32::st_shared(
                    staging.elem_addr(warp_row + g + 8, col),
                    T::pack2(c[2] * inv[1], c[3] * inv[1]),
                );
            }
        });
    });
    sync_warp(FULL_MASK);
    let chunks_per_row = (D / 8) as u32;
    unroll_lt!(i < 16 * D / 8 / 32, {
        let c = lane_id() + 32 * i as u32;
        let (r, chunk) = (c / chunks_per_row, c % chunks_per_row);
        if warp_row + r < rows_left && out.has_chunk(chunk) {
            // SAFETY: the row is < seq_q of this head (checked just above), so the chunk lies in
            // O's head (launcher-validated strides, 16-byte aligned); each chunk has one writer.
            unsafe {
                let words = ld_shared_v4(staging.chunk_addr(warp_row + r, chunk));
                store_chunk(
                    out.at(m0 + warp_row + r, 8 * chunk) as *mut Chunk16,
                    0,
                    Chunk16(words),
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

macro_rules! flash_wg_entry_points {
    ($($name:ident: $t:ty, $cfg:path;)*) => {$(
        // Warpgroups a CTA and CTAs an SM from the config: D = 128 at one CTA per SM (up to 255
        // registers: S, O and P are 160 of them), D = 64 at two (128 registers), the one-warpgroup
        // D = 64 kernel at three (shared memory allows 3).
        crate::launch_bounds!($name, $cfg.threads(), $cfg.min_blocks);
        /// FlashAttention forward on wgmma (sm_90a); launch with the grid, block and shared memory of
        /// its config.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(
            q: Slice<$t>, k: Slice<$t>, v: Slice<$t>, o: SliceMut<$t>, lse: SliceMut<f32>, shape: AttentionShape,
            strides: AttentionLayout,
        ) {
            const C: FlashWgmmaConfig = $cfg;
            unsafe {
                flash_wg_fwd::<$t, { C.head_dim }, { C.block_q }, { C.block_k }, { C.threads() }, { C.block_k / 2 }, { C.head_dim / 2 }>(
                    q, k, v, o, lse, shape, strides,
                )
            }
        }
    )*};
}

flash_wg_entry_points! {
    flash_wg4_fwd_d64_f16: F16, FLASH_WG_D64_Q64;
    flash_wg4_fwd_d64_bf16: BF16, FLASH_WG_D64_Q64;
}
