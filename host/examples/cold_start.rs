//! What a user waits for before the first result, in a fresh process: `Gpu::new`, then the first call
//! of one op (which loads that op family's kernel module: machine code where the library carries it,
//! else PTX that the driver JIT-compiles). Prints one JSON line; `cargo xtask coldstart` runs it in
//! fresh processes with the JIT cache off (`CUDA_CACHE_DISABLE=1`) and on, and tabulates.
//!
//! `cargo run --release -p host --example cold_start -- OP` with OP one of `none`, `softmax`,
//! `flash_forward`, `clifford_layer`. `RGK_MODULE_FORMAT=ptx` loads the PTX even where a cubin exists,
//! which is what a build without ptxas ships.
use std::time::Instant;

use host::ops::attention::{self, AttentionParams, Causal};
use host::ops::clifford::{Algebra, GpMode, Layer, Normalize, reference::LayerParams};
use host::ops::softmax;
use host::{DType, Gpu, HostTensor, Tensor};

const OPS: [&str; 4] = ["none", "softmax", "flash_forward", "clifford_layer"];

fn main() {
    let started = Instant::now();
    let op = std::env::args().nth(1).unwrap_or_else(|| "none".into());
    if !OPS.contains(&op.as_str()) {
        eprintln!("cold_start: unknown op `{op}`; expected one of {OPS:?}");
        std::process::exit(2);
    }
    match run(&op, started) {
        Ok(line) => println!("{line}"),
        Err(e) => {
            eprintln!("cold_start {op}: {e}");
            std::process::exit(1);
        }
    }
}

/// Deterministic inputs in [-1, 1) (no RNG crate needed; the values do not matter for start-up).
fn inputs(shape: &[usize], dtype: DType) -> host::Result<HostTensor> {
    let n: usize = shape.iter().product();
    let data = (0..n)
        .map(|i| {
            ((i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) as f32 / (1u64 << 23) as f32
                - 1.0
        })
        .collect();
    HostTensor::new(data, shape, dtype)
}

fn run(op: &str, started: Instant) -> host::Result<String> {
    let t = Instant::now();
    let gpu = Gpu::new(0)?;
    let gpu_new = t.elapsed().as_secs_f64();
    // Inputs are uploaded before the clock starts: the first call is the op, its module load included.
    let first_call: Box<dyn Fn() -> host::Result<()>> = match op {
        "none" => Box::new(|| Ok(())),
        "softmax" => {
            let x = Tensor::from_host(&gpu, &inputs(&[4096, 1024], DType::F32)?)?;
            Box::new(move || softmax::softmax(&x).map(drop))
        }
        "flash_forward" => {
            let shape = [4, 8, 512, 64];
            let q = Tensor::from_host(&gpu, &inputs(&shape, DType::F16)?)?;
            let p = AttentionParams {
                causal: Causal::No,
                scale: None,
                ..Default::default()
            };
            Box::new(move || attention::flash_forward(&q, &q, &q, &p).map(drop))
        }
        _ => {
            // The fully connected layer: its forward runs the clifford, matmul and elementwise modules.
            let (alg, b, n) = (Algebra::Cl3, 1024, 128);
            let params = LayerParams::init(alg, n, GpMode::FullyConnected, Normalize::Yes, 7)?;
            let layer = Layer::from_host(&gpu, &params)?;
            let x = Tensor::from_host(&gpu, &inputs(&[alg.components(), b, n], DType::F32)?)?;
            Box::new(move || layer.forward(&x).map(drop))
        }
    };
    gpu.synchronize()?;
    let t = Instant::now();
    first_call()?;
    gpu.synchronize()?;
    let first = t.elapsed().as_secs_f64();
    let modules: Vec<String> = gpu
        .loaded_modules()
        .iter()
        .map(|m| {
            format!(
                r#"{{"family": "{}", "image": "{}", "bytes": {}, "load_s": {:.6}}}"#,
                m.family.name(),
                m.image,
                m.bytes,
                m.load_time.as_secs_f64()
            )
        })
        .collect();
    Ok(format!(
        r#"{{"op": "{op}", "gpu": "{}", "gpu_new_s": {gpu_new:.6}, "first_call_s": {first:.6}, "process_s": {:.6}, "modules": [{}]}}"#,
        gpu.name(),
        started.elapsed().as_secs_f64(),
        modules.join(", ")
    ))
}
