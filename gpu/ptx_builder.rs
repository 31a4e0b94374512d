// The one definition of how the `gpu` crate becomes PTX. Included (`include!`) by `host/build.rs`, which
// embeds the PTX, and by `xtask` (`cargo xtask build-ptx`), which also runs ptxas on it.
//
// Facts this relies on (../shared/ARCHITECTURE.md): no rust-std ships for nvptx64, so `core` is built
// from `rust-src` (`-Zbuild-std=core`); `-Ctarget-cpu` must reach `core` too, so it goes through
// RUSTFLAGS, not `cargo rustc -- -C...`; `--emit=asm` on a cdylib writes `gpu.ptx`. The nested cargo uses
// its own target dir so it never waits on the outer build's lock.

/// GPU architectures we ship PTX for: sm_80 runs on Ampere, Ada and Hopper (driver JIT); sm_90 is for
/// Hopper-only paths. The host picks by compute capability.
pub const PTX_ARCHES: [&str; 2] = ["sm_80", "sm_90"];

/// Builds `gpu` for `arch` and returns the PTX text. `checked` keeps bounds checks (device asserts).
pub fn build_gpu_ptx(
    workspace: &std::path::Path,
    target_dir: &std::path::Path,
    arch: &str,
    checked: bool,
) -> Result<String, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let mut cmd = std::process::Command::new(cargo);
    cmd.current_dir(workspace)
        .args(["rustc", "--package", "gpu", "--release", "--lib", "--crate-type", "cdylib"])
        .args(["--target", "nvptx64-nvidia-cuda", "-Zbuild-std=core"])
        .arg("--target-dir")
        .arg(target_dir.join(if checked { format!("{arch}-checked") } else { arch.to_string() }));
    if checked {
        cmd.args(["--features", "checked"]);
    }
    cmd.args(["--", "--emit=asm"]);
    // The outer build's flags are for the host target; the nested build gets only the GPU ones.
    for var in ["RUSTFLAGS", "CARGO_ENCODED_RUSTFLAGS", "CARGO_BUILD_RUSTFLAGS", "RUSTC_WORKSPACE_WRAPPER", "CARGO_TARGET_DIR"] {
        cmd.env_remove(var);
    }
    cmd.env("RUSTFLAGS", format!("-Ctarget-cpu={arch}"));
    let out = cmd.output().map_err(|e| format!("could not run cargo for the nvptx build: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "building gpu for nvptx64 ({arch}) failed. It needs the pinned nightly with rust-src \
             (`rustup toolchain install` in the repo).\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let ptx = target_dir
        .join(if checked { format!("{arch}-checked") } else { arch.to_string() })
        .join("nvptx64-nvidia-cuda/release/gpu.ptx");
    std::fs::read_to_string(&ptx).map_err(|e| format!("nvptx build ran but {} is unreadable: {e}", ptx.display()))
}
