//! Attention forward: FlashAttention-2 on `mma.sync` ([`flash`], the sm_80 build), its Hopper wgmma
//! form (`flash_wgmma`, the sm_90 build: compute capability 9.0 runs that build, so the `mma.sync`
//! kernel would never run there), its warp-specialised TMA form (`flash_tma`, sm_90 build) and the
//! naive reference ([`naive`], both builds). Backward:
//! FlashAttention-2 on `mma.sync` ([`flash_bwd`], both builds until a wgmma form exists) and the
//! naive reference. Ring (context-parallel) attention's LSE merge and gradient accumulation:
//! [`ring`]. Decoding against a (paged) KV cache with split keys: [`decode`].
//! Semantics, layouts and the causal convention: `params::attention`.
mod decode;
#[cfg(not(target_feature = "sm_90a"))]
mod flash;
mod flash_bwd;
#[cfg(target_feature = "sm_90a")]
mod flash_tma;
#[cfg(target_feature = "sm_90a")]
mod flash_wg_bwd;
#[cfg(target_feature = "sm_90a")]
mod flash_wgmma;
mod naive;
mod ring;
