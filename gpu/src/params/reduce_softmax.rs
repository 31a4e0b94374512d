//! Reduce/softmax family (`kernels/reduce.rs`, `kernels/softmax.rs`, `host::ops::{reduce, softmax}`).

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
        crate::params::row_block(cols, CACHE_PER_THREAD, MAX_BLOCK)
    }
}
