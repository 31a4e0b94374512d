//! Decoding attention: a few query rows (`seq_q`, 1 for token-by-token generation) against a long
//! key/value cache, dense or paged, with grouped-query heads and the keys split over CTAs
//! (split-KV), then the splits merged through their LSEs. The work is reading K and V once: a CTA
//! takes one (split, key/value head, sequence) and every query row of that head's group (`q_heads /
//! kv_heads` heads x `seq_q` rows), so each key is read once for all the rows that use it.
//!
//! - `decode_split_*`: four warps; a warp's lanes work in groups of 8, a group on one key at a time
//!   (two a step, their loads issued together), each lane holding `head_dim / 8` elements of the
//!   key, of the query rows and of the output rows. Scores are summed over the group with three
//!   butterfly shuffles; each group keeps an online softmax (base 2, the scale and `log2 e` folded
//!   into Q) over its keys. The 16 groups then merge: within a warp by shuffles, across warps
//!   through shared memory. Rows beyond [`DECODE_ROWS`] take further passes over the split's keys.
//! - `decode_merge_*`: per query row, the splits' `(O, LSE)` combined (`LSE = ln sum e^LSE_s`,
//!   `O = sum O_s e^(LSE_s - LSE)`), O rounded to the input dtype.
//!
//! Not yet run on a GPU: built and checked by ptxas only (no spills, no stack); the GPU tests and
//! the bench are written (`host/tests/gpu_attention_decode.rs`).
use crate::dev::elem::{BF16, Elem, F16};
use crate::dev::math;
use crate::dev::mem::{Slice, SliceMut, load_chunk_ro};
use crate::dev::shared::check_index;
use crate::dev::sync::sync_threads;
use crate::dev::thread::{
    block_dim_x, block_idx_x, block_idx_y, block_idx_z, global_index_x, grid_dim_x, lane_id,
    thread_idx_x, warp_id,
};
use crate::dev::warp::shfl_xor_f32;
use crate::params::attention::{
    DECODE_KEYS_PER_STEP, DECODE_ROWS, DECODE_THREADS, DecodeShape, MaskKind,
};

const ROWS: usize = DECODE_ROWS as usize;
// The row loops below are written out for four rows.
const _: () = assert!(ROWS == 4);
const WARPS: usize = (DECODE_THREADS / 32) as usize;
/// Lane groups a CTA: 8 lanes each.
const GROUPS: u32 = DECODE_THREADS / 8;
const _: () = assert!(DECODE_KEYS_PER_STEP == 2 * GROUPS);

crate::static_shared!(fn merge_m() -> [f32; WARPS * ROWS] as DECODE_MERGE_M);
crate::static_shared!(fn merge_l() -> [f32; WARPS * ROWS] as DECODE_MERGE_L);
crate::static_shared!(fn merge_acc() -> [f32; WARPS * ROWS * 128] as DECODE_MERGE_ACC);

/// `$body` for each of this lane's 16-byte chunks `$c < CH` (one or two), unrolled.
macro_rules! chunks {
    ($c:ident, $body:block) => {
        crate::unroll!($c in [0, 1] {
            if $c < CH $body
        })
    };
}

/// The 8 elements of a 16-byte chunk of 16-bit values, widened.
#[inline(always)]
fn widen<T: Elem>(w: [u32; 4]) -> [f32; 8] {
    let ([a, b], [c, d]) = (T::unpack_word(w[0]), T::unpack_word(w[1]));
    let ([e, f], [g, h]) = (T::unpack_word(w[2]), T::unpack_word(w[3]));
    [a, b, c, d, e, f, g, h]
}

/// Element offset of key `j` of sequence `b`, key/value head `h` (see [`DecodeShape`]).
#[inline(always)]
fn key_offset(sh: &DecodeShape, table: &Slice<u32>, b: u32, h: u32, j: u32) -> u64 {
    let t = b as u64 * sh.max_pages as u64 + (j / sh.page_size) as u64;
    check_index(t as usize, table.len as usize);
    // SAFETY: in range (the host sizes the table `batch * max_pages` and checks every sequence's
    // pages against it).
    let page = unsafe { *table.ptr.add(t as usize) } as u64;
    page * sh.page_stride + (j % sh.page_size) as u64 * sh.row_stride + h as u64 * sh.head_stride
}

/// One split of one (key/value head, sequence): every query row of the head's group, `ROWS` a pass.
/// `CH` 16-byte chunks a lane (`head_dim = 64 CH`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn split<T: Elem, const CH: usize>(
    q: Slice<T>,
    k: Slice<T>,
    v: Slice<T>,
    table: Slice<u32>,
    lens: Slice<u32>,
    o_part: SliceMut<f32>,
    lse_part: SliceMut<f32>,
    sh: DecodeShape,
) {
    const { assert!(T::PER_WORD == 2) };
    let d = 64 * CH;
    let (s, h, b) = (block_idx_x(), block_idx_y(), block_idx_z());
    let (lane, warp) = (lane_id(), warp_id());
    let (sub, group) = (lane % 8, warp * 4 + lane / 8);
    check_index(b as usize, lens.len as usize);
    // SAFETY: b < batch = lens.len (the host's launch).
    let len = unsafe { *lens.ptr.add(b as usize) };
    let k0 = s * sh.keys_per_split;
    let k1 = if k0 + sh.keys_per_split < len {
        k0 + sh.keys_per_split
    } else {
        len
    };
    let group_size = sh.q_heads / sh.kv_heads;
    let rows = group_size * sh.seq_q;
    let c2 = sh.scale * math::LOG2_E;
    // The row `r` of this head's group: query head and query row.
    let row_of = |r: u32| (h * group_size + r / sh.seq_q, r % sh.seq_q);
    let mut pass = 0;
    while pass * (ROWS as u32) < rows {
        // This lane's elements of the pass's query rows, scaled (rows past the group are zero).
        // Every loop over a register array is unrolled (`unroll!`): a run-time index would move the
        // array to local memory.
        let mut qv = [[0f32; 8]; 2 * ROWS];
        let mut limit = [-1i64; ROWS];
        crate::unroll!(r in [0, 1, 2, 3] {
            let rr = pass * ROWS as u32 + r as u32;
            if rr < rows {
                let (hq, i) = row_of(rr);
                let base = ((b * sh.q_heads + hq) * sh.seq_q + i) as u64 * d as u64;
                chunks!(c, {
                    let at = (base + (c * 64) as u64 + sub as u64 * 8) / 8;
                    check_index(at as usize * 8 + 7, q.len as usize);
                    // SAFETY: a row of Q (in range above), 16-byte aligned (D a multiple of 8,
                    // aligned base: the host checks).
                    let x = widen::<T>(unsafe { load_chunk_ro(q.chunks(), at) }.0);
                    crate::unroll!(e in [0, 1, 2, 3, 4, 5, 6, 7] {
                        qv[r * 2 + c][e] = x[e] * c2;
                    });
                });
                limit[r] = if sh.mask == MaskKind::Causal {
                    i as i64 + len as i64 - sh.seq_q as i64
                } else {
                    i64::MAX
                };
            }
        });
        let mut m = [f32::NEG_INFINITY; ROWS];
        let mut l = [0f32; ROWS];
        let mut acc = [[0f32; 8]; 2 * ROWS];
        let mut kb = k0;
        while kb < k1 {
            // Two keys a group a step, their loads issued before any use.
            let js = [kb + group, kb + GROUPS + group];
            let mut kw = [[[0u32; 4]; 2]; 2];
            let mut vw = [[[0u32; 4]; 2]; 2];
            crate::unroll!(u in [0, 1] {
                if js[u] < k1 {
                    let off = key_offset(&sh, &table, b, h, js[u]);
                    chunks!(c, {
                        let at = (off + (c * 64) as u64 + sub as u64 * 8) / 8;
                        check_index(at as usize * 8 + 7, k.len as usize);
                        // SAFETY: a key row (the host checks the table's pages and strides
                        // against the cache), 16-byte aligned.
                        unsafe {
                            kw[u][c] = load_chunk_ro(k.chunks(), at).0;
                            vw[u][c] = load_chunk_ro(v.chunks(), at).0;
                        }
                    });
                }
            });
            crate::unroll!(u in [0, 1] {
                let j = js[u];
                let mut dot = [0f32; ROWS];
                chunks!(c, {
                    let kx = widen::<T>(kw[u][c]);
                    crate::unroll!(r in [0, 1, 2, 3] {
                        crate::unroll!(e in [0, 1, 2, 3, 4, 5, 6, 7] {
                            dot[r] = math::fma(qv[r * 2 + c][e], kx[e], dot[r]);
                        });
                    });
                });
                crate::unroll!(r in [0, 1, 2, 3] {
                    dot[r] += shfl_xor_f32(dot[r], 1);
                    dot[r] += shfl_xor_f32(dot[r], 2);
                    dot[r] += shfl_xor_f32(dot[r], 4);
                });
                let vx = [widen::<T>(vw[u][0]), widen::<T>(vw[u][1])];
                crate::unroll!(r in [0, 1, 2, 3] {
                    // Past the split, masked, or a padding row: no weight.
                    if j < k1 && (j as i64) <= limit[r] {
                        let m_new = math::max(m[r], dot[r]);
                        let alpha = math::exp2(m[r] - m_new);
                        let p = math::exp2(dot[r] - m_new);
                        l[r] = l[r] * alpha + p;
                        chunks!(c, {
                            crate::unroll!(e in [0, 1, 2, 3, 4, 5, 6, 7] {
                                acc[r * 2 + c][e] = acc[r * 2 + c][e] * alpha + p * vx[c][e];
                            });
                        });
                        m[r] = m_new;
                    }
                });
            });
            kb += DECODE_KEYS_PER_STEP;
        }
        // The four groups of the warp: lanes `sub`, `sub + 8`, `sub + 16`, `sub + 24` hold the same
        // elements of different keys.
        crate::unroll!(x in [8, 16] {
            crate::unroll!(r in [0, 1, 2, 3] {
                let (mo, lo) = (shfl_xor_f32(m[r], x as u32), shfl_xor_f32(l[r], x as u32));
                let mn = math::max(m[r], mo);
                let (wa, wb) = if mn == f32::NEG_INFINITY {
                    (0.0, 0.0)
                } else {
                    (math::exp2(m[r] - mn), math::exp2(mo - mn))
                };
                l[r] = l[r] * wa + lo * wb;
                chunks!(c, {
                    crate::unroll!(e in [0, 1, 2, 3, 4, 5, 6, 7] {
                        let other = shfl_xor_f32(acc[r * 2 + c][e], x as u32);
                        acc[r * 2 + c][e] = acc[r * 2 + c][e] * wa + other * wb;
                    });
                });
                m[r] = mn;
            });
        });
        // The four warps, through shared memory.
        let (sm, sl, sa) = (merge_m(), merge_l(), merge_acc());
        if lane < 8 {
            crate::unroll!(r in [0, 1, 2, 3] {
                if lane == 0 {
                    sm.store(warp as usize * ROWS + r, m[r]);
                    sl.store(warp as usize * ROWS + r, l[r]);
                }
                chunks!(c, {
                    crate::unroll!(e in [0, 1, 2, 3, 4, 5, 6, 7] {
                        let col = c * 64 + sub as usize * 8 + e;
                        sa.store((warp as usize * ROWS + r) * 128 + col, acc[r * 2 + c][e]);
                    });
                });
            });
        }
        sync_threads();
        let mut t = thread_idx_x() as usize;
        while t < ROWS * d {
            let (r, col) = (t / d, t % d);
            let rr = pass * ROWS as u32 + r as u32;
            if rr < rows {
                let mut mx = f32::NEG_INFINITY;
                for w in 0..WARPS {
                    mx = math::max(mx, sm.load(w * ROWS + r));
                }
                let (mut tl, mut to) = (0f32, 0f32);
                if mx != f32::NEG_INFINITY {
                    for w in 0..WARPS {
                        let wt = math::exp2(sm.load(w * ROWS + r) - mx);
                        tl += sl.load(w * ROWS + r) * wt;
                        to += sa.load((w * ROWS + r) * 128 + col) * wt;
                    }
                }
                let (hq, i) = row_of(rr);
                let slot = (((b * sh.q_heads + hq) * sh.seq_q + i) * sh.splits + s) as u64;
                let empty = tl == 0.0;
                o_part.set(
                    slot * d as u64 + col as u64,
                    if empty { 0.0 } else { to / tl },
                );
                if col == 0 {
                    let lse = if empty {
                        f32::NEG_INFINITY
                    } else {
                        (mx + math::log2(tl)) * math::LN_2
                    };
                    lse_part.set(slot, lse);
                }
            }
            t += block_dim_x() as usize;
        }
        // The shared buffers are rewritten by the next pass.
        sync_threads();
        pass += 1;
    }
}

/// Row `i` of every (sequence, query head): its splits merged; one thread an output element.
#[inline(always)]
unsafe fn merge<T: Elem>(
    o_part: Slice<f32>,
    lse_part: Slice<f32>,
    o: SliceMut<T>,
    lse: SliceMut<f32>,
    head_dim: u64,
    splits: u64,
) {
    let step = grid_dim_x() as u64 * block_dim_x() as u64;
    let mut idx = global_index_x();
    while idx < o.len {
        let (row, col) = (idx / head_dim, idx % head_dim);
        let mut mx = f32::NEG_INFINITY;
        for s in 0..splits {
            mx = math::max(mx, lse_part.get_ro(row * splits + s));
        }
        let (mut tl, mut to) = (0f32, 0f32);
        if mx != f32::NEG_INFINITY {
            for s in 0..splits {
                let w = math::exp(lse_part.get_ro(row * splits + s) - mx);
                if w != 0.0 {
                    tl += w;
                    to += w * o_part.get_ro((row * splits + s) * head_dim + col);
                }
            }
        }
        let empty = tl == 0.0;
        o.set(idx, if empty { 0.0 } else { to / tl });
        if col == 0 {
            lse.set(
                row,
                if empty {
                    f32::NEG_INFINITY
                } else {
                    mx + math::ln(tl)
                },
            );
        }
        idx += step;
    }
}

macro_rules! decode_entry_points {
    ($($split:ident, $ch:literal: $t:ty;)*) => {$(
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "ptx-kernel" fn $split(
            q: Slice<$t>,
            k: Slice<$t>,
            v: Slice<$t>,
            table: Slice<u32>,
            lens: Slice<u32>,
            o_part: SliceMut<f32>,
            lse_part: SliceMut<f32>,
            shape: DecodeShape,
        ) {
            unsafe { split::<$t, $ch>(q, k, v, table, lens, o_part, lse_part, shape) }
        }
    )*};
}

decode_entry_points! {
    decode_split_d64_f16, 1: F16;
    decode_split_d128_f16, 2: F16;
    decode_split_d64_bf16, 1: BF16;
    decode_split_d128_bf16, 2: BF16;
}

macro_rules! merge_entry_points {
    ($($merge:ident: $t:ty;)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $merge(
            o_part: Slice<f32>,
            lse_part: Slice<f32>,
            o: SliceMut<$t>,
            lse: SliceMut<f32>,
            head_dim: u64,
            splits: u64,
        ) {
            unsafe { merge(o_part, lse_part, o, lse, head_dim, splits) }
        }
    )*};
}

merge_entry_points! {
    decode_merge_f16: F16;
    decode_merge_bf16: BF16;
}
