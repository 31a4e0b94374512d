//! Past one GPU: a communicator over the GPUs of one host, NCCL collectives on our streams, ring
//! (context-parallel) attention ([`ring_attention`]) and data-parallel training ([`data_parallel`]).
//!
//! **One process, one thread per GPU.** [`run`] opens a [`Gpu`] per device, starts a thread for each
//! and hands every thread its [`Rank`]: its GPU, its place in the group and an NCCL communicator over
//! all of them. Threads (not processes) because the library's users are Rust programs that own their
//! GPUs; nothing has to be launched by a wrapper, and a failing rank is seen by the others at once.
//!
//! ```no_run
//! use host::{DType, Tensor, dist};
//! # fn main() -> host::Result<()> {
//! let n = dist::gpu_count();
//! let sums = dist::run(n, dist::Settings::default(), |rank| {
//!     let x = Tensor::from_f32(rank.gpu(), &[rank.rank() as f32; 4], &[4], DType::F32)?;
//!     rank.all_reduce(&x, dist::ReduceOp::Sum)?;
//!     rank.synchronize()?;
//!     Ok(x.to_vec()?[0])
//! })?;
//! assert!(sums.iter().all(|&s| s == (0..n).sum::<usize>() as f32));
//! # Ok(()) }
//! ```
//!
//! **Streams.** Ops run on the GPU's stream ([`Gpu::stream`]); collectives (NCCL) and exchanges
//! (peer copies on the copy engines) run on a second stream of the rank's own, ordered after
//! everything queued on the GPU's stream before them. The blocking forms
//! ([`Rank::all_reduce`], ...) make the GPU's stream wait for the collective (the host does not wait);
//! the `_start` forms return a [`Pending`] and let kernels queued meanwhile overlap the transfer until
//! [`Pending::finish`].
//!
//! **Failures do not hang.** Every wait through a [`Rank`] ([`Rank::synchronize`], a collective's
//! set-up) polls: it returns [`Error::Dist`] when the wait passes [`Settings::timeout`], when NCCL
//! reports an error, or when another rank failed. A rank whose closure returns an error (or panics)
//! marks the group failed; [`run`] then aborts every rank's communicator (`ncclCommAbort`), which ends
//! the collectives the others are waiting in, and returns the first rank's error. Waits outside the
//! rank ([`Gpu::synchronize`], [`Tensor::to_host`]) are not polled (they end when another rank fails,
//! as the abort ends the collective, but never time out): call [`Rank::synchronize`] before reading
//! results back. The one wait that cannot be polled is inside NCCL's own communicator set-up, if
//! a rank fails there after every rank has arrived (see `join` in this file).
pub mod data_parallel;
mod nccl;
pub mod ring_attention;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cudarc::driver::sys::{self, CUevent, CUstream};

use crate::device::Gpu;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use nccl::{DataType, Nccl, NcclComm, RedOp};

/// How a group runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// The longest a rank waits for one thing (a communicator's set-up, a collective to be queued,
    /// [`Rank::synchronize`]) before it gives up with [`Error::Dist`] and fails the group.
    pub timeout: Duration,
}

impl Default for Settings {
    /// A 120 s timeout: above any single step of the benches (the longest, ring attention backward
    /// at 256k tokens, is under 2 s), below what a user waits before suspecting a hang.
    fn default() -> Self {
        Settings {
            timeout: Duration::from_secs(120),
        }
    }
}

/// The reduction of [`Rank::all_reduce`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    /// The sum divided by the number of ranks.
    Avg,
    Max,
}

impl ReduceOp {
    fn nccl(self) -> RedOp {
        match self {
            ReduceOp::Sum => RedOp::Sum,
            ReduceOp::Avg => RedOp::Avg,
            ReduceOp::Max => RedOp::Max,
        }
    }
}

/// GPUs visible to this process (0 without a driver).
pub fn gpu_count() -> usize {
    if !crate::device::driver_present() {
        return 0;
    }
    cudarc::driver::CudaContext::device_count()
        .map(|n| n.max(0) as usize)
        .unwrap_or(0)
}

/// The NCCL library this process loads: its version and the name it was loaded by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NcclInfo {
    pub version: (u32, u32, u32),
    pub library: String,
}

/// Which NCCL [`run`] uses, or why none can be loaded ([`Error::NcclUnavailable`]).
pub fn nccl_info() -> Result<NcclInfo> {
    let lib = nccl::nccl().map_err(|reason| Error::NcclUnavailable { reason })?;
    Ok(NcclInfo {
        version: lib.version(),
        library: lib.path.clone(),
    })
}

/// What the ranks of one [`run`] share: whether the group failed, and the first failure.
struct Shared {
    world: usize,
    failed: AtomicBool,
    first: Mutex<Option<(usize, String)>>,
    /// Each rank's communicator, so that [`run`] can abort them all once the group failed.
    comms: Vec<Mutex<CommSlot>>,
    /// Ranks done with their work (their closure returned, or their set-up failed): a rank's drop
    /// ends its communicator only once all are.
    finished: std::sync::atomic::AtomicUsize,
    /// Where the ranks meet before the communicator set-up (see [`join`]).
    gate: Gate,
    /// Where [`Rank::exchange_start`] posts its receive buffers and finished copies (see there).
    mail: Mutex<HashMap<Mail, Post>>,
}

/// A mailbox entry of [`Rank::exchange_start`]: the `n`-th message from rank `from` to rank `to`,
/// either its receive buffer (posted by `to`) or its finished copy (posted by `from`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Mail {
    Buffer { from: usize, to: usize, n: u64 },
    Copied { from: usize, to: usize, n: u64 },
}

/// What a mailbox entry carries: for a buffer, where it is and the event after which it may be
/// overwritten; for a copy, the event after which it has landed.
struct Post {
    ptr: u64,
    bytes: usize,
    dtype: DType,
    ctx: sys::CUcontext,
    event: CUevent,
}

// SAFETY: the raw handles are only used through the driver, which is thread-safe; a post is taken
// out of the mailbox (under its mutex) by exactly one rank.
unsafe impl Send for Post {}

/// A rendezvous that a rank may leave only while it is still closed: it opens when the last rank
/// arrives, and from then on every rank that arrived goes through. So a rank that gives up waiting
/// (a timeout, another rank's failure) can never leave a peer that got through waiting for it.
#[derive(Default)]
pub(crate) struct Gate {
    /// (ranks here, open)
    state: Mutex<(usize, bool)>,
}

impl Gate {
    /// Arrives and waits until `world` ranks have: `Ok` once open, or `Err(why)` when `give_up`
    /// returns a reason while the gate is still closed (the rank is then no longer counted).
    pub(crate) fn pass(
        &self,
        world: usize,
        mut give_up: impl FnMut() -> Option<String>,
    ) -> std::result::Result<(), String> {
        let lock = || self.state.lock().unwrap_or_else(|p| p.into_inner());
        {
            let mut s = lock();
            s.0 += 1;
            if s.0 >= world {
                s.1 = true;
            }
        }
        let polls = Backoff::new();
        loop {
            {
                let mut s = lock();
                if s.1 {
                    return Ok(());
                }
                if let Some(why) = give_up() {
                    s.0 -= 1;
                    return Err(why);
                }
            }
            polls.pause();
        }
    }
}

/// A communicator handle that [`run`]'s watchdog may abort from its thread: every NCCL call on it
/// holds the lock (no call waits for a peer once the group is set up, see [`join`]), so an abort
/// never races a call, and a call after an abort sees `comm` null and fails.
struct CommSlot {
    /// Null before the set-up and once aborted or ended.
    comm: NcclComm,
}

// SAFETY: the raw communicator is only touched under the slot's mutex.
unsafe impl Send for CommSlot {}

impl Shared {
    fn fail(&self, rank: usize, what: String) {
        let mut first = self.first.lock().unwrap_or_else(|p| p.into_inner());
        if first.is_none() {
            *first = Some((rank, what));
        }
        self.failed.store(true, Ordering::SeqCst);
    }

    fn failure(&self) -> Option<(usize, String)> {
        self.first.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Aborts every communicator whose slot is free; a slot held by its rank (a call in progress)
    /// is tried again on the watchdog's next pass.
    fn abort_all(&self, nccl: &Nccl) {
        for slot in &self.comms {
            let mut s = match slot.try_lock() {
                Ok(s) => s,
                Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => continue,
            };
            if !s.comm.is_null() {
                // SAFETY: a live communicator, not in use (we hold its lock).
                unsafe { (nccl.comm_abort)(s.comm) };
                s.comm = std::ptr::null_mut();
            }
        }
    }
}

/// One GPU's place in a [`run`]: its device, its rank and the communicator over the group.
pub struct Rank {
    rank: usize,
    gpu: Gpu,
    comm_stream: CUstream,
    shared: Arc<Shared>,
    settings: Settings,
    nccl: &'static Nccl,
    /// Messages sent to, and received from, each rank so far ([`Rank::exchange_start`] numbers
    /// them so that the i-th send from a rank meets the i-th receive from it).
    sent: Mutex<Vec<u64>>,
    received: Mutex<Vec<u64>>,
}

/// A collective queued on a rank's communication stream by a `_start` call: the tensors it reads
/// and writes are kept alive here until the GPU's stream has been ordered after it. Dropping it
/// without [`Pending::finish`] orders the stream the same way (and reports no error).
#[must_use = "the GPU's stream is ordered after the transfer only by finish (or drop)"]
pub struct Pending<'r> {
    rank: &'r Rank,
    done: CUevent,
    _keep: Vec<Tensor>,
}

impl Pending<'_> {
    /// Makes the GPU's stream wait for the transfer (the host does not wait).
    pub fn finish(mut self) -> Result<()> {
        self.order()
    }

    fn order(&mut self) -> Result<()> {
        if self.done.is_null() {
            return Ok(());
        }
        let e = std::mem::replace(&mut self.done, std::ptr::null_mut());
        wait_event(self.rank.gpu.stream().cu_stream(), e)
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        let _ = self.order();
    }
}

fn drv(r: sys::CUresult, during: &str) -> Result<()> {
    match r {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        e => Err(Error::driver(cudarc::driver::DriverError(e), during)),
    }
}

/// `stream` waits for `event` (destroyed here: the driver keeps it until the wait is done).
fn wait_event(stream: CUstream, event: CUevent) -> Result<()> {
    let r = wait_event_keep(stream, event);
    // SAFETY: a live event; destroying a recorded event after queueing a wait on it is allowed
    // (its resources are freed once it completes).
    unsafe { sys::cuEventDestroy_v2(event) };
    r
}

/// `stream` waits for `event`, which stays the caller's.
fn wait_event_keep(stream: CUstream, event: CUevent) -> Result<()> {
    // SAFETY: both handles are live.
    drv(
        unsafe { sys::cuStreamWaitEvent(stream, event, 0) },
        "ordering two streams",
    )
}

/// An event recorded on `stream` now.
fn record(stream: CUstream) -> Result<CUevent> {
    let mut e: CUevent = std::ptr::null_mut();
    // SAFETY: creates and records an event on a live stream.
    unsafe {
        drv(
            sys::cuEventCreate(&mut e, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32),
            "creating an event",
        )?;
        if let Err(err) = drv(sys::cuEventRecord(e, stream), "recording an event") {
            sys::cuEventDestroy_v2(e);
            return Err(err);
        }
    }
    Ok(e)
}

fn nccl_type(op: &'static str, t: &Tensor) -> Result<DataType> {
    t.require_contiguous(op, "tensor")?;
    Ok(match t.dtype() {
        DType::F32 => DataType::Float32,
        DType::F16 => DataType::Float16,
        DType::BF16 => DataType::Bfloat16,
    })
}

impl Rank {
    /// This rank's index, `0..world()`.
    pub fn rank(&self) -> usize {
        self.rank
    }
    /// The number of ranks (GPUs) in the group.
    pub fn world(&self) -> usize {
        self.shared.world
    }
    /// This rank's GPU (ordinal `rank()`).
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }
    /// The group's settings.
    pub fn settings(&self) -> Settings {
        self.settings
    }

    fn error(&self, what: impl Into<String>) -> Error {
        Error::Dist {
            rank: self.rank,
            world: self.world(),
            what: what.into(),
        }
    }

    /// Fails this rank (and so the group) with `what`.
    fn give_up(&self, what: String) -> Error {
        self.shared.fail(self.rank, what.clone());
        self.error(what)
    }

    /// The error to return when another rank failed first.
    fn peer_failed(&self) -> Option<Error> {
        if !self.shared.failed.load(Ordering::SeqCst) {
            return None;
        }
        Some(match self.shared.failure() {
            Some((r, what)) if r != self.rank => {
                self.error(format!("gave up because rank {r} failed: {what}"))
            }
            Some((_, what)) => self.error(what),
            None => self.error("the group failed"),
        })
    }

    /// Runs `f` on the communicator under its lock; fails if it was aborted.
    fn with_comm<T>(&self, f: impl FnOnce(NcclComm) -> T) -> Result<T> {
        let slot = self.shared.comms[self.rank]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if slot.comm.is_null() {
            drop(slot);
            return Err(self
                .peer_failed()
                .unwrap_or_else(|| self.error("the communicator was aborted")));
        }
        Ok(f(slot.comm))
    }

    /// Polls `ready` until it says so, checking between polls for another rank's failure and for
    /// [`Settings::timeout`] (a timeout fails the group with `what` and `meaning`).
    fn poll_until(
        &self,
        what: &str,
        meaning: &str,
        mut ready: impl FnMut() -> Result<bool>,
    ) -> Result<()> {
        let start = Instant::now();
        let polls = Backoff::new();
        while !ready()? {
            if let Some(e) = self.peer_failed() {
                return Err(e);
            }
            if start.elapsed() > self.settings.timeout {
                return Err(self.give_up(format!(
                    "{what}: timed out after {:.1} s (Settings::timeout){meaning}",
                    self.settings.timeout.as_secs_f64()
                )));
            }
            polls.pause();
        }
        Ok(())
    }

    /// Polls until NCCL has finished queueing the last call (`ncclInProgress` -> success), with the
    /// timeout and the group's failure checked between polls.
    fn settle(&self, what: &str, first: i32) -> Result<()> {
        let mut state = first;
        self.poll_until(what, "; a peer rank never joined", || {
            if state == nccl::IN_PROGRESS {
                state = self.with_comm(|c| {
                    let mut s = nccl::SUCCESS;
                    // SAFETY: a live communicator; writes one int.
                    let r = unsafe { (self.nccl.comm_get_async_error)(c, &mut s) };
                    if r != nccl::SUCCESS { r } else { s }
                })?;
            }
            Ok(state != nccl::IN_PROGRESS)
        })?;
        if state != nccl::SUCCESS {
            let msg = self.with_comm(|c| self.nccl.describe(state, c))?;
            return Err(self.give_up(format!("{what}: {msg}")));
        }
        Ok(())
    }

    /// Queues `call` on the communication stream, after the work queued so far on the GPU's stream.
    fn enqueue(
        &self,
        what: &str,
        tensors: &[&Tensor],
        call: impl FnOnce(NcclComm, CUstream) -> i32,
    ) -> Result<Pending<'_>> {
        if let Some(e) = self.peer_failed() {
            return Err(e);
        }
        for t in tensors {
            if !t.gpu().same_device(&self.gpu) {
                return Err(Error::DeviceMismatch { op: "dist" });
            }
        }
        self.gpu
            .context()
            .bind_to_thread()
            .map_err(|e| Error::driver(e, "binding the context"))?;
        wait_event(self.comm_stream, record(self.gpu.stream().cu_stream())?)?;
        let first = self.with_comm(|c| call(c, self.comm_stream))?;
        if let Err(e) = self.settle(what, first) {
            // Whatever was queued may still touch the operands: the GPU's stream (where they are
            // freed) waits for it before the error returns.
            if let Ok(done) = record(self.comm_stream) {
                let _ = wait_event(self.gpu.stream().cu_stream(), done);
            }
            return Err(e);
        }
        Ok(Pending {
            rank: self,
            done: record(self.comm_stream)?,
            _keep: tensors.iter().map(|t| (*t).clone()).collect(),
        })
    }

    /// In-place all-reduce of `t` (contiguous, f32/f16/bf16) over every rank; the GPU's stream waits
    /// for it. Every rank must call it with the same shape, dtype and op.
    pub fn all_reduce(&self, t: &Tensor, op: ReduceOp) -> Result<()> {
        self.all_reduce_start(t, op)?.finish()
    }

    /// [`Rank::all_reduce`] without ordering the GPU's stream after it: kernels queued before
    /// [`Pending::finish`] overlap the transfer (and must not touch `t`).
    pub fn all_reduce_start(&self, t: &Tensor, op: ReduceOp) -> Result<Pending<'_>> {
        const OP: &str = "dist::all_reduce";
        let dt = nccl_type(OP, t)?;
        let (p, n) = (t.device_ptr(), t.numel());
        self.enqueue(OP, &[t], |c, s| {
            // SAFETY: `t` is contiguous with `n` elements at `p`; in place is allowed by NCCL.
            unsafe {
                (self.nccl.all_reduce)(p as *const _, p as *mut _, n, dt, op.nccl(), c, s as *mut _)
            }
        })
    }

    /// `dst` (`world()` times `src`'s elements, same dtype) receives every rank's `src`, rank order.
    pub fn all_gather(&self, src: &Tensor, dst: &Tensor) -> Result<()> {
        const OP: &str = "dist::all_gather";
        let dt = nccl_type(OP, src)?;
        nccl_type(OP, dst)?;
        if dst.dtype() != src.dtype() {
            return Err(Error::DType {
                op: OP,
                expected: format!("dst of src's dtype {}", src.dtype()),
                got: dst.dtype(),
            });
        }
        if dst.numel() != src.numel() * self.world() {
            return Err(Error::Length {
                what: "dist::all_gather dst (world x src elements)",
                expected: src.numel() * self.world(),
                got: dst.numel(),
            });
        }
        let (ps, pd, n) = (src.device_ptr(), dst.device_ptr(), src.numel());
        self.enqueue(OP, &[src, dst], |c, s| {
            // SAFETY: sizes checked above; both contiguous.
            unsafe { (self.nccl.all_gather)(ps as *const _, pd as *mut _, n, dt, c, s as *mut _) }
        })?
        .finish()
    }

    /// Sends each `sends[i].0` to rank `sends[i].1` and receives each `recvs[j].0` from rank
    /// `recvs[j].1`. Messages between two ranks meet in order: the i-th tensor one rank sends to
    /// another fills the i-th tensor that one receives from it, which must have the same dtype and
    /// element count (contiguous both). Returns a [`Pending`]: kernels queued before its `finish`
    /// overlap the transfer; they must not write a sent tensor nor touch a received one.
    ///
    /// The copies run on the copy engines, not NCCL: every GPU of the group is in this process, so
    /// the sender copies straight into the receiver's tensor (`cuMemcpyPeerAsync`, over NVLink where
    /// the GPUs have it; [`run`] gives every GPU access to the others' memory pools). NCCL's
    /// send/recv kernels held SMs for the whole transfer and while they waited for the peer, which
    /// cost ring attention's flash kernels about 4 ms of 123 on four H200s at S 256k (2026-11-26,
    /// 7e3f3c0); a copy engine holds none. The ranks meet on the host: a receiver posts its buffer
    /// and an event after which it may be overwritten, the sender queues the copy behind that event
    /// and posts the copy's own event, and the receiver's communication stream waits for it. Both
    /// waits are polled (a peer that never calls times out; a failed group ends them).
    ///
    /// So the call returns on the host only once every rank it sends to or receives from has made
    /// its matching call; a send to this rank itself must be received in the same call. A tensor
    /// received must not overlap one sent, nor one still in flight in an unfinished [`Pending`]
    /// (incoming copies are ordered after this rank's GPU stream, not after its own outgoing
    /// copies). In a group that fails, a copy a peer queued just before the failure may still land
    /// in this rank's received tensors after the error returns, and the events of unfinished
    /// messages are not freed.
    pub fn exchange_start(
        &self,
        sends: &[(&Tensor, usize)],
        recvs: &[(&Tensor, usize)],
    ) -> Result<Pending<'_>> {
        const OP: &str = "dist::exchange";
        for &(t, peer) in sends.iter().chain(recvs) {
            if peer >= self.world() {
                return Err(Error::Invalid {
                    op: OP,
                    msg: format!(
                        "peer rank {peer} out of range for a group of {}",
                        self.world()
                    ),
                });
            }
            t.require_contiguous(OP, "tensor")?;
            if !t.gpu().same_device(&self.gpu) {
                return Err(Error::DeviceMismatch { op: "dist" });
            }
        }
        if let Some(e) = self.peer_failed() {
            return Err(e);
        }
        self.gpu
            .context()
            .bind_to_thread()
            .map_err(|e| Error::driver(e, "binding the context"))?;
        let ctx = self.gpu.context().cu_ctx();
        let gpu_stream = self.gpu.stream().cu_stream();
        let number = |counts: &Mutex<Vec<u64>>, peer: usize| {
            let mut c = counts.lock().unwrap_or_else(|p| p.into_inner());
            c[peer] += 1;
            c[peer] - 1
        };
        // Every error from the first post on goes through one exit (below): the group fails (the
        // peers wait on this rank's posts) and the GPU's stream is ordered after whatever was queued.
        let attempt = (|| -> Result<CUevent> {
            // Receive buffers first (posting never waits), so no two ranks wait on each other.
            let mut arriving = Vec::with_capacity(recvs.len());
            for &(t, peer) in recvs {
                let n = number(&self.received, peer);
                let free = record(gpu_stream)?;
                self.post(
                    Mail::Buffer {
                        from: peer,
                        to: self.rank,
                        n,
                    },
                    Post {
                        ptr: t.device_ptr(),
                        bytes: t.numel() * t.dtype().size_bytes(),
                        dtype: t.dtype(),
                        ctx,
                        event: free,
                    },
                );
                arriving.push((peer, n, free));
            }
            // The sends: each behind this rank's queued work (the data) and the receiver's (its buffer).
            let ready = record(gpu_stream)?;
            let sent = (|| -> Result<()> {
                wait_event_keep(self.comm_stream, ready)?;
                for &(t, peer) in sends {
                    let n = number(&self.sent, peer);
                    let buf = self.take(
                        Mail::Buffer {
                            from: self.rank,
                            to: peer,
                            n,
                        },
                        "exchange: waiting for the receiver's buffer",
                    )?;
                    let bytes = t.numel() * t.dtype().size_bytes();
                    if buf.bytes != bytes || buf.dtype != t.dtype() {
                        return Err(self.give_up(format!(
                            "exchange: message {n} to rank {peer} is {bytes} bytes of {}, but rank \
                         {peer} receives {} bytes of {} there",
                            t.dtype(),
                            buf.bytes,
                            buf.dtype
                        )));
                    }
                    // SAFETY: both buffers are live for the copy (ours is kept by the Pending, the
                    // receiver's by its own); the copy is ordered after the receiver's event.
                    unsafe {
                        drv(
                            sys::cuStreamWaitEvent(self.comm_stream, buf.event, 0),
                            "ordering a copy after the receiver",
                        )?;
                        drv(
                            sys::cuMemcpyPeerAsync(
                                buf.ptr,
                                buf.ctx,
                                t.device_ptr(),
                                ctx,
                                bytes,
                                self.comm_stream,
                            ),
                            "copying to a peer GPU",
                        )?;
                    }
                    let copied = record(self.comm_stream)?;
                    self.post(
                        Mail::Copied {
                            from: self.rank,
                            to: peer,
                            n,
                        },
                        Post {
                            ptr: buf.ptr,
                            bytes,
                            dtype: t.dtype(),
                            ctx,
                            event: copied,
                        },
                    );
                }
                Ok(())
            })();
            // SAFETY: queued waits keep what they need; the event is ours.
            unsafe { sys::cuEventDestroy_v2(ready) };
            let received = sent.and_then(|()| {
                for &(peer, n, free) in &arriving {
                    let copy = self.take(
                        Mail::Copied {
                            from: peer,
                            to: self.rank,
                            n,
                        },
                        "exchange: waiting for the sender's copy",
                    )?;
                    // The sender queued its wait on `free` before posting the copy: ours to free now.
                    // SAFETY: events are freed once their queued waits are done.
                    unsafe { sys::cuEventDestroy_v2(free) };
                    wait_event(self.comm_stream, copy.event)?;
                }
                Ok(())
            });
            received?;
            record(self.comm_stream)
        })();
        match attempt {
            Ok(done) => {
                let mut keep: Vec<Tensor> = sends.iter().map(|s| s.0.clone()).collect();
                keep.extend(recvs.iter().map(|r| r.0.clone()));
                Ok(Pending {
                    rank: self,
                    done,
                    _keep: keep,
                })
            }
            Err(e) => {
                // The peers wait on this rank's posts: fail the group so that they stop at once.
                self.shared.fail(self.rank, e.to_string());
                // Whatever was queued may still touch the operands: the GPU's stream (where they
                // are freed) waits for it before the error returns.
                if let Ok(done) = record(self.comm_stream) {
                    let _ = wait_event(gpu_stream, done);
                }
                Err(e)
            }
        }
    }

    fn post(&self, key: Mail, post: Post) {
        self.shared
            .mail
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, post);
    }

    /// Takes the mailbox entry `key`, polling until its rank has posted it.
    fn take(&self, key: Mail, what: &str) -> Result<Post> {
        let mut got = None;
        self.poll_until(what, &format!("; {key:?} was never posted"), || {
            // Nothing is taken once the group failed: the rank that posted it may be returning
            // (and freeing its buffer); the poll then reports the failure.
            if self.shared.failed.load(Ordering::SeqCst) {
                return Ok(false);
            }
            got = self
                .shared
                .mail
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&key);
            Ok(got.is_some())
        })?;
        got.ok_or_else(|| self.error(format!("{what}: {key:?} vanished")))
    }

    /// Waits (host) for everything queued on this rank's streams, polling: returns [`Error::Dist`] on
    /// timeout or when another rank failed, a typed driver error if a kernel faulted.
    pub fn synchronize(&self) -> Result<()> {
        self.gpu
            .context()
            .bind_to_thread()
            .map_err(|e| Error::driver(e, "binding the context"))?;
        // The communication stream first, then the GPU's; one timeout for both.
        let streams = [self.comm_stream, self.gpu.stream().cu_stream()];
        let mut drained = 0;
        let meaning = " with work still queued; a peer rank did not take part in a collective";
        self.poll_until("synchronize", meaning, || {
            while drained < streams.len() {
                // SAFETY: a live stream.
                match unsafe { sys::cuStreamQuery(streams[drained]) } {
                    sys::CUresult::CUDA_SUCCESS => drained += 1,
                    sys::CUresult::CUDA_ERROR_NOT_READY => return Ok(false),
                    e => {
                        let err = Error::driver(
                            cudarc::driver::DriverError(e),
                            "dist: waiting for the streams",
                        );
                        self.shared.fail(self.rank, err.to_string());
                        return Err(err);
                    }
                }
            }
            Ok(true)
        })
    }

    /// All ranks reach this point before any leaves it (an all-reduce of one value, then
    /// [`Rank::synchronize`]).
    pub fn barrier(&self) -> Result<()> {
        // Made without a host copy: `Tensor::from_f32` waits for the GPU's stream, unpolled.
        let t = Tensor::zeros(&self.gpu, &[1], DType::F32)?;
        self.all_reduce(&t, ReduceOp::Sum)?;
        self.synchronize()
    }
}

/// A panic payload's message.
fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}

/// The pause between two polls of a host wait: yield (spin) for the first 20 ms, then sleep 50 us
/// a poll. A healthy group's waits mostly end within the spin, so the wait returns within
/// microseconds of the GPU finishing (a 100 us sleep from the 200th poll on, the first form, added
/// up to about 0.15 ms to every short wait); past it the host thread stops burning a core through
/// a long kernel, at a cost of about a sleep's length (a 50 us request sleeps about 100 us with
/// Linux's default timer slack).
struct Backoff {
    start: Instant,
}

impl Backoff {
    const SPIN: Duration = Duration::from_millis(20);

    fn new() -> Backoff {
        Backoff {
            start: Instant::now(),
        }
    }

    fn pause(&self) {
        if self.start.elapsed() < Self::SPIN {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

impl Drop for Rank {
    /// Ends the communicator once every rank is done with it: a healthy group finalises (flushes)
    /// and destroys, which may wait for the peers, so it starts only when all ranks have finished
    /// their work; a failed group aborts, which waits for nobody.
    fn drop(&mut self) {
        let _ = self.gpu.context().bind_to_thread();
        let shared = &self.shared;
        let polls = Backoff::new();
        while !shared.failed.load(Ordering::SeqCst)
            && shared.finished.load(Ordering::SeqCst) < shared.world
        {
            polls.pause();
        }
        // Taken out of the slot first: the watchdog never aborts it under our hands.
        let c = {
            let mut slot = shared.comms[self.rank]
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            std::mem::replace(&mut slot.comm, std::ptr::null_mut())
        };
        if !c.is_null() {
            // SAFETY: a live communicator that only this rank holds now.
            unsafe {
                let mut ok = !shared.failed.load(Ordering::SeqCst)
                    && matches!(
                        (self.nccl.comm_finalize)(c),
                        nccl::SUCCESS | nccl::IN_PROGRESS
                    );
                let start = Instant::now();
                while ok {
                    let mut st = nccl::SUCCESS;
                    (self.nccl.comm_get_async_error)(c, &mut st);
                    if st == nccl::SUCCESS {
                        break;
                    }
                    if st != nccl::IN_PROGRESS || start.elapsed() > self.settings.timeout {
                        ok = false;
                    }
                    polls.pause();
                }
                if ok {
                    (self.nccl.comm_destroy)(c);
                } else {
                    (self.nccl.comm_abort)(c);
                }
            }
        }
        // SAFETY: the stream was created by this rank; the driver frees it once its work is done.
        unsafe { sys::cuStreamDestroy_v2(self.comm_stream) };
    }
}

/// Runs `f` on `world` GPUs (ordinals `0..world`), one thread each, every thread with its [`Rank`];
/// returns the results in rank order, or the first rank's error (see the module doc: a failing rank
/// fails the group, never a hang).
pub fn run<T, F>(world: usize, settings: Settings, f: F) -> Result<Vec<T>>
where
    T: Send,
    F: Fn(&Rank) -> Result<T> + Sync,
{
    const OP: &str = "dist::run";
    if world == 0 {
        return Err(Error::Invalid {
            op: OP,
            msg: "a group needs at least one GPU, got world = 0".into(),
        });
    }
    let visible = gpu_count();
    if world > visible {
        return Err(Error::NoDevice {
            reason: format!("dist::run: {world} GPUs requested, {visible} visible"),
        });
    }
    if std::env::var_os("NCCL_RUNTIME_CONNECT").is_none() {
        // Collective connections are made during set-up (while every rank is known to be there),
        // not lazily at a collective's first use, where a blocking call would wait for the peer.
        // SAFETY: read by NCCL once, at its first communicator set-up; set before any rank thread
        // of this group starts (another thread of the program reading the environment at this
        // instant is the documented hazard of set_var).
        unsafe { std::env::set_var("NCCL_RUNTIME_CONNECT", "0") };
    }
    let nccl = nccl::nccl().map_err(|reason| Error::NcclUnavailable { reason })?;
    let mut id = nccl::UniqueId { internal: [0; 128] };
    // SAFETY: writes the 128-byte id.
    let r = unsafe { (nccl.get_unique_id)(&mut id) };
    if r != nccl::SUCCESS {
        return Err(Error::Dist {
            rank: 0,
            world,
            what: format!(
                "ncclGetUniqueId: {}",
                nccl.describe(r, std::ptr::null_mut())
            ),
        });
    }
    let shared = Arc::new(Shared {
        world,
        failed: AtomicBool::new(false),
        first: Mutex::new(None),
        comms: (0..world)
            .map(|_| {
                Mutex::new(CommSlot {
                    comm: std::ptr::null_mut(),
                })
            })
            .collect(),
        gate: Gate::default(),
        finished: std::sync::atomic::AtomicUsize::new(0),
        mail: Mutex::new(HashMap::new()),
    });
    let results: Vec<Option<T>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                let shared = shared.clone();
                let f = &f;
                scope.spawn(move || {
                    // The outcome is recorded before the rank is dropped: its drop waits for the
                    // other ranks unless the group has failed. A panic anywhere (set-up included)
                    // fails the group like an error.
                    let body = || -> Option<T> {
                        let r = match join(rank, &shared, settings, nccl, id) {
                            Ok(r) => r,
                            Err(e) => {
                                shared.fail(rank, e.to_string());
                                return None;
                            }
                        };
                        let v = match catch_unwind(AssertUnwindSafe(|| f(&r))) {
                            Ok(Ok(v)) => Some(v),
                            Ok(Err(e)) => {
                                shared.fail(rank, e.to_string());
                                None
                            }
                            Err(panic) => {
                                shared.fail(rank, format!("panicked: {}", panic_message(&panic)));
                                None
                            }
                        };
                        shared.finished.fetch_add(1, Ordering::SeqCst);
                        drop(r);
                        v
                    };
                    match catch_unwind(AssertUnwindSafe(body)) {
                        Ok(v) => v,
                        Err(panic) => {
                            shared.fail(rank, format!("panicked: {}", panic_message(&panic)));
                            None
                        }
                    }
                })
            })
            .collect();
        // The watchdog: once a rank failed, abort every communicator (each as soon as its slot is
        // free and filled) so that no rank stays in a collective waiting for it.
        while handles.iter().any(|h| !h.is_finished()) {
            if shared.failed.load(Ordering::SeqCst) {
                shared.abort_all(nccl);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        handles
            .into_iter()
            .map(|h| h.join().ok().flatten())
            .collect()
    });
    if let Some((rank, what)) = shared.failure() {
        return Err(Error::Dist { rank, world, what });
    }
    Ok(results
        .into_iter()
        .map(|r| r.expect("no failure recorded"))
        .collect())
}

/// Opens rank `rank`'s GPU, its stream and its communicator.
///
/// Communicators are **blocking** (NCCL's default): a call returns once its work is queued. Measured
/// on two H200s (2026-11-26), non-blocking communicators cost about 150 us of host time per
/// collective (NCCL hands each call to a helper thread), which capped a 1 MiB all-reduce at 0.36x
/// and an 8 MiB one at 0.33x of PyTorch's bus bandwidth; blocking ones run them at 2.7x and 1.06x.
/// What could then wait inside NCCL for a peer is made to happen while every rank is known to be
/// here: the set-up starts only after all ranks arrived (a rank that failed before fails the
/// others in this polled wait), collective connections are made during it (`NCCL_RUNTIME_CONNECT=0`
/// unless set); every pair of ranks then copies once (the peer copies of [`Rank::exchange_start`]
/// do not go through NCCL). From then on NCCL calls do not wait for peers; a peer missing from a collective is seen by the polled waits
/// ([`Rank::synchronize`]) and ends in an abort. One window is left: a rank that fails inside
/// NCCL's own set-up after every rank has arrived (an NCCL error on one GPU only) leaves the others
/// inside `ncclCommInitRankConfig`, where NCCL offers no timeout (a non-blocking set-up would, at
/// the per-call cost above).
fn join(
    rank: usize,
    shared: &Arc<Shared>,
    settings: Settings,
    nccl: &'static Nccl,
    id: nccl::UniqueId,
) -> Result<Rank> {
    let gpu = Gpu::new(rank)?;
    gpu.context()
        .bind_to_thread()
        .map_err(|e| Error::driver(e, "binding the context"))?;
    let mut stream: CUstream = std::ptr::null_mut();
    // SAFETY: creates a stream in the bound context.
    unsafe {
        drv(
            sys::cuStreamCreate(
                &mut stream,
                sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
            ),
            "creating the communication stream",
        )?;
    }
    let me = Rank {
        rank,
        gpu,
        comm_stream: stream,
        shared: shared.clone(),
        settings,
        nccl,
        sent: Mutex::new(vec![0; shared.world]),
        received: Mutex::new(vec![0; shared.world]),
    };
    match connect(&me, id) {
        Ok(()) => Ok(me),
        Err(e) => {
            // Recorded before `me` drops (its drop waits for the others unless the group failed).
            shared.fail(rank, e.to_string());
            Err(e)
        }
    }
}

/// Lets every other GPU of the group read and write the memory pool of `me`'s GPU (where tensors
/// live), so that [`Rank::exchange_start`]'s copies go GPU to GPU (over NVLink where there is
/// one) instead of through the host. A GPU that cannot reach this one is left out (its copies are
/// staged by the driver). Set on the device's pool: it outlives the group.
fn grant_peer_access(me: &Rank) -> Result<()> {
    if me.shared.world == 1 || !me.gpu.context().has_async_alloc() {
        return Ok(());
    }
    let pool = crate::device::device_pool(me.gpu.context())?;
    let mine = me.gpu.context().cu_device();
    let mut descs = Vec::new();
    // Rank `p` runs on device ordinal `p` (see `join`).
    for peer in (0..me.shared.world).filter(|&p| p != me.rank) {
        let mut dev: sys::CUdevice = 0;
        let mut can = 0;
        // SAFETY: writes one device handle and one flag.
        unsafe {
            drv(
                sys::cuDeviceGet(&mut dev, peer as i32),
                "reading a peer GPU",
            )?;
            drv(
                sys::cuDeviceCanAccessPeer(&mut can, dev, mine),
                "asking whether a peer GPU can reach this one",
            )?;
        }
        if can != 0 {
            descs.push(sys::CUmemAccessDesc {
                location: sys::CUmemLocation {
                    type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                    id: peer as i32,
                },
                flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            });
        }
    }
    if descs.is_empty() {
        return Ok(());
    }
    // SAFETY: `descs` holds `descs.len()` valid descriptors of this device's live pool.
    drv(
        unsafe { sys::cuMemPoolSetAccess(pool, descs.as_ptr(), descs.len()) },
        "giving the peer GPUs access to this GPU's memory pool",
    )
}

/// The communicator of `me`, and a first copy between every pair of ranks.
fn connect(me: &Rank, id: nccl::UniqueId) -> Result<()> {
    let (shared, rank, world) = (&me.shared, me.rank, me.shared.world);
    grant_peer_access(me)?;
    // NCCL's buffers come from outside the memory pool, which may hold freed tensor memory of
    // earlier work in this process: hand back what is unused (before the rendezvous, like every
    // step that can fail outside NCCL).
    me.gpu.trim_pool()?;
    // The pair-checking exchange's buffers, made before the rendezvous: from there to the end of
    // the set-up nothing but NCCL should be able to fail.
    let one = Tensor::zeros(&me.gpu, &[world], DType::F32)?;
    let got = Tensor::empty(&me.gpu, &[world], DType::F32)?;
    let views: Vec<(Tensor, Tensor)> = (0..world)
        .map(|p| Ok((one.narrow(p, 1)?, got.narrow(p, 1)?)))
        .collect::<Result<_>>()?;
    // Blocking set-up waits for every rank inside NCCL: start it only once every rank is here (a
    // rank that failed or timed out before leaves the rendezvous, and the others see it, polled).
    let start = Instant::now();
    shared
        .gate
        .pass(world, || {
            if let Some(e) = me.peer_failed() {
                return Some(e.to_string());
            }
            (start.elapsed() > me.settings.timeout).then(|| {
                format!(
                    "set-up: timed out after {:.1} s waiting for the other ranks to start",
                    me.settings.timeout.as_secs_f64()
                )
            })
        })
        .map_err(|why| me.error(why))?;
    let mut comm: NcclComm = std::ptr::null_mut();
    let mut config = nccl::Config::blocking();
    // SAFETY: the device is current on this thread; NCCL writes the handle.
    let r = unsafe {
        (me.nccl.comm_init_rank_config)(&mut comm, world as i32, id, rank as i32, &mut config)
    };
    shared.comms[rank]
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .comm = comm;
    if comm.is_null() {
        return Err(me.error(format!(
            "ncclCommInitRankConfig: {}",
            me.nccl.describe(r, std::ptr::null_mut())
        )));
    }
    me.settle("ncclCommInitRankConfig", r)?;
    if world > 1 {
        // Every pair copies once now, while every rank is here: a GPU pair whose copies fail
        // fails the set-up, not the user's first exchange.
        let sends: Vec<(&Tensor, usize)> = (0..world)
            .filter(|&p| p != rank)
            .map(|p| (&views[p].0, p))
            .collect();
        let recvs: Vec<(&Tensor, usize)> = (0..world)
            .filter(|&p| p != rank)
            .map(|p| (&views[p].1, p))
            .collect();
        me.exchange_start(&sends, &recvs)?.finish()?;
        me.synchronize()?;
    }
    Ok(())
}
