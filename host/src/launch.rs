//! The one place kernels are launched from: by-value parameter passing, grid sizing and the launch call
//! with its error mapping. Each op's typed launcher builds its arguments and calls [`launch`].
use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use gpu::params::KernelParam;

use crate::device::Gpu;
use crate::error::{Error, Result};

/// A `#[repr(C)]` parameter struct passed to a kernel by value.
#[repr(transparent)]
#[derive(Clone, Copy)]
pub struct ByValue<T>(pub T);

// SAFETY: `KernelParam` types are `#[repr(C)]` plain data shared with the kernel (gpu::params); the
// kernel reads exactly these bytes.
unsafe impl<T: KernelParam> DeviceRepr for ByValue<T> {}

/// Most blocks a 1-D grid-stride launch uses; kernels loop over the rest. Far below the 2^31-1 grid
/// limit, and enough (about 8000 blocks per SM-wave on 132 SMs) to fill any current GPU.
pub const MAX_GRID_BLOCKS: u64 = 1 << 20;

/// Blocks for `work` items at `per_block` items per block, capped for grid-stride kernels.
pub fn grid_blocks(work: u64, per_block: u64) -> u32 {
    work.div_ceil(per_block.max(1)).clamp(1, MAX_GRID_BLOCKS) as u32
}

/// One kernel launch: `name` with `args` pushed in order.
pub fn launch(
    gpu: &Gpu,
    name: &'static str,
    grid: u32,
    block: u32,
    args: &[&dyn ArgPush],
) -> Result<()> {
    launch_cfg(
        gpu,
        name,
        LaunchConfig {
            grid_dim: (grid, 1, 1),
            block_dim: (block, 1, 1),
            shared_mem_bytes: 0,
        },
        args,
    )
}

/// A launch with a full configuration (2-D/3-D grids, dynamic shared memory).
pub fn launch_cfg(
    gpu: &Gpu,
    name: &'static str,
    cfg: LaunchConfig,
    args: &[&dyn ArgPush],
) -> Result<()> {
    let func = gpu.function(name)?;
    let mut builder = gpu.stream().launch_builder(&func);
    for a in args {
        a.push(&mut builder);
    }
    // SAFETY: every launcher validates shapes, sizes and alignment before calling here, and passes
    // arguments in the order and types of the kernel's signature (one typed launcher per kernel).
    unsafe { builder.launch(cfg) }.map_err(|e| {
        // Out of resources: say which resource, so the message names the fix.
        let during = if e.0 == cudarc::driver::sys::cudaError_enum::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES {
            use cudarc::driver::sys::CUfunction_attribute as A;
            let regs = gpu.kernel_attribute(name, A::CU_FUNC_ATTRIBUTE_NUM_REGS).unwrap_or(0);
            let max = gpu.kernel_attribute(name, A::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK).unwrap_or(0);
            format!("launching `{name}` with {} threads/block ({regs} registers/thread; this kernel allows at most {max} threads/block) and {} B dynamic shared memory", cfg.block_dim.0 * cfg.block_dim.1 * cfg.block_dim.2, cfg.shared_mem_bytes)
        } else {
            format!("launching `{name}`")
        };
        Error::driver(e, during)
    })?;
    Ok(())
}

/// Dynamic shared memory a kernel may use without opting in (48 KiB on every CUDA GPU).
pub const DEFAULT_MAX_DYNAMIC_SMEM: u32 = 48 * 1024;

/// Lets kernel `name` use `bytes` of dynamic shared memory: above 48 KiB the driver requires the
/// opt-in attribute `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES` (up to 227 KiB on sm_90,
/// 163 KiB on sm_80). A host-side call: no GPU work is queued. The handle remembers what each
/// kernel was allowed, so only a kernel's first call at a size reaches the driver.
pub fn set_max_dynamic_smem(gpu: &Gpu, name: &'static str, bytes: u32) -> Result<()> {
    gpu.allow_smem_once(name, bytes, || {
        let func = gpu.function(name)?;
        let value = i32::try_from(bytes).map_err(|_| Error::TooLarge {
            op: "set_max_dynamic_smem",
            what: "dynamic shared memory bytes",
            given: bytes as u64,
            max: i32::MAX as u64,
        })?;
        func.set_attribute(
            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            value,
        )
        .map_err(|e| {
            Error::driver(
                e,
                format!("allowing `{name}` {bytes} bytes of dynamic shared memory"),
            )
        })
    })
}

/// [`launch_cfg`] for a kernel that may need more than 48 KiB of dynamic shared memory: opts in first
/// when `cfg.shared_mem_bytes` is above the default limit.
pub fn launch_cfg_large_smem(
    gpu: &Gpu,
    name: &'static str,
    cfg: LaunchConfig,
    args: &[&dyn ArgPush],
) -> Result<()> {
    if cfg.shared_mem_bytes > DEFAULT_MAX_DYNAMIC_SMEM {
        set_max_dynamic_smem(gpu, name, cfg.shared_mem_bytes)?;
    }
    launch_cfg(gpu, name, cfg, args)
}

/// Object-safe argument pushing, so launchers can pass a slice of mixed argument types.
pub trait ArgPush {
    fn push<'a>(&'a self, b: &mut cudarc::driver::LaunchArgs<'a>);
}

impl<T: DeviceRepr> ArgPush for T {
    fn push<'a>(&'a self, b: &mut cudarc::driver::LaunchArgs<'a>) {
        b.arg(self);
    }
}

/// The kernel entry-point name `{op}_{dtype}` as a `&'static str`.
#[macro_export]
#[doc(hidden)]
macro_rules! kernel_name {
    ($op:literal, $dtype:expr) => {
        match $dtype {
            $crate::DType::F32 => concat!($op, "_f32"),
            $crate::DType::F16 => concat!($op, "_f16"),
            $crate::DType::BF16 => concat!($op, "_bf16"),
        }
    };
}

/// A device copy of `v` for a kernel's `Slice<u32>` parameter (a one-element buffer for an empty
/// slice: the driver rejects empty allocations). `what` names the values in a copy error.
pub(crate) fn upload_u32(
    gpu: &Gpu,
    v: &[u32],
    what: &str,
) -> Result<cudarc::driver::CudaSlice<u32>> {
    let src: &[u32] = if v.is_empty() { &[0] } else { v };
    gpu.stream()
        .clone_htod(src)
        .map_err(|e| Error::driver(e, format!("copying {what} host -> device")))
}

/// The kernel-side view of the first `len` values of `buf`.
pub(crate) fn raw_u32(
    gpu: &Gpu,
    buf: &cudarc::driver::CudaSlice<u32>,
    len: usize,
) -> gpu::params::RawSlice {
    use cudarc::driver::DevicePtr;
    let (ptr, _sync) = buf.device_ptr(gpu.stream());
    gpu::params::RawSlice {
        ptr,
        len: len as u64,
    }
}
