//! The f32 tensor-core kernels' output (`matmul_tf32` on sm_80, `matmul_wg_tf32` on sm_90): the
//! element store both epilogues share, and the kernel that finishes a product split along the
//! depth (both write their slices' partial tiles to a workspace `[splits][M][N]`, which it adds in
//! slice order).
use crate::dev::mem::{Slice, SliceMut};
use crate::dev::thread::{global_index_x, grid_threads_x};
use crate::params::MatmulTf32;
use crate::params::matmul_tf32::FINISH_THREADS;
use crate::unroll;

/// Stores the product's value `v` of element (`row`, `col`) of batch entry `z` (slice `split` when
/// the product is split): to the slice's workspace tile, or to C plus the bias and (accumulating)
/// the old C, the order `matmul_splitk_finish_f32` keeps. Elements outside C are not stored.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn store_element(
    p: &MatmulTf32,
    bias: &Slice<f32>,
    c: &SliceMut<f32>,
    ws: &SliceMut<f32>,
    split: u32,
    z: u64,
    (row, col): (u32, u32),
    v: f32,
) {
    let mm = p.mm;
    if row >= mm.m || col >= mm.n {
        return;
    }
    if p.splits > 1 {
        ws.set(ws_index(p, split, (row, col)), v);
    } else {
        store_c(
            p,
            bias,
            c,
            z * mm.stride_c + row as u64 * mm.ldc,
            col as u64,
            v,
        );
    }
}

/// Whether every chunk of four elements of C (or of the workspace, when the product is split) that
/// starts at a column multiple of 4 is one aligned 16 bytes, and the bias's too: the condition of
/// [`store_element4`]'s 16-byte accesses.
#[inline(always)]
pub(super) fn chunks_aligned(
    p: &MatmulTf32,
    bias: &Slice<f32>,
    c: &SliceMut<f32>,
    ws: &SliceMut<f32>,
) -> bool {
    let mm = p.mm;
    if p.splits > 1 {
        mm.n % 4 == 0 && ws.ptr as u64 % 16 == 0
    } else {
        mm.ldc % 4 == 0
            && mm.stride_c % 4 == 0
            && c.ptr as u64 % 16 == 0
            && (bias.len == 0 || bias.ptr as u64 % 16 == 0)
    }
}

/// [`store_element`] of the four elements (`row`, `col .. col + 4`), `col` a multiple of 4: one
/// 16-byte access to the workspace, or to C (and the bias), in the same order of adds, when
/// `aligned` ([`chunks_aligned`]) and the chunk lies inside C; element by element otherwise.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn store_element4(
    p: &MatmulTf32,
    bias: &Slice<f32>,
    c: &SliceMut<f32>,
    ws: &SliceMut<f32>,
    split: u32,
    z: u64,
    (row, col): (u32, u32),
    v: [f32; 4],
    aligned: bool,
) {
    let mm = p.mm;
    if !(aligned && row < mm.m && col + 4 <= mm.n) {
        unroll!(e in [0, 1, 2, 3] {
            store_element(p, bias, c, ws, split, z, (row, col + e as u32), v[e]);
        });
    } else if p.splits > 1 {
        ws.set4(ws_index(p, split, (row, col)), v);
    } else {
        store_c4(
            p,
            bias,
            c,
            z * mm.stride_c + row as u64 * mm.ldc,
            col as u64,
            v,
        );
    }
}

/// [`store_c`] of the four elements `col .. col + 4` with 16-byte accesses (aligned, inside C).
#[inline(always)]
fn store_c4(
    p: &MatmulTf32,
    bias: &Slice<f32>,
    c: &SliceMut<f32>,
    row_at: u64,
    col: u64,
    v: [f32; 4],
) {
    let at = row_at + col;
    let mut v = v;
    if bias.len > 0 {
        let b = bias.get4_ro(col);
        unroll!(e in [0, 1, 2, 3] { v[e] += b[e]; });
    }
    if p.mm.accumulate != 0 {
        let old = c.get4(at);
        unroll!(e in [0, 1, 2, 3] { v[e] += old[e]; });
    }
    c.set4(at, v);
}

/// Element (`row`, `col`) of slice `split`'s tile in the split product's workspace
/// `[splits][M][N]`.
#[inline(always)]
fn ws_index(p: &MatmulTf32, split: u32, (row, col): (u32, u32)) -> u64 {
    (split as u64 * p.mm.m as u64 + row as u64) * p.mm.n as u64 + col as u64
}

/// `C[at + col] = v + bias[col] + C[at + col]` (the bias when there is one, the old C when
/// accumulating): the one order both the unsplit epilogue and the split-K finish add in.
#[inline(always)]
fn store_c(p: &MatmulTf32, bias: &Slice<f32>, c: &SliceMut<f32>, row_at: u64, col: u64, v: f32) {
    let at = row_at + col;
    let mut v = v;
    if bias.len > 0 {
        v += bias.get(col);
    }
    if p.mm.accumulate != 0 {
        v += c.get(at);
    }
    c.set(at, v);
}

crate::launch_bounds!(matmul_splitk_finish_f32, FINISH_THREADS, 1);
/// Finishes a split product: `C[r][c] = sum over slices s (in order) of ws[s][r][c]`, then plus the
/// bias and (accumulating) the old C, the order of the unsplit epilogue. Grid-stride over chunks of
/// four elements of M x N: one 16-byte access a slice where N is a multiple of 4 and C (and the
/// bias) are aligned as the epilogue's [`chunks_aligned`] asks, element by element otherwise.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn matmul_splitk_finish_f32(
    bias: Slice<f32>,
    c: SliceMut<f32>,
    ws: Slice<f32>,
    p: MatmulTf32,
) {
    let mm = p.mm;
    let (n, splits) = (mm.n as u64, p.splits as u64);
    let total = mm.m as u64 * n;
    let vec4 = n % 4 == 0
        && ws.ptr as u64 % 16 == 0
        && mm.ldc % 4 == 0
        && c.ptr as u64 % 16 == 0
        && (bias.len == 0 || bias.ptr as u64 % 16 == 0);
    let mut q = global_index_x();
    while q < total.div_ceil(4) {
        let i = 4 * q;
        if vec4 {
            // N % 4 == 0: the chunk lies in one row.
            let v = sum_slices::<4>(&ws, i, total, splits);
            store_c4(&p, &bias, &c, (i / n) * mm.ldc, i % n, v);
        } else {
            unroll!(e in [0, 1, 2, 3] {
                let j = i + e as u64;
                if j < total {
                    let [v] = sum_slices::<1>(&ws, j, total, splits);
                    store_c(&p, &bias, &c, (j / n) * mm.ldc, j % n, v);
                }
            });
        }
        q += grid_threads_x();
    }
}

/// `ws[0][i..i + W] + ws[1][i..i + W] + ...` over `splits` slices `total` floats apart, added in
/// slice order (the bits of the sequential sum): `W` 1, any `i`; `W` 4, one 16-byte load a slice
/// (`i % 4 == 0`, a 16-byte aligned workspace whose slices are whole chunks apart). The loads go out
/// four slices at a time ahead of their adds: one load then its add, slice after slice, would wait
/// out a memory latency per slice.
#[inline(always)]
fn sum_slices<const W: usize>(ws: &Slice<f32>, i: u64, total: u64, splits: u64) -> [f32; W] {
    let mut v = [0.0f32; W];
    let mut s = 0u64;
    while s < splits {
        let mut a = [[0.0f32; W]; 4];
        unroll!(e in [0, 1, 2, 3] {
            if s + (e as u64) < splits {
                a[e] = slice_chunk::<W>(ws, (s + e as u64) * total + i);
            }
        });
        unroll!(e in [0, 1, 2, 3] {
            let t = s + e as u64;
            if t < splits {
                // Slice 0 is taken as it is (0.0 + -0.0 would turn its sign).
                for x in 0..W {
                    v[x] = if t == 0 { a[e][x] } else { v[x] + a[e][x] };
                }
            }
        });
        s += 4;
    }
    v
}

/// Elements `at .. at + W` of the workspace: one load (`W` 1), or one 16-byte load (`W` 4, as
/// [`sum_slices`] asks).
#[inline(always)]
fn slice_chunk<const W: usize>(ws: &Slice<f32>, at: u64) -> [f32; W] {
    const { assert!(W == 1 || W == 4) };
    let mut out = [0.0f32; W];
    if W == 4 {
        let q = ws.get4_ro(at);
        for x in 0..W {
            out[x] = q[x];
        }
    } else {
        out[0] = ws.get_ro(at);
    }
    out
}
