//! Multi-GPU tests over every visible GPU (`host::dist`): collectives against host sums, exchanges
//! delivering messages in order, a failing, absent or mismatched rank ending the group with a clear
//! error instead of a hang, ring attention forward and
//! backward against the f64 reference of the whole sequence (the flash kernels' rule), and
//! data-parallel training against one GPU at the same global batch. With one GPU the group has one
//! rank (the ring is one step) and the tests that need a peer print SKIP.
mod common;

use std::time::{Duration, Instant};

use common::{max_abs_err, rng, sanitizing, uniform};
use host::dist::{self, ReduceOp, Settings, data_parallel, ring_attention};
use host::ops::attention::{self, AttentionParams, Causal, reference};
use host::replace::model::resident::{self, Block};
use host::replace::{Device, Exec, Plan, model};
use host::{DType, Error, HostTensor, Tensor};

/// The most a group may take to end after a failure (set-up and teardown included) before the test
/// calls it a hang: `normal` seconds, or 300 under compute-sanitizer, where NCCL's set-up alone
/// took 20-50 s (memcheck on two H200s, 2026-11-27).
fn no_hang_bound(normal: u64) -> Duration {
    Duration::from_secs(if sanitizing() { 300 } else { normal })
}

/// Every visible GPU, or a SKIP line.
fn world_or_skip(test: &str, min: usize) -> Option<usize> {
    let n = dist::gpu_count();
    if n < min {
        println!("SKIP {test}: needs {min} GPU(s), {n} visible");
        return None;
    }
    match dist::nccl_info() {
        Ok(info) => println!(
            "{test}: {n} GPUs, NCCL {:?} from {}",
            info.version, info.library
        ),
        Err(e) => {
            println!("SKIP {test}: {e}");
            return None;
        }
    }
    Some(n)
}

#[test]
fn collectives_match_host_arithmetic_and_leave_the_same_bits_on_every_rank() {
    let Some(world) = world_or_skip("collectives", 1) else {
        return;
    };
    let mut r = rng("collectives");
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for n in [1usize, 7, 4099, 1 << 20] {
            let inputs: Vec<HostTensor> = (0..world)
                .map(|_| uniform(&mut r, &[n], -1.0, 1.0, dtype))
                .collect();
            let out = dist::run(world, Settings::default(), |rank| {
                rank.gpu().set_poison_outputs(true);
                let mine = &inputs[rank.rank()];
                let mut res = Vec::new();
                for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max] {
                    let x = Tensor::from_host(rank.gpu(), mine)?;
                    rank.all_reduce(&x, op)?;
                    rank.synchronize()?;
                    res.push(x.to_vec()?);
                }
                let all = Tensor::empty(rank.gpu(), &[world * n], dtype)?;
                rank.all_gather(&Tensor::from_host(rank.gpu(), mine)?, &all)?;
                // A ring exchange: send to the next rank, receive from the previous one.
                let (next, prev) = ((rank.rank() + 1) % world, (rank.rank() + world - 1) % world);
                let got = Tensor::empty(rank.gpu(), &[n], dtype)?;
                rank.exchange_start(
                    &[(&Tensor::from_host(rank.gpu(), mine)?, next)],
                    &[(&got, prev)],
                )?
                .finish()?;
                rank.synchronize()?;
                res.push(all.to_vec()?);
                res.push(got.to_vec()?);
                Ok(res)
            })
            .unwrap();
            // The reduction is done in the dtype: allow one rounding per addition.
            let ulp = match dtype {
                DType::F32 => 1.2e-7,
                DType::F16 => 9.8e-4,
                DType::BF16 => 7.9e-3,
            };
            for (i, rank_out) in out.iter().enumerate() {
                assert_eq!(
                    rank_out[..4],
                    out[0][..4],
                    "{dtype} n={n}: rank {i}'s reductions differ from rank 0's"
                );
            }
            let res = &out[0];
            for e in 0..n {
                let vals: Vec<f64> = inputs.iter().map(|t| t.data[e] as f64).collect();
                let sum: f64 = vals.iter().sum();
                let abs: f64 = vals.iter().map(|v| v.abs()).sum();
                let tol = ulp * abs * world as f64 + 1e-30;
                assert!(
                    (res[0][e] as f64 - sum).abs() <= tol,
                    "{dtype} n={n} sum[{e}]: {} vs {sum}",
                    res[0][e]
                );
                assert!(
                    (res[1][e] as f64 - sum / world as f64).abs() <= tol,
                    "{dtype} n={n} avg[{e}]: {} vs {}",
                    res[1][e],
                    sum / world as f64
                );
                let max = vals.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                assert_eq!(res[2][e] as f64, max, "{dtype} n={n} max[{e}]");
            }
            let gathered: Vec<f32> = inputs.iter().flat_map(|t| t.data.clone()).collect();
            assert_eq!(res[3], gathered, "{dtype} n={n}: all_gather");
            for (rk, rank_out) in out.iter().enumerate() {
                let prev = (rk + world - 1) % world;
                assert_eq!(
                    rank_out[4], inputs[prev].data,
                    "{dtype} n={n}: rank {rk} received"
                );
            }
        }
    }
}

#[test]
fn collectives_reject_bad_operands_with_typed_errors() {
    let Some(world) = world_or_skip("collective errors", 1) else {
        return;
    };
    let errs = dist::run(world, Settings::default(), |rank| {
        let x = Tensor::from_f32(rank.gpu(), &[1.0; 6], &[2, 3], DType::F32)?;
        let strided = x.transpose(0, 1)?;
        let small = Tensor::empty(rank.gpu(), &[5], DType::F32)?;
        Ok([
            rank.all_reduce(&strided, ReduceOp::Sum)
                .err()
                .map(|e| e.to_string()),
            rank.all_gather(&x, &small).err().map(|e| e.to_string()),
            rank.exchange_start(&[(&x, world)], &[])
                .err()
                .map(|e| e.to_string()),
        ])
    })
    .unwrap();
    let [a, b, c] = &errs[0];
    assert!(
        a.as_deref().unwrap_or("").contains("must be contiguous"),
        "{a:?}"
    );
    assert!(b.as_deref().unwrap_or("").contains("expected"), "{b:?}");
    assert!(c.as_deref().unwrap_or("").contains("out of range"), "{c:?}");
}

/// A rank that fails (an error or a panic) while its peer waits in a collective ends the group with
/// that rank's error, well before the timeout: never a hang.
#[test]
fn a_failing_rank_fails_the_group_without_a_hang() {
    let Some(world) = world_or_skip("failing rank", 2) else {
        return;
    };
    for panic in [false, true] {
        let start = Instant::now();
        let settings = Settings {
            timeout: Duration::from_secs(60),
        };
        let e = dist::run(world, settings, |rank| {
            if rank.rank() == 1 {
                std::thread::sleep(Duration::from_millis(300));
                if panic {
                    panic!("planted panic");
                }
                return Err(Error::Invalid {
                    op: "test",
                    msg: "planted failure".into(),
                });
            }
            let x = Tensor::from_f32(rank.gpu(), &vec![1.0; 1 << 20], &[1 << 20], DType::F32)?;
            rank.all_reduce(&x, ReduceOp::Sum)?;
            rank.synchronize()?;
            Ok(())
        })
        .unwrap_err();
        let took = start.elapsed();
        println!("failing rank (panic {panic}): {e} after {took:?}");
        match &e {
            Error::Dist { rank: 1, what, .. } => {
                assert!(
                    what.contains(if panic {
                        "planted panic"
                    } else {
                        "planted failure"
                    }),
                    "{e}"
                )
            }
            other => panic!("expected rank 1's failure, got {other}"),
        }
        assert!(took < no_hang_bound(20), "the group took {took:?} to fail");
    }
}

/// A rank that never joins a collective its peer waits in: the peer times out with an error naming
/// the timeout.
#[test]
fn a_collective_a_peer_never_joins_times_out() {
    let Some(world) = world_or_skip("absent peer", 2) else {
        return;
    };
    let start = Instant::now();
    let settings = Settings {
        timeout: Duration::from_secs(3),
    };
    let e = dist::run(world, settings, |rank| {
        if rank.rank() != 0 {
            return Ok(());
        }
        let x = Tensor::from_f32(rank.gpu(), &[1.0; 64], &[64], DType::F32)?;
        rank.all_reduce(&x, ReduceOp::Sum)?;
        rank.synchronize()
    })
    .unwrap_err();
    let took = start.elapsed();
    println!("absent peer: {e} after {took:?}");
    assert!(
        matches!(&e, Error::Dist { rank: 0, what, .. } if what.contains("timed out")),
        "{e}"
    );
    assert!(took < no_hang_bound(30), "took {took:?}");
}

/// Several messages between the same two ranks, over several calls, land in order: the i-th
/// tensor a rank sends to another fills the i-th tensor that one receives from it (exact copies,
/// both directions of the ring at once, dtypes and lengths differing between messages).
#[test]
fn exchanges_deliver_messages_in_order() {
    let Some(world) = world_or_skip("exchange order", 2) else {
        return;
    };
    let mut r = rng("exchange order");
    // Per call and rank: two messages to the next rank, one to the previous.
    let shapes = [
        (DType::F32, 4099usize),
        (DType::F16, 77),
        (DType::BF16, 1 << 16),
    ];
    let data: Vec<Vec<Vec<HostTensor>>> = (0..3)
        .map(|_| {
            (0..world)
                .map(|_| {
                    shapes
                        .iter()
                        .map(|&(dt, n)| uniform(&mut r, &[n], -4.0, 4.0, dt))
                        .collect()
                })
                .collect()
        })
        .collect();
    let got = dist::run(world, Settings::default(), |rank| {
        rank.gpu().set_poison_outputs(true);
        let (me, next, prev) = (
            rank.rank(),
            (rank.rank() + 1) % world,
            (rank.rank() + world - 1) % world,
        );
        let mut out = Vec::new();
        for call in &data {
            let mine: Vec<Tensor> = call[me]
                .iter()
                .map(|t| Tensor::from_host(rank.gpu(), t))
                .collect::<host::Result<_>>()?;
            let into: Vec<Tensor> = shapes
                .iter()
                .map(|&(dt, n)| Tensor::empty(rank.gpu(), &[n], dt))
                .collect::<host::Result<_>>()?;
            rank.exchange_start(
                &[(&mine[0], next), (&mine[1], next), (&mine[2], prev)],
                &[(&into[0], prev), (&into[1], prev), (&into[2], next)],
            )?
            .finish()?;
            rank.synchronize()?;
            out.push(
                into.iter()
                    .map(|t| t.to_vec())
                    .collect::<host::Result<Vec<_>>>()?,
            );
        }
        Ok(out)
    })
    .unwrap();
    for (rk, calls) in got.iter().enumerate() {
        let (next, prev) = ((rk + 1) % world, (rk + world - 1) % world);
        for (c, msgs) in calls.iter().enumerate() {
            assert_eq!(
                msgs[0], data[c][prev][0].data,
                "call {c}: rank {rk}, first from {prev}"
            );
            assert_eq!(
                msgs[1], data[c][prev][1].data,
                "call {c}: rank {rk}, second from {prev}"
            );
            assert_eq!(
                msgs[2], data[c][next][2].data,
                "call {c}: rank {rk}, one from {next}"
            );
        }
    }
}

/// An exchange whose two sides disagree (a sender's length against the receiver's) fails the group
/// with both sizes named, and a send to a rank that never receives times out: never a hang, never a
/// copy into a buffer of the wrong size.
#[test]
fn an_exchange_that_does_not_match_fails_the_group() {
    let Some(world) = world_or_skip("exchange mismatch", 2) else {
        return;
    };
    let settings = Settings {
        timeout: Duration::from_secs(3),
    };
    let e = dist::run(world, settings, |rank| {
        match rank.rank() {
            0 => {
                let x = Tensor::from_f32(rank.gpu(), &[1.0; 64], &[64], DType::F32)?;
                rank.exchange_start(&[(&x, 1)], &[])?.finish()?;
            }
            1 => {
                let y = Tensor::empty(rank.gpu(), &[65], DType::F32)?;
                rank.exchange_start(&[], &[(&y, 0)])?.finish()?;
            }
            _ => {}
        }
        rank.synchronize()
    })
    .unwrap_err();
    println!("exchange mismatch: {e}");
    assert!(
        matches!(&e, Error::Dist { rank: 0, what, .. } if what.contains("256 bytes") && what.contains("260 bytes")),
        "{e}"
    );
    let start = Instant::now();
    let e = dist::run(world, settings, |rank| {
        if rank.rank() == 0 {
            let x = Tensor::from_f32(rank.gpu(), &[1.0; 64], &[64], DType::F32)?;
            rank.exchange_start(&[(&x, 1)], &[])?.finish()?;
        }
        rank.synchronize()
    })
    .unwrap_err();
    let took = start.elapsed();
    println!("exchange with an absent receiver: {e} after {took:?}");
    assert!(
        matches!(&e, Error::Dist { rank: 0, what, .. } if what.contains("timed out")),
        "{e}"
    );
    assert!(took < no_hang_bound(30), "took {took:?}");
}

#[derive(Clone, Copy, Debug)]
struct RingCase {
    batch: usize,
    heads: usize,
    chunk: usize,
    head_dim: usize,
    causal: bool,
    dtype: DType,
}

/// Ring attention's O, LSE and dQ/dK/dV, unsharded, against the f64 reference of the whole sequence
/// with the flash kernels' rule `max|x - ref| <= 2 max|naive - ref| + 1e-5`.
#[test]
fn ring_attention_matches_the_whole_sequence_reference() {
    let Some(world) = world_or_skip("ring attention", 1) else {
        return;
    };
    let mut r = rng("ring attention");
    let big = if common::sanitizing() { 64 } else { 300 };
    let cases = [
        RingCase {
            batch: 1,
            heads: 2,
            chunk: 97,
            head_dim: 64,
            causal: true,
            dtype: DType::F16,
        },
        RingCase {
            batch: 2,
            heads: 1,
            chunk: 64,
            head_dim: 128,
            causal: true,
            dtype: DType::BF16,
        },
        RingCase {
            batch: 1,
            heads: 2,
            chunk: 80,
            head_dim: 64,
            causal: false,
            dtype: DType::F16,
        },
        RingCase {
            batch: 1,
            heads: 1,
            chunk: big,
            head_dim: 128,
            causal: true,
            dtype: DType::F16,
        },
        RingCase {
            batch: 1,
            heads: 3,
            chunk: 33,
            head_dim: 64,
            causal: false,
            dtype: DType::BF16,
        },
    ];
    for c in cases {
        let s = 2 * world * c.chunk;
        let shape = [c.batch, c.heads, s, c.head_dim];
        let [q, k, v, d_o] = [0; 4].map(|_| uniform(&mut r, &shape, -1.0, 1.0, c.dtype));
        let params = AttentionParams {
            causal: if c.causal { Causal::Yes } else { Causal::No },
            scale: None,
            ..Default::default()
        };
        let want = reference::forward_and_naive(&q, &k, &v, &params).unwrap();
        let want_g = reference::backward_and_naive(&q, &k, &v, &d_o, &params).unwrap();
        let parts = dist::run(world, Settings::default(), |rank| {
            rank.gpu().set_poison_outputs(true);
            let up = |t: &HostTensor| {
                Tensor::from_host(rank.gpu(), &ring_attention::shard(t, world, rank.rank())?)
            };
            let (qs, ks, vs, dos) = (up(&q)?, up(&k)?, up(&v)?, up(&d_o)?);
            let (o, lse) = ring_attention::forward(rank, &qs, &ks, &vs, &params)?;
            let g = ring_attention::backward(rank, &qs, &ks, &vs, &o, &lse, &dos, &params)?;
            rank.synchronize()?;
            let mut out = Vec::new();
            for t in [o, lse, g.dq, g.dk, g.dv] {
                out.push(t.to_host()?);
            }
            Ok(out)
        })
        .unwrap();
        let whole = |i: usize| {
            let shards: Vec<HostTensor> = parts.iter().map(|p| p[i].clone()).collect();
            ring_attention::unshard(&shards).unwrap()
        };
        let mut ratios = Vec::new();
        for (i, what, exact, naive) in [
            (0, "O", &want.exact_o, &want.naive_o),
            (1, "LSE", &want.exact_lse, &want.naive_lse),
            (2, "dQ", &want_g.exact.dq, &want_g.naive.dq),
            (3, "dK", &want_g.exact.dk, &want_g.naive.dk),
            (4, "dV", &want_g.exact.dv, &want_g.naive.dv),
        ] {
            let out = whole(i);
            assert_eq!(out.shape, exact.shape, "{c:?} {what}");
            let err = max_abs_err(&out.data, &exact.data);
            let bound = 2.0 * max_abs_err(&naive.data, &exact.data) + 1e-5;
            assert!(
                err <= bound,
                "{c:?} world {world}: {what} max|x - ref| = {err:.3e} > {bound:.3e}"
            );
            ratios.push(format!("{what} {:.2}", err / bound));
        }
        println!("{c:?} world {world}: error / bound: {}", ratios.join(", "));
    }
}

#[test]
fn ring_attention_rejects_unsharded_operands() {
    let Some(world) = world_or_skip("ring attention errors", 1) else {
        return;
    };
    let errs = dist::run(world, Settings::default(), |rank| {
        let bhsd = Tensor::empty(rank.gpu(), &[1, 2, 64, 64], DType::F16)?;
        let shard = Tensor::empty(rank.gpu(), &[2, 1, 2, 32, 64], DType::F16)?;
        let other = Tensor::empty(rank.gpu(), &[2, 1, 2, 16, 64], DType::F16)?;
        let p = AttentionParams::default();
        Ok([
            ring_attention::forward(rank, &bhsd, &bhsd, &bhsd, &p)
                .err()
                .map(|e| e.to_string()),
            ring_attention::forward(rank, &shard, &other, &other, &p)
                .err()
                .map(|e| e.to_string()),
        ])
    })
    .unwrap();
    let [a, b] = &errs[0];
    assert!(
        a.as_deref().unwrap_or("").contains("zig-zag shard"),
        "{a:?}"
    );
    assert!(b.as_deref().unwrap_or("").contains("equal chunks"), "{b:?}");
}

/// The GPU-resident block (what data-parallel training runs) computes what the host executor's
/// all-GPU plan computes; data-parallel training follows one GPU at the same global batch, with
/// parameters bit-identical on every rank after every step.
#[test]
fn data_parallel_training_follows_one_gpu_at_the_global_batch() {
    let Some(world) = world_or_skip("data parallel", 1) else {
        return;
    };
    let seed = host::testing::seed("data parallel");
    let cfg = model::Config {
        vocab: 61,
        seq: 16,
        d_model: 64,
        d_ff: 48,
        batch: 2 * world,
        lr: 0.1,
    };
    let steps = 4;
    let params0 = model::init(&cfg, seed);
    let batch = model::batch(&cfg, seed ^ 1);
    let gpu = host::Gpu::new(0).unwrap();
    // The resident block against the op-by-op executor on the GPU (same kernels, host round trips).
    let device = Device::Gpu(gpu.clone());
    let (want_loss, want_grads) =
        model::loss_and_grads(&Exec::new(Plan::all_gpu(), &device), &cfg, &params0, &batch)
            .unwrap();
    let mut single = Block::new(&gpu, &cfg, &params0).unwrap();
    let (loss0, grads0) = single.loss_and_grads(&batch, &mut |_, _| Ok(())).unwrap();
    assert!(
        (loss0 - want_loss).abs() <= 1e-6 * want_loss.abs(),
        "resident loss {loss0} vs executor {want_loss}"
    );
    let got = resident::grads_to_host(&grads0, &cfg).unwrap();
    for ((name, a), (_, b)) in got.named().iter().zip(want_grads.named()) {
        let e = common::rel_err(&a.data, &b.data);
        assert!(
            e < 1e-5,
            "{name}: resident vs executor gradient differ by {e:.2e}"
        );
    }
    // One GPU, the whole batch, no NCCL.
    let mut want = vec![loss0];
    single.sgd(&grads0, cfg.lr).unwrap();
    for _ in 1..steps {
        let (loss, grads) = single.loss_and_grads(&batch, &mut |_, _| Ok(())).unwrap();
        single.sgd(&grads, cfg.lr).unwrap();
        want.push(loss);
    }
    // Small buckets, so that several are reduced during the backward.
    let settings = data_parallel::Settings { bucket_bytes: 4096 };
    let runs = dist::run(world, Settings::default(), |rank| {
        let (local_cfg, local_batch) =
            data_parallel::split_batch(&cfg, &batch, world, rank.rank())?;
        let mut dp = data_parallel::DataParallel::new(rank, &local_cfg, &params0, &settings)?;
        let mut out = Vec::new();
        for _ in 0..steps {
            let s = dp.step(&local_batch)?;
            out.push((s.loss, s.overlapped_buckets, s.buckets, dp.params()?));
        }
        Ok(out)
    })
    .unwrap();
    for step in 0..steps {
        let (loss, overlapped, buckets, ref p0) = runs[0][step];
        for (r, run) in runs.iter().enumerate() {
            assert!(
                run[step].3 == *p0,
                "step {step}: rank {r}'s parameters differ from rank 0's"
            );
            assert_eq!(
                run[step].0, loss,
                "step {step}: rank {r} reports another global loss"
            );
        }
        let w = want[step];
        println!(
            "step {step}: data-parallel loss {loss:.7} one GPU {w:.7} ({overlapped} of {buckets} buckets overlapped)"
        );
        assert!(
            (loss - w).abs() <= 1e-5 * w.abs(),
            "step {step}: loss {loss} vs one GPU {w}"
        );
        assert!(
            buckets > 2 && overlapped >= 1,
            "{overlapped} of {buckets} buckets overlapped"
        );
    }
    let last = &runs[0][steps - 1].3;
    let single = single.params().unwrap();
    for ((name, a), (_, b)) in last.named().iter().zip(single.named()) {
        let e = common::rel_err(&a.data, &b.data);
        assert!(
            e < 1e-4,
            "{name}: data-parallel vs one-GPU parameters differ by {e:.2e}"
        );
    }
}

/// The one-GPU flash result and ring attention on one GPU (a group of one: every pair in one step)
/// agree within the forward's rule, so a ring of one is a drop-in for `flash_forward`.
#[test]
fn a_ring_of_one_matches_flash_forward() {
    let Some(_) = world_or_skip("ring of one", 1) else {
        return;
    };
    let mut r = rng("ring of one");
    let shape = [1, 2, 2 * 129, 64];
    let [q, k, v] = [0; 3].map(|_| uniform(&mut r, &shape, -1.0, 1.0, DType::F16));
    let params = AttentionParams {
        causal: Causal::Yes,
        scale: Some(0.3),
        ..Default::default()
    };
    let want = reference::forward_and_naive(&q, &k, &v, &params).unwrap();
    let out = dist::run(1, Settings::default(), |rank| {
        let g = rank.gpu();
        let (of, _) = attention::flash_forward(
            &Tensor::from_host(g, &q)?,
            &Tensor::from_host(g, &k)?,
            &Tensor::from_host(g, &v)?,
            &params,
        )?;
        let up = |t: &HostTensor| Tensor::from_host(g, &ring_attention::shard(t, 1, 0)?);
        let (o, _) = ring_attention::forward(rank, &up(&q)?, &up(&k)?, &up(&v)?, &params)?;
        rank.synchronize()?;
        Ok((of.to_vec()?, ring_attention::unshard(&[o.to_host()?])?.data))
    })
    .unwrap();
    let (flash, ring) = &out[0];
    let bound = 2.0 * max_abs_err(&want.naive_o.data, &want.exact_o.data) + 1e-5;
    for (what, x) in [("flash", flash), ("ring", ring)] {
        let e = max_abs_err(x, &want.exact_o.data);
        assert!(e <= bound, "{what}: {e:.3e} > {bound:.3e}");
    }
}
