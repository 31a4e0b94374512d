//! Naive attention, the readable GPU reference: one block per query row. The row's scores are
//! materialised in a global f32 scratch row (`scale * q . k_j`, -inf where masked), the block finds
//! their max and sum, overwrites them with the probabilities, and each thread then accumulates output
//! columns `sum_j p_j v_j`. f32 math throughout; f16/bf16/f32 storage.
//!
//! Backward, two kernels, no atomics (the same bits on every run):
//! 1. [`backward_rows`], one block per query row `i`: recompute the row's probabilities `P_i` as the
//!    forward does, then `dP_ij = dO_i . V_j`, `D_i = sum_j P_ij dP_ij`, `dS_ij = P_ij (dP_ij - D_i)`;
//!    `P` and `dS` rows stay in two global f32 scratch matrices, and `dQ_i = scale sum_j dS_ij K_j`.
//! 2. [`backward_keys`], one block per key `j`: `dV_j = sum_i P_ij dO_i` and
//!    `dK_j = scale sum_i dS_ij Q_i`, reading the column `j` of the scratch matrices pass 1 wrote
//!    (the launches are stream-ordered).
use crate::dev::elem::{BF16, Elem, F16};
use crate::dev::mem::{Slice, SliceMut};
use crate::dev::sync::sync_threads;
use crate::dev::thread::{block_dim_x, block_idx_x, block_idx_y, thread_idx_x};
use crate::dev::{block, math};
use crate::params::attention::naive::MAX_HEAD_DIM;
use crate::params::attention::{AttentionShape, MaskKind};

crate::static_shared!(fn query_row() -> [f32; MAX_HEAD_DIM] as NAIVE_ATTENTION_QUERY_ROW);
crate::static_shared!(fn grad_row() -> [f32; MAX_HEAD_DIM] as NAIVE_ATTENTION_GRAD_ROW);

/// Keys query `i` sees: all `seq_k`, or with the causal mask those `j <= i + seq_k - seq_q`
/// (bottom-right aligned; 0 for a query above the first key).
#[inline(always)]
fn visible_keys(mask: MaskKind, i: u64, sq: u64, sk: u64) -> u64 {
    match mask {
        MaskKind::None => sk,
        MaskKind::Causal => (i as i64 + sk as i64 - sq as i64 + 1).clamp(0, sk as i64) as u64,
    }
}

/// The first query that sees key `j`: 0, or with the causal mask `j + seq_q - seq_k` (clamped to
/// `0..=seq_q`; `seq_q` means no query sees it).
#[inline(always)]
fn first_query(mask: MaskKind, j: u64, sq: u64, sk: u64) -> u64 {
    match mask {
        MaskKind::None => 0,
        MaskKind::Causal => (j as i64 + sq as i64 - sk as i64).clamp(0, sq as i64) as u64,
    }
}

/// One query row's `exp(s_j - max)` into `out[row + j]` for every key `j < sk` (0 past `visible`, all 0
/// when the row sees no key), from the query row staged in `query_row()` (after a barrier); returns the
/// row's max score and the sum of the exponentials (both block-uniform). Each thread reads back only
/// the scores it wrote; the barriers inside the block reductions order the rest. Shared by the forward
/// and the backward so the backward recomputes exactly the forward's probabilities.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn row_exponentials<T: Elem>(
    k: &Slice<T>,
    keys: u64,
    d: u64,
    sk: u64,
    visible: u64,
    scale: f32,
    out: &SliceMut<f32>,
    row: u64,
) -> (f32, f32) {
    let (tid, nt) = (thread_idx_x() as u64, block_dim_x() as u64);
    let qs = query_row();
    let read = out.as_slice();
    let mut m = f32::NEG_INFINITY;
    let mut j = tid;
    while j < sk {
        let s = if j < visible {
            let mut dot = 0.0f32;
            for c in 0..d {
                dot += qs.load(c as usize) * k.get(keys + j * d + c);
            }
            dot * scale
        } else {
            f32::NEG_INFINITY
        };
        out.set(row + j, s);
        m = math::max(m, s);
        j += nt;
    }
    let m = block::reduce_max(m);
    let mut l = 0.0f32;
    let mut j = tid;
    while j < sk {
        let e = if m == f32::NEG_INFINITY {
            0.0
        } else {
            math::exp(read.get(row + j) - m)
        };
        out.set(row + j, e);
        l += e;
        j += nt;
    }
    (m, block::reduce_sum(l))
}

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
    let visible = visible_keys(p.mask, i, sq, sk);
    let (m, l) = row_exponentials(&k, keys, d, sk, visible, p.scale, &scratch, scores);
    // No key seen: O = 0 and LSE = -inf; a NaN sum (a NaN score the row sees) gives NaN in both.
    let inv = if l != 0.0 { 1.0 / l } else { 0.0 };

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
        let row_lse = if l != 0.0 {
            m + math::ln(l)
        } else {
            f32::NEG_INFINITY
        };
        lse.set(bh * sq + i, row_lse);
    }
}

/// Backward pass 1. Grid `(seq_q, batch*heads of this launch)`; `probs` and `dscores` hold `seq_k`
/// f32 per row of the launch (row `(local * seq_q + i)`). Writes the whole row of both (0 where
/// masked) and dQ row `i`. A row that sees no key gets `P = dS = 0` and `dQ = 0`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn backward_rows<T: Elem>(
    q: Slice<T>,
    k: Slice<T>,
    v: Slice<T>,
    d_o: Slice<T>,
    dq: SliceMut<T>,
    probs: SliceMut<f32>,
    dscores: SliceMut<f32>,
    p: AttentionShape,
) {
    let (tid, nt) = (thread_idx_x() as u64, block_dim_x() as u64);
    let (sq, sk, d) = (p.seq_q as u64, p.seq_k as u64, p.head_dim as u64);
    let i = block_idx_x() as u64;
    let local = block_idx_y() as u64;
    let bh = p.bh_offset as u64 + local;
    let q_row = (bh * sq + i) * d; // first element of row i of Q, dO and dQ
    let keys = bh * sk * d; // first element of this head's K and V
    let scores = (local * sq + i) * sk; // this row's scratch
    let (read_probs, read_ds) = (probs.as_slice(), dscores.as_slice());

    let (qs, gs) = (query_row(), grad_row());
    let mut c = tid;
    while c < d {
        qs.store(c as usize, q.get(q_row + c));
        gs.store(c as usize, d_o.get(q_row + c));
        c += nt;
    }
    sync_threads();

    let visible = visible_keys(p.mask, i, sq, sk);
    // Unnormalised probabilities and their sum, exactly as the forward.
    let (_, l) = row_exponentials(&k, keys, d, sk, visible, p.scale, &probs, scores);
    let inv = if l > 0.0 { 1.0 / l } else { 0.0 };

    // P_ij, dP_ij = dO_i . V_j (0 where masked: P is 0 there too), and D_i = sum_j P_ij dP_ij.
    let mut dot_row = 0.0f32;
    let mut j = tid;
    while j < sk {
        let pj = read_probs.get(scores + j) * inv;
        let dp = if j < visible {
            let mut dot = 0.0f32;
            for c in 0..d {
                dot += gs.load(c as usize) * v.get(keys + j * d + c);
            }
            dot
        } else {
            0.0
        };
        probs.set(scores + j, pj);
        dscores.set(scores + j, dp);
        dot_row += pj * dp;
        j += nt;
    }
    let dot_row = block::reduce_sum(dot_row);

    // dS_ij = P_ij (dP_ij - D_i), again each thread on its own entries.
    let mut j = tid;
    while j < sk {
        let ds = read_probs.get(scores + j) * (read_ds.get(scores + j) - dot_row);
        dscores.set(scores + j, ds);
        j += nt;
    }
    // Publishes the dS row to every thread of the block.
    sync_threads();

    let mut c = tid;
    while c < d {
        let mut acc = 0.0f32;
        for j in 0..visible {
            acc += read_ds.get(scores + j) * k.get(keys + j * d + c);
        }
        dq.set(q_row + c, acc * p.scale);
        c += nt;
    }
}

/// Backward pass 2. Grid `(seq_k, batch*heads of this launch)`; reads the `P` and `dS` matrices of
/// pass 1 (column `j`). Each thread owns head-dim columns `c` of dK and dV row `j`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn backward_keys<T: Elem>(
    q: Slice<T>,
    d_o: Slice<T>,
    probs: Slice<f32>,
    dscores: Slice<f32>,
    dk: SliceMut<T>,
    dv: SliceMut<T>,
    p: AttentionShape,
) {
    let (tid, nt) = (thread_idx_x() as u64, block_dim_x() as u64);
    let (sq, sk, d) = (p.seq_q as u64, p.seq_k as u64, p.head_dim as u64);
    let j = block_idx_x() as u64;
    let local = block_idx_y() as u64;
    let bh = p.bh_offset as u64 + local;
    let k_row = (bh * sk + j) * d; // first element of row j of dK and dV
    let queries = bh * sq * d; // first element of this head's Q and dO
    let column = local * sq * sk + j; // element (0, j) of this head's scratch
    let first = first_query(p.mask, j, sq, sk);

    let mut c = tid;
    while c < d {
        let (mut acc_v, mut acc_k) = (0.0f32, 0.0f32);
        for i in first..sq {
            let at = column + i * sk;
            acc_v += probs.get(at) * d_o.get(queries + i * d + c);
            acc_k += dscores.get(at) * q.get(queries + i * d + c);
        }
        dv.set(k_row + c, acc_v);
        dk.set(k_row + c, acc_k * p.scale);
        c += nt;
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

macro_rules! naive_backward_entry_points {
    ($($rows:ident, $keys:ident: $t:ty;)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $rows(
            q: Slice<$t>, k: Slice<$t>, v: Slice<$t>, d_o: Slice<$t>, dq: SliceMut<$t>,
            probs: SliceMut<f32>, dscores: SliceMut<f32>, shape: AttentionShape,
        ) {
            unsafe { backward_rows(q, k, v, d_o, dq, probs, dscores, shape) }
        }
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $keys(
            q: Slice<$t>, d_o: Slice<$t>, probs: Slice<f32>, dscores: Slice<f32>,
            dk: SliceMut<$t>, dv: SliceMut<$t>, shape: AttentionShape,
        ) {
            unsafe { backward_keys(q, d_o, probs, dscores, dk, dv, shape) }
        }
    )*};
}

naive_backward_entry_points! {
    attention_naive_bwd_rows_f32, attention_naive_bwd_keys_f32: f32;
    attention_naive_bwd_rows_f16, attention_naive_bwd_keys_f16: F16;
    attention_naive_bwd_rows_bf16, attention_naive_bwd_keys_bf16: BF16;
}

naive_entry_points! {
    attention_naive_f32: f32;
    attention_naive_f16: F16;
    attention_naive_bf16: BF16;
}
