//! Reductions: sum / mean / max over the last dimension (one block per row) and over all elements (two
//! stages: a fixed number of blocks each reduce one contiguous range into a partial, then one block
//! reduces the partials). Ranges and combination order depend only on the sizes: the same bits every run.
use crate::dev::elem::{BF16, Elem, F16};
use crate::dev::mem::{Chunk16, Slice, SliceMut, load_chunk_ro};
use crate::dev::thread::{block_dim_x, block_idx_x, grid_dim_x, thread_idx_x};
use crate::dev::{block, math};

const SUM: u32 = 0;
const MEAN: u32 = 1;
const MAX: u32 = 2;

#[inline(always)]
fn identity<const MODE: u32>() -> f32 {
    if MODE == MAX { f32::NEG_INFINITY } else { 0.0 }
}

#[inline(always)]
fn fold<const MODE: u32>(acc: f32, v: f32) -> f32 {
    if MODE == MAX {
        math::max(acc, v)
    } else {
        acc + v
    }
}

#[inline(always)]
fn fold_chunk<T: Elem, const MODE: u32>(acc: f32, c: Chunk16) -> f32 {
    let mut a = acc;
    crate::unroll!(k in [0, 1, 2, 3] {
        a = T::fold_word(c.0[k], a, fold::<MODE>);
    });
    a
}

/// This thread's share of `x[start .. start+len)`, folded: the unaligned head and tail element by element,
/// the 16-byte aligned body four chunks per trip (64 bytes in flight per thread).
#[inline(always)]
fn fold_range<T: Elem, const MODE: u32>(x: &Slice<T>, start: u64, len: u64) -> f32 {
    let size = core::mem::size_of::<T>() as u64;
    let per_chunk = 16 / size;
    let (tid, nt) = (thread_idx_x() as u64, block_dim_x() as u64);
    let first_addr = x.ptr as u64 + start * size;
    let head = (((16 - first_addr % 16) % 16) / size).min(len);
    let body_chunks = (len - head) / per_chunk;
    let tail_start = head + body_chunks * per_chunk;

    let mut acc = [identity::<MODE>(); 4];
    let mut i = tid;
    while i < head {
        acc[0] = fold::<MODE>(acc[0], x.get(start + i));
        i += nt;
    }
    let mut i = tail_start + tid;
    while i < len {
        acc[1] = fold::<MODE>(acc[1], x.get(start + i));
        i += nt;
    }
    // SAFETY: `start + head` is inside the buffer and 16-byte aligned by the choice of `head`.
    let body = unsafe { x.ptr.add((start + head) as usize) } as *const Chunk16;
    let mut c = tid;
    while c + 3 * nt < body_chunks {
        // SAFETY: c + 3 nt < body_chunks: all four chunks lie inside the range.
        let v = unsafe {
            [
                load_chunk_ro(body, c),
                load_chunk_ro(body, c + nt),
                load_chunk_ro(body, c + 2 * nt),
                load_chunk_ro(body, c + 3 * nt),
            ]
        };
        crate::unroll!(k in [0, 1, 2, 3] {
            acc[k] = fold_chunk::<T, MODE>(acc[k], v[k]);
        });
        c += 4 * nt;
    }
    while c < body_chunks {
        // SAFETY: c < body_chunks.
        acc[2] = fold_chunk::<T, MODE>(acc[2], unsafe { load_chunk_ro(body, c) });
        c += nt;
    }
    fold::<MODE>(fold::<MODE>(acc[0], acc[1]), fold::<MODE>(acc[2], acc[3]))
}

#[inline(always)]
fn block_fold<const MODE: u32>(v: f32) -> f32 {
    if MODE == MAX {
        block::reduce_max(v)
    } else {
        block::reduce_sum(v)
    }
}

/// One block per row (grid-stride over rows): `out[r] = reduce(x[r, :])`.
#[inline(always)]
unsafe fn rows<T: Elem, const MODE: u32>(x: Slice<T>, out: SliceMut<T>, rows: u64, cols: u64) {
    let mut r = block_idx_x() as u64;
    while r < rows {
        let v = block_fold::<MODE>(fold_range::<T, MODE>(&x, r * cols, cols));
        if thread_idx_x() == 0 {
            out.set(
                r,
                if MODE == MEAN {
                    (v as f64 / cols as f64) as f32
                } else {
                    v
                },
            );
        }
        r += grid_dim_x() as u64;
    }
}

/// Stage 1 of a full reduction: block b folds its range into `partials[b]` (f32).
#[inline(always)]
unsafe fn all_partials<T: Elem, const MODE: u32>(x: Slice<T>, partials: SliceMut<f32>) {
    let blocks = grid_dim_x() as u64;
    let per_block = x.len.div_ceil(blocks);
    let b = block_idx_x() as u64;
    let start = (b * per_block).min(x.len);
    let len = per_block.min(x.len - start);
    let v = block_fold::<MODE>(fold_range::<T, MODE>(&x, start, len));
    if thread_idx_x() == 0 {
        partials.set(b, v);
    }
}

/// Stage 2: one block folds the partials; `numel` is the original element count (for the mean).
#[inline(always)]
unsafe fn all_finish<T: Elem, const MODE: u32>(partials: Slice<f32>, out: SliceMut<T>, numel: u64) {
    let v = block_fold::<MODE>(fold_range::<f32, MODE>(&partials, 0, partials.len));
    if thread_idx_x() == 0 {
        out.set(
            0,
            if MODE == MEAN {
                (v as f64 / numel as f64) as f32
            } else {
                v
            },
        );
    }
}

macro_rules! reduce_entry_points {
    ($($rows:ident, $partials:ident, $finish:ident, $t:ty, $mode:expr;)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $rows(x: Slice<$t>, out: SliceMut<$t>, nrows: u64, cols: u64) {
            unsafe { rows::<$t, { $mode }>(x, out, nrows, cols) }
        }
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $partials(x: Slice<$t>, partials: SliceMut<f32>) {
            unsafe { all_partials::<$t, { $mode }>(x, partials) }
        }
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $finish(partials: Slice<f32>, out: SliceMut<$t>, numel: u64) {
            unsafe { all_finish::<$t, { $mode }>(partials, out, numel) }
        }
    )*};
}

reduce_entry_points! {
    sum_rows_f32, sum_partials_f32, sum_finish_f32, f32, SUM;
    mean_rows_f32, mean_partials_f32, mean_finish_f32, f32, MEAN;
    max_rows_f32, max_partials_f32, max_finish_f32, f32, MAX;
    sum_rows_f16, sum_partials_f16, sum_finish_f16, F16, SUM;
    mean_rows_f16, mean_partials_f16, mean_finish_f16, F16, MEAN;
    max_rows_f16, max_partials_f16, max_finish_f16, F16, MAX;
    sum_rows_bf16, sum_partials_bf16, sum_finish_bf16, BF16, SUM;
    mean_rows_bf16, mean_partials_bf16, mean_finish_bf16, BF16, MEAN;
    max_rows_bf16, max_partials_bf16, max_finish_bf16, BF16, MAX;
}
