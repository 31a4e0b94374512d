//! The device library: a cuda_std-like API over PTX, one module per hardware concept.
//!
//! Layering (house rule 1): this module tree is the raw layer, the only place `asm!` and the unstable
//! `core::arch::nvptx` intrinsics appear. Kernels call these wrappers, never `asm!` directly.
pub mod atomic;
pub mod block;
pub mod elem;
pub mod math;
pub mod math64;
pub mod mem;
pub mod shared;
pub mod sync;
pub mod thread;
pub mod warp;

/// Repeats `$body` once per listed index with `$k` bound to that constant: a guaranteed unroll, so
/// register arrays indexed by `$k` stay in registers (a run-time index would move them to local memory).
#[macro_export]
macro_rules! unroll {
    ($k:ident in [$($i:literal),* $(,)?] $body:block) => {
        $( { let $k: usize = $i; $body } )*
    };
}
