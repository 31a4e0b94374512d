//! GPU vs CPU f64 reference for the Clifford layers and the tiled matmul: random and edge sizes (1, odd,
//! primes, 4096), Cl(2,0) and Cl(3,0), normalize on and off, forward and every gradient; outputs
//! poisoned before each launch (NaN never passes); 20 repeated runs bit-identical; typed errors for bad
//! inputs. SKIP without a GPU; the seed is printed (replay with RGK_SEED).
mod common;
use common::*;
use host::ops::clifford::{self as cl, Algebra, GpMode, Layer, Normalize, reference as cr};
use host::ops::matmul::{Precision, Transpose, matmul, reference as mr};
use host::{DType, Error, HostTensor, Tensor};
use rand::Rng;
use rand::rngs::StdRng;

const ALGS: [Algebra; 2] = [Algebra::Cl2, Algebra::Cl3];
const NORMS: [Normalize; 2] = [Normalize::No, Normalize::Yes];

/// The matmul precisions of fcgp and the Layer (docs/math/matmul.md).
const PRECISIONS: [Precision; 3] = [Precision::Tf32x3, Precision::Ieee, Precision::Tf32];

/// `base` for the fp32-class precisions; TF32 (10-bit mantissas in every product, 3e-4 to 7e-4
/// relative a product as operands are rounded or truncated, more through the norm's backward) is
/// held to 4e-3.
fn ptol(precision: Precision, base: f64) -> f64 {
    if precision == Precision::Tf32 {
        4e-3
    } else {
        base
    }
}

/// f32 relative-norm tolerance; reductions over more than 1e5 terms get 1e-4.
fn tol_for(terms: usize) -> f64 {
    if terms > 100_000 { 1e-4 } else { 1e-5 }
}

/// Tolerance for input gradients through the grade norm over `n` features. The norm backward
/// `go/r - o (sum go o) / (N r^2)` cancels almost exactly when the mean runs over very few features (at
/// N = 1 the normalised grade is a unit vector and its gradient is projected nearly to zero), so the
/// result is small against its terms and f32 rounding of the terms shows as up to ~2e-5 relative
/// (seen: sgp Cl2 B1 N1, 1.6e-5). Below 8 features those gradients are held to 1e-4.
fn grad_tol(n: usize, normalize: Normalize) -> f64 {
    if normalize == Normalize::Yes && n < 8 {
        1e-4
    } else {
        tol_for(n)
    }
}

fn mv(rng: &mut StdRng, alg: Algebra, b: usize, n: usize) -> HostTensor {
    uniform(rng, &[alg.components(), b, n], -1.5, 1.5, DType::F32)
}

fn up(gpu: &host::Gpu, t: &HostTensor) -> Tensor {
    Tensor::from_host(gpu, t).unwrap()
}

fn check(case: &str, what: &str, got: &Tensor, want: &HostTensor, tol: f64) {
    assert_eq!(got.shape(), want.shape.as_slice(), "{case} {what}: shape");
    assert_close(
        &format!("{case} {what}"),
        &got.to_vec().unwrap(),
        &want.data,
        tol,
    );
}

/// [`check`] for a reduction whose terms may cancel: passes at relative error `rel`, or when every
/// element is within `abs` of the reference (a rounding bound on the terms' scale, not the result's).
fn check_cancelling_sum(
    case: &str,
    what: &str,
    got: &Tensor,
    want: &HostTensor,
    (rel, abs): (f64, f64),
) {
    assert_eq!(got.shape(), want.shape.as_slice(), "{case} {what}: shape");
    let out = got.to_vec().unwrap();
    let worst = out
        .iter()
        .zip(&want.data)
        .map(|(&o, &w)| {
            if o.is_nan() {
                f64::INFINITY
            } else {
                (o as f64 - w as f64).abs()
            }
        })
        .fold(0.0f64, f64::max);
    if worst > abs {
        assert_close(
            &format!("{case} {what} (max abs error {worst:.2e} > {abs:.2e})"),
            &out,
            &want.data,
            rel,
        );
    }
}

/// The sgp gradients of a `(B, N)` case against the reference's. The weight gradient sums over the batch
/// (tol_for(b)) the product of the gated inputs with the norm backward's output, so it inherits that
/// output's cancellation at few features (seen: sgp Cl2 B1 N1, 2.3e-5 with the v2 backward on an H200).
fn check_sgp_grads(
    case: &str,
    g: &cl::Grads,
    want: &cr::Grads,
    b: usize,
    n: usize,
    normalize: Normalize,
) {
    check(
        case,
        "grad_x",
        &g.grad_x,
        &want.grad_x,
        grad_tol(n, normalize),
    );
    check(
        case,
        "grad_y",
        &g.grad_y,
        &want.grad_y,
        grad_tol(n, normalize),
    );
    let tol_w = tol_for(b).max(grad_tol(n, normalize));
    check(
        case,
        "grad_weight",
        &g.grad_weight,
        &want.grad_weight,
        tol_w,
    );
}

#[test]
fn matmul_matches_reference() {
    let Some(gpu) = gpu_or_skip("matmul_matches_reference") else {
        return;
    };
    let mut rng = rng("matmul");
    const DIMS: [usize; 8] = [1, 2, 7, 33, 128, 129, 257, 300];
    for case in 0..fuzz_cases(24) {
        let (m, n, k) = (
            DIMS[rng.random_range(0..8)],
            DIMS[rng.random_range(0..8)],
            DIMS[rng.random_range(0..8)],
        );
        let (ta, tb) = (
            [Transpose::No, Transpose::Yes][case % 2],
            [Transpose::No, Transpose::Yes][(case / 2) % 2],
        );
        let batch = [None, Some(3)][(case / 4) % 2];
        let a_shape =
            |r: usize, c: usize| -> Vec<usize> { batch.map_or(vec![r, c], |bt| vec![bt, r, c]) };
        let a = uniform(
            &mut rng,
            &if ta == Transpose::Yes {
                a_shape(k, m)
            } else {
                a_shape(m, k)
            },
            -1.0,
            1.0,
            DType::F32,
        );
        // b is broadcast (2-D) in half the batched cases.
        let b_dims = if tb == Transpose::Yes { [n, k] } else { [k, n] };
        let b_shape: Vec<usize> = if batch.is_some() && case % 3 == 0 {
            b_dims.to_vec()
        } else {
            a_shape(b_dims[0], b_dims[1])
        };
        let b = uniform(&mut rng, &b_shape, -1.0, 1.0, DType::F32);
        let got = matmul(&up(&gpu, &a), &up(&gpu, &b), ta, tb).unwrap();
        let want = mr::matmul(&a, &b, ta, tb).unwrap();
        check(
            &format!("matmul #{case} m{m} n{n} k{k} {ta:?} {tb:?} batch {batch:?}"),
            "out",
            &got,
            &want,
            1e-5,
        );
    }
}

/// (B, N) pairs: 1, odd, primes, 4096, both sides of the register-cache limit (2048 features).
fn sizes(rng: &mut StdRng) -> Vec<(usize, usize)> {
    let mut v = vec![(1, 1), (3, 7), (17, 31), (5, 97), (2, 2053), (1, 4096)];
    v.push((scaled(4096, 64), scaled(512, 33)));
    v.push((scaled(4096, 37), 3));
    for _ in 0..fuzz_cases(4) {
        v.push((rng.random_range(1..300), rng.random_range(1..700)));
    }
    v
}

#[test]
fn sgp_forward_and_backward_match_reference() {
    let Some(gpu) = gpu_or_skip("sgp_forward_and_backward_match_reference") else {
        return;
    };
    let mut rng = rng("sgp");
    for (b, n) in sizes(&mut rng) {
        for alg in ALGS {
            for normalize in NORMS {
                let case = format!("sgp {alg:?} B{b} N{n} {normalize:?}");
                let (x, y) = (mv(&mut rng, alg, b, n), mv(&mut rng, alg, b, n));
                let w = uniform(&mut rng, &[n, alg.paths()], -1.0, 1.0, DType::F32);
                let go = mv(&mut rng, alg, b, n);
                let (xd, yd, wd) = (up(&gpu, &x), up(&gpu, &y), up(&gpu, &w));
                let fwd = cl::sgp_forward(&xd, &yd, &wd, normalize).unwrap();
                let want = cr::sgp_forward(&x, &y, &w, normalize).unwrap();
                check(&case, "out", &fwd.out, &want.out, tol_for(n));
                if let (Some(r), Some(rw)) = (&fwd.norms, &want.norms) {
                    check(&case, "norms", r, rw, tol_for(n));
                }
                // Backward from the GPU's own saved state, against the reference on the same state.
                let saved = cr::Forward {
                    out: fwd.out.to_host().unwrap(),
                    norms: fwd.norms.as_ref().map(|r| r.to_host().unwrap()),
                };
                let g = cl::sgp_backward(&xd, &yd, &wd, &fwd, &up(&gpu, &go)).unwrap();
                let gw = cr::sgp_backward(&x, &y, &w, &saved, &go).unwrap();
                check_sgp_grads(&case, &g, &gw, b, n, normalize);
            }
        }
    }
}

/// Every forward variant (`sgp_forward_variant`) against the f64 reference: odd and prime sizes, rows
/// of exactly one block (1024), one past it (the fallback), and more rows than resident blocks. The
/// 2D v3 variants run on the multiples of 4 (rows of one warp and several, 1 to 8 rows a block, last
/// row group partial, quads that leave threads of a row idle: N = 4, 100, 132, 516) and fall back to v2
/// on the rest and in 3D.
#[test]
fn sgp_forward_variants_match_reference() {
    let Some(gpu) = gpu_or_skip("sgp_forward_variants_match_reference") else {
        return;
    };
    let mut rng = rng("sgp_variants");
    let mut shapes = vec![
        (1, 1),
        (3, 7),
        (17, 31),
        (5, 97),
        (2, 1024),
        (3, 1025),
        (scaled(4096, 64), scaled(512, 33)),
        (scaled(2053, 37), 3),
        (scaled(1031, 13), 129),
        (1, 4),
        (9, 4),
        (3, 8),
        (17, 32),
        (5, 100),
        (7, 128),
        (13, 132),
        (3, 516),
        (2, 1024),
        (scaled(4096, 64), 512),
        (scaled(2053, 37), 128),
    ];
    for _ in 0..fuzz_cases(4) {
        shapes.push((rng.random_range(1..700), rng.random_range(1..1100)));
        shapes.push((rng.random_range(1..700), 4 * rng.random_range(1..257)));
    }
    for variant in [
        cl::FwdVariant::Cached,
        cl::FwdVariant::V2,
        cl::FwdVariant::V3Prefetch,
    ] {
        for &(b, n) in &shapes {
            for alg in ALGS {
                for normalize in NORMS {
                    let case = format!("sgp {variant:?} {alg:?} B{b} N{n} {normalize:?}");
                    let (x, y) = (mv(&mut rng, alg, b, n), mv(&mut rng, alg, b, n));
                    let w = uniform(&mut rng, &[n, alg.paths()], -1.0, 1.0, DType::F32);
                    let (xd, yd, wd) = (up(&gpu, &x), up(&gpu, &y), up(&gpu, &w));
                    let fwd = cl::sgp_forward_variant(&xd, &yd, &wd, normalize, variant).unwrap();
                    let want = cr::sgp_forward(&x, &y, &w, normalize).unwrap();
                    check(&case, "out", &fwd.out, &want.out, tol_for(n));
                    assert_eq!(fwd.norms.is_some(), want.norms.is_some(), "{case}: norms");
                    if let (Some(r), Some(rw)) = (&fwd.norms, &want.norms) {
                        check(&case, "norms", r, rw, tol_for(n));
                    }
                    // Same bits on a second run.
                    let again = cl::sgp_forward_variant(&xd, &yd, &wd, normalize, variant).unwrap();
                    assert!(
                        bits(&again.out) == bits(&fwd.out),
                        "{case}: not deterministic"
                    );
                }
            }
        }
        // A NaN in one feature reaches its row's output (and, normalised, the whole row), never hidden.
        for alg in ALGS {
            let (b, n) = (3, 36);
            let (mut x, y) = (mv(&mut rng, alg, b, n), mv(&mut rng, alg, b, n));
            x.data[n + 5] = f32::NAN;
            let w = uniform(&mut rng, &[n, alg.paths()], -1.0, 1.0, DType::F32);
            let fwd = cl::sgp_forward_variant(
                &up(&gpu, &x),
                &up(&gpu, &y),
                &up(&gpu, &w),
                Normalize::No,
                variant,
            )
            .unwrap();
            let out = fwd.out.to_vec().unwrap();
            assert!(out[n + 5].is_nan(), "{variant:?} {alg:?}: NaN input lost");
            assert!(
                out[5].is_finite(),
                "{variant:?} {alg:?}: NaN leaked into another row"
            );
        }
    }
}

/// The backward against the f64 reference from the GPU's saved state,
/// at sizes that give 1, a few, and many row chunks (partial sums over up to 1000+ chunks).
#[test]
fn sgp_backward_matches_reference_and_is_deterministic() {
    let Some(gpu) = gpu_or_skip("sgp_backward_matches_reference_and_is_deterministic") else {
        return;
    };
    let mut rng = rng("sgp_bwd_variants");
    let mut shapes = vec![
        (1, 1),
        (3, 7),
        (17, 31),
        (5, 97),
        (2, 1025),
        (scaled(4099, 64), 3),
        (scaled(1024, 16), scaled(128, 9)),
        (scaled(257, 5), 513),
    ];
    for _ in 0..fuzz_cases(4) {
        shapes.push((rng.random_range(1..600), rng.random_range(1..700)));
    }
    {
        for &(b, n) in &shapes {
            for alg in ALGS {
                for normalize in NORMS {
                    let case = format!("sgp bwd {alg:?} B{b} N{n} {normalize:?}");
                    let (x, y) = (mv(&mut rng, alg, b, n), mv(&mut rng, alg, b, n));
                    let w = uniform(&mut rng, &[n, alg.paths()], -1.0, 1.0, DType::F32);
                    let go = mv(&mut rng, alg, b, n);
                    let (xd, yd, wd, god) =
                        (up(&gpu, &x), up(&gpu, &y), up(&gpu, &w), up(&gpu, &go));
                    let fwd = cl::sgp_forward(&xd, &yd, &wd, normalize).unwrap();
                    let saved = cr::Forward {
                        out: fwd.out.to_host().unwrap(),
                        norms: fwd.norms.as_ref().map(|r| r.to_host().unwrap()),
                    };
                    let g = cl::sgp_backward(&xd, &yd, &wd, &fwd, &god).unwrap();
                    let gw = cr::sgp_backward(&x, &y, &w, &saved, &go).unwrap();
                    check_sgp_grads(&case, &g, &gw, b, n, normalize);
                    let again = cl::sgp_backward(&xd, &yd, &wd, &fwd, &god).unwrap();
                    assert!(
                        bits(&again.grad_weight) == bits(&g.grad_weight)
                            && bits(&again.grad_x) == bits(&g.grad_x),
                        "{case}: not deterministic"
                    );
                }
            }
        }
    }
}

/// Rows `rows` of every component of a `(C, B, ...)` host tensor (`(G, B)` norms too), as a `(C,
/// rows, ...)` tensor.
fn batch_rows(t: &HostTensor, rows: &[usize]) -> HostTensor {
    let (c, b) = (t.shape[0], t.shape[1]);
    let inner: usize = t.shape[2..].iter().product();
    let mut data = Vec::with_capacity(c * rows.len() * inner);
    for k in 0..c {
        for &r in rows {
            let at = (k * b + r) * inner;
            data.extend_from_slice(&t.data[at..at + inner]);
        }
    }
    let mut shape = t.shape.clone();
    shape[1] = rows.len();
    HostTensor::new(data, &shape, DType::F32).unwrap()
}

/// Where the fc weights' tf32 parts outweigh the batch and split products still fill the GPU (2D
/// B1024 with 1024 features in and out) the backward's pair-term gradient products take a group's
/// paths two at a time (the host's `pair_grad_paths_per_product`, whose unit test holds the
/// premise). Each row of the output, and of grad x and grad y, depends on that row of the inputs
/// and the weights alone, so the f64 reference runs on a sample of rows: the forward and both input
/// gradients of those rows (the weight gradient, a sum over every row, is what the chunks do not
/// touch; `fcgp_forward_and_backward_match_reference` holds it at smaller shapes).
#[test]
fn fcgp_backward_in_path_chunks_matches_reference_on_sampled_rows() {
    let Some(gpu) = gpu_or_skip("fcgp_backward_in_path_chunks_matches_reference_on_sampled_rows")
    else {
        return;
    };
    let mut rng = rng("fcgp_path_chunks");
    let (alg, b, n, m) = (Algebra::Cl2, 1024, 1024, 1024);
    let (x, y) = (mv(&mut rng, alg, b, n), mv(&mut rng, alg, b, n));
    let w = uniform(&mut rng, &[alg.paths(), n, m], -0.5, 0.5, DType::F32);
    let go = uniform(&mut rng, &[alg.components(), b, m], -1.0, 1.0, DType::F32);
    let (xd, yd, wd) = (up(&gpu, &x), up(&gpu, &y), up(&gpu, &w));
    // The first and last rows, and three drawn between them.
    let mut rows = vec![0, b - 1];
    rows.extend((0..3).map(|_| rng.random_range(1..b - 1)));
    for normalize in NORMS {
        let case = format!("fcgp {alg:?} B{b} N{n} M{m} {normalize:?} rows {rows:?}");
        let fwd = cl::fcgp_forward_with(&xd, &yd, &wd, normalize, Precision::Tf32x3).unwrap();
        let g = cl::fcgp_backward_with(&xd, &yd, &wd, &fwd, &up(&gpu, &go), Precision::Tf32x3)
            .unwrap();
        let out = fwd.out.to_host().unwrap();
        let norms = fwd.norms.as_ref().map(|r| r.to_host().unwrap());
        let (xs, ys) = (batch_rows(&x, &rows), batch_rows(&y, &rows));
        let want = cr::fcgp_forward(&xs, &ys, &w, normalize).unwrap();
        let got_out = batch_rows(&out, &rows);
        assert_close(&format!("{case} out"), &got_out.data, &want.out.data, 1e-5);
        let saved = cr::Forward {
            out: got_out,
            norms: norms.as_ref().map(|r| batch_rows(r, &rows)),
        };
        let gw = cr::fcgp_backward(&xs, &ys, &w, &saved, &batch_rows(&go, &rows)).unwrap();
        let tol = grad_tol(m, normalize);
        for (what, got, want) in [
            ("grad_x", &g.grad_x, &gw.grad_x),
            ("grad_y", &g.grad_y, &gw.grad_y),
        ] {
            let got = batch_rows(&got.to_host().unwrap(), &rows);
            assert_close(&format!("{case} {what}"), &got.data, &want.data, tol);
        }
    }
}

#[test]
fn fcgp_forward_and_backward_match_reference() {
    let Some(gpu) = gpu_or_skip("fcgp_forward_and_backward_match_reference") else {
        return;
    };
    let mut rng = rng("fcgp");
    let shapes = [
        (1, 1, 1),
        (3, 7, 5),
        (17, 33, 31),
        (2, 130, 3),
        (scaled(64, 5), 40, 129),
        // 16-byte rows: the tensor-core precisions run (others fall back to Ieee), and the weight
        // gradient (depth C * B) is split along the depth.
        (scaled(300, 24), 68, 132),
        // The forward's pair-term product (up to 128 features, P M <= C B, N a multiple of 4,
        // tensor-core precisions): a depth tail (36 features) and partial row tiles; then output
        // rows that are not a multiple of 4 floats (element stores).
        (scaled(700, 40), 36, 12),
        (scaled(600, 400), 100, 126),
    ];
    for (b, n, m) in shapes {
        for alg in ALGS {
            for (normalize, precision) in NORMS
                .iter()
                .flat_map(|&nz| PRECISIONS.iter().map(move |&p| (nz, p)))
            {
                let case = format!("fcgp {alg:?} B{b} N{n} M{m} {normalize:?} {precision:?}");
                let (x, y) = (mv(&mut rng, alg, b, n), mv(&mut rng, alg, b, n));
                let w = uniform(&mut rng, &[alg.paths(), n, m], -0.5, 0.5, DType::F32);
                let go = uniform(&mut rng, &[alg.components(), b, m], -1.0, 1.0, DType::F32);
                let (xd, yd, wd) = (up(&gpu, &x), up(&gpu, &y), up(&gpu, &w));
                let fwd = cl::fcgp_forward_with(&xd, &yd, &wd, normalize, precision).unwrap();
                let want = cr::fcgp_forward(&x, &y, &w, normalize).unwrap();
                check(&case, "out", &fwd.out, &want.out, ptol(precision, 1e-5));
                let saved = cr::Forward {
                    out: fwd.out.to_host().unwrap(),
                    norms: fwd.norms.as_ref().map(|r| r.to_host().unwrap()),
                };
                let g =
                    cl::fcgp_backward_with(&xd, &yd, &wd, &fwd, &up(&gpu, &go), precision).unwrap();
                let gw = cr::fcgp_backward(&x, &y, &w, &saved, &go).unwrap();
                let gtol = ptol(precision, grad_tol(m, normalize));
                check(&case, "grad_x", &g.grad_x, &gw.grad_x, gtol);
                check(&case, "grad_y", &g.grad_y, &gw.grad_y, gtol);
                // The weight gradient is the pair terms times the gradient flowing out of the
                // grade norm, so it inherits that norm backward's cancellation at few features
                // (seen: Cl2 B1 N1 M1 Tf32x3, 2.27e-5 on an H100, seed 1795815920900873147): the
                // input gradients' tolerance.
                check(&case, "grad_weight", &g.grad_weight, &gw.grad_weight, gtol);
            }
        }
    }
}

#[test]
fn layer_forward_and_backward_match_reference() {
    let Some(gpu) = gpu_or_skip("layer_forward_and_backward_match_reference") else {
        return;
    };
    let mut rng = rng("layer");
    // The last shape has 16-byte rows (the tensor-core precisions run) and a split weight gradient.
    for (b, n) in [(1, 1), (5, 7), (scaled(33, 3), 65), (scaled(520, 40), 68)] {
        for alg in ALGS {
            for mode in [GpMode::PerFeature, GpMode::FullyConnected] {
                for (normalize, precision) in NORMS
                    .iter()
                    .flat_map(|&nz| PRECISIONS.iter().map(move |&p| (nz, p)))
                {
                    let case =
                        format!("layer {alg:?} {mode:?} B{b} N{n} {normalize:?} {precision:?}");
                    let mut p =
                        cr::LayerParams::init(alg, n, mode, normalize, rng.random()).unwrap();
                    // A non-zero bias, so its gradient and its broadcast over components are exercised.
                    p.linear_bias = uniform(&mut rng, &[n], -0.5, 0.5, DType::F32);
                    let x = mv(&mut rng, alg, b, n);
                    let go = mv(&mut rng, alg, b, n);
                    let layer = Layer::from_host(&gpu, &p)
                        .unwrap()
                        .with_precision(precision);
                    let xd = up(&gpu, &x);
                    let fwd = layer.forward(&xd).unwrap();
                    let want = p.forward(&x).unwrap();
                    check(&case, "out", &fwd.out, &want.out, ptol(precision, 1e-5));
                    let saved = cr::Forward {
                        out: fwd.out.to_host().unwrap(),
                        norms: fwd.norms.as_ref().map(|r| r.to_host().unwrap()),
                    };
                    let god = up(&gpu, &go);
                    let g = layer.backward(&xd, &fwd, &god).unwrap();
                    let gw = p.backward(&x, &saved, &go).unwrap();
                    // Without the saved linear output the backward recomputes it: the same bits.
                    let recomputed = cl::Forward {
                        linear_out: None,
                        ..fwd.clone()
                    };
                    let g2 = layer.backward(&xd, &recomputed, &god).unwrap();
                    assert!(
                        bits(&g2.grad_x) == bits(&g.grad_x)
                            && bits(&g2.grad_linear_weight) == bits(&g.grad_linear_weight),
                        "{case}: recomputing the linear output changed the gradients"
                    );
                    let gtol = ptol(precision, grad_tol(n, normalize));
                    check(&case, "grad_x", &g.grad_x, &gw.grad_x, gtol);
                    // The linear weight gradient is x times the gradient flowing out of the grade
                    // norm, so it inherits that norm backward's cancellation at few features (seen:
                    // Cl2 FullyConnected B1 N1, 3.2e-5 on an H200): the input gradients' tolerance.
                    check(
                        &case,
                        "grad_linear_weight",
                        &g.grad_linear_weight,
                        &gw.grad_linear_weight,
                        gtol,
                    );
                    // The bias gradient sums C*B signed terms per feature (4-8 at B = 1) that can
                    // cancel to a small fraction of their size, so f32 rounding of the terms is not
                    // bounded relative to the result (seen: B1 N1 Cl2 2.3e-5; Cl3 B1 N1 2.1e-4 with
                    // 2.5e-8 absolute on a result of 1.2e-4). It is held to 1e-4 relative, or else to
                    // the recursive-summation bound for C*B terms of magnitude at most 1 (the terms
                    // are gradients at the linear output, of order |go| <= 1.5 at this init):
                    // C*B*2^-20 absolute per element. NaN fails either way.
                    check_cancelling_sum(
                        &case,
                        "grad_linear_bias",
                        &g.grad_linear_bias,
                        &gw.grad_linear_bias,
                        (
                            ptol(precision, 1e-4),
                            (alg.components() * b) as f64 * 2f64.powi(-20),
                        ),
                    );
                    // The gp weight gradient takes the gradient flowing out of the grade norm too,
                    // and with it that norm backward's cancellation at few features (seen: Cl2
                    // PerFeature B1 N1 Ieee, 1.34e-5 on an H100, seed 1795812420046086439, whose
                    // products are FFMA: no tensor core): the input gradients' tolerance.
                    check(
                        &case,
                        "grad_gp_weight",
                        &g.grad_gp_weight,
                        &gw.grad_gp_weight,
                        gtol,
                    );
                }
            }
        }
    }
}

/// The allocation counter (`Gpu::memory_stats`, what the benches report as our peak memory) against
/// the sizes the sgp forward + backward must allocate, worked out by hand: forward out `(C, B, N)` and
/// norms `(G, B)`; backward grad_x, grad_y `(C, B, N)`, grad_weight `(N, P)`, the grade dots `(G, B)`
/// and the weight-gradient partials `(chunks, N, P)`; every buffer at least 16 bytes. All of them are
/// live at the backward's last allocation, so that is the peak. After the results are dropped the live
/// count is back where it started.
#[test]
fn sgp_peak_memory_is_the_sum_of_its_allocations() {
    let Some(gpu) = gpu_or_skip("sgp_peak_memory_is_the_sum_of_its_allocations") else {
        return;
    };
    let mut rng = rng("sgp_memory");
    for (b, n) in [
        (1, 1),
        (3, 7),
        (scaled(1024, 40), 128),
        (scaled(4096, 33), 96),
    ] {
        for alg in ALGS {
            let (x, y, go) = (
                up(&gpu, &mv(&mut rng, alg, b, n)),
                up(&gpu, &mv(&mut rng, alg, b, n)),
                up(&gpu, &mv(&mut rng, alg, b, n)),
            );
            let w = up(
                &gpu,
                &uniform(&mut rng, &[n, alg.paths()], -1.0, 1.0, DType::F32),
            );
            let before = gpu.memory_stats().live_bytes;
            gpu.reset_peak_memory();
            let f = cl::sgp_forward(&x, &y, &w, Normalize::Yes).unwrap();
            let g = cl::sgp_backward(&x, &y, &w, &f, &go).unwrap();
            let peak = gpu.memory_stats().peak_bytes - before;
            let alloc = |elems: usize| (4 * elems).max(16) as u64;
            let (c, gr, p) = (alg.components(), alg.grades(), alg.paths());
            let rpc = gpu::params::clifford::rows_per_chunk_v2(b as u64, n as u64);
            let chunks = (b as u64).div_ceil(rpc).max(1) as usize;
            let want =
                3 * alloc(c * b * n) + 2 * alloc(gr * b) + alloc(n * p) + alloc(chunks * n * p);
            assert_eq!(peak, want, "{alg:?} B{b} N{n}: peak bytes");
            drop((f, g));
            assert_eq!(
                gpu.memory_stats().live_bytes,
                before,
                "{alg:?} B{b} N{n}: bytes left live"
            );
        }
    }
}

#[test]
fn clifford_results_are_bit_identical_across_runs() {
    let Some(gpu) = gpu_or_skip("clifford_results_are_bit_identical_across_runs") else {
        return;
    };
    let mut rng = rng("clifford_determinism");
    let (b, n) = (scaled(4096, 97), scaled(512, 61));
    for alg in ALGS {
        let (x, y) = (
            up(&gpu, &mv(&mut rng, alg, b, n)),
            up(&gpu, &mv(&mut rng, alg, b, n)),
        );
        let w = up(
            &gpu,
            &uniform(&mut rng, &[n, alg.paths()], -1.0, 1.0, DType::F32),
        );
        let go = up(&gpu, &mv(&mut rng, alg, b, n));
        let first = cl::sgp_forward(&x, &y, &w, Normalize::Yes).unwrap();
        let (out0, gw0) = (
            bits(&first.out),
            bits(
                &cl::sgp_backward(&x, &y, &w, &first, &go)
                    .unwrap()
                    .grad_weight,
            ),
        );
        for run in 0..scaled(20, 2) {
            let f = cl::sgp_forward(&x, &y, &w, Normalize::Yes).unwrap();
            assert!(bits(&f.out) == out0, "{alg:?} forward changed on run {run}");
            let g = cl::sgp_backward(&x, &y, &w, &f, &go).unwrap();
            assert!(
                bits(&g.grad_weight) == gw0,
                "{alg:?} grad_weight changed on run {run}"
            );
        }
        let (bf, nf) = (scaled(256, 9), 64);
        let (x, y) = (
            up(&gpu, &mv(&mut rng, alg, bf, nf)),
            up(&gpu, &mv(&mut rng, alg, bf, nf)),
        );
        let w = up(
            &gpu,
            &uniform(&mut rng, &[alg.paths(), nf, nf], -0.5, 0.5, DType::F32),
        );
        let go = up(&gpu, &mv(&mut rng, alg, bf, nf));
        let f = cl::fcgp_forward(&x, &y, &w, Normalize::Yes).unwrap();
        let gw0 = bits(&cl::fcgp_backward(&x, &y, &w, &f, &go).unwrap().grad_weight);
        for run in 0..scaled(20, 2) {
            let g = cl::fcgp_backward(&x, &y, &w, &f, &go).unwrap();
            assert!(
                bits(&g.grad_weight) == gw0,
                "{alg:?} fcgp grad_weight changed on run {run}"
            );
        }
    }
}

#[test]
fn clifford_rejects_bad_inputs_with_typed_errors() {
    let Some(gpu) = gpu_or_skip("clifford_rejects_bad_inputs_with_typed_errors") else {
        return;
    };
    let t = |shape: &[usize]| {
        Tensor::from_f32(&gpu, &vec![0.5; shape.iter().product()], shape, DType::F32).unwrap()
    };
    let (x, w) = (t(&[4, 3, 5]), t(&[5, 10]));
    let msg = |e: Error| e.to_string();
    // Wrong component count.
    let e = cl::sgp_forward(&t(&[5, 3, 5]), &t(&[5, 3, 5]), &w, Normalize::Yes).unwrap_err();
    assert!(matches!(e, Error::Shape { .. }) && msg(e).contains("component count"));
    // Mismatched B and N between x and y.
    let e = cl::sgp_forward(&x, &t(&[4, 2, 5]), &w, Normalize::Yes).unwrap_err();
    assert!(matches!(e, Error::Shape { .. }) && msg(e).contains("batch B"));
    let e = cl::sgp_forward(&x, &t(&[4, 3, 6]), &w, Normalize::Yes).unwrap_err();
    assert!(matches!(e, Error::Shape { .. }) && msg(e).contains("features N"));
    // Weight of the wrong shape (mismatched N, or 3D paths for a 2D input): the expected shape is named.
    for bad in [t(&[6, 10]), t(&[5, 20])] {
        let e = msg(cl::sgp_forward(&x, &x, &bad, Normalize::No).unwrap_err());
        assert!(e.contains("(N, P) = [5, 10]"), "{e}");
    }
    let e = msg(cl::fcgp_forward(&x, &x, &t(&[10, 4, 7]), Normalize::No).unwrap_err());
    assert!(e.contains("(P, N_in, N_out) = [10, 5, 7]"), "{e}");
    // Non-contiguous input.
    let view = t(&[4, 5, 3]).transpose(1, 2).unwrap();
    let e = cl::sgp_forward(&view, &x, &w, Normalize::Yes).unwrap_err();
    assert!(matches!(e, Error::NotContiguous { .. }), "{e}");
    // Backward with a gradient of the wrong shape.
    let f = cl::sgp_forward(&x, &x, &w, Normalize::Yes).unwrap();
    assert!(matches!(
        cl::sgp_backward(&x, &x, &w, &f, &t(&[4, 3, 4])),
        Err(Error::Shape { .. })
    ));
    // Matmul inner-dimension mismatch.
    assert!(matches!(
        matmul(&t(&[2, 3]), &t(&[4, 2]), Transpose::No, Transpose::No),
        Err(Error::Shape { .. })
    ));
}

/// Runs without a GPU: every Clifford entry point the launchers name is in the clifford module of
/// both builds, with the launch bounds written beside its kernel (so ptxas capped its registers for
/// the block sizes the launchers use), and the f32 matmul the fc variant mixes features with is in
/// the matmul module.
#[test]
fn clifford_kernels_are_in_their_module_with_launch_bounds() {
    use gpu::params::clifford::{
        BWD_BLOCK, CHUNK_SUM_WARPS, ELEM_BLOCK, FC_BWD_BLOCK, FWD_MAX_BLOCK, FWD_V2_MAX_BLOCK,
        FWD_V3_BLOCK, ROW_BLOCK,
    };
    let bounded = [
        ("sgp2d_fwd_f32", FWD_MAX_BLOCK, 1),
        ("sgp3d_fwd_f32", FWD_MAX_BLOCK, 1),
        ("sgp2d_fwd_v2_f32", FWD_V2_MAX_BLOCK, 1),
        ("sgp3d_fwd_v2_f32", FWD_V2_MAX_BLOCK, 1),
        ("sgp2d_fwd_v3p_f32", FWD_V3_BLOCK, 2),
        ("sgp2d_bwd_v2_f32", BWD_BLOCK, 4),
        ("sgp3d_bwd_v2_f32", BWD_BLOCK, 3),
        ("chunk_sum_tree_f32", CHUNK_SUM_WARPS * 32, 2),
        ("grade_dot2d_f32", ROW_BLOCK, 2),
        ("grade_dot3d_f32", ROW_BLOCK, 2),
        ("grade_norm2d_f32", ROW_BLOCK, 2),
        ("grade_norm3d_f32", ROW_BLOCK, 2),
        ("fc_pairs2d_f32", ELEM_BLOCK, 2),
        ("fc_pairs3d_f32", ELEM_BLOCK, 2),
        ("fc_pairs_bwd2d_f32", FC_BWD_BLOCK, 3),
        ("fc_pairs_bwd3d_f32", FC_BWD_BLOCK, 3),
        ("fc_permute_blocks_f32", ELEM_BLOCK, 4),
        ("fc_gate_y2d_f32", ELEM_BLOCK, 2),
        ("fc_gate_y3d_f32", ELEM_BLOCK, 2),
    ];
    for arch in ["sm_80", "sm_90"] {
        for (name, threads, blocks) in bounded {
            assert_eq!(
                host::Family::of(name),
                Some(host::Family::Clifford),
                "{name}"
            );
            assert_eq!(
                host::modules::launch_bounds(name, arch),
                Some((threads, blocks)),
                "{name} {arch}: launch bounds"
            );
        }
        for name in ["chunk_sum_tree_f32", "col_sum_partials_f32"] {
            assert_eq!(
                host::Family::of(name),
                Some(host::Family::Clifford),
                "{name}"
            );
        }
        assert_eq!(
            host::Family::of("matmul_simt_nn_f32"),
            Some(host::Family::Matmul)
        );
    }
    assert_eq!(
        gpu::params::clifford::fwd_block(1 << 20, 4),
        gpu::params::clifford::FWD_MAX_BLOCK
    );
}
