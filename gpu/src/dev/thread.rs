//! Thread, block and grid indices.
//!
//! A launch is a grid of blocks; a block is up to 1024 threads run by warps of 32 on one SM. A thread's
//! global linear index in a 1-D launch is `block_idx * block_dim + thread_idx`, computed in 64 bits here so
//! tensors past 2^32 elements index correctly.
use core::arch::nvptx;

#[inline(always)]
pub fn thread_idx_x() -> u32 {
    // SAFETY: reads a special register; no memory is touched.
    unsafe { nvptx::_thread_idx_x() as u32 }
}
#[inline(always)]
pub fn block_idx_x() -> u32 {
    // SAFETY: as above.
    unsafe { nvptx::_block_idx_x() as u32 }
}
#[inline(always)]
pub fn block_idx_y() -> u32 {
    // SAFETY: as above.
    unsafe { nvptx::_block_idx_y() as u32 }
}
#[inline(always)]
pub fn block_idx_z() -> u32 {
    // SAFETY: as above.
    unsafe { nvptx::_block_idx_z() as u32 }
}
#[inline(always)]
pub fn block_dim_x() -> u32 {
    // SAFETY: as above.
    unsafe { nvptx::_block_dim_x() as u32 }
}
#[inline(always)]
pub fn grid_dim_x() -> u32 {
    // SAFETY: as above.
    unsafe { nvptx::_grid_dim_x() as u32 }
}
/// Global linear index of this thread in a 1-D launch, in 64 bits.
#[inline(always)]
pub fn global_index_x() -> u64 {
    block_idx_x() as u64 * block_dim_x() as u64 + thread_idx_x() as u64
}
/// Total threads of a 1-D launch, in 64 bits (the grid-stride step).
#[inline(always)]
pub fn grid_threads_x() -> u64 {
    grid_dim_x() as u64 * block_dim_x() as u64
}
/// Lane of this thread in its warp (0..32).
#[inline(always)]
pub fn lane_id() -> u32 {
    thread_idx_x() & 31
}
/// Warp of this thread in its block.
#[inline(always)]
pub fn warp_id() -> u32 {
    thread_idx_x() >> 5
}
