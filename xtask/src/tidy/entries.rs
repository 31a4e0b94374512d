//! Check 3: every PTX entry point is named by a host launcher. An entry point no launcher names is a
//! kernel compiled, shipped and never run: dead code, or a launcher that lost it in a rename.
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::Finding;
use super::files::rust_files;
use super::launcher_names::{launcher_kernel_names, unnamed_entries};
use crate::build_ptx::{PTX_ARCHES, build_gpu_ptx};

/// The PTX of the last build, one file per arch: the only function that knows where PTX lives, to
/// adapt when that changes. Candidates, each a complete set for [`PTX_ARCHES`]: `cargo xtask
/// build-ptx`'s target/ptx/gpu_ARCH.ptx, and what host's build script left in
/// target/PROFILE/build/host-*/out/ or build/host/*/out/ (cargo's older and newer layouts; one folder
/// per build configuration). The newest set wins, so
/// stale folders of older builds are not read. Empty when no build left a complete set.
pub fn find_ptx(root: &Path) -> Vec<PathBuf> {
    let target = target_dir(root);
    let set = |dir: &Path| -> Vec<PathBuf> {
        PTX_ARCHES
            .iter()
            .map(|a| dir.join(format!("gpu_{a}.ptx")))
            .collect()
    };
    let mut sets = vec![set(&target.join("ptx"))];
    for profile in ["debug", "release"] {
        let Ok(dirs) = std::fs::read_dir(target.join(profile).join("build")) else {
            continue;
        };
        for d in dirs.flatten() {
            let name = d.file_name().to_string_lossy().to_string();
            if name.starts_with("host-") {
                sets.push(set(&d.path().join("out")));
            } else if name == "host" {
                // Newer cargo: build/host/HASH/out.
                for h in std::fs::read_dir(d.path()).into_iter().flatten().flatten() {
                    sets.push(set(&h.path().join("out")));
                }
            }
        }
    }
    let newest = |s: &Vec<PathBuf>| {
        s.iter()
            .filter_map(|p| p.metadata().and_then(|m| m.modified()).ok())
            .max()
            .unwrap_or(SystemTime::UNIX_EPOCH)
    };
    sets.into_iter()
        .filter(|s| s.iter().all(|p| p.is_file()))
        .max_by_key(newest)
        .unwrap_or_default()
}

fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from)
}

/// Builds the PTX where `cargo xtask build-ptx` puts it (unchecked, every arch), with the one builder.
fn build(root: &Path) -> Result<(), String> {
    let out = target_dir(root).join("ptx");
    std::fs::create_dir_all(&out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    for arch in PTX_ARCHES {
        println!("tidy: no PTX found; building gpu -> PTX for {arch} ...");
        let ptx = build_gpu_ptx(root, &root.join("target").join("ptx-build"), arch, false)?;
        let file = out.join(format!("gpu_{arch}.ptx"));
        std::fs::write(&file, ptx).map_err(|e| format!("cannot write {}: {e}", file.display()))?;
    }
    Ok(())
}

/// The findings: each entry point of the PTX that no file of host/src names, at its `.entry` line.
pub fn check(root: &Path) -> Result<Vec<Finding>, String> {
    let mut ptx_files = find_ptx(root);
    if ptx_files.is_empty() {
        build(root)?;
        ptx_files = find_ptx(root);
    }
    let mut paths = Vec::new();
    rust_files(root, &root.join("host/src"), &mut paths);
    let mut texts = Vec::new();
    for p in &paths {
        texts.push(
            std::fs::read_to_string(root.join(p)).map_err(|e| format!("cannot read {p}: {e}"))?,
        );
    }
    let sources: Vec<(&str, &str)> = paths
        .iter()
        .map(String::as_str)
        .zip(texts.iter().map(String::as_str))
        .collect();
    let named = launcher_kernel_names(&sources);
    let mut findings = Vec::new();
    for file in &ptx_files {
        let ptx = std::fs::read_to_string(file)
            .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
        let shown = file
            .strip_prefix(root)
            .unwrap_or(file)
            .display()
            .to_string();
        for name in unnamed_entries(&host::ptx::entry_points(&ptx), &named) {
            let declaration = format!(".visible .entry {name}(");
            let line = ptx
                .lines()
                .position(|l| l.trim_start().starts_with(&declaration))
                .map_or(0, |n| n + 1);
            if !findings.iter().any(|f: &Finding| f.text == name) {
                findings.push(Finding::new(
                    &shown,
                    line,
                    "PTX entry point that no host launcher names",
                    name,
                ));
            }
        }
    }
    Ok(findings)
}
