//! `cargo xtask sanitize`: every GPU test binary under compute-sanitizer's memcheck, racecheck,
//! initcheck and synccheck; one summary table; non-zero exit on any finding or test failure.
//!
//! Works from the source tree (builds the release test binaries first) and from a bundle on a GPU
//! machine without Rust (`--bins DIR` with the binaries in DIR/tests). The tests run with
//! `RGK_SANITIZE=1`, which shrinks their fuzz loops and largest sizes: the sanitizer slows kernels by
//! 10-100x, and coverage comes from the shapes (odd, prime, ragged tails), not from their count.
//!
//! `--jobs N` (N > 1) runs each test of a binary in its own compute-sanitizer process, N at a time.
//! The processes share the GPU but overlap the tool's host-side work and the tests' CPU references, and
//! each test's log (`LOG_DIR/TOOL-BINARY/TEST.log`) is written as soon as it ends, so a run cut short
//! still says which tests were clean. The binary's row sums the findings of its tests.
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::util::{
    Args, Flag, Progress, Spec, build_test_binaries, executables_in, which, workspace_root,
};

const ALL_TOOLS: [&str; 4] = ["memcheck", "racecheck", "initcheck", "synccheck"];

/// Test binaries that launch kernels (the others — unit tests, ptx checks — need no sanitizer).
fn is_gpu_test(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("gpu_") || n.starts_with("bad_input"))
}

pub fn find_compute_sanitizer() -> Option<PathBuf> {
    which("compute-sanitizer").or_else(|| {
        [
            "/usr/local/cuda/bin/compute-sanitizer",
            "/usr/local/cuda/compute-sanitizer/compute-sanitizer",
        ]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
    })
}

struct Row {
    binary: String,
    tool: String,
    findings: Option<u64>,
    tests_ok: bool,
    seconds: f64,
}

pub const SPEC: Spec = Spec {
    task: "sanitize",
    summary: "run the GPU tests under compute-sanitizer; summary table; exit 1 on findings",
    positionals: &[],
    flags: &[
        Flag {
            name: "--bins",
            value: Some("DIR"),
            help: "test binaries in DIR/tests (a bundle) instead of building them",
        },
        Flag {
            name: "--tools",
            value: Some("LIST"),
            help: "some of memcheck,racecheck,initcheck,synccheck (default: all)",
        },
        Flag {
            name: "--only",
            value: Some("PREFIX,.."),
            help: "only the test binaries whose names start with one of these",
        },
        Flag {
            name: "--log-dir",
            value: Some("DIR"),
            help: "per-test logs (default target/sanitize)",
        },
        Flag {
            name: "--jobs",
            value: Some("N"),
            help: "N tests at a time, each in its own sanitizer process (default 1)",
        },
    ],
};

pub fn run(args: &Args) -> Result<(), String> {
    let tools: Vec<String> = args
        .value("--tools")
        .map(|t| t.split(',').map(str::to_string).collect())
        .unwrap_or_else(|| ALL_TOOLS.map(String::from).to_vec());
    if let Some(bad) = tools.iter().find(|t| !ALL_TOOLS.contains(&t.as_str())) {
        return Err(format!(
            "unknown tool `{bad}`; expected some of {ALL_TOOLS:?}"
        ));
    }
    let bins: Vec<PathBuf> = match args.value("--bins") {
        Some(dir) => executables_in(&Path::new(dir).join("tests"), "")?,
        None => build_test_binaries(
            &workspace_root().ok_or("no source tree: pass --bins DIR (a bundle)")?,
        )?,
    };
    // `--only gpu_lrp,gpu_attention`: binaries whose file name starts with one of the prefixes.
    let only: Vec<String> = args
        .value("--only")
        .map(|o| {
            o.split(',')
                .filter(|p| !p.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    let selected = |b: &Path| {
        only.is_empty()
            || b.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| only.iter().any(|p| n.starts_with(p.as_str())))
    };
    let bins: Vec<PathBuf> = bins
        .into_iter()
        .filter(|b| is_gpu_test(b) && selected(b))
        .collect();
    if bins.is_empty() {
        return Err(if only.is_empty() {
            "no GPU test binaries found".into()
        } else {
            format!("no GPU test binary matches --only {}", only.join(","))
        });
    }
    let cs = find_compute_sanitizer().ok_or("compute-sanitizer not found: install the CUDA toolkit (it ships in CUDA's bin/) or put it on PATH")?;
    let log_dir = PathBuf::from(args.value("--log-dir").unwrap_or("target/sanitize"));
    std::fs::create_dir_all(&log_dir)
        .map_err(|e| format!("cannot create {}: {e}", log_dir.display()))?;

    let jobs: usize = match args.value("--jobs") {
        None => 1,
        Some(j) => j
            .parse()
            .ok()
            .filter(|&j| j >= 1)
            .ok_or_else(|| format!("--jobs takes a count of at least 1, got `{j}`"))?,
    };

    let total = tools.len() * bins.len();
    let progress = Progress::new(total as u64, "sanitize");
    let mut rows = Vec::new();
    for tool in &tools {
        for bin in &bins {
            let name = bin
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("?")
                .split('-')
                .next()
                .unwrap_or("?")
                .to_string();
            progress.step(&format!(
                "[{}/{total}] compute-sanitizer --tool {tool} {name} ...",
                rows.len() + 1
            ));
            let start = Instant::now();
            let (log, findings, tests_ok) = if jobs > 1 {
                run_split(
                    &cs,
                    bin,
                    tool,
                    jobs,
                    &log_dir.join(format!("{tool}-{name}")),
                )?
            } else {
                let log = sanitize_once(&cs, bin, tool, None)?;
                let (findings, ok) = (error_count(&log), tests_passed(&log));
                (log, findings, ok)
            };
            std::fs::write(log_dir.join(format!("{tool}-{name}.log")), &log)
                .map_err(|e| e.to_string())?;
            let row = Row {
                binary: name,
                tool: tool.clone(),
                findings,
                tests_ok,
                seconds: start.elapsed().as_secs_f64(),
            };
            progress.done(&format!(
                "      {tool} {}: {} findings, tests {}, {:.1} s",
                row.binary,
                row.findings.map_or("?".into(), |n| n.to_string()),
                if row.tests_ok { "ok" } else { "FAILED" },
                row.seconds
            ));
            rows.push(row);
        }
    }
    progress.finish();
    print_summary(&rows);
    let bad: Vec<&Row> = rows
        .iter()
        .filter(|r| r.findings != Some(0) || !r.tests_ok)
        .collect();
    if bad.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} of {} runs had findings or failures; logs in {}",
            bad.len(),
            rows.len(),
            log_dir.display()
        ))
    }
}

/// One compute-sanitizer run of `bin` (all its tests, or the one named `test`); its stdout and
/// stderr.
fn sanitize_once(cs: &Path, bin: &Path, tool: &str, test: Option<&str>) -> Result<String, String> {
    let mut cmd = Command::new(cs);
    cmd.args([
        "--tool",
        tool,
        "--print-limit",
        "50",
        "--error-exitcode",
        "99",
        "--target-processes",
        "all",
    ]);
    if bin
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("gpu_dist"))
    {
        // NCCL's communicator set-up asks the runtime for the attributes of each of its kernels
        // and skips those built for other architectures; each "no kernel image" answer is a CUDA
        // API error that memcheck would count (168 in one run of gpu_dist on two H200s,
        // 2026-11-26, all from ncclInitKernelsForDevice). Memory errors are still reported; our
        // own driver calls return typed errors that the tests check.
        cmd.args(["--report-api-errors", "no"]);
    }
    cmd.arg(bin)
        .args(["--test-threads=1"])
        .env("RGK_SANITIZE", "1")
        .env("RGK_SANITIZE_TOOL", tool)
        .env("RGK_FUZZ_CASES", "3");
    if let Some(t) = test {
        cmd.args(["--exact", t]);
    }
    let out = cmd
        .output()
        .map_err(|e| format!("could not run {}: {e}", cs.display()))?;
    Ok(format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

/// Whether a test binary's output reports success (a run that broke before its summary did not).
fn tests_passed(log: &str) -> bool {
    log.contains("test result: ok") && !log.contains("FAILED")
}

/// The tests of a libtest binary (`--list --format terse`: one `name: test` line each).
fn list_tests(bin: &Path) -> Result<Vec<String>, String> {
    let out = Command::new(bin)
        .args(["--list", "--format", "terse"])
        .output()
        .map_err(|e| format!("could not list the tests of {}: {e}", bin.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} --list failed: {}",
            bin.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(parse_test_list(&String::from_utf8_lossy(&out.stdout)))
}

fn parse_test_list(listing: &str) -> Vec<String> {
    listing
        .lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .map(str::to_string)
        .collect()
}

/// Every test of `bin` in its own sanitizer process, `jobs` at a time. Returns the binary's log (the
/// tests' logs in listing order, each under a header), the summed findings (`None` if any run lost
/// its summary line) and whether every test passed. Each test's log is also written to `dir`.
fn run_split(
    cs: &Path,
    bin: &Path,
    tool: &str,
    jobs: usize,
    dir: &Path,
) -> Result<(String, Option<u64>, bool), String> {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let tests = list_tests(bin)?;
    if tests.is_empty() {
        return Err(format!("{} lists no tests", bin.display()));
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<String, String>>>> = Mutex::new(vec![None; tests.len()]);
    std::thread::scope(|scope| {
        for _ in 0..jobs.min(tests.len()) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(test) = tests.get(i) else { break };
                    let t0 = Instant::now();
                    let res = sanitize_once(cs, bin, tool, Some(test));
                    if let Ok(log) = &res {
                        let file = dir.join(format!("{}.log", test.replace("::", "__")));
                        let _ = std::fs::write(file, log);
                        println!(
                            "        {tool} {test}: {} findings, {}, {:.1} s",
                            error_count(log).map_or("?".into(), |n| n.to_string()),
                            if tests_passed(log) { "ok" } else { "FAILED" },
                            t0.elapsed().as_secs_f64()
                        );
                    }
                    results.lock().expect("no panics while held")[i] = Some(res);
                }
            });
        }
    });
    let mut log = String::new();
    let (mut findings, mut ok) = (Some(0u64), true);
    for (test, res) in tests
        .iter()
        .zip(results.into_inner().expect("no panics while held"))
    {
        let one = res.expect("every test was run")?;
        log.push_str(&format!("===== {test}\n{one}\n"));
        findings = findings.zip(error_count(&one)).map(|(a, b)| a + b);
        ok &= tests_passed(&one);
    }
    Ok((log, findings, ok))
}

/// What compute-sanitizer prints for a process that made no CUDA call: a test with no GPU work, run
/// in a process of its own (`--jobs`), has nothing to check.
const NO_CUDA_CALL: &str = "Target application terminated before first instrumented API call";

/// The count in compute-sanitizer's `ERROR SUMMARY: N error(s)` line (`None` if absent: the run broke);
/// 0 for a process that made no CUDA call.
fn error_count(log: &str) -> Option<u64> {
    if log.contains(NO_CUDA_CALL) && !log.contains("ERROR SUMMARY:") {
        return Some(0);
    }
    // racecheck reports `RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)`; both errors and
    // warnings count (a warning is a hazard the tool could not prove harmless).
    let race: Option<u64> = log
        .lines()
        .filter_map(|l| l.split("RACECHECK SUMMARY:").nth(1))
        .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
        .max();
    if race.is_some() {
        return race;
    }
    log.lines()
        .filter_map(|l| l.split("ERROR SUMMARY:").nth(1))
        .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
        .max()
}

fn print_summary(rows: &[Row]) {
    println!(
        "\n{:<24} {:<10} {:>9} {:>7} {:>8}",
        "test binary", "tool", "findings", "tests", "seconds"
    );
    for r in rows {
        println!(
            "{:<24} {:<10} {:>9} {:>7} {:>8.1}",
            r.binary,
            r.tool,
            r.findings.map_or("?".into(), |n| n.to_string()),
            if r.tests_ok { "ok" } else { "FAILED" },
            r.seconds
        );
    }
    let findings: u64 = rows.iter().filter_map(|r| r.findings).sum();
    println!(
        "sanitize: {} runs, {findings} findings, {} failed",
        rows.len(),
        rows.iter().filter(|r| !r.tests_ok).count()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_summary_is_parsed() {
        assert_eq!(error_count("========= ERROR SUMMARY: 0 errors\n"), Some(0));
        assert_eq!(
            error_count("x\n========= ERROR SUMMARY: 450 errors\n"),
            Some(450)
        );
        assert_eq!(error_count("no summary"), None);
        assert_eq!(
            error_count(
                "========= Error: Target application terminated before first instrumented API call\n"
            ),
            Some(0)
        );
        assert_eq!(
            error_count(
                "========= RACECHECK SUMMARY: 28 hazards displayed (0 errors, 28 warnings)\n"
            ),
            Some(28)
        );
    }

    #[test]
    fn test_listing_is_parsed() {
        let listing = "a_test: test\nmod::b: test\nsome_bench: benchmark\n\n";
        assert_eq!(parse_test_list(listing), ["a_test", "mod::b"]);
    }

    #[test]
    fn only_gpu_test_binaries_are_sanitized() {
        assert!(is_gpu_test(Path::new("/b/tests/gpu_attention-1234")));
        assert!(!is_gpu_test(Path::new("/b/tests/ptx-1234")));
    }
}
