//! Check 1: no text points outside the repository. A reader of a clone has only the repository, so a
//! path that climbs above its root, a reference to the specs and notes kept beside it (`shared/`), or
//! a markdown file cited by a name that no file here has, is a pointer to nothing.
use std::collections::BTreeSet;

use super::Finding;
use super::files::TextFile;

/// Text naming the notes and specs kept outside the repository, wherever it appears.
const OUTSIDE: [&str; 3] = ["../shared", "shared/specs", "shared/ARCHITECTURE.md"];

/// Markdown files the tools write at run time (reports under target/ and the bundles' output), which
/// the repository holds only once a run's evidence is committed: naming them points to the tool's
/// output, not to missing notes.
const GENERATED_MARKDOWN: [&str; 2] = ["coldstart.md", "report.md"];

/// The findings of one file. `markdown_names`: the file names (`README.md`) of every markdown file in
/// the repository, any folder.
pub fn check(file: &TextFile, markdown_names: &BTreeSet<String>) -> Vec<Finding> {
    let depth = file.path.matches('/').count();
    let mut out = Vec::new();
    for (n, line) in file.text.lines().enumerate() {
        let mut found: Vec<(&str, String)> = Vec::new();
        for token in line.split(|c: char| !is_path_char(c)) {
            if OUTSIDE.iter().any(|p| token.contains(p)) {
                found.push(("names notes kept outside the repository", token.to_string()));
            } else if climbs_above_root(token, depth) {
                found.push((
                    "relative path climbs above the repository root",
                    token.to_string(),
                ));
            }
        }
        for name in bare_markdown_names(line) {
            if !markdown_names.contains(name) && !GENERATED_MARKDOWN.contains(&name) {
                found.push((
                    "cites a markdown file that is not in the repository",
                    name.to_string(),
                ));
            }
        }
        for (what, text) in found {
            out.push(Finding::new(&file.path, n + 1, what, text));
        }
    }
    out
}

fn is_path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/' | '~')
}

/// Whether `token` (a run of path characters), read relative to a file `depth` folders below the
/// root, leaves the repository. Only runs with a `/` count: a bare `..` is a Rust range or a shell
/// `cd ..` from wherever the shell is. Absolute paths (and `//host/..` URLs, `~/..`) are not relative and are not judged; a path that
/// follows a variable (`$here/..`) starts with `/` once split and is skipped the same way.
fn climbs_above_root(token: &str, depth: usize) -> bool {
    if !token.contains('/') || token.starts_with('/') || token.starts_with('~') {
        return false;
    }
    let mut level = depth as i64;
    for component in token.split('/') {
        match component {
            "" | "." => {}
            ".." => {
                level -= 1;
                if level < 0 {
                    return true;
                }
            }
            _ => level += 1,
        }
    }
    false
}

/// Markdown file names cited bare (`ops.md`, not `docs/ops.md` or a URL): no folder to look in, so
/// the file must exist somewhere in the repository.
fn bare_markdown_names(line: &str) -> Vec<&str> {
    let b = line.as_bytes();
    let mut out = Vec::new();
    for (at, _) in line.match_indices(".md") {
        if b.get(at + 3)
            .is_some_and(|&c| c.is_ascii_alphanumeric() || c == b'_')
        {
            continue; // .mdx, .md_old
        }
        let start = line[..at]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
            .map_or(0, |p| p + 1);
        let before = line[..start].chars().next_back();
        if start == at || matches!(before, Some('/') | Some('\\') | Some('*')) {
            continue;
        }
        out.push(&line[start..at + 3]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn findings(path: &str, text: &str) -> Vec<String> {
        let names: BTreeSet<String> = ["README.md", "report.md"].map(String::from).into();
        let file = TextFile {
            path: path.to_string(),
            text: text.to_string(),
        };
        check(&file, &names).iter().map(|f| f.to_string()).collect()
    }

    #[test]
    fn notes_outside_the_repository_are_found() {
        let f = findings("README.md", "details in `../shared/ARCHITECTURE.md`.");
        assert_eq!(
            f,
            ["README.md:1: names notes kept outside the repository (../shared/ARCHITECTURE.md)"]
        );
        assert_eq!(
            findings("gpu/src/a.rs", "//! (see shared/specs/clifford.md)").len(),
            1
        );
    }

    #[test]
    fn climbing_paths_are_judged_from_the_file_folder() {
        // From the root, one `..` leaves; from xtask/src, two `..` reach the root.
        let f = findings("README.md", "see ../other/notes.txt");
        assert_eq!(
            f,
            ["README.md:1: relative path climbs above the repository root (../other/notes.txt)"]
        );
        assert!(findings("xtask/src/a.rs", r#"include!("../../gpu/ptx_builder.rs");"#).is_empty());
        assert_eq!(findings("xtask/src/a.rs", "../../../x").len(), 1);
        assert!(findings("host/build.rs", r#"rerun-if-changed=../gpu/src"#).is_empty());
        // Not relative to the file, or not paths: left alone.
        for text in [
            r#"cd "$(dirname "$0")/.."#,
            "cp $here/../x y",
            "for i in 0..n {}",
            "x[..]",
            "`matmul/...` rows",
            "https://example.com/a/../../b",
        ] {
            assert!(findings("README.md", text).is_empty(), "{text}");
        }
    }

    #[test]
    fn bare_markdown_citations_must_name_a_file_here() {
        assert_eq!(
            findings(
                "host/tests/a.rs",
                "// the contract in ops.md and attention.md"
            ),
            [
                "host/tests/a.rs:1: cites a markdown file that is not in the repository (ops.md)",
                "host/tests/a.rs:1: cites a markdown file that is not in the repository (attention.md)",
            ]
        );
        for text in [
            "see README.md",
            "the report.md beside it",
            "docs/x/notes.md",
            "*.md files",
            "a.mdx",
        ] {
            assert!(findings("a.rs", text).is_empty(), "{text}");
        }
    }
}
