use super::reference as r;
use crate::{DType, HostTensor};

fn t(v: &[f32], shape: &[usize]) -> HostTensor {
    HostTensor::new(v.to_vec(), shape, DType::F32).unwrap()
}

#[test]
fn constant_row_gives_beta() {
    let x = t(&[3.5; 8], &[2, 4]);
    let (y, mean, _) = r::layer_norm(
        &x,
        &t(&[2.0, -1.0, 0.5, 7.0], &[4]),
        &t(&[0.1, 0.2, 0.3, 0.4], &[4]),
        None,
    )
    .unwrap();
    assert_eq!(mean.data, vec![3.5, 3.5]);
    assert_eq!(y.data, vec![0.1, 0.2, 0.3, 0.4, 0.1, 0.2, 0.3, 0.4]);
}

#[test]
fn normalised_rows_have_mean_zero_and_variance_one() {
    let x: Vec<f32> = (0..64)
        .map(|i| ((i * 37) % 11) as f32 * 0.7 - 3.0)
        .collect();
    let (y, _, rstd) = r::layer_norm(
        &t(&x, &[4, 16]),
        &t(&[1.0; 16], &[16]),
        &t(&[0.0; 16], &[16]),
        Some(0.0),
    )
    .unwrap();
    for (row, rs) in y.data.chunks(16).zip(&rstd.data) {
        let m: f64 = row.iter().map(|&v| v as f64).sum::<f64>() / 16.0;
        let v: f64 = row.iter().map(|&v| (v as f64 - m).powi(2)).sum::<f64>() / 16.0;
        assert!(m.abs() < 1e-6 && (v - 1.0).abs() < 1e-6, "mean {m} var {v}");
        assert!(rs.is_finite());
    }
    // Closed form: [1, 3] -> mean 2, var 1, y = [-1, 1].
    let (y, m, s) = r::layer_norm(
        &t(&[1.0, 3.0], &[2]),
        &t(&[1.0, 1.0], &[2]),
        &t(&[0.0, 0.0], &[2]),
        Some(0.0),
    )
    .unwrap();
    assert_eq!(
        (y.data, m.data, s.data),
        (vec![-1.0, 1.0], vec![2.0], vec![1.0])
    );
}

#[test]
fn backward_matches_finite_differences() {
    let (rows, cols, eps) = (3usize, 5usize, 1e-5f64);
    let x: Vec<f64> = (0..rows * cols)
        .map(|i| ((i * 7919) % 13) as f64 * 0.31 - 1.7)
        .collect();
    let gamma: Vec<f64> = (0..cols).map(|j| 0.5 + 0.3 * j as f64).collect();
    let beta: Vec<f64> = (0..cols).map(|j| 0.1 * j as f64 - 0.2).collect();
    let w: Vec<f64> = (0..rows * cols)
        .map(|i| ((i * 104729) % 17) as f64 * 0.13 - 1.0)
        .collect();
    let loss = |x: &[f64], g: &[f64], b: &[f64]| {
        let (y, _, _) = r::forward_f64(x, g, b, cols, eps);
        y.iter().zip(&w).map(|(a, b)| a * b).sum::<f64>()
    };
    let (_, mean, rstd) = r::forward_f64(&x, &gamma, &beta, cols, eps);
    let (dx, dg, db) = r::backward_f64(&x, &gamma, &mean, &rstd, &w, cols);
    let h = 1e-6;
    let fd = |f: &dyn Fn(f64) -> f64| (f(h) - f(-h)) / (2.0 * h);
    for i in 0..x.len() {
        let num = fd(&|d| {
            let mut xp = x.clone();
            xp[i] += d;
            loss(&xp, &gamma, &beta)
        });
        assert!(
            (dx[i] - num).abs() < 1e-6 * (1.0 + num.abs()),
            "dx[{i}] {} vs {num}",
            dx[i]
        );
    }
    for j in 0..cols {
        let num = fd(&|d| {
            let mut gp = gamma.clone();
            gp[j] += d;
            loss(&x, &gp, &beta)
        });
        assert!(
            (dg[j] - num).abs() < 1e-6 * (1.0 + num.abs()),
            "dgamma[{j}] {} vs {num}",
            dg[j]
        );
        let num = fd(&|d| {
            let mut bp = beta.clone();
            bp[j] += d;
            loss(&x, &gamma, &bp)
        });
        assert!(
            (db[j] - num).abs() < 1e-6 * (1.0 + num.abs()),
            "dbeta[{j}] {} vs {num}",
            db[j]
        );
    }
}

#[test]
fn reference_rejects_a_gamma_of_the_wrong_length() {
    let e = r::layer_norm(
        &t(&[1.0; 6], &[2, 3]),
        &t(&[1.0; 2], &[2]),
        &t(&[0.0; 3], &[3]),
        None,
    )
    .unwrap_err();
    assert!(matches!(e, crate::Error::Shape { .. }), "{e}");
}
