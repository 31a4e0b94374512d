//! GPU vs CPU reference for reductions and softmax: random shapes, every dtype, determinism (same bits
//! every run), rows of length 1 to 1e6, outputs poisoned before each launch, seed printed.
mod common;
use common::*;
use host::ops::reduce::{self, Axis, Reduction, reference as rr};
use host::ops::softmax::{self, reference as sr};
use host::{DType, Tensor};
use rand::Rng;

/// Reductions over more than 1e5 elements are held to 1e-4 in f32 (docs/math/ops.md), others to 1e-5.
fn reduce_tol(dtype: DType, reduced: usize) -> f64 {
    match dtype {
        DType::F32 if reduced > 100_000 => 1e-4,
        d => tol(d),
    }
}

#[test]
fn reductions_match_reference() {
    let Some(gpu) = gpu_or_skip("reductions_match_reference") else {
        return;
    };
    let mut rng = rng("reductions");
    let reds = [Reduction::Sum, Reduction::Mean, Reduction::Max];
    for case in 0..fuzz_cases(54) {
        let dtype = DType::ALL[case % 3];
        let r = reds[(case / 3) % 3];
        let axis = if case % 2 == 0 { Axis::Last } else { Axis::All };
        let shape = random_shape(&mut rng, 3, 1 << 21);
        // Positive offset keeps sums away from cancellation, so relative error means rounding error.
        let x = uniform(&mut rng, &shape, 0.5, 1.5, dtype);
        let out = reduce::reduce(&Tensor::from_host(&gpu, &x).unwrap(), r, axis).unwrap();
        let want = rr::reduce(&x, r, axis).unwrap();
        assert_eq!(out.shape(), want.shape.as_slice());
        let reduced = if axis == Axis::All {
            x.numel()
        } else {
            *shape.last().unwrap()
        };
        assert_close(
            &format!("{r:?} {axis:?} {dtype} {shape:?}"),
            &out.to_vec().unwrap(),
            &want.data,
            reduce_tol(dtype, reduced),
        );
    }
}

#[test]
fn full_reductions_of_every_small_size_match_reference() {
    let Some(gpu) = gpu_or_skip("full_reductions_of_every_small_size_match_reference") else {
        return;
    };
    let mut rng = rng("small_full_reductions");
    let mut failures = Vec::new();
    for n in (1..=scaled(300, 40)).chain([4095, 8191, 8192, 8193, 70_001]) {
        for dtype in DType::ALL {
            for r in [Reduction::Sum, Reduction::Mean, Reduction::Max] {
                let x = uniform(&mut rng, &[n], 0.5, 1.5, dtype);
                let out = reduce::reduce(&Tensor::from_host(&gpu, &x).unwrap(), r, Axis::All)
                    .unwrap()
                    .to_vec()
                    .unwrap()[0];
                let want = rr::reduce(&x, r, Axis::All).unwrap().data[0];
                if !(rel_err(&[out], &[want]) <= reduce_tol(dtype, n)) {
                    failures.push(format!("{r:?} {dtype} n={n}: got {out} want {want}"));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures: {}",
        failures.len(),
        failures
            .iter()
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join("; ")
    );
}

#[test]
fn large_reductions_are_deterministic_and_accurate() {
    let Some(gpu) = gpu_or_skip("large_reductions_are_deterministic_and_accurate") else {
        return;
    };
    let mut rng = rng("large_reductions");
    let n = scaled(1 << 24, 1 << 16) + 7;
    let x = uniform(&mut rng, &[n], -1.0, 1.0, DType::F32);
    let xt = Tensor::from_host(&gpu, &x).unwrap();
    let first = reduce::sum(&xt, Axis::All).unwrap().to_vec().unwrap()[0];
    let want = rr::reduce(&x, Reduction::Sum, Axis::All).unwrap().data[0];
    // Absolute error against the f64 sum, relative to the sum of |x| (the cancellation-free scale).
    let scale: f64 = x.data.iter().map(|v| v.abs() as f64).sum();
    assert!(
        ((first - want) as f64).abs() / scale < 1e-6,
        "sum {first} vs {want}"
    );
    for _ in 0..scaled(20, 2) {
        assert_eq!(
            reduce::sum(&xt, Axis::All).unwrap().to_vec().unwrap()[0].to_bits(),
            first.to_bits(),
            "sum changed between runs"
        );
    }
    let rows = xt.reshape(&[n]).unwrap();
    let m = reduce::max(&rows, Axis::Last).unwrap().to_vec().unwrap()[0];
    assert_eq!(m, x.data.iter().cloned().fold(f32::NEG_INFINITY, f32::max));
    let last = Tensor::from_host(
        &gpu,
        &uniform(&mut rng, &[scaled(4096, 64), 4099], -1.0, 1.0, DType::F32),
    )
    .unwrap();
    let a = reduce::sum(&last, Axis::Last).unwrap().to_vec().unwrap();
    for _ in 0..5 {
        let b = reduce::sum(&last, Axis::Last).unwrap().to_vec().unwrap();
        assert!(
            a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "row sums changed between runs"
        );
    }
}

#[test]
fn reduction_backward_matches_reference() {
    let Some(gpu) = gpu_or_skip("reduction_backward_matches_reference") else {
        return;
    };
    let mut rng = rng("reduction_backward");
    for case in 0..fuzz_cases(12) {
        let dtype = DType::ALL[case % 3];
        let r = if case % 2 == 0 {
            Reduction::Sum
        } else {
            Reduction::Mean
        };
        let axis = if (case / 2) % 2 == 0 {
            Axis::Last
        } else {
            Axis::All
        };
        let shape = random_shape(&mut rng, 3, 1 << 18);
        let gshape = reduce::output_shape(&shape, axis);
        let g = uniform(&mut rng, &gshape, -1.0, 1.0, dtype);
        let dx = reduce::backward(&Tensor::from_host(&gpu, &g).unwrap(), r, axis, &shape).unwrap();
        let want = rr::backward(&g, r, axis, &shape).unwrap();
        assert_close(
            &format!("d{r:?} {axis:?} {dtype} {shape:?}"),
            &dx.to_vec().unwrap(),
            &want.data,
            tol(dtype),
        );
    }
}

#[test]
fn softmax_matches_reference_over_row_lengths() {
    let Some(gpu) = gpu_or_skip("softmax_matches_reference_over_row_lengths") else {
        return;
    };
    let mut rng = rng("softmax");
    // Register-cached rows (<= 8192: 16-byte vector path when the length is a multiple of 4 (f32) or 8
    // (f16/bf16), scalar otherwise, e.g. 12 and 8188 for the halves), two-pass rows, lengths 1 and 1e6.
    let cols_list = [
        1usize, 2, 4, 8, 12, 31, 32, 33, 1000, 1024, 4096, 8188, 8192, 16384, 16385, 100_003,
        1_000_000,
    ];
    for (i, &cols) in cols_list.iter().enumerate() {
        for dtype in DType::ALL {
            let rows = if sanitizing() {
                2
            } else {
                (1 << 21) / cols.max(1) % 300 + 1
            };
            let x = uniform(&mut rng, &[rows, cols], -10.0, 10.0, dtype);
            let dy = uniform(&mut rng, &[rows, cols], -1.0, 1.0, dtype);
            let xt = Tensor::from_host(&gpu, &x).unwrap();
            let y = softmax::softmax(&xt).unwrap();
            let want = sr::softmax(&x).unwrap();
            let case = format!("softmax #{i} {dtype} [{rows}, {cols}]");
            let yv = y.to_vec().unwrap();
            assert_close(&case, &yv, &want.data, tol(dtype));
            if dtype == DType::F32 {
                for row in yv.chunks(cols) {
                    let s: f64 = row.iter().map(|&v| v as f64).sum();
                    assert!((s - 1.0).abs() < 1e-4, "{case}: row sums to {s}");
                }
            }
            let dx = softmax::softmax_backward(&y, &Tensor::from_host(&gpu, &dy).unwrap()).unwrap();
            let y_host = y.to_host().unwrap();
            let want_dx = sr::softmax_backward(&y_host, &dy).unwrap();
            // dx = y (dy - dot): the subtraction cancels (a row of 2 gave 5e-4 relative to a tiny dx,
            // measured), so the error is judged on the scale of its terms, y (|dy| + |dot|).
            let dxv = dx.to_vec().unwrap();
            let norm = |v: &mut dyn Iterator<Item = f64>| v.map(|e| e * e).sum::<f64>().sqrt();
            let err = norm(
                &mut dxv
                    .iter()
                    .zip(&want_dx.data)
                    .map(|(&a, &b)| a as f64 - b as f64),
            );
            let terms = norm(
                &mut y_host
                    .data
                    .chunks(cols)
                    .zip(dy.data.chunks(cols))
                    .flat_map(|(yr, gr)| {
                        let dot: f64 = yr.iter().zip(gr).map(|(&a, &b)| a as f64 * b as f64).sum();
                        yr.iter()
                            .zip(gr)
                            .map(move |(&a, &b)| a as f64 * ((b as f64).abs() + dot.abs()))
                    }),
            );
            let scale = terms.max(norm(&mut want_dx.data.iter().map(|&v| v as f64)));
            assert!(
                err <= 10.0 * tol(dtype) * scale,
                "{case} backward: error {err:.3e} > {:.1e} x {scale:.3e}",
                10.0 * tol(dtype)
            );
        }
    }
}

#[test]
fn softmax_is_stable_and_propagates_nan() {
    let Some(gpu) = gpu_or_skip("softmax_is_stable_and_propagates_nan") else {
        return;
    };
    let x = Tensor::from_f32(
        &gpu,
        &[1000.0, 1001.0, 1002.0, 1.0, f32::NAN, 3.0],
        &[2, 3],
        DType::F32,
    )
    .unwrap();
    let y = softmax::softmax(&x).unwrap().to_vec().unwrap();
    let want = 1.0 / (1.0 + (-1f64).exp() + (-2f64).exp());
    assert!(
        (y[2] as f64 - want).abs() < 1e-6,
        "large inputs overflowed: {y:?}"
    );
    assert!(
        y[3..].iter().all(|v| v.is_nan()),
        "NaN in a row must reach every output of that row: {y:?}"
    );
    let _ = rand::rng().random::<u8>();
}
