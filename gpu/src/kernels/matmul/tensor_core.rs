//! Tensor-core matrix multiply `C = op(A) op(B)`: f16/bf16 in, f32 accumulation, C in the input type,
//! batched over grid z, either operand transposed, any M, N, K. Tile sizes: [`crate::params::matmul_tc`].
//!
//! One block per `BM x BN` tile of C (grid x, in `tile_coords` order for L2 reuse), eight warps of
//! 64 x 64 each (2 along M, 4 along N); a warp holds 4 x 8 `mma.m16n8k16` accumulators (128 f32 a
//! thread).
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
//! The pipeline per k-tile `kt` (one barrier per tile):
//! ```text
//! wait until tile kt has landed (at most STAGES - 2 newer groups pending), barrier
//!     (the barrier also means every warp is done with tile kt - 1's stage)
//! load tile kt + STAGES - 1 into that stage, commit
//! mma over tile kt
//! ```
use crate::dev::copy::{cp_async_commit, cp_async_wait};
use crate::dev::elem::{BF16, F16};
use crate::dev::mem::{Chunk16, Slice, SliceMut, load_u16_ro, store_chunk, store_u16};
use crate::dev::mma::{FragA, FragB, FragC, MmaElem};
use crate::dev::shared::check_index;
use crate::dev::sync::sync_threads;
use crate::dev::thread::{block_idx_x, block_idx_z, lane_id, thread_idx_x, warp_id};
use crate::dev::tile::{SharedCarve, SharedTile};
use crate::layout::Xor8;
use crate::params::matmul_tc::{
    BK, BM, BN, SMEM_BYTES, STAGES, THREADS, WARPS_N, WM, WN, tile_coords,
};
use crate::params::{MatmulTc, RowAccess};
use crate::{unroll, unroll_lt};

/// A shared tile of 16-bit elements with swizzled rows.
type Tile<T, const R: usize, const C: usize> = SharedTile<T, R, C, Xor8>;

/// 16 x 16 A blocks (M) and 8-column B tiles (N) of a warp tile; k16 steps per k-tile.
const MT: usize = (WM / 16) as usize;
const NT: usize = (WN / 8) as usize;
const KS: usize = (BK / 16) as usize;

/// Shared tile shapes: A is `[BM][BK]`, or `[BK][BM]` when stored transposed (`K x M`); B is
/// `[BK][BN]`, or `[BN][BK]` when stored transposed (`N x K`). Tiles keep the global orientation.
pub const fn a_tile(transposed: bool) -> (usize, usize) {
    if transposed {
        (BK as usize, BM as usize)
    } else {
        (BM as usize, BK as usize)
    }
}
pub const fn b_tile(transposed: bool) -> (usize, usize) {
    if transposed {
        (BN as usize, BK as usize)
    } else {
        (BK as usize, BN as usize)
    }
}

/// The kernel for one storage combination: `A_T` = A stored `K x M`, `B_T` = B stored `N x K`;
/// `AR x AC` and `BR x BC` are the shared tile shapes ([`a_tile`], [`b_tile`]).
#[inline(always)]
unsafe fn matmul_tc<
    T: MmaElem,
    const A_T: bool,
    const B_T: bool,
    const AR: usize,
    const AC: usize,
    const BR: usize,
    const BC: usize,
>(
    a: Slice<T>,
    b: Slice<T>,
    c: SliceMut<T>,
    p: MatmulTc,
) {
    const {
        assert!(a_tile(A_T).0 == AR && a_tile(A_T).1 == AC);
        assert!(b_tile(B_T).0 == BR && b_tile(B_T).1 == BC);
        assert!(
            STAGES as usize * (Tile::<T, AR, AC>::BYTES + Tile::<T, BR, BC>::BYTES)
                == SMEM_BYTES as usize
        );
        assert!(Tile::<T, { BM as usize }, { BN as usize }>::BYTES <= SMEM_BYTES as usize);
        assert!(STAGES >= 2 && STAGES <= 5);
    };
    let (tiles_m, tiles_n) = (p.m.div_ceil(BM), p.n.div_ceil(BN));
    let (tm, tn) = tile_coords(block_idx_x(), tiles_m, tiles_n);
    let (m0, n0) = (tm * BM, tn * BN);
    let z = block_idx_z() as u64;
    // Batch bases (pointer arithmetic only; every dereference is bounds-predicated below).
    let a_src = (a.ptr as *const u16).wrapping_add((z * p.stride_a) as usize);
    let b_src = (b.ptr as *const u16).wrapping_add((z * p.stride_b) as usize);

    let mut smem = SharedCarve::dynamic();
    let a_tiles: Tile<T, AR, AC> = smem.take(STAGES);
    let b_tiles: Tile<T, BR, BC> = smem.take(STAGES);
    check_index(smem.used(), SMEM_BYTES as usize + 1);

    let ops = Operands {
        a_tiles,
        b_tiles,
        a_src,
        b_src,
        m0,
        n0,
    };
    let ktiles = p.k.div_ceil(BK);
    unroll_lt!(s < STAGES as usize - 1, {
        if (s as u32) < ktiles {
            ops.load::<A_T, B_T>(&p, s as u32, s as u32);
        }
        cp_async_commit();
    });

    let w = warp_id();
    let (wm0, wn0) = ((w / WARPS_N) * WM, (w % WARPS_N) * WN);
    let mut acc = [[[0.0f32; 4]; NT]; MT];
    let (mut read, mut write) = (0u32, STAGES - 1);
    let mut kt = 0;
    while kt < ktiles {
        cp_async_wait::<{ STAGES - 2 }>();
        sync_threads();
        if kt + STAGES - 1 < ktiles {
            ops.load::<A_T, B_T>(&p, kt + STAGES - 1, write);
        }
        cp_async_commit();
        mma_tile::<T, A_T, B_T, AR, AC, BR, BC>(
            &mut acc,
            a_tiles.stage(read),
            b_tiles.stage(read),
            wm0,
            wn0,
        );
        read = if read + 1 == STAGES { 0 } else { read + 1 };
        write = if write + 1 == STAGES { 0 } else { write + 1 };
        kt += 1;
    }

    // Only empty groups can be pending; the barrier means every warp is done reading the stages.
    cp_async_wait::<0>();
    sync_threads();
    let staging: Tile<T, { BM as usize }, { BN as usize }> = SharedTile::at_dynamic::<0>();
    store_c(&acc, staging, wm0, wn0, c, &p, m0, n0, z);
}

/// This block's view of A and B: shared stages and the batch's stored matrices.
struct Operands<T, const AR: usize, const AC: usize, const BR: usize, const BC: usize> {
    a_tiles: Tile<T, AR, AC>,
    b_tiles: Tile<T, BR, BC>,
    a_src: *const u16,
    b_src: *const u16,
    m0: u32,
    n0: u32,
}

impl<T: MmaElem, const AR: usize, const AC: usize, const BR: usize, const BC: usize>
    Operands<T, AR, AC, BR, BC>
{
    /// Issues this thread's loads of k-tile `kt` of A and B into `stage`.
    #[inline(always)]
    fn load<const A_T: bool, const B_T: bool>(&self, p: &MatmulTc, kt: u32, stage: u32) {
        let k0 = kt * BK;
        let (at, bt) = (self.a_tiles.stage(stage), self.b_tiles.stage(stage));
        let (a, b) = (self.a_src, self.b_src);
        // SAFETY: the launcher validated that A and B hold (batch or 1) stored matrices with these
        // leading dims and bounds ((m, k) or (k, m) for A, (k, n) or (n, k) for B, as oriented
        // here) and chose `Chunks16` only for 16-byte granular rows; `load_tile` reads only inside
        // the bounds, and the stage is idle (pipeline order in the module doc).
        unsafe {
            if A_T {
                load_tile(at, a, p.lda, k0, p.k, self.m0, p.m, p.a_access);
            } else {
                load_tile(at, a, p.lda, self.m0, p.m, k0, p.k, p.a_access);
            }
            if B_T {
                load_tile(bt, b, p.ldb, self.n0, p.n, k0, p.k, p.b_access);
            } else {
                load_tile(bt, b, p.ldb, k0, p.k, self.n0, p.n, p.b_access);
            }
        }
    }
}

/// `acc += A B` over one k-tile: per k16 step, 4 A and 4 B `ldmatrix.x4`, then 32 `mma`.
#[inline(always)]
fn mma_tile<
    T: MmaElem,
    const A_T: bool,
    const B_T: bool,
    const AR: usize,
    const AC: usize,
    const BR: usize,
    const BC: usize,
>(
    acc: &mut [[FragC; NT]; MT],
    at: Tile<T, AR, AC>,
    bt: Tile<T, BR, BC>,
    wm0: u32,
    wn0: u32,
) {
    unroll_lt!(ks < KS, {
        let k16 = 16 * ks as u32;
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
        // Serpentine over n: consecutive mma share an operand.
        unroll_lt!(i < MT, {
            unroll_lt!(jj < NT, {
                let j = if i % 2 == 0 { jj } else { NT - 1 - jj };
                T::mma(&mut acc[i][j], &af[i], bf[j]);
            });
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
/// `cols` are multiples of 8. The tile stage is idle.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn load_tile<T: MmaElem, const R: usize, const C: usize>(
    tile: Tile<T, R, C>,
    src: *const u16,
    ld: u64,
    row0: u32,
    rows: u32,
    col0: u32,
    cols: u32,
    access: RowAccess,
) {
    const { assert!((R * C / 8) % THREADS as usize == 0 && THREADS as usize % (C / 8) == 0) };
    let cpr = (C / 8) as u32;
    let (tid, row_step) = (thread_idx_x(), THREADS / cpr);
    let (r_first, chunk) = (tid / cpr, tid % cpr);
    let col = col0 + 8 * chunk;
    let col_in = col < cols;
    if access == RowAccess::Chunks16 {
        // One 64-bit multiply per tile: the thread's copies are `row_step` stored rows apart.
        let first = src.wrapping_add(((row0 + r_first) as u64 * ld + col as u64) as usize);
        let step = row_step as u64 * ld;
        unroll_lt!(i < R * C / 8 / THREADS as usize, {
            let r = r_first + i as u32 * row_step;
            let fill = col_in && row0 + r < rows;
            let at = first.wrapping_add((i as u64 * step) as usize);
            // SAFETY: when `fill`, the 8 elements at `at` are inside the matrix (cols % 8 == 0)
            // and 16-byte aligned (caller's contract); otherwise nothing is read.
            unsafe { tile.copy_chunk_async(r, chunk, at as *const u8, fill) };
        });
    } else {
        unroll_lt!(i < R * C / 8 / THREADS as usize, {
            let r = r_first + i as u32 * row_step;
            let row = row0 + r;
            let mut words = [0u32; 4];
            if col_in && row < rows {
                let at = row as u64 * ld + col as u64;
                unroll!(e in [0, 1, 2, 3, 4, 5, 6, 7] {
                    if col + (e as u32) < cols {
                        // SAFETY: (row, col + e) is inside the matrix (checked just above).
                        let v = unsafe { load_u16_ro(src, at + e as u64) } as u32;
                        words[e / 2] |= v << (16 * (e % 2));
                    }
                });
            }
            tile.store_chunk(r, chunk, words);
        });
    }
}

/// Rounds the accumulators to `T`, stages them in shared memory and writes this block's tile of C.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn store_c<T: MmaElem>(
    acc: &[[FragC; NT]; MT],
    staging: Tile<T, { BM as usize }, { BN as usize }>,
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
    let cpr = BN / 8;
    let c_base = z * p.stride_c;
    let c_ptr = c.ptr as *mut u16;
    unroll_lt!(i < (BM * BN / 8 / THREADS) as usize, {
        let ch = thread_idx_x() + i as u32 * THREADS;
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
    ($($name:ident: $t:ty, $a_t:literal, $b_t:literal;)*) => {$(
        /// `C = op(A) op(B)` on tensor cores for one storage combination (see the module doc);
        /// grid (tiles, 1, batch), `THREADS` threads, `SMEM_BYTES` of dynamic shared memory.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(a: Slice<$t>, b: Slice<$t>, c: SliceMut<$t>, p: MatmulTc) {
            unsafe {
                matmul_tc::<$t, $a_t, $b_t, { a_tile($a_t).0 }, { a_tile($a_t).1 }, { b_tile($b_t).0 }, { b_tile($b_t).1 }>(
                    a, b, c, p,
                )
            }
        }
    )*};
}

tc_entry_points! {
    matmul_tc_nn_f16: F16, false, false;
    matmul_tc_nt_f16: F16, false, true;
    matmul_tc_tn_f16: F16, true, false;
    matmul_tc_tt_f16: F16, true, true;
    matmul_tc_nn_bf16: BF16, false, false;
    matmul_tc_nt_bf16: BF16, false, true;
    matmul_tc_tn_bf16: BF16, true, false;
    matmul_tc_tt_bf16: BF16, true, true;
}
