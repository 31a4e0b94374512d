//! ALiBi slopes (`AttentionParams::alibi_slopes`, BLOOM's and MPT's) on the FlashAttention kernels
//! of the sm_90 build:
//! - forward, every kernel (`FLASH_VARIANTS` this build runs): O and the LSE within tolerance of the
//!   f64 reference of `attention::model_features` (same slopes), with the softcap, sliding windows
//!   and grouped-query heads as well, slopes `[heads]` or `[batch, heads]` (the reference then runs
//!   per batch entry), positive and negative scales;
//! - backward (the `_scored_` kernels, every head dim): dQ, dK, dV within tolerance of the
//!   reference's, the same bits twice;
//! - zero slopes give the plain call (forward bits; the backward within an eighth of the tolerance:
//!   another kernel, another summation order);
//! - packed batches: `[sequences, heads]` slopes, each sequence as one dense call with its row;
//! - the paths that take no slopes, and bad slopes, are named errors.
//!
//! Odd lengths, both masks, f16 and bf16. Outputs are poisoned before every launch; inputs are fresh
//! (the seed is printed).
mod common;

use common::{
    assert_close, assert_grads_close, assert_lse_close, attention_params, bits, gpu_or_skip,
    packed_inputs, read, rng, sanitizing, tol, uniform,
};
use host::ops::attention::{
    self, AttentionGrads, AttentionParams, PackedSeqs, Window, flash_forward_variant,
    model_features as mf,
};
use host::{DType, Gpu, HostTensor, Tensor};
use rand::Rng;

/// One case: shapes, scale, slopes per batch entry, softcap, window left, causal.
#[derive(Clone, Copy)]
struct Case {
    b: usize,
    hq: usize,
    hkv: usize,
    sq: usize,
    sk: usize,
    d: usize,
    scale: Option<f32>,
    per_batch: bool,
    cap: Option<f32>,
    left: Option<usize>,
    causal: bool,
}

const fn case(
    (b, hq, hkv, sq, sk, d): (usize, usize, usize, usize, usize, usize),
    scale: Option<f32>,
    per_batch: bool,
    (cap, left, causal): (Option<f32>, Option<usize>, bool),
) -> Case {
    Case {
        b,
        hq,
        hkv,
        sq,
        sk,
        d,
        scale,
        per_batch,
        cap,
        left,
        causal,
    }
}

const CASES: [Case; 8] = [
    // BLOOM's shape of call: causal, one slope a head.
    case((2, 4, 4, 200, 200, 64), None, false, (None, None, true)),
    // Not causal (|i - j| both sides), Sq != Sk, grouped heads, slopes per batch entry.
    case((2, 4, 2, 130, 301, 128), None, true, (None, None, false)),
    // With a softcap and a window, a negative scale.
    case((1, 2, 1, 257, 129, 64), Some(-0.2), false, (Some(5.0), Some(40), true)),
    // One query row against a long sequence.
    case((1, 3, 3, 1, 400, 128), None, true, (None, None, true)),
    // A narrow head dim, tiny lengths, the softcap.
    case((3, 2, 2, 17, 33, 40), Some(0.5), true, (Some(2.0), None, false)),
    // Head dim 96 (the 128 tile), a window on both masks.
    case((1, 2, 2, 150, 150, 96), None, false, (None, Some(25), false)),
    // Head dim 256 with the softcap.
    case((1, 2, 2, 70, 90, 256), None, false, (Some(30.0), None, true)),
    // Head dim 200 (the 256 tile), grouped heads, a window, not causal, slopes per batch entry.
    case((2, 4, 1, 97, 160, 200), Some(0.1), true, (None, Some(50), false)),
];

/// The cases a run takes: under compute-sanitizer (tens of times slower) four of them (head dims
/// 128, 64, 40, 200: each scored backward kernel).
fn cases() -> Vec<Case> {
    if sanitizing() {
        vec![CASES[1], CASES[2], CASES[4], CASES[7]]
    } else {
        CASES.to_vec()
    }
}

fn name(c: &Case, dtype: DType) -> String {
    format!(
        "{dtype} B{} Hq{} Hkv{} Sq{} Sk{} D{} scale {:?} slopes {} cap {:?} window left {:?} \
         causal {}",
        c.b,
        c.hq,
        c.hkv,
        c.sq,
        c.sk,
        c.d,
        c.scale,
        if c.per_batch { "[B, H]" } else { "[H]" },
        c.cap,
        c.left,
        c.causal
    )
}

/// ALiBi's geometric slopes for `h` heads (`2^(-8 (i + 1) / h)`), each scaled by a random factor
/// in [0.5, 2) so that no two heads or batch entries share one: `rows` rows of `h`.
fn slopes(r: &mut rand::rngs::StdRng, rows: usize, h: usize) -> Vec<f32> {
    (0..rows * h)
        .map(|i| 2f32.powf(-8.0 * ((i % h) + 1) as f32 / h as f32) * r.random_range(0.5..2.0))
        .collect()
}

fn params<'a>(c: &Case, slopes: Option<&'a Tensor>) -> AttentionParams<'a> {
    AttentionParams {
        scale: c.scale,
        softcap: c.cap,
        window: Window {
            left: c.left,
            right: None,
        },
        alibi_slopes: slopes,
        ..attention_params(c.causal)
    }
}

/// Batch entry `b` of a host tensor (dim 0).
fn entry(x: &HostTensor, b: usize) -> HostTensor {
    let n = x.data.len() / x.shape[0];
    let mut shape = x.shape.clone();
    shape[0] = 1;
    HostTensor::new(x.data[b * n..(b + 1) * n].to_vec(), &shape, x.dtype).unwrap()
}

/// The f64 reference's O, LSE and (with `d_o`) gradients, per batch entry (each with its row of
/// `slope_rows`), concatenated back.
fn reference(
    [q, k, v]: [&HostTensor; 3],
    d_o: Option<&HostTensor>,
    p: &AttentionParams,
    c: &Case,
    slope_rows: &[f32],
) -> (Vec<f32>, Vec<f32>, Option<[Vec<f32>; 3]>) {
    let (mut o, mut lse) = (vec![], vec![]);
    let mut grads = d_o.map(|_| [vec![], vec![], vec![]]);
    for b in 0..c.b {
        let row = if c.per_batch { b } else { 0 };
        let f = mf::ModelFeatures {
            window_left: c.left,
            softcap: c.cap,
            alibi_slopes: Some(slope_rows[row * c.hq..(row + 1) * c.hq].to_vec()),
            ..Default::default()
        };
        let plain = AttentionParams {
            alibi_slopes: None,
            ..*p
        };
        let (qb, kb, vb) = (entry(q, b), entry(k, b), entry(v, b));
        let (ob, lb) = mf::forward(&qb, &kb, &vb, &plain, &f).unwrap();
        o.extend(ob.data);
        lse.extend(lb.data);
        if let (Some(g), Some(d_o)) = (grads.as_mut(), d_o) {
            let gb = mf::backward(&qb, &kb, &vb, &entry(d_o, b), &plain, &f).unwrap();
            g[0].extend(gb.dq.data);
            g[1].extend(gb.dk.data);
            g[2].extend(gb.dv.data);
        }
    }
    (o, lse, grads)
}

/// Whether this device runs ALiBi (the sm_90 build); otherwise checks the refusal and says so.
fn runs_alibi(gpu: &Gpu, test: &str) -> bool {
    let s = Tensor::from_f32(gpu, &[0.5], &[1], DType::F32).unwrap();
    common::sm90_feature_or_skip(gpu, test, "ALiBi", |q| {
        let p = AttentionParams {
            alibi_slopes: Some(&s),
            ..Default::default()
        };
        attention::flash_forward(q, q, q, &p)
    })
}

/// The forward kernels of this build that take ALiBi (the warp-specialised one): every other one
/// refuses the slopes by name.
fn alibi_variants(gpu: &Gpu, q: &Tensor, p: &AttentionParams, d: usize, what: &str) -> Vec<u32> {
    let all = common::flash_variants(gpu, d, what);
    let (takes, refuses): (Vec<u32>, Vec<u32>) = all
        .into_iter()
        .partition(|&v| v == attention::FLASH_TMA_VARIANT);
    for v in refuses {
        let e = flash_forward_variant(q, q, q, p, v).unwrap_err().to_string();
        assert!(e.contains("takes no ALiBi"), "{what} kernel {v}: {e}");
    }
    assert!(!takes.is_empty(), "{what}: no kernel takes ALiBi");
    takes
}

#[test]
fn alibi_forward_and_backward_match_the_reference() {
    let test = "alibi_forward_and_backward_match_the_reference";
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    if !runs_alibi(&gpu, test) {
        return;
    }
    let mut r = rng("alibi");
    for dtype in [DType::F16, DType::BF16] {
        for c in cases() {
            let what = name(&c, dtype);
            let host = [
                uniform(&mut r, &[c.b, c.hq, c.sq, c.d], -1.0, 1.0, dtype),
                uniform(&mut r, &[c.b, c.hkv, c.sk, c.d], -1.0, 1.0, dtype),
                uniform(&mut r, &[c.b, c.hkv, c.sk, c.d], -1.0, 1.0, dtype),
                uniform(&mut r, &[c.b, c.hq, c.sq, c.d], -1.0, 1.0, dtype),
            ];
            let [q, k, v, d_o] = host.each_ref().map(|x| Tensor::from_host(&gpu, x).unwrap());
            let rows = if c.per_batch { c.b } else { 1 };
            let slope_rows = slopes(&mut r, rows, c.hq);
            let shape: &[usize] = if c.per_batch { &[c.b, c.hq] } else { &[c.hq] };
            let s = Tensor::from_f32(&gpu, &slope_rows, shape, DType::F32).unwrap();
            let p = params(&c, Some(&s));
            let (o_ref, lse_ref, g_ref) = reference(
                [&host[0], &host[1], &host[2]],
                Some(&host[3]),
                &p,
                &c,
                &slope_rows,
            );
            let variants = alibi_variants(&gpu, &q, &p, c.d, &what);
            for &variant in &variants {
                let (o, lse) = flash_forward_variant(&q, &k, &v, &p, variant).unwrap();
                let at = format!("{what} kernel {variant}");
                assert_close(&format!("{at}: O"), &read(&o), &o_ref, tol(dtype));
                assert_lse_close(&format!("{at}: LSE"), &read(&lse), &lse_ref);
            }
            let g_ref = g_ref.expect("the reference's gradients");
            let (o, lse) = attention::flash_forward(&q, &k, &v, &p).unwrap();
            let g = attention::flash_backward(&q, &k, &v, &o, &lse, &d_o, &p).unwrap();
            assert_grads_close(
                &format!("{what}: backward vs reference"),
                &g,
                [&g_ref[0], &g_ref[1], &g_ref[2]],
                tol(dtype),
            );
            let g2 = attention::flash_backward(&q, &k, &v, &o, &lse, &d_o, &p).unwrap();
            assert_same_grads(&what, &g, &g2);
            println!("{what}: {} forward kernels and the backward: ok", variants.len());
        }
    }
}

fn assert_same_grads(what: &str, a: &AttentionGrads, b: &AttentionGrads) {
    for (n, x, y) in [("dQ", &a.dq, &b.dq), ("dK", &a.dk, &b.dk), ("dV", &a.dv, &b.dv)] {
        assert_eq!(bits(x), bits(y), "{what}: {n} run to run");
    }
}

#[test]
fn zero_slopes_give_the_plain_call() {
    let test = "zero_slopes_give_the_plain_call";
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    if !runs_alibi(&gpu, test) {
        return;
    }
    let mut r = rng("alibi zero slopes");
    for dtype in [DType::F16, DType::BF16] {
        for c in [CASES[0], CASES[1], CASES[4]] {
            let what = name(&c, dtype);
            let [q, k, v, d_o] = [
                [c.b, c.hq, c.sq, c.d],
                [c.b, c.hkv, c.sk, c.d],
                [c.b, c.hkv, c.sk, c.d],
                [c.b, c.hq, c.sq, c.d],
            ]
            .map(|s| Tensor::from_host(&gpu, &uniform(&mut r, &s, -1.0, 1.0, dtype)).unwrap());
            let zeros = Tensor::zeros(&gpu, &[c.hq], DType::F32).unwrap();
            let (with, plain) = (params(&c, Some(&zeros)), params(&c, None));
            for &variant in &alibi_variants(&gpu, &q, &with, c.d, &what) {
                let (o_z, lse_z) = flash_forward_variant(&q, &k, &v, &with, variant).unwrap();
                let (o_p, lse_p) = flash_forward_variant(&q, &k, &v, &plain, variant).unwrap();
                assert_eq!(bits(&o_z), bits(&o_p), "{what} kernel {variant}: O");
                assert_eq!(bits(&lse_z), bits(&lse_p), "{what} kernel {variant}: LSE");
            }
            let (o, lse) = attention::flash_forward(&q, &k, &v, &plain).unwrap();
            let g_z = attention::flash_backward(&q, &k, &v, &o, &lse, &d_o, &with).unwrap();
            let g_p = attention::flash_backward(&q, &k, &v, &o, &lse, &d_o, &plain).unwrap();
            assert_grads_close(
                &format!("{what}: zero slopes vs none"),
                &g_z,
                [&read(&g_p.dq), &read(&g_p.dk), &read(&g_p.dv)],
                tol(dtype) / 8.0,
            );
            println!("{what}: ok");
        }
    }
}

#[test]
fn alibi_packed_batches_match_one_call_per_sequence() {
    let test = "alibi_packed_batches_match_one_call_per_sequence";
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    if !runs_alibi(&gpu, test) {
        return;
    }
    let mut r = rng("alibi packed");
    let (h, d) = (2, 64);
    let (lq, lk) = ([70, 1, 257, 0, 33], [70, 200, 130, 5, 33]);
    for dtype in [DType::F16, DType::BF16] {
        let ((cu_q, cu_k), _, _, [qd, kd, vd, dod]) =
            packed_inputs(&gpu, &mut r, (&lq, &lk, h, h, d), dtype);
        let seqs = PackedSeqs {
            cu_seqlens_q: &cu_q,
            cu_seqlens_k: &cu_k,
        };
        let slope_rows = slopes(&mut r, lq.len(), h);
        let s = Tensor::from_f32(&gpu, &slope_rows, &[lq.len(), h], DType::F32).unwrap();
        for causal in [false, true] {
            let p = AttentionParams {
                alibi_slopes: Some(&s),
                softcap: Some(8.0),
                ..attention_params(causal)
            };
            let what = format!("{dtype} packed q {lq:?} k {lk:?} causal {causal}");
            let (o, lse) = attention::flash_forward_varlen(&qd, &kd, &vd, seqs, &p).unwrap();
            let g =
                attention::flash_backward_varlen(&qd, &kd, &vd, &o, &lse, &dod, seqs, &p).unwrap();
            // Each sequence as a dense call with its row of slopes.
            common::assert_packed_matches_per_sequence(
                &what,
                [&qd, &kd, &vd, &dod],
                (&cu_q, &cu_k),
                (&o, &g),
                tol(dtype) / 8.0,
                |i, [q, k, v, d_o]| {
                    let row = &slope_rows[i * h..(i + 1) * h];
                    let row = Tensor::from_f32(&gpu, row, &[h], DType::F32).unwrap();
                    let ps = AttentionParams {
                        alibi_slopes: Some(&row),
                        ..p
                    };
                    let (o, lse) = attention::flash_forward(&q, &k, &v, &ps).unwrap();
                    let g = attention::flash_backward(&q, &k, &v, &o, &lse, &d_o, &ps).unwrap();
                    (o, g)
                },
            );
            println!("{what}: ok");
        }
    }
}

#[test]
fn alibi_refusals_are_named_errors() {
    let Some(gpu) = gpu_or_skip("alibi_refusals_are_named_errors") else {
        return;
    };
    let q = Tensor::zeros(&gpu, &[2, 4, 16, 64], DType::F16).unwrap();
    let with = |s: &Tensor| {
        let p = AttentionParams {
            alibi_slopes: Some(s),
            ..Default::default()
        };
        attention::flash_forward(&q, &q, &q, &p).map(|_| ())
    };
    // Shapes other than [heads] and [batch, heads], another dtype: what was expected and given.
    for shape in [&[3][..], &[4, 2], &[1, 4], &[2, 4, 1]] {
        let s = Tensor::zeros(&gpu, shape, DType::F32).unwrap();
        let e = with(&s).unwrap_err().to_string();
        assert!(e.contains("[heads] = [4]") && e.contains(&format!("{shape:?}")), "{e}");
    }
    let s = Tensor::zeros(&gpu, &[4], DType::F16).unwrap();
    let e = with(&s).unwrap_err().to_string();
    assert!(e.contains("alibi_slopes") && e.contains("f16"), "{e}");
    // The paths that take none.
    let s = Tensor::zeros(&gpu, &[4], DType::F32).unwrap();
    let p = AttentionParams {
        alibi_slopes: Some(&s),
        ..Default::default()
    };
    let e = attention::naive_forward(&q, &q, &q, &p).unwrap_err().to_string();
    assert!(e.contains("no window, softcap or ALiBi"), "{e}");
    // Decoding takes slopes (gpu_attention_decode), checked as flash_forward checks them.
    let s3 = Tensor::zeros(&gpu, &[3], DType::F32).unwrap();
    let p3 = AttentionParams {
        alibi_slopes: Some(&s3),
        ..Default::default()
    };
    let e = attention::decode_forward(&q, attention::KvCache::Dense { k: &q, v: &q }, &p3)
        .unwrap_err()
        .to_string();
    assert!(e.contains("[heads] = [4]") && e.contains("[3]"), "{e}");
    if gpu.ptx_arch() == "sm_90" {
        let (o, lse) = attention::flash_forward(&q, &q, &q, &p).unwrap();
        let acc = AttentionGrads {
            dq: Tensor::zeros(&gpu, q.shape(), DType::F32).unwrap(),
            dk: Tensor::zeros(&gpu, q.shape(), DType::F32).unwrap(),
            dv: Tensor::zeros(&gpu, q.shape(), DType::F32).unwrap(),
        };
        let e = attention::flash_backward_add(&q, &q, &q, &o, &lse, &q, &p, &acc)
            .unwrap_err()
            .to_string();
        assert!(e.contains("ALiBi slopes given"), "{e}");
    }
}
