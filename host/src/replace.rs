//! Incremental replacement: the debugging method, built in. A small transformer block
//! ([`model`]) is trained with every op call routed through a [`Plan`], which says per op kind
//! ([`OpKind`]) whether the op's CPU reference ([`Backend::Reference`], the `reference` module of each
//! op family, f64 math) or its GPU kernel ([`Backend::Gpu`]: upload, launch, download) runs it.
//! [`bisect()`] switches one op kind at a time (and cumulatively) to the GPU and names the first one whose
//! GPU version makes the run diverge from the all-reference baseline, with the size of the divergence
//! per op.
//!
//! Model values live on the host ([`HostTensor`], f32) between ops: the GPU backend is a correctness
//! tool, not a fast path (every op pays a copy each way).
//!
//! ```
//! use host::replace::{model::{self, Config}, Device, Exec, Plan};
//! let cfg = Config::default();
//! let mut params = model::init(&cfg, 7);
//! let batch = model::batch(&cfg, 8);
//! let exec = Exec::new(Plan::all_reference(), &Device::None);
//! let steps = model::train(&exec, &cfg, &mut params, &batch, 2).unwrap();
//! assert!(steps[1].loss < steps[0].loss);
//! ```
pub mod bisect;
pub mod exec;
pub mod model;

pub use bisect::{BisectSettings, Divergence, OpDivergence, Report, bisect, bisect_on, divergence};
pub use exec::{Device, Exec, Planted};

use std::fmt;

/// Which implementation runs an op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The op's CPU reference on host tensors.
    Reference,
    /// The op's GPU kernel: inputs uploaded, outputs downloaded.
    Gpu,
}

/// The op kinds of the model, each switched as a whole (forward and backward). Listed in the order
/// of their first use in the forward pass, the order [`bisect()`] tries them in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// Token embedding gather and its scatter-add backward.
    Embedding,
    /// Elementwise add with broadcasting (positional embedding, biases, residuals, gradient sums) and
    /// its backward (sums over broadcast dims).
    Add,
    /// Layer norm forward (y, mean, rstd) and backward (dx, dgamma, dbeta).
    LayerNorm,
    /// Every matrix product: projections, attention scores and `P V`, and all their backward products
    /// (matmuls with transpose flags).
    Matmul,
    /// The attention-specific step between the score product and the softmax: scale by `1/sqrt(d)`
    /// and add the causal mask (affine + broadcast add), and its backward (the scale).
    Attention,
    /// Softmax over the attention scores and its backward.
    Softmax,
    /// Exact GELU and its backward.
    Gelu,
    /// Softmax cross-entropy: probabilities over the vocabulary (the loss value is `-mean log p` of
    /// them, on the host) and the gradient `(p - onehot) / N`.
    Loss,
}

impl OpKind {
    pub const ALL: [OpKind; 8] = [
        OpKind::Embedding,
        OpKind::Add,
        OpKind::LayerNorm,
        OpKind::Matmul,
        OpKind::Attention,
        OpKind::Softmax,
        OpKind::Gelu,
        OpKind::Loss,
    ];

    pub fn name(self) -> &'static str {
        match self {
            OpKind::Embedding => "embedding",
            OpKind::Add => "add",
            OpKind::LayerNorm => "layer_norm",
            OpKind::Matmul => "matmul",
            OpKind::Attention => "attention (scale + causal mask)",
            OpKind::Softmax => "softmax",
            OpKind::Gelu => "gelu",
            OpKind::Loss => "loss (softmax cross-entropy)",
        }
    }

    fn index(self) -> usize {
        OpKind::ALL
            .iter()
            .position(|&k| k == self)
            .unwrap_or_default()
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which backend runs each op kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    backends: [Backend; OpKind::ALL.len()],
}

impl Plan {
    /// Every op on its CPU reference: the trusted baseline.
    pub fn all_reference() -> Plan {
        Plan {
            backends: [Backend::Reference; OpKind::ALL.len()],
        }
    }

    /// Every op on the GPU.
    pub fn all_gpu() -> Plan {
        Plan {
            backends: [Backend::Gpu; OpKind::ALL.len()],
        }
    }

    /// This plan with `kind` run by `backend`.
    pub fn with(mut self, kind: OpKind, backend: Backend) -> Plan {
        self.backends[kind.index()] = backend;
        self
    }

    /// All-reference except `kinds`, which run on the GPU.
    pub fn gpu_only(kinds: &[OpKind]) -> Plan {
        kinds
            .iter()
            .fold(Plan::all_reference(), |p, &k| p.with(k, Backend::Gpu))
    }

    pub fn backend(&self, kind: OpKind) -> Backend {
        self.backends[kind.index()]
    }

    /// The kinds this plan runs on the GPU.
    pub fn on_gpu(&self) -> Vec<OpKind> {
        OpKind::ALL
            .into_iter()
            .filter(|&k| self.backend(k) == Backend::Gpu)
            .collect()
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let gpu = self.on_gpu();
        match gpu.len() {
            0 => f.write_str("all reference"),
            n if n == OpKind::ALL.len() => f.write_str("all GPU"),
            _ => {
                let names: Vec<&str> = gpu.iter().map(|k| k.name()).collect();
                write!(f, "GPU: {}", names.join(", "))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_switch_one_kind_at_a_time() {
        let p = Plan::all_reference().with(OpKind::Gelu, Backend::Gpu);
        assert_eq!(p.on_gpu(), vec![OpKind::Gelu]);
        assert_eq!(p.backend(OpKind::Matmul), Backend::Reference);
        assert_eq!(Plan::all_gpu().on_gpu().len(), OpKind::ALL.len());
        assert_eq!(
            Plan::gpu_only(&[OpKind::Add, OpKind::Loss]).to_string(),
            "GPU: add, loss (softmax cross-entropy)"
        );
        assert_eq!(Plan::all_reference().to_string(), "all reference");
    }
}
