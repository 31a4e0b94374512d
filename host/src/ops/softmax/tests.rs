use super::reference as r;
use crate::{DType, HostTensor};

#[test]
fn rows_sum_to_one_and_shift_invariance_holds() {
    let x = HostTensor::new(vec![1., 2., 3., 1001., 1002., 1003.], &[2, 3], DType::F32).unwrap();
    let y = r::softmax(&x).unwrap();
    for row in y.data.chunks(3) {
        assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    }
    // softmax(x + c) == softmax(x), and no overflow at 1000.
    for k in 0..3 {
        assert!((y.data[k] - y.data[k + 3]).abs() < 1e-7);
    }
    // Closed form: softmax([1,2,3])[2] = 1 / (1 + e^-1 + e^-2).
    let want = 1.0 / (1.0 + (-1f64).exp() + (-2f64).exp());
    assert!((y.data[2] as f64 - want).abs() < 1e-7);
}

#[test]
fn length_one_rows_are_one() {
    let x = HostTensor::new(vec![-5., 0., 7.], &[3, 1], DType::F32).unwrap();
    assert_eq!(r::softmax(&x).unwrap().data, vec![1., 1., 1.]);
}

#[test]
fn backward_matches_finite_differences() {
    let x = [0.3f64, -1.2, 2.0, 0.5];
    let g = [0.7f64, -0.1, 0.4, 1.3];
    let loss = |x: &[f64]| {
        let m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = x.iter().map(|v| (v - m).exp()).sum();
        x.iter()
            .zip(&g)
            .map(|(v, gi)| (v - m).exp() / s * gi)
            .sum::<f64>()
    };
    let xt = HostTensor::new(x.iter().map(|&v| v as f32).collect(), &[1, 4], DType::F32).unwrap();
    let y = r::softmax(&xt).unwrap();
    let gt = HostTensor::new(g.iter().map(|&v| v as f32).collect(), &[1, 4], DType::F32).unwrap();
    let dx = r::softmax_backward(&y, &gt).unwrap();
    for i in 0..4 {
        let (mut xp, mut xm) = (x, x);
        xp[i] += 1e-6;
        xm[i] -= 1e-6;
        let fd = (loss(&xp) - loss(&xm)) / 2e-6;
        assert!(
            (dx.data[i] as f64 - fd).abs() < 1e-5,
            "i={i}: {} vs {fd}",
            dx.data[i]
        );
    }
}
