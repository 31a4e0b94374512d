//! `cargo xtask <task>`: the project's workflow tool. One module per task; this file is the dispatch.
//!
//! Tasks that need a GPU (`sanitize`, `bench`, `profile`, `doctor`, `bisect`) also run from a bundle made by
//! `bundle`, on a GPU machine without Rust: the bundle carries this binary, prebuilt.
mod bench;
mod bench_compare;
mod bisect;
mod build_ptx;
mod bundle;
mod doctor;
mod profile;
mod sanitize;
mod stats;
mod util;

const USAGE: &str = "usage: cargo xtask <task> [options]

tasks:
  build-ptx [--checked]            build PTX per arch, print the ptxas resource table, fail on spills/stack
  sanitize [--bins DIR] [--tools memcheck,racecheck,initcheck,synccheck] [--only PREFIX,..] [--log-dir DIR] [--jobs N]
                                   run the GPU tests under compute-sanitizer; summary table; exit 1 on findings
  bundle [--out DIR]               build test + bench binaries, PTX, scripts and run.sh into DIR (default bundle/)
  bench [--bins DIR] [--out DIR] [--quick] [--no-peers] [--filter REGEX] [--peers-only PREFIX,..] [--peers-timeout S]
                                   GPU-timed benches, PyTorch peers, merged report (JSON, Markdown, SVG)
  bench-compare BASE.json NEW.json statistical comparison of two bench runs (exit 1 on a regression)
  profile KERNEL [--bins DIR]      ncu (--clock-control none) summary of one kernel
  doctor                           GPU, driver, toolchain and tool check, each with what to do
  bisect [--model transformer|clifford] [--planted gelu|layernorm] [--steps N] [--seed S]
                                   switch the transformer block's ops to the GPU one at a time: per-op
                                   divergence table, first divergent op (exit 0, nothing done, without a GPU)";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(task) = args.first() else {
        eprintln!("{USAGE}");
        std::process::exit(2);
    };
    let rest = &args[1..];
    let result = match task.as_str() {
        "build-ptx" => build_ptx::run(rest),
        "sanitize" => sanitize::run(rest),
        "bundle" => bundle::run(rest),
        "bench" => bench::run(rest),
        "bench-compare" => match rest {
            [base, new] => bench_compare::run(base.as_ref(), new.as_ref())
                .map(|regressed| {
                    if regressed {
                        Err("regression found".to_string())
                    } else {
                        Ok(())
                    }
                })
                .and_then(|r| r),
            _ => Err("usage: cargo xtask bench-compare BASE.json NEW.json".to_string()),
        },
        "profile" => profile::run(rest),
        "doctor" => doctor::run(rest),
        "bisect" => bisect::run(rest),
        "-h" | "--help" | "help" => {
            println!("{USAGE}");
            Ok(())
        }
        other => Err(format!("unknown task `{other}`\n{USAGE}")),
    };
    if let Err(e) = result {
        eprintln!("xtask {task}: {e}");
        std::process::exit(1);
    }
}
