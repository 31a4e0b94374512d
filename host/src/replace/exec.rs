//! The op dispatcher: every op the model calls, on host tensors, run by the backend the [`Plan`] names
//! for its [`OpKind`]. The reference path calls the op family's `reference` function; the GPU path
//! uploads the inputs, calls the typed launcher and downloads the outputs. Errors are the ops' own
//! (validation happens in the op, before any launch).
use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::ops::clifford::reference::{Forward as CliffordForward, LayerGrads, LayerParams};
use crate::ops::clifford::{self, GpMode, Layer};
use crate::ops::elementwise::{self, BinaryOp};
use crate::ops::matmul::{self, Transpose};
use crate::ops::{embedding, layer_norm, softmax};
use crate::replace::{Backend, OpKind, Plan};
use crate::tensor::{HostTensor, Tensor};

mod attention_core;
pub use attention_core::AttentionCoreForward;

/// What [`Backend::Gpu`] ops run on.
#[derive(Clone, Debug)]
pub enum Device {
    /// No device: a plan that puts any op on the GPU fails with [`Error::NoDevice`].
    None,
    /// A real GPU.
    Gpu(Gpu),
    /// A CPU stand-in for tests of the switching and naming logic: "GPU" ops run their reference, and
    /// every output of op kind `kind` is scaled by `1 + rel` (a defect that only shows when that kind
    /// is switched). For [`OpKind::FlashAttention`] the stand-in also rounds as a half-precision
    /// attention does (see [`Exec::causal_attention`]'s module), so `rel` 0 measures that rounding.
    Fake { kind: OpKind, rel: f32 },
}

/// Deliberately defective GPU paths, for proving that [`super::bisect()`] finds a bug. Each wraps the
/// real GPU op on the host side (no defective kernel is built or shipped) and only acts when its op
/// kind runs on the GPU (a real one; the flash defect also in its fake stand-in).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Planted {
    /// GELU forward that runs the kernel on each row minus its last element (an off-by-one in the
    /// row bound) and leaves that element 0.
    GeluOffByOne,
    /// Layer norm forward and backward with `eps` 1000 times the default.
    LayerNormEps,
    /// The flash attention core forward and backward without the causal mask: every query also sees
    /// the tokens after it (a dropped mask flag). Also acts in the core's CPU stand-in on a
    /// [`Device::Fake`] whose defect is in [`OpKind::FlashAttention`], so its naming is tested
    /// without a GPU.
    FlashAttentionNotCausal,
}

impl Planted {
    /// The op kind the defect lives in (what bisect must name).
    pub fn kind(self) -> OpKind {
        match self {
            Planted::GeluOffByOne => OpKind::Gelu,
            Planted::LayerNormEps => OpKind::LayerNorm,
            Planted::FlashAttentionNotCausal => OpKind::FlashAttention,
        }
    }

    /// Command-line names, in the order [`Planted::parse`] lists them.
    pub const NAMES: [&'static str; 3] = ["gelu", "layernorm", "flash"];

    /// From a command-line name: `gelu`, `layernorm` or `flash`.
    pub fn parse(name: &str) -> Option<Planted> {
        match name {
            "gelu" => Some(Planted::GeluOffByOne),
            "layernorm" | "layer_norm" => Some(Planted::LayerNormEps),
            "flash" => Some(Planted::FlashAttentionNotCausal),
            _ => None,
        }
    }
}

/// How one op call runs.
enum Run<'g> {
    /// The reference, its outputs scaled by `1 + rel` when given (the [`Device::Fake`] defect).
    Cpu(Option<f32>),
    Gpu(&'g Gpu),
}

/// Runs ops by a plan.
pub struct Exec<'d> {
    plan: Plan,
    device: &'d Device,
    planted: Option<Planted>,
}

fn up(gpu: &Gpu, t: &HostTensor) -> Result<Tensor> {
    Tensor::from_host(gpu, t)
}

fn scaled(t: HostTensor, rel: Option<f32>) -> HostTensor {
    match rel {
        None => t,
        Some(r) => HostTensor {
            data: t.data.iter().map(|v| v * (1.0 + r)).collect(),
            ..t
        },
    }
}

/// `t` viewed with another shape of the same element count (host tensors are always contiguous).
pub fn reshape(t: &HostTensor, shape: &[usize]) -> Result<HostTensor> {
    HostTensor::new(t.data.clone(), shape, t.dtype)
}

/// The `[S, S]` causal mask: 0 at and below the diagonal, -inf above it.
pub fn causal_mask(seq: usize) -> HostTensor {
    let data = (0..seq * seq)
        .map(|i| {
            if i % seq.max(1) > i / seq.max(1) {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    HostTensor {
        data,
        shape: vec![seq, seq],
        dtype: crate::DType::F32,
    }
}

/// Targets checked against the vocabulary (the same typed error the embedding reports for ids).
fn check_targets(op: &'static str, targets: &[u32], vocab: usize) -> Result<()> {
    match targets.iter().position(|&t| t as usize >= vocab) {
        None => Ok(()),
        Some(p) => Err(Error::IdOutOfRange {
            op,
            count: targets.iter().filter(|&&t| t as usize >= vocab).count() as u64,
            vocab,
            position: p,
            id: targets[p],
        }),
    }
}

impl<'d> Exec<'d> {
    pub fn new(plan: Plan, device: &'d Device) -> Exec<'d> {
        Exec {
            plan,
            device,
            planted: None,
        }
    }

    /// This executor with a planted defect in the GPU path of `planted.kind()`.
    pub fn with_planted(mut self, planted: Option<Planted>) -> Exec<'d> {
        self.planted = planted;
        self
    }

    pub fn plan(&self) -> Plan {
        self.plan
    }

    fn run(&self, kind: OpKind) -> Result<Run<'d>> {
        match (self.plan.backend(kind), self.device) {
            (Backend::Reference, _) => Ok(Run::Cpu(None)),
            (Backend::Gpu, Device::Gpu(gpu)) => Ok(Run::Gpu(gpu)),
            (Backend::Gpu, Device::Fake { kind: k, rel }) => {
                Ok(Run::Cpu((*k == kind).then_some(*rel)))
            }
            (Backend::Gpu, Device::None) => Err(Error::NoDevice {
                reason: format!("the plan runs {kind} on the GPU, but no GPU was given"),
            }),
        }
    }

    fn planted(&self, p: Planted) -> bool {
        self.planted == Some(p)
    }

    /// `op(a) op(b)` ([`OpKind::Matmul`]).
    pub fn matmul(
        &self,
        a: &HostTensor,
        b: &HostTensor,
        ta: Transpose,
        tb: Transpose,
    ) -> Result<HostTensor> {
        match self.run(OpKind::Matmul)? {
            Run::Cpu(rel) => Ok(scaled(matmul::reference::matmul(a, b, ta, tb)?, rel)),
            Run::Gpu(gpu) => matmul::matmul(&up(gpu, a)?, &up(gpu, b)?, ta, tb)?.to_host(),
        }
    }

    /// `a + b` with broadcasting ([`OpKind::Add`]).
    pub fn add(&self, a: &HostTensor, b: &HostTensor) -> Result<HostTensor> {
        match self.run(OpKind::Add)? {
            Run::Cpu(rel) => Ok(scaled(
                elementwise::reference::binary(BinaryOp::Add, a, b)?,
                rel,
            )),
            Run::Gpu(gpu) => elementwise::add(&up(gpu, a)?, &up(gpu, b)?)?.to_host(),
        }
    }

    /// Gradients of `a + b` for both operands, each summed to its shape ([`OpKind::Add`]).
    pub fn add_backward(
        &self,
        a: &HostTensor,
        b: &HostTensor,
        grad: &HostTensor,
    ) -> Result<(HostTensor, HostTensor)> {
        match self.run(OpKind::Add)? {
            Run::Cpu(rel) => {
                let (ga, gb) = elementwise::reference::binary_backward(BinaryOp::Add, a, b, grad)?;
                Ok((scaled(ga, rel), scaled(gb, rel)))
            }
            Run::Gpu(gpu) => {
                let (ga, gb) = elementwise::binary_backward(
                    BinaryOp::Add,
                    &up(gpu, a)?,
                    &up(gpu, b)?,
                    &up(gpu, grad)?,
                )?;
                Ok((ga.to_host()?, gb.to_host()?))
            }
        }
    }

    /// Layer norm `(y, mean, rstd)`, default eps ([`OpKind::LayerNorm`]).
    pub fn layer_norm(
        &self,
        x: &HostTensor,
        gamma: &HostTensor,
        beta: &HostTensor,
    ) -> Result<(HostTensor, HostTensor, HostTensor)> {
        match self.run(OpKind::LayerNorm)? {
            Run::Cpu(rel) => {
                let (y, m, r) = layer_norm::reference::layer_norm(x, gamma, beta, None)?;
                Ok((scaled(y, rel), m, r))
            }
            Run::Gpu(gpu) => {
                let eps = self.planted(Planted::LayerNormEps).then_some(
                    gpu::params::layer_norm::DEFAULT_EPS * 1000.0, // the planted defect
                );
                let (y, m, r) =
                    layer_norm::layer_norm(&up(gpu, x)?, &up(gpu, gamma)?, &up(gpu, beta)?, eps)?;
                Ok((y.to_host()?, m.to_host()?, r.to_host()?))
            }
        }
    }

    /// Layer norm backward `(dx, dgamma, dbeta)` ([`OpKind::LayerNorm`]).
    pub fn layer_norm_backward(
        &self,
        x: &HostTensor,
        gamma: &HostTensor,
        mean: &HostTensor,
        rstd: &HostTensor,
        dy: &HostTensor,
    ) -> Result<(HostTensor, HostTensor, HostTensor)> {
        match self.run(OpKind::LayerNorm)? {
            Run::Cpu(rel) => {
                let (dx, dg, db) =
                    layer_norm::reference::layer_norm_backward(x, gamma, mean, rstd, dy)?;
                Ok((scaled(dx, rel), scaled(dg, rel), scaled(db, rel)))
            }
            Run::Gpu(gpu) => {
                let (dx, dg, db) = layer_norm::layer_norm_backward(
                    &up(gpu, x)?,
                    &up(gpu, gamma)?,
                    &up(gpu, mean)?,
                    &up(gpu, rstd)?,
                    &up(gpu, dy)?,
                )?;
                Ok((dx.to_host()?, dg.to_host()?, db.to_host()?))
            }
        }
    }

    /// Rows of `table` picked by `ids` ([`OpKind::Embedding`]).
    pub fn embedding(&self, table: &HostTensor, ids: &[u32]) -> Result<HostTensor> {
        match self.run(OpKind::Embedding)? {
            Run::Cpu(rel) => Ok(scaled(embedding::reference::embedding(table, ids)?, rel)),
            Run::Gpu(gpu) => embedding::embedding(&up(gpu, table)?, ids)?.to_host(),
        }
    }

    /// Table gradient of an embedding lookup ([`OpKind::Embedding`]).
    pub fn embedding_backward(
        &self,
        ids: &[u32],
        dy: &HostTensor,
        vocab: usize,
    ) -> Result<HostTensor> {
        match self.run(OpKind::Embedding)? {
            Run::Cpu(rel) => Ok(scaled(
                embedding::reference::embedding_backward(ids, dy, vocab)?,
                rel,
            )),
            Run::Gpu(gpu) => embedding::embedding_backward(ids, &up(gpu, dy)?, vocab)?.to_host(),
        }
    }

    /// Exact GELU ([`OpKind::Gelu`]).
    pub fn gelu(&self, x: &HostTensor) -> Result<HostTensor> {
        match self.run(OpKind::Gelu)? {
            Run::Cpu(rel) => Ok(scaled(elementwise::reference::gelu(x)?, rel)),
            Run::Gpu(gpu) if self.planted(Planted::GeluOffByOne) => gelu_off_by_one(gpu, x),
            Run::Gpu(gpu) => elementwise::gelu(&up(gpu, x)?)?.to_host(),
        }
    }

    /// GELU backward ([`OpKind::Gelu`]).
    pub fn gelu_backward(&self, x: &HostTensor, dy: &HostTensor) -> Result<HostTensor> {
        match self.run(OpKind::Gelu)? {
            Run::Cpu(rel) => Ok(scaled(elementwise::reference::gelu_backward(x, dy)?, rel)),
            Run::Gpu(gpu) => elementwise::gelu_backward(&up(gpu, x)?, &up(gpu, dy)?)?.to_host(),
        }
    }

    /// Softmax over the last dim ([`OpKind::Softmax`]).
    pub fn softmax(&self, x: &HostTensor) -> Result<HostTensor> {
        match self.run(OpKind::Softmax)? {
            Run::Cpu(rel) => Ok(scaled(softmax::reference::softmax(x)?, rel)),
            Run::Gpu(gpu) => softmax::softmax(&up(gpu, x)?)?.to_host(),
        }
    }

    /// Softmax backward from the forward output ([`OpKind::Softmax`]).
    pub fn softmax_backward(&self, y: &HostTensor, dy: &HostTensor) -> Result<HostTensor> {
        match self.run(OpKind::Softmax)? {
            Run::Cpu(rel) => Ok(scaled(softmax::reference::softmax_backward(y, dy)?, rel)),
            Run::Gpu(gpu) => softmax::softmax_backward(&up(gpu, y)?, &up(gpu, dy)?)?.to_host(),
        }
    }

    /// `scale * scores + mask` (mask broadcast over the batch) ([`OpKind::Attention`]).
    pub fn attention_mask(
        &self,
        scores: &HostTensor,
        mask: &HostTensor,
        scale: f32,
    ) -> Result<HostTensor> {
        match self.run(OpKind::Attention)? {
            Run::Cpu(rel) => {
                let s = elementwise::reference::affine(scores, scale, 0.0)?;
                Ok(scaled(
                    elementwise::reference::binary(BinaryOp::Add, &s, mask)?,
                    rel,
                ))
            }
            Run::Gpu(gpu) => {
                let s = elementwise::affine(&up(gpu, scores)?, scale, 0.0)?;
                elementwise::add(&s, &up(gpu, mask)?)?.to_host()
            }
        }
    }

    /// Gradient of [`Exec::attention_mask`] for the scores: `scale * grad` ([`OpKind::Attention`]).
    pub fn attention_mask_backward(&self, grad: &HostTensor, scale: f32) -> Result<HostTensor> {
        match self.run(OpKind::Attention)? {
            Run::Cpu(rel) => Ok(scaled(
                elementwise::reference::affine(grad, scale, 0.0)?,
                rel,
            )),
            Run::Gpu(gpu) => elementwise::affine(&up(gpu, grad)?, scale, 0.0)?.to_host(),
        }
    }

    /// Softmax cross-entropy of `[N, V]` logits against `N` targets: `(mean loss, probabilities)`.
    /// The probabilities come from the backend; the scalar `-mean log p[target]` is taken on the host
    /// in f64 from them ([`OpKind::Loss`]).
    pub fn loss(&self, logits: &HostTensor, targets: &[u32]) -> Result<(f64, HostTensor)> {
        const OP: &str = "softmax cross-entropy";
        let (n, vocab) = rows_vocab(OP, logits, targets)?;
        check_targets(OP, targets, vocab)?;
        let p = match self.run(OpKind::Loss)? {
            Run::Cpu(rel) => scaled(softmax::reference::softmax(logits)?, rel),
            Run::Gpu(gpu) => softmax::softmax(&up(gpu, logits)?)?.to_host()?,
        };
        let sum: f64 = targets
            .iter()
            .enumerate()
            .map(|(i, &t)| -(p.data[i * vocab + t as usize] as f64).ln())
            .sum();
        Ok((sum / n.max(1) as f64, p))
    }

    /// Gradient of the mean loss for the logits: `(p - onehot(targets)) / N` ([`OpKind::Loss`]).
    pub fn loss_backward(&self, probs: &HostTensor, targets: &[u32]) -> Result<HostTensor> {
        const OP: &str = "softmax cross-entropy backward";
        let (n, vocab) = rows_vocab(OP, probs, targets)?;
        check_targets(OP, targets, vocab)?;
        let mut onehot = vec![0.0f32; n * vocab];
        for (i, &t) in targets.iter().enumerate() {
            onehot[i * vocab + t as usize] = 1.0;
        }
        let onehot = HostTensor::new(onehot, &probs.shape, probs.dtype)?;
        let inv_n = 1.0 / n.max(1) as f32;
        match self.run(OpKind::Loss)? {
            Run::Cpu(rel) => {
                let d = elementwise::reference::binary(BinaryOp::Sub, probs, &onehot)?;
                Ok(scaled(elementwise::reference::affine(&d, inv_n, 0.0)?, rel))
            }
            Run::Gpu(gpu) => {
                let d = elementwise::sub(&up(gpu, probs)?, &up(gpu, &onehot)?)?;
                elementwise::affine(&d, inv_n, 0.0)?.to_host()
            }
        }
    }
}

/// The op kind that runs a Clifford layer of this mode.
pub fn clifford_kind(mode: GpMode) -> OpKind {
    match mode {
        GpMode::PerFeature => OpKind::CliffordSgpLayer,
        GpMode::FullyConnected => OpKind::CliffordFcLayer,
    }
}

impl Exec<'_> {
    /// Clifford layer forward (`out` and, normalised, the grade norms) ([`OpKind::CliffordSgpLayer`]
    /// or [`OpKind::CliffordFcLayer`] by `p.mode`).
    pub fn clifford_layer(&self, p: &LayerParams, x: &HostTensor) -> Result<CliffordForward> {
        match self.run(clifford_kind(p.mode))? {
            Run::Cpu(rel) => {
                let f = p.forward(x)?;
                Ok(CliffordForward {
                    out: scaled(f.out, rel),
                    norms: f.norms,
                })
            }
            Run::Gpu(gpu) => {
                let f = Layer::from_host(gpu, p)?.forward(&up(gpu, x)?)?;
                Ok(CliffordForward {
                    out: f.out.to_host()?,
                    norms: f.norms.map(|r| r.to_host()).transpose()?,
                })
            }
        }
    }

    /// Clifford layer backward from the forward's saved state (same kind as [`Exec::clifford_layer`]).
    pub fn clifford_layer_backward(
        &self,
        p: &LayerParams,
        x: &HostTensor,
        fwd: &CliffordForward,
        grad_out: &HostTensor,
    ) -> Result<LayerGrads> {
        match self.run(clifford_kind(p.mode))? {
            Run::Cpu(rel) => {
                let g = p.backward(x, fwd, grad_out)?;
                Ok(LayerGrads {
                    grad_x: scaled(g.grad_x, rel),
                    grad_linear_weight: scaled(g.grad_linear_weight, rel),
                    grad_linear_bias: scaled(g.grad_linear_bias, rel),
                    grad_gp_weight: scaled(g.grad_gp_weight, rel),
                })
            }
            Run::Gpu(gpu) => {
                let saved = clifford::Forward {
                    out: up(gpu, &fwd.out)?,
                    norms: fwd.norms.as_ref().map(|r| up(gpu, r)).transpose()?,
                    linear_out: None,
                };
                let g = Layer::from_host(gpu, p)?.backward(
                    &up(gpu, x)?,
                    &saved,
                    &up(gpu, grad_out)?,
                )?;
                Ok(LayerGrads {
                    grad_x: g.grad_x.to_host()?,
                    grad_linear_weight: g.grad_linear_weight.to_host()?,
                    grad_linear_bias: g.grad_linear_bias.to_host()?,
                    grad_gp_weight: g.grad_gp_weight.to_host()?,
                })
            }
        }
    }

    /// Mean squared error of `out` against `target` (equal shapes): `(mean(diff^2), diff)` with
    /// `diff = out - target` from the backend; the scalar is taken on the host in f64 ([`OpKind::Mse`]).
    pub fn mse(&self, out: &HostTensor, target: &HostTensor) -> Result<(f64, HostTensor)> {
        const OP: &str = "mse";
        if out.shape != target.shape {
            return Err(Error::Shape {
                op: OP,
                what: "the target must have the output's shape".into(),
                expected: format!("{:?}", out.shape),
                got: target.shape.clone(),
            });
        }
        let diff = match self.run(OpKind::Mse)? {
            Run::Cpu(rel) => scaled(
                elementwise::reference::binary(BinaryOp::Sub, out, target)?,
                rel,
            ),
            Run::Gpu(gpu) => elementwise::sub(&up(gpu, out)?, &up(gpu, target)?)?.to_host()?,
        };
        let sum: f64 = diff.data.iter().map(|&d| d as f64 * d as f64).sum();
        Ok((sum / diff.numel().max(1) as f64, diff))
    }

    /// Gradient of [`Exec::mse`] for the output: `2 diff / numel` ([`OpKind::Mse`]).
    pub fn mse_backward(&self, diff: &HostTensor) -> Result<HostTensor> {
        let k = 2.0 / diff.numel().max(1) as f32;
        match self.run(OpKind::Mse)? {
            Run::Cpu(rel) => Ok(scaled(elementwise::reference::affine(diff, k, 0.0)?, rel)),
            Run::Gpu(gpu) => elementwise::affine(&up(gpu, diff)?, k, 0.0)?.to_host(),
        }
    }
}

/// `(N, V)` of `[N, V]` logits with `N` targets.
fn rows_vocab(op: &'static str, logits: &HostTensor, targets: &[u32]) -> Result<(usize, usize)> {
    match logits.shape[..] {
        [n, v] if n == targets.len() => Ok((n, v)),
        _ => Err(Error::Shape {
            op,
            what: format!("logits must be [N, V] with N = {} targets", targets.len()),
            expected: format!("[{}, V]", targets.len()),
            got: logits.shape.clone(),
        }),
    }
}

/// The planted defect [`Planted::GeluOffByOne`]: the real GELU kernel on each row without its last
/// element; that element is left 0.
fn gelu_off_by_one(gpu: &Gpu, x: &HostTensor) -> Result<HostTensor> {
    let cols = x.shape.last().copied().unwrap_or(0);
    let rows = x.numel().checked_div(cols).unwrap_or(0);
    let short = cols.saturating_sub(1);
    let mut out = vec![0.0f32; x.numel()];
    if rows * short > 0 {
        let trimmed: Vec<f32> = x
            .data
            .chunks(cols)
            .flat_map(|r| r[..short].iter().copied())
            .collect();
        let t = HostTensor::new(trimmed, &[rows, short], x.dtype)?;
        let y = elementwise::gelu(&up(gpu, &t)?)?.to_host()?;
        for (o, yr) in out.chunks_mut(cols).zip(y.data.chunks(short)) {
            o[..short].copy_from_slice(yr);
        }
    }
    HostTensor::new(out, &x.shape, x.dtype)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    #[test]
    fn causal_mask_hides_the_future() {
        let m = causal_mask(3);
        let inf = f32::NEG_INFINITY;
        assert_eq!(m.data, vec![0., inf, inf, 0., 0., inf, 0., 0., 0.]);
    }

    #[test]
    fn gpu_plan_without_device_is_a_typed_error() {
        let x = HostTensor::new(vec![1.0; 4], &[2, 2], DType::F32).unwrap();
        let exec = Exec::new(Plan::all_gpu(), &Device::None);
        assert!(matches!(exec.gelu(&x), Err(Error::NoDevice { .. })));
    }

    #[test]
    fn fake_device_perturbs_only_its_kind() {
        let dev = Device::Fake {
            kind: OpKind::Gelu,
            rel: 0.5,
        };
        let exec = Exec::new(Plan::all_gpu(), &dev);
        let x = HostTensor::new(vec![1.0, 2.0], &[1, 2], DType::F32).unwrap();
        let reference = elementwise::reference::gelu(&x).unwrap();
        assert_eq!(exec.gelu(&x).unwrap().data[0], reference.data[0] * 1.5);
        let p = exec.softmax(&x).unwrap();
        assert_eq!(p, softmax::reference::softmax(&x).unwrap());
    }

    #[test]
    fn loss_is_mean_negative_log_probability_and_checks_targets() {
        let exec = Exec::new(Plan::all_reference(), &Device::None);
        let logits = HostTensor::new(vec![0.0; 6], &[2, 3], DType::F32).unwrap();
        let (loss, p) = exec.loss(&logits, &[0, 2]).unwrap();
        assert!((loss - 3f64.ln()).abs() < 1e-6);
        let d = exec.loss_backward(&p, &[0, 2]).unwrap();
        assert!((d.data[0] - (1.0 / 3.0 - 1.0) / 2.0).abs() < 1e-7);
        assert!(matches!(
            exec.loss(&logits, &[0, 3]),
            Err(Error::IdOutOfRange {
                id: 3,
                vocab: 3,
                position: 1,
                ..
            })
        ));
        assert!(matches!(exec.loss(&logits, &[0]), Err(Error::Shape { .. })));
    }
}
