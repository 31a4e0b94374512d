//! `cargo xtask bundle`: everything a GPU machine without Rust needs, in one folder with one script.
//!
//! ```text
//! bundle/
//!   run.sh            ./run.sh OUT_DIR [stages]   (stages: doctor tests sanitize bench; default all)
//!   xtask             this tool (sanitize, bench, dist, profile, doctor run from the bundle)
//!   tests/<name>      release test binaries (kernel modules embedded)
//!   bench/ops         the criterion bench binary; bench/peers.py, bench/report.py, bench/dist_peers.py
//!   demo              the README's demo
//!   cold_start        the cold-start probe (`xtask coldstart` runs it in fresh processes)
//!   clifford_breakdown  one Clifford layer forward + backward twice, for a per-kernel profile
//!                     (scripts/clifford_breakdown.py)
//!   dist_bench        the multi-GPU benches (`xtask dist` runs it with tests/gpu_dist and PyTorch's peer)
//!   ptx/              each op family's module per arch (PTX, and cubin where ptxas ran), for inspection
//! ```
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::{Args, Flag, Spec, build_test_binaries, run_checked, workspace_root};

const RUN_SH: &str = r#"#!/usr/bin/env bash
# Runs the GPU checks of this bundle: ./run.sh OUT_DIR [doctor] [coldstart] [demo] [tests] [sanitize] [bench] [bench-quick] [compare] [profile] [bisect] [dist]
# (dist: the multi-GPU tests and benches on every GPU of the machine; DIST_FLAGS="--quick" for a smoke run)
# Logs go to OUT_DIR. Exit status: non-zero if any stage failed.
# SANITIZE_TOOLS=memcheck,racecheck limits the sanitizer tools, SANITIZE_ONLY=gpu_lrp,gpu_matmul the test binaries; BENCH_FLAGS="--quick --no-peers" etc.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-out}"; shift || true
stages="${*:-doctor tests sanitize bench}"
mkdir -p "$out"
# cuBLAS (a bench ceiling) ships with the CUDA toolkit and with PyTorch's wheels.
for d in /usr/local/cuda/lib64 $(python3 -c 'import nvidia, os; [print(os.path.join(p, q, "lib")) for p in nvidia.__path__ for q in os.listdir(p)]' 2>/dev/null); do
  [ -d "$d" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
status=0
stage() { echo; echo "=== $1 ($(date +%T))"; }
for s in $stages; do
  case "$s" in
    doctor) stage doctor; "$here/xtask" doctor 2>&1 | tee "$out/doctor.log" ;;
    coldstart) stage coldstart; "$here/xtask" coldstart --bins "$here" --out "$out/coldstart" 2>&1 | tee "$out/coldstart.log"; [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    demo) stage demo; "$here/demo" 2>&1 | tee "$out/demo.log"; [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    tests)
      stage tests
      for t in "$here"/tests/*; do
        echo "--- $(basename "$t")"
        "$t" --test-threads=1 2>&1 | tee -a "$out/tests.log" | grep -E "^test |test result|SKIP|seed|panicked" || true
        [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "FAILED: $(basename "$t")"; status=1; }
      done
      grep -h "test result" "$out/tests.log" | awk '{p+=$4; f+=$6} END {print "tests: " p " passed, " f " failed"}' ;;
    sanitize) stage sanitize; "$here/xtask" sanitize --bins "$here" --log-dir "$out/sanitize" ${SANITIZE_TOOLS:+--tools $SANITIZE_TOOLS} ${SANITIZE_ONLY:+--only $SANITIZE_ONLY} 2>&1 | tee "$out/sanitize.log"; [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    bench) stage bench; "$here/xtask" bench --bins "$here" --out "$out/bench" --peers-timeout "${PEERS_TIMEOUT:-900}" ${BENCH_FLAGS:-} 2>&1 | tee "$out/bench.log"; [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    compare)
      # Two runs of the same code (expect NO CHANGE) and one with the strided add kernel swapped in
      # for the vectorised one (expect REGRESSION on add/*), then bench-compare on each pair.
      stage compare
      f="${COMPARE_FILTER:-^add/}"
      for r in A B; do "$here/xtask" bench --bins "$here" --out "$out/cmp$r" --no-peers --filter "$f" > "$out/cmp$r.log" 2>&1 || status=1; done
      RGK_BENCH_SLOW_VARIANT=1 "$here/xtask" bench --bins "$here" --out "$out/cmpSlow" --no-peers --filter "$f" > "$out/cmpSlow.log" 2>&1 || status=1
      echo "--- same code twice:"; "$here/xtask" bench-compare "$out/cmpA/ours.json" "$out/cmpB/ours.json" | tee "$out/compare_same.txt"
      echo "--- strided add swapped in:"; "$here/xtask" bench-compare "$out/cmpA/ours.json" "$out/cmpSlow/ours.json" | tee "$out/compare_slow.txt" ;;
    bisect)
      # Incremental replacement on the transformer block: clean (expect no divergence), then each planted defect (expect it named);
      # then the Clifford MLP, clean.
      stage bisect
      for v in "" "--planted gelu" "--planted layernorm" "--planted flash" "--model clifford"; do
        echo "--- bisect $v" | tee -a "$out/bisect.log"
        "$here/xtask" bisect $v 2>&1 | tee -a "$out/bisect.log"; [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      done ;;
    dist) stage dist; "$here/xtask" dist --bins "$here" --out "$out/dist" ${DIST_FLAGS:-} 2>&1 | tee "$out/dist.log"; [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    profile) stage profile; for k in ${PROFILE_KERNELS:-softmax_f32 max_partials_f32}; do "$here/xtask" profile "$k" --bins "$here" 2>&1 | tee -a "$out/profile.log"; done ;;
    bench-quick) stage bench-quick; "$here/xtask" bench --bins "$here" --out "$out/bench" --quick 2>&1 | tee "$out/bench.log"; [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    *) echo "unknown stage $s"; status=2 ;;
  esac
done
exit $status
"#;

fn copy(from: &Path, to: &Path) -> Result<(), String> {
    std::fs::copy(from, to)
        .map(|_| ())
        .map_err(|e| format!("copy {} -> {}: {e}", from.display(), to.display()))
}

pub const SPEC: Spec = Spec {
    task: "bundle",
    summary: "build test + bench binaries, PTX, scripts and run.sh into one folder for a GPU machine",
    positionals: &[],
    flags: &[Flag {
        name: "--out",
        value: Some("DIR"),
        help: "the bundle folder (default bundle/)",
    }],
};

pub fn run(args: &Args) -> Result<(), String> {
    let root = workspace_root().ok_or("bundle needs the source tree")?;
    let out = args
        .value("--out")
        .map_or_else(|| root.join("bundle"), PathBuf::from);
    for sub in ["tests", "bench", "ptx"] {
        std::fs::create_dir_all(out.join(sub))
            .map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    }
    println!("bundle: building release binaries (tests, bench, demo, xtask) ...");
    // Two builds: naming `--example` restricts a build to examples.
    run_checked(Command::new("cargo").current_dir(&root).args([
        "build",
        "--release",
        "-p",
        "xtask",
    ]))?;
    run_checked(Command::new("cargo").current_dir(&root).args([
        "build",
        "--release",
        "-p",
        "host",
        "--example",
        "demo",
        "--example",
        "cold_start",
        "--example",
        "clifford_breakdown",
        "--example",
        "dist_bench",
    ]))?;
    copy(&root.join("target/release/xtask"), &out.join("xtask"))?;
    for example in ["demo", "cold_start", "clifford_breakdown", "dist_bench"] {
        copy(
            &root.join("target/release/examples").join(example),
            &out.join(example),
        )?;
    }
    for bin in build_test_binaries(&root)? {
        let name = bin
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("test")
            .split('-')
            .next()
            .unwrap_or("test")
            .to_string();
        copy(&bin, &out.join("tests").join(name))?;
    }
    copy(
        &crate::bench::build_bench_binary(&root)?,
        &out.join("bench/ops"),
    )?;
    for script in ["peers.py", "report.py", "dist_peers.py"] {
        copy(
            &root.join("bench").join(script),
            &out.join("bench").join(script),
        )?;
    }
    for family in host::Family::ALL {
        let img = host::modules::images(family);
        for (arch, build) in [("sm_80", img.sm80), ("sm_90", img.sm90)] {
            let stem = out.join("ptx").join(format!("{}_{arch}", family.name()));
            std::fs::write(stem.with_extension("ptx"), build.ptx).map_err(|e| e.to_string())?;
            if let Some(cubin) = build.cubin {
                std::fs::write(stem.with_extension("cubin"), cubin).map_err(|e| e.to_string())?;
            }
        }
    }
    let run_sh = out.join("run.sh");
    std::fs::write(&run_sh, RUN_SH).map_err(|e| e.to_string())?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&run_sh, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| e.to_string())?;
    println!(
        "bundle: {} ready; on the GPU machine: {}/run.sh OUT_DIR",
        out.display(),
        out.display()
    );
    Ok(())
}
