//! `cargo xtask dist`: the multi-GPU checks on every GPU of the machine. Runs the `gpu_dist` tests
//! (collectives, failure handling, ring attention and data-parallel training against their one-GPU
//! references), then the `dist_bench` example (all-reduce, ring attention and data-parallel scaling,
//! each beside its one-GPU baseline) and PyTorch's NCCL all-reduce (`bench/dist_peers.py`) in the
//! same call, and writes `dist.md` (the tables with ratios against the goals) and the JSON beside it.
//! NVLink multicast stays off (`NCCL_NVLS_ENABLE=0`) for every process it starts.
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::{Args, Flag, Spec, run_checked, workspace_root};

pub const SPEC: Spec = Spec {
    task: "dist",
    summary: "multi-GPU tests and benches (ring attention, all-reduce vs PyTorch, data parallel)",
    positionals: &[],
    flags: &[
        Flag {
            name: "--bins",
            value: Some("DIR"),
            help: "a bundle's binaries (tests/gpu_dist, dist_bench, bench/dist_peers.py) instead of building",
        },
        Flag {
            name: "--out",
            value: Some("DIR"),
            help: "report folder (default target/dist-report)",
        },
        Flag {
            name: "--quick",
            value: None,
            help: "small sizes only (a smoke run)",
        },
        Flag {
            name: "--no-tests",
            value: None,
            help: "benches only",
        },
    ],
};

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

/// (the gpu_dist test binary, dist_bench, dist_peers.py)
fn binaries(args: &Args) -> Result<(PathBuf, PathBuf, PathBuf), String> {
    if let Some(dir) = args.value("--bins") {
        let d = PathBuf::from(dir);
        return Ok((
            d.join("tests/gpu_dist"),
            d.join("dist_bench"),
            d.join("bench/dist_peers.py"),
        ));
    }
    let root = workspace_root().ok_or("dist needs the source tree or --bins")?;
    run_checked(Command::new(cargo()).current_dir(&root).args([
        "build",
        "--release",
        "-p",
        "host",
        "--example",
        "dist_bench",
    ]))?;
    let tests = crate::util::build_test_binaries(&root)?
        .into_iter()
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("gpu_dist-"))
        })
        .ok_or("the gpu_dist test binary was not built")?;
    Ok((
        tests,
        root.join("target/release/examples/dist_bench"),
        root.join("bench/dist_peers.py"),
    ))
}

fn nvls_off(cmd: &mut Command) -> &mut Command {
    cmd.env("NCCL_NVLS_ENABLE", "0")
        .env("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
        .env("NVSHMEM_DISABLE_NVLS", "1")
}

pub fn run(args: &Args) -> Result<(), String> {
    let out = args.value("--out").map_or_else(
        || {
            workspace_root()
                .unwrap_or_else(|| PathBuf::from("."))
                .join("target/dist-report")
        },
        PathBuf::from,
    );
    std::fs::create_dir_all(&out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let (tests, bench, peers) = binaries(args)?;
    let quick = args.has("--quick");
    let mut failed = Vec::new();
    if !args.has("--no-tests") {
        println!("dist: {} (every visible GPU) ...", tests.display());
        let log = out.join("gpu_dist.log");
        let status = nvls_off(Command::new(&tests).args(["--test-threads=1", "--nocapture"]))
            .stdout(file(&log)?)
            .stderr(file(&out.join("gpu_dist.stderr"))?)
            .status()
            .map_err(|e| format!("could not run {}: {e}", tests.display()))?;
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        for line in text
            .lines()
            .filter(|l| l.contains("test result") || l.contains("SKIP"))
        {
            println!("  {line}");
        }
        if !status.success() {
            failed.push("gpu_dist tests");
        }
    }
    let gpus = host::dist::gpu_count();
    if gpus == 0 {
        return Err(format!(
            "dist: no GPU visible{}; the benches need at least one (two or more to measure scaling)",
            if args.has("--no-tests") {
                ""
            } else {
                " (the tests above printed SKIP)"
            }
        ));
    }
    println!("dist: {} on {gpus} GPU(s) ...", bench.display());
    let ours_json = out.join("dist_bench.json");
    let mut cmd = Command::new(&bench);
    cmd.arg("--out").arg(&ours_json);
    if quick {
        cmd.arg("--quick");
    }
    if run_checked(nvls_off(&mut cmd)).is_err() {
        failed.push("dist_bench");
    }
    println!("dist: {} (PyTorch's NCCL all-reduce) ...", peers.display());
    let peer_json = out.join("dist_peers.json");
    let mut cmd = Command::new("python3");
    cmd.arg(&peers).arg("--out").arg(&peer_json);
    if quick {
        cmd.arg("--quick");
    }
    if run_checked(nvls_off(&mut cmd).stdout(std::process::Stdio::null())).is_err() {
        failed.push("dist_peers.py");
    }
    let report = report(&ours_json, &peer_json)?;
    std::fs::write(out.join("dist.md"), &report)
        .map_err(|e| format!("cannot write dist.md: {e}"))?;
    println!("\n{report}\nwrote {}", out.join("dist.md").display());
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("dist: failed: {}", failed.join(", ")))
    }
}

fn file(p: &Path) -> Result<std::fs::File, String> {
    std::fs::File::create(p).map_err(|e| format!("cannot create {}: {e}", p.display()))
}

fn read(p: &Path) -> Option<serde_json::Value> {
    serde_json::from_str(&std::fs::read_to_string(p).ok()?).ok()
}

/// The tables with the goals: all-reduce bus bandwidth ours / PyTorch (>= 0.9), ring attention
/// parallel efficiency (>= 0.85), data-parallel scaling efficiency (>= 0.9).
fn report(ours: &Path, peers: &Path) -> Result<String, String> {
    let o = read(ours).ok_or_else(|| format!("no results in {}", ours.display()))?;
    let p = read(peers);
    let mut s = format!(
        "# Multi-GPU: {} x {}, NCCL {} (ours){}\n",
        o["world"],
        o["device"].as_str().unwrap_or("?"),
        o["nccl"].as_str().unwrap_or("?"),
        p.as_ref()
            .map(|p| format!(
                "; PyTorch {} with NCCL {}",
                p["torch"].as_str().unwrap_or("?"),
                p["nccl"].as_str().unwrap_or("?")
            ))
            .unwrap_or_default()
    );
    if let Some(rows) = o["all_reduce"].as_array() {
        s.push_str("\n## All-reduce, f32, in place (goal: bus bandwidth >= 0.9x PyTorch's)\n\n| size | ours us | ours bus GB/s | PyTorch us | PyTorch bus GB/s | ours / PyTorch |\n|---|---|---|---|---|---|\n");
        for r in rows {
            let bytes = r["bytes"].as_u64().unwrap_or(0);
            let peer = p.as_ref().and_then(|p| {
                p["all_reduce"]
                    .as_array()?
                    .iter()
                    .find(|x| x["bytes"].as_u64() == Some(bytes))
                    .cloned()
            });
            let (ot, ob) = (
                r["time_s"].as_f64().unwrap_or(0.0),
                r["bus_gbps"].as_f64().unwrap_or(0.0),
            );
            match peer {
                Some(x) => {
                    let (pt, pb) = (
                        x["time_s"].as_f64().unwrap_or(0.0),
                        x["bus_gbps"].as_f64().unwrap_or(0.0),
                    );
                    s.push_str(&format!(
                        "| {} MiB | {:.1} | {:.1} | {:.1} | {:.1} | {:.3}x |\n",
                        bytes >> 20,
                        ot * 1e6,
                        ob,
                        pt * 1e6,
                        pb,
                        ob / pb
                    ));
                }
                None => s.push_str(&format!(
                    "| {} MiB | {:.1} | {:.1} | - | - | - |\n",
                    bytes >> 20,
                    ot * 1e6,
                    ob
                )),
            }
        }
    }
    if let Some(rows) = o["ring_attention"].as_array() {
        s.push_str("\n## Ring attention, causal, B1 H16 D128 f16 (goal: parallel efficiency >= 0.85)\n\n| pass | per-GPU L | total S | one GPU at L ms | all GPUs at S ms | efficiency n T1 / Tn | a rank's flash calls alone, one GPU, ms |\n|---|---|---|---|---|---|---|\n");
        for r in rows {
            s.push_str(&format!(
                "| {} | {} | {} | {:.2} | {:.2} | {:.3} | {} |\n",
                r["pass"].as_str().unwrap_or("?"),
                r["per_gpu_len"],
                r["total_len"],
                r["one_gpu_s"].as_f64().unwrap_or(0.0) * 1e3,
                r["n_gpu_s"].as_f64().unwrap_or(0.0) * 1e3,
                r["efficiency"].as_f64().unwrap_or(0.0),
                r["pieces_alone_s"]
                    .as_f64()
                    .map_or("-".to_string(), |t| format!("{:.2}", t * 1e3))
            ));
        }
    }
    if let Some(rows) = o["data_parallel"].as_array() {
        s.push_str("\n## Data-parallel step of the transformer block, resident on the GPU (goal: scaling efficiency >= 0.9)\n\n| sequences x tokens a GPU | GPUs | one GPU (no NCCL) ms | data-parallel step ms | efficiency T1 / Tn |\n|---|---|---|---|---|\n");
        for r in rows {
            s.push_str(&format!(
                "| {} x {} | {} | {:.2} | {:.2} | {:.3} |\n",
                r["sequences"],
                r["seq"],
                r["gpus"],
                r["one_gpu_s"].as_f64().unwrap_or(0.0) * 1e3,
                r["step_s"].as_f64().unwrap_or(0.0) * 1e3,
                r["efficiency"].as_f64().unwrap_or(0.0)
            ));
        }
    }
    Ok(s)
}
