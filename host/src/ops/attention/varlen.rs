//! Packed variable-length batches through the FlashAttention forward kernels (FlashAttention-2's
//! varlen API): Q `[total_q, heads, head_dim]`, K and V `[total_k, kv_heads, head_dim]`, sequence `b`
//! being rows `cu_seqlens_q[b]..cu_seqlens_q[b + 1]` of Q and `cu_seqlens_k[b]..cu_seqlens_k[b + 1]`
//! of K and V. Every mask applies within each sequence (causal: bottom-right aligned to the
//! sequence's own lengths). No padding and no copy: one launch whose grid covers the longest
//! sequence; each CTA reads its sequence's offsets, and CTAs past a shorter sequence store nothing.
//!
//! ```no_run
//! use host::ops::attention::{self, AttentionParams, Causal, PackedSeqs};
//! use host::{DType, Gpu, Tensor};
//! # fn main() -> host::Result<()> {
//! let gpu = Gpu::new(0)?;
//! // Three prompts of 5, 300 and 17 tokens, 8 heads of 64.
//! let cu = [0, 5, 305, 322];
//! let q = Tensor::from_f32(&gpu, &vec![0.1; 322 * 8 * 64], &[322, 8, 64], DType::F16)?;
//! let seqs = PackedSeqs { cu_seqlens_q: &cu, cu_seqlens_k: &cu };
//! let params = AttentionParams { causal: Causal::Yes, scale: None, ..Default::default() };
//! let (o, lse) = attention::flash_forward_varlen(&q, &q, &q, seqs, &params)?;
//! assert_eq!((o.shape(), lse.shape()), (&[322, 8, 64][..], &[8, 322][..]));
//! # Ok(()) }
//! ```
use gpu::params::attention::{AttentionLayout, HeadStrides, MAX_SEQ};

use super::model_features::check_offsets;
use super::{
    AttentionGrads, AttentionParams, BackwardMode, Dims, GRID_YZ_MAX, GradsOut, Operand, Path,
    flash_backward_run, flash_run, flash_tma_views, flash_variant_supported, flash_wgmma_variant,
    head_strides, packed_strides, validate_operands,
};
use crate::DType;
use crate::error::{Error, Result};
use crate::launch::{raw_u32, upload_u32};
use crate::ops::same_device_and_dtype;
use crate::tensor::Tensor;

/// The sequences of a packed batch, as host offsets (FlashAttention-2's `cu_seqlens`): sequence `b`
/// is rows `cu_seqlens_q[b]..cu_seqlens_q[b + 1]` of Q (and O) and rows
/// `cu_seqlens_k[b]..cu_seqlens_k[b + 1]` of K and V. Both start at 0, never decrease, end at the
/// operand's row count, and have one more entry than there are sequences.
#[derive(Clone, Copy, Debug)]
pub struct PackedSeqs<'a> {
    pub cu_seqlens_q: &'a [usize],
    pub cu_seqlens_k: &'a [usize],
}

/// The largest packed row count: the copy engine's coordinates are signed 32-bit.
const MAX_TOTAL_ROWS: usize = (1 << 31) - 1;

/// FlashAttention forward over a packed batch: returns O `[total_q, heads, head_dim]` (contiguous)
/// and LSE `[heads, total_q]` f32 (FlashAttention-2's varlen layouts). Q, K and V may have any
/// strides whose last one is 1 and whose others are nonzero multiples of 8 elements (so slices of a
/// fused `[total, 3, heads, head_dim]` projection run without a copy); grouped-query heads as in
/// [`super::flash_forward`]. f16/bf16, the head dims [`super::flash_forward`] takes. A sequence without keys gets
/// O = 0 and LSE = -inf; an empty sequence is allowed.
pub fn flash_forward_varlen(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqs: PackedSeqs,
    params: &AttentionParams,
) -> Result<(Tensor, Tensor)> {
    const OP: &str = "attention::flash_forward_varlen";
    let call = validate_varlen(OP, [q, k, v], seqs, params)?;
    let variant = flash_wgmma_variant(q.gpu(), &call.d, params);
    launch_varlen(OP, [q, k, v], seqs, params, &call, variant)
}

/// [`flash_forward_varlen`] on FlashAttention kernel `variant` (see `FLASH_VARIANTS`), for tests
/// that cover every shipped kernel; an error for a variant this build or head dim does not have.
#[doc(hidden)]
pub fn flash_forward_varlen_variant(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqs: PackedSeqs,
    params: &AttentionParams,
    variant: u32,
) -> Result<(Tensor, Tensor)> {
    const OP: &str = "attention::flash_forward_varlen_variant";
    let call = validate_varlen(OP, [q, k, v], seqs, params)?;
    if !flash_variant_supported(q.gpu(), variant, call.d.head_dim) {
        return Err(Error::Invalid {
            op: OP,
            msg: format!(
                "no FlashAttention kernel {variant} at head dim {} in the {} build",
                call.d.head_dim,
                q.gpu().ptx_arch()
            ),
        });
    }
    launch_varlen(OP, [q, k, v], seqs, params, &call, variant)
}

/// FlashAttention backward over a packed batch: `(dQ, dK, dV)` for upstream gradient `d_o`, from
/// the inputs, `seqs`, `params` and the outputs `(o, lse)` of the [`flash_forward_varlen`] call. dQ
/// is `[total_q, heads, head_dim]`, dK and dV `[total_k, kv_heads, head_dim]`, contiguous, in the
/// input dtype; grouped-query dK/dV are the sums over each group. O and dO take any strides the
/// forward's operands may have; LSE is `[heads, total_q]` f32 as the forward returns it.
/// Deterministic (the same bits every run): the partial dQ blocks of a sequence are added in
/// ascending key-block order behind turn counters.
#[allow(clippy::too_many_arguments)]
pub fn flash_backward_varlen(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    o: &Tensor,
    lse: &Tensor,
    d_o: &Tensor,
    seqs: PackedSeqs,
    params: &AttentionParams,
) -> Result<AttentionGrads> {
    const OP: &str = "attention::flash_backward_varlen";
    let call = validate_varlen(OP, [q, k, v], seqs, params)?;
    let (d, (tq, tk)) = (call.d, call.totals);
    for (name, t) in [("o", o), ("d_o", d_o)] {
        same_device_and_dtype(OP, q, t)?;
        if t.shape() != q.shape() {
            return Err(Error::Shape {
                op: OP,
                what: format!("{name} must have q's shape"),
                expected: format!("{:?}", q.shape()),
                got: t.shape().to_vec(),
            });
        }
        let t4 = (
            [1, t.shape()[1], t.shape()[0], t.shape()[2]],
            [
                t.shape()[0] * t.strides()[0],
                t.strides()[1],
                t.strides()[0],
                t.strides()[2],
            ],
        );
        let x = operand(name, t, &t4.0, &t4.1);
        head_strides(OP, &x)?;
        if !x.aligned16 {
            return Err(Error::Invalid {
                op: OP,
                msg: format!("{name} must start at a 16-byte aligned address"),
            });
        }
    }
    if !q.gpu().same_device(lse.gpu()) {
        return Err(Error::DeviceMismatch { op: OP });
    }
    if lse.shape() != [d.heads, tq] || lse.dtype() != DType::F32 {
        return Err(Error::Shape {
            op: OP,
            what: "lse (the forward's log-sum-exp: f32 [heads, total_q], as \
                   flash_forward_varlen returns it)"
                .into(),
            expected: format!("[{}, {tq}] f32", d.heads),
            got: lse.shape().to_vec(),
        });
    }
    lse.require_contiguous(OP, "lse")?;
    let gpu = q.gpu();
    let grads = AttentionGrads {
        dq: Tensor::empty(gpu, &[tq, d.heads, d.head_dim], q.dtype())?,
        dk: Tensor::empty(gpu, &[tk, d.kv_heads, d.head_dim], q.dtype())?,
        dv: Tensor::empty(gpu, &[tk, d.kv_heads, d.head_dim], q.dtype())?,
    };
    if d.batch == 0 {
        return Ok(grads);
    }
    let offsets = upload_offsets(gpu, seqs)?;
    let [qs, ks, vs] = call.strides;
    let layout = packed_layout(
        gpu,
        [
            qs,
            ks,
            vs,
            packed_strides(o),
            packed_strides(d_o),
            packed_strides(&grads.dq),
            packed_strides(&grads.dk),
            packed_strides(&grads.dv),
        ],
        (tq, d.batch),
        &offsets,
        super::alibi_fields(params),
    );
    flash_backward_run(
        OP,
        [q, k, v, o, lse, d_o],
        (params, d, call.scale),
        BackwardMode::Deterministic,
        GradsOut::Rounded(&grads),
        layout,
    )?;
    // Freed in stream order, after the kernels that read them.
    drop(offsets);
    Ok(grads)
}

/// The layout of a packed call: the operands' strides (`[q, k, v, o, d_o, dq, dk, dv]`) without a
/// batch stride (a sequence's rows start at its offset), the LSE `[heads, total_q]` (`tq` rows),
/// the uploaded offsets of the `batch` sequences, and the ALiBi fields ([`super::alibi_fields`]).
fn packed_layout(
    gpu: &crate::Gpu,
    strides: [HeadStrides; 8],
    (tq, batch): (usize, usize),
    offsets: &Offsets,
    (alibi_slopes, alibi_batch): (u64, u64),
) -> AttentionLayout {
    let [q, k, v, o, d_o, dq, dk, dv] = strides.map(|s| HeadStrides { batch: 0, ..s });
    AttentionLayout {
        q,
        k,
        v,
        o,
        d_o,
        dq,
        dk,
        dv,
        lse: HeadStrides {
            batch: 0,
            head: tq as u64,
            row: 1,
        },
        cu_seqlens_q: raw_u32(gpu, &offsets.q, batch + 1).ptr,
        cu_seqlens_k: raw_u32(gpu, offsets.k.as_ref().unwrap_or(&offsets.q), batch + 1).ptr,
        alibi_slopes,
        alibi_batch,
    }
}

/// The offsets as the kernels read them: u32 device arrays; `k` is `None` where the keys' offsets
/// are the queries' (one array then serves both, and the layout's two pointers are equal: what
/// tells the backward that every sequence has as many keys as queries, so it may release its dQ
/// turns late as the dense backward does).
struct Offsets {
    q: cudarc::driver::CudaSlice<u32>,
    k: Option<cudarc::driver::CudaSlice<u32>>,
}

fn upload_offsets(gpu: &crate::Gpu, seqs: PackedSeqs) -> Result<Offsets> {
    let to_u32 = |cu: &[usize]| cu.iter().map(|&x| x as u32).collect::<Vec<u32>>();
    let q = upload_u32(gpu, &to_u32(seqs.cu_seqlens_q), "cu_seqlens_q")?;
    let k = if seqs.cu_seqlens_k == seqs.cu_seqlens_q {
        None
    } else {
        Some(upload_u32(gpu, &to_u32(seqs.cu_seqlens_k), "cu_seqlens_k")?)
    };
    Ok(Offsets { q, k })
}

/// A validated packed call: the kernels' problem size (`batch` = sequences, `seq_q` / `seq_k` the
/// longest ones), the scale, the row totals and the operands' (head, row) strides.
struct VarlenCall {
    d: Dims,
    scale: f32,
    totals: (usize, usize),
    strides: [HeadStrides; 3],
}

/// Every rule of a packed call, each a named error: ranks, shapes, dtypes, head dims, strides and
/// alignment as the dense FlashAttention path has them (on the `[T, H, D]` operands), and the
/// offsets.
fn validate_varlen(
    op: &'static str,
    [q, k, v]: [&Tensor; 3],
    seqs: PackedSeqs,
    params: &AttentionParams,
) -> Result<VarlenCall> {
    same_device_and_dtype(op, q, k)?;
    same_device_and_dtype(op, q, v)?;
    for (name, t) in [("q", q), ("k", k), ("v", v)] {
        if t.shape().len() != 3 {
            return Err(Error::Shape {
                op,
                what: format!("{name} (a packed batch is [total, heads, head_dim])"),
                expected: "[total, heads, head_dim]".into(),
                got: t.shape().to_vec(),
            });
        }
    }
    if v.shape() != k.shape() {
        return Err(Error::Shape {
            op,
            what: "v must have k's shape".into(),
            expected: format!("{:?}", k.shape()),
            got: v.shape().to_vec(),
        });
    }
    // Each operand as the rank-4 `[1, heads, total, head_dim]` the dense rules read.
    let as4 = |t: &Tensor| {
        let (s, st) = (t.shape(), t.strides());
        ([1, s[1], s[0], s[2]], [s[0] * st[0], st[1], st[0], st[2]])
    };
    let (q4, k4, v4) = (as4(q), as4(k), as4(v));
    let ops = [
        operand("q", q, &q4.0, &q4.1),
        operand("k", k, &k4.0, &k4.1),
        operand("v", v, &v4.0, &v4.1),
    ];
    // Head counts, dtype, head dim, strides, alignment, scale: the dense path's rules.
    let (d0, scale) = validate_operands(op, Path::Flash, &ops, params)?;
    let strides = [
        head_strides(op, &ops[0])?,
        head_strides(op, &ops[1])?,
        head_strides(op, &ops[2])?,
    ];
    let (tq, tk) = (q.shape()[0], k.shape()[0]);
    let batch = check_offsets(op, "cu_seqlens_q", seqs.cu_seqlens_q, tq)?;
    if check_offsets(op, "cu_seqlens_k", seqs.cu_seqlens_k, tk)? != batch {
        return Err(Error::Length {
            what: "cu_seqlens_k (one entry more than there are sequences, as cu_seqlens_q)",
            expected: batch + 1,
            got: seqs.cu_seqlens_k.len(),
        });
    }
    if batch > GRID_YZ_MAX {
        return Err(Error::TooLarge {
            op,
            what: "sequences",
            given: batch as u64,
            max: GRID_YZ_MAX as u64,
        });
    }
    super::validate_model_features(op, Path::Flash, q, params, (batch, d0.heads))?;
    let longest = |cu: &[usize]| cu.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
    let (max_q, max_k) = (longest(seqs.cu_seqlens_q), longest(seqs.cu_seqlens_k));
    for (what, given, max) in [
        ("total_q rows", tq, MAX_TOTAL_ROWS),
        ("total_k rows", tk, MAX_TOTAL_ROWS),
        ("longest query sequence", max_q, MAX_SEQ),
        ("longest key sequence", max_k, MAX_SEQ),
    ] {
        if given > max {
            return Err(Error::TooLarge {
                op,
                what,
                given: given as u64,
                max: max as u64,
            });
        }
    }
    Ok(VarlenCall {
        d: Dims {
            batch,
            seq_q: max_q,
            seq_k: max_k,
            ..d0
        },
        scale,
        totals: (tq, tk),
        strides,
    })
}

/// The dense rules' view of a packed operand (`shape4`/`strides4` its rank-4 form).
fn operand<'a>(
    name: &'static str,
    t: &Tensor,
    shape4: &'a [usize; 4],
    strides4: &'a [usize; 4],
) -> Operand<'a> {
    Operand {
        name,
        shape: shape4,
        strides: strides4,
        dtype: t.dtype(),
        // Read the strides as given: contiguity of `[T, H, D]` is not that of the rank-4 form.
        contiguous: false,
        aligned16: crate::ops::aligned16(&[t]),
    }
}

/// The launch of a validated packed call on kernel `variant`.
fn launch_varlen(
    op: &'static str,
    [q, k, v]: [&Tensor; 3],
    seqs: PackedSeqs,
    params: &AttentionParams,
    call: &VarlenCall,
    variant: u32,
) -> Result<(Tensor, Tensor)> {
    let (d, (tq, tk)) = (&call.d, call.totals);
    let gpu = q.gpu();
    let o = Tensor::empty(gpu, &[tq, d.heads, d.head_dim], q.dtype())?;
    let lse = Tensor::empty(gpu, &[d.heads, tq], DType::F32)?;
    if tq * d.heads == 0 || d.batch == 0 {
        return Ok((o, lse));
    }
    // Freed in stream order, after the kernel that reads them.
    let offsets = upload_offsets(gpu, seqs)?;
    let [qs, ks, vs] = call.strides;
    // The backward-only entries repeat Q's, K's and V's: no forward kernel reads them.
    let layout = packed_layout(
        gpu,
        [qs, ks, vs, packed_strides(&o), qs, qs, ks, vs],
        (tq, d.batch),
        &offsets,
        super::alibi_fields(params),
    );
    // The copy engine's views: `[1][heads][total][head_dim]` (a batch dim of one, any valid stride).
    // The batch dim of one entry takes any valid stride: the row stride.
    let one = |s: HeadStrides| HeadStrides { batch: s.row, ..s };
    let views = flash_tma_views([q, k, v], [one(qs), one(ks), one(vs)], (tq, tk, 1), d);
    flash_run(
        op,
        [q, k, v],
        (&o, &lse),
        (params, d, call.scale),
        variant,
        (layout, views),
    )?;
    drop(offsets);
    Ok((o, lse))
}
