//! GPU vs CPU reference for linear-layer relevance propagation (host::ops::lrp): the three known defects
//! of the widely used CUDA version as regression tests, random shapes, the MLP explanation, and bad
//! input. Outputs are poisoned (NaN) before each launch; the seed is printed.
//!
//! Every test that runs a GEMM pass runs it on each `GemmVariant` (the shipped kernels and the variants
//! measured beside them), against the same reference and tolerances; a variant that cannot take a
//! shape (variants 3 and 4: `I` or `O` not a multiple of 4) falls back to the default, and the printed line
//! names the kernels that ran. Tests that exist for a variant's own edge cases assert that it ran.
//!
//! Defect 2 (a shared scalar written by every thread) is a race that only racecheck sees: `cargo xtask
//! sanitize` runs this file under racecheck; the kernels have no shared scalar written by many threads.
mod common;
use common::*;
use host::ops::lrp::{
    self, Activation, Func, GemmVariant, Kind, Linear, Nonlinearity,
    mlp::{self, MlpLayer},
    reference as lr,
};
use host::{DType, Error, HostTensor, Tensor};
use rand::Rng;
use rand::rngs::StdRng;

/// Relative size of the f32 error in P and N over a depth of `k` terms (about 5 sigma of a sequential
/// f32 sum): (row, output) pairs whose saturation outcome could flip within it get slack in the
/// comparison, see `reference::relevance_with_slack`.
fn margin(k: usize) -> f64 {
    3e-7 * (k.max(1) as f64).sqrt() + 1e-7
}

/// f32 relative-norm tolerance: 1e-5, 1e-4 when a sum runs over more than 4096 terms.
fn lrp_tol(ni: usize, no: usize) -> f64 {
    if ni.max(no) > 4096 { 1e-4 } else { 1e-5 }
}

struct Case {
    x: HostTensor,
    w: HostTensor,
    b: Option<HostTensor>,
    rel: HostTensor,
    act: Activation,
}

fn case(rng: &mut StdRng, rows: usize, ni: usize, no: usize, bias: bool, act: Activation) -> Case {
    Case {
        x: uniform(rng, &[rows, ni], -2.0, 2.0, DType::F32),
        w: uniform(rng, &[no, ni], -1.0, 1.0, DType::F32),
        b: bias.then(|| uniform(rng, &[no], -3.0, 3.0, DType::F32)),
        rel: uniform(rng, &[rows, no], -1.0, 1.0, DType::F32),
        act,
    }
}

/// One GEMM variant's run of a case: the GEMM kernels that ran (sums, spread) and the output.
struct Run {
    variant: GemmVariant,
    kernels: [&'static str; 2],
    out: Vec<f32>,
}

impl Run {
    /// Whether both GEMM passes ran on V5's kernels (`_v5_` names), not the staged fallback.
    fn variant_ran(&self) -> bool {
        self.kernels.iter().all(|k| k.contains("_v5_"))
    }
}

/// Runs the case on every GEMM variant and compares each with the reference row by row (ambiguous
/// rows: finite only); the runs in `GemmVariant::ALL` order.
fn check(gpu: &host::Gpu, name: &str, c: &Case) -> Vec<Run> {
    let (rows, ni) = (c.x.shape[0], c.x.shape[1]);
    let no = c.w.shape[0];
    let layer = Linear::from_host(gpu, &c.w, c.b.as_ref()).unwrap();
    let x = Tensor::from_host(gpu, &c.x).unwrap();
    let rel = Tensor::from_host(gpu, &c.rel).unwrap();
    let (want, slack) =
        lr::relevance_with_slack(&c.x, &c.rel, &c.w, c.b.as_ref(), &c.act, margin(ni)).unwrap();
    let tol = lrp_tol(ni, no);
    let loose = slack.iter().filter(|&&s| s > 0.0).count();
    GemmVariant::ALL
        .iter()
        .map(|&variant| {
            let kernels = lrp::relevance_kernels(&layer, &x, variant).unwrap();
            let out = lrp::relevance_variant(&layer, &x, &rel, &c.act, variant)
                .unwrap()
                .to_vec()
                .unwrap();
            let e = lr::slack_rel_err(&out, &want.data, &slack);
            println!(
                "{name} {variant:?} {kernels:?} [{rows},{ni}]x[{no},{ni}] {:?}: rel err {e:.2e} \
                 ({loose} elements with slack)",
                c.act
            );
            assert!(
                e <= tol,
                "{name} {variant:?} [{rows},{ni}]x[{no},{ni}] {:?}: relative error {e:.3e} > {tol:.1e}",
                c.act
            );
            Run {
                variant,
                kernels,
                out,
            }
        })
        .collect()
}

/// Asserts that every variant besides the staged kernels ran both GEMM passes on its own kernels (for
/// shapes chosen to exercise them: `I` and `O` multiples of 4).
fn assert_variants_ran(name: &str, runs: &[Run]) {
    for run in runs.iter().filter(|r| r.variant != GemmVariant::Staged) {
        assert!(
            run.variant_ran(),
            "{name}: {:?} fell back ({:?})",
            run.variant,
            run.kernels
        );
    }
}

fn non_mono(func: Func) -> Activation {
    Activation {
        kind: Kind::NonMono,
        lower: None,
        upper: None,
        func,
    }
}

#[test]
fn defect1_every_in_features_is_counted_once() {
    let Some(gpu) = gpu_or_skip("defect1_every_in_features_is_counted_once") else {
        return;
    };
    let mut rng = rng("lrp_defect1");
    // The reference CUDA version double counts when I % 4 == 0 and I < 1024; odd sizes around it too.
    let sizes = [
        4usize, 8, 12, 100, 1020, 1024, 1028, 4096, 1, 3, 5, 7, 33, 127, 1023, 1025, 4097,
    ];
    for (k, &ni) in sizes.iter().enumerate() {
        let rows = [1usize, 5, 17][k % 3];
        let act = [Activation::null(), Activation::tanh(), Activation::relu()][k % 3];
        let c = case(&mut rng, rows, ni, 37, k % 2 == 0, act);
        check(&gpu, &format!("defect1 I={ni}"), &c);
        // O = 37: variants 3 and 4 run the sums pass (where the double counting was) when I % 4 == 0.
        // P and N themselves: with no saturation and relevance 1, sum_i rin = sum_j (P+N)/(P'+N'+|b|),
        // where P' = P and N' = N except that a zero sum is stabilised to 1 (the aggregation of docs/math/lrp.md).
        // With few inputs all contributions often share a sign (I = 4: 1 in 8 outputs), so the
        // stabilised form is the identity to check, not the unsaturated (P+N)/(P+N+|b|).
        if act == Activation::null() {
            let mut c = c;
            c.rel = HostTensor::new(vec![1.0; rows * 37], &[rows, 37], DType::F32).unwrap();
            let runs = check(&gpu, &format!("defect1 conservation I={ni}"), &c);
            for (run, r) in runs.iter().flat_map(|run| (0..rows).map(move |r| (run, r))) {
                let got = &run.out;
                let s: f64 = got[r * ni..(r + 1) * ni].iter().map(|&v| v as f64).sum();
                let mut want = 0.0;
                for j in 0..37 {
                    let contrib =
                        |i: usize| c.x.data[r * ni + i] as f64 * c.w.data[j * ni + i] as f64;
                    let p: f64 = (0..ni).map(|i| contrib(i).max(0.0)).sum();
                    let n: f64 = (0..ni).map(|i| (-contrib(i)).max(0.0)).sum();
                    let stab = |v: f64| if v == 0.0 { 1.0 } else { v };
                    let b = c.b.as_ref().map_or(0.0, |b| b.data[j].abs() as f64);
                    want += (p + n) / (stab(p) + stab(n) + b);
                }
                assert!(
                    (s - want).abs() <= 1e-5 * want,
                    "I={ni} {:?} row {r}: sum {s} vs {want}",
                    run.variant
                );
            }
        }
    }
}

#[test]
fn defect3_results_are_bit_identical_across_runs() {
    let Some(gpu) = gpu_or_skip("defect3_results_are_bit_identical_across_runs") else {
        return;
    };
    let mut rng = rng("lrp_defect3");
    // R = 64 with few output tiles: the depth is split, so split order is exercised.
    let (rows, ni, no) = (64usize, 1028, 300);
    let c = case(&mut rng, rows, ni, no, true, Activation::tanh());
    let runs = check(&gpu, "defect3", &c);
    assert_variants_ran("defect3", &runs);
    let layer = Linear::from_host(&gpu, &c.w, c.b.as_ref()).unwrap();
    let x = Tensor::from_host(&gpu, &c.x).unwrap();
    let rel = Tensor::from_host(&gpu, &c.rel).unwrap();
    for first in &runs {
        for run in 0..scaled(100, 5) {
            let again = lrp::relevance_variant(&layer, &x, &rel, &c.act, first.variant)
                .unwrap()
                .to_vec()
                .unwrap();
            assert!(
                first
                    .out
                    .iter()
                    .zip(&again)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{:?} run {run}: bits changed",
                first.variant
            );
        }
    }
}

#[test]
fn hand_computed_branches_on_the_gpu() {
    let Some(gpu) = gpu_or_skip("hand_computed_branches_on_the_gpu") else {
        return;
    };
    // (x, w, bias, activation, expected relevance_in) for one row and one output of relevance 1.
    let cases: Vec<(Vec<f32>, Vec<f32>, Option<f32>, Activation, Vec<f64>)> = vec![
        (
            vec![1.0, 2.0, -1.0],
            vec![1.0, -1.0, 2.0],
            None,
            Activation::null(),
            vec![0.2, 0.4, 0.4],
        ),
        (
            vec![0.5, 3.0, -1.0],
            vec![1.0, -1.0, 2.0],
            None,
            Activation::tanh(),
            vec![0.5 / 6.0, 0.5, 2.0 / 6.0],
        ),
        (
            vec![3.0, -2.0, -0.5],
            vec![1.0, -1.0, 1.0],
            None,
            Activation::tanh(),
            vec![0.5, 2.0 / 6.0, 0.5 / 6.0],
        ),
        (
            vec![1.0, 2.0, -1.0],
            vec![1.0, -1.0, 2.0],
            Some(1.0),
            Activation::null(),
            vec![1.0 / 6.0, 2.0 / 6.0, 2.0 / 6.0],
        ),
        (
            vec![1.0, 2.0],
            vec![-2.0, -2.0],
            None,
            Activation::null(),
            vec![2.0 / 7.0, 4.0 / 7.0],
        ),
        (
            vec![30.0, 2.0],
            vec![1.0, -1.0],
            None,
            non_mono(Func::Tanh),
            vec![30.0 / 31.0, 2.0 / 31.0],
        ),
        (
            vec![2.0, 30.0],
            vec![1.0, -1.0],
            None,
            non_mono(Func::Tanh),
            vec![2.0 / 31.0, 30.0 / 31.0],
        ),
        (
            vec![0.0, 2.0],
            vec![1.0, 0.0],
            Some(5.0),
            Activation::tanh(),
            vec![0.0, 0.0],
        ),
    ];
    for (k, (x, w, b, act, want)) in cases.into_iter().enumerate() {
        let n = x.len();
        let layer = Linear::from_host(
            &gpu,
            &HostTensor::new(w, &[1, n], DType::F32).unwrap(),
            b.map(|v| HostTensor::new(vec![v], &[1], DType::F32).unwrap())
                .as_ref(),
        )
        .unwrap();
        let xt = Tensor::from_f32(&gpu, &x, &[1, n], DType::F32).unwrap();
        let rel = Tensor::from_f32(&gpu, &[1.0], &[1, 1], DType::F32).unwrap();
        for variant in GemmVariant::ALL {
            let got = lrp::relevance_variant(&layer, &xt, &rel, &act, variant)
                .unwrap()
                .to_vec()
                .unwrap();
            for (g, w) in got.iter().zip(&want) {
                assert!(
                    (*g as f64 - w).abs() <= 1e-6 * w.abs().max(1.0),
                    "case {k} {variant:?}: {got:?} vs {want:?}"
                );
            }
        }
    }
}

/// V5's spread pass with one split finishes in its epilogue (`lrp_spread_v5_finish_f32`: `|x| G`
/// written directly): shapes whose depth (O <= 256) gives one split, with ragged row and
/// column tiles, against the reference, the staged kernels and itself across runs.
#[test]
fn fused_spread_finish_matches_reference() {
    let Some(gpu) = gpu_or_skip("fused_spread_finish_matches_reference") else {
        return;
    };
    let mut rng = rng("lrp_fused_finish");
    for (rows, ni, no) in [
        (200usize, 1028usize, 36usize),
        (257, 2052, 100),
        (64, 4096, 256),
    ] {
        let c = case(&mut rng, rows, ni, no, true, Activation::tanh());
        let name = format!("fused R{rows} I{ni} O{no}");
        let runs = check(&gpu, &name, &c);
        let run = runs.iter().find(|r| r.variant == GemmVariant::V5).unwrap();
        assert_eq!(
            run.kernels,
            ["lrp_sums_v5_f32", "lrp_spread_v5_finish_f32"],
            "{name}"
        );
        let layer = Linear::from_host(&gpu, &c.w, c.b.as_ref()).unwrap();
        let (x, rel) = (
            Tensor::from_host(&gpu, &c.x).unwrap(),
            Tensor::from_host(&gpu, &c.rel).unwrap(),
        );
        let again = lrp::relevance(&layer, &x, &rel, &c.act)
            .unwrap()
            .to_vec()
            .unwrap();
        // The public call runs `GemmVariant::DEFAULT`: the same bits as that variant's run above.
        let default = runs
            .iter()
            .find(|r| r.variant == GemmVariant::DEFAULT)
            .unwrap();
        let same = again
            .iter()
            .zip(&default.out)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(
            same,
            "{name}: the default (fused) run differs from the {:?} run",
            GemmVariant::DEFAULT
        );
    }
}

#[test]
fn random_shapes_match_reference() {
    let Some(gpu) = gpu_or_skip("random_shapes_match_reference") else {
        return;
    };
    let mut rng = rng("lrp_random");
    const DIMS: [usize; 16] = [
        1, 2, 3, 7, 16, 31, 64, 65, 127, 255, 1000, 1023, 2049, 4096, 4099, 8192,
    ];
    const ROWS: [usize; 10] = [1, 2, 5, 16, 63, 64, 65, 257, 1024, 4096];
    let acts = [
        Activation::null(),
        Activation::tanh(),
        Activation::sigmoid(),
        Activation::relu(),
        Activation::softmax(),
        non_mono(Func::Tanh),
        non_mono(Func::Swish),
        non_mono(Func::Pulse),
        non_mono(Func::HardSigmoid),
        non_mono(Func::Wave),
        non_mono(Func::Absolute),
        Activation {
            kind: Kind::NonMono,
            lower: Some(-3.0),
            upper: Some(3.0),
            func: Func::Sigmoid,
        },
    ];
    // The f64 reference costs 2 R I O operations: keep each case under a budget.
    let budget = scaled(1 << 23, 1 << 16);
    let mut shapes = vec![
        (4096usize, 3usize, 2usize),
        (1, 8192, 3),
        (2, 3, 8192),
        (1, 1, 1),
    ];
    while shapes.len() < fuzz_cases(16) {
        let s = (
            ROWS[rng.random_range(0..ROWS.len())],
            DIMS[rng.random_range(0..DIMS.len())],
            DIMS[rng.random_range(0..DIMS.len())],
        );
        if s.0 * s.1 * s.2 <= budget {
            shapes.push(s);
        }
    }
    for (k, &(rows, ni, no)) in shapes.iter().enumerate() {
        let (rows, ni, no) = if rows * ni * no > budget {
            (rows.min(4), ni.min(256), no.min(256))
        } else {
            (rows, ni, no)
        };
        let c = case(&mut rng, rows, ni, no, k % 2 == 1, acts[k % acts.len()]);
        check(&gpu, &format!("random #{k}"), &c);
    }
}

#[test]
fn rank3_inputs_flatten_leading_dims() {
    let Some(gpu) = gpu_or_skip("rank3_inputs_flatten_leading_dims") else {
        return;
    };
    let mut rng = rng("lrp_rank3");
    let c = case(&mut rng, 6, 50, 9, true, Activation::sigmoid());
    let layer = Linear::from_host(&gpu, &c.w, c.b.as_ref()).unwrap();
    let x = Tensor::from_host(&gpu, &c.x)
        .unwrap()
        .reshape(&[2, 3, 50])
        .unwrap();
    let rel = Tensor::from_host(&gpu, &c.rel)
        .unwrap()
        .reshape(&[2, 3, 9])
        .unwrap();
    let want = lr::relevance(&c.x, &c.rel, &c.w, c.b.as_ref(), &c.act).unwrap();
    for variant in GemmVariant::ALL {
        let out = lrp::relevance_variant(&layer, &x, &rel, &c.act, variant).unwrap();
        assert_eq!(out.shape(), &[2, 3, 50]);
        assert_close(
            &format!("rank 3 {variant:?}"),
            &out.to_vec().unwrap(),
            &want.data,
            1e-5,
        );
    }
}

#[test]
fn dense_forward_matches_reference() {
    let Some(gpu) = gpu_or_skip("dense_forward_matches_reference") else {
        return;
    };
    let mut rng = rng("lrp_dense");
    // (65, 2052, 36): partial row tile, a depth tail of 4 after 64 stages of 32, a partial column
    // tile; variants 3 and 4 must run it (I % 4 == 0).
    for (k, &(rows, ni, no)) in [
        (1usize, 1usize, 1usize),
        (7, 33, 65),
        (64, 1000, 129),
        (300, 4099, 10),
        (65, 2052, 36),
    ]
    .iter()
    .enumerate()
    {
        let c = case(&mut rng, rows, ni, no, k % 2 == 0, Activation::null());
        let layer = Linear::from_host(&gpu, &c.w, c.b.as_ref()).unwrap();
        let x = Tensor::from_host(&gpu, &c.x).unwrap();
        for variant in GemmVariant::ALL {
            let kernel = lrp::dense_kernel(&layer, &x, variant).unwrap();
            if variant != GemmVariant::Staged && ni % 4 == 0 {
                assert_ne!(kernel, "dense_f32", "{variant:?} [{rows},{ni}]x[{no}]");
            }
            for f in [
                Nonlinearity::Linear,
                Nonlinearity::Relu,
                Nonlinearity::Tanh,
                Nonlinearity::Sigmoid,
                Nonlinearity::Softmax,
            ] {
                let got = lrp::dense_variant(&layer, &x, f, variant)
                    .unwrap()
                    .to_vec()
                    .unwrap();
                let want = lr::dense(&c.x, &c.w, c.b.as_ref(), f).unwrap();
                // x W^T cancels; compare on the scale of sum |x||w|.
                assert_close(
                    &format!("dense {variant:?} ({kernel}) {f:?} [{rows},{ni}]x[{no}]"),
                    &got,
                    &want.data,
                    1e-5 * (ni as f64).sqrt().max(1.0),
                );
            }
        }
    }
}

#[test]
fn mlp_explanation_matches_reference() {
    let Some(gpu) = gpu_or_skip("mlp_explanation_matches_reference") else {
        return;
    };
    let mut rng = rng("lrp_mlp");
    let widths = [37usize, 64, 129, 33, 10];
    let nls = [
        Nonlinearity::Relu,
        Nonlinearity::Tanh,
        Nonlinearity::Sigmoid,
        Nonlinearity::Softmax,
    ];
    let batch = scaled(50, 5);
    let host_layers: Vec<lr::HostLayer> = (0..4)
        .map(|l| {
            let scale = 1.0 / (widths[l] as f32).sqrt();
            lr::HostLayer::new(
                uniform(
                    &mut rng,
                    &[widths[l + 1], widths[l]],
                    -2.0 * scale,
                    2.0 * scale,
                    DType::F32,
                ),
                (l != 2).then(|| uniform(&mut rng, &[widths[l + 1]], -0.5, 0.5, DType::F32)),
                nls[l],
            )
        })
        .collect();
    let layers: Vec<MlpLayer> = host_layers
        .iter()
        .map(|h| {
            MlpLayer::new(
                Linear::from_host(&gpu, &h.weight, h.bias.as_ref()).unwrap(),
                h.nonlinearity,
            )
        })
        .collect();
    let x = uniform(&mut rng, &[batch, widths[0]], -1.0, 1.0, DType::F32);
    let (acts, rels) = lr::explain(&host_layers, &x, None).unwrap();
    for variant in GemmVariant::ALL {
        let xt = Tensor::from_host(&gpu, &x).unwrap();
        let e = mlp::explain_variant(&layers, &xt, None, variant).unwrap();
        for l in 0..=4 {
            assert_close(
                &format!("{variant:?} activation {l}"),
                &e.activations[l].to_vec().unwrap(),
                &acts[l].data,
                1e-5,
            );
            assert_close(
                &format!("{variant:?} relevance {l}"),
                &e.relevance[l].to_vec().unwrap(),
                &rels[l].data,
                1e-4,
            );
        }
        assert_eq!(e.input_relevance().shape(), &[batch, widths[0]]);
    }
}

#[test]
fn bad_input_is_rejected_before_launch() {
    let Some(gpu) = gpu_or_skip("bad_input_is_rejected_before_launch") else {
        return;
    };
    let t = |shape: &[usize]| {
        Tensor::from_f32(&gpu, &vec![0.5; shape.iter().product()], shape, DType::F32).unwrap()
    };
    let layer = Linear::new(t(&[4, 3]), Some(t(&[4]))).unwrap();
    let act = Activation::tanh();
    // Mismatched I between x and W, O between relevance_out and W, leading dims.
    let e = lrp::relevance(&layer, &t(&[2, 5]), &t(&[2, 4]), &act).unwrap_err();
    assert!(
        matches!(e, Error::Shape { .. }) && e.to_string().contains("in_features"),
        "{e}"
    );
    let e = lrp::relevance(&layer, &t(&[2, 3]), &t(&[2, 5]), &act).unwrap_err();
    assert!(matches!(e, Error::Shape { .. }), "{e}");
    let e = lrp::relevance(&layer, &t(&[2, 3]), &t(&[3, 4]), &act).unwrap_err();
    assert!(matches!(e, Error::Shape { .. }), "{e}");
    // Bias of the wrong length, weight of the wrong rank.
    assert!(matches!(
        Linear::new(t(&[4, 3]), Some(t(&[3]))),
        Err(Error::Shape { .. })
    ));
    assert!(matches!(
        Linear::new(t(&[12]), None),
        Err(Error::Shape { .. })
    ));
    // lower > upper.
    let bad = Activation {
        lower: Some(1.0),
        upper: Some(-1.0),
        ..act
    };
    assert!(matches!(
        lrp::relevance(&layer, &t(&[2, 3]), &t(&[2, 4]), &bad),
        Err(Error::Invalid { .. })
    ));
    // Non-finite weights and biases, on the GPU and on the host, anywhere in the buffer.
    for at in [0usize, 5, 11] {
        for v in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut w = vec![0.5f32; 12];
            w[at] = v;
            let wt = Tensor::from_f32(&gpu, &w, &[4, 3], DType::F32).unwrap();
            assert!(matches!(
                Linear::new(wt, None),
                Err(Error::NonFinite {
                    what: "weight",
                    count: 1,
                    ..
                })
            ));
            let wh = HostTensor::new(w, &[4, 3], DType::F32).unwrap();
            assert!(matches!(
                Linear::from_host(&gpu, &wh, None),
                Err(Error::NonFinite { .. })
            ));
        }
    }
    let bias = Tensor::from_f32(&gpu, &[0.0, f32::NAN, 0.0, 1.0], &[4], DType::F32).unwrap();
    assert!(matches!(
        Linear::new(t(&[4, 3]), Some(bias)),
        Err(Error::NonFinite { what: "bias", .. })
    ));
    let big: Vec<f32> = (0..1_000_003)
        .map(|i| if i % 250_000 == 7 { f32::NAN } else { 1.0 })
        .collect();
    let bt = Tensor::from_f32(&gpu, &big, &[1_000_003], DType::F32).unwrap();
    assert_eq!(lrp::count_nonfinite(&bt).unwrap(), 4);
    // Non-contiguous inputs and weights; wrong dtype.
    let view = t(&[3, 2]).transpose(0, 1).unwrap();
    assert!(matches!(
        lrp::relevance(&layer, &view, &t(&[2, 4]), &act),
        Err(Error::NotContiguous { .. })
    ));
    assert!(matches!(
        Linear::new(t(&[3, 4]).transpose(0, 1).unwrap(), None),
        Err(Error::NotContiguous { .. })
    ));
    let half = Tensor::from_f32(&gpu, &[0.5; 6], &[2, 3], DType::F16).unwrap();
    assert!(matches!(
        lrp::relevance(&layer, &half, &t(&[2, 4]), &act),
        Err(Error::DType { .. })
    ));
    // Empty batch: a no-op with the right shape; the context is still healthy.
    assert_eq!(
        lrp::relevance(&layer, &t(&[0, 3]), &t(&[0, 4]), &act)
            .unwrap()
            .shape(),
        &[0, 3]
    );
    assert!(
        lrp::relevance(&layer, &t(&[2, 3]), &t(&[2, 4]), &act)
            .unwrap()
            .to_vec()
            .unwrap()
            .iter()
            .all(|v| v.is_finite())
    );
}

#[test]
fn split_boundaries_and_depth_tails() {
    let Some(gpu) = gpu_or_skip("split_boundaries_and_depth_tails") else {
        return;
    };
    let mut rng = rng("lrp_splits");
    // The tensor-core passes step the depth 16 (a stage) and 8 (an mma) at a time, and split it in
    // slices of a multiple of 16: depths just past a stage, an mma step, a split, and R = 64 (the
    // skinny path that splits the depth 8 ways at I = O = 4096) with a tail of 8 after the last split;
    // partial row and column tiles (65 rows, 129 / 200 columns).
    let shapes = [
        (64usize, 4104usize, 200usize),
        (64, 200, 4104),
        (65, 4096 + 24, 129),
        (3, 9, 4097),
        (17, 8, 1),
        (1, 16, 24),
        (64, 513, 257),
    ];
    // Variants 3 and 4 (I and O multiples of 4, so they run): stages of 32 deep in a 4-buffer pipeline, copies
    // of 4 floats. Depths of 1, 2, 3 and 4 stages (fewer stages than the prologue fills: 4, 36, 68,
    // 100), a 4-deep tail after the last whole stage (4100 = 4096 + 4: at R = 64, 15 slices of 288
    // with a last one of 68 = 2 stages + 4), 8-deep tails, one chunk into the next row tile / column
    // tile (65 rows; 132 = 128 + 4 columns, which the spread pass reads as [k][n] chunks).
    let v3_shapes = [
        (64usize, 4100usize, 200usize),
        (64, 200, 4100),
        (65, 4096 + 36, 132),
        (3, 4, 4100),
        (17, 36, 4),
        (1, 68, 100),
        (130, 100, 68),
        (64, 516, 260),
        (1024, 256, 512),
    ];
    for (k, &(rows, ni, no)) in shapes.iter().chain(&v3_shapes).enumerate() {
        let act = [
            Activation::tanh(),
            Activation::null(),
            non_mono(Func::Sigmoid),
        ][k % 3];
        let c = case(&mut rng, rows, ni, no, k % 2 == 0, act);
        let runs = check(&gpu, &format!("splits #{k}"), &c);
        if k >= shapes.len() {
            assert_variants_ran(&format!("splits #{k}"), &runs);
        }
    }
}

#[test]
fn wide_dynamic_range_keeps_fp32_accuracy() {
    let Some(gpu) = gpu_or_skip("wide_dynamic_range_keeps_fp32_accuracy") else {
        return;
    };
    // 3xTF32 keeps about 21 bits per product whatever the magnitudes: inputs spanning 1e-3..1e3 (x) and
    // 1e-2..1e2 (W) with random signs must still match the f64 reference at the f32 tolerance.
    let mut rng = rng("lrp_range");
    let mut wide = |shape: &[usize], decades: f32| {
        let n: usize = shape.iter().product();
        let data = (0..n)
            .map(|_| {
                let m: f32 = rng.random_range(-1.0..1.0);
                m * 10f32.powf(rng.random_range(-decades..decades))
            })
            .collect();
        HostTensor::new(data, shape, DType::F32).unwrap()
    };
    // (64, 1024, 96) runs variants 3 and 4; (5, 333, 77) falls back.
    for &(rows, ni, no) in &[(64usize, 1024usize, 96usize), (5, 333, 77)] {
        let c = Case {
            x: wide(&[rows, ni], 3.0),
            w: wide(&[no, ni], 2.0),
            b: None,
            rel: wide(&[rows, no], 1.0),
            act: Activation::tanh(),
        };
        let runs = check(&gpu, &format!("wide range [{rows},{ni}]x[{no}]"), &c);
        if ni % 4 == 0 && no % 4 == 0 {
            assert_variants_ran("wide range", &runs);
        }
    }
}

#[test]
fn one_sign_products_give_exact_zero_sums() {
    let Some(gpu) = gpu_or_skip("one_sign_products_give_exact_zero_sums") else {
        return;
    };
    // When every c_i = x_i W_ji has one sign, A = |S| bit for bit (the split of |v| is that of v with
    // the sign taken off, and the mma's truncation is symmetric), so the other sum is exactly 0 and
    // N' = 1 (or P' = 1) enters the denominator; a rounding residue of A - S instead would be off by
    // about 1 / P. x > 0 everywhere, W of one sign per case, no saturation; shapes a multiple of 4
    // (variants 3 and 4 run) and not.
    let mut rng = rng("lrp_one_sign");
    for (k, &(rows, ni, no)) in [(70usize, 1000usize, 92usize), (9, 333, 31)]
        .iter()
        .enumerate()
    {
        for w_sign in [1.0f32, -1.0] {
            let mut pos = |shape: &[usize], sign: f32| {
                let n: usize = shape.iter().product();
                let data = (0..n)
                    .map(|_| sign * rng.random_range(0.01f32..2.0))
                    .collect();
                HostTensor::new(data, shape, DType::F32).unwrap()
            };
            let c = Case {
                x: pos(&[rows, ni], 1.0),
                w: pos(&[no, ni], w_sign),
                b: None,
                rel: pos(&[rows, no], 1.0),
                act: Activation::null(),
            };
            let runs = check(&gpu, &format!("one-sign #{k} W sign {w_sign}"), &c);
            if k == 0 {
                assert_variants_ran("one-sign", &runs);
            }
        }
    }
}
