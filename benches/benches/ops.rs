//! GPU-timed benchmarks of the shipped ops, named like the PyTorch peers in bench/peers.py so
//! bench/report.py can put them side by side. Run through `cargo xtask bench` (which adds the peers
//! and the report) or `cargo bench -p benches`. `RGK_BENCH_QUICK=1` shortens every bench;
//! `RGK_BENCH_SLOW_VARIANT=1` swaps the vectorised add for the strided kernel (a known-slower variant,
//! used to show that `xtask bench-compare` reports a regression).
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use benches::{BenchSpec, GpuTime, read_samples, rotation_copies, write_json};
use criterion::Criterion;
use host::ops::attention::{self as attn, AttentionParams, Causal};
use host::ops::clifford::{self as cl, Algebra, GpMode, Layer, Normalize};
use host::ops::elementwise::{self as ew, BinaryOp, KernelPath};
use host::ops::embedding::{self as emb, DeviceIds};
use host::ops::layer_norm as ln;
use host::ops::lrp::{self, Activation, Linear};
use host::ops::matmul::Precision;
use host::ops::reduce::{self, Axis};
use host::ops::softmax;
use host::{DType, Gpu, HostTensor, Tensor};
use rand::{Rng, SeedableRng};

type C = Criterion<GpuTime>;

struct Bencher<'a> {
    c: &'a mut C,
    gpu: Gpu,
    rng: rand::rngs::StdRng,
    l2_bytes: usize,
    specs: Vec<BenchSpec>,
}

impl Bencher<'_> {
    /// Random device tensors: `copies` independent sets so launches rotate through them.
    fn inputs(&mut self, shape: &[usize], dtype: DType, copies: usize) -> Vec<Tensor> {
        let n: usize = shape.iter().product();
        (0..copies)
            .map(|_| {
                let data: Vec<f32> = (0..n)
                    .map(|_| self.rng.random_range(-2.0f32..2.0))
                    .collect();
                Tensor::from_host(
                    &self.gpu,
                    &HostTensor::new(data, shape, dtype).expect("shape"),
                )
                .expect("upload")
            })
            .collect()
    }

    /// Registers one bench; `run(i)` performs one launch on input set `i % copies`.
    fn bench(&mut self, spec: BenchSpec, copies: usize, run: impl FnMut(usize)) {
        self.bench_sampled(spec, copies, Samples::Default, run)
    }

    /// [`Bencher::bench`] with `setup`, run before each of criterion's calls of the routine but
    /// outside its timing: for inputs made on first use (`setup` caches them), so that a run filtered
    /// to other benches never makes them, and making them counts in no sample or warm-up estimate.
    fn bench_prepared(
        &mut self,
        spec: BenchSpec,
        copies: usize,
        samples: Samples,
        mut setup: impl FnMut(),
        mut run: impl FnMut(usize),
    ) {
        let (group, id) = spec.criterion_ids();
        let mut g = self.c.benchmark_group(group);
        if let Some(t) = spec.throughput() {
            g.throughput(t);
        }
        if samples == Samples::Few {
            g.sample_size(FEW_SAMPLES)
                .sampling_mode(criterion::SamplingMode::Flat)
                .warm_up_time(Duration::from_millis(150))
                .measurement_time(Duration::from_millis(400));
        }
        let mut i = 0usize;
        g.bench_function(id, |b| {
            setup();
            b.iter(|| {
                run(i % copies);
                i += 1;
            })
        });
        g.finish();
        self.specs.push(spec);
    }

    /// [`Bencher::bench`] with a sampling plan (see [`Samples`]).
    fn bench_sampled(
        &mut self,
        spec: BenchSpec,
        copies: usize,
        samples: Samples,
        run: impl FnMut(usize),
    ) {
        self.bench_prepared(spec, copies, samples, || {}, run)
    }
}

/// How a bench is sampled. `Few` is for calls of up to tens of ms (fcgp and Layer at large shapes):
/// criterion's default linear sampling needs at least 1 + 2 + ... + 20 = 210 iterations, seconds each;
/// `Few` takes `FEW_SAMPLES` samples of equal iteration counts (flat sampling) in about 0.4 s.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Samples {
    Default,
    Few,
}

/// Samples of a [`Samples::Few`] bench (criterion's minimum).
const FEW_SAMPLES: usize = 10;

fn spec(name: String, bytes: Option<u64>, flops: Option<u64>) -> BenchSpec {
    BenchSpec {
        name,
        bytes,
        flops,
        peak_memory_bytes: None,
    }
}

/// `op/dtype/MxNxK` of `C (m x n) = A (m x k) B (k x n)`: A and B read and C written once, `2 m n k`
/// FLOPs.
fn matmul_spec(op: &str, dtype: DType, (m, n, k): (usize, usize, usize)) -> BenchSpec {
    let es = dtype.size_bytes();
    spec(
        format!("{op}/{dtype}/{m}x{n}x{k}"),
        Some(((m * k + k * n + m * n) * es) as u64),
        Some(2 * (m * n * k) as u64),
    )
}

/// `spec` with the peak device memory of one call of `call` (see [`peak_memory`]).
fn spec_with_memory<R>(
    gpu: &Gpu,
    name: String,
    bytes: Option<u64>,
    flops: Option<u64>,
    call: impl FnOnce() -> R,
) -> BenchSpec {
    BenchSpec {
        peak_memory_bytes: Some(peak_memory(gpu, call)),
        ..spec(name, bytes, flops)
    }
}

/// Bytes `call` allocates at its high point above what was held before it: our allocation counter's
/// peak since a reset just before the call, minus the bytes live then, with the call's results still
/// held when the peak is read. The same definition as bench/peers.py's PyTorch figure
/// (`max_memory_allocated() - memory_allocated()` around one call), counted exactly: the sizes our API
/// requested for outputs, saved state and workspaces.
fn peak_memory<R>(gpu: &Gpu, call: impl FnOnce() -> R) -> u64 {
    gpu.synchronize().expect("sync");
    gpu.reset_peak_memory();
    let before = gpu.memory_stats().live_bytes;
    let results = call();
    let peak = gpu.memory_stats().peak_bytes;
    gpu.synchronize().expect("sync");
    drop(results);
    peak - before
}

fn ceilings(b: &mut Bencher) {
    // Device-to-device copy of 1 GiB: bytes read + written.
    let bytes = 1usize << 30;
    let stream = b.gpu.stream().clone();
    // SAFETY: both buffers are filled by the memsets below before the copy reads them.
    let (src, dst) = unsafe {
        (
            stream.alloc::<u8>(bytes).expect("alloc"),
            stream.alloc::<u8>(bytes).expect("alloc"),
        )
    };
    use cudarc::driver::{DevicePtr, DevicePtrMut};
    let mut dst = dst;
    let (sp, _s) = src.device_ptr(&stream);
    let (dp, _d) = dst.device_ptr_mut(&stream);
    // SAFETY: the pointers cover `bytes` bytes of live buffers; same stream.
    unsafe {
        cudarc::driver::result::memset_d8_async(sp, 0x3c, bytes, stream.cu_stream())
            .expect("memset");
        cudarc::driver::result::memset_d8_async(dp, 0x00, bytes, stream.cu_stream())
            .expect("memset");
    }
    b.bench(
        spec(format!("copy/f32/{bytes}"), Some(2 * bytes as u64), None),
        1,
        |_| {
            // SAFETY: as above.
            unsafe {
                cudarc::driver::result::memcpy_dtod_async(dp, sp, bytes, stream.cu_stream())
                    .expect("copy")
            }
        },
    );
    gemm_ceiling(b);
}

/// The matmul shapes benched for f16/bf16, ours (`matmul/...`) and cuBLAS's (`gemm/...`) alike:
/// `(m, n, k)` of `C (m x n) = A (m x k) B (k x n)`, all row-major.
const GEMM_SHAPES: [(usize, usize, usize); 3] =
    [(4096, 4096, 4096), (8192, 8192, 8192), (4095, 4097, 1000)];

/// Dense fp16 and bf16 GEMM through cuBLAS (fp32 accumulation), the matrix-unit ceiling, at the
/// shapes of [`GEMM_SHAPES`] (the odd one in f16 only).
fn gemm_ceiling(b: &mut Bencher) {
    use cudarc::cublas::CudaBlas;
    let stream = b.gpu.stream().clone();
    let blas = match CudaBlas::new(stream.clone()) {
        Ok(blas) => blas,
        Err(e) => return println!("cuBLAS unavailable ({e:?}): no GEMM ceiling"),
    };
    for (m, n, k) in GEMM_SHAPES {
        cublas_gemm(b, &blas, "f16", (m, n, k), half::f16::from_f32);
        if m.is_multiple_of(8) {
            cublas_gemm(b, &blas, "bf16", (m, n, k), half::bf16::from_f32);
        }
    }
}

/// One cuBLAS GEMM bench `gemm/{tag}/{m}x{n}x{k}`: row-major `C = A B` computed as the column-major
/// `C^T = B^T A^T` (no transposes, no copies), inputs rotated through like ours.
fn cublas_gemm<T>(
    b: &mut Bencher,
    blas: &cudarc::cublas::CudaBlas,
    tag: &str,
    (m, n, k): (usize, usize, usize),
    from_f32: fn(f32) -> T,
) where
    T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits + num_like::One,
    cudarc::cublas::CudaBlas: cudarc::cublas::Gemm<T>,
{
    use cudarc::cublas::{Gemm, GemmConfig, sys::cublasOperation_t::CUBLAS_OP_N};
    let stream = b.gpu.stream().clone();
    let copies = rotation_copies((m * k + k * n) * 2, b.l2_bytes);
    let mut upload = |len: usize| {
        let vals: Vec<T> = (0..len)
            .map(|_| from_f32(b.rng.random_range(-1.0f32..1.0)))
            .collect();
        stream.clone_htod(&vals).expect("upload")
    };
    let sets: Vec<_> = (0..copies)
        .map(|_| (upload(m * k), upload(k * n)))
        .collect();
    let mut c = stream.alloc_zeros::<T>(m * n).expect("alloc");
    let cfg = GemmConfig {
        transa: CUBLAS_OP_N,
        transb: CUBLAS_OP_N,
        m: n as i32,
        n: m as i32,
        k: k as i32,
        alpha: T::one(),
        lda: n as i32,
        ldb: k as i32,
        beta: T::zero(),
        ldc: n as i32,
    };
    let flops = Some(2 * (m * n * k) as u64);
    b.bench(
        spec(format!("gemm/{tag}/{m}x{n}x{k}"), None, flops),
        copies,
        |i| {
            let (a, bm) = &sets[i];
            // SAFETY: column-major view of row-major data: the first operand is B (n x k
            // column-major = k x n row-major, ld n), the second A (ld k), C n x m column-major
            // (ld n); every buffer has exactly those element counts.
            unsafe { blas.gemm(cfg, bm, a, &mut c).expect("gemm") }
        },
    );
}

/// `one` and `zero` of the GEMM element types (cuBLAS's alpha and beta).
mod num_like {
    pub trait One: Copy {
        fn one() -> Self;
        fn zero() -> Self;
    }
    impl One for half::f16 {
        fn one() -> Self {
            half::f16::ONE
        }
        fn zero() -> Self {
            half::f16::ZERO
        }
    }
    impl One for half::bf16 {
        fn one() -> Self {
            half::bf16::ONE
        }
        fn zero() -> Self {
            half::bf16::ZERO
        }
    }
}

/// Our matmul at the cuBLAS ceiling's shapes (`matmul/{f16,bf16}/...`, tensor cores) and f32 4096^3
/// (`matmul/f32/...`, CUDA cores, against `sgemm/f32/4096x4096x4096`). Bytes count A, B and C once.
fn matmuls(b: &mut Bencher) {
    use host::ops::matmul::{
        Precision,
        Transpose::{No, Yes},
        matmul, matmul_with,
    };
    let quick = std::env::var("RGK_BENCH_QUICK").is_ok();
    let mut cases: Vec<(DType, (usize, usize, usize))> = vec![];
    for shape in GEMM_SHAPES {
        if quick && shape.0 == 8192 {
            continue;
        }
        cases.push((DType::F16, shape));
        if shape.0.is_multiple_of(8) {
            cases.push((DType::BF16, shape));
        }
    }
    cases.push((DType::F32, (4096, 4096, 4096)));
    for (dtype, (m, n, k)) in cases {
        let es = dtype.size_bytes();
        let copies = rotation_copies((m * k + k * n) * es, b.l2_bytes);
        let (x, w) = (
            b.inputs(&[m, k], dtype, copies),
            b.inputs(&[k, n], dtype, copies),
        );
        b.bench(matmul_spec("matmul", dtype, (m, n, k)), copies, |i| {
            matmul(&x[i], &w[i], No, No).expect("matmul");
        });
    }
    // The f32 precisions at 4096^3: `matmul/f32` above is the default (3xTF32); `matmul/tf32` is
    // `Precision::Tf32` (peer: torch at 'high'), `matmul_ieee/f32` the fma kernel.
    let (m, n, k) = (4096usize, 4096usize, 4096usize);
    let copies = rotation_copies((m * k + k * n) * 4, b.l2_bytes);
    let (x, w) = (
        b.inputs(&[m, k], DType::F32, copies),
        b.inputs(&[k, n], DType::F32, copies),
    );
    for (name, precision) in [
        ("matmul/tf32", Precision::Tf32),
        ("matmul_ieee/f32", Precision::Ieee),
    ] {
        let mut s = matmul_spec("matmul", DType::F32, (m, n, k));
        s.name = format!("{name}/{m}x{n}x{k}");
        b.bench(s, copies, |i| {
            matmul_with(&x[i], &w[i], No, No, precision).expect("matmul");
        });
    }
    // `matmul/tf32_nt`: C = A B^T with B stored `N x K`, a linear layer's `x W^T` (peer: torch at
    // 'high' on `a @ b.t()`). The TF32 kernels read such a B in place, with no split pass, its
    // f32 bits truncated to tf32 (cuBLAS presumably rounds: docs/math/matmul.md).
    let wt = b.inputs(&[n, k], DType::F32, copies);
    let mut s = matmul_spec("matmul", DType::F32, (m, n, k));
    s.name = format!("matmul/tf32_nt/{m}x{n}x{k}");
    b.bench(s, copies, |i| {
        matmul_with(&x[i], &wt[i], No, Yes, Precision::Tf32).expect("matmul");
    });
}

/// fp32 SGEMM 4096^3 through cuBLAS (no TF32: plain `cublasSgemm`), the ceiling the relevance kernels'
/// FLOP/s are read against.
fn sgemm_ceiling(b: &mut Bencher) {
    use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, sys::cublasOperation_t::CUBLAS_OP_N};
    let stream = b.gpu.stream().clone();
    let blas = match CudaBlas::new(stream.clone()) {
        Ok(blas) => blas,
        Err(e) => return println!("cuBLAS unavailable ({e:?}): no SGEMM ceiling"),
    };
    let n = 4096usize;
    let vals: Vec<f32> = (0..n * n)
        .map(|_| b.rng.random_range(-1.0f32..1.0))
        .collect();
    let (a, bm) = (
        stream.clone_htod(&vals).expect("upload"),
        stream.clone_htod(&vals).expect("upload"),
    );
    let mut c = stream.alloc_zeros::<f32>(n * n).expect("alloc");
    let ni = n as i32;
    let cfg = GemmConfig {
        transa: CUBLAS_OP_N,
        transb: CUBLAS_OP_N,
        m: ni,
        n: ni,
        k: ni,
        alpha: 1.0f32,
        lda: ni,
        ldb: ni,
        beta: 0.0f32,
        ldc: ni,
    };
    b.bench(
        spec(
            format!("sgemm/f32/{n}x{n}x{n}"),
            None,
            Some(2 * (n as u64).pow(3)),
        ),
        1,
        |_| {
            // SAFETY: a, b, c are n*n device buffers; the config describes n x n column-major operands.
            unsafe { blas.gemm(cfg, &a, &bm, &mut c).expect("sgemm") }
        },
    );
}

/// Relevance propagation through one linear layer, all rows in one call. FLOPs counted as docs/math/lrp.md
/// states: 2 R I O per pass, two passes (the sums pass does two FMAs per product, so its real FMA count
/// is higher).
fn relevance(b: &mut Bencher) {
    sgemm_ceiling(b);
    let (ni, no) = (4096usize, 4096usize);
    let w = b.inputs(&[no, ni], DType::F32, 1).remove(0);
    let bias = b.inputs(&[no], DType::F32, 1).remove(0);
    let layer = Linear::new(w, Some(bias)).expect("finite weights");
    for rows in [64usize, 1024] {
        let (x, rel) = (
            b.inputs(&[rows, ni], DType::F32, 1),
            b.inputs(&[rows, no], DType::F32, 1),
        );
        let flops = 2 * 2 * (rows * ni * no) as u64;
        b.bench(
            spec(format!("lrp/f32/R{rows}_I{ni}_O{no}"), None, Some(flops)),
            1,
            |_| {
                lrp::relevance(&layer, &x[0], &rel[0], &Activation::tanh()).expect("lrp");
            },
        );
    }
}

/// The add benches' tensors: 256 MiB per operand in every dtype (bench/peers.py uses the same).
const ADD_SHAPES: [(DType, [usize; 2]); 3] = [
    (DType::F32, [8192, 8192]),
    (DType::F16, [16384, 8192]),
    (DType::BF16, [16384, 8192]),
];

fn elementwise(b: &mut Bencher) {
    let path = if std::env::var("RGK_BENCH_SLOW_VARIANT").is_ok() {
        KernelPath::Strided
    } else {
        KernelPath::Auto
    };
    for (dtype, shape) in ADD_SHAPES {
        let bytes = (shape[0] * shape[1] * dtype.size_bytes()) as u64;
        let (x, y) = (b.inputs(&shape, dtype, 1), b.inputs(&shape, dtype, 1));
        // `add/...` writes into a preallocated output, as the PyTorch peers do (`torch.add(a, b,
        // out=c)`); `add_alloc/...` is the allocating call (`ew::add`), stream-ordered alloc and free
        // included.
        let mut out = Tensor::empty(&b.gpu, &shape, dtype).expect("alloc");
        b.bench(
            spec(
                format!("add/{dtype}/{}x{}", shape[0], shape[1]),
                Some(3 * bytes),
                None,
            ),
            1,
            |_| {
                ew::binary_into_on(BinaryOp::Add, &x[0], &y[0], &mut out, path).expect("add");
            },
        );
        b.bench(
            spec(
                format!("add_alloc/{dtype}/{}x{}", shape[0], shape[1]),
                Some(3 * bytes),
                None,
            ),
            1,
            |_| {
                ew::binary_on(BinaryOp::Add, &x[0], &y[0], path).expect("add");
            },
        );
    }
    let x = b.inputs(&[8192, 8192], DType::F32, 1);
    let row = b.inputs(&[8192], DType::F32, 1);
    let bytes = 8192u64 * 8192 * 4;
    b.bench(
        spec(
            "add_bcast/f32/8192x8192+8192".into(),
            Some(2 * bytes + 8192 * 4),
            None,
        ),
        1,
        |_| {
            ew::add(&x[0], &row[0]).expect("add");
        },
    );
    b.bench(
        spec("gelu/f32/8192x8192".into(), Some(2 * bytes), None),
        1,
        |_| {
            ew::gelu(&x[0]).expect("gelu");
        },
    );
}

fn reductions(b: &mut Bencher) {
    let x = b.inputs(&[8192, 8192], DType::F32, 1);
    let bytes = 8192u64 * 8192 * 4;
    b.bench(
        spec(
            "sum_lastdim/f32/8192x8192".into(),
            Some(bytes + 8192 * 4),
            None,
        ),
        1,
        |_| {
            reduce::sum(&x[0], Axis::Last).expect("sum");
        },
    );
    b.bench(
        spec(
            "max_lastdim/f32/8192x8192".into(),
            Some(bytes + 8192 * 4),
            None,
        ),
        1,
        |_| {
            reduce::max(&x[0], Axis::Last).expect("max");
        },
    );
    let flat = x[0].reshape(&[8192 * 8192]).expect("reshape");
    b.bench(
        spec("sum_all/f32/67108864".into(), Some(bytes + 4), None),
        1,
        |_| {
            reduce::sum(&flat, Axis::All).expect("sum");
        },
    );
}

fn softmaxes(b: &mut Bencher) {
    for (dtype, shape) in [
        (DType::F32, [8192usize, 8192]),
        (DType::F16, [8192, 8192]),
        (DType::BF16, [8192, 8192]),
        (DType::F32, [65536, 1024]),
        (DType::F32, [16384, 4096]),
    ] {
        let bytes = (shape[0] * shape[1] * dtype.size_bytes()) as u64;
        let copies = rotation_copies(bytes as usize, b.l2_bytes);
        let x = b.inputs(&shape, dtype, copies);
        b.bench(
            spec(
                format!("softmax/{dtype}/{}x{}", shape[0], shape[1]),
                Some(2 * bytes),
                None,
            ),
            copies,
            |i| {
                softmax::softmax(&x[i]).expect("softmax");
            },
        );
    }
    let x = b.inputs(&[8192, 8192], DType::F32, 1);
    let y = softmax::softmax(&x[0]).expect("softmax");
    let dy = b.inputs(&[8192, 8192], DType::F32, 1);
    b.bench(
        spec(
            "softmax_backward/f32/8192x8192".into(),
            Some(3 * 8192 * 8192 * 4),
            None,
        ),
        1,
        |_| {
            softmax::softmax_backward(&y, &dy[0]).expect("softmax_backward");
        },
    );
}

/// Layer norm forward (bytes: read x + write y; gamma/beta and the 2 x rows f32 statistics are
/// negligible and not counted, as in bench/peers.py) and backward (read x and dy, write dx: 3 tensors).
fn layer_norms(b: &mut Bencher) {
    // 256 MiB at the hidden sizes of BERT/GPT-2 base (768) and LLMs (4096), then the default shape
    // (1024), whose inputs the variants and the backward reuse.
    let (rows, cols) = (65536usize, 1024usize);
    layer_norm_forward(b, 87381, 768);
    layer_norm_forward(b, 16384, 4096);
    let (x, g, beta, _) = layer_norm_forward(b, rows, cols);
    let bytes = (rows * cols * 4) as u64;
    let (_, mean, rstd) = ln::layer_norm(&x[0], &g, &beta, None).expect("layer_norm");
    let dy = b.inputs(&[rows, cols], DType::F32, 1).remove(0);
    b.bench(
        spec(
            format!("layernorm_bwd/f32/{rows}x{cols}"),
            Some(3 * bytes),
            None,
        ),
        1,
        |_| {
            ln::layer_norm_backward(&x[0], &g, &mean, &rstd, &dy).expect("layer_norm_backward");
        },
    );
    // bf16 at the same shape: half the bytes, the same kernels.
    let half_bytes = bytes / 2;
    let xh = b.inputs(&[rows, cols], DType::BF16, 1).remove(0);
    let gh = b.inputs(&[cols], DType::BF16, 1).remove(0);
    let bh = b.inputs(&[cols], DType::BF16, 1).remove(0);
    let dyh = b.inputs(&[rows, cols], DType::BF16, 1).remove(0);
    let (_, mean_h, rstd_h) = ln::layer_norm(&xh, &gh, &bh, None).expect("layer_norm");
    b.bench(
        spec(
            format!("layernorm_bwd/bf16/{rows}x{cols}"),
            Some(3 * half_bytes),
            None,
        ),
        1,
        |_| {
            ln::layer_norm_backward(&xh, &gh, &mean_h, &rstd_h, &dyh).expect("layer_norm_backward");
        },
    );
}

/// `layernorm/f32/{rows}x{cols}` on rotated inputs; returns them (x copies, gamma, beta, copy count).
fn layer_norm_forward(
    b: &mut Bencher,
    rows: usize,
    cols: usize,
) -> (Vec<Tensor>, Tensor, Tensor, usize) {
    let bytes = (rows * cols * 4) as u64;
    let copies = rotation_copies(bytes as usize, b.l2_bytes);
    let x = b.inputs(&[rows, cols], DType::F32, copies);
    let g = b.inputs(&[cols], DType::F32, 1).remove(0);
    let beta = b.inputs(&[cols], DType::F32, 1).remove(0);
    b.bench(
        spec(
            format!("layernorm/f32/{rows}x{cols}"),
            Some(2 * bytes),
            None,
        ),
        copies,
        |i| {
            ln::layer_norm(&x[i], &g, &beta, None).expect("layer_norm");
        },
    );
    (x, g, beta, copies)
}

/// Embedding gather with device-resident ids uploaded from the host (the path a model uses; their bound
/// is known, so the id check is one host comparison). Bytes: N rows of D read from the table + N x D
/// written.
fn embeddings(b: &mut Bencher) {
    // 256 MiB of output at D = 768, 1024 and 4096 (GPT-2's vocabulary throughout).
    let vocab = 50257usize;
    for (cols, n) in [(768usize, 87381usize), (4096, 16384), (1024, 65536)] {
        let table = b.inputs(&[vocab, cols], DType::F32, 1).remove(0);
        let ids: Vec<u32> = (0..n)
            .map(|_| b.rng.random_range(0..vocab as u32))
            .collect();
        let ids = DeviceIds::from_slice(&b.gpu, &ids).expect("ids");
        b.bench(
            spec(
                format!("embedding/f32/V{vocab}_D{cols}_N{n}"),
                Some(2 * (n * cols * 4) as u64),
                None,
            ),
            1,
            |_| {
                emb::embedding(&table, &ids).expect("embedding");
            },
        );
    }
    let (cols, n) = (1024usize, 65536usize);
    // The backward from host ids, the whole call timed: the host check and stable counting sort, the
    // two uploads of the grouping, the kernel. Bytes: dy read + dW written.
    let dy = b.inputs(&[n, cols], DType::F32, 1).remove(0);
    let host_ids: Vec<u32> = (0..n)
        .map(|_| b.rng.random_range(0..vocab as u32))
        .collect();
    b.bench(
        spec(
            format!("embedding_bwd/f32/V{vocab}_D{cols}_N{n}"),
            Some(((n + vocab) * cols * 4) as u64),
            None,
        ),
        1,
        |_| {
            emb::embedding_backward(&host_ids, &dy, vocab).expect("embedding_backward");
        },
    );
}

/// The name of an attention bench's mask and its forward FLOPs: `4 B H S^2 D` (two matrix products),
/// half of that with the causal mask.
fn attention_mask_and_flops(
    causal: Causal,
    bb: usize,
    h: usize,
    s: usize,
    d: usize,
) -> (&'static str, u64) {
    let full = 4 * (bb * h * s * s * d) as u64;
    match causal {
        Causal::Yes => ("causal", full / 2),
        Causal::No => ("full", full),
    }
}

/// FlashAttention forward at the shapes of bench/peers.py (ATTN_FWD_SHAPES: ATTN_SHAPES, then S 1k,
/// 4k and 16k at D64 and D128), both masks, f16 and bf16.
/// FLOPs `4 B H S^2 D`, halved when causal (docs/math/attention.md).
fn attention(b: &mut Bencher) {
    let quick = std::env::var("RGK_BENCH_QUICK").is_ok();
    let shapes: &[(usize, usize, usize, usize)] = if quick {
        &[(4, 8, 512, 64)]
    } else {
        &[
            (4, 8, 512, 64),
            (16, 16, 2048, 64),
            (16, 16, 2048, 128),
            (4, 16, 8192, 64),
            (4, 16, 8192, 128),
            (16, 16, 1024, 64),
            (16, 16, 1024, 128),
            (8, 16, 4096, 64),
            (8, 16, 4096, 128),
            (2, 16, 16384, 64),
            (2, 16, 16384, 128),
        ]
    };
    for dtype in [DType::F16, DType::BF16] {
        for &(bb, h, s, d) in shapes {
            let shape = [bb, h, s, d];
            let set_bytes = 3 * bb * h * s * d * dtype.size_bytes();
            let copies = rotation_copies(set_bytes, b.l2_bytes);
            let (q, k, v) = (
                b.inputs(&shape, dtype, copies),
                b.inputs(&shape, dtype, copies),
                b.inputs(&shape, dtype, copies),
            );
            for causal in [Causal::No, Causal::Yes] {
                let (mask, flops) = attention_mask_and_flops(causal, bb, h, s, d);
                let params = AttentionParams {
                    causal,
                    scale: None,
                    ..Default::default()
                };
                b.bench(
                    spec(
                        format!("attn_fwd/{dtype}/B{bb}H{h}S{s}D{d}/{mask}"),
                        Some((4 * bb * h * s * d * dtype.size_bytes()) as u64),
                        Some(flops),
                    ),
                    copies,
                    |i| {
                        attn::flash_forward(&q[i], &k[i], &v[i], &params).expect("flash_forward");
                    },
                );
            }
        }
    }
}

/// Decoding against a dense KV cache (`attn_decode`): one query row a sequence, 32 query heads on 8
/// key/value heads (Llama-3's grouping), D128, B 1-64 x S_k 4k-128k at a fixed K/V size where it
/// fits. Bytes: the K and V read once (what the goal measures against copy bandwidth) plus Q
/// and O; FLOPs `4 B Hq S_k D`. f16 at three shapes also with the softcap 50 (`/c50`, the general
/// kernel) and ALiBi's geometric slopes (`/geometric`), for what they cost against the plain call;
/// and Gemma-2 9B's shape (16 query heads on 8, D256) plain and with its softcap.
fn attention_decode(b: &mut Bencher) {
    let quick = std::env::var("RGK_BENCH_QUICK").is_ok();
    let shapes: &[(usize, usize)] = if quick {
        &[(1, 4096)]
    } else {
        &[
            (1, 4096),
            (1, 32768),
            (1, 131072),
            (8, 8192),
            (16, 32768),
            (64, 4096),
            (64, 16384),
        ]
    };
    let geometric: Vec<f32> = (0..32)
        .map(|i| 2f32.powf(-8.0 * (i + 1) as f32 / 32.0))
        .collect();
    let slopes = Tensor::from_f32(&b.gpu, &geometric, &[32], DType::F32).expect("ALiBi slopes");
    let scored_shapes: &[(usize, usize)] = if quick {
        &[(1, 4096)]
    } else {
        &[(8, 8192), (16, 32768), (64, 16384)]
    };
    // (dtype, B, S_k, Hq, Hkv, D, modifications): Llama-3's grouping at D128, the plain call and
    // (f16, `scored_shapes`) the softcap and ALiBi; Gemma-2 9B's (16 query heads on 8, D256),
    // plain and with its softcap of 50.
    let mut cases = vec![];
    for dtype in [DType::F16, DType::BF16] {
        for &(bb, sk) in shapes {
            let mods: &[&str] = if dtype == DType::F16 && scored_shapes.contains(&(bb, sk)) {
                &["", "/c50", "/geometric"]
            } else {
                &[""]
            };
            cases.push((dtype, bb, sk, 32, 8, 128, mods));
        }
    }
    let d256_shapes: &[(usize, usize)] = if quick { &[] } else { &[(8, 8192), (64, 8192)] };
    for &(bb, sk) in d256_shapes {
        cases.push((DType::F16, bb, sk, 16, 8, 256, &["", "/c50"][..]));
    }
    for (dtype, bb, sk, hq, hkv, d, mods) in cases {
        let kv_bytes = 2 * bb * hkv * sk * d * dtype.size_bytes();
        let copies = rotation_copies(kv_bytes, b.l2_bytes);
        let (q, k, v) = (
            b.inputs(&[bb, hq, 1, d], dtype, copies),
            b.inputs(&[bb, hkv, sk, d], dtype, copies),
            b.inputs(&[bb, hkv, sk, d], dtype, copies),
        );
        for &tag in mods {
            let params = AttentionParams {
                causal: Causal::No,
                scale: None,
                softcap: (tag == "/c50").then_some(50.0),
                alibi_slopes: (tag == "/geometric").then_some(&slopes),
                ..Default::default()
            };
            b.bench(
                spec(
                    format!("attn_decode/{dtype}/B{bb}Hq{hq}Hkv{hkv}Sk{sk}D{d}{tag}"),
                    Some((kv_bytes + 2 * bb * hq * d * dtype.size_bytes()) as u64),
                    Some(4 * (bb * hq * sk * d) as u64),
                ),
                copies,
                |i| {
                    attn::decode_forward(
                        &q[i],
                        attn::KvCache::Dense { k: &k[i], v: &v[i] },
                        &params,
                    )
                    .expect("decode_forward");
                },
            );
        }
    }
}

/// `copies` input sets of four attention tensors (Q, K, V, dO) of `shapes`, uniform in [-2, 2),
/// made on first use (`get`) from a seed drawn now: a run filtered to other benches makes none.
struct LazySets {
    sets: std::cell::OnceCell<Vec<[Tensor; 4]>>,
    gpu: Gpu,
    seed: u64,
    shapes: [[usize; 4]; 4],
    dtype: DType,
    copies: usize,
}

impl LazySets {
    fn new(
        b: &mut Bencher,
        shapes: [[usize; 4]; 4],
        dtype: DType,
        copies: usize,
    ) -> std::rc::Rc<Self> {
        std::rc::Rc::new(LazySets {
            sets: std::cell::OnceCell::new(),
            gpu: b.gpu.clone(),
            seed: b.rng.random(),
            shapes,
            dtype,
            copies,
        })
    }

    fn get(&self) -> &[[Tensor; 4]] {
        self.sets.get_or_init(|| {
            let mut rng = rand::rngs::StdRng::seed_from_u64(self.seed);
            (0..self.copies)
                .map(|_| {
                    self.shapes.map(|shape| {
                        let data: Vec<f32> = (0..shape.iter().product::<usize>())
                            .map(|_| rng.random_range(-2.0f32..2.0))
                            .collect();
                        let host = HostTensor::new(data, &shape, self.dtype).expect("shape");
                        Tensor::from_host(&self.gpu, &host).expect("upload")
                    })
                })
                .collect()
        })
    }

    /// Benches `run` on these sets under `spec` (the sets made when that bench runs, not before),
    /// one set a call in rotation.
    fn bench(&self, b: &mut Bencher, spec: BenchSpec, mut run: impl FnMut(&[Tensor; 4])) {
        b.bench_prepared(
            spec,
            self.copies,
            Samples::Default,
            || {
                self.get();
            },
            |i| run(&self.get()[i]),
        );
    }

    /// An attention forward bench `{name}/fwd` and, with `backward_too`, a forward + backward one
    /// `{name}/fwdbwd` on these sets: bytes the pair's first or second, FLOPs `fwd_flops` or 3.5x
    /// them (docs/math/attention.md); `run(set, backward)` is one call.
    fn bench_passes(
        &self,
        b: &mut Bencher,
        (name, backward_too): (&str, bool),
        (fwd_bytes, fwdbwd_bytes): (usize, usize),
        fwd_flops: u64,
        run: impl Fn(&[Tensor; 4], bool),
    ) {
        for backward in [false, true] {
            if backward && !backward_too {
                continue;
            }
            let (bytes, flops, op) = if backward {
                (fwdbwd_bytes as u64, fwd_flops * 7 / 2, "fwdbwd")
            } else {
                (fwd_bytes as u64, fwd_flops, "fwd")
            };
            self.bench(
                b,
                spec(format!("{name}/{op}"), Some(bytes), Some(flops)),
                |set| run(set, backward),
            );
        }
    }
}

/// One FlashAttention forward of input set `[q, k, v, d_o]` and, with `backward`, its backward
/// (what a training step runs).
fn attention_step(set: &[Tensor; 4], params: &AttentionParams, backward: bool) {
    attention_step_in(
        set,
        params,
        backward.then_some(attn::BackwardMode::Deterministic),
    );
}

/// [`attention_step`] with the backward (if any) in `mode`'s dQ order.
fn attention_step_in(
    [q, k, v, d_o]: &[Tensor; 4],
    params: &AttentionParams,
    backward: Option<attn::BackwardMode>,
) {
    let (o, lse) = attn::flash_forward(q, k, v, params).expect("flash_forward");
    if let Some(mode) = backward {
        attn::flash_backward_with(q, k, v, &o, &lse, d_o, params, mode)
            .expect("flash_backward_with");
    }
}

/// One bench function of [`main`]'s list (`RGK_BENCH_FAMILIES` names them).
type BenchFn = fn(&mut Bencher);

/// [`attention_step`] on a packed batch: `set` holds Q, K, V, dO as `[1, T, H, D]`, the sequences
/// bounded by `cu` (for queries and keys alike).
fn packed_step(set: &[Tensor; 4], cu: &[usize], params: &AttentionParams, backward: bool) {
    let [q, k, v, d_o] = [0, 1, 2, 3].map(|j| set[j].index0(0).expect("[T, H, D]"));
    let seqs = attn::PackedSeqs {
        cu_seqlens_q: cu,
        cu_seqlens_k: cu,
    };
    let (o, lse) =
        attn::flash_forward_varlen(&q, &k, &v, seqs, params).expect("flash_forward_varlen");
    if backward {
        attn::flash_backward_varlen(&q, &k, &v, &o, &lse, &d_o, seqs, params)
            .expect("flash_backward_varlen");
    }
}

/// Grouped-query attention against multi-head attention of equal FLOPs (`attn_gqa`): B2 Hq32 S4096
/// D128 with 8 key/value heads (Llama-3's grouping) and with 32 (multi-head), forward and forward +
/// backward, both masks, f16. The goal: the grouped call within 5% of the multi-head one.
fn attention_gqa(b: &mut Bencher) {
    let quick = std::env::var("RGK_BENCH_QUICK").is_ok();
    let (bb, hq, s, d) = if quick {
        (1, 8, 512, 64)
    } else {
        (2, 32, 4096, 128)
    };
    let dtype = DType::F16;
    for hkv in [hq / 4, hq] {
        let q_bytes = bb * hq * s * d * dtype.size_bytes();
        let kv_bytes = bb * hkv * s * d * dtype.size_bytes();
        let copies = rotation_copies(2 * q_bytes + 2 * kv_bytes, b.l2_bytes);
        let inputs = LazySets::new(
            b,
            [
                [bb, hq, s, d],
                [bb, hkv, s, d],
                [bb, hkv, s, d],
                [bb, hq, s, d],
            ],
            dtype,
            copies,
        );
        for causal in [Causal::No, Causal::Yes] {
            let (mask, fwd_flops) = attention_mask_and_flops(causal, bb, hq, s, d);
            let params = AttentionParams {
                causal,
                scale: None,
                ..Default::default()
            };
            let name = format!("attn_gqa/{dtype}/B{bb}Hq{hq}Hkv{hkv}S{s}D{d}/{mask}");
            inputs.bench_passes(
                b,
                (&name, true),
                (2 * q_bytes + 2 * kv_bytes, 6 * q_bytes + 4 * kv_bytes),
                fwd_flops,
                |set, backward| attention_step(set, &params, backward),
            );
        }
    }
}

/// Strided operands against contiguous ones of the same shape (`attn_layout`): B2 H32 S4096 D128 f16,
/// Q, K, V and dO stored as `[B, H, S, D]` (`bhsd`) or as `[B, S, H, D]` memory passed as its
/// `transpose(1, 2)` view (`bshd`, FlashAttention's and candle's layout; O and the gradients come
/// back in it), forward and forward + backward, both masks. The goal: the strided call within 5% of
/// the contiguous one.
fn attention_layouts(b: &mut Bencher) {
    let quick = std::env::var("RGK_BENCH_QUICK").is_ok();
    let (bb, h, s, d) = if quick {
        (1, 8, 512, 64)
    } else {
        (2, 32, 4096, 128)
    };
    let dtype = DType::F16;
    let bytes1 = bb * h * s * d * dtype.size_bytes();
    let copies = rotation_copies(4 * bytes1, b.l2_bytes);
    for layout in ["bhsd", "bshd"] {
        let shape = if layout == "bshd" {
            [bb, s, h, d]
        } else {
            [bb, h, s, d]
        };
        let inputs = LazySets::new(b, [shape; 4], dtype, copies);
        for causal in [Causal::No, Causal::Yes] {
            let (mask, fwd_flops) = attention_mask_and_flops(causal, bb, h, s, d);
            let params = AttentionParams {
                causal,
                scale: None,
                ..Default::default()
            };
            let name = format!("attn_layout/{dtype}/B{bb}H{h}S{s}D{d}/{layout}/{mask}");
            inputs.bench_passes(
                b,
                (&name, true),
                (4 * bytes1, 10 * bytes1),
                fwd_flops,
                |set, backward| {
                    if layout == "bshd" {
                        let views = [0, 1, 2, 3].map(|j| set[j].transpose(1, 2).expect("view"));
                        attention_step(&views, &params, backward)
                    } else {
                        attention_step(set, &params, backward)
                    }
                },
            );
        }
    }
}

/// FlashAttention at head dims on and off the kernels' tiles (`attn_hdim`): B4 H16 S4096 f16, head
/// dims 32, 64, 96, 128, 192 and 256 (32, 96 and 192 run on the 64-, 128- and 256-wide tiles,
/// zero-padded, with products over their own columns: forwards and dense backwards at all three),
/// forward and forward + backward (and forward + backward with the nondeterministic dQ order,
/// `fwdbwd_nondet`), both masks, beside SDPA at the same shapes (bench/peers.py). The goal: every
/// head dim at least as fast as SDPA's flash backend.
fn attention_head_dims(b: &mut Bencher) {
    let quick = std::env::var("RGK_BENCH_QUICK").is_ok();
    let (bb, h, s) = if quick { (1, 8, 512) } else { (4, 16, 4096) };
    let dtype = DType::F16;
    for d in [32, 64, 96, 128, 192, 256] {
        let bytes1 = bb * h * s * d * dtype.size_bytes();
        let copies = rotation_copies(4 * bytes1, b.l2_bytes);
        let inputs = LazySets::new(b, [[bb, h, s, d]; 4], dtype, copies);
        for causal in [Causal::No, Causal::Yes] {
            let (mask, fwd_flops) = attention_mask_and_flops(causal, bb, h, s, d);
            let params = AttentionParams {
                causal,
                scale: None,
                ..Default::default()
            };
            let name = format!("attn_hdim/{dtype}/B{bb}H{h}S{s}D{d}/bhsd/{mask}");
            inputs.bench_passes(
                b,
                (&name, true),
                (4 * bytes1, 10 * bytes1),
                fwd_flops,
                |set, backward| attention_step(set, &params, backward),
            );
            // The same forward + backward with dQ added in arrival order: the determinism class
            // of SDPA's flash backend, whose backward adds dQ with atomics.
            inputs.bench(
                b,
                spec(
                    format!("{name}/fwdbwd_nondet"),
                    Some(10 * bytes1 as u64),
                    Some(fwd_flops * 7 / 2),
                ),
                |set| {
                    let mode = attn::BackwardMode::Nondeterministic;
                    attention_step_in(set, &params, Some(mode))
                },
            );
        }
    }
}

/// Sliding windows (`attn_window`): B2 H16 S8192 D128 f16, a causal window of 1024 keys back
/// (Mistral's kind) and a bidirectional one of 512 each side, forward and forward + backward,
/// beside SDPA with the window as a boolean mask and FlexAttention (bench/peers.py). FLOPs count
/// the visible pairs only.
fn attention_windows(b: &mut Bencher) {
    let quick = std::env::var("RGK_BENCH_QUICK").is_ok();
    let (bb, h, s, d) = if quick {
        (1, 4, 1024, 128)
    } else {
        (2, 16, 8192, 128)
    };
    let dtype = DType::F16;
    let bytes1 = bb * h * s * d * dtype.size_bytes();
    let copies = rotation_copies(4 * bytes1, b.l2_bytes);
    let inputs = LazySets::new(b, [[bb, h, s, d]; 4], dtype, copies);
    for (left, right, causal) in [(1024usize, 0usize, true), (512, 512, false)] {
        let visible: u64 = (0..s)
            .map(|i| (s - 1).min(i + right) - i.saturating_sub(left) + 1)
            .map(|n| n as u64)
            .sum();
        let fwd_flops = 4 * (bb * h * d) as u64 * visible;
        let params = AttentionParams {
            causal: if causal { Causal::Yes } else { Causal::No },
            scale: None,
            window: attn::Window {
                left: Some(left),
                right: Some(right),
            },
            ..Default::default()
        };
        let mask = if causal { "causal" } else { "full" };
        let name = format!("attn_window/{dtype}/B{bb}H{h}S{s}D{d}/L{left}R{right}/{mask}");
        inputs.bench_passes(
            b,
            (&name, true),
            (4 * bytes1, 10 * bytes1),
            fwd_flops,
            |set, backward| attention_step(set, &params, backward),
        );
    }
}

/// Score modifications: the logit softcap (`attn_softcap`, cap 50, Gemma-2's; D 64, 128 and 256)
/// and ALiBi (`attn_alibi`, BLOOM's geometric slopes `2^(-8 (h + 1) / H)`; D 64 and 128): B4 H16
/// S4096 f16, both masks, forward and forward + backward, beside FlexAttention with the same score
/// modification (bench/peers.py). The unmodified call of the same shape is `attn_hdim`'s.
fn attention_scores(b: &mut Bencher) {
    let quick = std::env::var("RGK_BENCH_QUICK").is_ok();
    let (bb, h, s) = if quick { (1, 4, 1024) } else { (4, 16, 4096) };
    let dtype = DType::F16;
    let geometric: Vec<f32> = (0..h)
        .map(|i| 2f32.powf(-8.0 * (i + 1) as f32 / h as f32))
        .collect();
    let slopes = Tensor::from_f32(&b.gpu, &geometric, &[h], DType::F32).expect("ALiBi slopes");
    let families = [
        ("attn_softcap", 64),
        ("attn_softcap", 128),
        ("attn_softcap", 256),
        ("attn_alibi", 64),
        ("attn_alibi", 128),
    ];
    for (family, d) in families {
        let bytes1 = bb * h * s * d * dtype.size_bytes();
        let copies = rotation_copies(4 * bytes1, b.l2_bytes);
        let inputs = LazySets::new(b, [[bb, h, s, d]; 4], dtype, copies);
        for causal in [Causal::No, Causal::Yes] {
            let (mask, fwd_flops) = attention_mask_and_flops(causal, bb, h, s, d);
            let alibi = family == "attn_alibi";
            let params = AttentionParams {
                causal,
                softcap: (!alibi).then_some(50.0),
                alibi_slopes: alibi.then_some(&slopes),
                ..Default::default()
            };
            let tag = if alibi { "geometric" } else { "c50" };
            let name = format!("{family}/{dtype}/B{bb}H{h}S{s}D{d}/{tag}/{mask}");
            inputs.bench_passes(
                b,
                (&name, true),
                (4 * bytes1, 10 * bytes1),
                fwd_flops,
                |set, backward| attention_step(set, &params, backward),
            );
        }
    }
}

/// A packed variable-length batch against the dense batch of equal FLOPs (`attn_varlen`): 8
/// sequences of 2048, H16 D128 f16, packed `[8 * 2048, 16, 128]` through `flash_forward_varlen` /
/// `flash_backward_varlen` (`packed`) or `[8, 16, 2048, 128]` through `flash_forward` /
/// `flash_backward` (`dense`), both masks, forward and forward + backward. The goal: the packed
/// call within 5% of the dense one.
fn attention_varlen(b: &mut Bencher) {
    let quick = std::env::var("RGK_BENCH_QUICK").is_ok();
    let (bb, h, s, d) = if quick {
        (2, 4, 512, 64)
    } else {
        (8, 16, 2048, 128)
    };
    let dtype = DType::F16;
    let bytes1 = bb * h * s * d * dtype.size_bytes();
    let copies = rotation_copies(4 * bytes1, b.l2_bytes);
    let cu: Vec<usize> = (0..=bb).map(|i| i * s).collect();
    for layout in ["dense", "packed"] {
        let shape = if layout == "packed" {
            [1, bb * s, h, d]
        } else {
            [bb, h, s, d]
        };
        let inputs = LazySets::new(b, [shape; 4], dtype, copies);
        for causal in [Causal::No, Causal::Yes] {
            let (mask, fwd_flops) = attention_mask_and_flops(causal, bb, h, s, d);
            let params = AttentionParams {
                causal,
                scale: None,
                ..Default::default()
            };
            inputs.bench_passes(
                b,
                (
                    &format!("attn_varlen/{dtype}/B{bb}H{h}S{s}D{d}/{layout}/{mask}"),
                    true,
                ),
                (4 * bytes1, 10 * bytes1),
                fwd_flops,
                |set, backward| {
                    if layout == "packed" {
                        packed_step(set, &cu, &params, backward)
                    } else {
                        attention_step(set, &params, backward)
                    }
                },
            );
        }
    }
}

/// A packed batch of unequal lengths (`attn_varlen_mixed`): 16 sequences from 128 to 4096 keys
/// (`VARLEN_MIXED_LENS`, the lengths bench/peers.py gives SDPA as nested tensors), H16 D128 f16,
/// both masks, forward and forward + backward. FLOPs: the sum over the sequences.
const VARLEN_MIXED_LENS: [usize; 16] = [
    4096, 256, 1024, 3072, 512, 2048, 128, 3584, 768, 1536, 2560, 384, 1792, 3328, 640, 2816,
];

fn attention_varlen_mixed(b: &mut Bencher) {
    let quick = std::env::var("RGK_BENCH_QUICK").is_ok();
    let (h, d) = (16, 128);
    let lens: Vec<usize> = if quick {
        VARLEN_MIXED_LENS.iter().map(|&n| n / 8).collect()
    } else {
        VARLEN_MIXED_LENS.to_vec()
    };
    let dtype = DType::F16;
    let mut cu = vec![0];
    for n in &lens {
        cu.push(cu.last().copied().unwrap_or(0) + n);
    }
    let total = *cu.last().unwrap_or(&0);
    let bytes1 = total * h * d * dtype.size_bytes();
    let copies = rotation_copies(4 * bytes1, b.l2_bytes);
    let inputs = LazySets::new(b, [[1, total, h, d]; 4], dtype, copies);
    for causal in [Causal::No, Causal::Yes] {
        let mask = if causal == Causal::Yes {
            "causal"
        } else {
            "full"
        };
        let fwd_flops: u64 = lens
            .iter()
            .map(|&n| (4 * h * n * n * d) as u64 / if causal == Causal::Yes { 2 } else { 1 })
            .sum();
        let params = AttentionParams {
            causal,
            scale: None,
            ..Default::default()
        };
        inputs.bench_passes(
            b,
            (
                &format!("attn_varlen_mixed/{dtype}/N{}H{h}D{d}/{mask}", lens.len()),
                true,
            ),
            (4 * bytes1, 10 * bytes1),
            fwd_flops,
            |set, backward| packed_step(set, &cu, &params, backward),
        );
    }
}

/// FlashAttention backward (`attn_bwd`: the backward alone, from the forward's O and LSE computed
/// once) and forward + backward (`attn_fwdbwd`) at the shapes of bench/peers.py (ATTN_BWD_SHAPES),
/// both masks; f16 and bf16 for the backward in both modes (`attn_bwd`, the deterministic default;
/// `attn_bwd_nondet`) and for forward + backward. FLOPs: the backward 2.5x
/// the forward's `4 B H S^2 D` (halved when causal), forward + backward 3.5x (docs/math/attention.md).
/// Bytes: the backward reads Q, K, V, O, dO and writes dQ, dK, dV (8 tensors); forward + backward
/// adds the forward's 4.
///
/// The inputs (Q, K, V, dO: up to 2 GiB a shape) and the forward's outputs are made by the setup of
/// a bench that runs ([`Bencher::bench_prepared`]): a run filtered to other benches makes none.
/// FlashAttention backward at B1 H16 S32768 D128 f16, both masks (`attn_bwd/f16/B1H16S32768D128/*`):
/// time and the peak device memory of one call ([`peak_memory`]), next to SDPA's in bench/peers.py.
/// One input set (512 MiB), made on first use like [`attention_backward`]'s; few samples (a call
/// takes a large part of a second).
fn attention_backward_long(b: &mut Bencher) {
    use std::cell::{Cell, OnceCell};
    use std::rc::Rc;
    if std::env::var("RGK_BENCH_QUICK").is_ok() {
        return;
    }
    let (bb, h, s, d, dtype) = (1, 16, 32768, 128, DType::F16);
    let tensor = bb * h * s * d * dtype.size_bytes();
    for causal in [Causal::No, Causal::Yes] {
        let (mask, fwd_flops) = attention_mask_and_flops(causal, bb, h, s, d);
        let params = AttentionParams {
            causal,
            scale: None,
            ..Default::default()
        };
        let (gpu, seed): (Gpu, u64) = (b.gpu.clone(), b.rng.random());
        type Saved = ([Tensor; 4], (Tensor, Tensor));
        let state: Rc<OnceCell<Saved>> = Rc::new(OnceCell::new());
        let peak: Rc<Cell<Option<u64>>> = Rc::new(Cell::new(None));
        let (st, pk, g2) = (state.clone(), peak.clone(), gpu.clone());
        let setup = move || {
            let (x, (o, lse)) = st.get_or_init(|| {
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
                let n = bb * h * s * d;
                let x: [Tensor; 4] = std::array::from_fn(|_| {
                    let data: Vec<f32> = (0..n).map(|_| rng.random_range(-2.0f32..2.0)).collect();
                    let host = HostTensor::new(data, &[bb, h, s, d], dtype).expect("shape");
                    Tensor::from_host(&g2, &host).expect("upload")
                });
                let out = attn::flash_forward(&x[0], &x[1], &x[2], &params).expect("flash_forward");
                (x, out)
            });
            if pk.get().is_none() {
                pk.set(Some(peak_memory(&g2, || {
                    attn::flash_backward(&x[0], &x[1], &x[2], o, lse, &x[3], &params)
                        .expect("flash_backward")
                })));
            }
        };
        let st = state.clone();
        b.bench_prepared(
            spec(
                format!("attn_bwd/{dtype}/B{bb}H{h}S{s}D{d}/{mask}"),
                Some(8 * tensor as u64),
                Some(fwd_flops * 5 / 2),
            ),
            1,
            Samples::Few,
            setup,
            |_| {
                let (x, (o, lse)) = st.get().unwrap();
                attn::flash_backward(&x[0], &x[1], &x[2], o, lse, &x[3], &params)
                    .expect("flash_backward");
            },
        );
        // Measured in the setup of the run (none when a filter skipped the bench).
        if let (Some(p), Some(last)) = (peak.get(), b.specs.last_mut()) {
            last.peak_memory_bytes = Some(p);
        }
    }
}

fn attention_backward(b: &mut Bencher) {
    use std::cell::OnceCell;
    let quick = std::env::var("RGK_BENCH_QUICK").is_ok();
    let shapes: &[(usize, usize, usize, usize)] = if quick {
        &[(4, 8, 512, 64)]
    } else {
        &[
            (16, 16, 2048, 64),
            (16, 16, 2048, 128),
            (4, 16, 8192, 64),
            (4, 16, 8192, 128),
        ]
    };
    for dtype in [DType::F16, DType::BF16] {
        for &(bb, h, s, d) in shapes {
            let shape = [bb, h, s, d];
            let tensor = bb * h * s * d * dtype.size_bytes();
            let copies = rotation_copies(4 * tensor, b.l2_bytes);
            let inputs = LazySets::new(b, [shape; 4], dtype, copies);
            for causal in [Causal::No, Causal::Yes] {
                let (mask, fwd_flops) = attention_mask_and_flops(causal, bb, h, s, d);
                let params = AttentionParams {
                    causal,
                    scale: None,
                    ..Default::default()
                };
                let x = inputs.clone();
                let saved: OnceCell<Vec<(Tensor, Tensor)>> = OnceCell::new();
                let prepare = || {
                    saved.get_or_init(|| {
                        x.get()
                            .iter()
                            .map(|[q, k, v, _]| {
                                attn::flash_forward(q, k, v, &params).expect("flash_forward")
                            })
                            .collect()
                    });
                };
                // The default (deterministic) backward, and the same backward with dQ summed in
                // arrival order: what determinism costs.
                for (op, mode) in [
                    ("attn_bwd", attn::BackwardMode::Deterministic),
                    ("attn_bwd_nondet", attn::BackwardMode::Nondeterministic),
                ] {
                    b.bench_prepared(
                        spec(
                            format!("{op}/{dtype}/B{bb}H{h}S{s}D{d}/{mask}"),
                            Some(8 * tensor as u64),
                            Some(fwd_flops * 5 / 2),
                        ),
                        copies,
                        Samples::Default,
                        prepare,
                        |i| {
                            let ([q, k, v, d_o], (o, lse)) =
                                (&x.get()[i], &saved.get().unwrap()[i]);
                            attn::flash_backward_with(q, k, v, o, lse, d_o, &params, mode)
                                .expect("flash_backward_with");
                        },
                    );
                }
                let x = inputs.clone();
                b.bench_prepared(
                    spec(
                        format!("attn_fwdbwd/{dtype}/B{bb}H{h}S{s}D{d}/{mask}"),
                        Some(12 * tensor as u64),
                        Some(fwd_flops * 7 / 2),
                    ),
                    copies,
                    Samples::Default,
                    || {
                        x.get();
                    },
                    |i| attention_step(&x.get()[i], &params, true),
                );
            }
        }
    }
}

/// Clifford layers. Shapes swept: B in {1024, 4096, 8192} x N in {128, 512, 1024}, all 9 (one shape
/// with RGK_BENCH_QUICK), the same grid as bench/peers.py's CLIFFORD_SWEEP. Bytes counted: sgp forward
/// reads x, y and writes o (3 tensors of C*B*N f32); forward+backward adds the backward's minimum
/// (reads x, y, grad_out, o; writes grad_x, grad_y): 9 tensors. fcgp and Layer count FLOPs of their
/// matmuls (2 * pair-slots * B * N * N for the fc mixing, plus 2 * C * B * N * N for the Layer's
/// linear map; 3x that forward+backward). Same names and formulas as bench/peers.py. fcgp and Layer run at every shape but with [`Samples::Few`]: their
/// large shapes take tens of ms a call, and the default sampling would spend seconds on each. Every
/// Clifford bench also records the peak device memory of one call ([`peak_memory`]).
fn clifford(b: &mut Bencher) {
    let quick = std::env::var("RGK_BENCH_QUICK").is_ok();
    let shapes: Vec<(usize, usize)> = if quick {
        vec![(4096, 512)]
    } else {
        // The full {1024, 4096, 8192} x {128, 512, 1024} grid, like bench/peers.py's CLIFFORD_SWEEP.
        let mut v = Vec::new();
        for bb in [1024usize, 4096, 8192] {
            for n in [128usize, 512, 1024] {
                v.push((bb, n));
            }
        }
        v
    };
    for alg in [Algebra::Cl2, Algebra::Cl3] {
        let (c, d, p) = (alg.components(), alg.dims(), alg.paths());
        // Forward alone at the headline shape (the bandwidth target).
        {
            let (bb, n) = (4096usize, 512usize);
            let size = (c * bb * n * 4) as u64;
            let copies = rotation_copies(2 * size as usize, b.l2_bytes);
            let (x, y) = (
                b.inputs(&[c, bb, n], DType::F32, copies),
                b.inputs(&[c, bb, n], DType::F32, copies),
            );
            let w = b.inputs(&[n, p], DType::F32, 1);
            let gpu = b.gpu.clone();
            b.bench(
                spec_with_memory(
                    &gpu,
                    format!("sgp_fwd/f32/{d}d_B{bb}_N{n}"),
                    Some(3 * size),
                    None,
                    || cl::sgp_forward(&x[0], &y[0], &w[0], Normalize::Yes).expect("sgp_forward"),
                ),
                copies,
                |i| {
                    cl::sgp_forward(&x[i], &y[i], &w[0], Normalize::Yes).expect("sgp_forward");
                },
            );
        }
        for &(bb, n) in &shapes {
            let size = (c * bb * n * 4) as u64;
            let copies = rotation_copies(3 * size as usize, b.l2_bytes);
            let (x, y, go) = (
                b.inputs(&[c, bb, n], DType::F32, copies),
                b.inputs(&[c, bb, n], DType::F32, copies),
                b.inputs(&[c, bb, n], DType::F32, copies),
            );
            let w = b.inputs(&[n, p], DType::F32, 1);
            let gpu = b.gpu.clone();
            b.bench(
                spec_with_memory(
                    &gpu,
                    format!("sgp_fwdbwd/f32/{d}d_B{bb}_N{n}"),
                    Some(9 * size),
                    None,
                    || {
                        let f = cl::sgp_forward(&x[0], &y[0], &w[0], Normalize::Yes)
                            .expect("sgp_forward");
                        let g = cl::sgp_backward(&x[0], &y[0], &w[0], &f, &go[0])
                            .expect("sgp_backward");
                        (f, g)
                    },
                ),
                copies,
                |i| {
                    let f =
                        cl::sgp_forward(&x[i], &y[i], &w[0], Normalize::Yes).expect("sgp_forward");
                    cl::sgp_backward(&x[i], &y[i], &w[0], &f, &go[i]).expect("sgp_backward");
                },
            );
        }
    }
    // fcgp and the Layer in both GP modes after every sgp bench (a run cut short keeps the sgp
    // sweep), fewer samples each: forward+backward and forward, f32 rows at the default precision
    // (3xTF32), tf32 rows at `Precision::Tf32` (peers at 'high'). One set of random inputs a shape.
    for alg in [Algebra::Cl2, Algebra::Cl3] {
        for &(bb, n) in &shapes {
            let c = alg.components();
            let mut inputs = b.inputs(&[c, bb, n], DType::F32, 3);
            let ins = LayerInputs {
                go: inputs.remove(2),
                y: inputs.remove(1),
                x: inputs.remove(0),
            };
            for precision in [Precision::Tf32x3, Precision::Tf32] {
                for backward in [true, false] {
                    for kind in ["fcgp", "layer", "layerfc"] {
                        clifford_layer_bench(b, &ins, kind, alg, bb, n, backward, precision);
                    }
                }
            }
        }
    }
}

/// Random `(C, B, N)` inputs of the fcgp / Layer benches: x, y (fcgp's second input) and the upstream
/// gradient.
struct LayerInputs {
    x: Tensor,
    y: Tensor,
    go: Tensor,
}

/// One fcgp / Layer bench of [`clifford`]: the name, FLOPs and inputs of bench/peers.py's
/// `clifford_layer_case` (forward+backward counts 3x the forward's matmul FLOPs).
#[allow(clippy::too_many_arguments)]
fn clifford_layer_bench(
    b: &mut Bencher,
    ins: &LayerInputs,
    kind: &str,
    alg: Algebra,
    bb: usize,
    n: usize,
    backward: bool,
    precision: Precision,
) {
    let (c, d, p) = (alg.components(), alg.dims(), alg.paths());
    let slots: u64 = (0..alg.grades())
        .map(|g| {
            alg.grade_span(g).1 as u64
                * alg
                    .path_table()
                    .iter()
                    .filter(|t| t[1] as usize == g)
                    .count() as u64
        })
        .sum();
    let fc = kind != "layer";
    let flops = if fc {
        2 * slots * (bb * n * n) as u64
    } else {
        0
    } + if kind == "fcgp" {
        0
    } else {
        2 * (c * bb * n * n) as u64
    };
    let name = format!(
        "{kind}_{}/{}/{d}d_B{bb}_N{n}",
        if backward { "fwdbwd" } else { "fwd" },
        if precision == Precision::Tf32 {
            "tf32"
        } else {
            "f32"
        }
    );
    let (x, go) = (&ins.x, &ins.go);
    let gpu = b.gpu.clone();
    let flops = Some(flops * if backward { 3 } else { 1 });
    if kind == "fcgp" {
        let y = &ins.y;
        let wf = b.inputs(&[p, n, n], DType::F32, 1).remove(0);
        let call = || {
            let f =
                cl::fcgp_forward_with(x, y, &wf, Normalize::Yes, precision).expect("fcgp_forward");
            let g = backward.then(|| {
                cl::fcgp_backward_with(x, y, &wf, &f, go, precision).expect("fcgp_backward")
            });
            (f, g)
        };
        b.bench_sampled(
            spec_with_memory(&gpu, name, None, flops, call),
            1,
            Samples::Few,
            |_| {
                call();
            },
        );
        return;
    }
    let mode = if fc {
        GpMode::FullyConnected
    } else {
        GpMode::PerFeature
    };
    let params = cl::reference::LayerParams::init(alg, n, mode, Normalize::Yes, 7).expect("init");
    let layer = Layer::from_host(&b.gpu, &params)
        .expect("layer")
        .with_precision(precision);
    let call = || {
        let f = layer.forward(x).expect("layer forward");
        let g = backward.then(|| layer.backward(x, &f, go).expect("layer backward"));
        (f, g)
    };
    b.bench_sampled(
        spec_with_memory(&gpu, name, None, flops, call),
        1,
        Samples::Few,
        |_| {
            call();
        },
    );
}

fn main() {
    let gpu = match Gpu::new(0) {
        Ok(g) => g,
        Err(e) => return println!("SKIP benches: {e}"),
    };
    let started = SystemTime::now();
    let quick = std::env::var("RGK_BENCH_QUICK").is_ok();
    let mut c = Criterion::default()
        .with_measurement(GpuTime {
            stream: gpu.stream().clone(),
        })
        .sample_size(if quick { 10 } else { 20 })
        .warm_up_time(Duration::from_millis(if quick { 200 } else { 300 }))
        .measurement_time(Duration::from_millis(if quick { 500 } else { 1000 }))
        .without_plots()
        // Fewer bootstrap resamples than criterion's 100k: its own CIs are not what we report (the
        // report uses the raw samples), and the analysis time adds up over ~80 benches.
        .nresamples(10_000)
        .configure_from_args();
    let l2_bytes = gpu
        .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)
        .unwrap_or(50 << 20) as usize;
    let seed: u64 = std::env::var("RGK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed);
    println!("benches on {} (seed {seed})", gpu.name());
    let mut b = Bencher {
        c: &mut c,
        gpu: gpu.clone(),
        rng: rand::rngs::StdRng::seed_from_u64(seed),
        l2_bytes,
        specs: Vec::new(),
    };
    // `RGK_BENCH_FAMILIES=attention_gqa,ceilings` runs only those bench functions: most make their
    // inputs up front, so a name filter alone still spends minutes making inputs it never uses.
    let families = std::env::var("RGK_BENCH_FAMILIES").ok();
    let wanted = |name: &str| {
        families
            .as_deref()
            .is_none_or(|f| f.split(',').any(|x| x.trim() == name))
    };
    let all: [(&str, BenchFn); 20] = [
        ("ceilings", ceilings),
        ("matmuls", matmuls),
        ("elementwise", elementwise),
        ("reductions", reductions),
        ("softmaxes", softmaxes),
        ("layer_norms", layer_norms),
        ("embeddings", embeddings),
        ("relevance", relevance),
        ("attention", attention),
        ("attention_gqa", attention_gqa),
        ("attention_layouts", attention_layouts),
        ("attention_head_dims", attention_head_dims),
        ("attention_windows", attention_windows),
        ("attention_scores", attention_scores),
        ("attention_varlen", attention_varlen),
        ("attention_varlen_mixed", attention_varlen_mixed),
        ("attention_decode", attention_decode),
        ("attention_backward", attention_backward),
        ("attention_backward_long", attention_backward_long),
        ("clifford", clifford),
    ];
    for (name, family) in all {
        if wanted(name) {
            family(&mut b);
        }
    }
    let specs = std::mem::take(&mut b.specs);
    c.final_summary();

    let home = PathBuf::from(
        std::env::var("CRITERION_HOME").unwrap_or_else(|_| "target/criterion".into()),
    );
    // Only benches that ran in this process (a name filter skips the others; their old files stay).
    let fresh = |s: &BenchSpec| {
        let (g, id) = s.criterion_ids();
        let f = home
            .join(g)
            .join(id.replace('/', "_"))
            .join("new")
            .join("sample.json");
        std::fs::metadata(f)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t >= started)
    };
    let results: Vec<_> = specs
        .into_iter()
        .filter(fresh)
        .filter_map(|s| read_samples(&home, &s).ok().map(|v| (s, v)))
        .collect();
    let out = PathBuf::from(
        std::env::var("RGK_BENCH_JSON").unwrap_or_else(|_| "target/rgk-bench/ours.json".into()),
    );
    match write_json(&out, gpu.name(), &results) {
        Ok(()) => println!("wrote {} ({} benches)", out.display(), results.len()),
        Err(e) => eprintln!("could not write {}: {e}", out.display()),
    }
}
