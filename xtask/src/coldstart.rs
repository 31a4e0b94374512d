//! `cargo xtask coldstart`: what a user waits for before the first result. Runs the `cold_start`
//! example (host/examples/cold_start.rs) in fresh processes: `Gpu::new`, then the first call of one op
//! family, with the driver's JIT cache off (`CUDA_CACHE_DISABLE=1`: every fresh machine, container or
//! CI runner) and warm (a private cache filled by one run first), loading the machine code the library
//! carries (cubin) or, with `RGK_MODULE_FORMAT=ptx`, the PTX a build without ptxas ships. Writes
//! `coldstart.md` and `coldstart.json` and prints the table.
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::{Args, Flag, Spec, run_checked, workspace_root};

pub const SPEC: Spec = Spec {
    task: "coldstart",
    summary: "Gpu::new + first call of each op family in fresh processes, JIT cache off and warm",
    positionals: &[],
    flags: &[
        Flag {
            name: "--bins",
            value: Some("DIR"),
            help: "the cold_start binary of a bundle instead of building it",
        },
        Flag {
            name: "--out",
            value: Some("DIR"),
            help: "report folder (default target/bench-report)",
        },
        Flag {
            name: "--reps",
            value: Some("N"),
            help: "fresh processes per row (default 3; the cold PTX rows run once)",
        },
    ],
};

/// The ops whose first call is timed (`none`: `Gpu::new` alone).
const OPS: [&str; 4] = ["none", "softmax", "flash_forward", "clifford_layer"];

/// How a row's processes load kernels: the cubin or the PTX, with the JIT cache off or warm.
#[derive(Clone, Copy)]
struct Mode {
    name: &'static str,
    ptx: bool,
    cache: bool,
}

const MODES: [Mode; 4] = [
    Mode {
        name: "cubin, cache off",
        ptx: false,
        cache: false,
    },
    Mode {
        name: "cubin, cache warm",
        ptx: false,
        cache: true,
    },
    Mode {
        name: "PTX only, cache off",
        ptx: true,
        cache: false,
    },
    Mode {
        name: "PTX only, cache warm",
        ptx: true,
        cache: true,
    },
];

/// One process's answer (the example's JSON line).
struct Sample {
    gpu_new: f64,
    first_call: f64,
    process: f64,
    modules: String,
    gpu: String,
}

fn build_binary(root: &Path) -> Result<PathBuf, String> {
    run_checked(
        Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .current_dir(root)
            .args([
                "build",
                "--release",
                "-p",
                "host",
                "--example",
                "cold_start",
            ]),
    )?;
    Ok(root.join("target/release/examples/cold_start"))
}

fn run_once(bin: &Path, op: &str, mode: Mode, cache_dir: &Path) -> Result<Sample, String> {
    let mut cmd = Command::new(bin);
    cmd.arg(op);
    if mode.ptx {
        cmd.env("RGK_MODULE_FORMAT", "ptx");
    } else {
        cmd.env_remove("RGK_MODULE_FORMAT");
    }
    if mode.cache {
        cmd.env_remove("CUDA_CACHE_DISABLE")
            .env("CUDA_CACHE_PATH", cache_dir);
    } else {
        cmd.env("CUDA_CACHE_DISABLE", "1");
    }
    let out = cmd
        .output()
        .map_err(|e| format!("could not run {}: {e}", bin.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} {op} failed: {}",
            bin.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(text.trim())
        .map_err(|e| format!("cold_start printed `{}`: {e}", text.trim()))?;
    let num = |k: &str| {
        v[k].as_f64()
            .ok_or_else(|| format!("cold_start's `{k}` missing in {v}"))
    };
    let modules = v["modules"]
        .as_array()
        .map(|ms| {
            ms.iter()
                .map(|m| {
                    format!(
                        "{} {} {:.3} s",
                        m["family"].as_str().unwrap_or("?"),
                        m["image"].as_str().unwrap_or("?"),
                        m["load_s"].as_f64().unwrap_or(f64::NAN)
                    )
                })
                .collect::<Vec<_>>()
                .join("; ")
        })
        .unwrap_or_default();
    Ok(Sample {
        gpu_new: num("gpu_new_s")?,
        first_call: num("first_call_s")?,
        process: num("process_s")?,
        modules,
        gpu: v["gpu"].as_str().unwrap_or("?").to_string(),
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        f64::NAN
    } else {
        v[v.len() / 2]
    }
}

pub fn run(args: &Args) -> Result<(), String> {
    let out = PathBuf::from(args.value("--out").unwrap_or("target/bench-report"));
    std::fs::create_dir_all(&out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let reps: usize = match args.value("--reps") {
        None => 3,
        Some(v) => v
            .parse()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("--reps takes a whole number above 0, got `{v}`"))?,
    };
    measure(args.value("--bins").map(Path::new), &out, reps)
}

/// The table for the `cold_start` binary of bundle `bins` (or one built from the source tree), into
/// `out`; `reps` processes a row.
pub fn measure(bins: Option<&Path>, out: &Path, reps: usize) -> Result<(), String> {
    let bin = match bins {
        Some(dir) => dir.join("cold_start"),
        None => {
            build_binary(&workspace_root().ok_or("no source tree: pass --bins DIR (a bundle)")?)?
        }
    };
    let (ptx_bytes, cubin_bytes, entries) = host::modules::embedded_totals();
    let mut md = format!(
        "# Cold start: `Gpu::new` + the first call, each in a fresh process\n\n\
         Embedded kernel code: {entries} entry points over {} op families and 2 builds, \
         {:.2} MB of PTX and {:.2} MB of cubin. Medians of {reps} processes a row (the \
         PTX-only rows with the cache off: 1). `first call` includes loading the family's \
         module(s); `process` is the whole process up to the answer.\n\n\
         | op | modules | Gpu::new s | first call s | Gpu::new + first call s | process s | loaded |\n\
         |---|---|---|---|---|---|---|\n",
        host::Family::ALL.len(),
        ptx_bytes as f64 / 1e6,
        cubin_bytes as f64 / 1e6
    );
    let mut json = Vec::new();
    let mut gpu_name = String::new();
    for mode in MODES {
        let cache =
            std::env::temp_dir().join(format!("rgk-coldstart-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&cache);
        for op in OPS {
            if mode.cache {
                // Fill the private cache first: a warm row is the second process on that machine.
                println!("coldstart: {op} ({}): warming the JIT cache ...", mode.name);
                run_once(&bin, op, mode, &cache)?;
            }
            let n = if mode.ptx && !mode.cache { 1 } else { reps };
            let mut samples = Vec::new();
            for i in 0..n {
                println!("coldstart: {op} ({}) {}/{n} ...", mode.name, i + 1);
                samples.push(run_once(&bin, op, mode, &cache)?);
            }
            let g = median(samples.iter().map(|s| s.gpu_new).collect());
            let f = median(samples.iter().map(|s| s.first_call).collect());
            let both = median(samples.iter().map(|s| s.gpu_new + s.first_call).collect());
            let p = median(samples.iter().map(|s| s.process).collect());
            gpu_name = samples[0].gpu.clone();
            md.push_str(&format!(
                "| {op} | {} | {g:.3} | {f:.3} | **{both:.3}** | {p:.3} | {} |\n",
                mode.name, samples[0].modules
            ));
            json.push(serde_json::json!({
                "op": op, "mode": mode.name, "processes": n,
                "gpu_new_s": g, "first_call_s": f, "gpu_new_plus_first_call_s": both, "process_s": p,
                "modules": samples[0].modules,
            }));
        }
        let _ = std::fs::remove_dir_all(&cache);
    }
    md.push_str(&format!("\nDevice: {gpu_name}.\n"));
    std::fs::write(out.join("coldstart.md"), &md).map_err(|e| e.to_string())?;
    let doc = serde_json::json!({
        "device": gpu_name, "entry_points": entries, "ptx_bytes": ptx_bytes, "cubin_bytes": cubin_bytes,
        "rows": json,
    });
    std::fs::write(out.join("coldstart.json"), doc.to_string()).map_err(|e| e.to_string())?;
    println!("\n{md}");
    Ok(())
}
