//! Kernel entry points, one module per op family. Each module writes its kernels once, generic over the
//! element type, and a macro stamps out the `{op}_{dtype}` entry points the host loads by name.
//!
//! Each family is compiled on its own (one cargo feature each, see gpu/ptx_builder.rs) into its own
//! PTX module, so the host loads only the families a program calls, on first use.
#[cfg(feature = "attention")]
mod attention;
#[cfg(feature = "clifford")]
mod clifford;
#[cfg(feature = "elementwise")]
mod elementwise;
#[cfg(feature = "norm_embedding")]
mod embedding;
#[cfg(feature = "norm_embedding")]
mod layer_norm;
#[cfg(feature = "lrp")]
mod lrp;
#[cfg(feature = "matmul")]
mod matmul;
#[cfg(feature = "reduce_softmax")]
mod reduce;
#[cfg(feature = "reduce_softmax")]
mod softmax;
