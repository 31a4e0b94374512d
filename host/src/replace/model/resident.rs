//! The transformer block of [`super`], trained with every tensor on the GPU: the same math and the
//! same ops as [`super::loss_and_grads`] with every kind on the GPU ([`Plan::all_gpu`]), but the
//! activations, parameters and gradients stay device tensors between ops, so a training step costs
//! its kernels, not a host round trip per op. This is the step data-parallel training runs
//! ([`crate::dist::data_parallel`]); [`super::loss_and_grads`] stays the bisectable form.
//!
//! Two steps are phrased differently on the device, with the same values:
//! - the cross-entropy's one-hot targets are gathered rows of an identity matrix (an embedding
//!   lookup), not built on the host: `dlogits = (p - onehot) / N`, and the loss is
//!   `-mean ln sum(p * onehot)`, read back as one value a row;
//! - the attention core's dO scale (a power of two bringing `max |dO|` into [0.5, 1) before the
//!   f16 rounding, see the core's module) comes from a device max of `dO` and `-dO`; reading both
//!   maxima (one read) is the step's one wait for the GPU before its end (the loss is read after
//!   the backward is queued).
//!
//! [`Plan::all_gpu`]: crate::replace::Plan::all_gpu
use crate::device::Gpu;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::attention::{self, AttentionParams, Causal};
use crate::ops::elementwise::{self, BinaryOp};
use crate::ops::matmul::{self, Transpose::No, Transpose::Yes};
use crate::ops::{embedding, layer_norm, reduce, softmax};
use crate::replace::model::{BACKWARD_ORDER, Batch, Config, Params};
use crate::tensor::{HostTensor, Tensor};

/// The block's parameters on one GPU, in [`Params::named`] order.
pub struct Block {
    cfg: Config,
    gpu: Gpu,
    params: Vec<(&'static str, Tensor)>,
    /// `[vocab, vocab]` identity: row `t` is the one-hot of target `t`.
    eye: Tensor,
}

impl Block {
    /// Uploads `p` (shapes as [`super::init`] makes them for `cfg`).
    pub fn new(gpu: &Gpu, cfg: &Config, p: &Params) -> Result<Block> {
        let params = p
            .named()
            .iter()
            .map(|(n, t)| Ok((*n, Tensor::from_host(gpu, t)?)))
            .collect::<Result<Vec<_>>>()?;
        let v = cfg.vocab;
        let mut eye = vec![0f32; v * v];
        for i in 0..v {
            eye[i * v + i] = 1.0;
        }
        Ok(Block {
            cfg: *cfg,
            gpu: gpu.clone(),
            params,
            eye: Tensor::from_f32(gpu, &eye, &[v, v], DType::F32)?,
        })
    }

    /// The parameters, read back.
    pub fn params(&self) -> Result<Params> {
        to_params(&self.params, &self.cfg)
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    fn param(&self, name: &str) -> Result<&Tensor> {
        self.params
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, t)| t)
            .ok_or_else(|| Error::Invalid {
                op: "model::resident",
                msg: format!("no parameter `{name}`"),
            })
    }

    /// The batch's mean loss and every parameter's gradient (in [`BACKWARD_ORDER`]), calling
    /// `on_grad` with each as soon as the backward has it.
    pub fn loss_and_grads(
        &self,
        batch: &Batch,
        on_grad: &mut dyn FnMut(&'static str, &Tensor) -> Result<()>,
    ) -> Result<(f64, Vec<(&'static str, Tensor)>)> {
        let (b, s, d) = (self.cfg.batch, self.cfg.seq, self.cfg.d_model);
        let n = self.cfg.tokens();
        for (what, len) in [
            ("model batch tokens (B * S)", batch.tokens.len()),
            ("model batch targets (B * S)", batch.targets.len()),
        ] {
            if len != n {
                return Err(Error::Length {
                    what,
                    expected: n,
                    got: len,
                });
            }
        }
        let p = |name: &str| self.param(name);
        let scale = 1.0 / (d.max(1) as f32).sqrt();
        let core = AttentionParams {
            causal: Causal::Yes,
            scale: Some(scale),
            ..Default::default()
        };
        let heads = |t: &Tensor| elementwise::cast(t, DType::F16)?.reshape(&[b, 1, s, d]);
        let rows = |t: &Tensor, factor: f32| {
            let x = elementwise::cast(t, DType::F32)?.reshape(&[n, d])?;
            if factor == 1.0 {
                Ok(x)
            } else {
                elementwise::affine(&x, factor, 0.0)
            }
        };

        // Forward.
        let h0 = embedding::embedding(p("tok_emb")?, &batch.tokens[..])?.reshape(&[b, s, d])?;
        let x0 = elementwise::add(&h0, p("pos_emb")?)?.reshape(&[n, d])?;
        let (a, m1, r1) = layer_norm::layer_norm(&x0, p("ln1_gamma")?, p("ln1_beta")?, None)?;
        let q2 = matmul::matmul(&a, p("wq")?, No, No)?;
        let k2 = matmul::matmul(&a, p("wk")?, No, No)?;
        let v2 = matmul::matmul(&a, p("wv")?, No, No)?;
        let (qh, kh, vh) = (heads(&q2)?, heads(&k2)?, heads(&v2)?);
        let (oh, lse) = attention::flash_forward(&qh, &kh, &vh, &core)?;
        let o = rows(&oh, 1.0)?;
        let att = matmul::matmul(&o, p("wo")?, No, No)?;
        let x1 = elementwise::add(&x0, &att)?;
        let (c, m2, r2) = layer_norm::layer_norm(&x1, p("ln2_gamma")?, p("ln2_beta")?, None)?;
        let u = matmul::matmul(&c, p("w1")?, No, No)?;
        let u1 = elementwise::add(&u, p("b1")?)?;
        let g = elementwise::gelu(&u1)?;
        let z = matmul::matmul(&g, p("w2")?, No, No)?;
        let z1 = elementwise::add(&z, p("b2")?)?;
        let x2 = elementwise::add(&x1, &z1)?;
        let logits = matmul::matmul(&x2, p("w_out")?, No, No)?;
        let probs = softmax::softmax(&logits)?;
        let onehot = embedding::embedding(&self.eye, &batch.targets[..])?;
        // Read back after the backward is queued: a read here would stall the GPU mid-step.
        let p_target = reduce::sum(&elementwise::mul(&probs, &onehot)?, reduce::Axis::Last)?;

        // Backward.
        let mut grads: Vec<(&'static str, Tensor)> = Vec::with_capacity(BACKWARD_ORDER.len());
        let mut emit = |name: &'static str, t: Tensor| -> Result<()> {
            on_grad(name, &t)?;
            grads.push((name, t));
            Ok(())
        };
        let dlogits = elementwise::affine(
            &elementwise::sub(&probs, &onehot)?,
            1.0 / n.max(1) as f32,
            0.0,
        )?;
        let dx2 = matmul::matmul(&dlogits, p("w_out")?, No, Yes)?;
        emit("w_out", matmul::matmul(&x2, &dlogits, Yes, No)?)?;
        let (dx1_res, dz1) = elementwise::binary_backward(BinaryOp::Add, &x1, &z1, &dx2)?;
        let (dz, db2) = elementwise::binary_backward(BinaryOp::Add, &z, p("b2")?, &dz1)?;
        emit("b2", db2)?;
        let dg = matmul::matmul(&dz, p("w2")?, No, Yes)?;
        emit("w2", matmul::matmul(&g, &dz, Yes, No)?)?;
        let du1 = elementwise::gelu_backward(&u1, &dg)?;
        let (du, db1) = elementwise::binary_backward(BinaryOp::Add, &u, p("b1")?, &du1)?;
        emit("b1", db1)?;
        let dc = matmul::matmul(&du, p("w1")?, No, Yes)?;
        emit("w1", matmul::matmul(&c, &du, Yes, No)?)?;
        let (dx1_mlp, dg2, db2n) =
            layer_norm::layer_norm_backward(&x1, p("ln2_gamma")?, &m2, &r2, &dc)?;
        emit("ln2_gamma", dg2)?;
        emit("ln2_beta", db2n)?;
        let dx1 = elementwise::add(&dx1_res, &dx1_mlp)?;
        let (dx0_res, datt) = elementwise::binary_backward(BinaryOp::Add, &x0, &att, &dx1)?;
        let do2 = matmul::matmul(&datt, p("wo")?, No, Yes)?;
        emit("wo", matmul::matmul(&o, &datt, Yes, No)?)?;
        // The core's backward in f16, dO scaled by a power of two first (see the module doc).
        let gscale = grad_scale(&do2)?;
        let doh = heads(&elementwise::affine(&do2, gscale, 0.0)?)?;
        let gh = attention::flash_backward(&qh, &kh, &vh, &oh, &lse, &doh, &core)?;
        let (dq, dk, dv) = (
            rows(&gh.dq, 1.0 / gscale)?,
            rows(&gh.dk, 1.0 / gscale)?,
            rows(&gh.dv, 1.0 / gscale)?,
        );
        emit("wq", matmul::matmul(&a, &dq, Yes, No)?)?;
        emit("wk", matmul::matmul(&a, &dk, Yes, No)?)?;
        emit("wv", matmul::matmul(&a, &dv, Yes, No)?)?;
        let da = elementwise::add(
            &elementwise::add(
                &matmul::matmul(&dq, p("wq")?, No, Yes)?,
                &matmul::matmul(&dk, p("wk")?, No, Yes)?,
            )?,
            &matmul::matmul(&dv, p("wv")?, No, Yes)?,
        )?;
        let (dx0_attn, dg1, db1n) =
            layer_norm::layer_norm_backward(&x0, p("ln1_gamma")?, &m1, &r1, &da)?;
        emit("ln1_gamma", dg1)?;
        emit("ln1_beta", db1n)?;
        let dx0 = elementwise::add(&dx0_res, &dx0_attn)?.reshape(&[b, s, d])?;
        let (dh0, dpos) = elementwise::binary_backward(BinaryOp::Add, &h0, p("pos_emb")?, &dx0)?;
        emit("pos_emb", dpos)?;
        let dtok = embedding::embedding_backward(
            &batch.tokens[..],
            &dh0.reshape(&[n, d])?,
            self.cfg.vocab,
        )?;
        emit("tok_emb", dtok)?;
        let loss = p_target
            .to_vec()?
            .iter()
            .map(|&x| -(x as f64).ln())
            .sum::<f64>()
            / n.max(1) as f64;
        Ok((loss, grads))
    }

    /// `p -= lr * grad` for every parameter named in `grads` (on the GPU, the same f32 arithmetic
    /// as [`super::sgd`]).
    pub fn sgd(&mut self, grads: &[(&'static str, Tensor)], lr: f32) -> Result<()> {
        for (name, g) in grads {
            let i = self
                .params
                .iter()
                .position(|(n, _)| n == name)
                .ok_or_else(|| Error::Invalid {
                    op: "model::resident::sgd",
                    msg: format!("no parameter `{name}`"),
                })?;
            let step = elementwise::affine(g, -lr, 0.0)?;
            let updated =
                elementwise::add(&self.params[i].1, &step.reshape(self.params[i].1.shape())?)?;
            self.params[i].1 = updated;
        }
        Ok(())
    }
}

/// The power of two that brings `max |x|` into [0.5, 1) (1 for zero or non-finite), as the host
/// core's `grad_scale` computes it.
fn grad_scale(x: &Tensor) -> Result<f32> {
    // Both maxima land in one buffer so the host waits for the GPU once, not twice.
    let both = Tensor::empty(x.gpu(), &[2], DType::F32)?;
    both.narrow(0, 1)?
        .copy_from(&reduce::max(x, reduce::Axis::All)?.reshape(&[1])?)?;
    both.narrow(1, 1)?.copy_from(
        &reduce::max(&elementwise::affine(x, -1.0, 0.0)?, reduce::Axis::All)?.reshape(&[1])?,
    )?;
    let v = both.to_vec()?;
    let max = v[0].max(v[1]);
    if max == 0.0 || !max.is_finite() {
        return Ok(1.0);
    }
    let e = -(max.log2().floor() as i32) - 1;
    Ok(2f32.powi(e.clamp(-100, 100)))
}

/// Gradients read back as host tensors, in [`Params`] layout (for tests and checks).
pub fn grads_to_host(grads: &[(&'static str, Tensor)], cfg: &Config) -> Result<Params> {
    to_params(grads, cfg)
}

/// Named device tensors (parameters or their gradients) read back into [`Params`] layout, each in
/// its parameter's shape.
fn to_params(named: &[(&'static str, Tensor)], cfg: &Config) -> Result<Params> {
    // `init` gives the layout (names and shapes); every value is replaced.
    let mut out = super::init(cfg, 0);
    for (name, t) in out.named_mut() {
        let (_, g) = named
            .iter()
            .find(|(n, _)| *n == name)
            .ok_or_else(|| Error::Invalid {
                op: "model::resident",
                msg: format!("no tensor for `{name}`"),
            })?;
        *t = HostTensor::new(g.to_host()?.data, &t.shape.clone(), DType::F32)?;
    }
    Ok(out)
}
