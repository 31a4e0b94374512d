//! FlashAttention-2 backward on tensor cores (`mma.sync.m16n8k16`, f16/bf16 in, f32 accumulation),
//! deterministic. Three kernels, launched in this order on one stream:
//!
//! 1. [`pre`] (`flash_bwd_pre_*`), one block per (64 query rows, head, batch): `D_i = rowsum(dO_i O_i)`
//!    in f32 and the LSE in log2 units, per row into a statistics array padded to whole blocks
//!    (padding rows and rows that see no key get LSE = +inf, so their probabilities come out exactly
//!    0 with no mask); it also zeroes the f32 dQ accumulator and the turn counters.
//! 2. [`flash_bwd`] (`flash_bwd_d*`), one CTA per (block of `BK` keys, head, batch). K_j and V_j stay
//!    in shared memory; each warp owns 16 keys and keeps their dK_j, dV_j rows in registers. The CTA
//!    walks the query blocks i that see its keys, **last block first**; per block, with Q_i and dO_i
//!    double-buffered by `cp.async`:
//!    - `S^T = K_j Q_i^T`, `dP^T = V_j dO_i^T` (16 keys x `BQ` queries a warp, A from K/V rows, B
//!      from the Q/dO tiles, no transposes);
//!    - `P^T = exp2(S^T c - LSE2)` with `c = scale log2(e)` (masked entries set to 0),
//!      `dS^T = P^T (dP^T - D)`;
//!    - `dV_j += P^T dO_i`, `dK_j += dS^T Q_i`: P^T and dS^T are rounded to the input type in
//!      registers and are directly the A operands (the accumulator layout of two 8-column tiles is the
//!      A layout of one 16-column block), dO_i and Q_i the B operands through `ldmatrix.trans`;
//!    - dS^T goes through shared memory (16-bit, swizzled) so that `dQ_i += dS K_j` can be split by
//!      query rows over the warps (A through `ldmatrix.trans` of dS^T, B = K_j through `.trans`);
//!    - the partial dQ block is added into the f32 accumulator `[B, H, S_q, D]` in a fixed order.
//!    Epilogue: dK_j (times `scale`) and dV_j rounded to the input type, staged through the CTA's
//!    own K/V tiles for 16-byte stores.
//! 3. [`convert_dq`] (`flash_bwd_dq_*`): dQ = `scale` x accumulator, rounded to the input type.
//!
//! # Determinism: the dQ accumulation order
//! Every query block i has a turn counter (zeroed by the pre-pass; there is one per 8 rows, and
//! this kernel uses the first of its block's; the wgmma kernel gives each of its 8 warps one). The K blocks that meet query block
//! i are exactly `0..=j_max(i)`: without a mask all of them; under the (bottom-right) causal mask, if
//! some query of block i sees a key of block j it sees every smaller key too. So K block j is the
//! `j`-th to reach block i, and its CTA waits until the counter equals `j` (`ld.acquire.gpu`), adds
//! its partial block (`red.global.add.f32`, each element by one thread), and after a block barrier
//! (the next step's first, or the one after the loop) one thread adds 1 with `red.release.gpu`. Each accumulator element therefore receives its
//! contributions in ascending `j`, the same sequence of f32 roundings on every run: the same bits.
//!
//! Why this cannot deadlock: CTAs are numbered with the K block fastest (grid `(K blocks, heads,
//! batch)`), and the hardware starts CTAs in increasing linear order. A CTA waits only for the CTA
//! one below it in the same head. The lowest-numbered unfinished CTA waits for nothing unfinished, and
//! it is running or is the next to start (every CTA below it is done, and every CTA above it that runs
//! started after it), so it finishes; by induction all do. Walking the query blocks last-first makes
//! every CTA of a head reach block i at the same step of its own loop (they all start at the last
//! block), so the waits are one partial-block addition long, not a whole CTA's work: under the causal
//! mask a first-to-last walk would make the CTA of K block j (which starts further down) wait for
//! block j-1 to walk the blocks above, holding its SM idle.
//!
//! The wgmma kernel (`flash_wg_bwd.rs`) also has a **rotated order** (`DQ_ROTATED`), which
//! takes the start-up waits away. In the ascending order a head's CTAs start together at the last
//! block and CTA j waits for j additions (each a release, an acquire and a round trip to L2 long)
//! before its first; measured, that cost the deterministic mode 1.2x-1.45x of the nondeterministic
//! one (docs/PERF_NOTES.md). Rotated, CTA j starts at query block `j n_q / n_k` and walks upward
//! (wrapping), under the causal mask from its first visible block, and each block takes the CTAs'
//! additions in the order of the steps at which they reach it (`KeyBlockWalk::turn_at`): the CTA
//! a CTA waits for reached the block `n_q / n_k` steps earlier (at least one), so CTAs that run in
//! step never wait. The order is still a function of (i, j) alone: the same bits every run. The
//! price is the deadlock argument: a CTA now waits for the CTA of the next key block (cyclically),
//! which may have started after it. The CTAs of heads started earlier wait only within their
//! heads and finish, so a head's CTAs all run at once as long as the GPU holds `n_k` CTAs at once;
//! the host takes the rotated order only where `n_k` is at most half the SM count (one CTA an
//! SM), else the ascending one, and the bounded wait turns a broken assumption into a launch
//! error rather than a hang.
//!
//! Under the causal mask the rotated waits are not cyclic: CTA j waits only for CTA j + 1 (the
//! blocks meeting block i are `0..=J`, met highest first). Launched with the grid reversed
//! (`DQ_REVERSED_GRID`: CTA x takes key block `n_k - 1 - x`), every CTA waits only for CTAs
//! started before it, the ascending order's argument holds, and causal calls take the rotated
//! order at any length.
//!
//! Rotation alone did not remove the cost (docs/PERF_NOTES.md): the release (`red.release.gpu`)
//! waits for the warp's reductions to reach L2, about a microsecond a step, in every warp. Where
//! the waiting CTA reaches the block at a later step than the releasing one
//! (`dq_late_release_fits`), the rotated order releases a block's turn one step late
//! (`DQ_LATE_RELEASE`): just before the warp's next turn (D = 128) or at the top of the next
//! step (D = 64, whose additions run early in a step), when the reductions have landed. A
//! release still precedes the warp's next wait, so every wait depends only on additions made
//! at an earlier step of the waited-for CTA's walk, and the walks cannot deadlock among
//! themselves.
//!
//! Extra memory is O((S_q + S_k) D): the f32 dQ accumulator, two f32 per query row and one counter per
//! 8 query rows.
use crate::dev::atomic::{add_release_u32, load_relaxed_f32, red_add_f32, wait_for_turn};
use crate::dev::copy::{cp_async_commit, cp_async_wait};
use crate::dev::elem::{BF16, F16};
use crate::dev::math::{LOG2_E, exp2, fma};
use crate::dev::mem::{Chunk16, Slice, SliceMut, load_chunk_ro, store_chunk};
use crate::dev::mma::{FragA, FragC, MmaElem};
use crate::dev::opaque_dep_u32;
use crate::dev::shared::check_index;
use crate::dev::sync::{sync_threads, sync_warp};
use crate::dev::thread::{
    block_idx_x, block_idx_y, block_idx_z, global_index_x, grid_threads_x, lane_id, thread_idx_x,
    warp_id,
};
use crate::dev::tile::{SharedCarve, SharedTile};
use crate::dev::warp::{FULL_MASK, shfl_xor_f32};
use crate::layout::{Linear, Xor8};
use crate::params::attention::{
    AttentionLayout, AttentionShape, Band, DQ_REVERSED_GRID, DqWalk, FLASH_BWD_D64, FLASH_BWD_D128,
    FLASH_BWD_PRE_ROWS, FLASH_BWD_TURN_ROWS, FlashBwdConfig, HeadStrides, MaskKind, dq_block_at,
    dq_turn_at, flash_bwd, flash_bwd_config, flash_tile_dim,
};
use crate::{unroll, unroll_lt};

use super::{HeadRows, HeadRowsMut, Sequence};

/// A `ROWS x COLS` tile of 16-bit elements with swizzled rows: K, V, Q, dO and dS^T tiles alike.
type Tile<T, const ROWS: usize, const COLS: usize> = SharedTile<T, ROWS, COLS, Xor8>;
/// One query block's statistics: row 0 the LSE in log2 units, row 1 D (f32).
type Stats<const BQ: usize> = SharedTile<f32, 2, BQ, Linear>;

/// The main backward kernel. `KD = D / 16` (k-steps of `S = Q K^T`), `NS = BQ / 8` (8-query tiles of
/// S^T), `KQ = BQ / 16` (k-steps of `P^T dO`), `NO = D / 8` (8-column tiles of dK, dV),
/// `NQ` (8-column tiles of a warp's dQ share); all are checked against the config.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn flash_bwd<
    T: MmaElem,
    const D: usize,
    const BK: usize,
    const BQ: usize,
    const KD: usize,
    const NS: usize,
    const KQ: usize,
    const NO: usize,
    const NQ: usize,
    const THREADS: usize,
    const DSC: usize,
>(
    q: Slice<T>,
    k: Slice<T>,
    v: Slice<T>,
    d_o: Slice<T>,
    stats: Slice<f32>,
    dq_acc: SliceMut<f32>,
    turns: SliceMut<u32>,
    dk: impl KvOut<T>,
    dv: impl KvOut<T>,
    p: AttentionShape,
    st: AttentionLayout,
) {
    let cfg: FlashBwdConfig = const { checked_config::<T, D, BK, BQ, KD, NS, KQ, NO, NQ, DSC>() };
    const { assert!(THREADS == BK / 16 * 32) };

    // The mma.sync kernel serves dense batches only (the host refuses packed ones in its build).
    let walk =
        KeyBlockWalk::of::<D, BK, BQ, false, false>(p, &st, (stats.len, turns.len), 0, (0, false));
    let KeyBlockWalk {
        sq,
        sk,
        j,
        n0,
        seq,
        hkv,
        bh,
        bkv,
        sq_pad,
        n_turns,
        turn_step,
        heads_total,
        first_qblock,
        ..
    } = walk;
    let n_qblocks = walk.dq.n_qblocks;
    // The key/value head's rows (launcher-validated strides; checked builds re-check).
    let k_src = HeadRows::of(k, st.k, (seq.bi, hkv), (seq.k0, sk), p.head_dim);
    let v_src = HeadRows::of(v, st.v, (seq.bi, hkv), (seq.k0, sk), p.head_dim);
    // The loop's per-head addresses are recomputed each step from this (`opaque_dep_u32`): kept
    // from before the loop they would hold registers through it. batch * heads < 2^32 (each <= 65535).
    let bh32 = bh as u32;

    let mut smem = SharedCarve::dynamic();
    let k_tile: Tile<T, BK, D> = smem.take(1);
    let v_tile: Tile<T, BK, D> = smem.take(1);
    let q_tiles: Tile<T, BQ, D> = smem.take(2);
    let do_tiles: Tile<T, BQ, D> = smem.take(2);
    let ds_tile: Tile<T, BK, DSC> = smem.take(1);
    let stat_tiles: Stats<BQ> = smem.take(2);
    check_index(smem.used(), cfg.smem_bytes() + 1);

    // Loads Q, dO and the statistics of query block `i` into stage `s`. The thread index goes
    // through `opaque_dep_u32` so the copies' per-thread offsets are computed here, not kept in
    // registers through the loop.
    // SAFETY (all calls): rows past seq_q are zero-filled without reading, the statistics rows
    // are padded to whole pre-pass blocks (which whole query blocks divide); the stage is idle (the
    // barrier before the call ends every read of it).
    // SAFETY (pointers): q/dO hold this head's seq_q rows (launcher-validated strides) and the
    // statistics 2*batch*heads*sq_pad values (launcher-validated, checked builds re-check above),
    // so these are the starts of this head's rows.
    let load_qblock = |i: u32, s: u32| unsafe {
        let m0 = i * BQ as u32;
        let t = opaque_dep_u32(thread_idx_x(), i);
        let hb = opaque_dep_u32(bh32, i) as u64;
        // The batch entry and head from `hb` (a division a step keeps two registers free).
        let (b_, h_) = (hb as u32 / p.heads, hb as u32 % p.heads);
        let sq_ = Sequence::of_kind::<false>(&st, &p, b_);
        let q_src = HeadRows::of(q, st.q, (sq_.bi, h_), (sq_.q0, sq), p.head_dim);
        let do_src = HeadRows::of(d_o, st.d_o, (sq_.bi, h_), (sq_.q0, sq), p.head_dim);
        let lse_src = stats.ptr.add((hb * sq_pad as u64) as usize);
        load_rows::<T, BQ, D, THREADS>(q_tiles.stage(s), q_src, m0, sq, t);
        load_rows::<T, BQ, D, THREADS>(do_tiles.stage(s), do_src, m0, sq, t);
        // Row 0 of the stage: the LSE; row 1: D, `heads_total * sq_pad` values further on.
        let chunks = (2 * BQ / 4) as u32;
        if t < chunks {
            let (row, chunk) = (t / (BQ as u32 / 4), t % (BQ as u32 / 4));
            let at = row as usize * (heads_total * sq_pad as u64) as usize
                + m0 as usize
                + 4 * chunk as usize;
            stat_tiles
                .stage(s)
                .copy_chunk_async(row, chunk, lse_src.add(at) as *const u8, true);
        }
    };

    // With no query block to walk (seq_q = 0) nothing is loaded: dK = dV = 0.
    if n_qblocks > first_qblock {
        // SAFETY: rows past seq_k are zero-filled without reading; nothing has touched the tiles.
        unsafe {
            load_rows::<T, BK, D, THREADS>(k_tile, k_src, n0, sk, thread_idx_x());
            load_rows::<T, BK, D, THREADS>(v_tile, v_src, n0, sk, thread_idx_x());
        }
        load_qblock(n_qblocks - 1, 0);
    }
    cp_async_commit();

    let key_row = 16 * warp_id(); // this warp's keys in the block; this thread's: key_row + g, + 8
    let c = p.scale * LOG2_E;
    let mut dk_acc = [[0.0f32; 4]; NO];
    let mut dv_acc = [[0.0f32; 4]; NO];

    let mut i = n_qblocks;
    let mut stage = 0u32;
    while i > first_qblock {
        i -= 1;
        let m0 = i * BQ as u32;
        // Q_i, dO_i and the statistics have landed; every warp is done with block i+1 (its stage,
        // the dS tile, and the turn-counter additions of its dQ block).
        cp_async_wait::<0>();
        sync_threads();
        let hb = opaque_dep_u32(bh32, i) as u64;
        if i + 1 < n_qblocks && thread_idx_x() == 0 {
            // SAFETY: the counter of this head's block i+1 (the launcher sized `turns` for every
            // block of every head); the barrier above ordered every thread's dQ additions first.
            unsafe {
                add_release_u32(
                    turns
                        .ptr
                        .add((hb * n_turns as u64) as usize + ((i + 1) * turn_step) as usize),
                    1,
                )
            };
        }
        if i > first_qblock {
            load_qblock(i - 1, stage ^ 1);
        }
        cp_async_commit();
        let (qt, dot, st) = (
            q_tiles.stage(stage),
            do_tiles.stage(stage),
            stat_tiles.stage(stage),
        );
        // Addresses into the fixed tiles and per-lane offsets are recomputed each step, not kept in
        // registers through the loop (the accumulators need them).
        let (kt, vt, dst) = (k_tile.in_step(i), v_tile.in_step(i), ds_tile.in_step(i));
        let lane = opaque_dep_u32(lane_id(), i);
        let (g, t) = (lane / 4, lane % 4);
        let w = opaque_dep_u32(warp_id(), i);
        let key_row = 16 * w;
        // dQ split: row group (16 query rows) and 8-column tiles of this warp.
        let row_groups = (BQ / 16) as u32;
        let (dq_rows, dq_tile0) = (16 * (w % row_groups), (w / row_groups) * NQ as u32);

        // S^T, P^T, dS^T and the dV/dK updates.
        let mask = Mask {
            first_query: walk
                .first_queries::<BK, BQ, false>(m0, n0 + key_row + g)
                .first,
        };
        query_block::<T, D, BK, BQ, DSC, KD, NS, KQ, NO>(
            Tiles {
                k: kt,
                v: vt,
                q: qt,
                d_o: dot,
                stats: st,
                ds: dst,
            },
            key_row,
            (g, t),
            &mask,
            c,
            &mut dk_acc,
            &mut dv_acc,
        );
        sync_threads();

        // This warp's share of dQ_i += dS K_j (unscaled): 16 query rows x NQ 8-column tiles.
        // A rolled loop: unrolled, ptxas issues every step's loads up front, more registers than
        // the dK/dV accumulators leave.
        let mut acc = [[0.0f32; 4]; NQ];
        let mut ks = 0u32;
        while ks < opaque_dep_u32((BK / 16) as u32, i) {
            let a = dst.load_a_km(16 * ks, dq_rows / 8);
            unroll_lt!(np < NQ / 2, {
                let [b0, b1] = kt.load_b_pair_kn(16 * ks, dq_tile0 + 2 * np as u32);
                T::mma(&mut acc[2 * np], &a, b0);
                T::mma(&mut acc[2 * np + 1], &a, b1);
            });
            ks += 1;
        }

        // Our turn on block i: K blocks 0..j have added theirs (see the module doc).
        // SAFETY: the counter of this head's block i, in `turns` (launcher-sized).
        let turn = unsafe {
            turns
                .ptr
                .add((hb * n_turns as u64) as usize + (i * turn_step) as usize)
        };
        // SAFETY: as above. Every lane polls the same word, so the warp leaves the wait together
        // (the warp barrier after it makes that explicit for the `mma` of the next step).
        unsafe { wait_for_turn(turn, j) };
        sync_warp(FULL_MASK);
        unroll!(r in [0, 1] {
            let row = m0 + dq_rows + g + 8 * r as u32;
            if row < sq {
                // The accumulator's rows per head: the shape's (a packed batch's longest).
                let base = (hb * p.seq_q as u64 + row as u64) * D as u64;
                unroll_lt!(n < NQ, {
                    let col = 8 * (dq_tile0 + n as u32) + 2 * t;
                    let at = base + col as u64;
                    check_index(at as usize + 1, dq_acc.len as usize);
                    // SAFETY: row < seq_q of this head and col + 1 < D: inside the accumulator
                    // (launcher-sized, checked builds re-check); one thread adds each element, and
                    // the turn counter orders the blocks that add to it.
                    unsafe {
                        red_add_f32(dq_acc.ptr.add(at as usize), acc[n][2 * r]);
                        red_add_f32(dq_acc.ptr.add(at as usize + 1), acc[n][2 * r + 1]);
                    }
                });
            }
        });
        stage ^= 1;
    }
    // Every warp is done with the last block: release its counter, and the K/V tiles are free
    // (no copy into them is in flight: the loop waited for every group it committed, and without a
    // loop nothing was copied; the wait makes that hold whatever the loop did).
    cp_async_wait::<0>();
    sync_threads();
    // Recomputed here (not kept in a register through the loop).
    let hb = opaque_dep_u32(bh32, i) as u64;
    if n_qblocks > first_qblock && thread_idx_x() == 0 {
        // SAFETY: as for the release in the loop (block `first_qblock`, the last one walked).
        unsafe {
            add_release_u32(
                turns
                    .ptr
                    .add((hb * n_turns as u64) as usize + (first_qblock * turn_step) as usize),
                1,
            )
        };
    }

    unroll_lt!(n < NO, {
        dk_acc[n] = dk_acc[n].map(|x| x * p.scale);
    });
    // dK and dV rows are the key/value head's (kept from before the loop: one register).
    let out_row0 = bkv * sk as u64 + n0 as u64 + key_row as u64;
    let rows_left = sk - n0;
    if let Some(out) = dv.rounded() {
        let out = HeadRowsMut::of(out, st.dv, (seq.bi, hkv), (seq.k0, sk), p.head_dim);
        store_rows::<T, BK, D, NO>(&dv_acc, v_tile, key_row, rows_left, out, n0 + key_row);
    }
    if let Some(out) = dk.rounded() {
        let out = HeadRowsMut::of(out, st.dk, (seq.bi, hkv), (seq.k0, sk), p.head_dim);
        store_rows::<T, BK, D, NO>(&dk_acc, k_tile, key_row, rows_left, out, n0 + key_row);
    }
    if let Some(out) = dv.added() {
        add_rows_f32::<NO, 1>(
            |n| dv_acc[n],
            key_row,
            rows_left,
            (out, p.head_dim, 0),
            (out_row0, AddMode::LoadAddStore),
        );
    }
    if let Some(out) = dk.added() {
        add_rows_f32::<NO, 1>(
            |n| dk_acc[n],
            key_row,
            rows_left,
            (out, p.head_dim, 0),
            (out_row0, AddMode::LoadAddStore),
        );
    }
}

/// Where a backward kernel puts dK and dV: rounded to the input type (a `SliceMut<T>`, what
/// `flash_backward` returns) or added into f32 accumulators ([`AddF32`]: ring attention sums the
/// key blocks' gradients over ring steps, rounding once at the end). Known at compile time: each
/// entry point takes one.
pub(super) trait KvOut<T>: Copy {
    /// The wgmma kernel's member grid: a CTA a query head, dK and dV added in member order
    /// ([`MemberSumF32`]).
    const MEMBER_GRID: bool = false;
    fn rounded(self) -> Option<SliceMut<T>>;
    fn added(self) -> Option<SliceMut<f32>>;
}

impl<T: Copy> KvOut<T> for SliceMut<T> {
    #[inline(always)]
    fn rounded(self) -> Option<SliceMut<T>> {
        Some(self)
    }
    #[inline(always)]
    fn added(self) -> Option<SliceMut<f32>> {
        None
    }
}

/// An f32 gradient accumulator the kernel adds its block's rows into (`out += grad`; each row has
/// one writer per launch). Passed as the `SliceMut<f32>` it wraps.
#[repr(transparent)]
#[derive(Clone, Copy)]
pub struct AddF32(pub SliceMut<f32>);

impl<T> KvOut<T> for AddF32 {
    #[inline(always)]
    fn rounded(self) -> Option<SliceMut<T>> {
        None
    }
    #[inline(always)]
    fn added(self) -> Option<SliceMut<f32>> {
        Some(self.0)
    }
}

/// dK or dV of the wgmma kernel's *member grid* (`flash_wg_bwd_members_*`, dense batches): the
/// f32 sums of a key/value head's rows over its group's query heads, and the rounded output. One
/// CTA a query head (grid y = `heads`; the key/value head `y / group`, the member `y % group`), as
/// a multi-head call's, instead of one a key/value head walking its whole group: under the causal
/// mask whole-group walks are `group` times longer and the longest finish last. The members meet
/// in member order: member m waits until its key block's counter (after the dQ turn counters in
/// `turns`, one a key/value head's key block, zeroed by the host) reads m; member 0 stores its
/// rows to the sums, the next ones add theirs (`red.global.add`), each releasing m + 1; the last
/// takes the sums into its registers and stores the rounded rows. So the sums take the same
/// order, and bits, every run. A wait points to the CTA of the same key block and the member
/// before, `n_kblocks` CTAs earlier in the launch: started before it. Laid out as
/// `params::attention::MemberSumParam`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemberSum<T> {
    pub sums: SliceMut<f32>,
    pub out: SliceMut<T>,
}

impl<T: Copy> KvOut<T> for MemberSum<T> {
    const MEMBER_GRID: bool = true;
    #[inline(always)]
    fn rounded(self) -> Option<SliceMut<T>> {
        Some(self.out)
    }
    #[inline(always)]
    fn added(self) -> Option<SliceMut<f32>> {
        Some(self.sums)
    }
}
const _: () = assert!(
    core::mem::size_of::<MemberSum<u16>>()
        == core::mem::size_of::<crate::params::attention::MemberSumParam>()
);

/// How [`add_rows_f32`] writes: load, add and store (rows this launch alone adds to), an L2
/// reduction (`red.global.add`: rows other blocks add to in turn, which a load through L1 could
/// see stale), or a plain store (the first of those turns).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum AddMode {
    LoadAddStore,
    Reduce,
    Store,
}

/// Adds the f32 rows [`add_rows_f32`] would add to into this warp's accumulator (`acc[4 n..]`:
/// rows `g` and `g + 8`, columns `8 n + 2 t` and the next, wgmma layout) instead, with loads
/// coherent at GPU scope (other blocks wrote them; the caller acquired their release and passed a
/// block barrier). Entries of rows past `rows_left` or columns past `cols` are left as they are.
#[inline(always)]
pub(super) fn take_rows_f32<const ON: usize>(
    acc: &mut [f32; ON],
    warp_row: u32,
    rows_left: u32,
    (sums, cols, col0): (SliceMut<f32>, u32, u32),
    out_row0: u64,
) {
    let (g, t) = (lane_id() / 4, lane_id() % 4);
    let load = |at: u64| {
        check_index(at as usize, sums.len as usize);
        // SAFETY: inside `sums` (the callers' row and column tests; checked builds re-check),
        // a 4-byte aligned f32.
        unsafe { load_relaxed_f32(sums.ptr.add(at as usize)) }
    };
    unroll_lt!(n < ON / 4, {
        let col = col0 as u64 + (8 * n) as u64 + 2 * t as u64;
        if warp_row + g < rows_left && col < cols as u64 {
            let at = (out_row0 + g as u64) * cols as u64 + col;
            acc[4 * n] += load(at);
            acc[4 * n + 1] += load(at + 1);
        }
        if warp_row + g + 8 < rows_left && col < cols as u64 {
            let at = (out_row0 + g as u64 + 8) * cols as u64 + col;
            acc[4 * n + 2] += load(at);
            acc[4 * n + 3] += load(at + 1);
        }
    });
}

/// Adds this warp's 16 rows of an accumulator (`quad(n)`, `n < VALUES / PER_QUAD`: rows `g` and
/// `g + 8`, columns `8 n + 2 t` and the next, of lane `4 g + t`: the layout of both the `mma.sync`
/// (`VALUES` fragments of 4, `PER_QUAD` 1) and the wgmma accumulators (`VALUES` f32, 4 a quad)) into
/// rows `out_row0..` of the f32 `out`, whose rows are `cols` (the head dim) wide, from column
/// `col0` (the warp's first): the accumulator's columns past `cols` (a padded tile's) are dropped.
/// `rows_left` = valid rows from the CTA's first row (`warp_row` is the warp's first row in the
/// block), written as `mode` says.
#[inline(always)]
pub(super) fn add_rows_f32<const VALUES: usize, const PER_QUAD: usize>(
    quad: impl Fn(usize) -> [f32; 4],
    warp_row: u32,
    rows_left: u32,
    (out, cols, col0): (SliceMut<f32>, u32, u32),
    (out_row0, mode): (u64, AddMode),
) {
    let (g, t) = (lane_id() / 4, lane_id() % 4);
    let add = |at: u64, v: f32| match mode {
        AddMode::LoadAddStore => out.set(at, out.get(at) + v),
        AddMode::Store => out.set(at, v),
        AddMode::Reduce => {
            check_index(at as usize, out.len as usize);
            // SAFETY: `at` is inside `out` (the callers' row and column tests; checked builds
            // re-check), a 4-byte aligned f32.
            unsafe { red_add_f32(out.ptr.add(at as usize), v) };
        }
    };
    unroll_lt!(n < VALUES / PER_QUAD, {
        let col = col0 as u64 + (8 * n) as u64 + 2 * t as u64;
        let a = quad(n);
        if warp_row + g < rows_left && col < cols as u64 {
            let at = (out_row0 + g as u64) * cols as u64 + col;
            add(at, a[0]);
            add(at + 1, a[1]);
        }
        if warp_row + g + 8 < rows_left && col < cols as u64 {
            let at = (out_row0 + g as u64 + 8) * cols as u64 + col;
            add(at, a[2]);
            add(at + 1, a[3]);
        }
    });
}

/// Where a main backward CTA stands: its block of `BK` keys of one head (grid: key blocks, heads,
/// batch), the query blocks of `BQ` rows it walks, and the sizes of the pre-pass's arrays. Shared by
/// this module's kernel and the wgmma kernel (`flash_wg_bwd.rs`).
#[derive(Clone, Copy)]
pub(super) struct KeyBlockWalk {
    pub sq: u32,
    pub sk: u32,
    /// The head's query and key blocks, mask and causal diagonal (query i sees key j iff
    /// j <= i + diag): what fixes the walks and turns of its CTAs.
    pub dq: DqWalk,
    /// The key block (this CTA) and its first key.
    pub j: u32,
    pub n0: u32,
    /// The batch entry's sequences, the query head and the key/value head whose block this is.
    pub seq: Sequence,
    pub h: u32,
    pub hkv: u32,
    /// The query head (batch * heads + head: its statistics, turns and dQ rows) and the key/value
    /// head (batch * kv_heads + head: its f32 dK/dV rows): [`AttentionShape::bwd_heads`].
    pub bh: u64,
    pub bkv: u64,
    /// The statistics' padded rows per head.
    pub sq_pad: u32,
    /// Turn counters per head (padded like the statistics, so every block's counters are its
    /// head's) and per query block.
    pub n_turns: u32,
    pub turn_step: u32,
    pub heads_total: u64,
    /// The first query block that sees keys of this block ([`DqWalk::first_qblock`]; n0 < sk, so
    /// under the causal mask that block is < n_qblocks).
    pub first_qblock: u32,
}

/// For one key row of a key block, against the query block starting at row `m0`: the query
/// offsets in the block that see it, `first..=last` (i32::MIN / i32::MAX where unbounded).
#[derive(Clone, Copy)]
pub(super) struct QueryBounds {
    pub first: [i32; 2],
    pub last: [i32; 2],
}

impl KeyBlockWalk {
    /// This CTA's walk for shape `p`; checked builds check that the statistics and the turn
    /// counters hold this head's rows (the operands' rows are checked where the kernel takes them,
    /// [`HeadRows::of`]).
    #[inline(always)]
    pub(super) fn of<
        const D: usize,
        const BK: usize,
        const BQ: usize,
        const PACKED: bool,
        const WINDOW: bool,
    >(
        p: AttentionShape,
        l: &AttentionLayout,
        (stats_len, turns_len): (u64, u64),
        order: u32,
        (salt, members): (u32, bool),
    ) -> Self {
        // The statistics, turn counters and dQ accumulator are sized by the shape (a packed batch:
        // its longest sequences); the walk by this batch entry's own lengths.
        // A packed walk is rebuilt each step (`salt` = the step, so the offsets are loaded again
        // rather than kept in registers through the loop).
        let b = if PACKED {
            opaque_dep_u32(block_idx_z(), salt)
        } else {
            block_idx_z()
        };
        let seq = Sequence::of_kind::<PACKED>(l, &p, b);
        let (sq, sk) = (seq.sq, seq.sk);
        let causal = p.mask == MaskKind::Causal;
        // Windows run on the general (packed) kernels that take them only (the launcher's rule,
        // `WINDOW`): the others take a constant band without one (the causal mask is `causal`).
        // Those reload theirs each step, like a packed batch's offsets.
        let band = if WINDOW {
            Band::of(&AttentionShape {
                window_left: opaque_dep_u32(p.window_left, salt),
                window_right: opaque_dep_u32(p.window_right, salt),
                ..p
            })
        } else {
            Band {
                left: i32::MAX,
                right: i32::MAX,
            }
        };
        let diag = sk as i32 - sq as i32;
        let n_kblocks = sk.div_ceil(BK as u32);
        // The grid covers the key blocks (of the longest sequence); reversed, CTA x takes block
        // n_k - 1 - x. A CTA past its sequence's blocks takes block n_k: no key, no step.
        // (A dense grid covers each head's key blocks exactly: no test, no select.)
        let here = !PACKED || block_idx_x() < n_kblocks;
        let j = if !here {
            n_kblocks
        } else if order & DQ_REVERSED_GRID != 0 {
            n_kblocks - 1 - block_idx_x()
        } else {
            block_idx_x()
        };
        let n0 = j * BK as u32;
        // With the member grid ([`MemberSumF32`]) grid y is the query head (the caller passes its
        // member).
        let y = if members {
            block_idx_y() / p.group()
        } else {
            block_idx_y()
        };
        let (bh, bkv) = p.bwd_heads(y, block_idx_z());
        let sq_pad = p.seq_q.div_ceil(FLASH_BWD_PRE_ROWS as u32) * FLASH_BWD_PRE_ROWS as u32;
        let dq = DqWalk {
            n_qblocks: sq.div_ceil(BQ as u32),
            n_kblocks,
            block_q: BQ as u32,
            block_k: BK as u32,
            causal,
            diag,
            band,
        };
        let walk = Self {
            sq,
            sk,
            dq,
            j,
            n0,
            seq,
            h: y * p.group() + p.group_member,
            hkv: y,
            bh,
            bkv,
            sq_pad,
            n_turns: sq_pad / FLASH_BWD_TURN_ROWS as u32,
            turn_step: (BQ / FLASH_BWD_TURN_ROWS) as u32,
            heads_total: (p.batch * p.heads) as u64,
            first_qblock: if here {
                dq.first_qblock(j)
            } else {
                dq.n_qblocks
            },
        };
        check_index(
            (2 * walk.heads_total * sq_pad as u64) as usize,
            stats_len as usize + 1,
        );
        check_index(
            ((bh + 1) * walk.n_turns as u64) as usize,
            turns_len as usize + 1,
        );
        walk
    }

    /// Query blocks this CTA walks: those that see its keys.
    #[inline(always)]
    pub(super) fn steps(&self) -> u32 {
        self.dq.end_qblock(self.j).saturating_sub(self.first_qblock)
    }

    /// The query block of step `step` (< [`Self::steps`]) in dQ order `order` ([`dq_block_at`]).
    #[inline(always)]
    pub(super) fn block_at(&self, step: u32, order: u32) -> u32 {
        dq_block_at(&self.dq, self.j, step, order)
    }

    /// The turn at which this CTA adds its part of query block `i` in dQ order `order`
    /// ([`dq_turn_at`]).
    #[inline(always)]
    pub(super) fn turn_at(&self, i: u32, order: u32) -> u32 {
        dq_turn_at(&self.dq, self.j, i, order)
    }

    /// For keys `key` and `key + 8` of this block, in the query block of `BQ` rows starting at row
    /// `m0`: the query offsets in the block that may see each (the mask keeps entry (key, query
    /// offset qq) iff `first <= qq <= last`); `first` i32::MAX for a key past seq_k, and
    /// (i32::MIN, i32::MAX) where the whole block is visible. Without `WINDOW` (the dense kernels)
    /// only the causal mask bounds them.
    #[inline(always)]
    pub(super) fn first_queries<const BK: usize, const BQ: usize, const WINDOW: bool>(
        &self,
        m0: u32,
        key: u32,
    ) -> QueryBounds {
        if !WINDOW {
            // The causal mask alone.
            let whole = self.n0 + BK as u32 <= self.sk
                && !(self.dq.causal && (self.n0 + BK as u32 - 1) as i32 > m0 as i32 + self.dq.diag);
            let first_query = |kk: i32| {
                if whole {
                    i32::MIN
                } else if kk >= self.sk as i32 {
                    i32::MAX
                } else if self.dq.causal {
                    kk - (m0 as i32 + self.dq.diag)
                } else {
                    i32::MIN
                }
            };
            return QueryBounds {
                first: [first_query(key as i32), first_query(key as i32 + 8)],
                last: [i32::MAX; 2],
            };
        }
        let band = self.dq.band;
        let (n0, diag) = (self.n0 as i32, self.dq.diag);
        // Whole: every key is below seq_k, the first query sees the last key (right side) and the
        // last query the first key (left side; a constant pass without a window).
        let whole = self.n0 + BK as u32 <= self.sk
            && n0 + BK as i32 - 1 < band.hi(m0 as i32, diag)
            && (band.left == i32::MAX || n0 >= band.lo(m0 as i32 + BQ as i32 - 1, diag));
        let bounds = |kk: i32| {
            // Query q (offset kk - m0 - diag from the key's diagonal) sees key kk iff
            // kk - diag - right <= q <= kk - diag + left.
            let at = kk - (m0 as i32 + diag);
            if whole {
                (i32::MIN, i32::MAX)
            } else if kk >= self.sk as i32 {
                (i32::MAX, i32::MAX)
            } else if band.left == i32::MAX {
                (at.saturating_sub(band.right), i32::MAX)
            } else {
                (at.saturating_sub(band.right), at.saturating_add(band.left))
            }
        };
        let (a, b) = (bounds(key as i32), bounds(key as i32 + 8));
        QueryBounds {
            first: [a.0, b.0],
            last: [a.1, b.1],
        }
    }
}

/// The config for `D`, checked against the kernel's const parameters (evaluated at compile time).
#[allow(clippy::too_many_arguments)]
const fn checked_config<
    T: MmaElem,
    const D: usize,
    const BK: usize,
    const BQ: usize,
    const KD: usize,
    const NS: usize,
    const KQ: usize,
    const NO: usize,
    const NQ: usize,
    const DSC: usize,
>() -> FlashBwdConfig {
    let Some(cfg) = flash_bwd_config(D) else {
        panic!("no FlashAttention backward config for this head dim")
    };
    assert!(cfg.block_k == BK && cfg.block_q == BQ && cfg.ds_cols() == DSC);
    assert!(KD == D / 16 && NS == BQ / 8 && NO == D / 8 && NQ == D / 8 / cfg.dq_col_split());
    assert!(KQ * 2 == NS);
    assert!(NQ % 2 == 0 && NS % 2 == 0 && BK % 16 == 0 && BQ % 16 == 0);
    let planned = 2 * Tile::<T, BK, D>::BYTES
        + 2 * 2 * Tile::<T, BQ, D>::BYTES
        + Tile::<T, BK, DSC>::BYTES
        + 2 * Stats::<BQ>::BYTES;
    assert!(planned == cfg.smem_bytes());
    cfg
}

/// The shared tiles one step of the loop reads (Q, dO and statistics of the current stage).
struct Tiles<T, const BK: usize, const BQ: usize, const D: usize, const DSC: usize> {
    k: Tile<T, BK, D>,
    v: Tile<T, BK, D>,
    q: Tile<T, BQ, D>,
    d_o: Tile<T, BQ, D>,
    stats: Stats<BQ>,
    ds: Tile<T, BK, DSC>,
}

/// Which entries of a step's S^T to keep: this thread's entries of key row `r` (0: `g`, 1: `g + 8`)
/// for query offset `qq` in the block iff `qq >= first_query[r]`: one compare per entry, the mask of
/// keys past seq_k and of the causal diagonal folded into the bound (`i32::MAX`: none, `i32::MIN`:
/// all).
struct Mask {
    first_query: [i32; 2],
}

/// One step's products for this warp's 16 keys (`key_row`; `(g, t)` = (lane / 4, lane % 4)) and the
/// `BQ = 8 NS` queries of the step (`KQ = NS / 2` k-steps of 16 queries):
/// - `S^T = K_j Q^T` and `dP^T = V_j dO^T` (K/V rows as A, Q/dO tiles as `[n][k]` B operands);
/// - `P^T = exp2(S^T c - LSE2)` (rows past seq_q and rows that see no key have LSE2 = +inf: P = 0
///   exactly; masked entries set to 0), `dS^T = P^T (dP^T - D)`;
/// - P^T and dS^T rounded to `T` as A fragments over k-steps of 16 queries; dS^T also stored to the
///   dS tile (rows = keys, columns = queries) for the dQ product: the fragments' words are the
///   tile's words (lane (g, t) holds rows g, g + 8, columns 2t, 2t + 1 of each 8-column tile);
/// - `dV_j += P^T dO` and `dK_j += dS^T Q` (dO and Q tiles as `[k][n]` B operands, `.trans`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn query_block<
    T: MmaElem,
    const D: usize,
    const BK: usize,
    const BQ: usize,
    const DSC: usize,
    const KD: usize,
    const NS: usize,
    const KQ: usize,
    const NO: usize,
>(
    tiles: Tiles<T, BK, BQ, D, DSC>,
    key_row: u32,
    (g, t): (u32, u32),
    mask: &Mask,
    c: f32,
    dk_acc: &mut [FragC; NO],
    dv_acc: &mut [FragC; NO],
) {
    const { assert!(KQ * 2 == NS && NS * 8 == BQ) };
    let mut s = [[0.0f32; 4]; NS];
    let mut dp = [[0.0f32; 4]; NS];
    unroll_lt!(kd < KD, {
        let ka = tiles.k.load_a(key_row, 2 * kd as u32);
        let va = tiles.v.load_a(key_row, 2 * kd as u32);
        unroll_lt!(np < KQ, {
            let [b0, b1] = tiles.q.load_b_pair_nk(16 * np as u32, 2 * kd as u32);
            T::mma(&mut s[2 * np], &ka, b0);
            T::mma(&mut s[2 * np + 1], &ka, b1);
            let [b0, b1] = tiles.d_o.load_b_pair_nk(16 * np as u32, 2 * kd as u32);
            T::mma(&mut dp[2 * np], &va, b0);
            T::mma(&mut dp[2 * np + 1], &va, b1);
        });
    });

    unroll_lt!(n < NS, {
        let col = (8 * n) as u32 + 2 * t;
        let lse2 = tiles.stats.load_pair(0, col);
        let delta = tiles.stats.load_pair(1, col);
        unroll!(e in [0, 1, 2, 3] {
            let pv = exp2(fma(s[n][e], c, -lse2[e % 2]));
            let keep = (col + (e % 2) as u32) as i32 >= mask.first_query[e / 2];
            let pv = if keep { pv } else { 0.0 };
            s[n][e] = pv;
            dp[n][e] = pv * (dp[n][e] - delta[e % 2]);
        });
    });

    let mut pa = [[0u32; 4]; KQ];
    let mut dsa = [[0u32; 4]; KQ];
    unroll_lt!(ks < KQ, {
        pa[ks] = to_a::<T>(&s[2 * ks], &s[2 * ks + 1]);
        dsa[ks] = to_a::<T>(&dp[2 * ks], &dp[2 * ks + 1]);
        let col = (16 * ks) as u32 + 2 * t;
        tiles.ds.store_word(key_row + g, col, dsa[ks][0]);
        tiles.ds.store_word(key_row + g + 8, col, dsa[ks][1]);
        tiles.ds.store_word(key_row + g, col + 8, dsa[ks][2]);
        tiles.ds.store_word(key_row + g + 8, col + 8, dsa[ks][3]);
    });

    unroll_lt!(ks < KQ, {
        let row0 = 16 * ks as u32;
        unroll_lt!(np < NO / 2, {
            let [b0, b1] = tiles.d_o.load_b_pair_kn(row0, 2 * np as u32);
            T::mma(&mut dv_acc[2 * np], &pa[ks], b0);
            T::mma(&mut dv_acc[2 * np + 1], &pa[ks], b1);
            let [b0, b1] = tiles.q.load_b_pair_kn(row0, 2 * np as u32);
            T::mma(&mut dk_acc[2 * np], &dsa[ks], b0);
            T::mma(&mut dk_acc[2 * np + 1], &dsa[ks], b1);
        });
    });
}

/// Two accumulator tiles (16 rows x 8 columns each, adjacent columns) rounded to `T` as the A
/// fragment of one 16 x 16 block.
#[inline(always)]
fn to_a<T: MmaElem>(lo: &FragC, hi: &FragC) -> FragA {
    [
        T::pack2(lo[0], lo[1]),
        T::pack2(lo[2], lo[3]),
        T::pack2(hi[0], hi[1]),
        T::pack2(hi[2], hi[3]),
    ]
}

/// Issues this thread's share of the 16-byte copies of rows `row0..row0 + ROWS` of a `[rows, D]`
/// matrix at `src` into `tile`; rows at or past `rows` are zero-filled. `THREADS` threads share the
/// work; `tid` is this thread's index.
///
/// # Safety
/// `src` points at `rows` readable rows of `D` elements, 16-byte aligned; `tile` is idle.
#[inline(always)]
unsafe fn load_rows<T: MmaElem, const ROWS: usize, const D: usize, const THREADS: usize>(
    tile: Tile<T, ROWS, D>,
    src: HeadRows<T>,
    row0: u32,
    rows: u32,
    tid: u32,
) {
    let chunks_per_row = Tile::<T, ROWS, D>::CHUNKS_PER_ROW as u32;
    const {
        assert!(
            (ROWS * D / 8).is_multiple_of(THREADS),
            "copies must divide evenly among threads"
        )
    };
    unroll_lt!(i < ROWS * D / 8 / THREADS, {
        let c = tid + (i * THREADS) as u32;
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

/// Writes this warp's 16 rows of `acc` (rounded to `T`) to rows `out_row0..` of the head `out`,
/// staged through the warp's own rows of `staging` for 16-byte stores. `rows_left` = valid rows
/// from the CTA's first row (`key_row` is the warp's first row in the block). The caller has ended
/// every other warp's reads of `staging` with a block barrier.
#[inline(always)]
fn store_rows<T: MmaElem, const BK: usize, const D: usize, const NO: usize>(
    acc: &[FragC; NO],
    staging: Tile<T, BK, D>,
    key_row: u32,
    rows_left: u32,
    out: HeadRowsMut<T>,
    out_row0: u32,
) {
    let (g, t) = (lane_id() / 4, lane_id() % 4);
    // The first warp barrier orders this warp's earlier reads of the rows (other warps' ended at the
    // caller's block barrier) before the writes; the second the writes before the reads below.
    sync_warp(FULL_MASK);
    unroll_lt!(n < NO, {
        let col = (8 * n) as u32 + 2 * t;
        let a = &acc[n];
        staging.store_word(key_row + g, col, T::pack2(a[0], a[1]));
        staging.store_word(key_row + g + 8, col, T::pack2(a[2], a[3]));
    });
    sync_warp(FULL_MASK);
    let chunks_per_row = (D / 8) as u32;
    unroll_lt!(i < 16 * D / 8 / 32, {
        let c = lane_id() + 32 * i as u32;
        let (r, chunk) = (c / chunks_per_row, c % chunks_per_row);
        if key_row + r < rows_left && out.has_chunk(chunk) {
            // SAFETY: the row is < seq_k of this head (checked just above), so the chunk lies in
            // the head's rows (launcher-validated strides, 16-byte aligned); each chunk has one
            // writer.
            unsafe {
                store_chunk(
                    out.at(out_row0 + r, 8 * chunk) as *mut Chunk16,
                    0,
                    Chunk16(staging.load_chunk(key_row + r, chunk)),
                )
            };
        }
    });
}

/// The pre-pass, one block per ([`FLASH_BWD_PRE_ROWS`] query rows, head, batch), for head dim
/// `p.head_dim` (any the launcher takes): one thread per (row, 16-byte chunk of the tile); a row's threads are
/// adjacent lanes and reduce their partial dot products with a fixed butterfly. Writes the rows'
/// statistics (LSE * log2(e), or +inf for a row past seq_q or one that sees no key (LSE = -inf); D,
/// 0 past seq_q), zeroes the rows of the dQ accumulator, and zeroes the rows' turn counters.
#[inline(always)]
fn pre<T: MmaElem>(
    o: Slice<T>,
    d_o: Slice<T>,
    lse: Slice<f32>,
    stats: SliceMut<f32>,
    dq_acc: SliceMut<f32>,
    turns: SliceMut<u32>,
    p: AttentionShape,
    st: AttentionLayout,
) {
    const ROWS: u32 = FLASH_BWD_PRE_ROWS as u32;
    const TURN: u32 = FLASH_BWD_TURN_ROWS as u32;
    // `rows`: the statistics' and the dQ accumulator's rows a head (the shape's seq_q, a packed
    // batch's longest sequence); `sq`: this batch entry's own.
    let (rows, d) = (p.seq_q, p.head_dim);
    let qb = block_idx_x();
    let (b, h) = (block_idx_z(), block_idx_y());
    let bh = (b * p.heads + h) as u64;
    let seq = Sequence::of(&st, &p, b);
    let sq = seq.sq;
    // This head's rows of O and dO (launcher-validated strides; checked builds re-check).
    let (o_rows, do_rows) = (
        HeadRows::of(o, st.o, (seq.bi, h), (seq.q0, sq), d),
        HeadRows::of(d_o, st.d_o, (seq.bi, h), (seq.q0, sq), d),
    );
    let sq_pad = (rows.div_ceil(ROWS) * ROWS) as u64;
    let half = (p.batch * p.heads) as u64 * sq_pad; // D after all heads' LSE
    let n_turns = sq_pad as u32 / TURN; // padded like the statistics
    // Chunks (threads) per row: the tile's, 8 or 16 (the dQ accumulator's rows are the kernels'
    // tile wide, padded past the head dim, and are zeroed whole); a row's chunks past the head dim
    // add nothing to D. (`max` only spares the divisions below a divide-by-zero check.)
    let cpr = (flash_tile_dim(d as usize) as u32 / 8).max(1);
    let head_chunks = d / 8;
    let rows_per_pass = (flash_bwd::PRE_THREADS / cpr).max(1);
    let (tid, chunk) = (thread_idx_x(), thread_idx_x() % cpr);
    for pass in 0..ROWS / rows_per_pass {
        let r = pass * rows_per_pass + tid / cpr;
        let row = qb * ROWS + r;
        let mut dot = 0.0f32;
        if row < sq {
            // The dQ accumulator is contiguous `[batch * heads, rows, tile D]` f32.
            let at = (bh * rows as u64 + row as u64) * cpr as u64 + chunk as u64;
            if chunk < head_chunks {
                // SAFETY: row < seq_q of this head, chunk < head_dim / 8: inside O's and dO's head
                // rows (launcher-validated strides, 16-byte aligned); both are inputs nothing
                // writes during the kernel.
                let (x, y) = unsafe {
                    (
                        load_chunk_ro(o_rows.at(row, 8 * chunk) as *const Chunk16, 0),
                        load_chunk_ro(do_rows.at(row, 8 * chunk) as *const Chunk16, 0),
                    )
                };
                unroll!(w in [0, 1, 2, 3] {
                    let (a, b) = (T::unpack_word(x.0[w]), T::unpack_word(y.0[w]));
                    dot = fma(a[0], b[0], dot);
                    dot = fma(a[1], b[1], dot);
                });
            }
            dq_acc.set4(at * 8, [0.0; 4]);
            dq_acc.set4(at * 8 + 4, [0.0; 4]);
        }
        // The row's partial sums, combined in a fixed order (lanes of a row are adjacent).
        let mut m = 1;
        while m < cpr {
            dot += shfl_xor_f32(dot, m);
            m *= 2;
        }
        if chunk == 0 {
            let base = bh * sq_pad + row as u64;
            let (lse2, delta) = if row < sq {
                let l = lse.get_ro(seq.lse_at(&st, h, row));
                (
                    if l == f32::NEG_INFINITY {
                        f32::INFINITY
                    } else {
                        l * LOG2_E
                    },
                    dot,
                )
            } else {
                (f32::INFINITY, 0.0)
            };
            stats.set(base, lse2);
            stats.set(half + base, delta);
        }
    }
    // This block's turn counters.
    if tid < ROWS / TURN {
        let t = qb * (ROWS / TURN) + tid;
        if t < n_turns {
            let at = bh * n_turns as u64 + t as u64;
            check_index(at as usize, turns.len as usize);
            // SAFETY: t < n_turns: inside this head's counters (`turns` is launcher-sized).
            unsafe { *turns.ptr.add(at as usize) = 0 };
        }
    }
}

/// `out = scale * acc` rounded to `T`: `acc` a contiguous f32 `[batch, heads, rows, acc_cols]`
/// (the dQ accumulator, its rows a tile wide; or grouped-query dK/dV sums, rows `head_dim` wide),
/// of which the first `head_dim` columns are read; `out` `[batch, heads, rows, head_dim]` with
/// strides `st`, or
/// with `cu` (a packed batch's `batch + 1` u32 row offsets; 0 for a dense one) packed rows, batch
/// entry `b`'s `cu[b + 1] - cu[b]` rows from row `cu[b]`. One CTA a block of
/// `CONVERT_THREADS / (head_dim / 8)` rows of one head (grid: row blocks, heads, batch), 8 elements
/// (two f32 chunks in, one 16-bit chunk out) a thread.
#[inline(always)]
fn convert_rows<T: MmaElem>(
    acc: Slice<f32>,
    out: SliceMut<T>,
    (heads, rows, d, acc_cols): (u32, u32, u32, u32),
    (st, cu): (HeadStrides, u64),
    scale: f32,
) {
    let (b, h) = (block_idx_z(), block_idx_y());
    let (bi, first, seq) = if cu == 0 {
        (b, 0, rows)
    } else {
        let cu = cu as *const u32;
        // SAFETY: the launcher passes `batch + 1` offsets, b < batch (the grid's z).
        let (r0, r1) = unsafe { (*cu.add(b as usize), *cu.add(b as usize + 1)) };
        (0, r0, r1 - r0)
    };
    // Chunks a row (head dims are multiples of 8; `max` spares the divisions a zero check).
    let cpr = (d / 8).max(1);
    let rows_per_block = (flash_bwd::CONVERT_THREADS / cpr).max(1);
    let row = block_idx_x() * rows_per_block + thread_idx_x() / cpr;
    let chunk = thread_idx_x() % cpr;
    if row >= seq || thread_idx_x() >= rows_per_block * cpr {
        return;
    }
    let out = HeadRowsMut::of(out, st, (bi, h), (first, seq), d);
    let at = ((b as u64 * heads as u64 + h as u64) * rows as u64 + row as u64) * acc_cols as u64
        + 8 * chunk as u64;
    let (a, c) = (acc.get4_ro(at), acc.get4_ro(at + 4));
    let words = [
        T::pack2(a[0] * scale, a[1] * scale),
        T::pack2(a[2] * scale, a[3] * scale),
        T::pack2(c[0] * scale, c[1] * scale),
        T::pack2(c[2] * scale, c[3] * scale),
    ];
    // SAFETY: row < seq, chunk < head_dim / 8: inside this head's rows of `out` (launcher-validated
    // strides, 16-byte aligned); each chunk has one writer.
    unsafe { store_chunk(out.at(row, 8 * chunk) as *mut Chunk16, 0, Chunk16(words)) };
}

macro_rules! flash_bwd_entry_points {
    ($($name:ident: $t:ty, $out:ty, $cfg:path $(, #[$attr:meta])?;)*) => {$(
        /// FlashAttention backward main kernel; launch with grid (key blocks, heads, batch) and the
        /// block and shared memory of its config, after the pre-pass. `dk`/`dv`: the input type
        /// (stored rounded) or [`AddF32`] (added into f32 accumulators).
        $(#[$attr])?
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(
            q: Slice<$t>, k: Slice<$t>, v: Slice<$t>, d_o: Slice<$t>, stats: Slice<f32>,
            dq_acc: SliceMut<f32>, turns: SliceMut<u32>, dk: $out, dv: $out,
            shape: AttentionShape, strides: AttentionLayout,
        ) {
            const C: FlashBwdConfig = $cfg;
            unsafe {
                flash_bwd::<$t, { C.head_dim }, { C.block_k }, { C.block_q }, { C.head_dim / 16 },
                    { C.block_q / 8 }, { C.block_q / 16 }, { C.head_dim / 8 }, { C.head_dim / 8 / C.dq_col_split() },
                    { C.threads() }, { C.ds_cols() }>(
                    q, k, v, d_o, stats, dq_acc, turns, dk, dv, shape, strides,
                )
            }
        }
        $(#[$attr])?
        crate::launch_bounds!($name, { $cfg.threads() }, { $cfg.min_blocks });
    )*};
}

flash_bwd_entry_points! {
    flash_bwd_d64_f16: F16, SliceMut<F16>, FLASH_BWD_D64;
    flash_bwd_d64_bf16: BF16, SliceMut<BF16>, FLASH_BWD_D64;
    flash_bwd_d128_f16: F16, SliceMut<F16>, FLASH_BWD_D128;
    flash_bwd_d128_bf16: BF16, SliceMut<BF16>, FLASH_BWD_D128;
    // dK and dV added into f32 accumulators; the sm_80 build only (the sm_90 build runs
    // `flash_wg_bwd_add_*`).
    flash_bwd_add_d64_f16: F16, AddF32, FLASH_BWD_D64, #[cfg(not(target_feature = "sm_90a"))];
    flash_bwd_add_d64_bf16: BF16, AddF32, FLASH_BWD_D64, #[cfg(not(target_feature = "sm_90a"))];
    flash_bwd_add_d128_f16: F16, AddF32, FLASH_BWD_D128, #[cfg(not(target_feature = "sm_90a"))];
    flash_bwd_add_d128_bf16: BF16, AddF32, FLASH_BWD_D128, #[cfg(not(target_feature = "sm_90a"))];
}

/// `dq += scale * acc` in f32, 8 elements a thread, grid-stride (the dQ of an accumulating call):
/// `dq` has `n8` chunks of 8 in rows of `d` (the head dim), `acc` the same rows `acc_cols` (its
/// tile) wide.
#[inline(always)]
fn add_dq(acc: Slice<f32>, dq: SliceMut<f32>, n8: u64, (d, acc_cols): (u32, u32), scale: f32) {
    // Head dims are nonzero multiples of 8; `max` spares the division a zero check.
    let row_chunks = (d as u64 / 8).max(1);
    let mut i = global_index_x();
    while i < n8 {
        let from = (i / row_chunks) * acc_cols as u64 + 8 * (i % row_chunks);
        unroll!(h in [0, 1] {
            let at = 8 * i + 4 * h as u64;
            let a = acc.get4_ro(from + 4 * h as u64);
            // Each element is read and written by this thread only.
            let was = [0, 1, 2, 3].map(|j| dq.get(at + j));
            dq.set4(at, [0, 1, 2, 3].map(|j| was[j as usize] + a[j as usize] * scale));
        });
        i += grid_threads_x();
    }
}

/// FlashAttention backward: the f32 dQ accumulator (rows `acc_cols` wide), times `scale`, added
/// into an f32 dQ (`n8` chunks of 8, rows `head_dim` wide).
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn flash_bwd_dq_add_f32(
    acc: Slice<f32>,
    dq: SliceMut<f32>,
    n8: u64,
    head_dim: u32,
    acc_cols: u32,
    scale: f32,
) {
    add_dq(acc, dq, n8, (head_dim, acc_cols), scale)
}
crate::launch_bounds!(flash_bwd_dq_add_f32, { flash_bwd::CONVERT_THREADS }, 1);

macro_rules! flash_bwd_helper_entry_points {
    ($($pre:ident, $convert:ident: $t:ty;)*) => {$(
        /// FlashAttention backward pre-pass; grid (query blocks, heads, batch), `PRE_THREADS` threads.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $pre(
            o: Slice<$t>, d_o: Slice<$t>, lse: Slice<f32>, stats: SliceMut<f32>,
            dq_acc: SliceMut<f32>, turns: SliceMut<u32>, shape: AttentionShape,
            strides: AttentionLayout,
        ) {
            pre::<$t>(o, d_o, lse, stats, dq_acc, turns, shape, strides)
        }
        crate::launch_bounds!($pre, { flash_bwd::PRE_THREADS }, 1);

        /// FlashAttention backward: an f32 accumulator (dQ, or grouped-query dK/dV) to the input
        /// type in the output's strides, times `scale`; grid (row blocks, heads, batch),
        /// `CONVERT_THREADS` threads.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $convert(
            acc: Slice<f32>, out: SliceMut<$t>, heads: u32, rows: u32, head_dim: u32,
            acc_cols: u32, strides: HeadStrides, cu_seqlens: u64, scale: f32,
        ) {
            convert_rows::<$t>(acc, out, (heads, rows, head_dim, acc_cols), (strides, cu_seqlens), scale)
        }
        crate::launch_bounds!($convert, { flash_bwd::CONVERT_THREADS }, 1);
    )*};
}

flash_bwd_helper_entry_points! {
    flash_bwd_pre_f16, flash_bwd_dq_f16: F16;
    flash_bwd_pre_bf16, flash_bwd_dq_bf16: BF16;
}
