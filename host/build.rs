//! Builds the `gpu` crate to PTX for every shipped arch and leaves it in OUT_DIR, where `src/ptx.rs`
//! embeds it with `include_str!`: `cargo test -p host` needs no extra step.
include!("../gpu/ptx_builder.rs");

fn main() {
    let manifest = std::path::PathBuf::from(
        std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
    );
    let workspace = manifest
        .parent()
        .expect("host/ sits in the workspace")
        .to_path_buf();
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo:rerun-if-changed=../gpu/src");
    println!("cargo:rerun-if-changed=../gpu/Cargo.toml");
    println!("cargo:rerun-if-changed=../gpu/ptx_builder.rs");
    println!("cargo:rerun-if-env-changed=RGK_CHECKED_PTX");
    // A checked PTX build (bounds checks kept) for sanitizer and fuzz runs: RGK_CHECKED_PTX=1.
    let checked = std::env::var("RGK_CHECKED_PTX").is_ok_and(|v| v == "1");
    let target_dir = workspace.join("target").join("ptx-build");
    for arch in PTX_ARCHES {
        match build_gpu_ptx(&workspace, &target_dir, arch, checked) {
            Ok(ptx) => std::fs::write(out_dir.join(format!("gpu_{arch}.ptx")), ptx)
                .expect("OUT_DIR is writable"),
            Err(e) => panic!("{e}"),
        }
    }
}
