//! The matmul family: `simt` (f32 on CUDA cores, `matmul_simt_{nn,nt,tn,tt}_f32`), `tf32` (sm_80
//! build: f32 on `mma.sync` tensor cores in 3xTF32 or TF32 precision, `matmul_tf32x3_*_f32`,
//! `matmul_tf32_*_f32`), `splitk` (the split-K finish of both f32 tensor-core kernels),
//! `tensor_core` (f16/bf16, `matmul_tc_{nn,nt,tn,tt}_{f16,bf16}`) and, in the sm_90
//! build, `tma` (f16/bf16 on TMA + wgmma, `matmul_tma_*`) and `wg_tf32` (f32 in 3xTF32 or TF32 on
//! TMA + wgmma, `matmul_wg_tf32x3_*_f32`, `matmul_wg_tf32_*_f32`). The host picks by dtype,
//! precision, build and alignment (`host::ops::matmul`).
mod simt;
mod splitk;
mod tensor_core;
// The `mma.sync` f32 kernels; the sm_90 build has `wg_tf32` instead.
#[cfg(not(target_feature = "sm_90a"))]
mod tf32;
// Hopper: TMA + mbarrier pipeline + wgmma, sm_90 build only.
#[cfg(target_feature = "sm_90a")]
mod tma;
#[cfg(target_feature = "sm_90a")]
mod wg_tf32;
