//! Atomics on global memory. Float atomics make summation order depend on scheduling, so no reduction
//! in this crate uses them for results (determinism rule); they are here for counters and flags.

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
