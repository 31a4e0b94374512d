//! The device library: a cuda_std-like API over PTX, one module per hardware concept.
//!
//! Layering (docs/ARCHITECTURE.md, Device library): this module tree is the raw layer, the only place `asm!` and the unstable
//! `core::arch::nvptx` intrinsics appear. Kernels call these wrappers, never `asm!` directly.
pub mod atomic;
pub mod block;
pub mod copy;
pub mod elem;
pub mod math;
pub mod math64;
pub mod mem;
pub mod mma;
pub mod shared;
pub mod sync;
pub mod thread;
pub mod tile;
pub mod warp;
// Hopper wgmma: only in the sm_90 (sm_90a) PTX build; see gpu/ptx_builder.rs `target_cpu`.
#[cfg(target_feature = "sm_90a")]
pub mod wgmma;
// Hopper transaction barriers, the TMA copy engine and the pipeline over them: sm_90 build only.
#[cfg(target_feature = "sm_90a")]
pub mod mbarrier;
#[cfg(target_feature = "sm_90a")]
pub mod tma;

/// Launch bounds of kernel `$entry` (Rust has no `__launch_bounds__`): it is launched with at most
/// `$threads` threads a block, and `$min_blocks` blocks should fit an SM at once. Write it beside the
/// kernel. It leaves a comment line in the PTX that the PTX builder (gpu/ptx_builder.rs
/// `apply_launch_bounds`) turns into `.maxntid $threads, 1, 1` / `.minnctapersm $min_blocks` on that
/// entry, so ptxas caps registers at `65536 / (threads * min_blocks)` instead of using up to 255 (a
/// 512-thread block of a 255-register kernel cannot launch at all). Launchers must never exceed
/// `$threads` (the launch fails with CUDA_ERROR_INVALID_VALUE). A bound naming no entry of the module
/// fails the build.
#[macro_export]
macro_rules! launch_bounds {
    ($entry:ident, $threads:expr, $min_blocks:expr) => {
        core::arch::global_asm!(
            concat!("// rgk:launch_bounds ", stringify!($entry), " {threads} {min_blocks}"),
            threads = const $threads,
            min_blocks = const $min_blocks,
        );
    };
}

/// Repeats `$body` once per listed index with `$k` bound to that constant: a guaranteed unroll, so
/// register arrays indexed by `$k` stay in registers (a run-time index would move them to local memory).
#[macro_export]
macro_rules! unroll {
    ($k:ident in [$($i:literal),* $(,)?] $body:block) => {
        $( { let $k: usize = $i; $body } )*
    };
}

/// `$body` for each `$k` in `0..$n`, where `$n` is a compile-time constant expression of at most 16
/// (it may name const generic parameters). Expands to 16 copies guarded by `if $k < $n`; the guards
/// are constants after monomorphisation and fold away, so this is a guaranteed full unroll whose
/// count a generic kernel can choose.
#[macro_export]
macro_rules! unroll_lt {
    ($k:ident < $n:expr, $body:block) => {{
        const { assert!($n <= 16, "unroll_lt! unrolls at most 16 iterations") };
        $crate::unroll!($k in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
            if $k < $n $body
        });
    }};
}

/// `v`, unchanged, through an empty `mov` the optimiser cannot see through.
///
/// Use on a loop counter at the top of a loop body that addresses many buffers from it (one address per
/// multivector component and feature): otherwise LLVM's loop strength reduction keeps every such
/// address as its own 64-bit induction variable, two registers each for the whole loop. In the fused
/// Clifford forward that was 48 pointers and 80-136 bytes of spills; with the counter hidden, addresses
/// are recomputed per trip from one base and the kernel does not spill.
#[inline(always)]
pub fn opaque_u64(v: u64) -> u64 {
    let out: u64;
    // SAFETY: a register move.
    unsafe {
        core::arch::asm!("mov.b64 {o}, {i};", o = out(reg64) out, i = in(reg64) v, options(nostack, nomem, pure))
    }
    out
}

/// `v`, unchanged, through an empty `mov` the optimiser cannot see through (32-bit). A per-thread
/// shared-memory base hidden this way keeps `base + constant` addresses as `[reg+imm]` operands: when
/// LLVM knows the low bits of the base it turns the `+` into `or`, which does not fold into the address,
/// and keeps every such address in a register of its own.
#[inline(always)]
pub fn opaque_u32(v: u32) -> u32 {
    let out: u32;
    // SAFETY: a register move.
    unsafe {
        core::arch::asm!("mov.b32 {o}, {i};", o = out(reg32) out, i = in(reg32) v, options(nostack, nomem, pure))
    }
    out
}

/// `v`, unchanged, through an empty `mov` that also reads `dep` (in a PTX comment). With `dep` a loop
/// counter, values computed from the result inside the loop are no longer loop-invariant, so the
/// optimiser computes them where they are used instead of once before the loop, keeping each in a
/// register for the whole loop (per-lane shared-memory offsets of a tile-heavy kernel: tens of
/// registers).
#[inline(always)]
pub fn opaque_dep_u32(v: u32, dep: u32) -> u32 {
    let out: u32;
    // SAFETY: a register move.
    unsafe {
        core::arch::asm!("mov.b32 {o}, {i}; // {d}", o = out(reg32) out, i = in(reg32) v, d = in(reg32) dep, options(nostack, nomem, pure))
    }
    out
}
