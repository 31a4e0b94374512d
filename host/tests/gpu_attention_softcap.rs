//! The logit softcap (`AttentionParams::softcap`, Gemma-2's) in the FlashAttention kernels of the
//! sm_90 build:
//! - every kernel that takes it (`FLASH_VARIANTS` this build runs): O within tolerance of the f64
//!   reference of `attention::model_features` (same softcap), the LSE too; with a sliding window and
//!   grouped-query heads as well; caps that saturate most scores (scale 1, cap 5) and the default
//!   scale with Gemma-2's cap of 50;
//! - a cap far above every score is (within tolerance) no cap;
//! - the backward (the `_scored_` kernels, every head dim): dQ, dK, dV within tolerance of the
//!   reference's, and of the uncapped call's under a cap far above every score;
//! - the naive path, the accumulating backward and bad caps are named errors.
//!
//! Odd lengths, both masks, f16 and bf16. Outputs are poisoned before every launch; inputs are fresh
//! (the seed is printed).
mod common;

use common::{
    assert_close, assert_lse_close, attention_params, gpu_or_skip, read, rng, sanitizing, tol,
    uniform,
};
use host::ops::attention::{
    self, AttentionParams, Window, flash_forward_variant, model_features as mf,
};
use host::{DType, Gpu, Tensor};

/// (B, Hq, Hkv, Sq, Sk, D, scale, cap, window left)
type Case = (
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    Option<f32>,
    f32,
    Option<usize>,
);

const CASES: [Case; 8] = [
    (1, 4, 2, 130, 257, 64, Some(1.0), 5.0, None),
    (2, 2, 2, 77, 77, 128, None, 50.0, None),
    (1, 2, 1, 200, 200, 128, Some(0.5), 2.0, Some(40)),
    (1, 3, 3, 1, 300, 256, Some(1.0), 10.0, None),
    (2, 2, 2, 33, 65, 40, Some(-1.0), 3.0, None),
    (1, 2, 2, 150, 150, 64, None, 20.0, Some(30)),
    // Gemma-2's head dim and cap, grouped heads, a window.
    (1, 4, 2, 131, 190, 256, None, 50.0, Some(70)),
    // Head dim 96 (the 128 tile), a negative scale.
    (2, 2, 1, 90, 141, 96, Some(-0.4), 3.0, None),
];

/// Under compute-sanitizer (tens of times slower) the 64, 128 and 256 tiles once each.
fn cases() -> Vec<Case> {
    if sanitizing() {
        vec![CASES[0], CASES[2], CASES[6]]
    } else {
        CASES.to_vec()
    }
}

fn params(
    causal: bool,
    scale: Option<f32>,
    cap: f32,
    left: Option<usize>,
) -> AttentionParams<'static> {
    AttentionParams {
        scale,
        softcap: Some(cap),
        window: Window { left, right: None },
        ..attention_params(causal)
    }
}

/// Whether this device runs the softcap (the sm_90 build); otherwise checks the refusal.
fn runs_softcap(gpu: &Gpu, test: &str) -> bool {
    common::sm90_feature_or_skip(gpu, test, "the softcap", |q| {
        attention::flash_forward(q, q, q, &params(false, None, 5.0, None))
    })
}

#[test]
fn softcapped_forward_matches_the_reference() {
    let test = "softcapped_forward_matches_the_reference";
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    if !runs_softcap(&gpu, test) {
        return;
    }
    let mut r = rng("softcap forward");
    for dtype in [DType::F16, DType::BF16] {
        for (b, hq, hkv, sq, sk, d, scale, cap, left) in cases() {
            let q = uniform(&mut r, &[b, hq, sq, d], -1.0, 1.0, dtype);
            let k = uniform(&mut r, &[b, hkv, sk, d], -1.0, 1.0, dtype);
            let v = uniform(&mut r, &[b, hkv, sk, d], -1.0, 1.0, dtype);
            let [qd, kd, vd] = [&q, &k, &v].map(|x| Tensor::from_host(&gpu, x).unwrap());
            for causal in [false, true] {
                let p = params(causal, scale, cap, left);
                let what = format!(
                    "{dtype} B{b} Hq{hq} Hkv{hkv} Sq{sq} Sk{sk} D{d} scale {scale:?} cap {cap} \
                     window left {left:?} causal {causal}"
                );
                let f = mf::ModelFeatures {
                    softcap: Some(cap),
                    window_left: left,
                    ..Default::default()
                };
                let (o_ref, lse_ref) = mf::forward(&q, &k, &v, &p, &f).unwrap();
                let variants = common::flash_variants(&gpu, d, &what);
                for &variant in &variants {
                    let (o, lse) = flash_forward_variant(&qd, &kd, &vd, &p, variant).unwrap();
                    assert_close(
                        &format!("{what} kernel {variant}: O"),
                        &read(&o),
                        &o_ref.data,
                        tol(dtype),
                    );
                    assert_lse_close(
                        &format!("{what} kernel {variant}: LSE"),
                        &read(&lse),
                        &lse_ref.data,
                    );
                    // A cap far above every score: the uncapped call, within tolerance.
                    let loose = AttentionParams {
                        softcap: Some(1e6),
                        ..p
                    };
                    let plain = AttentionParams { softcap: None, ..p };
                    let (o_l, _) = flash_forward_variant(&qd, &kd, &vd, &loose, variant).unwrap();
                    let (o_p, _) = flash_forward_variant(&qd, &kd, &vd, &plain, variant).unwrap();
                    assert_close(
                        &format!("{what} kernel {variant}: loose cap vs none"),
                        &read(&o_l),
                        &read(&o_p),
                        tol(dtype),
                    );
                }
                println!("{what}: {} kernels ok", variants.len());
            }
        }
    }
}

#[test]
fn softcap_refusals_are_named_errors() {
    let Some(gpu) = gpu_or_skip("softcap_refusals_are_named_errors") else {
        return;
    };
    let q = Tensor::zeros(&gpu, &[1, 2, 16, 64], DType::F16).unwrap();
    for bad in [0.0, -1.0, f32::NAN, f32::INFINITY, 1e-30, 1e30] {
        let e = attention::flash_forward(&q, &q, &q, &params(false, None, bad, None)).unwrap_err();
        assert!(e.to_string().contains("finite and positive"), "{bad}: {e}");
    }
    let p = params(true, None, 50.0, None);
    let e = attention::naive_forward(&q, &q, &q, &p).unwrap_err();
    assert!(e.to_string().contains("no window, softcap or ALiBi"), "{e}");
    if gpu.ptx_arch() == "sm_90" {
        let (o, lse) = attention::flash_forward(&q, &q, &q, &p).unwrap();
        let acc = attention::AttentionGrads {
            dq: Tensor::zeros(&gpu, q.shape(), DType::F32).unwrap(),
            dk: Tensor::zeros(&gpu, q.shape(), DType::F32).unwrap(),
            dv: Tensor::zeros(&gpu, q.shape(), DType::F32).unwrap(),
        };
        let e = attention::flash_backward_add(&q, &q, &q, &o, &lse, &q, &p, &acc).unwrap_err();
        assert!(e.to_string().contains("softcap Some(50.0)"), "{e}");
    }
}

#[test]
fn softcapped_backward_matches_the_reference() {
    let test = "softcapped_backward_matches_the_reference";
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    if !runs_softcap(&gpu, test) {
        return;
    }
    let mut r = rng("softcap backward");
    for dtype in [DType::F16, DType::BF16] {
        for (b, hq, hkv, sq, sk, d, scale, cap, left) in cases() {
            let host = [
                uniform(&mut r, &[b, hq, sq, d], -1.0, 1.0, dtype),
                uniform(&mut r, &[b, hkv, sk, d], -1.0, 1.0, dtype),
                uniform(&mut r, &[b, hkv, sk, d], -1.0, 1.0, dtype),
                uniform(&mut r, &[b, hq, sq, d], -1.0, 1.0, dtype),
            ];
            let [q, k, v, d_o] = host.each_ref().map(|x| Tensor::from_host(&gpu, x).unwrap());
            for causal in [false, true] {
                let p = params(causal, scale, cap, left);
                let what = format!(
                    "{dtype} B{b} Hq{hq} Hkv{hkv} Sq{sq} Sk{sk} D{d} scale {scale:?} cap {cap} \
                     window left {left:?} causal {causal}"
                );
                let f = mf::ModelFeatures {
                    softcap: Some(cap),
                    window_left: left,
                    ..Default::default()
                };
                let (o, lse) = attention::flash_forward(&q, &k, &v, &p).unwrap();
                let want = mf::backward(&host[0], &host[1], &host[2], &host[3], &p, &f).unwrap();
                let g = attention::flash_backward(&q, &k, &v, &o, &lse, &d_o, &p).unwrap();
                common::assert_grads_close(
                    &format!("{what}: vs reference"),
                    &g,
                    [&want.dq.data, &want.dk.data, &want.dv.data],
                    tol(dtype),
                );
                // A cap far above every score: the uncapped backward, within tolerance.
                let loose = AttentionParams {
                    softcap: Some(1e6),
                    ..p
                };
                let plain = AttentionParams { softcap: None, ..p };
                let (o_p, lse_p) = attention::flash_forward(&q, &k, &v, &plain).unwrap();
                let g_l =
                    attention::flash_backward(&q, &k, &v, &o_p, &lse_p, &d_o, &loose).unwrap();
                let g_p =
                    attention::flash_backward(&q, &k, &v, &o_p, &lse_p, &d_o, &plain).unwrap();
                common::assert_grads_close(
                    &format!("{what}: loose cap vs none"),
                    &g_l,
                    [&read(&g_p.dq), &read(&g_p.dk), &read(&g_p.dv)],
                    tol(dtype),
                );
                println!("{what}: ok");
            }
        }
    }
}
