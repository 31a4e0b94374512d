//! Embedding: gather rows of a `[vocab, cols]` table by u32 ids, an id check for device-resident ids,
//! and the backward as a deterministic scatter-add.
//!
//! - `embedding_{dtype}`: one warp per output row (grid-stride); the row is copied as 16-byte chunks
//!   (four in flight per lane) when a row is a whole number of chunks and both buffers are 16-byte
//!   aligned, element by element otherwise. An id `>= vocab` never addresses the table: the row is
//!   zero-filled. The host never launches with such an id (it validates host ids itself and runs
//!   `embedding_check_ids_u32` on device ids first), so this is a second line of defence, not the report.
//! - `embedding_check_ids_u32`: counts ids `>= vocab` into `count[0]` (integer atomics: exact and
//!   order-free); the host reads the count back before it launches the gather.
//! - `embedding_backward_{dtype}`: one block per row `v` of dW. The host groups the positions of each id
//!   (counting sort, stable): `order[offsets[v] .. offsets[v + 1]]` are the rows of dy whose id is `v`,
//!   in increasing order. Each thread sums its columns over that list in that order, so every element of
//!   dW is one thread's fixed-order sum: the same bits on every run, no float atomics. Rows of dW no id
//!   names are written as zeros.
use crate::dev::elem::{BF16, Elem, F16};
use crate::dev::mem::{Chunk16, Slice, SliceMut, load_chunk_ro, store_chunk};
use crate::dev::thread::{
    block_dim_x, block_idx_x, global_index_x, grid_dim_x, grid_threads_x, lane_id, thread_idx_x,
    warp_id,
};
use crate::params::embedding::BWD_CACHE;

const CACHE: usize = BWD_CACHE as usize;
const _: () = assert!(CACHE == 8);

/// Copies `chunks` 16-byte chunks from `src` to `dst`, lane `lane` of a warp taking every 32nd.
///
/// # Safety
/// Both ranges are `chunks` whole chunks inside their buffers; `src` is not written during the kernel.
#[inline(always)]
unsafe fn copy_chunks(src: *const Chunk16, dst: *mut Chunk16, chunks: u64, lane: u64) {
    let mut c = lane;
    while c + 3 * 32 < chunks {
        // SAFETY: c + 96 < chunks: all four chunks lie inside both rows.
        unsafe {
            let v = [
                load_chunk_ro(src, c),
                load_chunk_ro(src, c + 32),
                load_chunk_ro(src, c + 64),
                load_chunk_ro(src, c + 96),
            ];
            crate::unroll!(k in [0, 1, 2, 3] {
                store_chunk(dst, c + 32 * k as u64, v[k]);
            });
        }
        c += 128;
    }
    while c < chunks {
        // SAFETY: c < chunks.
        unsafe { store_chunk(dst, c, load_chunk_ro(src, c)) };
        c += 32;
    }
}

#[inline(always)]
unsafe fn gather<T: Elem>(
    table: Slice<T>,
    ids: Slice<u32>,
    out: SliceMut<T>,
    vocab: u64,
    cols: u64,
) {
    let row_bytes = cols * core::mem::size_of::<T>() as u64;
    let vector = row_bytes % 16 == 0 && table.ptr as u64 % 16 == 0 && out.ptr as u64 % 16 == 0;
    let warps = (block_dim_x() / 32) as u64;
    let lane = lane_id() as u64;
    let mut row = block_idx_x() as u64 * warps + warp_id() as u64;
    let stride = grid_dim_x() as u64 * warps;
    while row < ids.len {
        crate::dev::shared::check_index(row as usize, ids.len as usize);
        // SAFETY: row < ids.len.
        let id = unsafe { *ids.ptr.add(row as usize) } as u64;
        // SAFETY: row < ids.len and out holds ids.len * cols elements.
        let dst = unsafe { out.ptr.add((row * cols) as usize) };
        if id < vocab {
            // SAFETY: id < vocab: a row of the table.
            let src = unsafe { table.ptr.add((id * cols) as usize) };
            if vector {
                // SAFETY: both rows are 16-byte aligned (aligned bases, row bytes a multiple of 16) and
                // hold row_bytes / 16 whole chunks; the table is only read.
                unsafe {
                    copy_chunks(
                        src as *const Chunk16,
                        dst as *mut Chunk16,
                        row_bytes / 16,
                        lane,
                    )
                };
            } else {
                let mut j = lane;
                while j < cols {
                    // SAFETY: j < cols: inside both rows.
                    unsafe { *dst.add(j as usize) = *src.add(j as usize) };
                    j += 32;
                }
            }
        } else {
            let mut j = lane;
            while j < cols {
                // SAFETY: j < cols: inside the output row.
                unsafe { *dst.add(j as usize) = T::from_f32(0.0) };
                j += 32;
            }
        }
        row += stride;
    }
}

#[inline(always)]
unsafe fn check_ids(ids: Slice<u32>, vocab: u64, count: SliceMut<u32>) {
    let mut bad = 0u32;
    let mut i = global_index_x();
    while i < ids.len {
        crate::dev::shared::check_index(i as usize, ids.len as usize);
        // SAFETY: i < ids.len.
        if unsafe { *ids.ptr.add(i as usize) } as u64 >= vocab {
            bad += 1;
        }
        i += grid_threads_x();
    }
    if bad > 0 {
        // SAFETY: count holds at least one u32 (the launcher allocates it).
        unsafe { crate::dev::atomic::add_u32(count.ptr, bad) };
    }
}

/// `$body` for m = 0..CACHE, unrolled.
macro_rules! each_cached {
    ($m:ident $body:block) => {
        crate::unroll!($m in [0, 1, 2, 3, 4, 5, 6, 7] $body)
    };
}

#[inline(always)]
unsafe fn scatter_add<T: Elem>(
    order: Slice<u32>,
    offsets: Slice<u32>,
    dy: Slice<T>,
    dw: SliceMut<T>,
    vocab: u64,
    cols: u64,
) {
    let (tid, nt) = (thread_idx_x() as u64, block_dim_x() as u64);
    let mut v = block_idx_x() as u64;
    while v < vocab {
        crate::dev::shared::check_index(v as usize + 1, offsets.len as usize);
        // SAFETY: offsets holds vocab + 1 entries.
        let (k0, k1) = unsafe {
            (
                *offsets.ptr.add(v as usize),
                *offsets.ptr.add(v as usize + 1),
            )
        };
        let mut c0 = 0u64;
        while c0 < cols {
            // f64 sums: one id can own hundreds of thousands of rows of dy (a sequential f32 sum of
            // 812,468 terms was 1.7e-5 off the exact sum, measured); the order stays fixed.
            let mut acc = [0.0f64; CACHE];
            let mut k = k0 as u64;
            while k < k1 as u64 {
                crate::dev::shared::check_index(k as usize, order.len as usize);
                // SAFETY: offsets[vocab] == order.len (the host builds both), so k < order.len.
                let p = unsafe { *order.ptr.add(k as usize) } as u64;
                let base = p * cols + c0;
                each_cached!(m {
                    let j = tid + m as u64 * nt;
                    if c0 + j < cols {
                        acc[m] += dy.get(base + j) as f64;
                    }
                });
                k += 1;
            }
            each_cached!(m {
                let j = tid + m as u64 * nt;
                if c0 + j < cols {
                    dw.set(v * cols + c0 + j, acc[m] as f32);
                }
            });
            c0 += nt * CACHE as u64;
        }
        v += grid_dim_x() as u64;
    }
}

macro_rules! embedding_entry_points {
    ($($fwd:ident, $bwd:ident, $t:ty;)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $fwd(
            table: Slice<$t>, ids: Slice<u32>, out: SliceMut<$t>, vocab: u64, cols: u64,
        ) {
            unsafe { gather(table, ids, out, vocab, cols) }
        }
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $bwd(
            order: Slice<u32>, offsets: Slice<u32>, dy: Slice<$t>, dw: SliceMut<$t>, vocab: u64,
            cols: u64,
        ) {
            unsafe { scatter_add(order, offsets, dy, dw, vocab, cols) }
        }
    )*};
}

embedding_entry_points! {
    embedding_f32, embedding_backward_f32, f32;
    embedding_f16, embedding_backward_f16, F16;
    embedding_bf16, embedding_backward_bf16, BF16;
}

#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn embedding_check_ids_u32(
    ids: Slice<u32>,
    vocab: u64,
    count: SliceMut<u32>,
) {
    unsafe { check_ids(ids, vocab, count) }
}
