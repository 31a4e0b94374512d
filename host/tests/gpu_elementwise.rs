//! GPU vs CPU reference for the elementwise ops: random shapes and broadcast patterns, every dtype,
//! outputs poisoned before each launch, seed printed.
mod common;
use common::*;
use host::ops::elementwise::{self as ew, BinaryOp, KernelPath, reference as r};
use host::{DType, HostTensor, Tensor};
use rand::Rng;

const OPS: [BinaryOp; 4] = [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div];

/// A broadcast partner for `shape`: drop leading dims and/or set random dims to 1.
fn broadcast_partner(rng: &mut rand::rngs::StdRng, shape: &[usize]) -> Vec<usize> {
    let drop = rng.random_range(0..=shape.len());
    shape[drop..]
        .iter()
        .map(|&d| if rng.random_bool(0.4) { 1 } else { d })
        .collect()
}

/// Division operands kept away from zero so the comparison measures rounding, not cancellation.
fn operand(
    rng: &mut rand::rngs::StdRng,
    shape: &[usize],
    op: BinaryOp,
    dtype: DType,
) -> HostTensor {
    let mut t = uniform(rng, shape, -2.0, 2.0, dtype);
    if op == BinaryOp::Div {
        t.data
            .iter_mut()
            .for_each(|v| *v = if *v < 0.0 { *v - 0.5 } else { *v + 0.5 });
        t = HostTensor::new(t.data, shape, dtype).unwrap();
    }
    t
}

#[test]
fn binary_ops_match_reference_with_broadcasting() {
    let Some(gpu) = gpu_or_skip("binary_ops_match_reference_with_broadcasting") else {
        return;
    };
    let mut rng = rng("binary_ops");
    for case in 0..fuzz_cases(60) {
        let dtype = DType::ALL[case % 3];
        let op = OPS[(case / 3) % 4];
        let a_shape = random_shape(&mut rng, 4, 1 << 20);
        let b_shape = if rng.random_bool(0.5) {
            a_shape.clone()
        } else {
            broadcast_partner(&mut rng, &a_shape)
        };
        let (a_shape, b_shape) = if rng.random_bool(0.5) {
            (a_shape, b_shape)
        } else {
            (b_shape, a_shape)
        };
        let a = operand(&mut rng, &a_shape, BinaryOp::Add, dtype);
        let b = operand(&mut rng, &b_shape, op, dtype);
        let out = ew::binary(
            op,
            &Tensor::from_host(&gpu, &a).unwrap(),
            &Tensor::from_host(&gpu, &b).unwrap(),
        )
        .unwrap();
        let want = r::binary(op, &a, &b).unwrap();
        assert_eq!(out.shape(), want.shape.as_slice());
        assert_close(
            &format!("{op:?} {dtype} {a_shape:?} (op) {b_shape:?}"),
            &out.to_vec().unwrap(),
            &want.data,
            tol(dtype),
        );
    }
}

/// The contiguous (16-byte) path and the strided path: both must be exact.
const ADD_PATHS: [KernelPath; 2] = [KernelPath::Auto, KernelPath::Strided];

#[test]
fn large_contiguous_add_is_exact_in_f32() {
    let Some(gpu) = gpu_or_skip("large_contiguous_add_is_exact_in_f32") else {
        return;
    };
    let mut rng = rng("large_add");
    // 2^24 + 3 elements: many blocks and a ragged tail after the 16-byte chunks.
    let n = scaled(1 << 24, 1 << 16) + 3;
    let a = uniform(&mut rng, &[n], -1e3, 1e3, DType::F32);
    let b = uniform(&mut rng, &[n], -1e3, 1e3, DType::F32);
    let (da, db) = (
        Tensor::from_host(&gpu, &a).unwrap(),
        Tensor::from_host(&gpu, &b).unwrap(),
    );
    for path in ADD_PATHS {
        let out = ew::binary_on(BinaryOp::Add, &da, &db, path)
            .unwrap()
            .to_vec()
            .unwrap();
        // f32 addition is correctly rounded on both sides: the results are bit-identical.
        let mismatches = (0..n)
            .filter(|&i| out[i].to_bits() != (a.data[i] + b.data[i]).to_bits())
            .count();
        assert_eq!(
            mismatches, 0,
            "{path:?}: {mismatches} of {n} elements differ"
        );
    }
}

#[test]
fn binary_into_writes_every_element_and_rejects_bad_outputs() {
    let Some(gpu) = gpu_or_skip("binary_into_writes_every_element_and_rejects_bad_outputs") else {
        return;
    };
    let mut rng = rng("binary_into");
    for case in 0..fuzz_cases(24) {
        let dtype = DType::ALL[case % 3];
        let op = OPS[(case / 3) % 4];
        let a_shape = random_shape(&mut rng, 3, 1 << 18);
        let b_shape = if case % 2 == 0 {
            a_shape.clone()
        } else {
            broadcast_partner(&mut rng, &a_shape)
        };
        let a = operand(&mut rng, &a_shape, BinaryOp::Add, dtype);
        let b = operand(&mut rng, &b_shape, op, dtype);
        let want = r::binary(op, &a, &b).unwrap();
        // `Tensor::empty` is poisoned (0xFF bytes: NaN) in test builds: unwritten elements fail.
        let mut out = Tensor::empty(&gpu, &want.shape, dtype).unwrap();
        ew::binary_into(
            op,
            &Tensor::from_host(&gpu, &a).unwrap(),
            &Tensor::from_host(&gpu, &b).unwrap(),
            &mut out,
        )
        .unwrap();
        assert_close(
            &format!("into {op:?} {dtype} {a_shape:?} (op) {b_shape:?}"),
            &out.to_vec().unwrap(),
            &want.data,
            tol(dtype),
        );
    }
    // Bad outputs: a typed error naming what was expected, and nothing launched.
    let a = Tensor::from_host(&gpu, &uniform(&mut rng, &[4, 6], -1.0, 1.0, DType::F32)).unwrap();
    let b = Tensor::from_host(&gpu, &uniform(&mut rng, &[6], -1.0, 1.0, DType::F32)).unwrap();
    let mut wrong_shape = Tensor::empty(&gpu, &[6, 4], DType::F32).unwrap();
    let e = ew::binary_into(BinaryOp::Add, &a, &b, &mut wrong_shape).unwrap_err();
    assert!(
        matches!(e, host::Error::Shape { .. }) && e.to_string().contains("[4, 6]"),
        "{e}"
    );
    let mut wrong_dtype = Tensor::empty(&gpu, &[4, 6], DType::F16).unwrap();
    let e = ew::binary_into(BinaryOp::Add, &a, &b, &mut wrong_dtype).unwrap_err();
    assert!(matches!(e, host::Error::DType { .. }), "{e}");
    let mut strided = Tensor::empty(&gpu, &[6, 4], DType::F32)
        .unwrap()
        .transpose(0, 1)
        .unwrap();
    let e = ew::binary_into(BinaryOp::Add, &a, &b, &mut strided).unwrap_err();
    assert!(matches!(e, host::Error::NotContiguous { .. }), "{e}");
}

#[test]
fn add_tuning_variants_match_reference_in_half_precision() {
    let Some(gpu) = gpu_or_skip("add_tuning_variants_match_reference_in_half_precision") else {
        return;
    };
    let mut rng = rng("add_tunings");
    for dtype in [DType::F16, DType::BF16] {
        // Odd lengths: whole block tiles, a partial tile and a ragged tail of elements.
        for n in [1usize, 7, 8, 4099, scaled(1 << 20, 1 << 14) + 5] {
            let a = uniform(&mut rng, &[n], -2.0, 2.0, dtype);
            let b = uniform(&mut rng, &[n], -2.0, 2.0, dtype);
            let want = r::binary(BinaryOp::Add, &a, &b).unwrap();
            let (da, db) = (
                Tensor::from_host(&gpu, &a).unwrap(),
                Tensor::from_host(&gpu, &b).unwrap(),
            );
            for path in ADD_PATHS {
                let out = ew::binary_on(BinaryOp::Add, &da, &db, path).unwrap();
                assert_close(
                    &format!("add {dtype} n={n} {path:?}"),
                    &out.to_vec().unwrap(),
                    &want.data,
                    tol(dtype),
                );
            }
        }
    }
}

#[test]
fn strided_views_are_read_through_their_strides() {
    let Some(gpu) = gpu_or_skip("strided_views_are_read_through_their_strides") else {
        return;
    };
    let mut rng = rng("strided_views");
    let a = uniform(&mut rng, &[37, 53], -1.0, 1.0, DType::F32);
    let b = uniform(&mut rng, &[53, 37], -1.0, 1.0, DType::F32);
    let at = Tensor::from_host(&gpu, &a).unwrap();
    let bt = Tensor::from_host(&gpu, &b)
        .unwrap()
        .transpose(0, 1)
        .unwrap();
    assert!(!bt.is_contiguous());
    let out = ew::mul(&at, &bt).unwrap().to_vec().unwrap();
    let b_transposed = HostTensor::new(
        (0..37 * 53)
            .map(|k| b.data[(k % 53) * 37 + k / 53])
            .collect(),
        &[37, 53],
        DType::F32,
    )
    .unwrap();
    assert_close(
        "a * b^T",
        &out,
        &r::binary(BinaryOp::Mul, &a, &b_transposed).unwrap().data,
        1e-7,
    );
}

/// The broadcast-gradient pair: `reduce_to` (sum over the broadcast dims) and `expand` (broadcast
/// back), each scaled by a random alpha, against the f64 references on random broadcast shapes.
#[test]
fn reduce_to_and_expand_match_reference() {
    use rand::Rng;
    let Some(gpu) = gpu_or_skip("reduce_to_and_expand_match_reference") else {
        return;
    };
    let mut rng = rng("reduce_to_expand");
    for case in 0..fuzz_cases(18) {
        let dtype = DType::ALL[case % 3];
        let full = random_shape(&mut rng, 3, 1 << 16);
        let part = broadcast_partner(&mut rng, &full);
        let alpha = rng.random_range(-2.0f32..2.0);
        let g = uniform(&mut rng, &full, -1.0, 1.0, dtype);
        let x = uniform(&mut rng, &part, -1.0, 1.0, dtype);
        let what = format!("{dtype} {full:?} <-> {part:?} alpha {alpha}");
        let got = ew::reduce_to(&Tensor::from_host(&gpu, &g).unwrap(), &part, alpha).unwrap();
        let want = r::reduce_to(&g, &part, alpha).unwrap();
        assert_eq!(got.shape(), want.shape.as_slice(), "{what}");
        // Sums over the broadcast dims amplify the half dtypes' rounding.
        let t = if dtype == DType::F32 {
            1e-5
        } else {
            4.0 * tol(dtype)
        };
        assert_close(
            &format!("reduce_to {what}"),
            &got.to_vec().unwrap(),
            &want.data,
            t,
        );
        let got = ew::expand(&Tensor::from_host(&gpu, &x).unwrap(), &full, alpha).unwrap();
        let want = r::expand(&x, &full, alpha).unwrap();
        assert_eq!(got.shape(), want.shape.as_slice(), "{what}");
        assert_close(
            &format!("expand {what}"),
            &got.to_vec().unwrap(),
            &want.data,
            tol(dtype),
        );
    }
}

#[test]
fn binary_backward_matches_reference() {
    let Some(gpu) = gpu_or_skip("binary_backward_matches_reference") else {
        return;
    };
    let mut rng = rng("binary_backward");
    for case in 0..fuzz_cases(24) {
        let op = OPS[case % 4];
        let dtype = DType::ALL[(case / 4) % 3];
        let a_shape = random_shape(&mut rng, 3, 1 << 16);
        let b_shape = broadcast_partner(&mut rng, &a_shape);
        let a = operand(&mut rng, &a_shape, BinaryOp::Add, dtype);
        let b = operand(&mut rng, &b_shape, op, dtype);
        let g = uniform(&mut rng, &a_shape, -1.0, 1.0, dtype);
        let (ga, gb) = ew::binary_backward(
            op,
            &Tensor::from_host(&gpu, &a).unwrap(),
            &Tensor::from_host(&gpu, &b).unwrap(),
            &Tensor::from_host(&gpu, &g).unwrap(),
        )
        .unwrap();
        let (wa, wb) = r::binary_backward(op, &a, &b, &g).unwrap();
        // Half dtypes round the intermediate products, and the sums over broadcast dims amplify that.
        let t = if dtype == DType::F32 {
            1e-5
        } else {
            4.0 * tol(dtype)
        };
        assert_close(
            &format!("d{op:?}/da {dtype} {a_shape:?},{b_shape:?}"),
            &ga.to_vec().unwrap(),
            &wa.data,
            t,
        );
        assert_close(
            &format!("d{op:?}/db {dtype} {a_shape:?},{b_shape:?}"),
            &gb.to_vec().unwrap(),
            &wb.data,
            t,
        );
    }
}

#[test]
fn gelu_forward_and_backward_match_reference() {
    let Some(gpu) = gpu_or_skip("gelu_forward_and_backward_match_reference") else {
        return;
    };
    let mut rng = rng("gelu");
    for case in 0..fuzz_cases(18) {
        let dtype = DType::ALL[case % 3];
        let shape = random_shape(&mut rng, 3, 1 << 20);
        let x = uniform(&mut rng, &shape, -8.0, 8.0, dtype);
        let dy = uniform(&mut rng, &shape, -1.0, 1.0, dtype);
        let xt = Tensor::from_host(&gpu, &x).unwrap();
        let y = ew::gelu(&xt).unwrap().to_vec().unwrap();
        assert_close(
            &format!("gelu {dtype} {shape:?}"),
            &y,
            &r::gelu(&x).unwrap().data,
            tol(dtype),
        );
        let dx = ew::gelu_backward(&xt, &Tensor::from_host(&gpu, &dy).unwrap())
            .unwrap()
            .to_vec()
            .unwrap();
        assert_close(
            &format!("gelu' {dtype} {shape:?}"),
            &dx,
            &r::gelu_backward(&x, &dy).unwrap().data,
            tol(dtype),
        );
    }
}

#[test]
fn affine_matches_reference() {
    let Some(gpu) = gpu_or_skip("affine_matches_reference") else {
        return;
    };
    let mut rng = rng("affine");
    for dtype in DType::ALL {
        let shape = random_shape(&mut rng, 3, 1 << 18);
        let x = uniform(&mut rng, &shape, -4.0, 4.0, dtype);
        let y = ew::affine(&Tensor::from_host(&gpu, &x).unwrap(), -1.5, 0.25)
            .unwrap()
            .to_vec()
            .unwrap();
        assert_close(
            &format!("affine {dtype} {shape:?}"),
            &y,
            &r::affine(&x, -1.5, 0.25).unwrap().data,
            tol(dtype),
        );
    }
}

#[test]
fn nan_and_inf_propagate_as_values() {
    let Some(gpu) = gpu_or_skip("nan_and_inf_propagate_as_values") else {
        return;
    };
    let a = Tensor::from_f32(&gpu, &[f32::NAN, f32::INFINITY, 1.0, 0.0], &[4], DType::F32).unwrap();
    let b = Tensor::from_f32(&gpu, &[1.0, 1.0, f32::NEG_INFINITY, 0.0], &[4], DType::F32).unwrap();
    let s = ew::add(&a, &b).unwrap().to_vec().unwrap();
    assert!(s[0].is_nan());
    assert_eq!(&s[1..3], &[f32::INFINITY, f32::NEG_INFINITY]);
    assert!(ew::div(&a, &b).unwrap().to_vec().unwrap()[3].is_nan()); // 0/0
}

#[test]
fn cast_rounds_to_nearest_and_widens_exactly() {
    let Some(gpu) = gpu_or_skip("cast_rounds_to_nearest_and_widens_exactly") else {
        return;
    };
    let mut rng = rng("cast");
    let n = scaled(1 << 20, 4097) + rng.random_range(0..7usize);
    let mut values: Vec<f32> = (0..n)
        .map(|_| rng.random_range(-70000.0f32..70000.0))
        .collect();
    values[..4].copy_from_slice(&[f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0]);
    let x = Tensor::from_f32(&gpu, &values, &[n], DType::F32).unwrap();
    for dtype in [DType::F16, DType::BF16] {
        let narrow = ew::cast(&x, dtype).unwrap();
        assert_eq!(narrow.dtype(), dtype);
        let got = narrow.to_vec().unwrap();
        let back = ew::cast(&narrow, DType::F32).unwrap().to_vec().unwrap();
        for (i, &v) in values.iter().enumerate() {
            let want = dtype.round(v);
            // Bitwise: round-to-nearest-even is exact, and NaN must stay NaN (NaN != NaN otherwise).
            let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
            assert!(
                same(got[i], want),
                "narrow to {dtype} at {i}: {v} -> {} (want {want})",
                got[i]
            );
            assert!(
                same(back[i], want),
                "widen {dtype} at {i}: {} (want {want})",
                back[i]
            );
        }
    }
}

#[test]
fn row_broadcast_matches_reference_in_both_orders() {
    let Some(gpu) = gpu_or_skip("row_broadcast_matches_reference_in_both_orders") else {
        return;
    };
    let mut rng = rng("row_broadcast");
    // Rows of whole 16-byte chunks take the row kernel; 7 and 12 (f16/bf16) fall back to the strided one.
    for (full, row) in [
        (vec![3usize, 5, 8], vec![8usize]),
        (vec![257, 64], vec![1, 64]),
        (vec![2, 3, 16], vec![3, 16]),
        (vec![33, 12], vec![12]),
        (vec![9, 7], vec![7]),
        (vec![scaled(1024, 16), 1024], vec![1024]),
    ] {
        for dtype in DType::ALL {
            for op in OPS {
                // Both operands serve as divisors: away from 0 so the comparison is about the kernel.
                let x = uniform(&mut rng, &full, 0.25, 2.0, dtype);
                let r = uniform(&mut rng, &row, 0.5, 2.0, dtype);
                let (xt, rt) = (
                    Tensor::from_host(&gpu, &x).unwrap(),
                    Tensor::from_host(&gpu, &r).unwrap(),
                );
                for (a, b, at, bt, order) in [
                    (&x, &r, &xt, &rt, "full op row"),
                    (&r, &x, &rt, &xt, "row op full"),
                ] {
                    let got = ew::binary(op, at, bt).unwrap();
                    assert_eq!(got.shape(), &full[..]);
                    assert_close(
                        &format!("{op:?} {dtype} {full:?} {row:?} {order}"),
                        &got.to_vec().unwrap(),
                        &r::binary(op, a, b).unwrap().data,
                        tol(dtype),
                    );
                }
            }
        }
    }
}
