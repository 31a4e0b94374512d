//! Attention operands with any strides (last dim contiguous), read and written without a copy:
//! `[B, S, H, D]` memory seen as `[B, H, S, D]` through `transpose(1, 2)`, slices of a fused
//! `[B, S, 3, H, D]` QKV projection, and mixes of those with contiguous `[B, H, S, D]`.
//! - forward, every FlashAttention kernel this build has (`FLASH_VARIANTS`): O and LSE bit-identical
//!   to the same kernel on the same values stored contiguously, O in Q's layout, and O within the
//!   relative 2-norm tolerance of `common::tol` of the f64 reference of `attention::model_features`;
//! - backward: dQ, dK, dV bit-identical to the contiguous call's (same kernels, same summation order),
//!   each in its input's layout, and within tolerance of that reference;
//! - strides the kernels cannot take are named errors; the naive path stays contiguous and says so.
//!
//! Multi-head and grouped-query heads, odd lengths, both masks, f16 and bf16, head dims 64 and 128
//! (other head dims: `gpu_attention_head_dims`).
//! Outputs are poisoned before every launch; inputs are fresh (the seed is printed).
mod common;

use common::{
    assert_close, attention_params, bits, gpu_or_skip, read, rng, sanitizing, tol, uniform,
};
use host::ops::attention::{self, flash_forward_variant, model_features as mf};
use host::{DType, Error, Gpu, HostTensor, Tensor};

/// Where a case keeps its operands.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Layout {
    /// Q, K, V and dO in `[B, S, H, D]` memory.
    Bshd,
    /// Q, K, V slices of one `[B, S, 3, H, D]` tensor (equal head counts and lengths); dO `[B, S,
    /// H, D]`.
    FusedQkv,
    /// Q and dO in `[B, S, H, D]` memory, K and V contiguous `[B, H, S, D]`.
    Mixed,
}

/// Q, K, V `[B, H, S, D]` (equal shapes) uploaded as one `[B, S, 3, H, D]` tensor, returned as its
/// three `[B, H, S, D]` views.
fn upload_fused(gpu: &Gpu, x: [&HostTensor; 3]) -> [Tensor; 3] {
    let [b, h, s, d] = x[0].shape[..] else {
        panic!("rank 4")
    };
    let parts = x.map(common::to_bshd);
    let mut data = Vec::with_capacity(3 * parts[0].data.len());
    for row in 0..b * s {
        for p in &parts {
            data.extend_from_slice(&p.data[row * h * d..(row + 1) * h * d]);
        }
    }
    let qkv = HostTensor::new(data, &[b, s, 3, h, d], x[0].dtype).unwrap();
    let t = Tensor::from_host(gpu, &qkv).unwrap();
    [0, 1, 2].map(|i| t.select(2, i).unwrap().transpose(1, 2).unwrap())
}

/// The strides a `[b, h, s, d]` tensor has in `[B, S, H, D]` memory, seen as `[B, H, S, D]`.
fn bshd_strides([b, h, s, d]: [usize; 4]) -> Vec<usize> {
    let _ = b;
    vec![s * h * d, d, h * d, 1]
}

/// (B, Hq, Hkv, Sq, Sk, D, layout)
const CASES: [(usize, usize, usize, usize, usize, usize, Layout); 6] = [
    (2, 4, 4, 97, 131, 128, Layout::Bshd),
    (1, 8, 2, 200, 77, 64, Layout::Bshd),
    (2, 3, 3, 129, 129, 64, Layout::FusedQkv),
    (1, 2, 2, 70, 70, 128, Layout::FusedQkv),
    (1, 4, 4, 1, 300, 128, Layout::Mixed),
    (2, 8, 4, 33, 250, 128, Layout::Mixed),
];

/// The cases a run takes: under compute-sanitizer (tens of times slower) one of each layout.
fn cases() -> Vec<(usize, usize, usize, usize, usize, usize, Layout)> {
    if sanitizing() {
        vec![CASES[1], CASES[3], CASES[4]]
    } else {
        CASES.to_vec()
    }
}

/// One case's operands: the values, the strided tensors and the same values contiguous.
struct Operands {
    host: [HostTensor; 4],
    strided: [Tensor; 4],
    dense: [Tensor; 4],
}

fn operands(
    gpu: &Gpu,
    r: &mut rand::rngs::StdRng,
    (b, hq, hkv, sq, sk, d, layout): (usize, usize, usize, usize, usize, usize, Layout),
    dtype: DType,
) -> Operands {
    let q = uniform(r, &[b, hq, sq, d], -1.0, 1.0, dtype);
    let k = uniform(r, &[b, hkv, sk, d], -1.0, 1.0, dtype);
    let v = uniform(r, &[b, hkv, sk, d], -1.0, 1.0, dtype);
    let d_o = uniform(r, &[b, hq, sq, d], -1.0, 1.0, dtype);
    let up = |x: &HostTensor| Tensor::from_host(gpu, x).unwrap();
    let strided = match layout {
        Layout::Bshd => [&q, &k, &v, &d_o].map(|x| common::upload_bshd(gpu, x)),
        Layout::FusedQkv => {
            let [qs, ks, vs] = upload_fused(gpu, [&q, &k, &v]);
            [qs, ks, vs, common::upload_bshd(gpu, &d_o)]
        }
        Layout::Mixed => [
            common::upload_bshd(gpu, &q),
            up(&k),
            up(&v),
            common::upload_bshd(gpu, &d_o),
        ],
    };
    for (t, x) in strided.iter().zip([&q, &k, &v, &d_o]) {
        assert_eq!(t.shape(), &x.shape[..], "{layout:?}: view shape");
    }
    if layout != Layout::Mixed {
        assert!(!strided[0].is_contiguous(), "{layout:?}: Q must be strided");
    }
    let dense = [&q, &k, &v, &d_o].map(up);
    Operands {
        host: [q, k, v, d_o],
        strided,
        dense,
    }
}

/// The strides an output of shape `shape` must have when its input is `input`: `[B, S, H, D]` memory
/// when the input's heads interleave within its rows, else contiguous.
fn expected_strides(input: &Tensor, shape: [usize; 4]) -> Vec<usize> {
    let (s, t) = (input.shape(), input.strides());
    if s[1] > 1 && s[2] > 1 && t[1] < t[2] {
        bshd_strides(shape)
    } else {
        let [_, h, sq, d] = shape;
        vec![h * sq * d, sq * d, d, 1]
    }
}

#[test]
fn strided_forward_matches_contiguous_bits_and_the_reference() {
    let Some(gpu) = gpu_or_skip("strided_forward_matches_contiguous_bits_and_the_reference") else {
        return;
    };
    let mut r = rng("layouts forward");
    for dtype in [DType::F16, DType::BF16] {
        for case in cases() {
            let (b, hq, hkv, sq, sk, d, layout) = case;
            let x = operands(&gpu, &mut r, case, dtype);
            let [qs, ks, vs, _] = &x.strided;
            let [qc, kc, vc, _] = &x.dense;
            for causal in [false, true] {
                let p = attention_params(causal);
                let what = format!(
                    "{dtype} {layout:?} B{b} Hq{hq} Hkv{hkv} Sq{sq} Sk{sk} D{d} causal {causal}"
                );
                let (o_ref, _) = mf::forward(
                    &x.host[0],
                    &x.host[1],
                    &x.host[2],
                    &p,
                    &mf::ModelFeatures::default(),
                )
                .unwrap();
                let variants = common::flash_variants(&gpu, d, &what);
                for &variant in &variants {
                    let (o, lse) = flash_forward_variant(qs, ks, vs, &p, variant).unwrap();
                    let (o_c, lse_c) = flash_forward_variant(qc, kc, vc, &p, variant).unwrap();
                    assert_eq!(
                        o.strides(),
                        &expected_strides(qs, [b, hq, sq, d])[..],
                        "{what} kernel {variant}: O's layout"
                    );
                    assert_eq!(bits(&o), bits(&o_c), "{what} kernel {variant}: O");
                    assert_eq!(bits(&lse), bits(&lse_c), "{what} kernel {variant}: LSE");
                    assert_close(
                        &format!("{what} kernel {variant}: O vs reference"),
                        &read(&o),
                        &o_ref.data,
                        tol(dtype),
                    );
                }
                println!("{what}: {} kernels ok", variants.len());
            }
        }
    }
}

#[test]
fn strided_backward_matches_contiguous_bits_and_the_reference() {
    let Some(gpu) = gpu_or_skip("strided_backward_matches_contiguous_bits_and_the_reference")
    else {
        return;
    };
    let mut r = rng("layouts backward");
    for dtype in [DType::F16, DType::BF16] {
        for case in cases() {
            let (b, hq, hkv, sq, sk, d, layout) = case;
            let x = operands(&gpu, &mut r, case, dtype);
            let [qs, ks, vs, dos] = &x.strided;
            let [qc, kc, vc, doc] = &x.dense;
            for causal in [false, true] {
                let p = attention_params(causal);
                let what = format!(
                    "{dtype} {layout:?} B{b} Hq{hq} Hkv{hkv} Sq{sq} Sk{sk} D{d} causal {causal}"
                );
                let (o, lse) = attention::flash_forward(qs, ks, vs, &p).unwrap();
                let g = attention::flash_backward(qs, ks, vs, &o, &lse, dos, &p).unwrap();
                let (o_c, lse_c) = attention::flash_forward(qc, kc, vc, &p).unwrap();
                let g_c = attention::flash_backward(qc, kc, vc, &o_c, &lse_c, doc, &p).unwrap();
                for (name, out, input, shape) in [
                    ("dQ", &g.dq, qs, [b, hq, sq, d]),
                    ("dK", &g.dk, ks, [b, hkv, sk, d]),
                    ("dV", &g.dv, vs, [b, hkv, sk, d]),
                ] {
                    assert_eq!(out.shape(), &shape[..], "{what}: {name} shape");
                    assert_eq!(
                        out.strides(),
                        &expected_strides(input, shape)[..],
                        "{what}: {name}'s layout"
                    );
                }
                for (name, s, c) in [
                    ("dQ", &g.dq, &g_c.dq),
                    ("dK", &g.dk, &g_c.dk),
                    ("dV", &g.dv, &g_c.dv),
                ] {
                    assert_eq!(bits(s), bits(c), "{what}: {name} vs the contiguous call");
                }
                let want = mf::backward(
                    &x.host[0],
                    &x.host[1],
                    &x.host[2],
                    &x.host[3],
                    &p,
                    &mf::ModelFeatures::default(),
                )
                .unwrap();
                common::assert_grads_close(
                    &format!("{what}: vs reference"),
                    &g,
                    [&want.dq.data, &want.dk.data, &want.dv.data],
                    tol(dtype),
                );
                println!("{what}: ok");
            }
        }
    }
}

#[test]
fn strides_the_kernels_cannot_take_are_named_errors() {
    let Some(gpu) = gpu_or_skip("strides_the_kernels_cannot_take_are_named_errors") else {
        return;
    };
    let p = attention_params(false);
    let q = Tensor::zeros(&gpu, &[1, 2, 64, 64], DType::F16).unwrap();
    // head_dim not contiguous: the last two dims swapped.
    let qt = q.transpose(2, 3).unwrap();
    let e = attention::flash_forward(&qt, &q, &q, &p).unwrap_err();
    assert!(
        matches!(e, Error::Invalid { .. }) && e.to_string().contains("head_dim, is not contiguous"),
        "{e}"
    );
    // (Strides that are no multiples of 8 elements, zero strides and seq strides past 2^32 are
    // refused by the same rule: the validation unit tests in `host::ops::attention` cover them.)
    // The naive path takes contiguous operands only.
    let bshd = Tensor::zeros(&gpu, &[1, 64, 2, 64], DType::F16)
        .unwrap()
        .transpose(1, 2)
        .unwrap();
    let e = attention::naive_forward(&bshd, &q, &q, &p).unwrap_err();
    assert!(matches!(e, Error::NotContiguous { what: "q", .. }), "{e}");
    // Neither error touched the GPU state: a valid strided call still runs.
    let (o, _) = attention::flash_forward(&bshd, &q, &q, &p).unwrap();
    assert_eq!(o.strides(), &bshd_strides([1, 2, 64, 64])[..]);
}
