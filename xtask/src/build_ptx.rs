//! `cargo xtask build-ptx`: builds the PTX for every shipped arch into target/ptx/, runs ptxas on each
//! when found and prints the per-kernel resource table; fails on spills or local-memory stack in any
//! hot kernel (every kernel except the readable reference paths listed in `NOT_HOT`).
use crate::util::{Args, Flag, Spec, workspace_root};

include!("../../gpu/ptx_builder.rs");

/// Kernels exempt from the no-spill/no-stack gate: reference paths that are not tuned.
const NOT_HOT: [&str; 1] = ["naive_"];

pub const SPEC: Spec = Spec {
    task: "build-ptx",
    summary: "build PTX per arch, print the ptxas resource table, fail on spills/stack",
    positionals: &[],
    flags: &[Flag {
        name: "--checked",
        value: None,
        help: "keep bounds checks (the sanitizer and fuzz build)",
    }],
};

pub fn run(args: &Args) -> Result<(), String> {
    let root = workspace_root().ok_or("build-ptx needs the source tree")?;
    let checked = args.has("--checked");
    let out_dir = root.join("target").join("ptx");
    std::fs::create_dir_all(&out_dir).map_err(|e| e.to_string())?;
    let ptxas = find_ptxas();
    let mut failures = Vec::new();
    for arch in PTX_ARCHES {
        println!(
            "building gpu -> PTX for {arch}{} ...",
            if checked { " (checked)" } else { "" }
        );
        let ptx = build_gpu_ptx(&root, &root.join("target").join("ptx-build"), arch, checked)?;
        let file = out_dir.join(format!(
            "gpu_{arch}{}.ptx",
            if checked { "_checked" } else { "" }
        ));
        std::fs::write(&file, &ptx).map_err(|e| e.to_string())?;
        println!(
            "  wrote {} ({} kernels)",
            file.display(),
            host::ptx::entry_points(&ptx).len()
        );
        let Some(ptxas) = &ptxas else { continue };
        let table = ptxas_resources(ptxas, &ptx, arch)?;
        print_table(arch, &table);
        for k in table
            .iter()
            .filter(|k| !NOT_HOT.iter().any(|p| k.name.starts_with(p)))
        {
            if k.wgmma_serialized {
                failures.push(format!(
                    "{arch} {}: ptxas serialized its wgmma (Potential Performance Loss)",
                    k.name
                ));
            }
            if k.stack_bytes > 0 || k.spill_stores > 0 || k.spill_loads > 0 {
                failures.push(format!(
                    "{arch} {}: {} B stack, {} B spill stores, {} B spill loads",
                    k.name, k.stack_bytes, k.spill_stores, k.spill_loads
                ));
            }
        }
    }
    if ptxas.is_none() {
        println!(
            "ptxas not found: no resource table (pip install nvidia-cuda-nvcc-cu12, or set PTXAS=/path/to/ptxas)"
        );
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "hot kernels use local memory:\n  {}",
            failures.join("\n  ")
        ))
    }
}

fn print_table(arch: &str, table: &[KernelResources]) {
    println!("\n  ptxas -arch={arch}: {} kernels", table.len());
    println!(
        "  {:<32} {:>5} {:>9} {:>7} {:>7}",
        "kernel", "regs", "smem B", "stack B", "spill B"
    );
    let mut sorted: Vec<&KernelResources> = table.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    for k in sorted {
        println!(
            "  {:<32} {:>5} {:>9} {:>7} {:>7}",
            k.name,
            k.registers,
            k.shared_bytes,
            k.stack_bytes,
            k.spill_stores + k.spill_loads
        );
    }
}
