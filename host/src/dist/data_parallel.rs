//! Data-parallel training of the transformer block of [`crate::replace::model`], resident on the
//! GPU ([`Block`]): every rank holds the same parameters, trains on its share of the global batch,
//! and the gradients are averaged over the ranks (NCCL all-reduce, `Avg`) before the SGD update, so
//! every rank applies the same update and the loss curve is one GPU's at the global batch.
//!
//! **Buckets, overlapped with the backward.** The gradients live in one f32 device buffer laid out in
//! the order the backward produces them ([`BACKWARD_ORDER`]), cut into buckets of about
//! [`Settings::bucket_bytes`]. The backward reports each gradient as soon as it has it; it is
//! copied into its slot (device to device), and a bucket whose gradients have all arrived is
//! all-reduced on the rank's communication stream at once, while the backward's kernels for the
//! earlier layers run on the GPU's stream. After the backward the update waits for the last
//! buckets (stream order, no host wait) and reads the averaged gradients in place.
//!
//! **Identical parameters.** NCCL's all-reduce leaves the same bits on every rank, and the update is
//! the same f32 arithmetic on the same values, so parameters stay bit-identical across ranks (the
//! GPU tests check it after every step).
//!
//! ```no_run
//! use host::dist::{self, Settings, data_parallel::{self, DataParallel}};
//! use host::replace::model;
//! let n = dist::gpu_count();
//! let cfg = model::Config { vocab: 4096, seq: 1024, d_model: 128, d_ff: 512, batch: 16 * n, lr: 0.05 };
//! let params = model::init(&cfg, 1);
//! let batch = model::batch(&cfg, 2);                       // the global batch
//! let losses = dist::run(n, Settings::default(), |rank| {
//!     let (local_cfg, local) = data_parallel::split_batch(&cfg, &batch, n, rank.rank())?;
//!     let mut dp = DataParallel::new(rank, &local_cfg, &params, &Default::default())?;
//!     (0..10).map(|_| Ok(dp.step(&local)?.loss)).collect::<host::Result<Vec<f64>>>()
//! })?;
//! assert_eq!(losses[0], losses[n - 1]);                     // every rank reports the global loss
//! # Ok::<(), host::Error>(())
//! ```
use std::time::Instant;

use crate::dist::{Pending, Rank, ReduceOp};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::replace::model::resident::Block;
use crate::replace::model::{BACKWARD_ORDER, Batch, Config, Params};
use crate::tensor::Tensor;

/// How gradients are reduced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// A bucket is closed once it holds at least this many bytes of gradients (the last one may hold
    /// fewer). Smaller buckets start reducing earlier; each costs one collective's latency.
    pub bucket_bytes: usize,
}

impl Default for Settings {
    /// 1 MiB: at NVLink bandwidth (about 170 GB/s bus for a 1-8 MiB all-reduce on two H200s,
    /// 2026-11-26) some 10 us of transfer, a few times one collective's fixed latency, and small
    /// enough that the block's first gradient (the 2 MiB output projection at vocab 4096, d 128)
    /// is reduced while the backward computes the rest. 4 MiB put the whole block in one bucket,
    /// reduced only after the backward.
    fn default() -> Self {
        Settings {
            bucket_bytes: 1 << 20,
        }
    }
}

/// Rank `rank`'s share of a global batch: sequences `rank * B / world ..`, and the config with the
/// local batch size. The global batch must split evenly (equal shares keep the average of the ranks'
/// mean losses equal to the global mean).
pub fn split_batch(
    cfg: &Config,
    batch: &Batch,
    world: usize,
    rank: usize,
) -> Result<(Config, Batch)> {
    const OP: &str = "data_parallel::split_batch";
    if world == 0 || !cfg.batch.is_multiple_of(world) || rank >= world {
        return Err(Error::Invalid {
            op: OP,
            msg: format!(
                "the global batch of {} sequences must split evenly over {world} ranks (rank {rank})",
                cfg.batch
            ),
        });
    }
    let local = cfg.batch / world;
    let tokens = local * cfg.seq;
    let range = rank * tokens..(rank + 1) * tokens;
    let (Some(tok), Some(tgt)) = (batch.tokens.get(range.clone()), batch.targets.get(range)) else {
        return Err(Error::Length {
            what: "data_parallel::split_batch (batch tokens vs B * S)",
            expected: cfg.tokens(),
            got: batch.tokens.len().min(batch.targets.len()),
        });
    };
    Ok((
        Config {
            batch: local,
            ..*cfg
        },
        Batch {
            tokens: tok.to_vec(),
            targets: tgt.to_vec(),
        },
    ))
}

/// Where each gradient sits in the flat buffer, and the buckets.
struct Layout {
    /// (name, offset, len, shape) in [`BACKWARD_ORDER`].
    slots: Vec<(&'static str, usize, usize, Vec<usize>)>,
    /// (first slot, end slot) of each bucket.
    buckets: Vec<(usize, usize)>,
    total: usize,
}

fn layout(p: &Params, bucket_bytes: usize) -> Layout {
    let named = p.named();
    let mut slots = Vec::new();
    let mut off = 0;
    for name in BACKWARD_ORDER {
        let shape = named
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, t)| t.shape.clone())
            .unwrap_or_default();
        let len = shape.iter().product::<usize>();
        slots.push((name, off, len, shape));
        off += len;
    }
    let mut buckets = Vec::new();
    let (mut first, mut bytes) = (0, 0);
    for (i, slot) in slots.iter().enumerate() {
        bytes += slot.2 * 4;
        if bytes >= bucket_bytes.max(1) || i + 1 == slots.len() {
            buckets.push((first, i + 1));
            first = i + 1;
            bytes = 0;
        }
    }
    Layout {
        slots,
        buckets,
        total: off,
    }
}

/// One data-parallel step's result.
#[derive(Clone, Debug)]
pub struct Step {
    /// The global batch's mean loss (the mean of the ranks' losses), before the update.
    pub loss: f64,
    /// This rank's own loss.
    pub local_loss: f64,
    /// Buckets whose all-reduce was queued while the backward was still running (the last one
    /// closes with the backward's last gradient).
    pub overlapped_buckets: usize,
    pub buckets: usize,
    /// Host wall time of the forward and backward (kernels queued, gradient copies and bucket
    /// launches included).
    pub backward_s: f64,
    /// Host wall time from the backward's end to the update's end.
    pub after_backward_s: f64,
}

/// A rank's data-parallel trainer: the block on its GPU and the gradient buffer.
pub struct DataParallel<'r> {
    rank: &'r Rank,
    block: Block,
    cfg: Config,
    lay: Layout,
    flat: Tensor,
}

impl<'r> DataParallel<'r> {
    /// Uploads `params` to the rank's GPU. `cfg` is the local config (see [`split_batch`]); every
    /// rank must pass the same parameters.
    pub fn new(rank: &'r Rank, cfg: &Config, params: &Params, settings: &Settings) -> Result<Self> {
        let lay = layout(params, settings.bucket_bytes);
        Ok(DataParallel {
            rank,
            block: Block::new(rank.gpu(), cfg, params)?,
            cfg: *cfg,
            flat: Tensor::empty(rank.gpu(), &[lay.total.max(1)], DType::F32)?,
            lay,
        })
    }

    /// The block's current parameters, read back.
    pub fn params(&self) -> Result<Params> {
        self.rank.synchronize()?;
        self.block.params()
    }

    /// One SGD step on this rank's share `batch`: loss and gradients, gradients averaged over the
    /// group in buckets overlapped with the backward, then `params -= cfg.lr * grads`. Every rank
    /// must call it.
    pub fn step(&mut self, batch: &Batch) -> Result<Step> {
        let rank = self.rank;
        let lay = &self.lay;
        let flat = &self.flat;
        let mut arrived = vec![false; lay.slots.len()];
        let mut launched = vec![false; lay.buckets.len()];
        let mut pending: Vec<Pending> = Vec::new();
        let mut overlapped = 0usize;
        let t0 = Instant::now();
        let (local_loss, _) = {
            let mut on_grad = |name: &'static str, g: &Tensor| -> Result<()> {
                let Some(i) = lay.slots.iter().position(|s| s.0 == name) else {
                    return Ok(());
                };
                let (_, off, len, _) = &lay.slots[i];
                flat.narrow(*off, *len)?.copy_from(&g.reshape(&[*len])?)?;
                arrived[i] = true;
                for (b, &(s, e)) in lay.buckets.iter().enumerate() {
                    if !launched[b] && arrived[s..e].iter().all(|&a| a) {
                        let (o0, o1) = (lay.slots[s].1, lay.slots[e - 1].1 + lay.slots[e - 1].2);
                        pending.push(
                            rank.all_reduce_start(&flat.narrow(o0, o1 - o0)?, ReduceOp::Avg)?,
                        );
                        launched[b] = true;
                        overlapped += 1;
                    }
                }
                Ok(())
            };
            self.block.loss_and_grads(batch, &mut on_grad)?
        };
        let backward_s = t0.elapsed().as_secs_f64();
        // The last gradient closes the last bucket inside the backward; count it as not overlapped.
        overlapped = overlapped.saturating_sub(1);
        if let Some(b) = launched.iter().position(|l| !l) {
            return Err(rank.error(format!(
                "bucket {b} never filled: the backward did not report every gradient"
            )));
        }
        for p in pending {
            p.finish()?;
        }
        let averaged = lay
            .slots
            .iter()
            .map(|(name, off, len, shape)| Ok((*name, flat.narrow(*off, *len)?.reshape(shape)?)))
            .collect::<Result<Vec<_>>>()?;
        self.block.sgd(&averaged, self.cfg.lr)?;
        // The global loss: every rank's local loss (as an f32 pair, hi + lo, so no precision is lost).
        let hi = local_loss as f32;
        let lo = (local_loss - hi as f64) as f32;
        let gpu = rank.gpu();
        // `from_f32` waits for the GPU's stream without polling; the stream now follows the
        // buckets' all-reduces, so wait through the rank first (a lost peer times out there).
        rank.synchronize()?;
        let mine = Tensor::from_f32(gpu, &[hi, lo], &[2], DType::F32)?;
        let all = Tensor::empty(gpu, &[2 * rank.world()], DType::F32)?;
        rank.all_gather(&mine, &all)?;
        rank.synchronize()?;
        let losses = all.to_vec()?;
        let loss = losses
            .chunks(2)
            .map(|p| p[0] as f64 + p[1] as f64)
            .sum::<f64>()
            / rank.world() as f64;
        Ok(Step {
            loss,
            local_loss,
            overlapped_buckets: overlapped,
            buckets: lay.buckets.len(),
            backward_s,
            after_backward_s: t0.elapsed().as_secs_f64() - backward_s,
        })
    }
}
