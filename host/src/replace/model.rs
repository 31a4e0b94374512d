//! A small transformer block, forward and backward written op by op through an [`Exec`]:
//!
//! ```text
//! x0 = embedding(tok_emb, tokens) + pos_emb          [B*S, D]
//! a  = layer_norm(x0; ln1)                           q, k, v = a Wq, a Wk, a Wv
//! o  = softmax(scale * q k^T + causal_mask) v        per sequence, one head of width D
//! x1 = x0 + o Wo
//! c  = layer_norm(x1; ln2)
//! x2 = x1 + (gelu(c W1 + b1) W2 + b2)
//! loss = mean cross-entropy(softmax(x2 Wout), targets)
//! ```
//!
//! The attention core (the `o` line) is one op kind, [`OpKind::FlashAttention`](super::OpKind):
//! FlashAttention in f16 on the GPU; on its reference, the composed ops (score product, scale and
//! mask, softmax, `P v`), each run by its own kind's backend ([`Exec::causal_attention`]).
//!
//! The backward uses each op's backward: matmul gradients are matmuls with transpose flags, then the
//! attention core's backward, `gelu_backward`, `layer_norm_backward`, `embedding_backward` and the
//! add backward (sums over broadcast dims). Training is plain SGD, `p -= lr * grad`, on the host (the
//! same f32 update for every plan). All f32 between ops.
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::matmul::Transpose::{No, Yes};
use crate::replace::exec::{Exec, reshape};
use crate::tensor::HostTensor;

/// Model and batch sizes, and the SGD learning rate. Attention has one head of width `d_model`, so
/// for the GPU's attention core `d_model` must be a head dim the flash kernels take
/// ([`flash_head_dim_supported`](crate::ops::attention::flash_head_dim_supported): a multiple of 8
/// up to 128); the references take any.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Config {
    pub vocab: usize,
    pub seq: usize,
    pub d_model: usize,
    pub d_ff: usize,
    pub batch: usize,
    pub lr: f32,
}

impl Default for Config {
    /// Tiny and odd-sized where the kernels allow: vocab 31, seq 13, d_model 64 (the smallest head
    /// dim of the flash kernels), d_ff 40, batch 2, lr 0.2.
    fn default() -> Self {
        Config {
            vocab: 31,
            seq: 13,
            d_model: 64,
            d_ff: 40,
            batch: 2,
            lr: 0.2,
        }
    }
}

impl Config {
    /// Tokens per batch, `B * S`.
    pub fn tokens(&self) -> usize {
        self.batch * self.seq
    }
}

/// The trainable parameters (and, with the same layout, their gradients).
#[derive(Clone, Debug, PartialEq)]
pub struct Params {
    pub tok_emb: HostTensor,
    pub pos_emb: HostTensor,
    pub ln1_gamma: HostTensor,
    pub ln1_beta: HostTensor,
    pub wq: HostTensor,
    pub wk: HostTensor,
    pub wv: HostTensor,
    pub wo: HostTensor,
    pub ln2_gamma: HostTensor,
    pub ln2_beta: HostTensor,
    pub w1: HostTensor,
    pub b1: HostTensor,
    pub w2: HostTensor,
    pub b2: HostTensor,
    pub w_out: HostTensor,
}

/// Gradients of the loss, one per parameter.
pub type Grads = Params;

impl Params {
    /// Every tensor with its name, in a fixed order.
    pub fn named(&self) -> [(&'static str, &HostTensor); 15] {
        [
            ("tok_emb", &self.tok_emb),
            ("pos_emb", &self.pos_emb),
            ("ln1_gamma", &self.ln1_gamma),
            ("ln1_beta", &self.ln1_beta),
            ("wq", &self.wq),
            ("wk", &self.wk),
            ("wv", &self.wv),
            ("wo", &self.wo),
            ("ln2_gamma", &self.ln2_gamma),
            ("ln2_beta", &self.ln2_beta),
            ("w1", &self.w1),
            ("b1", &self.b1),
            ("w2", &self.w2),
            ("b2", &self.b2),
            ("w_out", &self.w_out),
        ]
    }

    /// Mutable access in the order of [`Params::named`].
    pub fn named_mut(&mut self) -> [(&'static str, &mut HostTensor); 15] {
        [
            ("tok_emb", &mut self.tok_emb),
            ("pos_emb", &mut self.pos_emb),
            ("ln1_gamma", &mut self.ln1_gamma),
            ("ln1_beta", &mut self.ln1_beta),
            ("wq", &mut self.wq),
            ("wk", &mut self.wk),
            ("wv", &mut self.wv),
            ("wo", &mut self.wo),
            ("ln2_gamma", &mut self.ln2_gamma),
            ("ln2_beta", &mut self.ln2_beta),
            ("w1", &mut self.w1),
            ("b1", &mut self.b1),
            ("w2", &mut self.w2),
            ("b2", &mut self.b2),
            ("w_out", &mut self.w_out),
        ]
    }
}

/// splitmix64: a small seeded generator, so the library needs no RNG dependency.
pub(crate) struct SplitMix(pub(crate) u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    pub(crate) fn unit(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn below(&mut self, n: usize) -> u32 {
        (self.next() % n.max(1) as u64) as u32
    }
}

pub(crate) fn tensor(rng: &mut SplitMix, shape: &[usize], center: f32, spread: f32) -> HostTensor {
    let n: usize = shape.iter().product();
    HostTensor {
        data: (0..n).map(|_| center + spread * rng.unit()).collect(),
        shape: shape.to_vec(),
        dtype: DType::F32,
    }
}

/// Seeded parameters: embeddings uniform in [-1, 1), weights in +-1/sqrt(fan_in), layer-norm gammas
/// near 1, betas and biases near 0.
pub fn init(cfg: &Config, seed: u64) -> Params {
    let mut r = SplitMix(seed);
    let (v, s, d, f) = (cfg.vocab, cfg.seq, cfg.d_model, cfg.d_ff);
    let wd = 1.0 / (d.max(1) as f32).sqrt();
    let wf = 1.0 / (f.max(1) as f32).sqrt();
    Params {
        tok_emb: tensor(&mut r, &[v, d], 0.0, 1.0),
        pos_emb: tensor(&mut r, &[s, d], 0.0, 0.5),
        ln1_gamma: tensor(&mut r, &[d], 1.0, 0.1),
        ln1_beta: tensor(&mut r, &[d], 0.0, 0.1),
        wq: tensor(&mut r, &[d, d], 0.0, wd),
        wk: tensor(&mut r, &[d, d], 0.0, wd),
        wv: tensor(&mut r, &[d, d], 0.0, wd),
        wo: tensor(&mut r, &[d, d], 0.0, wd),
        ln2_gamma: tensor(&mut r, &[d], 1.0, 0.1),
        ln2_beta: tensor(&mut r, &[d], 0.0, 0.1),
        w1: tensor(&mut r, &[d, f], 0.0, wd),
        b1: tensor(&mut r, &[f], 0.0, 0.1),
        w2: tensor(&mut r, &[f, d], 0.0, wf),
        b2: tensor(&mut r, &[d], 0.0, 0.1),
        w_out: tensor(&mut r, &[d, v], 0.0, wd),
    }
}

/// Token ids and next-token targets, `B * S` each, row-major by sequence.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    pub tokens: Vec<u32>,
    pub targets: Vec<u32>,
}

/// A seeded batch: random tokens, each target the next token of its sequence (the last one random).
pub fn batch(cfg: &Config, seed: u64) -> Batch {
    let mut r = SplitMix(seed ^ 0x5EED);
    let tokens: Vec<u32> = (0..cfg.tokens()).map(|_| r.below(cfg.vocab)).collect();
    let targets = (0..cfg.tokens())
        .map(|i| {
            if (i + 1) % cfg.seq.max(1) == 0 {
                r.below(cfg.vocab)
            } else {
                tokens[i + 1]
            }
        })
        .collect();
    Batch { tokens, targets }
}

/// The loss of one batch and the gradient of every parameter.
pub fn loss_and_grads(ex: &Exec, cfg: &Config, p: &Params, batch: &Batch) -> Result<(f64, Grads)> {
    loss_and_grads_with(ex, cfg, p, batch, &mut |_, _| Ok(()))
}

/// The parameter names in the order the backward produces their gradients (the order
/// [`loss_and_grads_with`] reports them in).
pub const BACKWARD_ORDER: [&str; 15] = [
    "w_out",
    "b2",
    "w2",
    "b1",
    "w1",
    "ln2_gamma",
    "ln2_beta",
    "wo",
    "wq",
    "wk",
    "wv",
    "ln1_gamma",
    "ln1_beta",
    "pos_emb",
    "tok_emb",
];

/// [`loss_and_grads`], calling `on_grad(name, grad)` for each parameter as soon as the backward has
/// its gradient (in [`BACKWARD_ORDER`]): data-parallel training starts reducing a bucket of
/// gradients while the backward goes on.
pub fn loss_and_grads_with(
    ex: &Exec,
    cfg: &Config,
    p: &Params,
    batch: &Batch,
    on_grad: &mut dyn FnMut(&'static str, &HostTensor) -> Result<()>,
) -> Result<(f64, Grads)> {
    let (b, s, d) = (cfg.batch, cfg.seq, cfg.d_model);
    let n = cfg.tokens();
    for (what, len) in [
        ("tokens", batch.tokens.len()),
        ("targets", batch.targets.len()),
    ] {
        if len != n {
            return Err(Error::Length {
                what: if what == "tokens" {
                    "model batch tokens (B * S)"
                } else {
                    "model batch targets (B * S)"
                },
                expected: n,
                got: len,
            });
        }
    }
    let scale = 1.0 / (d.max(1) as f32).sqrt();

    // Forward.
    let h0 = ex.embedding(&p.tok_emb, &batch.tokens)?;
    let h0 = reshape(&h0, &[b, s, h0.shape[1]])?;
    let x0 = ex.add(&h0, &p.pos_emb)?;
    let x0 = reshape(&x0, &[n, x0.shape[2]])?;
    let (a, m1, r1) = ex.layer_norm(&x0, &p.ln1_gamma, &p.ln1_beta)?;
    let q2 = ex.matmul(&a, &p.wq, No, No)?;
    let k2 = ex.matmul(&a, &p.wk, No, No)?;
    let v2 = ex.matmul(&a, &p.wv, No, No)?;
    let q = reshape(&q2, &[b, s, q2.shape[1]])?;
    let k = reshape(&k2, &[b, s, k2.shape[1]])?;
    let v = reshape(&v2, &[b, s, v2.shape[1]])?;
    let core = ex.causal_attention(&q, &k, &v, scale)?;
    let o = reshape(&core.o, &[n, core.o.shape[2]])?;
    let att = ex.matmul(&o, &p.wo, No, No)?;
    let x1 = ex.add(&x0, &att)?;
    let (c, m2, r2) = ex.layer_norm(&x1, &p.ln2_gamma, &p.ln2_beta)?;
    let u = ex.matmul(&c, &p.w1, No, No)?;
    let u1 = ex.add(&u, &p.b1)?;
    let g = ex.gelu(&u1)?;
    let z = ex.matmul(&g, &p.w2, No, No)?;
    let z1 = ex.add(&z, &p.b2)?;
    let x2 = ex.add(&x1, &z1)?;
    let logits = ex.matmul(&x2, &p.w_out, No, No)?;
    let (loss, lp) = ex.loss(&logits, &batch.targets)?;

    // Backward.
    let dlogits = ex.loss_backward(&lp, &batch.targets)?;
    let dx2 = ex.matmul(&dlogits, &p.w_out, No, Yes)?;
    let dw_out = ex.matmul(&x2, &dlogits, Yes, No)?;
    on_grad("w_out", &dw_out)?;
    let (dx1_res, dz1) = ex.add_backward(&x1, &z1, &dx2)?;
    let (dz, db2) = ex.add_backward(&z, &p.b2, &dz1)?;
    on_grad("b2", &db2)?;
    let dg = ex.matmul(&dz, &p.w2, No, Yes)?;
    let dw2 = ex.matmul(&g, &dz, Yes, No)?;
    on_grad("w2", &dw2)?;
    let du1 = ex.gelu_backward(&u1, &dg)?;
    let (du, db1) = ex.add_backward(&u, &p.b1, &du1)?;
    on_grad("b1", &db1)?;
    let dc = ex.matmul(&du, &p.w1, No, Yes)?;
    let dw1 = ex.matmul(&c, &du, Yes, No)?;
    on_grad("w1", &dw1)?;
    let (dx1_mlp, dln2_gamma, dln2_beta) =
        ex.layer_norm_backward(&x1, &p.ln2_gamma, &m2, &r2, &dc)?;
    on_grad("ln2_gamma", &dln2_gamma)?;
    on_grad("ln2_beta", &dln2_beta)?;
    let dx1 = ex.add(&dx1_res, &dx1_mlp)?;
    let (dx0_res, datt) = ex.add_backward(&x0, &att, &dx1)?;
    let do2 = ex.matmul(&datt, &p.wo, No, Yes)?;
    let dwo = ex.matmul(&o, &datt, Yes, No)?;
    on_grad("wo", &dwo)?;
    let do3 = reshape(&do2, &[b, s, do2.shape[1]])?;
    let (dq, dk, dv) = ex.causal_attention_backward(&q, &k, &v, &core, &do3, scale)?;
    let (dq, dk, dv) = (
        reshape(&dq, &q2.shape)?,
        reshape(&dk, &k2.shape)?,
        reshape(&dv, &v2.shape)?,
    );
    let dwq = ex.matmul(&a, &dq, Yes, No)?;
    on_grad("wq", &dwq)?;
    let dwk = ex.matmul(&a, &dk, Yes, No)?;
    on_grad("wk", &dwk)?;
    let dwv = ex.matmul(&a, &dv, Yes, No)?;
    on_grad("wv", &dwv)?;
    let da_q = ex.matmul(&dq, &p.wq, No, Yes)?;
    let da_k = ex.matmul(&dk, &p.wk, No, Yes)?;
    let da_v = ex.matmul(&dv, &p.wv, No, Yes)?;
    let da = ex.add(&ex.add(&da_q, &da_k)?, &da_v)?;
    let (dx0_attn, dln1_gamma, dln1_beta) =
        ex.layer_norm_backward(&x0, &p.ln1_gamma, &m1, &r1, &da)?;
    on_grad("ln1_gamma", &dln1_gamma)?;
    on_grad("ln1_beta", &dln1_beta)?;
    let dx0 = ex.add(&dx0_res, &dx0_attn)?;
    let dx0 = reshape(&dx0, &h0.shape)?;
    let (dh0, dpos_emb) = ex.add_backward(&h0, &p.pos_emb, &dx0)?;
    on_grad("pos_emb", &dpos_emb)?;
    let dh0 = reshape(&dh0, &[n, dh0.shape[2]])?;
    let dtok_emb = ex.embedding_backward(&batch.tokens, &dh0, p.tok_emb.shape[0])?;
    on_grad("tok_emb", &dtok_emb)?;

    Ok((
        loss,
        Params {
            tok_emb: dtok_emb,
            pos_emb: dpos_emb,
            ln1_gamma: dln1_gamma,
            ln1_beta: dln1_beta,
            wq: dwq,
            wk: dwk,
            wv: dwv,
            wo: dwo,
            ln2_gamma: dln2_gamma,
            ln2_beta: dln2_beta,
            w1: dw1,
            b1: db1,
            w2: dw2,
            b2: db2,
            w_out: dw_out,
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

pub mod resident;
#[cfg(test)]
mod tests;
