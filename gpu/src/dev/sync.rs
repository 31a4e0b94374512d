//! Barriers. `sync_threads` is `bar.sync 0`: every thread of the block must reach it (never call it under
//! a branch that only some threads take), and it orders their shared-memory accesses.

#[inline(always)]
pub fn sync_threads() {
    // SAFETY: a block-wide barrier; callers keep it on a path all threads of the block take.
    unsafe { core::arch::nvptx::_syncthreads() }
}

/// Warp-level barrier for the lanes in `mask`.
#[inline(always)]
pub fn sync_warp(mask: u32) {
    // SAFETY: only synchronises the named lanes.
    unsafe { core::arch::asm!("bar.warp.sync {0};", in(reg32) mask, options(nostack)) }
}
