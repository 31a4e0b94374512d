//! Grouped-query attention (K and V with fewer heads than Q) through `flash_forward` and
//! `flash_backward`, without copying K or V:
//! - forward, every FlashAttention kernel this build has (`FLASH_VARIANTS`): O and LSE bit-identical
//!   to the same kernel on K and V repeated to every query head (the multi-head path), and O within
//!   the relative 2-norm tolerance of `common::tol` of the f64 reference of
//!   `attention::model_features` (LSE within `1e-3 (1 + |ref|)`);
//! - backward: dQ, dK, dV within the relative 2-norm tolerance of `common::tol` of that reference
//!   (dK and dV summed over each group), dK and dV within the same tolerance of the multi-head
//!   path's gradients summed over each group, and the same bits on a second run (the group's sum is
//!   ordered).
//!
//! Groups of 2, 4 and 8 and MQA (one key/value head), odd lengths, both masks, f16 and bf16, head
//! dims 64 and 128. Outputs are poisoned before every launch; inputs are fresh (the seed is printed).
mod common;

use common::{assert_close, attention_params, bits, gpu_or_skip, read, rng, tol, uniform};
use host::ops::attention::{self, flash_forward_variant, model_features as mf};
use host::{DType, HostTensor, Tensor};

/// `x` `[B, Hkv, S, D]` with every head repeated `group` times: `[B, Hkv * group, S, D]`.
fn repeat_heads(x: &HostTensor, group: usize) -> HostTensor {
    let [b, hkv, s, d] = x.shape[..] else {
        panic!("rank 4")
    };
    let mut out = Vec::with_capacity(x.data.len() * group);
    for bi in 0..b {
        for h in 0..hkv {
            let at = ((bi * hkv + h) * s) * d;
            for _ in 0..group {
                out.extend_from_slice(&x.data[at..at + s * d]);
            }
        }
    }
    HostTensor::new(out, &[b, hkv * group, s, d], x.dtype).unwrap()
}

/// `g` `[B, Hkv * group, S, D]` summed over each group of heads (f64), as `[B, Hkv, S, D]`.
fn sum_groups(g: &[f32], shape: [usize; 4], group: usize) -> Vec<f32> {
    let [b, hkv, s, d] = shape;
    let mut out = vec![0f64; b * hkv * s * d];
    for bi in 0..b {
        for h in 0..hkv {
            for r in 0..group {
                let src = ((bi * hkv + h) * group + r) * s * d;
                let dst = (bi * hkv + h) * s * d;
                for e in 0..s * d {
                    out[dst + e] += g[src + e] as f64;
                }
            }
        }
    }
    out.into_iter().map(|x| x as f32).collect()
}

/// (B, Hq, Hkv, Sq, Sk, D)
const CASES: [(usize, usize, usize, usize, usize, usize); 5] = [
    (2, 8, 2, 97, 131, 128),
    (1, 8, 1, 200, 77, 64),
    (2, 4, 2, 1, 300, 64),
    (1, 16, 2, 129, 129, 128),
    (3, 6, 3, 33, 250, 64),
];

#[test]
fn grouped_forward_matches_the_repeated_heads_and_the_reference() {
    let Some(gpu) = gpu_or_skip("grouped_forward_matches_the_repeated_heads_and_the_reference")
    else {
        return;
    };
    let mut r = rng("gqa forward");
    for dtype in [DType::F16, DType::BF16] {
        for &(b, hq, hkv, sq, sk, d) in &CASES {
            for causal in [false, true] {
                let group = hq / hkv;
                let q = uniform(&mut r, &[b, hq, sq, d], -1.0, 1.0, dtype);
                let k = uniform(&mut r, &[b, hkv, sk, d], -1.0, 1.0, dtype);
                let v = uniform(&mut r, &[b, hkv, sk, d], -1.0, 1.0, dtype);
                let up = |x: &HostTensor| Tensor::from_host(&gpu, x).unwrap();
                let (qd, kd, vd) = (up(&q), up(&k), up(&v));
                let (kr, vr) = (up(&repeat_heads(&k, group)), up(&repeat_heads(&v, group)));
                let (o_ref, lse_ref) = mf::forward(
                    &q,
                    &k,
                    &v,
                    &attention_params(causal),
                    &mf::ModelFeatures::default(),
                )
                .unwrap();
                let what =
                    format!("{dtype} B{b} Hq{hq} Hkv{hkv} Sq{sq} Sk{sk} D{d} causal {causal}");
                let variants = common::flash_variants(&gpu, d, &what);
                for &variant in &variants {
                    let (o, lse) =
                        flash_forward_variant(&qd, &kd, &vd, &attention_params(causal), variant)
                            .unwrap();
                    let (o_mha, lse_mha) =
                        flash_forward_variant(&qd, &kr, &vr, &attention_params(causal), variant)
                            .unwrap();
                    assert_eq!(bits(&o), bits(&o_mha), "{what} kernel {variant}: O");
                    assert_eq!(bits(&lse), bits(&lse_mha), "{what} kernel {variant}: LSE");
                    let (o, lse) = (read(&o), read(&lse));
                    assert_close(
                        &format!("{what} kernel {variant}: O"),
                        &o,
                        &o_ref.data,
                        tol(dtype),
                    );
                    common::assert_lse_close(
                        &format!("{what} kernel {variant}: LSE"),
                        &lse,
                        &lse_ref.data,
                    );
                }
                println!("{what}: {} kernels ok", variants.len());
            }
        }
    }
}

#[test]
fn grouped_backward_sums_each_group_in_order() {
    let Some(gpu) = gpu_or_skip("grouped_backward_sums_each_group_in_order") else {
        return;
    };
    let mut r = rng("gqa backward");
    for dtype in [DType::F16, DType::BF16] {
        for &(b, hq, hkv, sq, sk, d) in &CASES {
            for causal in [false, true] {
                let group = hq / hkv;
                let p = attention_params(causal);
                let q = uniform(&mut r, &[b, hq, sq, d], -1.0, 1.0, dtype);
                let k = uniform(&mut r, &[b, hkv, sk, d], -1.0, 1.0, dtype);
                let v = uniform(&mut r, &[b, hkv, sk, d], -1.0, 1.0, dtype);
                let d_o = uniform(&mut r, &[b, hq, sq, d], -1.0, 1.0, dtype);
                let up = |x: &HostTensor| Tensor::from_host(&gpu, x).unwrap();
                let (qd, kd, vd, dod) = (up(&q), up(&k), up(&v), up(&d_o));
                let what =
                    format!("{dtype} B{b} Hq{hq} Hkv{hkv} Sq{sq} Sk{sk} D{d} causal {causal}");

                let (o, lse) = attention::flash_forward(&qd, &kd, &vd, &p).unwrap();
                let g = attention::flash_backward(&qd, &kd, &vd, &o, &lse, &dod, &p).unwrap();
                assert_eq!(g.dk.shape(), &[b, hkv, sk, d][..], "{what}: dK shape");
                let again = attention::flash_backward(&qd, &kd, &vd, &o, &lse, &dod, &p).unwrap();
                for (name, x, y) in [
                    ("dQ", &g.dq, &again.dq),
                    ("dK", &g.dk, &again.dk),
                    ("dV", &g.dv, &again.dv),
                ] {
                    assert_eq!(bits(x), bits(y), "{what}: {name} differs between runs");
                }

                let want =
                    mf::backward(&q, &k, &v, &d_o, &p, &mf::ModelFeatures::default()).unwrap();
                let t = tol(dtype);
                common::assert_grads_close(
                    &format!("{what}: vs reference"),
                    &g,
                    [&want.dq.data, &want.dk.data, &want.dv.data],
                    t,
                );

                // The multi-head path on repeated K and V, its dK and dV summed over each group.
                let (kr, vr) = (up(&repeat_heads(&k, group)), up(&repeat_heads(&v, group)));
                let (o_m, lse_m) = attention::flash_forward(&qd, &kr, &vr, &p).unwrap();
                let m = attention::flash_backward(&qd, &kr, &vr, &o_m, &lse_m, &dod, &p).unwrap();
                let shape = [b, hkv, sk, d];
                let (dk_m, dv_m) = (
                    sum_groups(&read(&m.dk), shape, group),
                    sum_groups(&read(&m.dv), shape, group),
                );
                assert_close(
                    &format!("{what}: dK vs the repeated heads"),
                    &read(&g.dk),
                    &dk_m,
                    t,
                );
                assert_close(
                    &format!("{what}: dV vs the repeated heads"),
                    &read(&g.dv),
                    &dv_m,
                    t,
                );
                assert_close(
                    &format!("{what}: dQ vs the repeated heads"),
                    &read(&g.dq),
                    &read(&m.dq),
                    t,
                );
                println!("{what}: ok");
            }
        }
    }
}

#[test]
fn heads_that_do_not_divide_are_named_errors() {
    let Some(gpu) = gpu_or_skip("heads_that_do_not_divide_are_named_errors") else {
        return;
    };
    let z = |shape: &[usize]| Tensor::zeros(&gpu, shape, DType::F16).unwrap();
    let (q, k) = (z(&[1, 6, 8, 64]), z(&[1, 4, 8, 64]));
    let e = attention::flash_forward(&q, &k, &k, &attention_params(false)).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("dividing"), "{msg}");
    assert!(msg.contains("[1, 4, 8, 64]"), "{msg}");
    // The naive path is multi-head only, and says so.
    let k2 = z(&[1, 2, 8, 64]);
    let e = attention::naive_forward(&q, &k2, &k2, &attention_params(false)).unwrap_err();
    assert!(e.to_string().contains("heads"), "{e}");
}
