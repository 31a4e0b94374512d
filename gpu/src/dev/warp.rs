//! Warp shuffles and warp reductions. A warp's 32 lanes exchange registers with `shfl.sync`; a butterfly
//! (xor) pattern leaves the full reduction in every lane after 5 steps, in an order that is fixed, so the
//! result has the same bits on every run.

pub const FULL_MASK: u32 = 0xffff_ffff;

/// `shfl.sync.bfly`: the value of lane `lane ^ xor_mask`. All 32 lanes must take part.
#[inline(always)]
pub fn shfl_xor_f32(v: f32, xor_mask: u32) -> f32 {
    let out: f32;
    // SAFETY: register exchange within the full warp; callers keep all lanes converged.
    unsafe {
        core::arch::asm!(
            "shfl.sync.bfly.b32 {o}, {v}, {m}, 0x1f, {full};",
            o = out(reg32) out, v = in(reg32) v, m = in(reg32) xor_mask, full = in(reg32) FULL_MASK,
            options(nostack, nomem)
        )
    }
    out
}

/// `shfl.sync.idx`: the value of lane `src`.
#[inline(always)]
pub fn shfl_idx_f32(v: f32, src: u32) -> f32 {
    let out: f32;
    // SAFETY: as above.
    unsafe {
        core::arch::asm!(
            "shfl.sync.idx.b32 {o}, {v}, {s}, 0x1f, {full};",
            o = out(reg32) out, v = in(reg32) v, s = in(reg32) src, full = in(reg32) FULL_MASK,
            options(nostack, nomem)
        )
    }
    out
}

/// Sum over the warp, returned in every lane.
#[inline(always)]
pub fn reduce_sum(mut v: f32) -> f32 {
    let mut m = 16;
    while m > 0 {
        v += shfl_xor_f32(v, m);
        m >>= 1;
    }
    v
}

/// Maximum over the warp, returned in every lane (NaN-propagating like `fmaxf` is not: see `math::max`).
#[inline(always)]
pub fn reduce_max(mut v: f32) -> f32 {
    let mut m = 16;
    while m > 0 {
        v = crate::dev::math::max(v, shfl_xor_f32(v, m));
        m >>= 1;
    }
    v
}

/// `x`, which every lane of the (fully active) warp holds alike, as ptxas's uniform-register value
/// (`redux.sync.min.u32` writes a uniform register, sm_80+). A value loaded from global memory is
/// not known to be uniform; branches and loop bounds derived from it make the wgmma kernels'
/// paths "divergent" to ptxas, which then serialises their wgmma. Passing such a value through this
/// keeps them uniform. Every lane must call it, with the same `x`.
#[inline(always)]
pub fn warp_uniform_u32(x: u32) -> u32 {
    let r: u32;
    // SAFETY: a warp-wide reduction over the full mask; the caller's warp is fully active.
    unsafe {
        core::arch::asm!(
            "redux.sync.min.u32 {r}, {x}, 0xffffffff;",
            r = out(reg32) r,
            x = in(reg32) x,
            options(nostack, nomem, pure)
        )
    }
    r
}
