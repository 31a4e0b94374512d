//! `xtask bench-compare BASE NEW`: compare two bench result files.
//!
//! Input format (`rgk-bench-v1`, written by our bench runner):
//! `{"schema": "rgk-bench-v1", "device": "...", "results":
//!   [{"name": "softmax/f32/4096x16384", "samples_ms": [0.41, ...], ...}]}`
//! Other fields are ignored. Benches are matched by `name`; the verdict per
//! bench comes from [`crate::stats::compare`] (samples are latencies).

use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

use crate::stats::{self, Comparison, Thresholds, Verdict};
use crate::util::{Args, Spec};

/// The only schema this reader understands.
pub const SCHEMA: &str = "rgk-bench-v1";

/// One bench entry: its name and latency samples in milliseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchSamples {
    pub name: String,
    pub samples_ms: Vec<f64>,
}

/// Matched comparisons plus the names present in only one file.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub comparisons: Vec<Comparison>,
    pub only_base: Vec<String>,
    pub only_new: Vec<String>,
}

pub const SPEC: Spec = Spec {
    task: "bench-compare",
    summary: "statistical comparison of two bench runs (exit 1 on a regression)",
    positionals: &["BASE.json", "NEW.json"],
    flags: &[],
};

/// The task: the table, and an error (exit 1) when a bench regressed.
pub fn run(args: &Args) -> Result<(), String> {
    let [base, new] = args.positionals() else {
        return Err("bench-compare takes BASE.json and NEW.json".into());
    };
    if compare_files(base.as_ref(), new.as_ref())? {
        Err("regression found".into())
    } else {
        Ok(())
    }
}

/// Compare two bench files, print the table; Ok(true) if any regression.
pub fn compare_files(base: &Path, new: &Path) -> Result<bool, String> {
    let base_doc = load(base)?;
    let new_doc = load(new)?;
    // Parse errors carry the offending path so the user knows which file.
    let base_set = parse_results(&base_doc).map_err(|e| with_path(base, &e))?;
    let new_set = parse_results(&new_doc).map_err(|e| with_path(new, &e))?;
    let report = compare_sets(&base_set, &new_set, &Thresholds::default());

    print!("{}", device_line(&base_doc, &new_doc));
    print!(
        "{}",
        format_table(&report.comparisons, Thresholds::default().confidence)
    );
    print!("{}", format_unmatched(&report));
    Ok(report
        .comparisons
        .iter()
        .any(|c| c.verdict == Verdict::Regression))
}

/// Compare two parsed documents; errors say which side was bad.
#[cfg(test)]
pub fn compare_values(base: &Value, new: &Value) -> Result<Vec<Comparison>, String> {
    let base_set = parse_results(base).map_err(|e| format!("base: {e}"))?;
    let new_set = parse_results(new).map_err(|e| format!("new: {e}"))?;
    Ok(compare_sets(&base_set, &new_set, &Thresholds::default()).comparisons)
}

fn with_path(path: &Path, msg: &str) -> String {
    format!("{}: {msg}", path.display())
}

/// Read and parse a file as JSON; the error names the path and the cause.
fn load(path: &Path) -> Result<Value, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| with_path(path, &format!("cannot read: {e}")))?;
    serde_json::from_str(&text).map_err(|e| with_path(path, &format!("invalid JSON: {e}")))
}

/// Validate the document shape and extract the bench entries.
pub fn parse_results(doc: &Value) -> Result<Vec<BenchSamples>, String> {
    let obj = doc.as_object().ok_or("top level is not a JSON object")?;
    match obj.get("schema").and_then(Value::as_str) {
        Some(SCHEMA) => {}
        Some(other) => return Err(format!("unsupported schema {other:?}, expected {SCHEMA:?}")),
        None => return Err("missing string field \"schema\"".to_string()),
    }
    let results = obj
        .get("results")
        .and_then(Value::as_array)
        .ok_or("missing array field \"results\"")?;
    let mut out: Vec<BenchSamples> = Vec::with_capacity(results.len());
    for (i, entry) in results.iter().enumerate() {
        let bench = parse_entry(entry).map_err(|e| format!("results[{i}]: {e}"))?;
        // Duplicate names would make matching ambiguous.
        if out.iter().any(|b| b.name == bench.name) {
            return Err(format!(
                "results[{i}]: duplicate bench name {:?}",
                bench.name
            ));
        }
        out.push(bench);
    }
    Ok(out)
}

/// One `results` entry: needs a string `name` and a non-empty array of
/// finite, non-negative numbers `samples_ms` (they are latencies).
fn parse_entry(entry: &Value) -> Result<BenchSamples, String> {
    let name = entry
        .get("name")
        .and_then(Value::as_str)
        .ok_or("missing string field \"name\"")?;
    let raw = entry
        .get("samples_ms")
        .and_then(Value::as_array)
        .ok_or_else(|| format!("{name:?}: missing array field \"samples_ms\""))?;
    if raw.is_empty() {
        return Err(format!("{name:?}: \"samples_ms\" is empty"));
    }
    let mut samples_ms = Vec::with_capacity(raw.len());
    for (j, v) in raw.iter().enumerate() {
        match v.as_f64() {
            Some(x) if x.is_finite() && x >= 0.0 => samples_ms.push(x),
            _ => return Err(format!("{name:?}: samples_ms[{j}] = {v} is not a latency")),
        }
    }
    Ok(BenchSamples {
        name: name.to_string(),
        samples_ms,
    })
}

/// Match by name (base order first) and compare each matched pair.
fn compare_sets(base: &[BenchSamples], new: &[BenchSamples], th: &Thresholds) -> Report {
    let find = |set: &[BenchSamples], name: &str| set.iter().position(|b| b.name == name);
    let mut report = Report {
        comparisons: Vec::new(),
        only_base: Vec::new(),
        only_new: Vec::new(),
    };
    for b in base {
        match find(new, &b.name) {
            Some(k) => report.comparisons.push(stats::compare(
                &b.name,
                &b.samples_ms,
                &new[k].samples_ms,
                th,
            )),
            None => report.only_base.push(b.name.clone()),
        }
    }
    for n in new {
        if find(base, &n.name).is_none() {
            report.only_new.push(n.name.clone());
        }
    }
    report
}

/// "device: X" header, flagging when the two runs came from different devices
/// (then timings are not comparable and verdicts mean little).
fn device_line(base: &Value, new: &Value) -> String {
    let dev = |v: &Value| {
        v.get("device")
            .and_then(Value::as_str)
            .unwrap_or("?")
            .to_string()
    };
    let (b, n) = (dev(base), dev(new));
    if b == n {
        format!("device: {b}\n")
    } else {
        format!("WARNING: devices differ: base {b:?}, new {n:?}\n")
    }
}

fn verdict_label(v: Verdict) -> &'static str {
    match v {
        Verdict::Regression => "REGRESSION",
        Verdict::Improvement => "IMPROVEMENT",
        Verdict::NoChange => "no change",
    }
}

/// Fixed-width table; the name column grows to the longest name.
pub fn format_table(rows: &[Comparison], confidence: f64) -> String {
    let w = rows.iter().map(|c| c.name.len()).max().unwrap_or(0).max(4);
    let ci_head = format!("{:.0}% CI", confidence * 100.0);
    let mut s = String::new();
    // write! into a String cannot fail; the Result is deliberately ignored.
    let _ = writeln!(
        s,
        "{:<w$}  {:>10}  {:>10}  {:>8}  {:>17}  {:>6}  {:>8}  verdict",
        "name", "base ms", "new ms", "change", ci_head, "delta", "p"
    );
    for c in rows {
        let ci = format!("[{:+.1}%, {:+.1}%]", c.ci_lo * 100.0, c.ci_hi * 100.0);
        let _ = writeln!(
            s,
            "{:<w$}  {:>10.4}  {:>10.4}  {:>+7.2}%  {:>17}  {:>+6.2}  {:>8.2e}  {}",
            c.name,
            c.base_median,
            c.new_median,
            c.rel_change * 100.0,
            ci,
            c.cliffs_delta,
            c.p_value,
            verdict_label(c.verdict)
        );
    }
    s
}

/// Lines listing benches present in only one of the two files.
fn format_unmatched(r: &Report) -> String {
    let mut s = String::new();
    for (label, names) in [("base", &r.only_base), ("new", &r.only_new)] {
        if !names.is_empty() {
            let _ = writeln!(s, "only in {label} ({}): {}", names.len(), names.join(", "));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(s: &str) -> Value {
        serde_json::from_str(s).unwrap()
    }

    fn doc(results: &str) -> Value {
        json(&format!(
            r#"{{"schema": "rgk-bench-v1", "device": "H100", "results": {results}}}"#
        ))
    }

    #[test]
    fn matches_by_name_and_ignores_extra_fields() {
        let base = doc(
            r#"[{"name": "a", "samples_ms": [1.0, 1.1, 0.9], "iters": 5},
                          {"name": "b", "samples_ms": [2, 2, 2]}]"#,
        );
        let new = doc(r#"[{"name": "b", "samples_ms": [2, 2, 2]},
                         {"name": "a", "samples_ms": [1.0, 1.1, 0.9]}]"#);
        let cmps = compare_values(&base, &new).unwrap();
        let names: Vec<&str> = cmps.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(cmps[0].base_median, 1.0);
        assert!(cmps.iter().all(|c| c.verdict == Verdict::NoChange));
    }

    #[test]
    fn reports_benches_in_one_file_only() {
        let base = parse_results(&doc(
            r#"[{"name": "a", "samples_ms": [1]}, {"name": "gone", "samples_ms": [1]}]"#,
        ))
        .unwrap();
        let new = parse_results(&doc(
            r#"[{"name": "a", "samples_ms": [1]}, {"name": "added", "samples_ms": [1]}]"#,
        ))
        .unwrap();
        let r = compare_sets(&base, &new, &Thresholds::default());
        assert_eq!(r.comparisons.len(), 1);
        assert_eq!(r.only_base, ["gone"]);
        assert_eq!(r.only_new, ["added"]);
        assert!(format_unmatched(&r).contains("only in new (1): added"));
    }

    #[test]
    fn detects_regression_end_to_end() {
        let base: Vec<String> = (0..30)
            .map(|i| format!("{}", 1.0 + i as f64 * 0.001))
            .collect();
        let new: Vec<String> = (0..30)
            .map(|i| format!("{}", 1.2 + i as f64 * 0.001))
            .collect();
        let mk = |s: &[String]| {
            doc(&format!(
                r#"[{{"name": "k", "samples_ms": [{}]}}]"#,
                s.join(",")
            ))
        };
        let cmps = compare_values(&mk(&base), &mk(&new)).unwrap();
        assert_eq!(cmps[0].verdict, Verdict::Regression);
        let table = format_table(&cmps, 0.95);
        assert!(
            table.contains("REGRESSION") && table.contains("95% CI"),
            "{table}"
        );
    }

    #[test]
    fn malformed_json_is_an_error() {
        // compare_values takes parsed values, so malformed text fails at
        // parse time; load() turns that into an error naming the path.
        assert!(
            serde_json::from_str::<Value>(r#"{"schema": "rgk-bench-v1", "results": [}"#).is_err()
        );
        let missing = std::path::Path::new("/nonexistent/rgk-bench.json");
        let err = load(missing).unwrap_err();
        assert!(
            err.starts_with("/nonexistent/rgk-bench.json: cannot read"),
            "{err}"
        );
    }

    #[test]
    fn run_reports_invalid_json_with_path() {
        let path = std::env::temp_dir().join(format!("rgk-bench-bad-{}.json", std::process::id()));
        std::fs::write(&path, "{not json").unwrap();
        let err = compare_files(&path, &path).unwrap_err();
        std::fs::remove_file(&path).unwrap();
        assert!(
            err.contains(&path.display().to_string()) && err.contains("invalid JSON"),
            "{err}"
        );
    }

    fn err_of(base: &Value) -> String {
        compare_values(base, &doc("[]")).unwrap_err()
    }

    #[test]
    fn missing_or_wrong_fields_are_errors() {
        assert!(err_of(&json("[]")).contains("not a JSON object"));
        assert!(err_of(&json(r#"{"results": []}"#)).contains("\"schema\""));
        assert!(
            err_of(&json(r#"{"schema": "other-v2", "results": []}"#))
                .contains("unsupported schema")
        );
        assert!(err_of(&json(r#"{"schema": "rgk-bench-v1"}"#)).contains("\"results\""));
        assert!(
            err_of(&doc(r#"[{"samples_ms": [1]}]"#))
                .contains("results[0]: missing string field \"name\"")
        );
        assert!(err_of(&doc(r#"[{"name": "a"}]"#)).contains("\"samples_ms\""));
        assert!(err_of(&doc(r#"[{"name": "a", "samples_ms": []}]"#)).contains("is empty"));
        assert!(
            err_of(&doc(r#"[{"name": "a", "samples_ms": [1, "x"]}]"#)).contains("samples_ms[1]")
        );
        assert!(err_of(&doc(r#"[{"name": "a", "samples_ms": [-1]}]"#)).contains("not a latency"));
        let dup = err_of(&doc(
            r#"[{"name": "a", "samples_ms": [1]}, {"name": "a", "samples_ms": [1]}]"#,
        ));
        assert!(dup.contains("results[1]: duplicate"), "{dup}");
    }

    #[test]
    fn error_names_the_bad_side() {
        let good = doc("[]");
        let bad = json("{}");
        assert!(
            compare_values(&bad, &good)
                .unwrap_err()
                .starts_with("base: ")
        );
        assert!(
            compare_values(&good, &bad)
                .unwrap_err()
                .starts_with("new: ")
        );
    }
}
