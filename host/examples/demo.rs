//! What rgk is for, in one run: kernels written in Rust, each result checked against its f64 CPU
//! reference and timed with CUDA events (median of several runs after a warm-up).
//!
//! 1. FlashAttention forward (`attention::flash_forward`) at B4 H16 S2048 D128, f16 and bf16, with and
//!    without the causal mask: TFLOP/s, and the error of O on sampled query rows (the f64 reference of
//!    every row would take minutes on the CPU), judged by the attention tests' rule
//!    `max|out - ref| <= 2 max|naive - ref| + 1e-5` (naive: the same math rounded to the input dtype).
//! 2. A Clifford `Layer` on Cl(3,0), per-feature and fully connected products: forward and backward.
//! 3. An MLP explained by relevance propagation (`lrp::mlp::explain`): why it predicts the class it
//!    predicts, as the input features with the most relevance, and how much relevance is conserved.
//! 4. `replace::bisect` training a small transformer with a bug planted in its GPU GELU, and naming it.
//! 5. The elementwise, reduction and softmax ops in f32, f16 and bf16, as a table.
//!
//! A progress line goes to stderr before every step that can take more than about a second. Without a
//! GPU the demo says so, runs the CPU references at small shapes (bisect needs a GPU; its harness runs
//! on a CPU stand-in instead) and exits 0. Exit status 1: a check failed (a GPU result outside its
//! tolerance; without a GPU, the sampled-row attention reference disagreeing with the full one); 2: an
//! error, printed as the library reports it (what was expected, what was given).
//!
//! `cargo run --release -p host --example demo`; `RGK_SEED=n` draws other inputs. `RGK_DEMO_QUIET`
//! leaves out the table rows of part 5 (`cargo xtask profile` runs the demo under Nsight Compute to
//! get one launch of a kernel, and wants little output).
use std::process::ExitCode;
use std::time::Instant;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, DriverError};
use host::ops::attention::{self, AttentionParams, Causal, reference as attention_ref};
use host::ops::clifford::reference::LayerParams;
use host::ops::clifford::{Algebra, GpMode, Layer, Normalize};
use host::ops::elementwise::{self as ew, BinaryOp, reference as ewr};
use host::ops::lrp::mlp::{self, MlpLayer};
use host::ops::lrp::{Linear, Nonlinearity, reference as lrp_ref};
use host::ops::reduce::{self, Axis, Reduction, reference as rr};
use host::ops::softmax::{self, reference as sr};
use host::replace::{self, BisectSettings, Device, Planted};
use host::{DType, Error, Gpu, HostTensor, Result, Tensor};

/// Timed GPU runs per measurement (after one warm-up); the median is reported.
const RUNS: usize = 10;
/// The inputs' seed unless `RGK_SEED` says otherwise.
const DEFAULT_SEED: u64 = 1;

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// The whole demo; `Ok(false)` when a check failed.
fn run() -> Result<bool> {
    let seed = match std::env::var("RGK_SEED") {
        Ok(s) => s.trim().parse().map_err(|_| Error::Invalid {
            op: "demo",
            msg: format!("RGK_SEED must be a non-negative integer, got `{s}`"),
        })?,
        Err(_) => DEFAULT_SEED,
    };
    let gpu = match Gpu::new(0) {
        Ok(g) => {
            println!("GPU: {g:?}");
            Some(g)
        }
        // Only a missing device means "run the references instead"; any other failure (a driver
        // error, PTX that does not load) is an error the user must see.
        Err(e @ Error::NoDevice { .. }) => {
            println!("{e}");
            println!(
                "No GPU: running the CPU references at small shapes instead (no GPU times or errors)."
            );
            None
        }
        Err(e) => return Err(e),
    };
    println!("seed {seed} (RGK_SEED=n draws other inputs)");
    let mut rng = Rng(seed);
    let mut verdict = Verdict::default();
    let gpu = gpu.as_ref();
    attention_section(gpu, &mut rng, &mut verdict)?;
    clifford_section(gpu, &mut rng, &mut verdict)?;
    lrp_section(gpu, &mut rng, &mut verdict)?;
    bisect_section(gpu, &mut verdict)?;
    table_section(gpu, &mut rng, &mut verdict)?;
    Ok(verdict.finish())
}

// ---------------------------------------------------------------------------------------------------
// 1. FlashAttention

/// FlashAttention on the GPU against the reference on sampled rows; without a GPU, the full reference
/// at a small shape, which also shows that the sampled rows are exactly what the full reference gives.
fn attention_section(gpu: Option<&Gpu>, rng: &mut Rng, verdict: &mut Verdict) -> Result<()> {
    section("1. FlashAttention forward: O = softmax(Q K^T / sqrt(D) + mask) V");
    results_header();
    // B4 H16 S2048 D128: a 2k-token context of a mid-sized model. The CPU shape keeps the full f64
    // reference (every row against every key) to a fraction of a second.
    let shape = if gpu.is_some() {
        [4, 16, 2048, 128]
    } else {
        [1, 2, 256, 64]
    };
    let [b, h, s, d] = shape;
    for dtype in [DType::F16, DType::BF16] {
        if gpu.is_some() {
            progress(&format!("random Q, K, V {shape:?} {dtype}"));
        }
        let x = attention_inputs(rng, shape, dtype)?;
        let dev = match gpu {
            Some(g) => Some(upload(g, &x)?),
            None => None,
        };
        for causal in [Causal::No, Causal::Yes] {
            let params = AttentionParams {
                causal,
                scale: None,
                ..Default::default()
            };
            let mask = if causal == Causal::Yes {
                "causal"
            } else {
                "full"
            };
            let label = format!("B{b} H{h} S{s} D{d} {mask} {dtype}");
            let rows = sample_rows(rng, b * h, s, 64);
            verdict.row(match (gpu, &dev) {
                (Some(g), Some(dev)) => flash_on_gpu(g, dev, &x, &params, &rows, label)?,
                _ => attention_on_cpu(&x, &params, &rows, label)?,
            });
        }
    }
    Ok(())
}

/// `flash_forward` timed on the GPU, checked on `rows` against the f64 reference.
fn flash_on_gpu(
    gpu: &Gpu,
    [q, k, v]: &[Tensor; 3],
    x: &[HostTensor; 3],
    params: &AttentionParams,
    rows: &[(usize, usize)],
    label: String,
) -> Result<Row> {
    let shape = &x[0].shape;
    let (b, h, s, d) = (shape[0], shape[1], shape[2], shape[3]);
    progress(&format!("flash_forward {label}"));
    let ((o, lse), ms) = time_gpu(gpu, || attention::flash_forward(q, k, v, params))?;
    let got = Rows::gather(&o.to_vec()?, &lse.to_vec()?, s, d, rows);
    let ((exact, naive), cpu_ms) = time_cpu(|| reference_rows(x, params, rows))?;
    // 2 flops per multiply-add, two products (Q K^T and P V); the causal mask skips half of the
    // score matrix.
    let mut flops = 4.0 * (b * h * s * s * d) as f64;
    if params.causal == Causal::Yes {
        flops /= 2.0;
    }
    Ok(Row {
        op: "flash_forward",
        shape: label,
        err: Some(rel_err(&got.o, &exact.o)),
        ok: Some(got.within_attention_rule(&exact, &naive)),
        gpu_ms: Some(ms),
        cpu_ms: Some(cpu_ms),
        note: format!(
            "{:.1} TFLOP/s; {} sampled rows; naive {} {:.1e}",
            flops / (ms * 1e-3) / 1e12,
            rows.len(),
            x[0].dtype,
            rel_err(&naive.o, &exact.o)
        ),
    })
}

/// The full f64 reference at a small shape, and the check that the sampled-row reference the GPU path
/// relies on gives exactly its rows.
fn attention_on_cpu(
    x: &[HostTensor; 3],
    params: &AttentionParams,
    rows: &[(usize, usize)],
    label: String,
) -> Result<Row> {
    let (s, d) = (x[0].shape[2], x[0].shape[3]);
    let (full, cpu_ms) =
        time_cpu(|| attention_ref::forward_and_naive(&x[0], &x[1], &x[2], params))?;
    let full_rows = Rows::gather(&full.exact_o.data, &full.exact_lse.data, s, d, rows);
    let (sampled, _) = reference_rows(x, params, rows)?;
    let same = max_abs_err(&sampled.o, &full_rows.o) == 0.0
        && max_abs_err(&sampled.lse, &full_rows.lse) == 0.0;
    Ok(Row {
        op: "attention reference",
        shape: label,
        err: None,
        ok: Some(same),
        gpu_ms: None,
        cpu_ms: Some(cpu_ms),
        note: format!(
            "naive {} vs f64 {:.1e}; {} sampled rows {} the full reference",
            x[0].dtype,
            rel_err(&full.naive_o.data, &full.exact_o.data),
            rows.len(),
            if same { "match" } else { "DIFFER from" }
        ),
    })
}

/// Q, K, V `[batch, heads, seq, head_dim]` as the attention tests draw them: Q and K in [-2, 2)
/// (scores of a few units, so peaked and flat softmax rows both occur), V in [-1, 1).
fn attention_inputs(rng: &mut Rng, shape: [usize; 4], dtype: DType) -> Result<[HostTensor; 3]> {
    Ok([
        rng.tensor(&shape, -2.0, 2.0, dtype)?,
        rng.tensor(&shape, -2.0, 2.0, dtype)?,
        rng.tensor(&shape, -1.0, 1.0, dtype)?,
    ])
}

fn upload<const N: usize>(gpu: &Gpu, hosts: &[HostTensor; N]) -> Result<[Tensor; N]> {
    let tensors: Vec<Tensor> = hosts
        .iter()
        .map(|t| Tensor::from_host(gpu, t))
        .collect::<Result<_>>()?;
    tensors.try_into().map_err(|_| Error::Invalid {
        op: "demo upload",
        msg: "tensor count changed during upload".into(),
    })
}

/// `count` query rows `(head, i)` to check (head counts over batch and heads): the first and last
/// query of the first and last head (where the causal mask sees one key and all keys), then random.
fn sample_rows(rng: &mut Rng, heads: usize, seq: usize, count: usize) -> Vec<(usize, usize)> {
    let mut rows = vec![(0, 0), (0, seq - 1), (heads - 1, 0), (heads - 1, seq - 1)];
    while rows.len() < count {
        rows.push((rng.below(heads), rng.below(seq)));
    }
    rows
}

/// O rows `[head_dim]` and LSE values of sampled query rows, in the order they were sampled.
#[derive(Default)]
struct Rows {
    o: Vec<f32>,
    lse: Vec<f32>,
}

impl Rows {
    /// The sampled rows of full outputs O `[.., seq_q, head_dim]` and LSE `[.., seq_q]`.
    fn gather(o: &[f32], lse: &[f32], seq_q: usize, d: usize, rows: &[(usize, usize)]) -> Rows {
        let mut out = Rows::default();
        for &(head, i) in rows {
            let r = head * seq_q + i;
            out.o.extend_from_slice(&o[r * d..(r + 1) * d]);
            out.lse.push(lse[r]);
        }
        out
    }

    /// The attention tests' rule, on O and on LSE: `max|out - ref| <= 2 max|naive - ref| + 1e-5`.
    fn within_attention_rule(&self, exact: &Rows, naive: &Rows) -> bool {
        [
            (&self.o, &exact.o, &naive.o),
            (&self.lse, &exact.lse, &naive.lse),
        ]
        .iter()
        .all(|(out, e, n)| max_abs_err(out, e) <= 2.0 * max_abs_err(n, e) + 1e-5)
    }
}

/// The f64 reference (exact, and naive in the input dtype) of single query rows. Each row is computed
/// alone, against the keys it sees, unmasked: rows are independent and the default scale depends on
/// head_dim only, so this is exactly what the full reference gives for them, at the cost of the
/// sampled rows instead of all `batch * heads * seq_q` of them.
fn reference_rows(
    [q, k, v]: &[HostTensor; 3],
    params: &AttentionParams,
    rows: &[(usize, usize)],
) -> Result<(Rows, Rows)> {
    let (sq, sk, d) = (q.shape[2], k.shape[2], q.shape[3]);
    let (mut exact, mut naive) = (Rows::default(), Rows::default());
    for &(head, i) in rows {
        // The module's causal convention: query i sees keys j <= i + seq_k - seq_q.
        let visible = match params.causal {
            Causal::Yes => (i + sk + 1).saturating_sub(sq).min(sk),
            Causal::No => sk,
        };
        let q_row = HostTensor::new(
            q.data[(head * sq + i) * d..][..d].to_vec(),
            &[1, 1, 1, d],
            q.dtype,
        )?;
        let keys = |t: &HostTensor| {
            HostTensor::new(
                t.data[head * sk * d..][..visible * d].to_vec(),
                &[1, 1, visible, d],
                t.dtype,
            )
        };
        let unmasked = AttentionParams {
            causal: Causal::No,
            ..*params
        };
        let both = attention_ref::forward_and_naive(&q_row, &keys(k)?, &keys(v)?, &unmasked)?;
        exact.o.extend_from_slice(&both.exact_o.data);
        exact.lse.extend_from_slice(&both.exact_lse.data);
        naive.o.extend_from_slice(&both.naive_o.data);
        naive.lse.extend_from_slice(&both.naive_lse.data);
    }
    Ok((exact, naive))
}

// ---------------------------------------------------------------------------------------------------
// 2. Clifford Layer

/// A Clifford `Layer` forward and backward against `LayerParams`' f64 forward and backward.
fn clifford_section(gpu: Option<&Gpu>, rng: &mut Rng, verdict: &mut Verdict) -> Result<()> {
    section(
        "2. Clifford Layer on Cl(3,0): per-grade linear map + bias, then RMSNorm(GP(gelu(x), gelu(y)))",
    );
    results_header();
    // (product weights, batch, features). On the GPU: a per-feature shape from the benchmark's grid,
    // and a fully connected one whose f64 reference (64 product terms, each a B x N x N product)
    // still takes only seconds.
    let cases = if gpu.is_some() {
        [
            (GpMode::PerFeature, 4096, 128),
            (GpMode::FullyConnected, 1024, 64),
        ]
    } else {
        [
            (GpMode::PerFeature, 64, 16),
            (GpMode::FullyConnected, 32, 8),
        ]
    };
    let alg = Algebra::Cl3;
    for (mode, b, n) in cases {
        let label = format!("{mode:?} B{b} N{n}");
        // LayerParams::init's weights and zero bias (a non-zero bias breaks rotation equivariance).
        let p = LayerParams::init(alg, n, mode, Normalize::Yes, rng.next())?;
        let x = rng.tensor(&[alg.components(), b, n], -1.5, 1.5, DType::F32)?;
        let grad_out = rng.tensor(&[alg.components(), b, n], -1.5, 1.5, DType::F32)?;
        progress(&format!(
            "clifford Layer {label}: CPU reference forward and backward"
        ));
        let (want, cpu_fwd) = time_cpu(|| p.forward(&x))?;
        let (want_grads, cpu_bwd) = time_cpu(|| p.backward(&x, &want, &grad_out))?;
        let Some(g) = gpu else {
            verdict.row(Row {
                op: "Layer forward (ref)",
                shape: label.clone(),
                err: None,
                ok: None,
                gpu_ms: None,
                cpu_ms: Some(cpu_fwd),
                note: "CPU f64 reference only".into(),
            });
            verdict.row(Row {
                op: "Layer backward (ref)",
                shape: label,
                err: None,
                ok: None,
                gpu_ms: None,
                cpu_ms: Some(cpu_bwd),
                note: "CPU f64 reference only".into(),
            });
            continue;
        };
        let layer = Layer::from_host(g, &p)?;
        let (xd, grad_out_d) = (Tensor::from_host(g, &x)?, Tensor::from_host(g, &grad_out)?);
        progress(&format!("clifford Layer {label}: GPU forward and backward"));
        let (fwd, fwd_ms) = time_gpu(g, || layer.forward(&xd))?;
        let (grads, bwd_ms) = time_gpu(g, || layer.backward(&xd, &fwd, &grad_out_d))?;
        let out_err = rel_err(&fwd.out.to_vec()?, &want.out.data);
        verdict.row(Row {
            op: "Layer::forward",
            shape: label.clone(),
            err: Some(out_err),
            ok: Some(out_err <= 1e-5),
            gpu_ms: Some(fwd_ms),
            cpu_ms: Some(cpu_fwd),
            note: "tol 1e-5".into(),
        });
        // grad_x at the forward's 1e-5. The parameter gradients sum over the whole batch (C * B =
        // 32768 rows at B4096); host/tests/gpu_clifford.rs holds them to 1e-5 on batches under 100
        // rows and gives long f32 reductions 1e-4, which they get here.
        let checks = [
            ("grad_x", &grads.grad_x, &want_grads.grad_x, 1e-5),
            (
                "grad_linear_weight",
                &grads.grad_linear_weight,
                &want_grads.grad_linear_weight,
                1e-4,
            ),
            (
                "grad_linear_bias",
                &grads.grad_linear_bias,
                &want_grads.grad_linear_bias,
                1e-4,
            ),
            (
                "grad_gp_weight",
                &grads.grad_gp_weight,
                &want_grads.grad_gp_weight,
                1e-4,
            ),
        ];
        // The row shows the gradient nearest its tolerance.
        let mut worst = ("", 0.0, 1.0);
        for (name, got, reference, tol) in checks {
            let err = rel_err(&got.to_vec()?, &reference.data);
            if worst.0.is_empty() || err / tol > worst.1 / worst.2 {
                worst = (name, err, tol);
            }
        }
        let (name, err, tol) = worst;
        verdict.row(Row {
            op: "Layer::backward",
            shape: label,
            err: Some(err),
            ok: Some(err <= tol),
            gpu_ms: Some(bwd_ms),
            cpu_ms: Some(cpu_bwd),
            note: format!("worst of 4 gradients: {name} (tol {tol:.0e})"),
        });
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------------
// 3. Relevance propagation

/// An MLP classifier explained by relevance propagation: why it predicts each sample's class.
fn lrp_section(gpu: Option<&Gpu>, rng: &mut Rng, verdict: &mut Verdict) -> Result<()> {
    section("3. MLP explained by layer-wise relevance propagation (lrp::mlp::explain)");
    results_header();
    // An MNIST-sized classifier (784 inputs, 10 classes) on the GPU; a narrow one on the CPU.
    let (batch, widths) = if gpu.is_some() {
        (256, [784, 512, 256, 10])
    } else {
        (8, [64, 32, 16, 10])
    };
    let nonlinearities = [
        Nonlinearity::Relu,
        Nonlinearity::Relu,
        Nonlinearity::Softmax,
    ];
    let mut layers = Vec::with_capacity(nonlinearities.len());
    for (l, &f) in nonlinearities.iter().enumerate() {
        // Random weights scaled by 1/sqrt(fan-in), so activations stay of order one through depth.
        let bound = 2.0 / (widths[l] as f32).sqrt();
        let weight = rng.tensor(&[widths[l + 1], widths[l]], -bound, bound, DType::F32)?;
        let bias = rng.tensor(&[widths[l + 1]], -0.5, 0.5, DType::F32)?;
        layers.push(lrp_ref::HostLayer::new(weight, Some(bias), f));
    }
    let x = rng.tensor(&[batch, widths[0]], -1.0, 1.0, DType::F32)?;
    let label = format!("B{batch} {}", widths.map(|w| w.to_string()).join("-"));
    progress(&format!("mlp::explain {label}: CPU reference"));
    // Explain each sample's predicted class: its probability is the relevance to distribute, the other
    // classes start with none.
    let probs = layers.iter().try_fold(x.clone(), |a, l| {
        lrp_ref::dense(&a, &l.weight, l.bias.as_ref(), l.nonlinearity)
    })?;
    let classes = widths[widths.len() - 1];
    let predicted: Vec<usize> = probs.data.chunks(classes).map(argmax).collect();
    let mut start = vec![0.0; batch * classes];
    for (r, &c) in predicted.iter().enumerate() {
        start[r * classes + c] = probs.data[r * classes + c];
    }
    let start = HostTensor::new(start, &[batch, classes], DType::F32)?;
    let ((acts, rels), cpu_ms) = time_cpu(|| lrp_ref::explain(&layers, &x, Some(&start)))?;
    let relevance_in = match gpu {
        Some(g) => {
            let mlp_layers: Vec<MlpLayer> = layers
                .iter()
                .map(|l| {
                    Ok(MlpLayer::new(
                        Linear::from_host(g, &l.weight, l.bias.as_ref())?,
                        l.nonlinearity,
                    ))
                })
                .collect::<Result<_>>()?;
            let [xd, start_d] = upload(g, &[x.clone(), start.clone()])?;
            progress(&format!("mlp::explain {label}: GPU"));
            let (e, ms) = time_gpu(g, || mlp::explain(&mlp_layers, &xd, Some(&start_d)))?;
            let got = e.input_relevance().to_vec()?;
            let err = rel_err(&got, &rels[0].data);
            let out_err = rel_err(
                &e.activations[layers.len()].to_vec()?,
                &acts[layers.len()].data,
            );
            // host/tests/gpu_lrp.rs's tolerances: 1e-5 for the forward; 1e-4 for relevance, which
            // divides by per-output sums of f32 products at every layer.
            verdict.row(Row {
                op: "mlp::explain",
                shape: label,
                err: Some(err),
                ok: Some(err <= 1e-4 && out_err <= 1e-5),
                gpu_ms: Some(ms),
                cpu_ms: Some(cpu_ms),
                note: format!("input relevance (tol 1e-4); output {out_err:.1e} (tol 1e-5)"),
            });
            got
        }
        None => {
            verdict.row(Row {
                op: "explain (ref)",
                shape: label,
                err: None,
                ok: None,
                gpu_ms: None,
                cpu_ms: Some(cpu_ms),
                note: "CPU f64 reference only".into(),
            });
            rels[0].data.clone()
        }
    };
    describe_explanation(&x, &relevance_in, &start, &predicted);
    Ok(())
}

/// Sample 0's most relevant input features, and how much of each sample's relevance reaches the input.
fn describe_explanation(
    x: &HostTensor,
    relevance: &[f32],
    start: &HostTensor,
    predicted: &[usize],
) {
    let inputs = x.shape[1];
    let classes = start.shape[1];
    let row0 = &relevance[..inputs];
    let mut order: Vec<usize> = (0..inputs).collect();
    order.sort_by(|&a, &b| row0[b].abs().total_cmp(&row0[a].abs()));
    println!(
        "sample 0: predicted class {} (p = {:.3}); its most relevant inputs:",
        predicted[0], start.data[predicted[0]]
    );
    for &i in order.iter().take(5) {
        println!("  x[{i}] = {:+.3}  relevance {:+.5}", x.data[i], row0[i]);
    }
    // Relevance is conserved layer by layer except for the share each layer's bias takes and what its
    // activation range saturates, so the input receives part of what the output started with.
    let ratios: Vec<f64> = relevance
        .chunks(inputs)
        .zip(start.data.chunks(classes))
        .map(|(r, s)| sum(r) / sum(s))
        .collect();
    println!(
        "conservation: sample 0's input relevance sums to {:.4} of output relevance {:.4} ({:.1}%); \
         mean over {} samples {:.1}%",
        sum(row0),
        sum(&start.data[..classes]),
        100.0 * ratios[0],
        ratios.len(),
        100.0 * ratios.iter().sum::<f64>() / ratios.len() as f64
    );
}

fn argmax(v: &[f32]) -> usize {
    (0..v.len())
        .max_by(|&a, &b| v[a].total_cmp(&v[b]))
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------------------------------
// 4. Bisect

/// `replace::bisect` with a planted GELU bug; without a GPU, its harness on a CPU stand-in.
fn bisect_section(gpu: Option<&Gpu>, verdict: &mut Verdict) -> Result<()> {
    section("4. bisect: which op's GPU version makes training diverge from the reference?");
    let planted = Planted::GeluOffByOne;
    if gpu.is_some() {
        println!(
            "planted bug: {planted:?} in the GPU path of {} (built host-side, never shipped)",
            planted.kind()
        );
        progress(
            "bisect: training the transformer block on the references, then each op kind on the GPU",
        );
    }
    match replace::bisect(Some(planted)) {
        Ok(report) => {
            println!("{report}");
            let named = report.culprit.map_or("nothing".into(), |k| k.to_string());
            let ok = report.culprit == Some(planted.kind());
            println!(
                "bisect named: {named} (planted in {}): {}",
                planted.kind(),
                if ok { "found" } else { "MISSED" }
            );
            verdict.record("bisect names the planted op", ok);
        }
        Err(e @ Error::NoDevice { .. }) => {
            println!(
                "bisect skipped: it compares each op's GPU kernel with its CPU reference inside \
                 training runs, so it needs a GPU ({e})"
            );
            // Device::Fake runs every "GPU" op as its reference and scales one op kind's outputs by
            // 1 + rel: the harness's switching and naming logic, runnable anywhere.
            println!(
                "The same harness on a CPU stand-in (replace::Device::Fake): the \"GPU\" {} is its \
                 reference with outputs scaled by 1 + 1e-2:",
                planted.kind()
            );
            let device = Device::Fake {
                kind: planted.kind(),
                rel: 1e-2,
            };
            let report = replace::bisect_on(&device, None, &BisectSettings::default())?;
            println!("{report}");
        }
        Err(e) => return Err(e),
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------------
// 5. Elementwise, reductions, softmax

/// Every elementwise, reduction and softmax op in every dtype: one row per op, one column per dtype.
/// Kept because it launches each of their kernels (`cargo xtask profile` finds them in this run).
fn table_section(gpu: Option<&Gpu>, rng: &mut Rng, verdict: &mut Verdict) -> Result<()> {
    section("5. elementwise, reductions and softmax, [512, 1024] (bias [1024])");
    let quiet = std::env::var("RGK_DEMO_QUIET").is_ok();
    let unit = if gpu.is_some() {
        "rel err / gpu ms"
    } else {
        "cpu ms"
    };
    if !quiet {
        print!("{:<18}", "op");
        for dtype in DType::ALL {
            print!(" {:>24}", format!("{dtype} {unit}"));
        }
        println!();
    }
    let inputs: Vec<[HostTensor; 3]> = DType::ALL
        .iter()
        .map(|&dtype| {
            Ok([
                rng.tensor(&[512, 1024], -2.0, 2.0, dtype)?,
                rng.tensor(&[1024], -2.0, 2.0, dtype)?,
                rng.tensor(&[512, 1024], -2.0, 2.0, dtype)?,
            ])
        })
        .collect::<Result<_>>()?;
    let cases: Vec<Vec<TableCase>> = inputs.iter().map(table_cases).collect();
    for op in 0..cases[0].len() {
        let mut cells = Vec::with_capacity(DType::ALL.len());
        for (dtype, per_dtype) in DType::ALL.into_iter().zip(&cases) {
            let case = &per_dtype[op];
            let (want, cpu_ms) = time_cpu(&case.reference)?;
            cells.push(match gpu {
                Some(g) => {
                    let dev: Vec<Tensor> = case
                        .inputs
                        .iter()
                        .map(|h| Tensor::from_host(g, h))
                        .collect::<Result<_>>()?;
                    let (out, ms) = time_gpu(g, || (case.gpu)(&dev))?;
                    let err = rel_err(&out.to_vec()?, &want.data);
                    let ok = err <= tolerance(dtype);
                    verdict.record(&format!("{} {dtype}", case.name), ok);
                    format!(
                        "{}{} / {ms:.4}",
                        sci(Some(err)),
                        if ok { "" } else { " FAIL" }
                    )
                }
                None => format!("{cpu_ms:.3}"),
            });
        }
        if !quiet {
            print!("{:<18}", cases[0][op].name);
            for c in &cells {
                print!(" {c:>24}");
            }
            println!();
        }
    }
    Ok(())
}

/// A table op's GPU call on its uploaded inputs.
type GpuOp<'a> = Box<dyn Fn(&[Tensor]) -> Result<Tensor> + 'a>;
/// A table op's CPU reference on its host inputs.
type CpuOp<'a> = Box<dyn Fn() -> Result<HostTensor> + 'a>;

/// One op of the table on one dtype's inputs.
struct TableCase<'a> {
    name: &'static str,
    gpu: GpuOp<'a>,
    inputs: Vec<&'a HostTensor>,
    reference: CpuOp<'a>,
}

impl<'a> TableCase<'a> {
    fn new(
        name: &'static str,
        gpu: impl Fn(&[Tensor]) -> Result<Tensor> + 'a,
        inputs: Vec<&'a HostTensor>,
        reference: impl Fn() -> Result<HostTensor> + 'a,
    ) -> Self {
        TableCase {
            name,
            gpu: Box::new(gpu),
            inputs,
            reference: Box::new(reference),
        }
    }
}

/// The table's ops on inputs `[a, bias, dy]` of one dtype.
fn table_cases([a, bias, dy]: &[HostTensor; 3]) -> Vec<TableCase<'_>> {
    vec![
        TableCase::new(
            "add (broadcast)",
            |t| ew::add(&t[0], &t[1]),
            vec![a, bias],
            || ewr::binary(BinaryOp::Add, a, bias),
        ),
        TableCase::new(
            "mul",
            |t| ew::mul(&t[0], &t[1]),
            vec![a, dy],
            || ewr::binary(BinaryOp::Mul, a, dy),
        ),
        TableCase::new("gelu", |t| ew::gelu(&t[0]), vec![a], || ewr::gelu(a)),
        TableCase::new(
            "gelu_backward",
            |t| ew::gelu_backward(&t[0], &t[1]),
            vec![a, dy],
            || ewr::gelu_backward(a, dy),
        ),
        TableCase::new(
            "sum (last dim)",
            |t| reduce::sum(&t[0], Axis::Last),
            vec![a],
            || rr::reduce(a, Reduction::Sum, Axis::Last),
        ),
        TableCase::new(
            "max (all)",
            |t| reduce::max(&t[0], Axis::All),
            vec![a],
            || rr::reduce(a, Reduction::Max, Axis::All),
        ),
        TableCase::new(
            "mean (all)",
            |t| reduce::mean(&t[0], Axis::All),
            vec![a],
            || rr::reduce(a, Reduction::Mean, Axis::All),
        ),
        TableCase::new(
            "softmax",
            |t| softmax::softmax(&t[0]),
            vec![a],
            || sr::softmax(a),
        ),
        TableCase::new(
            "softmax_backward",
            |t| softmax::softmax_backward(&t[0], &t[1]),
            vec![a, dy],
            || sr::softmax_backward(a, dy),
        ),
    ]
}

/// The elementwise tests' relative-norm tolerances: f32 1e-5, f16 1e-3, bf16 8e-3.
fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-5,
        DType::F16 => 1e-3,
        DType::BF16 => 8e-3,
    }
}

// ---------------------------------------------------------------------------------------------------
// Helpers: inputs, timing, errors, output

/// SplitMix64 from the printed seed: reproducible inputs without an RNG crate.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, n)` (the modulo bias is far below anything the demo could notice).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// Uniform in `[lo, hi)`, rounded to `dtype` (as `HostTensor::new` does).
    fn tensor(&mut self, shape: &[usize], lo: f32, hi: f32, dtype: DType) -> Result<HostTensor> {
        let n = shape.iter().product();
        let data = (0..n)
            .map(|_| lo + (hi - lo) * ((self.next() >> 40) as f32 / (1u64 << 24) as f32))
            .collect();
        HostTensor::new(data, shape, dtype)
    }
}

/// A CUDA driver error as the library reports one (its name, number and usual meaning).
fn driver_error(e: DriverError, during: &str) -> Error {
    let code = e.0 as u32;
    Error::Driver {
        name: e.error_name().map_or_else(
            |_| format!("CUDA_ERROR_{code}"),
            |s| s.to_string_lossy().into_owned(),
        ),
        code,
        during: during.into(),
        meaning: host::error::meaning(code).into(),
    }
}

/// An event recorded on the stream every op of `gpu` runs on (the default flags keep timing on).
fn event(gpu: &Gpu) -> Result<CudaEvent> {
    gpu.stream()
        .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(|e| driver_error(e, "recording a timing event"))
}

/// Runs `op` once to warm up (first launches load kernels and set shared-memory limits), then
/// [`RUNS`] times between CUDA events; returns the last result and the median GPU time in ms.
fn time_gpu<T>(gpu: &Gpu, mut op: impl FnMut() -> Result<T>) -> Result<(T, f64)> {
    let mut out = op()?;
    let mut events = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let start = event(gpu)?;
        let next = op()?;
        events.push((start, event(gpu)?));
        // The previous result is freed after the end event is recorded, outside the timed span.
        out = next;
    }
    gpu.synchronize()?;
    let mut ms = events
        .iter()
        .map(|(start, end)| {
            start
                .elapsed_ms(end)
                .map(f64::from)
                .map_err(|e| driver_error(e, "reading a timing event"))
        })
        .collect::<Result<Vec<f64>>>()?;
    ms.sort_by(f64::total_cmp);
    Ok((out, ms[ms.len() / 2]))
}

/// Runs `f` once; returns its result and the wall time in ms.
fn time_cpu<T>(f: impl FnOnce() -> Result<T>) -> Result<(T, f64)> {
    let t0 = Instant::now();
    let out = f()?;
    Ok((out, t0.elapsed().as_secs_f64() * 1e3))
}

/// `||out - ref|| / ||ref||` (2-norms); infinite when `out` has a NaN or the lengths differ.
fn rel_err(out: &[f32], reference: &[f32]) -> f64 {
    if out.len() != reference.len() || out.iter().any(|v| v.is_nan()) {
        return f64::INFINITY;
    }
    let num: f64 = out
        .iter()
        .zip(reference)
        .map(|(&a, &b)| (a as f64 - b as f64).powi(2))
        .sum();
    let den: f64 = reference.iter().map(|&b| (b as f64).powi(2)).sum();
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

/// `max|out - ref|`; infinite on a NaN, on an infinity the other side does not have at that place
/// (LSE of a row that sees no key is -inf on both), or when the lengths differ.
fn max_abs_err(out: &[f32], reference: &[f32]) -> f64 {
    if out.len() != reference.len() {
        return f64::INFINITY;
    }
    let mut worst = 0f64;
    for (&o, &r) in out.iter().zip(reference) {
        if o.is_nan() || r.is_nan() || ((o.is_infinite() || r.is_infinite()) && o != r) {
            return f64::INFINITY;
        }
        if o != r {
            worst = worst.max((o as f64 - r as f64).abs());
        }
    }
    worst
}

fn sum(v: &[f32]) -> f64 {
    v.iter().map(|&x| x as f64).sum()
}

/// A progress line on stderr before a step that may take a while, so the terminal is never silent.
fn progress(what: &str) {
    eprintln!("{what} ...");
}

fn section(title: &str) {
    println!("\n{title}");
}

/// The header of the lines [`Verdict::row`] prints.
fn results_header() {
    println!(
        "{:<21} {:<31} {:>9} {:>5} {:>9} {:>9}  note",
        "op", "shape", "rel err", "check", "gpu ms", "cpu ms"
    );
}

/// `v` in scientific notation, `n/a` when there is none.
fn sci(v: Option<f64>) -> String {
    v.map_or("n/a".into(), |v| format!("{v:.2e}"))
}

/// One result: a table line, and a check in the verdict when `ok` is known.
struct Row {
    op: &'static str,
    shape: String,
    /// Relative error against the f64 reference (GPU results only).
    err: Option<f64>,
    ok: Option<bool>,
    gpu_ms: Option<f64>,
    cpu_ms: Option<f64>,
    note: String,
}

/// Every check the demo made, for the closing verdict and the exit status.
#[derive(Default)]
struct Verdict {
    checked: usize,
    failed: Vec<String>,
}

impl Verdict {
    fn record(&mut self, what: &str, ok: bool) {
        self.checked += 1;
        if !ok {
            self.failed.push(what.to_string());
        }
    }

    fn row(&mut self, r: Row) {
        let ms = |v: Option<f64>| v.map_or("n/a".into(), |v| format!("{v:.3}"));
        let check = match r.ok {
            Some(true) => "ok",
            Some(false) => "FAIL",
            None => "-",
        };
        println!(
            "{:<21} {:<31} {:>9} {:>5} {:>9} {:>9}  {}",
            r.op,
            r.shape,
            sci(r.err),
            check,
            ms(r.gpu_ms),
            ms(r.cpu_ms),
            r.note
        );
        if let Some(ok) = r.ok {
            self.record(&format!("{} {}", r.op, r.shape), ok);
        }
    }

    /// Prints the verdict; whether every check passed.
    fn finish(self) -> bool {
        println!();
        if self.failed.is_empty() {
            println!("verdict: all {} checks passed", self.checked);
            true
        } else {
            println!(
                "verdict: {} of {} checks FAILED: {}",
                self.failed.len(),
                self.checked,
                self.failed.join("; ")
            );
            false
        }
    }
}
