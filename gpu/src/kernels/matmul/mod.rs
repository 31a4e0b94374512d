//! The matmul family: `simt` (f32 on CUDA cores, `matmul_simt_{nn,nt,tn,tt}_f32`), `tf32` (f32 on
//! tensor cores in 3xTF32 or TF32 precision, `matmul_tf32x3_*_f32`, `matmul_tf32_*_f32`, and the
//! split-K finish) and `tensor_core` (f16/bf16, `matmul_tc_{nn,nt,tn,tt}_{f16,bf16}`). The host picks
//! by dtype and precision (`host::ops::matmul`).
mod simt;
mod tensor_core;
mod tf32;
