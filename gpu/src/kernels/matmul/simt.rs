//! Tiled f32 matrix multiply: `C (+)= op(A) op(B) (+ bias)`, batched over grid z, any M, N, K, either
//! operand transposed.
//!
//! A block owns a `BM x BN` tile of C. Per `BK`-deep step, its 256 threads copy the A and B slices from
//! global memory into shared tiles stored k-major (`As[k][m]`, `Bs[k][n]`), then each thread multiplies
//! its `8 x 8` register micro-tile: rows `{ty*4 + 0..4, 64 + ty*4 + 0..4}`, columns likewise with tx, so
//! every shared read is a 16-byte vector that a warp serves without bank conflicts. The next step's
//! global loads are issued before the current step's math (register prefetch). Every C element is summed
//! by one thread in k order: the same bits on every run.
//!
//! Global-to-shared copy patterns (a thread moves 4 elements either way):
//! - k-contiguous source (A as stored M x K, or B stored transposed N x K): thread t reads row `t / 2`,
//!   k `4 (t % 2) .. +4`;
//! - outer-contiguous source (A stored transposed K x M, B as stored K x N): thread t reads k `t / 32`,
//!   columns `4 (t % 32) .. +4` (coalesced 512-byte rows).
use crate::dev::math;
use crate::dev::mem::{Slice, SliceMut};
use crate::dev::sync::sync_threads;
use crate::dev::thread::{block_idx_x, block_idx_y, block_idx_z, thread_idx_x};
use crate::params::Matmul;
use crate::params::matmul::{BK, BM, BN, LDS};

const TILE: usize = (BK * LDS) as usize;
crate::static_shared!(fn a_tile() -> [f32; TILE] as MATMUL_A_TILE);
crate::static_shared!(fn b_tile() -> [f32; TILE] as MATMUL_B_TILE);
const LD: usize = LDS as usize;
const HALF: usize = (BM / 2) as usize;

/// This thread's 4 elements of the `BK`-deep slice at `k0` of an operand whose "outer" dim (M for A, N
/// for B) starts at `o0` and has `outer` rows; `k_major` says the operand is stored k-major (outer
/// index contiguous). Out-of-range elements are 0.
#[inline(always)]
fn load_slice(
    src: &Slice<f32>,
    base: u64,
    ld: u64,
    k_major: bool,
    o0: u32,
    outer: u32,
    k0: u32,
    k: u32,
) -> [f32; 4] {
    let t = thread_idx_x();
    let mut v = [0.0f32; 4];
    if k_major {
        let (kk, oo) = (k0 + t / 32, o0 + (t % 32) * 4);
        crate::unroll!(i in [0, 1, 2, 3] {
            if kk < k && oo + (i as u32) < outer {
                v[i] = src.get(base + kk as u64 * ld + (oo + i as u32) as u64);
            }
        });
    } else {
        let (oo, kk) = (o0 + t / 2, k0 + (t % 2) * 4);
        crate::unroll!(i in [0, 1, 2, 3] {
            if oo < outer && kk + (i as u32) < k {
                v[i] = src.get(base + oo as u64 * ld + (kk + i as u32) as u64);
            }
        });
    }
    v
}

/// Stores what [`load_slice`] loaded into the k-major shared tile.
#[inline(always)]
fn store_slice(tile: &crate::dev::shared::SharedArray<f32, TILE>, k_major: bool, v: [f32; 4]) {
    let t = thread_idx_x() as usize;
    if k_major {
        tile.store4((t / 32) * LD + (t % 32) * 4, v);
    } else {
        crate::unroll!(i in [0, 1, 2, 3] {
            tile.store(((t % 2) * 4 + i) * LD + t / 2, v[i]);
        });
    }
}

#[inline(always)]
unsafe fn matmul(a: Slice<f32>, b: Slice<f32>, bias: Slice<f32>, c: SliceMut<f32>, p: Matmul) {
    let (at, bt) = (a_tile(), b_tile());
    let t = thread_idx_x() as usize;
    let (ty, tx) = (t / 16, t % 16);
    let (n0, m0, z) = (block_idx_x() * BN, block_idx_y() * BM, block_idx_z() as u64);
    let (a_base, b_base) = (z * p.stride_a, z * p.stride_b);
    // A is k-major when stored transposed (K x M); B when stored as is (K x N).
    let (a_km, b_km) = (p.trans_a != 0, p.trans_b == 0);

    let mut acc = [[0.0f32; 8]; 8];
    let steps = p.k.div_ceil(BK);
    let mut ra = load_slice(&a, a_base, p.lda, a_km, m0, p.m, 0, p.k);
    let mut rb = load_slice(&b, b_base, p.ldb, b_km, n0, p.n, 0, p.k);
    store_slice(&at, a_km, ra);
    store_slice(&bt, b_km, rb);
    sync_threads();
    let mut s = 0;
    while s < steps {
        let more = s + 1 < steps;
        if more {
            let k0 = (s + 1) * BK;
            ra = load_slice(&a, a_base, p.lda, a_km, m0, p.m, k0, p.k);
            rb = load_slice(&b, b_base, p.ldb, b_km, n0, p.n, k0, p.k);
        }
        crate::unroll!(kk in [0, 1, 2, 3, 4, 5, 6, 7] {
            let (a0, a1) = (at.load4(kk * LD + ty * 4), at.load4(kk * LD + HALF + ty * 4));
            let (b0, b1) = (bt.load4(kk * LD + tx * 4), bt.load4(kk * LD + HALF + tx * 4));
            let av = [a0[0], a0[1], a0[2], a0[3], a1[0], a1[1], a1[2], a1[3]];
            let bv = [b0[0], b0[1], b0[2], b0[3], b1[0], b1[1], b1[2], b1[3]];
            crate::unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7] {
                crate::unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7] {
                    acc[i][j] = math::fma(av[i], bv[j], acc[i][j]);
                });
            });
        });
        sync_threads();
        if more {
            store_slice(&at, a_km, ra);
            store_slice(&bt, b_km, rb);
            sync_threads();
        }
        s += 1;
    }

    let c_base = z * p.stride_c;
    let has_bias = bias.len > 0;
    crate::unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7] {
        let m = m0 + (if i < 4 { ty * 4 + i } else { HALF + ty * 4 + i - 4 }) as u32;
        if m < p.m {
            crate::unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7] {
                let n = n0 + (if j < 4 { tx * 4 + j } else { HALF + tx * 4 + j - 4 }) as u32;
                if n < p.n {
                    let at_c = c_base + m as u64 * p.ldc + n as u64;
                    let mut v = acc[i][j];
                    if has_bias {
                        v += bias.get(n as u64);
                    }
                    if p.accumulate != 0 {
                        v += c.get(at_c);
                    }
                    c.set(at_c, v);
                }
            });
        }
    });
}

/// `C (+)= op(A) op(B) (+ bias)`: grid (ceil(N / BN), ceil(M / BM), batch), `THREADS` threads. `bias`
/// of length 0 means no bias; otherwise it has `n` elements, added to every row.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn matmul_f32(
    a: Slice<f32>,
    b: Slice<f32>,
    bias: Slice<f32>,
    c: SliceMut<f32>,
    p: Matmul,
) {
    unsafe { matmul(a, b, bias, c, p) }
}
