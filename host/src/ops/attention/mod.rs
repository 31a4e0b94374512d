//! Attention forward: `O = softmax(scale * Q K^T + mask) V` per (batch, head), and the row
//! log-sum-exp `LSE = ln sum_j exp(scale * q_i . k_j)` over the visible keys (what backward needs);
//! and the backward (dQ, dK, dV).
//!
//! - Shapes: Q `[batch, heads, seq_q, head_dim]`, K and V `[batch, kv_heads, seq_k, head_dim]`. The
//!   FlashAttention paths take grouped-query attention (GQA/MQA): `kv_heads` any divisor of
//!   `heads`, query head `h` reading key/value head `h / (heads / kv_heads)`, K and V never copied;
//!   the backward's dK and dV are `[batch, kv_heads, seq_k, head_dim]`, each the sum over its group
//!   in f32, in query-head order (the same bits every run). The naive paths take `kv_heads = heads`
//!   only.
//! - Layouts: the FlashAttention paths take any strides whose last one is 1 and whose others are
//!   nonzero multiples of 8 elements (row stride below 2^32), so `[batch, seq, heads, head_dim]`
//!   memory seen through `transpose(1, 2)` and slices of a fused QKV tensor run without a copy. The
//!   naive paths take contiguous operands only. (A rank-4 tensor of shape `[batch, seq, heads,
//!   head_dim]` passed as it is would be read as `[batch, heads, seq, head_dim]`: transpose it.)
//! - Packed variable-length batches: [`flash_forward_varlen`], [`flash_backward_varlen`] (module
//!   [`varlen`]).
//! - Outputs: O `[batch, heads, seq_q, head_dim]` in the input dtype, in Q's layout (`[batch, seq,
//!   heads, head_dim]` memory, returned as its transposed view, when Q's heads interleave within its
//!   rows; else contiguous); the backward's gradients in their inputs' layouts; LSE `[batch, heads,
//!   seq_q]` f32, contiguous.
//! - `scale` defaults to `1 / sqrt(head_dim)`; any finite value is accepted.
//! - Causal: query `i` sees key `j` iff `j <= i + seq_k - seq_q` (the mask is aligned to the
//!   bottom-right corner when `seq_q != seq_k`, as in PyTorch's SDPA and FlashAttention). A query that
//!   sees no key (causal with `seq_q > seq_k`, or `seq_k = 0`) gets O = 0 and LSE = -inf, never NaN.
//! - [`flash_forward`]: the FlashAttention-2 kernel; f16/bf16, every head dim that is a multiple
//!   of 8 up to [`FLASH_MAX_HEAD_DIM`] (256, forward and backward; the sm_80 build up to
//!   [`FLASH_MAX_HEAD_DIM_SM80`], 128). The kernels are built for [`FLASH_TILE_DIMS`]; any other
//!   head dim runs on the narrowest of those that holds it, its columns past the head dim zero in
//!   the tiles and never stored. In the sm_90 build the products cover only the narrowest of
//!   [`FLASH_PRODUCT_DIMS`] (32, 64, 96, 128, 192, 256) that holds the head dim: the forward at
//!   every head dim, the backward at 32, 96 and 192 exactly (dense batches), so 96 and 192 cost
//!   three quarters of their tile's tensor-core work there; other head dims pay their tile's.
//!   [`naive_forward`]: scores materialised in a scratch buffer of `seq_q * seq_k` f32 per head,
//!   f32/f16/bf16, head dims 1..=256; the readable GPU reference.
//! - Both are cheap to call repeatedly on the same inputs: validation is O(rank), the launch is one
//!   kernel (the naive path: one per chunk of heads), and outputs are fresh allocations.
//! - [`flash_backward`]: dQ, dK, dV from dO and the forward's O and LSE, FlashAttention-2 on
//!   tensor cores, deterministic; f16/bf16, the head dims [`flash_forward`] takes.
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
//! let params = AttentionParams { causal: Causal::Yes, scale: None, ..Default::default() };
//! let (o, lse) = attention::flash_forward(&q, &kv, &kv, &params)?;
//! assert_eq!((o.shape(), lse.shape()), (&[2, 4, 100, 64][..], &[2, 4, 100][..]));
//! # Ok(()) }
//! ```
use cudarc::driver::LaunchConfig;
pub use decode::{DECODE_MAX_HEAD_DIM, KvCache, decode_forward};
use gpu::params::attention::{
    AttentionLayout, AttentionShape, Band, DQ_LATE_RELEASE, DQ_ORDERED, DQ_REVERSED_GRID,
    DQ_ROTATED, DqWalk, FLASH_BWD_PRE_ROWS, FLASH_BWD_TURN_ROWS, FLASH_WG_D64_Q64,
    FlashWgmmaConfig, GROUP_ALL, HeadStrides, MAX_SEQ, MaskKind, MemberSumParam, NO_WINDOW,
    dq_late_release_fits, dq_rotated_fits, flash_bwd, flash_bwd_config, flash_config,
    flash_product_dim, flash_tile_dim, flash_tma_config, flash_tma_smem_bytes, flash_wg_bwd_config,
    flash_wg_bwd_config_of, naive,
};
pub use gpu::params::attention::{
    FLASH_MAX_HEAD_DIM, FLASH_MAX_HEAD_DIM_SM80, FLASH_PRODUCT_DIMS, FLASH_TILE_DIMS,
    flash_head_dim_supported,
};
pub use varlen::{PackedSeqs, flash_backward_varlen, flash_forward_varlen};

use crate::DType;
use crate::error::{Error, Result};
use crate::kernel_name;
use crate::launch::{ByValue, grid_blocks, launch, launch_cfg, launch_cfg_large_smem};
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
#[derive(Clone, Copy, Debug, Default)]
pub struct AttentionParams<'a> {
    pub causal: Causal,
    /// Multiplies `Q K^T`; `None` means `1 / sqrt(head_dim)`.
    pub scale: Option<f32>,
    /// A sliding window (Mistral's, Gemma-2's local layers); the default sees every key.
    pub window: Window,
    /// A logit softcap `c > 0` (Gemma-2: 50): each score `s = scale q . k` becomes `c tanh(s / c)`
    /// before the softmax. The FlashAttention kernels of the sm_90 build, forward and backward
    /// (dense and packed batches), and decoding (both builds); the sm_80 build's FlashAttention,
    /// the naive path, `flash_backward_add` and ring attention refuse it by name.
    pub softcap: Option<f32>,
    /// ALiBi slopes (BLOOM, MPT): f32 on the call's device, `[heads]` (one slope a query head) or
    /// `[batch, heads]` (one a sequence and head; a packed batch's sequences count as its batch).
    /// Query head `h` subtracts `slope[h] |i + seq_k - seq_q - j|` from its score of key `j`,
    /// after the softcap, as FlashAttention-2 does; within each sequence of a packed batch. The
    /// FlashAttention kernels of the sm_90 build, forward and backward, and decoding (both
    /// builds); the sm_80 build's FlashAttention, the naive path, `flash_backward_add` and ring
    /// attention refuse them by name.
    pub alibi_slopes: Option<&'a crate::tensor::Tensor>,
}

impl AttentionParams<'_> {
    /// Whether the scores pass through a softcap or take ALiBi's bias (the backward's `_scored_`
    /// kernels).
    pub fn modifies_scores(&self) -> bool {
        self.softcap.is_some() || self.alibi_slopes.is_some()
    }

    /// Whether the call asks for any of a bounded window, a softcap and ALiBi slopes (what only
    /// the sm_90 FlashAttention kernels take).
    pub(crate) fn has_model_features(&self) -> bool {
        self.window.is_bounded() || self.modifies_scores()
    }

    /// `window .., softcap .., ALiBi slopes given|none`, for the errors that refuse them.
    pub(crate) fn model_features_given(&self) -> String {
        format!(
            "window {:?}, softcap {:?}, ALiBi slopes {}",
            self.window,
            self.softcap,
            if self.alibi_slopes.is_some() {
                "given"
            } else {
                "none"
            }
        )
    }
}

/// A sliding window: query `i` sees key `j` only if `i + off - left <= j <= i + off + right`, with
/// `off = seq_k - seq_q` (of its sequence, in a packed batch): aligned to the bottom-right corner
/// like the causal mask, which also caps the right side at 0. `None` leaves a side unbounded; a
/// bound at or past the sequence lengths is the same as none. FlashAttention kernels of the sm_90
/// build (forward, backward, packed batches) and decoding (`decode_forward`, both builds); the sm_80
/// build's FlashAttention and the naive path refuse a bounded window. The keys a query sees are contiguous, so a row whose window holds no key (possible only
/// past the causal diagonal) gets O = 0 and LSE = -inf, as a fully masked row does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Window {
    /// Keys a query sees before its own (aligned) position.
    pub left: Option<usize>,
    /// Keys a query sees after it.
    pub right: Option<usize>,
}

impl Window {
    /// Whether either side is bounded.
    pub fn is_bounded(&self) -> bool {
        self.left.is_some() || self.right.is_some()
    }
}

/// The problem size of a validated call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    pub batch: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads: `heads` (multi-head), or a divisor of it (grouped-query, FlashAttention
    /// paths only).
    pub kv_heads: usize,
    pub seq_q: usize,
    pub seq_k: usize,
    pub head_dim: usize,
}

impl Dims {
    /// The FlashAttention kernels' tile width (their `D`) this head dim runs at:
    /// [`flash_tile_dim`].
    pub fn tile_dim(&self) -> usize {
        flash_tile_dim(self.head_dim)
    }
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

/// Checks ranks and the agreement of Q, K and V shapes (shared by the GPU paths and the references):
/// equal head counts.
pub fn dims(op: &'static str, q: &[usize], k: &[usize], v: &[usize]) -> Result<Dims> {
    dims_with(op, q, k, v, false)
}

/// [`dims`] that also accepts grouped-query shapes: K and V with `kv_heads` heads dividing q's.
pub fn dims_grouped(op: &'static str, q: &[usize], k: &[usize], v: &[usize]) -> Result<Dims> {
    dims_with(op, q, k, v, true)
}

fn dims_with(
    op: &'static str,
    q: &[usize],
    k: &[usize],
    v: &[usize],
    grouped: bool,
) -> Result<Dims> {
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
    let heads_ok = if grouped {
        k[1] > 0 && h % k[1] == 0 || h == 0 && k[1] == 0
    } else {
        k[1] == h
    };
    if k[0] != b || !heads_ok || k[3] != d {
        return Err(Error::Shape {
            op,
            what: if grouped {
                "k must match q in batch and head_dim, with a head count dividing q's (grouped-query)"
                    .into()
            } else {
                "k must match q in batch, heads and head_dim".into()
            },
            expected: if grouped {
                format!("[{b}, a divisor of {h}, seq_k, {d}]")
            } else {
                format!("[{b}, {h}, seq_k, {d}]")
            },
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
        kv_heads: k[1],
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
    let checked = validate_operands(op, path, &ops, params)?;
    validate_model_features(op, path, q, params, (checked.0.batch, checked.0.heads))?;
    Ok(checked)
}

/// A bounded [`Window`], a softcap and ALiBi slopes run on the wgmma kernels only: the sm_90
/// build's FlashAttention (and decoding, [`validate_score_mods`]).
fn validate_model_features(
    op: &'static str,
    path: Path,
    q: &Tensor,
    params: &AttentionParams,
    (batch, heads): (usize, usize),
) -> Result<()> {
    validate_score_mods(op, q, params, (batch, heads))?;
    if !params.has_model_features() {
        return Ok(());
    }
    let msg = match path {
        Path::Naive => "the naive path takes no window, softcap or ALiBi slopes \
                        (attention::model_features is the reference with them)"
            .to_string(),
        Path::Flash if q.gpu().ptx_arch() != "sm_90" => format!(
            "a sliding window, a softcap or ALiBi slopes need the sm_90 build (compute capability \
             9.0); this device runs the {} build",
            q.gpu().ptx_arch()
        ),
        Path::Flash => return Ok(()),
    };
    Err(Error::Invalid {
        op,
        msg: format!("{msg} ({})", params.model_features_given()),
    })
}

/// The softcaps the kernels take: beyond these a cap is no cap (above) or caps every score to 0.
pub const SOFTCAP_RANGE: (f32, f32) = (1e-20, 1e20);

/// The softcap and ALiBi slopes as given: the softcap in [`SOFTCAP_RANGE`], the slopes f32
/// `[heads]` or `[batch, heads]`, contiguous, on q's device.
pub(super) fn validate_score_mods(
    op: &'static str,
    q: &Tensor,
    params: &AttentionParams,
    (batch, heads): (usize, usize),
) -> Result<()> {
    if let Some(c) = params.softcap
        && !(SOFTCAP_RANGE.0..=SOFTCAP_RANGE.1).contains(&c)
    {
        // (The range keeps the kernels' cap units, `c log2 e` or `c / |scale|`, and their inverses
        // finite and normal.)
        return Err(Error::Invalid {
            op,
            msg: format!(
                "softcap must be finite and positive, between {:e} and {:e}; got {c}",
                SOFTCAP_RANGE.0, SOFTCAP_RANGE.1
            ),
        });
    }
    if let Some(slopes) = params.alibi_slopes {
        if !slopes.gpu().same_device(q.gpu()) {
            return Err(Error::DeviceMismatch { op });
        }
        if slopes.dtype() != DType::F32 {
            return Err(Error::DType {
                op,
                expected: "f32 (alibi_slopes)".to_string(),
                got: slopes.dtype(),
            });
        }
        let shape = slopes.shape();
        if shape != [heads] && shape != [batch, heads] {
            return Err(Error::Invalid {
                op,
                msg: format!(
                    "alibi_slopes must be [heads] = [{heads}] or [batch, heads] = [{batch}, \
                     {heads}]; got {shape:?}"
                ),
            });
        }
        if !slopes.is_contiguous() {
            return Err(Error::NotContiguous {
                op,
                what: "alibi_slopes",
                shape: shape.to_vec(),
                strides: slopes.strides().to_vec(),
            });
        }
    }
    Ok(())
}

/// The kernels' [`AttentionLayout::alibi_slopes`] and `alibi_batch` of validated params: (0, 0)
/// without slopes.
pub(super) fn alibi_fields(params: &AttentionParams) -> (u64, u64) {
    match params.alibi_slopes {
        None => (0, 0),
        Some(t) => {
            let per_batch = t.shape().len() == 2;
            (t.raw().ptr, if per_batch { t.shape()[1] as u64 } else { 0 })
        }
    }
}

/// Every rule except "same device": ranks and shapes, dtypes, head dim, contiguity, alignment, sizes.
fn validate_operands(
    op: &'static str,
    path: Path,
    [q, k, v]: &[Operand; 3],
    params: &AttentionParams,
) -> Result<(Dims, f32)> {
    let d = match path {
        Path::Flash => dims_grouped(op, q.shape, k.shape, v.shape)?,
        Path::Naive => dims(op, q.shape, k.shape, v.shape)?,
    };
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
        Path::Flash => flash_head_dim_supported(d.head_dim),
        Path::Naive => (1..=naive::MAX_HEAD_DIM).contains(&d.head_dim),
    };
    if !supported {
        return Err(Error::Invalid {
            op,
            msg: match path {
                Path::Flash => format!(
                    "head_dim {} has no FlashAttention kernel; supported head dims: multiples of 8 \
                     from 8 to {FLASH_MAX_HEAD_DIM} (naive_forward takes 1..={})",
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
        match path {
            Path::Flash => {
                head_strides(op, x)?;
            }
            Path::Naive if !x.contiguous => {
                return Err(Error::NotContiguous {
                    op,
                    what: x.name,
                    shape: x.shape.to_vec(),
                    strides: x.strides.to_vec(),
                });
            }
            Path::Naive => {}
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

/// The upstream gradient dO of a naive backward call: q's shape and dtype, contiguous.
fn validate_grad_output(op: &'static str, q: &Operand, d_o: &Operand) -> Result<()> {
    validate_like_q(op, q, d_o, "the gradient of O")?;
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

/// The element strides (batch, head, row) of a rank-4 `[batch, heads, seq, head_dim]` view, with the
/// stride of a dim of size 1 (which no index steps along) replaced by the contiguous one, so that
/// such a dim never fails a rule it cannot break. `None` when the last dim is not contiguous.
fn normalized_strides(shape: &[usize], strides: &[usize], contiguous: bool) -> Option<HeadStrides> {
    let dense = crate::tensor::contiguous_strides(shape);
    let pick = |i: usize| {
        if contiguous || shape[i] <= 1 {
            dense[i] as u64
        } else {
            strides[i] as u64
        }
    };
    (contiguous || shape[3] <= 1 || strides[3] == 1).then(|| HeadStrides {
        batch: pick(0),
        head: pick(1),
        row: pick(2),
    })
}

/// The strides the FlashAttention kernels take for a `[batch, heads, seq, head_dim]` operand, or a
/// named error: the last dim contiguous (stride 1) and every other stride a nonzero multiple of 8
/// elements (16 bytes: the kernels and the copy engine move 16-byte chunks), the seq stride below
/// 2^32 (the kernels' row addressing). `[B, H, S, D]`
/// contiguous and `[B, S, H, D]` memory seen through `transpose(1, 2)` both pass; so does a slice of
/// a fused QKV tensor. A dim of size 1 may have any stride.
fn head_strides(op: &'static str, x: &Operand) -> Result<HeadStrides> {
    let bad = |why: &str| Error::Invalid {
        op,
        msg: format!(
            "{}: strides {:?} of shape {:?} are not supported ({why}); FlashAttention takes any \
             strides whose last one is 1 and whose others are nonzero multiples of 8 elements \
             (16 bytes)",
            x.name, x.strides, x.shape
        ),
    };
    let s = normalized_strides(x.shape, x.strides, x.contiguous)
        .ok_or_else(|| bad("the last dim, head_dim, is not contiguous"))?;
    for (what, stride) in [("batch", s.batch), ("heads", s.head), ("seq", s.row)] {
        if stride == 0 || !stride.is_multiple_of(8) {
            return Err(bad(&format!(
                "the {what} stride {stride} is not a nonzero multiple of 8"
            )));
        }
    }
    if s.row > u32::MAX as u64 {
        return Err(bad(&format!("the seq stride {} is not below 2^32", s.row)));
    }
    Ok(s)
}

/// The strides of a packed `[total, heads, head_dim]` tensor (validated) as the kernels take them:
/// no batch stride, its heads and rows.
fn packed_strides(t: &Tensor) -> HeadStrides {
    HeadStrides {
        batch: 0,
        head: t.strides()[1] as u64,
        row: t.strides()[0] as u64,
    }
}

/// [`head_strides`] of a validated tensor (validation has checked the rules).
fn strides_of(t: &Tensor) -> HeadStrides {
    normalized_strides(t.shape(), t.strides(), t.is_contiguous())
        .expect("validated: head_dim is contiguous")
}

/// A fresh `[b, h, s, d]` tensor (`shape`) laid out in memory as `like` is: `[B, S, H, D]` memory
/// (returned as its `transpose(1, 2)` view) when `like`'s heads interleave within its rows (head
/// stride below row stride, both dims longer than 1), else contiguous `[B, H, S, D]`. So O and dQ
/// come in Q's layout and dK, dV in K's and V's.
fn empty_in_layout_of(like: &Tensor, shape: [usize; 4], dtype: DType) -> Result<Tensor> {
    let (ls, lt) = (like.shape(), like.strides());
    let bshd = ls.len() == 4 && ls[1] > 1 && ls[2] > 1 && lt[1] < lt[2];
    if bshd {
        let [b, h, sq, d] = shape;
        Tensor::empty(like.gpu(), &[b, sq, h, d], dtype)?.transpose(1, 2)
    } else {
        Tensor::empty(like.gpu(), &shape, dtype)
    }
}

/// An operand that must have q's shape and dtype (`what` says what it is).
fn validate_like_q(op: &'static str, q: &Operand, x: &Operand, what: &str) -> Result<()> {
    if x.shape != q.shape {
        return Err(Error::Shape {
            op,
            what: format!("{} ({what}) must have q's shape", x.name),
            expected: format!("{:?}", q.shape),
            got: x.shape.to_vec(),
        });
    }
    if x.dtype != q.dtype {
        return Err(Error::DType {
            op,
            expected: format!("{} (q's dtype) for {}", q.dtype, x.name),
            got: x.dtype,
        });
    }
    Ok(())
}

/// The rules [`flash_backward`] adds to the forward's for O, LSE and dO (`[q, o, lse, d_o]`): O and dO
/// of q's shape and dtype, with strides the kernels take (any layout q may have) and 16-byte aligned
/// (for the kernels' vector loads), LSE `[batch, heads, seq_q]` f32, contiguous, as `flash_forward`
/// returns it.
fn validate_backward_operands(
    op: &'static str,
    d: &Dims,
    [q, o, lse, d_o]: &[Operand; 4],
) -> Result<()> {
    for (x, what) in [(o, "the forward's output O"), (d_o, "the gradient of O")] {
        validate_like_q(op, q, x, what)?;
        head_strides(op, x)?;
        if !x.aligned16 {
            return Err(Error::Invalid {
                op,
                msg: format!(
                    "{} must start at a 16-byte aligned address (a view at an odd offset?)",
                    x.name
                ),
            });
        }
    }
    let want = [d.batch, d.heads, d.seq_q];
    if lse.shape != want {
        return Err(Error::Shape {
            op,
            what: format!(
                "{} (the forward's log-sum-exp, as flash_forward returns it) must be [batch, heads, seq_q]",
                lse.name
            ),
            expected: format!("{want:?}"),
            got: lse.shape.to_vec(),
        });
    }
    if lse.dtype != DType::F32 {
        return Err(Error::DType {
            op,
            expected: format!("f32 for {} (the forward's log-sum-exp)", lse.name),
            got: lse.dtype,
        });
    }
    if !lse.contiguous {
        return Err(Error::NotContiguous {
            op,
            what: lse.name,
            shape: lse.shape.to_vec(),
            strides: lse.strides.to_vec(),
        });
    }
    Ok(())
}

fn shape_param(d: &Dims, params: &AttentionParams, scale: f32, bh_offset: usize) -> AttentionShape {
    // Every value was bounded by `validate` (seq <= 2^30, batch and heads <= 65535, head_dim <= 256).
    let softcap_k = AttentionShape::softcap_raw(params.softcap.unwrap_or(0.0), scale);
    AttentionShape {
        batch: d.batch as u32,
        heads: d.heads as u32,
        kv_heads: d.kv_heads as u32,
        group_member: 0,
        seq_q: d.seq_q as u32,
        seq_k: d.seq_k as u32,
        head_dim: d.head_dim as u32,
        mask: match params.causal {
            Causal::No => MaskKind::None,
            Causal::Yes => MaskKind::Causal,
        },
        scale,
        bh_offset: bh_offset as u32,
        window_left: window_side(params.window.left),
        window_right: window_side(params.window.right),
        softcap_k: softcap_k.0,
        softcap_inv_k: softcap_k.1,
    }
}

/// One side of a window as the kernels take it: [`NO_WINDOW`] when unbounded or past every
/// sequence (a bound of `MAX_SEQ` or more is none).
pub(super) fn window_side(side: Option<usize>) -> u32 {
    match side {
        Some(n) if n < MAX_SEQ => n as u32,
        _ => NO_WINDOW,
    }
}

/// Fresh O (in q's layout, [`empty_in_layout_of`]) and LSE tensors (poisoned in test mode).
fn outputs(q: &Tensor, d: &Dims) -> Result<(Tensor, Tensor)> {
    let o = empty_in_layout_of(q, [d.batch, d.heads, d.seq_q, d.head_dim], q.dtype())?;
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

/// FlashAttention forward: returns `(O, LSE)`. f16/bf16, head dims: multiples of 8 up to
/// [`FLASH_MAX_HEAD_DIM`] (see the module doc for how those off [`FLASH_TILE_DIMS`] run). With the
/// sm_90 build (compute capability 9.0: H100/H200) it runs the Hopper `wgmma` kernels (see
/// `flash_wgmma_variant` for which), with the sm_80 build the `mma.sync` FlashAttention-2 kernel;
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
/// chosen from H100 measurements:
/// - D = 64 when 128-row CTAs would not fill the chip twice over (fewer than two per SM): variant 4,
///   one warpgroup (64 rows) a CTA, so twice the CTAs share the SMs. Seed shape B4 H8 S512 (128
///   CTAs of 128 rows on 132 SMs): 11.3 us vs 12.2 for 128-row CTAs with 128-key tiles, cuDNN 11.8
///   (2026-11-26, 4473b4c).
/// - Otherwise variant 5, the warp-specialised TMA kernel: against the `cp.async` kernels it
///   replaced (2026-11-26, the bundles of 3963f5f and 8bc2a13 in one call, docs/PERF_NOTES.md), D = 128
///   19%-23% faster before its consumers took turns and 3%-4% more after; D = 64 1.6%-6.4% faster
///   at S 8192 and within 1.7% (no significant change) at S 2048.
/// - ALiBi slopes: variant 5 (variant 4 takes none: the bias's registers spilled it, 152 bytes).
fn flash_wgmma_variant(gpu: &crate::Gpu, d: &Dims, params: &AttentionParams) -> u32 {
    if gpu.ptx_arch() != "sm_90" {
        return 0;
    }
    if params.alibi_slopes.is_some() {
        return FLASH_TMA_VARIANT;
    }
    let ctas_of_128_rows = d.seq_q.div_ceil(128) as u64 * d.heads as u64 * d.batch as u64;
    let sms = gpu.sm_count().unwrap_or(0) as u64;
    match d.tile_dim() {
        64 if ctas_of_128_rows < 2 * sms => 4,
        _ => FLASH_TMA_VARIANT,
    }
}

/// FlashAttention kernel `variant` (one of [`FLASH_VARIANTS`], on a device that runs it) on
/// validated inputs: one CTA per (query block, head, batch).
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
    let (o, lse) = outputs(q, d)?;
    if d.batch * d.heads * d.seq_q == 0 {
        return Ok((o, lse));
    }
    let (qs, ks) = (strides_of(q), strides_of(k));
    let (alibi_slopes, alibi_batch) = alibi_fields(params);
    let layout = AttentionLayout {
        q: qs,
        k: ks,
        v: strides_of(v),
        o: strides_of(&o),
        // Backward-only entries: no forward kernel reads them.
        d_o: qs,
        dq: qs,
        dk: ks,
        dv: ks,
        lse: HeadStrides::dense(d.heads as u64, d.seq_q as u64, 1),
        cu_seqlens_q: 0,
        cu_seqlens_k: 0,
        alibi_slopes,
        alibi_batch,
    };
    let views = flash_tma_views(
        [q, k, v],
        [layout.q, layout.k, layout.v],
        (d.seq_q, d.seq_k, d.batch),
        d,
    );
    flash_run(
        op,
        [q, k, v],
        (&o, &lse),
        (params, d, scale),
        variant,
        (layout, views),
    )?;
    Ok((o, lse))
}

/// Launches forward kernel `variant` on operands whose rows `layout` places (dense or packed
/// batches; `views` are Q's, K's and V's for the copy engine, which the TMA kernel needs) into
/// `(o, lse)`; the caller checked a non-empty output. Grid: (query blocks of `d.seq_q` rows, heads,
/// batch).
fn flash_run(
    op: &'static str,
    [q, k, v]: [&Tensor; 3],
    (o, lse): (&Tensor, &Tensor),
    (params, d, scale): (&AttentionParams, &Dims, f32),
    variant: u32,
    (layout, views): (AttentionLayout, Option<[crate::tma::Tensor4; 3]>),
) -> Result<()> {
    if variant == FLASH_TMA_VARIANT {
        let Some(views) = views else {
            return Err(Error::Invalid {
                op,
                msg: "the copy engine cannot read Q, K or V (validation requires 16-byte aligned \
                      tensors; this is a bug)"
                    .into(),
            });
        };
        return flash_tma_launch(op, q, views, (o, lse), (params, d, scale), layout);
    }
    // (kernel, query rows a CTA, threads, dynamic shared memory bytes)
    let kernel = if variant == 0 {
        flash_config(d.tile_dim())
            .zip(flash_kernel(d.tile_dim(), q.dtype()))
            .map(|(c, name)| (name, c.block_q, c.threads(), c.smem_bytes()))
    } else {
        flash_wgmma_kernel(variant, d.tile_dim(), q.dtype())
            .map(|(c, name)| (name, c.block_q, c.threads(), c.smem_bytes()))
    };
    let Some((name, block_q, threads, smem)) = kernel else {
        return Err(Error::Invalid {
            op,
            msg: format!(
                "head_dim {} has no FlashAttention forward kernel in the {} build (it takes head \
                 dims up to {FLASH_MAX_HEAD_DIM_SM80}; up to {FLASH_MAX_HEAD_DIM} need the sm_90 \
                 build: compute capability 9.0)",
                d.head_dim,
                q.gpu().ptx_arch()
            ),
        });
    };
    let q_blocks = query_blocks(op, d, block_q)?;
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
            &ByValue(layout),
        ],
    )
}

/// Query blocks of `block_q` rows (a forward launch's grid x), or an error past u32.
fn query_blocks(op: &'static str, d: &Dims, block_q: usize) -> Result<u32> {
    let blocks = d.seq_q.div_ceil(block_q);
    u32::try_from(blocks).map_err(|_| Error::TooLarge {
        op,
        what: "query blocks",
        given: blocks as u64,
        max: u32::MAX as u64,
    })
}

/// The variant number of the warp-specialised TMA forward (`flash_tma_fwd_d{64,128}_*`).
pub const FLASH_TMA_VARIANT: u32 = 5;

/// Q as a rank-4 tensor `[batch][heads][rows_q][D]` and K, V as `[batch][kv_heads][rows_k][D]`, each
/// with its own (batch, head, row) `strides`, for the copy engine, or `None` when it cannot read
/// them (what validation already refuses). A packed batch is one batch entry of all its rows. With
/// no keys the kernel loads no K or V tile, and their maps are Q's (a map cannot be empty).
fn flash_tma_views(
    [q, k, v]: [&Tensor; 3],
    strides: [HeadStrides; 3],
    (rows_q, rows_k, batch): (usize, usize, usize),
    d: &Dims,
) -> Option<[crate::tma::Tensor4; 3]> {
    let view = |t: &Tensor, s: HeadStrides, rows: usize, heads: usize| crate::tma::Tensor4 {
        ptr: t.raw().ptr,
        inner: d.head_dim as u64,
        outer: rows as u64,
        heads: heads as u64,
        batch: batch as u64,
        outer_stride: s.row,
        head_stride: s.head,
        batch_stride: s.batch,
    };
    let vq = view(q, strides[0], rows_q, d.heads);
    let views = if rows_k == 0 {
        [vq; 3]
    } else {
        [
            vq,
            view(k, strides[1], rows_k, d.kv_heads),
            view(v, strides[2], rows_k, d.kv_heads),
        ]
    };
    views.iter().all(crate::tma::tma_readable4).then_some(views)
}

/// Runs the warp-specialised TMA forward (variant [`FLASH_TMA_VARIANT`]) into `(o, lse)` on Q, K,
/// V seen through `views` (`q` gives the device and dtype).
fn flash_tma_launch(
    op: &'static str,
    q: &Tensor,
    [vq, vk, vv]: [crate::tma::Tensor4; 3],
    (o, lse): (&Tensor, &Tensor),
    (params, d, scale): (&AttentionParams, &Dims, f32),
    layout: AttentionLayout,
) -> Result<()> {
    let Some(c) = flash_tma_config(d.tile_dim()) else {
        return Err(Error::Invalid {
            op,
            msg: format!("no warp-specialised kernel at head dim {}", d.head_dim),
        });
    };
    // The kernel's products cover the head dim's columns rounded up to FLASH_PRODUCT_DIMS, on
    // its tile's shared memory and tensor maps.
    let name = match (flash_product_dim(d.head_dim), q.dtype()) {
        (32, DType::F16) => "flash_tma_fwd_d32_f16",
        (32, DType::BF16) => "flash_tma_fwd_d32_bf16",
        (64, DType::F16) => "flash_tma_fwd_d64_f16",
        (64, DType::BF16) => "flash_tma_fwd_d64_bf16",
        (96, DType::F16) => "flash_tma_fwd_d96_f16",
        (96, DType::BF16) => "flash_tma_fwd_d96_bf16",
        (192, DType::F16) => "flash_tma_fwd_d192_f16",
        (192, DType::BF16) => "flash_tma_fwd_d192_bf16",
        (256, DType::F16) => "flash_tma_fwd_d256_f16",
        (256, DType::BF16) => "flash_tma_fwd_d256_bf16",
        (_, DType::F16) => "flash_tma_fwd_d128_f16",
        (_, DType::BF16) => "flash_tma_fwd_d128_bf16",
        (_, DType::F32) => {
            return Err(Error::Invalid {
                op,
                msg: "FlashAttention takes f16/bf16".into(),
            });
        }
    };
    let map_q = crate::tma::sw128_map4(op, q.dtype(), &vq, c.block_q as u32)?;
    let map_k = crate::tma::sw128_map4(op, q.dtype(), &vk, c.block_k as u32)?;
    let map_v = crate::tma::sw128_map4(op, q.dtype(), &vv, c.block_k as u32)?;
    let q_blocks = query_blocks(op, d, c.block_q)?;
    let launch = LaunchConfig {
        grid_dim: (q_blocks, d.heads as u32, d.batch as u32),
        block_dim: (c.tma_threads() as u32, 1, 1),
        shared_mem_bytes: flash_tma_smem_bytes(c) as u32,
    };
    launch_cfg_large_smem(
        q.gpu(),
        name,
        launch,
        &[
            &ByValue(map_q),
            &ByValue(map_k),
            &ByValue(map_v),
            &ByValue(o.raw()),
            &ByValue(lse.raw()),
            &ByValue(shape_param(d, params, scale, 0)),
            &ByValue(layout),
        ],
    )
}

/// The one-warpgroup wgmma kernel (variant 4, D = 64) for a dtype, with its config.
fn flash_wgmma_kernel(
    variant: u32,
    head_dim: usize,
    dtype: DType,
) -> Option<(FlashWgmmaConfig, &'static str)> {
    let name = match (variant, head_dim, dtype) {
        (4, 64, DType::F16) => "flash_wg4_fwd_d64_f16",
        (4, 64, DType::BF16) => "flash_wg4_fwd_d64_bf16",
        _ => return None,
    };
    Some((FLASH_WG_D64_Q64, name))
}

/// The FlashAttention kernels [`flash_forward_variant`] can select: 0 the `mma.sync` kernel (sm_80
/// build), 4 the one-warpgroup wgmma kernel (sm_90 build, D = 64) and 5 the warp-specialised TMA
/// kernel (sm_90 build). Each is what [`flash_forward`] runs for some shape; the selector lets the
/// tests cover every kernel on every shape. (Numbers 1 to 3 were `cp.async` wgmma kernels, deleted
/// when measured slower: docs/PERF_NOTES.md.)
#[doc(hidden)]
pub const FLASH_VARIANTS: [u32; 3] = [0, 4, FLASH_TMA_VARIANT];

/// Whether `gpu` runs FlashAttention kernel `variant` at head dim `head_dim`: 0 with the sm_80 build
/// (see `Build::Portable` to run it on a 9.0 device), the wgmma kernels with the sm_90 build.
#[doc(hidden)]
pub fn flash_variant_supported(gpu: &crate::Gpu, variant: u32, head_dim: usize) -> bool {
    match variant {
        0 => gpu.ptx_arch() == "sm_80" && flash_config(flash_tile_dim(head_dim)).is_some(),
        4 => gpu.ptx_arch() == "sm_90" && flash_tile_dim(head_dim) == 64,
        FLASH_TMA_VARIANT => {
            gpu.ptx_arch() == "sm_90" && flash_tma_config(flash_tile_dim(head_dim)).is_some()
        }
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
                 the sm_80 build; 4 in the sm_90 build at head dim 64; 5 there at head dims 64 \
                 and 128)",
                d.head_dim,
                q.gpu().ptx_arch()
            ),
        });
    }
    if variant != FLASH_TMA_VARIANT && params.alibi_slopes.is_some() {
        return Err(Error::Invalid {
            op: OP,
            msg: format!(
                "FlashAttention kernel {variant} takes no ALiBi slopes; kernel \
                 {FLASH_TMA_VARIANT} (what flash_forward runs with them) does"
            ),
        });
    }
    flash_launch(OP, q, k, v, params, &d, scale, variant)
}

/// FlashAttention backward: `(dQ, dK, dV)` for upstream gradient `d_o`, from the inputs, `params` and
/// the outputs `(o, lse)` of the [`flash_forward`] call (same shapes and contract: `[B, H, S, D]`
/// with any strides the kernels take, each gradient in its input's layout, f16/bf16, the head dims [`flash_forward`] takes, causal bottom-right or not, any lengths).
/// Gradients in the input dtype; rows that see no key get dQ = 0 and add nothing to dK and dV.
///
/// FlashAttention-2's algorithm on tensor cores: Hopper `wgmma` with the sm_90 build
/// (`gpu/src/kernels/attention/flash_wg_bwd.rs`), `mma.sync` with the sm_80 build (`flash_bwd.rs`):
/// a pre-pass computes `D = rowsum(dO * O)`, one CTA per block of keys keeps dK and dV in registers
/// and walks the query blocks, recomputing `P` from the LSE, and adds each partial dQ block into an
/// f32 accumulator; a last kernel rounds dQ. **Deterministic**: the partial dQ blocks of a query
/// block are added one key block at a time, in ascending order, behind a turn counter per query
/// block (no float atomics whose order varies), so every run gives the same bits. Extra device
/// memory: the f32 dQ accumulator (`4 B H S_q D` bytes) and `O(B H S_q)` bytes of statistics and
/// counters, never `S_q S_k`.
///
/// ```no_run
/// use host::ops::attention::{self, AttentionParams, Causal};
/// use host::{DType, Gpu, Tensor};
/// # fn main() -> host::Result<()> {
/// let gpu = Gpu::new(0)?;
/// let q = Tensor::from_f32(&gpu, &vec![0.1; 2 * 4 * 100 * 64], &[2, 4, 100, 64], DType::BF16)?;
/// let kv = Tensor::from_f32(&gpu, &vec![0.2; 2 * 4 * 300 * 64], &[2, 4, 300, 64], DType::BF16)?;
/// let params = AttentionParams { causal: Causal::Yes, scale: None, ..Default::default() };
/// let (o, lse) = attention::flash_forward(&q, &kv, &kv, &params)?;
/// let d_o = Tensor::from_f32(&gpu, &vec![1.0; 2 * 4 * 100 * 64], &[2, 4, 100, 64], DType::BF16)?;
/// let g = attention::flash_backward(&q, &kv, &kv, &o, &lse, &d_o, &params)?;
/// assert_eq!((g.dq.shape(), g.dk.shape()), (&[2, 4, 100, 64][..], &[2, 4, 300, 64][..]));
/// # Ok(()) }
/// ```
pub fn flash_backward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    o: &Tensor,
    lse: &Tensor,
    d_o: &Tensor,
    params: &AttentionParams,
) -> Result<AttentionGrads> {
    flash_backward_with(q, k, v, o, lse, d_o, params, BackwardMode::Deterministic)
}

/// How [`flash_backward_with`] sums the partial dQ blocks of the key blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BackwardMode {
    /// In a fixed key-block order behind turn counters: the same bits on every run (what
    /// [`flash_backward`] does). The order depends on the shape and the GPU's SM count (see
    /// `gpu/src/kernels/attention/flash_bwd.rs`), so bits agree between runs of one shape on one
    /// GPU model.
    #[default]
    Deterministic,
    /// In the order the key blocks arrive (f32 additions whose order varies): dQ may differ in its
    /// last bits from run to run; dK and dV are the same. Faster where the turn order makes CTAs
    /// wait (docs/PERF_NOTES.md has the cost). The sm_90 build's wgmma kernel only: the sm_80
    /// build is deterministic in both modes.
    Nondeterministic,
}

/// [`flash_backward`] with the dQ summation order chosen by `mode`.
#[allow(clippy::too_many_arguments)]
pub fn flash_backward_with(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    o: &Tensor,
    lse: &Tensor,
    d_o: &Tensor,
    params: &AttentionParams,
    mode: BackwardMode,
) -> Result<AttentionGrads> {
    const OP: &str = "attention::flash_backward";
    let (d, scale) = validate(OP, Path::Flash, q, k, v, params)?;
    let grads = empty_grads(q, k, v, &d)?;
    flash_backward_launch(
        OP,
        [q, k, v, o, lse, d_o],
        (params, d, scale),
        mode,
        GradsOut::Rounded(&grads),
    )?;
    Ok(grads)
}

/// [`flash_backward`] adding its gradients into the f32 accumulators `acc` (dQ of q's shape, dK and
/// dV of k's; f32, contiguous, 16-byte aligned) instead of returning them rounded to the input
/// type: for callers that sum the gradients of several calls and round once (ring attention sums
/// each key block's dK/dV over the ring's steps). Deterministic, as [`flash_backward`].
#[allow(clippy::too_many_arguments)]
pub fn flash_backward_add(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    o: &Tensor,
    lse: &Tensor,
    d_o: &Tensor,
    params: &AttentionParams,
    acc: &AttentionGrads,
) -> Result<()> {
    const OP: &str = "attention::flash_backward_add";
    let (d, scale) = validate(OP, Path::Flash, q, k, v, params)?;
    if params.has_model_features() {
        return Err(Error::Invalid {
            op: OP,
            msg: format!(
                "the accumulating backward takes no sliding window, softcap or ALiBi slopes ({}); \
                 flash_backward does",
                params.model_features_given()
            ),
        });
    }
    let kv = [d.batch, d.kv_heads, d.seq_k, d.head_dim];
    for (name, t, shape) in [
        ("acc.dq", &acc.dq, q.shape()),
        ("acc.dk", &acc.dk, &kv[..]),
        ("acc.dv", &acc.dv, &kv[..]),
    ] {
        if !q.gpu().same_device(t.gpu()) {
            return Err(Error::DeviceMismatch { op: OP });
        }
        if t.shape() != shape {
            return Err(Error::Shape {
                op: OP,
                what: format!("{name} (an f32 accumulator) must have the shape of its gradient"),
                expected: format!("{shape:?}"),
                got: t.shape().to_vec(),
            });
        }
        if t.dtype() != DType::F32 {
            return Err(Error::DType {
                op: OP,
                expected: format!("f32 for {name} (the accumulators are f32)"),
                got: t.dtype(),
            });
        }
        t.require_contiguous(OP, "accumulator")?;
        if !aligned16(&[t]) {
            return Err(Error::Invalid {
                op: OP,
                msg: format!("{name} must start at a 16-byte aligned address"),
            });
        }
    }
    flash_backward_launch(
        OP,
        [q, k, v, o, lse, d_o],
        (params, d, scale),
        BackwardMode::Deterministic,
        GradsOut::AddF32(acc),
    )
}

/// Where a backward call's gradients go.
#[derive(Clone, Copy)]
enum GradsOut<'a> {
    /// Stored in these input-dtype tensors.
    Rounded(&'a AttentionGrads),
    /// Added into these f32 tensors.
    AddF32(&'a AttentionGrads),
}

/// The backward's launches for validated Q, K, V (`x` = q, k, v, o, lse, d_o).
fn flash_backward_launch(
    op: &'static str,
    x: [&Tensor; 6],
    (params, d, scale): (&AttentionParams, Dims, f32),
    mode: BackwardMode,
    out: GradsOut,
) -> Result<()> {
    let [q, k, v, o, lse, d_o] = x;
    for x in [o, lse, d_o] {
        if !q.gpu().same_device(x.gpu()) {
            return Err(Error::DeviceMismatch { op });
        }
    }
    validate_backward_operands(
        op,
        &d,
        &[
            Operand::of("q", q),
            Operand::of("o", o),
            Operand::of("lse", lse),
            Operand::of("d_o", d_o),
        ],
    )?;
    let layout = {
        let (alibi_slopes, alibi_batch) = alibi_fields(params);
        let (dq, dk, dv) = match out {
            GradsOut::Rounded(g) => (strides_of(&g.dq), strides_of(&g.dk), strides_of(&g.dv)),
            GradsOut::AddF32(g) => (strides_of(&g.dq), strides_of(&g.dk), strides_of(&g.dv)),
        };
        AttentionLayout {
            q: strides_of(q),
            k: strides_of(k),
            v: strides_of(v),
            o: strides_of(o),
            d_o: strides_of(d_o),
            dq,
            dk,
            dv,
            lse: HeadStrides::dense(d.heads as u64, d.seq_q as u64, 1),
            cu_seqlens_q: 0,
            cu_seqlens_k: 0,
            alibi_slopes,
            alibi_batch,
        }
    };
    flash_backward_run(op, x, (params, d, scale), mode, out, layout)
}

/// The backward's launches for validated operands whose rows `layout` places (a dense batch, or a
/// packed one: then `d.seq_q`, `d.seq_k` are its longest sequences, whose dQ order every shorter
/// one keeps; see the order's choice below). The gradients' strides in `layout` are those
/// of the rounded outputs (the f32 accumulators are contiguous and the kernels that add into them
/// take no strides).
fn flash_backward_run(
    op: &'static str,
    [q, k, v, o, lse, d_o]: [&Tensor; 6],
    (params, d, scale): (&AttentionParams, Dims, f32),
    mode: BackwardMode,
    out: GradsOut,
    layout: AttentionLayout,
) -> Result<()> {
    let packed = layout.cu_seqlens_q != 0;
    let gpu = q.gpu();
    // A window walks the plain order, which the general kernels take; the scored kernels walk it
    // too and take the softcap and ALiBi.
    let needs = if params.modifies_scores() {
        BwdNeeds::Scores
    } else if packed && !params.window.is_bounded() && !matches!(out, GradsOut::AddF32(_)) {
        BwdNeeds::Packed
    } else if packed || params.window.is_bounded() {
        BwdNeeds::GeneralWalk
    } else if matches!(out, GradsOut::AddF32(_)) {
        BwdNeeds::DenseAdding
    } else {
        BwdNeeds::Dense
    };
    let Some(names) = flash_bwd_kernels(d.head_dim, q.dtype(), gpu.ptx_arch(), needs) else {
        let widest = if gpu.ptx_arch() == "sm_90" {
            FLASH_MAX_HEAD_DIM
        } else {
            FLASH_MAX_HEAD_DIM_SM80
        };
        return Err(Error::Invalid {
            op,
            msg: format!(
                "no FlashAttention backward kernel for head dim {} {} in the {} build (the backward \
                 takes multiples of 8 up to {widest}){}",
                d.head_dim,
                q.dtype(),
                gpu.ptx_arch(),
                if packed {
                    " for packed batches (they need the sm_90 build: compute capability 9.0)"
                } else {
                    ""
                }
            ),
        });
    };
    let heads_total = d.batch * d.heads;
    if heads_total == 0 || d.seq_q + d.seq_k == 0 {
        return Ok(());
    }
    let group = d.heads / d.kv_heads;
    // Grouped-query heads: dK and dV sum over the group's query heads in member order (the same
    // bits every run). The wgmma kernel walks the whole group in each CTA ([`GROUP_ALL`]: one
    // launch, the sums in registers), or under the causal mask at D = 128 runs a CTA a query head
    // (`flash_wg_bwd_members_*`, the member grid: the group's CTAs meet in f32 sums in member
    // order, the last storing them rounded): whole-group CTAs walk `group` times longer and, the
    // causal walks' lengths spreading from 1 to `n_q` blocks, the longest of them finish last.
    // The mma.sync kernel takes one launch a group member, each adding every dK/dV row once into
    // f32 accumulators (rounded outputs get zeroed accumulators first and are rounded at the end).
    let wgmma = names.main.starts_with("flash_wg_bwd_");
    let member_grid = matches!(out, GradsOut::Rounded(_))
        && group > 1
        && params.causal == Causal::Yes
        && !names.members.is_empty();
    let launches_per_member = group > 1 && !wgmma;
    let kv_elems = d.batch * d.kv_heads * d.seq_k * d.head_dim;
    let kv_acc = match out {
        GradsOut::Rounded(_) if launches_per_member => Some((
            Tensor::zeros(gpu, &[kv_elems], DType::F32)?,
            Tensor::zeros(gpu, &[kv_elems], DType::F32)?,
        )),
        _ => None,
    };
    // The member grid's f32 sums (its member 0 writes them before any member reads them).
    let member_sums = if member_grid {
        Some((
            Tensor::empty(gpu, &[kv_elems], DType::F32)?,
            Tensor::empty(gpu, &[kv_elems], DType::F32)?,
        ))
    } else {
        None
    };
    let (grads, main, add) = match out {
        GradsOut::Rounded(g) if member_grid => (g, names.members, false),
        GradsOut::Rounded(g) if launches_per_member => (g, names.main_add, false),
        GradsOut::Rounded(g) => (g, names.main, false),
        GradsOut::AddF32(g) => (g, names.main_add, true),
    };
    let pre_blocks = d.seq_q.div_ceil(FLASH_BWD_PRE_ROWS);
    let n_kblocks = d.seq_k.div_ceil(names.block_k);
    // The LSE in log2 units and D per query row (f32, padded to whole pre-pass blocks), a turn
    // counter per 8 query rows padded the same way (u32, in an f32 tensor: only the kernels read it), the f32 dQ
    // accumulator. The pre-pass writes all three.
    let stats = Tensor::empty(
        gpu,
        &[2 * heads_total * pre_blocks * FLASH_BWD_PRE_ROWS],
        DType::F32,
    )?;
    // With the member grid, a zeroed counter a key/value head's key block follows the dQ turns.
    let dq_turns = heads_total * pre_blocks * (FLASH_BWD_PRE_ROWS / FLASH_BWD_TURN_ROWS);
    let turns = if member_grid {
        Tensor::zeros(
            gpu,
            &[dq_turns + d.batch * d.kv_heads * n_kblocks],
            DType::F32,
        )?
    } else {
        Tensor::empty(gpu, &[dq_turns], DType::F32)?
    };
    // The dQ accumulator's rows are the kernels' tile wide (padded past the head dim); the f32 dK
    // and dV sums' (`kv_acc`, or the caller's) the head dim.
    let dq_acc = Tensor::empty(gpu, &[heads_total * d.seq_q * d.tile_dim()], DType::F32)?;
    let shape = shape_param(&d, params, scale, 0);
    let grid = |blocks: usize, what: &'static str| {
        u32::try_from(blocks).map_err(|_| Error::TooLarge {
            op,
            what,
            given: blocks as u64,
            max: u32::MAX as u64,
        })
    };
    let (qb, kb) = (
        grid(pre_blocks, "query blocks")?,
        grid(n_kblocks, "key blocks")?,
    );
    if d.seq_q > 0 {
        launch_cfg(
            gpu,
            names.pre,
            LaunchConfig {
                grid_dim: (qb, d.heads as u32, d.batch as u32),
                block_dim: (flash_bwd::PRE_THREADS, 1, 1),
                shared_mem_bytes: 0,
            },
            &[
                &ByValue(o.raw()),
                &ByValue(d_o.raw()),
                &ByValue(lse.raw()),
                &ByValue(stats.raw()),
                &ByValue(dq_acc.raw()),
                &ByValue(turns.raw()),
                &ByValue(shape),
                &ByValue(layout),
            ],
        )?;
    }
    // With seq_q = 0 the main kernel still runs: no query block to walk, dK = dV = 0 written.
    if d.seq_k > 0 {
        // The wgmma kernel's dQ order (its last argument; the mma.sync kernel has none).
        let walk = DqWalk {
            n_qblocks: d.seq_q.div_ceil(names.block_q) as u32,
            n_kblocks: n_kblocks as u32,
            block_q: names.block_q as u32,
            block_k: names.block_k as u32,
            causal: params.causal == Causal::Yes,
            diag: d.seq_k as i32 - d.seq_q as i32,
            band: Band::of(&shape),
        };
        // The plain order (each CTA waits only for CTAs of lower key blocks, started before it)
        // under a window and on the general kernels with the head dim split; otherwise the
        // rotated orders of the longest sequences, which hold for every shorter one of a packed
        // batch (a causal head's waits point to the next key block's CTA, started before it on
        // the reversed grid; an unmasked head's CTAs fit on the GPU at once), but for the late
        // release: only where every sequence has as many keys as queries, which the same offsets
        // for both say.
        let order = if params.window.is_bounded() || names.plain_order {
            match mode {
                BackwardMode::Deterministic => DQ_ORDERED,
                BackwardMode::Nondeterministic => 0,
            }
        } else if packed && layout.cu_seqlens_q != layout.cu_seqlens_k {
            dq_order(gpu, mode, &walk) & !DQ_LATE_RELEASE
        } else {
            dq_order(gpu, mode, &walk)
        };
        let (q_, k_, v_, do_) = (
            ByValue(q.raw()),
            ByValue(k.raw()),
            ByValue(v.raw()),
            ByValue(d_o.raw()),
        );
        let (dk_out, dv_out) = match &kv_acc {
            Some((dk, dv)) => (dk.raw(), dv.raw()),
            None => (grads.dk.raw(), grads.dv.raw()),
        };
        // The member grid's dK and dV: its sums and the rounded outputs.
        let (dk_sums, dv_sums) = match &member_sums {
            Some((dk, dv)) => (dk.raw(), dv.raw()),
            None => Default::default(),
        };
        let (st_, acc_, turns_) = (
            ByValue(stats.raw()),
            ByValue(dq_acc.raw()),
            ByValue(turns.raw()),
        );
        let (dk_, dv_) = (ByValue(dk_out), ByValue(dv_out));
        let (dk_m, dv_m) = (
            ByValue(MemberSumParam {
                sums: dk_sums,
                out: dk_out,
            }),
            ByValue(MemberSumParam {
                sums: dv_sums,
                out: dv_out,
            }),
        );
        let (dk_arg, dv_arg): (&dyn crate::launch::ArgPush, &dyn crate::launch::ArgPush) =
            if member_grid {
                (&dk_m, &dv_m)
            } else {
                (&dk_, &dv_)
            };
        let strides_ = ByValue(layout);
        // Grid y: the key/value heads; launch `r` takes query head `y * group + r` of each, or
        // the one launch all of them; with the member grid, the query heads.
        let launch_members: Vec<u32> = if launches_per_member {
            (0..group as u32).collect()
        } else if group > 1 && !member_grid {
            vec![GROUP_ALL]
        } else {
            vec![0]
        };
        let grid_y = if member_grid { d.heads } else { d.kv_heads };
        for member in launch_members {
            let shape_ = ByValue(AttentionShape {
                group_member: member,
                ..shape
            });
            // The wgmma kernel takes its dQ order before the strides; the mma.sync kernel has none.
            let wgmma_args: [&dyn crate::launch::ArgPush; 12] = [
                &q_, &k_, &v_, &do_, &st_, &acc_, &turns_, dk_arg, dv_arg, &shape_, &order,
                &strides_,
            ];
            let mma_args: [&dyn crate::launch::ArgPush; 11] = [
                &q_, &k_, &v_, &do_, &st_, &acc_, &turns_, &dk_, &dv_, &shape_, &strides_,
            ];
            let args: &[&dyn crate::launch::ArgPush] = if wgmma { &wgmma_args } else { &mma_args };
            launch_cfg_large_smem(
                gpu,
                main,
                LaunchConfig {
                    grid_dim: (kb, grid_y as u32, d.batch as u32),
                    block_dim: (names.threads, 1, 1),
                    shared_mem_bytes: names.smem_bytes,
                },
                args,
            )?;
        }
    }
    // f32 rows `[batch, heads, seq, head_dim]` to the input type, in `out`'s strides (the layout's
    // entry for it) and sequence offsets.
    let convert = |(acc, acc_cols): (&Tensor, usize),
                   out: &Tensor,
                   (out_strides, heads, seq, cu): (HeadStrides, usize, usize, u64),
                   scale: f32| {
        let rows_per_block = flash_bwd::CONVERT_THREADS as usize / (d.head_dim / 8);
        if seq == 0 {
            return Ok(());
        }
        launch_cfg(
            gpu,
            names.convert,
            LaunchConfig {
                grid_dim: (
                    grid(seq.div_ceil(rows_per_block), "row blocks")?,
                    heads as u32,
                    d.batch as u32,
                ),
                block_dim: (flash_bwd::CONVERT_THREADS, 1, 1),
                shared_mem_bytes: 0,
            },
            &[
                &ByValue(acc.raw()),
                &ByValue(out.raw()),
                &(heads as u32),
                &(seq as u32),
                &(d.head_dim as u32),
                &(acc_cols as u32),
                &ByValue(out_strides),
                &cu,
                &scale,
            ],
        )
    };
    if let Some((dk_acc, dv_acc)) = &kv_acc {
        // dK was scaled in the kernel: both round as they are.
        convert(
            (dk_acc, d.head_dim),
            &grads.dk,
            (layout.dk, d.kv_heads, d.seq_k, layout.cu_seqlens_k),
            1.0,
        )?;
        convert(
            (dv_acc, d.head_dim),
            &grads.dv,
            (layout.dv, d.kv_heads, d.seq_k, layout.cu_seqlens_k),
            1.0,
        )?;
    }
    // With seq_k = 0 the accumulator stays as the pre-pass zeroed it: dQ = 0.
    if add {
        // Into the caller's contiguous f32 dQ.
        let n8 = (heads_total * d.seq_q * d.head_dim / 8) as u64;
        if n8 > 0 {
            launch(
                gpu,
                "flash_bwd_dq_add_f32",
                grid_blocks(n8, flash_bwd::CONVERT_THREADS as u64),
                flash_bwd::CONVERT_THREADS,
                &[
                    &ByValue(dq_acc.raw()),
                    &ByValue(grads.dq.raw()),
                    &n8,
                    &(d.head_dim as u32),
                    &(d.tile_dim() as u32),
                    &scale,
                ],
            )?;
        }
    } else {
        convert(
            (&dq_acc, d.tile_dim()),
            &grads.dq,
            (layout.dq, d.heads, d.seq_q, layout.cu_seqlens_q),
            scale,
        )?;
    }
    Ok(())
}

/// The wgmma backward's dQ order flags (`DQ_*`) for a head walked as `w`. Deterministic calls wait
/// for turns. The walk is rotated, which spares the CTAs the start-up waits of the ascending order:
/// under the causal mask always, with the grid reversed so that a CTA waits only for CTAs started
/// before it; without a mask where a head's CTAs fit on half the SMs (one CTA an SM), for there a
/// CTA may wait for one of its head started after it, so all of them must be able to run at once,
/// with room left for whatever else runs on the GPU. Longer unmasked heads keep the ascending
/// order, in which a CTA waits only for CTAs started before it. Rotated walks release turns a step late where that holds
/// no CTA back (docs/PERF_NOTES.md has what each costs). The nondeterministic mode walks as the
/// deterministic one would, so its dK and dV are the same bits.
fn dq_order(gpu: &crate::Gpu, mode: BackwardMode, w: &DqWalk) -> u32 {
    let sms = gpu.sm_count().unwrap_or(0);
    // Causal rotated waits point to the next key block only; a reversed grid starts it first.
    let rotated = (w.causal || w.n_kblocks <= sms / 2) && dq_rotated_fits(w.n_qblocks, w.n_kblocks);
    let mut order = match (rotated, w.causal) {
        (false, _) => 0,
        (true, false) => DQ_ROTATED,
        (true, true) => DQ_ROTATED | DQ_REVERSED_GRID,
    };
    if mode == BackwardMode::Deterministic {
        order |= DQ_ORDERED;
        if rotated && dq_late_release_fits(w) {
            order |= DQ_LATE_RELEASE;
        }
    }
    order
}

/// The three kernels of one [`flash_backward`] call, with the main kernel's launch shape.
#[derive(Clone, Copy, Debug)]
struct FlashBwdKernels {
    pre: &'static str,
    main: &'static str,
    /// The main kernel adding dK and dV into f32 accumulators ("" for the scored kernels: the
    /// accumulating backward refuses a softcap and ALiBi).
    main_add: &'static str,
    /// The member-grid kernel (`flash_wg_bwd_members_*`: a CTA a query head, the group's dK and
    /// dV summed into f32 in member order) that grouped-query heads take under the causal mask;
    /// "" where there is none (head dims other than 128; the general, scored and mma.sync kernels).
    members: &'static str,
    convert: &'static str,
    /// Keys per CTA of the main kernel, query rows a step, its threads and dynamic shared memory.
    block_k: usize,
    block_q: usize,
    threads: u32,
    smem_bytes: u32,
    /// The main kernel walks the plain dQ order only (a general one with the head dim split).
    plain_order: bool,
}

/// What a backward call needs of its main kernel beyond a dense batch at the tile's head dim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BwdNeeds {
    /// Nothing more (a narrower head dim is read off the head dim).
    Dense,
    /// As `Dense`, for the f32-adding main kernel: in the sm_90 build the dense kernels of head
    /// dims 32, 96 and 192 have no adding form, so those take the general kernels.
    DenseAdding,
    /// The general walk: a packed batch or a sliding window.
    GeneralWalk,
    /// A packed batch with no window, writing the rounded gradients: at a tile's head dim the
    /// `_packed_` kernels, else as [`BwdNeeds::GeneralWalk`].
    Packed,
    /// A softcap or ALiBi slopes (and anything the general walk takes).
    Scores,
}

/// The backward's kernels for head dim `head_dim` (any [`flash_head_dim_supported`]; `None` for
/// another) and the build `ptx_arch` (a device's [`crate::Gpu::ptx_arch`]): the sm_90 build's main
/// kernel is a wgmma one (`flash_wg_bwd_*`: the dense kernels at a tile's width or at 32, 96 and 192; the
/// `_general_` ones for a call whose walk needs them ([`BwdNeeds::GeneralWalk`]) or another head dim; the
/// `_scored_` ones for a softcap or ALiBi, whose main kernel adds into no f32 accumulators), the
/// sm_80 build's the `mma.sync` one (`flash_bwd_d*`, none of those); the pre-pass and the dQ
/// conversion are shared.
fn flash_bwd_kernels(
    head_dim: usize,
    dtype: DType,
    ptx_arch: &str,
    needs: BwdNeeds,
) -> Option<FlashBwdKernels> {
    let general_walk = matches!(
        needs,
        BwdNeeds::GeneralWalk | BwdNeeds::Packed | BwdNeeds::Scores
    );
    let (pre, convert) = match dtype {
        DType::F16 => ("flash_bwd_pre_f16", "flash_bwd_dq_f16"),
        DType::BF16 => ("flash_bwd_pre_bf16", "flash_bwd_dq_bf16"),
        DType::F32 => return None,
    };
    if !flash_head_dim_supported(head_dim) {
        return None;
    }
    let tile = flash_tile_dim(head_dim);
    let wgmma = ptx_arch == "sm_90";
    // The dense wgmma kernels take a dense batch at their product columns exactly (the tile's, or
    // 32 / 96 / 192 on the tile above); other head dims zero-fill on the general kernels.
    let dense_dim = flash_wg_bwd_config(head_dim)
        .is_some_and(|c| needs != BwdNeeds::DenseAdding || c.cols == c.head_dim);
    let general = wgmma && (general_walk || !dense_dim);
    // The dense kernels' key: their product columns (the general ones': their tile).
    let key = if wgmma && !general { head_dim } else { tile };
    let (main, main_add) = match (wgmma, general, key, dtype) {
        (false, _, _, _) if general_walk => return None,
        (true, _, 64, DType::F16) if needs == BwdNeeds::Scores => {
            ("flash_wg_bwd_scored_d64_f16", "")
        }
        (true, _, 64, DType::BF16) if needs == BwdNeeds::Scores => {
            ("flash_wg_bwd_scored_d64_bf16", "")
        }
        (true, _, 128, DType::F16) if needs == BwdNeeds::Scores => {
            ("flash_wg_bwd_scored_d128_f16", "")
        }
        (true, _, 128, DType::BF16) if needs == BwdNeeds::Scores => {
            ("flash_wg_bwd_scored_d128_bf16", "")
        }
        (true, _, 256, DType::F16) if needs == BwdNeeds::Scores => {
            ("flash_wg_bwd_scored_d256_f16", "")
        }
        (true, _, 256, DType::BF16) if needs == BwdNeeds::Scores => {
            ("flash_wg_bwd_scored_d256_bf16", "")
        }
        (true, _, 64, DType::F16) if needs == BwdNeeds::Packed && head_dim == 64 => (
            "flash_wg_bwd_packed_d64_f16",
            "flash_wg_bwd_general_add_d64_f16",
        ),
        (true, _, 64, DType::BF16) if needs == BwdNeeds::Packed && head_dim == 64 => (
            "flash_wg_bwd_packed_d64_bf16",
            "flash_wg_bwd_general_add_d64_bf16",
        ),
        (true, _, 128, DType::F16) if needs == BwdNeeds::Packed && head_dim == 128 => (
            "flash_wg_bwd_packed_d128_f16",
            "flash_wg_bwd_general_add_d128_f16",
        ),
        (true, _, 128, DType::BF16) if needs == BwdNeeds::Packed && head_dim == 128 => (
            "flash_wg_bwd_packed_d128_bf16",
            "flash_wg_bwd_general_add_d128_bf16",
        ),
        (false, _, 64, DType::F16) => ("flash_bwd_d64_f16", "flash_bwd_add_d64_f16"),
        (false, _, 64, DType::BF16) => ("flash_bwd_d64_bf16", "flash_bwd_add_d64_bf16"),
        (false, _, 128, DType::F16) => ("flash_bwd_d128_f16", "flash_bwd_add_d128_f16"),
        (false, _, 128, DType::BF16) => ("flash_bwd_d128_bf16", "flash_bwd_add_d128_bf16"),
        // No f32-adding form at 32, 96 and 192: the accumulating backward runs the general kernels there
        // (`flash_backward_run`).
        (true, false, 32, DType::F16) => ("flash_wg_bwd_d32_f16", ""),
        (true, false, 32, DType::BF16) => ("flash_wg_bwd_d32_bf16", ""),
        (true, false, 96, DType::F16) => ("flash_wg_bwd_d96_f16", ""),
        (true, false, 96, DType::BF16) => ("flash_wg_bwd_d96_bf16", ""),
        (true, false, 192, DType::F16) => ("flash_wg_bwd_d192_f16", ""),
        (true, false, 192, DType::BF16) => ("flash_wg_bwd_d192_bf16", ""),
        (true, false, 64, DType::F16) => ("flash_wg_bwd_d64_f16", "flash_wg_bwd_add_d64_f16"),
        (true, false, 64, DType::BF16) => ("flash_wg_bwd_d64_bf16", "flash_wg_bwd_add_d64_bf16"),
        (true, false, 128, DType::F16) => ("flash_wg_bwd_d128_f16", "flash_wg_bwd_add_d128_f16"),
        (true, false, 128, DType::BF16) => ("flash_wg_bwd_d128_bf16", "flash_wg_bwd_add_d128_bf16"),
        (true, false, 256, DType::F16) => ("flash_wg_bwd_d256_f16", "flash_wg_bwd_add_d256_f16"),
        (true, false, 256, DType::BF16) => ("flash_wg_bwd_d256_bf16", "flash_wg_bwd_add_d256_bf16"),
        (true, true, 256, DType::F16) => (
            "flash_wg_bwd_general_d256_f16",
            "flash_wg_bwd_general_add_d256_f16",
        ),
        (true, true, 256, DType::BF16) => (
            "flash_wg_bwd_general_d256_bf16",
            "flash_wg_bwd_general_add_d256_bf16",
        ),
        (true, true, 64, DType::F16) => (
            "flash_wg_bwd_general_d64_f16",
            "flash_wg_bwd_general_add_d64_f16",
        ),
        (true, true, 64, DType::BF16) => (
            "flash_wg_bwd_general_d64_bf16",
            "flash_wg_bwd_general_add_d64_bf16",
        ),
        (true, true, 128, DType::F16) => (
            "flash_wg_bwd_general_d128_f16",
            "flash_wg_bwd_general_add_d128_f16",
        ),
        (true, true, 128, DType::BF16) => (
            "flash_wg_bwd_general_d128_bf16",
            "flash_wg_bwd_general_add_d128_bf16",
        ),
        _ => return None,
    };
    let (block_k, block_q, threads, smem_bytes, split) = if wgmma {
        let c = flash_wg_bwd_config_of(key, general, needs == BwdNeeds::Scores)?;
        (
            c.block_k,
            c.block_q,
            c.threads(),
            c.smem_bytes(),
            c.split_head,
        )
    } else {
        let c = flash_bwd_config(tile)?;
        (c.block_k, c.block_q, c.threads(), c.smem_bytes(), false)
    };
    let members = match (wgmma && !general && needs == BwdNeeds::Dense, key, dtype) {
        // (At 64 and 256 ptxas serialised or spilled the member grid: those keep whole groups.)
        (true, 128, DType::F16) => "flash_wg_bwd_members_d128_f16",
        (true, 128, DType::BF16) => "flash_wg_bwd_members_d128_bf16",
        _ => "",
    };
    Some(FlashBwdKernels {
        pre,
        main,
        main_add,
        members,
        convert,
        block_k,
        block_q,
        threads: threads as u32,
        smem_bytes: smem_bytes as u32,
        plain_order: general && split,
    })
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

/// Gradient tensors of a backward call, allocated (uninitialised) in q's dtype, each in the layout of
/// its input ([`empty_in_layout_of`]): dQ shaped as q, dK and dV as `[batch, kv_heads, seq_k,
/// head_dim]`.
fn empty_grads(q: &Tensor, k: &Tensor, v: &Tensor, d: &Dims) -> Result<AttentionGrads> {
    let q_shape = [d.batch, d.heads, d.seq_q, d.head_dim];
    let kv_shape = [d.batch, d.kv_heads, d.seq_k, d.head_dim];
    Ok(AttentionGrads {
        dq: empty_in_layout_of(q, q_shape, q.dtype())?,
        dk: empty_in_layout_of(k, kv_shape, q.dtype())?,
        dv: empty_in_layout_of(v, kv_shape, q.dtype())?,
    })
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
    let grads = empty_grads(q, k, v, &d)?;
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

/// CPU references (f64 accumulation): what the tests and the incremental-replacement harness
/// compare the kernels with.
pub mod decode;
pub mod model_features;
pub mod reference;
pub mod varlen;

#[cfg(test)]
mod tests;
