// The one definition of how the `gpu` crate becomes kernel modules: PTX per op family and arch, and
// (when ptxas is found) the machine code (cubin) of each. Included (`include!`) by `host/build.rs`, which
// embeds them, and by `xtask` (`cargo xtask build-ptx`, `tidy`), which also prints ptxas's report.
//
// Facts this relies on (docs/ARCHITECTURE.md): no rust-std ships for nvptx64, so `core` is built
// from `rust-src` (`-Zbuild-std=core`); `-Ctarget-cpu` must reach `core` too, so it goes through
// RUSTFLAGS, not `cargo rustc -- -C...`; `--emit=asm` on a cdylib writes `gpu.ptx`. The nested cargo uses
// its own target dir so it never waits on the outer build's lock.

/// GPU architectures we ship: sm_80 runs on Ampere, Ada, Hopper and later (its PTX through the driver's
/// JIT on anything but 8.x); sm_90 is for Hopper-only paths. The host picks by compute capability.
pub const PTX_ARCHES: [&str; 2] = ["sm_80", "sm_90"];

/// The op families, one kernel module each (a cargo feature of the `gpu` crate each, same names). A
/// program loads a family's module the first time it launches one of its kernels, so a program that
/// only calls softmax never waits for attention's code.
pub const FAMILIES: [&str; 7] = [
    "elementwise",
    "reduce_softmax",
    "norm_embedding",
    "matmul",
    "attention",
    "clifford",
    "lrp",
];

/// The `-Ctarget-cpu` (and `ptxas -arch`) an entry of [`PTX_ARCHES`] is built for. The "sm_90" PTX is
/// built for `sm_90a`, the arch-specific Hopper target: `wgmma`, `setmaxnreg` and friends exist only
/// there. sm_90a code (PTX `.target sm_90a`, or its cubin) runs on compute capability 9.0 devices only
/// (H100, H200), which is the only capability the host loads it on (`host::modules`).
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

/// The PTX ISA version of a build, as a rustc target-feature flag: the sm_90 build asks for PTX 8.1,
/// the first with vector reductions (`red.global.add.v4.f32`, which the wgmma FlashAttention
/// backward uses to add its dQ blocks), where rustc's default for sm_90a is 8.0; the sm_80 build
/// keeps rustc's default.
pub fn ptx_version_flag(arch: &str) -> &'static str {
    match arch {
        "sm_90" => " -Ctarget-feature=+ptx81",
        _ => "",
    }
}

/// Builds family `family` of `gpu` for `arch` and returns the PTX text, launch bounds applied.
/// `checked` keeps bounds checks (device asserts).
pub fn build_family_ptx(
    workspace: &std::path::Path,
    target_dir: &std::path::Path,
    arch: &str,
    family: &str,
    checked: bool,
) -> Result<String, String> {
    let dir = target_dir.join(if checked { format!("{arch}-checked") } else { arch.to_string() });
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let mut cmd = std::process::Command::new(cargo);
    cmd.current_dir(workspace)
        .args(["rustc", "--package", "gpu", "--release", "--lib", "--crate-type", "cdylib"])
        .args(["--target", "nvptx64-nvidia-cuda", "-Zbuild-std=core"])
        .arg("--target-dir")
        .arg(&dir)
        .arg("--features")
        .arg(if checked { format!("checked,{family}") } else { family.to_string() });
    cmd.args(["--", "--emit=asm"]);
    // The outer build's flags are for the host target; the nested build gets only the GPU ones.
    for var in ["RUSTFLAGS", "CARGO_ENCODED_RUSTFLAGS", "CARGO_BUILD_RUSTFLAGS", "RUSTC_WORKSPACE_WRAPPER", "CARGO_TARGET_DIR"] {
        cmd.env_remove(var);
    }
    cmd.env("RUSTFLAGS", format!("-Ctarget-cpu={}{}", target_cpu(arch), ptx_version_flag(arch)));
    let out = cmd.output().map_err(|e| format!("could not run cargo for the nvptx build: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "building gpu family `{family}` for nvptx64 ({arch}) failed. It needs the pinned nightly \
             with rust-src (`rustup toolchain install` in the repo).\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let ptx = dir.join("nvptx64-nvidia-cuda/release/gpu.ptx");
    let text = std::fs::read_to_string(&ptx).map_err(|e| format!("nvptx build ran but {} is unreadable: {e}", ptx.display()))?;
    apply_launch_bounds(&text)
        .and_then(|ptx| align_tensor_map_params(&ptx))
        .map_err(|e| format!("{family} ({arch}): {e}"))
}

/// The marker `gpu::tensor_map_param!` leaves in the PTX (a comment line at file scope).
pub const TENSOR_MAP_MARKER: &str = "// rgk:tensor_map ";

/// Re-declares every kernel parameter a `gpu::tensor_map_param!(entry, index, ..)` names as
/// `.param .align 64 .b8 <entry>_param_<index>[128]`: the copy engine reads tensor maps only at
/// 64-byte aligned addresses, and rustc declares a by-value struct parameter at most 16-byte aligned
/// (a larger `align` on the Rust type is a compiler error for nvptx kernels). A marker whose
/// parameter is not a 128-byte by-value parameter of that entry is an error.
pub fn align_tensor_map_params(ptx: &str) -> Result<String, String> {
    let mut wanted: Vec<(String, bool)> = Vec::new();
    for line in ptx.lines() {
        let Some(rest) = line.trim_start().strip_prefix(TENSOR_MAP_MARKER) else { continue };
        match rest.split_whitespace().collect::<Vec<_>>().as_slice() {
            [entry, index] if index.parse::<u32>().is_ok() => {
                wanted.push((format!("{entry}_param_{index}[128]"), false))
            }
            _ => return Err(format!("malformed tensor-map marker `{line}`")),
        }
    }
    let mut out = String::with_capacity(ptx.len());
    for line in ptx.lines() {
        let decl = line.trim_start().strip_prefix(".param .align 16 .b8 ");
        let hit = decl.and_then(|d| {
            let d = d.trim_end().trim_end_matches(',');
            wanted.iter_mut().find(|w| w.0 == d)
        });
        match hit {
            Some(w) => {
                w.1 = true;
                out.push_str(&line.replacen(".align 16", ".align 64", 1));
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    let missing: Vec<&str> = wanted.iter().filter(|w| !w.1).map(|w| w.0.as_str()).collect();
    if !missing.is_empty() {
        return Err(format!(
            "tensor-map markers name parameters that are not 128-byte by-value parameters: {}",
            missing.join(", ")
        ));
    }
    // Every parameter whose address `tensor_map_param!` takes (`mov.b64 %rd, <entry>_param_<i>;`)
    // must be one the markers re-aligned.
    for line in ptx.lines() {
        let Some(sym) = line.trim_start().strip_prefix("mov.b64").and_then(|r| r.split(',').nth(1)) else { continue };
        let sym = sym.trim().trim_end_matches(';');
        if sym.contains("_param_") && !wanted.iter().any(|w| w.0.strip_suffix("[128]") == Some(sym)) {
            return Err(format!("the address of parameter `{sym}` is taken, but no tensor-map marker names it"));
        }
    }
    Ok(out)
}

/// The marker `gpu::launch_bounds!` leaves in the PTX (a comment line at file scope).
pub const LAUNCH_BOUNDS_MARKER: &str = "// rgk:launch_bounds ";

/// Writes `.maxntid T, 1, 1` and `.minnctapersm M` between the parameter list and the body of every
/// entry that a `gpu::launch_bounds!(entry, T, M)` beside its kernel names: the PTX form of CUDA's
/// `__launch_bounds__`, which rustc cannot emit. A marker naming no entry of the module is an error
/// (a renamed kernel would otherwise silently lose its bound).
pub fn apply_launch_bounds(ptx: &str) -> Result<String, String> {
    let mut bounds: Vec<(&str, u32, u32, bool)> = Vec::new();
    for line in ptx.lines() {
        let Some(rest) = line.trim_start().strip_prefix(LAUNCH_BOUNDS_MARKER) else { continue };
        let f: Vec<&str> = rest.split_whitespace().collect();
        let parsed = match f.as_slice() {
            [name, t, m] => t.parse().ok().zip(m.parse().ok()).map(|(t, m)| (*name, t, m)),
            _ => None,
        };
        let (name, t, m) = parsed.ok_or_else(|| format!("malformed launch-bounds marker `{line}`"))?;
        bounds.push((name, t, m, false));
    }
    let mut out = String::with_capacity(ptx.len() + 64 * bounds.len());
    let mut pending: Option<(u32, u32)> = None;
    for line in ptx.lines() {
        if let Some(rest) = line.strip_prefix(".visible .entry ") {
            let name = rest.split('(').next().unwrap_or("");
            pending = bounds.iter_mut().find(|b| b.0 == name).map(|b| {
                b.3 = true;
                (b.1, b.2)
            });
        }
        if line.starts_with('{')
            && let Some((threads, min_blocks)) = pending.take()
        {
            out.push_str(&format!(".maxntid {threads}, 1, 1\n.minnctapersm {min_blocks}\n"));
        }
        out.push_str(line);
        out.push('\n');
    }
    let unused: Vec<&str> = bounds.iter().filter(|b| !b.3).map(|b| b.0).collect();
    if unused.is_empty() {
        Ok(out)
    } else {
        Err(format!("launch bounds name entries the module does not have: {}", unused.join(", ")))
    }
}

/// Finds `ptxas`: `$PTXAS`, then `PATH`, then the pip package `nvidia-cuda-nvcc-cu12` (which ships
/// ptxas for machines without a GPU) in the site-packages of `$RGK_PYTHON` or `python3`.
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
    let python = std::env::var("RGK_PYTHON").unwrap_or_else(|_| "python3".to_string());
    let out = std::process::Command::new(python)
        .args(["-c", "import nvidia.cuda_nvcc, os; print(os.path.join(list(nvidia.cuda_nvcc.__path__)[0], 'bin', 'ptxas'))"])
        .output()
        .ok()?;
    let p = std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if out.status.success() && p.is_file() { Some(p) } else { None }
}

/// One family's module for one arch: the PTX, and with ptxas its machine code and resource report.
pub struct BuiltModule {
    pub family: &'static str,
    pub arch: &'static str,
    pub ptx: String,
    /// `ptxas -arch=target_cpu(arch)` output (a cubin), when ptxas was given.
    pub cubin: Option<Vec<u8>>,
    /// ptxas's `-v` report for this module (parse with [`parse_ptxas_report`]).
    pub ptxas_report: Option<String>,
    /// Why ptxas failed on this module (an old ptxas without sm_90a, a kernel it rejects): the module
    /// then ships as PTX only, and the PTX resource test reports the failure.
    pub ptxas_error: Option<String>,
}

/// Builds every family for every arch (`checked`: bounds checks kept), and with `ptxas` assembles each
/// module to a cubin. One thread per arch runs the nvptx builds (each arch has its own target dir, so
/// the two never wait on each other's lock), and each module's ptxas runs in a thread of its own as
/// soon as its PTX exists. `progress` gets a line as each step ends (build scripts print it as a
/// cargo warning only on failure; xtask prints it).
pub fn build_all_modules(
    workspace: &std::path::Path,
    target_dir: &std::path::Path,
    checked: bool,
    ptxas: Option<&std::path::Path>,
    progress: &(dyn Fn(String) + Sync),
) -> Result<Vec<BuiltModule>, String> {
    std::thread::scope(|s| {
        let per_arch: Vec<_> = PTX_ARCHES
            .iter()
            .map(|&arch| {
                s.spawn(move || {
                    std::thread::scope(|s2| {
                        let mut jobs = Vec::new();
                        for &family in FAMILIES.iter() {
                            let started = std::time::Instant::now();
                            let ptx = build_family_ptx(workspace, target_dir, arch, family, checked)?;
                            progress(format!("{family} {arch}: PTX {} KiB in {:.1} s", ptx.len() / 1024, started.elapsed().as_secs_f64()));
                            jobs.push(s2.spawn(move || -> Result<BuiltModule, String> {
                                let (mut cubin, mut ptxas_report, mut ptxas_error) = (None, None, None);
                                if let Some(p) = ptxas {
                                    let started = std::time::Instant::now();
                                    match assemble(p, &ptx, arch, &format!("{family}-{arch}")) {
                                        Ok((c, r)) => {
                                            progress(format!("{family} {arch}: cubin {} KiB in {:.1} s", c.len() / 1024, started.elapsed().as_secs_f64()));
                                            (cubin, ptxas_report) = (Some(c), Some(r));
                                        }
                                        Err(e) => {
                                            progress(format!("{family} {arch}: ptxas failed, shipping PTX only: {e}"));
                                            ptxas_error = Some(e);
                                        }
                                    }
                                }
                                Ok(BuiltModule { family, arch, ptx, cubin, ptxas_report, ptxas_error })
                            }));
                        }
                        jobs.into_iter()
                            .map(|j| j.join().map_err(|_| "a ptxas thread panicked".to_string())?)
                            .collect::<Result<Vec<_>, String>>()
                    })
                })
            })
            .collect();
        let mut all = Vec::new();
        for h in per_arch {
            all.extend(h.join().map_err(|_| "an nvptx build thread panicked".to_string())??);
        }
        Ok(all)
    })
}

/// Runs `ptxas -arch=ARCH -v` on `ptx` (ARCH: `target_cpu(arch)`) and returns the cubin and the
/// report. `tag` names the scratch folder (unique per module and process).
pub fn assemble(ptxas: &std::path::Path, ptx: &str, arch: &str, tag: &str) -> Result<(Vec<u8>, String), String> {
    let dir = std::env::temp_dir().join(format!("rgk-ptxas-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let input = dir.join("kernels.ptx");
    let output = dir.join("kernels.cubin");
    std::fs::write(&input, ptx).map_err(|e| e.to_string())?;
    let out = std::process::Command::new(ptxas)
        .arg(format!("-arch={}", target_cpu(arch)))
        .arg("-v")
        .arg(&input)
        .arg("-o")
        .arg(&output)
        .output()
        .map_err(|e| format!("could not run {}: {e}", ptxas.display()))?;
    let report = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        return Err(format!("ptxas rejected the {tag} PTX:\n{report}"));
    }
    let cubin = std::fs::read(&output).map_err(|e| format!("ptxas ran but {} is unreadable: {e}", output.display()))?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok((cubin, report))
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

/// Names of the kernel entry points in a PTX text (`.visible .entry NAME(`).
pub fn ptx_entry_points(ptx: &str) -> Vec<&str> {
    ptx.lines()
        .filter_map(|l| l.trim_start().strip_prefix(".visible .entry "))
        .filter_map(|rest| rest.split('(').next())
        .collect()
}
