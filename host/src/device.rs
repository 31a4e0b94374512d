//! The GPU handle: driver context, the one stream all ops run on, the kernel modules loaded so far (one
//! per op family, each loaded on first use) and a cache of kernel handles. Cheap to clone (an `Arc`).
//!
//! The driver library is loaded at run time (cudarc `dynamic-loading`): without a driver the crate still
//! builds and runs, and [`Gpu::new`] returns [`Error::NoDevice`].
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};

use crate::error::{Error, Result};
use crate::modules::{Family, ModuleImage};

#[derive(Clone)]
pub struct Gpu {
    inner: Arc<Inner>,
}

struct Inner {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// One slot per [`Family`] (index `Family::index`): filled the first time one of its kernels is
    /// looked up. The lock is held while the module loads, so two threads never load it twice.
    modules: [Mutex<Option<LoadedModule>>; Family::ALL.len()],
    /// `RGK_MODULE_FORMAT=ptx`: load the PTX even where a cubin exists.
    prefer_ptx: bool,
    arch: &'static str,
    name: String,
    compute_capability: (i32, i32),
    functions: Mutex<HashMap<&'static str, CudaFunction>>,
    /// The dynamic shared memory each kernel has been allowed so far
    /// ([`crate::launch::set_max_dynamic_smem`]).
    smem_allowed: Mutex<HashMap<&'static str, u32>>,
    poison_outputs: AtomicBool,
    memory: Arc<MemoryCounter>,
    /// Theoretical DRAM peak in bytes a second (see [`Gpu::peak_dram_bytes_per_s`]).
    peak_dram_bytes_per_s: f64,
    /// Streaming multiprocessors (0 if the driver did not say: [`Gpu::sm_count`] asks again).
    sm_count: u32,
}

/// Which of the library's builds a [`Gpu`] handle runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Build {
    /// The device's own: the sm_90 build (sm_90a: wgmma kernels) on compute capability 9.0, the
    /// sm_80 build elsewhere.
    #[default]
    Native,
    /// The sm_80 build on any device of compute capability 8.0 or newer.
    Portable,
}

/// A family's module as loaded on this device.
#[derive(Clone)]
struct LoadedModule {
    module: Arc<CudaModule>,
    info: ModuleLoad,
}

/// How a family's module was loaded: what form, and how long the driver took.
#[derive(Clone, Debug, PartialEq)]
pub struct ModuleLoad {
    pub family: Family,
    /// "cubin sm_90a", "PTX sm_80 (JIT)", ...
    pub image: String,
    /// Bytes handed to the driver.
    pub bytes: usize,
    /// Wall time of the driver's load call (a PTX load includes its JIT compilation).
    pub load_time: Duration,
    /// Why the cubin was not used, where one existed but the driver refused it (the PTX was loaded).
    pub cubin_refused: Option<String>,
}

/// Device bytes held by the tensors of one [`Gpu`] handle: every [`crate::Tensor`] allocation adds its
/// size (as requested from the driver: `max(bytes, 16)`) when made and takes it off when its buffer is
/// freed (the last view dropped). `peak` is the most held at once since the last
/// [`Gpu::reset_peak_memory`]. The driver's own rounding and pool reserve are not counted, as PyTorch's
/// `memory_allocated` does not count its caching allocator's.
#[derive(Debug, Default)]
pub struct MemoryCounter {
    live: AtomicU64,
    peak: AtomicU64,
}

impl MemoryCounter {
    pub(crate) fn allocated(&self, bytes: u64) {
        let live = self.live.fetch_add(bytes, Ordering::SeqCst) + bytes;
        self.peak.fetch_max(live, Ordering::SeqCst);
    }
    pub(crate) fn freed(&self, bytes: u64) {
        self.live.fetch_sub(bytes, Ordering::SeqCst);
    }
    fn stats(&self) -> MemoryStats {
        MemoryStats {
            live_bytes: self.live.load(Ordering::SeqCst),
            peak_bytes: self.peak.load(Ordering::SeqCst),
        }
    }
    fn reset_peak(&self) {
        self.peak
            .store(self.live.load(Ordering::SeqCst), Ordering::SeqCst);
    }
}

/// A reading of a handle's [`MemoryCounter`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes held by live tensors now.
    pub live_bytes: u64,
    /// Most bytes held at once since the last reset (or since the handle was made).
    pub peak_bytes: u64,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let loaded: Vec<String> = self
            .loaded_modules()
            .iter()
            .map(|m| {
                format!(
                    "{} {} in {:.3} s",
                    m.family.name(),
                    m.image,
                    m.load_time.as_secs_f64()
                )
            })
            .collect();
        write!(
            f,
            "Gpu({}, sm_{}{}, {} build, modules loaded: [{}])",
            self.inner.name,
            self.inner.compute_capability.0,
            self.inner.compute_capability.1,
            self.inner.arch,
            loaded.join(", ")
        )
    }
}

/// Whether a CUDA driver library can be loaded on this machine (no panic if not).
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the driver library.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

impl Gpu {
    /// Opens device `ordinal`: creates (or retains) its primary context. Loads no kernel code: each op
    /// family's module is loaded the first time one of its kernels runs (see [`Gpu::load_family`]), as
    /// machine code where the library carries it for this device, else as PTX that the driver
    /// JIT-compiles (and caches in `~/.nv/ComputeCache` unless `CUDA_CACHE_DISABLE=1`).
    ///
    /// Memory: tensors are allocated from the device's stream-ordered pool, and the handle keeps
    /// the memory of dropped tensors in that pool for the next allocation instead of returning it
    /// to the system at every synchronisation (the driver's default). This is set on the device's
    /// pool, so it holds for every handle of the device in the process;
    /// [`Gpu::release_cached_memory`] returns it.
    ///
    /// `RGK_MODULE_FORMAT=ptx` in the environment loads the PTX even where machine code exists (to
    /// compare the two, or to work around a driver that refuses the cubin); `auto` or unset is the
    /// default.
    pub fn new(ordinal: usize) -> Result<Gpu> {
        Gpu::with_build(ordinal, Build::Native)
    }

    /// [`Gpu::new`] running the build of your choice: [`Build::Portable`] runs the sm_80 kernels on
    /// any device of compute capability 8.0 or newer, e.g. to test on an H100 the kernels an A100
    /// runs (on a 9.0 device their PTX is JIT-compiled on first use of each family).
    pub fn with_build(ordinal: usize, build: Build) -> Result<Gpu> {
        let prefer_ptx = match std::env::var("RGK_MODULE_FORMAT").as_deref() {
            Err(_) | Ok("auto") | Ok("") => false,
            Ok("ptx") => true,
            Ok(other) => {
                return Err(Error::Invalid {
                    op: "Gpu::new",
                    msg: format!("RGK_MODULE_FORMAT must be `auto` or `ptx`, got `{other}`"),
                });
            }
        };
        if !driver_present() {
            return Err(Error::NoDevice {
                reason: "the CUDA driver library (libcuda.so) is not present on this machine"
                    .into(),
            });
        }
        let count = CudaContext::device_count().map_err(|e| Error::NoDevice {
            reason: format!("cuInit/cuDeviceGetCount failed: {e:?}"),
        })?;
        if ordinal >= count.max(0) as usize {
            return Err(Error::NoDevice {
                reason: format!("device {ordinal} requested, {count} visible"),
            });
        }
        let ctx =
            CudaContext::new(ordinal).map_err(|e| Error::driver(e, "creating the CUDA context"))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| Error::driver(e, "reading the compute capability"))?;
        let native = crate::modules::arch_for(major, minor).ok_or_else(|| Error::NoDevice {
            reason: format!("device has compute capability {major}.{minor}; the shipped kernels need 8.0 or newer"),
        })?;
        let arch = match build {
            Build::Native => native,
            Build::Portable => "sm_80",
        };
        let name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        let stream = ctx.default_stream();
        // SAFETY: every op of this handle runs on its one stream, and kernels take buffers as raw
        // pointers (`RawSlice`), so the two events cudarc otherwise creates for each allocation
        // (and records, waits on and destroys) would order nothing: the stream already orders
        // every use of a buffer before its free. They cost host time on every `Tensor::empty`.
        unsafe { ctx.disable_event_tracking() };
        keep_freed_memory(&ctx)?;
        // Read once here: the driver answers the memory-clock attribute slowly (about 0.4 ms a call
        // measured on an H100), far too slow for a launcher to ask per call.
        let peak_dram_bytes_per_s = {
            use cudarc::driver::sys::CUdevice_attribute as A;
            let khz = ctx
                .attribute(A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE)
                .unwrap_or(0)
                .max(0) as f64;
            let bits = ctx
                .attribute(A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH)
                .unwrap_or(0)
                .max(0) as f64;
            2.0 * khz * 1e3 * bits / 8.0
        };
        let sm_count = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .unwrap_or(0)
            .max(0) as u32;
        Ok(Gpu {
            inner: Arc::new(Inner {
                ctx,
                stream,
                modules: Default::default(),
                prefer_ptx,
                arch,
                name,
                compute_capability: (major, minor),
                functions: Mutex::new(HashMap::new()),
                smem_allowed: Mutex::new(HashMap::new()),
                poison_outputs: AtomicBool::new(false),
                memory: Arc::new(MemoryCounter::default()),
                peak_dram_bytes_per_s,
                sm_count,
            }),
        })
    }

    pub fn name(&self) -> &str {
        &self.inner.name
    }
    pub fn compute_capability(&self) -> (i32, i32) {
        self.inner.compute_capability
    }
    /// The build this device runs (`sm_80` or `sm_90`; the sm_90 build targets sm_90a).
    pub fn ptx_arch(&self) -> &'static str {
        self.inner.arch
    }
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.inner.ctx
    }
    /// The stream every op of this handle runs on (events for timing go on it too).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.inner.stream
    }

    /// Number of streaming multiprocessors.
    /// Read once when the handle is made: launchers that size grids by it ask on every call.
    pub fn sm_count(&self) -> Result<u32> {
        if self.inner.sm_count > 0 {
            return Ok(self.inner.sm_count);
        }
        self.attribute(
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )
    }

    /// The DRAM's theoretical peak in bytes per second: 2 transfers a clock (DDR/HBM) x memory clock x
    /// bus width, from the driver's attributes (H100 SXM: 3.35e12, H200: 4.8e12). Kernels whose best
    /// form depends on how many bytes must be in flight choose by it.
    /// Read once when the handle is made (0 if the driver did not say).
    pub fn peak_dram_bytes_per_s(&self) -> f64 {
        self.inner.peak_dram_bytes_per_s
    }

    pub fn attribute(&self, a: cudarc::driver::sys::CUdevice_attribute) -> Result<u32> {
        self.inner
            .ctx
            .attribute(a)
            .map(|v| v.max(0) as u32)
            .map_err(|e| Error::driver(e, "reading a device attribute"))
    }

    /// Waits for all queued work; surfaces asynchronous kernel faults as typed errors.
    pub fn synchronize(&self) -> Result<()> {
        self.inner.stream.synchronize().map_err(|e| {
            Error::driver(
                e,
                "synchronizing the stream (an earlier kernel may have faulted)",
            )
        })
    }

    /// Gives the device memory that dropped tensors left in the driver's pool back to the system
    /// (after waiting for the stream): freed memory is kept for the next allocation (see
    /// [`Gpu::new`]), so other processes and allocations outside the pool (cuBLAS, NCCL)
    /// see it as used until this runs. A tensor allocation that finds the device full first trims
    /// the pool without waiting for the GPU (a host wait there could stall a rank of a
    /// [`crate::dist`] group) and tries once more; other allocations (NCCL's, cuBLAS's, id uploads)
    /// do not, so call this before handing the memory to them.
    pub fn release_cached_memory(&self) -> Result<()> {
        self.synchronize()?;
        self.trim_pool()
    }

    /// Returns the pool's unused memory to the system without waiting for the GPU: memory whose
    /// free is still queued on a stream stays (the driver never releases what backs a live or
    /// pending allocation), so this is safe at any time and may release less than
    /// [`Gpu::release_cached_memory`].
    pub(crate) fn trim_pool(&self) -> Result<()> {
        if !self.inner.ctx.has_async_alloc() {
            return Ok(());
        }
        let pool = device_pool(&self.inner.ctx)?;
        // SAFETY: trims the pool of this handle's device; the driver keeps whatever still backs
        // an allocation.
        unsafe { cudarc::driver::sys::cuMemPoolTrimTo(pool, 0) }
            .result()
            .map_err(|e| Error::driver(e, "trimming the device's memory pool"))
    }

    /// Poison mode: every op output is filled with 0xFF bytes (NaN in every float dtype) before its kernel
    /// runs, so an element a kernel fails to write shows up as NaN. Tests turn this on.
    pub fn set_poison_outputs(&self, on: bool) {
        self.inner.poison_outputs.store(on, Ordering::Relaxed);
    }
    pub fn poison_outputs(&self) -> bool {
        self.inner.poison_outputs.load(Ordering::Relaxed)
    }

    /// Device memory held by the tensors of this handle, now and at most since [`Gpu::reset_peak_memory`]
    /// (see [`MemoryCounter`]). For one call's peak: reset, read `live_bytes`, make the call and keep its
    /// results, then `peak_bytes - live_bytes_before` is what the call allocated at its high point
    /// (outputs, saved state and workspaces together), the same definition as PyTorch's
    /// `max_memory_allocated() - memory_allocated()` around a call.
    pub fn memory_stats(&self) -> MemoryStats {
        self.inner.memory.stats()
    }
    /// Starts a new peak: `peak_bytes` becomes the bytes held now.
    pub fn reset_peak_memory(&self) {
        self.inner.memory.reset_peak()
    }
    pub(crate) fn memory_counter(&self) -> &Arc<MemoryCounter> {
        &self.inner.memory
    }

    /// The kernel `name` (cached): loads its family's module first if no kernel of that family has run
    /// on this handle yet.
    pub fn function(&self, name: &'static str) -> Result<CudaFunction> {
        if let Some(f) = self.cached_function(name) {
            return Ok(f);
        }
        let family = Family::of(name).ok_or_else(|| Error::Invalid {
            op: "Gpu::function",
            msg: format!("no kernel named `{name}` in any embedded module"),
        })?;
        let f = self
            .module(family)?
            .module
            .load_function(name)
            .map_err(|e| {
                Error::driver(
                    e,
                    format!("looking up kernel `{name}` in the {} module", family.name()),
                )
            })?;
        self.inner
            .functions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name, f.clone());
        Ok(f)
    }

    /// Runs `allow`, which lets kernel `name` use `bytes` of dynamic shared memory, unless an
    /// earlier call already allowed it at least that much. The limit is an attribute of the loaded
    /// kernel, which lives as long as this handle's module, so a kernel launched many times makes
    /// the driver call once (at each larger size), not once a launch.
    pub(crate) fn allow_smem_once(
        &self,
        name: &'static str,
        bytes: u32,
        allow: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let mut allowed = self
            .inner
            .smem_allowed
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if allowed.get(name).is_some_and(|&b| b >= bytes) {
            return Ok(());
        }
        allow()?;
        allowed.insert(name, bytes);
        Ok(())
    }

    fn cached_function(&self, name: &str) -> Option<CudaFunction> {
        let cache = self
            .inner
            .functions
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        cache.get(name).cloned()
    }

    /// Loads `family`'s module now if it is not loaded yet (ops load theirs on first use; call this to
    /// move that cost to a moment of your choosing) and says how it was loaded.
    pub fn load_family(&self, family: Family) -> Result<ModuleLoad> {
        Ok(self.module(family)?.info)
    }

    /// The families loaded so far on this handle, and how.
    pub fn loaded_modules(&self) -> Vec<ModuleLoad> {
        self.inner
            .modules
            .iter()
            .filter_map(|m| {
                m.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .as_ref()
                    .map(|l| l.info.clone())
            })
            .collect()
    }

    /// `family`'s module, loaded by this call if no earlier one did.
    fn module(&self, family: Family) -> Result<LoadedModule> {
        let mut slot = self.inner.modules[family.index()]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(m) = slot.as_ref() {
            return Ok(m.clone());
        }
        let (major, arch) = (self.inner.compute_capability.0, self.inner.arch);
        let image = crate::modules::image_for(family, arch, major, self.inner.prefer_ptx);
        let load = |image: &ModuleImage| {
            let started = Instant::now();
            let src = match *image {
                ModuleImage::Cubin { bytes, .. } => cudarc::nvrtc::Ptx::from_binary(bytes.to_vec()),
                ModuleImage::Ptx { text, .. } => cudarc::nvrtc::Ptx::from_src(text),
            };
            self.inner
                .ctx
                .load_module(src)
                .map(|m| (m, started.elapsed()))
        };
        let mut cubin_refused = None;
        let (module, load_time, used) = match load(&image) {
            Ok((m, t)) => (m, t, image),
            Err(e) => {
                let ModuleImage::Cubin { arch, .. } = image else {
                    return Err(Error::driver(
                        e,
                        format!(
                            "loading the {} module ({})",
                            family.name(),
                            image.describe()
                        ),
                    ));
                };
                // A driver older than the ptxas that built the cubin refuses it; its PTX may still JIT.
                cubin_refused = Some(format!("{e:?}"));
                let ptx = crate::modules::image_for(family, arch, major, true);
                let (m, t) = load(&ptx).map_err(|e2| {
                    Error::driver(e2, format!("loading the {} module as PTX {arch} after the driver refused its cubin ({e:?})", family.name()))
                })?;
                (m, t, ptx)
            }
        };
        let info = ModuleLoad {
            family,
            image: used.describe(),
            bytes: used.bytes(),
            load_time,
            cubin_refused,
        };
        let loaded = LoadedModule { module, info };
        *slot = Some(loaded.clone());
        Ok(loaded)
    }

    /// A kernel attribute (registers per thread, largest block it can launch with, ...).
    pub fn kernel_attribute(
        &self,
        name: &'static str,
        attr: cudarc::driver::sys::CUfunction_attribute,
    ) -> Result<u32> {
        let f = self.function(name)?;
        // SAFETY: queries an attribute of a function handle loaded from our module.
        unsafe { cudarc::driver::result::function::get_function_attribute(f.cu_function(), attr) }
            .map(|v| v.max(0) as u32)
            .map_err(|e| Error::driver(e, format!("reading an attribute of `{name}`")))
    }

    /// Largest power-of-two block (>= 32 threads) that kernel `name` can launch with on this device: the
    /// JIT's register allocation decides it, and Rust has no `__launch_bounds__` to pin it.
    pub fn max_block_pow2(&self, name: &'static str) -> Result<u32> {
        let max = self.kernel_attribute(
            name,
            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
        )?;
        Ok(if max < 32 {
            32
        } else {
            1 << (31 - max.leading_zeros())
        })
    }

    pub(crate) fn same_device(&self, other: &Gpu) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner) || Arc::ptr_eq(&self.inner.ctx, &other.inner.ctx)
    }
}

/// The memory pool the device's stream-ordered allocations come from (tensors allocate from it).
pub(crate) fn device_pool(ctx: &Arc<CudaContext>) -> Result<cudarc::driver::sys::CUmemoryPool> {
    ctx.bind_to_thread()
        .map_err(|e| Error::driver(e, "binding the context to this thread"))?;
    let mut pool = std::ptr::null_mut();
    // SAFETY: writes the device's current pool handle into `pool`.
    unsafe { cudarc::driver::sys::cuDeviceGetMemPool(&mut pool, ctx.cu_device()) }
        .result()
        .map_err(|e| Error::driver(e, "reading the device's memory pool"))?;
    Ok(pool)
}

/// Tensors come from the driver's stream-ordered pool, whose default release threshold (0) hands
/// every freed byte back to the system at each stream or event synchronisation: the next step's
/// tensors then map fresh physical memory. A training step that reads its loss back each step paid
/// that on every step, and two GPUs driven from one process paid it under one driver lock. The
/// threshold is raised to "never" (what PyTorch's caching allocator does); [`Gpu::release_cached_memory`]
/// gives the memory back on request, and a tensor allocation that finds the device full trims the
/// pool first.
fn keep_freed_memory(ctx: &Arc<CudaContext>) -> Result<()> {
    if !ctx.has_async_alloc() {
        return Ok(());
    }
    let pool = device_pool(ctx)?;
    let mut threshold = u64::MAX;
    // SAFETY: sets a u64 attribute of a live pool; `threshold` outlives the call.
    unsafe {
        cudarc::driver::sys::cuMemPoolSetAttribute(
            pool,
            cudarc::driver::sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )
    }
    .result()
    .map_err(|e| Error::driver(e, "keeping freed memory in the device's pool"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_counter_tracks_live_and_peak_bytes() {
        let m = MemoryCounter::default();
        m.allocated(100);
        m.allocated(50);
        m.freed(100);
        assert_eq!(
            m.stats(),
            MemoryStats {
                live_bytes: 50,
                peak_bytes: 150
            }
        );
        m.reset_peak();
        assert_eq!(m.stats().peak_bytes, 50);
        m.allocated(30);
        m.freed(30);
        m.allocated(10);
        assert_eq!(
            m.stats(),
            MemoryStats {
                live_bytes: 60,
                peak_bytes: 80
            }
        );
    }
}
