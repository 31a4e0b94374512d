//! `cargo xtask <task>`: the project's workflow tool. One module per task; this file is the dispatch.
//!
//! Tasks that need a GPU (`sanitize`, `bench`, `dist`, `profile`, `doctor`, `bisect`) also run from a bundle made by
//! `bundle`, on a GPU machine without Rust: the bundle carries this binary, prebuilt.
//!
//! Each task declares its command line as a [`util::Spec`] table; `main` parses it with the one shared
//! parser before the task starts. Exit status: 2 when the command line does not parse (unknown task or
//! flag, missing value, flag given twice, wrong number of arguments), 1 when the task fails (including
//! a flag value it rejects), 0 otherwise.
mod bench;
mod bench_compare;
mod bisect;
mod build_ptx;
mod bundle;
mod coldstart;
mod dist;
mod doctor;
mod profile;
mod sanitize;
mod stats;
mod tidy;
mod util;

use util::{Args, Spec};

/// A task: its command-line table and what runs it.
struct Task {
    spec: &'static Spec,
    run: fn(&Args) -> Result<(), String>,
}

/// The task of each module named, in that order: its `SPEC` table and its `run`.
macro_rules! tasks {
    ($($module:ident),* $(,)?) => {
        [$(Task { spec: &$module::SPEC, run: $module::run }),*]
    };
}

/// Every task, in the order `cargo xtask help` lists them.
const TASKS: [Task; 11] = tasks![
    build_ptx,
    sanitize,
    bundle,
    bench,
    bench_compare,
    coldstart,
    dist,
    profile,
    doctor,
    bisect,
    tidy,
];

/// The overview: every task's synopsis and summary, from the same tables the parser reads, so the
/// usage cannot list a flag that a task does not take (`cargo xtask TASK --help` adds the flags' help).
fn usage() -> String {
    let mut s = String::from(
        "usage: cargo xtask <task> [options]   (cargo xtask <task> --help: its flags)\n\ntasks:",
    );
    for t in &TASKS {
        s.push_str(&format!(
            "\n  {}\n      {}",
            t.spec.synopsis(),
            t.spec.summary
        ));
    }
    s
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((task, rest)) = args.split_first() else {
        eprintln!("{}", usage());
        std::process::exit(2);
    };
    if matches!(task.as_str(), "-h" | "--help" | "help") {
        println!("{}", usage());
        return;
    }
    let Some(t) = TASKS.iter().find(|t| t.spec.task == task) else {
        eprintln!("xtask: unknown task `{task}`\n\n{}", usage());
        std::process::exit(2);
    };
    if rest.iter().any(|a| a == "-h" || a == "--help") {
        println!("{}", t.spec.usage());
        return;
    }
    let parsed = match util::parse_args(t.spec, rest) {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("xtask {task}: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = (t.run)(&parsed) {
        eprintln!("xtask {task}: {e}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Task names are unique and every table is well-formed: flags start with `--`, no flag twice.
    #[test]
    fn task_tables_are_consistent() {
        for (i, t) in TASKS.iter().enumerate() {
            assert!(
                TASKS[..i].iter().all(|u| u.spec.task != t.spec.task),
                "task {} twice",
                t.spec.task
            );
            for (j, f) in t.spec.flags.iter().enumerate() {
                assert!(
                    f.name.starts_with("--") && f.name.len() > 2,
                    "{}: {}",
                    t.spec.task,
                    f.name
                );
                assert!(
                    t.spec.flags[..j].iter().all(|g| g.name != f.name),
                    "{}: {} twice",
                    t.spec.task,
                    f.name
                );
            }
            assert!(usage().contains(&t.spec.synopsis()));
        }
    }

    /// Every flag a task's code reads by name is in its table (reading an undeclared one would be
    /// "not given" forever; debug builds assert it too, but only on the paths a test runs).
    #[test]
    fn tasks_read_only_declared_flags() {
        let sources = [
            ("build-ptx", include_str!("build_ptx.rs")),
            ("sanitize", include_str!("sanitize.rs")),
            ("bundle", include_str!("bundle.rs")),
            ("bench", include_str!("bench.rs")),
            ("bench-compare", include_str!("bench_compare.rs")),
            ("profile", include_str!("profile.rs")),
            ("doctor", include_str!("doctor.rs")),
            ("bisect", include_str!("bisect.rs")),
            ("tidy", include_str!("tidy.rs")),
        ];
        for (task, text) in sources {
            let spec = TASKS
                .iter()
                .find(|t| t.spec.task == task)
                .map(|t| t.spec)
                .expect("every source belongs to a task");
            for reader in [".value(\"", ".has(\""] {
                for (at, _) in text.match_indices(reader) {
                    let rest = &text[at + reader.len()..];
                    let name = &rest[..rest.find('"').unwrap_or(0)];
                    assert!(
                        spec.flags.iter().any(|f| f.name == name),
                        "{task} reads undeclared flag {name}"
                    );
                }
            }
        }
    }
}
