//! Hopper f16/bf16 matrix multiply `C = op(A) op(B)` (sm_90 build only): TMA copies into an mbarrier
//! pipeline, `wgmma` from shared memory, warp specialisation. Entry points
//! `matmul_tma_{nn,nt,tn,tt}_{f16,bf16}`; tile sizes and the design notes are in
//! [`crate::params::matmul_tma`]. The host takes this kernel when every operand's rows are 16-byte
//! aligned (what the copy engine needs) and the `mma.sync` kernel (`tensor_core.rs`) otherwise.
//!
//! Roles, per persistent CTA (384 threads):
//! ```text
//! warpgroup 0 (producer, 40 registers): thread 0, per tile, per k-tile kt:
//!     wait empty[s] (the consumers released stage s), expect 48 KiB on full[s],
//!     TMA A's tile and B's tile of kt into stage s
//! warpgroups 1, 2 (consumers, 232 registers; rows 64 (w - 1).. of the tile), per tile:
//!     per k-tile: wait full[s]; 4 wgmma m64n256k16 from the stage, commit;
//!         wait until the previous k-tile's group retired, release its stage
//!     retire the last group, release its stage, store C (rounded to T) from registers
//! ```
//! The producer is never more than `STAGES` k-tiles ahead, and crosses tile boundaries freely, so
//! the next tile's first stages load while the consumers store C.
use crate::dev::elem::{BF16, F16};
use crate::dev::mbarrier::{PipeState, Pipeline};
use crate::dev::mem::{SliceMut, store_u32};
use crate::dev::mma::MmaElem;
use crate::dev::shared::{check_index, dynamic_base};
use crate::dev::sync::sync_threads;
use crate::dev::thread::{block_idx_x, grid_dim_x, lane_id, thread_idx_x};
use crate::dev::tma::TensorMapRef;
use crate::dev::wgmma::{
    Accumulator, SwizzledTile, Wgmma, commit, fence, set_max_registers_dec, set_max_registers_inc,
};
use crate::params::matmul_tc::tile_coords;
use crate::params::matmul_tma::{BK, BM, BN, CONSUMER_REGS, PRODUCER_REGS, STAGES, THREADS};
use crate::params::{MatmulTma, TensorMapParam};
use crate::unroll;

/// Shared tile `(rows, cols)` of A's k-tile: K-major (`[m][k]`, `TA = 0`) 128 x 64, one box;
/// MN-major (`[k][m]`, `TA = 1`) 64 x 128, two boxes. The tensor map's box height is `rows`.
const fn a_tile(ta: u32) -> (usize, usize) {
    if ta == 1 {
        (BK as usize, BM as usize)
    } else {
        (BM as usize, BK as usize)
    }
}

/// Shared tile of B's k-tile: K-major (`[n][k]`, `TB = 1`) 256 x 64, one box; MN-major (`[k][n]`,
/// `TB = 0`) 64 x 256, four boxes.
const fn b_tile(tb: u32) -> (usize, usize) {
    if tb == 1 {
        (BN as usize, BK as usize)
    } else {
        (BK as usize, BN as usize)
    }
}

/// The kernel for one storage combination (`TA`, `TB`: 1 = that operand stored transposed). `B_MN`
/// is `1 - TB`, wgmma's `imm-trans-b`: B stored as `[k][n]` (not transposed) is the MN-major
/// operand, while a transposed A (`[k][m]`) is the MN-major one (`imm-trans-a = TA`).
#[inline(always)]
unsafe fn matmul_tma<
    T: MmaElem + Wgmma<[f32; 128]>,
    const TA: u32,
    const TB: u32,
    const B_MN: u32,
    const AR: usize,
    const AC: usize,
    const BR: usize,
    const BC: usize,
>(
    map_a: TensorMapRef<AR>,
    map_b: TensorMapRef<BR>,
    c: SliceMut<T>,
    p: MatmulTma,
) {
    let pipe = Pipeline::<(SwizzledTile<AR, AC>, SwizzledTile<BR, BC>), { STAGES as usize }>::at(
        dynamic_base(),
    );
    let tid = thread_idx_x();
    if tid == 0 {
        // SAFETY: one thread, before the barrier below and any other use.
        unsafe { pipe.init(2) };
        map_a.prefetch();
        map_b.prefetch();
    }
    sync_threads();
    let per_batch = p.tiles_m * p.tiles_n;
    let tiles = per_batch * p.batch;
    let k_tiles = p.k.div_ceil(BK);
    // The tile `t` of the persistent walk: (batch, first row, first column).
    let coords = |t: u32| {
        let z = t / per_batch;
        let (tm, tn) = tile_coords(t - z * per_batch, p.tiles_m, p.tiles_n);
        (z, tm * BM, tn * BN)
    };
    if tid < 128 {
        set_max_registers_dec::<PRODUCER_REGS>();
        if tid == 0 {
            let mut at = PipeState::START;
            let mut t = block_idx_x();
            while t < tiles {
                let (z, m0, n0) = coords(t);
                let za = if p.a_batched != 0 { z as i32 } else { 0 };
                let zb = if p.b_batched != 0 { z as i32 } else { 0 };
                let mut kt = 0;
                while kt < k_tiles {
                    let k0 = (kt * BK) as i32;
                    // SAFETY: the one producer thread; the two loads fill the stage's two tiles,
                    // exactly the bytes announced; the maps' boxes are the tiles' (their types).
                    unsafe {
                        let ((ta, tb), full) = pipe.producer_acquire(at);
                        if TA == 1 {
                            map_a.load(ta, m0 as i32, k0, za, full);
                        } else {
                            map_a.load(ta, k0, m0 as i32, za, full);
                        }
                        if TB == 1 {
                            map_b.load(tb, k0, n0 as i32, zb, full);
                        } else {
                            map_b.load(tb, n0 as i32, k0, zb, full);
                        }
                    }
                    at = at.next();
                    kt += 1;
                }
                t += grid_dim_x();
            }
        }
    } else {
        set_max_registers_inc::<CONSUMER_REGS>();
        let wg = tid / 128 - 1;
        let elected = tid % 128 == 0;
        let mut at = PipeState::START;
        let mut t = block_idx_x();
        while t < tiles {
            let (z, m0, n0) = coords(t);
            let mut acc = [0f32; 128];
            let mut prev = at;
            let mut kt = 0;
            while kt < k_tiles {
                let (ta, tb) = pipe.consumer_wait(at);
                fence();
                unroll!(s in [0, 1, 2, 3] {
                    let s = s as u32;
                    let a_desc = if TA == 1 { ta.desc_mn_major_from(s, 64 * wg) } else { ta.desc_k_major(64 * wg, s) };
                    let b_desc = if TB == 1 { tb.desc_k_major(0, s) } else { tb.desc_mn_major(s) };
                    // SAFETY: the whole warpgroup, on a stage that has landed (the full barrier)
                    // and stays until this warpgroup releases it after a covering wait.
                    unsafe { T::mma_ss_t::<TA, B_MN>(&mut acc, a_desc, b_desc, 1) };
                });
                commit();
                acc.wait::<1>();
                if kt > 0 && elected {
                    // SAFETY: one thread a consumer; the wait above retired k-tile kt - 1's wgmma.
                    unsafe { pipe.consumer_release(prev) };
                }
                prev = at;
                at = at.next();
                kt += 1;
            }
            acc.wait::<0>();
            if k_tiles > 0 && elected {
                // SAFETY: as above; every wgmma of this tile has retired.
                unsafe { pipe.consumer_release(prev) };
            }
            store_tile(&acc, c, &p, z, m0 + 64 * wg, n0);
            t += grid_dim_x();
        }
    }
}

/// Stores a consumer warpgroup's 64 x 256 accumulator (rows from `row0`, columns from `n0`) to C,
/// rounded to `T`: thread (warp `w`, lane `g * 4 + q`) holds rows `16 w + g` and `+ 8`, columns
/// `8 j + 2 q, + 1` for `j < 32` (the wgmma accumulator layout), stored as 4-byte pairs. Rows and
/// columns past C are skipped (the launcher guarantees an even N, so a pair is in or out whole).
#[inline(always)]
fn store_tile<T: MmaElem>(
    acc: &[f32; 128],
    c: SliceMut<T>,
    p: &MatmulTma,
    z: u32,
    row0: u32,
    n0: u32,
) {
    let lane = lane_id();
    let (g, q) = (lane / 4, lane % 4);
    let row = row0 + 16 * ((thread_idx_x() % 128) / 32) + g;
    let base = z as u64 * p.stride_c;
    let words = c.ptr as *mut u32;
    unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31] {
        let col = n0 + 8 * j as u32 + 2 * q;
        if col < p.n {
            unroll!(h in [0, 1] {
                let r = row + 8 * h as u32;
                if r < p.m {
                    let at = base + r as u64 * p.ldc + col as u64;
                    check_index((at + 1) as usize, c.len as usize);
                    // SAFETY: (r, col) and (r, col + 1) are inside C (bounds above, N even, the
                    // launcher-validated size); ldc and the batch stride are even and C's base
                    // 16-byte aligned, so the word is aligned; each pair has one writer.
                    unsafe { store_u32(words, at / 2, T::pack2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1])) };
                }
            });
        }
    });
}

macro_rules! tma_entry_points {
    ($($name:ident: $t:ty, $ta:literal, $tb:literal;)*) => {$(
        // One CTA per SM with a register cap at entry, which `setmaxnreg` needs.
        crate::launch_bounds!($name, THREADS, 1);
        crate::tensor_map_params!($name, 0, 1);
        /// `C = op(A) op(B)` for one storage combination (see the module doc): `a_map` and `b_map`
        /// are tensor maps of A and B (`host::ops::matmul`), grid `min(tiles, SMs)`, 384 threads,
        /// `matmul_tma::SMEM_BYTES` of dynamic shared memory.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(
            _a_map: TensorMapParam,
            _b_map: TensorMapParam,
            c: SliceMut<$t>,
            p: MatmulTma,
        ) {
            let map_a = crate::tensor_map_param!($name, 0, a_tile($ta).0);
            let map_b = crate::tensor_map_param!($name, 1, b_tile($tb).0);
            unsafe {
                matmul_tma::<$t, $ta, $tb, { 1 - $tb }, { a_tile($ta).0 }, { a_tile($ta).1 }, { b_tile($tb).0 }, { b_tile($tb).1 }>(
                    map_a, map_b, c, p,
                )
            }
        }
    )*};
}

tma_entry_points! {
    matmul_tma_nn_f16: F16, 0, 0;
    matmul_tma_nt_f16: F16, 0, 1;
    matmul_tma_tn_f16: F16, 1, 0;
    matmul_tma_tt_f16: F16, 1, 1;
    matmul_tma_nn_bf16: BF16, 0, 0;
    matmul_tma_nt_bf16: BF16, 0, 1;
    matmul_tma_tn_bf16: BF16, 1, 0;
    matmul_tma_tt_bf16: BF16, 1, 1;
}
