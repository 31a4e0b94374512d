//! Ring (context-parallel) attention's two elementwise steps, both memory-bound and run between the
//! flash kernels of a ring step:
//! - `ring_merge_*`: folds one partial attention output into an f32 accumulator through the LSEs,
//!   `o = o_acc e^(lse_acc - m) + o_part e^(lse_part - m)` with `m = ln(e^lse_acc + e^lse_part)` per
//!   query row (the softmax over the union of two key sets, from the two partial softmaxes);
//! - `ring_accumulate_f32`: adds one f32 gradient accumulator into another (a ring step's key-block
//!   gradients into the accumulator that travels with the key block).
//!
//! `first` != 0 starts a merge accumulator: it is written without being read (no memset pass).
//!
//! Both work in 16-byte accesses, a thread a group of 8 (merge) or 4 (accumulate) elements: the
//! merge's row index and its weights (three exponentials and a logarithm) are then computed once
//! per 8 elements instead of once per element, which kept the one-element form from streaming at
//! copy rate. The host launches them only on 16-byte aligned buffers whose head dimension (merge)
//! or length (accumulate) is a multiple of the group.
use crate::dev::elem::{BF16, Elem, F16};
use crate::dev::math;
use crate::dev::mem::{Slice, SliceMut, load_chunk_ro};
use crate::dev::thread::{global_index_x, grid_threads_x};

/// One thread a group of 8 elements of one query row (the row is `i / head_dim`). The LSE is read
/// from `lse_acc` and the merged one written to `lse_out` (a second buffer: other threads of the row
/// still read the old value).
#[inline(always)]
unsafe fn merge<T: Elem>(
    o_acc: SliceMut<f32>,
    lse_acc: Slice<f32>,
    o_part: Slice<T>,
    lse_part: Slice<f32>,
    lse_out: SliceMut<f32>,
    head_dim: u64,
    first: u32,
) {
    // A 16-byte chunk holds 8 elements only for 16-bit types.
    const { assert!(T::PER_WORD == 2) };
    let step = grid_threads_x();
    let groups = o_part.len / 8;
    let mut g = global_index_x();
    while g < groups {
        let i = g * 8;
        let row = i / head_dim;
        let lp = lse_part.get_ro(row);
        crate::dev::shared::check_index(i as usize + 7, o_part.len as usize);
        // SAFETY: `i + 8 <= len` (above) and the host passes a 16-byte aligned buffer; the partial
        // output is only read.
        let words = unsafe { load_chunk_ro(o_part.chunks(), g) }.0;
        // Spelled out element by element: indexed loops over these arrays put them on the stack.
        let ([p0, p1], [p2, p3]) = (T::unpack_word(words[0]), T::unpack_word(words[1]));
        let ([p4, p5], [p6, p7]) = (T::unpack_word(words[2]), T::unpack_word(words[3]));
        let (o, lse) = if first != 0 {
            ([p0, p1, p2, p3, p4, p5, p6, p7], lp)
        } else {
            let la = lse_acc.get_ro(row);
            let m = math::max(la, lp);
            if m == f32::NEG_INFINITY {
                // Neither side has a visible key yet: the row stays empty (zero output, LSE -inf).
                ([0f32; 8], f32::NEG_INFINITY)
            } else {
                let lse = m + math::ln(math::exp(la - m) + math::exp(lp - m));
                let (wa, wp) = (math::exp(la - lse), math::exp(lp - lse));
                let ([a0, a1, a2, a3], [a4, a5, a6, a7]) = (o_acc.get4(i), o_acc.get4(i + 4));
                // An empty side contributes nothing, whatever its output holds.
                let mix = |a: f32, p: f32| {
                    (if wa == 0.0 { 0.0 } else { a * wa }) + (if wp == 0.0 { 0.0 } else { p * wp })
                };
                let o = [
                    mix(a0, p0),
                    mix(a1, p1),
                    mix(a2, p2),
                    mix(a3, p3),
                    mix(a4, p4),
                    mix(a5, p5),
                    mix(a6, p6),
                    mix(a7, p7),
                ];
                (o, lse)
            }
        };
        o_acc.set4(i, [o[0], o[1], o[2], o[3]]);
        o_acc.set4(i + 4, [o[4], o[5], o[6], o[7]]);
        if i % head_dim == 0 {
            lse_out.set(row, lse);
        }
        g += step;
    }
}

/// `acc += x`, f32, 4 elements a thread.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn ring_accumulate_f32(acc: SliceMut<f32>, x: Slice<f32>) {
    let step = grid_threads_x();
    let mut g = global_index_x();
    while g < x.len / 4 {
        let (a, b) = (acc.get4(g * 4), x.get4_ro(g * 4));
        acc.set4(g * 4, [a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3]]);
        g += step;
    }
}

macro_rules! ring_entry_points {
    ($($merge:ident: $t:ty;)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $merge(
            o_acc: SliceMut<f32>,
            lse_acc: Slice<f32>,
            o_part: Slice<$t>,
            lse_part: Slice<f32>,
            lse_out: SliceMut<f32>,
            head_dim: u64,
            first: u32,
        ) {
            unsafe { merge(o_acc, lse_acc, o_part, lse_part, lse_out, head_dim, first) }
        }
    )*};
}

ring_entry_points! {
    ring_merge_f16: F16;
    ring_merge_bf16: BF16;
}
