//! Multi-GPU benchmarks over every visible GPU, each beside its one-GPU baseline in the same process:
//!
//! - **all-reduce**: f32 sum, in place, 1 MiB to 1 GiB; bus bandwidth as nccl-tests defines it
//!   (`bytes * 2 (n - 1) / n / time`), timed with CUDA events around 20 back-to-back calls;
//! - **ring attention**: causal, B1 H16 D128 f16, total length S of 64k, 128k and 256k (per-GPU
//!   length `L = S / n`), forward and forward + backward; parallel efficiency `n T1(L) / Tn(S)`
//!   where `T1(L)` is one GPU's `flash_forward` (+ `flash_backward`) at length L: the n GPUs do n
//!   times one GPU's work at L (causal work grows as S^2), so perfect scaling takes the same time;
//! - **data-parallel step** of the `replace` transformer block, resident on the GPU: a fixed batch
//!   per GPU; scaling efficiency `T1 / Tn` with `T1` one GPU's step of the same block (no NCCL) at
//!   that batch.
//!
//! Times are medians over iterations; a multi-GPU iteration is the slowest rank's wall time between
//! a barrier and its `synchronize`. `cargo run --release -p host --example dist_bench -- [--quick]
//! [--only allreduce,ring,dp] [--out FILE.json]`; `cargo xtask dist` runs it with PyTorch's NCCL
//! all-reduce as the peer.
use std::time::{Duration, Instant};

use host::dist::{self, ReduceOp, Settings, data_parallel, ring_attention};
use host::ops::attention::{self, AttentionParams, Causal};
use host::replace::model;
use host::replace::model::resident::Block;
use host::{DType, Gpu, HostTensor, Tensor};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let only = value("--only").unwrap_or_else(|| "allreduce,ring,dp".into());
    let out = value("--out");
    match run(quick, &only) {
        Ok(json) => {
            if let Some(path) = out {
                if let Err(e) = std::fs::write(&path, &json) {
                    eprintln!("dist_bench: cannot write {path}: {e}");
                    std::process::exit(1);
                }
                println!("wrote {path}");
            }
        }
        Err(e) => {
            eprintln!("dist_bench: {e}");
            std::process::exit(1);
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Deterministic inputs in [-1, 1) (the values do not change the timing).
fn inputs(shape: &[usize], dtype: DType, salt: u64) -> host::Result<HostTensor> {
    let n: usize = shape.iter().product();
    let data = (0..n as u64)
        .map(|i| {
            ((i ^ salt).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) as f32 / (1u64 << 23) as f32
                - 1.0
        })
        .collect();
    HostTensor::new(data, shape, dtype)
}

fn run(quick: bool, only: &str) -> host::Result<String> {
    let world = dist::gpu_count();
    let info = dist::nccl_info()?;
    let gpu0 = Gpu::new(0)?;
    println!(
        "dist_bench: {world} x {}, NCCL {}.{}.{} ({})",
        gpu0.name(),
        info.version.0,
        info.version.1,
        info.version.2,
        info.library
    );
    let mut json = Vec::new();
    if only.contains("allreduce") {
        json.push(all_reduce(world, quick)?);
    }
    if only.contains("ring") {
        json.push(ring(world, &gpu0, quick)?);
    }
    if only.contains("dp") {
        json.push(data_parallel_step(world, &gpu0, quick)?);
    }
    Ok(format!(
        "{{\"world\": {world}, \"device\": \"{}\", \"nccl\": \"{}.{}.{}\", {}}}",
        gpu0.name(),
        info.version.0,
        info.version.1,
        info.version.2,
        json.join(", ")
    ))
}

fn all_reduce(world: usize, quick: bool) -> host::Result<String> {
    let sizes: &[usize] = if quick {
        &[1 << 20, 64 << 20]
    } else {
        &[1 << 20, 8 << 20, 64 << 20, 256 << 20, 1 << 30]
    };
    println!("\n| all-reduce f32 sum | time us | bus GB/s |\n|---|---|---|");
    let mut rows = Vec::new();
    for &bytes in sizes {
        let n = bytes / 4;
        let iters = 20;
        let per_rank = dist::run(world, Settings::default(), |rank| {
            let x = Tensor::from_host(rank.gpu(), &inputs(&[n], DType::F32, rank.rank() as u64)?)?;
            // Values stay finite: an average keeps them in range over repeated calls.
            for _ in 0..5 {
                rank.all_reduce(&x, ReduceOp::Avg)?;
            }
            rank.synchronize()?;
            rank.barrier()?;
            let s = rank.gpu().stream();
            let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
            let e0 = s.record_event(flags).map_err(|e| host::Error::Invalid {
                op: "bench",
                msg: format!("{e:?}"),
            })?;
            for _ in 0..iters {
                rank.all_reduce(&x, ReduceOp::Avg)?;
            }
            let e1 = s.record_event(flags).map_err(|e| host::Error::Invalid {
                op: "bench",
                msg: format!("{e:?}"),
            })?;
            rank.synchronize()?;
            let ms = e0.elapsed_ms(&e1).map_err(|e| host::Error::Invalid {
                op: "bench",
                msg: format!("{e:?}"),
            })?;
            Ok(ms as f64 / 1e3 / iters as f64)
        })?;
        let t = per_rank.iter().cloned().fold(0.0, f64::max);
        let bus = bytes as f64 * 2.0 * (world as f64 - 1.0) / world as f64 / t / 1e9;
        println!("| {} MiB | {:.1} | {:.1} |", bytes >> 20, t * 1e6, bus);
        rows.push(format!(
            "{{\"bytes\": {bytes}, \"time_s\": {t:.9}, \"bus_gbps\": {bus:.3}}}"
        ));
    }
    Ok(format!("\"all_reduce\": [{}]", rows.join(", ")))
}

fn ring(world: usize, gpu0: &Gpu, quick: bool) -> host::Result<String> {
    let (b, h, d) = (1, 16, 128);
    // The goal's total lengths (64k to 256k), whatever the GPU count: each GPU holds S / n.
    let totals: &[usize] = if quick {
        &[8192 * world]
    } else {
        &[65536, 131072, 262144]
    };
    let (warm, iters) = if quick { (1, 3) } else { (2, 5) };
    let params = AttentionParams {
        causal: Causal::Yes,
        scale: None,
        ..Default::default()
    };
    println!(
        "\n| ring attention causal B{b} H{h} D{d} f16 | S total | one GPU at L ms | {world} GPUs ms | efficiency |\n|---|---|---|---|---|"
    );
    let mut rows = Vec::new();
    for &total in totals {
        let l = total / world;
        // One GPU at the per-GPU length.
        let shape = [b, h, l, d];
        let [q, k, v, d_o] = [1u64, 2, 3, 4]
            .map(|s| inputs(&shape, DType::F16, s).and_then(|t| Tensor::from_host(gpu0, &t)));
        let (q, k, v, d_o) = (q?, k?, v?, d_o?);
        let mut one = [Vec::new(), Vec::new()];
        for i in 0..warm + iters {
            gpu0.synchronize()?;
            let t = Instant::now();
            let (o, lse) = attention::flash_forward(&q, &k, &v, &params)?;
            gpu0.synchronize()?;
            let t_fwd = t.elapsed().as_secs_f64();
            let g = attention::flash_backward(&q, &k, &v, &o, &lse, &d_o, &params)?;
            gpu0.synchronize()?;
            let t_all = t.elapsed().as_secs_f64();
            drop(g);
            if i >= warm {
                one[0].push(t_fwd);
                one[1].push(t_all);
            }
        }
        drop((q, k, v, d_o));
        // The flash calls one rank makes in the ring forward (every rank does equal work), run back
        // to back on one GPU with no exchange and no merge: what the ring's kernels cost alone.
        let pieces = {
            let c = l / 2;
            let shape = [b, h, c, d];
            let [q, k, v] = [5u64, 6, 7]
                .map(|s| inputs(&shape, DType::F16, s).and_then(|t| Tensor::from_host(gpu0, &t)));
            let (q, k, v) = (q?, k?, v?);
            let mut times = Vec::new();
            for i in 0..warm + iters {
                gpu0.synchronize()?;
                let t = Instant::now();
                for step in 0..world {
                    for pair in ring_attention::step_pairs(world, 0, step, true) {
                        let p = AttentionParams {
                            causal: if pair.causal { Causal::Yes } else { Causal::No },
                            scale: None,
                            ..Default::default()
                        };
                        drop(attention::flash_forward(&q, &k, &v, &p)?);
                    }
                }
                gpu0.synchronize()?;
                if i >= warm {
                    times.push(t.elapsed().as_secs_f64());
                }
            }
            median(times)
        };
        // n GPUs at n L: each rank makes its own shards (the values do not change the timing, and
        // the whole sequence at 256k tokens would cost gigabytes of host memory).
        let s = world * l;
        let local = [2, b, h, l / 2, d];
        let settings = Settings {
            timeout: Duration::from_secs(300),
        };
        let per_rank = dist::run(world, settings, |rank| {
            let g = rank.gpu();
            let x: Vec<Tensor> = [1u64, 2, 3, 4]
                .iter()
                .map(|&salt| {
                    Tensor::from_host(
                        g,
                        &inputs(&local, DType::F16, salt + 8 * rank.rank() as u64)?,
                    )
                })
                .collect::<host::Result<_>>()?;
            let mut times = [Vec::new(), Vec::new()];
            for i in 0..warm + iters {
                rank.barrier()?;
                let t = Instant::now();
                let (o, lse) = ring_attention::forward(rank, &x[0], &x[1], &x[2], &params)?;
                rank.synchronize()?;
                let t_fwd = t.elapsed().as_secs_f64();
                let gr =
                    ring_attention::backward(rank, &x[0], &x[1], &x[2], &o, &lse, &x[3], &params)?;
                rank.synchronize()?;
                let t_all = t.elapsed().as_secs_f64();
                drop(gr);
                if i >= warm {
                    times[0].push(t_fwd);
                    times[1].push(t_all);
                }
            }
            Ok(times)
        })?;
        for (which, name) in [(0, "forward"), (1, "forward+backward")] {
            let t1 = median(one[which].clone());
            let tn = median(
                (0..iters)
                    .map(|i| per_rank.iter().map(|t| t[which][i]).fold(0.0, f64::max))
                    .collect(),
            );
            let eff = world as f64 * t1 / tn;
            // Forward only: the ring's flash calls alone on one GPU.
            let (alone_md, alone_json) = if which == 0 {
                (
                    format!(" its flash calls alone on one GPU: {:.2} ms", pieces * 1e3),
                    format!(", \"pieces_alone_s\": {pieces:.6}"),
                )
            } else {
                (String::new(), String::new())
            };
            println!(
                "| {name} L={l} | {s} | {:.2} | {:.2} | {:.3} |{alone_md}",
                t1 * 1e3,
                tn * 1e3,
                eff,
            );
            rows.push(format!(
                "{{\"pass\": \"{name}\", \"per_gpu_len\": {l}, \"total_len\": {s}, \"one_gpu_s\": {t1:.6}, \"n_gpu_s\": {tn:.6}, \"efficiency\": {eff:.4}{alone_json}}}"
            ));
        }
    }
    Ok(format!("\"ring_attention\": [{}]", rows.join(", ")))
}

fn data_parallel_step(world: usize, gpu0: &Gpu, quick: bool) -> host::Result<String> {
    // 16 and 32 sequences of 1024 tokens a GPU: enough work that a step is the GPU's, not the
    // launches'.
    let mut rows = Vec::new();
    println!(
        "\n| data-parallel step, sequences x tokens a GPU | GPUs | ms | scaling efficiency |\n|---|---|---|---|"
    );
    for per_gpu in if quick { vec![4] } else { vec![16, 32] } {
        rows.extend(data_parallel_case(world, gpu0, quick, per_gpu)?);
    }
    Ok(format!("\"data_parallel\": [{}]", rows.join(", ")))
}

fn data_parallel_case(
    world: usize,
    gpu0: &Gpu,
    quick: bool,
    per_gpu: usize,
) -> host::Result<Vec<String>> {
    let cfg_local = model::Config {
        vocab: 4096,
        seq: 1024,
        d_model: 128,
        d_ff: 512,
        batch: per_gpu,
        lr: 0.05,
    };
    let (warm, iters) = if quick { (2, 5) } else { (3, 15) };
    let params0 = model::init(&cfg_local, 11);
    let batch0 = model::batch(&cfg_local, 12);
    // One GPU, no NCCL: the resident block's step at the per-GPU batch.
    let mut block = Block::new(gpu0, &cfg_local, &params0)?;
    let mut one = Vec::new();
    for i in 0..warm + iters {
        gpu0.synchronize()?;
        let t = Instant::now();
        let (_, g) = block.loss_and_grads(&batch0, &mut |_, _| Ok(()))?;
        block.sgd(&g, cfg_local.lr)?;
        gpu0.synchronize()?;
        if i >= warm {
            one.push(t.elapsed().as_secs_f64());
        }
    }
    drop(block);
    let t1 = median(one);
    let settings = data_parallel::Settings::default();
    let mut rows = Vec::new();
    let tokens = format!("{per_gpu} x {}", cfg_local.seq);
    println!("| {tokens}: one GPU, no NCCL | 1 | {:.3} | 1 |", t1 * 1e3);
    for n in [1, world] {
        let global = model::Config {
            batch: per_gpu * n,
            ..cfg_local
        };
        let batch_n = model::batch(&global, 12);
        let runs = dist::run(n, Settings::default(), |rank| {
            let (c, b) = data_parallel::split_batch(&global, &batch_n, n, rank.rank())?;
            let mut dp = data_parallel::DataParallel::new(rank, &c, &params0, &settings)?;
            let mut out = Vec::new();
            for i in 0..warm + iters {
                rank.barrier()?;
                let t = Instant::now();
                let s = dp.step(&b)?;
                rank.synchronize()?;
                if i >= warm {
                    out.push((t.elapsed().as_secs_f64(), s));
                }
            }
            Ok(out)
        })?;
        let tn = median(
            (0..iters)
                .map(|i| runs.iter().map(|r| r[i].0).fold(0.0, f64::max))
                .collect(),
        );
        let s = &runs[0][iters - 1].1;
        // Host time to queue the forward and backward (it includes the step's one mid-step wait
        // for the GPU), slowest rank: where it nears the step time, the step is host-bound.
        let queue = median(
            (0..iters)
                .map(|i| runs.iter().map(|r| r[i].1.backward_s).fold(0.0, f64::max))
                .collect(),
        );
        println!(
            "| data parallel ({} of {} buckets queued during the backward; host queues the step in {:.3} ms) | {n} | {:.3} | {:.3} |",
            s.overlapped_buckets,
            s.buckets,
            queue * 1e3,
            tn * 1e3,
            t1 / tn
        );
        rows.push(format!(
            "{{\"sequences\": {per_gpu}, \"seq\": {}, \"gpus\": {n}, \"one_gpu_s\": {t1:.6}, \"step_s\": {tn:.6}, \"efficiency\": {:.4}, \"buckets\": {}, \"overlapped\": {}, \"queue_s\": {queue:.6}}}",
            cfg_local.seq, t1 / tn, s.buckets, s.overlapped_buckets
        ));
        if world == 1 {
            break;
        }
    }
    Ok(rows)
}
