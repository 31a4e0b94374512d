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
        let at = z * mm.stride_c + row as u64 * mm.ldc + col as u64;
        let mut v = v;
        if bias.len > 0 {
            let b = bias.get4_ro(col as u64);
            unroll!(e in [0, 1, 2, 3] { v[e] += b[e]; });
        }
        if mm.accumulate != 0 {
            let old = c.get4(at);
            unroll!(e in [0, 1, 2, 3] { v[e] += old[e]; });
        }
        c.set4(at, v);
    }
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
/// bias and (accumulating) the old C, the order of the unsplit epilogue. Grid-stride over M x N.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn matmul_splitk_finish_f32(
    bias: Slice<f32>,
    c: SliceMut<f32>,
    ws: Slice<f32>,
    p: MatmulTf32,
) {
    let mm = p.mm;
    let total = mm.m as u64 * mm.n as u64;
    let mut i = global_index_x();
    while i < total {
        let (row, col) = (i / mm.n as u64, i % mm.n as u64);
        let mut v = ws.get(i);
        let mut s = 1u64;
        while s < p.splits as u64 {
            v += ws.get(s * total + i);
            s += 1;
        }
        store_c(&p, &bias, &c, row * mm.ldc, col, v);
        i += grid_threads_x();
    }
}
