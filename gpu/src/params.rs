//! Launch parameters and launch constants, defined once for the kernel and its host launcher.
//!
//! Every struct here is `#[repr(C)]` and passed to a kernel by value; the host wraps it in
//! `host::launch::ByValue` which is only implemented for types that implement [`KernelParam`].

/// Marker for plain-old-data launch parameters.
///
/// # Safety
/// Implement only for `#[repr(C)]` structs of integers/floats/arrays of them with no padding the
/// kernel reads, so the bytes the host writes are the bytes the kernel reads.
pub unsafe trait KernelParam: Copy {}

/// Highest tensor rank the strided (broadcasting) kernels index.
pub const MAX_DIMS: usize = 6;

/// Shape and element strides of a strided binary op `out = a (op) b` over a contiguous `out`.
/// Broadcast dimensions have stride 0. Shapes are right-aligned in the arrays: unused leading dims have
/// extent 1 (and stride 0), so kernels loop over all `MAX_DIMS` with constant indices.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Broadcast2 {
    pub numel: u64,
    pub shape: [u64; MAX_DIMS],
    pub a_strides: [u64; MAX_DIMS],
    pub b_strides: [u64; MAX_DIMS],
}
unsafe impl KernelParam for Broadcast2 {}

/// `out[o] = sum over the reduced dims of grad[...]`: used for the gradient of a broadcast operand.
/// `out_shape` has the full rank of `grad` with 1 on every reduced dim; `red_shape` has 1 on every kept
/// dim and the full extent on every reduced one; `grad_strides` are the contiguous strides of `grad`.
/// Right-aligned like [`Broadcast2`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReduceTo {
    pub out_numel: u64,
    pub red_numel: u64,
    pub out_shape: [u64; MAX_DIMS],
    pub red_shape: [u64; MAX_DIMS],
    pub grad_strides: [u64; MAX_DIMS],
}
unsafe impl KernelParam for ReduceTo {}

/// Elementwise kernels.
pub mod elementwise {
    /// Threads per block for every elementwise kernel.
    pub const BLOCK: u32 = 256;
    /// 16-byte chunks each thread handles per loop trip in the contiguous (vectorised) kernels.
    pub const CHUNKS_PER_THREAD: u32 = 2;
    /// Bytes in one vector access: `ld.global.v4.b32`.
    pub const VECTOR_BYTES: usize = 16;
}

/// Reductions over the last dimension and over all elements.
pub mod reduce {
    /// Threads per block for row reductions and both stages of the full reduction.
    pub const BLOCK: u32 = 256;
    /// Fixed number of partial sums of the first stage of a full reduction (upper bound). Fixed so that
    /// the summation order depends only on the element count: the same bits on every run.
    pub const MAX_PARTIALS: u32 = 1024;
    /// Elements each first-stage block covers at least, so small inputs use few blocks.
    pub const MIN_ELEMS_PER_BLOCK: u64 = 8192;
}

/// Softmax over the last dimension.
pub mod softmax {
    /// Elements each thread keeps in registers on the single-read path.
    pub const CACHE_PER_THREAD: u32 = 16;
    /// Most threads in a block. 512, not 1024: the kernels use 70-80 registers per thread and a block
    /// of 1024 would exceed the 64K registers of an SM (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES); Rust has no
    /// `__launch_bounds__` to make the compiler fit 1024.
    pub const MAX_BLOCK: u32 = 512;
    /// Longest row held in registers (read once, written once); longer rows are read twice.
    pub const MAX_CACHED_COLS: u64 = (CACHE_PER_THREAD * MAX_BLOCK) as u64;

    /// Threads for a row of `cols` elements: enough to cover the row with `CACHE_PER_THREAD` elements
    /// each, a power of two between one warp and `MAX_BLOCK`.
    pub const fn block_for(cols: u64) -> u32 {
        let need = cols.div_ceil(CACHE_PER_THREAD as u64);
        let mut t: u64 = 32;
        while t < need && t < MAX_BLOCK as u64 {
            t *= 2;
        }
        t as u32
    }
}

/// Kinds of binary op, as the kernels number them.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add = 0,
    Sub = 1,
    Mul = 2,
    Div = 3,
}

/// A device buffer as a kernel receives it: pointer and element count, passed by value together
/// (matches `dev::mem::Slice<T>` / `SliceMut<T>` bit for bit; a const assertion there checks it).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RawSlice {
    pub ptr: u64,
    pub len: u64,
}
unsafe impl KernelParam for RawSlice {}
