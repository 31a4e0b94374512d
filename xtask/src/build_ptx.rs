//! `cargo xtask build-ptx`: builds every op family's kernel module for every shipped arch into
//! target/ptx/ (`FAMILY_ARCH.ptx`, and with ptxas `FAMILY_ARCH.cubin`), prints ptxas's per-kernel
//! resource table, the module sizes and entry-point counts, and fails on spills, local-memory stack or
//! serialized wgmma in any kernel.
use crate::util::{Args, Flag, Spec, workspace_root};

include!("../../gpu/ptx_builder.rs");

pub const SPEC: Spec = Spec {
    task: "build-ptx",
    summary: "build every op family's module (PTX, cubin), print sizes and ptxas's resource table",
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
    println!(
        "building {} families x {} arches{} ({}) ...",
        FAMILIES.len(),
        PTX_ARCHES.len(),
        if checked { ", checked" } else { "" },
        ptxas
            .as_ref()
            .map_or("no ptxas: PTX only".to_string(), |p| format!(
                "ptxas {}",
                p.display()
            ))
    );
    let modules = build_all_modules(
        &root,
        &root.join("target").join("ptx-build"),
        checked,
        ptxas.as_deref(),
        &|line| println!("  {line}"),
    )?;
    let suffix = if checked { "_checked" } else { "" };
    let mut failures = Vec::new();
    let (mut ptx_bytes, mut cubin_bytes, mut entries) = (0, 0, 0);
    println!(
        "\n  {:<16} {:<6} {:>8} {:>10} {:>10}",
        "family", "arch", "kernels", "PTX B", "cubin B"
    );
    for m in &modules {
        let stem = format!("{}_{}{suffix}", m.family, m.arch);
        std::fs::write(out_dir.join(format!("{stem}.ptx")), &m.ptx).map_err(|e| e.to_string())?;
        if let Some(c) = &m.cubin {
            std::fs::write(out_dir.join(format!("{stem}.cubin")), c).map_err(|e| e.to_string())?;
        }
        let n = ptx_entry_points(&m.ptx).len();
        let cubin_len = m.cubin.as_ref().map_or(0, Vec::len);
        println!(
            "  {:<16} {:<6} {n:>8} {:>10} {cubin_len:>10}",
            m.family,
            m.arch,
            m.ptx.len()
        );
        (ptx_bytes, cubin_bytes, entries) = (
            ptx_bytes + m.ptx.len(),
            cubin_bytes + cubin_len,
            entries + n,
        );
    }
    println!(
        "  {:<16} {:<6} {entries:>8} {ptx_bytes:>10} {cubin_bytes:>10}",
        "total", ""
    );
    println!("  wrote {}", out_dir.display());
    for m in &modules {
        if let Some(e) = &m.ptxas_error {
            failures.push(format!("{} {}: ptxas failed: {e}", m.family, m.arch));
        }
        let Some(report) = &m.ptxas_report else {
            continue;
        };
        let table = parse_ptxas_report(report);
        print_table(&format!("{} {}", m.family, target_cpu(m.arch)), &table);
        for k in &table {
            if k.wgmma_serialized {
                failures.push(format!(
                    "{} {}: ptxas serialized its wgmma (Potential Performance Loss)",
                    m.arch, k.name
                ));
            }
            if k.stack_bytes > 0 || k.spill_stores > 0 || k.spill_loads > 0 {
                failures.push(format!(
                    "{} {}: {} B stack, {} B spill stores, {} B spill loads",
                    m.arch, k.name, k.stack_bytes, k.spill_stores, k.spill_loads
                ));
            }
        }
    }
    if ptxas.is_none() {
        println!(
            "ptxas not found: no machine code and no resource table (pip install nvidia-cuda-nvcc-cu12, or set PTXAS=/path/to/ptxas)"
        );
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "ptxas failed, or kernels use local memory or serialize wgmma:\n  {}",
            failures.join("\n  ")
        ))
    }
}

fn print_table(what: &str, table: &[KernelResources]) {
    println!("\n  ptxas {what}: {} kernels", table.len());
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
