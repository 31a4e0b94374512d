//! Small helpers shared by tasks: the command-line table and its parser, the workspace root, running
//! commands.
use std::path::{Path, PathBuf};
use std::process::Command;

/// One flag a task accepts: `--name`, followed by a value when `value` names its placeholder.
#[derive(Debug)]
pub struct Flag {
    pub name: &'static str,
    pub value: Option<&'static str>,
    pub help: &'static str,
}

/// A task's whole command line: required positional arguments and flags, in any order. Each task
/// declares one and [`parse_args`] is the only parser, so every task rejects the same mistakes the
/// same way: a misspelt flag is an error, never an option silently dropped that leaves the task on
/// its defaults.
#[derive(Debug)]
pub struct Spec {
    pub task: &'static str,
    pub summary: &'static str,
    /// Placeholders of the required positional arguments, in order (`BASE.json`, `KERNEL`).
    pub positionals: &'static [&'static str],
    pub flags: &'static [Flag],
}

impl Spec {
    /// `TASK POSITIONALS [--flag VALUE] ..`, the line `cargo xtask help` lists.
    pub fn synopsis(&self) -> String {
        let mut s = self.task.to_string();
        for p in self.positionals {
            s.push(' ');
            s.push_str(p);
        }
        for f in self.flags {
            s.push_str(&match f.value {
                Some(v) => format!(" [{} {v}]", f.name),
                None => format!(" [{}]", f.name),
            });
        }
        s
    }

    /// The synopsis, the summary and one line per flag: what a usage error prints.
    pub fn usage(&self) -> String {
        let mut s = format!("usage: cargo xtask {}\n{}", self.synopsis(), self.summary);
        if !self.flags.is_empty() {
            s.push_str("\n\nflags:");
        }
        let names: Vec<String> = self
            .flags
            .iter()
            .map(|f| match f.value {
                Some(v) => format!("{} {v}", f.name),
                None => f.name.to_string(),
            })
            .collect();
        let width = names.iter().map(String::len).max().unwrap_or(0);
        for (name, f) in names.iter().zip(self.flags) {
            s.push_str(&format!("\n  {name:<width$}  {}", f.help));
        }
        s
    }
}

/// A command line that [`parse_args`] accepted.
#[derive(Debug)]
pub struct Args {
    spec: &'static Spec,
    positionals: Vec<String>,
    given: Vec<(&'static str, Option<String>)>,
}

impl Args {
    /// The value of `--name`, if it was given.
    pub fn value(&self, name: &str) -> Option<&str> {
        self.declared(name);
        self.given
            .iter()
            .find(|(n, _)| *n == name)
            .and_then(|(_, v)| v.as_deref())
    }

    /// Whether `--name` was given.
    pub fn has(&self, name: &str) -> bool {
        self.declared(name);
        self.given.iter().any(|(n, _)| *n == name)
    }

    /// The positional arguments, as many as the table names (the parser checked the count).
    pub fn positionals(&self) -> &[String] {
        &self.positionals
    }

    /// Reading a flag the table does not declare is a typo in the task's code that would read as "not
    /// given" forever; debug builds (and so the tests) stop on it.
    fn declared(&self, name: &str) {
        debug_assert!(
            self.spec.flags.iter().any(|f| f.name == name),
            "xtask {} reads `{name}`, which its flag table does not declare",
            self.spec.task
        );
    }
}

/// Parses `args` against `spec`. Errors (the task's usage follows the message): a flag the table does
/// not list, a flag given twice, a value flag at the end or followed by another `--flag` (a value
/// never starts with `--`, so `--out --quick` is a missing value, not an output folder named
/// `--quick`), `--flag=value` (values are separate arguments), and too few or too many positional
/// arguments.
pub fn parse_args(spec: &'static Spec, args: &[String]) -> Result<Args, String> {
    let fail = |msg: String| Err(format!("{msg}\n\n{}", spec.usage()));
    let mut out = Args {
        spec,
        positionals: Vec::new(),
        given: Vec::new(),
    };
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        if !arg.starts_with('-') || arg == "-" {
            if out.positionals.len() == spec.positionals.len() {
                return fail(format!("unexpected argument `{arg}`"));
            }
            out.positionals.push(arg.clone());
            continue;
        }
        let Some(flag) = spec.flags.iter().find(|f| f.name == arg) else {
            let (name, _) = arg.split_once('=').unwrap_or((arg, ""));
            return fail(match spec.flags.iter().find(|f| f.name == name) {
                Some(Flag {
                    value: Some(placeholder),
                    ..
                }) => {
                    format!("`{arg}`: give the value as the next argument (`{name} {placeholder}`)")
                }
                _ => format!("unknown flag `{arg}`"),
            });
        };
        if out.given.iter().any(|(n, _)| *n == flag.name) {
            return fail(format!("`{}` given twice", flag.name));
        }
        let value = match flag.value {
            None => None,
            Some(placeholder) => match rest.next() {
                Some(v) if !v.starts_with("--") => Some(v.clone()),
                _ => return fail(format!("`{}` needs a value ({placeholder})", flag.name)),
            },
        };
        out.given.push((flag.name, value));
    }
    if out.positionals.len() < spec.positionals.len() {
        let missing = &spec.positionals[out.positionals.len()..];
        return fail(format!("missing {}", missing.join(" ")));
    }
    Ok(out)
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

/// Progress for long tasks: a bar on a terminal (indicatif), plain lines otherwise (logs, CI).
pub struct Progress {
    bar: indicatif::ProgressBar,
}

impl Progress {
    pub fn new(total: u64, what: &str) -> Self {
        let bar = indicatif::ProgressBar::new(total);
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{prefix} [{bar:30}] {pos}/{len} {elapsed_precise} {msg}",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_prefix(what.to_string());
        Progress { bar }
    }
    /// Starts a step: shows `msg` on the bar, or prints it as a line when there is no terminal.
    pub fn step(&self, msg: &str) {
        if self.bar.is_hidden() {
            println!("{msg}");
        } else {
            self.bar.set_message(msg.to_string());
        }
    }
    /// Finishes a step with a result line (kept in the scrollback / log).
    pub fn done(&self, line: &str) {
        if self.bar.is_hidden() {
            println!("{line}");
        } else {
            self.bar.println(line);
        }
        self.bar.inc(1);
    }
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: Spec = Spec {
        task: "demo",
        summary: "a task for the parser's tests",
        positionals: &["FILE"],
        flags: &[
            Flag {
                name: "--out",
                value: Some("DIR"),
                help: "where to write",
            },
            Flag {
                name: "--quick",
                value: None,
                help: "fewer samples",
            },
        ],
    };

    fn parse(args: &[&str]) -> Result<Args, String> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        parse_args(&SPEC, &args)
    }

    /// The first line of a usage error: the problem, before the usage text.
    fn problem(args: &[&str]) -> String {
        let e = parse(args).expect_err("should be rejected");
        assert!(
            e.contains("usage: cargo xtask demo FILE [--out DIR] [--quick]"),
            "{e}"
        );
        assert!(
            e.contains("--out DIR") && e.contains("fewer samples"),
            "{e}"
        );
        e.lines().next().unwrap_or_default().to_string()
    }

    #[test]
    fn good_command_lines_parse_in_any_order() {
        let a = parse(&["--quick", "f.json", "--out", "o"]).unwrap();
        assert_eq!(a.positionals(), ["f.json"]);
        assert_eq!(a.value("--out"), Some("o"));
        assert!(a.has("--quick"));
        let a = parse(&["f.json"]).unwrap();
        assert_eq!((a.value("--out"), a.has("--quick")), (None, false));
        // A value may start with one dash (a regex, a negative number); only `--` marks a flag.
        assert_eq!(
            parse(&["f", "--out", "-x"]).unwrap().value("--out"),
            Some("-x")
        );
    }

    #[test]
    fn unknown_flags_are_named() {
        assert_eq!(problem(&["f", "--qiuck"]), "unknown flag `--qiuck`");
        assert_eq!(problem(&["f", "-q"]), "unknown flag `-q`");
        assert_eq!(
            problem(&["f", "--out=o"]),
            "`--out=o`: give the value as the next argument (`--out DIR`)"
        );
    }

    #[test]
    fn missing_values_are_errors() {
        assert_eq!(problem(&["f", "--out"]), "`--out` needs a value (DIR)");
        assert_eq!(
            problem(&["f", "--out", "--quick"]),
            "`--out` needs a value (DIR)"
        );
    }

    #[test]
    fn duplicates_are_errors() {
        assert_eq!(
            problem(&["f", "--quick", "--quick"]),
            "`--quick` given twice"
        );
        assert_eq!(
            problem(&["f", "--out", "a", "--out", "b"]),
            "`--out` given twice"
        );
    }

    #[test]
    fn positional_counts_are_exact() {
        assert_eq!(problem(&[]), "missing FILE");
        assert_eq!(problem(&["--quick"]), "missing FILE");
        assert_eq!(problem(&["f", "g"]), "unexpected argument `g`");
    }

    #[test]
    fn test_executables_come_from_test_artifacts_only() {
        let lines = r#"{"reason":"compiler-artifact","profile":{"test":true},"executable":"/t/a"}
{"reason":"compiler-artifact","profile":{"test":false},"executable":"/t/lib"}
{"reason":"build-finished","success":true}"#;
        assert_eq!(test_executables(lines), vec![PathBuf::from("/t/a")]);
    }
}
