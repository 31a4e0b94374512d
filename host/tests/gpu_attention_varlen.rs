//! Packed variable-length batches through `flash_forward_varlen`, every FlashAttention kernel this
//! build has (`FLASH_VARIANTS`):
//! - O and LSE bit-identical to one `flash_forward` call per sequence on the same kernel (each
//!   sequence's rows taken as a `[1, H, S, D]` view of the packed tensors, no copy);
//! - O within the relative 2-norm tolerance of `common::tol` of the f64 reference
//!   `model_features::varlen_forward`, LSE within `1e-3 (1 + |ref|)` (and -inf exactly where a
//!   sequence has no key);
//! - `flash_backward_varlen`: dQ, dK, dV within that tolerance of the f64 reference
//!   (`model_features::backward` per sequence, grouped dK/dV summed), and the same bits on a second
//!   run;
//! - bad offsets are named errors.
//!
//! Lengths include empty sequences, sequences without keys, single rows, odd lengths and sequences
//! longer than a query block next to short ones; grouped-query heads; both masks; f16 and bf16; head
//! dims 64 and 128. Outputs are poisoned before every launch; inputs are fresh (the seed is
//! printed).
mod common;

use common::{
    attention_params, bits, gpu_or_skip, packed_inputs, read, rng, sanitizing, sequence_view, tol,
};
use host::ops::attention::{
    self, PackedSeqs, flash_forward_variant, model_features as mf,
    varlen::flash_forward_varlen_variant,
};
use host::{DType, Error, HostTensor, Tensor};

/// Rows `r0..r1` of a packed `[T, H, D]` host tensor as `[1, H, r1 - r0, D]`.
fn unpack(x: &HostTensor, r0: usize, r1: usize) -> HostTensor {
    let (h, d) = (x.shape[1], x.shape[2]);
    let n = r1 - r0;
    let mut out = vec![0f32; n * h * d];
    for r in 0..n {
        for hh in 0..h {
            let src = ((r0 + r) * h + hh) * d;
            out[(hh * n + r) * d..][..d].copy_from_slice(&x.data[src..src + d]);
        }
    }
    HostTensor::new(out, &[1, h, n, d], x.dtype).unwrap()
}

/// `g` `[1, H, n, D]` written into rows `r0..` of a packed `[T, H, D]` array.
fn scatter(dst: &mut [f32], g: &[f32], r0: usize, h: usize, d: usize) {
    let n = g.len() / (h * d);
    for hh in 0..h {
        for r in 0..n {
            dst[((r0 + r) * h + hh) * d..][..d].copy_from_slice(&g[(hh * n + r) * d..][..d]);
        }
    }
}

/// (query lengths, key lengths, Hq, Hkv, D)
type Case = (Vec<usize>, Vec<usize>, usize, usize, usize);

fn cases() -> Vec<Case> {
    let all: Vec<Case> = vec![
        (vec![5, 300, 17, 0, 129], vec![5, 300, 17, 0, 129], 4, 4, 64),
        (vec![1, 1, 1], vec![700, 33, 0], 8, 2, 128),
        (vec![200, 64, 3], vec![77, 64, 500], 4, 1, 64),
        (vec![130, 250], vec![130, 250], 2, 2, 128),
    ];
    if sanitizing() {
        vec![all[0].clone(), all[1].clone()]
    } else {
        all
    }
}

#[test]
fn packed_forward_matches_one_call_per_sequence_and_the_reference() {
    let Some(gpu) = gpu_or_skip("packed_forward_matches_one_call_per_sequence_and_the_reference")
    else {
        return;
    };
    let mut r = rng("varlen forward");
    for dtype in [DType::F16, DType::BF16] {
        for (lq, lk, hq, hkv, d) in cases() {
            let ((cu_q, cu_k), (tq, _), [q, k, v, _], [qd, kd, vd, _]) =
                packed_inputs(&gpu, &mut r, (&lq, &lk, hq, hkv, d), dtype);
            let seqs = PackedSeqs {
                cu_seqlens_q: &cu_q,
                cu_seqlens_k: &cu_k,
            };
            for causal in [false, true] {
                let p = attention_params(causal);
                let what =
                    format!("{dtype} q {lq:?} k {lk:?} Hq{hq} Hkv{hkv} D{d} causal {causal}");
                let (o_ref, lse_ref) =
                    mf::varlen_forward(&q, &k, &v, &cu_q, &cu_k, &p, &mf::ModelFeatures::default())
                        .unwrap();
                let variants = common::flash_variants(&gpu, d, &what);
                for &variant in &variants {
                    let (o, lse) =
                        flash_forward_varlen_variant(&qd, &kd, &vd, seqs, &p, variant).unwrap();
                    assert_eq!(o.shape(), &[tq, hq, d][..], "{what}: O shape");
                    assert_eq!(lse.shape(), &[hq, tq][..], "{what}: LSE shape");
                    let (o, lse) = (read(&o), read(&lse));
                    // One call per sequence on the same kernel.
                    for b in 0..lq.len() {
                        let (q0, q1, k0, k1) = (cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]);
                        if q1 == q0 {
                            continue;
                        }
                        let (ob, lb) = flash_forward_variant(
                            &sequence_view(&qd, q0, q1),
                            &sequence_view(&kd, k0, k1),
                            &sequence_view(&vd, k0, k1),
                            &p,
                            variant,
                        )
                        .unwrap();
                        let (ob, lb) = (read(&ob), read(&lb)); // [1, H, n, D], [1, H, n]
                        let n = q1 - q0;
                        for h in 0..hq {
                            for i in 0..n {
                                let got = &o[((q0 + i) * hq + h) * d..][..d];
                                let want = &ob[(h * n + i) * d..][..d];
                                assert!(
                                    got.iter()
                                        .zip(want)
                                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                                    "{what} kernel {variant}: sequence {b} head {h} row {i}: O"
                                );
                                assert_eq!(
                                    lse[h * tq + q0 + i].to_bits(),
                                    lb[h * n + i].to_bits(),
                                    "{what} kernel {variant}: sequence {b} head {h} row {i}: LSE"
                                );
                            }
                        }
                    }
                    common::assert_close(
                        &format!("{what} kernel {variant}: O vs reference"),
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
fn packed_backward_matches_the_reference_and_repeats_its_bits() {
    let Some(gpu) = gpu_or_skip("packed_backward_matches_the_reference_and_repeats_its_bits")
    else {
        return;
    };
    if gpu.ptx_arch() != "sm_90" {
        println!("SKIP: packed backward kernels are in the sm_90 build only");
        return;
    }
    let mut r = rng("varlen backward");
    for dtype in [DType::F16, DType::BF16] {
        for (lq, lk, hq, hkv, d) in cases() {
            let ((cu_q, cu_k), (tq, tk), [q, k, v, d_o], [qd, kd, vd, dod]) =
                packed_inputs(&gpu, &mut r, (&lq, &lk, hq, hkv, d), dtype);
            let seqs = PackedSeqs {
                cu_seqlens_q: &cu_q,
                cu_seqlens_k: &cu_k,
            };
            for causal in [false, true] {
                let p = attention_params(causal);
                let what =
                    format!("{dtype} q {lq:?} k {lk:?} Hq{hq} Hkv{hkv} D{d} causal {causal}");
                let (o, lse) = attention::flash_forward_varlen(&qd, &kd, &vd, seqs, &p).unwrap();
                let g = attention::flash_backward_varlen(&qd, &kd, &vd, &o, &lse, &dod, seqs, &p)
                    .unwrap();
                assert_eq!(g.dq.shape(), &[tq, hq, d][..], "{what}: dQ shape");
                assert_eq!(g.dk.shape(), &[tk, hkv, d][..], "{what}: dK shape");
                let again =
                    attention::flash_backward_varlen(&qd, &kd, &vd, &o, &lse, &dod, seqs, &p)
                        .unwrap();
                for (name, x, y) in [
                    ("dQ", &g.dq, &again.dq),
                    ("dK", &g.dk, &again.dk),
                    ("dV", &g.dv, &again.dv),
                ] {
                    assert_eq!(bits(x), bits(y), "{what}: {name} differs between runs");
                }
                // The reference, one sequence at a time.
                let (mut dq, mut dk, mut dv) = (
                    vec![0f32; tq * hq * d],
                    vec![0f32; tk * hkv * d],
                    vec![0f32; tk * hkv * d],
                );
                for b in 0..lq.len() {
                    let (q0, q1, k0, k1) = (cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]);
                    let want = mf::backward(
                        &unpack(&q, q0, q1),
                        &unpack(&k, k0, k1),
                        &unpack(&v, k0, k1),
                        &unpack(&d_o, q0, q1),
                        &p,
                        &mf::ModelFeatures::default(),
                    )
                    .unwrap();
                    scatter(&mut dq, &want.dq.data, q0, hq, d);
                    scatter(&mut dk, &want.dk.data, k0, hkv, d);
                    scatter(&mut dv, &want.dv.data, k0, hkv, d);
                }
                common::assert_grads_close(
                    &format!("{what}: vs reference"),
                    &g,
                    [&dq, &dk, &dv],
                    tol(dtype),
                );
                println!("{what}: ok");
            }
        }
    }
}

#[test]
fn bad_offsets_are_named_errors() {
    let Some(gpu) = gpu_or_skip("bad_offsets_are_named_errors") else {
        return;
    };
    let p = attention_params(false);
    let q = Tensor::zeros(&gpu, &[10, 2, 64], DType::F16).unwrap();
    let call = |cq: &[usize], ck: &[usize]| {
        attention::flash_forward_varlen(
            &q,
            &q,
            &q,
            PackedSeqs {
                cu_seqlens_q: cq,
                cu_seqlens_k: ck,
            },
            &p,
        )
    };
    assert!(call(&[0, 4, 10], &[0, 6, 10]).is_ok());
    let e = call(&[0, 4, 9], &[0, 6, 10]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Length {
                expected: 10,
                got: 9,
                ..
            }
        ),
        "{e}"
    );
    let e = call(&[0, 6, 4, 10], &[0, 1, 2, 10]).unwrap_err();
    assert!(e.to_string().contains("never decrease"), "{e}");
    let e = call(&[1, 10], &[0, 10]).unwrap_err();
    assert!(e.to_string().contains("start at 0"), "{e}");
    let e = call(&[0, 5, 10], &[0, 10]).unwrap_err();
    assert!(
        matches!(e, Error::Length { .. }) && e.to_string().contains("cu_seqlens_k"),
        "{e}"
    );
    // Rank-4 operands are the dense API's, and say so.
    let q4 = Tensor::zeros(&gpu, &[1, 10, 2, 64], DType::F16).unwrap();
    let e = attention::flash_forward_varlen(
        &q4,
        &q4,
        &q4,
        PackedSeqs {
            cu_seqlens_q: &[0, 10],
            cu_seqlens_k: &[0, 10],
        },
        &p,
    )
    .unwrap_err();
    assert!(e.to_string().contains("[total, heads, head_dim]"), "{e}");
}
