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

/// `bar.sync id, threads`: a barrier for the `threads` threads (a multiple of 32) that name barrier
/// `id` (1..16; 0 is [`sync_threads`]'s): one warpgroup of a warp-specialised kernel synchronises
/// without stopping the others. Orders the shared-memory accesses of the threads taking part.
///
/// # Safety
/// Exactly `threads` threads, whole warps, reach barrier `id` each time it is used, and no other
/// use of `id` with another count overlaps.
#[inline(always)]
pub unsafe fn named_barrier(id: u32, threads: u32) {
    // SAFETY: the caller's.
    unsafe {
        core::arch::asm!("bar.sync {0}, {1};", in(reg32) id, in(reg32) threads, options(nostack))
    }
}

/// `bar.arrive id, threads`: arrives at named barrier `id` without waiting; the `threads` count
/// includes the threads that [`named_barrier`] on it. Two warpgroups take turns this way (one
/// arrives where the other waits).
///
/// # Safety
/// As for [`named_barrier`]: the arrivals and waits of every use of `id` add up to `threads`.
#[inline(always)]
pub unsafe fn named_barrier_arrive(id: u32, threads: u32) {
    // SAFETY: the caller's.
    unsafe {
        core::arch::asm!("bar.arrive {0}, {1};", in(reg32) id, in(reg32) threads, options(nostack))
    }
}
