//! Launch parameters and launch constants, defined once for the kernel and its host launcher: one
//! file per op family (the same families as the kernel modules, `gpu/ptx_builder.rs` `FAMILIES`), and
//! here what every family shares.
//!
//! Every struct here is `#[repr(C)]` and passed to a kernel by value; the host wraps it in
//! `host::launch::ByValue` which is only implemented for types that implement [`KernelParam`].

pub mod attention;
pub mod clifford;
pub mod elementwise;
pub mod lrp;
pub mod matmul;
pub mod norm_embedding;
pub mod reduce_softmax;

pub use elementwise::{BinaryOp, Broadcast2, ReduceTo};
pub use lrp::{LrpCoeff, LrpFinish, LrpGemm};
pub use matmul::{
    Matmul, MatmulTc, MatmulTf32, MatmulTma, RowAccess, SPLIT_GATHER_BITS, SPLIT_GATHER_MAX,
    SplitB, WG_PAIRS_PATH_BITS, WgPairs, matmul_f32v, matmul_tc, matmul_tf32, matmul_tma,
    matmul_wg_tf32, split_b_stored_offset,
};
pub use norm_embedding::{embedding, layer_norm};
pub use reduce_softmax::{reduce, softmax};

/// Marker for plain-old-data launch parameters.
///
/// # Safety
/// Implement only for `#[repr(C)]` structs of integers/floats/arrays of them with no padding the
/// kernel reads, so the bytes the host writes are the bytes the kernel reads.
pub unsafe trait KernelParam: Copy {}

/// A tensor map (the driver's `CUtensorMap`, encoded on the host by `cuTensorMapEncodeTiled`) as a
/// by-value kernel parameter: 128 opaque bytes. Kernels declare it and reach it only through
/// `gpu::tensor_map_param!` (see `gpu::dev::tma` for why); the PTX builder re-declares the
/// parameter 64-byte aligned, as the copy engine requires.
#[repr(C, align(16))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorMapParam {
    pub opaque: [u64; 16],
}
// SAFETY: #[repr(C)], 16 u64, no padding.
unsafe impl KernelParam for TensorMapParam {}

/// Whether a warp-specialised CTA of one producer warpgroup and `threads / 128 - 1` consumer
/// warpgroups (one CTA an SM) can move to `producer` and `consumer` registers a thread with
/// `setmaxnreg`. Each thread starts with the launch's cap (65536 / threads, rounded down to 8), and
/// `setmaxnreg.inc` draws only on the CTA's pool of what `.dec` released: a consumer raise the
/// producer's release does not cover blocks the consumers for ever.
pub const fn register_split_fits(threads: u32, producer: u32, consumer: u32) -> bool {
    let entry = 65536 / threads / 8 * 8;
    threads >= 256
        && threads.is_multiple_of(128)
        && producer.is_multiple_of(8)
        && consumer.is_multiple_of(8)
        && producer <= entry
        && consumer >= entry
        && (entry - producer) * 128 >= (consumer - entry) * (threads - 128)
}

/// Highest tensor rank the strided (broadcasting) kernels index.
pub const MAX_DIMS: usize = 6;

/// Threads for a block that covers a row of `cols` elements at `per_thread` elements a thread: a power
/// of two from one warp (32) up to `max_block`. Shared by the row kernels (softmax, layer norm, the
/// embedding backward), which hold the row in registers when it fits and loop otherwise.
pub const fn row_block(cols: u64, per_thread: u32, max_block: u32) -> u32 {
    let need = cols.div_ceil(per_thread as u64);
    let mut t: u64 = 32;
    while t < need && t < max_block as u64 {
        t *= 2;
    }
    t as u32
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
