// The one definition of how the `gpu` crate becomes PTX. Included (`include!`) by `host/build.rs`, which
// embeds the PTX, and by `xtask` (`cargo xtask build-ptx`), which also runs ptxas on it.
//
// Facts this relies on (../shared/ARCHITECTURE.md): no rust-std ships for nvptx64, so `core` is built
// from `rust-src` (`-Zbuild-std=core`); `-Ctarget-cpu` must reach `core` too, so it goes through
// RUSTFLAGS, not `cargo rustc -- -C...`; `--emit=asm` on a cdylib writes `gpu.ptx`. The nested cargo uses
// its own target dir so it never waits on the outer build's lock.

/// GPU architectures we ship PTX for: sm_80 runs on Ampere, Ada, Hopper and later (driver JIT); sm_90 is
/// for Hopper-only paths. The host picks by compute capability.
pub const PTX_ARCHES: [&str; 2] = ["sm_80", "sm_90"];

/// The `-Ctarget-cpu` (and `ptxas -arch`) an entry of [`PTX_ARCHES`] is built for. The "sm_90" PTX is
/// built for `sm_90a`, the arch-specific Hopper target: `wgmma`, `setmaxnreg` and friends exist only
/// there. sm_90a PTX (`.target sm_90a`) JIT-compiles on compute capability 9.0 devices only (H100,
/// H200), which is the only capability the host loads it on (`host::ptx::for_compute_capability`).
/// In the gpu crate, `#[cfg(target_feature = "sm_90a")]` is true only in this build (rustc's nvptx
/// target derives the `sm_*` target features from the target cpu: sm_90a implies sm_90 and below,
/// sm_80 none of sm_86 and up), so wgmma kernels are compiled into the sm_90 PTX and never into the
/// sm_80 one.
pub fn target_cpu(arch: &str) -> &str {
    match arch {
        "sm_90" => "sm_90a",
        other => other,
    }
}

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
    cmd.env("RUSTFLAGS", format!("-Ctarget-cpu={}", target_cpu(arch)));
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
    let text = std::fs::read_to_string(&ptx).map_err(|e| format!("nvptx build ran but {} is unreadable: {e}", ptx.display()))?;
    Ok(apply_launch_bounds(&text, gpu::params::LAUNCH_BOUNDS))
}

/// Writes `.maxntid T, 1, 1` and `.minnctapersm M` between the parameter list and the body of every
/// entry whose name starts with a prefix in `bounds` (`gpu::params::LAUNCH_BOUNDS`): the PTX form of
/// CUDA's `__launch_bounds__`, which rustc cannot emit.
pub fn apply_launch_bounds(ptx: &str, bounds: &[(&str, u32, u32)]) -> String {
    let mut out = String::with_capacity(ptx.len() + 4096);
    let mut pending: Option<(u32, u32)> = None;
    for line in ptx.lines() {
        if let Some(rest) = line.strip_prefix(".visible .entry ") {
            let name = rest.split('(').next().unwrap_or("");
            pending = bounds.iter().find(|(p, _, _)| name.starts_with(p)).map(|&(_, t, m)| (t, m));
        }
        if line.starts_with('{') {
            if let Some((threads, min_blocks)) = pending.take() {
                out.push_str(&format!(".maxntid {threads}, 1, 1\n.minnctapersm {min_blocks}\n"));
            }
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Finds `ptxas`: `$PTXAS`, then `PATH`, then the pip package `nvidia-cuda-nvcc-cu12` (which ships
/// ptxas for machines without a GPU) in the site-packages of `python3`.
pub fn find_ptxas() -> Option<std::path::PathBuf> {
    if let Ok(p) = std::env::var("PTXAS") {
        let p = std::path::PathBuf::from(p);
        if p.is_file() {
            return Some(p);
        }
    }
    if let Some(paths) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&paths) {
            let p = dir.join("ptxas");
            if p.is_file() {
                return Some(p);
            }
        }
    }
    let out = std::process::Command::new("python3")
        .args(["-c", "import nvidia.cuda_nvcc, os; print(os.path.join(list(nvidia.cuda_nvcc.__path__)[0], 'bin', 'ptxas'))"])
        .output()
        .ok()?;
    let p = std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if out.status.success() && p.is_file() { Some(p) } else { None }
}

/// One kernel's resource use as ptxas reports it (`ptxas -v`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KernelResources {
    pub name: String,
    pub registers: u32,
    pub shared_bytes: u32,
    pub stack_bytes: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
    /// ptxas said "Potential Performance Loss: wgmma.mma_async instructions are serialized ..." for
    /// this kernel: an accumulator register was touched while a wgmma was in flight, so ptxas waits
    /// after every wgmma (correct, but the asynchrony is gone).
    pub wgmma_serialized: bool,
}

/// Runs `ptxas -arch=ARCH -v` on `ptx` and parses the per-kernel report (ARCH: `target_cpu(arch)`,
/// the arch the PTX was built for).
pub fn ptxas_resources(ptxas: &std::path::Path, ptx: &str, arch: &str) -> Result<Vec<KernelResources>, String> {
    let dir = std::env::temp_dir().join(format!("rgk-ptxas-{}-{arch}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let input = dir.join("kernels.ptx");
    std::fs::write(&input, ptx).map_err(|e| e.to_string())?;
    let out = std::process::Command::new(ptxas)
        .arg(format!("-arch={}", target_cpu(arch)))
        .arg("-v")
        .arg(&input)
        .arg("-o")
        .arg(dir.join("kernels.cubin"))
        .output()
        .map_err(|e| format!("could not run {}: {e}", ptxas.display()))?;
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        return Err(format!("ptxas rejected the {arch} PTX:\n{text}"));
    }
    Ok(parse_ptxas_report(&text))
}

/// Parses `ptxas -v` output. Only entry functions (`Compiling entry function 'NAME'`) are reported.
pub fn parse_ptxas_report(text: &str) -> Vec<KernelResources> {
    fn number_before(line: &str, unit: &str) -> u32 {
        line.find(unit)
            .and_then(|i| line[..i].split_whitespace().last())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }
    let mut out: Vec<KernelResources> = Vec::new();
    let mut current: Option<usize> = None;
    for line in text.lines() {
        if line.contains("Potential Performance Loss") && line.contains("wgmma") {
            // "... wgmma.mma_async instructions are serialized due to ... in the function 'NAME'"
            let name = line.rsplit("function '").next().and_then(|r| r.split('\'').next()).unwrap_or("");
            if let Some(k) = out.iter_mut().find(|k| k.name == name) {
                k.wgmma_serialized = true;
            } else {
                out.push(KernelResources { name: name.to_string(), wgmma_serialized: true, ..Default::default() });
            }
            continue;
        }
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or("").to_string();
            out.push(KernelResources { name, ..Default::default() });
            current = Some(out.len() - 1);
        } else if line.contains("Function properties for ") {
            // Properties of a non-entry function (device function) are not a kernel's.
            let name = line.split("Function properties for ").nth(1).unwrap_or("").trim();
            current = out.iter().position(|k| k.name == name);
        } else if let Some(i) = current {
            let k = &mut out[i];
            if line.contains("bytes stack frame") {
                k.stack_bytes = number_before(line, "bytes stack frame");
                k.spill_stores = number_before(line, "bytes spill stores");
                k.spill_loads = number_before(line, "bytes spill loads");
            } else if line.contains("registers") {
                k.registers = number_before(line, "registers");
                k.shared_bytes = number_before(line, "bytes smem");
            }
        }
    }
    out
}
