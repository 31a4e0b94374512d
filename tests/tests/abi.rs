//! The launch ABI: parameter structs are passed by value as raw bytes, so their layout must be the one
//! the nvptx64 kernels were compiled with. Both targets are 64-bit little-endian with the same C layout
//! rules; these tests pin the sizes so an edit that adds padding or reorders fields is caught here.
use gpu::params::{
    Broadcast2, MAX_DIMS, MatmulTc, MatmulTf32, MatmulTma, RawSlice, ReduceTo, RowAccess, SplitB,
    TensorMapParam, WgPairs,
};

#[test]
fn parameter_structs_have_the_kernel_layout() {
    assert_eq!(std::mem::size_of::<RawSlice>(), 16);
    assert_eq!(std::mem::align_of::<RawSlice>(), 8);
    assert_eq!(std::mem::size_of::<Broadcast2>(), 8 + 3 * 8 * MAX_DIMS);
    assert_eq!(std::mem::size_of::<ReduceTo>(), 16 + 3 * 8 * MAX_DIMS);
    // Six 4-byte fields (M, N, K and the three row-access modes), then six u64 (lds, strides).
    assert_eq!(std::mem::size_of::<RowAccess>(), 4);
    assert_eq!(std::mem::size_of::<MatmulTc>(), 6 * 4 + 6 * 8);
    assert_eq!(std::mem::align_of::<MatmulTc>(), 8);
    assert_eq!(std::mem::offset_of!(MatmulTc, lda), 24);
    // `Matmul` (six u32, six u64), the split (two u32), the gather flag, the batch, the entries.
    assert_eq!(std::mem::size_of::<MatmulTf32>(), 6 * 4 + 6 * 8 + 4 * 4 + 8);
    assert_eq!(std::mem::offset_of!(MatmulTf32, b_entry_of), 88);
    // Six u32 (sizes, orientation, passes, the gather's block rows), then five u64 (ld, stride,
    // pitch, the gather's block table and block stride).
    assert_eq!(std::mem::size_of::<SplitB>(), 6 * 4 + 5 * 8);
    assert_eq!(std::mem::offset_of!(SplitB, ld), 24);
    assert_eq!(std::mem::offset_of!(SplitB, block_of), 48);
    // `MatmulTf32`, the k-tiles of a term and padding, eight u32 (y components and signs), eight
    // u64 (paths).
    assert_eq!(std::mem::size_of::<WgPairs>(), 96 + 2 * 4 + 8 * 4 + 8 * 8);
    assert_eq!(std::mem::offset_of!(WgPairs, k_neg), 104);
    assert_eq!(std::mem::offset_of!(WgPairs, paths), 136);
    // Eight u32: M, N, K, batch, the tile counts and the two batched flags.
    assert_eq!(std::mem::size_of::<MatmulTma>(), 8 * 4);
    // The driver's CUtensorMap: 128 opaque bytes. The kernel-side parameter is declared 16-byte
    // aligned by rustc and re-declared 64-byte aligned by the PTX builder; its size is what matters.
    // (host/src/tma.rs checks it against cudarc's `CUtensorMap`.)
    assert_eq!(std::mem::size_of::<TensorMapParam>(), 128);
}

/// Every 16-bit matmul kernel has an entry per dtype and transpose, with the launch bound the host
/// launches it with in each build that has it: `matmul_tc_*` in both builds (256 threads, one block
/// per SM), `matmul_tma_*` (the Hopper kernel) in the sm_90 build only (384 threads, one CTA an SM,
/// the register cap `setmaxnreg` needs).
#[test]
fn tensor_core_matmul_entry_points_exist_for_every_dtype_and_transpose() {
    let hopper = gpu::params::matmul_tma::THREADS;
    for (prefix, sm80, sm90) in [
        ("matmul_tc", Some((256, 1)), Some((256, 1))),
        ("matmul_tma", None, Some((hopper, 1))),
    ] {
        for dtype in ["f16", "bf16"] {
            for t in ["nn", "nt", "tn", "tt"] {
                let name = format!("{prefix}_{t}_{dtype}");
                assert_eq!(
                    host::Family::of(&name),
                    Some(host::Family::Matmul),
                    "{name}"
                );
                for (arch, bound) in [("sm_80", sm80), ("sm_90", sm90)] {
                    assert_eq!(
                        host::modules::launch_bounds(&name, arch),
                        bound,
                        "{name} {arch}"
                    );
                }
            }
        }
    }
}

#[test]
fn every_ptx_entry_point_is_named_op_dtype() {
    for family in host::Family::ALL {
        let entries = host::modules::images(family).entries;
        assert!(!entries.is_empty());
        for e in entries {
            assert!(
                ["_f32", "_f16", "_bf16", "_u32"]
                    .iter()
                    .any(|s| e.ends_with(s)),
                "entry point `{e}` does not end in a dtype suffix"
            );
        }
    }
}

#[test]
fn row_blocks_are_powers_of_two_between_a_warp_and_the_cap() {
    use gpu::params::{embedding, layer_norm, row_block, softmax};
    assert_eq!(row_block(1, 16, 512), 32);
    assert_eq!(row_block(16 * 64, 16, 512), 64);
    assert_eq!(row_block(16 * 64 + 1, 16, 512), 128);
    assert_eq!(row_block(1 << 30, 16, 512), 512);
    for cols in [1u64, 31, 513, 8192, 8193, 1 << 20] {
        assert_eq!(
            softmax::block_for(cols),
            row_block(cols, softmax::CACHE_PER_THREAD, softmax::MAX_BLOCK)
        );
        assert_eq!(
            layer_norm::block_for(cols),
            row_block(cols, layer_norm::CACHE_PER_THREAD, layer_norm::MAX_BLOCK)
        );
        assert_eq!(
            embedding::bwd_block_for(cols),
            row_block(cols, embedding::BWD_CACHE, embedding::BWD_MAX_BLOCK)
        );
    }
}
