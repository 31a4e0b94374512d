//! Shared-memory transaction barriers (`mbarrier`, sm_90 forms) and the producer/consumer
//! [`Pipeline`] built on them: the synchronisation under the Tensor Memory Accelerator copies of
//! [`crate::dev::tma`]. Compiled only into the sm_90 PTX (`#[cfg(target_feature = "sm_90a")]` on the
//! module).
//!
//! # The hardware model (PTX ISA, "Parallel Synchronization and Communication Instructions: mbarrier")
//! An mbarrier is an 8-byte object in shared memory with a *phase*, a *pending arrival count* and a
//! *transaction count*. The current phase completes when both the pending arrivals and the pending
//! transaction bytes reach zero; the barrier then starts the next phase with the arrival count it was
//! initialised with. Phases alternate parity 0, 1, 0, ...:
//! - `mbarrier.arrive.expect_tx` adds bytes to the transaction count, then arrives;
//! - a TMA copy naming the barrier (`mbarrier::complete_tx::bytes`) subtracts the bytes it wrote
//!   when they have landed in shared memory;
//! - `mbarrier.try_wait.parity P` returns true once the phase of parity `P` has completed, so a
//!   thread that tracks the phase parity it waits for never confuses two phases (a phase can never
//!   run two ahead of a waiter that is needed to complete it). A barrier fresh from `init` is in
//!   phase 0; waiting on parity 1 then returns at once (the phase "before" it counts as complete),
//!   which is how the producer's first pass over the empty stages goes through.
//! - The completing phase has release/acquire semantics at CTA scope: data written by the copies (or
//!   by threads before their arrive) is visible to the threads whose wait returned.
use crate::dev::shared::check_index;
use crate::dev::wgmma::{Accumulator, SwizzledTile, commit, fence};

/// One mbarrier, by its shared-window address (8-byte aligned).
#[derive(Clone, Copy)]
pub struct MBarrier {
    addr: u32,
}

impl MBarrier {
    /// The barrier at shared-window address `addr` (a multiple of 8, checked in checked builds).
    #[inline(always)]
    pub fn at(addr: u32) -> Self {
        check_index((addr % 8) as usize, 1);
        Self { addr }
    }

    /// The shared-window address (the operand of a TMA copy's `mbarrier::complete_tx`).
    #[inline(always)]
    pub fn addr(self) -> u32 {
        self.addr
    }

    /// `mbarrier.init`: phase 0 with `arrivals` pending arrivals and no transaction bytes.
    ///
    /// # Safety
    /// One thread initialises each barrier, before any other use, and [`fence_init`] plus a block
    /// barrier separate the init from every other thread's use.
    #[inline(always)]
    pub unsafe fn init(self, arrivals: u32) {
        // SAFETY: the caller's: an 8-byte aligned barrier in this CTA's shared memory.
        unsafe {
            core::arch::asm!(
                "mbarrier.init.shared::cta.b64 [{a}], {n};",
                a = in(reg32) self.addr, n = in(reg32) arrivals,
                options(nostack)
            )
        }
    }

    /// `mbarrier.arrive.expect_tx`: adds `bytes` to the current phase's transaction count, then
    /// arrives once.
    ///
    /// # Safety
    /// The barrier is initialised; the bytes are those of copies that name this barrier and are
    /// issued for this phase.
    #[inline(always)]
    pub unsafe fn arrive_expect_tx(self, bytes: u32) {
        // SAFETY: the caller's.
        unsafe {
            core::arch::asm!(
                "mbarrier.arrive.expect_tx.shared::cta.b64 _, [{a}], {b};",
                a = in(reg32) self.addr, b = in(reg32) bytes,
                options(nostack)
            )
        }
    }

    /// `mbarrier.arrive`: one arrival (release semantics: this thread's earlier accesses happen
    /// before the phase completes).
    ///
    /// # Safety
    /// The barrier is initialised and expects this arrival in its current phase.
    #[inline(always)]
    pub unsafe fn arrive(self) {
        // SAFETY: the caller's.
        unsafe {
            core::arch::asm!(
                "mbarrier.arrive.shared::cta.b64 _, [{a}];",
                a = in(reg32) self.addr,
                options(nostack)
            )
        }
    }

    /// Whether the phase of parity `parity` (0 or 1) has completed (`mbarrier.try_wait.parity`,
    /// which may suspend the thread for a while in hardware before answering no). Acquire semantics
    /// when it answers yes.
    #[inline(always)]
    pub fn try_wait(self, parity: u32) -> bool {
        let done: u32;
        // SAFETY: reads the barrier's state. Not `nomem`: accesses after it stay after it.
        unsafe {
            core::arch::asm!(
                "{{",
                ".reg .pred p;",
                "mbarrier.try_wait.parity.shared::cta.b64 p, [{a}], {p};",
                "selp.u32 {d}, 1, 0, p;",
                "}}",
                a = in(reg32) self.addr, p = in(reg32) parity, d = out(reg32) done,
                options(nostack)
            )
        }
        done != 0
    }

    /// Blocks until the phase of parity `parity` has completed ([`MBarrier::try_wait`] in a loop).
    #[inline(always)]
    pub fn wait(self, parity: u32) {
        while !self.try_wait(parity) {}
    }
}

/// `fence.mbarrier_init.release.cluster`: makes this thread's `mbarrier.init`s visible before a
/// following barrier, to the other threads and to the copy engine.
#[inline(always)]
pub fn fence_init() {
    // SAFETY: a fence.
    unsafe { core::arch::asm!("fence.mbarrier_init.release.cluster;", options(nostack)) }
}

/// The shared-memory tiles of one pipeline stage: what a stage holds and how many bytes its copies
/// bring (the transaction count its `full` barrier waits for). Implemented for one tile and for
/// pairs of stage tiles, nested as deep as needed (GEMM: A and B; the f32 GEMM: A and B's two tf32
/// parts); all are 128-byte-swizzled [`SwizzledTile`]s, whose sizes are whole 1024-byte swizzle
/// atoms, so consecutive tiles and stages stay 1024-byte aligned.
pub trait StageTiles: Copy {
    /// Bytes of one stage (a multiple of 1024).
    const BYTES: usize;
    /// The stage at shared-window address `base` (1024-byte aligned).
    fn at(base: u32) -> Self;
}

impl<const R: usize, const C: usize> StageTiles for SwizzledTile<R, C> {
    const BYTES: usize = SwizzledTile::<R, C>::BYTES;
    #[inline(always)]
    fn at(base: u32) -> Self {
        SwizzledTile::at(base)
    }
}

impl<A: StageTiles, B: StageTiles> StageTiles for (A, B) {
    const BYTES: usize = A::BYTES + B::BYTES;
    #[inline(always)]
    fn at(base: u32) -> Self {
        (A::at(base), B::at(base + A::BYTES as u32))
    }
}

/// Where a pipeline participant is: stage index and the parity of that stage's current use.
/// Producer and consumers each keep their own, start at [`PipeState::START`] and advance once per
/// stage they fill or drain, in the same order.
#[derive(Clone, Copy)]
pub struct PipeState<const STAGES: usize> {
    /// The stage filled or drained next.
    pub stage: u32,
    /// How many times the ring has wrapped, mod 2: the parity of the `full` phase to wait for.
    pub phase: u32,
}

impl<const STAGES: usize> PipeState<STAGES> {
    pub const START: Self = Self { stage: 0, phase: 0 };

    /// The next stage (wrapping, which flips the phase).
    #[inline(always)]
    pub fn next(self) -> Self {
        if self.stage + 1 == STAGES as u32 {
            Self {
                stage: 0,
                phase: self.phase ^ 1,
            }
        } else {
            Self {
                stage: self.stage + 1,
                phase: self.phase,
            }
        }
    }
}

/// A `STAGES`-deep ring of shared-memory stages of `S` filled by one producer thread with TMA copies
/// and drained by `consumers` arrivals (one elected thread per consumer warpgroup): per stage a `full`
/// barrier (1 arrival + the stage's bytes) and an `empty` barrier (`consumers` arrivals).
///
/// Shared-memory layout from its 1024-aligned base: the stages (`STAGES * S::BYTES`), then the
/// `full` barriers, then the `empty` barriers ([`Pipeline::BYTES`] in all). The transaction bytes the
/// producer announces are `S::BYTES`, the type's own size, so the count can never disagree with the
/// tiles it waits for.
#[derive(Clone, Copy)]
pub struct Pipeline<S: StageTiles, const STAGES: usize> {
    base: u32,
    _stage: core::marker::PhantomData<S>,
}

impl<S: StageTiles, const STAGES: usize> Pipeline<S, STAGES> {
    const VALID: () = assert!(STAGES >= 2 && STAGES <= 8 && S::BYTES % 1024 == 0);
    /// Shared-memory bytes of the ring and its barriers.
    pub const BYTES: usize = STAGES * S::BYTES + 16 * STAGES;

    /// The ring at shared-window address `base` (1024-byte aligned, `BYTES` reserved).
    #[inline(always)]
    pub fn at(base: u32) -> Self {
        let () = Self::VALID;
        check_index((base % 1024) as usize, 1);
        Self {
            base,
            _stage: core::marker::PhantomData,
        }
    }

    /// The tiles of stage `stage`.
    #[inline(always)]
    pub fn stage(self, stage: u32) -> S {
        check_index(stage as usize, STAGES);
        S::at(self.base + stage * S::BYTES as u32)
    }

    #[inline(always)]
    fn full(self, stage: u32) -> MBarrier {
        MBarrier::at(self.base + (STAGES * S::BYTES) as u32 + 8 * stage)
    }

    #[inline(always)]
    fn empty(self, stage: u32) -> MBarrier {
        MBarrier::at(self.base + (STAGES * S::BYTES + 8 * STAGES) as u32 + 8 * stage)
    }

    /// Initialises every barrier (`full`: 1 arrival; `empty`: `consumers` arrivals) and fences the
    /// inits.
    ///
    /// # Safety
    /// One thread calls it before any other use of the ring; a block barrier follows before any other
    /// thread uses it.
    #[inline(always)]
    pub unsafe fn init(self, consumers: u32) {
        for s in 0..STAGES as u32 {
            // SAFETY: the caller's (one initialising thread, barrier after).
            unsafe {
                self.full(s).init(1);
                self.empty(s).init(consumers);
            }
        }
        fence_init();
    }

    /// Producer: waits until the consumers have released stage `at.stage` (the previous use of it;
    /// the first pass goes through at once), announces the stage's bytes on its `full` barrier and
    /// returns the tiles to fill and the barrier the copies complete on.
    ///
    /// # Safety
    /// Called by the one producer thread, with its own [`PipeState`]; the copies it then issues fill
    /// exactly `S::BYTES` (every tile of the stage, once).
    #[inline(always)]
    pub unsafe fn producer_acquire(self, at: PipeState<STAGES>) -> (S, MBarrier) {
        self.empty(at.stage).wait(at.phase ^ 1);
        let full = self.full(at.stage);
        // SAFETY: the caller's: the copies that follow bring exactly these bytes.
        unsafe { full.arrive_expect_tx(S::BYTES as u32) };
        (self.stage(at.stage), full)
    }

    /// Consumer: waits until stage `at.stage` has landed and returns its tiles (every thread of the
    /// consumer waits; the copy engine's writes are visible to it after the wait).
    #[inline(always)]
    pub fn consumer_wait(self, at: PipeState<STAGES>) -> S {
        self.full(at.stage).wait(at.phase);
        self.stage(at.stage)
    }

    /// Consumer: hands stage `at.stage` back to the producer.
    ///
    /// # Safety
    /// Called by one thread per consumer (the ring counts `consumers` arrivals), after every read of
    /// the stage by that consumer has completed (for wgmma: a `wait_group` covering them).
    #[inline(always)]
    pub unsafe fn consumer_release(self, at: PipeState<STAGES>) {
        // SAFETY: the caller's.
        unsafe { self.empty(at.stage).arrive() }
    }

    /// Consumer warpgroup: `k_tiles` stages from `at` with one wgmma group in flight. Per k-tile:
    /// wait for the stage, fence, `products(acc, stage)` (the stage's wgmma into `acc`), commit,
    /// wait until at most that group is pending, release the previous k-tile's stage (the group
    /// that read it has retired). At the end it retires the last group, releases its stage and
    /// returns the state after the walk.
    ///
    /// # Safety
    /// Every thread of one consumer warpgroup calls it, `elected` true on exactly one of them (it
    /// releases the stages); `products` reads the stage only through the wgmma it issues.
    #[inline(always)]
    pub unsafe fn consume_one_group_behind<A: Accumulator>(
        self,
        at: PipeState<STAGES>,
        k_tiles: u32,
        elected: bool,
        acc: &mut A,
        mut products: impl FnMut(&mut A, S),
    ) -> PipeState<STAGES> {
        let (mut at, mut prev, mut kt) = (at, at, 0);
        while kt < k_tiles {
            let stage = self.consumer_wait(at);
            fence();
            products(acc, stage);
            commit();
            acc.wait::<1>();
            if kt > 0 && elected {
                // SAFETY: one thread a consumer; the wait above retired k-tile kt - 1's wgmma.
                unsafe { self.consumer_release(prev) };
            }
            prev = at;
            at = at.next();
            kt += 1;
        }
        acc.wait::<0>();
        if k_tiles > 0 && elected {
            // SAFETY: as above; every wgmma of the walk has retired.
            unsafe { self.consumer_release(prev) };
        }
        at
    }
}
