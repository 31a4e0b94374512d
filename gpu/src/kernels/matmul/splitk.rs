//! Finishes a product split along the depth (`matmul_tf32` on sm_80, `matmul_wg_tf32` on sm_90):
//! both write their slices' partial tiles to a workspace `[splits][M][N]`, and this kernel adds them
//! in slice order.
use crate::dev::mem::{Slice, SliceMut};
use crate::dev::thread::{global_index_x, grid_threads_x};
use crate::params::MatmulTf32;
use crate::params::matmul_tf32::FINISH_THREADS;

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
        if bias.len > 0 {
            v += bias.get(col);
        }
        let at = row * mm.ldc + col;
        if mm.accumulate != 0 {
            v += c.get(at);
        }
        c.set(at, v);
        i += grid_threads_x();
    }
}
