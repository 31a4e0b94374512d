//! The embedded kernel modules: ptxas (when it ran at build time) compiled every module with no spills,
//! no local-memory stack and no serialized wgmma. (That every entry point is named by a launcher and
//! every launcher name is an entry point is `cargo xtask tidy`'s check 3, also run by `cargo test`.)
include!("../../gpu/ptx_builder.rs");

#[test]
fn ptxas_compiled_every_module_without_spills_stack_or_serialized_wgmma() {
    let mut checked = 0;
    for family in host::Family::ALL {
        let img = host::modules::images(family);
        for (arch, build) in [("sm_80", img.sm80), ("sm_90", img.sm90)] {
            if let Some(e) = build.ptxas_error {
                panic!(
                    "{} {arch}: ptxas failed at build time (the module ships as PTX only):\n{e}",
                    family.name()
                );
            }
            let Some(report) = build.ptxas_report else {
                println!(
                    "SKIP {} {arch}: built without ptxas (pip install nvidia-cuda-nvcc-cu12, or set PTXAS)",
                    family.name()
                );
                continue;
            };
            let table = parse_ptxas_report(report);
            assert!(
                !table.is_empty(),
                "{} {arch}: ptxas reported no kernel",
                family.name()
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
            checked += table.len();
        }
    }
    println!("ptxas reports checked: {checked} kernels");
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

/// `gpu::tensor_map_params!` markers re-declare the named 128-byte parameters 64-byte aligned; a
/// marker without its parameter, or a parameter address taken without a marker, fails the build;
/// the embedded sm_90 matmul module carries the aligned declarations of every `matmul_tma_*` entry.
#[test]
fn tensor_map_parameters_are_declared_64_byte_aligned() {
    let ptx = "// rgk:tensor_map k 0\n.visible .entry k(\n\t.param .align 16 .b8 k_param_0[128],\n\t.param .align 16 .b8 k_param_1[128]\n)\n{\n\tmov.b64 %rd1, k_param_0;\n}\n";
    let out = align_tensor_map_params(ptx).unwrap();
    assert!(
        out.contains("\t.param .align 64 .b8 k_param_0[128],\n"),
        "{out}"
    );
    assert!(
        out.contains("\t.param .align 16 .b8 k_param_1[128]\n"),
        "{out}"
    );
    let missing = ptx.replace("// rgk:tensor_map k 0", "// rgk:tensor_map k 2");
    assert!(
        align_tensor_map_params(&missing)
            .unwrap_err()
            .contains("k_param_2")
    );
    let unmarked = ptx.replace("mov.b64 %rd1, k_param_0;", "mov.b64 %rd1, k_param_1;");
    assert!(
        align_tensor_map_params(&unmarked)
            .unwrap_err()
            .contains("k_param_1")
    );
    assert!(align_tensor_map_params("// rgk:tensor_map k\n").is_err());

    let matmul = host::Family::ALL
        .into_iter()
        .find(|f| f.name() == "matmul")
        .unwrap();
    let sm90 = host::modules::images(matmul).sm90.ptx;
    let mut entries = 0;
    for t in ["nn", "nt", "tn", "tt"] {
        for dt in ["f16", "bf16"] {
            for i in 0..3 {
                let decl = format!(".param .align 64 .b8 matmul_tma_{t}_{dt}_param_{i}[128]");
                assert!(sm90.contains(&decl), "sm_90 matmul PTX lacks `{decl}`");
            }
            entries += 1;
        }
    }
    assert_eq!(entries, 8);
}
