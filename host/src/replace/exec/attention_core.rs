//! The transformer block's attention core as one op kind ([`OpKind::FlashAttention`]): causal
//! `O = softmax(scale Q K^T + mask) V` per sequence, Q, K, V and O `[B, S, D]` (one head of width
//! `D`), and its backward `dO -> dQ, dK, dV`.
//!
//! - [`Backend::Reference`](crate::replace::Backend::Reference): the composed ops, each run by the
//!   backend of its own kind, exactly as the block ran them before the core was one kind: the score
//!   product and `P V` ([`OpKind::Matmul`]), scale and causal mask ([`OpKind::Attention`]), softmax
//!   ([`OpKind::Softmax`]) and their backwards. With every kind on its reference this is the
//!   all-reference baseline, unchanged; a plan that puts one of those kinds on the GPU still runs its
//!   kernel here, so each stays bisectable on its own.
//! - [`Backend::Gpu`](crate::replace::Backend::Gpu): `flash_forward` and `flash_backward` in f16 on
//!   the `[B, 1, S, D]` head layout; the forward's O and LSE are what the backward takes. f16 rather
//!   than bf16 because its unit roundoff is 8 times smaller (2^-11 against 2^-8), so the rounding of
//!   the core's inputs and outputs moves training 8 times less, and f16's narrower range does not
//!   matter here: Q, K, V and O are O(1) (projections of layer-normed rows), and dO (about 1/N of the
//!   logits' scale) is multiplied by a power of two into [0.5, 1) before it is rounded and divided by
//!   it after, both exact, so small gradients keep f16's full precision instead of falling into its
//!   subnormals.
//! - On a [`Device::Fake`](super::Device::Fake) whose defect is in this kind, the GPU stand-in is the
//!   attention family's same-precision naive reference in f16 (`reference::forward_and_naive`,
//!   `backward_and_naive`: S, P, dP, dS and the outputs rounded to f16 where a naive half-precision
//!   attention stores them, on the same f16-rounded inputs and scaled dO), its outputs scaled by
//!   `1 + rel`. The flash kernels are held to twice that naive computation's error
//!   (docs/math/attention.md), so with `rel` 0 it measures the divergence a correct GPU core may
//!   cause, without a GPU. The planted defect [`Planted::FlashAttentionNotCausal`] acts in this
//!   stand-in too, so that bisect's naming of it is tested without a GPU.
use super::{Exec, Planted, Run, causal_mask, scaled, up};
use crate::DType;
use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::ops::attention::{self, AttentionParams, Causal, reference};
use crate::ops::matmul::Transpose::{No, Yes};
use crate::replace::OpKind;
use crate::tensor::HostTensor;

/// The attention core's forward result and what its backward needs (the backend that made it).
#[derive(Clone, Debug)]
pub struct AttentionCoreForward {
    /// O `[B, S, D]`, f32.
    pub o: HostTensor,
    saved: Saved,
}

#[derive(Clone, Debug)]
enum Saved {
    /// The composed path's softmax output P `[B, S, S]`.
    Probs(HostTensor),
    /// The flash path's (or its stand-in's) row log-sum-exp `[B, 1, S]`, f32; O (f16 values in f32)
    /// and it are what the backward kernel takes.
    Lse(HostTensor),
}

const OP: &str = "attention core";

/// `(B, S, D)` of a `[B, S, D]` operand, which all three must share.
fn check(q: &HostTensor, k: &HostTensor, v: &HostTensor) -> Result<()> {
    for (name, t) in [("q", q), ("k", k), ("v", v)] {
        if t.shape.len() != 3 || t.shape != q.shape {
            return Err(Error::Shape {
                op: OP,
                what: format!("{name} must be [batch, seq, head_dim], the shape of q"),
                expected: format!("{:?}", q.shape),
                got: t.shape.clone(),
            });
        }
    }
    Ok(())
}

/// `t` `[B, S, D]` as the flash kernels' `[B, 1, S, D]` in f16 (rounded as the upload rounds).
fn to_heads_f16(t: &HostTensor) -> Result<HostTensor> {
    let [b, s, d] = t.shape[..] else {
        return Err(Error::Shape {
            op: OP,
            what: "operand must be [batch, seq, head_dim]".into(),
            expected: "rank 3".into(),
            got: t.shape.clone(),
        });
    };
    HostTensor::new(t.data.clone(), &[b, 1, s, d], DType::F16)
}

/// `[B, 1, S, D]` back to the model's `[B, S, D]` f32, every value times `factor` (a power of two:
/// exact).
fn from_heads(t: &HostTensor, factor: f32) -> Result<HostTensor> {
    let [b, 1, s, d] = t.shape[..] else {
        return Err(Error::Shape {
            op: OP,
            what: "result must be [batch, 1, seq, head_dim]".into(),
            expected: "[B, 1, S, D]".into(),
            got: t.shape.clone(),
        });
    };
    HostTensor::new(
        t.data.iter().map(|&x| x * factor).collect(),
        &[b, s, d],
        DType::F32,
    )
}

/// The power of two `2^e` that brings `max |d_o|` into [0.5, 1) (1 for an all-zero or non-finite
/// gradient, which then reaches the kernel as it is; NaN is left to propagate).
fn grad_scale(d_o: &HostTensor) -> f32 {
    let max = d_o.data.iter().fold(0f32, |m, x| m.max(x.abs()));
    if max == 0.0 || !max.is_finite() {
        return 1.0;
    }
    let e = -(max.log2().floor() as i32) - 1;
    2f32.powi(e.clamp(-100, 100))
}

/// dO scaled by `s` and rounded to f16 in the head layout.
fn scaled_grad_f16(d_o: &HostTensor, s: f32) -> Result<HostTensor> {
    let t = HostTensor::new(
        d_o.data.iter().map(|&x| x * s).collect(),
        &d_o.shape,
        DType::F32,
    )?;
    to_heads_f16(&t)
}

impl Exec<'_> {
    fn core_params(&self, scale: f32) -> AttentionParams<'static> {
        // The planted defect drops the mask: every query sees the later tokens too.
        let causal = if self.planted(Planted::FlashAttentionNotCausal) {
            Causal::No
        } else {
            Causal::Yes
        };
        AttentionParams {
            causal,
            scale: Some(scale),
            ..Default::default()
        }
    }

    /// Causal attention `softmax(scale Q K^T + mask) V` of `[B, S, D]` Q, K, V
    /// ([`OpKind::FlashAttention`]; the module doc says what each backend runs).
    pub fn causal_attention(
        &self,
        q: &HostTensor,
        k: &HostTensor,
        v: &HostTensor,
        scale: f32,
    ) -> Result<AttentionCoreForward> {
        check(q, k, v)?;
        let stand_in = |rel: f32| -> Result<AttentionCoreForward> {
            let p = self.core_params(scale);
            let b = reference::forward_and_naive(
                &to_heads_f16(q)?,
                &to_heads_f16(k)?,
                &to_heads_f16(v)?,
                &p,
            )?;
            Ok(AttentionCoreForward {
                o: scaled(from_heads(&b.naive_o, 1.0)?, Some(rel)),
                saved: Saved::Lse(b.naive_lse),
            })
        };
        match self.run(OpKind::FlashAttention)? {
            Run::Cpu(None) => {
                let mask = causal_mask(q.shape[1]);
                let scores = self.matmul(q, k, No, Yes)?;
                let masked = self.attention_mask(&scores, &mask, scale)?;
                let probs = self.softmax(&masked)?;
                let o = self.matmul(&probs, v, No, No)?;
                Ok(AttentionCoreForward {
                    o,
                    saved: Saved::Probs(probs),
                })
            }
            Run::Cpu(Some(rel)) => stand_in(rel),
            Run::Gpu(gpu) => {
                let (o, lse) = attention::flash_forward(
                    &up(gpu, &to_heads_f16(q)?)?,
                    &up(gpu, &to_heads_f16(k)?)?,
                    &up(gpu, &to_heads_f16(v)?)?,
                    &self.core_params(scale),
                )?;
                Ok(AttentionCoreForward {
                    o: from_heads(&o.to_host()?, 1.0)?,
                    saved: Saved::Lse(lse.to_host()?),
                })
            }
        }
    }

    /// Gradients `(dQ, dK, dV)` of [`Exec::causal_attention`] for upstream `d_o` `[B, S, D]`, from
    /// its forward result `fwd` (same op kind, same plan).
    pub fn causal_attention_backward(
        &self,
        q: &HostTensor,
        k: &HostTensor,
        v: &HostTensor,
        fwd: &AttentionCoreForward,
        d_o: &HostTensor,
        scale: f32,
    ) -> Result<(HostTensor, HostTensor, HostTensor)> {
        check(q, k, v)?;
        if d_o.shape != q.shape || fwd.o.shape != q.shape {
            return Err(Error::Shape {
                op: OP,
                what: "d_o and the forward's O must have q's shape".into(),
                expected: format!("{:?}", q.shape),
                got: if d_o.shape != q.shape {
                    d_o.shape.clone()
                } else {
                    fwd.o.shape.clone()
                },
            });
        }
        let run = self.run(OpKind::FlashAttention)?;
        match (run, &fwd.saved) {
            (Run::Cpu(None), Saved::Probs(probs)) => {
                let dprobs = self.matmul(d_o, v, No, Yes)?;
                let dv = self.matmul(probs, d_o, Yes, No)?;
                let dmasked = self.softmax_backward(probs, &dprobs)?;
                let dscores = self.attention_mask_backward(&dmasked, scale)?;
                let dq = self.matmul(&dscores, k, No, No)?;
                let dk = self.matmul(&dscores, q, Yes, No)?;
                Ok((dq, dk, dv))
            }
            (Run::Cpu(Some(rel)), Saved::Lse(_)) => {
                let s = grad_scale(d_o);
                let p = self.core_params(scale);
                let g = reference::backward_and_naive(
                    &to_heads_f16(q)?,
                    &to_heads_f16(k)?,
                    &to_heads_f16(v)?,
                    &scaled_grad_f16(d_o, s)?,
                    &p,
                )?
                .naive;
                let back = |t: &HostTensor| -> Result<HostTensor> {
                    Ok(scaled(from_heads(t, 1.0 / s)?, Some(rel)))
                };
                Ok((back(&g.dq)?, back(&g.dk)?, back(&g.dv)?))
            }
            (Run::Gpu(gpu), Saved::Lse(lse)) => {
                self.flash_backward(gpu, [q, k, v, &fwd.o, d_o], lse, scale)
            }
            _ => Err(Error::Invalid {
                op: OP,
                msg: "the forward result comes from another backend than this plan's for the \
                      attention core"
                    .into(),
            }),
        }
    }

    /// The GPU backward: `flash_backward` on the forward's O (its f16 values, uploaded exactly) and
    /// LSE, and dO scaled into [0.5, 1) and rounded to f16; the gradients scaled back.
    fn flash_backward(
        &self,
        gpu: &Gpu,
        [q, k, v, o, d_o]: [&HostTensor; 5],
        lse: &HostTensor,
        scale: f32,
    ) -> Result<(HostTensor, HostTensor, HostTensor)> {
        let s = grad_scale(d_o);
        let dev = |t: &HostTensor| up(gpu, &to_heads_f16(t)?);
        let g = attention::flash_backward(
            &dev(q)?,
            &dev(k)?,
            &dev(v)?,
            &dev(o)?,
            &up(gpu, lse)?,
            &up(gpu, &scaled_grad_f16(d_o, s)?)?,
            &self.core_params(scale),
        )?;
        Ok((
            from_heads(&g.dq.to_host()?, 1.0 / s)?,
            from_heads(&g.dk.to_host()?, 1.0 / s)?,
            from_heads(&g.dv.to_host()?, 1.0 / s)?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{elementwise, matmul, softmax};
    use crate::replace::model::SplitMix;
    use crate::replace::{Backend, Device, Plan};

    fn random(rng: &mut SplitMix, shape: &[usize], spread: f32) -> HostTensor {
        crate::replace::model::tensor(rng, shape, 0.0, spread)
    }

    /// On its reference the core is the composed reference ops, bit for bit (the all-reference
    /// baseline did not change when the core became one kind).
    #[test]
    fn reference_core_is_the_composed_reference_ops() {
        let mut rng = SplitMix(crate::testing::seed(
            "reference_core_is_the_composed_reference_ops",
        ));
        let (q, k, v, d_o) = (
            random(&mut rng, &[2, 5, 8], 1.0),
            random(&mut rng, &[2, 5, 8], 1.0),
            random(&mut rng, &[2, 5, 8], 1.0),
            random(&mut rng, &[2, 5, 8], 0.1),
        );
        let scale = 0.35;
        let ex = crate::replace::test_support::reference();
        let fwd = ex.causal_attention(&q, &k, &v, scale).unwrap();
        let (dq, dk, dv) = ex
            .causal_attention_backward(&q, &k, &v, &fwd, &d_o, scale)
            .unwrap();

        let mm = |a, b, ta, tb| matmul::reference::matmul(a, b, ta, tb).unwrap();
        let scores = mm(&q, &k, No, Yes);
        let s = elementwise::reference::affine(&scores, scale, 0.0).unwrap();
        let masked = elementwise::reference::binary(
            elementwise::BinaryOp::Add,
            &s,
            &super::super::causal_mask(5),
        )
        .unwrap();
        let p = softmax::reference::softmax(&masked).unwrap();
        assert_eq!(fwd.o, mm(&p, &v, No, No));
        let dp = mm(&d_o, &v, No, Yes);
        let ds = softmax::reference::softmax_backward(&p, &dp).unwrap();
        let ds = elementwise::reference::affine(&ds, scale, 0.0).unwrap();
        assert_eq!(dv, mm(&p, &d_o, Yes, No));
        assert_eq!(dq, mm(&ds, &k, No, No));
        assert_eq!(dk, mm(&ds, &q, Yes, No));
    }

    /// The f16 stand-in (what the GPU path's conversions and a naive f16 attention round) is near
    /// the reference and not equal to it; its gradients come back from the power-of-two dO scale.
    #[test]
    fn half_precision_stand_in_rounds_like_f16() {
        let mut rng = SplitMix(crate::testing::seed(
            "half_precision_stand_in_rounds_like_f16",
        ));
        let (q, k, v) = (
            random(&mut rng, &[2, 7, 64], 1.0),
            random(&mut rng, &[2, 7, 64], 1.0),
            random(&mut rng, &[2, 7, 64], 1.0),
        );
        // A small upstream gradient, as in the model (about 1/N of the logits'): without the
        // power-of-two scale much of it would be f16 subnormals.
        let d_o = random(&mut rng, &[2, 7, 64], 1e-4);
        let scale = 0.125;
        let reference = crate::replace::test_support::reference();
        let dev = Device::Fake {
            kind: OpKind::FlashAttention,
            rel: 0.0,
        };
        let half = Exec::new(
            Plan::all_reference().with(OpKind::FlashAttention, Backend::Gpu),
            &dev,
        );
        let (fr, fh) = (
            reference.causal_attention(&q, &k, &v, scale).unwrap(),
            half.causal_attention(&q, &k, &v, scale).unwrap(),
        );
        let gr = reference
            .causal_attention_backward(&q, &k, &v, &fr, &d_o, scale)
            .unwrap();
        let gh = half
            .causal_attention_backward(&q, &k, &v, &fh, &d_o, scale)
            .unwrap();
        for (what, h, r) in [
            ("o", &fh.o, &fr.o),
            ("dq", &gh.0, &gr.0),
            ("dk", &gh.1, &gr.1),
            ("dv", &gh.2, &gr.2),
        ] {
            let e = crate::replace::bisect::rel_max_diff(&h.data, &r.data);
            println!("{what}: max-norm relative difference {e:.2e}");
            assert!(e > 0.0 && e < 1e-2, "{what}: {e:e}");
            assert_eq!((&h.shape, h.dtype), (&r.shape, DType::F32));
        }
    }

    #[test]
    fn gradient_scale_is_a_power_of_two_into_half_to_one() {
        let t = |v: Vec<f32>| HostTensor::new(v.clone(), &[v.len()], DType::F32).unwrap();
        for (max, want) in [
            (0.03f32, 32f32),
            (1.0, 0.5),
            (0.5, 1.0),
            (3e-7, 2f32.powi(21)),
        ] {
            let s = grad_scale(&t(vec![0.0, -max, max / 3.0]));
            assert_eq!(s, want, "{max}");
            assert!((0.5..1.0).contains(&(max * s)), "{max}");
        }
        assert_eq!(grad_scale(&t(vec![0.0; 3])), 1.0);
        assert_eq!(grad_scale(&t(vec![1.0, f32::INFINITY])), 1.0);
    }

    #[test]
    fn bad_shapes_and_a_forward_of_another_backend_are_typed_errors() {
        let ex = crate::replace::test_support::reference();
        let x = HostTensor::new(vec![0.5; 24], &[2, 3, 4], DType::F32).unwrap();
        let short = HostTensor::new(vec![0.5; 16], &[2, 2, 4], DType::F32).unwrap();
        let e = ex.causal_attention(&x, &short, &x, 0.5).unwrap_err();
        assert!(matches!(e, Error::Shape { op: OP, .. }), "{e}");
        let flat = HostTensor::new(vec![0.5; 24], &[6, 4], DType::F32).unwrap();
        assert!(matches!(
            ex.causal_attention(&flat, &flat, &flat, 0.5),
            Err(Error::Shape { .. })
        ));
        let fwd = ex.causal_attention(&x, &x, &x, 0.5).unwrap();
        let e = ex
            .causal_attention_backward(&x, &x, &x, &fwd, &short, 0.5)
            .unwrap_err();
        assert!(matches!(e, Error::Shape { op: OP, .. }), "{e}");
        // A forward made by the f16 stand-in, a backward by the reference plan.
        let dev = Device::Fake {
            kind: OpKind::FlashAttention,
            rel: 0.0,
        };
        let half = Exec::new(Plan::all_gpu(), &dev);
        let fwd = half.causal_attention(&x, &x, &x, 0.5).unwrap();
        let e = ex
            .causal_attention_backward(&x, &x, &x, &fwd, &x, 0.5)
            .unwrap_err();
        assert!(matches!(e, Error::Invalid { op: OP, .. }), "{e}");
    }
}
