//! Incremental replacement: the debugging method, built in. Two small models — a transformer block
//! ([`model`]) and a Clifford MLP ([`clifford_model`]) — are trained with every op call routed
//! through a [`Plan`], which says per op kind ([`OpKind`]) whether the op's CPU reference
//! ([`Backend::Reference`], the `reference` module of each op family, f64 math) or its GPU kernel
//! ([`Backend::Gpu`]: upload, launch, download) runs it. [`bisect()`] switches the op kinds a model
//! uses ([`Model::kinds`]) one at a time (and cumulatively) to the GPU and names the first one whose
//! GPU version makes the run diverge from the all-reference baseline, with the size of the divergence
//! per op.
//!
//! Model values live on the host ([`crate::HostTensor`], f32) between ops: the GPU backend is a correctness
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
pub mod clifford_model;
pub mod exec;
pub mod model;
#[cfg(test)]
pub(crate) mod test_support;

pub use bisect::{
    BisectSettings, Divergence, OpDivergence, Report, TrainStep, bisect, bisect_on, divergence,
};
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

/// The op kinds of the models, each switched as a whole (forward and backward). Each model's kinds
/// ([`Model::kinds`]) are listed in the order of their first use in its forward pass, the order
/// [`bisect()`] tries them in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// Token embedding gather and its scatter-add backward.
    Embedding,
    /// Elementwise add with broadcasting (positional embedding, biases, residuals, gradient sums) and
    /// its backward (sums over broadcast dims).
    Add,
    /// Layer norm forward (y, mean, rstd) and backward (dx, dgamma, dbeta).
    LayerNorm,
    /// Every matrix product: projections, attention scores and `P V` (on the attention core's
    /// reference path), and all their backward products (matmuls with transpose flags).
    Matmul,
    /// The attention core `Q, K, V -> O` and its backward `dO -> dQ, dK, dV`: FlashAttention in f16
    /// on the GPU, the composed ops (scores product, scale and mask, softmax, `P V`, each under its
    /// own kind) as its reference ([`Exec::causal_attention`]).
    FlashAttention,
    /// The attention-specific step between the score product and the softmax: scale by `1/sqrt(d)`
    /// and add the causal mask (affine + broadcast add), and its backward (the scale); on the attention
    /// core's reference path only.
    Attention,
    /// Softmax over the attention scores and its backward; on the attention core's reference path
    /// only.
    Softmax,
    /// Exact GELU and its backward.
    Gelu,
    /// Softmax cross-entropy: probabilities over the vocabulary (the loss value is `-mean log p` of
    /// them, on the host) and the gradient `(p - onehot) / N`.
    Loss,
    /// A Clifford [`Layer`](crate::ops::clifford::Layer) with per-feature product weights (sgp):
    /// per-grade linear map + bias, MV-GELU gates, weighted geometric product, grade RMS norm; forward
    /// and backward.
    CliffordSgpLayer,
    /// A Clifford [`Layer`](crate::ops::clifford::Layer) with fully connected product weights (fcgp).
    CliffordFcLayer,
    /// Mean squared error: the difference `out - target` (the loss value `mean(diff^2)` is taken
    /// on the host) and the gradient `2 diff / numel`.
    Mse,
}

impl OpKind {
    pub const ALL: [OpKind; 12] = [
        OpKind::Embedding,
        OpKind::Add,
        OpKind::LayerNorm,
        OpKind::Matmul,
        OpKind::FlashAttention,
        OpKind::Attention,
        OpKind::Softmax,
        OpKind::Gelu,
        OpKind::Loss,
        OpKind::CliffordSgpLayer,
        OpKind::CliffordFcLayer,
        OpKind::Mse,
    ];

    /// The transformer block's kinds ([`model`]), in the order of first use. The attention core
    /// ([`OpKind::FlashAttention`]) is called before the scale-and-mask and softmax it runs on its
    /// reference path, so with it on the GPU (every cumulative run from it on) those two kinds are
    /// not called: their rows measure them alone.
    pub const TRANSFORMER: [OpKind; 9] = [
        OpKind::Embedding,
        OpKind::Add,
        OpKind::LayerNorm,
        OpKind::Matmul,
        OpKind::FlashAttention,
        OpKind::Attention,
        OpKind::Softmax,
        OpKind::Gelu,
        OpKind::Loss,
    ];

    /// The Clifford MLP's kinds ([`clifford_model`]), in the order of first use.
    pub const CLIFFORD: [OpKind; 4] = [
        OpKind::CliffordSgpLayer,
        OpKind::CliffordFcLayer,
        OpKind::Add,
        OpKind::Mse,
    ];

    pub fn name(self) -> &'static str {
        match self {
            OpKind::Embedding => "embedding",
            OpKind::Add => "add",
            OpKind::LayerNorm => "layer_norm",
            OpKind::Matmul => "matmul",
            OpKind::FlashAttention => "flash attention (f16 core)",
            OpKind::Attention => "attention (scale + causal mask)",
            OpKind::Softmax => "softmax",
            OpKind::Gelu => "gelu",
            OpKind::Loss => "loss (softmax cross-entropy)",
            OpKind::CliffordSgpLayer => "clifford layer (sgp)",
            OpKind::CliffordFcLayer => "clifford layer (fcgp)",
            OpKind::Mse => "mse loss",
        }
    }

    /// Whether this kind's GPU path computes in half precision (f16 inputs and outputs), so that a
    /// correct GPU run of it diverges by that rounding ([`Model::half_tolerance`]).
    pub fn half_precision(self) -> bool {
        self == OpKind::FlashAttention
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

/// A model the harness trains, with its configuration.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Model {
    /// The transformer block of [`model`].
    Transformer(model::Config),
    /// The Clifford MLP of [`clifford_model`].
    Clifford(clifford_model::Config),
}

impl Default for Model {
    /// The transformer block with its default configuration.
    fn default() -> Self {
        Model::Transformer(model::Config::default())
    }
}

impl Model {
    /// Command-line names, in the order [`Model::parse`] lists them.
    pub const NAMES: [&'static str; 2] = ["transformer", "clifford"];

    /// From a command-line name (`transformer` or `clifford`), with the default configuration.
    pub fn parse(name: &str) -> Option<Model> {
        match name {
            "transformer" => Some(Model::Transformer(model::Config::default())),
            "clifford" => Some(Model::Clifford(clifford_model::Config::default())),
            _ => None,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Model::Transformer(_) => "transformer",
            Model::Clifford(_) => "clifford",
        }
    }

    /// The divergence [`bisect()`] tolerates for this model by default
    /// ([`BisectSettings::for_model`]). Transformer: 1e-4. Clifford MLP: 1e-3, because its three SGD
    /// steps amplify an op's relative error about 10x (a uniform 1e-6 perturbation of one op kind
    /// moves the gradients by 4e-6 to 1.4e-5; `bisect::tests`) and the GPU Clifford ops are held to
    /// 1e-5 per op against their references (`host/tests/gpu_clifford.rs`), which would leave no
    /// margin at 1e-4. A defect from a wrong index or constant moves it by far more than 1e-3.
    pub fn tolerance(&self) -> f64 {
        match self {
            Model::Transformer(_) => 1e-4,
            Model::Clifford(_) => 1e-3,
        }
    }

    /// The divergence [`bisect()`] tolerates by default in a run with a half-precision op kind on
    /// the GPU ([`OpKind::half_precision`]; [`BisectSettings::for_model`]). Transformer: 1e-2. Its
    /// f16 attention core rounds Q, K, V, O, P, dO, dS and the gradients to f16 (unit roundoff
    /// 2^-11 = 4.9e-4); the kernels are held to twice the error of a naive f16 attention, whose run
    /// diverges by about 1e-3 in the CPU stand-in (`bisect::tests`). A wrong mask, scale or index
    /// moves it by far more. Clifford MLP: its f32 tolerance (it has no half-precision kind).
    pub fn half_tolerance(&self) -> f64 {
        match self {
            Model::Transformer(_) => 1e-2,
            Model::Clifford(_) => self.tolerance(),
        }
    }

    /// The op kinds this model uses, in the order of their first use in its forward pass.
    pub fn kinds(&self) -> &'static [OpKind] {
        match self {
            Model::Transformer(_) => &OpKind::TRANSFORMER,
            Model::Clifford(_) => &OpKind::CLIFFORD,
        }
    }
}

impl fmt::Display for Model {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Model::Transformer(c) => write!(
                f,
                "transformer block: vocab {}, seq {}, d_model {}, d_ff {}, batch {}, lr {}",
                c.vocab, c.seq, c.d_model, c.d_ff, c.batch, c.lr
            ),
            Model::Clifford(c) => write!(
                f,
                "clifford MLP: {:?}, features {}, batch {}, layers sgp + fcgp (grade norm), \
                 residual, MSE; lr {}",
                c.algebra, c.features, c.batch, c.lr
            ),
        }
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

/// `p -= lr * grad` over named parameters and their gradients, in order (host-side f32, identical for
/// every plan); the models' `sgd`.
fn sgd_step<'a>(
    params: impl IntoIterator<Item = (&'static str, &'a mut crate::HostTensor)>,
    grads: impl IntoIterator<Item = (&'static str, &'a crate::HostTensor)>,
    lr: f32,
) -> crate::error::Result<()> {
    for ((name, t), (_, g)) in params.into_iter().zip(grads) {
        if t.shape != g.shape {
            return Err(crate::error::Error::Shape {
                op: "sgd",
                what: format!("gradient of {name} must have its parameter's shape"),
                expected: format!("{:?}", t.shape),
                got: g.shape.clone(),
            });
        }
        for (w, dw) in t.data.iter_mut().zip(&g.data) {
            *w -= lr * dw;
        }
    }
    Ok(())
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

    #[test]
    fn every_kind_belongs_to_a_model_and_models_parse() {
        for kind in OpKind::ALL {
            assert!(
                OpKind::TRANSFORMER.contains(&kind) || OpKind::CLIFFORD.contains(&kind),
                "{kind}"
            );
        }
        for name in Model::NAMES {
            assert_eq!(Model::parse(name).map(|m| m.name()), Some(name));
        }
        assert_eq!(Model::parse("resnet"), None);
        assert_eq!(Model::default().kinds(), &OpKind::TRANSFORMER[..]);
    }
}
