//! Kernel entry points, one module per op family. Each module writes its kernels once, generic over the
//! element type, and a macro stamps out the `{op}_{dtype}` entry points the host loads by name.
mod attention;
mod clifford;
mod elementwise;
mod embedding;
mod layer_norm;
mod lrp;
mod matmul;
mod reduce;
mod softmax;
