//! The f32 matmul on tensor cores: `C (+)= op(A) op(B) (+ bias)` with `mma.m16n8k8` tf32 inputs and
//! f32 accumulation, batched over grid z or split along the depth, either operand transposed, any
//! M, N, K. Two precisions (`host::ops::matmul::Precision`): `matmul_tf32x3_*` (3xTF32, f32
//! accuracy) and `matmul_tf32_*` (TF32). Tiles, pipeline and split-K: `params::matmul_tf32`.
//!
//! Per k-tile `kt` (one barrier a tile):
//! ```text
//! wait until tile kt has landed (at most STAGES - 2 newer groups pending), barrier
//!     (the barrier also means every warp is done reading tile kt - 1's stage)
//! copy tile kt + STAGES - 1 into that stage, commit
//! 4 k8 steps: fragments from shared memory, split, mma
//! ```
//! Fragments are read with scalar `ld.shared` (f32 has no `ldmatrix` form that fits `m16n8k8`'s
//! tf32 fragments for every orientation); the tile pitches make each read conflict-free
//! (`params::matmul_tf32`). The split into tf32 parts is the integer one of
//! `params::lrp::v5::split_tf32_fast` (sm_90 has no tf32 conversion instruction).
//!
//! Every C element is one thread's fixed sequence of `mma` and adds over k (and, when split, the
//! finishing kernel's fixed slice order): the same bits on every run.
use super::splitk::store_element;
use crate::dev::copy::{cp_async_16_bytes, cp_async_commit, cp_async_wait};
use crate::dev::mem::{Slice, SliceMut};
use crate::dev::mma::{FragA, FragBTf32, FragC, mma_tf32};
use crate::dev::shared::{SharedScalar, dynamic_base};
use crate::dev::sync::sync_threads;
use crate::dev::thread::{block_idx_x, block_idx_y, block_idx_z, lane_id, thread_idx_x, warp_id};
use crate::params::MatmulTf32;
use crate::params::lrp::v5::{split_tf32_fast, tf32_rna_bits};
use crate::params::matmul_tf32::*;
use crate::unroll;

/// m16 tiles (M) and n8 tiles (N) of a warp's 64 x 32 piece of C.
const MT: usize = 4;
const NT: usize = 4;
/// 16-byte copies a thread issues per operand and k-tile; the loops below unroll over these
/// counts as literal lists (nested `unroll_lt!` would expand 16 copies a level before folding).
const COPIES: u32 = BM * BK / 4 / THREADS;
const _: () = assert!(MT == 4 && NT == 4 && COPIES == 4 && BK / 8 == 4 && STAGES == 3);

/// One operand's copy geometry: stored rows `ld` floats apart from `src`; the tile is `[outer][k]`
/// when `K_CONTIG` (rows along the outer dim, M or N), else `[k][outer]`.
#[derive(Clone, Copy)]
struct Source {
    src: *const f32,
    ld: u64,
    /// This block's first outer index and the operand's outer extent.
    o0: u32,
    outer: u32,
}

/// Issues this thread's copies of the k-tile at depth `k0` (valid depths `< k_end`) of one operand
/// into the tile at shared address `tile`.
///
/// # Safety
/// The launcher validated that every stored element `(outer < outer, k < K)` is readable at
/// `src + outer * ld + k` (k-contiguous) or `src + k * ld + outer`, with `src` 16-byte aligned and
/// `ld` a multiple of 4; the stage is idle.
#[inline(always)]
unsafe fn copy_tile<const K_CONTIG: bool>(s: &Source, tile: u32, k0: u32, k_end: u32) {
    let tid = thread_idx_x();
    unroll!(i in [0, 1, 2, 3] {
        let ch = tid + i as u32 * THREADS;
        // (row, first column) in the stored matrix and the shared offset of the chunk.
        let (row, col, row_end, col_end, smem) = if K_CONTIG {
            let (r, c) = (ch / (BK / 4), 4 * (ch % (BK / 4)));
            (s.o0 + r, k0 + c, s.outer, k_end, (r * PITCH_K + c) * 4)
        } else {
            let (r, c) = (ch / (BM / 4), 4 * (ch % (BM / 4)));
            (k0 + r, s.o0 + c, k_end, s.outer, (r * PITCH_O + c) * 4)
        };
        let inside = row < row_end && col < col_end;
        let bytes = if inside {
            let left = col_end - col;
            4 * if left < 4 { left } else { 4 }
        } else {
            0
        };
        let at = if inside {
            s.src.wrapping_add((row as u64 * s.ld + col as u64) as usize)
        } else {
            s.src
        };
        // SAFETY: `bytes` covers only elements inside the matrix (caller's contract); chunk
        // starts are 16-byte aligned (aligned base, ld and col multiples of 4).
        unsafe { cp_async_16_bytes(tile + smem, at as *const u8, bytes) };
    });
}

/// The fragments of one k8 step at depth `k8` of a stage: A for the warp's `MT` m16 tiles (rows
/// `wm0 ..`), B for its `NT` n8 tiles (columns `wn0 ..`), as f32 bits.
#[inline(always)]
fn load_frags<const A_KC: bool, const B_KC: bool>(
    a_tile: u32,
    b_tile: u32,
    wm0: u32,
    wn0: u32,
    k8: u32,
) -> ([FragA; MT], [FragBTf32; NT]) {
    let (g, t) = (lane_id() / 4, lane_id() % 4);
    let a_at = |r: u32, k: u32| {
        let off = if A_KC {
            r * PITCH_K + k
        } else {
            k * PITCH_O + r
        };
        // SAFETY: inside the stage's A tile (r < BM, k < BK); written before the loop's barrier.
        unsafe { u32::ld_shared(a_tile + 4 * off) }
    };
    let b_at = |k: u32, n: u32| {
        let off = if B_KC {
            n * PITCH_K + k
        } else {
            k * PITCH_O + n
        };
        // SAFETY: as for A.
        unsafe { u32::ld_shared(b_tile + 4 * off) }
    };
    let mut af = [[0u32; 4]; MT];
    unroll!(i in [0, 1, 2, 3] {
        let r = wm0 + 16 * i as u32 + g;
        af[i] = [
            a_at(r, k8 + t),
            a_at(r + 8, k8 + t),
            a_at(r, k8 + t + 4),
            a_at(r + 8, k8 + t + 4),
        ];
    });
    let mut bf = [[0u32; 2]; NT];
    unroll!(j in [0, 1, 2, 3] {
        let n = wn0 + 8 * j as u32 + g;
        bf[j] = [b_at(k8 + t, n), b_at(k8 + t + 4, n)];
    });
    (af, bf)
}

/// The kernel body: `PASSES` 3 (3xTF32) or 1 (TF32); A stored `K x M` unless `A_KC` (k-contiguous,
/// `M x K`), B stored `K x N` unless `B_KC` (`N x K`). Grid (N tiles, M tiles, batch or slices).
#[inline(always)]
unsafe fn matmul_tf32<const PASSES: u32, const A_KC: bool, const B_KC: bool>(
    a: Slice<f32>,
    b: Slice<f32>,
    bias: Slice<f32>,
    c: SliceMut<f32>,
    ws: SliceMut<f32>,
    p: MatmulTf32,
) {
    const { assert!(PASSES == 1 || PASSES == 3) };
    let mm = p.mm;
    let (n0, m0) = (block_idx_x() * BN, block_idx_y() * BM);
    let (z, split) = if p.splits > 1 {
        (0u64, block_idx_z())
    } else {
        (block_idx_z() as u64, 0)
    };
    let k_begin = split * p.k_per_split;
    let k_end = {
        let e = k_begin as u64 + p.k_per_split as u64;
        if e < mm.k as u64 { e as u32 } else { mm.k }
    };
    let sa = Source {
        src: a.ptr.wrapping_add((z * mm.stride_a) as usize),
        ld: mm.lda,
        o0: m0,
        outer: mm.m,
    };
    let sb = Source {
        src: b.ptr.wrapping_add((z * mm.stride_b) as usize),
        ld: mm.ldb,
        o0: n0,
        outer: mm.n,
    };
    let smem = dynamic_base();
    let stage_bytes = 2 * TILE_FLOATS * 4;
    let a_tile = |s: u32| smem + s * stage_bytes;
    let b_tile = |s: u32| smem + s * stage_bytes + TILE_FLOATS * 4;
    let ktiles = if k_end > k_begin {
        (k_end - k_begin).div_ceil(BK)
    } else {
        0
    };
    // SAFETY (all copies): launcher-validated operands (see `copy_tile`); stages follow the
    // pipeline order of the module doc.
    unroll!(s in [0, 1] {
        if (s as u32) < ktiles {
            let k0 = k_begin + s as u32 * BK;
            unsafe {
                copy_tile::<A_KC>(&sa, a_tile(s as u32), k0, k_end);
                copy_tile::<B_KC>(&sb, b_tile(s as u32), k0, k_end);
            }
        }
        cp_async_commit();
    });

    let w = warp_id();
    let (wm0, wn0) = ((w / WARPS_N) * 64, (w % WARPS_N) * 32);
    let mut acc: [[FragC; NT]; MT] = [[[0.0; 4]; NT]; MT];
    let (mut read, mut write) = (0u32, STAGES - 1);
    let mut kt = 0u32;
    while kt < ktiles {
        cp_async_wait::<{ STAGES - 2 }>();
        sync_threads();
        if kt + STAGES - 1 < ktiles {
            let k0 = k_begin + (kt + STAGES - 1) * BK;
            unsafe {
                copy_tile::<A_KC>(&sa, a_tile(write), k0, k_end);
                copy_tile::<B_KC>(&sb, b_tile(write), k0, k_end);
            }
        }
        cp_async_commit();
        let (at, bt) = (a_tile(read), b_tile(read));
        if PASSES == 3 {
            let mut part: [[FragC; NT]; MT] = [[[0.0; 4]; NT]; MT];
            unroll!(ks in [0, 1, 2, 3] {
                let (af, bf) = load_frags::<A_KC, B_KC>(at, bt, wm0, wn0, 8 * ks as u32);
                let mut bh = [[0u32; 2]; NT];
                let mut bl = [[0u32; 2]; NT];
                unroll!(j in [0, 1, 2, 3] {
                    unroll!(e in [0, 1] {
                        (bh[j][e], bl[j][e]) = split_tf32_fast(f32::from_bits(bf[j][e]));
                    });
                });
                unroll!(i in [0, 1, 2, 3] {
                    let mut ah = [0u32; 4];
                    let mut al = [0u32; 4];
                    unroll!(e in [0, 1, 2, 3] {
                        (ah[e], al[e]) = split_tf32_fast(f32::from_bits(af[i][e]));
                    });
                    unroll!(j in [0, 1, 2, 3] {
                        // The small terms first: they are lost least to the chain's truncation.
                        let mut d = mma_tf32(part[i][j], &al, &bh[j]);
                        d = mma_tf32(d, &ah, &bl[j]);
                        part[i][j] = mma_tf32(d, &ah, &bh[j]);
                    });
                });
            });
            unroll!(i in [0, 1, 2, 3] {
                unroll!(j in [0, 1, 2, 3] {
                    unroll!(e in [0, 1, 2, 3] {
                        acc[i][j][e] += part[i][j][e];
                    });
                });
            });
        } else {
            unroll!(ks in [0, 1, 2, 3] {
                let (af, bf) = load_frags::<A_KC, B_KC>(at, bt, wm0, wn0, 8 * ks as u32);
                let mut bh = [[0u32; 2]; NT];
                unroll!(j in [0, 1, 2, 3] {
                    unroll!(e in [0, 1] {
                        bh[j][e] = tf32_rna_bits(bf[j][e]);
                    });
                });
                unroll!(i in [0, 1, 2, 3] {
                    let mut ah = [0u32; 4];
                    unroll!(e in [0, 1, 2, 3] {
                        ah[e] = tf32_rna_bits(af[i][e]);
                    });
                    unroll!(j in [0, 1, 2, 3] {
                        acc[i][j] = mma_tf32(acc[i][j], &ah, &bh[j]);
                    });
                });
            });
        }
        read = if read + 1 == STAGES { 0 } else { read + 1 };
        write = if write + 1 == STAGES { 0 } else { write + 1 };
        kt += 1;
    }
    cp_async_wait::<0>();

    // Epilogue: element (row g (+8), cols 2t, 2t + 1) of each fragment.
    let (g, t) = (lane_id() / 4, lane_id() % 4);
    unroll!(i in [0, 1, 2, 3] {
        unroll!(j in [0, 1, 2, 3] {
            unroll!(h in [0, 1] {
                let row = m0 + wm0 + 16 * i as u32 + 8 * h as u32 + g;
                unroll!(e in [0, 1] {
                    let col = n0 + wn0 + 8 * j as u32 + 2 * t + e as u32;
                    store_element(&p, &bias, &c, &ws, split, z, (row, col), acc[i][j][2 * h + e]);
                });
            });
        });
    });
}

macro_rules! tf32_entry_points {
    ($($name:ident, $passes:literal, $a_kc:literal, $b_kc:literal;)*) => {$(
        // One 256-thread block per SM: up to 255 registers for the 64 accumulators, the 64 stage
        // partials (3xTF32) and the split fragments.
        crate::launch_bounds!($name, THREADS, 1);
        /// `C (+)= op(A) op(B) (+ bias)` on tensor cores for one precision and storage combination
        /// (module doc). Grid (ceil(N / BN), ceil(M / BM), batch or `splits`), `THREADS` threads,
        /// `SMEM_BYTES` of dynamic shared memory. `ws` holds `splits * M * N` floats when split.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(
            a: Slice<f32>,
            b: Slice<f32>,
            bias: Slice<f32>,
            c: SliceMut<f32>,
            ws: SliceMut<f32>,
            p: MatmulTf32,
        ) {
            unsafe { matmul_tf32::<$passes, $a_kc, $b_kc>(a, b, bias, c, ws, p) }
        }
    )*};
}

// `nn`: A stored M x K (k-contiguous), B stored K x N; `t` marks an operand stored transposed.
tf32_entry_points! {
    matmul_tf32x3_nn_f32, 3, true, false;
    matmul_tf32x3_nt_f32, 3, true, true;
    matmul_tf32x3_tn_f32, 3, false, false;
    matmul_tf32x3_tt_f32, 3, false, true;
    matmul_tf32_nn_f32, 1, true, false;
    matmul_tf32_nt_f32, 1, true, true;
    matmul_tf32_tn_f32, 1, false, false;
    matmul_tf32_tt_f32, 1, false, true;
}
