//! FlashAttention backward on Hopper warpgroup MMA (`wgmma`, sm_90a): the sm_90 build's main
//! backward kernel (`flash_wg_bwd_d{64,128,256}_{dtype}`), between the pre-pass and the dQ conversion of
//! `flash_bwd.rs`, whose statistics, f32 dQ accumulator, turn counters and determinism argument it
//! shares (see that module's doc). Compiled only into the sm_90 PTX.
//!
//! One CTA of two warpgroups per (block of 128 keys, head, batch); warpgroup `w` owns keys
//! `64 w..64 w + 64`, the M = 64 of its products, and keeps their dK and dV rows in registers (wgmma
//! accumulators). At D = 256 (`flash_wg_bwd_{d256,general_d256,scored_d256}_*`), at 192 on the 256
//! tile (`flash_wg_bwd_d192_*`, split unevenly: 128 and 64 columns of dK and dV) and in the scored
//! kernels at D = 128 (`flash_wg_bwd_scored_d128_*`) a CTA takes 64 keys and the warpgroups split
//! the head dim instead: see [`split_step`].
//! Grouped-query heads: a CTA walks every query head of its key/value head's group, dK and dV
//! summed in its registers; the member-grid kernels (`flash_wg_bwd_members_*`, [`MemberSum`])
//! take one query head a CTA instead and add dK and dV into f32 in member order.
//! K and V stay in shared memory; the CTA walks the query blocks that see its keys
//! in the order its dQ order asks (`KeyBlockWalk::block_at`: last-first, or rotated), Q_i, dO_i
//! and their statistics pipelined by `cp.async` (2 stages, 3 with `defer_dq`). Per query block i
//! (D = 128, [`FlashWgBwdConfig::defer_dq`] false):
//! ```text
//! wait, proxy fence, barrier      Q_i/dO_i landed; every warpgroup retired the last step's products
//! load Q/dO of the next block of the walk into the other stage
//! per sub-block of 64 queries (one at D = 128, two at D = 64):
//!   S^T = K_w Q^T, dP^T = V_w dO^T    (ss wgmma, K-major both; one group; the wait also retires
//!                                      the previous sub-block's dV/dK products)
//!   P^T = exp2(S^T c - LSE2), dS^T = P^T (dP^T - D)  (masked entries 0)
//!   dS^T -> shared tile [keys][queries] (16-bit), proxy fence
//!   dV_w += P^T dO, dK_w += dS^T Q    (rs wgmma: P^T, dS^T from registers, dO/Q MN-major)
//! barrier                         the dS^T tile is whole
//! dQ half = dS K                  (ss wgmma, A = dS^T tile MN-major, B = K tile MN-major)
//! wait; per warp: its turn on block i, red.global.add.v4.f32 of its part, release
//! ```
//! With `defer_dq` (D = 64) there is no barrier after the sub-blocks: step i - 1 issues block i's
//! dQ product right after its top barrier (which also completes block i's dS^T tile), then its
//! first sub-block's S^T / dP^T; `wait_group 1` retires the dQ product, and each warp, in its turn,
//! adds its part (`red.global.add.v2.f32`, the accumulator's pairs where they lie: see
//! [`add_dq_half`]) while the tensor cores compute S^T and dP^T. The last block's dQ follows the
//! loop. So the dS^T tile is double-buffered (a step writes the tile the dQ product of two steps
//! back read) and Q/dO take 3 stages (a step's last dV/dK products retire only in the next step,
//! after that step's loads were issued). D = 128 keeps the plain order: its dK and dV take 128
//! registers, and ptxas serialised the wgmma for lack of registers to keep 32 more in flight. D = 96
//! keeps it too: with its 96 f32 of dK and dV a thread, the deferred order spilled 8 bytes.
//! The nondeterministic mode (no `DQ_ORDERED`, `BackwardMode::Nondeterministic` on the host) skips
//! the turn waits and releases: each warp adds its part as soon as it has it, so the f32 sums of
//! a dQ element happen in arrival order.
//!
//! P^T and dS^T leave the S^T / dP^T accumulators as the A fragments of the next products with no
//! data movement (the wgmma accumulator layout of two 8-column blocks is the A layout of one
//! 16-deep step), as in the forward's `P V`. The two warpgroups split the 128 x 64 (D = 128) or
//! 128 x 128 (D = 64) dQ block into two 64 x 64 halves (by columns, or by query rows), so each adds
//! half of it. Epilogue: dK (times `scale`) and dV rounded to the input type, staged through the
//! CTA's K/V tiles for 16-byte stores.
use crate::dev::atomic::{
    add_relaxed_u32, add_release_u32, fence_acq_rel_gpu, red_add_v2_f32, red_add_v4_f32,
    wait_for_turn,
};
use crate::dev::copy::{cp_async_16, cp_async_commit, cp_async_wait};
use crate::dev::elem::{BF16, F16};
use crate::dev::math::{LOG2_E, abs, exp2, fma, max, tanh};
use crate::dev::mem::{Chunk16, Slice, SliceMut, store_chunk};
use crate::dev::mma::MmaElem;
use crate::dev::opaque_dep_u32;
use crate::dev::shared::{
    SharedScalar, check_index, dynamic_base, ld_shared_v2_f32, ld_shared_v4, st_shared_v4,
};
use crate::dev::sync::{sync_threads, sync_warp};
use crate::dev::thread::{block_idx_y, block_idx_z, lane_id, thread_idx_x};
use crate::dev::warp::{FULL_MASK, shfl_xor_f32, warp_uniform_u32};
use crate::dev::wgmma::{Accumulator, SwizzledTile, Wgmma, commit, fence, fence_proxy_async};
use crate::params::attention::{
    AttentionLayout, AttentionShape, DQ_LATE_RELEASE, DQ_ORDERED, FLASH_BWD_PRE_ROWS,
    FLASH_BWD_TURN_ROWS, FLASH_WG_BWD_D32, FLASH_WG_BWD_D64, FLASH_WG_BWD_D64_GENERAL,
    FLASH_WG_BWD_D96, FLASH_WG_BWD_D128, FLASH_WG_BWD_D128_SCORED, FLASH_WG_BWD_D192,
    FLASH_WG_BWD_D256, FlashWgBwdConfig, GROUP_ALL, flash_wg_bwd_config_of,
};
use crate::{unroll, unroll_lt};

use super::flash_bwd::{
    AddF32, AddMode, KeyBlockWalk, KvOut, MemberSum, QueryBounds, add_rows_f32, take_rows_f32,
};
use super::flash_wgmma::{load_cols, load_rows, pack_p};
use super::{HeadRows, HeadRowsMut, Sequence, alibi_slope};

crate::static_shared!(fn packed_q_rows() -> [u32; 2] as FLASH_WG_BWD_PACKED_Q_ROWS);

/// The main backward kernel. `D`: the tiles' width; `HD`: the head-dim columns the products cover
/// (`D`, or 32 / 96 / 192 on the 64 / 128 / 256 tiles); `ON`: f32 a thread of dK and of dV
/// (`HD / 2`, or `D / 4` with the head dim split: the most a warpgroup keeps), `QN`: of a dQ part (32, or 16 at `HD` = 32), `SUBS`: the
/// step's sub-blocks on the paired path (0 with the split: its step is [`split_step`]); all
/// checked against the config. S^T and dP^T (per 64-query sub-block) are 32 each (64 x 64).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn flash_wg_bwd<
    T,
    const D: usize,
    const HD: usize,
    const BK: usize,
    const BQ: usize,
    const ON: usize,
    const QN: usize,
    const STAGES: usize,
    const SUBS: usize,
    const GENERAL: bool,
    const WINDOW: bool,
    const SCORE: bool,
    const EXACT: bool,
    O: KvOut<T>,
>(
    q: Slice<T>,
    k: Slice<T>,
    v: Slice<T>,
    d_o: Slice<T>,
    stats: Slice<f32>,
    dq_acc: SliceMut<f32>,
    turns: SliceMut<u32>,
    dk: O,
    dv: O,
    p: AttentionShape,
    order: u32,
    st: AttentionLayout,
) where
    T: Wgmma<[f32; ON]> + Wgmma<[f32; 32]> + Wgmma<[f32; QN]> + Wgmma<[f32; 16]>,
    [f32; ON]: Accumulator,
    [f32; 32]: Accumulator,
    [f32; QN]: Accumulator,
    [f32; 16]: Accumulator,
{
    let cfg: FlashWgBwdConfig =
        const { checked_config::<D, HD, BK, BQ, ON, QN, STAGES, GENERAL, SCORE>() };
    const { assert!(SUBS == cfg_subs::<HD, GENERAL, SCORE>()) };
    // The deferred order is the dense kernels' (a packed walk's offsets or a narrow head dim's
    // width leave it no registers), so the dQ additions take their pairs by `defer_dq` alone.
    const {
        assert!(
            !GENERAL || !checked_config::<D, HD, BK, BQ, ON, QN, STAGES, GENERAL, SCORE>().defer_dq
        )
    };
    // (Their own consts: read off `cfg`, the branches they pick folded later, and ptxas spilled.)
    let split: bool =
        const { checked_config::<D, HD, BK, BQ, ON, QN, STAGES, GENERAL, SCORE>().split_head };
    let two_dq_parts: bool =
        const { checked_config::<D, HD, BK, BQ, ON, QN, STAGES, GENERAL, SCORE>().dq_parts() == 2 };
    // An uneven split (192 on the 256 tile): warpgroup 1 keeps 64 columns of dK and dV (the first
    // 32 f32 of its accumulators) and adds two dQ parts, warpgroup 0 one.
    let uneven: bool =
        const { checked_config::<D, HD, BK, BQ, ON, QN, STAGES, GENERAL, SCORE>().uneven_split() };
    const TH: usize = 256;
    // The general kernels with the head dim split walk in the plain order (the host passes nothing
    // else): known here, the rotated orders' arithmetic folds away, which their registers need
    // (with it they spilled 16-44 bytes).
    // The head dim's columns: the products' own in a dense kernel (every column test folds away;
    // the tile's columns past them are zero-filled on load), the shape's in a general one
    // (narrower head dims zero-filled on load and cut on store).
    // (`EXACT`: a general kernel launched only at its tile's head dim, whose column tests fold away
    // as the dense kernels' do.)
    let cols = if GENERAL && !EXACT {
        p.head_dim
    } else {
        HD as u32
    };
    // The member-sum kernels run a CTA a query head ([`MemberSum`]; a constant: every other
    // kernel's member-grid code folds away).
    let member_grid = O::MEMBER_GRID;
    const { assert!(!(GENERAL && O::MEMBER_GRID)) };
    let order = if GENERAL && split {
        order & DQ_ORDERED
    } else {
        order
    };

    // The query heads this launch walks: one group member, or (`GROUP_ALL`) every member of the
    // key/value head's group in turn, dK and dV summed in the registers across them.
    let (first_member, members) = if member_grid {
        (block_idx_y() % p.group(), 1)
    } else if p.group_member == GROUP_ALL {
        (0, p.group())
    } else {
        (p.group_member, 1)
    };
    let walk = KeyBlockWalk::of::<D, BK, BQ, GENERAL, WINDOW>(
        AttentionShape {
            group_member: first_member,
            ..p
        },
        &st,
        (stats.len, turns.len),
        order,
        (0, member_grid),
    );
    // What does not depend on the query head: the key block, its key/value head, the walk's length.
    let KeyBlockWalk {
        sk,
        n0,
        seq,
        hkv,
        bkv,
        ..
    } = walk;
    let n_steps = walk.steps();
    // A packed batch entry's first query row and row count, which every step's copies take: read
    // from the offsets once (`walk.seq`) and kept in shared memory. Read from the offsets each
    // step, they held each step's start on an L2 round trip (the turns' acquire polls empty the
    // L1): 3% of the packed D128 kernel's stall samples under ncu. Kept in registers, they would
    // take registers from the products.
    let packed = GENERAL && st.cu_seqlens_q != 0;
    if packed {
        if thread_idx_x() == 0 {
            packed_q_rows().store(0, seq.q0);
            packed_q_rows().store(1, seq.sq);
        }
        sync_threads();
    }
    // This head's rows of K and V (launcher-validated strides; checked builds re-check); Q's and
    // dO's are taken in each step's copies (`load_qblock`).
    let k_src = HeadRows::of(k, st.k, (seq.bi, hkv), (seq.k0, sk), cols);
    let v_src = HeadRows::of(v, st.v, (seq.bi, hkv), (seq.k0, sk), cols);

    // Shared memory (config order; every 16-bit tile whole 1024-byte atoms, so all stay aligned).
    const { assert!(STAGES == 2 || STAGES == 3) };
    let base = dynamic_base();
    let kv_bytes = SwizzledTile::<BK, D>::BYTES as u32;
    let qo_bytes = SwizzledTile::<BQ, D>::BYTES as u32;
    let k_tile = SwizzledTile::<BK, D>::at(base);
    let v_tile = k_tile.stage(1);
    let q_tiles = SwizzledTile::<BQ, D>::at(base + 2 * kv_bytes);
    let do_tiles = q_tiles.stage(STAGES as u32);
    let ds_tiles = SwizzledTile::<BK, BQ>::at(base + 2 * kv_bytes + 2 * STAGES as u32 * qo_bytes);
    let stats_base = base
        + 2 * kv_bytes
        + 2 * STAGES as u32 * qo_bytes
        + 2 * SwizzledTile::<BK, BQ>::BYTES as u32;
    let stat_stage = (2 * BQ * 4) as u32; // a stage: LSE2 of the BQ rows, then their D
    check_index(
        (stats_base + STAGES as u32 * stat_stage - base) as usize,
        cfg.smem_bytes() + 1,
    );

    // With no query block to walk (seq_q = 0) nothing is loaded: dK = dV = 0. K and V are loaded
    // once (they join the first member's first copy group). Q, dO and V only in the products'
    // `HD` columns (no product reads past them); K whole, zero-filled past them, since a dQ part
    // of 64 columns reads K's columns to the tile's edge (at `HD` = 96).
    if n_steps > 0 {
        // SAFETY: rows past seq_k are zero-filled without reading; nothing has touched the tiles.
        unsafe {
            load_rows::<BK, D, TH, T>(k_tile, k_src, n0, sk);
            load_cols::<BK, D, HD, TH, T>(v_tile, v_src, n0, sk);
        }
    }
    if cfg.defer_dq {
        // The first step's dQ product of "the previous block" reads dS^T tile 1: zeros, so that it
        // reads defined values (its result is never added).
        zero_tile::<BK, BQ, TH>(ds_tiles.stage(1));
    }

    let c = if SCORE {
        scored_c(&p)
    } else {
        p.scale * LOG2_E
    };
    let mut dk_acc = [0.0f32; ON];
    let mut dv_acc = [0.0f32; ON];
    for member in first_member..first_member + members {
        // One query head's walk: every step's dQ part is added behind that head's turn counters, and
        // every turn this CTA takes is released before the next head's walk starts (no CTA waits on a
        // head's turn while holding another head's).
        // This member's walk and dQ sink.
        let walk_at = |salt: u32| {
            KeyBlockWalk::of::<D, BK, BQ, GENERAL, WINDOW>(
                AttentionShape {
                    group_member: member,
                    ..p
                },
                &st,
                (stats.len, turns.len),
                order,
                (salt, member_grid),
            )
        };
        let sink_of = |w: &KeyBlockWalk| DqSink {
            acc: dq_acc,
            turns,
            bh: w.bh,
            // (The same value as `sq` in a dense batch: no register of its own.)
            rows: if GENERAL { p.seq_q } else { w.sq },
            sq: w.sq,
            n_turns: w.n_turns,
            turn_step: w.turn_step,
            order,
        };
        let walk = walk_at(0);
        let KeyBlockWalk {
            bh,
            sq_pad,
            heads_total,
            ..
        } = walk;
        let sink = sink_of(&walk);
        check_index(
            ((bh + 1) * p.seq_q as u64 * D as u64) as usize,
            dq_acc.len as usize + 1,
        );

        // Loads Q, dO and the statistics of query block `i` into stage `s`.
        // SAFETY (all calls): rows past seq_q are zero-filled without reading; the statistics rows are
        // padded to whole pre-pass blocks, which whole query blocks divide; the stage is idle (every
        // product that read it retired before the barrier ahead of the call, see the module doc).
        let load_qblock = |i: u32, s: u32| unsafe {
            let m0 = i * BQ as u32;
            // The head's rows from the (batch * heads + head) index the dQ sink holds anyway: two
            // pointers and strides kept through the loop would cost the registers the products need.
            let hb = opaque_dep_u32(bh as u32, i);
            let (b_, h_) = (hb / p.heads, hb % p.heads);
            // The head's statistics, recomputed here for the same reason. SAFETY: the launcher
            // validated that the statistics hold 2*batch*heads*sq_pad values (checked builds
            // re-check in `KeyBlockWalk::of`), so this is the start of this head's.
            let lse_src = stats.ptr.add(hb as usize * sq_pad as usize);
            let delta_offset = heads_total as usize * sq_pad as usize; // D after all heads' LSE
            // The batch entry's first query row (a packed batch's offset; 0 for a dense one, whose
            // batch index the strides take; a packed batch's batch strides are 0).
            // (Loaded values are not known uniform to ptxas: `warp_uniform_u32` keeps the bounds
            // uniform, as every lane read the same words.)
            let (q0, sq) = if packed {
                (
                    warp_uniform_u32(packed_q_rows().load(0)),
                    warp_uniform_u32(packed_q_rows().load(1)),
                )
            } else {
                (0, p.seq_q)
            };
            let q_src = HeadRows::of(q, st.q, (b_, h_), (q0, sq), cols);
            let do_src = HeadRows::of(d_o, st.d_o, (b_, h_), (q0, sq), cols);
            load_cols::<BQ, D, HD, TH, T>(q_tiles.stage(s), q_src, m0, sq);
            load_cols::<BQ, D, HD, TH, T>(do_tiles.stage(s), do_src, m0, sq);
            let t = thread_idx_x();
            let chunks = (2 * BQ / 4) as u32;
            if t < chunks {
                let (row, chunk) = (t / (BQ as u32 / 4), t % (BQ as u32 / 4));
                let at = row as usize * delta_offset + m0 as usize + 4 * chunk as usize;
                cp_async_16(
                    stats_base + s * stat_stage + row * (BQ as u32 * 4) + 16 * chunk,
                    lse_src.add(at) as *const u8,
                    true,
                );
            }
        };

        if n_steps > 0 {
            load_qblock(walk.block_at(0, order), 0);
        }
        cp_async_commit();
        let mut i = 0u32; // the step's query block
        let mut prev = 0u32; // the previous step's
        let mut step = 0u32;
        while step < n_steps {
            i = walk.block_at(step, order);
            let m0 = i * BQ as u32;
            let (stage, ds_stage) = (step % STAGES as u32, step % 2);
            // Per-thread indices are recomputed each step (`opaque_dep_u32`), not kept in registers
            // through the loop: the accumulators need them.
            let tid = opaque_dep_u32(thread_idx_x(), i);
            let wg = tid / 128;
            let warp_in_wg = (tid / 32) % 4;
            let (g, t) = ((tid % 32) / 4, tid % 4);
            // (Split, the first key is 0 through `opaque_dep_u32`, so that the K and V tiles'
            // descriptors are not loop-invariant: hoisted, they would hold 64 registers.)
            let (wg_key, wg_col) = if split {
                (opaque_dep_u32(0, i), (D / 2) as u32 * wg)
            } else {
                (64 * wg, 0)
            };
            let key_row = wg_key + 16 * warp_in_wg + g; // this thread's keys: key_row, key_row + 8
            // This warpgroup's dQ half: query rows from `dq_row0`, columns from `dq_col0`.
            let dq_row0 = 64 * (wg % cfg.dq_row_splits() as u32);
            let dq_col0 = if split {
                cfg.dq_col0_of(wg as usize) as u32
            } else {
                64 * (wg / cfg.dq_row_splits() as u32)
            };
            // Q_i, dO_i and the statistics have landed (and the zeroed dS^T tile); every warpgroup
            // wrote and fenced the previous step's dS^T and retired what the loads below overwrite.
            cp_async_wait::<0>();
            fence_proxy_async();
            sync_threads();
            if cfg.defer_dq && sink.late() && step > 1 {
                // The additions of the previous step (block `step - 2`, deferred: added during step
                // `step - 1`), most of a step ago, before this step's turn.
                sink.release_cta(walk.block_at(step - 2, order), tid);
            }
            if step + 1 < n_steps {
                load_qblock(walk.block_at(step + 1, order), (step + 1) % STAGES as u32);
            }
            cp_async_commit();
            let (qt, dot, ds_tile) = (
                q_tiles.stage(stage),
                do_tiles.stage(stage),
                ds_tiles.stage(ds_stage),
            );

            // Deferred: the previous block's dQ half (its dS^T tile is whole since the barrier
            // above), computed ahead of this block's first S^T / dP^T and added while they run.
            let mut dq = [0.0f32; QN];
            if cfg.defer_dq {
                // SAFETY: as for the dQ product in the non-deferred branch below.
                unsafe {
                    issue_dq::<T, BK, D, BQ, QN>(
                        &mut dq,
                        ds_tiles.stage(ds_stage ^ 1),
                        k_tile,
                        dq_row0,
                        dq_col0,
                    )
                };
            }

            // Per key row of this thread (0: key_row, 1: key_row + 8): the queries that see it.
            let qb = walk.first_queries::<BK, BQ, WINDOW>(m0, n0 + key_row);
            let stats_at = stats_base + stage * stat_stage;

            // The block's queries in sub-blocks of 64 (the N of S^T): S^T and dP^T stay at 32 f32 a
            // thread each, and sub-block h's dV/dK products run while h + 1's S^T and dP^T are
            // computed (the wait for those retires them).
            if split {
                // The scored kernels' modifications at this thread's first query and key (read
                // where warpgroup 0 applies them: held through the products, they spilled).
                let diag = walk.dq.diag;
                let mods = |q: u32| ScoreMods::of(&p, &st, bh, (m0 + q, n0 + key_row), diag);
                // SAFETY: the whole CTA calls it here (see `split_step`); the other dS^T stage is
                // free (this step's dQ product reads this step's, and the last step's retired).
                unsafe {
                    split_step::<T, D, HD, BK, BQ, ON, STAGES, SCORE>(
                        (k_tile, q_tiles, ds_tile, stage),
                        (stats_at, ds_tiles.stage(ds_stage ^ 1)),
                        (c, qb, &p, mods),
                        (wg_key, wg_col, uneven),
                        (&mut dv_acc, &mut dk_acc),
                    )
                };
            }
            unroll_lt!(h < SUBS, {
                let q0 = (64 * h) as u32;
                // S^T and dP^T (64 keys x 64 queries for this warpgroup).
                let mut s = [0.0f32; 32];
                let mut dp = [0.0f32; 32];
                fence();
                unroll_lt!(kd < HD / 16, {
                    // SAFETY: the whole warpgroup issues it (no divergence above); K, V and Q_i, dO_i
                    // landed and were fenced before the barrier; `s`, `dp` are untouched until the
                    // wait below.
                    unsafe {
                        T::mma_ss(
                            &mut s,
                            k_tile.desc_k_major(wg_key, kd as u32),
                            qt.desc_k_major(q0, kd as u32),
                            (kd > 0) as u32,
                        );
                        T::mma_ss(
                            &mut dp,
                            v_tile.desc_k_major(wg_key, kd as u32),
                            dot.desc_k_major(q0, kd as u32),
                            (kd > 0) as u32,
                        );
                    }
                });
                commit();
                if cfg.defer_dq && h == 0 {
                    // Every group but the one just committed retires: the previous block's dQ half
                    // (and its last dV/dK products).
                    dq.wait::<1>();
                    dv_acc.hold();
                    dk_acc.hold();
                    if step > 0 {
                        sink.add(&dq, prev, walk.turn_at(prev, order), tid, cfg, false);
                    }
                }
                // Retires the previous sub-block's dV/dK products too (groups retire in order).
                s.wait::<0>();
                dp.hold();
                dv_acc.hold();
                dk_acc.hold();

                // P^T = exp2(S^T c - LSE2), dS^T = P^T (dP^T - D), masked entries 0; the scored
                // kernels take the softcap and ALiBi's bias into S^T first (and the cap's
                // derivative into dS^T). The cap's branch is uniform and outside the entries.
                let at = (q0 + 2 * t, stats_at, c);
                if !SCORE {
                    p_and_ds::<BQ, false, false, 32>(
                        &mut s,
                        &mut dp,
                        at,
                        (qb, &p),
                        ScoreMods::NONE,
                    );
                } else {
                    let q = m0 + q0 + 2 * t;
                    let mods = ScoreMods::of(&p, &st, bh, (q, n0 + key_row), walk.dq.diag);
                    if p.softcap_k != 0.0 {
                        p_and_ds::<BQ, true, true, 32>(&mut s, &mut dp, at, (qb, &p), mods);
                    } else {
                        p_and_ds::<BQ, false, true, 32>(&mut s, &mut dp, at, (qb, &p), mods);
                    }
                }
                let pa = pack_p::<T, 32>(&s);
                let dsa = pack_p::<T, 32>(&dp);
                // dS^T into this step's tile (rows = keys, columns = queries): fragment word (r, h) of
                // step ks is row key_row + 8 r, columns q0 + 16 ks + 8 h + 2t, +1. The tile's readers,
                // the dQ product of two steps back, retired before the barrier at the top.
                // SAFETY: one writer per word (this thread's fragment positions).
                unsafe { store_ds::<BK, BQ, 4>(ds_tile, &dsa, key_row, q0 + 2 * t) };
                fence_proxy_async();

                // dV_w += P^T dO_i, dK_w += dS^T Q_i over this sub-block's 64 queries.
                fence();
                unroll_lt!(ks < 4, {
                    let k_step = (4 * h + ks) as u32;
                    // SAFETY: the whole warpgroup; the tiles landed and were fenced before the barrier
                    // at the top and are not written until these products retired; the fragments and
                    // accumulators are untouched until the next wait.
                    unsafe {
                        T::mma_rs_tb(&mut dv_acc, &pa[ks], dot.desc_mn_major_from(k_step, wg_col));
                        T::mma_rs_tb(&mut dk_acc, &dsa[ks], qt.desc_mn_major_from(k_step, wg_col));
                    }
                });
                commit();
            });

            if !cfg.defer_dq {
                // Both warpgroups' dS^T rows are in the tile (written and fenced before this
                // barrier; with the head dim split, before `split_step`'s second, which serves).
                if !split {
                    sync_threads();
                }
                // SAFETY: the whole warpgroup; the dS^T tile was fenced before the barrier above and
                // the K tile before the one at the top; neither is written until the wait below;
                // `dq` is untouched until then.
                unsafe { issue_dq::<T, BK, D, BQ, QN>(&mut dq, ds_tile, k_tile, dq_row0, dq_col0) };
                if sink.late() && step > 0 {
                    // The previous step's additions (a step ago: landed) before this turn. Its block
                    // is recomputed: kept through the step, ptxas spilled.
                    // (A release a warp here: one thread for the CTA, as the deferred order
                    // releases, measured slower at D192 and D256 without the causal mask, no
                    // better at D96, and spilled the general kernels; docs/PERF_NOTES.md.)
                    sink.release(walk.block_at(step - 1, order), tid);
                }
                // The turn is awaited while the tensor cores compute the dQ half: the poll's round
                // trip to L2 is off the step's critical path.
                sink.wait(i, walk.turn_at(i, order), tid);
                // Every group of this warpgroup retires here (in order): dV and dK too.
                dq.wait::<0>();
                dv_acc.hold();
                dk_acc.hold();
                // (Uneven, warpgroup 1's share is two parts and warpgroup 0's one.)
                if two_dq_parts && (!uneven || wg == 1) {
                    // The head dim split at D = 256: the share's first 64 columns are added inside the turn
                    // just taken, then its second 64 take the same registers (one after the
                    // other: both at once spilled), and their additions release the turn.
                    sink.add_part(&dq, i, tid, cfg, dq_col0);
                    // SAFETY: as above (the tiles are not written until the wait below).
                    unsafe {
                        issue_dq::<T, BK, D, BQ, QN>(
                            &mut dq,
                            ds_tile,
                            k_tile,
                            dq_row0,
                            dq_col0 + 64,
                        )
                    };
                    dq.wait::<0>();
                    dv_acc.hold();
                    dk_acc.hold();
                }
                sink.add_waited(&dq, i, tid, cfg, false);
            }
            prev = i;
            step += 1;
        }
        if cfg.defer_dq {
            // The last dV/dK products retire (a wait on every path, so that ptxas sees none in
            // flight past the loop).
            dv_acc.wait::<0>();
            dk_acc.hold();
        }
        if cfg.defer_dq && step > 0 {
            // The last block's dQ half: its dS^T tile is whole after this barrier.
            sync_threads();
            let tid = opaque_dep_u32(thread_idx_x(), i);
            let wg = tid / 128;
            let mut dq = [0.0f32; QN];
            // SAFETY: as in the loop; nothing writes the tiles any more.
            unsafe {
                issue_dq::<T, BK, D, BQ, QN>(
                    &mut dq,
                    ds_tiles.stage((step - 1) % 2),
                    k_tile,
                    64 * (wg % cfg.dq_row_splits() as u32),
                    64 * (wg / cfg.dq_row_splits() as u32),
                )
            };
            dq.wait::<0>();
            dv_acc.hold();
            dk_acc.hold();
            if sink.late() && step > 1 {
                // The additions of the loop's last step (block `step - 2`), before this turn.
                sink.release_cta(walk.block_at(step - 2, order), tid);
            }
            sink.add(&dq, i, walk.turn_at(i, order), tid, cfg, true);
        }
        if sink.late() && !cfg.defer_dq && step > 0 {
            // The last step's additions.
            let last = walk.block_at(step - 1, order);
            sink.release(last, opaque_dep_u32(thread_idx_x(), last));
        }
        // The K/V tiles are free: every copy was waited for, every product retired.
        cp_async_wait::<0>();
        sync_threads();
    }

    let dk_acc = dk_acc.map(|x| x * p.scale);
    let (warp_key, warp_col) = if split {
        let tid = thread_idx_x();
        (16 * (tid / 32 % 4), (D / 2) as u32 * (tid / 128))
    } else {
        (16 * (thread_idx_x() / 32), 0)
    };
    // dK and dV rows are the key/value head's.
    let out_row0 = bkv * sk as u64 + n0 as u64 + warp_key as u64;
    // The sequence again (kept from the start, its values would hold registers through the loops).
    // A packed batch's CTA past its sequence's keys has n0 = sk's block end: no rows.
    let seq = Sequence::of_kind::<GENERAL>(&st, &p, block_idx_z());
    let rows_left = if GENERAL {
        seq.sk.saturating_sub(n0)
    } else {
        sk - n0
    };
    if member_grid {
        // The member grid ([`MemberSum`]): in this member's turn on its key block, the members
        // before the last add their rows to the sums (member 0 stores them) and release the
        // next; the last takes the sums into its registers and stores the rounded rows.
        let (member, last) = (
            block_idx_y() % p.group(),
            block_idx_y() % p.group() + 1 == p.group(),
        );
        let counter = member_counter::<BK>(&p, turns, bkv, n0);
        if thread_idx_x() == 0 {
            // SAFETY: a live counter (`member_counter`).
            unsafe { wait_for_turn(counter, member) };
        }
        sync_threads();
        let rows = (warp_key, rows_left, cols, warp_col, out_row0);
        let (mut dv_acc, mut dk_acc) = (dv_acc, dk_acc);
        member_sums::<ON>(&mut dv_acc, dv.added(), (member, last), rows);
        member_sums::<ON>(&mut dk_acc, dk.added(), (member, last), rows);
        if last {
            if let Some(out) = dv.rounded() {
                let out = HeadRowsMut::of(out, st.dv, (seq.bi, hkv), (seq.k0, sk), cols);
                store_rows::<T, BK, D, ON>(
                    &dv_acc,
                    v_tile,
                    (warp_key, warp_col),
                    rows_left,
                    out,
                    n0,
                );
            }
            if let Some(out) = dk.rounded() {
                let out = HeadRowsMut::of(out, st.dk, (seq.bi, hkv), (seq.k0, sk), cols);
                store_rows::<T, BK, D, ON>(
                    &dk_acc,
                    k_tile,
                    (warp_key, warp_col),
                    rows_left,
                    out,
                    n0,
                );
            }
        } else {
            // Every thread's additions, then the release (cumulative over the barrier).
            sync_threads();
            if thread_idx_x() == 0 {
                // SAFETY: a live counter.
                unsafe { add_release_u32(counter, 1) };
            }
        }
        return;
    }
    if let Some(out) = dv.rounded() {
        let out = HeadRowsMut::of(out, st.dv, (seq.bi, hkv), (seq.k0, sk), cols);
        store_rows::<T, BK, D, ON>(&dv_acc, v_tile, (warp_key, warp_col), rows_left, out, n0);
    }
    if let Some(out) = dk.rounded() {
        let out = HeadRowsMut::of(out, st.dk, (seq.bi, hkv), (seq.k0, sk), cols);
        store_rows::<T, BK, D, ON>(&dk_acc, k_tile, (warp_key, warp_col), rows_left, out, n0);
    }
    // The accumulators' quads (4 f32 an 8-column tile), as the f32 epilogue reads them.
    let quad =
        |acc: &[f32; ON], n: usize| [acc[4 * n], acc[4 * n + 1], acc[4 * n + 2], acc[4 * n + 3]];
    if let Some(out) = dv.added() {
        add_rows_f32::<ON, 4>(
            |n| quad(&dv_acc, n),
            warp_key,
            rows_left,
            (out, cols, warp_col),
            (out_row0, AddMode::LoadAddStore),
        );
    }
    if let Some(out) = dk.added() {
        add_rows_f32::<ON, 4>(
            |n| quad(&dk_acc, n),
            warp_key,
            rows_left,
            (out, cols, warp_col),
            (out_row0, AddMode::LoadAddStore),
        );
    }
}

/// The member grid's turn counter of key block `n0 / BK` of key/value head `bkv` ([`MemberSum`]):
/// after the dQ turn counters in `turns`.
#[inline(always)]
fn member_counter<const BK: usize>(
    p: &AttentionShape,
    turns: SliceMut<u32>,
    bkv: u64,
    n0: u32,
) -> *mut u32 {
    let n_turns = p.seq_q.div_ceil(FLASH_BWD_PRE_ROWS as u32) * FLASH_BWD_PRE_ROWS as u32
        / FLASH_BWD_TURN_ROWS as u32;
    let at = (p.batch * p.heads) as u64 * n_turns as u64
        + bkv * p.seq_k.div_ceil(BK as u32) as u64
        + (n0 / BK as u32) as u64;
    check_index(at as usize, turns.len as usize);
    // SAFETY: inside `turns` (the host sizes it with a counter a key/value head's key block after
    // the dQ turns; checked builds re-check).
    unsafe { turns.ptr.add(at as usize) }
}

/// One of the member grid's sums ([`MemberSum`]), in this CTA's member's turn: member 0 stores
/// its rows (`acc`), the next ones add theirs, the last (`last`) takes the sums into `acc`.
/// `rows`: this warp's first row, the valid rows, the columns, the warp's first column and its
/// first row in the sums.
#[inline(always)]
fn member_sums<const ON: usize>(
    acc: &mut [f32; ON],
    sums: Option<SliceMut<f32>>,
    (member, last): (u32, bool),
    (warp_row, rows_left, cols, col0, out_row0): (u32, u32, u32, u32, u64),
) {
    let Some(sums) = sums else { return };
    if last {
        take_rows_f32::<ON>(acc, warp_row, rows_left, (sums, cols, col0), out_row0);
    } else {
        let mode = if member == 0 {
            AddMode::Store
        } else {
            AddMode::Reduce
        };
        add_rows_f32::<ON, 4>(
            |n| [acc[4 * n], acc[4 * n + 1], acc[4 * n + 2], acc[4 * n + 3]],
            warp_row,
            rows_left,
            (sums, cols, col0),
            (out_row0, mode),
        );
    }
}

/// One step's products before dQ with the head dim split ([`FlashWgBwdConfig::split_head`]: 64
/// keys, 64 queries, both warpgroups on the same keys): warpgroup `w` computes `S^T = K Q^T` and
/// `dP^T = V dO^T` for the step's queries `32 w..32 w + 32` (two `m64n32` chains over the whole
/// head dim), turns them into P^T and dS^T as the paired step does ([`p_and_ds`]: the softcap and
/// ALiBi with `SCORE`), and stores both, rounded, into its half of `pt_tile` and of the dS^T tile.
/// After one barrier both warpgroups read back the two tiles' fragments over all 64 queries. Then
/// `dV_w += P^T dO_i`, `dK_w += dS^T Q_i` on the warpgroup's columns (`D / 2`; with the uneven
/// split warpgroup 0 128, which it retires before returning, and warpgroup 1 64), issued and
/// committed (the caller's dQ wait retires what is still in flight). Returns with the dS^T tile
/// whole and fenced for the dQ product.
///
/// Why by queries: split by product (one warpgroup S^T, the other dP^T) the softmax and the dS^T
/// pass ran one after the other, each while the other warpgroup waited at a barrier of its own;
/// by queries both warpgroups do half of each at once, behind one barrier.
///
/// # Safety
/// Every thread of the CTA calls it at the same point of its step (one barrier); Q_i, dO_i, the
/// statistics and K, V landed and were fenced before a barrier the caller passed; the dS^T tile
/// and `pt_tile` have no reader left from earlier steps (the dQ product that read the tile retired,
/// and the read-backs of `pt_tile` happen before the caller's next barrier).
#[inline(always)]
#[allow(clippy::type_complexity)]
unsafe fn split_step<
    T,
    const D: usize,
    const HD: usize,
    const BK: usize,
    const BQ: usize,
    const ON: usize,
    const STAGES: usize,
    const SCORE: bool,
>(
    (k_tile, q_tiles, ds_tile, stage): (
        SwizzledTile<BK, D>,
        SwizzledTile<BQ, D>,
        SwizzledTile<BK, BQ>,
        u32,
    ),
    (stats, pt_tile): (u32, SwizzledTile<BK, BQ>),
    (c, qb, p, mods): (
        f32,
        QueryBounds,
        &AttentionShape,
        impl FnOnce(u32) -> ScoreMods,
    ),
    (wg_key, wg_col, uneven): (u32, u32, bool),
    (dv_acc, dk_acc): (&mut [f32; ON], &mut [f32; ON]),
) where
    T: Wgmma<[f32; ON]> + Wgmma<[f32; 32]> + Wgmma<[f32; 16]>,
    [f32; ON]: Accumulator,
    [f32; 32]: Accumulator,
    [f32; 16]: Accumulator,
{
    // (Instantiated by every kernel, run by the split ones only, whose config has BK = BQ = 64.)
    let tid = opaque_dep_u32(thread_idx_x(), stage);
    let (wg, tw) = (tid / 128, tid % 128);
    let t = tid % 4;
    let key_row = wg_key + 16 * (tw / 32) + (tid % 32) / 4;
    // This warpgroup's queries of the step (the N of its S^T and dP^T).
    let q0 = 32 * wg;
    let (qt, dot) = (q_tiles.stage(stage), q_tiles.stage(stage + STAGES as u32));
    let mut s = [0.0f32; 16];
    let mut dp = [0.0f32; 16];
    fence();
    unroll_lt!(kd < HD / 16, {
        // SAFETY: the whole warpgroup issues it; the tiles landed and were fenced (the caller's
        // contract); `s`, `dp` are untouched until the wait below.
        unsafe {
            T::mma_ss(
                &mut s,
                k_tile.desc_k_major(wg_key, kd as u32),
                qt.desc_k_major(q0, kd as u32),
                (kd > 0) as u32,
            );
            T::mma_ss(
                &mut dp,
                k_tile.stage(1).desc_k_major(wg_key, kd as u32),
                dot.desc_k_major(q0, kd as u32),
                (kd > 0) as u32,
            );
        }
    });
    commit();
    s.wait::<0>();
    dp.hold();
    dv_acc.hold();
    dk_acc.hold();
    // P^T and dS^T in place of S^T and dP^T; the cap's branch is uniform.
    let at = (q0 + 2 * t, stats, c);
    if !SCORE {
        p_and_ds::<BQ, false, false, 16>(&mut s, &mut dp, at, (qb, p), ScoreMods::NONE);
    } else if p.softcap_k != 0.0 {
        p_and_ds::<BQ, true, true, 16>(&mut s, &mut dp, at, (qb, p), mods(q0 + 2 * t));
    } else {
        p_and_ds::<BQ, false, true, 16>(&mut s, &mut dp, at, (qb, p), mods(q0 + 2 * t));
    }
    // SAFETY: one writer per word (this thread's fragment positions in its warpgroup's half); the
    // tiles' last readers retired or passed a barrier (the contract).
    unsafe {
        store_ds::<BK, BQ, 2>(pt_tile, &pack_p::<T, 16>(&s), key_row, q0 + 2 * t);
        store_ds::<BK, BQ, 2>(ds_tile, &pack_p::<T, 16>(&dp), key_row, q0 + 2 * t);
    }
    fence_proxy_async();
    sync_threads();
    // SAFETY: both halves written before the barrier above; `pt_tile` is not written until the
    // caller's next barrier, the dS^T tile not until the next step.
    let (pa, dsa) = unsafe {
        (
            load_ds::<BK, BQ>(pt_tile, key_row, 2 * t),
            load_ds::<BK, BQ>(ds_tile, key_row, 2 * t),
        )
    };
    // An uneven split (192 on the 256 tile): warpgroup 1 keeps 64 columns (`m64n64` into the first
    // 32 f32 of its accumulators; the rest stay zero, past the product columns the epilogue
    // stores), warpgroup 0 128 as two `m64n64` halves: the first beside warpgroup 1's, left in
    // flight, the second in a branch of its own that retires it (and the first) before leaving.
    // ptxas serialised every wgmma of the kernel when a branch's products stayed in flight past
    // it, and when the branch came before the common half.
    fence();
    if uneven {
        let (Some((dv_lo, dv_rest)), Some((dk_lo, dk_rest))) = (
            dv_acc.split_first_chunk_mut::<32>(),
            dk_acc.split_first_chunk_mut::<32>(),
        ) else {
            return;
        };
        unroll_lt!(ks < 4, {
            // SAFETY: as below.
            unsafe {
                T::mma_rs_tb(dv_lo, &pa[ks], dot.desc_mn_major_from(ks as u32, wg_col));
                T::mma_rs_tb(dk_lo, &dsa[ks], qt.desc_mn_major_from(ks as u32, wg_col));
            }
        });
        commit();
        if wg == 0 {
            if let (Some(dv_hi), Some(dk_hi)) = (
                dv_rest.first_chunk_mut::<32>(),
                dk_rest.first_chunk_mut::<32>(),
            ) {
                fence();
                unroll_lt!(ks < 4, {
                    // SAFETY: as below; retired just after.
                    unsafe {
                        let col = wg_col + 64;
                        T::mma_rs_tb(dv_hi, &pa[ks], dot.desc_mn_major_from(ks as u32, col));
                        T::mma_rs_tb(dk_hi, &dsa[ks], qt.desc_mn_major_from(ks as u32, col));
                    }
                });
                commit();
                dv_hi.wait::<0>();
                dk_hi.hold();
                dv_lo.hold();
                dk_lo.hold();
            }
        }
    } else {
        unroll_lt!(ks < 4, {
            // SAFETY: the whole warpgroup; the tiles landed and were fenced; the fragments and
            // accumulators are untouched until the caller's wait.
            unsafe {
                T::mma_rs_tb(dv_acc, &pa[ks], dot.desc_mn_major_from(ks as u32, wg_col));
                T::mma_rs_tb(dk_acc, &dsa[ks], qt.desc_mn_major_from(ks as u32, wg_col));
            }
        });
        commit();
    }
}

/// The ALiBi bias of the scored kernels in the backward's raw units: `P^T = exp2(w c - LSE2)` with
/// `c = scale log2 e` (signed: the backward does not negate Q; clamped away from 0 as the forward's
/// softmax clamps it, so that both see the same logits) and `w` the modified raw score, `w = k
/// tanh(s / k) - slope |pos - key|` with `slope = alibi log2 e / c` and the softcap's `k` from the
/// shape ([`AttentionShape::softcap_k`]: read from the parameters, no register).
#[derive(Clone, Copy)]
struct ScoreMods {
    slope: f32,
    /// `pos - key` of this thread's first key row and query offset 0 of its columns (entry `8 n +
    /// e % 2` of key row `e / 2` adds `8 n + e % 2 - 8 (e / 2)`).
    base: f32,
}

impl ScoreMods {
    const NONE: Self = Self {
        slope: 0.0,
        base: 0.0,
    };

    /// Of query head `bh` (its `batch * heads + head` index), for a thread whose first query
    /// column is query `q` of its sequence and whose first key is `key`; `diag` aligns them.
    #[inline(always)]
    fn of(
        p: &AttentionShape,
        st: &AttentionLayout,
        bh: u64,
        (q, key): (u32, u32),
        diag: i32,
    ) -> Self {
        // (u32: batch * heads < 2^32, and a u64 division is a subroutine call, whose saved
        // registers spilled D = 128.)
        let bh = bh as u32;
        let (b, h) = (bh / p.heads, bh % p.heads);
        // `alibi_slope` divides by |c|; the backward's raw units carry the scale's sign.
        let slope = alibi_slope(st, p, b, h);
        let slope = if p.scale < 0.0 { -slope } else { slope };
        Self {
            slope,
            base: (q as i32 + diag - key as i32) as f32,
        }
    }
}

/// The scored kernels' `c = scale log2 e`, its magnitude clamped away from 0 as the forward's.
#[inline(always)]
fn scored_c(p: &AttentionShape) -> f32 {
    let c = max(p.scale.abs() * LOG2_E, 1e-30);
    if p.scale < 0.0 { -c } else { c }
}

/// The modified score `w` of raw score `raw` (through the softcap with `CAP`, then ALiBi's bias of
/// `mods` with `ALIBI`, `off` the entry's `pos - key` past `mods.base`) as `(exp2(w c - lse2),
/// dw/ds)` (1 without the cap).
#[inline(always)]
fn modified_p<const CAP: bool, const ALIBI: bool>(
    raw: f32,
    off: f32,
    (lse2, c): (f32, f32),
    p: &AttentionShape,
    mods: ScoreMods,
) -> (f32, f32) {
    let (w, dw) = if CAP {
        let th = tanh(raw * p.softcap_inv_k);
        (p.softcap_k * th, fma(-th, th, 1.0))
    } else {
        (raw, 1.0)
    };
    let w = if ALIBI {
        fma(-mods.slope, abs(mods.base + off), w)
    } else {
        w
    };
    (exp2(fma(w, c, -lse2)), dw)
}

/// P^T and dS^T of `SN / 4 * 8` queries (a 64-query sub-block, or a split step's 32) in place of
/// S^T (`s`) and dP^T (`dp`): `P^T = exp2(w c - LSE2)`, `dS^T = P^T (dP^T - D) dw/ds`, entries
/// outside `qb` 0, with `w` the raw score through the softcap (`CAP`) and ALiBi's bias (`ALIBI`)
/// of `mods`, or the raw score itself. `col0`: this thread's first query column; `stats`: the
/// stage's LSE2 and D rows; `c = scale log2 e`.
#[inline(always)]
fn p_and_ds<const BQ: usize, const CAP: bool, const ALIBI: bool, const SN: usize>(
    s: &mut [f32; SN],
    dp: &mut [f32; SN],
    (col0, stats, c): (u32, u32, f32),
    (qb, p): (QueryBounds, &AttentionShape),
    mods: ScoreMods,
) {
    unroll_lt!(n < SN / 4, {
        let col = col0 + (8 * n) as u32;
        // SAFETY: 8-byte aligned (even column) inside the stage; landed before the barrier.
        let (lse2, delta) = unsafe {
            (
                ld_shared_v2_f32(stats + 4 * col),
                ld_shared_v2_f32(stats + 4 * (BQ as u32 + col)),
            )
        };
        unroll!(e in [0, 1, 2, 3] {
            let off = (8 * n + e % 2) as f32 - (8 * (e / 2)) as f32;
            let (pv, dw) = modified_p::<CAP, ALIBI>(s[4 * n + e], off, (lse2[e % 2], c), p, mods);
            let qq = (col + (e % 2) as u32) as i32;
            let keep = qq >= qb.first[e / 2] && qq <= qb.last[e / 2];
            let pv = if keep { pv } else { 0.0 };
            s[4 * n + e] = pv;
            let ds = pv * (dp[4 * n + e] - delta[e % 2]);
            dp[4 * n + e] = if CAP { ds * dw } else { ds };
        });
    });
}

/// Stores this thread's dS^T (or P^T) fragments (`dsa[ks]`, `KS` k-steps of 16 queries) into a
/// `BK x BQ` tile (rows = keys, columns = queries): word (r, h) of step ks is row `key_row + 8 r`,
/// columns `col0 + 16 ks + 8 h`, +1 (`col0` even).
///
/// # Safety
/// No other thread accesses these words until a barrier after the stores, and no wgmma reads the
/// tile until a `fence_proxy_async` and a barrier after them.
#[inline(always)]
unsafe fn store_ds<const BK: usize, const BQ: usize, const KS: usize>(
    ds_tile: SwizzledTile<BK, BQ>,
    dsa: &[[u32; 4]; 16],
    key_row: u32,
    col0: u32,
) {
    unroll_lt!(ks < KS, {
        let col = col0 + (16 * ks) as u32;
        // SAFETY: 4-byte aligned (even column) inside the tile; the caller's contract.
        unsafe {
            u32::st_shared(ds_tile.elem_addr(key_row, col), dsa[ks][0]);
            u32::st_shared(ds_tile.elem_addr(key_row + 8, col), dsa[ks][1]);
            u32::st_shared(ds_tile.elem_addr(key_row, col + 8), dsa[ks][2]);
            u32::st_shared(ds_tile.elem_addr(key_row + 8, col + 8), dsa[ks][3]);
        }
    });
}

/// Reads back the fragments [`store_ds`] stores (the A fragments of 4 k-steps of 16 queries, in
/// the first 4 entries).
///
/// # Safety
/// The words were written before a barrier this thread passed and are not written again until
/// this thread's next barrier.
#[inline(always)]
unsafe fn load_ds<const BK: usize, const BQ: usize>(
    tile: SwizzledTile<BK, BQ>,
    key_row: u32,
    col0: u32,
) -> [[u32; 4]; 16] {
    let mut frags = [[0u32; 4]; 16];
    unroll_lt!(ks < 4, {
        let col = col0 + (16 * ks) as u32;
        // SAFETY: 4-byte aligned (even column) inside the tile; the caller's contract.
        unsafe {
            frags[ks] = [
                u32::ld_shared(tile.elem_addr(key_row, col)),
                u32::ld_shared(tile.elem_addr(key_row + 8, col)),
                u32::ld_shared(tile.elem_addr(key_row, col + 8)),
                u32::ld_shared(tile.elem_addr(key_row + 8, col + 8)),
            ]
        };
    });
    frags
}

/// Issues (fence, products, commit) this warpgroup's dQ half `dq = dS K`: query rows `dq_row0..`
/// of the dS^T tile (A, MN-major) times columns `dq_col0..` of the K tile (B, MN-major), over all
/// `BK` keys, unscaled; the caller waits.
///
/// # Safety
/// The whole warpgroup calls it; both tiles were written and fenced (`fence_proxy_async`) before
/// a barrier the caller passed, and are not written until the caller's wait; `dq` is not touched
/// until then.
#[inline(always)]
unsafe fn issue_dq<T, const BK: usize, const D: usize, const BQ: usize, const QN: usize>(
    dq: &mut [f32; QN],
    ds_tile: SwizzledTile<BK, BQ>,
    k_tile: SwizzledTile<BK, D>,
    dq_row0: u32,
    dq_col0: u32,
) where
    T: Wgmma<[f32; QN]>,
{
    fence();
    unroll_lt!(ks < BK / 16, {
        // SAFETY: the caller's contract.
        unsafe {
            T::mma_ss_tt(
                dq,
                ds_tile.desc_mn_major_from(ks as u32, dq_row0),
                k_tile.desc_mn_major_from(ks as u32, dq_col0),
                (ks > 0) as u32,
            )
        };
    });
    commit();
}

/// Zeroes `tile` (all `TH` threads of the CTA; the caller's next barrier, after a
/// `fence_proxy_async` the top of the loop makes, orders the stores before any wgmma read).
#[inline(always)]
fn zero_tile<const ROWS: usize, const COLS: usize, const TH: usize>(
    tile: SwizzledTile<ROWS, COLS>,
) {
    let chunks_per_row = (COLS / 8) as u32;
    const { assert!((ROWS * COLS / 8) % TH == 0) };
    unroll_lt!(i < ROWS * COLS / 8 / TH, {
        let c = thread_idx_x() + (i * TH) as u32;
        // SAFETY: an aligned chunk of the tile; each chunk has one writer, and nothing reads the
        // tile before the barrier at the top of the loop.
        unsafe {
            st_shared_v4(
                tile.chunk_addr(c / chunks_per_row, c % chunks_per_row),
                [0; 4],
            )
        };
    });
}

/// Where a CTA's partial dQ blocks go and in which order: the f32 accumulator, the turn counters
/// (`n_turns` a head, `turn_step` a query block, one a warp), the head, and the dQ order flags
/// (`DQ_*`).
#[derive(Clone, Copy)]
struct DqSink {
    acc: SliceMut<f32>,
    turns: SliceMut<u32>,
    bh: u64,
    /// The accumulator's rows a head (the shape's `seq_q`: a packed batch's longest sequence).
    rows: u32,
    /// This batch entry's query rows.
    sq: u32,
    n_turns: u32,
    turn_step: u32,
    order: u32,
}

impl DqSink {
    fn ordered(&self) -> bool {
        self.order & DQ_ORDERED != 0
    }

    /// Whether a warp releases its turn on a block one step after its additions
    /// (`DQ_LATE_RELEASE`): the caller then calls [`Self::release`] before the warp's next turn.
    fn late(&self) -> bool {
        self.ordered() && self.order & DQ_LATE_RELEASE != 0
    }

    /// The turn counter of warp `warp` on query block `i`.
    fn counter(&self, i: u32, warp: u32) -> *mut u32 {
        let at = (self.bh * self.n_turns as u64) as usize + (i * self.turn_step + warp) as usize;
        check_index(at, self.turns.len as usize);
        // SAFETY: the counter of this warp in this head's block i, in `turns` (launcher-sized:
        // block_q / 8 >= 8 counters a block, config asserts; checked builds re-check).
        unsafe { self.turns.ptr.add(at) }
    }

    /// This warp's part of query block `i`'s dQ half (thread `tid`), added at turn `turn`
    /// (`KeyBlockWalk::turn_at`; without `DQ_ORDERED` as soon as it is ready, in whatever order
    /// the CTAs arrive): the same warp of the `turn` key blocks ahead of this one has added its
    /// part (see flash_bwd.rs's module doc; each warp adds a part of the block no other warp of
    /// the CTA touches, behind a counter of its own). The turn is released right after the
    /// additions, or with `DQ_LATE_RELEASE` by the caller's later [`Self::release`] (unless
    /// `release_now`). Every lane polls the same word, so the warp leaves the wait together.
    #[inline(always)]
    fn add<const QN: usize>(
        &self,
        dq: &[f32; QN],
        i: u32,
        turn: u32,
        tid: u32,
        cfg: FlashWgBwdConfig,
        release_now: bool,
    ) {
        self.wait(i, turn, tid);
        self.add_waited(dq, i, tid, cfg, release_now);
    }

    /// The wait of [`Self::add`] alone: until warp `tid / 32`'s turn `turn` on block `i` has
    /// come (nothing without `DQ_ORDERED`).
    #[inline(always)]
    fn wait(&self, i: u32, turn: u32, tid: u32) {
        if self.ordered() {
            // SAFETY: a live counter.
            unsafe { wait_for_turn(self.counter(i, tid / 32), turn) };
            sync_warp(FULL_MASK);
        }
    }

    /// The rest of [`Self::add`], after [`Self::wait`]: the additions and the release.
    #[inline(always)]
    fn add_waited<const QN: usize>(
        &self,
        dq: &[f32; QN],
        i: u32,
        tid: u32,
        cfg: FlashWgBwdConfig,
        release_now: bool,
    ) {
        let (wg, warp) = (tid / 128, tid / 32);
        let dq_row0 = 64 * (wg % cfg.dq_row_splits() as u32);
        // With the head dim split, the share's last part (`Self::add_part` added a first one at
        // D = 256).
        let dq_col0 = if cfg.split_head {
            (cfg.dq_col0_of(wg as usize) + 64 * (cfg.dq_parts_of(wg as usize) - 1)) as u32
        } else {
            64 * (wg / cfg.dq_row_splits() as u32)
        };
        let counter = self.counter(i, warp);
        let row0 = i * cfg.block_q as u32 + dq_row0 + 16 * (warp % 4);
        add_dq_half(
            dq,
            (self.acc, self.bh, self.rows),
            self.sq,
            (row0, dq_col0),
            (cfg.head_dim, cfg.cols),
            cfg.defer_dq,
        );
        // Every lane's additions, then the release (cumulative over the warp barrier).
        sync_warp(FULL_MASK);
        if self.ordered() && (release_now || !self.late()) && tid % 32 == 0 {
            // SAFETY: as above.
            unsafe { add_release_u32(counter, 1) };
        }
    }

    /// Adds this warp's part of the first 64 x 64 part of block `i`'s dQ share (the head dim
    /// split), from column `col0`, inside the turn [`Self::wait`] took; [`Self::add_waited`] adds
    /// the second and releases the turn.
    #[inline(always)]
    fn add_part<const QN: usize>(
        &self,
        dq: &[f32; QN],
        i: u32,
        tid: u32,
        cfg: FlashWgBwdConfig,
        col0: u32,
    ) {
        let row0 = i * cfg.block_q as u32 + 16 * (tid / 32 % 4);
        add_dq_half(
            dq,
            (self.acc, self.bh, self.rows),
            self.sq,
            (row0, col0),
            (cfg.head_dim, cfg.cols),
            cfg.defer_dq,
        );
    }

    /// Releases every warp's turn on block `i` at once, from thread 0 ([`Self::late`] only): one
    /// fence, then the eight counters. The caller passed a CTA barrier after every warp's
    /// additions to block `i`, so the fence orders them all (release is cumulative). Each warp
    /// releasing its own turn stalled every warp in a `MEMBAR` once a step (docs/PERF_NOTES.md).
    #[inline(always)]
    fn release_cta(&self, i: u32, tid: u32) {
        if tid == 0 {
            fence_acq_rel_gpu();
            unroll_lt!(w < 8, {
                // SAFETY: a live counter (as in `Self::counter`).
                unsafe { add_relaxed_u32(self.counter(i, w as u32), 1) };
            });
        }
    }

    /// Releases warp `tid / 32`'s turn on block `i`, whose additions it made earlier (after a
    /// warp barrier, so the release covers every lane's; [`Self::late`] only).
    #[inline(always)]
    fn release(&self, i: u32, tid: u32) {
        let counter = self.counter(i, tid / 32);
        if tid % 32 == 0 {
            // SAFETY: a live counter; the warp barrier after the additions orders them first.
            unsafe { add_release_u32(counter, 1) };
        }
    }
}

/// Adds this thread's share of a warp's 16 rows of a 64 x `2 QN` dQ part (wgmma accumulator layout:
/// `dq[4n], dq[4n + 1]` row g, columns 8n + 2t, +1; `dq[4n + 2], dq[4n + 3]` row g + 8) to the
/// f32 accumulator (`rows` rows a head, of which the first `sq` are this sequence's). `row0` = the
/// warp's first query row in the head, `col0` = the part's first column; the accumulator's rows are
/// `d` f32 (the tile's width), of which the first `cols` are the products' (the columns past them,
/// zeros, are not added). Either way a warp's additions of an 8-column block cover 16 whole
/// 32-byte sectors:
/// - `in_pairs` (the deferred order: the dense D32 and D64 kernels): each pair where it lies, 8
///   bytes an instruction. Their additions run while the tensor cores compute the next S^T and
///   dP^T, and the fewer instructions took 5.7%-7.5% off D32's forward + backward.
/// - else: 16 bytes an instruction. Lanes t and t ^ 1 trade halves, so the even lane adds row g,
///   columns 8n + 4 (t / 2)..+4, and the odd lane row g + 8. In the plain order the pairs gained
///   nothing measurable (D96 +1.4%), and the general kernels spilled with them
///   (docs/PERF_NOTES.md).
#[inline(always)]
fn add_dq_half<const QN: usize>(
    dq: &[f32; QN],
    (acc, bh, rows): (SliceMut<f32>, u64, u32),
    sq: u32,
    (row0, col0): (u32, u32),
    (d, cols): (usize, usize),
    in_pairs: bool,
) {
    let (g, t) = (lane_id() / 4, lane_id() % 4);
    // (`cols` is the tile's in all but the 96 kernel, whose test is one compare.)
    let col_in = |n: usize| cols == d || col0 + ((8 * n) as u32) < cols as u32;
    if in_pairs {
        // Each 8-column block of the accumulator holds this thread's columns `2 t, 2 t + 1` in rows
        // g and g + 8: added where they lie, two floats at a time.
        unroll_lt!(half < 2, {
            let row = row0 + g + (8 * half) as u32;
            if row < sq {
                let base = (bh * rows as u64 + row as u64) * d as u64 + (col0 + 2 * t) as u64;
                unroll_lt!(n < QN / 4, {
                    if col_in(n) {
                        let at = base + (8 * n) as u64;
                        check_index(at as usize + 1, acc.len as usize);
                        // SAFETY: row < seq_q of this head and col + 1 < D: inside the accumulator
                        // (launcher-sized, checked builds re-check), 8-byte aligned (col even,
                        // rows of D f32, aligned base); one thread adds each element, and the turn
                        // counter orders the blocks that add to it.
                        unsafe {
                            red_add_v2_f32(
                                acc.ptr.add(at as usize),
                                [dq[4 * n + 2 * half], dq[4 * n + 2 * half + 1]],
                            )
                        };
                    }
                });
            }
        });
        return;
    }
    let odd = t % 2 == 1;
    let row = row0 + g + if odd { 8 } else { 0 };
    let base = (bh * rows as u64 + row as u64) * d as u64 + (col0 + 4 * (t / 2)) as u64;
    unroll_lt!(n < QN / 4, {
        let a = &dq[4 * n..4 * n + 4];
        // What the partner lane needs: the even lane sends its row g + 8, the odd lane its row g.
        let (s0, s1) = if odd { (a[0], a[1]) } else { (a[2], a[3]) };
        let (r0, r1) = (shfl_xor_f32(s0, 1), shfl_xor_f32(s1, 1));
        let v = if odd {
            [r0, r1, a[2], a[3]]
        } else {
            [a[0], a[1], r0, r1]
        };
        if row < sq && col_in(n) {
            let at = base + 8 * n as u64;
            check_index(at as usize + 3, acc.len as usize);
            // SAFETY: as above, 16-byte aligned (col a multiple of 4).
            unsafe { red_add_v4_f32(acc.ptr.add(at as usize), v) };
        }
    });
}

/// The config's [`FlashWgBwdConfig::paired_sub_blocks`] (checked against `SUBS`).
const fn cfg_subs<const D: usize, const GENERAL: bool, const SCORE: bool>() -> usize {
    match flash_wg_bwd_config_of(D, GENERAL, SCORE) {
        Some(c) => c.paired_sub_blocks(),
        None => 0,
    }
}

/// The config for product columns `HD` on `D`-wide tiles, checked against the kernel's const
/// parameters (evaluated at compile time).
const fn checked_config<
    const D: usize,
    const HD: usize,
    const BK: usize,
    const BQ: usize,
    const ON: usize,
    const QN: usize,
    const STAGES: usize,
    const GENERAL: bool,
    const SCORE: bool,
>() -> FlashWgBwdConfig {
    let Some(cfg) = flash_wg_bwd_config_of(HD, GENERAL, SCORE) else {
        panic!("no wgmma FlashAttention backward config for this head dim")
    };
    assert!(cfg.head_dim == D && cfg.cols == HD && (HD == D || !GENERAL));
    assert!(cfg.block_k == BK && cfg.block_q == BQ && cfg.threads() == 256);
    assert!(ON == cfg.wg_cols() / 2 && BQ % 64 == 0 && BQ <= 128);
    assert!(QN == cfg.dq_part_cols() / 2 && (QN == 32 || !cfg.split_head));
    // A dQ share of two 64 x 64 parts (128 columns) only with the head dim split, which does not
    // defer dQ (the non-deferred step adds the parts one after the other); the scored kernels
    // walk the general way.
    assert!((cfg.dq_parts() == 1 || cfg.split_head) && !(cfg.split_head && cfg.defer_dq));
    assert!(!cfg.split_head || cfg.wg_cols() == 64 * cfg.dq_parts());
    // The uneven split's roles, which `split_step` and the loop spell out (warpgroup 0: 128
    // columns as two `m64n64` halves and one dQ part; warpgroup 1: 64 columns from 128, the first
    // 32 f32 of its accumulators, and two dQ parts from 0).
    assert!(!cfg.uneven_split() || (cfg.wg_cols_of(1) == 64 && ON == 64 && !GENERAL && !SCORE));
    assert!(
        !cfg.uneven_split()
            || (cfg.wg_cols_of(0) == 128
                && cfg.wg_col0(1) == 128
                && cfg.dq_parts_of(0) == 1
                && cfg.dq_parts_of(1) == 2
                && cfg.dq_col0_of(1) == 0)
    );
    assert!(GENERAL || !SCORE);
    assert!(cfg.stages == STAGES);
    let planned = 2 * SwizzledTile::<BK, D>::BYTES
        + 2 * STAGES * SwizzledTile::<BQ, D>::BYTES
        + 2 * SwizzledTile::<BK, BQ>::BYTES
        + STAGES * 2 * BQ * 4;
    assert!(planned == cfg.smem_bytes());
    cfg
}

/// Writes this warp's 16 rows of `acc` (wgmma accumulator layout, rounded to `T`) to rows
/// `out_row0..` of `out`, staged through the warp's own rows of `staging` for 16-byte stores.
/// `rows_left` = valid rows from the CTA's first row (`warp_row` is the warp's first row in the
/// block). The caller has ended every read of `staging` (products retired, block barrier).
#[inline(always)]
fn store_rows<T: MmaElem, const BK: usize, const D: usize, const ON: usize>(
    acc: &[f32; ON],
    staging: SwizzledTile<BK, D>,
    (warp_row, warp_col): (u32, u32),
    rows_left: u32,
    out: HeadRowsMut<T>,
    block_row0: u32,
) {
    let (g, t) = (lane_id() / 4, lane_id() % 4);
    sync_warp(FULL_MASK);
    unroll_lt!(n < ON / 4, {
        let col = warp_col + (8 * n) as u32 + 2 * t;
        let a = &acc[4 * n..4 * n + 4];
        // SAFETY: 4-byte aligned addresses (even column) inside the tile; only this warp touches
        // its rows from here on.
        unsafe {
            u32::st_shared(staging.elem_addr(warp_row + g, col), T::pack2(a[0], a[1]));
            u32::st_shared(
                staging.elem_addr(warp_row + g + 8, col),
                T::pack2(a[2], a[3]),
            );
        }
    });
    sync_warp(FULL_MASK);
    let chunks_per_row = (2 * ON / 8) as u32;
    const { assert!((16 * 2 * ON / 8) % 32 == 0) };
    unroll_lt!(i < 16 * 2 * ON / 8 / 32, {
        let c = lane_id() + 32 * i as u32;
        let (r, chunk) = (c / chunks_per_row, warp_col / 8 + c % chunks_per_row);
        if warp_row + r < rows_left && out.has_chunk(chunk) {
            // SAFETY: the row is < seq_k of this head (checked just above), so the chunk lies in
            // the head's rows (launcher-validated strides, 16-byte aligned); each chunk has one
            // writer.
            unsafe {
                let words = ld_shared_v4(staging.chunk_addr(warp_row + r, chunk));
                store_chunk(
                    out.at(block_row0 + warp_row + r, 8 * chunk) as *mut Chunk16,
                    0,
                    Chunk16(words),
                )
            };
        }
    });
}

macro_rules! flash_wg_bwd_entry_points {
    ($($name:ident: $t:ty, $out:ty, $cfg:path, $general:expr, $window:expr, $score:expr, $exact:expr;)*) => {$(
        /// FlashAttention backward main kernel on wgmma (sm_90a); launch with grid (key blocks,
        /// heads, batch), 256 threads and the shared memory of its config, after the pre-pass.
        /// `order`: how the dQ blocks are walked and summed (`DQ_*` flags; without `DQ_ORDERED`
        /// in arrival order, the explicit nondeterministic mode). The `_general_` kernels take a
        /// packed (variable-length) batch, a head dim narrower than the tile and (not the f32-adding
        /// ones) a sliding window, the `_packed_` ones a packed batch at the tile's head dim with no
        /// window, the `_scored_` ones also the softcap and ALiBi slopes; the others a dense batch
        /// at the tile's head dim.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(
            q: Slice<$t>, k: Slice<$t>, v: Slice<$t>, d_o: Slice<$t>, stats: Slice<f32>,
            dq_acc: SliceMut<f32>, turns: SliceMut<u32>, dk: $out, dv: $out,
            shape: AttentionShape, order: u32, strides: AttentionLayout,
        ) {
            const C: FlashWgBwdConfig = $cfg;
            unsafe {
                flash_wg_bwd::<$t, { C.head_dim }, { C.cols }, { C.block_k }, { C.block_q },
                    { C.wg_cols() / 2 }, { C.dq_part_cols() / 2 }, { C.stages },
                    { C.paired_sub_blocks() }, $general, $window, $score, $exact, $out>(
                    q, k, v, d_o, stats, dq_acc, turns, dk, dv, shape, order, strides,
                )
            }
        }
        crate::launch_bounds!($name, { $cfg.threads() }, 1);
    )*};
}

flash_wg_bwd_entry_points! {
    // Head dims 32, 96 and 192 on the 64, 128 and 256 tiles, products over their own columns (dense batches
    // at exactly that head dim; no f32-adding form: the accumulating backward takes the general
    // kernels there).
    flash_wg_bwd_d32_f16: F16, SliceMut<F16>, FLASH_WG_BWD_D32, false, false, false, false;
    flash_wg_bwd_d32_bf16: BF16, SliceMut<BF16>, FLASH_WG_BWD_D32, false, false, false, false;
    flash_wg_bwd_d96_f16: F16, SliceMut<F16>, FLASH_WG_BWD_D96, false, false, false, false;
    flash_wg_bwd_d96_bf16: BF16, SliceMut<BF16>, FLASH_WG_BWD_D96, false, false, false, false;
    // Head dim 192 on the 256 tile, the head dim split unevenly (`FlashWgBwdConfig::uneven_split`).
    flash_wg_bwd_d192_f16: F16, SliceMut<F16>, FLASH_WG_BWD_D192, false, false, false, false;
    flash_wg_bwd_d192_bf16: BF16, SliceMut<BF16>, FLASH_WG_BWD_D192, false, false, false, false;
    flash_wg_bwd_d64_f16: F16, SliceMut<F16>, FLASH_WG_BWD_D64, false, false, false, false;
    flash_wg_bwd_d64_bf16: BF16, SliceMut<BF16>, FLASH_WG_BWD_D64, false, false, false, false;
    flash_wg_bwd_d128_f16: F16, SliceMut<F16>, FLASH_WG_BWD_D128, false, false, false, false;
    flash_wg_bwd_d128_bf16: BF16, SliceMut<BF16>, FLASH_WG_BWD_D128, false, false, false, false;
    flash_wg_bwd_d256_f16: F16, SliceMut<F16>, FLASH_WG_BWD_D256, false, false, false, false;
    flash_wg_bwd_d256_bf16: BF16, SliceMut<BF16>, FLASH_WG_BWD_D256, false, false, false, false;
    // Grouped-query heads under the causal mask: a CTA a query head, the group's dK and dV summed
    // in member order through f32 sums, the last member storing them rounded (`MemberSum`).
    // D = 128 only: at 64 ptxas serialised the member grid's wgmma, at 256 it spilled 28 bytes.
    flash_wg_bwd_members_d128_f16: F16, MemberSum<F16>, FLASH_WG_BWD_D128, false, false, false, false;
    flash_wg_bwd_members_d128_bf16: BF16, MemberSum<BF16>, FLASH_WG_BWD_D128, false, false, false, false;
    // dK and dV added into f32 accumulators (ring attention's steps).
    flash_wg_bwd_add_d64_f16: F16, AddF32, FLASH_WG_BWD_D64, false, false, false, false;
    flash_wg_bwd_add_d64_bf16: BF16, AddF32, FLASH_WG_BWD_D64, false, false, false, false;
    flash_wg_bwd_add_d128_f16: F16, AddF32, FLASH_WG_BWD_D128, false, false, false, false;
    flash_wg_bwd_add_d128_bf16: BF16, AddF32, FLASH_WG_BWD_D128, false, false, false, false;
    flash_wg_bwd_add_d256_f16: F16, AddF32, FLASH_WG_BWD_D256, false, false, false, false;
    flash_wg_bwd_add_d256_bf16: BF16, AddF32, FLASH_WG_BWD_D256, false, false, false, false;
    // Packed (variable-length) batches (`flash_backward_varlen`), head dims narrower than the
    // tile and windows; the f32-adding forms without windows (ring attention takes none, and the
    // window's bounds would spill D = 128's registers there).
    flash_wg_bwd_general_d64_f16: F16, SliceMut<F16>, FLASH_WG_BWD_D64_GENERAL, true, true, false, false;
    flash_wg_bwd_general_d64_bf16: BF16, SliceMut<BF16>, FLASH_WG_BWD_D64_GENERAL, true, true, false, false;
    flash_wg_bwd_general_d128_f16: F16, SliceMut<F16>, FLASH_WG_BWD_D128, true, true, false, false;
    flash_wg_bwd_general_d128_bf16: BF16, SliceMut<BF16>, FLASH_WG_BWD_D128, true, true, false, false;
    flash_wg_bwd_general_d256_f16: F16, SliceMut<F16>, FLASH_WG_BWD_D256, true, true, false, false;
    flash_wg_bwd_general_d256_bf16: BF16, SliceMut<BF16>, FLASH_WG_BWD_D256, true, true, false, false;
    flash_wg_bwd_general_add_d64_f16: F16, AddF32, FLASH_WG_BWD_D64_GENERAL, true, false, false, false;
    flash_wg_bwd_general_add_d64_bf16: BF16, AddF32, FLASH_WG_BWD_D64_GENERAL, true, false, false, false;
    flash_wg_bwd_general_add_d128_f16: F16, AddF32, FLASH_WG_BWD_D128, true, false, false, false;
    flash_wg_bwd_general_add_d128_bf16: BF16, AddF32, FLASH_WG_BWD_D128, true, false, false, false;
    flash_wg_bwd_general_add_d256_f16: F16, AddF32, FLASH_WG_BWD_D256, true, false, false, false;
    flash_wg_bwd_general_add_d256_bf16: BF16, AddF32, FLASH_WG_BWD_D256, true, false, false, false;
    // Packed batches at the tile's head dim with no window (`flash_backward_varlen`'s common call):
    // the general walk with the column tests and the window's band folded away.
    flash_wg_bwd_packed_d64_f16: F16, SliceMut<F16>, FLASH_WG_BWD_D64_GENERAL, true, false, false, true;
    flash_wg_bwd_packed_d64_bf16: BF16, SliceMut<BF16>, FLASH_WG_BWD_D64_GENERAL, true, false, false, true;
    flash_wg_bwd_packed_d128_f16: F16, SliceMut<F16>, FLASH_WG_BWD_D128, true, false, false, true;
    flash_wg_bwd_packed_d128_bf16: BF16, SliceMut<BF16>, FLASH_WG_BWD_D128, true, false, false, true;
    // The softcap and ALiBi: kernels of their own, so that the calls without them keep the
    // general kernels' registers and code. D = 128 splits the head dim (FLASH_WG_BWD_D128_SCORED:
    // on the 128-key pairing the slope, the distance and the cap's derivative spilled 56-224
    // bytes).
    flash_wg_bwd_scored_d64_f16: F16, SliceMut<F16>, FLASH_WG_BWD_D64_GENERAL, true, true, true, false;
    flash_wg_bwd_scored_d64_bf16: BF16, SliceMut<BF16>, FLASH_WG_BWD_D64_GENERAL, true, true, true, false;
    flash_wg_bwd_scored_d128_f16: F16, SliceMut<F16>, FLASH_WG_BWD_D128_SCORED, true, true, true, false;
    flash_wg_bwd_scored_d128_bf16: BF16, SliceMut<BF16>, FLASH_WG_BWD_D128_SCORED, true, true, true, false;
    flash_wg_bwd_scored_d256_f16: F16, SliceMut<F16>, FLASH_WG_BWD_D256, true, true, true, false;
    flash_wg_bwd_scored_d256_bf16: BF16, SliceMut<BF16>, FLASH_WG_BWD_D256, true, true, true, false;
}
