//! Layer norm over the last dimension, forward and backward; one block per row (forward: grid-stride
//! over rows; backward: one block per chunk of rows).
//!
//! Forward: `y = (x - mean) * rstd * gamma + beta`, `rstd = 1 / sqrt(var + eps)` (biased variance), f32
//! math for every storage type; `mean` and `rstd` are written per row in f32 for the backward.
//! Rows up to `MAX_CACHED_COLS` are held in registers (`CACHE_PER_THREAD` per thread): read once,
//! written once, and the variance is the exact two-pass `mean((x - mean)^2)` over the registers.
//! Longer rows read x twice: one pass of sums shifted by the row's first element, then the write pass.
//!
//! Backward, with `xhat = (x - mean) * rstd` and `g = dy * gamma`:
//! `dx = rstd * (g - mean(g) - xhat * mean(g * xhat))`, `dgamma = sum_rows dy * xhat`,
//! `dbeta = sum_rows dy`. Block `b` takes rows `[b * rows_per_chunk, ...)` and folds their dgamma/dbeta
//! into partial row `b` (a thread owns the same columns on every row: registers on the cached path, its
//! own elements of the partial row otherwise); `param_grads` then adds the partial rows in chunk order.
//! No float atomics: the same bits on every run.
use crate::dev::copy::{cp_async_16, cp_async_commit, cp_async_wait};
use crate::dev::elem::{BF16, Elem, F16};
use crate::dev::mem::{Chunk16, Slice, SliceMut, load_chunk_ro, store_chunk};
use crate::dev::shared::{SharedScalar, dynamic_base, ld_shared_v4, st_shared_v4};
use crate::dev::sync::sync_threads;
use crate::dev::thread::{block_dim_x, block_idx_x, grid_dim_x, lane_id, thread_idx_x, warp_id};
use crate::dev::{block, math, opaque_u32, opaque_u64, warp};
use crate::params::layer_norm::{
    CACHE_PER_THREAD, FINISH_COLS, FINISH_WARPS, MAX_BLOCK, NARROW_PER_THREAD, PIPE_MAX_BLOCK,
    PIPE_STAGES, WARP_LANE_ELEMS, WARP_MAX_WARPS,
};

const CACHE: usize = CACHE_PER_THREAD as usize;
const NARROW: usize = NARROW_PER_THREAD as usize;

/// Whether this launch's block holds a whole row in registers. Uniform across the block, so the
/// barriers inside either path are reached by every thread.
#[inline(always)]
fn cached<const N: usize>(cols: u64) -> bool {
    cols <= block_dim_x() as u64 * N as u64
}

/// The row's inputs and outputs of the forward.
struct Fwd<T> {
    x: Slice<T>,
    gamma: Slice<T>,
    beta: Slice<T>,
    y: SliceMut<T>,
    mean: SliceMut<f32>,
    rstd: SliceMut<f32>,
    cols: u64,
    eps: f32,
}

/// One row in registers. 32-bit offsets from the row base behind `opaque_u64` (see softmax.rs: with
/// 64-bit element indices LLVM keeps one address per cached element alive across the barriers).
#[inline(always)]
fn forward_cached<T: Elem, const N: usize>(a: &Fwd<T>, r: u64) {
    let (tid, nt, n) = (thread_idx_x(), block_dim_x(), a.cols as u32);
    let base = r * a.cols;
    // SAFETY: `base` is the first element of a row inside x and y (rows * cols elements).
    let (xr, yr) = unsafe { (a.x.ptr.add(base as usize), a.y.ptr.add(base as usize)) };
    let mut v = [0.0f32; N];
    let mut s = 0.0f32;
    crate::unroll_lt!(k < N, {
        let j = tid + k as u32 * nt;
        if j < n {
            // SAFETY: j < cols: inside the row.
            v[k] = unsafe { (*xr.add(opaque_u64(j as u64) as usize)).to_f32() };
            s += v[k];
        }
    });
    let mean = block::reduce_sum(s) / a.cols as f32;
    let mut q = 0.0f32;
    crate::unroll_lt!(k < N, {
        if tid + k as u32 * nt < n {
            v[k] -= mean;
            q += v[k] * v[k];
        }
    });
    let rstd = 1.0 / math::sqrt(block::reduce_sum(q) / a.cols as f32 + a.eps);
    crate::unroll_lt!(k < N, {
        let j = tid + k as u32 * nt;
        if j < n {
            let o = opaque_u64(j as u64);
            let out = math::fma(v[k] * rstd, a.gamma.get(o), a.beta.get(o));
            // SAFETY: as above; each element is written by exactly one thread.
            unsafe { *yr.add(o as usize) = T::from_f32(out) };
        }
    });
    if tid == 0 {
        a.mean.set(r, mean);
        a.rstd.set(r, rstd);
    }
}

/// One row in registers, read and written as 16-byte chunks (x, y, gamma and beta): for rows of whole
/// chunks with 16-byte aligned bases (the host checks). Chunk `tid + k * nt` of the row is this thread's
/// k-th, `CACHE` elements a thread. The scalar kernel put 64 threads with 16 scalar loads each on a row
/// of 1024 and reached 0.81 of copy bandwidth; wide loads at 40-odd registers let more blocks per SM
/// keep loads in flight across the two block reductions.
#[inline(always)]
fn forward_vec<T: Elem>(a: &Fwd<T>, r: u64) {
    let per_chunk = 16 / core::mem::size_of::<T>();
    let slots = CACHE / per_chunk;
    let (tid, nt) = (thread_idx_x(), block_dim_x());
    let row_chunks = (a.cols / per_chunk as u64) as u32;
    let first = (r * row_chunks as u64) as usize;
    // SAFETY: the row's chunks `first .. first + row_chunks` lie inside x and y (rows * cols elements,
    // cols a multiple of per_chunk); bases are 16-byte aligned (host check).
    let (xc, yc) = unsafe { (a.x.chunks().add(first), a.y.chunks().add(first)) };
    let mut v = [0.0f32; CACHE];
    let mut s = 0.0f32;
    crate::unroll!(k in [0, 1, 2, 3] {
        let c = tid + k as u32 * nt;
        if k < slots && c < row_chunks {
            // SAFETY: c < row_chunks: inside the row.
            let ch = unsafe { load_chunk_ro(xc, opaque_u64(c as u64)) };
            crate::unroll!(w in [0, 1, 2, 3] {
                let [lo, hi] = T::unpack_word(ch.0[w]);
                let i = k * per_chunk + w * T::PER_WORD;
                v[i] = lo;
                s += lo;
                if T::PER_WORD == 2 {
                    v[i + 1] = hi;
                    s += hi;
                }
            });
        }
    });
    let mean = block::reduce_sum(s) / a.cols as f32;
    // Centre only the elements this thread holds (the rest stay 0 and add nothing to the variance).
    let mut q = 0.0f32;
    crate::unroll!(k in [0, 1, 2, 3] {
        if k < slots && tid + k as u32 * nt < row_chunks {
            crate::unroll!(e in [0, 1, 2, 3, 4, 5, 6, 7] {
                if e < per_chunk {
                    let i = k * per_chunk + e;
                    v[i] -= mean;
                    q += v[i] * v[i];
                }
            });
        }
    });
    let rstd = 1.0 / math::sqrt(block::reduce_sum(q) / a.cols as f32 + a.eps);
    crate::unroll!(k in [0, 1, 2, 3] {
        let c = tid + k as u32 * nt;
        if k < slots && c < row_chunks {
            let o = opaque_u64(c as u64);
            // SAFETY: c < row_chunks: inside gamma and beta (cols elements, aligned: host check).
            let (gc, bc) = unsafe { (load_chunk_ro(a.gamma.chunks(), o), load_chunk_ro(a.beta.chunks(), o)) };
            let mut ch = Chunk16([0; 4]);
            crate::unroll!(w in [0, 1, 2, 3] {
                let i = k * per_chunk + w * T::PER_WORD;
                let [g0, g1] = T::unpack_word(gc.0[w]);
                let [b0, b1] = T::unpack_word(bc.0[w]);
                let hi = if T::PER_WORD == 2 { math::fma(v[i + 1] * rstd, g1, b1) } else { 0.0 };
                ch.0[w] = T::pack_word(math::fma(v[i] * rstd, g0, b0), hi);
            });
            // SAFETY: as above; each chunk is written by exactly one thread.
            unsafe { store_chunk(yc, o, ch) };
        }
    });
    if tid == 0 {
        a.mean.set(r, mean);
        a.rstd.set(r, rstd);
    }
}

/// The vector forward over rows, grid-stride (see `forward_vec` for when the host launches it).
#[inline(always)]
unsafe fn forward_vectorised<T: Elem>(a: Fwd<T>, rows: u64) {
    let mut r = block_idx_x() as u64;
    while r < rows {
        forward_vec(&a, r);
        r += grid_dim_x() as u64;
    }
}

/// A row longer than the register cache: sums of `x - x[0]` and of its square (the shift keeps the
/// one-pass variance free of cancellation for rows with a large mean), then the write pass.
#[inline(always)]
fn forward_streaming<T: Elem>(a: &Fwd<T>, r: u64) {
    let (tid, nt) = (thread_idx_x() as u64, block_dim_x() as u64);
    let base = r * a.cols;
    let shift = a.x.get(base);
    let (mut s1, mut s2) = (0.0f32, 0.0f32);
    let mut j = tid;
    while j < a.cols {
        let d = a.x.get(base + j) - shift;
        s1 += d;
        s2 += d * d;
        j += nt;
    }
    let [t1, t2, _, _] = block::reduce_sum4([s1, s2, 0.0, 0.0]);
    let m1 = t1 / a.cols as f32;
    let mean = shift + m1;
    let var = math::max(t2 / a.cols as f32 - m1 * m1, 0.0);
    let rstd = 1.0 / math::sqrt(var + a.eps);
    let mut j = tid;
    while j < a.cols {
        let xh = (a.x.get(base + j) - mean) * rstd;
        a.y.set(base + j, math::fma(xh, a.gamma.get(j), a.beta.get(j)));
        j += nt;
    }
    if tid == 0 {
        a.mean.set(r, mean);
        a.rstd.set(r, rstd);
    }
}

#[inline(always)]
unsafe fn forward<T: Elem, const N: usize>(a: Fwd<T>, rows: u64) {
    let mut r = block_idx_x() as u64;
    while r < rows {
        if cached::<N>(a.cols) {
            forward_cached::<T, N>(&a, r)
        } else {
            forward_streaming(&a, r)
        }
        r += grid_dim_x() as u64;
    }
}

/// The inputs and outputs of the backward.
struct Bwd<T> {
    x: Slice<T>,
    gamma: Slice<T>,
    mean: Slice<f32>,
    rstd: Slice<f32>,
    dy: Slice<T>,
    dx: SliceMut<T>,
    /// `[2][chunks][cols]`: dgamma partial rows, then dbeta partial rows.
    partials: SliceMut<f32>,
    rows: u64,
    cols: u64,
}

/// Rows `[r0, r1)` in registers, `N` elements a thread; this thread's dgamma/dbeta columns accumulate in
/// registers over the chunk and are written once, to partial row `chunk`. The next row's x and dy are
/// loaded before this row's block reduction, so their latency hides behind its barriers (one row in
/// flight per block was latency bound: 0.30 of copy bandwidth at 65536 x 1024).
#[inline(always)]
fn backward_cached<T: Elem, const N: usize>(a: &Bwd<T>, chunk: u64, r0: u64, r1: u64) {
    let (tid, nt, n) = (thread_idx_x(), block_dim_x(), a.cols as u32);
    let inv_cols = 1.0 / a.cols as f32;
    let mut dg = [0.0f32; N];
    let mut db = [0.0f32; N];
    let mut gam = [0.0f32; N];
    // This thread's x and dy of row `$r` into `$xv`, `$dyv` (a macro, not a closure: a closure taking
    // the arrays by reference puts them in local memory).
    macro_rules! load_row {
        ($r:expr, $xv:ident, $dyv:ident) => {{
            let base = $r * a.cols;
            // SAFETY: `base` is the first element of a row inside x and dy (r < rows).
            let (xr, gr) = unsafe { (a.x.ptr.add(base as usize), a.dy.ptr.add(base as usize)) };
            crate::unroll_lt!(k < N, {
                let j = tid + k as u32 * nt;
                if j < n {
                    let o = opaque_u64(j as u64) as usize;
                    // SAFETY: j < cols: inside the row.
                    unsafe {
                        $xv[k] = (*xr.add(o)).to_f32();
                        $dyv[k] = (*gr.add(o)).to_f32();
                    }
                }
            });
        }};
    }
    // Registers allow gamma and the next row in flight for narrow rows only (the 16-element kernel
    // would need 7 x 16 values: it spilled); it loads the row at the top of each trip and gamma per use.
    let prefetch = N <= 8;
    if prefetch {
        crate::unroll_lt!(k < N, {
            let j = tid + k as u32 * nt;
            if j < n {
                gam[k] = a.gamma.get(j as u64);
            }
        });
    }
    let (mut xv, mut dyv) = ([0.0f32; N], [0.0f32; N]);
    if prefetch && r0 < r1 {
        load_row!(r0, xv, dyv);
    }
    let mut r = r0;
    while r < r1 {
        let (m, rs) = (a.mean.get(r), a.rstd.get(r));
        let mut xh = [0.0f32; N];
        let mut g = [0.0f32; N];
        let (mut s1, mut s2) = (0.0f32, 0.0f32);
        // SAFETY: `r * cols` is the first element of a row inside x and dy.
        let (xr, gr) = unsafe {
            (
                a.x.ptr.add((r * a.cols) as usize),
                a.dy.ptr.add((r * a.cols) as usize),
            )
        };
        crate::unroll_lt!(k < N, {
            let j = tid + k as u32 * nt;
            if j < n {
                let (x, dy, gamma) = if prefetch {
                    (xv[k], dyv[k], gam[k])
                } else {
                    let o = opaque_u64(j as u64);
                    // SAFETY: j < cols: inside the row.
                    unsafe {
                        (
                            (*xr.add(o as usize)).to_f32(),
                            (*gr.add(o as usize)).to_f32(),
                            a.gamma.get(o),
                        )
                    }
                };
                xh[k] = (x - m) * rs;
                g[k] = dy * gamma;
                s1 += g[k];
                s2 += g[k] * xh[k];
                dg[k] += dy * xh[k];
                db[k] += dy;
            }
        });
        if prefetch && r + 1 < r1 {
            load_row!(r + 1, xv, dyv);
        }
        let [t1, t2, _, _] = block::reduce_sum4([s1, s2, 0.0, 0.0]);
        let (mg, mgx) = (t1 * inv_cols, t2 * inv_cols);
        // SAFETY: `r * cols` is the first element of a row inside dx.
        let dr = unsafe { a.dx.ptr.add((r * a.cols) as usize) };
        crate::unroll_lt!(k < N, {
            let j = tid + k as u32 * nt;
            if j < n {
                let out = rs * (g[k] - mg - xh[k] * mgx);
                // SAFETY: as above; each element is written by exactly one thread.
                unsafe { *dr.add(opaque_u64(j as u64) as usize) = T::from_f32(out) };
            }
        });
        r += 1;
    }
    let chunks = grid_dim_x() as u64;
    crate::unroll_lt!(k < N, {
        let j = tid + k as u32 * nt;
        if j < n {
            a.partials.set(chunk * a.cols + j as u64, dg[k]);
            a.partials.set((chunks + chunk) * a.cols + j as u64, db[k]);
        }
    });
}

/// Rows `[r0, r1)` of whole 16-byte chunks, thread `tid` owning chunk `tid` of every row (`per_chunk`
/// consecutive elements), x and dy arriving through a `PIPE_STAGES`-deep `cp.async` pipeline in dynamic
/// shared memory: rows `r + 1 .. r + PIPE_STAGES - 1` are in flight while row `r` is reduced, at no
/// register cost (the register-prefetching kernel kept one row ahead and reached 0.56 of copy
/// bandwidth). A thread reads back only the slots it copied itself, so its own `cp.async.wait_group`
/// orders them; no barrier guards the stages (the block reductions have their own).
/// Slot layout: stage s, operand o (0 = x, 1 = dy), thread t at `((s * 2 + o) * nt + t) * 16` bytes.
#[inline(always)]
fn backward_pipe<T: Elem>(a: &Bwd<T>, chunk: u64, r0: u64, r1: u64) {
    const S: u32 = PIPE_STAGES;
    let per_chunk = 16 / core::mem::size_of::<T>();
    let (tid, nt) = (thread_idx_x(), block_dim_x());
    let row_chunks = (a.cols / per_chunk as u64) as u32;
    let mine = tid < row_chunks;
    let inv_cols = 1.0 / a.cols as f32;
    let base = dynamic_base();
    let slot = |stage: u32, operand: u32| base + ((stage * 2 + operand) * nt + tid) * 16;
    // Starts the copies of row `r` into `stage` (none past the chunk's rows or the row's chunks) and
    // closes a group either way, so every trip waits on the same group count.
    let issue = |r: u64, stage: u32| {
        if r < r1 && mine {
            let c = (r * row_chunks as u64 + tid as u64) as usize;
            // SAFETY: r < rows and tid < row_chunks: chunk c lies inside x and dy (16-byte aligned
            // bases: host check); the slots are this thread's, read only after its wait below.
            unsafe {
                cp_async_16(slot(stage, 0), a.x.chunks().add(c) as *const u8, true);
                cp_async_16(slot(stage, 1), a.dy.chunks().add(c) as *const u8, true);
            }
        }
        cp_async_commit();
    };
    crate::unroll!(s in [0, 1, 2, 3] {
        if (s as u32) + 1 < S {
            issue(r0 + s as u64, s as u32);
        }
    });
    let mut gam = [0.0f32; 8];
    let (mut dg, mut db) = ([0.0f32; 8], [0.0f32; 8]);
    if mine {
        // SAFETY: tid < row_chunks: a chunk of gamma (cols elements, aligned: host check).
        let gc = unsafe { load_chunk_ro(a.gamma.chunks(), tid as u64) };
        crate::unroll!(w in [0, 1, 2, 3] {
            let [lo, hi] = T::unpack_word(gc.0[w]);
            gam[w * T::PER_WORD] = lo;
            if T::PER_WORD == 2 {
                gam[w * 2 + 1] = hi;
            }
        });
    }
    let (mut r, mut stage) = (r0, 0u32);
    while r < r1 {
        issue(r + S as u64 - 1, (stage + S - 1) % S);
        cp_async_wait::<{ PIPE_STAGES - 1 }>();
        let (m, rs) = (a.mean.get(r), a.rstd.get(r));
        let (mut xh, mut g) = ([0.0f32; 8], [0.0f32; 8]);
        let (mut s1, mut s2) = (0.0f32, 0.0f32);
        if mine {
            // SAFETY: this thread's slots of `stage`, filled by its own copies, which the wait above
            // completed.
            let (xw, dw) = unsafe { (ld_shared_v4(slot(stage, 0)), ld_shared_v4(slot(stage, 1))) };
            crate::unroll!(w in [0, 1, 2, 3] {
                let xs = T::unpack_word(xw[w]);
                let ds = T::unpack_word(dw[w]);
                crate::unroll!(h in [0, 1] {
                    if h < T::PER_WORD {
                        let e = w * T::PER_WORD + h;
                        xh[e] = (xs[h] - m) * rs;
                        g[e] = ds[h] * gam[e];
                        s1 += g[e];
                        s2 += g[e] * xh[e];
                        dg[e] += ds[h] * xh[e];
                        db[e] += ds[h];
                    }
                });
            });
        }
        let [t1, t2, _, _] = block::reduce_sum4([s1, s2, 0.0, 0.0]);
        let (mg, mgx) = (t1 * inv_cols, t2 * inv_cols);
        if mine {
            let mut ch = Chunk16([0; 4]);
            crate::unroll!(w in [0, 1, 2, 3] {
                let e = w * T::PER_WORD;
                let lo = rs * (g[e] - mg - xh[e] * mgx);
                let hi = if T::PER_WORD == 2 { rs * (g[e + 1] - mg - xh[e + 1] * mgx) } else { 0.0 };
                ch.0[w] = T::pack_word(lo, hi);
            });
            let c = r * row_chunks as u64 + tid as u64;
            // SAFETY: chunk c lies inside dx (as for x above); each chunk is written by one thread.
            unsafe { store_chunk(a.dx.chunks(), c, ch) };
        }
        r += 1;
        stage = (stage + 1) % S;
    }
    cp_async_wait::<0>();
    if mine {
        let chunks = grid_dim_x() as u64;
        crate::unroll!(e in [0, 1, 2, 3, 4, 5, 6, 7] {
            if e < per_chunk {
                let j = tid as u64 * per_chunk as u64 + e as u64;
                a.partials.set(chunk * a.cols + j, dg[e]);
                a.partials.set((chunks + chunk) * a.cols + j, db[e]);
            }
        });
    }
}

/// Rows longer than the register cache: a sums pass, then the dx pass, which also folds dy * xhat and
/// dy into this thread's own elements of partial row `chunk` (written on the chunk's first row).
#[inline(always)]
fn backward_streaming<T: Elem>(a: &Bwd<T>, chunk: u64, r0: u64, r1: u64) {
    let (tid, nt) = (thread_idx_x() as u64, block_dim_x() as u64);
    let inv_cols = 1.0 / a.cols as f32;
    let chunks = grid_dim_x() as u64;
    let (pg, pb) = (chunk * a.cols, (chunks + chunk) * a.cols);
    let mut r = r0;
    while r < r1 {
        let base = r * a.cols;
        let (m, rs) = (a.mean.get(r), a.rstd.get(r));
        let (mut s1, mut s2) = (0.0f32, 0.0f32);
        let mut j = tid;
        while j < a.cols {
            let xh = (a.x.get(base + j) - m) * rs;
            let g = a.dy.get(base + j) * a.gamma.get(j);
            s1 += g;
            s2 += g * xh;
            j += nt;
        }
        let [t1, t2, _, _] = block::reduce_sum4([s1, s2, 0.0, 0.0]);
        let (mg, mgx) = (t1 * inv_cols, t2 * inv_cols);
        let mut j = tid;
        while j < a.cols {
            let xh = (a.x.get(base + j) - m) * rs;
            let dyv = a.dy.get(base + j);
            a.dx.set(base + j, rs * (dyv * a.gamma.get(j) - mg - xh * mgx));
            // Only this thread touches these two partial elements (same j on every row).
            let (og, ob) = if r == r0 {
                (0.0, 0.0)
            } else {
                (a.partials.get(pg + j), a.partials.get(pb + j))
            };
            a.partials.set(pg + j, og + dyv * xh);
            a.partials.set(pb + j, ob + dyv);
            j += nt;
        }
        r += 1;
    }
}

#[inline(always)]
unsafe fn backward<T: Elem, const N: usize>(a: Bwd<T>, rows_per_chunk: u64) {
    let chunk = block_idx_x() as u64;
    let r0 = (chunk * rows_per_chunk).min(a.rows);
    let r1 = (r0 + rows_per_chunk).min(a.rows);
    if cached::<N>(a.cols) {
        backward_cached::<T, N>(&a, chunk, r0, r1)
    } else {
        backward_streaming(&a, chunk, r0, r1)
    }
}

/// The pipelined backward over this block's chunk of rows (see `backward_pipe` for when the host
/// launches it).
#[inline(always)]
unsafe fn backward_pipelined<T: Elem>(a: Bwd<T>, rows_per_chunk: u64) {
    let chunk = block_idx_x() as u64;
    let r0 = (chunk * rows_per_chunk).min(a.rows);
    let r1 = (r0 + rows_per_chunk).min(a.rows);
    backward_pipe(&a, chunk, r0, r1)
}

/// The row `r` of the warp-per-row backward's trip: `stage` and the statistics of row `r`.
/// Rows `gw, gw + tw, gw + 2 tw, ...` belong to warp `gw` of `tw` in the grid (a persistent grid: the
/// host sizes it to the blocks resident at once), so every warp gets the same number of rows, or one
/// fewer. Each lane owns chunks `lane + 32 k` of every row (`k < ceil(row_chunks / 32)`): 16-byte
/// accesses, a warp's loads of one slot contiguous. x and dy arrive through `S` `cp.async` stages in the
/// warp's own slice of dynamic shared memory (rows `r + tw .. r + (S - 1) tw` in flight while row `r`
/// is reduced); a lane reads back only the bytes it copied itself, so its own `cp.async.wait_group`
/// orders them and the row loop has no barrier. The two row sums are warp butterflies (the same bits
/// in every lane), and dx re-reads x and dy from the stage instead of keeping xhat and g in registers
/// across the shuffles. (ptxas merges the two reads and keeps x and dy across the shuffles anyway:
/// about 205 registers, 8 warps an SM. A volatile re-read, bounded to 170 registers for 12 warps an
/// SM, still spilled 20-48 B: ptxas hoists all 16 chunk loads of the first pass.)
///
/// dgamma/dbeta: each lane accumulates its columns over all the warp's rows in registers; at the end
/// the block's warps store their sums to shared memory and thread `t` adds them in warp order for
/// columns `t, t + nt, ...` into partial row `block` (`param_grads` then adds the partial rows in block
/// order). The grid, and with it the summation order, depends on the device's SM count and the kernel's
/// occupancy: the same bits on every run on one device.
///
/// Stage layout, per warp `w`: stage `s`, operand `o` (0 = x, 1 = dy), slot `k`, lane `l` at
/// `(((w * S + s) * 2 + o) * kpl + k) * 512 + l * 16` bytes, `kpl = ceil(row_chunks / 32)`.
/// Host checks: cols a multiple of the chunk, at most `WARP_MAX_COLS`; 16-byte aligned bases.
#[inline(always)]
unsafe fn backward_warp<T: Elem, const S: u32>(a: Bwd<T>) {
    const LANE: usize = WARP_LANE_ELEMS as usize;
    let per_chunk = 16 / core::mem::size_of::<T>();
    // Slots a lane may hold (f32: 8, f16/bf16: 4); a launch uses the first `kpl`.
    let slots = LANE / per_chunk;
    let (lane, wid, warps) = (lane_id(), warp_id(), block_dim_x() / 32);
    let row_chunks = (a.cols / per_chunk as u64) as u32;
    let kpl = row_chunks.div_ceil(32);
    let inv_cols = 1.0 / a.cols as f32;
    let operand_bytes = kpl * 512;
    let stage_bytes = 2 * operand_bytes;
    // This lane's first slot; `opaque_u32` keeps `+ k * 512` as address immediates.
    let mine = opaque_u32(dynamic_base() + wid * S * stage_bytes + lane * 16);
    let owned = |k: usize| lane + 32 * (k as u32) < row_chunks;
    let gw = block_idx_x() as u64 * warps as u64 + wid as u64;
    let tw = grid_dim_x() as u64 * warps as u64;
    // Starts the copies of row `r` into `stage` (none past the last row) and closes a group either
    // way, so every trip waits on the same group count.
    let issue = |r: u64, stage: u32| {
        if r < a.rows {
            let first = (r * row_chunks as u64 + lane as u64) as usize;
            let dst = mine + stage * stage_bytes;
            // SAFETY: r < rows: the row's chunks lie inside x and dy; `first + 32 k` is inside the row
            // for owned slots (below). The slots are this lane's, read only after its wait.
            unsafe {
                let (xs, ds) = (a.x.chunks().add(first), a.dy.chunks().add(first));
                crate::unroll!(k in [0, 1, 2, 3, 4, 5, 6, 7] {
                    if k < slots && owned(k) {
                        let d = dst + k as u32 * 512;
                        cp_async_16(d, xs.add(32 * k) as *const u8, true);
                        cp_async_16(d + operand_bytes, ds.add(32 * k) as *const u8, true);
                    }
                });
            }
        }
        cp_async_commit();
    };
    crate::unroll!(s in [0, 1, 2, 3] {
        if (s as u32) + 1 < S {
            issue(gw + s as u64 * tw, s as u32);
        }
    });
    let mut gam = [0.0f32; LANE];
    let (mut dg, mut db) = ([0.0f32; LANE], [0.0f32; LANE]);
    crate::unroll!(k in [0, 1, 2, 3, 4, 5, 6, 7] {
        if k < slots && owned(k) {
            // SAFETY: an owned chunk of gamma (cols elements, aligned: host check).
            let gc = unsafe { load_chunk_ro(a.gamma.chunks(), (lane + 32 * k as u32) as u64) };
            crate::unroll!(w in [0, 1, 2, 3] {
                let [lo, hi] = T::unpack_word(gc.0[w]);
                let e = k * per_chunk + w * T::PER_WORD;
                gam[e] = lo;
                if T::PER_WORD == 2 {
                    gam[e + 1] = hi;
                }
            });
        }
    });
    // The next row's statistics are loaded a trip ahead (their latency would otherwise add to every
    // row's).
    let stats = |r: u64| {
        if r < a.rows {
            (a.mean.get_ro(r), a.rstd.get_ro(r))
        } else {
            (0.0, 0.0)
        }
    };
    let mut next = stats(gw);
    let (mut r, mut stage) = (gw, 0u32);
    while r < a.rows {
        issue(r + (S as u64 - 1) * tw, (stage + S - 1) % S);
        let (m, rs) = next;
        next = stats(r + tw);
        match S {
            2 => cp_async_wait::<1>(),
            3 => cp_async_wait::<2>(),
            _ => cp_async_wait::<3>(),
        }
        let xb = mine + stage * stage_bytes;
        let dyb = xb + operand_bytes;
        let (mut s1, mut s2) = (0.0f32, 0.0f32);
        crate::unroll!(k in [0, 1, 2, 3, 4, 5, 6, 7] {
            if k < slots && owned(k) {
                // SAFETY: this lane's slots of `stage`, filled by its own copies, which the wait
                // above completed.
                let (xw, dw) = unsafe {
                    (ld_shared_v4(xb + k as u32 * 512), ld_shared_v4(dyb + k as u32 * 512))
                };
                crate::unroll!(w in [0, 1, 2, 3] {
                    let xs = T::unpack_word(xw[w]);
                    let ds = T::unpack_word(dw[w]);
                    crate::unroll!(h in [0, 1] {
                        if h < T::PER_WORD {
                            let e = k * per_chunk + w * T::PER_WORD + h;
                            let xh = (xs[h] - m) * rs;
                            let g = ds[h] * gam[e];
                            s1 += g;
                            s2 += g * xh;
                            dg[e] += ds[h] * xh;
                            db[e] += ds[h];
                        }
                    });
                });
            }
        });
        // Two butterflies, interleaved: every lane ends with the same bits (a + b == b + a).
        let mut step = 16;
        while step > 0 {
            s1 += warp::shfl_xor_f32(s1, step);
            s2 += warp::shfl_xor_f32(s2, step);
            step >>= 1;
        }
        let (mg, mgx) = (s1 * inv_cols, s2 * inv_cols);
        let first = r * row_chunks as u64 + lane as u64;
        crate::unroll!(k in [0, 1, 2, 3, 4, 5, 6, 7] {
            if k < slots && owned(k) {
                // SAFETY: as above (the stage is not reissued before the next trip).
                let (xw, dw) = unsafe {
                    (ld_shared_v4(xb + k as u32 * 512), ld_shared_v4(dyb + k as u32 * 512))
                };
                let mut ch = Chunk16([0; 4]);
                crate::unroll!(w in [0, 1, 2, 3] {
                    let xs = T::unpack_word(xw[w]);
                    let ds = T::unpack_word(dw[w]);
                    let e = k * per_chunk + w * T::PER_WORD;
                    let lo = rs * (ds[0] * gam[e] - mg - (xs[0] - m) * rs * mgx);
                    let hi = if T::PER_WORD == 2 {
                        rs * (ds[1] * gam[e + 1] - mg - (xs[1] - m) * rs * mgx)
                    } else {
                        0.0
                    };
                    ch.0[w] = T::pack_word(lo, hi);
                });
                // SAFETY: an owned chunk of row r inside dx; each chunk is written by one lane.
                unsafe { store_chunk(a.dx.chunks(), first + 32 * k as u64, ch) };
            }
        });
        r += tw;
        stage = (stage + 1) % S;
    }
    // Fold the block's warps: every copy done (this thread's, then everyone's at the barrier) before
    // the stages are reused as `[2][warps][cols]` f32.
    cp_async_wait::<0>();
    sync_threads();
    let base = dynamic_base();
    let cols = a.cols as u32;
    crate::unroll!(k in [0, 1, 2, 3, 4, 5, 6, 7] {
        if k < slots && owned(k) {
            let j = (lane + 32 * k as u32) * per_chunk as u32;
            crate::unroll!(q in [0, 1] {
                if q * 4 < per_chunk {
                    let e = k * per_chunk + q * 4;
                    let at = |o: u32| base + ((o * warps + wid) * cols + j + q as u32 * 4) * 4;
                    let g4 = [dg[e].to_bits(), dg[e + 1].to_bits(), dg[e + 2].to_bits(), dg[e + 3].to_bits()];
                    let b4 = [db[e].to_bits(), db[e + 1].to_bits(), db[e + 2].to_bits(), db[e + 3].to_bits()];
                    // SAFETY: 16-byte aligned (cols and j multiples of 4) inside the
                    // `2 * warps * cols` f32 the host sized; this lane's own elements.
                    unsafe {
                        st_shared_v4(at(0), g4);
                        st_shared_v4(at(1), b4);
                    }
                }
            });
        }
    });
    sync_threads();
    let (blk, blocks) = (block_idx_x() as u64, grid_dim_x() as u64);
    let mut j = thread_idx_x();
    while j < cols {
        let (mut sg, mut sb) = (0.0f32, 0.0f32);
        let mut w = 0;
        while w < warps {
            // SAFETY: inside the fold area, written before the barrier above.
            unsafe {
                sg += f32::ld_shared(base + (w * cols + j) * 4);
                sb += f32::ld_shared(base + ((warps + w) * cols + j) * 4);
            }
            w += 1;
        }
        a.partials.set(blk * a.cols + j as u64, sg);
        a.partials.set((blocks + blk) * a.cols + j as u64, sb);
        j += block_dim_x();
    }
}

crate::static_shared!(fn finish_slots() -> [f32; 2 * (FINISH_WARPS * FINISH_COLS) as usize] as LAYER_NORM_FINISH_SLOTS);

/// `dgamma[j] = sum_c partials[0][c][j]`, `dbeta[j] = sum_c partials[1][c][j]`. A block takes 32
/// columns (one per lane, coalesced); warp `w` of `FINISH_WARPS` sums chunks `w, w + FINISH_WARPS, ...`
/// (eight accumulators, fixed order); warp 0 adds the warp sums in warp order.
#[inline(always)]
unsafe fn param_grads<T: Elem>(
    partials: Slice<f32>,
    dgamma: SliceMut<T>,
    dbeta: SliceMut<T>,
    chunks: u64,
    cols: u64,
) {
    const W: u64 = FINISH_WARPS as u64;
    const SLOT: usize = (FINISH_WARPS * FINISH_COLS) as usize;
    let (lane, w) = (lane_id() as u64, warp_id() as u64);
    let slots = finish_slots();
    let groups = cols.div_ceil(FINISH_COLS as u64);
    let mut cg = block_idx_x() as u64;
    while cg < groups {
        let j = cg * FINISH_COLS as u64 + lane;
        let mut sg = [0.0f32; 8];
        let mut sb = [0.0f32; 8];
        if j < cols {
            let mut c = w;
            while c + 7 * W < chunks {
                crate::unroll!(q in [0, 1, 2, 3, 4, 5, 6, 7] {
                    let cc = c + q as u64 * W;
                    sg[q] += partials.get_ro(cc * cols + j);
                    sb[q] += partials.get_ro((chunks + cc) * cols + j);
                });
                c += 8 * W;
            }
            while c < chunks {
                sg[0] += partials.get_ro(c * cols + j);
                sb[0] += partials.get_ro((chunks + c) * cols + j);
                c += W;
            }
        }
        // The previous group's readers are done with the slots.
        sync_threads();
        let s = (w * FINISH_COLS as u64 + lane) as usize;
        slots.store(
            s,
            ((sg[0] + sg[1]) + (sg[2] + sg[3])) + ((sg[4] + sg[5]) + (sg[6] + sg[7])),
        );
        slots.store(
            SLOT + s,
            ((sb[0] + sb[1]) + (sb[2] + sb[3])) + ((sb[4] + sb[5]) + (sb[6] + sb[7])),
        );
        sync_threads();
        if w == 0 && j < cols {
            let (mut tg, mut tb) = (0.0f32, 0.0f32);
            let mut ww = 0usize;
            while ww < FINISH_WARPS as usize {
                tg += slots.load(ww * FINISH_COLS as usize + lane as usize);
                tb += slots.load(SLOT + ww * FINISH_COLS as usize + lane as usize);
                ww += 1;
            }
            dgamma.set(j, tg);
            dbeta.set(j, tb);
        }
        cg += grid_dim_x() as u64;
    }
}

macro_rules! layer_norm_entry_points {
    ($($fwd:ident, $fwd_vec:ident, $bwd:ident, $bwd_pipe:ident, $bwd_narrow:ident, $bwd_warp:ident, $fin:ident, $t:ty, $pipe_blocks:expr;)*) => {$(
        // Without a bound the JIT may use more registers than a 512-thread block allows (the launch
        // fails with CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES): the row caches (x, and in the backward dy
        // plus the dgamma/dbeta accumulators) must fit the 128 registers a 512-thread block allows.
        crate::launch_bounds!($fwd, MAX_BLOCK, 1);
        crate::launch_bounds!($bwd, MAX_BLOCK, 1);
        crate::launch_bounds!($fin, MAX_BLOCK, 1);
        // The vector forward (16 values a thread) and the narrow backward (4 elements a thread: x,
        // dy, xhat, g, gamma, dgamma, dbeta and the next row's x and dy) fit two blocks of 512 per SM.
        crate::launch_bounds!($fwd_vec, MAX_BLOCK, 2);
        crate::launch_bounds!($bwd_narrow, MAX_BLOCK, 2);
        // The pipelined backward: f32 fits 64 registers (two blocks a SM); the halves hold 8 elements
        // a chunk and spilled at 64, so they get up to 128 (one block).
        crate::launch_bounds!($bwd_pipe, PIPE_MAX_BLOCK, $pipe_blocks);
        // Warp per row: dgamma, dbeta and gamma take 96 registers a lane, and ptxas keeps the row's x
        // and dy across the shuffles. At a cap of 128 they spilled (f32 ~80 B, f16/bf16 ~600 B); at 170
        // (3 blocks of 4 warps) still 20-48 B; unbounded they take ~205 (8 warps an SM).
        crate::launch_bounds!($bwd_warp, WARP_MAX_WARPS * 32, 1);
        /// `CACHE_PER_THREAD` (16) elements a thread: rows up to `MAX_CACHED_COLS` in registers.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $fwd(
            x: Slice<$t>, gamma: Slice<$t>, beta: Slice<$t>, y: SliceMut<$t>,
            mean: SliceMut<f32>, rstd: SliceMut<f32>, rows: u64, cols: u64, eps: f32,
        ) {
            unsafe { forward::<$t, CACHE>(Fwd { x, gamma, beta, y, mean, rstd, cols, eps }, rows) }
        }
        /// 16-byte chunks, `CACHE_PER_THREAD` elements a thread (see `forward_vec`).
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $fwd_vec(
            x: Slice<$t>, gamma: Slice<$t>, beta: Slice<$t>, y: SliceMut<$t>,
            mean: SliceMut<f32>, rstd: SliceMut<f32>, rows: u64, cols: u64, eps: f32,
        ) {
            unsafe { forward_vectorised::<$t>(Fwd { x, gamma, beta, y, mean, rstd, cols, eps }, rows) }
        }
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $bwd(
            x: Slice<$t>, gamma: Slice<$t>, mean: Slice<f32>, rstd: Slice<f32>, dy: Slice<$t>,
            dx: SliceMut<$t>, partials: SliceMut<f32>, rows: u64, cols: u64, rows_per_chunk: u64,
        ) {
            unsafe {
                backward::<$t, CACHE>(Bwd { x, gamma, mean, rstd, dy, dx, partials, rows, cols }, rows_per_chunk)
            }
        }
        /// `cp.async`-pipelined rows of whole 16-byte chunks, one chunk a thread (see `backward_pipe`).
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $bwd_pipe(
            x: Slice<$t>, gamma: Slice<$t>, mean: Slice<f32>, rstd: Slice<f32>, dy: Slice<$t>,
            dx: SliceMut<$t>, partials: SliceMut<f32>, rows: u64, cols: u64, rows_per_chunk: u64,
        ) {
            unsafe {
                backward_pipelined::<$t>(Bwd { x, gamma, mean, rstd, dy, dx, partials, rows, cols }, rows_per_chunk)
            }
        }
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $bwd_narrow(
            x: Slice<$t>, gamma: Slice<$t>, mean: Slice<f32>, rstd: Slice<f32>, dy: Slice<$t>,
            dx: SliceMut<$t>, partials: SliceMut<f32>, rows: u64, cols: u64, rows_per_chunk: u64,
        ) {
            unsafe {
                backward::<$t, NARROW>(Bwd { x, gamma, mean, rstd, dy, dx, partials, rows, cols }, rows_per_chunk)
            }
        }
        /// Warp-per-row backward, 2 `cp.async` stages a warp (see `backward_warp`).
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $bwd_warp(
            x: Slice<$t>, gamma: Slice<$t>, mean: Slice<f32>, rstd: Slice<f32>, dy: Slice<$t>,
            dx: SliceMut<$t>, partials: SliceMut<f32>, rows: u64, cols: u64,
        ) {
            unsafe { backward_warp::<$t, 2>(Bwd { x, gamma, mean, rstd, dy, dx, partials, rows, cols }) }
        }
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $fin(
            partials: Slice<f32>, dgamma: SliceMut<$t>, dbeta: SliceMut<$t>, chunks: u64, cols: u64,
        ) {
            unsafe { param_grads(partials, dgamma, dbeta, chunks, cols) }
        }
    )*};
}

layer_norm_entry_points! {
    layer_norm_f32, layer_norm_vec_f32, layer_norm_backward_f32, layer_norm_backward_pipe_f32, layer_norm_backward_narrow_f32, layer_norm_backward_warp2_f32, layer_norm_param_grads_f32, f32, 2;
    layer_norm_f16, layer_norm_vec_f16, layer_norm_backward_f16, layer_norm_backward_pipe_f16, layer_norm_backward_narrow_f16, layer_norm_backward_warp2_f16, layer_norm_param_grads_f16, F16, 1;
    layer_norm_bf16, layer_norm_vec_bf16, layer_norm_backward_bf16, layer_norm_backward_pipe_bf16, layer_norm_backward_narrow_bf16, layer_norm_backward_warp2_bf16, layer_norm_param_grads_bf16, BF16, 1;
}
