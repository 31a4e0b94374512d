//! Explaining a small MLP end to end on the GPU: the forward pass keeps every layer's input, then
//! relevance flows from the output back to the input, one [`relevance`](super::relevance) call per
//! layer (all rows of the batch at once).
//!
//! ```no_run
//! use host::ops::lrp::{Linear, Nonlinearity, mlp::{MlpLayer, explain}};
//! use host::{DType, Gpu, HostTensor, Tensor};
//! # fn main() -> host::Result<()> {
//! let gpu = Gpu::new(0)?;
//! let w1 = HostTensor::new(vec![0.5; 8 * 4], &[8, 4], DType::F32)?;
//! let w2 = HostTensor::new(vec![0.25; 3 * 8], &[3, 8], DType::F32)?;
//! let layers = [
//!     MlpLayer::new(Linear::from_host(&gpu, &w1, None)?, Nonlinearity::Relu),
//!     MlpLayer::new(Linear::from_host(&gpu, &w2, None)?, Nonlinearity::Softmax),
//! ];
//! let x = Tensor::from_f32(&gpu, &[1.0, -2.0, 3.0, 0.5, 0.1, 0.2, 0.3, 0.4], &[2, 4], DType::F32)?;
//! let e = explain(&layers, &x, None)?; // start from the outputs themselves
//! assert_eq!(e.input_relevance().shape(), &[2, 4]);
//! # Ok(()) }
//! ```
use super::{Activation, GemmVariant, Linear, Nonlinearity, dense_variant, relevance_variant};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// One layer: parameters, the forward nonlinearity, and the activation description used for relevance
/// (the nonlinearity's preset unless replaced).
#[derive(Clone, Debug)]
pub struct MlpLayer {
    pub linear: Linear,
    pub nonlinearity: Nonlinearity,
    pub activation: Activation,
}

impl MlpLayer {
    pub fn new(linear: Linear, nonlinearity: Nonlinearity) -> Self {
        MlpLayer {
            linear,
            nonlinearity,
            activation: nonlinearity.preset(),
        }
    }
}

/// The forward activations and the relevance at every layer boundary.
#[derive(Clone, Debug)]
pub struct Explanation {
    /// `activations[0]` is the input, `activations[l + 1]` the output of layer `l`.
    pub activations: Vec<Tensor>,
    /// `relevance[l]` is the relevance of layer `l`'s input; the last entry is the starting relevance
    /// at the output.
    pub relevance: Vec<Tensor>,
}

impl Explanation {
    /// Relevance of the network's input features.
    pub fn input_relevance(&self) -> &Tensor {
        &self.relevance[0]
    }
}

/// Forward pass of `layers` on `x: [.., I0]`, keeping each layer's input.
pub fn forward(layers: &[MlpLayer], x: &Tensor) -> Result<Vec<Tensor>> {
    forward_variant(layers, x, GemmVariant::DEFAULT)
}

fn forward_variant(layers: &[MlpLayer], x: &Tensor, variant: GemmVariant) -> Result<Vec<Tensor>> {
    let mut acts = vec![x.clone()];
    for layer in layers {
        let next = dense_variant(
            &layer.linear,
            acts.last().expect("non-empty"),
            layer.nonlinearity,
            variant,
        )?;
        acts.push(next);
    }
    Ok(acts)
}

/// Runs the forward pass and propagates relevance from the output back to the input. `start` is the
/// relevance of the last layer's outputs (same shape); `None` starts from the outputs themselves.
pub fn explain(layers: &[MlpLayer], x: &Tensor, start: Option<&Tensor>) -> Result<Explanation> {
    explain_variant(layers, x, start, GemmVariant::DEFAULT)
}

/// [`explain`] with every GEMM pass on `variant`'s kernels (see `super::relevance_variant`).
#[doc(hidden)]
pub fn explain_variant(
    layers: &[MlpLayer],
    x: &Tensor,
    start: Option<&Tensor>,
    variant: GemmVariant,
) -> Result<Explanation> {
    const OP: &str = "lrp::mlp::explain";
    if layers.is_empty() {
        return Err(Error::Invalid {
            op: OP,
            msg: "an MLP needs at least one layer".into(),
        });
    }
    for (l, pair) in layers.windows(2).enumerate() {
        if pair[0].linear.out_features() != pair[1].linear.in_features() {
            return Err(Error::Shape {
                op: OP,
                what: format!("layer {} input must match layer {l}'s output", l + 1),
                expected: format!("in_features {}", pair[0].linear.out_features()),
                got: pair[1].linear.weight().shape().to_vec(),
            });
        }
    }
    let activations = forward_variant(layers, x, variant)?;
    let output = activations.last().expect("non-empty").clone();
    let mut rel = match start {
        Some(s) => {
            crate::ops::same_shape(
                OP,
                "start relevance must have the output's shape",
                output.shape(),
                s.shape(),
            )?;
            s.clone()
        }
        None => output,
    };
    let mut relevances = vec![rel.clone()];
    for (l, layer) in layers.iter().enumerate().rev() {
        rel = relevance_variant(
            &layer.linear,
            &activations[l],
            &rel,
            &layer.activation,
            variant,
        )?;
        relevances.push(rel.clone());
    }
    relevances.reverse();
    Ok(Explanation {
        activations,
        relevance: relevances,
    })
}
