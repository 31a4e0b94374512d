//! Naive attention, the readable GPU reference: one block per query row. The row's scores are
//! materialised in a global f32 scratch row (`scale * q . k_j`, -inf where masked), the block finds
//! their max and sum, overwrites them with the probabilities, and each thread then accumulates output
//! columns `sum_j p_j v_j`. f32 math throughout; f16/bf16/f32 storage.
use crate::dev::elem::{BF16, Elem, F16};
use crate::dev::mem::{Slice, SliceMut};
use crate::dev::sync::sync_threads;
use crate::dev::thread::{block_dim_x, block_idx_x, block_idx_y, thread_idx_x};
use crate::dev::{block, math};
use crate::params::attention::naive::MAX_HEAD_DIM;
use crate::params::attention::{AttentionShape, MaskKind};

crate::static_shared!(fn query_row() -> [f32; MAX_HEAD_DIM] as NAIVE_ATTENTION_QUERY_ROW);

/// Grid `(seq_q, batch*heads of this launch)`; `scratch` holds `seq_k` f32 per row of the launch.
#[inline(always)]
unsafe fn naive<T: Elem>(
    q: Slice<T>,
    k: Slice<T>,
    v: Slice<T>,
    o: SliceMut<T>,
    lse: SliceMut<f32>,
    scratch: SliceMut<f32>,
    p: AttentionShape,
) {
    let (tid, nt) = (thread_idx_x() as u64, block_dim_x() as u64);
    let (sq, sk, d) = (p.seq_q as u64, p.seq_k as u64, p.head_dim as u64);
    let i = block_idx_x() as u64;
    let local = block_idx_y() as u64;
    let bh = p.bh_offset as u64 + local;
    let q_row = (bh * sq + i) * d;
    let keys = bh * sk * d; // first element of this head's K and V
    let scores = (local * sq + i) * sk; // this row's scratch
    let read_scratch = scratch.as_slice();

    let qs = query_row();
    let mut c = tid;
    while c < d {
        qs.store(c as usize, q.get(q_row + c));
        c += nt;
    }
    sync_threads();

    // Causal: query i sees key j iff j <= i + sk - sq (bottom-right aligned).
    let visible = match p.mask {
        MaskKind::None => sk,
        MaskKind::Causal => (i as i64 + sk as i64 - sq as i64 + 1).clamp(0, sk as i64) as u64,
    };
    let mut m = f32::NEG_INFINITY;
    let mut j = tid;
    while j < sk {
        let s = if j < visible {
            let mut dot = 0.0f32;
            for c in 0..d {
                dot += qs.load(c as usize) * k.get(keys + j * d + c);
            }
            dot * p.scale
        } else {
            f32::NEG_INFINITY
        };
        scratch.set(scores + j, s);
        m = math::max(m, s);
        j += nt;
    }
    let m = block::reduce_max(m);

    // Each thread rewrites the scores it wrote itself; the barrier in reduce_sum publishes them.
    let mut l = 0.0f32;
    let mut j = tid;
    while j < sk {
        let e = if m == f32::NEG_INFINITY {
            0.0
        } else {
            math::exp(read_scratch.get(scores + j) - m)
        };
        scratch.set(scores + j, e);
        l += e;
        j += nt;
    }
    let l = block::reduce_sum(l);
    let inv = if l > 0.0 { 1.0 / l } else { 0.0 };

    let mut c = tid;
    while c < d {
        let mut acc = 0.0f32;
        for j in 0..sk {
            acc += read_scratch.get(scores + j) * v.get(keys + j * d + c);
        }
        o.set(q_row + c, acc * inv);
        c += nt;
    }
    if tid == 0 {
        let row_lse = if l > 0.0 {
            m + math::ln(l)
        } else {
            f32::NEG_INFINITY
        };
        lse.set(bh * sq + i, row_lse);
    }
}

macro_rules! naive_entry_points {
    ($($name:ident: $t:ty;)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(
            q: Slice<$t>, k: Slice<$t>, v: Slice<$t>, o: SliceMut<$t>, lse: SliceMut<f32>,
            scratch: SliceMut<f32>, shape: AttentionShape,
        ) {
            unsafe { naive(q, k, v, o, lse, scratch, shape) }
        }
    )*};
}

naive_entry_points! {
    attention_naive_f32: f32;
    attention_naive_f16: F16;
    attention_naive_bf16: BF16;
}
