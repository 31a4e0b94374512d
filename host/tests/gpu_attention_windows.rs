//! Sliding windows (`AttentionParams::window`) on the FlashAttention kernels of the sm_90 build:
//! - forward, every kernel that takes a window (`FLASH_VARIANTS` this build runs): O within
//!   tolerance of the f64 reference of `attention::model_features` (same window), the LSE too, with
//!   -inf exactly for rows whose window holds no key; a window of `(None, Some(0))` gives the causal
//!   call's bits, and one wider than the sequences the unwindowed call's;
//! - backward: dQ, dK, dV within tolerance of that reference's, and of the causal call's for
//!   `(None, Some(0))` (other kernels: another summation order);
//! - packed batches: the window applies within each sequence (the forward bit-identical to one
//!   call per sequence, the backward within an eighth of the tolerance of it);
//! - the path that takes no window (naive) says so (decoding takes one: `gpu_attention_decode`).
//!
//! Windows on one side and on both, causal or not, grouped-query heads, odd lengths, f16 and bf16.
//! Outputs are poisoned before every launch; inputs are fresh (the seed is printed).
mod common;

use common::{
    assert_close, assert_grads_close, assert_lse_close, attention_params, bits, gpu_or_skip,
    packed_inputs, read, rng, sanitizing, tol, uniform,
};
use host::ops::attention::{
    self, AttentionParams, PackedSeqs, Window, flash_forward_variant, model_features as mf,
};
use host::{DType, Gpu, HostTensor, Tensor};

/// (B, Hq, Hkv, Sq, Sk, D, window left, window right, causal)
type Case = (
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    Option<usize>,
    Option<usize>,
    bool,
);

const CASES: [Case; 8] = [
    // Mistral's: causal with a left window.
    (1, 4, 2, 300, 300, 64, Some(70), None, true),
    // Bidirectional local attention, Sq != Sk.
    (2, 2, 2, 130, 301, 128, Some(64), Some(32), false),
    // Left only, more queries than keys (the first rows see no key).
    (1, 2, 1, 257, 129, 64, Some(10), None, true),
    // One query row against a long sequence (decoding's shape).
    (1, 3, 3, 1, 400, 128, Some(100), None, true),
    // The diagonal only.
    (2, 2, 2, 200, 200, 96, Some(0), Some(0), false),
    // Right only.
    (1, 4, 1, 64, 700, 64, None, Some(3), false),
    // Both sides, a narrow head dim, tiny lengths.
    (3, 2, 2, 17, 33, 40, Some(5), Some(7), false),
    // Gemma-2's head dim (the 256-wide tile), causal with a left window, grouped heads.
    (2, 4, 2, 190, 190, 256, Some(50), None, true),
];

/// The cases a run takes: under compute-sanitizer (tens of times slower) four of them.
fn cases() -> Vec<Case> {
    if sanitizing() {
        vec![CASES[0], CASES[1], CASES[4], CASES[7]]
    } else {
        CASES.to_vec()
    }
}

fn params(causal: bool, left: Option<usize>, right: Option<usize>) -> AttentionParams<'static> {
    AttentionParams {
        window: Window { left, right },
        ..attention_params(causal)
    }
}

fn features(left: Option<usize>, right: Option<usize>) -> mf::ModelFeatures {
    mf::ModelFeatures {
        window_left: left,
        window_right: right,
        ..Default::default()
    }
}

fn name(c: &Case, dtype: DType) -> String {
    let (b, hq, hkv, sq, sk, d, l, r, causal) = *c;
    format!("{dtype} B{b} Hq{hq} Hkv{hkv} Sq{sq} Sk{sk} D{d} window ({l:?}, {r:?}) causal {causal}")
}

/// Q, K, V, dO of a case: host values and uploaded tensors.
fn operands(
    gpu: &Gpu,
    r: &mut rand::rngs::StdRng,
    c: &Case,
    dtype: DType,
) -> ([HostTensor; 4], [Tensor; 4]) {
    let (b, hq, hkv, sq, sk, d, ..) = *c;
    let host = [
        uniform(r, &[b, hq, sq, d], -1.0, 1.0, dtype),
        uniform(r, &[b, hkv, sk, d], -1.0, 1.0, dtype),
        uniform(r, &[b, hkv, sk, d], -1.0, 1.0, dtype),
        uniform(r, &[b, hq, sq, d], -1.0, 1.0, dtype),
    ];
    let dev = host.each_ref().map(|x| Tensor::from_host(gpu, x).unwrap());
    (host, dev)
}

/// Whether this device runs windows (the sm_90 build); otherwise checks the refusal and says so.
fn runs_windows(gpu: &Gpu, test: &str) -> bool {
    common::sm90_feature_or_skip(gpu, test, "a sliding window", |q| {
        attention::flash_forward(q, q, q, &params(false, Some(2), None))
    })
}

#[test]
fn windowed_forward_matches_the_reference_and_its_compositions() {
    let test = "windowed_forward_matches_the_reference_and_its_compositions";
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    if !runs_windows(&gpu, test) {
        return;
    }
    let mut r = rng("windows forward");
    for dtype in [DType::F16, DType::BF16] {
        for c in cases() {
            let (_, _, _, sq, sk, d, left, right, causal) = c;
            let what = name(&c, dtype);
            let (host, [q, k, v, _]) = operands(&gpu, &mut r, &c, dtype);
            let p = params(causal, left, right);
            let (o_ref, lse_ref) =
                mf::forward(&host[0], &host[1], &host[2], &p, &features(left, right)).unwrap();
            let variants = common::flash_variants(&gpu, d, &what);
            for &variant in &variants {
                let (o, lse) = flash_forward_variant(&q, &k, &v, &p, variant).unwrap();
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
                // A window past both sequences is no window: the plain call's bits.
                let wide = params(causal, Some(sq + sk), Some(sq + sk));
                let plain = attention_params(causal);
                let (o_w, lse_w) = flash_forward_variant(&q, &k, &v, &wide, variant).unwrap();
                let (o_p, lse_p) = flash_forward_variant(&q, &k, &v, &plain, variant).unwrap();
                assert_eq!(
                    bits(&o_w),
                    bits(&o_p),
                    "{what} kernel {variant}: wide window O"
                );
                assert_eq!(
                    bits(&lse_w),
                    bits(&lse_p),
                    "{what} kernel {variant}: wide LSE"
                );
                // (None, Some(0)) is the causal mask.
                let right0 = params(false, None, Some(0));
                let (o_r, lse_r) = flash_forward_variant(&q, &k, &v, &right0, variant).unwrap();
                let (o_c, lse_c) =
                    flash_forward_variant(&q, &k, &v, &attention_params(true), variant).unwrap();
                assert_eq!(
                    bits(&o_r),
                    bits(&o_c),
                    "{what} kernel {variant}: right 0 = causal O"
                );
                assert_eq!(
                    bits(&lse_r),
                    bits(&lse_c),
                    "{what} kernel {variant}: right 0 LSE"
                );
            }
            println!("{what}: {} kernels ok", variants.len());
        }
    }
}

#[test]
fn windowed_backward_matches_the_reference_and_the_causal_call() {
    let test = "windowed_backward_matches_the_reference_and_the_causal_call";
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    if !runs_windows(&gpu, test) {
        return;
    }
    let mut r = rng("windows backward");
    for dtype in [DType::F16, DType::BF16] {
        for c in cases() {
            let (.., left, right, causal) = c;
            let what = name(&c, dtype);
            let (host, [q, k, v, d_o]) = operands(&gpu, &mut r, &c, dtype);
            let p = params(causal, left, right);
            let (o, lse) = attention::flash_forward(&q, &k, &v, &p).unwrap();
            let g = attention::flash_backward(&q, &k, &v, &o, &lse, &d_o, &p).unwrap();
            let want = mf::backward(
                &host[0],
                &host[1],
                &host[2],
                &host[3],
                &p,
                &features(left, right),
            )
            .unwrap();
            assert_grads_close(
                &format!("{what}: vs reference"),
                &g,
                [&want.dq.data, &want.dk.data, &want.dv.data],
                tol(dtype),
            );
            // The same values twice: the ascending order is deterministic.
            let g2 = attention::flash_backward(&q, &k, &v, &o, &lse, &d_o, &p).unwrap();
            for (n, a, b) in [
                ("dQ", &g.dq, &g2.dq),
                ("dK", &g.dk, &g2.dk),
                ("dV", &g.dv, &g2.dv),
            ] {
                assert_eq!(bits(a), bits(b), "{what}: {n} run to run");
            }
            // (None, Some(0)) against the causal call (the dense kernels: another order).
            let right0 = params(false, None, Some(0));
            let causal_p = attention_params(true);
            let (o_r, lse_r) = attention::flash_forward(&q, &k, &v, &right0).unwrap();
            let g_r = attention::flash_backward(&q, &k, &v, &o_r, &lse_r, &d_o, &right0).unwrap();
            let (o_c, lse_c) = attention::flash_forward(&q, &k, &v, &causal_p).unwrap();
            let g_c = attention::flash_backward(&q, &k, &v, &o_c, &lse_c, &d_o, &causal_p).unwrap();
            for (n, a, b) in [
                ("dQ", &g_r.dq, &g_c.dq),
                ("dK", &g_r.dk, &g_c.dk),
                ("dV", &g_r.dv, &g_c.dv),
            ] {
                assert_close(
                    &format!("{what}: right 0 vs causal {n}"),
                    &read(a),
                    &read(b),
                    tol(dtype) / 8.0,
                );
            }
            println!("{what}: ok");
        }
    }
}

#[test]
fn windowed_packed_batches_match_one_call_per_sequence() {
    let test = "windowed_packed_batches_match_one_call_per_sequence";
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    if !runs_windows(&gpu, test) {
        return;
    }
    let mut r = rng("windows packed");
    let (h, d) = (2, 64);
    let (lq, lk) = ([70, 1, 257, 0], [70, 200, 130, 5]);
    for dtype in [DType::F16, DType::BF16] {
        let ((cu_q, cu_k), _, _, [qd, kd, vd, dod]) =
            packed_inputs(&gpu, &mut r, (&lq, &lk, h, h, d), dtype);
        let seqs = PackedSeqs {
            cu_seqlens_q: &cu_q,
            cu_seqlens_k: &cu_k,
        };
        for causal in [false, true] {
            let p = params(causal, Some(20), Some(9));
            let what = format!("{dtype} packed q {lq:?} k {lk:?} causal {causal}");
            let (o, lse) = attention::flash_forward_varlen(&qd, &kd, &vd, seqs, &p).unwrap();
            let g =
                attention::flash_backward_varlen(&qd, &kd, &vd, &o, &lse, &dod, seqs, &p).unwrap();
            // The backward per sequence: the same general kernel walks both, within an eighth of
            // the tolerance all the same, as the grids differ.
            common::assert_packed_matches_per_sequence(
                &what,
                [&qd, &kd, &vd, &dod],
                (&cu_q, &cu_k),
                (&o, &g),
                tol(dtype) / 8.0,
                |_, [q, k, v, d_o]| {
                    let (o, lse) = attention::flash_forward(&q, &k, &v, &p).unwrap();
                    let g = attention::flash_backward(&q, &k, &v, &o, &lse, &d_o, &p).unwrap();
                    (o, g)
                },
            );
            println!("{what}: ok");
        }
    }
}

#[test]
fn paths_without_windows_say_so() {
    let Some(gpu) = gpu_or_skip("paths_without_windows_say_so") else {
        return;
    };
    let q = Tensor::zeros(&gpu, &[1, 2, 8, 64], DType::F16).unwrap();
    let p = params(false, Some(3), None);
    let e = attention::naive_forward(&q, &q, &q, &p).unwrap_err();
    assert!(e.to_string().contains("takes no window"), "{e}");
}
