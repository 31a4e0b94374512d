//! Attention forward: the FlashAttention-2 kernel ([`flash`]) and the naive reference ([`naive`]).
//! Semantics, layouts and the causal convention: `params::attention`.
mod flash;
mod naive;
