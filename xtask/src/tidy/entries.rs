//! Check 3: every PTX entry point is named by a host launcher, and every name a launcher uses is an
//! entry point. An entry point no launcher names is a kernel compiled, shipped and never run: dead
//! code, or a launcher that lost it in a rename; a launcher name no module has fails at run time.
use std::path::Path;

use super::Finding;
use super::files::rust_files;
use super::launcher_names::{launcher_kernel_names, unnamed_entries};

/// The findings: each entry point of the kernel modules that no file of host/src names, and each
/// kernel-like name in host/src that no module has. The modules are the ones this tool was built with (xtask links `host`, whose build script builds them from the
/// tree), one per op family.
pub fn check(root: &Path) -> Result<Vec<Finding>, String> {
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
    for family in host::Family::ALL {
        let shown = format!("gpu/src/kernels ({} module)", family.name());
        for name in unnamed_entries(host::modules::images(family).entries, &named) {
            findings.push(Finding::new(
                &shown,
                0,
                "PTX entry point that no host launcher names",
                name,
            ));
        }
    }
    // A name ending like a kernel (`{op}_{dtype}`) that is no entry point of any module.
    let kernel_like = |n: &str| {
        ["_f32", "_f16", "_bf16", "_u32"]
            .iter()
            .any(|s| n.ends_with(s))
    };
    for name in named
        .iter()
        .filter(|n| kernel_like(n) && host::Family::of(n).is_none())
    {
        findings.push(Finding::new(
            "host/src",
            0,
            "launcher names a kernel that no module has",
            name.clone(),
        ));
    }
    Ok(findings)
}
