//! Incremental replacement of the Clifford MLP on the GPU (SKIP without one): all-reference vs all-GPU
//! training agree, each op kind alone agrees, and bisect reports the GPU build as clean.
//!
//! Tolerances, after 3 SGD steps (the model's default config): the loss at every step within 1e-5
//! relative; every parameter gradient at every step within 1e-3 max-norm relative
//! (`max |g_gpu - g_ref| / max |g_ref|`) and 1e-3 relative 2-norm. The GPU Clifford ops are held to
//! 1e-5 per op against their f64 references (`gpu_clifford.rs`); three SGD steps amplify an op's
//! relative error about 10x in this model (`Model::tolerance`), so 1e-3 keeps a tenfold margin.
//! Each run prints the measured divergences.
mod common;
use common::*;
use host::replace::clifford_model::{self, Config, Step};
use host::replace::{BisectSettings, Device, Exec, Model, OpKind, Plan, bisect_on, divergence};
use rand::Rng;

const LOSS_TOL: f64 = 1e-5;
const GRAD_TOL: f64 = 1e-3;
const STEPS: usize = 3;

fn train(device: &Device, plan: Plan, seed: u64) -> Vec<Step> {
    let cfg = Config::default();
    let mut params = clifford_model::init(&cfg, seed).expect("init");
    let batch = clifford_model::batch(&cfg, seed).expect("batch");
    let exec = Exec::new(plan, device);
    clifford_model::train(&exec, &cfg, &mut params, &batch, STEPS).expect("training runs")
}

#[test]
fn clifford_all_gpu_training_matches_all_reference() {
    let Some(gpu) = gpu_or_skip("clifford_all_gpu_training_matches_all_reference") else {
        return;
    };
    let seed = rng("clifford_all_gpu_training_matches_all_reference").random::<u64>();
    let device = Device::Gpu(gpu);
    let reference = train(&device, Plan::all_reference(), seed);
    let on_gpu = train(&device, Plan::all_gpu(), seed);
    assert_runs_match(&on_gpu, &reference, LOSS_TOL, GRAD_TOL);
}

#[test]
fn clifford_each_op_kind_alone_on_the_gpu_matches_the_reference() {
    let Some(gpu) = gpu_or_skip("clifford_each_op_kind_alone_on_the_gpu_matches_the_reference")
    else {
        return;
    };
    let device = Device::Gpu(gpu);
    let reference = train(&device, Plan::all_reference(), 5);
    for kind in OpKind::CLIFFORD {
        let d = divergence(&train(&device, Plan::gpu_only(&[kind]), 5), &reference);
        println!(
            "{kind}: loss {:.2e}, grad {:.2e} ({})",
            d.loss, d.grad, d.worst_param
        );
        assert!(d.loss <= LOSS_TOL && d.grad <= GRAD_TOL, "{kind}: {d:?}");
    }
}

#[test]
fn clifford_bisect_reports_a_clean_build_as_clean() {
    let Some(gpu) = gpu_or_skip("clifford_bisect_reports_a_clean_build_as_clean") else {
        return;
    };
    let settings = BisectSettings::for_model(Model::parse("clifford").unwrap());
    let r = bisect_on(&Device::Gpu(gpu), None, &settings).expect("bisect runs");
    println!("{r}");
    assert!(r.clean(), "{r}");
    assert_eq!(r.rows.len(), OpKind::CLIFFORD.len());
}

#[test]
fn clifford_gpu_path_rejects_bad_input_with_typed_errors() {
    let Some(gpu) = gpu_or_skip("clifford_gpu_path_rejects_bad_input_with_typed_errors") else {
        return;
    };
    let cfg = Config::default();
    let device = Device::Gpu(gpu);
    let exec = Exec::new(Plan::all_gpu(), &device);
    let b = clifford_model::batch(&cfg, 1).unwrap();
    let mut p = clifford_model::init(&cfg, 1).unwrap();
    // An sgp weight for one feature too many: the GPU Layer's validation names it.
    p.sgp.gp_weight = host::HostTensor::new(
        vec![0.1; (cfg.features + 1) * 20],
        &[cfg.features + 1, 20],
        host::DType::F32,
    )
    .unwrap();
    let e = clifford_model::loss_and_grads(&exec, &cfg, &p, &b).unwrap_err();
    assert!(
        matches!(e, host::Error::Shape { .. }) && e.to_string().contains("gp_weight"),
        "{e}"
    );
}
