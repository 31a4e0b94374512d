//! Elementwise family (`kernels/elementwise.rs`, `host::ops::elementwise`): the strided and
//! broadcasting launch parameters and the threads and chunks of every elementwise kernel.
use super::{KernelParam, MAX_DIMS};

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

/// Threads per block for every elementwise kernel.
pub const BLOCK: u32 = 256;
/// 16-byte chunks of each operand a thread loads before it stores, in one trip, in the contiguous
/// binary kernels (and chunks a thread covers in the grid of every vectorised kernel).
pub const CHUNKS_PER_THREAD: u32 = 2;
/// Chunks a thread of the contiguous binary kernels (add, sub, mul, div) loads from each operand:
/// one. Measured on an H200 (2026-11-26, 190591e, H200: docs/results/2026-11-26-190591e-h200/add-into-bench/), 8192^2 f32 add into a preallocated
/// output: 256 threads x 1 chunk 0.1864 ms, x 2 chunks 0.1879, 128 x 1 0.1864, 512 x 1 0.1867,
/// 512 x 2 0.1876 (f16/bf16 the same to 0.0001 ms); PyTorch eager 0.1871 in that run.
pub const BINARY_CHUNKS_PER_THREAD: u32 = 1;
/// Bytes in one vector access: `ld.global.v4.b32`.
pub const VECTOR_BYTES: usize = 16;

/// Kinds of binary op, as the kernels number them.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add = 0,
    Sub = 1,
    Mul = 2,
    Div = 3,
}
