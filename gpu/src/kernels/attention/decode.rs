//! Decoding attention: a few query rows (`seq_q`, 1 for token-by-token generation) against a long
//! key/value cache, dense or paged, with grouped-query heads and the keys split over CTAs
//! (split-KV), then the splits merged through their LSEs. The work is reading K and V once: a CTA
//! takes one (split, key/value head, sequence) and every query row of that head's group (`q_heads /
//! kv_heads` heads x `seq_q` rows), so each key is read once for all the rows that use it.
//!
//! - `decode_split_*`: four warps. K and V arrive in 64-key tiles through a three-stage ring of
//!   shared memory filled by `cp.async`, so two tiles of loads are in flight while one is read
//!   (registers alone could not hold enough loads in flight to read at copy speed). A warp's lanes
//!   work in groups of 8, a group on four keys of each tile (two at a time), each lane holding
//!   an eighth of the tile's columns of the key, of the query rows and of the output rows. The group's
//!   eight partial scores a step (two keys, four rows) are summed by recursive halving, each lane
//!   left with one whole score (7 shuffles), which it masks, then gathered (8); each group keeps an
//!   online softmax (base 2, the scale and `log2 e` folded into Q) over its keys, rescaling once
//!   per two keys. The groups then merge: within a warp by shuffles, across warps through shared
//!   memory. Rows beyond [`DECODE_ROWS`] take further passes over the split's keys.
//! - At 256 columns (`decode_split_d256_*`) a group has 16 lanes, each two chunks of a row, and
//!   takes eight keys of a tile; the CTA's 192 KiB ring leaves one CTA an SM, and holds the
//!   warps' O rows for their merge once the keys are read.
//! - `decode_split_general_*`: the same for a head dim narrower than the tile (multiples of 8 up
//!   to 256 on the tile of 64, 128 or 256 columns that holds them: the tile's columns past the
//!   head dim are zero-filled on load, so they add nothing to a score or to O, and are not
//!   stored), the softcap and ALiBi's bias (on each score once the group has summed it, as the
//!   FlashAttention forward: the cap, then the bias).
//! - `decode_merge_*`: per query row, the splits' `(O, LSE)` combined (`LSE = ln sum e^LSE_s`,
//!   `O = sum O_s e^(LSE_s - LSE)`), O rounded to the input dtype.
//!
use crate::dev::copy::{cp_async_16, cp_async_commit, cp_async_wait};
use crate::dev::elem::{BF16, Elem, F16};
use crate::dev::math;
use crate::dev::mem::{Slice, SliceMut, load_chunk_ro};
use crate::dev::shared::check_index;
use crate::dev::shared::{SharedScalar, dynamic_base, ld_shared_v4};
use crate::dev::sync::sync_threads;
use crate::dev::thread::{
    block_dim_x, block_idx_x, block_idx_y, block_idx_z, lane_id, thread_idx_x, warp_id,
};
use crate::dev::warp::{shfl_idx_f32, shfl_xor_f32};
use crate::params::attention::{
    DECODE_MAX_SPLITS as MAX_SPLITS, DECODE_ROWS, DECODE_STAGES, DECODE_THREADS, DECODE_TILE_KEYS,
    DecodeShape, MaskKind, NO_WINDOW,
};

use super::alibi_slope_at;

const ROWS: usize = DECODE_ROWS as usize;
// The row loops below are written out for four rows.
const _: () = assert!(ROWS == 4);
const WARPS: usize = (DECODE_THREADS / 32) as usize;
const TILE_KEYS: u32 = DECODE_TILE_KEYS;
const STAGES: u32 = DECODE_STAGES;

/// Lanes of a group at a tile of `64 ch` columns: 8, or 16 at 256 columns (a lane holds at most
/// two 16-byte chunks of a row: four, for four rows of Q and of O, would not fit the registers).
const fn group_lanes(ch: usize) -> u32 {
    if ch > 2 { 16 } else { 8 }
}

/// A lane's 16-byte chunks of a row (one or two).
const fn lane_chunks(ch: usize) -> usize {
    ch * 8 / group_lanes(ch) as usize
}

// Every tile splits into whole pairs of keys a group: 4 keys a group of 8 lanes, 8 of 16.
const _: () = {
    let mut ch = 1;
    while ch <= 4 {
        let groups = DECODE_THREADS / group_lanes(ch);
        assert!(TILE_KEYS % groups == 0 && (TILE_KEYS / groups) % 2 == 0 && lane_chunks(ch) <= 2);
        ch *= 2;
    }
};

crate::static_shared!(fn merge_m() -> [f32; WARPS * ROWS] as DECODE_MERGE_M);
crate::static_shared!(fn merge_l() -> [f32; WARPS * ROWS] as DECODE_MERGE_L);
crate::static_shared!(fn merge_acc() -> [f32; WARPS * ROWS * 128] as DECODE_MERGE_ACC);
crate::static_shared!(fn merge_w() -> [f32; MAX_SPLITS as usize] as DECODE_MERGE_W);
// Per row of a pass: the keys it sees, `begin..end` (u32 bits), and the general kernels' ALiBi
// slope (base 2) and aligned position `i + len - seq_q` (i32 bits). Read per score from here (by
// the lane that holds it): as registers of every lane they spilled D = 128.
const ROW_BEGIN: usize = 0;
const ROW_END: usize = ROWS;
const ROW_SLOPE: usize = 2 * ROWS;
const ROW_POS: usize = 3 * ROWS;
crate::static_shared!(fn row_info() -> [f32; 4 * ROWS] as DECODE_ROW_INFO);

/// `$body` for each of this lane's 16-byte chunks `$c < lane_chunks(CH)` (one or two), unrolled.
macro_rules! chunks {
    ($c:ident, $body:block) => {
        crate::unroll!($c in [0, 1] {
            if $c < lane_chunks(CH) $body
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

/// Element offset of key `j` of sequence `b`, key/value head `h` (see [`DecodeShape`]); with an
/// empty block table (a dense cache) sequence `b` is page `b`, whose keys are rows (no division).
#[inline(always)]
fn key_offset(sh: &DecodeShape, table: &Slice<u32>, b: u32, h: u32, j: u32) -> u64 {
    if table.len == 0 {
        return b as u64 * sh.page_stride + h as u64 * sh.head_stride + j as u64 * sh.row_stride;
    }
    let t = b as u64 * sh.max_pages as u64 + (j / sh.page_size) as u64;
    check_index(t as usize, table.len as usize);
    // SAFETY: in range (the host sizes the table `batch * max_pages` and checks every sequence's
    // pages against it).
    let page = unsafe { *table.ptr.add(t as usize) } as u64;
    page * sh.page_stride + (j % sh.page_size) as u64 * sh.row_stride + h as u64 * sh.head_stride
}

/// Bytes of one K (or V) tile: `TILE_KEYS` rows of `d` 16-bit elements.
#[inline(always)]
fn tile_bytes(d: u32) -> u32 {
    TILE_KEYS * d * 2
}

/// Bytes of one stage: its K tile, then its V tile.
#[inline(always)]
fn stage_bytes(d: u32) -> u32 {
    2 * tile_bytes(d)
}

/// Starts the copies of keys `kt..kt + TILE_KEYS` of K and V into stage `stage` (this thread's
/// share: `CH * 4` chunks of 16 bytes of each); keys at or past `k1`, and the tile's columns past
/// the head dim, are zero-filled without a read.
///
/// # Safety
/// Stage `stage` is idle: no thread reads it until a wait covering this thread's next commit and a
/// barrier after it.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn load_tile<T: Elem, const CH: usize, const GENERAL: bool>(
    sh: &DecodeShape,
    k: &Slice<T>,
    v: &Slice<T>,
    table: &Slice<u32>,
    b: u32,
    h: u32,
    kt: u32,
    k1: u32,
    stage: u32,
) {
    let d = 64 * CH as u32;
    let per_row = d / 8; // 16-byte chunks a row
    let k_base = dynamic_base() + stage * stage_bytes(d);
    // A plain loop: unrolled, its addresses would take registers the scores need.
    for i in 0..4 * CH as u32 {
        let c = thread_idx_x() + i * DECODE_THREADS;
        let (row, chunk) = (c / per_row, c % per_row);
        let j = kt + row;
        let fill = j < k1 && (!GENERAL || chunk < sh.head_dim / 8);
        let off = if fill {
            key_offset(sh, table, b, h, j) + chunk as u64 * 8
        } else {
            0
        };
        check_index(off as usize + 7, k.len.min(v.len) as usize);
        let dst = k_base + (row * d + chunk * 8) * 2;
        // SAFETY: when `fill`, a chunk of a key row (the host checks the table's pages and strides
        // against the cache), 16-byte aligned (aligned bases, D a multiple of 8); otherwise not
        // read. The destination is inside the idle stage (the caller's).
        unsafe {
            cp_async_16(dst, k.ptr.add(off as usize) as *const u8, fill);
            cp_async_16(
                dst + tile_bytes(d),
                v.ptr.add(off as usize) as *const u8,
                fill,
            );
        }
    }
}

/// One split of one (key/value head, sequence): every query row of the head's group, `ROWS` a pass.
/// `CH` 16-byte chunks a lane (the tile's width `64 CH`). `GENERAL` (the `_general_` kernels): a
/// head dim narrower than the tile, the softcap and ALiBi slopes of `sh`; otherwise the head dim
/// is the tile's and the scores are plain.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn split<T: Elem, const CH: usize, const GENERAL: bool>(
    q: Slice<T>,
    k: Slice<T>,
    v: Slice<T>,
    table: Slice<u32>,
    lens: Slice<u32>,
    o_part: SliceMut<f32>,
    lse_part: SliceMut<f32>,
    o: SliceMut<T>,
    lse: SliceMut<f32>,
    sh: DecodeShape,
) {
    const { assert!(T::PER_WORD == 2) };
    // The tile's width (shared memory, the lanes' elements) and the head dim (Q, O: rows of `hd`).
    let d = 64 * CH;
    let hd = if GENERAL { sh.head_dim as usize } else { d };
    let (s, h, b) = (block_idx_x(), block_idx_y(), block_idx_z());
    let (lane, warp) = (lane_id(), warp_id());
    // Lane groups of `gl` lanes: chunk `c` of lane `sub` holds columns `8 (gl c + sub)..+8`.
    let gl = group_lanes(CH);
    let groups = DECODE_THREADS / gl;
    let per_group = TILE_KEYS / groups;
    let (sub, group) = (lane % gl, warp * (32 / gl) + lane / gl);
    let lane_col = |c: usize| 8 * (gl as usize * c + sub as usize);
    // Without lengths (a dense cache) every sequence has `dense_len` keys.
    let len = if lens.len == 0 {
        sh.dense_len
    } else {
        check_index(b as usize, lens.len as usize);
        // SAFETY: b < batch = lens.len (the host's launch).
        unsafe { *lens.ptr.add(b as usize) }
    };
    // Under a window's left side the splits start at the first key the first row sees.
    let off = len as i64 - sh.seq_q as i64;
    let windowed = sh.window_left != NO_WINDOW;
    let start = if windowed {
        (off - sh.window_left as i64).clamp(0, len as i64) as u32
    } else {
        0
    };
    let k0 = (start + s * sh.keys_per_split).min(len);
    let k1 = if k0 + sh.keys_per_split < len {
        k0 + sh.keys_per_split
    } else {
        len
    };
    // The window's right side (the causal mask's 0; NO_WINDOW: none).
    let right = if sh.mask == MaskKind::Causal {
        0
    } else {
        sh.window_right
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
        crate::unroll!(r in [0, 1, 2, 3] {
            let rr = pass * ROWS as u32 + r as u32;
            if rr < rows {
                let (hq, i) = row_of(rr);
                let base = ((b * sh.q_heads + hq) * sh.seq_q + i) as u64 * hd as u64;
                chunks!(c, {
                    // A lane whose chunk lies past a narrower head dim loads the row's last chunk
                    // instead: finite values that meet only zeros (K's columns past the head dim
                    // are zero-filled), so they add nothing. (A predicated load spilled D = 128.)
                    let col = lane_col(c).min(hd - 8);
                    let at = (base + col as u64) / 8;
                    check_index(at as usize * 8 + 7, q.len as usize);
                    // SAFETY: a chunk of a row of Q (in range above), 16-byte aligned (the head
                    // dim a multiple of 8, aligned base: the host checks).
                    let x = widen::<T>(unsafe { load_chunk_ro(q.chunks(), at) }.0);
                    crate::unroll!(e in [0, 1, 2, 3, 4, 5, 6, 7] {
                        qv[r * 2 + c][e] = x[e] * c2;
                    });
                });
            }
            if thread_idx_x() == 0 {
                // Row r sees keys begin..end (the split's, or its window's and causal limits;
                // none for padding rows). Read after the tile loop's first barrier; the last
                // pass's reads ended before the barrier at its end.
                let (mut begin, mut end) = (0u32, 0u32);
                if rr < rows {
                    let (hq, i) = row_of(rr);
                    end = if right != NO_WINDOW {
                        // Keys j <= i + len - seq_q + right, i.e. below i + 1 + off + right (in
                        // i64: it can be negative), within the split.
                        (i as i64 + 1 + off + right as i64).clamp(0, k1 as i64) as u32
                    } else {
                        k1
                    };
                    begin = if windowed {
                        (i as i64 + off - sh.window_left as i64).clamp(0, k1 as i64) as u32
                    } else {
                        0
                    };
                    if GENERAL {
                        // The slope times log2 e (the kernel's scores are base 2); 0 without slopes.
                        row_info().store(
                            ROW_SLOPE + r,
                            if sh.alibi_slopes == 0 {
                                0.0
                            } else {
                                // SAFETY: a nonzero address, from the host's validated slopes.
                                let at = (sh.alibi_slopes, sh.alibi_batch);
                                (unsafe { alibi_slope_at(at, b, hq) }) * math::LOG2_E
                            },
                        );
                        let pos = (i as i64 + off) as i32 as u32;
                        row_info().store(ROW_POS + r, f32::from_bits(pos));
                    }
                }
                row_info().store(ROW_BEGIN + r, f32::from_bits(begin));
                row_info().store(ROW_END + r, f32::from_bits(end));
            }
        });
        let mut m = [f32::NEG_INFINITY; ROWS];
        let mut l = [0f32; ROWS];
        let mut acc = [[0f32; 8]; 2 * ROWS];
        // K and V come through a ring of `STAGES` shared-memory tiles filled by `cp.async`, so a
        // CTA keeps up to `STAGES - 1` tiles (64 KiB at D = 128) of loads in flight without holding
        // them in registers: that, not arithmetic, is what reading the cache at copy speed needs.
        let n_tiles = k1.saturating_sub(k0).div_ceil(TILE_KEYS);
        crate::unroll!(t in [0, 1] {
            const { assert!(STAGES == 3) };
            if (t as u32) < n_tiles {
                // SAFETY: stage `t` is idle (no read of it before the loop's first barrier).
                unsafe { load_tile::<T, CH, GENERAL>(&sh, &k, &v, &table, b, h, k0 + t as u32 * TILE_KEYS, k1, t as u32) };
            }
            cp_async_commit();
        });
        for t in 0..n_tiles {
            // Tile `t` has landed, and every thread is done reading tile `t - 1`, whose stage the
            // load below refills.
            cp_async_wait::<{ STAGES - 2 }>();
            sync_threads();
            let ahead = t + STAGES - 1;
            if ahead < n_tiles {
                // SAFETY: stage `ahead % STAGES` = `(t - 1) % STAGES`, idle since the barrier.
                unsafe {
                    load_tile::<T, CH, GENERAL>(
                        &sh,
                        &k,
                        &v,
                        &table,
                        b,
                        h,
                        k0 + ahead * TILE_KEYS,
                        k1,
                        ahead % STAGES,
                    )
                };
            }
            cp_async_commit();
            let kt = k0 + t * TILE_KEYS;
            let k_base = dynamic_base() + (t % STAGES) * stage_bytes(d as u32);
            let v_base = k_base + tile_bytes(d as u32);
            // This group's keys of the tile (four, or eight with 16-lane groups), two at a time:
            // scores first, then one softmax update for the pair (one rescale of the
            // accumulators per two keys, not per key; four at a time would not fit D = 128's
            // registers). A loop, not unrolled: the pairs interleaved would not fit the registers.
            for half in 0..per_group / 2 {
                // This lane's partial dot products: `dot[u][r]` of key `2 half + u` of the group
                // and row `r`.
                let mut dot = [[0f32; ROWS]; 2];
                crate::unroll!(u in [0, 1] {
                    let row = group + (2 * half + u as u32) * groups;
                    chunks!(c, {
                        // SAFETY: inside this stage's K tile (row < TILE_KEYS, column < d),
                        // 16-byte aligned; the barrier above ordered its copy before this read.
                        let kx = widen::<T>(unsafe {
                            ld_shared_v4(k_base + (row * d as u32 + lane_col(c) as u32) * 2)
                        });
                        crate::unroll!(r in [0, 1, 2, 3] {
                            crate::unroll!(e in [0, 1, 2, 3, 4, 5, 6, 7] {
                                dot[u][r] = math::fma(qv[r * 2 + c][e], kx[e], dot[u][r]);
                            });
                        });
                    });
                });
                // Summed over the group, lane `sub` holding the score of key `sub % 8 / 4`, row
                // `sub % 4`: its modifications and mask once, then every lane gathers all eight.
                let mut score = group_sum_scatter(&dot, sub, gl);
                let (u_me, r_me) = (sub % 8 / 4, sub % 4);
                let j = kt + group + (2 * half + u_me) * groups;
                if GENERAL {
                    // The softcap, then ALiBi's bias (base 2; a zero slope without one). The
                    // cap's branch is uniform.
                    if sh.softcap_k != 0.0 {
                        score = sh.softcap_k * math::tanh(score * sh.softcap_inv_k);
                    }
                    // (Rows past the group: masked below whatever this gives.)
                    let pos = row_info().load(ROW_POS + r_me as usize).to_bits() as i32;
                    let dist = math::abs((pos - j as i32) as f32);
                    score = math::fma(-row_info().load(ROW_SLOPE + r_me as usize), dist, score);
                }
                // Past the split, masked, or a padding row: no weight.
                let info = |at: usize| row_info().load(at + r_me as usize).to_bits();
                if j >= info(ROW_END) || j < info(ROW_BEGIN) {
                    score = f32::NEG_INFINITY;
                }
                let group_lane0 = lane & !(gl - 1);
                crate::unroll!(u in [0, 1] {
                    crate::unroll!(r in [0, 1, 2, 3] {
                        dot[u][r] = shfl_idx_f32(score, group_lane0 + (4 * u + r) as u32);
                    });
                });
                // The scores become the weights in place.
                crate::unroll!(r in [0, 1, 2, 3] {
                    let m_new = math::max(m[r], math::max(dot[0][r], dot[1][r]));
                    // While no key has counted everything is -inf: 0 keeps alpha and the weights
                    // at 0, not NaN.
                    let m_use = if m_new == f32::NEG_INFINITY { 0.0 } else { m_new };
                    let alpha = math::exp2(m[r] - m_use);
                    dot[0][r] = math::exp2(dot[0][r] - m_use);
                    dot[1][r] = math::exp2(dot[1][r] - m_use);
                    l[r] = l[r] * alpha + (dot[0][r] + dot[1][r]);
                    m[r] = m_new;
                    chunks!(c, {
                        crate::unroll!(e in [0, 1, 2, 3, 4, 5, 6, 7] {
                            acc[r * 2 + c][e] *= alpha;
                        });
                    });
                });
                crate::unroll!(u in [0, 1] {
                    let row = group + (2 * half + u as u32) * groups;
                    chunks!(c, {
                        // SAFETY: as for K, in this stage's V tile (zero-filled past the split).
                        let vx = widen::<T>(unsafe {
                            ld_shared_v4(v_base + (row * d as u32 + lane_col(c) as u32) * 2)
                        });
                        crate::unroll!(r in [0, 1, 2, 3] {
                            crate::unroll!(e in [0, 1, 2, 3, 4, 5, 6, 7] {
                                acc[r * 2 + c][e] = math::fma(dot[u][r], vx[e], acc[r * 2 + c][e]);
                            });
                        });
                    });
                });
            }
        }
        // The groups of the warp (four of 8 lanes, or two of 16): lanes `sub`, `sub + gl`, ...
        // hold the same elements of different keys.
        crate::unroll!(x in [8, 16] {
            if x as u32 >= gl { crate::unroll!(r in [0, 1, 2, 3] {
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
            }); }
        });
        // The four warps, through shared memory: O's rows in `merge_acc` (128 columns), or at
        // 256 columns in the tile ring, idle once every thread has read its last tile (no copy
        // is in flight after the loop: the last ones issued were waited for). `merge_acc` at 256
        // columns would take the second CTA of an SM from D = 128.
        let wide = d > 128;
        let merge_cols = if wide { d } else { 128 };
        let sa_addr = |i: usize| {
            check_index(i, WARPS * ROWS * merge_cols);
            if wide {
                dynamic_base() + 4 * i as u32
            } else {
                merge_acc().addr(i)
            }
        };
        if wide {
            cp_async_wait::<0>();
            sync_threads();
        }
        let (sm, sl) = (merge_m(), merge_l());
        if lane < gl {
            crate::unroll!(r in [0, 1, 2, 3] {
                if lane == 0 {
                    sm.store(warp as usize * ROWS + r, m[r]);
                    sl.store(warp as usize * ROWS + r, l[r]);
                }
                chunks!(c, {
                    crate::unroll!(e in [0, 1, 2, 3, 4, 5, 6, 7] {
                        let col = lane_col(c) + e;
                        let at = sa_addr((warp as usize * ROWS + r) * merge_cols + col);
                        // SAFETY: inside `merge_acc` or the ring (checked above), 4-byte
                        // aligned; one writer per element, read after the barrier below.
                        unsafe { f32::st_shared(at, acc[r * 2 + c][e]) };
                    });
                });
            });
        }
        sync_threads();
        let mut t = thread_idx_x() as usize;
        while t < ROWS * d {
            // (Over the tile's columns: a constant divisor; those past the head dim are not
            // stored.)
            let (r, col) = (t / d, t % d);
            let rr = pass * ROWS as u32 + r as u32;
            if rr < rows && col < hd {
                let mut mx = f32::NEG_INFINITY;
                for w in 0..WARPS {
                    mx = math::max(mx, sm.load(w * ROWS + r));
                }
                let (mut tl, mut to) = (0f32, 0f32);
                if mx != f32::NEG_INFINITY {
                    for w in 0..WARPS {
                        let wt = math::exp2(sm.load(w * ROWS + r) - mx);
                        tl += sl.load(w * ROWS + r) * wt;
                        // SAFETY: written before the barrier above (inside, aligned).
                        let part =
                            unsafe { f32::ld_shared(sa_addr((w * ROWS + r) * merge_cols + col)) };
                        to += part * wt;
                    }
                }
                let (hq, i) = row_of(rr);
                let row = ((b * sh.q_heads + hq) * sh.seq_q + i) as u64;
                let empty = tl == 0.0;
                let value = if empty { 0.0 } else { to / tl };
                let row_lse = if empty {
                    f32::NEG_INFINITY
                } else {
                    (mx + math::log2(tl)) * math::LN_2
                };
                if sh.splits == 1 {
                    // One split is the answer: no merge launch.
                    o.set(row * hd as u64 + col as u64, value);
                    if col == 0 {
                        lse.set(row, row_lse);
                    }
                } else {
                    let slot = row * sh.splits as u64 + s as u64;
                    o_part.set(slot * hd as u64 + col as u64, value);
                    if col == 0 {
                        lse_part.set(slot, row_lse);
                    }
                }
            }
            t += block_dim_x() as usize;
        }
        // The shared buffers are rewritten by the next pass.
        sync_threads();
        pass += 1;
    }
}

/// The 8 partial sums a lane holds (`x[u][r]`) summed over its group of `gl` lanes (8 or 16) and
/// scattered: lane `sub` of the group returns the sum of value `4 u + r = sub % 8`. Recursive
/// halving over 8 lanes: 4 + 2 + 1 shuffles (and one more across the two halves of 16), where a
/// butterfly for each value takes 24 (32) and leaves every lane all eight.
#[inline(always)]
fn group_sum_scatter(x: &[[f32; ROWS]; 2], sub: u32, gl: u32) -> f32 {
    // Each step keeps the half of the values this lane's bit selects and adds the partner's copy
    // of that half (the partner, across the bit, sends it).
    let hi4 = sub & 4 != 0;
    let mut y = [0f32; 4];
    crate::unroll!(k in [0, 1, 2, 3] {
        let (keep, send) = if hi4 { (x[1][k], x[0][k]) } else { (x[0][k], x[1][k]) };
        y[k] = keep + shfl_xor_f32(send, 4);
    });
    let hi2 = sub & 2 != 0;
    let mut z = [0f32; 2];
    crate::unroll!(k in [0, 1] {
        let (keep, send) = if hi2 { (y[2 + k], y[k]) } else { (y[k], y[2 + k]) };
        z[k] = keep + shfl_xor_f32(send, 2);
    });
    let (keep, send) = if sub & 1 != 0 {
        (z[1], z[0])
    } else {
        (z[0], z[1])
    };
    let w = keep + shfl_xor_f32(send, 1);
    // Lanes `sub` and `sub ^ 8` of a 16-lane group hold the same value's two halves.
    if gl > 8 { w + shfl_xor_f32(w, 8) } else { w }
}

/// One query row's splits merged, a CTA a row (`MERGE_THREADS` threads, one an output column
/// and more for D = 64): the splits' LSEs go through shared memory once, as weights
/// `e^(LSE_s - max)`, so each column's sum over the splits is independent loads (not a chain of
/// dependent ones).
#[inline(always)]
unsafe fn merge<T: Elem>(
    o_part: Slice<f32>,
    lse_part: Slice<f32>,
    o: SliceMut<T>,
    lse: SliceMut<f32>,
    head_dim: u64,
    splits: u64,
) {
    let row = block_idx_x() as u64;
    let t = thread_idx_x() as u64;
    let w = merge_w();
    check_index(splits as usize, MAX_SPLITS as usize + 1);
    let mut s = t;
    while s < splits {
        w.store(s as usize, lse_part.get_ro(row * splits + s));
        s += block_dim_x() as u64;
    }
    sync_threads();
    let mut mx = f32::NEG_INFINITY;
    for s in 0..splits as usize {
        mx = math::max(mx, w.load(s));
    }
    sync_threads();
    let mut s = t;
    while s < splits {
        let x = w.load(s as usize);
        w.store(
            s as usize,
            if mx == f32::NEG_INFINITY {
                0.0
            } else {
                math::exp(x - mx)
            },
        );
        s += block_dim_x() as u64;
    }
    sync_threads();
    let mut tl = 0f32;
    for s in 0..splits as usize {
        tl += w.load(s);
    }
    let empty = tl == 0.0;
    let mut col = t;
    while col < head_dim {
        // Four independent partial sums: the loads of four splits in flight at once.
        let mut to = [0f32; 4];
        let mut s = 0;
        while s + 4 <= splits {
            crate::unroll!(u in [0, 1, 2, 3] {
                let su = s + u as u64;
                to[u] += w.load(su as usize) * o_part.get_ro((row * splits + su) * head_dim + col);
            });
            s += 4;
        }
        while s < splits {
            to[0] += w.load(s as usize) * o_part.get_ro((row * splits + s) * head_dim + col);
            s += 1;
        }
        let sum = (to[0] + to[1]) + (to[2] + to[3]);
        o.set(row * head_dim + col, if empty { 0.0 } else { sum / tl });
        col += block_dim_x() as u64;
    }
    if t == 0 {
        lse.set(
            row,
            if empty {
                f32::NEG_INFINITY
            } else {
                mx + math::ln(tl)
            },
        );
    }
}

macro_rules! decode_entry_points {
    ($($split:ident, $ch:literal, $general:literal: $t:ty;)*) => {$(
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
            o: SliceMut<$t>,
            lse: SliceMut<f32>,
            shape: DecodeShape,
        ) {
            unsafe { split::<$t, $ch, $general>(q, k, v, table, lens, o_part, lse_part, o, lse, shape) }
        }
    )*};
}

decode_entry_points! {
    decode_split_d64_f16, 1, false: F16;
    decode_split_d128_f16, 2, false: F16;
    decode_split_d64_bf16, 1, false: BF16;
    decode_split_d128_bf16, 2, false: BF16;
    decode_split_d256_f16, 4, false: F16;
    decode_split_d256_bf16, 4, false: BF16;
    // Head dims narrower than the tile, the softcap and ALiBi: kernels of their own, so that the
    // plain calls keep a constant head dim and no modification.
    decode_split_general_d64_f16, 1, true: F16;
    decode_split_general_d128_f16, 2, true: F16;
    decode_split_general_d64_bf16, 1, true: BF16;
    decode_split_general_d128_bf16, 2, true: BF16;
    decode_split_general_d256_f16, 4, true: F16;
    decode_split_general_d256_bf16, 4, true: BF16;
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
