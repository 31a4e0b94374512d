//! The model-feature reference against compositions of the plain reference and against direct
//! formulas; the backward against central differences. Fresh random inputs every run (the seed is
//! printed; `RGK_SEED` replays it).
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::super::reference;
use super::*;

fn rng(test: &str) -> StdRng {
    StdRng::seed_from_u64(crate::testing::seed(test))
}

fn random(r: &mut StdRng, shape: &[usize]) -> HostTensor {
    let n = shape.iter().product();
    HostTensor::new(
        (0..n).map(|_| r.random_range(-1.0f32..1.0)).collect(),
        shape,
        DType::F32,
    )
    .unwrap()
}

fn params(causal: bool, scale: Option<f32>) -> AttentionParams<'static> {
    AttentionParams {
        causal: if causal { Causal::Yes } else { Causal::No },
        scale,
        ..Default::default()
    }
}

/// `max |a - b|`, with NaN never passing (and -inf equal to -inf).
fn max_diff(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(&x, &y)| {
            if x == y {
                0.0
            } else if x.is_nan() || y.is_nan() {
                f64::INFINITY
            } else {
                (x as f64 - y as f64).abs()
            }
        })
        .fold(0.0, f64::max)
}

/// K/V `[B, Hkv, S, D]` with every head repeated `g` times: `[B, g Hkv, S, D]`, query head `h`
/// reading copy `h / g`'s source.
fn repeat_heads(x: &HostTensor, g: usize) -> HostTensor {
    let [b, h, s, d] = *x.shape.as_slice() else {
        panic!("rank 4")
    };
    let mut out = Vec::with_capacity(x.data.len() * g);
    for bi in 0..b {
        for hh in 0..h {
            let src = &x.data[(bi * h + hh) * s * d..(bi * h + hh + 1) * s * d];
            for _ in 0..g {
                out.extend_from_slice(src);
            }
        }
    }
    HostTensor::new(out, &[b, h * g, s, d], x.dtype).unwrap()
}

#[test]
fn with_no_features_it_is_the_plain_reference() {
    let mut r = rng("model features: plain");
    for (sq, sk, causal) in [(5, 7, false), (5, 7, true), (9, 4, true), (1, 13, true)] {
        let (q, k, v, g) = (
            random(&mut r, &[2, 3, sq, 8]),
            random(&mut r, &[2, 3, sk, 8]),
            random(&mut r, &[2, 3, sk, 8]),
            random(&mut r, &[2, 3, sq, 8]),
        );
        let p = params(causal, None);
        let f = ModelFeatures::default();
        let (o, lse) = forward(&q, &k, &v, &p, &f).unwrap();
        let (o_ref, lse_ref) = reference::forward(&q, &k, &v, &p).unwrap();
        assert!(max_diff(&o.data, &o_ref.data) < 1e-6, "O, {sq}x{sk}");
        assert!(max_diff(&lse.data, &lse_ref.data) < 1e-6, "LSE, {sq}x{sk}");
        let gr = backward(&q, &k, &v, &g, &p, &f).unwrap();
        let gr_ref = reference::backward(&q, &k, &v, &g, &p).unwrap();
        for (what, a, b) in [
            ("dQ", &gr.dq, &gr_ref.dq),
            ("dK", &gr.dk, &gr_ref.dk),
            ("dV", &gr.dv, &gr_ref.dv),
        ] {
            assert!(max_diff(&a.data, &b.data) < 1e-6, "{what}, {sq}x{sk}");
        }
    }
}

#[test]
fn grouped_query_heads_are_repeated_keys_and_values() {
    let mut r = rng("model features: gqa");
    for (hkv, g, causal) in [(2, 3, true), (1, 4, false), (3, 1, true)] {
        let hq = hkv * g;
        let (q, k, v, go) = (
            random(&mut r, &[2, hq, 6, 8]),
            random(&mut r, &[2, hkv, 9, 8]),
            random(&mut r, &[2, hkv, 9, 8]),
            random(&mut r, &[2, hq, 6, 8]),
        );
        let f = ModelFeatures {
            softcap: Some(3.0),
            alibi_slopes: Some((0..hq).map(|h| 0.25 / (h + 1) as f32).collect()),
            window_left: Some(4),
            ..Default::default()
        };
        let p = params(causal, None);
        let (kr, vr) = (repeat_heads(&k, g), repeat_heads(&v, g));
        let (o, lse) = forward(&q, &k, &v, &p, &f).unwrap();
        let (o_mha, lse_mha) = forward(&q, &kr, &vr, &p, &f).unwrap();
        assert!(max_diff(&o.data, &o_mha.data) < 1e-7, "O, Hkv {hkv} g {g}");
        assert!(max_diff(&lse.data, &lse_mha.data) < 1e-7, "LSE");
        // dK/dV of a key/value head: the sum of its group's repeated-head gradients.
        let gq = backward(&q, &k, &v, &go, &p, &f).unwrap();
        let gm = backward(&q, &kr, &vr, &go, &p, &f).unwrap();
        assert!(max_diff(&gq.dq.data, &gm.dq.data) < 1e-7, "dQ");
        let per = 9 * 8;
        for (what, grouped, repeated) in [("dK", &gq.dk, &gm.dk), ("dV", &gq.dv, &gm.dv)] {
            for bk in 0..2 * hkv {
                for e in 0..per {
                    let sum: f64 = (0..g)
                        .map(|c| repeated.data[(bk * g + c) * per + e] as f64)
                        .sum();
                    let got = grouped.data[bk * per + e] as f64;
                    assert!(
                        (got - sum).abs() < 1e-6,
                        "{what}[{bk}][{e}]: {got} vs {sum}"
                    );
                }
            }
        }
    }
}

/// Row `i` of one head computed straight from the formulas of the module doc, for comparison.
#[allow(clippy::too_many_arguments)]
fn direct_row(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    (i, sq, sk, d): (usize, usize, usize, usize),
    scale: f64,
    causal: bool,
    f: &ModelFeatures,
    slope: f64,
) -> Option<Vec<f64>> {
    let pos = i as i64 + sk as i64 - sq as i64;
    let keys: Vec<usize> = (0..sk)
        .filter(|&j| {
            let j = j as i64;
            (!causal || j <= pos)
                && f.window_left.is_none_or(|l| j >= pos - l as i64)
                && (causal || f.window_right.is_none_or(|rr| j <= pos + rr as i64))
        })
        .collect();
    if keys.is_empty() {
        return None;
    }
    let s: Vec<f64> = keys
        .iter()
        .map(|&j| {
            let dot: f64 = (0..d)
                .map(|c| q[i * d + c] as f64 * k[j * d + c] as f64)
                .sum();
            let mut x = scale * dot;
            if let Some(cap) = f.softcap {
                x = cap as f64 * (x / cap as f64).tanh();
            }
            x - slope * (pos - j as i64).abs() as f64
        })
        .collect();
    let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
    Some(
        (0..d)
            .map(|c| {
                keys.iter()
                    .zip(&s)
                    .map(|(&j, x)| (x - m).exp() / z * v[j * d + c] as f64)
                    .sum()
            })
            .collect(),
    )
}

#[test]
fn windows_softcap_and_alibi_follow_their_formulas() {
    let mut r = rng("model features: formulas");
    let d = 8;
    for (sq, sk, causal, left, right) in [
        (6, 11, false, Some(3), Some(2)),
        (6, 11, true, Some(2), None),
        (11, 6, true, None, None),
        (7, 7, false, None, Some(0)),
        (4, 9, false, Some(0), Some(0)),
    ] {
        let (q, k, v) = (
            random(&mut r, &[1, 2, sq, d]),
            random(&mut r, &[1, 2, sk, d]),
            random(&mut r, &[1, 2, sk, d]),
        );
        let f = ModelFeatures {
            window_left: left,
            window_right: right,
            softcap: Some(0.7),
            alibi_slopes: Some(vec![0.5, 0.125]),
        };
        let p = params(causal, Some(1.3));
        let (o, lse) = forward(&q, &k, &v, &p, &f).unwrap();
        for h in 0..2 {
            for i in 0..sq {
                let row = (h * sq + i) * d;
                let want = direct_row(
                    &q.data[h * sq * d..],
                    &k.data[h * sk * d..],
                    &v.data[h * sk * d..],
                    (i, sq, sk, d),
                    1.3,
                    causal,
                    &f,
                    [0.5, 0.125][h],
                );
                match want {
                    None => {
                        assert!(o.data[row..row + d].iter().all(|&x| x == 0.0));
                        assert_eq!(lse.data[h * sq + i], f32::NEG_INFINITY);
                    }
                    Some(w) => {
                        for c in 0..d {
                            let got = o.data[row + c] as f64;
                            assert!(
                                (got - w[c]).abs() < 1e-6,
                                "{sq}x{sk} causal {causal} window ({left:?}, {right:?}) head {h} \
                                 row {i}: {got} vs {}",
                                w[c]
                            );
                        }
                    }
                }
            }
        }
    }
    // A window of (None, Some(0)) without the causal flag is the causal mask.
    let (q, k, v) = (
        random(&mut r, &[1, 2, 5, d]),
        random(&mut r, &[1, 2, 8, d]),
        random(&mut r, &[1, 2, 8, d]),
    );
    let win = ModelFeatures {
        window_right: Some(0),
        ..Default::default()
    };
    let (a, _) = forward(&q, &k, &v, &params(false, None), &win).unwrap();
    let (b, _) = reference::forward(&q, &k, &v, &params(true, None)).unwrap();
    assert!(max_diff(&a.data, &b.data) < 1e-6);
}

/// The head the finite-difference test differentiates: scale 0.8, ALiBi slope 0.3.
fn fd_head<'a>(
    [q, k, v]: [&'a [f64]; 3],
    (sq, sk, d): (usize, usize, usize),
    causal: bool,
    f: &'a ModelFeatures,
) -> Head<'a> {
    Head {
        q,
        k,
        v,
        sq,
        sk,
        d,
        scale: 0.8,
        causal,
        f,
        slope: 0.3,
    }
}

#[test]
fn the_backward_matches_central_differences() {
    let mut r = rng("model features: finite differences");
    let (sq, sk, d) = (4, 6, 5);
    let draw = |r: &mut StdRng, n: usize| -> Vec<f64> {
        (0..n).map(|_| r.random_range(-1.0..1.0)).collect()
    };
    for causal in [false, true] {
        let (q, k, v, go) = (
            draw(&mut r, sq * d),
            draw(&mut r, sk * d),
            draw(&mut r, sk * d),
            draw(&mut r, sq * d),
        );
        let f = ModelFeatures {
            window_left: Some(3),
            window_right: Some(1),
            softcap: Some(0.9),
            alibi_slopes: None,
        };
        let dims = (sq, sk, d);
        let loss = |q: &[f64], k: &[f64], v: &[f64]| -> f64 {
            fd_head([q, k, v], dims, causal, &f)
                .forward()
                .0
                .iter()
                .zip(&go)
                .map(|(a, b)| a * b)
                .sum()
        };
        let g = fd_head([&q, &k, &v], dims, causal, &f).backward(&go);
        let eps = 1e-6;
        for (what, which, grad) in [("dQ", 0, &g.dq), ("dK", 1, &g.dk), ("dV", 2, &g.dv)] {
            for e in 0..grad.len() {
                let mut xs = [q.clone(), k.clone(), v.clone()];
                xs[which][e] += eps;
                let up = loss(&xs[0], &xs[1], &xs[2]);
                xs[which][e] -= 2.0 * eps;
                let down = loss(&xs[0], &xs[1], &xs[2]);
                let numeric = (up - down) / (2.0 * eps);
                assert!(
                    (numeric - grad[e]).abs() < 1e-7 + 1e-6 * numeric.abs(),
                    "causal {causal} {what}[{e}]: analytic {} numeric {numeric}",
                    grad[e]
                );
            }
        }
    }
}

#[test]
fn varlen_is_one_call_per_sequence() {
    let mut r = rng("model features: varlen");
    let (hq, hkv, d) = (4, 2, 8);
    let (lens_q, lens_k) = ([3usize, 0, 5, 1], [4usize, 2, 6, 7]);
    let cu = |lens: &[usize]| -> Vec<usize> {
        std::iter::once(0)
            .chain(lens.iter().scan(0, |a, &l| {
                *a += l;
                Some(*a)
            }))
            .collect()
    };
    let (cu_q, cu_k) = (cu(&lens_q), cu(&lens_k));
    let (tq, tk) = (cu_q[4], cu_k[4]);
    let (q, k, v) = (
        random(&mut r, &[tq, hq, d]),
        random(&mut r, &[tk, hkv, d]),
        random(&mut r, &[tk, hkv, d]),
    );
    let f = ModelFeatures {
        window_left: Some(2),
        ..Default::default()
    };
    let p = params(true, None);
    let (o, lse) = varlen_forward(&q, &k, &v, &cu_q, &cu_k, &p, &f).unwrap();
    for b in 0..4 {
        let (q0, n) = (cu_q[b], lens_q[b]);
        // The sequence on its own, built in BHSD by hand.
        let bhsd = |x: &HostTensor, r0: usize, rows: usize, h: usize| {
            let mut out = vec![0f32; h * rows * d];
            for i in 0..rows {
                for hh in 0..h {
                    let src = ((r0 + i) * h + hh) * d;
                    out[(hh * rows + i) * d..(hh * rows + i + 1) * d]
                        .copy_from_slice(&x.data[src..src + d]);
                }
            }
            HostTensor::new(out, &[1, h, rows, d], DType::F32).unwrap()
        };
        let (ob, lb) = forward(
            &bhsd(&q, q0, n, hq),
            &bhsd(&k, cu_k[b], lens_k[b], hkv),
            &bhsd(&v, cu_k[b], lens_k[b], hkv),
            &p,
            &f,
        )
        .unwrap();
        for h in 0..hq {
            for i in 0..n {
                let got = &o.data[((q0 + i) * hq + h) * d..((q0 + i) * hq + h + 1) * d];
                let want = &ob.data[(h * n + i) * d..(h * n + i + 1) * d];
                assert_eq!(got, want, "sequence {b} head {h} row {i}");
                assert_eq!(lse.data[h * tq + q0 + i], lb.data[h * n + i]);
            }
        }
    }
    // Offsets that do not cover the rows, or decrease, are errors.
    assert!(varlen_forward(&q, &k, &v, &[0, 3, 9], &cu_k, &p, &f).is_err());
    assert!(varlen_forward(&q, &k, &v, &[0, 5, 3, 8, 9], &cu_k, &p, &f).is_err());
}

#[test]
fn a_paged_cache_reads_back_as_its_dense_form() {
    let mut r = rng("model features: paged");
    let (hkv, d, page) = (2, 8, 4);
    let lens = [5usize, 12, 1];
    let sk = 12;
    let dense = random(&mut r, &[3, hkv, sk, d]);
    // Pages handed out in a shuffled order, one spare page never used.
    let needed: usize = lens.iter().map(|l| l.div_ceil(page)).sum();
    let mut order: Vec<usize> = (0..needed + 1).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, r.random_range(0..=i));
    }
    let mut cache = vec![f32::NAN; (needed + 1) * page * hkv * d];
    let mut next = 0;
    let mut table = Vec::new();
    for (b, &len) in lens.iter().enumerate() {
        let mut row = Vec::new();
        for pg in 0..len.div_ceil(page) {
            let p = order[next];
            next += 1;
            row.push(p);
            for slot in 0..page {
                let j = pg * page + slot;
                if j >= len {
                    break;
                }
                for h in 0..hkv {
                    let src = ((b * hkv + h) * sk + j) * d;
                    let dst = ((p * page + slot) * hkv + h) * d;
                    cache[dst..dst + d].copy_from_slice(&dense.data[src..src + d]);
                }
            }
        }
        table.push(row);
    }
    let cache = HostTensor::new(cache, &[needed + 1, page, hkv, d], DType::F32).unwrap();
    let got = gather_paged(&cache, &table, &lens).unwrap();
    assert_eq!(got.shape, [3, hkv, sk, d]);
    for (b, &len) in lens.iter().enumerate() {
        for h in 0..hkv {
            for j in 0..sk {
                let at = ((b * hkv + h) * sk + j) * d;
                let want: &[f32] = if j < len {
                    &dense.data[at..at + d]
                } else {
                    &[0.0; 8]
                };
                assert_eq!(&got.data[at..at + d], want, "seq {b} head {h} key {j}");
            }
        }
    }
    let mut bad = table.clone();
    bad[1][0] = needed + 5;
    assert!(gather_paged(&cache, &bad, &lens).is_err());
    assert!(gather_paged(&cache, &table[..2], &lens).is_err());
}

#[test]
fn split_kv_merges_to_the_unsplit_result() {
    let mut r = rng("model features: split-kv");
    let (hq, hkv, sk, d) = (8, 2, 23, 16);
    // Decoding: one query row against a long key range, split into uneven parts.
    let (q, k, v) = (
        random(&mut r, &[1, hq, 1, d]),
        random(&mut r, &[1, hkv, sk, d]),
        random(&mut r, &[1, hkv, sk, d]),
    );
    let f = ModelFeatures {
        softcap: Some(2.0),
        ..Default::default()
    };
    let p = params(false, None);
    let keys = |x: &HostTensor, a: usize, b: usize| {
        let mut out = Vec::new();
        for h in 0..hkv {
            out.extend_from_slice(&x.data[(h * sk + a) * d..(h * sk + b) * d]);
        }
        HostTensor::new(out, &[1, hkv, b - a, d], DType::F32).unwrap()
    };
    let cuts = [0, 5, 6, 17, 23];
    let parts: Vec<(Vec<f64>, Vec<f64>)> = cuts
        .windows(2)
        .map(|w| {
            let (o, l) = forward(&q, &keys(&k, w[0], w[1]), &keys(&v, w[0], w[1]), &p, &f).unwrap();
            (
                o.data.iter().map(|&x| x as f64).collect(),
                l.data.iter().map(|&x| x as f64).collect(),
            )
        })
        .collect();
    let (o, lse) = merge_splits(&parts, d);
    let (o_all, lse_all) = forward(&q, &k, &v, &p, &f).unwrap();
    for (a, b) in o.iter().zip(&o_all.data) {
        assert!((a - *b as f64).abs() < 1e-6, "{a} vs {b}");
    }
    for (a, b) in lse.iter().zip(&lse_all.data) {
        assert!((a - *b as f64).abs() < 1e-6, "{a} vs {b}");
    }
}

#[test]
fn bad_shapes_and_features_are_named_errors() {
    let mut r = rng("model features: errors");
    let (q, k) = (random(&mut r, &[1, 6, 3, 8]), random(&mut r, &[1, 4, 5, 8]));
    let p = params(false, None);
    let f = ModelFeatures::default();
    let e = forward(&q, &k, &k, &p, &f).unwrap_err().to_string();
    assert!(e.contains("multiple"), "{e}");
    let k2 = random(&mut r, &[1, 2, 5, 8]);
    let slopes = ModelFeatures {
        alibi_slopes: Some(vec![0.1; 5]),
        ..Default::default()
    };
    let e = forward(&q, &k2, &k2, &p, &slopes).unwrap_err().to_string();
    assert!(
        e.contains("ALiBi") && e.contains('6') && e.contains('5'),
        "{e}"
    );
    let cap = ModelFeatures {
        softcap: Some(0.0),
        ..Default::default()
    };
    let e = forward(&q, &k2, &k2, &p, &cap).unwrap_err().to_string();
    assert!(e.contains("softcap"), "{e}");
}
