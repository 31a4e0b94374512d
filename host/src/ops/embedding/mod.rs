//! Embedding: `out[n, :] = table[ids[n], :]` for a `[V, D]` table and `N` u32 ids (out `[N, D]`), and
//! the backward `dW[v, :] = sum over n with ids[n] = v of dy[n, :]` (`[V, D]`). f32, f16, bf16.
//!
//! An id `>= V` is an [`Error::IdOutOfRange`] returned to the caller, found before anything reads the
//! table, never an illegal address:
//! - ids given as a host slice ([`Ids::Host`]) are checked on the host, then uploaded;
//! - ids already on the device ([`DeviceIds`]) are checked by a small GPU pass (`embedding_check_ids_u32`,
//!   N * 4 bytes read) that counts the bad ones; the host reads the count back (one synchronisation)
//!   and launches the gather only if it is 0. On the error path the ids are copied back once to name
//!   the first bad one. (Chosen over a fused check in the gather: the gather never runs on bad input,
//!   and the extra pass is ~1/D of the gather's traffic.) The gather also zero-fills a row whose id is
//!   out of range instead of reading past the table, as a second line of defence.
//!
//! The backward is deterministic without float atomics: the host groups the positions by id with a
//! stable counting sort (device ids are copied to the host for it: N * 4 bytes), and one GPU thread sums
//! each element of dW over its positions in increasing order. Rows of dW that no id names are zero.
use std::sync::Arc;

use cudarc::driver::CudaSlice;
use gpu::params::RawSlice;
use gpu::params::embedding::{BLOCK, CHECK_BLOCK, CHECK_MAX_BLOCKS, bwd_block_for};

use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::kernel_name;
use crate::launch::{ByValue, grid_blocks, launch, raw_u32, upload_u32};
use crate::tensor::Tensor;

/// u32 ids resident on the device. Ids uploaded from the host carry their bound (largest id + 1), so an
/// op checks them against a table's vocabulary with one comparison on the host: no check kernel, no
/// read-back, no synchronisation on the hot path. Ids of unknown bound are checked on the device first.
#[derive(Clone)]
pub struct DeviceIds {
    gpu: Gpu,
    buf: Arc<CudaSlice<u32>>,
    len: usize,
    /// Exclusive upper bound of the ids when known (0 for no ids).
    bound: Option<u64>,
}

impl std::fmt::Debug for DeviceIds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceIds({} ids)", self.len)
    }
}

impl DeviceIds {
    /// Copies `ids` to the device as they are.
    pub fn from_slice(gpu: &Gpu, ids: &[u32]) -> Result<DeviceIds> {
        Ok(DeviceIds {
            gpu: gpu.clone(),
            buf: Arc::new(upload(gpu, ids)?),
            len: ids.len(),
            bound: Some(ids.iter().max().map_or(0, |&m| m as u64 + 1)),
        })
    }
    /// The same ids with their bound forgotten, as ids computed on the device would be: the ops then
    /// run the device-side check. For tests of that path.
    #[doc(hidden)]
    pub fn without_known_bound(mut self) -> DeviceIds {
        self.bound = None;
        self
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }
    /// The ids, copied back (synchronises).
    pub fn to_vec(&self) -> Result<Vec<u32>> {
        let mut v = self
            .gpu
            .stream()
            .clone_dtoh(self.buf.as_ref())
            .map_err(|e| Error::driver(e, "copying ids device -> host"))?;
        self.gpu.synchronize()?;
        v.truncate(self.len);
        Ok(v)
    }
    fn raw(&self) -> RawSlice {
        raw_u32(&self.gpu, &self.buf, self.len)
    }
}

/// Ids for [`embedding`] and [`embedding_backward`]: a host slice or a device buffer.
#[derive(Clone, Copy, Debug)]
pub enum Ids<'a> {
    Host(&'a [u32]),
    Device(&'a DeviceIds),
}

impl<'a> From<&'a [u32]> for Ids<'a> {
    fn from(v: &'a [u32]) -> Self {
        Ids::Host(v)
    }
}
impl<'a, const N: usize> From<&'a [u32; N]> for Ids<'a> {
    fn from(v: &'a [u32; N]) -> Self {
        Ids::Host(v)
    }
}
impl<'a> From<&'a Vec<u32>> for Ids<'a> {
    fn from(v: &'a Vec<u32>) -> Self {
        Ids::Host(v)
    }
}
impl<'a> From<&'a DeviceIds> for Ids<'a> {
    fn from(v: &'a DeviceIds) -> Self {
        Ids::Device(v)
    }
}

impl Ids<'_> {
    fn len(&self) -> usize {
        match self {
            Ids::Host(v) => v.len(),
            Ids::Device(d) => d.len,
        }
    }
}

fn upload(gpu: &Gpu, v: &[u32]) -> Result<CudaSlice<u32>> {
    upload_u32(gpu, v, "u32 indices")
}

/// The first out-of-range id of a host slice, as the error.
fn check_host_ids(op: &'static str, ids: &[u32], vocab: usize) -> Result<()> {
    let bad = |&id: &u32| id as usize >= vocab;
    match ids.iter().position(bad) {
        None => Ok(()),
        Some(position) => Err(Error::IdOutOfRange {
            op,
            count: ids.iter().filter(|id| bad(id)).count() as u64,
            vocab,
            position,
            id: ids[position],
        }),
    }
}

/// Counts device ids `>= vocab` on the GPU; on a nonzero count copies them back to name the first.
fn check_device_ids(op: &'static str, ids: &DeviceIds, vocab: usize) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    match ids.bound {
        Some(bound) if bound <= vocab as u64 => return Ok(()),
        // Known to hold an id >= vocab: name the first and count them from a host copy.
        Some(_) => return check_host_ids(op, &ids.to_vec()?, vocab),
        None => {}
    }
    let gpu = &ids.gpu;
    let count = gpu
        .stream()
        .alloc_zeros::<u32>(1)
        .map_err(|e| Error::driver(e, "allocating the id check counter"))?;
    let grid = grid_blocks(ids.len as u64, CHECK_BLOCK as u64).min(CHECK_MAX_BLOCKS as u32);
    launch(
        gpu,
        "embedding_check_ids_u32",
        grid,
        CHECK_BLOCK,
        &[
            &ByValue(ids.raw()),
            &(vocab as u64),
            &ByValue(raw_u32(gpu, &count, 1)),
        ],
    )?;
    let n = gpu
        .stream()
        .clone_dtoh(&count)
        .map_err(|e| Error::driver(e, "reading the id check counter"))?;
    gpu.synchronize()?;
    if n[0] == 0 {
        return Ok(());
    }
    check_host_ids(op, &ids.to_vec()?, vocab)
}

fn check_ids_len(op: &'static str, n: usize) -> Result<()> {
    if n as u64 > u32::MAX as u64 {
        return Err(Error::TooLarge {
            op,
            what: "number of ids",
            given: n as u64,
            max: u32::MAX as u64,
        });
    }
    Ok(())
}

/// `[N, D]` rows of `table` (`[V, D]`, contiguous) picked by `ids`.
pub fn embedding<'a>(table: &Tensor, ids: impl Into<Ids<'a>>) -> Result<Tensor> {
    const OP: &str = "embedding";
    let ids = ids.into();
    if table.shape().len() != 2 {
        return Err(Error::Shape {
            op: OP,
            what: "table must be [V, D]".into(),
            expected: "rank 2".into(),
            got: table.shape().to_vec(),
        });
    }
    table.require_contiguous(OP, "table")?;
    let (vocab, cols) = (table.shape()[0], table.shape()[1]);
    let n = ids.len();
    check_ids_len(OP, n)?;
    let gpu = table.gpu();
    // Validate first: nothing is launched (or allocated for the output) on bad ids.
    let uploaded;
    let ids_raw = match ids {
        Ids::Host(v) => {
            check_host_ids(OP, v, vocab)?;
            uploaded = upload(gpu, v)?;
            raw_u32(gpu, &uploaded, n)
        }
        Ids::Device(d) => {
            if !d.gpu.same_device(gpu) {
                return Err(Error::DeviceMismatch { op: OP });
            }
            check_device_ids(OP, d, vocab)?;
            d.raw()
        }
    };
    let out = Tensor::empty(gpu, &[n, cols], table.dtype())?;
    if out.numel() > 0 {
        launch(
            gpu,
            kernel_name!("embedding", table.dtype()),
            grid_blocks(n as u64, (BLOCK / 32) as u64),
            BLOCK,
            &[
                &ByValue(table.raw()),
                &ByValue(ids_raw),
                &ByValue(out.raw()),
                &(vocab as u64),
                &(cols as u64),
            ],
        )?;
    }
    Ok(out)
}

/// Positions grouped by id (stable counting sort): `order[offsets[v] .. offsets[v + 1]]` are the `n`
/// with `ids[n] = v`, increasing. Ids must be `< vocab`.
pub fn group_by_id(ids: &[u32], vocab: usize) -> (Vec<u32>, Vec<u32>) {
    let mut offsets = vec![0u32; vocab + 1];
    for &id in ids {
        offsets[id as usize + 1] += 1;
    }
    for v in 0..vocab {
        offsets[v + 1] += offsets[v];
    }
    let mut next = offsets.clone();
    let mut order = vec![0u32; ids.len()];
    for (n, &id) in ids.iter().enumerate() {
        order[next[id as usize] as usize] = n as u32;
        next[id as usize] += 1;
    }
    (order, offsets)
}

/// `dW` (`[vocab, D]`, dy's dtype) of an embedding lookup with `ids`, from `dy` (`[N, D]`).
pub fn embedding_backward<'a>(
    ids: impl Into<Ids<'a>>,
    dy: &Tensor,
    vocab: usize,
) -> Result<Tensor> {
    const OP: &str = "embedding_backward";
    let ids = ids.into();
    let n = ids.len();
    check_ids_len(OP, n)?;
    if dy.shape().len() != 2 || dy.shape()[0] != n {
        return Err(Error::Shape {
            op: OP,
            what: format!("dy must be [N, D] with N = {n} ids"),
            expected: format!("[{n}, D]"),
            got: dy.shape().to_vec(),
        });
    }
    dy.require_contiguous(OP, "dy")?;
    let gpu = dy.gpu();
    let host_ids;
    let ids: &[u32] = match ids {
        Ids::Host(v) => v,
        Ids::Device(d) => {
            if !d.gpu.same_device(gpu) {
                return Err(Error::DeviceMismatch { op: OP });
            }
            host_ids = d.to_vec()?;
            &host_ids
        }
    };
    check_host_ids(OP, ids, vocab)?;
    let cols = dy.shape()[1];
    let dw = Tensor::empty(gpu, &[vocab, cols], dy.dtype())?;
    if dw.numel() == 0 {
        return Ok(dw);
    }
    let (order, offsets) = group_by_id(ids, vocab);
    let (order_d, offsets_d) = (upload(gpu, &order)?, upload(gpu, &offsets)?);
    let name = kernel_name!("embedding_backward", dy.dtype());
    launch(
        gpu,
        name,
        grid_blocks(vocab as u64, 1),
        bwd_block_for(cols as u64).min(gpu.max_block_pow2(name)?),
        &[
            &ByValue(raw_u32(gpu, &order_d, n)),
            &ByValue(raw_u32(gpu, &offsets_d, vocab + 1)),
            &ByValue(dy.raw()),
            &ByValue(dw.raw()),
            &(vocab as u64),
            &(cols as u64),
        ],
    )?;
    Ok(dw)
}

/// CPU references (f64 accumulation): what the tests and the incremental-replacement harness
/// compare the kernels with.
pub mod reference;

#[cfg(test)]
mod tests;
