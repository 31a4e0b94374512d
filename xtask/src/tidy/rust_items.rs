//! What the op-reference check reads from Rust text: the free functions of a module and the calls in
//! them, and, in test files, the paths their calls resolve to through `use` declarations. Text-level
//! (no macro expansion, no type information): good for this codebase's plain style, documented where
//! it approximates.
use std::collections::{BTreeMap, BTreeSet};

use super::launcher_names::launcher_scan::{Scanned, closing, ident_at, is_ident, skip_space};

/// A free function (`fn` at the top level of the scanned range).
#[derive(Clone, Debug)]
pub struct FnItem {
    pub name: String,
    /// `pub fn` (not `pub(crate)`): part of the crate's API.
    pub public: bool,
    /// 1-based line of the `fn` keyword.
    pub line: usize,
    /// Byte range of the body, braces included.
    pub body: (usize, usize),
}

/// The `fn` items at brace depth 0 of `masked[from..to]`, skipping `#[cfg(test)]` items.
pub fn free_fns(s: &Scanned, from: usize, to: usize) -> Vec<FnItem> {
    let m = &s.masked;
    let b = m.as_bytes();
    let mut out = Vec::new();
    let (mut depth, mut k) = (0usize, from);
    while k < to {
        match b[k] {
            b'{' => depth += 1,
            b'}' => depth = depth.saturating_sub(1),
            b'f' if depth == 0
                && (k == 0 || !is_ident(b[k - 1]))
                && ident_at(m, k) == "fn"
                && b.get(k + 2).is_some_and(u8::is_ascii_whitespace)
                && !s.in_test_item(k) =>
            {
                let name_at = skip_space(m, k + 2);
                let name = ident_at(m, name_at).to_string();
                // The body: the first `{` after the signature's brackets (`;` ends a body-less fn).
                let mut j = name_at + name.len();
                while j < to && !matches!(b[j], b'{' | b';') {
                    j = if matches!(b[j], b'(' | b'[') {
                        closing(m, j) + 1
                    } else {
                        j + 1
                    };
                }
                if j < to && b[j] == b'{' {
                    let end = closing(m, j) + 1;
                    let line_start = m[..k].rfind('\n').map_or(0, |p| p + 1);
                    let before: Vec<&str> = m[line_start..k].split_whitespace().collect();
                    let public = before
                        .iter()
                        .rev()
                        .find(|w| !matches!(**w, "const" | "unsafe" | "async" | "extern"))
                        .is_some_and(|w| *w == "pub");
                    out.push(FnItem {
                        name,
                        public,
                        line: m[..k].matches('\n').count() + 1,
                        body: (j, end),
                    });
                    k = end;
                    continue;
                }
                k = j;
                continue;
            }
            _ => {}
        }
        k += 1;
    }
    out
}

/// The block of an inline module `mod name { .. }` at depth 0: the range inside its braces.
pub fn inline_module(s: &Scanned, name: &str) -> Option<(usize, usize)> {
    let m = &s.masked;
    for (at, _) in m.match_indices("mod ") {
        if at > 0 && is_ident(m.as_bytes()[at - 1]) {
            continue;
        }
        let name_at = skip_space(m, at + 3);
        if ident_at(m, name_at) != name {
            continue;
        }
        let open = skip_space(m, name_at + name.len());
        if m.as_bytes().get(open) == Some(&b'{') {
            return Some((open + 1, closing(m, open)));
        }
    }
    None
}

/// Calls in `masked[from..to]`: each path (`a::b::f`) written before `(`, as segments. Method calls
/// (`.f(`), macros (`f!(`) and `fn f(` declarations are not calls.
pub fn calls(masked: &str, from: usize, to: usize) -> Vec<Vec<String>> {
    let b = masked.as_bytes();
    let mut out = Vec::new();
    let mut k = from;
    while k < to {
        if !(b[k].is_ascii_alphabetic() || b[k] == b'_') || (k > 0 && is_ident(b[k - 1])) {
            k += 1;
            continue;
        }
        let start = k;
        let mut segments = Vec::new();
        loop {
            let seg = ident_at(masked, k);
            segments.push(seg.to_string());
            k += seg.len();
            let next = skip_space(masked, k);
            if masked[next..].starts_with("::") {
                let after = skip_space(masked, next + 2);
                if b.get(after)
                    .is_some_and(|&c| c.is_ascii_alphabetic() || c == b'_')
                {
                    k = after;
                    continue;
                }
            }
            break;
        }
        let next = skip_space(masked, k);
        let before = masked[..start].trim_end();
        let is_call = b.get(next) == Some(&b'(')
            && !before.ends_with('.')
            && !before.ends_with("fn")
            && !before.ends_with("::");
        if is_call {
            out.push(segments);
        }
    }
    out
}

/// The names a file's `use` declarations bring in, as full paths from the crate root (`crate::..`;
/// an integration test's `host::` is the same crate), and its glob imports. One table for the whole
/// file: a `use` inside a function counts everywhere (an approximation that only ever adds names).
pub struct Imports {
    names: BTreeMap<String, Vec<String>>,
    globs: Vec<Vec<String>>,
    /// What `super` means in this file: the parent of the test module.
    parent: Vec<String>,
}

impl Imports {
    /// The `use` declarations in `masked[from..to]`; `parent`: the module path `super::` resolves to
    /// (empty for an integration test).
    pub fn read(s: &Scanned, from: usize, to: usize, parent: &[&str]) -> Imports {
        let mut imports = Imports {
            names: BTreeMap::new(),
            globs: Vec::new(),
            parent: parent.iter().map(|p| p.to_string()).collect(),
        };
        let m = &s.masked[..to];
        for (at, _) in m.match_indices("use ").filter(|(at, _)| *at >= from) {
            if at > 0 && is_ident(m.as_bytes()[at - 1]) {
                continue;
            }
            let end = m[at..].find(';').map_or(m.len(), |p| at + p);
            let tokens = use_tokens(&m[at + 4..end]);
            let mut pos = 0;
            let mut found = Vec::new();
            use_tree(&tokens, &mut pos, Vec::new(), &mut found);
            for (local, path) in found {
                let path = imports.absolute(&path);
                match local {
                    Some(local) => {
                        imports.names.insert(local, path);
                    }
                    None => imports.globs.push(path),
                }
            }
        }
        imports
    }

    /// `path` with its first segment made absolute: `host`/`crate`, `super`, or a name imported
    /// earlier (`use exact::Shape` after `use super::reference::exact`).
    fn absolute(&self, path: &[String]) -> Vec<String> {
        let Some((first, rest)) = path.split_first() else {
            return Vec::new();
        };
        let mut out = match first.as_str() {
            "host" | "crate" => vec!["crate".to_string()],
            "super" => self.parent.clone(),
            other => self
                .names
                .get(other)
                .cloned()
                .unwrap_or_else(|| vec![other.to_string()]),
        };
        out.extend(rest.iter().cloned());
        out
    }

    /// Full paths a call's path may denote: through the imports, and under each glob import.
    pub fn resolve(&self, path: &[String]) -> Vec<String> {
        let mut out = vec![self.absolute(path).join("::")];
        for g in &self.globs {
            out.push(g.iter().chain(path).cloned().collect::<Vec<_>>().join("::"));
        }
        out
    }
}

/// Every full path the calls of `masked[from..to]` may denote.
pub fn resolved_calls(s: &Scanned, from: usize, to: usize, imports: &Imports) -> BTreeSet<String> {
    calls(&s.masked, from, to)
        .iter()
        .flat_map(|c| imports.resolve(c))
        .collect()
}

fn use_tokens(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let b = text.as_bytes();
    let mut k = 0;
    while k < b.len() {
        let c = b[k];
        if is_ident(c) {
            let w = ident_at(text, k);
            out.push(w.to_string());
            k += w.len();
        } else if text[k..].starts_with("::") {
            out.push("::".into());
            k += 2;
        } else {
            if matches!(c, b'{' | b'}' | b',' | b'*') {
                out.push((c as char).to_string());
            }
            k += 1;
        }
    }
    out
}

/// One use tree (`a::b::{c, d as e, f::*, self}`) into (local name or `None` for a glob, path).
fn use_tree(
    t: &[String],
    pos: &mut usize,
    prefix: Vec<String>,
    out: &mut Vec<(Option<String>, Vec<String>)>,
) {
    let mut path = prefix;
    while *pos < t.len() {
        match t[*pos].as_str() {
            "::" => *pos += 1,
            "*" => {
                *pos += 1;
                out.push((None, path));
                return;
            }
            "{" => {
                *pos += 1;
                while *pos < t.len() && t[*pos] != "}" {
                    if t[*pos] == "," {
                        *pos += 1;
                        continue;
                    }
                    use_tree(t, pos, path.clone(), out);
                }
                *pos += 1;
                return;
            }
            "}" | "," => break,
            "as" => {
                let local = t.get(*pos + 1).cloned().unwrap_or_default();
                *pos += 2;
                if local != "_" {
                    out.push((Some(local), path));
                }
                return;
            }
            "self" if !path.is_empty() => *pos += 1,
            word => {
                path.push(word.to_string());
                *pos += 1;
            }
        }
    }
    if let Some(last) = path.last().cloned() {
        out.push((Some(last), path));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tidy::launcher_names::launcher_scan::scan;

    #[test]
    fn free_functions_with_visibility_and_bodies() {
        let s = scan(
            "pub fn a(x: (u32, u32)) -> R<(A, B)> { b(x) }\nfn b() {}\npub(crate) fn c() {}\n\
             impl T { pub fn m(&self) { a() } }\n#[cfg(test)]\nfn t() {}\nmod reference { pub fn a() {} }",
        );
        let fns = free_fns(&s, 0, s.masked.len());
        let names: Vec<(&str, bool, usize)> = fns
            .iter()
            .map(|f| (f.name.as_str(), f.public, f.line))
            .collect();
        assert_eq!(names, [("a", true, 1), ("b", false, 2), ("c", false, 3)]);
        assert_eq!(
            calls(&s.masked, fns[0].body.0, fns[0].body.1),
            [vec!["b".to_string()]]
        );
        let (from, to) = inline_module(&s, "reference").unwrap();
        assert_eq!(free_fns(&s, from, to)[0].name, "a");
    }

    #[test]
    fn calls_are_paths_before_parentheses() {
        let s = scan("ew::binary(a, b); x.method(); v!(q); super::f (1); Tensor::new(); fn g() {}");
        let got: Vec<String> = calls(&s.masked, 0, s.masked.len())
            .iter()
            .map(|c| c.join("::"))
            .collect();
        assert_eq!(got, ["ew::binary", "super::f", "Tensor::new"]);
    }

    #[test]
    fn imports_resolve_aliases_groups_and_globs() {
        let s = scan(
            "use host::ops::lrp::{self, Activation, reference as lr, mlp::{self, MlpLayer}};\n\
             use host::ops::matmul::{Transpose, matmul, reference};\nuse super::*;\n\
             use super::reference::{exact, LayerParams};\nuse exact::Shape;",
        );
        let i = Imports::read(&s, 0, s.masked.len(), &["crate", "ops", "clifford"]);
        let r = |p: &str| i.resolve(&p.split("::").map(String::from).collect::<Vec<_>>());
        assert_eq!(
            r("lr::relevance")[0],
            "crate::ops::lrp::reference::relevance"
        );
        assert_eq!(r("mlp::explain")[0], "crate::ops::lrp::mlp::explain");
        assert_eq!(r("lrp::dense")[0], "crate::ops::lrp::dense");
        assert_eq!(r("matmul")[0], "crate::ops::matmul::matmul");
        assert_eq!(
            r("reference::matmul")[0],
            "crate::ops::matmul::reference::matmul"
        );
        assert_eq!(
            r("Shape::new")[0],
            "crate::ops::clifford::reference::exact::Shape::new"
        );
        assert!(r("sgp_forward").contains(&"crate::ops::clifford::sgp_forward".to_string()));
    }
}
