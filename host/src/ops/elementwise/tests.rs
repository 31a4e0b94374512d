use super::BinaryOp;
use super::reference as r;
use crate::{DType, HostTensor};

fn t(data: &[f32], shape: &[usize]) -> HostTensor {
    HostTensor::new(data.to_vec(), shape, DType::F32).unwrap()
}

#[test]
fn reference_broadcasts_row_and_column_vectors() {
    let a = t(&[1., 2., 3.], &[3, 1]);
    let b = t(&[10., 20.], &[2]);
    let c = r::binary(BinaryOp::Add, &a, &b).unwrap();
    assert_eq!(c.shape, vec![3, 2]);
    assert_eq!(c.data, vec![11., 21., 12., 22., 13., 23.]);
    let d = r::binary(BinaryOp::Div, &b, &t(&[4.], &[])).unwrap();
    assert_eq!(d.data, vec![2.5, 5.0]);
}

#[test]
fn reference_backward_sums_over_broadcast_dims() {
    let a = t(&[1., 2., 3., 4., 5., 6.], &[2, 3]);
    let b = t(&[2., 4., 8.], &[3]);
    let g = t(&[1.; 6], &[2, 3]);
    let (ga, gb) = r::binary_backward(BinaryOp::Mul, &a, &b, &g).unwrap();
    assert_eq!(ga.data, vec![2., 4., 8., 2., 4., 8.]);
    assert_eq!(gb.data, vec![5., 7., 9.]); // column sums of a
    let (_, gb) = r::binary_backward(BinaryOp::Sub, &a, &b, &g).unwrap();
    assert_eq!(gb.data, vec![-2., -2., -2.]);
    let (ga, gb) = r::binary_backward(BinaryOp::Div, &a, &b, &g).unwrap();
    assert_eq!(ga.data[0], 0.5);
    assert!((gb.data[0] - (-(1. + 4.) / 4.)).abs() < 1e-6); // -sum_i a_i0 / b0^2
}

#[test]
fn gelu_matches_closed_form_values() {
    // GELU(x) = x Phi(x); Phi(1) = 0.8413447460685429, Phi(-1) = 0.15865525393145707.
    let y = r::gelu(&t(&[0.0, 1.0, -1.0, 3.0], &[4])).unwrap();
    assert_eq!(y.data[0], 0.0);
    assert!((y.data[1] as f64 - 0.841_344_746_068_542_9).abs() < 1e-7);
    assert!((y.data[2] as f64 + 0.158_655_253_931_457_07).abs() < 1e-7);
    assert!((y.data[3] as f64 - 3.0 * 0.998_650_101_968_369_9).abs() < 1e-6);
}

#[test]
fn gelu_backward_matches_finite_differences() {
    for &x in &[-3.0f64, -0.7, 0.0, 0.4, 2.5] {
        let h = 1e-6;
        let f = |v: f64| v * r::normal_cdf(v);
        let fd = (f(x + h) - f(x - h)) / (2.0 * h);
        let g = r::gelu_backward(&t(&[x as f32], &[1]), &t(&[1.0], &[1])).unwrap();
        assert!(
            (g.data[0] as f64 - fd).abs() < 1e-5,
            "x={x}: {} vs {fd}",
            g.data[0]
        );
    }
}

#[test]
fn reference_rejects_incompatible_shapes_naming_both() {
    let e = r::binary(BinaryOp::Add, &t(&[0.; 6], &[2, 3]), &t(&[0.; 4], &[4]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("[2, 3]") && e.contains("[4]"), "{e}");
}

#[test]
fn half_results_are_rounded_to_the_dtype() {
    let a = HostTensor::new(vec![1.0], &[1], DType::F16).unwrap();
    let b = HostTensor::new(vec![1e-4], &[1], DType::F16).unwrap();
    // 1 + 1e-4 is not representable in f16 (spacing 2^-10 near 1): rounds back to 1.
    assert_eq!(r::binary(BinaryOp::Add, &a, &b).unwrap().data[0], 1.0);
}
