//! CPU references (f64), with the semantics of the module doc.
use super::{AttentionGrads, AttentionParams, Causal, Dims, dims, scale};
use crate::DType;
use crate::error::{Error, Result};
use crate::tensor::HostTensor;

/// Exact and same-precision-naive results of one computation.
#[derive(Clone, Debug, PartialEq)]
pub struct Both {
    /// O in f64 arithmetic, stored as (unrounded) f32.
    pub exact_o: HostTensor,
    /// LSE in f64 arithmetic.
    pub exact_lse: HostTensor,
    /// O as a naive implementation in the input dtype computes it (see [`naive_same_precision`]).
    pub naive_o: HostTensor,
    pub naive_lse: HostTensor,
}

/// The reference: f64 arithmetic throughout. O is returned as f32 (`dtype` F32, not rounded to the
/// input dtype) and LSE as f32.
pub fn forward(
    q: &HostTensor,
    k: &HostTensor,
    v: &HostTensor,
    params: &AttentionParams,
) -> Result<(HostTensor, HostTensor)> {
    let b = forward_and_naive(q, k, v, params)?;
    Ok((b.exact_o, b.exact_lse))
}

/// The straightforward computation in the input dtype, rounding where a naive f16/bf16
/// implementation stores a tensor: S = round(scale * Q K^T) (the product accumulated exactly),
/// P = round(softmax(S)) (the softmax of the rounded S computed exactly), O = round(P V) (P V
/// accumulated exactly). LSE = ln sum exp(S) of the rounded S, in f64. Its distance from
/// [`forward`] is the error scale of the correctness rule
/// `max|out - ref| <= 2 max|naive - ref| + 1e-5`.
pub fn naive_same_precision(
    q: &HostTensor,
    k: &HostTensor,
    v: &HostTensor,
    params: &AttentionParams,
) -> Result<(HostTensor, HostTensor)> {
    let b = forward_and_naive(q, k, v, params)?;
    Ok((b.naive_o, b.naive_lse))
}

/// [`forward`] and [`naive_same_precision`] in one pass (they share the dot products); rows are
/// spread over the available CPU cores.
pub fn forward_and_naive(
    q: &HostTensor,
    k: &HostTensor,
    v: &HostTensor,
    params: &AttentionParams,
) -> Result<Both> {
    const OP: &str = "attention::reference";
    let d = dims(OP, &q.shape, &k.shape, &v.shape)?;
    let scale = scale(OP, params, d.head_dim)? as f64;
    let rows = d.batch * d.heads * d.seq_q;
    let dh = d.head_dim;
    let mut exact_o = vec![0f32; rows * dh];
    let mut naive_o = vec![0f32; rows * dh];
    let mut exact_lse = vec![0f32; rows];
    let mut naive_lse = vec![0f32; rows];
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per = rows.div_ceil(threads).max(1);
    let job = Job {
        q: &q.data,
        k: &k.data,
        v: &v.data,
        d,
        scale,
        causal: params.causal == Causal::Yes,
        dtype: q.dtype,
    };
    std::thread::scope(|s| {
        let parts = exact_o
            .chunks_mut(per * dh.max(1))
            .zip(naive_o.chunks_mut(per * dh.max(1)))
            .zip(exact_lse.chunks_mut(per).zip(naive_lse.chunks_mut(per)));
        for (t, ((eo, no), (el, nl))) in parts.enumerate() {
            let job = &job;
            s.spawn(move || job.rows(t * per, eo, no, el, nl));
        }
    });
    let o_shape = [d.batch, d.heads, d.seq_q, d.head_dim];
    let l_shape = [d.batch, d.heads, d.seq_q];
    Ok(Both {
        exact_o: HostTensor::new(exact_o, &o_shape, DType::F32)?,
        exact_lse: HostTensor::new(exact_lse, &l_shape, DType::F32)?,
        naive_o: HostTensor::new(naive_o, &o_shape, q.dtype)?,
        naive_lse: HostTensor::new(naive_lse, &l_shape, DType::F32)?,
    })
}

/// O `[batch, heads, seq_q, head_dim]` of [`forward`] from f64 inputs, in f64, not rounded: what
/// finite-difference tests differentiate, because a perturbation must be made and seen at f64
/// resolution (an f32 input step of 1e-6 relative would be lost in f32 rounding of O). `q`, `k` and
/// `v` are row-major with the shapes `dims` describes.
pub fn forward_f64(
    dims: Dims,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    params: &AttentionParams,
) -> Result<Vec<f64>> {
    let Dims {
        batch,
        heads,
        seq_q: sq,
        seq_k: sk,
        head_dim: dh,
        ..
    } = dims;
    let per_q = sq * dh;
    let per_k = sk * dh;
    for (what, given, expected) in [
        (
            "attention::reference::forward_f64 q",
            q.len(),
            batch * heads * per_q,
        ),
        (
            "attention::reference::forward_f64 k",
            k.len(),
            batch * heads * per_k,
        ),
        (
            "attention::reference::forward_f64 v",
            v.len(),
            batch * heads * per_k,
        ),
    ] {
        if given != expected {
            return Err(Error::Length {
                what,
                expected,
                got: given,
            });
        }
    }
    let scale = scale("attention::reference::forward_f64", params, dh)? as f64;
    let mut o = Vec::with_capacity(batch * heads * per_q);
    for head in 0..batch * heads {
        let x = HeadInputs {
            q: &q[head * per_q..(head + 1) * per_q],
            k: &k[head * per_k..(head + 1) * per_k],
            v: &v[head * per_k..(head + 1) * per_k],
            seq_q: sq,
            seq_k: sk,
            head_dim: dh,
            scale,
            causal: params.causal == Causal::Yes,
        };
        o.extend(x.forward());
    }
    Ok(o)
}

/// The backward reference: f64 arithmetic throughout, gradients returned as (unrounded) f32.
/// `d_o` must have q's shape. Fully masked rows (they see no key) contribute nothing: their dQ
/// is 0 and they add nothing to dK and dV.
pub fn backward(
    q: &HostTensor,
    k: &HostTensor,
    v: &HostTensor,
    d_o: &HostTensor,
    params: &AttentionParams,
) -> Result<AttentionGrads<HostTensor>> {
    Ok(backward_impl(q, k, v, d_o, params, false)?.exact)
}

/// Exact and same-precision-naive gradients of one backward computation.
#[derive(Clone, Debug)]
pub struct BothGrads {
    /// [`backward`]: f64 arithmetic, stored as (unrounded) f32.
    pub exact: AttentionGrads<HostTensor>,
    /// What a naive backward in the input dtype computes (see [`backward_and_naive`]), in that dtype.
    pub naive: AttentionGrads<HostTensor>,
}

/// [`backward`] and the straightforward backward in the input dtype, rounding where a naive f16/bf16
/// implementation (autograd through `S = scale Q K^T`, softmax and `P V`) stores a tensor:
/// `S = round(scale Q K^T)`, `P = round(softmax(S))`, `dP = round(dO V^T)`,
/// `dS = round(P (dP - rowsum(P dP)))` (the softmax backward in f32 math, one rounding),
/// `dV = round(P^T dO)`, `dQ = round(scale dS K)`, `dK = round(scale dS^T Q)`; every product and sum
/// is accumulated exactly. The naive gradients' distance from the exact ones is the error scale of
/// the backward's correctness rule `max|g - ref| <= 2 max|naive - ref| + 1e-5` (docs/math/attention.md),
/// the forward's rule applied to each of dQ, dK and dV. For f32 inputs both are the f64 result.
pub fn backward_and_naive(
    q: &HostTensor,
    k: &HostTensor,
    v: &HostTensor,
    d_o: &HostTensor,
    params: &AttentionParams,
) -> Result<BothGrads> {
    backward_impl(q, k, v, d_o, params, true)
}

/// Both backwards, or (`with_naive` false) only the exact one, the naive gradients then left 0.
fn backward_impl(
    q: &HostTensor,
    k: &HostTensor,
    v: &HostTensor,
    d_o: &HostTensor,
    params: &AttentionParams,
    with_naive: bool,
) -> Result<BothGrads> {
    const OP: &str = "attention::reference::backward";
    let d = dims(OP, &q.shape, &k.shape, &v.shape)?;
    if d_o.shape != q.shape {
        return Err(Error::Shape {
            op: OP,
            what: "d_o (the gradient of O) must have q's shape".into(),
            expected: format!("{:?}", q.shape),
            got: d_o.shape.clone(),
        });
    }
    let scale = scale(OP, params, d.head_dim)? as f64;
    let causal = params.causal == Causal::Yes;
    let (sq, sk, dh) = (d.seq_q, d.seq_k, d.head_dim);
    let heads = d.batch * d.heads;
    let dtype = q.dtype;
    // [exact, naive] x [dq, dk, dv]
    let mut out: [[Vec<f32>; 3]; 2] = std::array::from_fn(|_| {
        [
            vec![0f32; heads * sq * dh],
            vec![0f32; heads * sk * dh],
            vec![0f32; heads * sk * dh],
        ]
    });
    let f64s = |x: &[f32]| -> Vec<f64> { x.iter().map(|&v| v as f64).collect() };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per = heads.div_ceil(threads).max(1);
    let [[edq, edk, edv], [ndq, ndk, ndv]] = &mut out;
    std::thread::scope(|s| {
        let parts = edq
            .chunks_mut((per * sq * dh).max(1))
            .zip(edk.chunks_mut((per * sk * dh).max(1)))
            .zip(edv.chunks_mut((per * sk * dh).max(1)))
            .zip(
                ndq.chunks_mut((per * sq * dh).max(1))
                    .zip(ndk.chunks_mut((per * sk * dh).max(1)))
                    .zip(ndv.chunks_mut((per * sk * dh).max(1))),
            );
        for (t, (((edq, edk), edv), ((ndq, ndk), ndv))) in parts.enumerate() {
            s.spawn(move || {
                for h in 0..per.min(heads - t * per) {
                    let head = t * per + h;
                    let (qr, kr) = (
                        head * sq * dh..(head + 1) * sq * dh,
                        head * sk * dh..(head + 1) * sk * dh,
                    );
                    let x = HeadInputs {
                        q: &f64s(&q.data[qr.clone()]),
                        k: &f64s(&k.data[kr.clone()]),
                        v: &f64s(&v.data[kr]),
                        seq_q: sq,
                        seq_k: sk,
                        head_dim: dh,
                        scale,
                        causal,
                    };
                    let g_o = f64s(&d_o.data[qr]);
                    let (a, b) = (h * sq * dh, h * sk * dh);
                    let store = |dst: &mut [f32], src: &[f64]| {
                        for (o, &x) in dst.iter_mut().zip(src) {
                            *o = x as f32;
                        }
                    };
                    let g = x.backward(&g_o);
                    store(&mut edq[a..a + sq * dh], &g.dq);
                    store(&mut edk[b..b + sk * dh], &g.dk);
                    store(&mut edv[b..b + sk * dh], &g.dv);
                    if !with_naive {
                        continue;
                    }
                    let g = x.backward_naive(&g_o, dtype);
                    store(&mut ndq[a..a + sq * dh], &g.dq);
                    store(&mut ndk[b..b + sk * dh], &g.dk);
                    store(&mut ndv[b..b + sk * dh], &g.dv);
                }
            });
        }
    });
    let kv = [d.batch, d.heads, sk, dh];
    let [[edq, edk, edv], [ndq, ndk, ndv]] = out;
    Ok(BothGrads {
        exact: AttentionGrads {
            dq: HostTensor::new(edq, &q.shape, DType::F32)?,
            dk: HostTensor::new(edk, &kv, DType::F32)?,
            dv: HostTensor::new(edv, &kv, DType::F32)?,
        },
        naive: AttentionGrads {
            dq: HostTensor::new(ndq, &q.shape, dtype)?,
            dk: HostTensor::new(ndk, &kv, dtype)?,
            dv: HostTensor::new(ndv, &kv, dtype)?,
        },
    })
}

/// One head's inputs in f64: Q `[seq_q, head_dim]`, K and V `[seq_k, head_dim]`.
pub(super) struct HeadInputs<'a> {
    pub q: &'a [f64],
    pub k: &'a [f64],
    pub v: &'a [f64],
    pub seq_q: usize,
    pub seq_k: usize,
    pub head_dim: usize,
    pub scale: f64,
    pub causal: bool,
}

impl HeadInputs<'_> {
    /// Keys query `i` sees (the module doc's causal convention).
    fn visible(&self, i: usize) -> usize {
        if self.causal {
            (i as i64 + self.seq_k as i64 - self.seq_q as i64 + 1).clamp(0, self.seq_k as i64)
                as usize
        } else {
            self.seq_k
        }
    }

    /// Row `i`'s probabilities over its visible keys (empty when it sees none).
    fn probs(&self, i: usize) -> Vec<f64> {
        let dh = self.head_dim;
        let qi = &self.q[i * dh..(i + 1) * dh];
        let s: Vec<f64> = (0..self.visible(i))
            .map(|j| {
                let kj = &self.k[j * dh..(j + 1) * dh];
                self.scale * qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f64>()
            })
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let l: f64 = e.iter().sum();
        e.iter().map(|x| x / l).collect()
    }

    /// O `[seq_q, head_dim]` in f64 (0 for rows that see no key): what the finite-difference tests
    /// differentiate ([`forward_f64`]).
    pub(super) fn forward(&self) -> Vec<f64> {
        let dh = self.head_dim;
        let mut o = vec![0f64; self.seq_q * dh];
        for i in 0..self.seq_q {
            for (j, p) in self.probs(i).into_iter().enumerate() {
                for c in 0..dh {
                    o[i * dh + c] += p * self.v[j * dh + c];
                }
            }
        }
        o
    }

    /// Gradients for upstream `d_o` `[seq_q, head_dim]`, in f64.
    pub(super) fn backward(&self, d_o: &[f64]) -> AttentionGrads<Vec<f64>> {
        let (sq, sk, dh) = (self.seq_q, self.seq_k, self.head_dim);
        let mut g = AttentionGrads {
            dq: vec![0f64; sq * dh],
            dk: vec![0f64; sk * dh],
            dv: vec![0f64; sk * dh],
        };
        for i in 0..sq {
            let p = self.probs(i);
            let (qi, gi) = (&self.q[i * dh..(i + 1) * dh], &d_o[i * dh..(i + 1) * dh]);
            let dp: Vec<f64> = (0..p.len())
                .map(|j| {
                    let vj = &self.v[j * dh..(j + 1) * dh];
                    gi.iter().zip(vj).map(|(a, b)| a * b).sum::<f64>()
                })
                .collect();
            let row_dot: f64 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
            for j in 0..p.len() {
                let ds = p[j] * (dp[j] - row_dot);
                for c in 0..dh {
                    g.dq[i * dh + c] += self.scale * ds * self.k[j * dh + c];
                    g.dk[j * dh + c] += self.scale * ds * qi[c];
                    g.dv[j * dh + c] += p[j] * gi[c];
                }
            }
        }
        g
    }

    /// The same-precision naive gradients (see [`backward_and_naive`]), each rounded to `dtype`,
    /// as f64.
    pub(super) fn backward_naive(&self, d_o: &[f64], dtype: DType) -> AttentionGrads<Vec<f64>> {
        let (sq, sk, dh) = (self.seq_q, self.seq_k, self.head_dim);
        let round = |x: f64| dtype.round(x as f32) as f64;
        let mut acc = AttentionGrads {
            dq: vec![0f64; sq * dh],
            dk: vec![0f64; sk * dh],
            dv: vec![0f64; sk * dh],
        };
        for i in 0..sq {
            let visible = self.visible(i);
            if visible == 0 {
                continue;
            }
            let (qi, gi) = (&self.q[i * dh..(i + 1) * dh], &d_o[i * dh..(i + 1) * dh]);
            let s: Vec<f64> = (0..visible)
                .map(|j| {
                    let kj = &self.k[j * dh..(j + 1) * dh];
                    round(self.scale * qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f64>())
                })
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let l: f64 = e.iter().sum();
            let p: Vec<f64> = e.iter().map(|x| round(x / l)).collect();
            let dp: Vec<f64> = (0..visible)
                .map(|j| {
                    let vj = &self.v[j * dh..(j + 1) * dh];
                    round(gi.iter().zip(vj).map(|(a, b)| a * b).sum::<f64>())
                })
                .collect();
            let row_dot: f64 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
            for j in 0..visible {
                let ds = round(p[j] * (dp[j] - row_dot));
                for c in 0..dh {
                    acc.dq[i * dh + c] += ds * self.k[j * dh + c];
                    acc.dk[j * dh + c] += ds * qi[c];
                    acc.dv[j * dh + c] += p[j] * gi[c];
                }
            }
        }
        for x in acc.dq.iter_mut().chain(acc.dk.iter_mut()) {
            *x = round(self.scale * *x);
        }
        for x in acc.dv.iter_mut() {
            *x = round(*x);
        }
        acc
    }
}

struct Job<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    d: Dims,
    scale: f64,
    causal: bool,
    dtype: DType,
}

impl Job<'_> {
    /// Rows `first..first + el.len()` (row = (batch * heads + head) * seq_q + i).
    fn rows(&self, first: usize, eo: &mut [f32], no: &mut [f32], el: &mut [f32], nl: &mut [f32]) {
        let Dims {
            seq_q,
            seq_k,
            head_dim: dh,
            ..
        } = self.d;
        let round = |x: f64| self.dtype.round(x as f32) as f64;
        let mut s = vec![0f64; seq_k];
        let mut sr = vec![0f64; seq_k];
        let (mut acc, mut acc_r) = (vec![0f64; dh], vec![0f64; dh]);
        for (r, (lse_e, lse_n)) in el.iter_mut().zip(nl.iter_mut()).enumerate() {
            let row = first + r;
            let (head, i) = (row / seq_q, row % seq_q);
            let visible = if self.causal {
                (i as i64 + seq_k as i64 - seq_q as i64 + 1).clamp(0, seq_k as i64) as usize
            } else {
                seq_k
            };
            let (o_e, o_n) = (&mut eo[r * dh..(r + 1) * dh], &mut no[r * dh..(r + 1) * dh]);
            if visible == 0 {
                o_e.fill(0.0);
                o_n.fill(0.0);
                *lse_e = f32::NEG_INFINITY;
                *lse_n = f32::NEG_INFINITY;
                continue;
            }
            let qi = &self.q[row * dh..(row + 1) * dh];
            let kv0 = head * seq_k * dh;
            for j in 0..visible {
                let kj = &self.k[kv0 + j * dh..kv0 + (j + 1) * dh];
                let dot: f64 = qi.iter().zip(kj).map(|(&a, &b)| a as f64 * b as f64).sum();
                s[j] = self.scale * dot;
                sr[j] = round(s[j]);
            }
            let m = s[..visible]
                .iter()
                .cloned()
                .fold(f64::NEG_INFINITY, f64::max);
            let mr = sr[..visible]
                .iter()
                .cloned()
                .fold(f64::NEG_INFINITY, f64::max);
            let (mut l, mut lr) = (0f64, 0f64);
            for j in 0..visible {
                s[j] = (s[j] - m).exp();
                sr[j] = (sr[j] - mr).exp();
                l += s[j];
                lr += sr[j];
            }
            acc.fill(0.0);
            acc_r.fill(0.0);
            for j in 0..visible {
                let vj = &self.v[kv0 + j * dh..kv0 + (j + 1) * dh];
                let (p, pr) = (s[j] / l, round(sr[j] / lr));
                for c in 0..dh {
                    acc[c] += p * vj[c] as f64;
                    acc_r[c] += pr * vj[c] as f64;
                }
            }
            for c in 0..dh {
                o_e[c] = acc[c] as f32;
                o_n[c] = round(acc_r[c]) as f32;
            }
            *lse_e = (m + l.ln()) as f32;
            *lse_n = (mr + lr.ln()) as f32;
        }
    }
}
