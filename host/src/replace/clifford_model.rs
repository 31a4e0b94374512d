//! A small Clifford MLP, forward and backward written op by op through an [`Exec`]:
//!
//! ```text
//! h1   = Layer_sgp(x)          per-grade linear + bias, MV-GELU gates, per-feature GP, grade RMS norm
//! h2   = Layer_fcgp(h1)        the same with the fully connected GP
//! out  = h2 + h1               residual
//! loss = mean((out - target)^2)
//! ```
//!
//! Multivectors are `(C, B, N)` f32 (see `ops::clifford`); both layers keep N features. Parameters
//! follow the init of docs/math/clifford.md ([`LayerParams::init`]: gp weights `N(0, 1/(dims+1))`, linear weights std
//! `1/sqrt(N (dims+1))` or `1/sqrt(N)` fully connected, bias 0). The backward uses each op's backward:
//! the MSE gradient, the add backward, each layer's backward (grad_x, linear weight and bias, gp
//! weight), and an add to sum the two paths into `h1`. Training is plain SGD on the host, the same
//! f32 update for every plan.
//!
//! Op kinds: [`OpKind::CliffordSgpLayer`], [`OpKind::CliffordFcLayer`], [`OpKind::Add`],
//! [`OpKind::Mse`] ([`OpKind::CLIFFORD`]).
//!
//! [`OpKind::CliffordSgpLayer`]: crate::replace::OpKind::CliffordSgpLayer
//! [`OpKind::CliffordFcLayer`]: crate::replace::OpKind::CliffordFcLayer
//! [`OpKind::Add`]: crate::replace::OpKind::Add
//! [`OpKind::Mse`]: crate::replace::OpKind::Mse
//! [`OpKind::CLIFFORD`]: crate::replace::OpKind::CLIFFORD
use crate::error::{Error, Result};
use crate::ops::clifford::reference::LayerParams;
use crate::ops::clifford::{Algebra, GpMode, Normalize};
use crate::replace::bisect::TrainStep;
use crate::replace::exec::Exec;
use crate::replace::model::{SplitMix, tensor};
use crate::tensor::HostTensor;

/// Model and batch sizes, and the SGD learning rate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Config {
    pub algebra: Algebra,
    /// Features N of the input and of both layers.
    pub features: usize,
    pub batch: usize,
    pub lr: f32,
}

impl Default for Config {
    /// Cl(3,0), 9 features, batch 6, lr 0.2. Nine features keep the grade norm's mean over more
    /// than a handful of features, where its backward does not cancel to f32 noise (see
    /// `host/tests/gpu_clifford.rs`, `grad_tol`). At lr 0.2 the loss falls steadily (about 1.36,
    /// 1.19, 1.05 for seed 1) and three steps amplify an op's relative error about 10x; at 0.5 up
    /// to 60x.
    fn default() -> Self {
        Config {
            algebra: Algebra::Cl3,
            features: 9,
            batch: 6,
            lr: 0.2,
        }
    }
}

impl Config {
    /// The shape of the input, the output and the target: `(C, B, N)`.
    pub fn shape(&self) -> [usize; 3] {
        [self.algebra.components(), self.batch, self.features]
    }
}

/// The trainable parameters (and, with the same layout, their gradients): the sgp layer, then the
/// fcgp layer.
#[derive(Clone, Debug)]
pub struct Params {
    pub sgp: LayerParams,
    pub fc: LayerParams,
}

/// Gradients of the loss, one per parameter tensor.
pub type Grads = Params;

impl Params {
    /// Every tensor with its name, in a fixed order.
    pub fn named(&self) -> [(&'static str, &HostTensor); 6] {
        [
            ("sgp.linear_weight", &self.sgp.linear_weight),
            ("sgp.linear_bias", &self.sgp.linear_bias),
            ("sgp.gp_weight", &self.sgp.gp_weight),
            ("fc.linear_weight", &self.fc.linear_weight),
            ("fc.linear_bias", &self.fc.linear_bias),
            ("fc.gp_weight", &self.fc.gp_weight),
        ]
    }

    /// Mutable access in the order of [`Params::named`].
    pub fn named_mut(&mut self) -> [(&'static str, &mut HostTensor); 6] {
        [
            ("sgp.linear_weight", &mut self.sgp.linear_weight),
            ("sgp.linear_bias", &mut self.sgp.linear_bias),
            ("sgp.gp_weight", &mut self.sgp.gp_weight),
            ("fc.linear_weight", &mut self.fc.linear_weight),
            ("fc.linear_bias", &mut self.fc.linear_bias),
            ("fc.gp_weight", &mut self.fc.gp_weight),
        ]
    }
}

/// Seeded parameters by the init of docs/math/clifford.md; both layers normalise.
pub fn init(cfg: &Config, seed: u64) -> Result<Params> {
    let layer =
        |mode, seed| LayerParams::init(cfg.algebra, cfg.features, mode, Normalize::Yes, seed);
    Ok(Params {
        sgp: layer(GpMode::PerFeature, seed)?,
        fc: layer(GpMode::FullyConnected, seed ^ 0xC11F_F0CD)?,
    })
}

/// One batch: input multivectors and the target the output is fitted to.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    pub x: HostTensor,
    pub target: HostTensor,
}

/// A seeded batch: input uniform in [-1, 1), target uniform in [-1, 1).
pub fn batch(cfg: &Config, seed: u64) -> Result<Batch> {
    let mut r = SplitMix(seed ^ 0xC1_1FF0);
    let shape = cfg.shape();
    Ok(Batch {
        x: tensor(&mut r, &shape, 0.0, 1.0),
        target: tensor(&mut r, &shape, 0.0, 1.0),
    })
}

/// The mean squared error of one batch and the gradient of every parameter.
pub fn loss_and_grads(ex: &Exec, cfg: &Config, p: &Params, batch: &Batch) -> Result<(f64, Grads)> {
    let shape = cfg.shape();
    for (what, t) in [("x", &batch.x), ("target", &batch.target)] {
        if t.shape != shape {
            return Err(Error::Shape {
                op: "clifford model",
                what: format!("the batch's {what} must be (C, B, N) of the model's config"),
                expected: format!("{shape:?}"),
                got: t.shape.clone(),
            });
        }
    }

    // Forward.
    let f1 = ex.clifford_layer(&p.sgp, &batch.x)?;
    let f2 = ex.clifford_layer(&p.fc, &f1.out)?;
    let out = ex.add(&f2.out, &f1.out)?;
    let (loss, diff) = ex.mse(&out, &batch.target)?;

    // Backward.
    let dout = ex.mse_backward(&diff)?;
    let (dh2, dh1_res) = ex.add_backward(&f2.out, &f1.out, &dout)?;
    let g2 = ex.clifford_layer_backward(&p.fc, &f1.out, &f2, &dh2)?;
    let dh1 = ex.add(&dh1_res, &g2.grad_x)?;
    let g1 = ex.clifford_layer_backward(&p.sgp, &batch.x, &f1, &dh1)?;

    let grads = |lp: &LayerParams, g: crate::ops::clifford::reference::LayerGrads| LayerParams {
        linear_weight: g.grad_linear_weight,
        linear_bias: g.grad_linear_bias,
        gp_weight: g.grad_gp_weight,
        ..lp.clone()
    };
    Ok((
        loss,
        Params {
            sgp: grads(&p.sgp, g1),
            fc: grads(&p.fc, g2),
        },
    ))
}

/// `p -= lr * grad` for every parameter (host-side f32, identical for every plan).
pub fn sgd(p: &mut Params, grads: &Grads, lr: f32) -> Result<()> {
    super::sgd_step(p.named_mut(), grads.named(), lr)
}

/// One training step's loss and gradients (taken before the update).
#[derive(Clone, Debug)]
pub struct Step {
    pub loss: f64,
    pub grads: Grads,
}

impl TrainStep for Step {
    fn loss(&self) -> f64 {
        self.loss
    }
    fn named_grads(&self) -> Vec<(&'static str, &HostTensor)> {
        self.grads.named().to_vec()
    }
}

/// `steps` SGD steps on one batch; `params` are updated in place.
pub fn train(
    ex: &Exec,
    cfg: &Config,
    params: &mut Params,
    batch: &Batch,
    steps: usize,
) -> Result<Vec<Step>> {
    let mut out = Vec::with_capacity(steps);
    for _ in 0..steps {
        let (loss, grads) = loss_and_grads(ex, cfg, params, batch)?;
        sgd(params, &grads, cfg.lr)?;
        out.push(Step { loss, grads });
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
