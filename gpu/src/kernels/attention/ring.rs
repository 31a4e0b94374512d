//! Ring (context-parallel) attention's two elementwise steps, both memory-bound and run between the
//! flash kernels of a ring step:
//! - `ring_merge_*`: folds one partial attention output into an f32 accumulator through the LSEs,
//!   `o = o_acc e^(lse_acc - m) + o_part e^(lse_part - m)` with `m = ln(e^lse_acc + e^lse_part)` per
//!   query row (the softmax over the union of two key sets, from the two partial softmaxes);
//! - `ring_accumulate_f32`: adds one f32 gradient accumulator into another (a ring step's key-block
//!   gradients into the accumulator that travels with the key block).
//!
//! `first` != 0 starts a merge accumulator: it is written without being read (no memset pass).
use crate::dev::elem::{BF16, Elem, F16};
use crate::dev::math;
use crate::dev::mem::{Slice, SliceMut};
use crate::dev::thread::{global_index_x, grid_threads_x};

/// One thread an element; element `i` belongs to query row `i / head_dim`. The LSE is read from
/// `lse_acc` and the merged one written to `lse_out` (a second buffer: other threads of the row still
/// read the old value).
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
    let step = grid_threads_x();
    let mut i = global_index_x();
    while i < o_part.len {
        let row = i / head_dim;
        let lp = lse_part.get_ro(row);
        let (o, lse) = if first != 0 {
            (o_part.get(i), lp)
        } else {
            let la = lse_acc.get_ro(row);
            let m = math::max(la, lp);
            if m == f32::NEG_INFINITY {
                // Neither side has a visible key yet: the row stays empty (zero output, LSE -inf).
                (0.0, f32::NEG_INFINITY)
            } else {
                let lse = m + math::ln(math::exp(la - m) + math::exp(lp - m));
                let (wa, wp) = (math::exp(la - lse), math::exp(lp - lse));
                // An empty side contributes nothing, whatever its output holds.
                let a = if wa == 0.0 { 0.0 } else { o_acc.get(i) * wa };
                let p = if wp == 0.0 { 0.0 } else { o_part.get(i) * wp };
                (a + p, lse)
            }
        };
        o_acc.set(i, o);
        if i % head_dim == 0 {
            lse_out.set(row, lse);
        }
        i += step;
    }
}

/// `acc += x`, f32.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn ring_accumulate_f32(acc: SliceMut<f32>, x: Slice<f32>) {
    let step = grid_threads_x();
    let mut i = global_index_x();
    while i < x.len {
        acc.set(i, acc.get(i) + x.get_ro(i));
        i += step;
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
