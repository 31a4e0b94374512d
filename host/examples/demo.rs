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

/// The same event pair around one launch, for the GPU-time column.
fn timing_event(gpu: &Gpu) -> Result<cudarc::driver::CudaEvent> {
    gpu.stream()
        .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(|e| host::Error::Invalid {
            op: "demo",
            msg: format!("recording a CUDA event: {e:?}"),
        })
}

/// Runs `gpu_op` (timed with CUDA events, after one warm-up launch) and compares with `reference`.
fn check(
    gpu: &Gpu,
    gpu_op: &GpuOp,
    inputs: &[&HostTensor],
    reference: &HostTensor,
) -> Result<(f64, f64)> {
    let dev: Vec<Tensor> = inputs
        .iter()
        .map(|h| Tensor::from_host(gpu, h))
        .collect::<Result<_>>()?;
    gpu_op(&dev)?;
    let start = timing_event(gpu)?;
    let out = gpu_op(&dev)?;
    let end = timing_event(gpu)?;
    gpu.synchronize()?;
    let ms = start.elapsed_ms(&end).unwrap_or(f32::NAN) as f64;
    Ok((rel_err(&out.to_vec()?, &reference.data), ms))
}

type GpuOp<'a> = dyn Fn(&[Tensor]) -> Result<Tensor> + 'a;
type CpuOp<'a> = dyn Fn() -> Result<HostTensor> + 'a;

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
        // (op, GPU call on the uploaded inputs, inputs, CPU reference)
        let cases: [(&str, &GpuOp, Vec<&HostTensor>, &CpuOp); 9] = [
            (
                "add (broadcast)",
                &|t| ew::add(&t[0], &t[1]),
                vec![&a, &bias],
                &|| ewr::binary(BinaryOp::Add, &a, &bias),
            ),
            ("mul", &|t| ew::mul(&t[0], &t[1]), vec![&a, &dy], &|| {
                ewr::binary(BinaryOp::Mul, &a, &dy)
            }),
            ("gelu", &|t| ew::gelu(&t[0]), vec![&a], &|| ewr::gelu(&a)),
            (
                "gelu_backward",
                &|t| ew::gelu_backward(&t[0], &t[1]),
                vec![&a, &dy],
                &|| ewr::gelu_backward(&a, &dy),
            ),
            (
                "sum (last dim)",
                &|t| reduce::sum(&t[0], Axis::Last),
                vec![&a],
                &|| rr::reduce(&a, Reduction::Sum, Axis::Last),
            ),
            (
                "max (all)",
                &|t| reduce::max(&t[0], Axis::All),
                vec![&a],
                &|| rr::reduce(&a, Reduction::Max, Axis::All),
            ),
            (
                "mean (all)",
                &|t| reduce::mean(&t[0], Axis::All),
                vec![&a],
                &|| rr::reduce(&a, Reduction::Mean, Axis::All),
            ),
            ("softmax", &|t| softmax::softmax(&t[0]), vec![&a], &|| {
                sr::softmax(&a)
            }),
            (
                "softmax_backward",
                &|t| softmax::softmax_backward(&t[0], &t[1]),
                vec![&a, &dy],
                &|| sr::softmax_backward(&a, &dy),
            ),
        ];
        for (name, gpu_op, inputs, reference) in cases {
            let t0 = Instant::now();
            let want = reference()?;
            let cpu_ms = t0.elapsed().as_secs_f64() * 1e3;
            let (err, ms) = match &gpu {
                Some(g) => check(g, gpu_op, &inputs, &want)?,
                None => (f64::NAN, f64::NAN),
            };
            if gpu.is_some() {
                worst = worst.max(err / tolerance(dtype));
            }
            if !quiet {
                let shape = format!("{:?}", a.shape);
                let fmt = |v: f64| {
                    if v.is_nan() {
                        "n/a".to_string()
                    } else {
                        format!("{v:.3e}")
                    }
                };
                println!(
                    "{:<22} {:<16} {:<5} {:>12} {:>10} {:>10.3}",
                    name,
                    shape,
                    dtype,
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
