//! CPU tests of the Clifford MLP on the references: finite differences of the whole model's loss,
//! training, bad input.
use super::*;
use crate::replace::test_support::{reference, seed};
use crate::replace::{Device, Plan};

/// The model's loss in f64 end to end, from the same f64 building blocks the references use
/// (`exact::linear`, `exact::fused`): what the finite differences differentiate. The model itself
/// rounds every op's output to f32 between ops; this does not, so its differences are free of f32
/// noise.
fn loss_f64(cfg: &Config, p: &[Vec<f64>], b: &Batch) -> f64 {
    use crate::ops::clifford::reference::exact::{self, Mix, Shape};
    let s = Shape {
        alg: cfg.algebra,
        b: cfg.batch,
        n: cfg.features,
    };
    let x: Vec<f64> = b.x.data.iter().map(|&v| v as f64).collect();
    let y1 = exact::linear(s, &x, &p[0], &p[1]);
    let (h1, _) = exact::fused(s, Mix::PerFeature, &x, &y1, &p[2], true);
    let y2 = exact::linear(s, &h1, &p[3], &p[4]);
    let fc = Mix::FullyConnected {
        out_features: cfg.features,
    };
    let (h2, _) = exact::fused(s, fc, &h1, &y2, &p[5], true);
    let sum: f64 = h1
        .iter()
        .zip(&h2)
        .zip(&b.target.data)
        .map(|((a, c), &t)| (a + c - t as f64).powi(2))
        .sum();
    sum / h1.len() as f64
}

/// The model's backward (all-reference plan: each op's f64 backward, outputs rounded to f32) against
/// central differences of [`loss_f64`] in f64, step `1e-6 max(1, |w|)`. The grade norm and the
/// gates curve the loss strongly where a grade's RMS is small, so f32-noisy differences of the
/// model's own loss would need steps where truncation and noise both reach 1e-3 relative; the f64
/// loss needs no compromise. The backward's own error is the f32 rounding of op outputs between
/// ops, amplified by that curvature: checked `|fd - grad| <= 1e-7 + 1e-5 |grad|` (worst seen ~0.2 of it) for every entry
/// of the bias gradients and a spread of entries (plus the largest) of the others.
#[test]
fn whole_model_backward_matches_central_differences() {
    let cfg = Config::default();
    let seed = seed("whole_model_backward_matches_central_differences");
    let params = init(&cfg, seed).unwrap();
    let batch = batch(&cfg, seed).unwrap();
    let (loss, grads) = loss_and_grads(&reference(), &cfg, &params, &batch).unwrap();
    let p64: Vec<Vec<f64>> = params
        .named()
        .iter()
        .map(|(_, t)| t.data.iter().map(|&v| v as f64).collect())
        .collect();
    let l64 = loss_f64(&cfg, &p64, &batch);
    assert!(
        (l64 - loss).abs() <= 1e-6 * l64,
        "f64 loss {l64} vs model {loss}"
    );
    let (mut checked, mut worst) = (0, 0.0f64);
    for (pi, (name, g)) in grads.named().into_iter().enumerate() {
        let n = g.numel();
        let largest = (0..n)
            .max_by(|&a, &b| g.data[a].abs().total_cmp(&g.data[b].abs()))
            .unwrap_or(0);
        assert!(g.data[largest] != 0.0, "{name}: all-zero gradient");
        let stride = (n / 40).max(1);
        for idx in (0..n).step_by(stride).chain([n - 1, largest]) {
            let h = 1e-6 * p64[pi][idx].abs().max(1.0);
            let (mut plus, mut minus) = (p64.clone(), p64.clone());
            plus[pi][idx] += h;
            minus[pi][idx] -= h;
            let fd = (loss_f64(&cfg, &plus, &batch) - loss_f64(&cfg, &minus, &batch)) / (2.0 * h);
            let an = g.data[idx] as f64;
            let bound = 1e-7 + 1e-5 * an.abs();
            worst = worst.max((fd - an).abs() / bound);
            assert!(
                (fd - an).abs() <= bound,
                "{name}[{idx}]: backward {an:.7e}, central difference {fd:.7e}"
            );
            checked += 1;
        }
    }
    println!("{checked} entries checked; worst error / tolerance = {worst:.3}");
}

#[test]
fn training_lowers_the_loss_and_is_deterministic() {
    let cfg = Config::default();
    let batch = batch(&cfg, 3).unwrap();
    let ex = reference();
    let mut p = init(&cfg, 2).unwrap();
    let steps = train(&ex, &cfg, &mut p, &batch, 5).unwrap();
    let losses: Vec<f64> = steps.iter().map(|s| s.loss).collect();
    println!("losses {losses:?}");
    assert!(losses.windows(2).all(|w| w[1] < w[0]), "{losses:?}");
    let mut p2 = init(&cfg, 2).unwrap();
    let again = train(&ex, &cfg, &mut p2, &batch, 5).unwrap();
    for ((name, a), (_, b)) in p.named().into_iter().zip(p2.named()) {
        assert_eq!(a, b, "{name}");
    }
    assert_eq!(again.last().map(|s| s.loss), steps.last().map(|s| s.loss));
}

#[test]
fn the_model_is_two_spec_layers_with_a_residual() {
    // The sgp layer then the fc layer of the reference, composed by hand, give the model's loss.
    let cfg = Config::default();
    let p = init(&cfg, 9).unwrap();
    let b = batch(&cfg, 9).unwrap();
    let h1 = p.sgp.forward(&b.x).unwrap().out;
    let h2 = p.fc.forward(&h1).unwrap().out;
    let want: f64 = h1
        .data
        .iter()
        .zip(&h2.data)
        .zip(&b.target.data)
        .map(|((a, c), t)| ((a + c - t) as f64).powi(2))
        .sum::<f64>()
        / h1.numel() as f64;
    let (loss, _) = loss_and_grads(&reference(), &cfg, &p, &b).unwrap();
    assert!((loss - want).abs() <= 1e-6 * want, "{loss} vs {want}");
    assert_eq!(p.sgp.mode, GpMode::PerFeature);
    assert_eq!(p.fc.mode, GpMode::FullyConnected);
    assert_eq!(p.fc.gp_weight.shape, vec![20, 9, 9]);
    assert!(p.sgp.linear_bias.data.iter().all(|&v| v == 0.0));
}

#[test]
fn bad_batches_and_parameters_are_typed_errors() {
    let cfg = Config::default();
    let p = init(&cfg, 1).unwrap();
    let ex = reference();
    let mut b = batch(&cfg, 1).unwrap();
    b.target = HostTensor::new(vec![0.0; 8 * 6 * 8], &[8, 6, 8], crate::DType::F32).unwrap();
    let e = loss_and_grads(&ex, &cfg, &p, &b).unwrap_err();
    assert!(
        matches!(e, Error::Shape { .. }) && e.to_string().contains("target"),
        "{e}"
    );
    let mut b = batch(&cfg, 1).unwrap();
    b.x = HostTensor::new(vec![0.0; 4 * 6 * 9], &[4, 6, 9], crate::DType::F32).unwrap();
    assert!(matches!(
        loss_and_grads(&ex, &cfg, &p, &b),
        Err(Error::Shape { .. })
    ));
    // A fc weight of the wrong width: the layer's own validation names it.
    let b = batch(&cfg, 1).unwrap();
    let mut bad = p.clone();
    bad.fc.gp_weight =
        HostTensor::new(vec![0.1; 20 * 9 * 8], &[20, 9, 8], crate::DType::F32).unwrap();
    let e = loss_and_grads(&ex, &cfg, &bad, &b).unwrap_err();
    assert!(
        matches!(e, Error::Invalid { .. }) && e.to_string().contains("gp_weight"),
        "{e}"
    );
    // A plan that needs a GPU without one.
    let none = Device::None;
    let e = loss_and_grads(&Exec::new(Plan::all_gpu(), &none), &cfg, &p, &b).unwrap_err();
    assert!(matches!(e, Error::NoDevice { .. }), "{e}");
}
