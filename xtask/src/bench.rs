//! `cargo xtask bench`: the cold-start rows (`cargo xtask coldstart`: `Gpu::new` + the first call of
//! each op family in fresh processes, unless `--filter` narrows the run), our GPU-timed criterion
//! benches (CUDA events on the ops' stream), the PyTorch peers measured on the same card in the same
//! invocation (bench/peers.py), and the merged report (bench/report.py: report.md, report.json,
//! ratio.svg, roofline.svg; coldstart.md beside them).
//!
//! Peers are timed with `--hide-launch` (a short spin kernel queued first), so their samples are GPU
//! time like ours: criterion runs many launches between two events, which hides our launch cost too.
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::{Args, Flag, Spec, run_checked, which, workspace_root};

/// Bench executables of `cargo bench --no-run --message-format=json` output.
fn bench_executable(json_lines: &str) -> Option<PathBuf> {
    json_lines
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["reason"] == "compiler-artifact" && v["target"]["kind"][0] == "bench")
        .find_map(|v| v["executable"].as_str().map(PathBuf::from))
}

/// Builds the criterion bench binary and returns its path.
pub fn build_bench_binary(root: &Path) -> Result<PathBuf, String> {
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(root)
        .args([
            "bench",
            "--no-run",
            "--message-format=json",
            "-p",
            "benches",
        ])
        .output()
        .map_err(|e| format!("could not run cargo: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "building the benches failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    bench_executable(&String::from_utf8_lossy(&out.stdout))
        .ok_or_else(|| "cargo built no bench executable".into())
}

pub const SPEC: Spec = Spec {
    task: "bench",
    summary: "GPU-timed benches, PyTorch peers, merged report (JSON, Markdown, SVG)",
    positionals: &[],
    flags: &[
        Flag {
            name: "--bins",
            value: Some("DIR"),
            help: "the bench binary and scripts of a bundle instead of building them",
        },
        Flag {
            name: "--out",
            value: Some("DIR"),
            help: "report folder (default target/bench-report)",
        },
        Flag {
            name: "--quick",
            value: None,
            help: "fewer samples (RGK_BENCH_QUICK=1, peers --quick)",
        },
        Flag {
            name: "--no-peers",
            value: None,
            help: "skip the PyTorch peers",
        },
        Flag {
            name: "--filter",
            value: Some("REGEX"),
            help: "only our benches matching REGEX (criterion's filter)",
        },
        Flag {
            name: "--peers-only",
            value: Some("PREFIX,.."),
            help: "only the peers whose bench names start with one of these",
        },
        Flag {
            name: "--peer-names",
            value: Some("NAME,.."),
            help: "only these peers (e.g. sdpa-cudnn,torch-eager)",
        },
        Flag {
            name: "--peers-timeout",
            value: Some("S"),
            help: "stop the peers after S seconds, keeping what finished",
        },
    ],
};

pub fn run(args: &Args) -> Result<(), String> {
    let out = PathBuf::from(args.value("--out").unwrap_or("target/bench-report"));
    std::fs::create_dir_all(&out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let out = out.canonicalize().map_err(|e| e.to_string())?;
    let quick = args.has("--quick");
    let (bench_bin, scripts) = match args.value("--bins") {
        Some(dir) => (
            Path::new(dir).join("bench").join("ops"),
            Path::new(dir).join("bench"),
        ),
        None => {
            let root = workspace_root().ok_or("no source tree: pass --bins DIR (a bundle)")?;
            (build_bench_binary(&root)?, root.join("bench"))
        }
    };
    if args.value("--filter").is_none() {
        crate::coldstart::measure(args.value("--bins").map(Path::new), &out, 3)?;
    }
    let ours = out.join("ours.json");
    println!("bench: our kernels ({}) ...", bench_bin.display());
    let mut cmd = Command::new(&bench_bin);
    cmd.arg("--bench")
        .env("CRITERION_HOME", out.join("criterion"))
        .env("RGK_BENCH_JSON", &ours);
    if quick {
        cmd.env("RGK_BENCH_QUICK", "1");
    }
    if let Some(filter) = args.value("--filter") {
        cmd.arg(filter);
    }
    run_checked(&mut cmd)?;
    if !ours.is_file() {
        // The bench binary printed why (e.g. `SKIP benches: no CUDA device`); peers alone compare nothing.
        return Err(format!(
            "no results of ours in {} (no GPU?); nothing to report",
            ours.display()
        ));
    }
    let Some(python) = which("python3") else {
        println!(
            "python3 not found: peers missing; our results are in {}",
            ours.display()
        );
        return Ok(());
    };
    let peers = out.join("peers.json");
    if !args.has("--no-peers") {
        println!("bench: PyTorch peers ...");
        // `--peers-timeout SECS` bounds the peers (they rewrite their JSON after every result, so what
        // finished is kept): a device call has a hard time limit and the report must still be made.
        let mut cmd = match args.value("--peers-timeout") {
            Some(secs) if which("timeout").is_some() => {
                let mut c = Command::new("timeout");
                c.arg(secs).arg(&python);
                c
            }
            _ => Command::new(&python),
        };
        cmd.arg(scripts.join("peers.py"))
            .arg("--out")
            .arg(&peers)
            .arg("--hide-launch")
            .env("PYTHONUNBUFFERED", "1");
        if quick {
            cmd.arg("--quick");
        }
        // `--peers-only a,b`: bench-name prefixes for the peers (criterion's `--filter` is a regex the
        // peers script does not read).
        if let Some(only) = args.value("--peers-only") {
            cmd.arg("--only").arg(only);
        }
        if let Some(names) = args.value("--peer-names") {
            cmd.arg("--peer").arg(names);
        }
        if let Err(e) = run_checked(&mut cmd) {
            println!("peers failed ({e}); the report marks them missing");
        }
    }
    let mut cmd = Command::new(&python);
    cmd.arg(scripts.join("report.py"))
        .arg("--ours")
        .arg(&ours)
        .arg("--out-dir")
        .arg(&out);
    if !peers.is_file() {
        // report.py takes a peers file; without peers every row says "peer missing".
        std::fs::write(
            &peers,
            r#"{"schema": "rgk-bench-v1", "device": "none", "results": []}"#,
        )
        .map_err(|e| e.to_string())?;
    }
    cmd.arg("--peers").arg(&peers);
    run_checked(&mut cmd)?;
    println!("bench: report in {}", out.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn bench_executable_is_the_bench_target() {
        let l = r#"{"reason":"compiler-artifact","target":{"kind":["lib"]},"executable":null}
{"reason":"compiler-artifact","target":{"kind":["bench"]},"executable":"/t/ops-1"}"#;
        assert_eq!(super::bench_executable(l), Some("/t/ops-1".into()));
    }
}
