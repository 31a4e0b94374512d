//! The matmul family: `simt` (f32 on CUDA cores, `matmul_simt_{nn,nt,tn,tt}_f32`) and `tensor_core`
//! (f16/bf16 on tensor cores, `matmul_tc_{nn,nt,tn,tt}_{f16,bf16}`). The host picks by dtype
//! (`host::ops::matmul`).
mod simt;
mod tensor_core;
