//! The matmul family: `simt` (f32 on CUDA cores, `matmul_f32`), `simt_db` (its double-buffered tuning
//! variants, `matmul_simtv{N}_*_f32`) and `tensor_core` (f16/bf16 on tensor
//! cores, `matmul_tc_{nn,nt,tn,tt}_{f16,bf16}`). The host picks by dtype (`host::ops::matmul`).
mod simt;
mod simt_db;
mod tensor_core;
