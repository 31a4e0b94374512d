// Kernel entry-point names that the host launchers name: the data of tidy's check "every PTX entry point
// is launched from somewhere" (`entries.rs`, on the kernel modules xtask links through `host`).
//
// A launcher names a kernel with a string literal ("lrp_sums_f32", a `match` arm returning
// "sgp_fwd_c4") or with a macro that glues a literal to fixed suffixes: `kernel_name!("softmax", dtype)`
// (host/src/launch.rs: `concat!($op, "_f32")` and the f16/bf16 arms) or a file's own `macro_rules!`
// of the same shape (matmul's `tc_names!("matmul_tc")`). Both are read from the sources, so a new
// macro of that shape needs no change here. The collected set is a superset (every literal that
// could be a name counts), which is what the check needs: an entry point in no launcher's text at all
// is dead code or a launcher that builds names some other way.

/// Every entry-point name the sources (`(path, text)`, host/src/**/*.rs) name: string literals of the
/// form `[a-z][a-z0-9_]*`, and the expansions of macros whose body is `concat!($param, "suffix")`
/// arms (`kernel_name!("op", dtype)` gives `op_f32`, `op_f16`, `op_bf16`). Test code is skipped:
/// files named `tests.rs`, modules declared `#[cfg(test)] mod name;` in another source, files
/// starting `#![cfg(test)]`, and every `#[cfg(test)]` item inside a file.
pub fn launcher_kernel_names(sources: &[(&str, &str)]) -> std::collections::BTreeSet<String> {
    let scanned: Vec<(String, launcher_scan::Scanned)> = sources
        .iter()
        .map(|(path, text)| (path.replace('\\', "/"), launcher_scan::scan(text)))
        .collect();
    let test_files = launcher_scan::test_only_files(
        &scanned
            .iter()
            .map(|(p, s)| (p.as_str(), s))
            .collect::<Vec<_>>(),
    );
    let kept: Vec<&launcher_scan::Scanned> = scanned
        .iter()
        .filter(|(p, s)| !test_files.contains(p) && !s.whole_file_is_test)
        .map(|(_, s)| s)
        .collect();
    // `kernel_name!` is exported from host/src/launch.rs; its suffixes are known here too, so that a
    // caller passing only some files still gets its expansions (a definition found in the sources wins).
    let mut macros: Vec<(String, Vec<String>)> = vec![(
        "kernel_name".to_string(),
        vec!["_f32".to_string(), "_f16".to_string(), "_bf16".to_string()],
    )];
    for s in &kept {
        for (name, suffixes) in launcher_scan::concat_macros(s) {
            macros.retain(|(n, _)| *n != name);
            macros.push((name, suffixes));
        }
    }
    let mut names = std::collections::BTreeSet::new();
    for s in &kept {
        for (offset, lit) in &s.literals {
            if !s.in_test_item(*offset) && launcher_scan::looks_like_entry(lit) {
                names.insert(lit.clone());
            }
        }
        for (name, suffixes) in &macros {
            for prefix in launcher_scan::macro_prefixes(s, name) {
                for suffix in suffixes {
                    names.insert(format!("{prefix}{suffix}"));
                }
            }
        }
    }
    names
}

/// The entry points (from the PTX) that no launcher names, in the order given, each once.
pub fn unnamed_entries(
    entries: &[&str],
    named: &std::collections::BTreeSet<String>,
) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for e in entries {
        if !named.contains(*e) && !out.iter().any(|o| o == e) {
            out.push(e.to_string());
        }
    }
    out
}

/// Reading Rust text without a parser: comments and literals blanked, items found by brace matching.
/// Shared with tidy's op-reference check, which reads the same sources.
pub mod launcher_scan {
    /// One source, scanned.
    pub struct Scanned {
        /// The text with comments and the insides of string and char literals replaced by spaces
        /// (newlines kept), so byte offsets match the original and brackets in prose never count.
        pub masked: String,
        /// String literals: the byte offset of the opening quote and the text between the quotes.
        pub literals: Vec<(usize, String)>,
        /// Byte ranges of `#[cfg(test)]` items (attribute to end of item).
        pub test_items: Vec<(usize, usize)>,
        /// `#![cfg(test)]` at the top: the whole file is test code.
        pub whole_file_is_test: bool,
    }

    impl Scanned {
        pub fn in_test_item(&self, offset: usize) -> bool {
            self.test_items
                .iter()
                .any(|&(a, b)| a <= offset && offset < b)
        }
    }

    pub fn scan(text: &str) -> Scanned {
        let (masked, literals) = mask(text);
        let test_items = test_items(&masked);
        let whole_file_is_test = masked.trim_start().starts_with("#![cfg(test)]");
        Scanned {
            masked,
            literals,
            test_items,
            whole_file_is_test,
        }
    }

    pub fn looks_like_entry(s: &str) -> bool {
        let b = s.as_bytes();
        !b.is_empty()
            && b[0].is_ascii_lowercase()
            && b.iter()
                .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_')
    }

    pub fn is_ident(c: u8) -> bool {
        c.is_ascii_alphanumeric() || c == b'_'
    }

    /// See [`Scanned::masked`]. Handles `//` and nested `/* */` comments, `"..."` with escapes,
    /// raw strings `r#"..."#` (and `b`/`br` forms), char literals (told from lifetimes by the closing
    /// quote).
    pub fn mask(text: &str) -> (String, Vec<(usize, String)>) {
        let b = text.as_bytes();
        let n = b.len();
        let mut out = b.to_vec();
        let mut literals = Vec::new();
        let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
            for c in &mut out[from.min(n)..to.min(n)] {
                if *c != b'\n' {
                    *c = b' ';
                }
            }
        };
        let mut i = 0;
        while i < n {
            let c = b[i];
            let after_ident = i > 0 && is_ident(b[i - 1]);
            if c == b'/' && b.get(i + 1) == Some(&b'/') {
                let end = b[i..].iter().position(|&x| x == b'\n').map_or(n, |p| i + p);
                blank(&mut out, i, end);
                i = end;
            } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
                let (mut depth, mut j) = (1, i + 2);
                while j < n && depth > 0 {
                    if b[j] == b'/' && b.get(j + 1) == Some(&b'*') {
                        depth += 1;
                        j += 2;
                    } else if b[j] == b'*' && b.get(j + 1) == Some(&b'/') {
                        depth -= 1;
                        j += 2;
                    } else {
                        j += 1;
                    }
                }
                blank(&mut out, i, j);
                i = j;
            } else if !after_ident && (c == b'r' || (c == b'b' && b.get(i + 1) == Some(&b'r'))) {
                let start = if c == b'b' { i + 2 } else { i + 1 };
                let hashes = b[start.min(n)..].iter().take_while(|&&x| x == b'#').count();
                let quote = start + hashes;
                if b.get(quote) != Some(&b'"') {
                    i += 1;
                    continue;
                }
                let closing: Vec<u8> = std::iter::once(b'"')
                    .chain(std::iter::repeat_n(b'#', hashes))
                    .collect();
                let end = b[quote + 1..]
                    .windows(closing.len())
                    .position(|w| w == closing.as_slice())
                    .map_or(n, |p| quote + 1 + p);
                literals.push((quote, text.get(quote + 1..end).unwrap_or("").to_string()));
                blank(&mut out, quote + 1, end);
                i = end + closing.len();
            } else if c == b'"' {
                let mut j = i + 1;
                while j < n && b[j] != b'"' {
                    j += if b[j] == b'\\' { 2 } else { 1 };
                }
                literals.push((i, text.get(i + 1..j.min(n)).unwrap_or("").to_string()));
                blank(&mut out, i + 1, j);
                i = j + 1;
            } else if c == b'\'' {
                if b.get(i + 1) == Some(&b'\\') {
                    // '\n', '\'', '\u{..}': the escaped character, then up to the closing quote.
                    let end = b[(i + 3).min(n)..]
                        .iter()
                        .position(|&x| x == b'\'')
                        .map_or(n, |p| i + 3 + p);
                    blank(&mut out, i + 1, end);
                    i = end + 1;
                } else {
                    let width = match b.get(i + 1) {
                        Some(&x) if x >= 0xF0 => 4,
                        Some(&x) if x >= 0xE0 => 3,
                        Some(&x) if x >= 0xC0 => 2,
                        _ => 1,
                    };
                    if b.get(i + 1 + width) == Some(&b'\'') {
                        blank(&mut out, i + 1, i + 1 + width);
                        i += 2 + width;
                    } else {
                        i += 1; // a lifetime or a label
                    }
                }
            } else {
                i += 1;
            }
        }
        // Only whole characters were blanked (every range starts and ends at an ASCII delimiter), so
        // this is UTF-8; the lossy path is never taken.
        let masked = String::from_utf8(out)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
        (masked, literals)
    }

    /// The offset of the bracket closing the one at `open` (any of `([{`, counted together), or the
    /// end of the text.
    pub fn closing(masked: &str, open: usize) -> usize {
        let mut depth = 0usize;
        for (k, &c) in masked.as_bytes().iter().enumerate().skip(open) {
            match c {
                b'(' | b'[' | b'{' => depth += 1,
                b')' | b']' | b'}' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        return k;
                    }
                }
                _ => {}
            }
        }
        masked.len()
    }

    /// Offset of the first non-whitespace byte at or after `from`.
    pub fn skip_space(masked: &str, from: usize) -> usize {
        masked.as_bytes()[from.min(masked.len())..]
            .iter()
            .position(|c| !c.is_ascii_whitespace())
            .map_or(masked.len(), |p| from + p)
    }

    /// The identifier starting at `from` (empty if none).
    pub fn ident_at(masked: &str, from: usize) -> &str {
        let b = masked.as_bytes();
        let end = b[from.min(b.len())..]
            .iter()
            .position(|&c| !is_ident(c))
            .map_or(b.len(), |p| from + p);
        &masked[from.min(end)..end]
    }

    /// Every occurrence of the whole word `word` (not inside a longer identifier).
    pub fn word_offsets(masked: &str, word: &str) -> Vec<usize> {
        let b = masked.as_bytes();
        masked
            .match_indices(word)
            .map(|(k, _)| k)
            .filter(|&k| {
                (k == 0 || !is_ident(b[k - 1]))
                    && b.get(k + word.len()).is_none_or(|&c| !is_ident(c))
            })
            .collect()
    }

    /// `#[cfg(test)]` items: from the attribute to the end of the item (its closing brace for items
    /// with a body, else its `;`), with further attributes in between. An attribute on a field or a
    /// match arm ends at the `,` or at the enclosing bracket.
    fn test_items(masked: &str) -> Vec<(usize, usize)> {
        let b = masked.as_bytes();
        let mut out = Vec::new();
        for (start, _) in masked.match_indices("#[cfg(test)]") {
            let mut k = skip_space(masked, start + "#[cfg(test)]".len());
            while b.get(k) == Some(&b'#') {
                k = skip_space(masked, closing(masked, k + 1) + 1);
            }
            // The item's keyword, after the visibility and `const`/`unsafe`/`async`/`extern` before `fn`.
            let mut w = k;
            loop {
                let word = ident_at(masked, w);
                let next = skip_space(masked, w + word.len());
                match word {
                    "pub" if b.get(next) == Some(&b'(') => {
                        w = skip_space(masked, closing(masked, next) + 1)
                    }
                    "pub" | "unsafe" | "async" | "extern" => w = next,
                    "const" if ident_at(masked, next) == "fn" => w = next,
                    _ => break,
                }
            }
            let keyword = ident_at(masked, w);
            let ends_with_body = matches!(
                keyword,
                "fn" | "mod" | "impl" | "struct" | "enum" | "trait" | "union" | "macro_rules"
            );
            // Not an item (a field, an arm): it ends at its comma. Items may hold commas (`<A, B>`).
            let is_item = ends_with_body
                || matches!(
                    keyword,
                    "use" | "const" | "static" | "type" | "extern" | "let"
                );
            let mut j = k;
            let end = loop {
                match b.get(j) {
                    None => break b.len(),
                    Some(b';') => break j + 1,
                    Some(b',') if !is_item => break j + 1,
                    Some(b')') | Some(b']') | Some(b'}') => break j,
                    Some(b'(') | Some(b'[') => j = closing(masked, j) + 1,
                    Some(b'{') => {
                        j = closing(masked, j) + 1;
                        if ends_with_body {
                            break j;
                        }
                    }
                    Some(_) => j += 1,
                }
            };
            out.push((start, end));
        }
        out
    }

    /// Files declared `#[cfg(test)] mod name;` by another source: `dir/foo.rs` declares
    /// `dir/foo/name.rs`, `dir/mod.rs` (or lib.rs, main.rs) declares `dir/name.rs`; either may be
    /// `name/mod.rs`. Plus every file named `tests.rs`, the convention, for callers passing few files.
    pub fn test_only_files(scanned: &[(&str, &Scanned)]) -> std::collections::BTreeSet<String> {
        let mut out = std::collections::BTreeSet::new();
        for (path, s) in scanned {
            if path.ends_with("/tests.rs") || *path == "tests.rs" {
                out.insert(path.to_string());
            }
            let (dir, file) = path.rsplit_once('/').unwrap_or(("", path));
            let stem = file.trim_end_matches(".rs");
            let child_dir = if matches!(stem, "mod" | "lib" | "main") {
                dir.to_string()
            } else if dir.is_empty() {
                stem.to_string()
            } else {
                format!("{dir}/{stem}")
            };
            for &(a, b) in &s.test_items {
                let item = s.masked[a..b].trim_end();
                let Some(decl) = item.strip_suffix(';') else {
                    continue;
                };
                let Some(name) = decl.split_whitespace().last() else {
                    continue;
                };
                if decl.split_whitespace().any(|w| w == "mod") && name.bytes().all(is_ident) {
                    let base = if child_dir.is_empty() {
                        name.to_string()
                    } else {
                        format!("{child_dir}/{name}")
                    };
                    out.insert(format!("{base}.rs"));
                    out.insert(format!("{base}/mod.rs"));
                }
            }
        }
        out
    }

    /// Macros defined in `s` whose arms glue their literal argument to suffixes with
    /// `concat!($param, "suffix")`: (name, suffixes).
    pub fn concat_macros(s: &Scanned) -> Vec<(String, Vec<String>)> {
        let b = s.masked.as_bytes();
        let mut out = Vec::new();
        for at in word_offsets(&s.masked, "macro_rules") {
            let after_bang = skip_space(&s.masked, at + "macro_rules".len());
            if b.get(after_bang) != Some(&b'!') {
                continue;
            }
            let name_at = skip_space(&s.masked, after_bang + 1);
            let name = ident_at(&s.masked, name_at);
            let open = skip_space(&s.masked, name_at + name.len());
            if name.is_empty() || s.in_test_item(at) {
                continue;
            }
            let close = closing(&s.masked, open);
            let suffixes: Vec<String> = s
                .literals
                .iter()
                .filter(|(q, _)| open < *q && *q < close && glued_to_param(&s.masked, *q))
                .map(|(_, lit)| lit.clone())
                .collect();
            if !suffixes.is_empty() {
                out.push((name.to_string(), suffixes));
            }
        }
        out
    }

    /// Whether the literal at `quote` is the second argument of `concat!($param, ...)`.
    fn glued_to_param(masked: &str, quote: usize) -> bool {
        let before = masked[..quote].trim_end();
        let Some(before) = before.strip_suffix(',') else {
            return false;
        };
        let before = before
            .trim_end()
            .trim_end_matches(|c: char| c.is_ascii_alphanumeric() || c == '_');
        let Some(before) = before.strip_suffix('$') else {
            return false;
        };
        let before = before.trim_end();
        let Some(before) = before.strip_suffix('(') else {
            return false;
        };
        before.trim_end().ends_with("concat!")
    }

    /// The first string literal of each invocation `name!(..)` in `s` outside test items.
    pub fn macro_prefixes(s: &Scanned, name: &str) -> Vec<String> {
        let b = s.masked.as_bytes();
        let mut out = Vec::new();
        for at in word_offsets(&s.masked, name) {
            let bang = at + name.len();
            if b.get(bang) != Some(&b'!') || s.in_test_item(at) {
                continue;
            }
            let open = skip_space(&s.masked, bang + 1);
            if !matches!(b.get(open), Some(b'(') | Some(b'[') | Some(b'{')) {
                continue;
            }
            let close = closing(&s.masked, open);
            if let Some((_, lit)) = s.literals.iter().find(|(q, _)| open < *q && *q < close) {
                out.push(lit.clone());
            }
        }
        out
    }
}
