//! Tensor-core matrix multiply `C = op(A) op(B)`: f16/bf16 in, f32 accumulation, C in the input type,
//! batched over grid z, either operand transposed, any M, N, K. Tile sizes: [`crate::params::matmul_tc`].
//!
//! One block per `BM x BN` tile of C (grid x, in `tile_coords` order for L2 reuse); in the default
//! configuration eight warps of 64 x 64 each (2 along M, 4 along N); a warp holds 4 x 8
//! `mma.m16n8k16` accumulators (128 f32 a thread).
//! - Main loop: `STAGES` shared-memory stages of a `BK`-deep slice of A and B, filled by 16-byte
//!   `cp.async` copies in commit groups (rows or chunks past the matrix are zero-filled through
//!   `src_size = 0`, so the tails of M, N and K need no other handling). Shared tiles keep the
//!   layout of global memory (a `[m][k]` or `[k][m]` tile for A, `[k][n]` or `[n][k]` for B), rows
//!   swizzled with [`Xor8`]; the fragments come from `ldmatrix.x4`, with `.trans` where the stored
//!   orientation is the transpose of the fragment's (A stored `K x M`, B stored `K x N`).
//! - An operand whose rows are not 16-byte aligned (leading dim not a multiple of 8, or an odd base)
//!   cannot use `cp.async`; the host marks it [`RowAccess::Elements`] and the same loader fills the
//!   same chunks element by element (bounds-checked per element) with ordinary loads. The branch is
//!   uniform across the block.
//! - Epilogue: accumulators rounded to `T`, staged through the (then idle) pipeline memory as a
//!   `BM x BN` swizzled tile, written to C in 16-byte chunks (or element by element when C's rows are
//!   not 16-byte aligned), rows and columns past C skipped.
//!
//! Every C element is one thread's fixed sequence of `mma` over k: the same bits on every run.
//!
//! The kernel is generic over a [`Config`] (tile, stages, warps, fragment pipelining); the
//! `matmul_tc_*` entry points use [`matmul_tc::DEFAULT`]. Every configuration computes each C element
//! with the same k order (k ascending, 16 at a time), so a re-tune changes no bits.
//!
//! The pipeline per k-tile `kt` (one barrier per tile):
//! ```text
//! wait until tile kt has landed (at most STAGES - 2 newer groups pending), barrier
//!     (the barrier also means every warp is done with tile kt - 1's stage)
//! load tile kt + STAGES - 1 into that stage, commit
//! mma over tile kt
//! ```
//! With `frag_pipe` the fragments of k16 step `s + 1` are loaded before the `mma` of step `s`, and
//! the wait and barrier for tile kt + 1 come before the last step of tile kt (whose fragments are
//! already in registers), so the first fragments of tile kt + 1 load while its `mma` run:
//! ```text
//! prologue: wait for tile 0, barrier, fragments of (tile 0, step 0)
//! per tile kt, per step s:
//!     s == last: wait until tile kt + 1 has landed, barrier (every warp is done reading tile kt)
//!     s < last: a third of the copies of tile kt + STAGES - 1 into the stage tile kt - 1 used
//!         (s == last - 1: commit)
//!     fragments of the next step (s + 1, or step 0 of tile kt + 1) into the other register set
//!     mma of step s
//! ```
//! The pipelined loop runs when both operands take `cp.async` (16-byte rows); otherwise the plain
//! loop above does (the element-wise copies would add registers to a loop that has none to spare).
use crate::dev::copy::{cp_async_commit, cp_async_wait};
use crate::dev::elem::{BF16, F16};
use crate::dev::mem::{Chunk16, Slice, SliceMut, load_u16_ro, store_chunk, store_u16};
use crate::dev::mma::{FragA, FragB, FragC, MmaElem};
use crate::dev::shared::check_index;
use crate::dev::sync::sync_threads;
use crate::dev::thread::{block_idx_x, block_idx_z, lane_id, thread_idx_x, warp_id};
use crate::dev::tile::{SharedCarve, SharedTile};
use crate::layout::Xor8;
use crate::params::matmul_tc::{self, Config, tile_coords};
use crate::params::{MatmulTc, RowAccess};
use crate::{unroll, unroll_lt};
use core::marker::PhantomData;

/// A shared tile of 16-bit elements with swizzled rows.
type Tile<T, const R: usize, const C: usize> = SharedTile<T, R, C, Xor8>;

/// A kernel configuration as a type (the kernel's generic parameter).
pub trait TcConfig {
    const C: Config;
}

/// Shared tile shapes: A is `[BM][BK]`, or `[BK][BM]` when stored transposed (`K x M`); B is
/// `[BK][BN]`, or `[BN][BK]` when stored transposed (`N x K`). Tiles keep the global orientation.
pub const fn a_tile(c: Config, transposed: bool) -> (usize, usize) {
    if transposed {
        (c.bk as usize, c.bm as usize)
    } else {
        (c.bm as usize, c.bk as usize)
    }
}
pub const fn b_tile(c: Config, transposed: bool) -> (usize, usize) {
    if transposed {
        (c.bn as usize, c.bk as usize)
    } else {
        (c.bk as usize, c.bn as usize)
    }
}
/// 16 x 16 A blocks (M) and 8-column B tiles (N) of a warp tile.
pub const fn mt(c: Config) -> usize {
    (c.wm() / 16) as usize
}
pub const fn nt(c: Config) -> usize {
    (c.wn() / 8) as usize
}

/// `cp.async.wait_group` for a run-time count that is a constant after monomorphisation (the
/// pipeline depth minus 2): at most `n` of this thread's newest groups pending.
#[inline(always)]
fn cp_async_wait_n(n: u32) {
    match n {
        0 => cp_async_wait::<0>(),
        1 => cp_async_wait::<1>(),
        2 => cp_async_wait::<2>(),
        _ => cp_async_wait::<3>(),
    }
}

/// The kernel for one configuration and storage combination: `A_T` = A stored `K x M`, `B_T` = B
/// stored `N x K`; `AR x AC` and `BR x BC` are the shared tile shapes ([`a_tile`], [`b_tile`]), `MT`
/// and `NT` the warp tile's blocks ([`mt`], [`nt`]), `SM x SN` the staging tile (`bm x bn`).
#[inline(always)]
unsafe fn matmul_tc<
    T: MmaElem,
    K: TcConfig,
    const A_T: bool,
    const B_T: bool,
    const AR: usize,
    const AC: usize,
    const BR: usize,
    const BC: usize,
    const MT: usize,
    const NT: usize,
    const SM: usize,
    const SN: usize,
>(
    a: Slice<T>,
    b: Slice<T>,
    c: SliceMut<T>,
    p: MatmulTc,
) {
    let cf = K::C;
    const {
        assert!(K::C.valid());
        assert!(a_tile(K::C, A_T).0 == AR && a_tile(K::C, A_T).1 == AC);
        assert!(b_tile(K::C, B_T).0 == BR && b_tile(K::C, B_T).1 == BC);
        assert!(mt(K::C) == MT && nt(K::C) == NT);
        assert!(K::C.bm as usize == SM && K::C.bn as usize == SN);
        assert!(
            K::C.stages as usize * (Tile::<T, AR, AC>::BYTES + Tile::<T, BR, BC>::BYTES)
                <= K::C.smem_bytes() as usize
        );
        assert!(Tile::<T, SM, SN>::BYTES <= K::C.smem_bytes() as usize);
    };
    let (bm, bn, bk, stages) = (cf.bm, cf.bn, cf.bk, cf.stages);
    let (tiles_m, tiles_n) = (p.m.div_ceil(bm), p.n.div_ceil(bn));
    let (tm, tn) = tile_coords(block_idx_x(), tiles_m, tiles_n);
    let (m0, n0) = (tm * bm, tn * bn);
    let z = block_idx_z() as u64;
    // Batch bases (pointer arithmetic only; every dereference is bounds-predicated below).
    let a_src = (a.ptr as *const u16).wrapping_add((z * p.stride_a) as usize);
    let b_src = (b.ptr as *const u16).wrapping_add((z * p.stride_b) as usize);

    let mut smem = SharedCarve::dynamic();
    let a_tiles: Tile<T, AR, AC> = smem.take(stages);
    let b_tiles: Tile<T, BR, BC> = smem.take(stages);
    check_index(smem.used(), cf.smem_bytes() as usize + 1);

    let ops = Operands::<T, K, AR, AC, BR, BC> {
        a_tiles,
        b_tiles,
        a_src,
        b_src,
        m0,
        n0,
        _cfg: PhantomData,
    };
    let ktiles = p.k.div_ceil(bk);
    unroll_lt!(s < K::C.stages as usize - 1, {
        if (s as u32) < ktiles {
            ops.load::<A_T, B_T>(&p, s as u32, s as u32);
        }
        cp_async_commit();
    });

    let w = warp_id();
    let (wm0, wn0) = ((w / cf.warps_n) * cf.wm(), (w % cf.warps_n) * cf.wn());
    let mut acc = [[[0.0f32; 4]; NT]; MT];
    // The pipelined loop only for 16-byte rows (module doc).
    let chunks = p.a_access == RowAccess::Chunks16 && p.b_access == RowAccess::Chunks16;
    if cf.frag_pipe && chunks {
        mainloop_pipelined::<T, K, A_T, B_T, AR, AC, BR, BC, MT, NT>(
            &mut acc, &ops, &p, ktiles, wm0, wn0,
        );
    } else {
        let (mut read, mut write) = (0u32, stages - 1);
        let mut kt = 0;
        while kt < ktiles {
            cp_async_wait_n(stages - 2);
            sync_threads();
            if kt + stages - 1 < ktiles {
                ops.load::<A_T, B_T>(&p, kt + stages - 1, write);
            }
            cp_async_commit();
            unroll_lt!(ks < (K::C.bk / 16) as usize, {
                let (af, bf) = load_frags::<T, A_T, B_T, AR, AC, BR, BC, MT, NT>(
                    a_tiles.stage(read),
                    b_tiles.stage(read),
                    wm0,
                    wn0,
                    16 * ks as u32,
                );
                mma_step::<T, MT, NT>(&mut acc, &af, &bf);
            });
            read = if read + 1 == stages { 0 } else { read + 1 };
            write = if write + 1 == stages { 0 } else { write + 1 };
            kt += 1;
        }
    }

    // Only empty groups can be pending; the barrier means every warp is done reading the stages.
    cp_async_wait::<0>();
    sync_threads();
    let staging: Tile<T, SM, SN> = SharedTile::at_dynamic::<0>();
    store_c::<T, K, MT, NT, SM, SN>(&acc, staging, wm0, wn0, c, &p, m0, n0, z);
}

/// The k loop with register double-buffered fragments (module doc, `frag_pipe`). Entered after the
/// prologue committed tiles `0..STAGES - 1`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn mainloop_pipelined<
    T: MmaElem,
    K: TcConfig,
    const A_T: bool,
    const B_T: bool,
    const AR: usize,
    const AC: usize,
    const BR: usize,
    const BC: usize,
    const MT: usize,
    const NT: usize,
>(
    acc: &mut [[FragC; NT]; MT],
    ops: &Operands<T, K, AR, AC, BR, BC>,
    p: &MatmulTc,
    ktiles: u32,
    wm0: u32,
    wn0: u32,
) {
    let stages = K::C.stages;
    const KS: usize = 4;
    const { assert!(K::C.bk as usize / 16 == KS) };
    if ktiles == 0 {
        return;
    }
    cp_async_wait_n(stages - 2);
    sync_threads();
    let (mut read, mut write) = (0u32, stages - 1);
    // Two register sets: `f0` holds the even k16 steps, `f1` the odd ones (KS is even, so step 0 of
    // the next tile goes to `f0` again).
    let mut f0 = load_frags::<T, A_T, B_T, AR, AC, BR, BC, MT, NT>(
        ops.a_tiles.stage(read),
        ops.b_tiles.stage(read),
        wm0,
        wn0,
        0,
    );
    let mut f1 = f0;
    let mut kt = 0;
    while kt < ktiles {
        let prefetch = kt + stages - 1 < ktiles;
        unroll_lt!(ks < KS, {
            if ks == KS - 1 {
                // Tile kt + 1 has landed (its group and older are complete), and after the barrier
                // every warp has loaded its last fragments of tile kt, so its stage may be refilled.
                cp_async_wait_n(stages - 2);
                sync_threads();
                read = if read + 1 == stages { 0 } else { read + 1 };
            }
            // Refill the stage tile kt - 1 used (idle since the barrier of the previous tile's last
            // step), spread over steps 0 to KS - 2 so the copies interleave with the tile's mma;
            // issued before the next fragments load, while only one register set is live.
            if ks < KS - 1 {
                if prefetch {
                    let c = RowAccess::Chunks16;
                    ops.load_part::<A_T, B_T>(
                        p,
                        kt + stages - 1,
                        write,
                        c,
                        c,
                        ks as u32,
                        KS as u32 - 1,
                    );
                }
            }
            if ks == KS - 2 {
                cp_async_commit();
                write = if write + 1 == stages { 0 } else { write + 1 };
            }
            // Fragments of the next step: step ks + 1 of this tile, or step 0 of tile kt + 1 (when
            // there is none, the stage holds stale data that is never used).
            let next_k16 = 16 * ((ks + 1) % KS) as u32;
            let next = load_frags::<T, A_T, B_T, AR, AC, BR, BC, MT, NT>(
                ops.a_tiles.stage(read),
                ops.b_tiles.stage(read),
                wm0,
                wn0,
                next_k16,
            );
            if ks % 2 == 0 {
                mma_step::<T, MT, NT>(acc, &f0.0, &f0.1);
                f1 = next;
            } else {
                mma_step::<T, MT, NT>(acc, &f1.0, &f1.1);
                f0 = next;
            }
        });
        kt += 1;
    }
}

/// This block's view of A and B: shared stages and the batch's stored matrices.
struct Operands<T, K, const AR: usize, const AC: usize, const BR: usize, const BC: usize> {
    a_tiles: Tile<T, AR, AC>,
    b_tiles: Tile<T, BR, BC>,
    a_src: *const u16,
    b_src: *const u16,
    m0: u32,
    n0: u32,
    _cfg: PhantomData<K>,
}

impl<T: MmaElem, K: TcConfig, const AR: usize, const AC: usize, const BR: usize, const BC: usize>
    Operands<T, K, AR, AC, BR, BC>
{
    /// Copies per thread of one k-tile of A and of B.
    const A_COPIES: u32 = (AR * AC / 8) as u32 / K::C.threads();
    const B_COPIES: u32 = (BR * BC / 8) as u32 / K::C.threads();

    /// Issues this thread's loads of k-tile `kt` of A and B into `stage`.
    #[inline(always)]
    fn load<const A_T: bool, const B_T: bool>(&self, p: &MatmulTc, kt: u32, stage: u32) {
        self.load_part::<A_T, B_T>(p, kt, stage, p.a_access, p.b_access, 0, 1);
    }

    /// Part `part` of `parts` of [`Self::load`] (the thread's A copies, then its B copies, split
    /// into `parts` runs of nearly equal length), with the given row-access modes (which must be
    /// the launch's, or `Chunks16` where the launch's is).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn load_part<const A_T: bool, const B_T: bool>(
        &self,
        p: &MatmulTc,
        kt: u32,
        stage: u32,
        a_access: RowAccess,
        b_access: RowAccess,
        part: u32,
        parts: u32,
    ) {
        let total = Self::A_COPIES + Self::B_COPIES;
        let (lo, hi) = (part * total / parts, (part + 1) * total / parts);
        let a_range = (lo.min(Self::A_COPIES), hi.min(Self::A_COPIES));
        let b_range = (
            lo.max(Self::A_COPIES) - Self::A_COPIES,
            hi.max(Self::A_COPIES) - Self::A_COPIES,
        );
        let k0 = kt * K::C.bk;
        let (at, bt) = (self.a_tiles.stage(stage), self.b_tiles.stage(stage));
        let (a, b) = (self.a_src, self.b_src);
        // SAFETY: the launcher validated that A and B hold (batch or 1) stored matrices with these
        // leading dims and bounds ((m, k) or (k, m) for A, (k, n) or (n, k) for B, as oriented
        // here) and chose `Chunks16` only for 16-byte granular rows; `load_tile` reads only inside
        // the bounds, and the stage is idle (pipeline order in the module doc).
        unsafe {
            if a_range.0 < a_range.1 {
                if A_T {
                    load_tile::<T, K, AR, AC>(
                        at, a, p.lda, k0, p.k, self.m0, p.m, a_access, a_range,
                    );
                } else {
                    load_tile::<T, K, AR, AC>(
                        at, a, p.lda, self.m0, p.m, k0, p.k, a_access, a_range,
                    );
                }
            }
            if b_range.0 < b_range.1 {
                if B_T {
                    load_tile::<T, K, BR, BC>(
                        bt, b, p.ldb, self.n0, p.n, k0, p.k, b_access, b_range,
                    );
                } else {
                    load_tile::<T, K, BR, BC>(
                        bt, b, p.ldb, k0, p.k, self.n0, p.n, b_access, b_range,
                    );
                }
            }
        }
    }
}

/// The A and B fragments of one warp for the k16 step at `k16` of a stage: `MT` A and `NT / 2` B
/// `ldmatrix.x4`.
#[inline(always)]
fn load_frags<
    T: MmaElem,
    const A_T: bool,
    const B_T: bool,
    const AR: usize,
    const AC: usize,
    const BR: usize,
    const BC: usize,
    const MT: usize,
    const NT: usize,
>(
    at: Tile<T, AR, AC>,
    bt: Tile<T, BR, BC>,
    wm0: u32,
    wn0: u32,
    k16: u32,
) -> ([FragA; MT], [FragB; NT]) {
    let mut af: [FragA; MT] = [[0; 4]; MT];
    unroll_lt!(i < MT, {
        let m = wm0 + 16 * i as u32;
        af[i] = if A_T {
            at.load_a_km(k16, m / 8)
        } else {
            at.load_a(m, k16 / 8)
        };
    });
    let mut bf: [FragB; NT] = [[0; 2]; NT];
    unroll_lt!(j < NT / 2, {
        let n = wn0 + 16 * j as u32;
        let [b0, b1] = if B_T {
            bt.load_b_pair_nk(n, k16 / 8)
        } else {
            bt.load_b_pair_kn(k16, n / 8)
        };
        bf[2 * j] = b0;
        bf[2 * j + 1] = b1;
    });
    (af, bf)
}

/// `acc += A B` for one k16 step: `MT x NT` `mma`, serpentine over n (consecutive `mma` share an
/// operand).
#[inline(always)]
fn mma_step<T: MmaElem, const MT: usize, const NT: usize>(
    acc: &mut [[FragC; NT]; MT],
    af: &[FragA; MT],
    bf: &[FragB; NT],
) {
    unroll_lt!(i < MT, {
        unroll_lt!(jj < NT, {
            let j = if i % 2 == 0 { jj } else { NT - 1 - jj };
            T::mma(&mut acc[i][j], &af[i], bf[j]);
        });
    });
}

/// Issues this thread's share of one `R x C` tile: tile element (r, e) is element
/// (row0 + r, col0 + e) of the stored `rows x cols` matrix at `src` (leading dim `ld`); elements
/// outside it are zero. `Chunks16`: one `cp.async` per 16-byte chunk (needs `cols`, `ld`, `col0` and
/// the base 16-byte granular); `Elements`: per-element loads into registers, then one shared store.
///
/// # Safety
/// Every in-bounds element `(row, col)` (row < rows, col < cols) at `src + row * ld + col` is
/// readable and not written during the kernel; with `Chunks16`, `src` is 16-byte aligned, `ld` and
/// `cols` are multiples of 8. The tile stage is idle. The block size of `K` divides the tile's
/// chunks and is a multiple of its chunks per row (checked at compile time). Only the thread's
/// copies `lo..hi` (of `R * C / 8 / threads`, in order) are issued: a caller may spread one tile's
/// copies over several calls.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn load_tile<T: MmaElem, K: TcConfig, const R: usize, const C: usize>(
    tile: Tile<T, R, C>,
    src: *const u16,
    ld: u64,
    row0: u32,
    rows: u32,
    col0: u32,
    cols: u32,
    access: RowAccess,
    (lo, hi): (u32, u32),
) {
    const {
        assert!(
            (R * C / 8) % K::C.threads() as usize == 0 && K::C.threads() as usize % (C / 8) == 0
        )
    };
    let threads = K::C.threads();
    let cpr = (C / 8) as u32;
    let (tid, row_step) = (thread_idx_x(), threads / cpr);
    let (r_first, chunk) = (tid / cpr, tid % cpr);
    let col = col0 + 8 * chunk;
    let col_in = col < cols;
    if access == RowAccess::Chunks16 {
        // One 64-bit multiply per tile: the thread's copies are `row_step` stored rows apart.
        let first = src.wrapping_add(((row0 + r_first) as u64 * ld + col as u64) as usize);
        let step = row_step as u64 * ld;
        unroll_lt!(i < R * C / 8 / K::C.threads() as usize, {
            if lo <= i as u32 && (i as u32) < hi {
                let r = r_first + i as u32 * row_step;
                let fill = col_in && row0 + r < rows;
                let at = first.wrapping_add((i as u64 * step) as usize);
                // SAFETY: when `fill`, the 8 elements at `at` are inside the matrix (cols % 8 == 0)
                // and 16-byte aligned (caller's contract); otherwise nothing is read.
                unsafe { tile.copy_chunk_async(r, chunk, at as *const u8, fill) };
            }
        });
    } else {
        unroll_lt!(i < R * C / 8 / K::C.threads() as usize, {
            let r = r_first + i as u32 * row_step;
            let row = row0 + r;
            let mut words = [0u32; 4];
            if lo <= i as u32 && (i as u32) < hi && col_in && row < rows {
                let at = row as u64 * ld + col as u64;
                unroll!(e in [0, 1, 2, 3, 4, 5, 6, 7] {
                    if col + (e as u32) < cols {
                        // SAFETY: (row, col + e) is inside the matrix (checked just above).
                        let v = unsafe { load_u16_ro(src, at + e as u64) } as u32;
                        words[e / 2] |= v << (16 * (e % 2));
                    }
                });
            }
            if lo <= i as u32 && (i as u32) < hi {
                tile.store_chunk(r, chunk, words);
            }
        });
    }
}

/// Rounds the accumulators to `T`, stages them in shared memory and writes this block's tile of C.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn store_c<
    T: MmaElem,
    K: TcConfig,
    const MT: usize,
    const NT: usize,
    const SM: usize,
    const SN: usize,
>(
    acc: &[[FragC; NT]; MT],
    staging: Tile<T, SM, SN>,
    wm0: u32,
    wn0: u32,
    c: SliceMut<T>,
    p: &MatmulTc,
    m0: u32,
    n0: u32,
    z: u64,
) {
    let (g, t) = (lane_id() / 4, lane_id() % 4);
    unroll_lt!(i < MT, {
        unroll_lt!(j < NT, {
            let (row, col) = (wm0 + 16 * i as u32 + g, wn0 + 8 * j as u32 + 2 * t);
            let f = &acc[i][j];
            staging.store_word(row, col, T::pack2(f[0], f[1]));
            staging.store_word(row + 8, col, T::pack2(f[2], f[3]));
        });
    });
    sync_threads();
    let threads = K::C.threads();
    let cpr = K::C.bn / 8;
    let c_base = z * p.stride_c;
    let c_ptr = c.ptr as *mut u16;
    unroll_lt!(i < (K::C.bm * K::C.bn / 8 / K::C.threads()) as usize, {
        let ch = thread_idx_x() + i as u32 * threads;
        let (r, chunk) = (ch / cpr, ch % cpr);
        let (row, col) = (m0 + r, n0 + 8 * chunk);
        if row < p.m && col < p.n {
            let words = staging.load_chunk(r, chunk);
            let at = c_base + row as u64 * p.ldc + col as u64;
            if p.c_access == RowAccess::Chunks16 {
                check_index((at + 7) as usize, c.len as usize);
                // SAFETY: the launcher validated C's size, 16-byte aligned base and a leading dim
                // and batch stride that are multiples of 8, so the chunk is aligned and in C
                // (n % 8 == 0 puts all 8 columns inside); each chunk has one writer.
                unsafe { store_chunk(c_ptr as *mut Chunk16, at / 8, Chunk16(words)) };
            } else {
                unroll!(e in [0, 1, 2, 3, 4, 5, 6, 7] {
                    if col + (e as u32) < p.n {
                        check_index((at + e as u64) as usize, c.len as usize);
                        // SAFETY: (row, col + e) is inside C (checked above, launcher-validated
                        // size); each element has one writer.
                        unsafe {
                            store_u16(c_ptr, at + e as u64, (words[e / 2] >> (16 * (e % 2))) as u16)
                        };
                    }
                });
            }
        }
    });
}

macro_rules! tc_entry_points {
    ($cfg:ty: $($name:ident: $t:ty, $a_t:literal, $b_t:literal;)*) => {$(
        // One 256-thread block per SM, so ptxas may use up to 255 registers for the 128 accumulators
        // and the fragments of a 64 x 64 warp tile.
        crate::launch_bounds!($name, <$cfg as TcConfig>::C.threads(), <$cfg as TcConfig>::C.min_blocks);
        /// `C = op(A) op(B)` on tensor cores for one storage combination (see the module doc);
        /// grid (tiles, 1, batch), `threads()` threads, `smem_bytes()` of dynamic shared memory of
        /// this entry's configuration.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(a: Slice<$t>, b: Slice<$t>, c: SliceMut<$t>, p: MatmulTc) {
            const C: Config = <$cfg as TcConfig>::C;
            unsafe {
                matmul_tc::<
                    $t, $cfg, $a_t, $b_t,
                    { a_tile(C, $a_t).0 }, { a_tile(C, $a_t).1 },
                    { b_tile(C, $b_t).0 }, { b_tile(C, $b_t).1 },
                    { mt(C) }, { nt(C) }, { C.bm as usize }, { C.bn as usize },
                >(a, b, c, p)
            }
        }
    )*};
}

/// The entry points of one configuration: `$prefix_{nn,nt,tn,tt}_{f16,bf16}`.
macro_rules! tc_config {
    ($cfg:ident = $value:expr; $nn:ident $nt:ident $tn:ident $tt:ident $nnb:ident $ntb:ident $tnb:ident $ttb:ident) => {
        struct $cfg;
        impl TcConfig for $cfg {
            const C: Config = $value;
        }
        tc_entry_points! { $cfg:
            $nn: F16, false, false;
            $nt: F16, false, true;
            $tn: F16, true, false;
            $tt: F16, true, true;
            $nnb: BF16, false, false;
            $ntb: BF16, false, true;
            $tnb: BF16, true, false;
            $ttb: BF16, true, true;
        }
    };
}

tc_config! { Default = matmul_tc::DEFAULT;
matmul_tc_nn_f16 matmul_tc_nt_f16 matmul_tc_tn_f16 matmul_tc_tt_f16
matmul_tc_nn_bf16 matmul_tc_nt_bf16 matmul_tc_tn_bf16 matmul_tc_tt_bf16 }
