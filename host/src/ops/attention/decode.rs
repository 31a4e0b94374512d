//! Decoding attention against a KV cache ([`decode_forward`]): a few query rows a sequence (1 for
//! token-by-token generation, up to a few dozen for speculative decoding) against long keys and
//! values, dense or in fixed-size pages through a block table, with grouped-query heads and the
//! keys split over CTAs (split-KV) so that even one sequence fills the GPU; the splits are merged
//! through their LSEs. The kernels (`gpu/src/kernels/attention/decode.rs`) read each key once for
//! all the query rows of its head group.
//! Measured against PyTorch's SDPA: docs/PERF_NOTES.md, "Decoding".
use cudarc::driver::LaunchConfig;
use cudarc::driver::sys::CUdevice_attribute;
use gpu::params::RawSlice;
use gpu::params::attention::{
    DECODE_MAX_SPLITS, DECODE_THREADS, DECODE_TILE_KEYS, DecodeShape, MAX_SEQ, MaskKind,
    decode_smem_bytes,
};

use super::{AttentionParams, Causal, GRID_YZ_MAX, scale};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::launch::{ByValue, launch, launch_cfg, raw_u32, set_max_dynamic_smem, upload_u32};
use crate::tensor::Tensor;

/// Where the keys and values are.
#[derive(Clone, Copy, Debug)]
pub enum KvCache<'a> {
    /// K and V `[B, Hkv, Sk, D]`, contiguous: every sequence has `Sk` keys.
    Dense { k: &'a Tensor, v: &'a Tensor },
    /// K and V caches `[pages, page_size, Hkv, D]`, contiguous; `block_table` is `[B, max_pages]`
    /// row-major (sequence `b`'s key `j` is in page `block_table[b * max_pages + j / page_size]`,
    /// slot `j % page_size`), `seq_lens` `[B]` the keys each sequence has. Entries of the table past
    /// a sequence's last page are not read.
    Paged {
        k: &'a Tensor,
        v: &'a Tensor,
        block_table: &'a [u32],
        max_pages: usize,
        seq_lens: &'a [u32],
    },
}

/// The widest head dim the decoding kernels take (every multiple of 8 up to it: the 64-, 128- and
/// 256-column tiles, narrower head dims zero-filled).
pub const DECODE_MAX_HEAD_DIM: usize = 256;

/// Attention of Q `[B, Hq, Sq, D]` (f16/bf16, contiguous, `D` a multiple of 8 up to
/// [`DECODE_MAX_HEAD_DIM`]) against a KV cache with `Hkv` heads (`Hq` a multiple of `Hkv`; query
/// head `h` reads key/value head `h / (Hq / Hkv)`). Causal masking is bottom-right aligned per
/// sequence (query row `i` sees keys `j <= i + len - Sq`), and so is a sliding window
/// ([`super::Window`]: keys `i + len - Sq - left ..= i + len - Sq + right`; the splits then cover
/// only the keys from the first row's first visible one, so a window reads `Sq + left` keys a
/// sequence, not its whole cache). The softcap and ALiBi slopes as in
/// [`super::AttentionParams`] (slopes `[heads]` or `[B, heads]`, one row a sequence; the distance
/// `|i + len - Sq - j|`), in both builds. The 256-column tile (head dims past 128) takes 192 KiB of
/// shared memory a block: sm_90 devices give it, A100's 163 KiB does not (a named error). Returns
/// O `[B, Hq, Sq, D]` (q's dtype) and LSE `[B, Hq, Sq]` (f32); a row that sees no key gets O = 0
/// and LSE = -inf.
///
/// One generation step of Gemma-2 9B's attention (16 query heads on 8, D256, softcap 50, a local
/// layer's 4096-key window) for two sequences held in a paged cache of 16-key pages:
///
/// ```no_run
/// use host::ops::attention::{self, AttentionParams, Causal, KvCache, Window};
/// use host::{DType, Gpu, Tensor};
/// # fn main() -> host::Result<()> {
/// let gpu = Gpu::new(0)?;
/// let (pages, page, hkv, d) = (64, 16, 8, 256);
/// // K and V pages `[pages, page_size, Hkv, D]`; sequence 0 holds 600 keys on pages 0..38,
/// // sequence 1 holds 100 on pages 40..47 (a block table row a sequence, `max_pages` wide).
/// let shape = [pages, page, hkv, d];
/// let k = Tensor::from_f32(&gpu, &vec![0.1; shape.iter().product()], &shape, DType::BF16)?;
/// let v = Tensor::from_f32(&gpu, &vec![0.2; shape.iter().product()], &shape, DType::BF16)?;
/// let max_pages = 40;
/// let mut block_table = vec![0u32; 2 * max_pages];
/// for i in 0..max_pages {
///     block_table[i] = i as u32;
///     block_table[max_pages + i] = (40 + i % 8) as u32;
/// }
/// let q = Tensor::from_f32(&gpu, &vec![0.3; 2 * 16 * d], &[2, 16, 1, d], DType::BF16)?;
/// let seq_lens = [600, 100];
/// let cache =
///     KvCache::Paged { k: &k, v: &v, block_table: &block_table, max_pages, seq_lens: &seq_lens };
/// let params = AttentionParams {
///     causal: Causal::Yes,
///     softcap: Some(50.0),
///     window: Window { left: Some(4096), right: None },
///     ..Default::default()
/// };
/// let (o, lse) = attention::decode_forward(&q, cache, &params)?;
/// assert_eq!((o.shape(), lse.shape()), (&[2, 16, 1, d][..], &[2, 16, 1][..]));
/// # Ok(()) }
/// ```
pub fn decode_forward(
    q: &Tensor,
    kv: KvCache<'_>,
    params: &AttentionParams,
) -> Result<(Tensor, Tensor)> {
    const OP: &str = "attention::decode_forward";
    let plan = Plan::of(OP, q, &kv, params)?;
    let gpu = q.gpu();
    let o = Tensor::empty(gpu, q.shape(), q.dtype())?;
    let lse = Tensor::empty(gpu, &q.shape()[..3], DType::F32)?;
    if o.numel() == 0 {
        return Ok((o, lse));
    }
    let (sh, rows) = (plan.shape, plan.rows);
    // With one split the split kernel writes O and LSE itself; the partials are not used.
    let parts = if sh.splits > 1 {
        rows * sh.splits as usize
    } else {
        0
    };
    let o_part = Tensor::empty(gpu, &[parts, plan.d], DType::F32)?;
    let lse_part = Tensor::empty(gpu, &[parts], DType::F32)?;
    // A dense cache has no table or lengths to upload: the kernel reads empty slices as "sequence
    // b is page b, of dense_len keys".
    let upload = |v: &[u32], what: &str| match v.is_empty() {
        true => Ok(None),
        false => upload_u32(gpu, v, what).map(Some),
    };
    let table = upload(&plan.table, "a decode block table")?;
    let lens = upload(&plan.lens, "decode sequence lengths")?;
    let view = |buf: &Option<_>, len| match buf {
        Some(b) => raw_u32(gpu, b, len),
        None => RawSlice { ptr: 0, len: 0 },
    };
    let (k, v) = plan.kv;
    let split = split_kernel(plan.d, q.dtype(), params.modifies_scores());
    let tile = decode_tile_dim(plan.d);
    let smem = decode_smem_bytes(tile as u32);
    // Always opted in: the static merge buffers count against the same 48 KiB default, so even
    // D = 64's 48 KiB of tiles needs it. A device that cannot give a block the tile's ring (the
    // 256 tile's 192 KiB past sm_90) is told apart from other failures by name.
    set_max_dynamic_smem(gpu, split, smem).map_err(|e| {
        let optin = gpu
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            .unwrap_or(0);
        Error::Invalid {
            op: OP,
            msg: format!(
                "head_dim {} decodes on the {tile}-column tile, whose ring of K and V tiles takes \
                 {smem} bytes of shared memory a block (plus the kernel's static buffers); this \
                 device gives a block at most {optin} ({e})",
                plan.d
            ),
        }
    })?;
    launch_cfg(
        gpu,
        split,
        LaunchConfig {
            grid_dim: (sh.splits, sh.kv_heads, sh.batch),
            block_dim: (DECODE_THREADS, 1, 1),
            shared_mem_bytes: smem,
        },
        &[
            &ByValue(q.raw()),
            &ByValue(k.raw()),
            &ByValue(v.raw()),
            &ByValue(view(&table, plan.table.len())),
            &ByValue(view(&lens, plan.lens.len())),
            &ByValue(o_part.raw()),
            &ByValue(lse_part.raw()),
            &ByValue(o.raw()),
            &ByValue(lse.raw()),
            &ByValue(sh),
        ],
    )?;
    if sh.splits == 1 {
        drop((table, lens));
        return Ok((o, lse));
    }
    // A CTA a query row, a thread an output column (two at D = 256).
    const MERGE_THREADS: u32 = 128;
    launch(
        gpu,
        match q.dtype() {
            DType::BF16 => "decode_merge_bf16",
            _ => "decode_merge_f16",
        },
        rows as u32,
        MERGE_THREADS,
        &[
            &ByValue(o_part.raw()),
            &ByValue(lse_part.raw()),
            &ByValue(o.raw()),
            &ByValue(lse.raw()),
            &(plan.d as u64),
            &(sh.splits as u64),
        ],
    )?;
    // The uploaded table and lengths are freed in stream order, after the kernels that read them.
    drop((table, lens));
    Ok((o, lse))
}

/// The tile (64, 128 or 256 columns) of a head dim up to [`DECODE_MAX_HEAD_DIM`].
fn decode_tile_dim(d: usize) -> usize {
    match d {
        ..=64 => 64,
        65..=128 => 128,
        _ => 256,
    }
}

/// Decoding CTAs an SM holds at a tile width: two (96 KiB of tiles each at 128 columns), one at
/// 256 (192 KiB).
fn decode_ctas_per_sm(tile: usize) -> usize {
    if tile > 128 { 1 } else { 2 }
}

/// The split kernel of head dim `d`'s tile: the plain one at the tile's width without a softcap
/// or ALiBi slopes (`scored`), else the general one.
fn split_kernel(d: usize, dtype: DType, scored: bool) -> &'static str {
    let tile = decode_tile_dim(d);
    match (tile, dtype == DType::BF16, scored || d != tile) {
        (64, true, false) => "decode_split_d64_bf16",
        (64, false, false) => "decode_split_d64_f16",
        (128, true, false) => "decode_split_d128_bf16",
        (128, false, false) => "decode_split_d128_f16",
        (_, true, false) => "decode_split_d256_bf16",
        (_, false, false) => "decode_split_d256_f16",
        (64, true, true) => "decode_split_general_d64_bf16",
        (64, false, true) => "decode_split_general_d64_f16",
        (128, true, true) => "decode_split_general_d128_bf16",
        (128, false, true) => "decode_split_general_d128_f16",
        (_, true, true) => "decode_split_general_d256_bf16",
        (_, false, true) => "decode_split_general_d256_f16",
    }
}

/// A validated call: the kernel's shape parameter, the block table and lengths to upload.
struct Plan<'a> {
    shape: DecodeShape,
    /// Query rows, `batch * q_heads * seq_q`: below 2^32 (the kernels index rows in u32).
    rows: usize,
    d: usize,
    kv: (&'a Tensor, &'a Tensor),
    table: Vec<u32>,
    lens: Vec<u32>,
}

impl<'a> Plan<'a> {
    fn of(
        op: &'static str,
        q: &Tensor,
        kv: &KvCache<'a>,
        params: &AttentionParams,
    ) -> Result<Plan<'a>> {
        let [b, hq, sq, d] = *q.shape() else {
            return Err(Error::Shape {
                op,
                what: "q".into(),
                expected: "[B, Hq, Sq, D]".into(),
                got: q.shape().to_vec(),
            });
        };
        if !matches!(q.dtype(), DType::F16 | DType::BF16) {
            return Err(Error::DType {
                op,
                expected: "f16 or bf16".into(),
                got: q.dtype(),
            });
        }
        if !(d.is_multiple_of(8) && (8..=DECODE_MAX_HEAD_DIM).contains(&d)) {
            return Err(Error::Invalid {
                op,
                msg: format!(
                    "head_dim {d} has no decoding kernel; supported: multiples of 8 up to \
                     {DECODE_MAX_HEAD_DIM}"
                ),
            });
        }
        super::validate_score_mods(op, q, params, (b, hq))?;
        let (k, v) = match *kv {
            KvCache::Dense { k, v } | KvCache::Paged { k, v, .. } => (k, v),
        };
        for (what, t) in [("q", q), ("k", k), ("v", v)] {
            t.require_contiguous(op, what)?;
            if t.dtype() != q.dtype() {
                return Err(Error::DType {
                    op,
                    expected: format!("{} (q's dtype) for {what}", q.dtype()),
                    got: t.dtype(),
                });
            }
            if !t.gpu().same_device(q.gpu()) {
                return Err(Error::DeviceMismatch { op });
            }
            if t.numel() > 0 && !t.device_ptr().is_multiple_of(16) {
                return Err(Error::Invalid {
                    op,
                    msg: format!("{what} must start at a 16-byte aligned address"),
                });
            }
        }
        if v.shape() != k.shape() {
            return Err(Error::Shape {
                op,
                what: "v (k's shape)".into(),
                expected: format!("{:?}", k.shape()),
                got: v.shape().to_vec(),
            });
        }
        let bad_k = |expected: String| Error::Shape {
            op,
            what: "k".into(),
            expected,
            got: k.shape().to_vec(),
        };
        // (kv heads, page size, max pages, strides, table, lengths, dense length)
        let (hkv, page_size, max_pages, strides, table, lens, dense_len) = match *kv {
            KvCache::Dense { .. } => {
                let [kb, hkv, sk, kd] = *k.shape() else {
                    return Err(bad_k("[B, Hkv, Sk, D]".into()));
                };
                if kb != b || kd != d {
                    return Err(bad_k(format!("[{b}, Hkv, Sk, {d}]")));
                }
                // One page a sequence, the whole of its keys: no table, no lengths.
                let strides = ((hkv * sk * d) as u64, d as u64, (sk * d) as u64);
                (hkv, sk.max(1), 1, strides, vec![], vec![], sk)
            }
            KvCache::Paged {
                block_table,
                max_pages,
                seq_lens,
                ..
            } => {
                let [pages, page, hkv, kd] = *k.shape() else {
                    return Err(bad_k("[pages, page_size, Hkv, D]".into()));
                };
                if kd != d || page == 0 {
                    return Err(bad_k(format!("[pages, page_size >= 1, Hkv, {d}]")));
                }
                if seq_lens.len() != b {
                    return Err(Error::Length {
                        what: "decode seq_lens (one a sequence of q)",
                        expected: b,
                        got: seq_lens.len(),
                    });
                }
                if block_table.len() != b * max_pages {
                    return Err(Error::Length {
                        what: "decode block_table (B x max_pages)",
                        expected: b * max_pages,
                        got: block_table.len(),
                    });
                }
                for (s, &len) in seq_lens.iter().enumerate() {
                    let need = (len as usize).div_ceil(page);
                    if need > max_pages {
                        return Err(Error::Invalid {
                            op,
                            msg: format!(
                                "sequence {s} has {len} keys: {need} pages of {page}, but the block \
                                 table holds {max_pages} a sequence"
                            ),
                        });
                    }
                    if let Some(p) = block_table[s * max_pages..s * max_pages + need]
                        .iter()
                        .find(|&&p| p as usize >= pages)
                    {
                        return Err(Error::Invalid {
                            op,
                            msg: format!("sequence {s} names page {p} of a {pages}-page cache"),
                        });
                    }
                }
                let strides = ((page * hkv * d) as u64, (hkv * d) as u64, d as u64);
                (
                    hkv,
                    page,
                    max_pages.max(1),
                    strides,
                    block_table.to_vec(),
                    seq_lens.to_vec(),
                    0,
                )
            }
        };
        if hkv == 0 || hq % hkv != 0 {
            return Err(bad_k(format!("Hkv dividing q's {hq} heads")));
        }
        for (what, given) in [("batch", b), ("kv heads", hkv)] {
            if given > GRID_YZ_MAX {
                return Err(Error::TooLarge {
                    op,
                    what,
                    given: given as u64,
                    max: GRID_YZ_MAX as u64,
                });
            }
        }
        let max_len = (lens.iter().copied().max().unwrap_or(0) as usize).max(dense_len);
        // The kernel counts keys in u32 and forms `i + len - Sq`: the attention paths' one limit.
        if max_len > MAX_SEQ || sq > MAX_SEQ {
            return Err(Error::TooLarge {
                op,
                what: "sequence length",
                given: max_len.max(sq) as u64,
                max: MAX_SEQ as u64,
            });
        }
        let sms = q.gpu().sm_count().unwrap_or(132).max(1) as usize;
        // Under a window's left side a sequence's keys from its first row's first visible key:
        // at most `sq + left` of them.
        let span = match params.window.left {
            Some(left) => max_len.min(sq.saturating_add(left)),
            None => max_len,
        };
        let ctas = sms * decode_ctas_per_sm(decode_tile_dim(d));
        let (keys_per_split, splits) = split_plan(ctas, b * hkv, span);
        let too_big = |what: &'static str, given: usize| Error::TooLarge {
            op,
            what,
            given: given as u64,
            max: u32::MAX as u64,
        };
        let u = |what, x: usize| u32::try_from(x).map_err(|_| too_big(what, x));
        // The kernels form a row's index `(b * q_heads + h) * seq_q + i` in u32.
        let rows = b * hq * sq;
        u("query rows (batch x heads x seq_q)", rows)?;
        // The kernel's scores are base 2 (the scale and log2 e folded into Q), so is its cap.
        let (softcap_k, softcap_inv_k) = match params.softcap {
            Some(c) => (
                c * std::f32::consts::LOG2_E,
                1.0 / (c * std::f32::consts::LOG2_E),
            ),
            None => (0.0, 0.0),
        };
        let (alibi_slopes, alibi_batch) = super::alibi_fields(params);
        Ok(Plan {
            rows,
            shape: DecodeShape {
                batch: u("batch", b)?,
                q_heads: u("query heads", hq)?,
                kv_heads: u("kv heads", hkv)?,
                seq_q: u("query rows", sq)?,
                head_dim: d as u32,
                page_size: u("page size", page_size)?,
                max_pages: u("max pages", max_pages)?,
                keys_per_split,
                splits,
                mask: match params.causal {
                    Causal::Yes => MaskKind::Causal,
                    Causal::No => MaskKind::None,
                },
                scale: scale(op, params, d)?,
                dense_len: u("sequence length", dense_len)?,
                window_left: super::window_side(params.window.left),
                window_right: super::window_side(params.window.right),
                softcap_k,
                softcap_inv_k,
                page_stride: strides.0,
                row_stride: strides.1,
                head_stride: strides.2,
                alibi_slopes,
                alibi_batch,
            },
            d,
            kv: (k, v),
            table,
            lens,
        })
    }
}

/// Keys a split and the number of splits: as many CTAs (`heads` = sequences x kv heads of them a
/// split) as fit the chip at once (`ctas`: two an SM at D = 128, [`decode_ctas_per_sm`]), rounded
/// down so that no second wave runs a few stragglers, but no more splits than the keys make
/// 256-key pieces (so a split holds at least 128 keys), each a whole number of the kernel's
/// 64-key tiles.
fn split_plan(ctas: usize, heads: usize, max_len: usize) -> (u32, u32) {
    let want = (ctas / heads.max(1)).min(DECODE_MAX_SPLITS as usize);
    let most = max_len.div_ceil(256).max(1);
    let splits = want.clamp(1, most);
    let step = DECODE_TILE_KEYS as usize;
    let per = max_len.div_ceil(splits).div_ceil(step).max(1) * step;
    let splits = max_len.div_ceil(per).max(1);
    (per as u32, splits as u32)
}

#[cfg(test)]
mod tests {
    use super::split_plan;

    #[test]
    fn splits_cover_the_keys_in_whole_steps_and_fill_the_chip() {
        for (heads, len) in [
            (8, 131072),
            (512, 4096),
            (1, 1),
            (8, 0),
            (64, 1000),
            (2, 300),
        ] {
            let (per, splits) = split_plan(2 * 132, heads, len);
            let (per, splits) = (per as usize, splits as usize);
            assert_eq!(per % 64, 0, "{heads} {len}");
            assert!(per * splits >= len, "{heads} {len}: {per} x {splits}");
            assert!(
                per * (splits - 1) < len.max(1),
                "{heads} {len}: an empty split"
            );
            assert!(
                splits == 1 || per >= 128,
                "{heads} {len}: splits of {per} keys"
            );
            assert!(
                splits == 1 || heads * splits <= 2 * 132,
                "{heads} {len}: {splits} splits overfill"
            );
        }
        // A long single-sequence decode is spread over the chip.
        let (_, splits) = split_plan(2 * 132, 8, 131072);
        assert!(8 * splits as usize >= 2 * 132);
    }
}
