//! Attention forward: `O = softmax(scale * Q K^T + mask) V` per (batch, head), and the row
//! log-sum-exp `LSE = ln sum_j exp(scale * q_i . k_j)` over the visible keys (what backward needs).
//!
//! - Layout: Q `[batch, heads, seq_q, head_dim]`, K and V `[batch, heads, seq_k, head_dim]`, all
//!   contiguous. `[batch, seq, heads, head_dim]` is **not** accepted, either as a rank-4 tensor of that
//!   shape (its dims would be misread, so pass `x.transpose(1, 2)?.contiguous()?`) or as a transposed
//!   view (rejected as non-contiguous).
//! - Outputs: O `[batch, heads, seq_q, head_dim]` in the input dtype, LSE `[batch, heads, seq_q]` f32.
//! - `scale` defaults to `1 / sqrt(head_dim)`; any finite value is accepted.
//! - Causal: query `i` sees key `j` iff `j <= i + seq_k - seq_q` (the mask is aligned to the
//!   bottom-right corner when `seq_q != seq_k`, as in PyTorch's SDPA and FlashAttention). A query that
//!   sees no key (causal with `seq_q > seq_k`, or `seq_k = 0`) gets O = 0 and LSE = -inf, never NaN.
//! - [`flash_forward`]: the FlashAttention-2 kernel; f16/bf16, head dims [`FLASH_HEAD_DIMS`].
//!   [`naive_forward`]: scores materialised in a scratch buffer of `seq_q * seq_k` f32 per head,
//!   f32/f16/bf16, head dims 1..=256; the readable GPU reference.
//! - Both are cheap to call repeatedly on the same inputs: validation is O(rank), the launch is one
//!   kernel (the naive path: one per chunk of heads), and outputs are fresh allocations.
//! - [`naive_backward`]: dQ, dK, dV from dO through the materialised scores (P and dS in f32
//!   scratch), same inputs and masking as [`naive_forward`]; gradients in the input dtype, f32 math.
//!   Rows that see no key contribute nothing: their dQ is 0 and they add 0 to dK and dV (never NaN).
//!
//! ```no_run
//! use host::ops::attention::{self, AttentionParams, Causal};
//! use host::{DType, Gpu, Tensor};
//! # fn main() -> host::Result<()> {
//! let gpu = Gpu::new(0)?;
//! let q = Tensor::from_f32(&gpu, &vec![0.1; 2 * 4 * 100 * 64], &[2, 4, 100, 64], DType::F16)?;
//! let kv = Tensor::from_f32(&gpu, &vec![0.2; 2 * 4 * 300 * 64], &[2, 4, 300, 64], DType::F16)?;
//! let params = AttentionParams { causal: Causal::Yes, scale: None };
//! let (o, lse) = attention::flash_forward(&q, &kv, &kv, &params)?;
//! assert_eq!((o.shape(), lse.shape()), (&[2, 4, 100, 64][..], &[2, 4, 100][..]));
//! # Ok(()) }
//! ```
use cudarc::driver::LaunchConfig;
pub use gpu::params::attention::FLASH_HEAD_DIMS;
use gpu::params::attention::{
    AttentionShape, FLASH_WG_D64_Q64, FlashWgmmaConfig, MAX_SEQ, MaskKind,
    flash_config, flash_wgmma_config, naive,
};

use crate::DType;
use crate::error::{Error, Result};
use crate::kernel_name;
use crate::launch::{ByValue, launch_cfg, launch_cfg_large_smem};
use crate::ops::{aligned16, same_device_and_dtype};
use crate::tensor::Tensor;

/// Whether query `i` is limited to keys `j <= i + seq_k - seq_q`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Causal {
    #[default]
    No,
    Yes,
}

/// Options of an attention call.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AttentionParams {
    pub causal: Causal,
    /// Multiplies `Q K^T`; `None` means `1 / sqrt(head_dim)`.
    pub scale: Option<f32>,
}

/// The problem size of a validated call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    pub batch: usize,
    pub heads: usize,
    pub seq_q: usize,
    pub seq_k: usize,
    pub head_dim: usize,
}

/// Gradients of an attention call: dQ `[batch, heads, seq_q, head_dim]`, dK and dV
/// `[batch, heads, seq_k, head_dim]`. `T` is [`Tensor`] on the GPU path, `HostTensor` from the
/// reference.
#[derive(Clone, Debug)]
pub struct AttentionGrads<T = Tensor> {
    pub dq: T,
    pub dk: T,
    pub dv: T,
}

/// Which kernel a call is validated for (dtype and head-dim support differ).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    Flash,
    Naive,
}

const GRID_YZ_MAX: usize = 65535;

/// Checks ranks and the agreement of Q, K and V shapes (shared by the GPU paths and the references).
pub fn dims(op: &'static str, q: &[usize], k: &[usize], v: &[usize]) -> Result<Dims> {
    for (name, s) in [("q", q), ("k", k), ("v", v)] {
        if s.len() != 4 {
            return Err(Error::Shape {
                op,
                what: format!(
                    "{name} must be [batch, heads, seq, head_dim]; [batch, seq, heads, head_dim] is \
                     not supported (pass x.transpose(1, 2)?.contiguous()?)"
                ),
                expected: "rank 4".into(),
                got: s.to_vec(),
            });
        }
    }
    let (b, h, d) = (q[0], q[1], q[3]);
    if k[0] != b || k[1] != h || k[3] != d {
        return Err(Error::Shape {
            op,
            what: "k must match q in batch, heads and head_dim".into(),
            expected: format!("[{b}, {h}, seq_k, {d}]"),
            got: k.to_vec(),
        });
    }
    if v != k {
        return Err(Error::Shape {
            op,
            what: "v must have the shape of k (same batch, heads, seq_k and head_dim)".into(),
            expected: format!("{k:?}"),
            got: v.to_vec(),
        });
    }
    let dims = Dims {
        batch: b,
        heads: h,
        seq_q: q[2],
        seq_k: k[2],
        head_dim: d,
    };
    for (what, given) in [("seq_q", dims.seq_q), ("seq_k", dims.seq_k)] {
        if given > MAX_SEQ {
            return Err(Error::TooLarge {
                op,
                what,
                given: given as u64,
                max: MAX_SEQ as u64,
            });
        }
    }
    Ok(dims)
}

/// The scale to use: the given one (must be finite) or `1 / sqrt(head_dim)`.
pub fn scale(op: &'static str, params: &AttentionParams, head_dim: usize) -> Result<f32> {
    match params.scale {
        Some(s) if !s.is_finite() => Err(Error::Invalid {
            op,
            msg: format!("scale must be finite, got {s}"),
        }),
        Some(s) => Ok(s),
        None => Ok((1.0 / (head_dim.max(1) as f64).sqrt()) as f32),
    }
}

/// What validation needs to know about an operand, so the rules are testable without a GPU.
#[derive(Clone, Copy, Debug)]
struct Operand<'a> {
    name: &'static str,
    shape: &'a [usize],
    strides: &'a [usize],
    dtype: DType,
    contiguous: bool,
    aligned16: bool,
}

impl<'a> Operand<'a> {
    fn of(name: &'static str, t: &'a Tensor) -> Self {
        Operand {
            name,
            shape: t.shape(),
            strides: t.strides(),
            dtype: t.dtype(),
            contiguous: t.is_contiguous(),
            aligned16: aligned16(&[t]),
        }
    }
}

fn validate(
    op: &'static str,
    path: Path,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    params: &AttentionParams,
) -> Result<(Dims, f32)> {
    same_device_and_dtype(op, q, k)?;
    same_device_and_dtype(op, q, v)?;
    let ops = [
        Operand::of("q", q),
        Operand::of("k", k),
        Operand::of("v", v),
    ];
    validate_operands(op, path, &ops, params)
}

/// Every rule except "same device": ranks and shapes, dtypes, head dim, contiguity, alignment, sizes.
fn validate_operands(
    op: &'static str,
    path: Path,
    [q, k, v]: &[Operand; 3],
    params: &AttentionParams,
) -> Result<(Dims, f32)> {
    let d = dims(op, q.shape, k.shape, v.shape)?;
    for x in [k, v] {
        if x.dtype != q.dtype {
            return Err(Error::DType {
                op,
                expected: format!("{} (q's dtype) for {}", q.dtype, x.name),
                got: x.dtype,
            });
        }
    }
    match (path, q.dtype) {
        (_, DType::F16 | DType::BF16) | (Path::Naive, DType::F32) => {}
        (Path::Flash, got) => {
            return Err(Error::DType {
                op,
                expected: "f16 or bf16 (f32 is supported by naive_forward only)".into(),
                got,
            });
        }
    }
    let supported = match path {
        Path::Flash => FLASH_HEAD_DIMS.contains(&d.head_dim),
        Path::Naive => (1..=naive::MAX_HEAD_DIM).contains(&d.head_dim),
    };
    if !supported {
        return Err(Error::Invalid {
            op,
            msg: match path {
                Path::Flash => format!(
                    "head_dim {} has no FlashAttention kernel; supported head dims: {FLASH_HEAD_DIMS:?} \
                     (naive_forward takes 1..={})",
                    d.head_dim,
                    naive::MAX_HEAD_DIM
                ),
                Path::Naive => format!(
                    "head_dim {} is not supported by naive_forward; supported: 1..={}",
                    d.head_dim,
                    naive::MAX_HEAD_DIM
                ),
            },
        });
    }
    for x in [q, k, v] {
        if !x.contiguous {
            return Err(Error::NotContiguous {
                op,
                what: x.name,
                shape: x.shape.to_vec(),
                strides: x.strides.to_vec(),
            });
        }
        if path == Path::Flash && !x.aligned16 {
            return Err(Error::Invalid {
                op,
                msg: format!(
                    "{} must start at a 16-byte aligned address (a view at an odd offset?)",
                    x.name
                ),
            });
        }
    }
    for (what, given) in [("batch", d.batch), ("heads", d.heads)] {
        if given > GRID_YZ_MAX {
            return Err(Error::TooLarge {
                op,
                what,
                given: given as u64,
                max: GRID_YZ_MAX as u64,
            });
        }
    }
    Ok((d, scale(op, params, d.head_dim)?))
}

/// The upstream gradient dO of a backward call: q's shape, dtype and contiguity.
fn validate_grad_output(op: &'static str, q: &Operand, d_o: &Operand) -> Result<()> {
    if d_o.shape != q.shape {
        return Err(Error::Shape {
            op,
            what: format!("{} (the gradient of O) must have q's shape", d_o.name),
            expected: format!("{:?}", q.shape),
            got: d_o.shape.to_vec(),
        });
    }
    if d_o.dtype != q.dtype {
        return Err(Error::DType {
            op,
            expected: format!("{} (q's dtype) for {}", q.dtype, d_o.name),
            got: d_o.dtype,
        });
    }
    if !d_o.contiguous {
        return Err(Error::NotContiguous {
            op,
            what: d_o.name,
            shape: d_o.shape.to_vec(),
            strides: d_o.strides.to_vec(),
        });
    }
    Ok(())
}

fn shape_param(d: &Dims, params: &AttentionParams, scale: f32, bh_offset: usize) -> AttentionShape {
    // Every value was bounded by `validate` (seq <= 2^30, batch and heads <= 65535, head_dim <= 256).
    AttentionShape {
        batch: d.batch as u32,
        heads: d.heads as u32,
        seq_q: d.seq_q as u32,
        seq_k: d.seq_k as u32,
        head_dim: d.head_dim as u32,
        mask: match params.causal {
            Causal::No => MaskKind::None,
            Causal::Yes => MaskKind::Causal,
        },
        scale,
        bh_offset: bh_offset as u32,
    }
}

/// Fresh O and LSE tensors (poisoned in test mode).
fn outputs(q: &Tensor, d: &Dims) -> Result<(Tensor, Tensor)> {
    let o = Tensor::empty(q.gpu(), &[d.batch, d.heads, d.seq_q, d.head_dim], q.dtype())?;
    let lse = Tensor::empty(q.gpu(), &[d.batch, d.heads, d.seq_q], DType::F32)?;
    Ok((o, lse))
}

fn flash_kernel(head_dim: usize, dtype: DType) -> Option<&'static str> {
    Some(match (head_dim, dtype) {
        (64, DType::F16) => "flash_fwd_d64_f16",
        (64, DType::BF16) => "flash_fwd_d64_bf16",
        (128, DType::F16) => "flash_fwd_d128_f16",
        (128, DType::BF16) => "flash_fwd_d128_bf16",
        _ => return None,
    })
}

/// FlashAttention forward: returns `(O, LSE)`. f16/bf16, head dims [`FLASH_HEAD_DIMS`]. With the
/// sm_90 build (compute capability 9.0: H100/H200) it runs the Hopper `wgmma` kernels (see
/// [`flash_wgmma_variant`] for which), with the sm_80 build the `mma.sync` FlashAttention-2 kernel;
/// both keep the same contract.
pub fn flash_forward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    params: &AttentionParams,
) -> Result<(Tensor, Tensor)> {
    const OP: &str = "attention::flash_forward";
    let (d, scale) = validate(OP, Path::Flash, q, k, v, params)?;
    let variant = flash_wgmma_variant(q.gpu(), &d, params);
    flash_launch(OP, q, k, v, params, &d, scale, variant)
}

/// The FlashAttention kernel [`flash_forward`] runs (0: the `mma.sync` kernel of the sm_80 build),
/// chosen from H100 measurements (2026-11-26, commits 00fbcc5 and eb3702d, f16 and bf16 alike; every
/// default row was faster than SDPA's flash backend, 1.15x to 1.26x):
/// - D = 128: variant 1 (S2048: 1.480 ms vs the overlapped schedule's 1.537; S8192 5.712 vs 5.790).
/// - D = 64 when 128-row CTAs would not fill the chip twice over (fewer than two per SM): variant 4,
///   one warpgroup (64 rows) a CTA, so twice the CTAs share the SMs. Seed shape B4 H8 S512 (128
///   CTAs of 128 rows on 132 SMs): 11.3 us vs 12.2 for 128-row CTAs with 128-key tiles, cuDNN 11.8.
/// - D = 64 otherwise: variant 2 causal (S2048: 0.487 vs variant 1's 0.493), variant 1 unmasked
///   (0.843 vs 0.860); variant 4 was 5-6% slower there.
fn flash_wgmma_variant(gpu: &crate::Gpu, d: &Dims, params: &AttentionParams) -> u32 {
    if gpu.ptx_arch() != "sm_90" {
        return 0;
    }
    let ctas_of_128_rows = d.seq_q.div_ceil(128) as u64 * d.heads as u64 * d.batch as u64;
    let sms = gpu.sm_count().unwrap_or(0) as u64;
    match (d.head_dim, params.causal) {
        (128, _) => 1,
        (64, _) if ctas_of_128_rows < 2 * sms => 4,
        (64, Causal::Yes) => 2,
        (64, Causal::No) => 1,
        _ => 0,
    }
}

/// FlashAttention variant `variant` (0: the `mma.sync` FlashAttention-2 kernel; 1..=[`FLASH_VARIANTS`]:
/// wgmma, on a device that runs it) on validated inputs: one CTA per (query block, head, batch).
#[allow(clippy::too_many_arguments)]
fn flash_launch(
    op: &'static str,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    params: &AttentionParams,
    d: &Dims,
    scale: f32,
    variant: u32,
) -> Result<(Tensor, Tensor)> {
    // (kernel, query rows a CTA, threads, dynamic shared memory bytes)
    let kernel = if variant == 0 {
        flash_config(d.head_dim)
            .zip(flash_kernel(d.head_dim, q.dtype()))
            .map(|(c, name)| (name, c.block_q, c.threads(), c.smem_bytes()))
    } else {
        flash_wgmma_kernel(variant, d.head_dim, q.dtype())
            .map(|(c, name)| (name, c.block_q, c.threads(), c.smem_bytes()))
    };
    let Some((name, block_q, threads, smem)) = kernel else {
        unreachable!("validate accepts only head dims and dtypes with a kernel")
    };
    let (o, lse) = outputs(q, d)?;
    if d.batch * d.heads * d.seq_q == 0 {
        return Ok((o, lse));
    }
    let q_blocks = u32::try_from(d.seq_q.div_ceil(block_q)).map_err(|_| Error::TooLarge {
        op,
        what: "query blocks",
        given: d.seq_q.div_ceil(block_q) as u64,
        max: u32::MAX as u64,
    })?;
    let launch = LaunchConfig {
        grid_dim: (q_blocks, d.heads as u32, d.batch as u32),
        block_dim: (threads as u32, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    launch_cfg_large_smem(
        q.gpu(),
        name,
        launch,
        &[
            &ByValue(q.raw()),
            &ByValue(k.raw()),
            &ByValue(v.raw()),
            &ByValue(o.raw()),
            &ByValue(lse.raw()),
            &ByValue(shape_param(d, params, scale, 0)),
        ],
    )?;
    Ok((o, lse))
}

/// The wgmma (Hopper) kernel of variant 1 (plain schedule, D 64 and 128), 2 (overlapped, D = 64) or
/// 4 (overlapped, one warpgroup of 64 query rows a CTA, 128-key tiles, D = 64) for a head dim and
/// dtype, with its config.
fn flash_wgmma_kernel(
    variant: u32,
    head_dim: usize,
    dtype: DType,
) -> Option<(FlashWgmmaConfig, &'static str)> {
    let name = match (variant, head_dim, dtype) {
        (1, 64, DType::F16) => "flash_wg_fwd_d64_f16",
        (1, 64, DType::BF16) => "flash_wg_fwd_d64_bf16",
        (1, 128, DType::F16) => "flash_wg_fwd_d128_f16",
        (1, 128, DType::BF16) => "flash_wg_fwd_d128_bf16",
        (2, 64, DType::F16) => "flash_wg2_fwd_d64_f16",
        (2, 64, DType::BF16) => "flash_wg2_fwd_d64_bf16",
        (4, 64, DType::F16) => "flash_wg4_fwd_d64_f16",
        (4, 64, DType::BF16) => "flash_wg4_fwd_d64_bf16",
        _ => return None,
    };
    let cfg = match (variant, head_dim) {
        (4, 64) => FLASH_WG_D64_Q64,
        _ => flash_wgmma_config(head_dim)?,
    };
    Some((cfg, name))
}

/// The FlashAttention kernels [`flash_forward_variant`] can select: 0 the `mma.sync` kernel (sm_80
/// build), 1, 2 and 4 the wgmma kernels (sm_90 build; 2 and 4 at D = 64 only). Each is what
/// [`flash_forward`] runs for some shape; the selector lets the tests cover every kernel on every
/// shape.
#[doc(hidden)]
pub const FLASH_VARIANTS: [u32; 4] = [0, 1, 2, 4];

/// Whether `gpu` runs FlashAttention kernel `variant` at head dim `head_dim`: 0 with the sm_80 build
/// (see `Build::Portable` to run it on a 9.0 device), the wgmma kernels with the sm_90 build.
#[doc(hidden)]
pub fn flash_variant_supported(gpu: &crate::Gpu, variant: u32, head_dim: usize) -> bool {
    match variant {
        0 => gpu.ptx_arch() == "sm_80",
        1 => gpu.ptx_arch() == "sm_90",
        2 | 4 => gpu.ptx_arch() == "sm_90" && head_dim == 64,
        _ => false,
    }
}

/// [`flash_forward`] on FlashAttention kernel `variant` (see [`FLASH_VARIANTS`]), for tests that cover
/// every shipped kernel on every shape. Same validation, outputs and masking contract; an error
/// (never a fallback) for a variant this handle's build or this head dim does not have.
#[doc(hidden)]
pub fn flash_forward_variant(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    params: &AttentionParams,
    variant: u32,
) -> Result<(Tensor, Tensor)> {
    const OP: &str = "attention::flash_forward_variant";
    let (d, scale) = validate(OP, Path::Flash, q, k, v, params)?;
    if !flash_variant_supported(q.gpu(), variant, d.head_dim) {
        return Err(Error::Invalid {
            op: OP,
            msg: format!(
                "no FlashAttention kernel {variant} at head dim {} in the {} build (kernels: 0 in \
                 the sm_80 build; 1 in the sm_90 build; 2 and 4 there at head dim 64)",
                d.head_dim,
                q.gpu().ptx_arch()
            ),
        });
    }
    flash_launch(OP, q, k, v, params, &d, scale, variant)
}

/// Naive attention forward (scores materialised, f32 math): returns `(O, LSE)`. f32/f16/bf16,
/// head dims 1..=256. Uses a scratch buffer of up to 2^28 f32 (launching heads in chunks).
pub fn naive_forward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    params: &AttentionParams,
) -> Result<(Tensor, Tensor)> {
    const OP: &str = "attention::naive_forward";
    let (d, scale) = validate(OP, Path::Naive, q, k, v, params)?;
    let (o, lse) = outputs(q, &d)?;
    let heads_total = d.batch * d.heads;
    if heads_total * d.seq_q == 0 {
        return Ok((o, lse));
    }
    let per_head = (d.seq_q * d.seq_k).max(1);
    let chunk = (naive::MAX_SCRATCH_ELEMS / per_head).clamp(1, GRID_YZ_MAX.min(heads_total));
    let scratch = Tensor::empty(q.gpu(), &[chunk * per_head], DType::F32)?;
    let grid_x = u32::try_from(d.seq_q).map_err(|_| Error::TooLarge {
        op: OP,
        what: "seq_q",
        given: d.seq_q as u64,
        max: u32::MAX as u64,
    })?;
    for first in (0..heads_total).step_by(chunk) {
        let count = chunk.min(heads_total - first);
        let launch = LaunchConfig {
            grid_dim: (grid_x, count as u32, 1),
            block_dim: (naive::BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        launch_cfg(
            q.gpu(),
            kernel_name!("attention_naive", q.dtype()),
            launch,
            &[
                &ByValue(q.raw()),
                &ByValue(k.raw()),
                &ByValue(v.raw()),
                &ByValue(o.raw()),
                &ByValue(lse.raw()),
                &ByValue(scratch.raw()),
                &ByValue(shape_param(&d, params, scale, first)),
            ],
        )?;
    }
    Ok((o, lse))
}

/// Naive attention backward: `(dQ, dK, dV)` for upstream gradient `d_o` (O's shape and dtype), with
/// the inputs and `params` of the [`naive_forward`] call. The scores are recomputed (no saved state):
/// `S = scale Q K^T` (masked), `P = softmax(S)`, `dV = P^T dO`, `dP = dO V^T`,
/// `dS = P * (dP - rowsum(dP * P))`, `dQ = scale dS K`, `dK = scale dS^T Q`, all in f32; outputs in
/// the input dtype. f32/f16/bf16, head dims 1..=256. Uses two f32 scratch matrices of
/// `seq_q * seq_k` per head (up to 2^28 f32 in all; heads launched in chunks). Deterministic.
pub fn naive_backward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    d_o: &Tensor,
    params: &AttentionParams,
) -> Result<AttentionGrads> {
    const OP: &str = "attention::naive_backward";
    let (d, scale) = validate(OP, Path::Naive, q, k, v, params)?;
    if !q.gpu().same_device(d_o.gpu()) {
        return Err(Error::DeviceMismatch { op: OP });
    }
    validate_grad_output(OP, &Operand::of("q", q), &Operand::of("d_o", d_o))?;
    let gpu = q.gpu();
    let kv_shape = [d.batch, d.heads, d.seq_k, d.head_dim];
    let grads = AttentionGrads {
        dq: Tensor::empty(gpu, q.shape(), q.dtype())?,
        dk: Tensor::empty(gpu, &kv_shape, q.dtype())?,
        dv: Tensor::empty(gpu, &kv_shape, q.dtype())?,
    };
    let heads_total = d.batch * d.heads;
    if heads_total == 0 || d.seq_q + d.seq_k == 0 {
        return Ok(grads);
    }
    // Both passes index one (batch, head) chunk of P and dS: `count * seq_q * seq_k` each.
    let per_head = (d.seq_q * d.seq_k).max(1);
    let chunk = (naive::MAX_SCRATCH_ELEMS / (2 * per_head)).clamp(1, GRID_YZ_MAX.min(heads_total));
    let probs = Tensor::empty(gpu, &[chunk * per_head], DType::F32)?;
    let dscores = Tensor::empty(gpu, &[chunk * per_head], DType::F32)?;
    let grid_x = |what: &'static str, n: usize| {
        u32::try_from(n).map_err(|_| Error::TooLarge {
            op: OP,
            what,
            given: n as u64,
            max: u32::MAX as u64,
        })
    };
    let (rows_x, keys_x) = (grid_x("seq_q", d.seq_q)?, grid_x("seq_k", d.seq_k)?);
    let launch = |grid_x: u32, count: usize| LaunchConfig {
        grid_dim: (grid_x, count as u32, 1),
        block_dim: (naive::BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    for first in (0..heads_total).step_by(chunk) {
        let count = chunk.min(heads_total - first);
        let shape = shape_param(&d, params, scale, first);
        // Pass 1 (rows): P, dS and dQ. With seq_q = 0 there is nothing to compute.
        if d.seq_q > 0 {
            launch_cfg(
                gpu,
                kernel_name!("attention_naive_bwd_rows", q.dtype()),
                launch(rows_x, count),
                &[
                    &ByValue(q.raw()),
                    &ByValue(k.raw()),
                    &ByValue(v.raw()),
                    &ByValue(d_o.raw()),
                    &ByValue(grads.dq.raw()),
                    &ByValue(probs.raw()),
                    &ByValue(dscores.raw()),
                    &ByValue(shape),
                ],
            )?;
        }
        // Pass 2 (keys): dK and dV (0 when seq_q = 0: no query sees any key).
        if d.seq_k > 0 {
            launch_cfg(
                gpu,
                kernel_name!("attention_naive_bwd_keys", q.dtype()),
                launch(keys_x, count),
                &[
                    &ByValue(q.raw()),
                    &ByValue(d_o.raw()),
                    &ByValue(probs.raw()),
                    &ByValue(dscores.raw()),
                    &ByValue(grads.dk.raw()),
                    &ByValue(grads.dv.raw()),
                    &ByValue(shape),
                ],
            )?;
        }
    }
    Ok(grads)
}

/// CPU references (f64), with the semantics of the module doc.
pub mod reference {
    use super::{AttentionGrads, AttentionParams, Causal, Dims, dims, scale};
    use crate::DType;
    use crate::error::{Error, Result};
    use crate::tensor::HostTensor;

    /// Exact and same-precision-naive results of one computation.
    #[derive(Clone, Debug, PartialEq)]
    pub struct Both {
        /// O in f64 arithmetic, stored as (unrounded) f32.
        pub exact_o: HostTensor,
        /// LSE in f64 arithmetic.
        pub exact_lse: HostTensor,
        /// O as a naive implementation in the input dtype computes it (see [`naive_same_precision`]).
        pub naive_o: HostTensor,
        pub naive_lse: HostTensor,
    }

    /// The reference: f64 arithmetic throughout. O is returned as f32 (`dtype` F32, not rounded to the
    /// input dtype) and LSE as f32.
    pub fn forward(
        q: &HostTensor,
        k: &HostTensor,
        v: &HostTensor,
        params: &AttentionParams,
    ) -> Result<(HostTensor, HostTensor)> {
        let b = forward_and_naive(q, k, v, params)?;
        Ok((b.exact_o, b.exact_lse))
    }

    /// The straightforward computation in the input dtype, rounding where a naive f16/bf16
    /// implementation stores a tensor: S = round(scale * Q K^T) (the product accumulated exactly),
    /// P = round(softmax(S)) (the softmax of the rounded S computed exactly), O = round(P V) (P V
    /// accumulated exactly). LSE = ln sum exp(S) of the rounded S, in f64. Its distance from
    /// [`forward`] is the error scale of the correctness rule
    /// `max|out - ref| <= 2 max|naive - ref| + 1e-5`.
    pub fn naive_same_precision(
        q: &HostTensor,
        k: &HostTensor,
        v: &HostTensor,
        params: &AttentionParams,
    ) -> Result<(HostTensor, HostTensor)> {
        let b = forward_and_naive(q, k, v, params)?;
        Ok((b.naive_o, b.naive_lse))
    }

    /// [`forward`] and [`naive_same_precision`] in one pass (they share the dot products); rows are
    /// spread over the available CPU cores.
    pub fn forward_and_naive(
        q: &HostTensor,
        k: &HostTensor,
        v: &HostTensor,
        params: &AttentionParams,
    ) -> Result<Both> {
        const OP: &str = "attention::reference";
        let d = dims(OP, &q.shape, &k.shape, &v.shape)?;
        let scale = scale(OP, params, d.head_dim)? as f64;
        let rows = d.batch * d.heads * d.seq_q;
        let dh = d.head_dim;
        let mut exact_o = vec![0f32; rows * dh];
        let mut naive_o = vec![0f32; rows * dh];
        let mut exact_lse = vec![0f32; rows];
        let mut naive_lse = vec![0f32; rows];
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let per = rows.div_ceil(threads).max(1);
        let job = Job {
            q: &q.data,
            k: &k.data,
            v: &v.data,
            d,
            scale,
            causal: params.causal == Causal::Yes,
            dtype: q.dtype,
        };
        std::thread::scope(|s| {
            let parts = exact_o
                .chunks_mut(per * dh.max(1))
                .zip(naive_o.chunks_mut(per * dh.max(1)))
                .zip(exact_lse.chunks_mut(per).zip(naive_lse.chunks_mut(per)));
            for (t, ((eo, no), (el, nl))) in parts.enumerate() {
                let job = &job;
                s.spawn(move || job.rows(t * per, eo, no, el, nl));
            }
        });
        let o_shape = [d.batch, d.heads, d.seq_q, d.head_dim];
        let l_shape = [d.batch, d.heads, d.seq_q];
        Ok(Both {
            exact_o: HostTensor::new(exact_o, &o_shape, DType::F32)?,
            exact_lse: HostTensor::new(exact_lse, &l_shape, DType::F32)?,
            naive_o: HostTensor::new(naive_o, &o_shape, q.dtype)?,
            naive_lse: HostTensor::new(naive_lse, &l_shape, DType::F32)?,
        })
    }

    /// The backward reference: f64 arithmetic throughout, gradients returned as (unrounded) f32.
    /// `d_o` must have q's shape. Fully masked rows (they see no key) contribute nothing: their dQ
    /// is 0 and they add nothing to dK and dV.
    pub fn backward(
        q: &HostTensor,
        k: &HostTensor,
        v: &HostTensor,
        d_o: &HostTensor,
        params: &AttentionParams,
    ) -> Result<AttentionGrads<HostTensor>> {
        const OP: &str = "attention::reference::backward";
        let d = dims(OP, &q.shape, &k.shape, &v.shape)?;
        if d_o.shape != q.shape {
            return Err(Error::Shape {
                op: OP,
                what: "d_o (the gradient of O) must have q's shape".into(),
                expected: format!("{:?}", q.shape),
                got: d_o.shape.clone(),
            });
        }
        let scale = scale(OP, params, d.head_dim)? as f64;
        let causal = params.causal == Causal::Yes;
        let (sq, sk, dh) = (d.seq_q, d.seq_k, d.head_dim);
        let heads = d.batch * d.heads;
        let mut dq = vec![0f32; heads * sq * dh];
        let mut dk = vec![0f32; heads * sk * dh];
        let mut dv = vec![0f32; heads * sk * dh];
        let f64s = |x: &[f32]| -> Vec<f64> { x.iter().map(|&v| v as f64).collect() };
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let per = heads.div_ceil(threads).max(1);
        std::thread::scope(|s| {
            let parts = dq
                .chunks_mut((per * sq * dh).max(1))
                .zip(dk.chunks_mut((per * sk * dh).max(1)))
                .zip(dv.chunks_mut((per * sk * dh).max(1)));
            for (t, ((dq, dk), dv)) in parts.enumerate() {
                s.spawn(move || {
                    for h in 0..per.min(heads - t * per) {
                        let head = t * per + h;
                        let (qr, kr) = (
                            head * sq * dh..(head + 1) * sq * dh,
                            head * sk * dh..(head + 1) * sk * dh,
                        );
                        let x = HeadInputs {
                            q: &f64s(&q.data[qr.clone()]),
                            k: &f64s(&k.data[kr.clone()]),
                            v: &f64s(&v.data[kr]),
                            seq_q: sq,
                            seq_k: sk,
                            head_dim: dh,
                            scale,
                            causal,
                        };
                        let g = x.backward(&f64s(&d_o.data[qr]));
                        let (a, b) = (h * sq * dh, h * sk * dh);
                        let store = |dst: &mut [f32], src: &[f64]| {
                            for (o, &x) in dst.iter_mut().zip(src) {
                                *o = x as f32;
                            }
                        };
                        store(&mut dq[a..a + sq * dh], &g.dq);
                        store(&mut dk[b..b + sk * dh], &g.dk);
                        store(&mut dv[b..b + sk * dh], &g.dv);
                    }
                });
            }
        });
        let kv = [d.batch, d.heads, sk, dh];
        Ok(AttentionGrads {
            dq: HostTensor::new(dq, &q.shape, DType::F32)?,
            dk: HostTensor::new(dk, &kv, DType::F32)?,
            dv: HostTensor::new(dv, &kv, DType::F32)?,
        })
    }

    /// One head's inputs in f64: Q `[seq_q, head_dim]`, K and V `[seq_k, head_dim]`.
    pub(super) struct HeadInputs<'a> {
        pub q: &'a [f64],
        pub k: &'a [f64],
        pub v: &'a [f64],
        pub seq_q: usize,
        pub seq_k: usize,
        pub head_dim: usize,
        pub scale: f64,
        pub causal: bool,
    }

    impl HeadInputs<'_> {
        /// Keys query `i` sees (the module doc's causal convention).
        fn visible(&self, i: usize) -> usize {
            if self.causal {
                (i as i64 + self.seq_k as i64 - self.seq_q as i64 + 1).clamp(0, self.seq_k as i64)
                    as usize
            } else {
                self.seq_k
            }
        }

        /// Row `i`'s probabilities over its visible keys (empty when it sees none).
        fn probs(&self, i: usize) -> Vec<f64> {
            let dh = self.head_dim;
            let qi = &self.q[i * dh..(i + 1) * dh];
            let s: Vec<f64> = (0..self.visible(i))
                .map(|j| {
                    let kj = &self.k[j * dh..(j + 1) * dh];
                    self.scale * qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f64>()
                })
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let l: f64 = e.iter().sum();
            e.iter().map(|x| x / l).collect()
        }

        /// O `[seq_q, head_dim]` in f64 (0 for rows that see no key): what the finite-difference test
        /// differentiates.
        #[cfg(test)]
        pub(super) fn forward(&self) -> Vec<f64> {
            let dh = self.head_dim;
            let mut o = vec![0f64; self.seq_q * dh];
            for i in 0..self.seq_q {
                for (j, p) in self.probs(i).into_iter().enumerate() {
                    for c in 0..dh {
                        o[i * dh + c] += p * self.v[j * dh + c];
                    }
                }
            }
            o
        }

        /// Gradients for upstream `d_o` `[seq_q, head_dim]`, in f64.
        pub(super) fn backward(&self, d_o: &[f64]) -> AttentionGrads<Vec<f64>> {
            let (sq, sk, dh) = (self.seq_q, self.seq_k, self.head_dim);
            let mut g = AttentionGrads {
                dq: vec![0f64; sq * dh],
                dk: vec![0f64; sk * dh],
                dv: vec![0f64; sk * dh],
            };
            for i in 0..sq {
                let p = self.probs(i);
                let (qi, gi) = (&self.q[i * dh..(i + 1) * dh], &d_o[i * dh..(i + 1) * dh]);
                let dp: Vec<f64> = (0..p.len())
                    .map(|j| {
                        let vj = &self.v[j * dh..(j + 1) * dh];
                        gi.iter().zip(vj).map(|(a, b)| a * b).sum::<f64>()
                    })
                    .collect();
                let row_dot: f64 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
                for j in 0..p.len() {
                    let ds = p[j] * (dp[j] - row_dot);
                    for c in 0..dh {
                        g.dq[i * dh + c] += self.scale * ds * self.k[j * dh + c];
                        g.dk[j * dh + c] += self.scale * ds * qi[c];
                        g.dv[j * dh + c] += p[j] * gi[c];
                    }
                }
            }
            g
        }
    }

    struct Job<'a> {
        q: &'a [f32],
        k: &'a [f32],
        v: &'a [f32],
        d: Dims,
        scale: f64,
        causal: bool,
        dtype: DType,
    }

    impl Job<'_> {
        /// Rows `first..first + el.len()` (row = (batch * heads + head) * seq_q + i).
        fn rows(
            &self,
            first: usize,
            eo: &mut [f32],
            no: &mut [f32],
            el: &mut [f32],
            nl: &mut [f32],
        ) {
            let Dims {
                seq_q,
                seq_k,
                head_dim: dh,
                ..
            } = self.d;
            let round = |x: f64| self.dtype.round(x as f32) as f64;
            let mut s = vec![0f64; seq_k];
            let mut sr = vec![0f64; seq_k];
            let (mut acc, mut acc_r) = (vec![0f64; dh], vec![0f64; dh]);
            for (r, (lse_e, lse_n)) in el.iter_mut().zip(nl.iter_mut()).enumerate() {
                let row = first + r;
                let (head, i) = (row / seq_q, row % seq_q);
                let visible = if self.causal {
                    (i as i64 + seq_k as i64 - seq_q as i64 + 1).clamp(0, seq_k as i64) as usize
                } else {
                    seq_k
                };
                let (o_e, o_n) = (&mut eo[r * dh..(r + 1) * dh], &mut no[r * dh..(r + 1) * dh]);
                if visible == 0 {
                    o_e.fill(0.0);
                    o_n.fill(0.0);
                    *lse_e = f32::NEG_INFINITY;
                    *lse_n = f32::NEG_INFINITY;
                    continue;
                }
                let qi = &self.q[row * dh..(row + 1) * dh];
                let kv0 = head * seq_k * dh;
                for j in 0..visible {
                    let kj = &self.k[kv0 + j * dh..kv0 + (j + 1) * dh];
                    let dot: f64 = qi.iter().zip(kj).map(|(&a, &b)| a as f64 * b as f64).sum();
                    s[j] = self.scale * dot;
                    sr[j] = round(s[j]);
                }
                let m = s[..visible]
                    .iter()
                    .cloned()
                    .fold(f64::NEG_INFINITY, f64::max);
                let mr = sr[..visible]
                    .iter()
                    .cloned()
                    .fold(f64::NEG_INFINITY, f64::max);
                let (mut l, mut lr) = (0f64, 0f64);
                for j in 0..visible {
                    s[j] = (s[j] - m).exp();
                    sr[j] = (sr[j] - mr).exp();
                    l += s[j];
                    lr += sr[j];
                }
                acc.fill(0.0);
                acc_r.fill(0.0);
                for j in 0..visible {
                    let vj = &self.v[kv0 + j * dh..kv0 + (j + 1) * dh];
                    let (p, pr) = (s[j] / l, round(sr[j] / lr));
                    for c in 0..dh {
                        acc[c] += p * vj[c] as f64;
                        acc_r[c] += pr * vj[c] as f64;
                    }
                }
                for c in 0..dh {
                    o_e[c] = acc[c] as f32;
                    o_n[c] = round(acc_r[c]) as f32;
                }
                *lse_e = (m + l.ln()) as f32;
                *lse_n = (mr + lr.ln()) as f32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::reference as r;
    use super::*;
    use crate::HostTensor;

    fn host(data: Vec<f32>, shape: &[usize]) -> HostTensor {
        HostTensor::new(data, shape, DType::F32).unwrap()
    }

    #[test]
    fn reference_matches_a_hand_computed_case() {
        // One head, 2 queries, 3 keys, head_dim 2, scale 1.
        // q0 = (1, 0), q1 = (0, 1); k = (1, 0), (0, 1), (1, 1); v = (1, 2), (3, 4), (5, 6).
        let q = host(vec![1., 0., 0., 1.], &[1, 1, 2, 2]);
        let k = host(vec![1., 0., 0., 1., 1., 1.], &[1, 1, 3, 2]);
        let v = host(vec![1., 2., 3., 4., 5., 6.], &[1, 1, 3, 2]);
        let p = AttentionParams {
            causal: Causal::No,
            scale: Some(1.0),
        };
        let (o, lse) = r::forward(&q, &k, &v, &p).unwrap();
        // Row 0 scores (1, 0, 1): weights (e, 1, e) / (2e + 1).
        let e = std::f64::consts::E;
        let z = 2.0 * e + 1.0;
        let want0 = [(e * 1. + 3. + e * 5.) / z, (e * 2. + 4. + e * 6.) / z];
        // Row 1 scores (0, 1, 1): weights (1, e, e) / (2e + 1).
        let want1 = [(1. + e * 3. + e * 5.) / z, (2. + e * 4. + e * 6.) / z];
        let want = [want0[0], want0[1], want1[0], want1[1]];
        for (got, want) in o.data.iter().zip(want) {
            assert!((*got as f64 - want).abs() < 1e-6, "{got} vs {want}");
        }
        for got in &lse.data {
            assert!((*got as f64 - z.ln()).abs() < 1e-6);
        }

        // Causal with seq_q = 2 < seq_k = 3 (bottom-right aligned): query 0 sees keys 0..=1,
        // query 1 sees all three.
        let p = AttentionParams {
            causal: Causal::Yes,
            scale: Some(1.0),
        };
        let (o, lse) = r::forward(&q, &k, &v, &p).unwrap();
        let w0 = [e / (e + 1.), 1. / (e + 1.)];
        assert!((o.data[0] as f64 - (w0[0] * 1. + w0[1] * 3.)).abs() < 1e-6);
        assert!((o.data[1] as f64 - (w0[0] * 2. + w0[1] * 4.)).abs() < 1e-6);
        assert!((lse.data[0] as f64 - (e + 1.).ln()).abs() < 1e-6);
        assert!((o.data[2] as f64 - want1[0]).abs() < 1e-6);
    }

    #[test]
    fn fully_masked_rows_are_zero_with_lse_minus_infinity() {
        // seq_q = 3 > seq_k = 1, causal: query i sees key 0 iff 0 <= i - 2, so rows 0 and 1 see nothing.
        let q = host(vec![0.5; 6], &[1, 1, 3, 2]);
        let k = host(vec![1.0, -1.0], &[1, 1, 1, 2]);
        let v = host(vec![2.0, 3.0], &[1, 1, 1, 2]);
        let p = AttentionParams {
            causal: Causal::Yes,
            scale: None,
        };
        let b = r::forward_and_naive(&q, &k, &v, &p).unwrap();
        for out in [&b.exact_o, &b.naive_o] {
            assert_eq!(out.data, vec![0., 0., 0., 0., 2., 3.]);
        }
        for lse in [&b.exact_lse, &b.naive_lse] {
            assert_eq!(&lse.data[..2], &[f32::NEG_INFINITY; 2]);
            assert_eq!(lse.data[2], 0.0); // one key with score 0.5 - 0.5 = 0
        }
    }

    #[test]
    fn naive_same_precision_rounds_like_the_dtype() {
        let q = HostTensor::new(vec![0.3, -0.7, 1.1, 0.2], &[1, 1, 2, 2], DType::BF16).unwrap();
        let k = HostTensor::new(vec![0.9, 0.1, -0.4, 0.8], &[1, 1, 2, 2], DType::BF16).unwrap();
        let v = HostTensor::new(vec![0.11, 0.22, 0.33, 0.44], &[1, 1, 2, 2], DType::BF16).unwrap();
        let p = AttentionParams::default();
        let (o, _) = r::naive_same_precision(&q, &k, &v, &p).unwrap();
        assert!(o.data.iter().all(|&x| DType::BF16.round(x) == x));
        let (exact, _) = r::forward(&q, &k, &v, &p).unwrap();
        let err = o
            .data
            .iter()
            .zip(&exact.data)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(err > 0.0 && err < 4e-3, "bf16 naive error {err}");
    }

    #[test]
    fn shape_validation_names_the_problem() {
        let e = dims("t", &[2, 3, 4], &[2, 3, 4, 8], &[2, 3, 4, 8])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rank 4") && e.contains("[batch, seq, heads, head_dim]"),
            "{e}"
        );
        let e = dims("t", &[2, 3, 5, 8], &[2, 4, 7, 8], &[2, 4, 7, 8])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("batch, heads and head_dim") && e.contains("[2, 3, seq_k, 8]"),
            "{e}"
        );
        let e = dims("t", &[2, 3, 5, 8], &[2, 3, 7, 16], &[2, 3, 7, 16])
            .unwrap_err()
            .to_string();
        assert!(e.contains("head_dim"), "{e}");
        let e = dims("t", &[2, 3, 5, 8], &[2, 3, 7, 8], &[2, 3, 6, 8])
            .unwrap_err()
            .to_string();
        assert!(e.contains("v must have the shape of k"), "{e}");
        let e = dims("t", &[1, 1, (1 << 30) + 1, 8], &[1, 1, 1, 8], &[1, 1, 1, 8]).unwrap_err();
        assert!(matches!(e, Error::TooLarge { what: "seq_q", .. }), "{e}");
        assert!(dims("t", &[2, 3, 5, 8], &[2, 3, 7, 8], &[2, 3, 7, 8]).is_ok());
    }

    fn operand<'a>(name: &'static str, shape: &'a [usize], dtype: DType) -> Operand<'a> {
        Operand {
            name,
            shape,
            strides: &[],
            dtype,
            contiguous: true,
            aligned16: true,
        }
    }

    fn check(path: Path, ops: [Operand; 3]) -> Result<(Dims, f32)> {
        validate_operands("t", path, &ops, &AttentionParams::default())
    }

    #[test]
    fn validation_rejects_each_bad_input_with_a_typed_error() {
        let (qs, ks) = ([2, 3, 5, 64], [2, 3, 7, 64]);
        let good = |dt| {
            [
                operand("q", &qs, dt),
                operand("k", &ks, dt),
                operand("v", &ks, dt),
            ]
        };
        let (d, scale) = check(Path::Flash, good(DType::F16)).unwrap();
        assert_eq!((d.seq_q, d.seq_k, scale), (5, 7, 0.125));
        assert!(check(Path::Flash, good(DType::BF16)).is_ok());
        assert!(check(Path::Naive, good(DType::F32)).is_ok());

        // dtype: f32 only on the naive path; mixed dtypes never.
        let e = check(Path::Flash, good(DType::F32)).unwrap_err();
        assert!(
            matches!(
                e,
                Error::DType {
                    got: DType::F32,
                    ..
                }
            ),
            "{e}"
        );
        let mut mixed = good(DType::F16);
        mixed[2].dtype = DType::BF16;
        let e = check(Path::Naive, mixed).unwrap_err();
        assert!(
            matches!(
                e,
                Error::DType {
                    got: DType::BF16,
                    ..
                }
            ) && e.to_string().contains("for v"),
            "{e}"
        );

        // head dim: says which are supported.
        let (q96, k96) = ([2, 3, 5, 96], [2, 3, 7, 96]);
        let bad = [
            operand("q", &q96, DType::F16),
            operand("k", &k96, DType::F16),
            operand("v", &k96, DType::F16),
        ];
        let e = check(Path::Flash, bad).unwrap_err().to_string();
        assert!(e.contains("head_dim 96") && e.contains("[64, 128]"), "{e}");
        assert!(check(Path::Naive, bad).is_ok());
        let (q512, k512) = ([1, 1, 5, 512], [1, 1, 7, 512]);
        let big = [
            operand("q", &q512, DType::F32),
            operand("k", &k512, DType::F32),
            operand("v", &k512, DType::F32),
        ];
        assert!(
            check(Path::Naive, big)
                .unwrap_err()
                .to_string()
                .contains("1..=256")
        );

        // non-contiguous (e.g. a [B, S, H, D] tensor viewed as [B, H, S, D] through transpose(1, 2)).
        let mut strided = good(DType::F16);
        strided[1].contiguous = false;
        strided[1].strides = &[1344, 64, 192, 1];
        let e = check(Path::Flash, strided).unwrap_err();
        assert!(matches!(e, Error::NotContiguous { what: "k", .. }), "{e}");

        // misaligned base (flash only).
        let mut odd = good(DType::F16);
        odd[0].aligned16 = false;
        assert!(
            check(Path::Flash, odd)
                .unwrap_err()
                .to_string()
                .contains("16-byte aligned")
        );
        assert!(check(Path::Naive, odd).is_ok());

        // rank and shape agreement.
        let q3 = [2, 3, 5];
        let e = check(
            Path::Flash,
            [
                operand("q", &q3, DType::F16),
                good(DType::F16)[1],
                good(DType::F16)[2],
            ],
        );
        assert!(matches!(e, Err(Error::Shape { .. })));
        let kh = [2, 4, 7, 64];
        let e = check(
            Path::Flash,
            [
                good(DType::F16)[0],
                operand("k", &kh, DType::F16),
                operand("v", &kh, DType::F16),
            ],
        );
        assert!(
            e.unwrap_err()
                .to_string()
                .contains("batch, heads and head_dim")
        );

        // grid limits.
        let (qh, khh) = ([1, 70000, 5, 64], [1, 70000, 7, 64]);
        let e = check(
            Path::Flash,
            [
                operand("q", &qh, DType::F16),
                operand("k", &khh, DType::F16),
                operand("v", &khh, DType::F16),
            ],
        );
        assert!(matches!(e, Err(Error::TooLarge { what: "heads", .. })));
    }

    /// splitmix64 values in [-1, 1): seeded inputs without an RNG dependency.
    fn values(seed: &mut u64, n: usize) -> Vec<f64> {
        (0..n)
            .map(|_| {
                *seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let mut z = *seed;
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                z ^= z >> 31;
                (z >> 11) as f64 / (1u64 << 52) as f64 - 1.0
            })
            .collect()
    }

    /// The backward reference against central differences of the f64 forward, for every element of
    /// Q, K and V: loss `L = sum(dO * O)`, step `h = 1e-6 max(1, |x|)`, checked
    /// `|fd - grad| <= 1e-7 + 1e-6 |grad|` (f64: rounding noise ~1e-10, truncation ~1e-12). Shapes:
    /// square and Sq != Sk both ways, both masks, a custom scale, and causal Sq > Sk where rows see no
    /// key. The f64 forward is first pinned to the public [`reference::forward`].
    #[test]
    fn backward_reference_matches_central_differences() {
        let cases = [
            // (seq_q, seq_k, head_dim, causal, scale)
            (4, 4, 3, Causal::No, None),
            (4, 4, 3, Causal::Yes, None),
            (3, 5, 4, Causal::No, Some(0.7)),
            (3, 5, 4, Causal::Yes, None),
            (5, 3, 2, Causal::Yes, Some(1.3)), // rows 0 and 1 see no key
            (5, 2, 3, Causal::No, None),
            (1, 1, 5, Causal::Yes, None),
        ];
        let mut seed = 0x00A7_7E47_u64;
        let mut checked = 0;
        for (sq, sk, dh, causal, sc) in cases {
            let params = AttentionParams { causal, scale: sc };
            let scale = scale("t", &params, dh).unwrap() as f64;
            let (q, k, v) = (
                values(&mut seed, sq * dh),
                values(&mut seed, sk * dh),
                values(&mut seed, sk * dh),
            );
            let d_o = values(&mut seed, sq * dh);
            let head = |q: &[f64], k: &[f64], v: &[f64]| -> f64 {
                let x = r::HeadInputs {
                    q,
                    k,
                    v,
                    seq_q: sq,
                    seq_k: sk,
                    head_dim: dh,
                    scale,
                    causal: causal == Causal::Yes,
                };
                x.forward().iter().zip(&d_o).map(|(o, g)| o * g).sum()
            };
            // The f64 forward is the published reference forward.
            let f32s = |x: &[f64]| x.iter().map(|&v| v as f32).collect::<Vec<_>>();
            let (ht, hk) = ([1, 1, sq, dh], [1, 1, sk, dh]);
            let (qt, kt, vt) = (
                host(f32s(&q), &ht),
                host(f32s(&k), &hk),
                host(f32s(&v), &hk),
            );
            let x = r::HeadInputs {
                q: &qt.data.iter().map(|&v| v as f64).collect::<Vec<_>>(),
                k: &kt.data.iter().map(|&v| v as f64).collect::<Vec<_>>(),
                v: &vt.data.iter().map(|&v| v as f64).collect::<Vec<_>>(),
                seq_q: sq,
                seq_k: sk,
                head_dim: dh,
                scale,
                causal: causal == Causal::Yes,
            };
            let (o, _) = r::forward(&qt, &kt, &vt, &params).unwrap();
            for (a, b) in x.forward().iter().zip(&o.data) {
                assert!((a - *b as f64).abs() < 1e-6, "{a} vs {b}");
            }

            let g = r::HeadInputs {
                q: &q,
                k: &k,
                v: &v,
                seq_q: sq,
                seq_k: sk,
                head_dim: dh,
                scale,
                causal: causal == Causal::Yes,
            }
            .backward(&d_o);
            for (which, grad) in [("dq", &g.dq), ("dk", &g.dk), ("dv", &g.dv)] {
                for idx in 0..grad.len() {
                    let (mut qp, mut kp, mut vp) = (q.clone(), k.clone(), v.clone());
                    let (mut qm, mut km, mut vm) = (q.clone(), k.clone(), v.clone());
                    let (xp, xm) = match which {
                        "dq" => (&mut qp[idx], &mut qm[idx]),
                        "dk" => (&mut kp[idx], &mut km[idx]),
                        _ => (&mut vp[idx], &mut vm[idx]),
                    };
                    let h = 1e-6 * xp.abs().max(1.0);
                    *xp += h;
                    *xm -= h;
                    let fd = (head(&qp, &kp, &vp) - head(&qm, &km, &vm)) / (2.0 * h);
                    let an = grad[idx];
                    assert!(
                        an.is_finite() && (fd - an).abs() <= 1e-7 + 1e-6 * an.abs(),
                        "sq {sq} sk {sk} d {dh} {causal:?}: {which}[{idx}] backward {an:.9e}, \
                         central difference {fd:.9e}"
                    );
                    checked += 1;
                }
            }
        }
        assert!(checked > 200, "{checked}");
    }

    #[test]
    fn backward_of_fully_masked_rows_is_zero_and_never_nan() {
        // Causal, seq_q = 4 > seq_k = 2: query i sees keys j <= i - 2, so rows 0 and 1 see nothing.
        let mut seed = 7u64;
        let f = |s: &mut u64, n| values(s, n).into_iter().map(|v| v as f32).collect();
        let q = host(f(&mut seed, 2 * 4 * 3), &[1, 2, 4, 3]);
        let k = host(f(&mut seed, 2 * 2 * 3), &[1, 2, 2, 3]);
        let v = host(f(&mut seed, 2 * 2 * 3), &[1, 2, 2, 3]);
        let d_o = host(f(&mut seed, 2 * 4 * 3), &[1, 2, 4, 3]);
        let p = AttentionParams {
            causal: Causal::Yes,
            scale: None,
        };
        let g = r::backward(&q, &k, &v, &d_o, &p).unwrap();
        assert_eq!(g.dq.shape, vec![1, 2, 4, 3]);
        assert_eq!(
            (g.dk.shape.clone(), g.dv.shape.clone()),
            (vec![1, 2, 2, 3], vec![1, 2, 2, 3])
        );
        for t in [&g.dq, &g.dk, &g.dv] {
            assert!(t.data.iter().all(|x| x.is_finite()));
        }
        for head in 0..2 {
            // Rows 0 and 1: dQ = 0. Row 2 sees only key 0 (P = 1): dQ = 0 too (dS = 1 (dP - dP)).
            let rows = &g.dq.data[head * 12..head * 12 + 9];
            assert!(rows.iter().all(|&x| x == 0.0), "{rows:?}");
            // dV of key 1: only row 3 sees it.
            assert!(
                g.dv.data[head * 6 + 3..head * 6 + 6]
                    .iter()
                    .any(|&x| x != 0.0)
            );
        }
        // Every row masked (seq_k = 0 is allowed): all zero.
        let empty = host(vec![], &[1, 2, 0, 3]);
        let g = r::backward(&q, &empty, &empty, &d_o, &p).unwrap();
        assert!(g.dq.data.iter().all(|&x| x == 0.0) && g.dk.data.is_empty());
    }

    #[test]
    fn backward_reference_hand_case_and_bad_input() {
        // One key: P = 1 for every query, so dV = sum of dO rows and dQ = dK = 0.
        let q = host(vec![0.3, -0.2, 0.9, 0.4], &[1, 1, 2, 2]);
        let k = host(vec![0.5, 0.1], &[1, 1, 1, 2]);
        let v = host(vec![2.0, -1.0], &[1, 1, 1, 2]);
        let d_o = host(vec![1.0, 2.0, 3.0, -4.0], &[1, 1, 2, 2]);
        let p = AttentionParams::default();
        let g = r::backward(&q, &k, &v, &d_o, &p).unwrap();
        assert_eq!(g.dv.data, vec![4.0, -2.0]);
        assert!(g.dq.data.iter().chain(&g.dk.data).all(|&x| x == 0.0));
        // d_o of the wrong shape, non-finite scale.
        let bad = host(vec![0.0; 6], &[1, 1, 3, 2]);
        let e = r::backward(&q, &k, &v, &bad, &p).unwrap_err();
        assert!(
            matches!(e, Error::Shape { .. }) && e.to_string().contains("d_o"),
            "{e}"
        );
        let p = AttentionParams {
            scale: Some(f32::INFINITY),
            ..Default::default()
        };
        assert!(r::backward(&q, &k, &v, &d_o, &p).is_err());
    }

    #[test]
    fn backward_validation_checks_the_gradient_operand() {
        let (qs, other) = ([2, 3, 5, 64], [2, 3, 7, 64]);
        let q = operand("q", &qs, DType::F16);
        assert!(validate_grad_output("t", &q, &operand("d_o", &qs, DType::F16)).is_ok());
        let e = validate_grad_output("t", &q, &operand("d_o", &other, DType::F16)).unwrap_err();
        assert!(
            matches!(e, Error::Shape { .. }) && e.to_string().contains("d_o"),
            "{e}"
        );
        let e = validate_grad_output("t", &q, &operand("d_o", &qs, DType::BF16)).unwrap_err();
        assert!(
            matches!(
                e,
                Error::DType {
                    got: DType::BF16,
                    ..
                }
            ),
            "{e}"
        );
        let mut strided = operand("d_o", &qs, DType::F16);
        strided.contiguous = false;
        let e = validate_grad_output("t", &q, &strided).unwrap_err();
        assert!(matches!(e, Error::NotContiguous { what: "d_o", .. }), "{e}");
    }

    #[test]
    fn naive_backward_kernels_exist_for_every_dtype() {
        for dt in DType::ALL {
            for name in [
                kernel_name!("attention_naive_bwd_rows", dt),
                kernel_name!("attention_naive_bwd_keys", dt),
            ] {
                assert!(in_build(&name, "sm_80") && in_build(&name, "sm_90"), "{name}");
            }
        }
    }

    /// Whether kernel `name` is in the attention module of build `arch`.
    fn in_build(name: &str, arch: &str) -> bool {
        let img = crate::modules::images(crate::Family::Attention);
        let ptx = if arch == "sm_90" { img.sm90.ptx } else { img.sm80.ptx };
        crate::modules::entry_points(ptx).contains(&name)
    }

    #[test]
    fn scale_defaults_to_inverse_sqrt_head_dim_and_must_be_finite() {
        assert_eq!(scale("t", &AttentionParams::default(), 64).unwrap(), 0.125);
        let p = AttentionParams {
            scale: Some(f32::NAN),
            ..Default::default()
        };
        assert!(
            scale("t", &p, 64)
                .unwrap_err()
                .to_string()
                .contains("finite")
        );
    }

    #[test]
    fn flash_kernels_exist_for_every_supported_head_dim_and_dtype() {
        // The mma.sync kernel in the sm_80 build only; the wgmma kernels in the sm_90 build only.
        for d in FLASH_HEAD_DIMS {
            assert!(flash_config(d).is_some());
            for dt in [DType::F16, DType::BF16] {
                let name = flash_kernel(d, dt).unwrap();
                assert!(in_build(name, "sm_80") && !in_build(name, "sm_90"), "{name}");
            }
        }
        for d in FLASH_HEAD_DIMS {
            assert!(flash_wgmma_config(d).is_some());
            for dt in [DType::F16, DType::BF16] {
                for variant in [1, 2, 4] {
                    let Some((cfg, name)) = flash_wgmma_kernel(variant, d, dt) else {
                        assert!(variant != 1 && d != 64, "variant {variant} D {d} has no kernel");
                        continue;
                    };
                    assert_eq!(cfg.head_dim, d);
                    assert!(in_build(name, "sm_90") && !in_build(name, "sm_80"), "{name}");
                    let bound = crate::modules::launch_bounds(name, "sm_90");
                    assert_eq!(bound, Some((cfg.threads() as u32, cfg.min_blocks)), "{name}");
                }
            }
        }
        // wgmma exists only in the sm_90a PTX.
        let img = crate::modules::images(crate::Family::Attention);
        assert!(!img.sm80.ptx.contains("wgmma"));
        assert!(img.sm90.ptx.contains(".target sm_90a"));
        for dt in DType::ALL {
            let name = kernel_name!("attention_naive", dt);
            assert!(in_build(name, "sm_80") && in_build(name, "sm_90"), "{name}");
        }
    }
}
