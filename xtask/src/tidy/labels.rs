//! Check 2: no internal run labels. Evidence is named by date and commit (`docs/results/2026-11-26/`,
//! "H100, commit 54f406a"), which any reader can look up; the numbered work periods and lettered runs
//! that produced it are names only their authors can resolve, so code and docs never use them.
//!
//! The rule, phrase by phrase (case-insensitive unless said):
//! - the word "session" in any form (`sessions`, `session-2`, `SESSION_NOTE`), unless it is an API's
//!   term: an option or command listed in [`SESSION_TERMS`], or a qualified name (`x.Session`,
//!   `x::Session`). "This session" is a label too: the period it names has no date.
//! - "run"/"runs" then a space or `-`, then a run label: one letter and at most one digit (`run d`,
//!   `run b2`, `runs a–g`, `run-D`, `Run C`). Not a label: a word of two letters or more ("run the
//!   tests"), an uppercase letter with a digit (`runs V2`: a kernel variant), a letter with two digits
//!   (`run f32 kernels`: a dtype), `e.`/`i.` (e.g., i.e.), and the article "a" unless punctuation or
//!   a list follows it ("runs a kernel" is English; "runs a and b", "run a's files", "runs a–g" are
//!   labels).
//! - a parenthesised period marker `(s4)` not preceded by an identifier (`f(s1)` is a call).
//! - a folder named after a period: `2026-11-26-s5`, or any `-s5/`.
use super::Finding;
use super::files::TextFile;

/// Where "session" is a tool's or API's own word, not a work period: Nsight Systems' CLI
/// (`nsys launch --session NAME`, `--session-new`, `nsys sessions list`). Extend with the exact term
/// when an API (CUDA, NCCL, a profiler) needs the word.
pub const SESSION_TERMS: [&str; 2] = ["--session", "nsys sessions"];

/// The findings of one file's lines.
pub fn check(file: &TextFile) -> Vec<Finding> {
    let mut out = Vec::new();
    for (n, line) in file.text.lines().enumerate() {
        let mut found = labels(line);
        found.extend(period_runs(prose(&file.path, line)));
        for label in found {
            out.push(Finding::new(&file.path, n + 1, "internal run label", label));
        }
    }
    out
}

/// Every run label in `line` that needs no context, as written there.
pub fn labels(line: &str) -> Vec<String> {
    let mut out = session_words(line);
    out.extend(run_labels(line));
    out.extend(period_markers(line));
    out.extend(period_folders(line));
    out
}

/// The prose of a line: in source code, its comment (`//` in Rust, `#` in Python, shell and TOML),
/// for the forms that code also writes (`let (s1, k1) = ..`); the whole line elsewhere.
fn prose<'a>(path: &str, line: &'a str) -> &'a str {
    let marker = if path.ends_with(".rs") {
        "//"
    } else if [".py", ".sh", ".toml", ".yml", ".yaml"]
        .iter()
        .any(|e| path.ends_with(e))
    {
        "#"
    } else {
        return line;
    };
    line.find(marker).map_or("", |k| &line[k..])
}

fn session_words(line: &str) -> Vec<String> {
    let lower = line.to_ascii_lowercase();
    let b = line.as_bytes();
    let mut out = Vec::new();
    for (at, _) in lower.match_indices("session") {
        if at > 0 && b[at - 1].is_ascii_alphabetic() {
            continue; // "possession"
        }
        let qualified = line[..at].ends_with('.') || line[..at].ends_with("::");
        let api_term = SESSION_TERMS.iter().any(|term| {
            lower
                .match_indices(term)
                .any(|(t, _)| t <= at && at < t + term.len())
        });
        if qualified || api_term {
            continue;
        }
        // The word, and the period number after it when there is one ("sessions 2–4").
        let mut end = at
            + line[at..]
                .find(|c: char| !(c.is_ascii_alphabetic() || c == '_'))
                .unwrap_or(line.len() - at);
        let rest = &line[end..];
        if let Some(num) = rest.strip_prefix([' ', '-'])
            && num.starts_with(|c: char| c.is_ascii_digit())
        {
            let len = num
                .find(|c: char| !(c.is_ascii_digit() || c == '-' || c == '–'))
                .unwrap_or(num.len());
            end += 1 + num[..len].trim_end_matches(['-', '–']).len();
        }
        out.push(line[at..end].to_string());
    }
    out
}

/// What may follow the letter `a` for it to be a run label, not the article.
fn a_is_label(rest: &str) -> bool {
    rest.is_empty()
        || rest.starts_with(['\'', ',', '.', ';', ':', ')', ']', '–', '-', '/', '+', '&'])
        || [" and ", " or ", " + ", " & ", " – ", " - "]
            .iter()
            .any(|w| rest.starts_with(w))
}

fn run_labels(line: &str) -> Vec<String> {
    let lower = line.to_ascii_lowercase();
    let b = line.as_bytes();
    let mut out = Vec::new();
    for (at, _) in lower.match_indices("run") {
        if at > 0 && (b[at - 1].is_ascii_alphanumeric() || b[at - 1] == b'_') {
            continue; // "rerun", `do_run`
        }
        let mut k = at + 3;
        if b.get(k) == Some(&b's') {
            k += 1;
        }
        if !matches!(b.get(k), Some(b' ') | Some(b'-')) {
            continue;
        }
        let letter_at = k + 1;
        let Some(&letter) = b.get(letter_at).filter(|c| c.is_ascii_alphabetic()) else {
            continue;
        };
        let mut end = letter_at + 1;
        let digit = b.get(end).is_some_and(u8::is_ascii_digit);
        if digit {
            end += 1;
        }
        if b.get(end)
            .is_some_and(|&c| c.is_ascii_alphanumeric() || c == b'_')
        {
            continue; // a word, or a letter with two digits (f32)
        }
        let rest = &line[end..];
        let label = if letter.is_ascii_uppercase() {
            !digit
        } else if digit {
            true
        } else if letter == b'a' {
            a_is_label(rest)
        } else {
            !(matches!(letter, b'e' | b'i') && rest.starts_with('.'))
        };
        if label {
            out.push(line[at..end].to_string());
        }
    }
    out
}

/// `(s4)`: a period marker, unless the parenthesis is a call's (`f(s1)`).
fn period_markers(line: &str) -> Vec<String> {
    marker_starts(line)
        .filter(|&(_, end)| line.as_bytes().get(end) == Some(&b')'))
        .map(|(at, end)| line[at..end + 1].to_string())
        .collect()
}

/// `(s4, f3)`: a period marker with a run label. Only in prose: code writes the same shape
/// (`let (s1, k1) = ..`).
fn period_runs(prose: &str) -> Vec<String> {
    let b = prose.as_bytes();
    let mut out = Vec::new();
    for (at, end) in marker_starts(prose) {
        let Some(label) = prose[end..].strip_prefix(", ").map(str::as_bytes) else {
            continue;
        };
        let len = match label {
            [l, d, ..] if l.is_ascii_lowercase() && d.is_ascii_digit() => 2,
            [l, ..] if l.is_ascii_lowercase() => 1,
            _ => continue,
        };
        if matches!(label.get(len), Some(b')') | Some(b',')) {
            out.push(String::from_utf8_lossy(&b[at..end + 2 + len + 1]).into_owned());
        }
    }
    out
}

/// `(s` and one or two digits, not after an identifier: (start, offset after the digits).
fn marker_starts(line: &str) -> impl Iterator<Item = (usize, usize)> + '_ {
    let b = line.as_bytes();
    line.match_indices("(s").filter_map(move |(at, _)| {
        let after_ident = at > 0 && (b[at - 1].is_ascii_alphanumeric() || b[at - 1] == b'_');
        let digits = b[at + 2..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count();
        (!after_ident && (1..=2).contains(&digits)).then_some((at, at + 2 + digits))
    })
}

/// `2026-11-26-s5` (a date, then the period) and any `-s5/`.
fn period_folders(line: &str) -> Vec<String> {
    let b = line.as_bytes();
    let is_date = |s: &[u8]| {
        s.len() == 10
            && s.iter().enumerate().all(|(i, c)| {
                if i == 4 || i == 7 {
                    *c == b'-'
                } else {
                    c.is_ascii_digit()
                }
            })
    };
    let mut out = Vec::new();
    for (at, _) in line.match_indices("-s") {
        let digits = b[at + 2..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count();
        let after = b.get(at + 2 + digits);
        if digits == 0 || after.is_some_and(|&c| c.is_ascii_alphanumeric() || c == b'_') {
            continue;
        }
        let dated = at >= 10 && is_date(&b[at - 10..at]);
        if dated {
            out.push(line[at - 10..at + 2 + digits].to_string());
        } else if after == Some(&b'/') {
            let start = line[..at]
                .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
                .map_or(0, |p| p + 1);
            out.push(line[start..at + 3 + digits].to_string());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{TextFile, check, labels};

    /// Real forms from the tree, each with the label the check reports.
    #[test]
    fn labels_are_found() {
        let cases: [(&str, &[&str]); 22] = [
            (
                "measured on an H100 (session 4, run b2)",
                &["session 4", "run b2"],
            ),
            (
                "(session 4, runs b2 and d, f16 and bf16 alike; in run d every",
                &["session 4", "runs b2", "run d"],
            ),
            (
                "racle tests were delivered in sessions 2–4. This session",
                &["sessions 2–4", "session"],
            ),
            ("| **Sessions 2-3, NVIDIA H200** |", &["Sessions 2-3"]),
            (
                "the session-2 run-D initcheck question",
                &["session-2", "run-D"],
            ),
            (
                "# Session note, 2026-11-26 (session 5)",
                &["Session", "session 5"],
            ),
            (
                "see docs/results/2026-11-26-s4/SESSION_NOTE.md",
                &["SESSION_NOTE", "2026-11-26-s4"],
            ),
            ("Its README maps runs a–g to", &["runs a"]),
            ("racechecked in runs a+b (0 hazards)", &["runs a"]),
            ("its tarball also holds run a's files", &["run a"]),
            ("racecheck (runs a + b)", &["runs a"]),
            ("all four tools (runs e/f)", &["runs e"]),
            ("copy 3,013 GB/s in runs b-g;", &["runs b"]),
            ("the default until run r5), 3 (the", &["run r5"]),
            ("(session 4, runs f3 and d)", &["session 4", "runs f3"]),
            ("- Run A: all GPU tests but one passed", &["Run A"]),
            ("- Run V chose the defaults", &["Run V"]),
            ("run c redid that stage", &["run c"]),
            ("Run f: 128 threads a row", &["Run f"]),
            ("rows marked (s3) are", &["(s3)"]),
            ("| 8192^2: 1.58x (s4) |", &["(s4)"]),
            ("gaps: `docs/results/x-s5/` (latest", &["x-s5/"]),
        ];
        for (line, want) in cases {
            let mut got = labels(line);
            let mut want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
            got.sort();
            want.sort();
            assert_eq!(got, want, "{line}");
        }
    }

    #[test]
    fn period_and_run_pairs_are_labels_in_prose_only() {
        let file = |path: &str, text: &str| TextFile {
            path: path.into(),
            text: text.into(),
        };
        let found =
            |f: TextFile| -> Vec<String> { check(&f).into_iter().map(|f| f.text).collect() };
        let md = "| matmul (s5, e) | sgp (s4, f3) | (s3, r5, run d) |";
        assert_eq!(
            found(file("docs/PERF_NOTES.md", md)),
            ["run d", "(s5, e)", "(s4, f3)", "(s3, r5,"]
        );
        let rs = "let (s1, k1) = split(); // from (s4, f3)\nlet (s2, k2) = (s2 as usize, k2);";
        assert_eq!(found(file("host/src/a.rs", rs)), ["(s4, f3)"]);
    }

    #[test]
    fn ordinary_english_and_code_are_not_labels() {
        for line in [
            "run the tests",
            "runs a kernel per row",
            "a run of 10 samples",
            "for 3D it runs V2.",
            "2D runs V2 and 3D runs Cached",
            "runs a 4096x4096 matmul",
            "run f32 kernels",
            "runs e.g. the naive path",
            "rerun it; reruns",
            "fn run(args: &Args)",
            "let runs_b = 2;",
            "run-time check",
            "runs on an A100",
            "f(s1) + g(s2)",
            "S2048 (D128)",
            "h200-final-bench/report.md",
            "nsys launch --session rgk; nsys sessions list",
            "sess = tf.Session()",
            "possession",
            "docs/results/2026-11-26/README.md",
        ] {
            assert!(labels(line).is_empty(), "{line}: {:?}", labels(line));
        }
    }
}
