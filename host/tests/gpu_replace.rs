//! Incremental replacement on the GPU (SKIP without one): all-reference vs all-GPU training agree,
//! bisect names a planted bug and reports a clean build as clean, and the GPU path rejects bad input
//! with the ops' typed errors.
mod common;
use common::*;
use host::Error;
use host::replace::model::{self, Config, Step};
use host::replace::{BisectSettings, Device, Exec, OpKind, Plan, Planted, bisect_on, divergence};
use rand::Rng;

/// All-reference vs all-GPU after 3 SGD steps: the loss at every step within 1e-5 relative, every
/// parameter gradient at every step within 1e-4 (max |g_gpu - g_ref| / max |g_ref|). The GPU ops are
/// f32 (matmul without TF32, f32 softmax / layer norm / erfc GELU) against f64 references rounded to
/// f32; 1e-4 leaves room for three steps of compounding.
const LOSS_TOL: f64 = 1e-5;
const GRAD_TOL: f64 = 1e-4;
const STEPS: usize = 3;

fn train(device: &Device, plan: Plan, planted: Option<Planted>, seed: u64) -> Vec<Step> {
    let cfg = Config::default();
    let mut params = model::init(&cfg, seed);
    let batch = model::batch(&cfg, seed);
    let exec = Exec::new(plan, device).with_planted(planted);
    model::train(&exec, &cfg, &mut params, &batch, STEPS).expect("training runs")
}

#[test]
fn all_gpu_training_matches_all_reference() {
    let Some(gpu) = gpu_or_skip("all_gpu_training_matches_all_reference") else {
        return;
    };
    let seed = rng("all_gpu_training_matches_all_reference").random::<u64>();
    let device = Device::Gpu(gpu);
    let reference = train(&device, Plan::all_reference(), None, seed);
    let on_gpu = train(&device, Plan::all_gpu(), None, seed);
    assert_runs_match(&on_gpu, &reference, LOSS_TOL, GRAD_TOL);
}

#[test]
fn each_op_kind_alone_on_the_gpu_matches_the_reference() {
    let Some(gpu) = gpu_or_skip("each_op_kind_alone_on_the_gpu_matches_the_reference") else {
        return;
    };
    let device = Device::Gpu(gpu);
    let reference = train(&device, Plan::all_reference(), None, 5);
    for kind in OpKind::TRANSFORMER {
        let d = divergence(
            &train(&device, Plan::gpu_only(&[kind]), None, 5),
            &reference,
        );
        println!(
            "{kind}: loss {:.2e}, grad {:.2e} ({})",
            d.loss, d.grad, d.worst_param
        );
        assert!(d.loss <= LOSS_TOL && d.grad <= GRAD_TOL, "{kind}: {d:?}");
    }
}

fn gpu_bisect(test: &str, planted: Option<Planted>) -> Option<host::replace::Report> {
    let gpu = gpu_or_skip(test)?;
    let report =
        bisect_on(&Device::Gpu(gpu), planted, &BisectSettings::default()).expect("bisect runs");
    println!("{report}");
    Some(report)
}

#[test]
fn bisect_reports_a_clean_build_as_clean() {
    if let Some(r) = gpu_bisect("bisect_reports_a_clean_build_as_clean", None) {
        assert!(r.clean(), "{r}");
    }
}

#[test]
fn bisect_names_the_planted_gelu_off_by_one() {
    if let Some(r) = gpu_bisect(
        "bisect_names_the_planted_gelu_off_by_one",
        Some(Planted::GeluOffByOne),
    ) {
        assert_eq!(r.culprit, Some(OpKind::Gelu), "{r}");
        assert!(!r.interaction, "{r}");
        // Every kind before GELU is clean alone.
        for row in r.rows.iter().take_while(|row| row.kind != OpKind::Gelu) {
            assert!(row.alone.max() <= r.settings.tolerance, "{r}");
        }
    }
}

#[test]
fn bisect_names_the_planted_layer_norm_eps() {
    if let Some(r) = gpu_bisect(
        "bisect_names_the_planted_layer_norm_eps",
        Some(Planted::LayerNormEps),
    ) {
        assert_eq!(r.culprit, Some(OpKind::LayerNorm), "{r}");
    }
}

#[test]
fn gpu_path_rejects_bad_input_with_typed_errors() {
    let Some(gpu) = gpu_or_skip("gpu_path_rejects_bad_input_with_typed_errors") else {
        return;
    };
    let cfg = Config::default();
    let device = Device::Gpu(gpu);
    let exec = Exec::new(Plan::all_gpu(), &device);
    let p = model::init(&cfg, 1);
    let mut b = model::batch(&cfg, 1);
    b.tokens[3] = 1000;
    let e = model::loss_and_grads(&exec, &cfg, &p, &b).unwrap_err();
    assert!(
        matches!(
            e,
            Error::IdOutOfRange {
                op: "embedding",
                position: 3,
                id: 1000,
                ..
            }
        ),
        "{e}"
    );
    let b = model::batch(&cfg, 1);
    let mut p = model::init(&cfg, 1);
    p.w2 = host::HostTensor::new(
        vec![0.1; (cfg.d_ff + 1) * cfg.d_model],
        &[cfg.d_ff + 1, cfg.d_model],
        host::DType::F32,
    )
    .unwrap();
    let e = model::loss_and_grads(&exec, &cfg, &p, &b).unwrap_err();
    assert!(matches!(e, Error::Shape { op: "matmul", .. }), "{e}");
}
