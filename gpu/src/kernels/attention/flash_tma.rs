//! FlashAttention forward, warp-specialised on the Hopper pipeline (sm_90 build only): entry points
//! `flash_tma_fwd_d{32,64,96,128,192,256}_{f16,bf16}`. Same contract (masking, LSE, any S_q / S_k, scale sign) as the
//! other forward kernels; the masking, online softmax, P packing and epilogue are those of
//! `flash_wgmma.rs`, shared.
//!
//! One CTA per (block of 128 query rows, or 192 at head dims to 64, head, batch), a producer warpgroup
//! and two (three) consumers, 384 (512) threads:
//! ```text
//! warpgroup 0 (producer, 40 (24) registers), thread 0:
//!     TMA Q's rows once (Q's barrier); per K/V tile j: acquire a K stage, TMA K(j);
//!     acquire a V stage, TMA V(j)          (two rings of 2 stages; rows past S_k arrive as zeros)
//! warpgroups 1, 2 (, 3) (consumers, 232 (160) registers; query rows 64 (w - 1)..): wait for Q,
//! then per tile j
//!     wait K(j); wait for this warpgroup's turn; S(j) = Q K(j)^T: issue, commit
//!     j > 0: wait V(j-1); O += P(j-1) V(j-1): issue, commit
//!     hand the turn to the next warpgroup; wait for S(j) only (P V runs on)
//!     release K(j); mask, softmax(j)
//!     wait for P V(j-1); release V(j-1); rescale O; P(j) = pack(S(j))
//!     ... after the loop: wait V(n-1); O += P V; wait; release; store O and LSE
//!     then for the block's tiles past this warpgroup's own rows (the drain): wait K, take and
//!     pass the turn, release K; wait V, release V
//! ```
//! The turns (FlashAttention-3's ping-pong) let one warpgroup's softmax run while another's GEMMs
//! hold the tensor cores. Invisible tiles (past the causal diagonal, outside a window) are never
//! loaded: both roles walk the same tiles (from the first key this block's first row sees to the
//! last its last row sees). Heaviest query blocks first, as in the other kernels. The producer's
//! copies of the next tiles run while the consumers compute, with no block-wide barrier in the loop.
use crate::dev::elem::{BF16, F16};
use crate::dev::math::{LOG2_E, max};
use crate::dev::mbarrier::{MBarrier, PipeState, Pipeline, fence_init};
use crate::dev::mem::SliceMut;
use crate::dev::shared::{check_index, dynamic_base, ld_shared_v4, st_shared_v4};
use crate::dev::sync::{named_barrier, named_barrier_arrive, sync_threads};
use crate::dev::thread::{block_idx_z, lane_id, thread_idx_x};
use crate::dev::tma::TensorMapRef;
use crate::dev::warp::warp_uniform_u32;
use crate::dev::wgmma::{
    Accumulator, SwizzledTile, Wgmma, fence, fence_proxy_async, set_max_registers_dec,
    set_max_registers_inc,
};
use crate::params::TensorMapParam;
use crate::params::attention::{
    AttentionLayout, AttentionShape, FLASH_TMA_D64, FLASH_TMA_D128, FLASH_TMA_D256,
    flash_tma_smem_bytes,
};
use crate::unroll_lt;

use super::alibi_slope;
use super::flash_wgmma::{
    KeyLimits, OnlineSoftmax, QueryBlock, alibi, issue_pv, issue_s, key_limits, last_key_end, mask,
    pack_p, rescale, softcap, store_output,
};

/// K/V ring depth.
const STAGES: usize = 2;
/// The first of the named barriers of the consumers' turns, one a consumer warpgroup (1 to 3 serve
/// the per-warpgroup barrier after negating Q).
const TURN: u32 = 4;

#[inline(always)]
unsafe fn flash_tma_fwd<
    T,
    const D: usize,
    const COLS: usize,
    const BQ: usize,
    const BK: usize,
    const SN: usize,
    const ON: usize,
    const PRODUCER_REGS: u32,
    const CONSUMER_REGS: u32,
>(
    map_q: TensorMapRef<BQ, 4>,
    map_k: TensorMapRef<BK, 4>,
    map_v: TensorMapRef<BK, 4>,
    o: SliceMut<T>,
    lse: SliceMut<f32>,
    p: AttentionShape,
    st: AttentionLayout,
) where
    T: Wgmma<[f32; SN]> + Wgmma<[f32; ON]>,
    [f32; SN]: Accumulator,
    [f32; ON]: Accumulator,
{
    // The products cover the first `COLS` columns of the tile's `D` (the head dim's, rounded up to
    // 16; the rest are zeros in Q, K and V): fewer k-steps of `Q K^T`, a narrower `P V`.
    const {
        assert!((BQ == 128 || BQ == 192) && SN == BK / 2 && ON == COLS / 2 && BK <= 128 && D <= 256)
    };
    // Consumer warpgroups, 64 query rows each.
    let consumers = (BQ / 64) as u32;
    // (A packed batch's CTAs past their sequence's last block walk no tile and store nothing.)
    let qb = QueryBlock::of::<BQ, BK>(&p, &st);
    let p0 = p;
    let p = qb.seq.shape(p);
    let sk = p.seq_k;
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
    // Tiles from the first the block sees (a window's left edge): tile `first_tile + t` at step t.
    let steps = n_tiles - first_tile;
    // The maps' (row, batch) coordinates: rows of a packed sequence start at its offset.
    let (bi, q_row0, k_row0) = (seq.bi as i32, (seq.q0 + m0) as i32, seq.k0 as i32);

    // Q, the K ring, the V ring (each whole 1024-byte atoms), then Q's barrier.
    let base = dynamic_base();
    let q_tile = SwizzledTile::<BQ, D>::at(base);
    let ring_bytes = Pipeline::<SwizzledTile<BK, D>, STAGES>::BYTES.next_multiple_of(1024) as u32;
    let k_ring =
        Pipeline::<SwizzledTile<BK, D>, STAGES>::at(base + SwizzledTile::<BQ, D>::BYTES as u32);
    let v_ring = Pipeline::<SwizzledTile<BK, D>, STAGES>::at(
        base + SwizzledTile::<BQ, D>::BYTES as u32 + ring_bytes,
    );
    let q_bar = MBarrier::at(base + SwizzledTile::<BQ, D>::BYTES as u32 + 2 * ring_bytes);
    let tid = thread_idx_x();
    if tid == 0 {
        // SAFETY: one thread, before the barrier below and every other use.
        unsafe {
            k_ring.init(consumers);
            v_ring.init(consumers);
            q_bar.init(1);
        }
        fence_init();
        map_q.prefetch();
        map_k.prefetch();
        map_v.prefetch();
    }
    sync_threads();

    if tid < 128 {
        set_max_registers_dec::<PRODUCER_REGS>();
        if tid == 0 {
            // SAFETY: the one producer thread; each load fills exactly the tile whose bytes its
            // barrier announced (Q's below, the rings' in `producer_acquire`).
            unsafe {
                q_bar.arrive_expect_tx(SwizzledTile::<BQ, D>::BYTES as u32);
                map_q.load(q_tile, (0, q_row0), (h as i32, bi), q_bar);
                let (mut ks, mut vs) = (PipeState::START, PipeState::START);
                for j in first_tile..n_tiles {
                    let row = k_row0 + (j * BK as u32) as i32;
                    let (kt, kb) = k_ring.producer_acquire(ks);
                    map_k.load(kt, (0, row), (hkv as i32, bi), kb);
                    ks = ks.next();
                    let (vt, vb) = v_ring.producer_acquire(vs);
                    map_v.load(vt, (0, row), (hkv as i32, bi), vb);
                    vs = vs.next();
                }
            }
        }
        return;
    }
    set_max_registers_inc::<CONSUMER_REGS>();
    let ctid = tid - 128;
    let wg = ctid / 128;
    let elected = ctid % 128 == 0;
    let wg_row = wg * 64; // this warpgroup's first row in the block
    let warp_row = wg_row + ((ctid / 32) % 4) * 16; // this warp's first row in the block
    let first_row = m0 + warp_row + lane_id() / 4; // this thread's rows: first_row and first_row + 8
    let key_limit = key_limits(first_row, sk, diag, band);
    // The tiles this warpgroup's own rows see: the block's but for those past its last row's last
    // key (under the causal mask a lower warpgroup's rows end a tile or more before the block's
    // last row) or, where its rows all lie past S_q (the sequence's last block), none. Over those
    // steps it only passes its turn and hands back the stages (the drain after the loop): up to a
    // sixth less tensor work for a causal 192-row block at S 2048, a 33rd for a full one.
    let own_steps = {
        let row0 = m0 + wg_row;
        let last = (row0 + 63).min(p.seq_q.max(1) - 1);
        let end = last_key_end(band, last, diag, sk);
        let own = end
            .div_ceil(BK as u32)
            .saturating_sub(first_tile)
            .min(steps);
        // (Derived from the thread index, which ptxas cannot see is uniform over the warp: a loop
        // bound it thinks divergent makes it serialise the wgmma.)
        warp_uniform_u32(if row0 < p.seq_q { own } else { 0 })
    };

    q_bar.wait(0);
    if p.scale < 0.0 {
        // s * scale == (-s) * |scale|: negate this warpgroup's Q rows (sign bits), once.
        negate_rows::<BQ, D>(q_tile, wg_row, ctid % 128);
        fence_proxy_async();
        // SAFETY: this warpgroup's 128 threads, barrier 1 + wg theirs alone.
        unsafe { named_barrier(1 + wg, 128) };
    }

    // Clamped away from 0 so that masked scores stay -inf (not NaN) under scale = 0.
    let mut softmax = OnlineSoftmax::new(max(p.scale.abs() * LOG2_E, 1e-30));
    let mut acc = [0.0f32; ON];
    let mut s = [0.0f32; SN];
    let mut pf = [[0u32; 4]; 16];
    let (mut ks, mut vs) = (PipeState::<STAGES>::START, PipeState::<STAGES>::START);
    // Ping-pong: the consumer warpgroups issue their tile's wgmma in turns, round the ring
    // (barrier `TURN + w` is warpgroup w's turn; warpgroup w - 1 arrives on it after issuing), so
    // one's softmax runs while another's GEMMs occupy the tensor cores. Warpgroup 0 goes first (no
    // wait at j = 0) and waits once more after the loop, for the last warpgroup's last arrival, so
    // each barrier sees as many waits as arrivals (steps). The waits and
    // the arrivals sit where this warpgroup has no wgmma in flight or only unconditional code
    // follows (ptxas serialises wgmma around branches while accumulators are in flight).
    for t in 0..own_steps {
        let n0 = (first_tile + t) * BK as u32;
        let kt = k_ring.consumer_wait(ks);
        take_turn(wg, t);
        fence();
        // SAFETY: the whole warpgroup; Q and K(j) have landed (their barriers) and stay until this
        // warpgroup releases K(j) after the wait below.
        unsafe { issue_s::<T, BQ, BK, D, COLS, SN>(&mut s, q_tile, wg_row, kt) };
        if t > 0 {
            let vt = v_ring.consumer_wait(vs);
            // SAFETY: the whole warpgroup; V(j-1) has landed; P(j-1) and the rescaled O were
            // written before the `fence` above.
            unsafe { issue_pv::<T, BK, D, ON>(&mut acc, &pf, vt) };
            pass_turn(wg, consumers);
            // S(j) retired (groups retire in order); P V(j-1) may still run.
            s.wait::<1>();
        } else {
            pass_turn(wg, consumers);
            s.wait::<0>();
        }
        if elected {
            // SAFETY: one thread a consumer; the wait above retired this warpgroup's S(j).
            unsafe { k_ring.consumer_release(ks) };
        }
        ks = ks.next();
        // (Read from the parameters each tile: no register held through the loop.)
        if p.softcap_k > 0.0 {
            softcap(&mut s, p.softcap_k);
        }
        let slope = alibi_slope(&st, &p, block_idx_z(), h);
        if slope != 0.0 {
            let pos = first_row as i32 + diag;
            alibi(&mut s, n0, [pos, pos + 8], slope);
        }
        if KeyLimits::tile_needs_mask::<BK>(n0, sk, (m0 + wg_row, diag, band)) {
            mask(&mut s, n0, key_limit);
        }
        let alpha = softmax.update::<SN, true>(&mut s);
        acc.wait::<0>(); // P V(j-1) retired: O and P(j-1) are free
        if t > 0 {
            if elected {
                // SAFETY: as above; P V(j-1) retired.
                unsafe { v_ring.consumer_release(vs) };
            }
            vs = vs.next();
        }
        // (Most tiles of a long row leave the base, and O, as they are: see `RESCALE_LOG2`.)
        if alpha != [1.0; 2] {
            rescale(&mut acc, alpha);
        }
        pf = pack_p::<T, SN>(&s);
    }
    if own_steps > 0 {
        let vt = v_ring.consumer_wait(vs);
        fence();
        // SAFETY: as in the loop.
        unsafe { issue_pv::<T, BK, D, ON>(&mut acc, &pf, vt) };
    }
    acc.wait::<0>();
    if own_steps > 0 {
        if elected {
            // SAFETY: as above; the last P V retired.
            unsafe { v_ring.consumer_release(vs) };
        }
        vs = vs.next();
    }
    // The warp's own Q rows are free: its warpgroup's last S wgmma retired.
    store_output::<T, BQ, D, ON>(&acc, &softmax, q_tile, warp_row, (&p0, &st), (o, lse));
    // The drain: the block's tiles past this warpgroup's rows. It takes and passes its turn as in
    // the loop (each turn barrier keeps as many waits as arrivals) and hands each stage back once
    // it has landed (an arrival before then could count towards the stage's previous phase).
    for t in own_steps..steps {
        k_ring.consumer_wait(ks);
        take_turn(wg, t);
        pass_turn(wg, consumers);
        if elected {
            // SAFETY: one thread a consumer; this warpgroup reads neither stage.
            unsafe { k_ring.consumer_release(ks) };
        }
        ks = ks.next();
        v_ring.consumer_wait(vs);
        if elected {
            // SAFETY: as above.
            unsafe { v_ring.consumer_release(vs) };
        }
        vs = vs.next();
    }
    if wg == 0 && steps > 0 {
        // The last warpgroup's last arrival.
        take_turn(0, 1);
    }
}

/// Waits for consumer warpgroup `wg`'s turn at step `t` of the ping-pong (barrier `TURN + wg`),
/// which warpgroup `wg - 1` (round the ring) passes; warpgroup 0's first turn needs no wait. The
/// whole warpgroup calls it, where it has no wgmma in flight.
#[inline(always)]
fn take_turn(wg: u32, t: u32) {
    if wg != 0 || t > 0 {
        // SAFETY: 256 threads use barrier TURN + w: its 128 wait, warpgroup w - 1's 128 arrive.
        unsafe { named_barrier(TURN + wg, 256) };
    }
}

/// Passes the turn from consumer warpgroup `wg` to the next of `consumers`, round the ring. The
/// whole warpgroup calls it, after issuing its step's wgmma.
#[inline(always)]
fn pass_turn(wg: u32, consumers: u32) {
    // SAFETY: as in `take_turn`: warpgroup w - 1's 128 threads arrive on barrier TURN + w.
    unsafe { named_barrier_arrive(TURN + (wg + 1) % consumers, 256) };
}

/// Flips the sign bit of every element of rows `row0..row0 + 64` of `tile`, by the 128 threads of
/// one warpgroup (`t` = the thread's index in it).
#[inline(always)]
fn negate_rows<const ROWS: usize, const D: usize>(tile: SwizzledTile<ROWS, D>, row0: u32, t: u32) {
    let chunks_per_row = (D / 8) as u32;
    unroll_lt!(i < 64 * D / 8 / 128, {
        let c = t + (i * 128) as u32;
        let addr = tile.chunk_addr(row0 + c / chunks_per_row, c % chunks_per_row);
        check_index((row0 + c / chunks_per_row) as usize, ROWS);
        // SAFETY: an aligned chunk of this warpgroup's rows; each chunk has one thread; the
        // warpgroup barrier after this orders the writes before its wgmma reads.
        unsafe {
            let w = ld_shared_v4(addr);
            st_shared_v4(addr, w.map(|x| x ^ 0x8000_8000));
        }
    });
}

macro_rules! flash_tma_entry_points {
    ($($name:ident: $t:ty, $cfg:path, $cols:literal;)*) => {$(
        // One CTA per SM with a register cap at entry, which `setmaxnreg` needs.
        crate::launch_bounds!($name, $cfg.tma_threads(), 1);
        crate::tensor_map_params!($name, 0, 1, 2);
        /// Warp-specialised FlashAttention forward (sm_90a): rank-4 tensor maps (`[batch][heads][seq]
        /// [D]`, any strides) of Q, K and V (`host::ops::attention`), O written with `strides.o`, grid (query blocks, heads, batch), `tma_threads()` of its config, `flash_tma_smem_bytes` of
        /// dynamic shared memory.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(
            _q_map: TensorMapParam, _k_map: TensorMapParam, _v_map: TensorMapParam,
            o: SliceMut<$t>, lse: SliceMut<f32>, shape: AttentionShape, strides: AttentionLayout,
        ) {
            const C: crate::params::attention::FlashWgmmaConfig = $cfg;
            const _: () = assert!(flash_tma_smem_bytes(C) > 0);
            let map_q = crate::tensor_map_param!($name, 0, C.block_q, 4);
            let map_k = crate::tensor_map_param!($name, 1, C.block_k, 4);
            let map_v = crate::tensor_map_param!($name, 2, C.block_k, 4);
            unsafe {
                flash_tma_fwd::<$t, { C.head_dim }, $cols, { C.block_q }, { C.block_k }, { C.block_k / 2 }, { $cols / 2 }, { C.tma_registers().0 }, { C.tma_registers().1 }>(
                    map_q, map_k, map_v, o, lse, shape, strides,
                )
            }
        }
    )*};
}

// Name, element, tile config, the columns the products cover. Head dims 32, 96 and 192 (and the
// narrower ones each serves) run on the tile above them with products over their own columns only:
// half, three quarters and three quarters of the tile's `Q K^T` and `P V`.
flash_tma_entry_points! {
    flash_tma_fwd_d32_f16: F16, FLASH_TMA_D64, 32;
    flash_tma_fwd_d32_bf16: BF16, FLASH_TMA_D64, 32;
    flash_tma_fwd_d64_f16: F16, FLASH_TMA_D64, 64;
    flash_tma_fwd_d64_bf16: BF16, FLASH_TMA_D64, 64;
    flash_tma_fwd_d96_f16: F16, FLASH_TMA_D128, 96;
    flash_tma_fwd_d96_bf16: BF16, FLASH_TMA_D128, 96;
    flash_tma_fwd_d128_f16: F16, FLASH_TMA_D128, 128;
    flash_tma_fwd_d128_bf16: BF16, FLASH_TMA_D128, 128;
    flash_tma_fwd_d192_f16: F16, FLASH_TMA_D256, 192;
    flash_tma_fwd_d192_bf16: BF16, FLASH_TMA_D256, 192;
    flash_tma_fwd_d256_f16: F16, FLASH_TMA_D256, 256;
    flash_tma_fwd_d256_bf16: BF16, FLASH_TMA_D256, 256;
}
