//! The Tensor Memory Accelerator (TMA, sm_90): bulk tensor copies from global to shared memory
//! described by a *tensor map*, completing on an [`MBarrier`]. Compiled only into the sm_90 PTX
//! (`#[cfg(target_feature = "sm_90a")]` on the module).
//!
//! # Tensor maps
//! A tensor map is a 128-byte opaque descriptor the host encodes with the driver's
//! `cuTensorMapEncodeTiled` (`host::tma`): the tensor's base, its dims and strides, the *box* one copy
//! moves, the shared-memory swizzle, and zero fill for coordinates outside the tensor (so tails of
//! M, N and K need no other handling). The hardware reads it from kernel-parameter, constant or
//! global memory, 64-byte aligned; never from local memory.
//!
//! It reaches a kernel as a by-value parameter of type [`crate::params::TensorMapParam`]. Rust has no
//! `__grid_constant__`: taking the parameter's address in Rust makes LLVM copy it to the stack (local
//! memory), which the copy engine cannot read, and rustc cannot declare it more than 16-byte aligned.
//! So the kernel never touches the parameter in Rust; [`tensor_map_param!`] names it in PTX
//! (`<kernel>_param_<index>`, LLVM's parameter naming), takes its address with `mov` and
//! `cvta.param`, and leaves a marker from which the PTX builder (`gpu/ptx_builder.rs`) re-declares
//! that parameter `.align 64` (the build fails if the marker names no such 128-byte parameter).
//!
//! # Swizzle agreement
//! Every map here has a box 128 bytes wide (64 16-bit elements, or 32 f32 for the f32 matmul) and
//! `BOX_ROWS` rows tall, with 128-byte swizzle, which is exactly the [`SwizzledTile`] layout the
//! wgmma descriptors read (16-byte chunk `c` of row `r` at `c ^ (r % 8)`, 1024-byte aligned atoms).
//! A [`TensorMapRef<BOX_ROWS>`] only loads into a `SwizzledTile<BOX_ROWS, C>` (one box per 128-byte
//! panel), so a copy whose box or swizzle disagrees with the tile the wgmma reads does not compile.
//! The element size is the map's third parameter (2 unless named): it sets how many elements one
//! panel spans, so a panel's coordinate cannot disagree with the bytes it fills.
use crate::dev::mbarrier::MBarrier;
use crate::dev::wgmma::SwizzledTile;

/// The generic address of a tensor map (kernel-parameter space) of rank `RANK` (3: `[batch][rows]
/// [columns]`; 4: `[batch][heads][rows][columns]`) of `ELEM_BYTES`-byte elements whose box is 128
/// bytes wide and `BOX_ROWS` rows tall (one entry of every outer dim), with 128-byte swizzle. Made
/// only by [`tensor_map_param!`]; the rank picks which `load` exists, so a copy with the wrong
/// number of coordinates does not compile.
#[derive(Clone, Copy)]
pub struct TensorMapRef<const BOX_ROWS: usize, const RANK: usize = 3, const ELEM_BYTES: usize = 2> {
    addr: u64,
}

impl<const BOX_ROWS: usize, const RANK: usize, const ELEM_BYTES: usize>
    TensorMapRef<BOX_ROWS, RANK, ELEM_BYTES>
{
    /// Elements of one 128-byte panel (the box width).
    const PANEL_ELEMS: i32 = {
        assert!(ELEM_BYTES == 2 || ELEM_BYTES == 4);
        (128 / ELEM_BYTES) as i32
    };

    /// # Safety
    /// `addr` is the generic address of a 64-byte aligned tensor map in parameter, constant or global
    /// memory, encoded with rank `RANK`, a box 128 bytes wide and `BOX_ROWS` tall of
    /// `ELEM_BYTES`-byte elements and 128-byte swizzle, valid for the kernel's lifetime.
    #[doc(hidden)]
    #[inline(always)]
    pub const unsafe fn from_generic(addr: u64) -> Self {
        Self { addr }
    }

    /// `prefetch.tensormap`: brings the descriptor into the cache ahead of the first copy.
    #[inline(always)]
    pub fn prefetch(self) {
        // SAFETY: a prefetch of a valid descriptor address.
        unsafe {
            core::arch::asm!("prefetch.tensormap [{a}];", a = in(reg64) self.addr, options(nostack))
        }
    }
}

impl<const BOX_ROWS: usize> TensorMapRef<BOX_ROWS, 4> {
    /// Copies the `BOX_ROWS x C` block whose first element is at (column `inner`, row `outer`, head
    /// `head`, batch entry `batch`) of a rank-4 tensor into `tile`, as the rank-3 `load` does.
    ///
    /// # Safety
    /// As for the rank-3 `load`.
    #[inline(always)]
    pub unsafe fn load<const C: usize>(
        self,
        tile: SwizzledTile<BOX_ROWS, C>,
        (inner, outer): (i32, i32),
        (head, batch): (i32, i32),
        bar: MBarrier,
    ) {
        let mut p = 0;
        while p < C / 64 {
            let dst = tile.chunk_addr(0, 8 * p as u32);
            // SAFETY: the caller's; `dst` is panel p's 1024-aligned base inside the tile.
            unsafe {
                core::arch::asm!(
                    "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [{d}], [{m}, {{{x}, {y}, {z}, {w}}}], [{b}];",
                    d = in(reg32) dst, m = in(reg64) self.addr,
                    x = in(reg32) inner + 64 * p as i32, y = in(reg32) outer, z = in(reg32) head,
                    w = in(reg32) batch, b = in(reg32) bar.addr(),
                    options(nostack)
                )
            }
            p += 1;
        }
    }
}

impl<const BOX_ROWS: usize, const ELEM_BYTES: usize> TensorMapRef<BOX_ROWS, 3, ELEM_BYTES> {
    /// Copies the block of `BOX_ROWS` rows and `C` 16-bit columns' worth of bytes whose first
    /// element is at (column `inner`, row `outer`, batch `batch`) of the tensor into `tile`: one box
    /// per 128-byte panel, columns `inner + p * 128 / ELEM_BYTES`.
    /// Elements outside the tensor arrive as zeros. The copies complete on `bar` with
    /// `SwizzledTile::<BOX_ROWS, C>::BYTES` transaction bytes.
    ///
    /// # Safety
    /// Issued by one thread; `bar`'s current phase expects these bytes (an `arrive_expect_tx` that
    /// counts them); no thread reads or writes `tile` until that phase completes, and the tile's
    /// previous readers are done with it (a pipeline `empty` barrier).
    #[inline(always)]
    pub unsafe fn load<const C: usize>(
        self,
        tile: SwizzledTile<BOX_ROWS, C>,
        inner: i32,
        outer: i32,
        batch: i32,
        bar: MBarrier,
    ) {
        let mut p = 0;
        while p < C / 64 {
            let dst = tile.chunk_addr(0, 8 * p as u32);
            // SAFETY: the caller's; `dst` is panel p's 1024-aligned base inside the tile.
            unsafe {
                core::arch::asm!(
                    "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [{d}], [{m}, {{{x}, {y}, {z}}}], [{b}];",
                    d = in(reg32) dst, m = in(reg64) self.addr,
                    x = in(reg32) inner + Self::PANEL_ELEMS * p as i32, y = in(reg32) outer,
                    z = in(reg32) batch, b = in(reg32) bar.addr(),
                    options(nostack)
                )
            }
            p += 1;
        }
    }

    /// Copies `tile` to the `BOX_ROWS x C` block of the tensor whose first element is at (column
    /// `inner`, row `outer`, batch `batch`): one box per 64-column panel. Elements of the box outside
    /// the tensor are not written. Completes asynchronously in this thread's bulk group (see
    /// [`bulk_commit`], [`bulk_wait_read`]).
    ///
    /// # Safety
    /// Issued by one thread after the tile's writers made their writes visible to the async proxy
    /// (`fence.proxy.async.shared::cta` in each writer, then a barrier with this thread); nobody
    /// writes the tile until a [`bulk_wait_read`] covering this store; the tensor's memory is this
    /// kernel's to write.
    #[inline(always)]
    pub unsafe fn store<const C: usize>(
        self,
        tile: SwizzledTile<BOX_ROWS, C>,
        inner: i32,
        outer: i32,
        batch: i32,
    ) {
        let mut p = 0;
        while p < C / 64 {
            let src = tile.chunk_addr(0, 8 * p as u32);
            // SAFETY: the caller's; `src` is panel p's 1024-aligned base inside the tile.
            unsafe {
                core::arch::asm!(
                    "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [{m}, {{{x}, {y}, {z}}}], [{s}];",
                    m = in(reg64) self.addr, s = in(reg32) src,
                    x = in(reg32) inner + Self::PANEL_ELEMS * p as i32, y = in(reg32) outer,
                    z = in(reg32) batch, options(nostack)
                )
            }
            p += 1;
        }
    }
}

/// Declares parameters `$index`.. of kernel `$entry` to be tensor maps: write it beside the kernel,
/// as `launch_bounds!`. It leaves a marker line in the PTX from which the PTX builder re-declares
/// each named parameter `.align 64` (and fails if one is not a 128-byte by-value parameter); the
/// builder also fails on a [`tensor_map_param!`] address of a parameter no marker names.
#[macro_export]
macro_rules! tensor_map_params {
    ($entry:ident, $($index:literal),+) => {
        $(core::arch::global_asm!(concat!(
            "// rgk:tensor_map ", stringify!($entry), " ", stringify!($index)
        ));)+
    };
}

/// `cp.async.bulk.commit_group`: closes this thread's bulk stores ([`TensorMapRef::store`]) issued
/// since the last commit into a bulk group.
#[inline(always)]
pub fn bulk_commit() {
    // SAFETY: bookkeeping of this thread's bulk copies.
    unsafe { core::arch::asm!("cp.async.bulk.commit_group;", options(nostack)) }
}

/// `cp.async.bulk.wait_group.read N`: blocks until at most `N` of this thread's bulk groups still
/// read their shared-memory source (after which the source may be rewritten).
#[inline(always)]
pub fn bulk_wait_read<const N: u32>() {
    // SAFETY: waits; not `nomem`, so shared-memory writes after it stay after it.
    unsafe { core::arch::asm!("cp.async.bulk.wait_group.read {n};", n = const N, options(nostack)) }
}

/// `cp.async.bulk.wait_group N`: blocks until at most `N` of this thread's bulk groups are pending
/// (their writes to global memory done): before the kernel's shared memory goes away.
#[inline(always)]
pub fn bulk_wait<const N: u32>() {
    // SAFETY: waits.
    unsafe { core::arch::asm!("cp.async.bulk.wait_group {n};", n = const N, options(nostack)) }
}

/// The [`TensorMapRef`] of by-value kernel parameter number `$index` (from 0) of kernel `$entry`,
/// which must be declared as [`crate::params::TensorMapParam`], named by a [`tensor_map_params!`]
/// beside the kernel, and never used in Rust. `$rows` is the box height the host encoded
/// (`host::tma`), `$rank` (3 if left out) the map's rank, `$elem_bytes` (2 if left out) its element
/// size. Call it in the entry point itself; see the module doc for why the parameter is reached
/// through PTX.
#[macro_export]
macro_rules! tensor_map_param {
    ($entry:ident, $index:literal, $rows:expr) => {
        $crate::tensor_map_param!($entry, $index, $rows, 3, 2)
    };
    ($entry:ident, $index:literal, $rows:expr, $rank:expr) => {
        $crate::tensor_map_param!($entry, $index, $rows, $rank, 2)
    };
    ($entry:ident, $index:literal, $rows:expr, $rank:expr, $elem_bytes:expr) => {{
        let addr: u64;
        // SAFETY: takes the address of a kernel parameter (a .param-space address, made generic).
        unsafe {
            core::arch::asm!(
                concat!("mov.b64 {a}, ", stringify!($entry), "_param_", stringify!($index), ";"),
                "cvta.param.u64 {a}, {a};",
                a = out(reg64) addr,
                options(nostack, nomem, pure)
            )
        };
        // SAFETY: the host encodes this parameter with rank $rank for a 128-byte x $rows box of
        // $elem_bytes-byte elements with 128-byte swizzle (the launcher of `$entry`), and the
        // builder aligned it to 64 bytes (`tensor_map_params!`).
        unsafe {
            $crate::dev::tma::TensorMapRef::<{ $rows }, { $rank }, { $elem_bytes }>::from_generic(addr)
        }
    }};
}
