use super::Transpose::{No, Yes};
use super::reference::matmul;
use crate::{DType, HostTensor};

fn t(data: &[f32], shape: &[usize]) -> HostTensor {
    HostTensor::new(data.to_vec(), shape, DType::F32).unwrap()
}

#[test]
fn reference_products_and_transposes() {
    let a = t(&[1., 2., 3., 4., 5., 6.], &[2, 3]);
    let b = t(&[7., 8., 9., 10., 11., 12.], &[3, 2]);
    assert_eq!(
        matmul(&a, &b, No, No).unwrap().data,
        vec![58., 64., 139., 154.]
    );
    // (a^T)^T b^T^T: transposed storage of the same matrices gives the same product.
    let at = t(&[1., 4., 2., 5., 3., 6.], &[3, 2]);
    let bt = t(&[7., 9., 11., 8., 10., 12.], &[2, 3]);
    assert_eq!(
        matmul(&at, &bt, Yes, Yes).unwrap().data,
        vec![58., 64., 139., 154.]
    );
    // Batched a with a broadcast b.
    let ab = t(
        &[1., 2., 3., 4., 5., 6., 1., 0., 0., 0., 1., 0.],
        &[2, 2, 3],
    );
    let out = matmul(&ab, &b, No, No).unwrap();
    assert_eq!(out.shape, vec![2, 2, 2]);
    assert_eq!(out.data, vec![58., 64., 139., 154., 7., 8., 9., 10.]);
    assert!(matmul(&a, &a, No, No).is_err());
}

#[test]
fn shape_rules_name_both_shapes() {
    use super::matmul_dims;
    use crate::Error;
    let e = matmul_dims("matmul", &[4, 5], &[6, 7], No, No).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::Shape { .. }), "{e}");
    assert!(msg.contains("[4, 5]") && msg.contains("[6, 7]"), "{msg}");
    // Transposes change which dim is inner: (5 x 4)^T . (6 x 5)^T = 4 x 6 works.
    let d = matmul_dims("matmul", &[5, 4], &[6, 5], Yes, Yes).unwrap();
    assert_eq!((d.m, d.n, d.k, d.batch), (4, 6, 5, None));
    assert!(matmul_dims("matmul", &[4], &[4, 4], No, No).is_err());
    assert!(matmul_dims("matmul", &[1, 2, 3, 4], &[4, 4], No, No).is_err());
    let e = matmul_dims("matmul", &[2, 3, 4], &[5, 4, 6], No, No).unwrap_err();
    assert!(
        e.to_string().contains("[2, 3, 4]") && e.to_string().contains("[5, 4, 6]"),
        "{e}"
    );
    // A 2-D operand broadcasts over the other's batch.
    let d = matmul_dims("matmul", &[3, 4], &[2, 4, 6], No, No).unwrap();
    assert_eq!(d.batch, Some(2));
    assert!(!d.a_batched && d.b_batched);
    assert_eq!(d.out_shape(), vec![2, 3, 6]);
    // The reference applies the same rules, and refuses mixed dtypes.
    let h = |s: &[usize], dt| HostTensor::new(vec![0.0; s.iter().product()], s, dt).unwrap();
    assert!(matches!(
        matmul(&h(&[4, 5], DType::F16), &h(&[6, 7], DType::F16), No, No),
        Err(Error::Shape { .. })
    ));
    assert!(matches!(
        matmul(&h(&[4, 5], DType::F16), &h(&[5, 7], DType::BF16), No, No),
        Err(Error::DType { .. })
    ));
}

#[test]
fn tensor_core_limits_and_access_paths() {
    use super::{MatmulDims, row_access, tc_kernel, tc_limits};
    use crate::Error;
    use gpu::params::RowAccess::{Chunks16, Elements};
    let d = |m, n, k, batch| MatmulDims {
        m,
        n,
        k,
        batch,
        a: (m, k),
        b: (k, n),
        a_batched: batch.is_some(),
        b_batched: batch.is_some(),
    };
    assert!(
        tc_limits(
            "matmul",
            &d(1, 1, 1, None),
            &gpu::params::matmul_tc::DEFAULT
        )
        .is_ok()
    );
    assert!(
        tc_limits(
            "matmul",
            &d(1 << 20, 1 << 20, 1 << 31, Some(65_535)),
            &gpu::params::matmul_tc::DEFAULT
        )
        .is_ok()
    );
    for bad in [
        d((1 << 31) + 1, 1, 1, None),
        d(1, 1, (1 << 31) + 1, None),
        d(1, 1, 1, Some(65_536)),
        d(1 << 31, 1 << 31, 1, None),
    ] {
        assert!(
            matches!(
                tc_limits("matmul", &bad, &gpu::params::matmul_tc::DEFAULT),
                Err(Error::TooLarge { .. })
            ),
            "{bad:?}"
        );
    }
    assert_eq!(row_access(true, 64, 64 * 32), Chunks16);
    assert_eq!(row_access(true, 64, 0), Chunks16);
    assert_eq!(row_access(true, 1000, 1000 * 4095), Chunks16);
    assert_eq!(row_access(true, 4097, 0), Elements);
    assert_eq!(row_access(false, 64, 0), Elements);
    assert_eq!(row_access(true, 8, 8 * 3 + 4), Elements);
    // Every 16-bit dtype and transpose combination has its own kernel in the matmul module, whose
    // launch bound allows the block the host launches; f32 has none.
    let names = [DType::F16, DType::BF16].into_iter().flat_map(|dt| {
        [(No, No), (No, Yes), (Yes, No), (Yes, Yes)].map(|(ta, tb)| tc_kernel(dt, ta, tb).unwrap())
    });
    assert_matmul_kernels(names.collect(), gpu::params::matmul_tc::DEFAULT.threads());
    assert!(tc_kernel(DType::F32, No, No).is_none());
}

/// `names` are distinct kernels of the matmul module whose launch bound, in both builds, is `threads`
/// (the block the host launches them with).
fn assert_matmul_kernels(names: Vec<&str>, threads: u32) {
    let distinct: std::collections::HashSet<_> = names.iter().collect();
    assert_eq!(distinct.len(), names.len(), "{names:?}");
    for name in names {
        assert_eq!(
            crate::Family::of(name),
            Some(crate::Family::Matmul),
            "{name}"
        );
        for arch in ["sm_80", "sm_90"] {
            let bound = crate::modules::launch_bounds(name, arch).map(|b| b.0);
            assert_eq!(bound, Some(threads), "{name} {arch}");
        }
    }
}

#[test]
fn hopper_f32_kernels_exist_in_the_sm_90_build_alone_with_their_launch_bound() {
    use gpu::params::matmul_wg_tf32 as wg;
    let names = super::WG_NAMES
        .iter()
        .chain(&super::WG_WIDE_NAMES)
        .chain(&super::WG_PAIRS_NAMES)
        .chain(&["matmul_wg_split_b_f32"]);
    for &name in names {
        assert_eq!(
            crate::Family::of(name),
            Some(crate::Family::Matmul),
            "{name}"
        );
        let threads = if name == "matmul_wg_split_b_f32" {
            wg::SPLIT_THREADS
        } else {
            wg::THREADS
        };
        assert_eq!(
            crate::modules::launch_bounds(name, "sm_90"),
            Some((threads, 1)),
            "{name}"
        );
        assert_eq!(crate::modules::launch_bounds(name, "sm_80"), None, "{name}");
    }
}

#[test]
fn f32_kernels_exist_with_the_launch_bound_the_host_launches_with() {
    let cfg = gpu::params::matmul_f32v::CONFIG;
    let mut names = Vec::new();
    for (ta, tb) in [(No, No), (No, Yes), (Yes, No), (Yes, Yes)] {
        let (name, threads, smem) = super::f32_kernel(ta, tb);
        assert_eq!((threads, smem), (cfg.threads(), cfg.smem_bytes()));
        names.push(name);
    }
    assert_matmul_kernels(names, cfg.threads());
}

#[test]
fn tile_order_visits_every_tile_once() {
    use gpu::params::matmul_tc::{GROUP_M, tile_coords};
    for (tm, tn) in [(1u32, 1u32), (3, 5), (8, 1), (17, 3), (64, 32), (9, 9)] {
        let mut seen = vec![false; (tm * tn) as usize];
        for bid in 0..tm * tn {
            let (i, j) = tile_coords(bid, tm, tn);
            assert!(
                i < tm && j < tn,
                "bid {bid} -> ({i}, {j}) outside {tm} x {tn}"
            );
            let at = (i * tn + j) as usize;
            assert!(!seen[at], "tile ({i}, {j}) visited twice");
            seen[at] = true;
            // Consecutive blocks stay inside one group of GROUP_M tile rows.
            assert_eq!(i / GROUP_M, bid / (GROUP_M * tn));
        }
    }
}

#[test]
fn reference_rows_match_the_full_product() {
    use super::reference::matmul_row;
    let a = t(&[1., 2., 3., 4., 5., 6.], &[2, 3]);
    let b = t(&[7., 8., 9., 10., 11., 12.], &[3, 2]);
    assert_eq!(matmul_row(&a, &b, No, No, 0, 1).unwrap(), vec![139., 154.]);
    assert!(matmul_row(&a, &b, No, No, 0, 2).is_err());
    assert!(matmul_row(&a, &b, No, No, 1, 0).is_err());
}

#[test]
fn gathered_rows_read_the_stacked_blocks() {
    use super::RowBlocks;
    use gpu::params::{SPLIT_GATHER_MAX, SplitB, split_b_stored_offset};
    // Five (N, M) blocks of distinct values, N = 3 rows of M = 4; the product's B stacks blocks
    // 3, 0, 4, 0 (a block may repeat).
    let (n, m, p) = (3usize, 4usize, 5usize);
    let weight: Vec<f32> = (0..p * n * m).map(|i| i as f32).collect();
    let blocks = [3usize, 0, 4, 0];
    let g = RowBlocks {
        rows: n,
        stride: (n * m) as u64,
        blocks: &blocks,
    };
    let split = g.split_form().unwrap();
    // Stored rows are B's rows or, transposed, its columns: the kernel picks which index is the
    // row; the offset of a stored row is the same either way.
    let sp = SplitB {
        block_rows: split.rows,
        block_of: split.of,
        block_stride: split.stride,
        ld: m as u64,
        ..SplitB::default()
    };
    for r in 0..blocks.len() * n {
        let stacked_row = &weight[(blocks[r / n] * n + r % n) * m..][..m];
        let at = split_b_stored_offset(&sp, r as u32) as usize;
        assert_eq!(&weight[at..at + m], stacked_row, "stored row {r}");
    }
    // Without a gather a stored row is `ld` floats after the one before.
    let plain = SplitB {
        ld: 7,
        ..SplitB::default()
    };
    assert_eq!(split_b_stored_offset(&plain, 5), 35);
    // Past the kernel's reach: too many blocks, a block index past 5 bits, empty blocks.
    let many = vec![1usize; SPLIT_GATHER_MAX + 1];
    let too_many = RowBlocks { blocks: &many, ..g };
    assert!(too_many.split_form().is_none());
    assert!(RowBlocks { blocks: &[32], ..g }.split_form().is_none());
    assert!(RowBlocks { rows: 0, ..g }.split_form().is_none());
    let full = vec![31usize; SPLIT_GATHER_MAX];
    let of = RowBlocks { blocks: &full, ..g }.split_form().unwrap().of;
    let sp = SplitB {
        block_rows: 1,
        block_of: of,
        block_stride: 1,
        ..SplitB::default()
    };
    assert_eq!(split_b_stored_offset(&sp, SPLIT_GATHER_MAX as u32 - 1), 31);
}
