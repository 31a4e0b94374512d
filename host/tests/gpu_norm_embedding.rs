//! GPU vs f64 CPU reference for layer norm and embedding, forward and backward: random shapes (D = 1,
//! odd, 4099, past the register cache; rows 1 .. many), every dtype, outputs poisoned before each
//! launch, seed printed; dgamma/dbeta and dW bit-identical over 20 runs; out-of-range ids are errors
//! and the context keeps working.
mod common;
use common::*;
use host::ops::embedding::{self as emb, DeviceIds, reference as er};
use host::ops::layer_norm::{self as ln, reference as lr};
use host::{DType, Error, HostTensor, Tensor};
use rand::Rng;
use rand::rngs::StdRng;

/// Row lengths: 1, odd, powers of two, the cached limit (8192) and past it (two-pass path).
// Narrow kernels (4 a thread) up to 2048, 16-element kernels to 8192, two-pass rows beyond.
const COLS: [usize; 14] = [
    1, 2, 3, 31, 33, 257, 1000, 1024, 2048, 2049, 4099, 8192, 8193, 20_011,
];

fn rows_for(rng: &mut StdRng, cols: usize) -> usize {
    let cap = (scaled(1 << 21, 1 << 14) / cols).clamp(1, scaled(5000, 40));
    match rng.random_range(0..3) {
        0 => 1,
        1 => rng.random_range(1..=17.min(cap)),
        _ => rng.random_range(1..=cap),
    }
}

/// dx and dgamma are differences of nearly equal terms (and dgamma/dbeta are sums over many rows), so
/// they are held to 10x the elementwise tolerance; f32 stays within 1e-4.
fn grad_tol(dtype: DType) -> f64 {
    10.0 * tol(dtype)
}

/// Layer norm inputs of `[rows, cols]`: x offset from 0 (a row mean away from 0, as real activations
/// have), gamma around 1, beta around 0.
fn ln_inputs(
    rng: &mut StdRng,
    rows: usize,
    cols: usize,
    dtype: DType,
) -> (HostTensor, HostTensor, HostTensor) {
    (
        uniform(rng, &[rows, cols], 1.0, 5.0, dtype),
        uniform(rng, &[cols], 0.5, 1.5, dtype),
        uniform(rng, &[cols], -1.0, 1.0, dtype),
    )
}

/// A forward's `(y, mean, rstd)` against the reference's: y at the dtype's tolerance, the f32
/// statistics at 1e-5 / 1e-4 (cols = 1: var = 0 and rstd = 1/sqrt(eps), exact up to rounding).
fn check_forward(
    case: &str,
    got: &(Tensor, Tensor, Tensor),
    want: &(HostTensor, HostTensor, HostTensor),
    dtype: DType,
) {
    assert_close(case, &got.0.to_vec().unwrap(), &want.0.data, tol(dtype));
    assert_close(
        &format!("{case} mean"),
        &got.1.to_vec().unwrap(),
        &want.1.data,
        1e-5,
    );
    assert_close(
        &format!("{case} rstd"),
        &got.2.to_vec().unwrap(),
        &want.2.data,
        1e-4,
    );
}

#[test]
fn layer_norm_matches_reference() {
    let Some(gpu) = gpu_or_skip("layer_norm_matches_reference") else {
        return;
    };
    let mut rng = rng("layer_norm");
    for (i, &cols) in COLS.iter().enumerate() {
        for dtype in DType::ALL {
            let rows = rows_for(&mut rng, cols);
            let (x, g, b) = ln_inputs(&mut rng, rows, cols, dtype);
            let dy = uniform(&mut rng, &[rows, cols], -1.0, 1.0, dtype);
            let up = |h: &HostTensor| Tensor::from_host(&gpu, h).unwrap();
            let (xt, gt, bt) = (up(&x), up(&g), up(&b));
            let case = format!("layer_norm #{i} {dtype} [{rows}, {cols}]");
            let got = ln::layer_norm(&xt, &gt, &bt, None).unwrap();
            let want = lr::layer_norm(&x, &g, &b, None).unwrap();
            assert_eq!(got.0.shape(), &[rows, cols]);
            assert_eq!(got.1.shape(), &[rows]);
            check_forward(&case, &got, &want, dtype);
            let grads = ln::layer_norm_backward(&xt, &gt, &got.1, &got.2, &up(&dy)).unwrap();
            check_backward(&case, &x, &g, (&want.1, &want.2), &dy, grads);
        }
    }
}

/// The backward's `(dx, dgamma, dbeta)` against the f64 reference from the reference statistics
/// `(mean, rstd)`; the panic message names `case` (the seed is printed above it).
fn check_backward(
    case: &str,
    x: &HostTensor,
    g: &HostTensor,
    (wm, wr): (&HostTensor, &HostTensor),
    dy: &HostTensor,
    (dx, dg, db): (Tensor, Tensor, Tensor),
) {
    let (rows, cols) = (wm.data.len(), g.data.len());
    let dtype = x.dtype;
    assert_eq!(dx.shape(), x.shape.as_slice(), "{case} dx shape");
    let (wdx, wdg, wdb) = lr::layer_norm_backward(x, g, wm, wr, dy).unwrap();
    // dx = rstd (g - mean(g) - xhat mean(g xhat)) cancels (for 2 columns it is 0 up to the
    // eps term: a 2e-5 result from O(1) terms, measured 5.7e-4 relative on an H200), so the
    // error is judged on the scale of its terms, rstd |dy gamma|, or of dx when larger.
    let dxv = dx.to_vec().unwrap();
    let norm = |v: &mut dyn Iterator<Item = f64>| v.map(|e| e * e).sum::<f64>().sqrt();
    let err = norm(
        &mut dxv
            .iter()
            .zip(&wdx.data)
            .map(|(&a, &b)| a as f64 - b as f64),
    );
    let terms =
        norm(&mut (0..rows * cols).map(|k| {
            wr.data[k / cols] as f64 * (dy.data[k] as f64 * g.data[k % cols] as f64).abs()
        }));
    let scale = terms.max(norm(&mut wdx.data.iter().map(|&v| v as f64)));
    // `err <= ...` is false for a NaN error (an unwritten, poisoned element).
    assert!(
        err <= grad_tol(dtype) * scale,
        "{case} dx: error {err:.3e} > {:.1e} x {scale:.3e} (seed above)",
        grad_tol(dtype)
    );
    assert_close(
        &format!("{case} dgamma"),
        &dg.to_vec().unwrap(),
        &wdg.data,
        grad_tol(dtype),
    );
    assert_close(
        &format!("{case} dbeta"),
        &db.to_vec().unwrap(),
        &wdb.data,
        grad_tol(dtype),
    );
}

/// Row lengths for the warp-per-row backward: whole 16-byte chunks from one chunk to the 1024-element
/// limit (lanes with no chunk, partial last slots), and rows that fall back to the block-a-row kernels
/// (not whole chunks, longer than 1024).
const WARP_COLS: [usize; 16] = [
    1, 3, 4, 8, 12, 64, 100, 128, 136, 504, 768, 1000, 1016, 1024, 1032, 2048,
];

#[test]
fn layer_norm_backward_warp_kernel_matches_reference() {
    let Some(gpu) = gpu_or_skip("layer_norm_backward_warp_kernel_matches_reference") else {
        return;
    };
    let mut rng = rng("layer_norm_backward_warp");
    {
        for (i, &cols) in WARP_COLS.iter().enumerate() {
            for dtype in DType::ALL {
                // Rows past the grid's warps (several rows a warp) on some cases: the grid holds
                // a few thousand warps.
                let rows = match rng.random_range(0..4) {
                    0 => scaled((1 << 23) / cols, (1 << 14) / cols).clamp(1, scaled(9000, 64)),
                    _ => rows_for(&mut rng, cols),
                };
                let x = uniform(&mut rng, &[rows, cols], 1.0, 5.0, dtype);
                let g = uniform(&mut rng, &[cols], 0.5, 1.5, dtype);
                let b = uniform(&mut rng, &[cols], -1.0, 1.0, dtype);
                let dy = uniform(&mut rng, &[rows, cols], -1.0, 1.0, dtype);
                let up = |h: &HostTensor| Tensor::from_host(&gpu, h).unwrap();
                let (xt, gt, bt) = (up(&x), up(&g), up(&b));
                let launch = ln::warp_launch(&gpu, dtype, (rows as u64, cols as u64)).unwrap();
                let case = format!("#{i} {dtype} [{rows}, {cols}] (warp launch {launch:?})");
                println!("{case}");
                let (_, mean, rstd) = ln::layer_norm(&xt, &gt, &bt, None).unwrap();
                let (_, wm, wr) = lr::layer_norm(&x, &g, &b, None).unwrap();
                let grads = ln::layer_norm_backward(&xt, &gt, &mean, &rstd, &up(&dy)).unwrap();
                check_backward(&case, &x, &g, (&wm, &wr), &dy, grads);
            }
        }
    }
}

/// The warp-per-row kernel runs where it applies (so the test above checks it, not only the
/// block-a-row fallback): rows of whole chunks up to 1024 elements, every dtype.
#[test]
fn layer_norm_backward_takes_the_warp_kernel_where_it_applies() {
    let Some(gpu) = gpu_or_skip("layer_norm_backward_takes_the_warp_kernel_where_it_applies")
    else {
        return;
    };
    {
        for dtype in DType::ALL {
            for (rows, cols, applies) in [
                (65536u64, 1024u64, true),
                (5, 64, true),
                (1, 8, true),
                (100, 1026, false),
                (100, 2048, false),
            ] {
                let launch = ln::warp_launch(&gpu, dtype, (rows, cols)).unwrap();
                println!("{dtype} [{rows}, {cols}]: {launch:?}");
                // Halves need whole chunks of 8: 1026 is not one for any dtype.
                let applies = applies && cols % dtype.chunk_elems() as u64 == 0;
                assert_eq!(launch.is_some(), applies, "{dtype} [{rows}, {cols}]");
                if let Some((_, threads, grid, _)) = launch {
                    // No more warps than rows, rounded up to a block.
                    assert!(grid as u64 * (threads as u64 / 32) < rows + threads as u64 / 32);
                }
            }
        }
    }
}

#[test]
fn layer_norm_backward_warp_kernel_is_bit_identical_over_runs() {
    let Some(gpu) = gpu_or_skip("layer_norm_backward_warp_kernel_is_bit_identical_over_runs")
    else {
        return;
    };
    let mut rng = rng("layer_norm_backward_warp_determinism");
    {
        for (rows, cols, dtype) in [
            (scaled(20_000, 300), 1024, DType::F32),
            (scaled(9_000, 200), 1016, DType::BF16),
            (scaled(3_000, 100), 96, DType::F16),
        ] {
            let up = |h: &HostTensor| Tensor::from_host(&gpu, h).unwrap();
            let x = up(&uniform(&mut rng, &[rows, cols], -2.0, 2.0, dtype));
            let g = up(&uniform(&mut rng, &[cols], 0.5, 1.5, dtype));
            let b = up(&uniform(&mut rng, &[cols], -1.0, 1.0, dtype));
            let dy = up(&uniform(&mut rng, &[rows, cols], -1.0, 1.0, dtype));
            let (_, mean, rstd) = ln::layer_norm(&x, &g, &b, None).unwrap();
            let run = || {
                let (dx, dg, db) = ln::layer_norm_backward(&x, &g, &mean, &rstd, &dy).unwrap();
                (bits(&dx), bits(&dg), bits(&db))
            };
            let first = run();
            for r in 0..scaled(5, 2) {
                let again = run();
                let case = format!("{dtype} [{rows}, {cols}] run {r}");
                assert!(again.1 == first.1, "{case}: dgamma changed");
                assert!(again.2 == first.2, "{case}: dbeta changed");
                assert!(again.0 == first.0, "{case}: dx changed");
            }
        }
    }
}

#[test]
fn layer_norm_of_higher_rank_and_constant_rows() {
    let Some(gpu) = gpu_or_skip("layer_norm_of_higher_rank_and_constant_rows") else {
        return;
    };
    let mut rng = rng("layer_norm_rank3");
    let x = uniform(&mut rng, &[3, 5, 7], -2.0, 2.0, DType::F32);
    let g = uniform(&mut rng, &[7], 0.5, 1.5, DType::F32);
    let b = uniform(&mut rng, &[7], -1.0, 1.0, DType::F32);
    let up = |h: &HostTensor| Tensor::from_host(&gpu, h).unwrap();
    let (y, mean, _) = ln::layer_norm(&up(&x), &up(&g), &up(&b), Some(1e-3)).unwrap();
    let (wy, _, _) = lr::layer_norm(&x, &g, &b, Some(1e-3)).unwrap();
    assert_eq!(mean.shape(), &[3, 5]);
    assert_close("rank 3", &y.to_vec().unwrap(), &wy.data, 1e-5);
    // A constant row normalises to beta exactly (x - mean = 0), on both paths.
    for cols in [100usize, 9000] {
        let xc = Tensor::from_f32(&gpu, &vec![3.25; 2 * cols], &[2, cols], DType::F32).unwrap();
        let bv: Vec<f32> = (0..cols).map(|j| j as f32 * 0.01).collect();
        let (y, _, _) = ln::layer_norm(
            &xc,
            &Tensor::from_f32(&gpu, &vec![2.0; cols], &[cols], DType::F32).unwrap(),
            &Tensor::from_f32(&gpu, &bv, &[cols], DType::F32).unwrap(),
            None,
        )
        .unwrap();
        let y = y.to_vec().unwrap();
        assert_eq!(&y[..cols], &bv[..], "constant row, cols {cols}");
        assert_eq!(&y[cols..], &bv[..], "constant row, cols {cols}");
    }
}

#[test]
fn layer_norm_param_grads_are_bit_identical_over_runs() {
    let Some(gpu) = gpu_or_skip("layer_norm_param_grads_are_bit_identical_over_runs") else {
        return;
    };
    let mut rng = rng("layer_norm_determinism");
    for (rows, cols) in [(scaled(20_000, 300), 1024), (scaled(700, 40), 8193)] {
        let up = |h: &HostTensor| Tensor::from_host(&gpu, h).unwrap();
        let x = up(&uniform(&mut rng, &[rows, cols], -2.0, 2.0, DType::F32));
        let g = up(&uniform(&mut rng, &[cols], 0.5, 1.5, DType::F32));
        let b = up(&uniform(&mut rng, &[cols], -1.0, 1.0, DType::F32));
        let dy = up(&uniform(&mut rng, &[rows, cols], -1.0, 1.0, DType::F32));
        let (_, mean, rstd) = ln::layer_norm(&x, &g, &b, None).unwrap();
        let (dx0, dg0, db0) = ln::layer_norm_backward(&x, &g, &mean, &rstd, &dy).unwrap();
        let (dx0, dg0, db0) = (bits(&dx0), bits(&dg0), bits(&db0));
        for run in 0..scaled(20, 3) {
            let (dx, dg, db) = ln::layer_norm_backward(&x, &g, &mean, &rstd, &dy).unwrap();
            assert!(
                bits(&dg) == dg0,
                "[{rows}, {cols}] run {run}: dgamma changed"
            );
            assert!(
                bits(&db) == db0,
                "[{rows}, {cols}] run {run}: dbeta changed"
            );
            assert!(bits(&dx) == dx0, "[{rows}, {cols}] run {run}: dx changed");
        }
    }
}

#[test]
fn layer_norm_with_no_rows_is_empty_with_zero_param_grads() {
    let Some(gpu) = gpu_or_skip("layer_norm_with_no_rows_is_empty_with_zero_param_grads") else {
        return;
    };
    let x = Tensor::empty(&gpu, &[0, 5], DType::F32).unwrap();
    let g = Tensor::from_f32(&gpu, &[1.0; 5], &[5], DType::F32).unwrap();
    let (y, mean, rstd) = ln::layer_norm(&x, &g, &g, None).unwrap();
    assert_eq!((y.shape(), mean.shape()), (&[0usize, 5][..], &[0usize][..]));
    let (dx, dg, db) = ln::layer_norm_backward(&x, &g, &mean, &rstd, &x).unwrap();
    assert_eq!(dx.shape(), &[0, 5]);
    assert_eq!(
        (dg.to_vec().unwrap(), db.to_vec().unwrap()),
        (vec![0.0; 5], vec![0.0; 5])
    );
}

/// Ids for a vocabulary of `vocab`: uniform, or (every third case) drawn from a few hot ids so that
/// rows of dW sum many positions.
fn random_ids(rng: &mut StdRng, n: usize, vocab: usize, hot: bool) -> Vec<u32> {
    let pool = if hot { vocab.min(3) } else { vocab };
    (0..n).map(|_| rng.random_range(0..pool) as u32).collect()
}

#[test]
fn embedding_matches_reference() {
    let Some(gpu) = gpu_or_skip("embedding_matches_reference") else {
        return;
    };
    let mut rng = rng("embedding");
    const DIMS: [usize; 9] = [1, 3, 4, 8, 31, 64, 257, 1024, 4099];
    for case in 0..fuzz_cases(36) {
        let dtype = DType::ALL[case % 3];
        let cols = DIMS[rng.random_range(0..DIMS.len())];
        let vocab = [1usize, 7, 1000, 50_257][rng.random_range(0..4)]
            .min(scaled(1 << 22, 1 << 14) / cols)
            .max(1);
        let n = rng.random_range(1..=scaled(1 << 20, 1 << 12) / cols + 1);
        let ids = random_ids(&mut rng, n, vocab, case % 3 == 2);
        let table = uniform(&mut rng, &[vocab, cols], -1.0, 1.0, dtype);
        let dy = uniform(&mut rng, &[n, cols], -1.0, 1.0, dtype);
        let tt = Tensor::from_host(&gpu, &table).unwrap();
        let label = format!("embedding #{case} {dtype} V={vocab} D={cols} N={n}");
        let want = er::embedding(&table, &ids).unwrap();
        // A gather copies bits: exact, whichever way the ids arrive.
        let out = emb::embedding(&tt, &ids).unwrap();
        assert_eq!(out.shape(), &[n, cols]);
        assert_eq!(out.to_vec().unwrap(), want.data, "{label} (host ids)");
        let dev = DeviceIds::from_slice(&gpu, &ids).unwrap();
        assert_eq!(
            emb::embedding(&tt, &dev).unwrap().to_vec().unwrap(),
            want.data,
            "{label} (device ids)"
        );

        let dw =
            emb::embedding_backward(&ids, &Tensor::from_host(&gpu, &dy).unwrap(), vocab).unwrap();
        let want_dw = er::embedding_backward(&ids, &dy, vocab).unwrap();
        assert_eq!(dw.shape(), &[vocab, cols]);
        // Sums of up to N terms (hot ids) in f32: 1e-5 relative in f32, the storage rounding otherwise.
        assert_close(
            &format!("{label} dW"),
            &dw.to_vec().unwrap(),
            &want_dw.data,
            tol(dtype),
        );
    }
}

#[test]
fn embedding_backward_is_bit_identical_over_runs() {
    let Some(gpu) = gpu_or_skip("embedding_backward_is_bit_identical_over_runs") else {
        return;
    };
    let mut rng = rng("embedding_determinism");
    let (vocab, cols, n) = (1000, 257, scaled(60_000, 2000));
    for hot in [false, true] {
        let ids = random_ids(&mut rng, n, vocab, hot);
        let dy =
            Tensor::from_host(&gpu, &uniform(&mut rng, &[n, cols], -1.0, 1.0, DType::F32)).unwrap();
        let dev = DeviceIds::from_slice(&gpu, &ids).unwrap();
        let first = bits(&emb::embedding_backward(&ids, &dy, vocab).unwrap());
        for run in 0..scaled(20, 3) {
            let again = if run % 2 == 0 {
                emb::embedding_backward(&ids, &dy, vocab).unwrap()
            } else {
                emb::embedding_backward(&dev, &dy, vocab).unwrap()
            };
            assert!(bits(&again) == first, "hot={hot} run {run}: dW changed");
        }
    }
}

#[test]
fn out_of_range_ids_are_errors_and_the_context_survives() {
    let Some(gpu) = gpu_or_skip("out_of_range_ids_are_errors_and_the_context_survives") else {
        return;
    };
    let table = Tensor::from_f32(
        &gpu,
        &(0..40).map(|v| v as f32).collect::<Vec<_>>(),
        &[10, 4],
        DType::F32,
    )
    .unwrap();
    let bad: Vec<u32> = vec![3, 9, 10, 2, u32::MAX];
    let expect = |e: Error| {
        assert!(
            matches!(
                e,
                Error::IdOutOfRange {
                    count: 2,
                    vocab: 10,
                    position: 2,
                    id: 10,
                    ..
                }
            ),
            "{e}"
        )
    };
    expect(emb::embedding(&table, &bad).unwrap_err());
    let dev = DeviceIds::from_slice(&gpu, &bad).unwrap();
    expect(emb::embedding(&table, &dev).unwrap_err());
    let dy = Tensor::from_f32(&gpu, &[1.0; 20], &[5, 4], DType::F32).unwrap();
    expect(emb::embedding_backward(&bad, &dy, 10).unwrap_err());
    expect(emb::embedding_backward(&dev, &dy, 10).unwrap_err());
    // The same ids as ids computed on the device (bound unknown): the device check kernel finds them.
    let unknown = dev.clone().without_known_bound();
    expect(emb::embedding(&table, &unknown).unwrap_err());
    expect(emb::embedding_backward(&unknown, &dy, 10).unwrap_err());
    // Many bad device ids: the count is exact, with and without a known bound.
    let many = DeviceIds::from_slice(&gpu, &vec![10u32; 100_001]).unwrap();
    for ids in [many.clone(), many.without_known_bound()] {
        assert!(matches!(
            emb::embedding(&table, &ids).unwrap_err(),
            Error::IdOutOfRange { count: 100_001, .. }
        ));
    }
    // Valid ids of unknown bound pass the device check.
    let fine = DeviceIds::from_slice(&gpu, &[9u32, 0])
        .unwrap()
        .without_known_bound();
    assert_eq!(
        emb::embedding(&table, &fine).unwrap().to_vec().unwrap(),
        vec![36., 37., 38., 39., 0., 1., 2., 3.]
    );
    // The context still works: a valid lookup after the errors.
    let ok = emb::embedding(&table, &[9u32, 0])
        .unwrap()
        .to_vec()
        .unwrap();
    assert_eq!(ok, vec![36., 37., 38., 39., 0., 1., 2., 3.]);
    gpu.synchronize().unwrap();
}

#[test]
fn embedding_of_no_ids_and_unused_rows() {
    let Some(gpu) = gpu_or_skip("embedding_of_no_ids_and_unused_rows") else {
        return;
    };
    let table = Tensor::from_f32(&gpu, &[1.0; 12], &[3, 4], DType::BF16).unwrap();
    let out = emb::embedding(&table, &Vec::<u32>::new()).unwrap();
    assert_eq!(out.shape(), &[0, 4]);
    let dy = Tensor::empty(&gpu, &[0, 4], DType::BF16).unwrap();
    // No ids: dW is all zeros (every row unused), written by the kernel over the poison.
    let dw = emb::embedding_backward(&Vec::<u32>::new(), &dy, 3).unwrap();
    assert_eq!(dw.to_vec().unwrap(), vec![0.0; 12]);
}
