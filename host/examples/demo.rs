//! The main job: runs every op on the GPU, checks each against its CPU reference and prints a table
//! (op, shape, dtype, relative error, GPU time). Without a GPU it says so and runs the CPU references.
//!
//! `cargo run --release -p host --example demo`
use std::time::Instant;

use host::ops::elementwise::{self as ew, BinaryOp, reference as ewr};
use host::ops::reduce::{self, Axis, Reduction, reference as rr};
use host::ops::softmax::{self, reference as sr};
use host::{DType, Gpu, HostTensor, Result, Tensor};

/// Deterministic pseudo-random inputs (splitmix64): the demo needs no RNG crate.
fn random(shape: &[usize], dtype: DType, seed: u64) -> HostTensor {
    let mut s = seed;
    let n: usize = shape.iter().product();
    let data = (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
        })
        .collect();
    HostTensor::new(data, shape, dtype).expect("shape and data agree")
}

fn rel_err(out: &[f32], reference: &[f32]) -> f64 {
    let num: f64 = out
        .iter()
        .zip(reference)
        .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
        .sum();
    let den: f64 = reference.iter().map(|b| (*b as f64).powi(2)).sum();
    if out.iter().any(|v| v.is_nan()) {
        f64::INFINITY
    } else {
        (num / den.max(1e-300)).sqrt()
    }
}

struct Case {
    name: &'static str,
    shape: Vec<usize>,
    dtype: DType,
}

/// Runs `gpu_op` (timed with CUDA events, after one warm-up launch) and compares with `reference`.
fn check(
    gpu: &Gpu,
    case: &Case,
    gpu_op: &dyn Fn(&[Tensor]) -> Result<Tensor>,
    inputs: &[HostTensor],
    reference: &HostTensor,
) -> Result<(f64, f64)> {
    let dev: Vec<Tensor> = inputs
        .iter()
        .map(|h| Tensor::from_host(gpu, h))
        .collect::<Result<_>>()?;
    gpu_op(&dev)?;
    let start = gpu
        .stream()
        .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(|e| host::Error::Invalid {
            op: "demo",
            msg: format!("{e:?}"),
        })?;
    let out = gpu_op(&dev)?;
    let end = gpu
        .stream()
        .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(|e| host::Error::Invalid {
            op: "demo",
            msg: format!("{e:?}"),
        })?;
    gpu.synchronize()?;
    let ms = start.elapsed_ms(&end).unwrap_or(f32::NAN) as f64;
    let _ = case;
    Ok((rel_err(&out.to_vec()?, &reference.data), ms))
}

fn main() -> Result<()> {
    let quiet = std::env::var("RGK_DEMO_QUIET").is_ok();
    let gpu = match Gpu::new(0) {
        Ok(g) => {
            println!("GPU: {g:?}");
            Some(g)
        }
        Err(e) => {
            println!("{e}\nRunning the CPU references only (the GPU columns say n/a).");
            None
        }
    };
    println!(
        "{:<22} {:<16} {:<5} {:>12} {:>10} {:>10}",
        "op", "shape", "dtype", "rel err", "gpu ms", "cpu ms"
    );
    let mut worst: f64 = 0.0;
    for dtype in DType::ALL {
        let a = random(&[512, 1024], dtype, 1);
        let bias = random(&[1024], dtype, 2);
        let dy = random(&[512, 1024], dtype, 3);
        type Gpu1 = Box<dyn Fn(&[Tensor]) -> Result<Tensor>>;
        let cases: Vec<(
            Case,
            Gpu1,
            Vec<HostTensor>,
            Box<dyn Fn() -> Result<HostTensor>>,
        )> = vec![
            (
                Case {
                    name: "add (broadcast)",
                    shape: vec![512, 1024],
                    dtype,
                },
                Box::new(|t| ew::add(&t[0], &t[1])),
                vec![a.clone(), bias.clone()],
                Box::new(|| ewr::binary(BinaryOp::Add, &a, &bias)),
            ),
            (
                Case {
                    name: "mul",
                    shape: vec![512, 1024],
                    dtype,
                },
                Box::new(|t| ew::mul(&t[0], &t[1])),
                vec![a.clone(), dy.clone()],
                Box::new(|| ewr::binary(BinaryOp::Mul, &a, &dy)),
            ),
            (
                Case {
                    name: "gelu",
                    shape: vec![512, 1024],
                    dtype,
                },
                Box::new(|t| ew::gelu(&t[0])),
                vec![a.clone()],
                Box::new(|| ewr::gelu(&a)),
            ),
            (
                Case {
                    name: "gelu_backward",
                    shape: vec![512, 1024],
                    dtype,
                },
                Box::new(|t| ew::gelu_backward(&t[0], &t[1])),
                vec![a.clone(), dy.clone()],
                Box::new(|| ewr::gelu_backward(&a, &dy)),
            ),
            (
                Case {
                    name: "sum (last dim)",
                    shape: vec![512, 1024],
                    dtype,
                },
                Box::new(|t| reduce::sum(&t[0], Axis::Last)),
                vec![a.clone()],
                Box::new(|| rr::reduce(&a, Reduction::Sum, Axis::Last)),
            ),
            (
                Case {
                    name: "max (all)",
                    shape: vec![512, 1024],
                    dtype,
                },
                Box::new(|t| reduce::max(&t[0], Axis::All)),
                vec![a.clone()],
                Box::new(|| rr::reduce(&a, Reduction::Max, Axis::All)),
            ),
            (
                Case {
                    name: "mean (all)",
                    shape: vec![512, 1024],
                    dtype,
                },
                Box::new(|t| reduce::mean(&t[0], Axis::All)),
                vec![a.clone()],
                Box::new(|| rr::reduce(&a, Reduction::Mean, Axis::All)),
            ),
            (
                Case {
                    name: "softmax",
                    shape: vec![512, 1024],
                    dtype,
                },
                Box::new(|t| softmax::softmax(&t[0])),
                vec![a.clone()],
                Box::new(|| sr::softmax(&a)),
            ),
            (
                Case {
                    name: "softmax_backward",
                    shape: vec![512, 1024],
                    dtype,
                },
                Box::new(|t| softmax::softmax_backward(&t[0], &t[1])),
                vec![a.clone(), dy.clone()],
                Box::new(|| sr::softmax_backward(&a, &dy)),
            ),
        ];
        for (case, gpu_op, inputs, reference) in cases {
            let t0 = Instant::now();
            let want = reference()?;
            let cpu_ms = t0.elapsed().as_secs_f64() * 1e3;
            let (err, ms) = match &gpu {
                Some(g) => check(g, &case, gpu_op.as_ref(), &inputs, &want)?,
                None => (f64::NAN, f64::NAN),
            };
            if gpu.is_some() {
                worst = worst.max(err / tolerance(dtype));
            }
            if !quiet {
                let shape = format!("{:?}", case.shape);
                let fmt = |v: f64| {
                    if v.is_nan() {
                        "n/a".to_string()
                    } else {
                        format!("{v:.3e}")
                    }
                };
                println!(
                    "{:<22} {:<16} {:<5} {:>12} {:>10} {:>10.3}",
                    case.name,
                    shape,
                    case.dtype,
                    fmt(err),
                    fmt(ms),
                    cpu_ms
                );
            }
        }
    }
    if gpu.is_some() {
        println!(
            "worst error / tolerance: {worst:.3} ({})",
            if worst <= 1.0 {
                "all ops match their references"
            } else {
                "MISMATCH"
            }
        );
        if worst > 1.0 {
            std::process::exit(1);
        }
    }
    Ok(())
}

/// Relative-norm tolerances of ops.md: f32 1e-5 (1e-4 for the reductions' wider sums is not needed at
/// this size), f16 1e-3, bf16 8e-3.
fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-5,
        DType::F16 => 1e-3,
        DType::BF16 => 8e-3,
    }
}
