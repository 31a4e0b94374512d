//! The repository's text: what tidy's text checks read.
use std::path::Path;

/// One text file: its path from the repository root (`/`-separated) and its contents.
pub struct TextFile {
    pub path: String,
    pub text: String,
}

/// Every path of the repository (git's tracked files; a walk of the tree where git cannot answer,
/// e.g. an unpacked archive). Tracked files, not the folder's contents: what is committed is what
/// the checks are about, and local notes or outputs beside the sources are not.
pub fn repository_paths(root: &Path) -> Result<Vec<String>, String> {
    let out = std::process::Command::new("git")
        .current_dir(root)
        .args(["ls-files", "-z"])
        .output();
    if let Ok(out) = out
        && out.status.success()
    {
        let listed = String::from_utf8_lossy(&out.stdout);
        return Ok(listed
            .split('\0')
            .filter(|p| !p.is_empty() && root.join(p).is_file())
            .map(str::to_string)
            .collect());
    }
    let mut paths = Vec::new();
    walk(root, root, &mut paths)?;
    paths.sort();
    Ok(paths)
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) -> Result<(), String> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(rel) = path.strip_prefix(root) else {
            continue;
        };
        let rel = rel.to_string_lossy().replace('\\', "/");
        if path.is_dir() {
            if !skipped(&format!("{rel}/")) {
                walk(root, &path, out)?;
            }
        } else {
            out.push(rel);
        }
    }
    Ok(())
}

/// Paths the text checks skip: build outputs (target/, bundle/), git's own folder, and the raw data
/// of measurements (docs/results/**/*.json, *.log, *.svg: tool output quoted as it was written,
/// not prose of ours).
pub fn skipped(path: &str) -> bool {
    let data = [".json", ".log", ".svg"];
    ["target/", "bundle/", ".git/"]
        .iter()
        .any(|d| path.starts_with(d))
        || (path.starts_with("docs/results/") && data.iter().any(|ext| path.ends_with(ext)))
}

/// The text files among `paths` that are not [`skipped`]: a file with a NUL byte or that is not
/// UTF-8 is binary and skipped too.
pub fn text_files(root: &Path, paths: &[String]) -> Result<Vec<TextFile>, String> {
    let mut out = Vec::new();
    for path in paths.iter().filter(|p| !skipped(p)) {
        let bytes =
            std::fs::read(root.join(path)).map_err(|e| format!("cannot read {path}: {e}"))?;
        if bytes.contains(&0) {
            continue;
        }
        if let Ok(text) = String::from_utf8(bytes) {
            out.push(TextFile {
                path: path.clone(),
                text,
            });
        }
    }
    Ok(out)
}

/// Every `.rs` file in `dir` and below, appended to `out` as paths relative to `root` (nothing for a
/// folder that does not exist).
pub fn rust_files(root: &Path, dir: &Path, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(root, &path, out);
        } else if path.extension().is_some_and(|e| e == "rs")
            && let Ok(rel) = path.strip_prefix(root)
        {
            out.push(rel.to_string_lossy().replace('\\', "/"));
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn outputs_and_measurement_data_are_skipped() {
        for p in [
            "target/debug/x.rs",
            "bundle/run.sh",
            ".git/config",
            "docs/results/2026-11-26/a/report.json",
            "docs/results/x.log",
            "docs/results/a/ratio.svg",
        ] {
            assert!(super::skipped(p), "{p}");
        }
        for p in [
            "README.md",
            "docs/results/a/README.md",
            "docs/plot.svg",
            "xtask/src/main.rs",
        ] {
            assert!(!super::skipped(p), "{p}");
        }
    }
}
