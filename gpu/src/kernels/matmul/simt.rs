//! The f32 matmul on CUDA cores (`matmul_simt_{nn,nt,tn,tt}_f32`, configured by
//! `gpu::params::matmul_f32v::CONFIG`): `C (+)= op(A) op(B) (+ bias)`, batched over grid z, any M,
//! N, K, either operand transposed. Full fp32 FFMA (no TF32).
//!
//! Why it is built this way (each measured against a single-stage 8 x 8 kernel, docs/PERF_NOTES.md):
//! - Two shared stages. The next k-tile, loaded into registers before the current tile's math, is
//!   stored into the other stage, so one barrier per k-tile suffices (one stage must wait for every
//!   warp to finish reading it before overwriting it: two barriers a tile).
//! - 16-byte global loads (`ld.global.nc.v4`) for each 4-float group that lies inside the operand
//!   when its rows are 16-byte aligned (aligned base, leading dim and batch stride multiples of 4
//!   floats, decided per block). Groups at the edges and unaligned operands take a scalar,
//!   per-element checked path.
//! - The micro-tile and the k-tile depth are parameters (`CQ` groups of 4 columns a thread: 8 x 8
//!   with 256 threads or 8 x 16 with 128; `BK` 8 or 16).
//!
//! Shared layout: A and B tiles k-major (`As[k][m]`, `Bs[k][n]`, pitch `LDS`); stage `s` at byte
//! `s * 2 * TILE_BYTES`, A first, then B. A thread owns rows `{ty*4 + 0..4, 64 + ty*4 + 0..4}` and
//! columns `q * (BN / CQ) + tx*4 + 0..4`. Per k, a warp's A reads are 2 (CQ = 2) or 4 (CQ = 4)
//! distinct consecutive 16-byte groups (broadcast to the lanes sharing ty), its B reads 16 or 8
//! consecutive groups: no bank conflicts. Every shared read of the math is `[register + constant]`.
//!
//! Each C element sums its products k = 0, 1, 2, ... with one fma each (zeros past K add nothing):
//! the same bits on every run.
use crate::dev::math;
use crate::dev::mem::{Slice, SliceMut};
use crate::dev::opaque_u32;
use crate::dev::shared::{SharedScalar, dynamic_base, ld_shared_v4, st_shared_v4};
use crate::dev::sync::sync_threads;
use crate::dev::thread::{block_idx_x, block_idx_y, block_idx_z, thread_idx_x};
use crate::params::Matmul;
use crate::params::matmul_f32v::{BM, BN, CONFIG, LDS};

/// One operand as the tile copy sees it: the product's matrix starts at `base`, rows `ld` apart;
/// `k_major` when stored with the outer index (M for A, N for B) contiguous; `outer` its M or N and
/// `o0` this block's first outer index; `vec` when every row starts 16-byte aligned.
#[derive(Clone, Copy)]
struct Operand {
    src: Slice<f32>,
    base: u64,
    ld: u64,
    k_major: bool,
    outer: u32,
    o0: u32,
    vec: bool,
}

/// Whether `[lo, lo + 4)` lies in `[0, end)` (no u32 overflow for `end` near 2^32).
#[inline(always)]
fn group_inside(lo: u32, end: u32) -> bool {
    lo < end && end - lo >= 4
}

/// Group `g` (0 .. BM * BK / 4) of the `BK`-deep k-tile at `k0`. A k-major source reads groups along
/// the outer dim (`k = g / 32`, outer `(g % 32) * 4`: a warp reads one 512-byte row); a
/// k-contiguous source along k (outer `g / (BK / 4)`, k `(g % (BK / 4)) * 4`: a warp reads whole
/// 32-byte sectors). Out-of-range elements are 0.
#[inline(always)]
fn load_group<const BK: usize>(op: &Operand, g: u32, k0: u32, k: u32) -> [f32; 4] {
    let mut v = [0.0f32; 4];
    if op.k_major {
        let (kk, o) = (k0 + g / (BM / 4), op.o0 + (g % (BM / 4)) * 4);
        let at = op.base + kk as u64 * op.ld + o as u64;
        if op.vec && kk < k && group_inside(o, op.outer) {
            return op.src.get4_ro(at);
        }
        crate::unroll!(i in [0, 1, 2, 3] {
            if kk < k && o + (i as u32) < op.outer {
                v[i] = op.src.get_ro(at + i as u64);
            }
        });
    } else {
        let per_row = (BK / 4) as u32;
        let (o, kk) = (op.o0 + g / per_row, k0 + (g % per_row) * 4);
        let at = op.base + o as u64 * op.ld + kk as u64;
        if op.vec && o < op.outer && group_inside(kk, k) {
            return op.src.get4_ro(at);
        }
        crate::unroll!(i in [0, 1, 2, 3] {
            if o < op.outer && kk + (i as u32) < k {
                v[i] = op.src.get_ro(at + i as u64);
            }
        });
    }
    v
}

/// Stores what [`load_group`] loaded for group `g` into the k-major tile at byte address `tile`:
/// one 16-byte store for a k-major source, four scalar stores (a transpose) otherwise.
#[inline(always)]
fn store_group<const BK: usize>(tile: u32, k_major: bool, g: u32, v: [f32; 4]) {
    if k_major {
        let (kk, o) = (g / (BM / 4), (g % (BM / 4)) * 4);
        // SAFETY: kk < BK and o + 4 <= BM: inside this stage's tile, 16-byte aligned (LDS % 4 == 0).
        unsafe { st_shared_v4(tile + (kk * LDS + o) * 4, v.map(f32::to_bits)) };
    } else {
        let per_row = (BK / 4) as u32;
        let (o, kq) = (g / per_row, (g % per_row) * 4);
        crate::unroll!(i in [0, 1, 2, 3] {
            // SAFETY: kq + i < BK and o < BM: inside this stage's tile.
            unsafe { f32::st_shared(tile + ((kq + i as u32) * LDS + o) * 4, v[i]) };
        });
    }
}

/// Four floats from shared byte address `addr` (16-byte aligned, written before the last barrier).
#[inline(always)]
fn lds4(addr: u32) -> [f32; 4] {
    // SAFETY: callers pass addresses inside the current stage; its stores precede a barrier.
    unsafe { ld_shared_v4(addr) }.map(f32::from_bits)
}

/// Whether an operand at `src` with rows `ld` and products `stride` floats apart starts every row on
/// 16 bytes.
#[inline(always)]
fn rows_aligned16(ptr: u64, ld: u64, stride: u64) -> bool {
    ptr % 16 == 0 && ld % 4 == 0 && stride % 4 == 0
}

/// Groups of 4 floats a thread copies per k-tile and operand (1, 2 or 4).
const fn groups_per_thread(cq: usize, bk: usize) -> usize {
    (BM as usize * bk / 4) / (16 * 32 / cq)
}

/// The kernel body: `CQ` column groups a thread (2 or 4), `BK`-deep k-tiles (8 or 16), A stored
/// transposed when `TA`, B when `TB` (compile-time: one copy path per operand, and its address terms
/// are the only ones live across the math); launched with `16 * 32 / CQ` threads and `2 * 2 * BK * LDS * 4` bytes of dynamic shared memory.
#[inline(always)]
unsafe fn matmul_db<const CQ: usize, const BK: usize, const TA: bool, const TB: bool>(
    a: Slice<f32>,
    b: Slice<f32>,
    bias: Slice<f32>,
    c: SliceMut<f32>,
    p: Matmul,
) {
    const { assert!((CQ == 2 || CQ == 4) && (BK == 8 || BK == 16)) };
    let threads = (16 * 32 / CQ) as u32;
    let tx_count = (32 / CQ) as u32;
    let col_step = BN / CQ as u32;

    let t = thread_idx_x();
    let (ty, tx) = (t / tx_count, t % tx_count);
    let (n0, m0, z) = (block_idx_x() * BN, block_idx_y() * BM, block_idx_z() as u64);
    // A is k-major when stored transposed (K x M); B when stored as is (K x N).
    let op_a = Operand {
        src: a,
        base: z * p.stride_a,
        ld: p.lda,
        k_major: TA,
        outer: p.m,
        o0: m0,
        vec: rows_aligned16(a.ptr as u64, p.lda, p.stride_a),
    };
    let op_b = Operand {
        src: b,
        base: z * p.stride_b,
        ld: p.ldb,
        k_major: !TB,
        outer: p.n,
        o0: n0,
        vec: rows_aligned16(b.ptr as u64, p.ldb, p.stride_b),
    };

    let tile_bytes = BK as u32 * LDS * 4;
    let stage_bytes = 2 * tile_bytes;
    let smem = dynamic_base();
    // This thread's first A and B fragment addresses in stage 0.
    let a_frag = smem + ty * 16;
    let b_frag = smem + tile_bytes + tx * 16;

    let mut acc = [[0.0f32; 16]; 8];
    let steps = p.k.div_ceil(BK as u32);
    let (mut ra, mut rb) = ([[0.0f32; 4]; 4], [[0.0f32; 4]; 4]);
    if steps > 0 {
        crate::unroll!(j in [0, 1, 2, 3] {
            if j < groups_per_thread(CQ, BK) {
                let g = t + j as u32 * threads;
                ra[j] = load_group::<BK>(&op_a, g, 0, p.k);
                rb[j] = load_group::<BK>(&op_b, g, 0, p.k);
            }
        });
        crate::unroll!(j in [0, 1, 2, 3] {
            if j < groups_per_thread(CQ, BK) {
                let g = t + j as u32 * threads;
                store_group::<BK>(smem, op_a.k_major, g, ra[j]);
                store_group::<BK>(smem + tile_bytes, op_b.k_major, g, rb[j]);
            }
        });
        sync_threads();
    }
    let mut s = 0u32;
    while s < steps {
        // The next tile's copies go out before this tile's math. Register path: on the last trip
        // the loads ask for k past K, every element fails its bounds check, nothing is read and
        // zeros land in the idle stage (no branch, so LLVM cannot sink the loads below the math).
        // The trip counter hidden from LLVM: the tile addresses are recomputed from the kernel
        // parameters each trip instead of being strength-reduced into 64-bit pointers that stay
        // live across the math (they spilled at the 128-register cap).
        let trip = opaque_u32(s);
        let k_next = (trip + 1) * BK as u32;
        let cur = (trip & 1) * stage_bytes;
        // The other stage: its last readers (the previous trip's math) passed the barrier that
        // ended that trip.
        let next = smem + (cur ^ stage_bytes);
        crate::unroll!(j in [0, 1, 2, 3] {
            if j < groups_per_thread(CQ, BK) {
                let g = t + j as u32 * threads;
                ra[j] = load_group::<BK>(&op_a, g, k_next, p.k);
                rb[j] = load_group::<BK>(&op_b, g, k_next, p.k);
            }
        });

        // Hidden from LLVM so every fragment read below stays `[register + constant]`.
        let (a_s, b_s) = (opaque_u32(a_frag + cur), opaque_u32(b_frag + cur));
        crate::unroll_lt!(kk < BK, {
            let row = kk as u32 * LDS * 4;
            let (a0, a1) = (lds4(a_s + row), lds4(a_s + row + (BM / 2) * 4));
            let av = [a0[0], a0[1], a0[2], a0[3], a1[0], a1[1], a1[2], a1[3]];
            let mut bv = [0.0f32; 16];
            crate::unroll!(q in [0, 1, 2, 3] {
                if q < CQ {
                    let b4 = lds4(b_s + row + q as u32 * col_step * 4);
                    crate::unroll!(e in [0, 1, 2, 3] {
                        bv[q * 4 + e] = b4[e];
                    });
                }
            });
            crate::unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7] {
                crate::unroll_lt!(j < 4 * CQ, {
                    acc[i][j] = math::fma(av[i], bv[j], acc[i][j]);
                });
            });
        });

        crate::unroll!(j in [0, 1, 2, 3] {
            if j < groups_per_thread(CQ, BK) {
                let g = t + j as u32 * threads;
                store_group::<BK>(next, op_a.k_major, g, ra[j]);
                store_group::<BK>(next + tile_bytes, op_b.k_major, g, rb[j]);
            }
        });
        sync_threads();
        s += 1;
    }

    let c_base = z * p.stride_c;
    let c_vec = rows_aligned16(c.ptr as u64, p.ldc, p.stride_c);
    let has_bias = bias.len > 0;
    crate::unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7] {
        let m = m0 + if i < 4 { ty * 4 + i as u32 } else { BM / 2 + ty * 4 + i as u32 - 4 };
        if m < p.m {
            crate::unroll!(q in [0, 1, 2, 3] {
                if q < CQ {
                    let n = n0 + q as u32 * col_step + tx * 4;
                    let at_c = c_base + m as u64 * p.ldc + n as u64;
                    let mut v = [0.0f32; 4];
                    crate::unroll!(e in [0, 1, 2, 3] {
                        v[e] = acc[i][q * 4 + e];
                        if n + (e as u32) < p.n {
                            if has_bias {
                                v[e] += bias.get((n + e as u32) as u64);
                            }
                            if p.accumulate != 0 {
                                v[e] += c.get(at_c + e as u64);
                            }
                        }
                    });
                    if c_vec && group_inside(n, p.n) {
                        c.set4(at_c, v);
                    } else {
                        crate::unroll!(e in [0, 1, 2, 3] {
                            if n + (e as u32) < p.n {
                                c.set(at_c + e as u64, v[e]);
                            }
                        });
                    }
                }
            });
        }
    });
}

/// The four storage combinations: `matmul_simt_{nn,nt,tn,tt}_f32` (first letter A, second B; `t`:
/// stored transposed), each the kernel body at [`CONFIG`]. Grid (ceil(N / 128), ceil(M / 128),
/// batch), `CONFIG.threads()` threads, `CONFIG.smem_bytes()` of dynamic shared memory.
macro_rules! f32_entry_points {
    ($($name:ident, $ta:literal, $tb:literal;)*) => {$(
        crate::launch_bounds!($name, CONFIG.threads(), CONFIG.min_blocks);
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(
            a: Slice<f32>,
            b: Slice<f32>,
            bias: Slice<f32>,
            c: SliceMut<f32>,
            p: Matmul,
        ) {
            unsafe { matmul_db::<{ CONFIG.col_quads as usize }, { CONFIG.bk as usize }, $ta, $tb>(a, b, bias, c, p) }
        }
    )*};
}

f32_entry_points! {
    matmul_simt_nn_f32, false, false;
    matmul_simt_nt_f32, false, true;
    matmul_simt_tn_f32, true, false;
    matmul_simt_tt_f32, true, true;
}
