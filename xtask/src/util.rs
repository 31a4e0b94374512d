//! Small helpers shared by tasks: flag parsing, the workspace root, running commands.
use std::path::{Path, PathBuf};
use std::process::Command;

/// The value after `--name` in `args`, if present.
pub fn flag_value(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

/// Whether `--name` is present.
pub fn has_flag(args: &[String], name: &str) -> bool {
    args.iter().any(|a| a == name)
}

/// Workspace root (the folder holding this repo's Cargo.toml); `None` in a bundle without sources.
pub fn workspace_root() -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let root = dir.parent()?.to_path_buf();
    root.join("Cargo.toml").is_file().then_some(root)
}

/// Whether `program` can be run (found on PATH or as a path).
pub fn which(program: &str) -> Option<PathBuf> {
    let p = Path::new(program);
    if p.components().count() > 1 {
        return p.is_file().then(|| p.to_path_buf());
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// Runs `cmd`, failing with its description when it cannot start or exits non-zero.
pub fn run_checked(cmd: &mut Command) -> Result<(), String> {
    let status = cmd
        .status()
        .map_err(|e| format!("could not start {cmd:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} exited with {status}"))
    }
}

/// Test executables of `cargo test --no-run --message-format=json` output (GPU test binaries).
pub fn test_executables(json_lines: &str) -> Vec<PathBuf> {
    json_lines
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["reason"] == "compiler-artifact" && v["profile"]["test"] == true)
        .filter_map(|v| v["executable"].as_str().map(PathBuf::from))
        .collect()
}

/// Builds the workspace's test binaries (release) and returns their paths.
pub fn build_test_binaries(root: &Path) -> Result<Vec<PathBuf>, String> {
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(root)
        .args([
            "test",
            "--release",
            "--no-run",
            "--message-format=json",
            "-p",
            "host",
            "-p",
            "integration-tests",
        ])
        .output()
        .map_err(|e| format!("could not run cargo: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "building test binaries failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(test_executables(&String::from_utf8_lossy(&out.stdout)))
}

/// Executable files directly inside `dir` whose names start with `prefix`.
pub fn executables_in(dir: &Path, prefix: &str) -> Result<Vec<PathBuf>, String> {
    use std::os::unix::fs::PermissionsExt;
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("cannot read {}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix))
        })
        .filter(|p| {
            p.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .collect();
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_read_by_name() {
        let args: Vec<String> = ["--bins", "b", "--quick"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(flag_value(&args, "--bins").as_deref(), Some("b"));
        assert!(has_flag(&args, "--quick"));
        assert_eq!(flag_value(&args, "--out"), None);
    }

    #[test]
    fn test_executables_come_from_test_artifacts_only() {
        let lines = r#"{"reason":"compiler-artifact","profile":{"test":true},"executable":"/t/a"}
{"reason":"compiler-artifact","profile":{"test":false},"executable":"/t/lib"}
{"reason":"build-finished","success":true}"#;
        assert_eq!(test_executables(lines), vec![PathBuf::from("/t/a")]);
    }
}
