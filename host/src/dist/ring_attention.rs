//! Ring attention: attention over a sequence sharded across the ranks of a [`Rank`] group, forward
//! and backward, each rank holding `S / world` of the queries, keys and values.
//!
//! **Zig-zag sharding.** The sequence is cut into `2 world` equal chunks; rank `r` holds chunks `r`
//! and `2 world - 1 - r` ([`zigzag_chunks`]). A rank's tensors are `[2, B, H, S / (2 world), D]`:
//! entry 0 its early chunk, entry 1 its late one ([`shard`] / [`unshard`] convert from and to
//! `[B, H, S, D]`). Under a causal mask every rank then does the same work at every ring step:
//!
//! - step 0 (its own keys): early queries x early keys (causal), late x early (full), late x late
//!   (causal);
//! - keys from a lower rank: both query chunks x the visitor's early chunk (full), nothing with its
//!   late chunk (it lies after both);
//! - keys from a higher rank: the late query chunk x both of the visitor's chunks (full).
//!
//! Each is `2 c^2` query-key products (`c` the chunk length), so no rank waits for another.
//! Without a mask every step computes all four chunk pairs.
//!
//! **The ring.** At step `s` rank `r` holds the keys and values of rank `r - s`; it sends them on to
//! `r + 1` and receives the next from `r - 1` ([`Rank::exchange_start`]) while the flash kernels run
//! on the ones it holds. The forward folds each pair's `(O, LSE)` into an f32 accumulator through
//! the LSEs (`ring_merge_*`: the softmax over the union of key sets). The backward sends each key
//! block's dK/dV accumulator (f32) around with it: every rank adds its pairs' gradients (computed
//! with the final O and LSE, so each pair's `P = exp(S - LSE)` is already the global softmax) and
//! passes it on; one last exchange brings it home. dQ stays local. The flash backward adds each
//! pair's gradients into f32 accumulators ([`attention::flash_backward_add`]), so every gradient
//! is rounded to the input dtype once, at the end (rounding each pair's gradients first measured up
//! to 1.06 of the flash rule's bound for dV on two H200s, 2026-11-26; summed in f32, 0.23-0.59).
//!
//! ```no_run
//! use host::{DType, Tensor, dist::{self, ReduceOp, Settings, ring_attention}};
//! use host::ops::attention::{AttentionParams, Causal};
//! let n = dist::gpu_count();
//! let s = 4096 * 2 * n;                                    // the sequence splits into 2n equal chunks
//! let x = host::HostTensor::new(vec![0.5; 2 * s * 64], &[1, 2, s, 64], DType::F16)?;
//! let outs = dist::run(n, Settings::default(), |rank| {
//!     let shard = Tensor::from_host(rank.gpu(), &ring_attention::shard(&x, n, rank.rank())?)?;
//!     let p = AttentionParams { causal: Causal::Yes, scale: None, ..Default::default() };
//!     let (o, _lse) = ring_attention::forward(rank, &shard, &shard, &shard, &p)?;
//!     let total = Tensor::from_f32(rank.gpu(), &[1.0], &[1], DType::F32)?;
//!     rank.all_reduce(&total, ReduceOp::Sum)?;              // n on every rank
//!     rank.synchronize()?;                                  // polled: never hangs on a lost peer
//!     o.to_host()
//! })?;
//! let o = ring_attention::unshard(&outs)?;                  // [1, 2, s, 64], as flash_forward on one GPU
//! # Ok::<(), host::Error>(())
//! ```
use crate::dist::{Pending, Rank};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::launch::{ByValue, grid_blocks, launch};
use crate::ops::attention::{self, AttentionGrads, AttentionParams, Causal};
use crate::ops::elementwise;
use crate::tensor::{HostTensor, Tensor};

/// The two chunks (of `2 world`) rank `rank` holds: `[rank, 2 world - 1 - rank]`.
pub fn zigzag_chunks(world: usize, rank: usize) -> [usize; 2] {
    [rank, 2 * world - 1 - rank]
}

/// One flash call of a ring step: the rank's query chunk `q` (0 early, 1 late) against the visiting
/// rank's key chunk `kv`, with or without the causal mask.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pair {
    pub q: usize,
    pub kv: usize,
    pub causal: bool,
}

/// The pairs rank `rank` computes at ring step `step` (see the module doc).
pub fn step_pairs(world: usize, rank: usize, step: usize, causal: bool) -> Vec<Pair> {
    let p = |q, kv, causal| Pair { q, kv, causal };
    if !causal {
        return vec![
            p(0, 0, false),
            p(0, 1, false),
            p(1, 0, false),
            p(1, 1, false),
        ];
    }
    let src = (rank + world - step % world) % world;
    if src == rank {
        vec![p(0, 0, true), p(1, 0, false), p(1, 1, true)]
    } else if src < rank {
        vec![p(0, 0, false), p(1, 0, false)]
    } else {
        vec![p(1, 0, false), p(1, 1, false)]
    }
}

fn shard_dims(op: &'static str, shape: &[usize], world: usize) -> Result<(usize, usize)> {
    if shape.len() < 3 || world == 0 {
        return Err(Error::Shape {
            op,
            what: format!("a [B, H, S, ...] tensor and world >= 1 (world = {world})"),
            expected: "rank >= 3".into(),
            got: shape.to_vec(),
        });
    }
    let s = shape[2];
    if !s.is_multiple_of(2 * world) {
        return Err(Error::Shape {
            op,
            what: format!(
                "the sequence (dim 2) must split into 2 x world = {} equal chunks",
                2 * world
            ),
            expected: format!("a multiple of {}", 2 * world),
            got: shape.to_vec(),
        });
    }
    Ok((s, s / (2 * world)))
}

/// Rank `rank`'s zig-zag shard of `x` (`[B, H, S, ...]`: Q, K, V, dO as `[B, H, S, D]`, an LSE as
/// `[B, H, S]`): `[2, B, H, S / (2 world), ...]`.
pub fn shard(x: &HostTensor, world: usize, rank: usize) -> Result<HostTensor> {
    const OP: &str = "ring_attention::shard";
    let (s, c) = shard_dims(OP, &x.shape, world)?;
    if rank >= world {
        return Err(Error::Invalid {
            op: OP,
            msg: format!("rank {rank} out of range for world {world}"),
        });
    }
    let outer: usize = x.shape[..2].iter().product();
    let inner: usize = x.shape[3..].iter().product();
    let mut data = Vec::with_capacity(x.numel() / world);
    for chunk in zigzag_chunks(world, rank) {
        for o in 0..outer {
            let start = (o * s + chunk * c) * inner;
            data.extend_from_slice(&x.data[start..start + c * inner]);
        }
    }
    let mut shape = vec![2];
    shape.extend_from_slice(&x.shape);
    shape[3] = c;
    Ok(HostTensor {
        data,
        shape,
        dtype: x.dtype,
    })
}

/// The inverse of [`shard`]: every rank's shard, in rank order, back to `[B, H, S, ...]`.
pub fn unshard(parts: &[HostTensor]) -> Result<HostTensor> {
    const OP: &str = "ring_attention::unshard";
    let world = parts.len();
    let Some(first) = parts.first() else {
        return Err(Error::Invalid {
            op: OP,
            msg: "no shards given".into(),
        });
    };
    if first.shape.len() < 4 || first.shape[0] != 2 || parts.iter().any(|p| p.shape != first.shape)
    {
        return Err(Error::Shape {
            op: OP,
            what: "every shard [2, B, H, chunk, ...] of one shape".into(),
            expected: "[2, B, H, chunk, ...]".into(),
            got: first.shape.clone(),
        });
    }
    let c = first.shape[3];
    let s = c * 2 * world;
    let outer: usize = first.shape[1..3].iter().product();
    let inner: usize = first.shape[4..].iter().product();
    let mut data = vec![0f32; outer * s * inner];
    for (rank, part) in parts.iter().enumerate() {
        for (e, chunk) in zigzag_chunks(world, rank).into_iter().enumerate() {
            for o in 0..outer {
                let src = ((e * outer + o) * c) * inner;
                let dst = (o * s + chunk * c) * inner;
                data[dst..dst + c * inner].copy_from_slice(&part.data[src..src + c * inner]);
            }
        }
    }
    let mut shape = first.shape[1..].to_vec();
    shape[2] = s;
    Ok(HostTensor {
        data,
        shape,
        dtype: first.dtype,
    })
}

/// The local `[2, B, H, c, D]` operands checked: zig-zag shards of one shape on the rank's GPU, the
/// LSE `[2, B, H, c]` f32, the rest in q's half-precision dtype, all contiguous.
fn check_shards(op: &'static str, rank: &Rank, named: &[(&str, &Tensor)]) -> Result<()> {
    let (_, q) = named[0];
    if named.iter().any(|(_, t)| !t.gpu().same_device(rank.gpu())) {
        return Err(Error::DeviceMismatch { op });
    }
    if q.shape().len() != 5 || q.shape()[0] != 2 {
        return Err(Error::Shape {
            op,
            what: "q must be a zig-zag shard [2, batch, heads, chunk, head_dim] (see ring_attention::shard)"
                .into(),
            expected: "[2, B, H, c, D]".into(),
            got: q.shape().to_vec(),
        });
    }
    for &(name, t) in &named[1..] {
        let want: Vec<usize> = if name == "lse" {
            q.shape()[..4].to_vec()
        } else {
            q.shape().to_vec()
        };
        if t.shape() != want.as_slice() {
            return Err(Error::Shape {
                op,
                what: format!(
                    "{name} must match q's shard shape (ring attention needs equal chunks on every rank)"
                ),
                expected: format!("{want:?}"),
                got: t.shape().to_vec(),
            });
        }
        let dtype = if name == "lse" { DType::F32 } else { q.dtype() };
        if t.dtype() != dtype {
            return Err(Error::DType {
                op,
                expected: format!("{dtype} for {name}"),
                got: t.dtype(),
            });
        }
        t.require_contiguous(op, "operand")?;
    }
    q.require_contiguous(op, "q")?;
    if q.dtype() == DType::F32 {
        return Err(Error::DType {
            op,
            expected: "f16 or bf16 (the flash kernels' dtypes)".into(),
            got: q.dtype(),
        });
    }
    Ok(())
}

fn merge_kernel(dtype: DType) -> &'static str {
    match dtype {
        DType::BF16 => "ring_merge_bf16",
        _ => "ring_merge_f16",
    }
}

const BLOCK: u32 = 256;

/// A rank's place in the ring and the call's constants, from its validated operands.
struct Place {
    shape: Vec<usize>,
    scale: f32,
    causal: bool,
    world: usize,
    me: usize,
    /// The ranks it sends to and receives from.
    next: usize,
    prev: usize,
}

impl Place {
    fn of(op: &'static str, rank: &Rank, q: &Tensor, params: &AttentionParams) -> Result<Place> {
        // The ring's steps see key blocks by global position through the causal mask only.
        if params.has_model_features() {
            return Err(Error::Invalid {
                op,
                msg: format!(
                    "ring attention takes no sliding window, softcap or ALiBi slopes ({}); \
                     attention::flash_forward on one GPU does",
                    params.model_features_given()
                ),
            });
        }
        let shape = q.shape().to_vec();
        let (world, me) = (rank.world(), rank.rank());
        Ok(Place {
            scale: attention::scale(op, params, shape[4])?,
            shape,
            causal: params.causal == Causal::Yes,
            world,
            me,
            next: (me + 1) % world,
            prev: (me + world - 1) % world,
        })
    }
}

impl Place {
    /// Where the next visitor's keys and values arrive: two sets, used in turn (none for a ring of
    /// one).
    fn arrivals(&self, gpu: &crate::Gpu, dtype: DType) -> Result<Vec<(Tensor, Tensor)>> {
        if self.world == 1 {
            return Ok(Vec::new());
        }
        Ok(vec![
            pair(gpu, &self.shape, dtype)?,
            pair(gpu, &self.shape, dtype)?,
        ])
    }
}

/// Two tensors of one shape and dtype: a key/value or dK/dV buffer pair.
fn pair(gpu: &crate::Gpu, shape: &[usize], dtype: DType) -> Result<(Tensor, Tensor)> {
    Ok((
        Tensor::empty(gpu, shape, dtype)?,
        Tensor::empty(gpu, shape, dtype)?,
    ))
}

/// The ring's elementwise kernels move 16 bytes an access, a thread a group of `group` elements:
/// every buffer must start 16-byte aligned and `unit` (the head dimension, or the length) must be a
/// multiple of the group. The ring's own buffers always are (head dims are multiples of 8); this
/// says so instead of faulting if a caller's view ever is not.
fn vector_ready(op: &'static str, ts: &[&Tensor], unit: usize, group: usize) -> Result<()> {
    if !unit.is_multiple_of(group) || ts.iter().any(|t| !t.device_ptr().is_multiple_of(16)) {
        return Err(Error::Invalid {
            op,
            msg: format!(
                "needs 16-byte aligned buffers and a multiple of {group} elements (a row, or the \
                 whole length), got {unit} and buffer addresses mod 16 {:?}",
                ts.iter().map(|t| t.device_ptr() % 16).collect::<Vec<_>>()
            ),
        });
    }
    Ok(())
}

/// `(o_acc, lse_acc) <- merge((o_acc, lse_acc), (o_part, lse_part))`, the new LSE written to `lse_out`.
fn merge(
    o_acc: &Tensor,
    lse_acc: &Tensor,
    o_part: &Tensor,
    lse_part: &Tensor,
    lse_out: &Tensor,
    first: bool,
) -> Result<()> {
    let head_dim = *o_part.shape().last().unwrap_or(&1) as u64;
    vector_ready(
        "ring_attention::merge",
        &[o_acc, o_part],
        head_dim as usize,
        8,
    )?;
    let first = first as u32;
    launch(
        o_acc.gpu(),
        merge_kernel(o_part.dtype()),
        grid_blocks(o_part.numel() as u64 / 8, BLOCK as u64),
        BLOCK,
        &[
            &ByValue(o_acc.raw()),
            &ByValue(lse_acc.raw()),
            &ByValue(o_part.raw()),
            &ByValue(lse_part.raw()),
            &ByValue(lse_out.raw()),
            &head_dim,
            &first,
        ],
    )
}

/// `acc += x`, both f32 and contiguous.
fn accumulate(acc: &Tensor, x: &Tensor) -> Result<()> {
    vector_ready("ring_attention::accumulate", &[acc, x], x.numel(), 4)?;
    launch(
        acc.gpu(),
        "ring_accumulate_f32",
        grid_blocks(x.numel() as u64 / 4, BLOCK as u64),
        BLOCK,
        &[&ByValue(acc.raw()), &ByValue(x.raw())],
    )
}

fn pair_params(scale: f32, causal: bool) -> AttentionParams<'static> {
    AttentionParams {
        causal: if causal { Causal::Yes } else { Causal::No },
        scale: Some(scale),
        ..Default::default()
    }
}

/// Ring attention forward on this rank's shards (`[2, B, H, c, D]` f16/bf16, see [`shard`]):
/// returns this rank's `O` (`[2, B, H, c, D]`, input dtype) and LSE (`[2, B, H, c]`, f32), equal
/// within rounding to the same rows of one GPU's [`attention::flash_forward`] on the whole sequence.
/// `params.causal` masks by global position. Every rank of the group must call it.
pub fn forward(
    rank: &Rank,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    params: &AttentionParams,
) -> Result<(Tensor, Tensor)> {
    const OP: &str = "ring_attention::forward";
    check_shards(OP, rank, &[("q", q), ("k", k), ("v", v)])?;
    let gpu = rank.gpu();
    let pl = Place::of(OP, rank, q, params)?;

    let o_acc = Tensor::empty(gpu, &pl.shape, DType::F32)?;
    // Two LSE buffers per query chunk: a merge reads one and writes the other.
    let lse = [
        [
            Tensor::empty(gpu, &pl.shape[1..4], DType::F32)?,
            Tensor::empty(gpu, &pl.shape[1..4], DType::F32)?,
        ],
        [
            Tensor::empty(gpu, &pl.shape[1..4], DType::F32)?,
            Tensor::empty(gpu, &pl.shape[1..4], DType::F32)?,
        ],
    ];
    let mut current = [0usize; 2];
    let mut started = [false; 2];
    let recv = pl.arrivals(gpu, q.dtype())?;
    let (mut kc, mut vc) = (k.clone(), v.clone());
    for step in 0..pl.world {
        let pending: Option<Pending> = if step + 1 < pl.world {
            let (kr, vr) = &recv[step % 2];
            Some(rank.exchange_start(
                &[(&kc, pl.next), (&vc, pl.next)],
                &[(kr, pl.prev), (vr, pl.prev)],
            )?)
        } else {
            None
        };
        for pair in step_pairs(pl.world, pl.me, step, pl.causal) {
            let (o_p, lse_p) = attention::flash_forward(
                &q.index0(pair.q)?,
                &kc.index0(pair.kv)?,
                &vc.index0(pair.kv)?,
                &pair_params(pl.scale, pair.causal),
            )?;
            let i = pair.q;
            merge(
                &o_acc.index0(i)?,
                &lse[i][current[i]],
                &o_p,
                &lse_p,
                &lse[i][1 - current[i]],
                !started[i],
            )?;
            current[i] = 1 - current[i];
            started[i] = true;
        }
        if let Some(p) = pending {
            p.finish()?;
            let (kr, vr) = &recv[step % 2];
            (kc, vc) = (kr.clone(), vr.clone());
        }
    }
    let o = elementwise::cast(&o_acc, q.dtype())?;
    let lse_out = Tensor::empty(gpu, &pl.shape[..4], DType::F32)?;
    for i in 0..2 {
        lse_out.index0(i)?.copy_from(&lse[i][current[i]])?;
    }
    Ok((o, lse_out))
}

/// Ring attention backward: this rank's dQ, dK, dV (`[2, B, H, c, D]`, input dtype) from its shards
/// of Q, K, V, the forward's O and LSE, and dO. Every rank of the group must call it.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    rank: &Rank,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    o: &Tensor,
    lse: &Tensor,
    d_o: &Tensor,
    params: &AttentionParams,
) -> Result<AttentionGrads> {
    const OP: &str = "ring_attention::backward";
    check_shards(
        OP,
        rank,
        &[
            ("q", q),
            ("k", k),
            ("v", v),
            ("o", o),
            ("lse", lse),
            ("d_o", d_o),
        ],
    )?;
    let gpu = rank.gpu();
    let pl = Place::of(OP, rank, q, params)?;

    // f32 accumulators: the flash backward adds each pair's gradients into them (no rounding until
    // the end). dQ stays here; dK/dV travel with the keys and values: the one finished last step is
    // sent on while the next visitor's arrives in the other, and this step's pairs add into a local
    // pair (`step_kv`) that joins the arrived one once it is in.
    let dq_acc = Tensor::zeros(gpu, &pl.shape, DType::F32)?;
    let dkv = [
        pair(gpu, &pl.shape, DType::F32)?,
        pair(gpu, &pl.shape, DType::F32)?,
    ];
    let step_kv = if pl.world > 1 {
        Some(pair(gpu, &pl.shape, DType::F32)?)
    } else {
        None
    };
    let recv = pl.arrivals(gpu, q.dtype())?;
    let (mut kc, mut vc) = (k.clone(), v.clone());
    for step in 0..pl.world {
        let (dk_in, dv_in) = &dkv[step % 2];
        let (dk_out, dv_out) = &dkv[(step + 1) % 2];
        let mut sends: Vec<(&Tensor, usize)> = Vec::new();
        let mut recvs: Vec<(&Tensor, usize)> = Vec::new();
        if step + 1 < pl.world {
            let (kr, vr) = &recv[step % 2];
            sends.extend([(&kc, pl.next), (&vc, pl.next)]);
            recvs.extend([(kr, pl.prev), (vr, pl.prev)]);
        }
        if step > 0 {
            sends.extend([(dk_out, pl.next), (dv_out, pl.next)]);
            recvs.extend([(dk_in, pl.prev), (dv_in, pl.prev)]);
        }
        let pending = if sends.is_empty() {
            None
        } else {
            Some(rank.exchange_start(&sends, &recvs)?)
        };
        // Step 0 adds straight into this rank's own accumulator (nothing arrives for it); later
        // steps into the local pair, while the visitor's accumulator is still arriving.
        let (tk, tv) = match (step, &step_kv) {
            (0, _) | (_, None) => (dk_in, dv_in),
            (_, Some((sk, sv))) => (sk, sv),
        };
        tk.fill_bytes(0)?;
        tv.fill_bytes(0)?;
        for pair in step_pairs(pl.world, pl.me, step, pl.causal) {
            let acc = AttentionGrads {
                dq: dq_acc.index0(pair.q)?,
                dk: tk.index0(pair.kv)?,
                dv: tv.index0(pair.kv)?,
            };
            attention::flash_backward_add(
                &q.index0(pair.q)?,
                &kc.index0(pair.kv)?,
                &vc.index0(pair.kv)?,
                &o.index0(pair.q)?,
                &lse.index0(pair.q)?,
                &d_o.index0(pair.q)?,
                &pair_params(pl.scale, pair.causal),
                &acc,
            )?;
        }
        if let Some(p) = pending {
            p.finish()?;
        }
        if step > 0 {
            accumulate(dk_in, tk)?;
            accumulate(dv_in, tv)?;
        }
        if step + 1 < pl.world {
            let (kr, vr) = &recv[step % 2];
            (kc, vc) = (kr.clone(), vr.clone());
        }
    }
    // The last accumulator belongs to rank `next`: send it home, and receive ours.
    let last = (pl.world - 1) % 2;
    let home = if pl.world > 1 {
        let (dk_l, dv_l) = &dkv[last];
        let (dk_h, dv_h) = &dkv[1 - last];
        rank.exchange_start(
            &[(dk_l, pl.next), (dv_l, pl.next)],
            &[(dk_h, pl.prev), (dv_h, pl.prev)],
        )?
        .finish()?;
        1 - last
    } else {
        last
    };
    Ok(AttentionGrads {
        dq: elementwise::cast(&dq_acc, q.dtype())?,
        dk: elementwise::cast(&dkv[home].0, q.dtype())?,
        dv: elementwise::cast(&dkv[home].1, q.dtype())?,
    })
}

/// CPU references for the ring's pieces (f64), for tests that run without a GPU.
pub mod reference {
    /// The LSE merge of two partial attention results over disjoint key sets, row by row
    /// (`o`: `[.., D]` rows, `lse`: one value a row).
    pub fn merge(
        o_a: &[f32],
        lse_a: &[f32],
        o_b: &[f32],
        lse_b: &[f32],
        head_dim: usize,
    ) -> (Vec<f32>, Vec<f32>) {
        let mut o = vec![0f32; o_a.len()];
        let mut lse = vec![f32::NEG_INFINITY; lse_a.len()];
        for r in 0..lse_a.len() {
            let (la, lb) = (lse_a[r] as f64, lse_b[r] as f64);
            let m = la.max(lb);
            if m == f64::NEG_INFINITY {
                continue;
            }
            let l = m + ((la - m).exp() + (lb - m).exp()).ln();
            let (wa, wb) = ((la - l).exp(), (lb - l).exp());
            for c in 0..head_dim {
                let i = r * head_dim + c;
                let a = if wa == 0.0 { 0.0 } else { o_a[i] as f64 * wa };
                let b = if wb == 0.0 { 0.0 } else { o_b[i] as f64 * wb };
                o[i] = (a + b) as f32;
            }
            lse[r] = l as f32;
        }
        (o, lse)
    }

    /// One pair's gradients given the *final* O and LSE of its query rows (what the ring backward
    /// computes per pair): `P = exp(scale q k^T - lse)`, `dS = P (dO v^T - rowsum(dO o))`,
    /// `dq = scale dS k`, `dk = scale dS^T q`, `dv = P^T dO`. All `[rows, D]` of one head.
    #[allow(clippy::too_many_arguments)]
    pub fn pair_backward(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        o: &[f32],
        lse: &[f32],
        d_o: &[f32],
        d: usize,
        scale: f64,
        causal: bool,
    ) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let (nq, nk) = (q.len() / d, k.len() / d);
        let (mut dq, mut dk, mut dv) = (
            vec![0f64; q.len()],
            vec![0f64; k.len()],
            vec![0f64; v.len()],
        );
        for i in 0..nq {
            let delta: f64 = (0..d)
                .map(|c| d_o[i * d + c] as f64 * o[i * d + c] as f64)
                .sum();
            for j in 0..nk {
                if causal && j + nq > i + nk {
                    continue;
                }
                let s: f64 = (0..d)
                    .map(|c| q[i * d + c] as f64 * k[j * d + c] as f64)
                    .sum::<f64>()
                    * scale;
                let p = (s - lse[i] as f64).exp();
                let dp: f64 = (0..d)
                    .map(|c| d_o[i * d + c] as f64 * v[j * d + c] as f64)
                    .sum();
                let ds = p * (dp - delta);
                for c in 0..d {
                    dq[i * d + c] += scale * ds * k[j * d + c] as f64;
                    dk[j * d + c] += scale * ds * q[i * d + c] as f64;
                    dv[j * d + c] += p * d_o[i * d + c] as f64;
                }
            }
        }
        (dq, dk, dv)
    }
}
