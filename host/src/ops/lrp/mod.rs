//! Relevance propagation through linear layers (layer-wise relevance propagation as DL-Backtrace does
//! it; docs/math/lrp.md), batched over all rows, deterministic, and an end-to-end MLP
//! explanation ([`mlp`]).
//!
//! For a layer `y = W x + b` with `x: [.., I]`, `W: [O, I]`, optional `b: [O]`, and the relevance of its
//! outputs `relevance_out: [.., O]`, [`relevance`] returns `relevance_in: [.., I]` with, per row,
//! `relevance_in[i] = sum_j R_j * (c_i > 0 ? c_i / P' * Pa : c_i < 0 ? -c_i / N' * Na : 0)`,
//! `c_i = x_i W[j,i]`, saturation by [`Activation`] and aggregation exactly as docs/math/lrp.md orders them.
//!
//! How it runs (gpu/src/kernels/lrp.rs): per (row, j) the sums `A = sum |c_i|` and `S = sum c_i` in one
//! tiled GEMM pass (`P = (A+S)/2`, `N = (A-S)/2`); the per-(row, j) coefficient in f64; then
//! `relevance_in = |x| * (coef |W|)`, a second tiled GEMM. The GEMM passes run on the tensor cores in
//! "3xTF32" form (fp32-level accuracy, error bound in the kernel's module doc). Both are split along their depth
//! into a number of slices that depends on the shape only, and the slices are added in order: results
//! are bit-identical from run to run (no float atomics).
//!
//! Weights are checked for NaN/inf once, when a [`Linear`] is built (on the host for
//! [`Linear::from_host`], by a one-pass GPU count for [`Linear::new`]), not on every call: an explanation
//! reuses the same layer for every batch.
pub mod mlp;
pub mod reference;
#[cfg(test)]
mod tests;

use cudarc::driver::LaunchConfig;
use gpu::params::lrp as cfg;
use gpu::params::{LrpCoeff, LrpFinish, LrpGemm, RawSlice};

use crate::error::{Error, Result};
use crate::launch::{ByValue, grid_blocks, launch, launch_cfg_large_smem};
use crate::tensor::{HostTensor, Tensor};
use crate::{DType, Gpu};

/// How a layer's activation range saturates relevance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Monotonic: `T < lower` zeroes P, `T > upper` zeroes N.
    Mono,
    /// Non-monotonic: the same clamps, then ties `f(T) == f(P + pb)` / `f(T) == f(-(N + nb))`.
    NonMono,
    /// No activation information: no saturation.
    Null,
}

/// The activation function `f` a `NonMono` layer compares values of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Func {
    Identity,
    /// `1 / (1 + e^-x)`
    Sigmoid,
    /// `x * sigmoid(0.75 x)`
    Swish,
    /// `x * e / (e^-x + e^x)` (e the constant)
    Wave,
    /// `1 - tanh(x)^2`
    Pulse,
    /// `x * tanh(x)`
    Absolute,
    /// `clamp(0.2 x + 0.5, 0, 1)`
    HardSigmoid,
    Tanh,
}

impl Func {
    pub const ALL: [Func; 8] = [
        Func::Identity,
        Func::Sigmoid,
        Func::Swish,
        Func::Wave,
        Func::Pulse,
        Func::Absolute,
        Func::HardSigmoid,
        Func::Tanh,
    ];

    /// `f(x)` in f64 (the CPU reference's definition; the GPU evaluates the same formulas in f64).
    pub fn eval(self, x: f64) -> f64 {
        let sigmoid = |v: f64| 1.0 / (1.0 + (-v).exp());
        match self {
            Func::Identity => x,
            Func::Sigmoid => sigmoid(x),
            Func::Swish => x * sigmoid(0.75 * x),
            Func::Wave => x * std::f64::consts::E / ((-x).exp() + x.exp()),
            Func::Pulse => {
                let t = x.tanh();
                1.0 - t * t
            }
            Func::Absolute => x * x.tanh(),
            Func::HardSigmoid => (0.2 * x + 0.5).clamp(0.0, 1.0),
            Func::Tanh => x.tanh(),
        }
    }

    fn code(self) -> u32 {
        match self {
            Func::Identity => cfg::FUNC_IDENTITY,
            Func::Sigmoid => cfg::FUNC_SIGMOID,
            Func::Swish => cfg::FUNC_SWISH,
            Func::Wave => cfg::FUNC_WAVE,
            Func::Pulse => cfg::FUNC_PULSE,
            Func::Absolute => cfg::FUNC_ABSOLUTE,
            Func::HardSigmoid => cfg::FUNC_HARD_SIGMOID,
            Func::Tanh => cfg::FUNC_TANH,
        }
    }
}

/// A layer's activation description: saturation kind, range (missing = unbounded) and function.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Activation {
    pub kind: Kind,
    pub lower: Option<f32>,
    pub upper: Option<f32>,
    pub func: Func,
}

impl Activation {
    /// No activation information: no saturation.
    pub const fn null() -> Self {
        Activation {
            kind: Kind::Null,
            lower: None,
            upper: None,
            func: Func::Identity,
        }
    }
    /// tanh: mono, range [-2, 2].
    pub const fn tanh() -> Self {
        Activation {
            kind: Kind::Mono,
            lower: Some(-2.0),
            upper: Some(2.0),
            func: Func::Tanh,
        }
    }
    /// sigmoid: mono, range [-4, 4].
    pub const fn sigmoid() -> Self {
        Activation {
            kind: Kind::Mono,
            lower: Some(-4.0),
            upper: Some(4.0),
            func: Func::Sigmoid,
        }
    }
    /// relu: mono, lower bound 0.
    pub const fn relu() -> Self {
        Activation {
            kind: Kind::Mono,
            lower: Some(0.0),
            upper: None,
            func: Func::Identity,
        }
    }
    /// softmax: mono, range [-1, 2].
    pub const fn softmax() -> Self {
        Activation {
            kind: Kind::Mono,
            lower: Some(-1.0),
            upper: Some(2.0),
            func: Func::Identity,
        }
    }

    /// Bounds must not be NaN, and `lower <= upper` when both are given.
    pub fn validate(&self, op: &'static str) -> Result<()> {
        if self.lower.is_some_and(f32::is_nan) || self.upper.is_some_and(f32::is_nan) {
            return Err(Error::Invalid {
                op,
                msg: format!("activation bounds must not be NaN (got {self:?})"),
            });
        }
        if let (Some(l), Some(u)) = (self.lower, self.upper)
            && l > u
        {
            return Err(Error::Invalid {
                op,
                msg: format!("activation bounds: lower {l} > upper {u}"),
            });
        }
        Ok(())
    }

    /// Bounds as the kernels take them: missing = -inf / +inf.
    pub fn bounds(&self) -> (f32, f32) {
        (
            self.lower.unwrap_or(f32::NEG_INFINITY),
            self.upper.unwrap_or(f32::INFINITY),
        )
    }

    fn kind_code(&self) -> u32 {
        match self.kind {
            Kind::Mono => cfg::KIND_MONO,
            Kind::NonMono => cfg::KIND_NON_MONO,
            Kind::Null => cfg::KIND_NULL,
        }
    }
}

/// `(rows, in_features, out_features)` of a relevance call from the shapes, or the error that says
/// which shape disagrees. Shared by the GPU launcher and the CPU reference.
pub fn dims(
    op: &'static str,
    x: &[usize],
    relevance_out: &[usize],
    weight: &[usize],
    bias: Option<&[usize]>,
) -> Result<(usize, usize, usize)> {
    let [o, i] = *weight else {
        return Err(Error::Shape {
            op,
            what: "weight must be [out_features, in_features]".into(),
            expected: "rank 2".into(),
            got: weight.to_vec(),
        });
    };
    if let Some(b) = bias
        && b != [o]
    {
        return Err(Error::Shape {
            op,
            what: "bias must be [out_features]".into(),
            expected: format!("[{o}]"),
            got: b.to_vec(),
        });
    }
    let Some((&xi, lead)) = x.split_last() else {
        return Err(Error::Shape {
            op,
            what: "x must be [.., in_features]".into(),
            expected: format!("[.., {i}]"),
            got: x.to_vec(),
        });
    };
    if xi != i {
        return Err(Error::Shape {
            op,
            what: "x's last dim must equal the weight's in_features".into(),
            expected: format!("[.., {i}]"),
            got: x.to_vec(),
        });
    }
    let want: Vec<usize> = lead.iter().copied().chain([o]).collect();
    if relevance_out != want.as_slice() {
        return Err(Error::Shape {
            op,
            what: "relevance_out must be x's leading dims + [out_features]".into(),
            expected: format!("{want:?}"),
            got: relevance_out.to_vec(),
        });
    }
    Ok((lead.iter().product(), i, o))
}

/// A linear layer's parameters on the GPU, validated once: `weight: [O, I]`, `bias: [O]`, f32,
/// contiguous, finite.
#[derive(Clone, Debug)]
pub struct Linear {
    weight: Tensor,
    bias: Option<Tensor>,
}

impl Linear {
    /// Wraps device tensors, checking shapes, dtype, contiguity, and finiteness (one GPU pass over the
    /// weights, [`count_nonfinite`]).
    pub fn new(weight: Tensor, bias: Option<Tensor>) -> Result<Linear> {
        const OP: &str = "Linear::new";
        Self::check_layout(OP, &weight, bias.as_ref())?;
        for (what, t) in [("weight", Some(&weight)), ("bias", bias.as_ref())] {
            if let Some(t) = t {
                let count = count_nonfinite(t)?;
                if count > 0 {
                    return Err(Error::NonFinite {
                        op: OP,
                        what,
                        count,
                    });
                }
            }
        }
        Ok(Linear { weight, bias })
    }

    /// Uploads host parameters, checking finiteness on the host while they pass through.
    pub fn from_host(gpu: &Gpu, weight: &HostTensor, bias: Option<&HostTensor>) -> Result<Linear> {
        const OP: &str = "Linear::from_host";
        for (what, t) in [("weight", Some(weight)), ("bias", bias)] {
            if let Some(t) = t {
                let count = t.data.iter().filter(|v| !v.is_finite()).count() as u64;
                if count > 0 {
                    return Err(Error::NonFinite {
                        op: OP,
                        what,
                        count,
                    });
                }
            }
        }
        let weight = Tensor::from_host(gpu, weight)?;
        let bias = bias.map(|b| Tensor::from_host(gpu, b)).transpose()?;
        Self::check_layout(OP, &weight, bias.as_ref())?;
        Ok(Linear { weight, bias })
    }

    fn check_layout(op: &'static str, weight: &Tensor, bias: Option<&Tensor>) -> Result<()> {
        for (what, t) in [("weight", Some(weight)), ("bias", bias)] {
            let Some(t) = t else { continue };
            if t.dtype() != DType::F32 {
                return Err(Error::DType {
                    op,
                    expected: "f32".into(),
                    got: t.dtype(),
                });
            }
            t.require_contiguous(op, what)?;
            if !t.gpu().same_device(weight.gpu()) {
                return Err(Error::DeviceMismatch { op });
            }
        }
        let w = weight.shape();
        dims(
            op,
            &[w.get(1).copied().unwrap_or(0)],
            &[w.first().copied().unwrap_or(0)],
            w,
            bias.map(Tensor::shape),
        )?;
        Ok(())
    }

    pub fn weight(&self) -> &Tensor {
        &self.weight
    }
    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }
    pub fn in_features(&self) -> usize {
        self.weight.shape()[1]
    }
    pub fn out_features(&self) -> usize {
        self.weight.shape()[0]
    }
    pub fn gpu(&self) -> &Gpu {
        self.weight.gpu()
    }
}

/// Number of NaN/inf elements of an f32 tensor: one grid-stride pass (at most `CHECK_BLOCKS` blocks,
/// one partial count each) and a copy of the partials back. Reads the tensor once; synchronises.
pub fn count_nonfinite(t: &Tensor) -> Result<u64> {
    const OP: &str = "count_nonfinite";
    if t.dtype() != DType::F32 {
        return Err(Error::DType {
            op: OP,
            expected: "f32".into(),
            got: t.dtype(),
        });
    }
    t.require_contiguous(OP, "input")?;
    let n = t.numel() as u64;
    if n == 0 {
        return Ok(0);
    }
    let blocks = n.div_ceil(cfg::EW_BLOCK as u64).clamp(1, cfg::CHECK_BLOCKS) as u32;
    let partials = Tensor::empty(t.gpu(), &[blocks as usize], DType::F32)?;
    // The kernel reads exactly the tensor's elements (its buffer may be a larger token allocation).
    let x = RawSlice {
        ptr: t.raw().ptr,
        len: n,
    };
    launch(
        t.gpu(),
        "nonfinite_partials_f32",
        blocks,
        cfg::EW_BLOCK,
        &[&ByValue(x), &ByValue(partials.raw())],
    )?;
    Ok(partials.to_vec()?.iter().map(|&c| c as u64).sum())
}

/// The kernels that run relevance propagation's GEMM passes. Both ship: [`GemmVariant::V5`] where
/// its operands allow, [`GemmVariant::Staged`] otherwise; the selector ([`relevance_variant`],
/// [`dense_variant`]) lets the tests run either on every shape.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmVariant {
    /// `lrp_sums_f32`, `lrp_spread_f32`, `dense_f32`: 16-deep stages double buffered from registers,
    /// for operands that are not 16-byte granular (`I` or `O` not a multiple of 4, or an unaligned
    /// base).
    Staged,
    /// `lrp_sums_v5_f32`, `lrp_spread_v5_f32` (and `lrp_spread_v5_finish_f32`, the finish in its
    /// epilogue where the pass has one split), `dense_v5_f32` (`gpu::params::lrp::v3` tiles): 32-deep
    /// stages through a 4-buffer `cp.async` pipeline in dynamic shared memory, one fresh 3xTF32
    /// partial per stage, the split done by integer operations (`hi` as `cvt.rna.tf32.f32` would give
    /// it, `lo` truncated: error per product `5 2^-22` instead of `3 2^-22`). A pass whose operands do
    /// not allow it runs [`GemmVariant::Staged`]. Measured on an H100 (2026-11-26, the bundle of 624c403, the
    /// PyTorch peer in the same call): R1024 I=O=4096 1.930 ms (vectorised PyTorch 6.127: 3.17x); the
    /// other pipelines tried are in docs/PERF_NOTES.md ("Deleted kernels").
    V5,
}

impl GemmVariant {
    /// What [`relevance`], [`dense`] and [`mlp`] run where their operands allow it.
    pub const DEFAULT: GemmVariant = GemmVariant::V5;
    pub const ALL: [GemmVariant; 2] = [GemmVariant::Staged, GemmVariant::V5];
}

/// One of the tiled GEMM passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pass {
    /// `A = sum |x||W|`, `S = sum x W` per (row, output): B is `W` as `[N][K]`.
    Sums,
    /// `G = coef |W|` per (row, input): B is `W` as `[K][N]`.
    Spread,
    /// `x W^T` per (row, output): B is `W` as `[N][K]`.
    Dense,
}

impl Pass {
    /// The pass's kernel in `variant`.
    fn kernel(self, variant: GemmVariant) -> &'static str {
        use GemmVariant::{Staged, V5};
        match (self, variant) {
            (Pass::Sums, Staged) => "lrp_sums_f32",
            (Pass::Spread, Staged) => "lrp_spread_f32",
            (Pass::Dense, Staged) => "dense_f32",
            (Pass::Sums, V5) => "lrp_sums_v5_f32",
            (Pass::Spread, V5) => "lrp_spread_v5_f32",
            (Pass::Dense, V5) => "dense_v5_f32",
        }
    }

    /// Split workspaces the pass writes.
    fn outputs(self) -> usize {
        if self == Pass::Sums { 2 } else { 1 }
    }

    /// The operand half of [`Pass::v3_fits`]: 16-byte rows and bases.
    fn v3_rows_fit(self, a_ptr: u64, b_ptr: u64, n: u64, k: u64) -> bool {
        let b_row = if self == Pass::Spread { n } else { k };
        k.is_multiple_of(4)
            && b_row.is_multiple_of(4)
            && a_ptr.is_multiple_of(16)
            && b_ptr.is_multiple_of(16)
    }

    /// Whether the V5 pipeline can run this pass over an `m x n` output of depth `k` from `a`'s and `b`'s
    /// buffers (`a_ptr`, `b_ptr`): its `cp.async` copies need 16-byte rows (A's rows are `k` floats,
    /// B's `k`, or `n` in the spread pass, where `W` is `[K][N]`), 16-byte aligned bases, and a device
    /// that gives a block its shared memory.
    fn v3_fits(self, gpu: &Gpu, a_ptr: u64, b_ptr: u64, n: u64, k: u64) -> Result<bool> {
        if !self.v3_rows_fit(a_ptr, b_ptr, n, k) {
            return Ok(false);
        }
        let optin = gpu.attribute(
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
        )?;
        Ok(cfg::v3::smem_bytes(self == Pass::Spread) <= optin)
    }
}

/// The GEMM grid's `(column tiles, row tiles)` for an `m x n` output, or the error naming the
/// dimension past the grid's limits (rows: `MAX_GRID_Y` tiles; columns: `u32::MAX` tiles).
fn tile_grid(m: u64, n: u64) -> Result<(u32, u32)> {
    let row_tiles = m.div_ceil(cfg::BM);
    if row_tiles > cfg::MAX_GRID_Y {
        return Err(Error::TooLarge {
            op: "lrp",
            what: "rows",
            given: m,
            max: cfg::MAX_GRID_Y * cfg::BM,
        });
    }
    let col_tiles = u32::try_from(n.div_ceil(cfg::BN)).map_err(|_| Error::TooLarge {
        op: "lrp",
        what: "columns",
        given: n,
        max: u32::MAX as u64 * cfg::BN,
    })?;
    // row_tiles <= MAX_GRID_Y (65,535): no cast loss.
    Ok((col_tiles, row_tiles as u32))
}

/// The kernel `pass` runs on for `variant` (V5: where [`Pass::v3_fits`]).
fn pass_kernel(
    gpu: &Gpu,
    pass: Pass,
    variant: GemmVariant,
    (a_ptr, b_ptr): (u64, u64),
    (n, k): (u64, u64),
) -> Result<&'static str> {
    let fits = variant != GemmVariant::Staged && pass.v3_fits(gpu, a_ptr, b_ptr, n, k)?;
    Ok(pass.kernel(if fits { variant } else { GemmVariant::Staged }))
}

/// The kernels of the sums and spread passes [`relevance_variant`] launches for `x` (the spread pass
/// reads the coefficients from a fresh allocation, which is aligned), for tests that must know
/// whether a variant ran or fell back.
#[doc(hidden)]
pub fn relevance_kernels(
    layer: &Linear,
    x: &Tensor,
    variant: GemmVariant,
) -> Result<[&'static str; 2]> {
    let (i, o) = (layer.in_features() as u64, layer.out_features() as u64);
    let r = x.numel() as u64 / i.max(1);
    let (gpu, w) = (x.gpu(), layer.weight.raw().ptr);
    let spread = pass_kernel(gpu, Pass::Spread, variant, (0, w), (i, o))?;
    let spread = match finish_kernel(spread) {
        Some(fused) if finishes_in_epilogue(spread, (r, i, o)) => fused,
        _ => spread,
    };
    let sums = pass_kernel(gpu, Pass::Sums, variant, (x.raw().ptr, w), (o, i))?;
    Ok([sums, spread])
}

/// The spread kernel with the finish fused into its epilogue, for the spread kernel that has one (V5).
fn finish_kernel(spread_kernel: &str) -> Option<&'static str> {
    match spread_kernel {
        "lrp_spread_v5_f32" => Some("lrp_spread_v5_finish_f32"),
        _ => None,
    }
}

/// Whether the spread pass over `(m, n, k)` on `kernel` writes the finished relevance in its own
/// epilogue ([`finish_kernel`]): a spread kernel that has a fused form, with a single split.
fn finishes_in_epilogue(kernel: &str, (m, n, k): (u64, u64, u64)) -> bool {
    finish_kernel(kernel).is_some() && cfg::v3::split_k(m, n, k).0 == 1
}

/// The kernel of the GEMM pass [`dense_variant`] launches for `x`.
#[doc(hidden)]
pub fn dense_kernel(layer: &Linear, x: &Tensor, variant: GemmVariant) -> Result<&'static str> {
    let (i, o) = (layer.in_features() as u64, layer.out_features() as u64);
    let ptrs = (x.raw().ptr, layer.weight.raw().ptr);
    pass_kernel(x.gpu(), Pass::Dense, variant, ptrs, (o, i))
}

/// [`gemm_pass`] without a fused finish: the split workspaces and the split count.
fn split_pass(
    gpu: &Gpu,
    pass: Pass,
    variant: GemmVariant,
    a: &Tensor,
    b: &Tensor,
    mnk: (usize, usize, usize),
) -> Result<(Vec<Tensor>, u64)> {
    match gemm_pass(gpu, pass, variant, a, b, mnk, None)? {
        PassOutput::Splits(ws, splits) => Ok((ws, splits)),
        PassOutput::Finished => unreachable!("a pass finishes in its epilogue only when asked"),
    }
}

/// What one GEMM pass wrote.
enum PassOutput {
    /// Split partials (`splits` of `m x n` each), for a finishing kernel to add in split order.
    Splits(Vec<Tensor>, u64),
    /// The finished result, written by the pass's own epilogue (the fused spread + finish).
    Finished,
}

/// Launches one tiled GEMM pass over an `m x n` output of depth `k` (`variant`'s kernel where it fits,
/// else the staged one), into fresh split workspaces; returns them with the split count. With
/// `finish = Some((x, out))` (the spread pass), a pass that runs on V5's kernel with a single split
/// writes `out = |x| G` directly (`lrp_spread_v5_finish_f32`) and returns `Finished`.
fn gemm_pass(
    gpu: &Gpu,
    pass: Pass,
    variant: GemmVariant,
    a: &Tensor,
    b: &Tensor,
    (m, n, k): (usize, usize, usize),
    finish: Option<(&Tensor, &Tensor)>,
) -> Result<PassOutput> {
    let (m, n, k) = (m as u64, n as u64, k as u64);
    let (ar, br) = (a.raw(), b.raw());
    let kernel = pass_kernel(gpu, pass, variant, (ar.ptr, br.ptr), (n, k))?;
    // V5 runs the `cp.async` pipeline (`gpu::params::lrp::v3` tiles, split and shared memory).
    let v3 = kernel != pass.kernel(GemmVariant::Staged);
    let (splits, k_per_split) = if v3 {
        cfg::v3::split_k(m, n, k)
    } else {
        cfg::split_k(m, n, k)
    };
    let fused = finish.is_some() && pass == Pass::Spread && finishes_in_epilogue(kernel, (m, n, k));
    let (col_tiles, row_tiles) = tile_grid(m, n)?;
    let ws_len = usize::try_from(splits * m * n).map_err(|_| Error::TooLarge {
        op: "lrp",
        what: "workspace elements",
        given: u64::MAX,
        max: usize::MAX as u64,
    })?;
    let ws: Vec<Tensor> = if fused {
        Vec::new()
    } else {
        (0..pass.outputs())
            .map(|_| Tensor::empty(gpu, &[ws_len], DType::F32))
            .collect::<Result<_>>()?
    };
    let p = LrpGemm {
        rows: m,
        cols: n,
        depth: k,
        k_per_split,
    };
    let (ar, br) = (ByValue(ar), ByValue(br));
    let (kernel, wr): (_, Vec<ByValue<RawSlice>>) = match (finish, finish_kernel(kernel)) {
        // Arguments (coef, W, x, out, p): x in the place of the first workspace, out in the second.
        (Some((x, out)), Some(fused_kernel)) if fused => {
            (fused_kernel, vec![ByValue(x.raw()), ByValue(out.raw())])
        }
        _ => (kernel, ws.iter().map(|t| ByValue(t.raw())).collect()),
    };
    let pv = ByValue(p);
    let mut args: Vec<&dyn crate::launch::ArgPush> = vec![&ar, &br];
    args.extend(wr.iter().map(|w| w as &dyn crate::launch::ArgPush));
    args.push(&pv);
    let shared_mem_bytes = if v3 {
        cfg::v3::smem_bytes(pass == Pass::Spread)
    } else {
        0
    };
    launch_cfg_large_smem(
        gpu,
        kernel,
        LaunchConfig {
            grid_dim: (col_tiles, row_tiles, splits as u32),
            block_dim: (cfg::THREADS, 1, 1),
            shared_mem_bytes,
        },
        &args,
    )?;
    Ok(if fused {
        PassOutput::Finished
    } else {
        PassOutput::Splits(ws, splits)
    })
}

fn require_f32(op: &'static str, what: &'static str, t: &Tensor, layer: &Linear) -> Result<()> {
    if t.dtype() != DType::F32 {
        return Err(Error::DType {
            op,
            expected: format!("f32 ({what})"),
            got: t.dtype(),
        });
    }
    if !t.gpu().same_device(layer.gpu()) {
        return Err(Error::DeviceMismatch { op });
    }
    t.require_contiguous(op, what)
}

/// Relevance of `layer`'s inputs `x: [.., I]` given the relevance of its outputs
/// `relevance_out: [.., O]`, under activation `act`. All rows in one sequence of launches; f32 result of
/// `x`'s shape.
pub fn relevance(
    layer: &Linear,
    x: &Tensor,
    relevance_out: &Tensor,
    act: &Activation,
) -> Result<Tensor> {
    relevance_variant(layer, x, relevance_out, act, GemmVariant::DEFAULT)
}

/// [`relevance`] with its GEMM passes on `variant`'s kernels (`GemmVariant::DEFAULT` is exactly
/// [`relevance`]): same contract, results within the same error bound, bit-identical across runs.
#[doc(hidden)]
pub fn relevance_variant(
    layer: &Linear,
    x: &Tensor,
    relevance_out: &Tensor,
    act: &Activation,
    variant: GemmVariant,
) -> Result<Tensor> {
    const OP: &str = "lrp::relevance";
    require_f32(OP, "x", x, layer)?;
    require_f32(OP, "relevance_out", relevance_out, layer)?;
    act.validate(OP)?;
    let (r, i, o) = dims(
        OP,
        x.shape(),
        relevance_out.shape(),
        layer.weight.shape(),
        layer.bias.as_ref().map(Tensor::shape),
    )?;
    let gpu = x.gpu();
    let out = Tensor::empty(gpu, x.shape(), DType::F32)?;
    if r * i == 0 {
        return Ok(out);
    }
    if o == 0 {
        out.fill_bytes(0)?; // an empty sum over outputs
        return Ok(out);
    }
    let w = &layer.weight;
    let coef = Tensor::empty(gpu, &[r, o], DType::F32)?;
    let (lower, upper) = act.bounds();
    let bias_raw = layer.bias.as_ref().map(Tensor::raw).unwrap_or_default();
    let coeff_params = |splits| LrpCoeff {
        rows: r as u64,
        cols: o as u64,
        splits,
        has_bias: layer.bias.is_some() as u32,
        kind: act.kind_code(),
        func: act.func.code(),
        lower,
        upper,
        _pad: 0,
    };
    let coeffs = (coeff_params, bias_raw);
    sums_then_coefficients(
        gpu,
        variant,
        (x, w, relevance_out),
        &coef,
        (r, o, i),
        coeffs,
    )?;
    // Pass 2: G = coef |W| per (row, i), then relevance_in = |x| G (in the pass's epilogue when it
    // runs V5 in one split).
    let spread = (r, i, o);
    let finish = Some((x, &out));
    let PassOutput::Splits(ws, splits) = gemm_pass(
        gpu,
        Pass::Spread,
        variant,
        &coef,
        &layer.weight,
        spread,
        finish,
    )?
    else {
        return Ok(out);
    };
    let p = LrpFinish {
        rows: r as u64,
        cols: i as u64,
        splits,
        has_bias: 0,
        func: 0,
    };
    launch(
        gpu,
        "lrp_finish_f32",
        grid_blocks((r * i) as u64, cfg::EW_BLOCK as u64),
        cfg::EW_BLOCK,
        &[
            &ByValue(ws[0].raw()),
            &ByValue(x.raw()),
            &ByValue(out.raw()),
            &ByValue(p),
        ],
    )?;
    Ok(out)
}

/// Pass 1 as split workspaces of A and S, then `lrp_coeffs_f32` adds the splits and writes `coef` (`coeff_params(splits)` its parameters,
/// `bias_raw` the bias as it takes it).
fn sums_then_coefficients(
    gpu: &Gpu,
    variant: GemmVariant,
    (x, w, relevance_out): (&Tensor, &Tensor, &Tensor),
    coef: &Tensor,
    (r, o, i): (usize, usize, usize),
    (coeff_params, bias_raw): (impl Fn(u64) -> LrpCoeff, RawSlice),
) -> Result<()> {
    let (ws, splits) = split_pass(gpu, Pass::Sums, variant, x, w, (r, o, i))?;
    launch(
        gpu,
        "lrp_coeffs_f32",
        grid_blocks((r * o) as u64, cfg::EW_BLOCK as u64),
        cfg::EW_BLOCK,
        &[
            &ByValue(ws[0].raw()),
            &ByValue(ws[1].raw()),
            &ByValue(relevance_out.raw()),
            &ByValue(bias_raw),
            &ByValue(coef.raw()),
            &ByValue(coeff_params(splits)),
        ],
    )
}

/// The nonlinearity after a dense layer, for the forward pass of [`mlp`]; each has the preset
/// [`Activation`] for relevance listed in docs/math/lrp.md.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Nonlinearity {
    Linear,
    Relu,
    Tanh,
    Sigmoid,
    /// Softmax over the last dim.
    Softmax,
}

impl Nonlinearity {
    /// The preset of docs/math/lrp.md: tanh mono [-2, 2], sigmoid mono [-4, 4], relu mono lower 0, softmax mono
    /// [-1, 2]; a linear layer has no activation information.
    pub fn preset(self) -> Activation {
        match self {
            Nonlinearity::Linear => Activation::null(),
            Nonlinearity::Relu => Activation::relu(),
            Nonlinearity::Tanh => Activation::tanh(),
            Nonlinearity::Sigmoid => Activation::sigmoid(),
            Nonlinearity::Softmax => Activation::softmax(),
        }
    }

    fn code(self) -> u32 {
        match self {
            Nonlinearity::Linear | Nonlinearity::Softmax => cfg::FWD_LINEAR,
            Nonlinearity::Relu => cfg::FWD_RELU,
            Nonlinearity::Tanh => cfg::FWD_TANH,
            Nonlinearity::Sigmoid => cfg::FWD_SIGMOID,
        }
    }
}

/// Forward pass of a dense layer: `f(x W^T + b)` for `x: [.., I]`, result `[.., O]` (the same tiled
/// kernel as the relevance sums, then an epilogue; softmax runs as its own op).
pub fn dense(layer: &Linear, x: &Tensor, f: Nonlinearity) -> Result<Tensor> {
    dense_variant(layer, x, f, GemmVariant::DEFAULT)
}

/// [`dense`] with its GEMM pass on `variant`'s kernel (`GemmVariant::DEFAULT` is exactly [`dense`]).
#[doc(hidden)]
pub fn dense_variant(
    layer: &Linear,
    x: &Tensor,
    f: Nonlinearity,
    variant: GemmVariant,
) -> Result<Tensor> {
    const OP: &str = "lrp::dense";
    require_f32(OP, "x", x, layer)?;
    let (i, o) = (layer.in_features(), layer.out_features());
    let mut out_shape = x.shape().to_vec();
    match out_shape.last_mut() {
        Some(last) if *last == i => *last = o,
        _ => {
            return Err(Error::Shape {
                op: OP,
                what: "x's last dim must equal the weight's in_features".into(),
                expected: format!("[.., {i}]"),
                got: x.shape().to_vec(),
            });
        }
    }
    let r = x.numel() / i.max(1);
    let gpu = x.gpu();
    let y = Tensor::empty(gpu, &out_shape, DType::F32)?;
    if r * o == 0 {
        return Ok(y);
    }
    let p = |splits| LrpFinish {
        rows: r as u64,
        cols: o as u64,
        splits,
        has_bias: layer.bias.is_some() as u32,
        func: f.code(),
    };
    let bias_raw = layer.bias.as_ref().map(Tensor::raw).unwrap_or_default();
    if i == 0 {
        // An empty sum: y = f(b) (or f(0)); a one-split zero workspace gives the epilogue that.
        let zeros = Tensor::zeros(gpu, &[r * o], DType::F32)?;
        launch(
            gpu,
            "dense_finish_f32",
            grid_blocks((r * o) as u64, cfg::EW_BLOCK as u64),
            cfg::EW_BLOCK,
            &[
                &ByValue(zeros.raw()),
                &ByValue(bias_raw),
                &ByValue(y.raw()),
                &ByValue(p(1)),
            ],
        )?;
    } else {
        let (ws, splits) = split_pass(gpu, Pass::Dense, variant, x, &layer.weight, (r, o, i))?;
        launch(
            gpu,
            "dense_finish_f32",
            grid_blocks((r * o) as u64, cfg::EW_BLOCK as u64),
            cfg::EW_BLOCK,
            &[
                &ByValue(ws[0].raw()),
                &ByValue(bias_raw),
                &ByValue(y.raw()),
                &ByValue(p(splits)),
            ],
        )?;
    }
    if f == Nonlinearity::Softmax {
        return crate::ops::softmax::softmax(&y);
    }
    Ok(y)
}
