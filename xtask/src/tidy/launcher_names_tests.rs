//! Tests of launcher_names.rs, kept apart so that the file a test crate `include!`s holds no tests.
use std::collections::BTreeSet;

use super::launcher_names::launcher_scan::{mask, scan};
use super::launcher_names::{launcher_kernel_names, unnamed_entries};

fn names(sources: &[(&str, &str)]) -> Vec<String> {
    launcher_kernel_names(sources).into_iter().collect()
}

#[test]
fn literals_and_kernel_name_expansions_are_collected() {
    let launch = r#"macro_rules! kernel_name {
    ($op:literal, $dtype:expr) => {
        match $dtype {
            $crate::DType::F32 => concat!($op, "_f32"),
            $crate::DType::F16 => concat!($op, "_f16"),
            $crate::DType::BF16 => concat!($op, "_bf16"),
        }
    };
}"#;
    let op = r#"
fn kernel(d: DType) -> &'static str { kernel_name!("softmax", d) }
fn other() -> &'static str { "lrp_sums_f32" } // "in_a_comment"
const OP: &str = "Not an entry";
"#;
    let got = names(&[
        ("host/src/launch.rs", launch),
        ("host/src/ops/softmax.rs", op),
    ]);
    assert_eq!(
        got,
        [
            "lrp_sums_f32",
            "softmax",
            "softmax_bf16",
            "softmax_f16",
            "softmax_f32"
        ]
    );
    // Without launch.rs among the sources, kernel_name! still expands.
    assert!(names(&[("a.rs", op)]).contains(&"softmax_bf16".to_string()));
}

#[test]
fn a_files_own_concat_macro_expands() {
    let matmul = r#"
macro_rules! tc_names {
    ($p:literal) => { [concat!($p, "_nn_f16"), concat!($p, "_tt_bf16")] };
}
const TC_NAMES: [[&str; 2]; 2] = [tc_names!("matmul_tc"), tc_names!("matmul_tcv1")];
"#;
    assert_eq!(
        names(&[("host/src/ops/matmul.rs", matmul)]),
        [
            "matmul_tc",
            "matmul_tc_nn_f16",
            "matmul_tc_tt_bf16",
            "matmul_tcv1",
            "matmul_tcv1_nn_f16",
            "matmul_tcv1_tt_bf16"
        ]
    );
}

#[test]
fn test_code_is_skipped() {
    let family = r#"
pub fn f() -> &'static str { "kept_f32" }
#[cfg(test)]
mod tests;
#[cfg(test)]
mod inline {
    const X: &str = "inline_test_f32";
}
#[cfg(test)]
fn helper() -> &'static str { "test_fn_f32" }
const AFTER: &str = "after_f32";
"#;
    let sources = [
        ("host/src/ops/lrp.rs", family),
        (
            "host/src/ops/lrp/tests.rs",
            r#"const T: &str = "unit_test_f32";"#,
        ),
        ("host/src/ops/lrp/mlp.rs", r#"const M: &str = "mlp_f32";"#),
        (
            "host/src/replace/support.rs",
            "#![cfg(test)]\nconst S: &str = \"support_f32\";",
        ),
    ];
    assert_eq!(names(&sources), ["after_f32", "kept_f32", "mlp_f32"]);
}

#[test]
fn unnamed_entries_keep_order_once() {
    let named: BTreeSet<String> = ["add_f32".to_string()].into();
    assert_eq!(
        unnamed_entries(&["dead_f32", "add_f32", "old_f16", "dead_f32"], &named),
        ["dead_f32", "old_f16"]
    );
}

#[test]
fn masking_blanks_comments_and_literals_only() {
    let text = "let a = 'x'; // c { \nlet s = r#\"q \" {\"#; /* a /* nested */ } */ fn f<'a>(x: &'a str) {'\\''}";
    let (masked, lits) = mask(text);
    assert_eq!(masked.len(), text.len());
    assert_eq!(masked.matches('{').count(), 1, "{masked}");
    assert!(masked.contains("fn f<'a>(x: &'a str)"), "{masked}");
    assert_eq!(
        lits,
        [(text.find("r#").unwrap_or(0) + 2, "q \" {".to_string())]
    );
    assert_eq!(
        scan("#[cfg(test)]\nmod t { }\nfn g() {}").test_items,
        [(0, 22)]
    );
}
