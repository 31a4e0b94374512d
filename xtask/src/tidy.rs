//! `cargo xtask tidy`: checks of the repository's text, each finding printed as
//! `path:line: what is wrong (the text)`; exit 1 when there is any.
//!
//! 1. Nothing points outside the repository (`outside`): no relative path climbing above the root, no
//!    `../shared`, `shared/specs`, `shared/ARCHITECTURE.md`, no markdown file cited by a bare name
//!    that no file here has.
//! 2. No internal run labels (`labels`): evidence is named by date and commit, never by work period
//!    or run letter; the rule, phrase by phrase, is in that module. File and folder names are checked
//!    too (reported at line 0).
//! 3. Every PTX entry point is named by a host launcher, and every kernel name a launcher uses is an
//!    entry point (`entries`, with the names from `launcher_names`).
//! 4. Every op launcher has a CPU reference and a test comparing against it (`references`; the
//!    exceptions are [`REFERENCE_EXCEPTIONS`] below).
//!
//! Checks 1 and 2 read the tracked text files except build outputs and the raw measurement data
//! under docs/results (see `files`). This module's own files are exempt from them: they spell out
//! the very phrases they look for.
//!
//! `cargo test` runs all four (`tests::repository_is_tidy`). Check 3 reads the kernel modules this
//! tool links through `host` (built from the same tree).
use std::collections::BTreeSet;
use std::path::Path;

use crate::util::{Args, Spec, workspace_root};

mod entries;
mod files;
mod labels;
pub mod launcher_names;
#[cfg(test)]
mod launcher_names_tests;
mod outside;
mod references;
mod rust_items;

use references::{Counterpart, Exception};

pub const SPEC: Spec = Spec {
    task: "tidy",
    summary: "check the repository's text: nothing outside it, no run labels, every PTX entry point \
              launched, every op launcher with a CPU reference test (exit 1 on findings)",
    positionals: &[],
    flags: &[],
};

/// Paths exempt from checks 1 and 2: the checks' own sources and tests quote what they look for.
const SELF: [&str; 2] = ["xtask/src/tidy.rs", "xtask/src/tidy/"];

/// Check 4's exceptions: launchers whose CPU reference has another name, or that need none. Each
/// entry says why; an entry naming no launcher is itself a finding, so the table cannot go stale.
pub const REFERENCE_EXCEPTIONS: [Exception; 17] = [
    Exception {
        family: "attention",
        function: "flash_forward",
        counterpart: Counterpart::Named("forward_and_naive"),
        reason: "one f64 forward serves every attention kernel; forward_and_naive returns it with the \
                 naive kernel's same-precision result, which sets the bounds",
    },
    Exception {
        family: "attention",
        function: "decode::decode_forward",
        counterpart: Counterpart::Exempt,
        reason: "its reference is model_features::forward (GQA, paged caches and split merges are \
                 model features); host/tests/gpu_attention_decode.rs checks it against that",
    },
    Exception {
        family: "attention",
        function: "varlen::flash_forward_varlen",
        counterpart: Counterpart::Exempt,
        reason: "its reference is model_features::varlen_forward (packed batches are a model \
                 feature); host/tests/gpu_attention_varlen.rs checks it against that and against \
                 one flash_forward call per sequence",
    },
    Exception {
        family: "attention",
        function: "varlen::flash_backward_varlen",
        counterpart: Counterpart::Exempt,
        reason: "its reference is model_features::backward, one sequence at a time; \
                 host/tests/gpu_attention_varlen.rs checks it against that",
    },
    Exception {
        family: "attention",
        function: "varlen::flash_forward_varlen_variant",
        counterpart: Counterpart::Exempt,
        reason: "flash_forward_varlen on a chosen kernel, for the tests; same reference",
    },
    Exception {
        family: "attention",
        function: "naive_forward",
        counterpart: Counterpart::Named("forward_and_naive"),
        reason: "as flash_forward: the reference forward and the naive same-precision forward",
    },
    Exception {
        family: "attention",
        function: "naive_backward",
        counterpart: Counterpart::Named("backward"),
        reason: "the f64 backward is the contract of every backward kernel",
    },
    Exception {
        family: "attention",
        function: "flash_backward",
        counterpart: Counterpart::Named("backward_and_naive"),
        reason: "the f64 backward, returned with the same-precision naive backward that sets the \
                 bounds (the forward's rule, per gradient)",
    },
    Exception {
        family: "attention",
        function: "flash_backward_with",
        counterpart: Counterpart::Named("backward_and_naive"),
        reason: "flash_backward with a chosen dQ summation order, held to the same rule",
    },
    Exception {
        family: "attention",
        function: "flash_backward_add",
        counterpart: Counterpart::Named("backward_and_naive"),
        reason: "flash_backward adding into f32 accumulators; what it adds is held to the same rule",
    },
    Exception {
        family: "elementwise",
        function: "cast",
        counterpart: Counterpart::Exempt,
        reason: "the reference of a cast is the rounding itself, DType::round, which the cast test \
                 compares against bit for bit",
    },
    Exception {
        family: "matmul",
        function: "matmul_f32_into",
        counterpart: Counterpart::Named("matmul"),
        reason: "the product with a bias row and accumulation into `out`: its test adds both to \
                 reference::matmul's product",
    },
    Exception {
        family: "matmul",
        function: "matmul_with",
        counterpart: Counterpart::Named("matmul"),
        reason: "the product at a chosen f32 precision: every precision is held to reference::matmul",
    },
    Exception {
        family: "clifford",
        function: "fcgp_forward_with",
        counterpart: Counterpart::Named("fcgp_forward"),
        reason: "fcgp_forward at a chosen matmul precision, held to reference::fcgp_forward",
    },
    Exception {
        family: "clifford",
        function: "fcgp_backward_with",
        counterpart: Counterpart::Named("fcgp_backward"),
        reason: "fcgp_backward at a chosen matmul precision, held to reference::fcgp_backward",
    },
    Exception {
        family: "lrp",
        function: "count_nonfinite",
        counterpart: Counterpart::Exempt,
        reason: "a validation count of NaN and infinities, checked against counts known by \
                 construction of the input",
    },
    Exception {
        family: "lrp",
        function: "mlp::forward",
        counterpart: Counterpart::Named("explain"),
        reason: "the reference explanation returns the forward activations along with the relevances",
    },
];

/// One finding: where, what is wrong, and the offending text.
#[derive(Clone, Debug, PartialEq)]
pub struct Finding {
    pub path: String,
    /// 1-based; 0 for a file's or folder's name.
    pub line: usize,
    pub what: String,
    pub text: String,
}

impl Finding {
    pub fn new(path: &str, line: usize, what: &str, text: impl Into<String>) -> Finding {
        Finding {
            path: path.to_string(),
            line,
            what: what.to_string(),
            text: text.into(),
        }
    }
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}: {} ({})",
            self.path, self.line, self.what, self.text
        )
    }
}

/// The findings of the checks that need no build, by check.
pub struct TextFindings {
    pub outside: Vec<Finding>,
    pub labels: Vec<Finding>,
    pub references: Vec<Finding>,
}

/// Checks 1, 2 and 4 on the repository at `root`.
pub fn text_findings(root: &Path) -> Result<TextFindings, String> {
    let paths = files::repository_paths(root)?;
    let markdown_names: BTreeSet<String> = paths
        .iter()
        .filter(|p| p.ends_with(".md"))
        .map(|p| p.rsplit('/').next().unwrap_or(p).to_string())
        .collect();
    let checked: Vec<String> = paths
        .iter()
        .filter(|p| !SELF.iter().any(|s| p.starts_with(s)))
        .cloned()
        .collect();
    let mut found = TextFindings {
        outside: Vec::new(),
        labels: name_labels(&checked),
        references: references::check(root, &REFERENCE_EXCEPTIONS, "xtask/src/tidy.rs")?,
    };
    for file in files::text_files(root, &checked)? {
        found.outside.extend(outside::check(&file, &markdown_names));
        found.labels.extend(labels::check(&file));
    }
    Ok(found)
}

/// Check 2 on file and folder names: each labelled name once, at the first path through it.
fn name_labels(paths: &[String]) -> Vec<Finding> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for path in paths {
        let mut prefix = String::new();
        for component in path.split('/') {
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(component);
            for label in labels::labels(component) {
                if seen.insert(prefix.clone()) {
                    out.push(Finding::new(
                        &prefix,
                        0,
                        "internal run label in a file or folder name",
                        label,
                    ));
                }
            }
        }
    }
    out
}

pub fn run(_args: &Args) -> Result<(), String> {
    let root = workspace_root().ok_or("tidy needs the source tree")?;
    let text = text_findings(&root)?;
    let entries = entries::check(&root)?;
    let groups = [
        ("outside the repository", &text.outside),
        ("run labels", &text.labels),
        (
            "PTX entry points and launcher names that do not match",
            &entries,
        ),
        ("op launchers without a reference test", &text.references),
    ];
    for (_, findings) in groups {
        for f in findings {
            println!("{f}");
        }
    }
    let total: usize = groups.iter().map(|(_, f)| f.len()).sum();
    if total == 0 {
        println!("tidy: clean");
        return Ok(());
    }
    let counts: Vec<String> = groups
        .iter()
        .map(|(what, f)| format!("{} {what}", f.len()))
        .collect();
    Err(format!("{total} findings: {}", counts.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// All four checks on this repository.
    #[test]
    fn repository_is_tidy() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("xtask/ sits in the workspace");
        let found = text_findings(root).unwrap_or_else(|e| panic!("tidy could not run: {e}"));
        let entries = entries::check(root).unwrap_or_else(|e| panic!("tidy could not run: {e}"));
        let all: Vec<String> = [found.outside, found.labels, entries, found.references]
            .iter()
            .flatten()
            .map(|f| f.to_string())
            .collect();
        assert!(
            all.is_empty(),
            "{} tidy findings:\n{}",
            all.len(),
            all.join("\n")
        );
    }

    #[test]
    fn findings_print_as_path_line_what_text() {
        let f = Finding::new(
            "README.md",
            27,
            "names notes kept outside the repository",
            "../shared",
        );
        assert_eq!(
            f.to_string(),
            "README.md:27: names notes kept outside the repository (../shared)"
        );
    }

    #[test]
    fn labelled_names_are_reported_once_per_folder() {
        let paths = [
            "docs/results/2026-11-26-s5/README.md",
            "docs/results/2026-11-26-s5/a/report.json",
            "docs/results/2026-11-26/README.md",
        ]
        .map(String::from);
        let got: Vec<String> = name_labels(&paths).iter().map(|f| f.to_string()).collect();
        assert_eq!(
            got,
            [
                "docs/results/2026-11-26-s5:0: internal run label in a file or folder name (2026-11-26-s5)"
            ]
        );
    }
}
