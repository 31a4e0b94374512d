//! CPU tests of the model on the references: finite differences of the full backward, training,
//! bad input.
use super::*;
use crate::replace::test_support::{reference, seed};

/// Finite-difference step and tolerance. The references round every op's output to f32, so the loss
/// is an f32-noisy function (noise ~1e-7 relative, ~3e-7 absolute at loss ~3.4): a central difference
/// with step h = 1e-2 has noise up to ~3e-7 / 2e-2 = 1.5e-5 (typically far less: the rounding errors
/// largely cancel between the two evaluations) and truncation error O(h^2 f'''). Checked:
/// `|fd - grad| <= 1e-5 + 1e-3 |grad|`.
const H: f32 = 1e-2;
const ATOL: f64 = 1e-5;
const RTOL: f64 = 1e-3;

#[test]
fn full_backward_matches_central_differences() {
    let cfg = Config::default();
    // Fresh parameters each run, seeded and printed (replay with RGK_SEED).
    let seed = seed("full_backward_matches_central_differences");
    let params = init(&cfg, seed);
    let batch = batch(&cfg, seed);
    let ex = reference();
    let (_, grads) = loss_and_grads(&ex, &cfg, &params, &batch).unwrap();
    let loss_at = |p: &Params| loss_and_grads(&ex, &cfg, p, &batch).unwrap().0;
    let mut checked = 0;
    let mut worst = 0.0f64;
    for (pi, (name, g)) in grads.named().into_iter().enumerate() {
        let n = g.numel();
        // First, middle and last entry, plus the largest-gradient entry (tok_emb has zero rows for
        // tokens not in the batch: the largest one is a used row).
        let largest = (0..n)
            .max_by(|&a, &b| g.data[a].abs().total_cmp(&g.data[b].abs()))
            .unwrap_or(0);
        for idx in [0, n / 2, n - 1, largest] {
            let (mut plus, mut minus) = (params.clone(), params.clone());
            plus.named_mut()[pi].1.data[idx] += H;
            minus.named_mut()[pi].1.data[idx] -= H;
            let fd = (loss_at(&plus) - loss_at(&minus)) / (2.0 * H as f64);
            let an = g.data[idx] as f64;
            let err = (fd - an).abs();
            worst = worst.max(err / (ATOL + RTOL * an.abs()));
            assert!(
                err <= ATOL + RTOL * an.abs(),
                "{name}[{idx}]: backward {an:.6e}, central difference {fd:.6e}"
            );
            checked += 1;
        }
    }
    println!("{checked} entries checked; worst error / tolerance = {worst:.3}");
}

#[test]
fn training_lowers_the_loss_and_is_deterministic() {
    let cfg = Config::default();
    let batch = batch(&cfg, 3);
    let ex = reference();
    let t0 = std::time::Instant::now();
    let mut p = init(&cfg, 2);
    let steps = train(&ex, &cfg, &mut p, &batch, 5).unwrap();
    println!("5 all-reference steps in {:?}", t0.elapsed());
    let losses: Vec<f64> = steps.iter().map(|s| s.loss).collect();
    println!("losses {losses:?}");
    assert!(losses.windows(2).all(|w| w[1] < w[0]), "{losses:?}");
    let mut p2 = init(&cfg, 2);
    let again = train(&ex, &cfg, &mut p2, &batch, 5).unwrap();
    assert_eq!(p, p2);
    assert_eq!(again.last().map(|s| s.loss), steps.last().map(|s| s.loss));
}

#[test]
fn ids_and_targets_out_of_range_are_typed_errors() {
    let cfg = Config::default();
    let p = init(&cfg, 1);
    let mut b = batch(&cfg, 1);
    b.tokens[5] = cfg.vocab as u32;
    let e = loss_and_grads(&reference(), &cfg, &p, &b).unwrap_err();
    assert!(
        matches!(
            e,
            crate::Error::IdOutOfRange {
                position: 5,
                id: 31,
                vocab: 31,
                ..
            }
        ),
        "{e}"
    );
    let mut b = batch(&cfg, 1);
    b.targets[7] = 99;
    let e = loss_and_grads(&reference(), &cfg, &p, &b).unwrap_err();
    assert!(
        matches!(
            e,
            crate::Error::IdOutOfRange {
                position: 7,
                id: 99,
                ..
            }
        ),
        "{e}"
    );
    let mut b = batch(&cfg, 1);
    b.tokens.pop();
    let e = loss_and_grads(&reference(), &cfg, &p, &b).unwrap_err();
    assert!(
        matches!(
            e,
            crate::Error::Length {
                expected: 26,
                got: 25,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn shape_mismatches_between_layers_are_typed_errors() {
    let cfg = Config::default();
    let b = batch(&cfg, 1);
    let ex = reference();
    let bad = |f: &dyn Fn(&mut Params)| {
        let mut p = init(&cfg, 1);
        f(&mut p);
        loss_and_grads(&ex, &cfg, &p, &b).unwrap_err()
    };
    let d = cfg.d_model;
    let mismatched = |r, c| HostTensor::new(vec![0.1; r * c], &[r, c], DType::F32).unwrap();
    // W2 takes d_ff + 1 inputs: the MLP's second product does not multiply.
    let e = bad(&|p| p.w2 = mismatched(cfg.d_ff + 1, d));
    assert!(
        matches!(
            e,
            crate::Error::Shape {
                op: "matmul (reference)",
                ..
            }
        ),
        "{e}"
    );
    // b1 does not broadcast against [N, d_ff].
    let e = bad(&|p| p.b1 = HostTensor::new(vec![0.0; 7], &[7], DType::F32).unwrap());
    assert!(matches!(e, crate::Error::Broadcast { .. }), "{e}");
    // ln2's gamma of the wrong width.
    let e =
        bad(&|p| p.ln2_gamma = HostTensor::new(vec![1.0; d + 1], &[d + 1], DType::F32).unwrap());
    assert!(matches!(e, crate::Error::Shape { .. }), "{e}");
    // Positional table for a longer sequence than the batch's.
    let e = bad(&|p| p.pos_emb = mismatched(cfg.seq + 1, d));
    assert!(matches!(e, crate::Error::Broadcast { .. }), "{e}");
    // An embedding table of another width than the model's.
    let e = bad(&|p| p.tok_emb = mismatched(cfg.vocab, d + 2));
    assert!(matches!(e, crate::Error::Broadcast { .. }), "{e}");
}
