//! `cargo xtask doctor`: what this machine has for building, testing, sanitizing, profiling and
//! benchmarking, each missing piece with what to do.
use crate::util::{Args, Spec, which};

fn line(ok: bool, what: &str, detail: &str) {
    println!(
        "  [{}] {what:<22} {detail}",
        if ok { " ok " } else { "MISS" }
    );
}

pub const SPEC: Spec = Spec {
    task: "doctor",
    summary: "GPU, driver, toolchain and tool check, each with what to do",
    positionals: &[],
    flags: &[],
};

pub fn run(_args: &Args) -> Result<(), String> {
    println!("GPU:");
    match host::Gpu::new(0) {
        Ok(gpu) => {
            use cudarc::driver::sys::CUdevice_attribute as A;
            let attr = |a| {
                gpu.attribute(a)
                    .map(|v| v.to_string())
                    .unwrap_or_else(|e| e.to_string())
            };
            let (ma, mi) = gpu.compute_capability();
            line(
                true,
                "device",
                &format!(
                    "{} (compute capability {ma}.{mi}, runs the {} build)",
                    gpu.name(),
                    gpu.ptx_arch()
                ),
            );
            // Each family's module as this device loads it (a family loads on its first call;
            // here all of them, to show what each costs).
            for family in host::Family::ALL {
                match gpu.load_family(family) {
                    Ok(m) => line(
                        m.cubin_refused.is_none(),
                        &format!("module {}", family.name()),
                        &format!(
                            "{}, {} KiB, loaded in {:.3} s{}",
                            m.image,
                            m.bytes / 1024,
                            m.load_time.as_secs_f64(),
                            m.cubin_refused
                                .as_ref()
                                .map(|e| format!(" (the driver refused the cubin: {e})"))
                                .unwrap_or_default()
                        ),
                    ),
                    Err(e) => line(false, &format!("module {}", family.name()), &e.to_string()),
                }
            }
            line(
                true,
                "SMs",
                &attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
            );
            line(
                true,
                "smem per block (opt-in)",
                &format!(
                    "{} B",
                    attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
                ),
            );
            line(
                true,
                "L2",
                &format!("{} B", attr(A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)),
            );
            let mut v = 0i32;
            // SAFETY: writes one int.
            let driver = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) };
            line(
                true,
                "driver CUDA version",
                &format!("{}.{} ({driver:?})", v / 1000, (v % 1000) / 10),
            );
            line(
                true,
                "memory",
                &gpu.context()
                    .total_mem()
                    .map(|b| format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64))
                    .unwrap_or_else(|e| format!("{e:?}")),
            );
        }
        Err(e) => line(
            false,
            "device",
            &format!(
                "{e} — GPU tests will SKIP; run them on a machine with an NVIDIA driver (sm_80+)"
            ),
        ),
    }
    println!("tools:");
    let rustc = std::process::Command::new("rustc")
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    line(rustc.is_some(), "rust toolchain", &rustc.unwrap_or_else(|| "not found — rustup toolchain install (in the repo: reads rust-toolchain.toml); a bundle needs none".into()));
    let ptxas = crate::build_ptx::find_ptxas();
    line(
        ptxas.is_some(),
        "ptxas",
        &ptxas.map(|p| p.display().to_string()).unwrap_or_else(|| {
            "not found — pip install nvidia-cuda-nvcc-cu12 (resource table, CI gate)".into()
        }),
    );
    let cs = crate::sanitize::find_compute_sanitizer();
    line(
        cs.is_some(),
        "compute-sanitizer",
        &cs.map(|p| p.display().to_string()).unwrap_or_else(|| {
            "not found — part of the CUDA toolkit (needed by `xtask sanitize`)".into()
        }),
    );
    let ncu = crate::profile::find_ncu();
    line(
        ncu.is_some(),
        "ncu",
        &ncu.map(|p| p.display().to_string())
            .unwrap_or_else(|| "not found — Nsight Compute (needed by `xtask profile`)".into()),
    );
    let torch = which("python3")
        .and_then(|py| {
            std::process::Command::new(py)
                .args([
                    "-c",
                    "import torch; print(torch.__version__, torch.cuda.is_available())",
                ])
                .output()
                .ok()
        })
        .filter(|o| o.status.success());
    line(
        torch.is_some(),
        "python3 + torch",
        &torch
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_else(|| "not found — peers in `xtask bench` are reported as missing".into()),
    );
    Ok(())
}
