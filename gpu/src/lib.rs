//! GPU kernels written in Rust, compiled by rustc's own `nvptx64-nvidia-cuda` target to PTX.
//!
//! The crate has two faces:
//! - on the host target it only exposes [`params`] (the `#[repr(C)]` launch-parameter structs and the
//!   per-kernel launch constants, so the host launcher and the kernel read the same numbers) and
//!   [`layout`] (shared-memory tile layouts and their compile-time alignment checks);
//! - on `nvptx64` it also holds the device library ([`dev`]) and the kernels (`kernels`), exported as
//!   `#[unsafe(no_mangle)] extern "ptx-kernel"` entry points named `{op}_{dtype}`.
#![cfg_attr(not(test), no_std)]
#![cfg_attr(
    target_arch = "nvptx64",
    feature(abi_ptx, stdarch_nvptx, asm_experimental_arch)
)]

pub mod layout;
pub mod params;

#[cfg(target_arch = "nvptx64")]
pub mod dev;

#[cfg(target_arch = "nvptx64")]
mod kernels;

/// A Rust panic in a kernel (a failed bounds check in a `checked` build, an explicit assert) becomes
/// `trap`: the launch fails with CUDA_ERROR_ILLEGAL_INSTRUCTION / LAUNCH_FAILED and the host error
/// says that a device-side check failed.
#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // SAFETY: `trap` aborts the kernel; nothing after it runs.
    unsafe { core::arch::nvptx::trap() }
}
