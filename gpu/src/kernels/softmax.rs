//! Softmax over the last dimension, forward and backward; one block per row (grid-stride over rows).
//!
//! Rows up to `MAX_CACHED_COLS` are held in registers (`CACHE_PER_THREAD` per thread): read once, written
//! once. Longer rows take two passes: an online (max, sum) pass, then the write pass.
//! Stable: `exp(x - max)`. A row that is all -inf has no defined softmax and yields NaN, as in PyTorch.
use crate::dev::elem::{BF16, Elem, F16};
use crate::dev::mem::{Chunk16, Slice, SliceMut, load_chunk_ro, store_chunk};
use crate::dev::thread::{block_dim_x, block_idx_x, grid_dim_x, thread_idx_x};
use crate::dev::{block, math};
use crate::params::softmax::{CACHE_PER_THREAD, MAX_BLOCK};

const CACHE: usize = CACHE_PER_THREAD as usize;
// The unrolled loops below list the indices 0..16 literally.
const _: () = assert!(CACHE == 16);

/// `$body` for k = 0..CACHE, unrolled (the row caches must stay in registers).
macro_rules! each_cached {
    ($k:ident $body:block) => {
        crate::unroll!($k in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] $body)
    };
}

/// Row softmax with the row in registers. Requires `cols <= block_dim * CACHE` (so indices fit in u32).
///
/// Indices are 32-bit offsets from the row's base pointer: with 64-bit element indices LLVM keeps one
/// 64-bit address per cached element alive across the barriers, which spills under the 128-register
/// bound a 512-thread block imposes.
#[inline(always)]
fn forward_cached<T: Elem>(x: &Slice<T>, y: &SliceMut<T>, base: u64, cols: u64) {
    let (tid, nt, cols) = (thread_idx_x(), block_dim_x(), cols as u32);
    // SAFETY: `base` is the first element of a row inside both buffers (rows * cols elements).
    let (xr, yr) = unsafe { (x.ptr.add(base as usize), y.ptr.add(base as usize)) };
    let mut v = [f32::NEG_INFINITY; CACHE];
    let mut m = f32::NEG_INFINITY;
    each_cached!(k {
        let j = tid + k as u32 * nt;
        if j < cols {
            // SAFETY: j < cols: inside the row.
            v[k] = unsafe { (*xr.add(crate::dev::opaque_u64(j as u64) as usize)).to_f32() };
            m = math::max(m, v[k]);
        }
    });
    let m = block::reduce_max(m);
    let mut s = 0.0f32;
    each_cached!(k {
        if tid + k as u32 * nt < cols {
            v[k] = math::exp(v[k] - m);
            s += v[k];
        }
    });
    let inv = 1.0 / block::reduce_sum(s);
    each_cached!(k {
        let j = tid + k as u32 * nt;
        if j < cols {
            // SAFETY: as above; each element is written by exactly one thread.
            unsafe { *yr.add(crate::dev::opaque_u64(j as u64) as usize) = T::from_f32(v[k] * inv) };
        }
    });
}

/// Row softmax with the row in registers, read and written as 16-byte chunks: for rows whose length is a
/// multiple of a chunk's elements (4 f32, 8 f16/bf16) and buffers with 16-byte aligned bases (the host
/// checks both). Chunk `tid + k * nt` of the row is this thread's k-th; `CACHE` elements a thread, so
/// `CACHE / per_chunk` chunks. Fewer, wider loads and the 64-register bound of two 512-thread blocks per
/// SM (its launch bounds) keep one block's loads in flight while the other reduces (rows of 8192 f32 reached
/// 0.60 of copy bandwidth with one scalar block per SM).
#[inline(always)]
fn forward_vec<T: Elem>(x: &Slice<T>, y: &SliceMut<T>, row: u64, cols: u64) {
    let per_chunk = 16 / core::mem::size_of::<T>();
    let slots = CACHE / per_chunk;
    let (tid, nt) = (thread_idx_x(), block_dim_x());
    let row_chunks = (cols / per_chunk as u64) as u32;
    let first = (row * row_chunks as u64) as usize;
    // SAFETY: the row's chunks `first .. first + row_chunks` lie inside both buffers (rows * cols
    // elements, cols a multiple of per_chunk); the bases are 16-byte aligned (host check).
    let (xc, yc) = unsafe { (x.chunks().add(first), y.chunks().add(first)) };
    // Slots past the row stay -inf: exp(-inf - m) = 0 adds nothing to the sum.
    let mut v = [f32::NEG_INFINITY; CACHE];
    let mut m = f32::NEG_INFINITY;
    crate::unroll!(k in [0, 1, 2, 3] {
        let c = tid + k as u32 * nt;
        if k < slots && c < row_chunks {
            // SAFETY: c < row_chunks: inside the row.
            let ch = unsafe { load_chunk_ro(xc, crate::dev::opaque_u64(c as u64)) };
            crate::unroll!(w in [0, 1, 2, 3] {
                let [lo, hi] = T::unpack_word(ch.0[w]);
                let i = k * per_chunk + w * T::PER_WORD;
                v[i] = lo;
                m = math::max(m, lo);
                if T::PER_WORD == 2 {
                    v[i + 1] = hi;
                    m = math::max(m, hi);
                }
            });
        }
    });
    let m = block::reduce_max(m);
    let mut s = 0.0f32;
    each_cached!(k {
        v[k] = math::exp(v[k] - m);
        s += v[k];
    });
    let inv = 1.0 / block::reduce_sum(s);
    crate::unroll!(k in [0, 1, 2, 3] {
        let c = tid + k as u32 * nt;
        if k < slots && c < row_chunks {
            let mut ch = Chunk16([0; 4]);
            crate::unroll!(w in [0, 1, 2, 3] {
                let i = k * per_chunk + w * T::PER_WORD;
                let hi = if T::PER_WORD == 2 { v[i + 1] * inv } else { 0.0 };
                ch.0[w] = T::pack_word(v[i] * inv, hi);
            });
            // SAFETY: as above; each chunk is written by exactly one thread.
            unsafe { store_chunk(yc, crate::dev::opaque_u64(c as u64), ch) };
        }
    });
}

/// Row softmax for long rows: each thread keeps an online (max, sum of exp) over its elements; the block
/// merges them (rescaling each sum to the block max), then a second pass writes.
#[inline(always)]
fn forward_streaming<T: Elem>(x: &Slice<T>, y: &SliceMut<T>, base: u64, cols: u64) {
    let (tid, nt) = (thread_idx_x() as u64, block_dim_x() as u64);
    let (mut m, mut s) = (f32::NEG_INFINITY, 0.0f32);
    let mut j = tid;
    while j < cols {
        let v = x.get(base + j);
        let m_new = math::max(m, v);
        s = s * math::exp(m - m_new) + math::exp(v - m_new);
        m = m_new;
        j += nt;
    }
    let m_row = block::reduce_max(m);
    // A thread that saw no element has m = -inf and s = 0: its rescaled share must be 0, not NaN.
    let share = if s == 0.0 {
        0.0
    } else {
        s * math::exp(m - m_row)
    };
    let inv = 1.0 / block::reduce_sum(share);
    let mut j = tid;
    while j < cols {
        y.set(base + j, math::exp(x.get(base + j) - m_row) * inv);
        j += nt;
    }
}

/// dx = y * (dy - sum(y * dy)), row in registers.
#[inline(always)]
fn backward_cached<T: Elem>(y: &Slice<T>, dy: &Slice<T>, dx: &SliceMut<T>, base: u64, cols: u64) {
    let (tid, nt, cols) = (thread_idx_x(), block_dim_x(), cols as u32);
    // SAFETY: `base` is the first element of a row inside all three buffers (32-bit row offsets as in
    // `forward_cached`).
    let (yr, gr, dr) = unsafe {
        (
            y.ptr.add(base as usize),
            dy.ptr.add(base as usize),
            dx.ptr.add(base as usize),
        )
    };
    let mut yv = [0.0f32; CACHE];
    let mut gv = [0.0f32; CACHE];
    let mut dot = 0.0f32;
    each_cached!(k {
        let j = tid + k as u32 * nt;
        if j < cols {
            let o = crate::dev::opaque_u64(j as u64) as usize;
            // SAFETY: j < cols: inside the row.
            unsafe {
                yv[k] = (*yr.add(o)).to_f32();
                gv[k] = (*gr.add(o)).to_f32();
            }
            dot += yv[k] * gv[k];
        }
    });
    let dot = block::reduce_sum(dot);
    each_cached!(k {
        let j = tid + k as u32 * nt;
        if j < cols {
            // SAFETY: as above; each element is written by exactly one thread.
            unsafe { *dr.add(crate::dev::opaque_u64(j as u64) as usize) = T::from_f32(yv[k] * (gv[k] - dot)) };
        }
    });
}

#[inline(always)]
fn backward_streaming<T: Elem>(
    y: &Slice<T>,
    dy: &Slice<T>,
    dx: &SliceMut<T>,
    base: u64,
    cols: u64,
) {
    let (tid, nt) = (thread_idx_x() as u64, block_dim_x() as u64);
    let mut dot = 0.0f32;
    let mut j = tid;
    while j < cols {
        dot += y.get(base + j) * dy.get(base + j);
        j += nt;
    }
    let dot = block::reduce_sum(dot);
    let mut j = tid;
    while j < cols {
        dx.set(base + j, y.get(base + j) * (dy.get(base + j) - dot));
        j += nt;
    }
}

/// Whether this launch's block holds a whole row in registers. Uniform across the block, so the
/// barriers inside either path are reached by every thread.
#[inline(always)]
fn cached(cols: u64) -> bool {
    cols <= block_dim_x() as u64 * CACHE as u64
}

#[inline(always)]
unsafe fn forward<T: Elem>(x: Slice<T>, y: SliceMut<T>, rows: u64, cols: u64) {
    let mut r = block_idx_x() as u64;
    while r < rows {
        if cached(cols) {
            forward_cached(&x, &y, r * cols, cols)
        } else {
            forward_streaming(&x, &y, r * cols, cols)
        }
        r += grid_dim_x() as u64;
    }
}

/// The vector path (`forward_vec`) over rows, grid-stride. The host launches it only for rows of at most
/// `block_dim * CACHE` elements, a multiple of a chunk, with 16-byte aligned bases.
#[inline(always)]
unsafe fn forward_vectorised<T: Elem>(x: Slice<T>, y: SliceMut<T>, rows: u64, cols: u64) {
    let mut r = block_idx_x() as u64;
    while r < rows {
        forward_vec(&x, &y, r, cols);
        r += grid_dim_x() as u64;
    }
}

#[inline(always)]
unsafe fn backward<T: Elem>(y: Slice<T>, dy: Slice<T>, dx: SliceMut<T>, rows: u64, cols: u64) {
    let mut r = block_idx_x() as u64;
    while r < rows {
        if cached(cols) {
            backward_cached(&y, &dy, &dx, r * cols, cols)
        } else {
            backward_streaming(&y, &dy, &dx, r * cols, cols)
        }
        r += grid_dim_x() as u64;
    }
}

macro_rules! softmax_entry_points {
    ($($fwd:ident, $vec:ident, $bwd:ident, $t:ty;)*) => {$(
        // Without a bound the JIT may use more registers than a 512-thread block allows (the launch
        // fails with CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES); with it, ptxas fits the row caches into 128.
        // The vector forward holds 16 values a thread in 64 registers: two 512-thread blocks per SM
        // overlap one block's loads with the other's reductions.
        crate::launch_bounds!($fwd, MAX_BLOCK, 1);
        crate::launch_bounds!($vec, MAX_BLOCK, 2);
        crate::launch_bounds!($bwd, MAX_BLOCK, 1);
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $fwd(x: Slice<$t>, y: SliceMut<$t>, rows: u64, cols: u64) {
            unsafe { forward(x, y, rows, cols) }
        }
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $vec(x: Slice<$t>, y: SliceMut<$t>, rows: u64, cols: u64) {
            unsafe { forward_vectorised(x, y, rows, cols) }
        }
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $bwd(y: Slice<$t>, dy: Slice<$t>, dx: SliceMut<$t>, rows: u64, cols: u64) {
            unsafe { backward(y, dy, dx, rows, cols) }
        }
    )*};
}

softmax_entry_points! {
    softmax_f32, softmax_vec_f32, softmax_backward_f32, f32;
    softmax_f16, softmax_vec_f16, softmax_backward_f16, F16;
    softmax_bf16, softmax_vec_bf16, softmax_backward_bf16, BF16;
}
