//! Atomics on global memory. Float atomics make summation order depend on scheduling, so no reduction
//! in this crate uses them for results in an order it does not fix (determinism rule); they are here
//! for counters and flags, and for sums whose writers are serialised in a fixed order
//! ([`red_add_f32`] behind [`load_acquire_u32`] / [`add_release_u32`] turn counters).

/// `atom.global.add.u32`; returns the old value.
///
/// # Safety
/// `addr` must point to a live, 4-byte aligned `u32` in global memory.
#[inline(always)]
pub unsafe fn add_u32(addr: *mut u32, v: u32) -> u32 {
    let old: u32;
    unsafe {
        core::arch::asm!("atom.global.add.u32 {o}, [{a}], {v};", o = out(reg32) old, a = in(reg64) addr, v = in(reg32) v, options(nostack))
    }
    old
}

/// `atom.global.add.f32`; returns the old value. Order-dependent: not for deterministic results.
///
/// # Safety
/// `addr` must point to a live, 4-byte aligned `f32` in global memory.
#[inline(always)]
pub unsafe fn add_f32(addr: *mut f32, v: f32) -> f32 {
    let old: f32;
    unsafe {
        core::arch::asm!("atom.global.add.f32 {o}, [{a}], {v};", o = out(reg32) old, a = in(reg64) addr, v = in(reg32) v, options(nostack))
    }
    old
}

/// `ld.acquire.gpu.global.u32`: a load that later memory operations of this thread cannot move
/// above, and that synchronises with the `release` write it reads (so this thread then sees every
/// write ordered before that release, by any thread of the releasing block). The wait side of a
/// flag or turn counter between blocks.
///
/// # Safety
/// `addr` must point to a live, 4-byte aligned `u32` in global memory.
#[inline(always)]
pub unsafe fn load_acquire_u32(addr: *const u32) -> u32 {
    let v: u32;
    unsafe {
        core::arch::asm!("ld.acquire.gpu.global.u32 {v}, [{a}];", v = out(reg32) v, a = in(reg64) addr, options(nostack))
    }
    v
}

/// `ld.relaxed.gpu.global.f32`: a load coherent at GPU scope (never a stale L1 line), for values
/// other blocks wrote and published through a release this thread's block acquired (the acquire
/// by one thread, then a block barrier, then this load).
///
/// # Safety
/// `addr` must point to a live, 4-byte aligned `f32` in global memory.
#[inline(always)]
pub unsafe fn load_relaxed_f32(addr: *const f32) -> f32 {
    let v: f32;
    unsafe {
        core::arch::asm!("ld.relaxed.gpu.global.f32 {v}, [{a}];", v = out(reg32) v, a = in(reg64) addr, options(nostack))
    }
    v
}

/// `fence.acq_rel.gpu`: with a strong write after it (such as [`add_relaxed_u32`]) a release at GPU
/// scope, cumulative as [`add_release_u32`]'s: one fence before several signals pays one wait for
/// this thread's earlier memory operations, where each `red.release` waits again.
#[inline(always)]
pub fn fence_acq_rel_gpu() {
    // SAFETY: a memory fence; no operands.
    unsafe { core::arch::asm!("fence.acq_rel.gpu;", options(nostack)) }
}

/// `red.relaxed.gpu.global.add.u32`: adds `v` with no ordering of its own; after
/// [`fence_acq_rel_gpu`], a release.
///
/// # Safety
/// `addr` must point to a live, 4-byte aligned `u32` in global memory.
#[inline(always)]
pub unsafe fn add_relaxed_u32(addr: *mut u32, v: u32) {
    unsafe {
        core::arch::asm!("red.relaxed.gpu.global.add.u32 [{a}], {v};", a = in(reg64) addr, v = in(reg32) v, options(nostack))
    }
}

/// `red.release.gpu.global.add.u32`: adds `v` after every earlier memory operation of this thread,
/// and of every thread ordered before it by a block barrier, is visible at GPU scope (release is
/// cumulative). The signal side of [`load_acquire_u32`]: `sync_threads()`, then one thread calls this.
///
/// # Safety
/// `addr` must point to a live, 4-byte aligned `u32` in global memory.
#[inline(always)]
pub unsafe fn add_release_u32(addr: *mut u32, v: u32) {
    unsafe {
        core::arch::asm!("red.release.gpu.global.add.u32 [{a}], {v};", a = in(reg64) addr, v = in(reg32) v, options(nostack))
    }
}

/// `red.global.add.f32` (relaxed, GPU scope, no return value). Its result depends on the order of
/// the additions to one address, so it is deterministic only where that order is fixed: callers
/// serialise the writers of each address (FlashAttention's dQ: one block at a time per query block,
/// in a fixed order, through a turn counter).
///
/// # Safety
/// `addr` must point to a live, 4-byte aligned `f32` in global memory.
#[inline(always)]
pub unsafe fn red_add_f32(addr: *mut f32, v: f32) {
    unsafe {
        core::arch::asm!("red.global.add.f32 [{a}], {v};", a = in(reg64) addr, v = in(reg32) v, options(nostack))
    }
}

/// `red.global.add.v4.f32` (PTX 8.1, sm_90): [`red_add_f32`] of four consecutive floats in one
/// instruction, with the same order rule; a warp's 16-byte pieces of whole 32-byte sectors reach
/// L2 as a quarter of the requests four scalar reductions make.
///
/// # Safety
/// `addr` must point to four live `f32` in global memory, 16-byte aligned.
#[inline(always)]
pub unsafe fn red_add_v4_f32(addr: *mut f32, v: [f32; 4]) {
    unsafe {
        core::arch::asm!(
            "red.global.add.v4.f32 [{a}], {{{b}, {c}, {d}, {e}}};",
            a = in(reg64) addr, b = in(reg32) v[0], c = in(reg32) v[1], d = in(reg32) v[2], e = in(reg32) v[3],
            options(nostack)
        )
    }
}

/// `red.global.add.v2.f32` (PTX 8.1, sm_90): [`red_add_f32`] of two consecutive floats in one
/// instruction, with the same order rule. A wgmma accumulator holds its f32 in such pairs, so a
/// warp adds them where they lie: four lanes' pairs fill a row's 32-byte sector, the L2 requests
/// of [`red_add_v4_f32`] without the lane exchange that would form its 16-byte pieces.
///
/// # Safety
/// `addr` must point to two live `f32` in global memory, 8-byte aligned.
#[inline(always)]
pub unsafe fn red_add_v2_f32(addr: *mut f32, v: [f32; 2]) {
    unsafe {
        core::arch::asm!(
            "red.global.add.v2.f32 [{a}], {{{b}, {c}}};",
            a = in(reg64) addr, b = in(reg32) v[0], c = in(reg32) v[1],
            options(nostack)
        )
    }
}

/// Polls at most this many times in [`wait_for_turn`] before trapping.
pub const TURN_POLLS: u32 = 1 << 26;

/// Spins (every calling thread, with [`load_acquire_u32`]) until the counter at `addr` equals `turn`.
/// A turn that has not come after [`TURN_POLLS`] polls (tens of seconds: far beyond any wait the
/// ordering protocols here allow) means the protocol's assumption failed; the kernel traps, so the
/// launch fails with an error instead of hanging the device.
///
/// # Safety
/// `addr` must point to a live, 4-byte aligned `u32` in global memory.
#[inline(always)]
pub unsafe fn wait_for_turn(addr: *const u32, turn: u32) {
    let mut polls = 0u32;
    while unsafe { load_acquire_u32(addr) } != turn {
        polls += 1;
        if polls == TURN_POLLS {
            // SAFETY: `trap` aborts the kernel; nothing after it runs.
            unsafe { core::arch::nvptx::trap() }
        }
    }
}
