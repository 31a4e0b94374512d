//! `cargo xtask profile KERNEL`: Nsight Compute on one launch of one kernel (clocks left as they are:
//! `--clock-control none`), summarised as DRAM bandwidth %, SM throughput %, tensor-pipe utilisation and
//! achieved occupancy. The profiled program is the demo, which launches every shipped kernel.
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::{Args, Flag, Spec, which, workspace_root};

const METRICS: [(&str, &str); 4] = [
    (
        "dram__throughput.avg.pct_of_peak_sustained_elapsed",
        "DRAM bandwidth % of peak",
    ),
    (
        "sm__throughput.avg.pct_of_peak_sustained_elapsed",
        "SM throughput % of peak",
    ),
    (
        "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
        "tensor pipe % active",
    ),
    (
        "sm__warps_active.avg.pct_of_peak_sustained_active",
        "achieved occupancy %",
    ),
];

pub fn find_ncu() -> Option<PathBuf> {
    which("ncu").or_else(|| {
        ["/usr/local/cuda/bin/ncu"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
    })
}

pub const SPEC: Spec = Spec {
    task: "profile",
    summary: "ncu (--clock-control none) summary of one kernel (an entry-point name, e.g. softmax_f32)",
    positionals: &["KERNEL"],
    flags: &[Flag {
        name: "--bins",
        value: Some("DIR"),
        help: "the demo of a bundle instead of building it",
    }],
};

pub fn run(args: &Args) -> Result<(), String> {
    let [kernel] = args.positionals() else {
        return Err("profile takes one KERNEL".into());
    };
    let ncu = find_ncu().ok_or(
        "ncu (Nsight Compute) not found: install it with the CUDA toolkit or put it on PATH",
    )?;
    let demo = match args.value("--bins") {
        Some(dir) => Path::new(dir).join("demo"),
        None => {
            let root = workspace_root().ok_or("no source tree: pass --bins DIR (a bundle)")?;
            crate::util::run_checked(Command::new("cargo").current_dir(&root).args([
                "build",
                "--release",
                "-p",
                "host",
                "--example",
                "demo",
            ]))?;
            root.join("target/release/examples/demo")
        }
    };
    let metrics: Vec<&str> = METRICS.iter().map(|m| m.0).collect();
    let out = Command::new(&ncu)
        .args([
            "--clock-control",
            "none",
            "--launch-count",
            "1",
            "--csv",
            "--page",
            "raw",
        ])
        .arg("--kernel-name")
        .arg(format!("regex:^{kernel}$"))
        .arg("--metrics")
        .arg(metrics.join(","))
        .arg(&demo)
        .env("RGK_DEMO_QUIET", "1")
        .output()
        .map_err(|e| format!("could not run ncu: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let values = parse_raw_csv(&text);
    if values.is_empty() {
        return Err(format!(
            "ncu reported nothing for `{kernel}` (is that an entry-point name, e.g. softmax_f32?)\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    println!("ncu --clock-control none, one launch of {kernel}:");
    for (metric, label) in METRICS {
        println!(
            "  {label:<28} {}",
            values
                .iter()
                .find(|(m, _)| m == metric)
                .map_or("n/a", |(_, v)| v.as_str())
        );
    }
    Ok(())
}

/// `--page raw --csv`: a header row of metric names, a units row, then one row per profiled launch.
fn parse_raw_csv(text: &str) -> Vec<(String, String)> {
    let rows: Vec<Vec<String>> = text
        .lines()
        .filter(|l| l.starts_with('"'))
        .map(|l| {
            l.split("\",\"")
                .map(|c| c.trim_matches('"').to_string())
                .collect()
        })
        .collect();
    match (rows.first(), rows.get(2)) {
        (Some(header), Some(values)) => {
            header.iter().cloned().zip(values.iter().cloned()).collect()
        }
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn raw_csv_pairs_names_with_first_launch_values() {
        let t = "==PROF== x\n\"ID\",\"Kernel Name\",\"dram__throughput.avg.pct_of_peak_sustained_elapsed\"\n\"\",\"\",\"%\"\n\"0\",\"softmax_f32\",\"91.5\"\n";
        let v = super::parse_raw_csv(t);
        assert_eq!(
            v[2],
            (
                "dram__throughput.avg.pct_of_peak_sustained_elapsed".to_string(),
                "91.5".to_string()
            )
        );
    }
}
