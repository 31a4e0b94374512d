//! The embedded PTX: every kernel the launchers name is in it, for every arch, and ptxas (when found)
//! accepts it with no spills and no local-memory stack.
include!("../../gpu/ptx_builder.rs");

const KERNELS: [&str; 22] = [
    "add",
    "sub",
    "mul",
    "div",
    "add_bcast",
    "sub_bcast",
    "mul_bcast",
    "div_bcast",
    "gelu",
    "gelu_backward",
    "affine",
    "expand",
    "reduce_to",
    "sum_rows",
    "sum_partials",
    "softmax",
    "softmax_backward",
    "layer_norm",
    "layer_norm_backward",
    "layer_norm_param_grads",
    "embedding",
    "embedding_backward",
];

#[test]
fn every_launched_kernel_is_in_the_ptx_for_every_dtype_and_arch() {
    for (arch, ptx) in [("sm_80", host::ptx::SM80), ("sm_90", host::ptx::SM90)] {
        assert!(
            ptx.contains(&format!(".target {arch}")),
            "{arch} PTX targets another arch"
        );
        let entries = host::ptx::entry_points(ptx);
        for k in KERNELS {
            for d in ["f32", "f16", "bf16"] {
                let name = format!("{k}_{d}");
                assert!(
                    entries.contains(&name.as_str()),
                    "{arch}: kernel {name} missing from the PTX"
                );
            }
        }
    }
}

/// Kernels with one entry point (relevance propagation and its dense forward: f32 only; the embedding
/// id check: u32 ids).
const F32_KERNELS: [&str; 15] = [
    "lrp_sums_f32",
    "lrp_sums_v3_f32",
    "lrp_abs_v3_f32",
    "lrp_spread_v3_f32",
    "lrp_spread_v3_finish_f32",
    "dense_v3_f32",
    "lrp_spread_v4_f32",
    "dense_v4_f32",
    "lrp_coeffs_f32",
    "lrp_spread_f32",
    "lrp_finish_f32",
    "dense_f32",
    "dense_finish_f32",
    "nonfinite_partials_f32",
    "embedding_check_ids_u32",
];

#[test]
fn every_f32_only_kernel_is_in_the_ptx() {
    for ptx in [host::ptx::SM80, host::ptx::SM90] {
        let entries = host::ptx::entry_points(ptx);
        for k in F32_KERNELS {
            assert!(entries.contains(&k), "kernel {k} missing from the PTX");
        }
    }
}

#[test]
fn ptxas_accepts_the_ptx_without_spills_or_stack() {
    let Some(ptxas) = find_ptxas() else {
        println!(
            "SKIP ptxas_accepts_the_ptx_without_spills_or_stack: ptxas not found (pip install nvidia-cuda-nvcc-cu12, or set PTXAS)"
        );
        return;
    };
    for (arch, ptx) in [("sm_80", host::ptx::SM80), ("sm_90", host::ptx::SM90)] {
        let table = ptxas_resources(&ptxas, ptx, arch).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            table.len() >= KERNELS.len() * 3,
            "{arch}: ptxas reported only {} kernels",
            table.len()
        );
        for k in &table {
            assert_eq!(
                (k.stack_bytes, k.spill_stores, k.spill_loads),
                (0, 0, 0),
                "{arch}: {} uses local memory: {k:?}",
                k.name
            );
            assert!(
                !k.wgmma_serialized,
                "{arch}: ptxas serialized the wgmma of {} (an accumulator is touched while in flight)",
                k.name
            );
        }
    }
}

#[test]
fn ptxas_report_parser_reads_entries_and_ignores_device_functions() {
    let text = "ptxas info    : Compiling entry function 'softmax_f32' for 'sm_90'\n\
ptxas info    : Function properties for softmax_f32\n\
    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n\
ptxas info    : Used 71 registers, used 1 barriers, 128 bytes smem\n\
ptxas info    : Function properties for _ZN4core9panicking\n\
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n";
    let t = parse_ptxas_report(text);
    assert_eq!(t.len(), 1);
    let warned = parse_ptxas_report(
        "ptxas info    : Compiling entry function 'flash_wg_x' for 'sm_90a'\n\
ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized due to \
the presence of Extern calls in the function 'flash_wg_x'.\n",
    );
    assert!(
        warned.len() == 1 && warned[0].wgmma_serialized,
        "{warned:?}"
    );
    assert_eq!(
        t[0],
        KernelResources {
            name: "softmax_f32".into(),
            registers: 71,
            shared_bytes: 128,
            stack_bytes: 8,
            spill_stores: 4,
            spill_loads: 4,
            wgmma_serialized: false,
        }
    );
}
