//! Check 3: every PTX entry point is named by a host launcher. An entry point no launcher names is a
//! kernel compiled, shipped and never run: dead code, or a launcher that lost it in a rename.
use std::path::Path;

use super::Finding;
use super::files::rust_files;
use super::launcher_names::{launcher_kernel_names, unnamed_entries};

/// The findings: each entry point of the kernel modules that no file of host/src names. The modules
/// are the ones this tool was built with (xtask links `host`, whose build script builds them from the
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
    Ok(findings)
}
