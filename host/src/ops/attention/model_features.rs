//! The f64 reference of the attention features that real models call: grouped-query heads (GQA/MQA),
//! sliding windows, logit softcapping, ALiBi biases, variable-length (packed) batches, paged KV
//! caches and split-KV decoding with its LSE merge. `decode_forward`, the flash kernels' grouped
//! heads, packed batches (`varlen`), sliding windows, softcap and ALiBi slopes are tested against
//! it. It is the
//! independent reference (and the exact semantics, `docs/math/attention.md`, "Features of real
//! models"), checked here against compositions of the plain
//! reference: GQA against repeated K/V, a window against the causal mask, varlen against one call
//! per sequence, a paged cache against its gathered dense form, split-KV against no split, and the
//! backward against central differences.
//!
//! Semantics, per (batch, query head `h`), with `off = Sk - Sq` (the bottom-right alignment of the
//! causal mask):
//! - **GQA:** `Hq = g Hkv`; query head `h` reads key/value head `h / g` (FlashAttention's grouping).
//! - **Score:** `s = scale q_i . k_j`; with a softcap `c`, `s = c tanh(s / c)`; with ALiBi slopes,
//!   `s -= slope[h] |i + off - j|`.
//! - **Visibility:** key `j` is seen by query `i` iff `j <= i + off` when causal, and
//!   `i + off - left <= j <= i + off + right` for a window `(left, right)` (either side may be
//!   unbounded). A row that sees no key gets O = 0 and LSE = -inf; its gradients are 0.
use std::ops::Range;

use crate::DType;
use crate::error::{Error, Result};
use crate::tensor::HostTensor;

use super::{AttentionGrads, AttentionParams, Causal};

/// The features of one call beyond [`AttentionParams`] (all off by default).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelFeatures {
    /// Keys a query sees before its own (aligned) position; `None` = all of them.
    pub window_left: Option<usize>,
    /// Keys a query sees after its own (aligned) position; `None` = all of them (causal: none).
    pub window_right: Option<usize>,
    /// Logit softcap `c > 0`: scores become `c tanh(s / c)` (Gemma-2 uses 50).
    pub softcap: Option<f32>,
    /// One ALiBi slope a query head (`Hq` of them).
    pub alibi_slopes: Option<Vec<f32>>,
}

/// One (batch, query head) problem in f64: Q `[sq, d]`, K and V `[sk, d]`, its ALiBi slope.
struct Head<'a> {
    q: &'a [f64],
    k: &'a [f64],
    v: &'a [f64],
    sq: usize,
    sk: usize,
    d: usize,
    scale: f64,
    causal: bool,
    f: &'a ModelFeatures,
    slope: f64,
}

impl Head<'_> {
    /// Whether query `i` sees key `j`.
    fn sees(&self, i: usize, j: usize) -> bool {
        let pos = i as i64 + self.sk as i64 - self.sq as i64;
        let j = j as i64;
        // Causal caps the right side at the query's own position, whatever the window says.
        let right = if self.causal {
            Some(0)
        } else {
            self.f.window_right.map(|r| r as i64)
        };
        right.is_none_or(|r| j <= pos + r) && self.f.window_left.is_none_or(|l| j >= pos - l as i64)
    }

    /// `(s, ds/draw)` of query `i` and key `j`, where `raw = scale q . k`.
    fn score(&self, i: usize, j: usize) -> (f64, f64) {
        let d = self.d;
        let raw = self.scale
            * self.q[i * d..(i + 1) * d]
                .iter()
                .zip(&self.k[j * d..(j + 1) * d])
                .map(|(a, b)| a * b)
                .sum::<f64>();
        let (mut s, mut ds) = (raw, 1.0);
        if let Some(c) = self.f.softcap {
            let c = c as f64;
            let t = (raw / c).tanh();
            s = c * t;
            ds = 1.0 - t * t;
        }
        let pos = i as f64 + self.sk as f64 - self.sq as f64;
        s -= self.slope * (pos - j as f64).abs();
        (s, ds)
    }

    /// Row `i`: the visible keys with their probabilities and score derivatives, and the LSE.
    fn row(&self, i: usize) -> (Vec<(usize, f64, f64)>, f64) {
        let s: Vec<(usize, f64, f64)> = (0..self.sk)
            .filter(|&j| self.sees(i, j))
            .map(|j| {
                let (s, ds) = self.score(i, j);
                (j, s, ds)
            })
            .collect();
        if s.is_empty() {
            return (s, f64::NEG_INFINITY);
        }
        let m = s.iter().map(|x| x.1).fold(f64::NEG_INFINITY, f64::max);
        let l: f64 = s.iter().map(|x| (x.1 - m).exp()).sum();
        let lse = m + l.ln();
        (
            s.into_iter()
                .map(|(j, s, ds)| (j, (s - lse).exp(), ds))
                .collect(),
            lse,
        )
    }

    /// O `[sq, d]` and LSE `[sq]`.
    fn forward(&self) -> (Vec<f64>, Vec<f64>) {
        let d = self.d;
        let mut o = vec![0f64; self.sq * d];
        let mut lse = vec![f64::NEG_INFINITY; self.sq];
        for i in 0..self.sq {
            let (p, l) = self.row(i);
            lse[i] = l;
            for (j, pj, _) in p {
                for c in 0..d {
                    o[i * d + c] += pj * self.v[j * d + c];
                }
            }
        }
        (o, lse)
    }

    /// dQ `[sq, d]`, dK and dV `[sk, d]` for upstream `g_o` `[sq, d]`.
    fn backward(&self, g_o: &[f64]) -> AttentionGrads<Vec<f64>> {
        let d = self.d;
        let mut g = AttentionGrads {
            dq: vec![0f64; self.sq * d],
            dk: vec![0f64; self.sk * d],
            dv: vec![0f64; self.sk * d],
        };
        for i in 0..self.sq {
            let (p, _) = self.row(i);
            let gi = &g_o[i * d..(i + 1) * d];
            let dp: Vec<f64> = p
                .iter()
                .map(|&(j, _, _)| {
                    gi.iter()
                        .zip(&self.v[j * d..(j + 1) * d])
                        .map(|(a, b)| a * b)
                        .sum()
                })
                .collect();
            let row_dot: f64 = p.iter().zip(&dp).map(|(x, y)| x.1 * y).sum();
            for (&(j, pj, dsdraw), &dpj) in p.iter().zip(&dp) {
                // d loss / d raw score, then through raw = scale q . k.
                let draw = pj * (dpj - row_dot) * dsdraw * self.scale;
                for c in 0..d {
                    g.dq[i * d + c] += draw * self.k[j * d + c];
                    g.dk[j * d + c] += draw * self.q[i * d + c];
                    g.dv[j * d + c] += pj * gi[c];
                }
            }
        }
        g
    }
}

/// The shapes of a dense call: `(batch, hq, hkv, sq, sk, d)`, checked.
fn dense_dims(
    op: &'static str,
    q: &[usize],
    k: &[usize],
    v: &[usize],
    f: &ModelFeatures,
) -> Result<(usize, usize, usize, usize, usize, usize)> {
    let bad = |what: &str, expected: String, got: &[usize]| Error::Shape {
        op,
        what: what.into(),
        expected,
        got: got.to_vec(),
    };
    let [b, hq, sq, d] = *q else {
        return Err(bad("q", "[B, Hq, Sq, D]".into(), q));
    };
    let [bk, hkv, sk, dk] = *k else {
        return Err(bad("k", "[B, Hkv, Sk, D]".into(), k));
    };
    if bk != b || dk != d || hkv == 0 || hq % hkv != 0 {
        return Err(bad(
            "k (batch and head dim of q; q's heads a multiple of k's)",
            format!("[{b}, a divisor of {hq}, Sk, {d}]"),
            k,
        ));
    }
    if v != k {
        return Err(bad("v (k's shape)", format!("{k:?}"), v));
    }
    if let Some(s) = &f.alibi_slopes
        && s.len() != hq
    {
        return Err(Error::Length {
            what: "attention model features: ALiBi slopes (one a query head)",
            expected: hq,
            got: s.len(),
        });
    }
    if let Some(c) = f.softcap
        && !(c.is_finite() && c > 0.0)
    {
        return Err(Error::Invalid {
            op,
            msg: format!("softcap must be finite and positive, got {c}"),
        });
    }
    Ok((b, hq, hkv, sq, sk, d))
}

fn f64s(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

fn f32s(x: &[f64]) -> Vec<f32> {
    x.iter().map(|&v| v as f32).collect()
}

/// A checked dense call in f64: its inputs, shape `(B, Hq, Hkv, Sq, Sk, D)` and options.
struct Dense<'a> {
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
    dims: (usize, usize, usize, usize, usize, usize),
    scale: f64,
    causal: bool,
    f: &'a ModelFeatures,
}

impl<'a> Dense<'a> {
    fn of(
        op: &'static str,
        (q, k, v): (&HostTensor, &HostTensor, &HostTensor),
        params: &AttentionParams,
        f: &'a ModelFeatures,
    ) -> Result<Dense<'a>> {
        let dims = dense_dims(op, &q.shape, &k.shape, &v.shape, f)?;
        Ok(Dense {
            q: f64s(&q.data),
            k: f64s(&k.data),
            v: f64s(&v.data),
            dims,
            scale: super::scale(op, params, dims.5)? as f64,
            causal: params.causal == Causal::Yes,
            f,
        })
    }

    /// Every (batch, query head) problem in order, with the element ranges of its Q rows and of
    /// the key/value head it reads (query head `h` of a batch entry reads head `h / (Hq / Hkv)`).
    fn each_head(&self, mut visit: impl FnMut(Range<usize>, Range<usize>, Head<'_>)) {
        let (b, hq, hkv, sq, sk, d) = self.dims;
        for bi in 0..b {
            for h in 0..hq {
                let (qh, kh) = (bi * hq + h, bi * hkv + h / (hq / hkv));
                let (qr, kr) = (
                    qh * sq * d..(qh + 1) * sq * d,
                    kh * sk * d..(kh + 1) * sk * d,
                );
                let head = Head {
                    q: &self.q[qr.clone()],
                    k: &self.k[kr.clone()],
                    v: &self.v[kr.clone()],
                    sq,
                    sk,
                    d,
                    scale: self.scale,
                    causal: self.causal,
                    f: self.f,
                    slope: self.f.alibi_slopes.as_ref().map_or(0.0, |s| s[h] as f64),
                };
                visit(qr, kr, head);
            }
        }
    }
}

/// Dense forward: Q `[B, Hq, Sq, D]`, K and V `[B, Hkv, Sk, D]` (`Hq` a multiple of `Hkv`). Returns O
/// `[B, Hq, Sq, D]` and LSE `[B, Hq, Sq]`, f64 arithmetic stored as f32.
pub fn forward(
    q: &HostTensor,
    k: &HostTensor,
    v: &HostTensor,
    params: &AttentionParams,
    f: &ModelFeatures,
) -> Result<(HostTensor, HostTensor)> {
    let call = Dense::of("attention::model_features::forward", (q, k, v), params, f)?;
    let (b, hq, _, sq, _, d) = call.dims;
    let mut o = Vec::with_capacity(b * hq * sq * d);
    let mut lse = Vec::with_capacity(b * hq * sq);
    call.each_head(|_, _, head| {
        let (oh, lh) = head.forward();
        o.extend(oh);
        lse.extend(lh);
    });
    Ok((
        HostTensor::new(f32s(&o), &[b, hq, sq, d], DType::F32)?,
        HostTensor::new(f32s(&lse), &[b, hq, sq], DType::F32)?,
    ))
}

/// Dense backward for upstream `d_o` (q's shape): dQ `[B, Hq, Sq, D]`, and dK, dV `[B, Hkv, Sk, D]`,
/// each key/value head's gradient the sum over its group of query heads, in query-head order.
pub fn backward(
    q: &HostTensor,
    k: &HostTensor,
    v: &HostTensor,
    d_o: &HostTensor,
    params: &AttentionParams,
    f: &ModelFeatures,
) -> Result<AttentionGrads<HostTensor>> {
    const OP: &str = "attention::model_features::backward";
    let call = Dense::of(OP, (q, k, v), params, f)?;
    if d_o.shape != q.shape {
        return Err(Error::Shape {
            op: OP,
            what: "d_o (q's shape)".into(),
            expected: format!("{:?}", q.shape),
            got: d_o.shape.clone(),
        });
    }
    let gd = f64s(&d_o.data);
    let mut dq = vec![0f64; call.q.len()];
    let (mut dk, mut dv) = (vec![0f64; call.k.len()], vec![0f64; call.v.len()]);
    call.each_head(|qr, kr, head| {
        let g = head.backward(&gd[qr.clone()]);
        dq[qr].copy_from_slice(&g.dq);
        for (x, y) in dk[kr.clone()].iter_mut().zip(&g.dk) {
            *x += y;
        }
        for (x, y) in dv[kr].iter_mut().zip(&g.dv) {
            *x += y;
        }
    });
    Ok(AttentionGrads {
        dq: HostTensor::new(f32s(&dq), &q.shape, DType::F32)?,
        dk: HostTensor::new(f32s(&dk), &k.shape, DType::F32)?,
        dv: HostTensor::new(f32s(&dv), &k.shape, DType::F32)?,
    })
}

/// Cumulative sequence offsets (`[0, s_0, s_0 + s_1, ..]`, FlashAttention-2's `cu_seqlens`) of
/// packed sequences in `total` rows, checked (`op` names the caller in errors); returns how many
/// sequences (at least one) they bound.
pub(super) fn check_offsets(
    op: &'static str,
    what: &'static str,
    cu: &[usize],
    total: usize,
) -> Result<usize> {
    if cu.len() < 2 || cu[0] != 0 || cu.windows(2).any(|w| w[1] < w[0]) {
        return Err(Error::Invalid {
            op,
            msg: format!(
                "{what} must start at 0 and never decrease, one entry more than there are \
                 sequences (at least one), got {cu:?}"
            ),
        });
    }
    if cu[cu.len() - 1] != total {
        return Err(Error::Length {
            what,
            expected: total,
            got: cu[cu.len() - 1],
        });
    }
    Ok(cu.len() - 1)
}

/// Rows `r0..r1` of a packed `[T, H, D]` tensor as `[1, H, r1 - r0, D]` (BHSD).
fn unpack(x: &HostTensor, r0: usize, r1: usize) -> Result<HostTensor> {
    let (h, d) = (x.shape[1], x.shape[2]);
    let mut out = vec![0f32; (r1 - r0) * h * d];
    for r in r0..r1 {
        for hh in 0..h {
            let src = (r * h + hh) * d;
            let dst = (hh * (r1 - r0) + (r - r0)) * d;
            out[dst..dst + d].copy_from_slice(&x.data[src..src + d]);
        }
    }
    HostTensor::new(out, &[1, h, r1 - r0, d], x.dtype)
}

/// Variable-length (packed) forward, as FlashAttention-2's varlen API: Q `[Tq, Hq, D]`, K and V
/// `[Tk, Hkv, D]`, sequence `b` being rows `cu_q[b]..cu_q[b + 1]` of Q and `cu_k[b]..cu_k[b + 1]`
/// of K/V; every mask (causal, window) within each sequence. Returns O `[Tq, Hq, D]` and LSE
/// `[Hq, Tq]` (FlashAttention-2's varlen layouts).
pub fn varlen_forward(
    q: &HostTensor,
    k: &HostTensor,
    v: &HostTensor,
    cu_q: &[usize],
    cu_k: &[usize],
    params: &AttentionParams,
    f: &ModelFeatures,
) -> Result<(HostTensor, HostTensor)> {
    const OP: &str = "attention::model_features::varlen_forward";
    for (what, t) in [("q", q), ("k", k), ("v", v)] {
        if t.shape.len() != 3 {
            return Err(Error::Shape {
                op: OP,
                what: format!("{what} (packed [T, H, D])"),
                expected: "[T, H, D]".into(),
                got: t.shape.clone(),
            });
        }
    }
    let batch = check_offsets(OP, "varlen cu_seqlens_q", cu_q, q.shape[0])?;
    if check_offsets(OP, "varlen cu_seqlens_k", cu_k, k.shape[0])? != batch {
        return Err(Error::Length {
            what: "varlen cu_seqlens_k (one more than the sequences of cu_seqlens_q)",
            expected: batch + 1,
            got: cu_k.len(),
        });
    }
    let (tq, hq, d) = (q.shape[0], q.shape[1], q.shape[2]);
    let mut o = vec![0f32; tq * hq * d];
    let mut lse = vec![f32::NEG_INFINITY; hq * tq];
    for b in 0..batch {
        let (q0, q1, k0, k1) = (cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]);
        let (ob, lb) = forward(
            &unpack(q, q0, q1)?,
            &unpack(k, k0, k1)?,
            &unpack(v, k0, k1)?,
            params,
            f,
        )?;
        let n = q1 - q0;
        for h in 0..hq {
            for i in 0..n {
                let src = (h * n + i) * d;
                let dst = ((q0 + i) * hq + h) * d;
                o[dst..dst + d].copy_from_slice(&ob.data[src..src + d]);
                lse[h * tq + q0 + i] = lb.data[h * n + i];
            }
        }
    }
    Ok((
        HostTensor::new(o, &[tq, hq, d], DType::F32)?,
        HostTensor::new(lse, &[hq, tq], DType::F32)?,
    ))
}

/// A paged KV cache read back as dense K (or V) `[B, Hkv, max(seq_lens), D]`: `cache` is
/// `[pages, page_size, Hkv, D]`, sequence `b`'s key `j` lives in page `block_table[b][j / page_size]`
/// at slot `j % page_size`; rows past a sequence's length are 0 (callers slice them off).
pub fn gather_paged(
    cache: &HostTensor,
    block_table: &[Vec<usize>],
    seq_lens: &[usize],
) -> Result<HostTensor> {
    const OP: &str = "attention::model_features::gather_paged";
    let [pages, page, hkv, d] = *cache.shape.as_slice() else {
        return Err(Error::Shape {
            op: OP,
            what: "cache".into(),
            expected: "[pages, page_size, Hkv, D]".into(),
            got: cache.shape.clone(),
        });
    };
    if block_table.len() != seq_lens.len() {
        return Err(Error::Length {
            what: "paged KV block table (one row a sequence)",
            expected: seq_lens.len(),
            got: block_table.len(),
        });
    }
    let sk = seq_lens.iter().copied().max().unwrap_or(0);
    let b = seq_lens.len();
    let mut out = vec![0f32; b * hkv * sk * d];
    for (bi, (table, &len)) in block_table.iter().zip(seq_lens).enumerate() {
        if len.div_ceil(page.max(1)) > table.len() {
            return Err(Error::Length {
                what: "paged KV block table row (pages for the sequence's length)",
                expected: len.div_ceil(page.max(1)),
                got: table.len(),
            });
        }
        for j in 0..len {
            let p = table[j / page];
            if p >= pages {
                return Err(Error::Invalid {
                    op: OP,
                    msg: format!("sequence {bi} names page {p} of a {pages}-page cache"),
                });
            }
            for h in 0..hkv {
                let src = ((p * page + j % page) * hkv + h) * d;
                let dst = ((bi * hkv + h) * sk + j) * d;
                out[dst..dst + d].copy_from_slice(&cache.data[src..src + d]);
            }
        }
    }
    HostTensor::new(out, &[b, hkv, sk, d], cache.dtype)
}

/// Merges partial results over disjoint key sets, as split-KV decoding combines its splits: each
/// part is `(O [rows, D], LSE [rows])` of the same query rows; the result is the attention over the
/// union (`O = sum_p O_p e^(LSE_p - LSE)`, `LSE = ln sum_p e^(LSE_p)`). Rows no part sees stay O = 0,
/// LSE = -inf.
pub fn merge_splits(parts: &[(Vec<f64>, Vec<f64>)], d: usize) -> (Vec<f64>, Vec<f64>) {
    let rows = parts.first().map_or(0, |p| p.1.len());
    let mut o = vec![0f64; rows * d];
    let mut lse = vec![f64::NEG_INFINITY; rows];
    for r in 0..rows {
        let m = parts
            .iter()
            .map(|p| p.1[r])
            .fold(f64::NEG_INFINITY, f64::max);
        if m == f64::NEG_INFINITY {
            continue;
        }
        let total = m + parts.iter().map(|p| (p.1[r] - m).exp()).sum::<f64>().ln();
        lse[r] = total;
        for (po, pl) in parts {
            let w = (pl[r] - total).exp();
            if w == 0.0 {
                continue;
            }
            for c in 0..d {
                o[r * d + c] += w * po[r * d + c];
            }
        }
    }
    (o, lse)
}

#[cfg(test)]
mod tests;
