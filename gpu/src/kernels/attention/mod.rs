//! Attention forward: the FlashAttention-2 kernel ([`flash`]), its Hopper wgmma variant
//! (`flash_wgmma`, sm_90 PTX only) and the naive reference ([`naive`]).
//! Semantics, layouts and the causal convention: `params::attention`.
mod flash;
// wgmma (sm_90a) variant: only in the sm_90 PTX build (see gpu/ptx_builder.rs `target_cpu`).
#[cfg(target_feature = "sm_90a")]
mod flash_wgmma;
mod naive;
