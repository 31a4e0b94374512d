//! FlashAttention at head dims off the kernels' tiles (every multiple of 8 up to
//! `FLASH_MAX_HEAD_DIM`; a head dim runs on the narrowest tile of `FLASH_TILE_DIMS` that holds it,
//! in the sm_90 build with products over the narrowest of `FLASH_PRODUCT_DIMS` that holds it), and
//! at the widest tile (256; the sm_90 build's):
//! - forward, every kernel this build has (`FLASH_VARIANTS`): O and LSE bit-identical to the same
//!   kernel on the operands zero-padded to the tile's width (the padded call's O cut back to the head
//!   dim; its padded columns exactly 0), and O within tolerance of the f64 reference of
//!   `attention::model_features`;
//! - backward: dQ, dK, dV within an eighth of the tolerance of the padded call's, cut back (its
//!   padded columns exactly 0; not bit-identical: see the test), and within tolerance of that
//!   reference (the padded call takes the scale of the unpadded head dim, so both compute the same
//!   function);
//! - the accumulating backward (`flash_backward_add`): what it adds to random f32 accumulators
//!   within tolerance of the reference at 32, 96, 136, 192 and 256 (the sm_90 build) and at 32 and
//!   96 in the sm_80 build; past 128 there a named error that leaves the accumulators untouched.
//!
//! Multi-head and grouped-query heads, odd lengths, a `[B, S, H, D]` strided case, both masks, f16
//! and bf16. Outputs are poisoned before every launch; inputs are fresh (the seed is printed).
mod common;

use common::{
    assert_close, assert_grads_close, assert_lse_close, attention_params, bits, gpu_or_skip,
    portable_build, read, rng, sanitizing, tol, uniform,
};
use host::ops::attention::{
    self, AttentionGrads, AttentionParams, FLASH_MAX_HEAD_DIM, flash_forward_variant,
    model_features as mf,
};
use host::{DType, Gpu, HostTensor, Tensor};

/// (B, Hq, Hkv, Sq, Sk, D, Q/K/V/dO in `[B, S, H, D]` memory)
/// 32 and 96 have dense backward kernels of their own in the sm_90 build (their products cover
/// their columns, on the 64 and 128 tiles); the others run the general kernels.
const CASES: [(usize, usize, usize, usize, usize, usize, bool); 9] = [
    (2, 3, 3, 77, 131, 8, false),
    (1, 4, 2, 130, 65, 40, false),
    (2, 2, 2, 129, 129, 56, true),
    (1, 4, 4, 200, 333, 72, false),
    (2, 4, 1, 97, 97, 96, false),
    (1, 3, 3, 1, 257, 104, true),
    (1, 2, 2, 150, 150, 120, false),
    (2, 4, 2, 131, 190, 32, true),
    (1, 3, 3, 250, 129, 96, true),
];

/// Head dims on the 256-wide tile (the sm_90 build's only), forward and backward (192 grouped and
/// not: its dense backward kernel splits the head dim unevenly).
const WIDE_CASES: [(usize, usize, usize, usize, usize, usize, bool); 5] = [
    (1, 3, 3, 64, 64, 136, false),
    (2, 2, 1, 77, 301, 192, true),
    (1, 3, 3, 259, 190, 192, false),
    (1, 2, 2, 130, 200, FLASH_MAX_HEAD_DIM - 8, false),
    (2, 4, 2, 257, 129, FLASH_MAX_HEAD_DIM, false),
];

/// The cases a run takes: under compute-sanitizer (tens of times slower) one a tile, strided and
/// grouped among them.
fn cases() -> Vec<(usize, usize, usize, usize, usize, usize, bool)> {
    if sanitizing() {
        vec![CASES[1], CASES[4], CASES[5], CASES[7]]
    } else {
        CASES.to_vec()
    }
}

/// [`cases`] and, in the sm_90 build, the 256-wide ones.
fn wide_cases(gpu: &Gpu) -> Vec<(usize, usize, usize, usize, usize, usize, bool)> {
    let mut c = cases();
    if gpu.ptx_arch() != "sm_90" {
        println!("the {} build takes head dims up to 128", gpu.ptx_arch());
    } else if sanitizing() {
        c.extend([WIDE_CASES[1], WIDE_CASES[4]]);
    } else {
        c.extend(WIDE_CASES);
    }
    c
}

/// The narrowest tile width (64, 128 or 256) that holds `d`.
fn tile_of(d: usize) -> usize {
    [64, 128, 256].into_iter().find(|&t| t >= d).unwrap()
}

/// `x` `[.., D]` with its rows zero-padded to `width`.
fn pad_rows(x: &HostTensor, width: usize) -> HostTensor {
    let d = *x.shape.last().unwrap();
    let mut out = Vec::with_capacity(x.data.len() / d * width);
    for row in x.data.chunks(d) {
        out.extend_from_slice(row);
        out.resize(out.len() + width - d, 0.0);
    }
    let mut shape = x.shape.clone();
    *shape.last_mut().unwrap() = width;
    HostTensor::new(out, &shape, x.dtype).unwrap()
}

/// The first `d` columns of every `width`-wide row of `x`; asserts the rest are exactly 0.
fn cut_rows(case: &str, x: &[f32], width: usize, d: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len() / width * d);
    for (i, row) in x.chunks(width).enumerate() {
        assert!(
            row[d..].iter().all(|&v| v == 0.0),
            "{case}: row {i} of the padded call has nonzero padding"
        );
        out.extend_from_slice(&row[..d]);
    }
    out
}

/// One case's operands: the values, as the call takes them (strided or not), and zero-padded to
/// the tile (contiguous).
struct Operands {
    host: [HostTensor; 4],
    given: [Tensor; 4],
    padded: [Tensor; 4],
}

fn operands(
    gpu: &Gpu,
    r: &mut rand::rngs::StdRng,
    (b, hq, hkv, sq, sk, d, bshd): (usize, usize, usize, usize, usize, usize, bool),
    dtype: DType,
) -> Operands {
    let q = uniform(r, &[b, hq, sq, d], -1.0, 1.0, dtype);
    let k = uniform(r, &[b, hkv, sk, d], -1.0, 1.0, dtype);
    let v = uniform(r, &[b, hkv, sk, d], -1.0, 1.0, dtype);
    let d_o = uniform(r, &[b, hq, sq, d], -1.0, 1.0, dtype);
    let host = [q, k, v, d_o];
    let given = host.each_ref().map(|x| {
        if bshd {
            common::upload_bshd(gpu, x)
        } else {
            Tensor::from_host(gpu, x).unwrap()
        }
    });
    let padded = host
        .each_ref()
        .map(|x| Tensor::from_host(gpu, &pad_rows(x, tile_of(d))).unwrap());
    Operands {
        host,
        given,
        padded,
    }
}

/// The f64 reference's dQ, dK, dV of a case's operands.
fn reference_grads(x: &Operands, p: &AttentionParams) -> AttentionGrads<HostTensor> {
    let [q, k, v, d_o] = &x.host;
    mf::backward(q, k, v, d_o, p, &mf::ModelFeatures::default()).unwrap()
}

/// The padded call's parameters: the scale of the unpadded head dim, as the call at `d` defaults to.
fn padded_params(causal: bool, d: usize) -> AttentionParams<'static> {
    AttentionParams {
        scale: Some((1.0 / (d as f64).sqrt()) as f32),
        ..attention_params(causal)
    }
}

#[test]
fn head_dims_off_the_tiles_forward_match_the_padded_call_and_the_reference() {
    let Some(gpu) =
        gpu_or_skip("head_dims_off_the_tiles_forward_match_the_padded_call_and_the_reference")
    else {
        return;
    };
    let mut r = rng("head dims forward");
    for dtype in [DType::F16, DType::BF16] {
        for case in wide_cases(&gpu) {
            let (b, hq, hkv, sq, sk, d, bshd) = case;
            let x = operands(&gpu, &mut r, case, dtype);
            let [q, k, v, _] = &x.given;
            let [qp, kp, vp, _] = &x.padded;
            for causal in [false, true] {
                let p = attention_params(causal);
                let what = format!(
                    "{dtype} B{b} Hq{hq} Hkv{hkv} Sq{sq} Sk{sk} D{d} bshd {bshd} causal {causal}"
                );
                let (o_ref, lse_ref) = mf::forward(
                    &x.host[0],
                    &x.host[1],
                    &x.host[2],
                    &p,
                    &mf::ModelFeatures::default(),
                )
                .unwrap();
                let variants = common::flash_variants(&gpu, d, &what);
                for &variant in &variants {
                    let (o, lse) = flash_forward_variant(q, k, v, &p, variant).unwrap();
                    assert_eq!(o.shape(), &[b, hq, sq, d][..], "{what}: O's shape");
                    let (op, lsep) =
                        flash_forward_variant(qp, kp, vp, &padded_params(causal, d), variant)
                            .unwrap();
                    let cut = cut_rows(&what, &read(&op), tile_of(d), d);
                    let got = read(&o);
                    assert_eq!(
                        got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        cut.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "{what} kernel {variant}: O vs the padded call"
                    );
                    assert_eq!(bits(&lse), bits(&lsep), "{what} kernel {variant}: LSE");
                    assert_close(
                        &format!("{what} kernel {variant}: O vs reference"),
                        &got,
                        &o_ref.data,
                        tol(dtype),
                    );
                    assert_lse_close(
                        &format!("{what} kernel {variant}"),
                        &read(&lse),
                        &lse_ref.data,
                    );
                }
                println!("{what}: {} kernels ok", variants.len());
            }
        }
    }
}

#[test]
fn head_dims_off_the_tiles_backward_match_the_padded_call_and_the_reference() {
    let Some(gpu) =
        gpu_or_skip("head_dims_off_the_tiles_backward_match_the_padded_call_and_the_reference")
    else {
        return;
    };
    let mut r = rng("head dims backward");
    for dtype in [DType::F16, DType::BF16] {
        for case in wide_cases(&gpu) {
            let (b, hq, hkv, sq, sk, d, bshd) = case;
            let x = operands(&gpu, &mut r, case, dtype);
            let [q, k, v, d_o] = &x.given;
            let [qp, kp, vp, dop] = &x.padded;
            for causal in [false, true] {
                let p = attention_params(causal);
                let pp = padded_params(causal, d);
                let what = format!(
                    "{dtype} B{b} Hq{hq} Hkv{hkv} Sq{sq} Sk{sk} D{d} bshd {bshd} causal {causal}"
                );
                let (o, lse) = attention::flash_forward(q, k, v, &p).unwrap();
                let g = attention::flash_backward(q, k, v, &o, &lse, d_o, &p).unwrap();
                let (op, lsep) = attention::flash_forward(qp, kp, vp, &pp).unwrap();
                let gp = attention::flash_backward(qp, kp, vp, &op, &lsep, dop, &pp).unwrap();
                for (name, got, padded, shape) in [
                    ("dQ", &g.dq, &gp.dq, [b, hq, sq, d]),
                    ("dK", &g.dk, &gp.dk, [b, hkv, sk, d]),
                    ("dV", &g.dv, &gp.dv, [b, hkv, sk, d]),
                ] {
                    assert_eq!(got.shape(), &shape[..], "{what}: {name}'s shape");
                    let cut = cut_rows(&format!("{what}: {name}"), &read(padded), tile_of(d), d);
                    // Within an eighth of the reference tolerance, not bit-identical: the padded
                    // call's head dim is its tile's, which the sm_90 build runs on the dense kernel
                    // with its own walk over the query blocks (rotated, deferred dQ), so dK and dV
                    // add the same terms in another order; the unpadded call runs the general one.
                    assert_close(
                        &format!("{what}: {name} vs the padded call"),
                        &read(got),
                        &cut,
                        tol(dtype) / 8.0,
                    );
                }
                let want = reference_grads(&x, &p);
                assert_grads_close(
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

/// `flash_backward_add` on one case, both masks: what it adds to random f32 accumulators within
/// tolerance of the f64 reference.
fn accumulating_backward_matches_the_reference(
    gpu: &Gpu,
    r: &mut rand::rngs::StdRng,
    case: (usize, usize, usize, usize, usize, usize, bool),
    dtype: DType,
) {
    let (b, hq, hkv, sq, sk, d, bshd) = case;
    let x = operands(gpu, r, case, dtype);
    let [q, k, v, d_o] = &x.given;
    for causal in [false, true] {
        let what = format!(
            "{} {dtype} B{b} Hq{hq} Hkv{hkv} Sq{sq} Sk{sk} D{d} bshd {bshd} causal {causal}",
            gpu.ptx_arch()
        );
        let p = attention_params(causal);
        let (o, lse) = attention::flash_forward(q, k, v, &p).unwrap();
        // (Contiguous f32 whatever the operands' layout.)
        let before =
            [q.shape(), k.shape(), v.shape()].map(|shape| uniform(r, shape, -1.0, 1.0, DType::F32));
        let acc = AttentionGrads {
            dq: Tensor::from_host(gpu, &before[0]).unwrap(),
            dk: Tensor::from_host(gpu, &before[1]).unwrap(),
            dv: Tensor::from_host(gpu, &before[2]).unwrap(),
        };
        attention::flash_backward_add(q, k, v, &o, &lse, d_o, &p, &acc).unwrap();
        let want = reference_grads(&x, &p);
        for (name, t, b0, w) in [
            ("dQ", &acc.dq, &before[0], &want.dq),
            ("dK", &acc.dk, &before[1], &want.dk),
            ("dV", &acc.dv, &before[2], &want.dv),
        ] {
            let added: Vec<f32> = read(t).iter().zip(&b0.data).map(|(a, b)| a - b).collect();
            assert_close(
                &format!("{what}: {name} added vs reference"),
                &added,
                &w.data,
                tol(dtype),
            );
        }
        println!("{what}: ok");
    }
}

#[test]
fn the_accumulating_backward_takes_every_head_dim() {
    let Some(gpu) = gpu_or_skip("the_accumulating_backward_takes_every_head_dim") else {
        return;
    };
    let mut r = rng("head dims accumulating backward");
    if gpu.ptx_arch() == "sm_90" {
        // 32 and 96 (their dense kernels have no adding form: the general ones), 136 and 192
        // (the 256 tile's general adding kernel), 256 (its dense one); GQA and strided among them.
        let cases = [
            (1, 4, 2, 97, 130, 32, false, DType::F16),
            (2, 2, 2, 64, 77, 96, true, DType::BF16),
            (1, 2, 2, 33, 65, 136, false, DType::F16),
            (1, 4, 2, 130, 97, 192, false, DType::BF16),
            (2, 2, 1, 129, 129, FLASH_MAX_HEAD_DIM, true, DType::F16),
        ];
        for (b, hq, hkv, sq, sk, d, bshd, dtype) in cases {
            accumulating_backward_matches_the_reference(
                &gpu,
                &mut r,
                (b, hq, hkv, sq, sk, d, bshd),
                dtype,
            );
        }
    }
    // The sm_80 build at 32 and 96 (its tiles' adding kernels: the sm_90 dense kernels of those
    // head dims have no adding form, which must not reach this build)...
    let portable = portable_build(&gpu);
    for d in [32, 96] {
        let case = (1, 4, 2, 77, 130, d, false);
        accumulating_backward_matches_the_reference(&portable, &mut r, case, DType::BF16);
    }
    // ... and past 128: a named error, the accumulators untouched.
    let d = 136;
    let x = operands(&portable, &mut r, (1, 2, 2, 33, 33, d, false), DType::F16);
    let [q, k, v, d_o] = &x.given;
    let p = attention_params(true);
    let o = Tensor::zeros(&portable, q.shape(), DType::F16).unwrap();
    let lse = Tensor::zeros(&portable, &[1, 2, 33], DType::F32).unwrap();
    let acc = AttentionGrads {
        dq: Tensor::zeros(&portable, q.shape(), DType::F32).unwrap(),
        dk: Tensor::zeros(&portable, k.shape(), DType::F32).unwrap(),
        dv: Tensor::zeros(&portable, v.shape(), DType::F32).unwrap(),
    };
    let e = attention::flash_backward_add(q, k, v, &o, &lse, d_o, &p, &acc).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("head dim {d}")) && msg.contains("up to 128"),
        "{msg}"
    );
    for t in [&acc.dq, &acc.dk, &acc.dv] {
        assert!(read(t).iter().all(|&x| x.to_bits() == 0), "d {d}");
    }
}
