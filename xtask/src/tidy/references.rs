//! Check 4: every op has a CPU reference and a test that compares against it.
//!
//! The rule, for each op family under host/src/ops/ (`F.rs`, or `F/mod.rs`, with the files of its
//! folder `F/`):
//! 1. The family has a `reference` module (`pub mod reference { .. }` in the module file, or
//!    `F/reference.rs`).
//! 2. A *launcher* is a free `pub fn` of the family (any of its files except the reference module
//!    and test files) that calls `launch`, `launch_cfg` or `launch_cfg_large_smem` (host/src/launch.rs)
//!    directly or through other free functions of the family. Methods are not launchers: they compose
//!    the family's functions (clifford's `Layer`, lrp's `Linear`), which are checked themselves.
//! 3. Each launcher X has a counterpart `reference::R`, the first of: a [`Counterpart::Named`] entry
//!    of tidy's exception table; `reference::X`; the same for X without a variant suffix
//!    ([`VARIANT_SUFFIXES`]: `binary_into_on` → `binary_into` → `binary`); and, for a wrapper (a
//!    function whose whole body is one call of another family function: `sum` calls `reduce`), the
//!    counterpart of the function it wraps. [`Counterpart::Exempt`] entries need none.
//! 4. Some test calls both `reference::R` and X, or a public function that reaches X (through calls,
//!    or through the wrapper chain X starts: a test of `binary_on` exercises `sub`, which only calls
//!    it). "Some test" is a file host/tests/gpu_*.rs, or the family's unit tests (a `tests.rs`
//!    declared `#[cfg(test)]`, or an inline `#[cfg(test)] mod`); calls are matched by the path they
//!    resolve to through the file's `use` declarations (`reference as r`, `super::*`).
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::Finding;
use super::files::rust_files;
use super::launcher_names::launcher_scan::{Scanned, closing, scan, test_only_files};
use super::rust_items::{FnItem, Imports, calls, free_fns, inline_module, resolved_calls};

/// The kernel-launching primitives of host/src/launch.rs.
const LAUNCH_CALLS: [&str; 3] = ["launch", "launch_cfg", "launch_cfg_large_smem"];

/// Suffixes of a launcher that runs the same op as the name without them: a chosen kernel
/// (`_variant`, `_on`, `_threads`) or a given output (`_into`). Their reference is the op's.
pub const VARIANT_SUFFIXES: [&str; 4] = ["_variant", "_into", "_on", "_threads"];

/// What stands in for the rule for one launcher.
pub enum Counterpart {
    /// Its reference function has another name: `reference::NAME`.
    Named(&'static str),
    /// It needs no reference function (the reason says what checks it instead).
    Exempt,
}

/// One entry of tidy's exception table.
pub struct Exception {
    pub family: &'static str,
    /// The launcher: `name`, or `submodule::name` for one in `F/submodule.rs`.
    pub function: &'static str,
    pub counterpart: Counterpart,
    pub reason: &'static str,
}

/// One source file of a family, scanned, with the module path it is.
struct Source {
    path: String,
    /// Segments below the family (`["mlp"]` for `lrp/mlp.rs`).
    module: Vec<String>,
    scanned: Scanned,
}

/// A free function of a family, with where it is.
struct Func {
    item: FnItem,
    source: usize,
    /// Names of the family functions it calls (single-segment, `super::` or `self::` calls).
    callees: BTreeSet<String>,
    launches: bool,
    /// The family function its whole body calls, when it is a wrapper.
    wraps: Option<String>,
}

/// The findings for the tree at `root`; `table`: tidy's exceptions (`table_path`: where they are
/// written, for findings about the table itself).
pub fn check(root: &Path, table: &[Exception], table_path: &str) -> Result<Vec<Finding>, String> {
    let ops = root.join("host/src/ops");
    let gpu_tests = read_tests(root)?;
    let mut findings = Vec::new();
    let mut launchers_seen: BTreeSet<(String, String)> = BTreeSet::new();
    for family in families(&ops)? {
        findings.extend(check_family(
            root,
            &family,
            table,
            &gpu_tests,
            &mut launchers_seen,
        )?);
    }
    let table_text = std::fs::read_to_string(root.join(table_path)).unwrap_or_default();
    for e in table {
        let known = launchers_seen.contains(&(e.family.to_string(), e.function.to_string()));
        if !known {
            let line = table_text
                .lines()
                .position(|l| l.contains(&format!("function: \"{}\"", e.function)))
                .map_or(0, |n| n + 1);
            findings.push(Finding::new(
                table_path,
                line,
                "exception table entry names no launcher of the family (remove or rename it)",
                format!("{}::{}, kept because: {}", e.family, e.function, e.reason),
            ));
        }
    }
    Ok(findings)
}

/// Family names: `F.rs` and `F/mod.rs` under host/src/ops (not ops' own mod.rs).
fn families(ops: &Path) -> Result<Vec<String>, String> {
    let mut out = BTreeSet::new();
    let entries =
        std::fs::read_dir(ops).map_err(|e| format!("cannot read {}: {e}", ops.display()))?;
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().to_string();
        if let Some(stem) = name.strip_suffix(".rs").filter(|s| *s != "mod") {
            out.insert(stem.to_string());
        } else if path.join("mod.rs").is_file() {
            out.insert(name);
        }
    }
    Ok(out.into_iter().collect())
}

/// host/tests/gpu_*.rs, scanned, each with the full paths its calls resolve to.
fn read_tests(root: &Path) -> Result<Vec<BTreeSet<String>>, String> {
    let dir = root.join("host/tests");
    let mut out = Vec::new();
    let entries =
        std::fs::read_dir(&dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if name.starts_with("gpu_") && name.ends_with(".rs") {
            let text = std::fs::read_to_string(entry.path())
                .map_err(|e| format!("cannot read host/tests/{name}: {e}"))?;
            let s = scan(&text);
            let imports = Imports::read(&s, 0, s.masked.len(), &[]);
            out.push(resolved_calls(&s, 0, s.masked.len(), &imports));
        }
    }
    Ok(out)
}

fn check_family(
    root: &Path,
    family: &str,
    table: &[Exception],
    gpu_tests: &[BTreeSet<String>],
    launchers_seen: &mut BTreeSet<(String, String)>,
) -> Result<Vec<Finding>, String> {
    let ops = "host/src/ops";
    let module_file = if root.join(ops).join(format!("{family}.rs")).is_file() {
        format!("{ops}/{family}.rs")
    } else {
        format!("{ops}/{family}/mod.rs")
    };
    let mut paths = vec![module_file.clone()];
    rust_files(root, &root.join(ops).join(family), &mut paths);
    let paths: BTreeSet<String> = paths.into_iter().collect();
    let mut sources = Vec::new();
    for path in &paths {
        let text = std::fs::read_to_string(root.join(path))
            .map_err(|e| format!("cannot read {path}: {e}"))?;
        sources.push(Source {
            path: path.clone(),
            module: module_below(path, family),
            scanned: scan(&text),
        });
    }
    let test_files = test_only_files(
        &sources
            .iter()
            .map(|s| (s.path.as_str(), &s.scanned))
            .collect::<Vec<_>>(),
    );
    let is_reference = |s: &Source| s.module.first().is_some_and(|m| m == "reference");
    let family_path = |module: &[String]| -> Vec<String> {
        ["crate", "ops", family]
            .iter()
            .map(|s| s.to_string())
            .chain(module.iter().cloned())
            .collect()
    };

    // The reference module's public functions, and the tests' resolved calls.
    let mut reference_fns: BTreeSet<String> = BTreeSet::new();
    let mut has_reference = false;
    let mut tests: Vec<BTreeSet<String>> = gpu_tests.to_vec();
    for s in &sources {
        let m = &s.scanned;
        if test_files.contains(&s.path) {
            // A tests.rs is a child of the module that declares it: its `super` is that module.
            let parent = &s.module[..s.module.len().saturating_sub(1)];
            let p = family_path(parent);
            let p: Vec<&str> = p.iter().map(String::as_str).collect();
            tests.push(resolved_calls(
                m,
                0,
                m.masked.len(),
                &Imports::read(m, 0, m.masked.len(), &p),
            ));
            continue;
        }
        if is_reference(s) {
            has_reference = true;
            if s.module.len() == 1 {
                reference_fns.extend(
                    free_fns(m, 0, m.masked.len())
                        .into_iter()
                        .filter(|f| f.public)
                        .map(|f| f.name),
                );
            }
            continue;
        }
        if s.module.is_empty()
            && let Some((from, to)) = inline_module(m, "reference")
        {
            has_reference = true;
            reference_fns.extend(
                free_fns(m, from, to)
                    .into_iter()
                    .filter(|f| f.public)
                    .map(|f| f.name),
            );
        }
        for &(from, to) in &m.test_items {
            if m.masked[from..to].contains("mod ") && m.masked[from..to].contains('{') {
                let p = family_path(&s.module);
                let p: Vec<&str> = p.iter().map(String::as_str).collect();
                tests.push(resolved_calls(m, from, to, &Imports::read(m, from, to, &p)));
            }
        }
    }
    let mut findings = Vec::new();
    if !has_reference {
        findings.push(Finding::new(
            &module_file,
            1,
            "op family has no `reference` module (CPU references)",
            family.to_string(),
        ));
    }

    // The family's free functions and its call graph.
    let mut funcs: Vec<Func> = Vec::new();
    for (i, s) in sources.iter().enumerate() {
        if test_files.contains(&s.path) || is_reference(s) {
            continue;
        }
        let m = &s.scanned;
        for item in free_fns(m, 0, m.masked.len()) {
            let body = calls(&m.masked, item.body.0, item.body.1);
            let launches = body.iter().any(|c| {
                c.last().is_some_and(|l| LAUNCH_CALLS.contains(&l.as_str()))
                    && (c.len() == 1 || c[c.len() - 2] == "launch")
            });
            let callees = body
                .iter()
                .filter(|c| {
                    c.len() == 1 || (c.len() == 2 && matches!(c[0].as_str(), "super" | "self"))
                })
                .filter_map(|c| c.last().cloned())
                .collect();
            let wraps = wrapped_call(&m.masked, &item);
            funcs.push(Func {
                item,
                source: i,
                callees,
                launches,
                wraps,
            });
        }
    }
    let names: BTreeSet<String> = funcs.iter().map(|f| f.item.name.clone()).collect();
    for f in &mut funcs {
        f.callees.retain(|c| names.contains(c));
        f.wraps = f.wraps.take().filter(|w| names.contains(w));
    }
    // Launching: a fixed point over the graph (by name: a family's free functions have distinct
    // names in practice, and a clash only merges two nodes).
    let mut launching: BTreeSet<String> = funcs
        .iter()
        .filter(|f| f.launches)
        .map(|f| f.item.name.clone())
        .collect();
    loop {
        let more: Vec<String> = funcs
            .iter()
            .filter(|f| {
                !launching.contains(&f.item.name) && f.callees.iter().any(|c| launching.contains(c))
            })
            .map(|f| f.item.name.clone())
            .collect();
        if more.is_empty() {
            break;
        }
        launching.extend(more);
    }

    for f in funcs
        .iter()
        .filter(|f| f.item.public && launching.contains(&f.item.name))
    {
        let s = &sources[f.source];
        let qualified = s
            .module
            .iter()
            .chain([&f.item.name])
            .cloned()
            .collect::<Vec<_>>()
            .join("::");
        launchers_seen.insert((family.to_string(), qualified.clone()));
        launchers_seen.insert((family.to_string(), f.item.name.clone()));
        let entry = |name: &str| {
            table.iter().find(|e| {
                e.family == family
                    && (e.function == name || (name == f.item.name && e.function == qualified))
            })
        };
        let what = format!("pub fn {qualified}");
        let counterpart = counterpart(&f.item.name, &funcs, &reference_fns, &entry);
        let r = match counterpart {
            Found::Exempt => continue,
            Found::None => {
                findings.push(Finding::new(
                    &s.path,
                    f.item.line,
                    "launches a kernel but has no CPU reference: no reference::NAME for it, its \
                     un-suffixed name or what it wraps, and no entry in tidy's exception table",
                    what,
                ));
                continue;
            }
            Found::Named(r) => r,
        };
        if !reference_fns.contains(&r) {
            findings.push(Finding::new(
                &s.path,
                f.item.line,
                "tidy's exception table names a reference function that does not exist",
                format!("{what} -> reference::{r}"),
            ));
            continue;
        }
        let related = related(&f.item.name, &funcs);
        let base = family_path(&[]).join("::");
        let reference_path = format!("{base}::reference::{r}");
        let covered = tests.iter().any(|t| {
            t.contains(&reference_path)
                && t.iter().any(|p| {
                    p.starts_with(&format!("{base}::"))
                        && !p.contains("::reference::")
                        && related.iter().any(|y| p.ends_with(&format!("::{y}")))
                })
        });
        if !covered {
            findings.push(Finding::new(
                &s.path,
                f.item.line,
                "no test calls both it (or a public function reaching it) and its CPU reference",
                format!("{what} vs reference::{r}"),
            ));
        }
    }
    Ok(findings)
}

/// The module path below the family of one of its files: `lrp/mlp.rs` → `["mlp"]`, `lrp.rs` and
/// `lrp/mod.rs` → `[]`.
fn module_below(path: &str, family: &str) -> Vec<String> {
    let rel = path
        .strip_prefix("host/src/ops/")
        .unwrap_or(path)
        .trim_end_matches(".rs");
    if rel == family {
        return Vec::new();
    }
    let mut module: Vec<String> = rel
        .strip_prefix(&format!("{family}/"))
        .unwrap_or(rel)
        .split('/')
        .map(String::from)
        .collect();
    if module.last().is_some_and(|m| m == "mod") {
        module.pop();
    }
    module
}

/// The function a wrapper's whole body calls: the body is `path(args)` and nothing else.
fn wrapped_call(masked: &str, item: &FnItem) -> Option<String> {
    let inner = masked
        .get(item.body.0 + 1..item.body.1.saturating_sub(1))?
        .trim();
    let open = inner.find('(')?;
    let head: String = inner[..open]
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    let segments: Vec<&str> = head.split("::").collect();
    let simple =
        segments.len() == 1 || (segments.len() == 2 && matches!(segments[0], "super" | "self"));
    let ident =
        |s: &str| !s.is_empty() && s.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_');
    if !simple || !segments.iter().all(|s| ident(s)) || closing(inner, open) + 1 != inner.len() {
        return None;
    }
    segments.last().map(|s| s.to_string())
}

enum Found {
    Named(String),
    Exempt,
    None,
}

/// Rule 3: the reference function of launcher `name`.
fn counterpart<'t>(
    name: &str,
    funcs: &[Func],
    reference_fns: &BTreeSet<String>,
    entry: &dyn Fn(&str) -> Option<&'t Exception>,
) -> Found {
    let mut seen = BTreeSet::new();
    let mut current = name.to_string();
    while seen.insert(current.clone()) {
        let mut candidate = current.clone();
        loop {
            if let Some(e) = entry(&candidate) {
                return match e.counterpart {
                    Counterpart::Named(r) => Found::Named(r.to_string()),
                    Counterpart::Exempt => Found::Exempt,
                };
            }
            if reference_fns.contains(&candidate) {
                return Found::Named(candidate);
            }
            match VARIANT_SUFFIXES
                .iter()
                .find_map(|s| candidate.strip_suffix(s))
            {
                Some(shorter) => candidate = shorter.to_string(),
                None => break,
            }
        }
        match funcs
            .iter()
            .find(|f| f.item.name == current)
            .and_then(|f| f.wraps.clone())
        {
            Some(target) => current = target,
            None => break,
        }
    }
    Found::None
}

/// Rule 4's functions: the wrapper chain `name` starts, and everything public that calls into it.
fn related(name: &str, funcs: &[Func]) -> BTreeSet<String> {
    let mut set: BTreeSet<String> = BTreeSet::from([name.to_string()]);
    let mut current = name.to_string();
    while let Some(next) = funcs
        .iter()
        .find(|f| f.item.name == current)
        .and_then(|f| f.wraps.clone())
    {
        if !set.insert(next.clone()) {
            break;
        }
        current = next;
    }
    let callers: BTreeMap<&str, Vec<&str>> = funcs.iter().fold(BTreeMap::new(), |mut m, f| {
        for c in &f.callees {
            m.entry(c.as_str())
                .or_insert_with(Vec::new)
                .push(f.item.name.as_str());
        }
        m
    });
    let mut todo: Vec<String> = set.iter().cloned().collect();
    while let Some(n) = todo.pop() {
        for caller in callers.get(n.as_str()).into_iter().flatten() {
            if set.insert(caller.to_string()) {
                todo.push(caller.to_string());
            }
        }
    }
    let public: BTreeSet<&str> = funcs
        .iter()
        .filter(|f| f.item.public)
        .map(|f| f.item.name.as_str())
        .collect();
    set.retain(|n| public.contains(n.as_str()));
    set
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small tree: family `foo` with a wrapper chain, an untested reference and a launcher without
    /// one; family `bare` without a reference module.
    #[test]
    fn the_rule_on_a_small_tree() {
        let root = std::env::temp_dir().join(format!("rgk-tidy-references-{}", std::process::id()));
        let write = |path: &str, text: &str| {
            let p = root.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        };
        write("host/src/ops/mod.rs", "pub mod foo;\npub mod bare;\n");
        write(
            "host/src/ops/foo.rs",
            r#"use crate::launch::{launch, launch_cfg};
pub fn foo(x: &T) -> R {
    foo_on(x, Path::Auto)
}
pub fn foo_on(x: &T, p: Path) -> R { run(x, p) }
fn run(x: &T, p: Path) -> R { launch(gpu, "foo_f32", 1, 1, &[]) }
pub fn twice(x: &T) -> R { foo(x) }
pub fn bar(x: &T) -> R { launch_cfg(gpu, "bar_f32", cfg, &[]) }
pub fn baz(x: &T) -> R { crate::launch::launch(gpu, "baz_f32", 1, 1, &[]) }
pub fn helper() -> u32 { 3 }
pub mod reference {
    pub fn foo(x: &H) -> H { x.clone() }
    pub fn bar(x: &H) -> H { x.clone() }
}
#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn only_the_reference() { reference::bar(&h); }
}
"#,
        );
        write(
            "host/src/ops/bare.rs",
            "pub fn q() { launch(gpu, \"q_f32\", 1, 1, &[]) }\n",
        );
        write(
            "host/tests/gpu_foo.rs",
            "use host::ops::foo::{self, reference as r};\n#[test]\nfn t() { foo::foo_on(&x, P); r::foo(&h); }\n",
        );
        write("xtask/src/tidy.rs", "    function: \"gone\",\n");
        let table = [Exception {
            family: "foo",
            function: "gone",
            counterpart: Counterpart::Exempt,
            reason: "a test entry",
        }];
        let found = check(&root, &table, "xtask/src/tidy.rs").unwrap();
        let _ = std::fs::remove_dir_all(&root);
        let got: Vec<String> = found
            .iter()
            .map(|f| format!("{}:{} {}", f.path, f.line, f.text))
            .collect();
        assert_eq!(
            got,
            [
                "host/src/ops/bare.rs:1 bare",
                "host/src/ops/bare.rs:1 pub fn q",
                "host/src/ops/foo.rs:8 pub fn bar vs reference::bar",
                "host/src/ops/foo.rs:9 pub fn baz",
                "xtask/src/tidy.rs:1 foo::gone, kept because: a test entry",
            ]
        );
    }

    #[test]
    fn wrappers_are_single_calls() {
        let s = scan("fn a() { b(x, (1, 2)) }\nfn c() { b(x)?; Ok(()) }\nfn d() { super::b(y) }");
        let fns = free_fns(&s, 0, s.masked.len());
        let wraps: Vec<Option<String>> = fns.iter().map(|f| wrapped_call(&s.masked, f)).collect();
        assert_eq!(wraps, [Some("b".into()), None, Some("b".into())]);
    }
}
