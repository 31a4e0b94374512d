//! CPU tests of the multi-GPU pieces: zig-zag sharding, the ring's pair schedule, the LSE merge and the
//! whole ring (forward and backward) simulated on the CPU against one-sequence references, the
//! data-parallel batch split and bucket layout, and the errors of a group that cannot start.
use super::data_parallel::split_batch;
use super::ring_attention::{Pair, reference, shard, step_pairs, unshard, zigzag_chunks};
use crate::DType;
use crate::error::Error;
use crate::ops::attention::{self as attn, AttentionParams, Causal};
use crate::replace::model::{self, BACKWARD_ORDER, Config};
use crate::tensor::HostTensor;

fn seed_for(test: &str) -> u64 {
    crate::testing::seed(test)
}

fn random(shape: &[usize], rng: &mut u64) -> HostTensor {
    let n: usize = shape.iter().product();
    let data = (0..n)
        .map(|_| {
            *rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((*rng >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect();
    HostTensor::new(data, shape, DType::F32).unwrap()
}

#[test]
fn zigzag_shards_cover_the_sequence_once_and_unshard_inverts_them() {
    let mut rng = seed_for("zigzag_shards_cover_the_sequence_once_and_unshard_inverts_them");
    for world in 1..=5 {
        let mut seen = vec![0; 2 * world];
        for r in 0..world {
            for c in zigzag_chunks(world, r) {
                seen[c] += 1;
            }
        }
        assert!(seen.iter().all(|&n| n == 1), "world {world}: {seen:?}");
        for shape in [vec![2, 3, 4 * world, 5], vec![1, 2, 6 * world]] {
            let x = random(&shape, &mut rng);
            let parts: Vec<_> = (0..world).map(|r| shard(&x, world, r).unwrap()).collect();
            assert_eq!(parts[0].shape[0], 2);
            assert_eq!(parts[0].shape[3], shape[2] / (2 * world));
            assert_eq!(unshard(&parts).unwrap(), x, "world {world} shape {shape:?}");
        }
    }
    // The early chunk of rank 0 is the sequence's first rows.
    let x = random(&[1, 1, 8, 2], &mut rng);
    let p = shard(&x, 2, 0).unwrap();
    assert_eq!(&p.data[..4], &x.data[..4]);
    assert_eq!(&p.data[4..8], &x.data[12..16]);
}

#[test]
fn shard_rejects_sequences_that_do_not_split_evenly() {
    let x = HostTensor::new(vec![0.0; 10 * 4], &[1, 1, 10, 4], DType::F32).unwrap();
    let e = shard(&x, 2, 0).unwrap_err();
    assert!(
        matches!(&e, Error::Shape { what, .. } if what.contains("4 equal chunks")),
        "{e}"
    );
    assert!(matches!(shard(&x, 5, 7), Err(Error::Invalid { .. })));
}

/// Every (query chunk, key chunk) of the global causal mask with any visible key is computed exactly
/// once over all ranks and steps, with the mask only on the diagonal; unmasked, every pair once; and
/// under the mask every rank does the same work at every step.
#[test]
fn ring_steps_compute_every_visible_chunk_pair_once_with_equal_work() {
    for world in 1..=6 {
        for causal in [true, false] {
            let n = 2 * world;
            let mut count = vec![vec![0; n]; n];
            for r in 0..world {
                for step in 0..world {
                    let src = (r + world - step) % world;
                    let pairs = step_pairs(world, r, step, causal);
                    let work: f64 = pairs.iter().map(|p| if p.causal { 0.5 } else { 1.0 }).sum();
                    assert_eq!(
                        work,
                        if causal { 2.0 } else { 4.0 },
                        "world {world} rank {r} step {step}"
                    );
                    for Pair {
                        q,
                        kv,
                        causal: masked,
                    } in pairs
                    {
                        let (gq, gk) = (zigzag_chunks(world, r)[q], zigzag_chunks(world, src)[kv]);
                        assert!(
                            !causal || gk <= gq,
                            "world {world}: q chunk {gq} sees later k chunk {gk}"
                        );
                        assert_eq!(masked, causal && gk == gq);
                        count[gq][gk] += 1;
                    }
                }
            }
            for (gq, row) in count.iter().enumerate() {
                for (gk, &c) in row.iter().enumerate() {
                    let want = usize::from(!causal || gk <= gq);
                    assert_eq!(c, want, "world {world} causal {causal}: pair ({gq}, {gk})");
                }
            }
        }
    }
}

#[test]
fn lse_merge_equals_the_softmax_over_both_key_sets_and_ignores_empty_sides() {
    let mut rng =
        seed_for("lse_merge_equals_the_softmax_over_both_key_sets_and_ignores_empty_sides");
    let (rows, d, ka, kb) = (5, 4, 7, 3);
    let q = random(&[1, 1, rows, d], &mut rng);
    let k = random(&[1, 1, ka + kb, d], &mut rng);
    let v = random(&[1, 1, ka + kb, d], &mut rng);
    let p = AttentionParams::default();
    let split = |t: &HostTensor, lo: usize, hi: usize| {
        HostTensor::new(
            t.data[lo * d..hi * d].to_vec(),
            &[1, 1, hi - lo, d],
            DType::F32,
        )
        .unwrap()
    };
    let (o_a, l_a) =
        attn::reference::forward(&q, &split(&k, 0, ka), &split(&v, 0, ka), &p).unwrap();
    let (o_b, l_b) =
        attn::reference::forward(&q, &split(&k, ka, ka + kb), &split(&v, ka, ka + kb), &p).unwrap();
    let (o, l) = attn::reference::forward(&q, &k, &v, &p).unwrap();
    let (om, lm) = reference::merge(&o_a.data, &l_a.data, &o_b.data, &l_b.data, d);
    for (x, y) in om.iter().zip(&o.data).chain(lm.iter().zip(&l.data)) {
        assert!((x - y).abs() < 1e-5, "{x} vs {y}");
    }
    // An empty side (LSE -inf, output poisoned) contributes nothing; two empty sides stay empty.
    let nan = vec![f32::NAN; rows * d];
    let ninf = vec![f32::NEG_INFINITY; rows];
    let (om, lm) = reference::merge(&nan, &ninf, &o_b.data, &l_b.data, d);
    assert_eq!((om, lm), (o_b.data.clone(), l_b.data.clone()));
    let (om, lm) = reference::merge(&nan, &ninf, &nan, &ninf, d);
    assert!(om.iter().all(|&x| x == 0.0) && lm.iter().all(|&x| x == f32::NEG_INFINITY));
}

/// Chunk `j` of a shard `[2, B, H, c, D]` as a `[B, H, c, D]` tensor.
fn chunk(t: &HostTensor, j: usize) -> HostTensor {
    let per = t.numel() / 2;
    HostTensor::new(
        t.data[j * per..(j + 1) * per].to_vec(),
        &t.shape[1..],
        t.dtype,
    )
    .unwrap()
}

/// The whole ring on the CPU: each rank's steps with the pair schedule, the f64 attention reference per
/// pair and the LSE merge, then unsharded, equals attention over the whole sequence; the backward
/// (pair gradients from the final O and LSE, dK/dV summed over the visiting ranks) equals the whole
/// sequence's gradients.
#[test]
fn ring_simulated_on_the_cpu_equals_attention_over_the_whole_sequence() {
    let mut rng = seed_for("ring_simulated_on_the_cpu_equals_attention_over_the_whole_sequence");
    for (world, causal) in [(1, true), (2, true), (3, true), (3, false), (4, true)] {
        let (b, h, c, d) = (1, 2, 3, 4);
        let s = 2 * world * c;
        let q = random(&[b, h, s, d], &mut rng);
        let k = random(&[b, h, s, d], &mut rng);
        let v = random(&[b, h, s, d], &mut rng);
        let d_o = random(&[b, h, s, d], &mut rng);
        let params = AttentionParams {
            causal: if causal { Causal::Yes } else { Causal::No },
            scale: None,
            ..Default::default()
        };
        let (o_full, lse_full) = attn::reference::forward(&q, &k, &v, &params).unwrap();
        let g_full = attn::reference::backward(&q, &k, &v, &d_o, &params).unwrap();
        let sh = |t: &HostTensor| {
            (0..world)
                .map(|r| shard(t, world, r).unwrap())
                .collect::<Vec<_>>()
        };
        let (qs, ks, vs, dos) = (sh(&q), sh(&k), sh(&v), sh(&d_o));
        let (os, ls) = (sh(&o_full), sh(&lse_full));
        let scale = 1.0 / (d as f64).sqrt();
        let rows = b * h * c;
        let mut outs = Vec::new();
        let mut lses = Vec::new();
        let mut dq_all = Vec::new();
        let mut dkv: Vec<(Vec<f64>, Vec<f64>)> =
            vec![(vec![0.0; 2 * rows * d], vec![0.0; 2 * rows * d]); world];
        for r in 0..world {
            let mut acc: [Option<(Vec<f32>, Vec<f32>)>; 2] = [None, None];
            let mut dq = vec![0f64; 2 * rows * d];
            for step in 0..world {
                let src = (r + world - step) % world;
                for p in step_pairs(world, r, step, causal) {
                    let pp = AttentionParams {
                        causal: if p.causal { Causal::Yes } else { Causal::No },
                        scale: None,
                        ..Default::default()
                    };
                    let (qc, kc, vc) = (
                        chunk(&qs[r], p.q),
                        chunk(&ks[src], p.kv),
                        chunk(&vs[src], p.kv),
                    );
                    let (o, l) = attn::reference::forward(&qc, &kc, &vc, &pp).unwrap();
                    acc[p.q] = Some(match acc[p.q].take() {
                        None => (o.data, l.data),
                        Some((oa, la)) => reference::merge(&oa, &la, &o.data, &l.data, d),
                    });
                    // Backward, head by head.
                    let (oc, lc, doc) =
                        (chunk(&os[r], p.q), chunk(&ls[r], p.q), chunk(&dos[r], p.q));
                    for hh in 0..b * h {
                        let (x, y) = (hh * c * d, (hh + 1) * c * d);
                        let (gq, gk, gv) = reference::pair_backward(
                            &qc.data[x..y],
                            &kc.data[x..y],
                            &vc.data[x..y],
                            &oc.data[x..y],
                            &lc.data[hh * c..(hh + 1) * c],
                            &doc.data[x..y],
                            d,
                            scale,
                            p.causal,
                        );
                        let (qo, ko) = (p.q * rows * d + x, p.kv * rows * d + x);
                        for i in 0..c * d {
                            dq[qo + i] += gq[i];
                            dkv[src].0[ko + i] += gk[i];
                            dkv[src].1[ko + i] += gv[i];
                        }
                    }
                }
            }
            let [Some(a0), Some(a1)] = acc else {
                panic!("a query chunk saw no keys")
            };
            let mut shape = vec![2];
            shape.extend_from_slice(&q.shape);
            shape[3] = c;
            outs.push(HostTensor {
                data: [a0.0, a1.0].concat(),
                shape: shape.clone(),
                dtype: DType::F32,
            });
            lses.push(HostTensor {
                data: [a0.1, a1.1].concat(),
                shape: shape[..4].to_vec(),
                dtype: DType::F32,
            });
            dq_all.push(HostTensor {
                data: dq.iter().map(|&x| x as f32).collect(),
                shape,
                dtype: DType::F32,
            });
        }
        let close = |a: &HostTensor, b: &HostTensor, tol: f32, what: &str| {
            assert_eq!(a.shape, b.shape, "{what}");
            let m = a
                .data
                .iter()
                .zip(&b.data)
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max);
            assert!(
                m < tol,
                "world {world} causal {causal}: {what} max diff {m}"
            );
        };
        close(&unshard(&outs).unwrap(), &o_full, 1e-5, "O");
        close(&unshard(&lses).unwrap(), &lse_full, 1e-5, "LSE");
        close(&unshard(&dq_all).unwrap(), &g_full.dq, 1e-5, "dQ");
        let as_shard = |x: &Vec<f64>| HostTensor {
            data: x.iter().map(|&v| v as f32).collect(),
            shape: dq_all[0].shape.clone(),
            dtype: DType::F32,
        };
        let dk: Vec<_> = dkv.iter().map(|p| as_shard(&p.0)).collect();
        let dv: Vec<_> = dkv.iter().map(|p| as_shard(&p.1)).collect();
        close(&unshard(&dk).unwrap(), &g_full.dk, 1e-5, "dK");
        close(&unshard(&dv).unwrap(), &g_full.dv, 1e-5, "dV");
    }
}

#[test]
fn split_batch_gives_each_rank_its_sequences_and_rejects_uneven_splits() {
    let cfg = Config {
        batch: 6,
        ..Config::default()
    };
    let batch = model::batch(
        &cfg,
        seed_for("split_batch_gives_each_rank_its_sequences_and_rejects_uneven_splits"),
    );
    let parts: Vec<_> = (0..3)
        .map(|r| split_batch(&cfg, &batch, 3, r).unwrap())
        .collect();
    assert!(parts.iter().all(|(c, _)| c.batch == 2));
    let tokens: Vec<u32> = parts.iter().flat_map(|(_, b)| b.tokens.clone()).collect();
    let targets: Vec<u32> = parts.iter().flat_map(|(_, b)| b.targets.clone()).collect();
    assert_eq!(
        (tokens, targets),
        (batch.tokens.clone(), batch.targets.clone())
    );
    let e = split_batch(&cfg, &batch, 4, 0).unwrap_err();
    assert!(
        matches!(&e, Error::Invalid { msg, .. } if msg.contains("split evenly")),
        "{e}"
    );
}

/// The data-parallel step's bucket schedule depends on the backward reporting every parameter once,
/// in the documented order: the CPU backward does.
#[test]
fn the_backward_reports_every_gradient_once_in_backward_order() {
    let cfg = Config::default();
    let p = model::init(
        &cfg,
        seed_for("the_backward_reports_every_gradient_once_in_backward_order"),
    );
    let batch = model::batch(&cfg, 3);
    let device = crate::replace::Device::None;
    let ex = crate::replace::Exec::new(crate::replace::Plan::all_reference(), &device);
    let mut seen = Vec::new();
    let (_, grads) = model::loss_and_grads_with(&ex, &cfg, &p, &batch, &mut |name, g| {
        seen.push((name, g.clone()));
        Ok(())
    })
    .unwrap();
    assert_eq!(
        seen.iter().map(|s| s.0).collect::<Vec<_>>(),
        BACKWARD_ORDER.to_vec()
    );
    for (name, g) in grads.named() {
        let reported = &seen.iter().find(|s| s.0 == name).unwrap().1;
        assert_eq!(
            reported, g,
            "{name}: the reported gradient is the returned one"
        );
    }
}

#[test]
fn a_group_that_cannot_start_says_why() {
    let e = super::run(0, super::Settings::default(), |_| Ok(())).unwrap_err();
    assert!(
        matches!(&e, Error::Invalid { msg, .. } if msg.contains("at least one GPU")),
        "{e}"
    );
    let visible = super::gpu_count();
    let e = super::run(visible + 1, super::Settings::default(), |_| Ok(())).unwrap_err();
    assert!(
        matches!(&e, Error::NoDevice { reason } if reason.contains(&format!("{} GPUs requested", visible + 1))),
        "{e}"
    );
}

#[test]
fn a_missing_nccl_library_is_a_typed_error_naming_what_was_tried() {
    // Only meaningful where NCCL is absent (CI); where it loads, its version must be 2.18 or newer.
    match super::nccl_info() {
        Err(Error::NcclUnavailable { reason }) => {
            assert!(
                reason.contains("libnccl.so.2") && reason.contains("LD_LIBRARY_PATH"),
                "{reason}"
            )
        }
        Err(e) => panic!("unexpected error {e}"),
        Ok(info) => assert!(info.version >= (2, 18, 0), "{info:?}"),
    }
}

/// The set-up rendezvous: all ranks through once the last arrives; a rank that gives up before that
/// leaves it closed for a late peer (which then gives up too), never half open.
#[test]
fn the_rendezvous_opens_for_all_or_for_none() {
    use super::Gate;
    use std::time::{Duration, Instant};
    let gate = Gate::default();
    let ok = std::thread::scope(|s| {
        let hs: Vec<_> = (0..3).map(|_| s.spawn(|| gate.pass(3, || None))).collect();
        hs.into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    assert!(ok.iter().all(|r| r.is_ok()), "{ok:?}");

    // World 2: the first rank gives up after 30 ms; the second arrives after that and must not
    // pass (it gives up after 60 ms of its own).
    let gate = Gate::default();
    let timeout = |d: Duration| {
        let start = Instant::now();
        move || (start.elapsed() > d).then(|| "timed out".to_string())
    };
    let first = gate.pass(2, timeout(Duration::from_millis(30)));
    assert_eq!(first, Err("timed out".into()));
    let second = gate.pass(2, timeout(Duration::from_millis(60)));
    assert_eq!(
        second,
        Err("timed out".into()),
        "a rank got through a gate its peer had left"
    );
    // Both gone: two new arrivals open it.
    let both = std::thread::scope(|s| {
        let a = s.spawn(|| gate.pass(2, || None));
        let b = s.spawn(|| gate.pass(2, || None));
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_eq!(both, (Ok(()), Ok(())));
}
