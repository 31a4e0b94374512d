//! CPU references in f64, written from the formulas of docs/math/lrp.md directly (per element `c_i = x_i W[j,i]`,
//! `P' = P == 0 ? 1 : P`, `Pa`, `Na` in the order given there, exact-equality ties), independent of the
//! GPU's algebra (`(A +- S) / 2` sums, one merged coefficient).
use super::{Activation, Kind, Nonlinearity, dims};
use crate::error::Result;
use crate::tensor::HostTensor;

/// P and N after the activation-range rules (docs/math/lrp.md, "Activation-range saturation").
pub fn saturate(act: &Activation, p: f64, n: f64, pb: f64, nb: f64) -> (f64, f64) {
    if act.kind == Kind::Null {
        return (p, n);
    }
    let t = p + pb - n - nb;
    let ties = (act.kind == Kind::NonMono).then(|| {
        let f = |v: f64| act.func.eval(v);
        (f(t), f(p + pb), f(-(n + nb)))
    });
    let (lower, upper) = act.bounds();
    let (mut p, mut n) = (p, n);
    if t < lower as f64 {
        p = 0.0;
    }
    if t > upper as f64 {
        n = 0.0;
    }
    if let Some((ft, fp, fn_)) = ties
        && p > 0.0
        && n > 0.0
    {
        if ft == fp {
            n = 0.0;
        } else if ft == fn_ {
            p = 0.0;
        }
    }
    (p, n)
}

/// The stabilised sums and aggregation weights `(P', N', Pa, Na)` (docs/math/lrp.md, "Aggregation").
pub fn aggregate(p: f64, n: f64, pb: f64, nb: f64) -> (f64, f64, f64, f64) {
    let pp = if p == 0.0 { 1.0 } else { p };
    let nn = if n == 0.0 { 1.0 } else { n };
    let pa = ((pp + pb) / (pp + nn + pb + nb)) * (pp / (pp + pb));
    let na = ((nn + nb) / (pp + nn + pb + nb)) * (nn / (nn + nb));
    (pp, nn, pa, na)
}

/// The distinct saturation outcomes (which of P, N end up zero) under perturbations of P and N by
/// `margin * (P + N + pb + nb)` (an f32 accumulation's error), the unperturbed outcome first. A GPU
/// result may legitimately take any of them. Zero sums are exact on the GPU too and are not perturbed.
pub fn outcomes(
    act: &Activation,
    p: f64,
    n: f64,
    pb: f64,
    nb: f64,
    margin: f64,
) -> Vec<(bool, bool)> {
    let delta = margin * (p + n + pb + nb);
    let zeroed = |(a, b): (f64, f64)| (a == 0.0, b == 0.0);
    let mut seen = vec![zeroed(saturate(act, p, n, pb, nb))];
    let steps = [-delta, 0.0, delta];
    for &dp in &steps {
        for &dn in &steps {
            let pq = if p == 0.0 { 0.0 } else { (p + dp).max(0.0) };
            let nq = if n == 0.0 { 0.0 } else { (n + dn).max(0.0) };
            let z = zeroed(saturate(act, pq, nq, pb, nb));
            if !seen.contains(&z) {
                seen.push(z);
            }
        }
    }
    seen
}

/// Whether [`outcomes`] has more than one element.
pub fn ambiguous(act: &Activation, p: f64, n: f64, pb: f64, nb: f64, margin: f64) -> bool {
    outcomes(act, p, n, pb, nb, margin).len() > 1
}

/// `relevance_in` for `x: [.., I]`, `relevance_out: [.., O]`, `weight: [O, I]`, `bias: [O]`.
pub fn relevance(
    x: &HostTensor,
    relevance_out: &HostTensor,
    weight: &HostTensor,
    bias: Option<&HostTensor>,
    act: &Activation,
) -> Result<HostTensor> {
    Ok(relevance_with_slack(x, relevance_out, weight, bias, act, 0.0)?.0)
}

/// [`relevance`], plus a per-element slack: how far each `relevance_in` element could move if the
/// (row, output) pairs whose saturation outcome is ambiguous at `margin` (see [`outcomes`]) took another
/// outcome, i.e. `sum over ambiguous j of |R_j| |c_i| max |1/D'_alt - 1/D'|`. Zero when nothing is
/// ambiguous (always at margin 0).
pub fn relevance_with_slack(
    x: &HostTensor,
    relevance_out: &HostTensor,
    weight: &HostTensor,
    bias: Option<&HostTensor>,
    act: &Activation,
    margin: f64,
) -> Result<(HostTensor, Vec<f64>)> {
    const OP: &str = "lrp::relevance (reference)";
    act.validate(OP)?;
    let (rows, ni, no) = dims(
        OP,
        &x.shape,
        &relevance_out.shape,
        &weight.shape,
        bias.map(|b| b.shape.as_slice()),
    )?;
    let mut out = vec![0.0f32; rows * ni];
    let mut slack = vec![0.0f64; rows * ni];
    let mut c = vec![0.0f64; ni];
    let mut acc = vec![0.0f64; ni];
    for r in 0..rows {
        let xr = &x.data[r * ni..(r + 1) * ni];
        acc.iter_mut().for_each(|v| *v = 0.0);
        for j in 0..no {
            let wj = &weight.data[j * ni..(j + 1) * ni];
            let (mut p, mut n) = (0.0f64, 0.0f64);
            for ((ci, &xv), &wv) in c.iter_mut().zip(xr).zip(wj) {
                *ci = xv as f64 * wv as f64; // exact: a product of two f32 fits an f64
                p += ci.max(0.0);
                n += (-*ci).max(0.0);
            }
            let b = bias.map_or(0.0, |b| b.data[j] as f64);
            let (pb, nb) = (b.max(0.0), (-b).max(0.0));
            let (ps, ns) = saturate(act, p, n, pb, nb);
            let (pp, nn, pa, na) = aggregate(ps, ns, pb, nb);
            let rj = relevance_out.data[r * no + j] as f64;
            for (a, &ci) in acc.iter_mut().zip(&c) {
                *a += rj
                    * if ci > 0.0 {
                        ci / pp * pa
                    } else if ci < 0.0 {
                        -ci / nn * na
                    } else {
                        0.0
                    };
            }
            if margin > 0.0 {
                let inv = |pz: bool, nz: bool| {
                    let pp = if pz || p == 0.0 { 1.0 } else { p };
                    let nn = if nz || n == 0.0 { 1.0 } else { n };
                    1.0 / (pp + nn + pb + nb)
                };
                let all = outcomes(act, p, n, pb, nb, margin);
                let center = inv(all[0].0, all[0].1);
                let moved = all[1..]
                    .iter()
                    .map(|&(pz, nz)| (inv(pz, nz) - center).abs())
                    .fold(0.0, f64::max);
                if moved > 0.0 {
                    for (s, &ci) in slack[r * ni..(r + 1) * ni].iter_mut().zip(&c) {
                        *s += rj.abs() * ci.abs() * moved;
                    }
                }
            }
        }
        for (o, a) in out[r * ni..(r + 1) * ni].iter_mut().zip(&acc) {
            *o = *a as f32;
        }
    }
    Ok((HostTensor::new(out, &x.shape, crate::DType::F32)?, slack))
}

/// `f(x W^T + b)` in f64 (softmax through the softmax reference).
pub fn dense(
    x: &HostTensor,
    weight: &HostTensor,
    bias: Option<&HostTensor>,
    f: Nonlinearity,
) -> Result<HostTensor> {
    const OP: &str = "lrp::dense (reference)";
    let o = weight.shape.first().copied().unwrap_or(0);
    let mut out_shape = x.shape.clone();
    if let Some(last) = out_shape.last_mut() {
        *last = o;
    }
    let (rows, ni, no) = dims(
        OP,
        &x.shape,
        &out_shape,
        &weight.shape,
        bias.map(|b| b.shape.as_slice()),
    )?;
    let mut y = Vec::with_capacity(rows * no);
    for r in 0..rows {
        let xr = &x.data[r * ni..(r + 1) * ni];
        for j in 0..no {
            let wj = &weight.data[j * ni..(j + 1) * ni];
            let mut v: f64 = xr.iter().zip(wj).map(|(&a, &b)| a as f64 * b as f64).sum();
            v += bias.map_or(0.0, |b| b.data[j] as f64);
            y.push(match f {
                Nonlinearity::Relu => v.max(0.0),
                Nonlinearity::Tanh => v.tanh(),
                Nonlinearity::Sigmoid => 1.0 / (1.0 + (-v).exp()),
                Nonlinearity::Linear | Nonlinearity::Softmax => v,
            } as f32);
        }
    }
    let y = HostTensor::new(y, &out_shape, crate::DType::F32)?;
    if f == Nonlinearity::Softmax {
        return crate::ops::softmax::reference::softmax(&y);
    }
    Ok(y)
}

/// A layer for the reference MLP explanation.
#[derive(Clone, Debug)]
pub struct HostLayer {
    pub weight: HostTensor,
    pub bias: Option<HostTensor>,
    pub nonlinearity: Nonlinearity,
    pub activation: Activation,
}

impl HostLayer {
    pub fn new(weight: HostTensor, bias: Option<HostTensor>, nonlinearity: Nonlinearity) -> Self {
        HostLayer {
            weight,
            bias,
            nonlinearity,
            activation: nonlinearity.preset(),
        }
    }
}

/// `(activations, relevance)` as in [`super::mlp::Explanation`].
pub fn explain(
    layers: &[HostLayer],
    x: &HostTensor,
    start: Option<&HostTensor>,
) -> Result<(Vec<HostTensor>, Vec<HostTensor>)> {
    let mut acts = vec![x.clone()];
    for l in layers {
        let y = dense(
            acts.last().expect("non-empty"),
            &l.weight,
            l.bias.as_ref(),
            l.nonlinearity,
        )?;
        acts.push(y);
    }
    let mut rel = start
        .cloned()
        .unwrap_or_else(|| acts.last().expect("non-empty").clone());
    let mut rels = vec![rel.clone()];
    for (k, l) in layers.iter().enumerate().rev() {
        rel = relevance(&acts[k], &rel, &l.weight, l.bias.as_ref(), &l.activation)?;
        rels.push(rel.clone());
    }
    rels.reverse();
    Ok((acts, rels))
}

/// `||max(|out - ref| - slack, 0)|| / ||ref||` (2-norms): the relative error left after each element is
/// allowed its [`relevance_with_slack`] slack. NaN in `out` never passes (+inf).
pub fn slack_rel_err(out: &[f32], reference: &[f32], slack: &[f64]) -> f64 {
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for ((&o, &r), &s) in out.iter().zip(reference).zip(slack) {
        if !o.is_finite() {
            return f64::INFINITY;
        }
        num += ((o as f64 - r as f64).abs() - s).max(0.0).powi(2);
        den += (r as f64).powi(2);
    }
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}
