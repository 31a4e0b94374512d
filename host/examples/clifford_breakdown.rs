//! Runs one Clifford layer configuration forward and backward twice (identical launch sequences), for
//! a per-kernel profile of the second call: `scripts/clifford_breakdown.py` runs this under Nsight
//! Compute and groups the kernels into the parts of the backward (norm, pairs, mixing, weight
//! gradients, linear map, ...), each against its floor.
//!
//! `cargo run --release -p host --example clifford_breakdown -- KIND DIMS B N [PRECISION]` with KIND
//! `layer` (per-feature GP), `layerfc` (fully connected GP) or `fcgp`; DIMS 2 or 3; PRECISION
//! `tf32x3` (default), `tf32` or `ieee`. Prints the launch boundaries it used on stderr.
//!
//! With a last argument `host`, it times the host instead: 200 forwards (then 200 forwards +
//! backwards) queued back to back, printing the host's time to queue them and the time until the
//! GPU has run them, per call. Where the two agree, the calls are bound by the host's launches.
use host::ops::clifford::{self as cl, Algebra, GpMode, Layer, Normalize, reference::LayerParams};
use host::ops::matmul::Precision;
use host::{DType, Gpu, HostTensor, Tensor};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Err(e) = run(&args) {
        eprintln!("clifford_breakdown: {e}");
        std::process::exit(1);
    }
}

/// Deterministic inputs in [-1, 1) (the values do not matter for a time profile).
fn inputs(gpu: &Gpu, shape: &[usize], seed: u64) -> host::Result<Tensor> {
    let n: usize = shape.iter().product();
    let data = (0..n as u64)
        .map(|i| {
            ((i ^ seed).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) as f32 / (1u64 << 23) as f32
                - 1.0
        })
        .collect();
    Tensor::from_host(gpu, &HostTensor::new(data, shape, DType::F32)?)
}

fn run(args: &[String]) -> Result<(), String> {
    let usage = "usage: clifford_breakdown layer|layerfc|fcgp 2|3 B N [tf32x3|tf32|ieee] [host]";
    let (host_timing, args) = match args.split_last() {
        Some((last, rest)) if last == "host" => (true, rest),
        _ => (false, args),
    };
    let [kind, dims, b, n, rest @ ..] = args else {
        return Err(usage.into());
    };
    let alg = match dims.as_str() {
        "2" => Algebra::Cl2,
        "3" => Algebra::Cl3,
        _ => return Err(format!("DIMS must be 2 or 3, got `{dims}`; {usage}")),
    };
    let parse = |what: &str, s: &str| {
        s.parse::<usize>()
            .map_err(|_| format!("{what} must be a positive integer, got `{s}`; {usage}"))
    };
    let (b, n) = (parse("B", b)?, parse("N", n)?);
    let precision = match rest.first().map(String::as_str) {
        None | Some("tf32x3") => Precision::Tf32x3,
        Some("tf32") => Precision::Tf32,
        Some("ieee") => Precision::Ieee,
        Some(other) => return Err(format!("unknown precision `{other}`; {usage}")),
    };
    let gpu = Gpu::new(0).map_err(|e| e.to_string())?;
    let c = alg.components();
    let err = |e: host::Error| e.to_string();
    let x = inputs(&gpu, &[c, b, n], 1).map_err(err)?;
    let go = inputs(&gpu, &[c, b, n], 3).map_err(err)?;
    // `step(true)`: forward and backward; `step(false)`: the forward alone.
    let mut step: Box<dyn FnMut(bool) -> host::Result<()>> = match kind.as_str() {
        "fcgp" => {
            let y = inputs(&gpu, &[c, b, n], 2).map_err(err)?;
            let w = inputs(&gpu, &[alg.paths(), n, n], 4).map_err(err)?;
            Box::new(move |backward| {
                let f = cl::fcgp_forward_with(&x, &y, &w, Normalize::Yes, precision)?;
                if !backward {
                    return Ok(());
                }
                cl::fcgp_backward_with(&x, &y, &w, &f, &go, precision).map(drop)
            })
        }
        "layer" | "layerfc" => {
            let mode = if kind == "layer" {
                GpMode::PerFeature
            } else {
                GpMode::FullyConnected
            };
            let p = LayerParams::init(alg, n, mode, Normalize::Yes, 7).map_err(err)?;
            let layer = Layer::from_host(&gpu, &p)
                .map_err(err)?
                .with_precision(precision);
            Box::new(move |backward| {
                let f = layer.forward(&x)?;
                if !backward {
                    return Ok(());
                }
                layer.backward(&x, &f, &go).map(drop)
            })
        }
        other => return Err(format!("unknown KIND `{other}`; {usage}")),
    };
    if host_timing {
        for (backward, what) in [(false, "forward"), (true, "forward+backward")] {
            const CALLS: u32 = 200;
            for _ in 0..20 {
                step(backward).map_err(err)?;
            }
            gpu.synchronize().map_err(err)?;
            let start = std::time::Instant::now();
            for _ in 0..CALLS {
                step(backward).map_err(err)?;
            }
            let queued = start.elapsed();
            gpu.synchronize().map_err(err)?;
            let done = start.elapsed();
            let us = |d: std::time::Duration| d.as_secs_f64() * 1e6 / CALLS as f64;
            println!(
                "{kind} {dims}D B{b} N{n} {precision:?} {what}: host queues a call in {:.1} us, \
                 the GPU has run it after {:.1} us (per call, {CALLS} calls back to back)",
                us(queued),
                us(done)
            );
        }
        return Ok(());
    }
    for call in 0..2 {
        eprintln!("clifford_breakdown: call {call} begins");
        step(true).map_err(err)?;
        gpu.synchronize().map_err(err)?;
    }
    eprintln!("clifford_breakdown: done ({kind} {dims}D B{b} N{n} {precision:?})");
    Ok(())
}
