//! Block-wide reductions: each warp reduces with shuffles, warp results meet in 32 shared slots, and every
//! warp then reduces those slots itself (no third barrier to broadcast). The combination order is fixed by
//! thread and warp index, so the result has the same bits on every run.
//!
//! Every thread of the block must call these (they contain barriers), and the block size must be a
//! multiple of 32.
use crate::dev::{sync::sync_threads, thread, warp};

crate::static_shared!(fn scratch() -> [f32; 32] as BLOCK_REDUCE_SCRATCH);

#[inline(always)]
fn combine(v: f32, identity: f32, warp_op: impl Fn(f32) -> f32) -> f32 {
    let partial = warp_op(v);
    let slots = scratch();
    // Barrier first: a previous reduction's readers may still be reading the slots.
    sync_threads();
    if thread::lane_id() == 0 {
        slots.store(thread::warp_id() as usize, partial);
    }
    sync_threads();
    let warps = thread::block_dim_x() / 32;
    let lane = thread::lane_id();
    let mine = if lane < warps {
        slots.load(lane as usize)
    } else {
        identity
    };
    warp_op(mine)
}

/// Sum over the block, returned in every thread.
#[inline(always)]
pub fn reduce_sum(v: f32) -> f32 {
    combine(v, 0.0, warp::reduce_sum)
}

/// Maximum over the block (NaN-propagating), returned in every thread.
#[inline(always)]
pub fn reduce_max(v: f32) -> f32 {
    combine(v, f32::NEG_INFINITY, warp::reduce_max)
}

crate::static_shared!(fn scratch4() -> [f32; 128] as BLOCK_REDUCE_SCRATCH4);

/// Four independent sums over the block at once (two barriers for all four), returned in every
/// thread. Same fixed combination order as [`reduce_sum`]: the same bits on every run.
#[inline(always)]
pub fn reduce_sum4(v: [f32; 4]) -> [f32; 4] {
    let slots = scratch4();
    let mut partial = [0.0f32; 4];
    crate::unroll!(k in [0, 1, 2, 3] {
        partial[k] = warp::reduce_sum(v[k]);
    });
    sync_threads();
    let (lane, warp_id) = (thread::lane_id() as usize, thread::warp_id() as usize);
    if lane == 0 {
        crate::unroll!(k in [0, 1, 2, 3] {
            slots.store(k * 32 + warp_id, partial[k]);
        });
    }
    sync_threads();
    let warps = (thread::block_dim_x() / 32) as usize;
    let mut out = [0.0f32; 4];
    crate::unroll!(k in [0, 1, 2, 3] {
        let mine = if lane < warps { slots.load(k * 32 + lane) } else { 0.0 };
        out[k] = warp::reduce_sum(mine);
    });
    out
}
