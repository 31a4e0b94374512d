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
//!     retire the last group, release its stage;
//!     per 64 x 128 half of its C tile: wait until its last TMA store has read the staging tile,
//!     write the half (rounded to T) there, fence, TMA-store it (not waited for)
//! ```
//! The producer is never more than `STAGES` k-tiles ahead, and crosses tile boundaries freely, so
//! the next tile's first stages load while the consumers store C.
use crate::dev::elem::{BF16, F16};
use crate::dev::mbarrier::{PipeState, Pipeline};
use crate::dev::mma::MmaElem;
use crate::dev::shared::{SharedScalar, dynamic_base};
use crate::dev::sync::{named_barrier, sync_threads};
use crate::dev::thread::{block_idx_x, grid_dim_x, lane_id, thread_idx_x};
use crate::dev::tma::{TensorMapRef, bulk_commit, bulk_wait, bulk_wait_read};
use crate::dev::wgmma::{
    SwizzledTile, Wgmma, fence_proxy_async, set_max_registers_dec, set_max_registers_inc,
};
use crate::params::matmul_tc::tile_coords;
use crate::params::matmul_tma::{
    BK, BM, BN, CONSUMER_REGS, PIPELINE_BYTES, PRODUCER_REGS, STAGES, STAGING_BYTES, THREADS,
};
use crate::params::{MatmulTma, TensorMapParam};

/// A consumer's staging tile for C: 64 rows x 128 columns (half its 64 x 256 accumulator), in the
/// 128-byte-swizzle layout its TMA store reads (two 64-column boxes).
type Staging = SwizzledTile<64, 128>;
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
    map_c: TensorMapRef<64>,
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
        map_c.prefetch();
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
        let staging = Staging::at(dynamic_base() + PIPELINE_BYTES + wg * STAGING_BYTES);
        let mut at = PipeState::START;
        let mut t = block_idx_x();
        while t < tiles {
            let (z, m0, n0) = coords(t);
            let mut acc = [0f32; 128];
            // SAFETY: the whole consumer warpgroup, `elected` on one thread; the products read the
            // stage only through their wgmma.
            at = unsafe {
                pipe.consume_one_group_behind(at, k_tiles, elected, &mut acc, |acc, (ta, tb)| {
                    unroll!(s in [0, 1, 2, 3] {
                        let s = s as u32;
                        let a_desc = if TA == 1 { ta.desc_mn_major_from(s, 64 * wg) } else { ta.desc_k_major(64 * wg, s) };
                        let b_desc = if TB == 1 { tb.desc_k_major(0, s) } else { tb.desc_mn_major(s) };
                        // SAFETY: the whole warpgroup, on a stage that has landed (the full
                        // barrier) and stays until the walk releases it after a covering wait.
                        unsafe { T::mma_ss_t::<TA, B_MN>(acc, a_desc, b_desc, 1) };
                    });
                })
            };
            store_tile::<T>(&acc, map_c, staging, wg, elected, z, m0 + 64 * wg, n0);
            t += grid_dim_x();
        }
        if elected {
            // The last stores must have read shared memory before the CTA's memory goes away.
            bulk_wait::<0>();
        }
    }
}

/// Stores a consumer warpgroup's 64 x 256 accumulator (rows from `row0`, columns from `n0`, batch
/// `z`) to C, rounded to `T`, in two 64 x 128 halves: each half is written to the warpgroup's
/// staging tile, then one thread stores it with TMA (two boxes; the copy engine skips rows and
/// columns past C) and the warpgroup goes on while the copy runs. Thread (warp `w`, lane `g * 4 + q`)
/// holds rows `16 w + g` and `+ 8`, columns `8 j + 2 q, + 1` for `j < 32` (the wgmma accumulator
/// layout); in the swizzled staging tile the eight rows `g` of one column chunk land on eight
/// different 16-byte bank groups, so the 4-byte writes of a warp hit 32 distinct banks.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn store_tile<T: MmaElem>(
    acc: &[f32; 128],
    map_c: TensorMapRef<64>,
    staging: Staging,
    wg: u32,
    elected: bool,
    z: u32,
    row0: u32,
    n0: u32,
) {
    let lane = lane_id();
    let (g, q) = (lane / 4, lane % 4);
    let row = 16 * ((thread_idx_x() % 128) / 32) + g;
    unroll!(h in [0, 1] {
        if elected {
            // The previous store from this tile has read it.
            bulk_wait_read::<0>();
        }
        // SAFETY: the 128 threads of this consumer warpgroup, barrier 1 + wg (1 or 2) theirs alone.
        unsafe { named_barrier(1 + wg, 128) };
        unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
            let col = 8 * j as u32 + 2 * q;
            unroll!(r in [0, 1] {
                let i = 4 * (16 * h + j) + 2 * r;
                // SAFETY: (row + 8 r, col) is inside the staging tile (row < 64, col < 128, even,
                // so 4-byte aligned); each word has one writer; the tile is free (the wait above).
                unsafe { u32::st_shared(staging.elem_addr(row + 8 * r as u32, col), T::pack2(acc[i], acc[i + 1])) };
            });
        });
        fence_proxy_async();
        // SAFETY: as above.
        unsafe { named_barrier(1 + wg, 128) };
        if elected {
            // SAFETY: every writer fenced its writes and passed the barrier; the tile is not
            // rewritten before the `bulk_wait_read` of the next half or tile.
            unsafe { map_c.store(staging, (n0 + 128 * h as u32) as i32, row0 as i32, z as i32) };
            bulk_commit();
        }
    });
}

macro_rules! tma_entry_points {
    ($($name:ident: $t:ty, $ta:literal, $tb:literal;)*) => {$(
        // One CTA per SM with a register cap at entry, which `setmaxnreg` needs.
        crate::launch_bounds!($name, THREADS, 1);
        crate::tensor_map_params!($name, 0, 1, 2);
        /// `C = op(A) op(B)` for one storage combination (see the module doc): `a_map`, `b_map` and
        /// `c_map` are tensor maps of A, B and C (`host::ops::matmul`), grid `min(tiles, SMs)`, 384
        /// threads, `matmul_tma::SMEM_BYTES` of dynamic shared memory.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(
            _a_map: TensorMapParam,
            _b_map: TensorMapParam,
            _c_map: TensorMapParam,
            p: MatmulTma,
        ) {
            let map_a = crate::tensor_map_param!($name, 0, a_tile($ta).0);
            let map_b = crate::tensor_map_param!($name, 1, b_tile($tb).0);
            let map_c = crate::tensor_map_param!($name, 2, 64);
            unsafe {
                matmul_tma::<$t, $ta, $tb, { 1 - $tb }, { a_tile($ta).0 }, { a_tile($ta).1 }, { b_tile($tb).0 }, { b_tile($tb).1 }>(
                    map_a, map_b, map_c, p,
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
