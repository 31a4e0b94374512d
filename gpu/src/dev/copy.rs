//! Data movement into and out of shared memory for the tensor cores: `cp.async` (global -> shared,
//! asynchronous) and `ldmatrix` (shared -> registers, in `mma` fragment order).
//!
//! # `cp.async` (sm_80+)
//! `cp.async.cg.shared.global [dst], [src], 16, src_size` starts a 16-byte copy that bypasses L1 and
//! the register file; the issuing thread continues at once. Copies are batched into *groups*:
//! `cp.async.commit_group` closes the group of all copies this thread issued since the last commit
//! (an empty group is fine), and `cp.async.wait_group N` blocks until at most `N` of this thread's
//! most recent groups are still pending. The wait covers only the calling thread's copies: before other
//! threads read the data, the block needs a barrier after the wait. With `src_size = 0` nothing is read
//! from `src` and the 16 destination bytes are zero-filled: that is how tiles past the end of a tensor
//! are padded without a branch around the instruction. Both addresses must be 16-byte aligned.
//!
//! # `ldmatrix` (sm_75+)
//! `ldmatrix.sync.aligned.m8n8.x4.shared.b16` loads four 8x8 matrices of 16-bit elements: lane `l`
//! supplies the shared address of row `l % 8` of matrix `l / 8` (16 contiguous, 16-byte aligned
//! bytes), and lane `l` receives in register `i` the pair at row `l / 4`, columns `2 (l % 4)` and
//! `2 (l % 4) + 1` of matrix `i`, which is exactly the `mma.m16n8k16` fragment order. `.trans` delivers
//! the transposed matrices (the pair at column `l / 4`, rows `2 (l % 4)`, `+1`), which turns a
//! row-major `[k][n]` tile into B fragments. All 32 lanes must execute it together (`.sync.aligned`).
//! The address patterns that feed it live in [`crate::layout::ldmatrix`], where they are unit-tested.

/// Starts a 16-byte asynchronous copy from global `src` to shared `dst`; when `fill` is false nothing
/// is read and the destination is zero-filled.
///
/// # Safety
/// - `dst` is a 16-byte aligned shared-window address inside this block's shared memory, and nothing
///   reads or writes those 16 bytes until this thread's group containing the copy has been waited for
///   (and, for other threads, a barrier after that wait);
/// - `src` is 16-byte aligned and, when `fill` is true, points at 16 readable bytes of global memory
///   that nothing writes during the kernel (when `fill` is false it is not dereferenced).
#[inline(always)]
pub unsafe fn cp_async_16(dst: u32, src: *const u8, fill: bool) {
    // SAFETY: the caller's contract, with `fill` as 16 or 0 bytes read.
    unsafe { cp_async_16_bytes(dst, src, if fill { 16 } else { 0 }) }
}

/// [`cp_async_16`] reading only the first `bytes` (0..=16) bytes of `src`: the rest of the 16
/// destination bytes are zero-filled (the copy of a row's last, partial chunk).
///
/// # Safety
/// As for [`cp_async_16`], with the first `bytes` bytes of `src` readable.
#[inline(always)]
pub unsafe fn cp_async_16_bytes(dst: u32, src: *const u8, bytes: u32) {
    unsafe {
        core::arch::asm!(
            "{{",
            ".reg .u64 g;",
            "cvta.to.global.u64 g, {src};",
            "cp.async.cg.shared.global [{dst}], [g], 16, {n};",
            "}}",
            dst = in(reg32) dst, src = in(reg64) src, n = in(reg32) bytes,
            options(nostack)
        )
    }
}

/// Starts a 4-byte asynchronous copy (`cp.async.ca`, through L1) from global `src` to shared `dst`;
/// when `fill` is false nothing is read and the destination is zero-filled. The 4-byte form can
/// scatter: f32 matmul tiles use it to store a k-contiguous operand k-major (a transpose) and to copy
/// rows that are not 16-byte aligned.
///
/// # Safety
/// As for [`cp_async_16`], with 4-byte alignment and 4 bytes.
#[inline(always)]
pub unsafe fn cp_async_4(dst: u32, src: *const u8, fill: bool) {
    let src_size: u32 = if fill { 4 } else { 0 };
    unsafe {
        core::arch::asm!(
            "{{",
            ".reg .u64 g;",
            "cvta.to.global.u64 g, {src};",
            "cp.async.ca.shared.global [{dst}], [g], 4, {n};",
            "}}",
            dst = in(reg32) dst, src = in(reg64) src, n = in(reg32) src_size,
            options(nostack)
        )
    }
}

/// Closes the group of `cp.async` copies this thread issued since the previous commit.
#[inline(always)]
pub fn cp_async_commit() {
    // SAFETY: only bookkeeping of this thread's outstanding copies.
    unsafe { core::arch::asm!("cp.async.commit_group;", options(nostack)) }
}

/// Waits until at most `N` of this thread's most recently committed groups are pending (`N` <= 3).
/// Other threads' copies need a block barrier after this before this thread may read them.
#[inline(always)]
pub fn cp_async_wait<const N: u32>() {
    // SAFETY: waiting has no memory effects of its own beyond ordering this thread's copies; the
    // `asm!` is not `nomem`, so the compiler does not move shared-memory reads above it.
    unsafe {
        match N {
            0 => core::arch::asm!("cp.async.wait_group 0;", options(nostack)),
            1 => core::arch::asm!("cp.async.wait_group 1;", options(nostack)),
            2 => core::arch::asm!("cp.async.wait_group 2;", options(nostack)),
            _ => core::arch::asm!("cp.async.wait_group 3;", options(nostack)),
        }
    }
}

/// `ldmatrix.sync.aligned.m8n8.x4.shared.b16`: four 8x8 matrices, register `i` from matrix `i`.
///
/// # Safety
/// - all 32 lanes of the warp execute this call together (no divergence around it);
/// - `addr` is a 16-byte aligned shared address of 16 readable bytes in this block's shared memory,
///   written before a barrier (or by this warp before a `bar.warp.sync`) that this call follows.
#[inline(always)]
pub unsafe fn ldmatrix_x4(addr: u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    unsafe {
        core::arch::asm!(
            "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{{a}, {b}, {c}, {d}}}, [{p}];",
            a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d,
            p = in(reg32) addr, options(nostack, readonly)
        )
    }
    [a, b, c, d]
}

/// `ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16`: as [`ldmatrix_x4`], each matrix transposed.
///
/// # Safety
/// As for [`ldmatrix_x4`].
#[inline(always)]
pub unsafe fn ldmatrix_x4_trans(addr: u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    unsafe {
        core::arch::asm!(
            "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{{a}, {b}, {c}, {d}}}, [{p}];",
            a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d,
            p = in(reg32) addr, options(nostack, readonly)
        )
    }
    [a, b, c, d]
}
