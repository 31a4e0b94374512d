//! Elementwise kernels: binary ops (contiguous vectorised, and strided with broadcasting), GELU forward
//! and backward, and the broadcast-gradient reduction `reduce_to`.
use crate::dev::elem::{BF16, Elem, F16};
use crate::dev::math;
use crate::dev::mem::{Chunk16, Slice, SliceMut, load_chunk_ro, store_chunk};
use crate::dev::thread::{
    block_dim_x, block_idx_x, global_index_x, grid_dim_x, grid_threads_x, thread_idx_x,
};
use crate::params::elementwise::{BINARY_CHUNKS_PER_THREAD, CHUNKS_PER_THREAD};
use crate::params::{Broadcast2, MAX_DIMS, ReduceTo};

const ADD: u32 = 0;
const SUB: u32 = 1;
const MUL: u32 = 2;
const DIV: u32 = 3;

#[inline(always)]
fn apply<const OP: u32>(a: f32, b: f32) -> f32 {
    match OP {
        ADD => a + b,
        SUB => a - b,
        MUL => a * b,
        _ => math::div(a, b),
    }
}

/// Words of a 16-byte chunk, mapped through `f`.
#[inline(always)]
fn map_chunk2<T: Elem>(x: Chunk16, y: Chunk16, f: impl Fn(f32, f32) -> f32 + Copy) -> Chunk16 {
    let mut z = [0u32; 4];
    crate::unroll!(k in [0, 1, 2, 3] {
        z[k] = T::map_word2(x.0[k], y.0[k], f);
    });
    Chunk16(z)
}

#[inline(always)]
fn map_chunk<T: Elem>(x: Chunk16, f: impl Fn(f32) -> f32 + Copy) -> Chunk16 {
    let mut z = [0u32; 4];
    crate::unroll!(k in [0, 1, 2, 3] {
        z[k] = T::map_word(x.0[k], f);
    });
    Chunk16(z)
}

/// `out = f(a, b)` over equal-length contiguous buffers whose bases are 16-byte aligned (the launcher
/// checks): 16-byte chunks in block tiles (grid-stride over tiles), then the ragged tail element by
/// element.
#[inline(always)]
unsafe fn zip_contiguous<T: Elem, const UNROLL: usize>(
    a: Slice<T>,
    b: Slice<T>,
    out: SliceMut<T>,
    f: impl Fn(f32, f32) -> f32 + Copy,
) {
    let per_chunk = (16 / core::mem::size_of::<T>()) as u64;
    let chunks = a.len / per_chunk;
    // A block takes tiles of UNROLL * block_dim consecutive chunks, thread t chunks t, t + block_dim,
    // ...: all of a thread's loads are issued before any store (a store is inline asm, a memory clobber,
    // so the compiler cannot hoist later loads above it), and a block's accesses stay inside one
    // contiguous tile (a grid-stride pair of chunks 128 MiB apart measured 1% slower than PyTorch's
    // tiled kernel; four chunks a thread, at 64 registers, 2% slower; for the binary ops one chunk a
    // thread measured 0.8% faster than two, see `params::elementwise::BINARY_CHUNKS_PER_THREAD`).
    let bd = block_dim_x() as u64;
    let tile = bd * UNROLL as u64;
    let mut t = block_idx_x() as u64 * tile;
    while t < chunks {
        let i = t + thread_idx_x() as u64;
        if t + tile <= chunks {
            // SAFETY: i + u * bd < t + tile <= chunks for every u < UNROLL: each chunk lies inside all
            // three buffers (equal lengths, checked by the launcher); bases are 16-byte aligned
            // (checked by the launcher).
            unsafe {
                let mut x = [Chunk16([0; 4]); UNROLL];
                let mut y = [Chunk16([0; 4]); UNROLL];
                crate::unroll_lt!(u < UNROLL, {
                    x[u] = load_chunk_ro(a.chunks(), i + u as u64 * bd);
                    y[u] = load_chunk_ro(b.chunks(), i + u as u64 * bd);
                });
                crate::unroll_lt!(u < UNROLL, {
                    store_chunk(
                        out.chunks(),
                        i + u as u64 * bd,
                        map_chunk2::<T>(x[u], y[u], f),
                    );
                });
            }
        } else {
            crate::unroll_lt!(u < UNROLL, {
                let c = i + u as u64 * bd;
                if c < chunks {
                    // SAFETY: c < chunks (as above).
                    unsafe {
                        let z = map_chunk2::<T>(
                            load_chunk_ro(a.chunks(), c),
                            load_chunk_ro(b.chunks(), c),
                            f,
                        );
                        store_chunk(out.chunks(), c, z);
                    }
                }
            });
        }
        t += grid_dim_x() as u64 * tile;
    }
    let j = chunks * per_chunk + global_index_x();
    if j < a.len {
        out.set(j, f(a.get(j), b.get(j)));
    }
}

/// `out = f(x)` over a contiguous, 16-byte aligned buffer.
#[inline(always)]
unsafe fn map_contiguous<T: Elem>(x: Slice<T>, out: SliceMut<T>, f: impl Fn(f32) -> f32 + Copy) {
    let per_chunk = (16 / core::mem::size_of::<T>()) as u64;
    let chunks = x.len / per_chunk;
    let step = grid_threads_x();
    let mut i = global_index_x();
    while i < chunks {
        // SAFETY: as in `zip_contiguous`.
        unsafe {
            store_chunk(
                out.chunks(),
                i,
                map_chunk::<T>(load_chunk_ro(x.chunks(), i), f),
            )
        }
        i += step;
    }
    let j = chunks * per_chunk + global_index_x();
    if j < x.len {
        out.set(j, f(x.get(j)));
    }
}

/// Offsets into `a` and `b` of output element `i` (row-major over `p.shape`). The launcher pads unused
/// leading dims with extent 1, so the loop runs over all `MAX_DIMS` with constant indices: fully unrolled,
/// the parameter arrays stay in the parameter space instead of being copied to a local-memory stack.
#[inline(always)]
fn broadcast_offsets(p: &Broadcast2, i: u64) -> (u64, u64) {
    let (mut oa, mut ob) = (0u64, 0u64);
    if p.numel <= u32::MAX as u64 {
        // 32-bit division is several times cheaper than 64-bit; valid because every index fits.
        let mut r = i as u32;
        for d in (0..MAX_DIMS).rev() {
            let s = (p.shape[d] as u32).max(1);
            let idx = (r % s) as u64;
            r /= s;
            oa += idx * p.a_strides[d];
            ob += idx * p.b_strides[d];
        }
    } else {
        let mut r = i;
        for d in (0..MAX_DIMS).rev() {
            let s = p.shape[d].max(1);
            let idx = r % s;
            r /= s;
            oa += idx * p.a_strides[d];
            ob += idx * p.b_strides[d];
        }
    }
    (oa, ob)
}

/// Offset of the row-major index `i` over `shape` in a buffer with `strides` (unused leading dims have
/// extent 1; see `broadcast_offsets`).
#[inline(always)]
fn strided_offset(shape: &[u64; MAX_DIMS], strides: &[u64; MAX_DIMS], i: u64) -> u64 {
    let (mut off, mut r) = (0u64, i);
    for d in (0..MAX_DIMS).rev() {
        let s = shape[d].max(1);
        off += (r % s) * strides[d];
        r /= s;
    }
    off
}

/// `out = a (op) b` with NumPy broadcasting: strides of broadcast dims are 0; `out` is contiguous.
#[inline(always)]
unsafe fn zip_broadcast<T: Elem>(
    a: Slice<T>,
    b: Slice<T>,
    out: SliceMut<T>,
    p: &Broadcast2,
    f: impl Fn(f32, f32) -> f32,
) {
    let step = grid_threads_x();
    let mut i = global_index_x();
    while i < p.numel {
        let (oa, ob) = broadcast_offsets(p, i);
        out.set(i, f(a.get(oa), b.get(ob)));
        i += step;
    }
}

/// `out = full (op) row`, or `row (op) full` when `row_first != 0`, where `row` repeats along the leading
/// dims of `full` (a bias row, `[R, C] + [C]`): output chunk `i` pairs with row chunk `i % row_chunks`.
/// The host launches it only for contiguous, 16-byte aligned buffers, a row of whole chunks and fewer
/// than 2^31 chunks, so 32-bit indices (one 32-bit remainder per chunk instead of the strided kernel's
/// six 64-bit divisions per element) cannot wrap.
#[inline(always)]
unsafe fn zip_rows<T: Elem>(
    full: Slice<T>,
    row: Slice<T>,
    out: SliceMut<T>,
    row_chunks: u32,
    row_first: u32,
    f: impl Fn(f32, f32) -> f32 + Copy,
) {
    let chunks = (full.len / (16 / core::mem::size_of::<T>()) as u64) as u32;
    let step = grid_threads_x() as u32;
    let mut i = global_index_x() as u32;
    while i < chunks {
        // SAFETY: i < chunks and i % row_chunks < row_chunks: inside `full`/`out` and `row` (whole
        // chunks, aligned bases: host checks).
        unsafe {
            let x = load_chunk_ro(full.chunks(), i as u64);
            let r = load_chunk_ro(row.chunks(), (i % row_chunks) as u64);
            let z = if row_first != 0 {
                map_chunk2::<T>(r, x, f)
            } else {
                map_chunk2::<T>(x, r, f)
            };
            store_chunk(out.chunks(), i as u64, z);
        }
        i += step;
    }
}

/// GELU with the exact (erf) form: `x * Phi(x)`.
#[inline(always)]
fn gelu(x: f32) -> f32 {
    x * math::normal_cdf(x)
}

/// d GELU / dx = Phi(x) + x phi(x), times the upstream gradient.
#[inline(always)]
fn gelu_grad(x: f32, dy: f32) -> f32 {
    dy * (math::normal_cdf(x) + x * math::normal_pdf(x))
}

/// `out = alpha * a` broadcast to `p.shape` (the gradient of a reduction, expanded back).
#[inline(always)]
unsafe fn expand<T: Elem>(a: Slice<T>, out: SliceMut<T>, p: &Broadcast2, alpha: f32) {
    let step = grid_threads_x();
    let mut i = global_index_x();
    while i < p.numel {
        out.set(i, alpha * a.get(broadcast_offsets(p, i).0));
        i += step;
    }
}

/// Sum of `grad` over the broadcast dims, times `alpha`, into the operand's shape (f64 accumulation,
/// fixed order).
#[inline(always)]
unsafe fn reduce_to<T: Elem>(grad: Slice<T>, out: SliceMut<T>, p: &ReduceTo, alpha: f32) {
    let step = grid_threads_x();
    let mut o = global_index_x();
    while o < p.out_numel {
        // Offset in grad of the first element that maps to output o, then every reduced position.
        let base = strided_offset(&p.out_shape, &p.grad_strides, o);
        let mut acc = 0.0f64;
        let mut r = 0u64;
        while r < p.red_numel {
            acc += grad.get(base + strided_offset(&p.red_shape, &p.grad_strides, r)) as f64;
            r += 1;
        }
        out.set(o, alpha * acc as f32);
        o += step;
    }
}

/// `out = x` converted element by element between storage types (f32 math in between): the widening
/// and narrowing around the half-precision backward paths that must not round their intermediates.
#[inline(always)]
unsafe fn convert<S: Elem, D: Elem>(x: Slice<S>, out: SliceMut<D>) {
    let step = grid_threads_x();
    let mut i = global_index_x();
    while i < x.len {
        out.set(i, x.get(i));
        i += step;
    }
}

/// Half storage to f32 (exact).
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn widen_f16(x: Slice<F16>, out: SliceMut<f32>) {
    unsafe { convert(x, out) }
}
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn widen_bf16(x: Slice<BF16>, out: SliceMut<f32>) {
    unsafe { convert(x, out) }
}
/// f32 to half storage (round to nearest even).
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn narrow_f16(x: Slice<f32>, out: SliceMut<F16>) {
    unsafe { convert(x, out) }
}
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn narrow_bf16(x: Slice<f32>, out: SliceMut<BF16>) {
    unsafe { convert(x, out) }
}

macro_rules! binary_entry_points {
    ($($contig:ident, $rows:ident, $bcast:ident, $t:ty, $op:expr;)*) => {$(
        /// Contiguous, same-shape binary op (see `zip_contiguous`).
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $contig(a: Slice<$t>, b: Slice<$t>, out: SliceMut<$t>) {
            unsafe { zip_contiguous::<_, { BINARY_CHUNKS_PER_THREAD as usize }>(a, b, out, apply::<{ $op }>) }
        }
        /// A row repeated along the leading dims of a full operand (see `zip_rows`).
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $rows(full: Slice<$t>, row: Slice<$t>, out: SliceMut<$t>, row_chunks: u32, row_first: u32) {
            unsafe { zip_rows(full, row, out, row_chunks, row_first, apply::<{ $op }>) }
        }
        /// Strided binary op with broadcasting (see `zip_broadcast`).
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $bcast(a: Slice<$t>, b: Slice<$t>, out: SliceMut<$t>, p: Broadcast2) {
            unsafe { zip_broadcast(a, b, out, &p, apply::<{ $op }>) }
        }
    )*};
}

binary_entry_points! {
    add_f32, add_rows_f32, add_bcast_f32, f32, ADD;
    sub_f32, sub_rows_f32, sub_bcast_f32, f32, SUB;
    mul_f32, mul_rows_f32, mul_bcast_f32, f32, MUL;
    div_f32, div_rows_f32, div_bcast_f32, f32, DIV;
    add_f16, add_rows_f16, add_bcast_f16, F16, ADD;
    sub_f16, sub_rows_f16, sub_bcast_f16, F16, SUB;
    mul_f16, mul_rows_f16, mul_bcast_f16, F16, MUL;
    div_f16, div_rows_f16, div_bcast_f16, F16, DIV;
    add_bf16, add_rows_bf16, add_bcast_bf16, BF16, ADD;
    sub_bf16, sub_rows_bf16, sub_bcast_bf16, BF16, SUB;
    mul_bf16, mul_rows_bf16, mul_bcast_bf16, BF16, MUL;
    div_bf16, div_rows_bf16, div_bcast_bf16, BF16, DIV;
}

macro_rules! unary_entry_points {
    ($($gelu:ident, $gelu_bwd:ident, $reduce_to:ident, $expand:ident, $affine:ident, $t:ty;)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $gelu(x: Slice<$t>, y: SliceMut<$t>) {
            unsafe { map_contiguous(x, y, gelu) }
        }
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $gelu_bwd(x: Slice<$t>, dy: Slice<$t>, dx: SliceMut<$t>) {
            unsafe { zip_contiguous::<_, { CHUNKS_PER_THREAD as usize }>(x, dy, dx, gelu_grad) }
        }
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $reduce_to(grad: Slice<$t>, out: SliceMut<$t>, p: ReduceTo, alpha: f32) {
            unsafe { reduce_to(grad, out, &p, alpha) }
        }
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $expand(a: Slice<$t>, out: SliceMut<$t>, p: Broadcast2, alpha: f32) {
            unsafe { expand(a, out, &p, alpha) }
        }
        /// `out = alpha * x + beta` (scalar ops), contiguous.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $affine(x: Slice<$t>, out: SliceMut<$t>, alpha: f32, beta: f32) {
            unsafe { map_contiguous(x, out, |v| alpha * v + beta) }
        }
    )*};
}

unary_entry_points! {
    gelu_f32, gelu_backward_f32, reduce_to_f32, expand_f32, affine_f32, f32;
    gelu_f16, gelu_backward_f16, reduce_to_f16, expand_f16, affine_f16, F16;
    gelu_bf16, gelu_backward_bf16, reduce_to_bf16, expand_bf16, affine_bf16, BF16;
}
