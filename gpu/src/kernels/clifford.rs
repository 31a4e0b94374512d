//! Clifford-algebra layers on Cl(2,0) and Cl(3,0) (docs/math/clifford.md).
//!
//! Tensors are `(C, B, N)` contiguous f32: component c, batch row b, feature n at `c*B*N + b*N + n`, so
//! consecutive threads take consecutive features and every component load is coalesced. All C
//! components of one (b, n) live in registers; the product is generated from the term tables in
//! `params::clifford` with constant indices only (`unroll!` over term / component / path numbers).
//!
//! Kernels:
//! - `sgp{2,3}d_fwd`: the fused `RMSNorm(GP(gelu(x), gelu(y)))` with per-feature weights. One block per
//!   batch row (grid-stride): the row's outputs stay in registers (`FWD_CACHE_{2,3}D` features a thread), the
//!   block reduces the grade sums of squares with `block::reduce_sum4`, then scales and writes: one read
//!   of x and y, one write of o. Requires `n <= block * cache` (`fwd_max_cached`); for longer rows the
//!   host runs it un-normalised and then `grade_norm` (one more read and write of o).
//! - `sgp{2,3}d_fwd_v2` (one thread a feature, persistent grid) and `sgp2d_fwd_v3p` (4 features a
//!   thread, 16-byte accesses): the same forward for cards whose bandwidth needs more bytes in flight
//!   (the host picks by the card's DRAM peak).
//! - `grade_dot{2,3}d`: per row and grade, `S = sum_n sum_{c in G} go_c * o_c` (norm backward).
//! - `sgp{2,3}d_bwd_v2`: one thread per feature over a chunk of batch rows (grid y = chunk): norm
//!   backward, gated inputs recomputed from raw x, y, product and gate backward; the weight gradient
//!   of the chunk is summed in registers and written as partial `[chunk][n][p]`; `chunk_sum_tree`
//!   then adds the partials in a fixed order. No float atomics anywhere: the same bits on every run.
//! - `grade_norm{2,3}d`, `grade_norm_bwd{2,3}d`: the norm alone (fully connected variant).
//! - `fc_pairs{2,3}d`, `fc_pairs_bwd{2,3}d`: the per-feature pair terms of the fully connected variant
//!   (see `params::clifford::pair_slots`) and their backward; the feature mixing is the f32 matmul.
//! - `fc_gate_y{2,3}d`: y scaled by both gates, for the fc forward's pair-term product
//!   (`matmul_wg_pairs_*`), which builds the pair terms itself.
//! - `fc_permute_blocks`: the fc weights (and their gradient) reordered by path in one launch.
//! - `chunk_sum`, `col_sum_partials`: fixed-order sums for weight and bias gradients.
use crate::dev::mem::{Chunk16, Slice, SliceMut, load_chunk_ro, store_chunk};
use crate::dev::shared::check_index;
use crate::dev::sync::sync_threads;
use crate::dev::thread::{
    block_dim_x, block_idx_x, block_idx_y, grid_dim_x, lane_id, thread_idx_x, warp_id,
};
use crate::dev::{block, math, opaque_u32, opaque_u64, warp};
use crate::params::clifford::{
    BWD_BLOCK, CHUNK_SUM_WARPS, ELEM_BLOCK, FC_BWD_BLOCK, FC_PHASE_SPLIT_2D, FC_PHASE_SPLIT_3D,
    FWD_CACHE_2D, FWD_CACHE_3D, FWD_MAX_BLOCK, FWD_V2_MAX_BLOCK, FWD_V3_BLOCK, GRADES_2D,
    GRADES_3D, NORM_EPS, NUM_SLOTS_2D, NUM_SLOTS_3D, PATHS_2D, PATHS_3D, ROW_BLOCK, SLOT_LAYOUT_2D,
    SLOT_LAYOUT_3D, SLOTS_2D, SLOTS_3D, TERMS_2D, TERMS_3D, Term, fwd_v3_row_threads, perm_entry,
};

/// One algebra: sizes and tables padded to the 3D sizes, so register arrays have one fixed length
/// (entries past `C`, `P`, `NT`, `NS` are never touched and are optimised away).
trait Algebra {
    const C: usize;
    /// Features a thread of the fused forward keeps in registers (at most 4).
    const CACHE: usize;
    const G: usize;
    const P: usize;
    const NT: usize;
    const NS: usize;
    const TERMS: [Term; 64];
    const SLOT: [usize; 64];
    const GRADE: [usize; 8];
    /// Each pair slot's place in the pair buffer (`params::clifford::slot_layout`).
    const LAYOUT: [[u32; 3]; 44];
    /// The row block at which the fc variant's second phase begins (`params::clifford::fc_phase_split`).
    const SPLIT: usize;
    /// Output component and path of each pair slot (terms sharing both are summed before weighting).
    const SLOT_J: [usize; 44] = slot_field(&Self::TERMS, &Self::SLOT, Self::NT, true);
    const SLOT_P: [usize; 44] = slot_field(&Self::TERMS, &Self::SLOT, Self::NT, false);
    /// Whether term `ti` is the first (in term order) of its slot.
    const FIRST_IN_SLOT: [bool; 64] = first_in_slot(&Self::SLOT, Self::NT);
    /// Whether term `ti` is the last (in term order) of its slot.
    const LAST_IN_SLOT: [bool; 64] = last_in_slot(&Self::SLOT, Self::NT);
    /// Whether slot `s` is the first (in slot order) of its output component.
    const FIRST_SLOT_OF_J: [bool; 44] = first_slot_of_j(&Self::SLOT_J, Self::NS);
}

const fn slot_field(terms: &[Term; 64], slot: &[usize; 64], nt: usize, j: bool) -> [usize; 44] {
    let mut out = [0; 44];
    let mut ti = 0;
    while ti < nt {
        out[slot[ti]] = if j {
            terms[ti].j as usize
        } else {
            terms[ti].p as usize
        };
        ti += 1;
    }
    out
}
const fn first_in_slot(slot: &[usize; 64], nt: usize) -> [bool; 64] {
    let mut out = [false; 64];
    let mut seen = [false; 44];
    let mut ti = 0;
    while ti < nt {
        out[ti] = !seen[slot[ti]];
        seen[slot[ti]] = true;
        ti += 1;
    }
    out
}
const fn last_in_slot(slot: &[usize; 64], nt: usize) -> [bool; 64] {
    let mut out = [false; 64];
    let mut seen = [false; 44];
    let mut ti = nt;
    while ti > 0 {
        ti -= 1;
        out[ti] = !seen[slot[ti]];
        seen[slot[ti]] = true;
    }
    out
}
const fn first_slot_of_j(slot_j: &[usize; 44], ns: usize) -> [bool; 44] {
    let mut out = [false; 44];
    let mut seen = [false; 8];
    let mut s = 0;
    while s < ns {
        out[s] = !seen[slot_j[s]];
        seen[slot_j[s]] = true;
        s += 1;
    }
    out
}

const NONE: Term = Term {
    j: 0,
    i: 0,
    k: 0,
    p: 0,
    neg: false,
};

const fn pad_terms<const N: usize>(t: &[Term; N]) -> [Term; 64] {
    let mut out = [NONE; 64];
    let mut i = 0;
    while i < N {
        out[i] = t[i];
        i += 1;
    }
    out
}
const fn pad_u8<const N: usize, const M: usize>(t: &[u8; N]) -> [usize; M] {
    let mut out = [0; M];
    let mut i = 0;
    while i < N {
        out[i] = t[i] as usize;
        i += 1;
    }
    out
}
const fn num_grades<const C: usize>(g: &[u8; C]) -> usize {
    g[C - 1] as usize + 1
}

struct Cl2;
struct Cl3;
impl Algebra for Cl2 {
    const C: usize = 4;
    const CACHE: usize = FWD_CACHE_2D as usize;
    const G: usize = num_grades(&GRADES_2D);
    const P: usize = PATHS_2D.len();
    const NT: usize = TERMS_2D.len();
    const NS: usize = NUM_SLOTS_2D;
    const TERMS: [Term; 64] = pad_terms(&TERMS_2D);
    const SLOT: [usize; 64] = pad_u8(&SLOTS_2D);
    const GRADE: [usize; 8] = pad_u8(&GRADES_2D);
    const LAYOUT: [[u32; 3]; 44] = SLOT_LAYOUT_2D;
    const SPLIT: usize = FC_PHASE_SPLIT_2D;
}
impl Algebra for Cl3 {
    const C: usize = 8;
    const CACHE: usize = FWD_CACHE_3D as usize;
    const G: usize = num_grades(&GRADES_3D);
    const P: usize = PATHS_3D.len();
    const NT: usize = TERMS_3D.len();
    const NS: usize = NUM_SLOTS_3D;
    const TERMS: [Term; 64] = pad_terms(&TERMS_3D);
    const SLOT: [usize; 64] = pad_u8(&SLOTS_3D);
    const GRADE: [usize; 8] = pad_u8(&GRADES_3D);
    const LAYOUT: [[u32; 3]; 44] = SLOT_LAYOUT_3D;
    const SPLIT: usize = FC_PHASE_SPLIT_3D;
}

type Mv = [f32; 8];
const _: () = assert!(FWD_CACHE_2D <= 4 && FWD_CACHE_3D <= 4);

macro_rules! each_comp {
    ($A:ty, $c:ident $body:block) => {
        crate::unroll!($c in [0, 1, 2, 3, 4, 5, 6, 7] { if $c < <$A>::C $body })
    };
}
macro_rules! each_grade {
    ($A:ty, $g:ident $body:block) => {
        crate::unroll!($g in [0, 1, 2, 3] { if $g < <$A>::G $body })
    };
}
macro_rules! each_path {
    ($A:ty, $p:ident $body:block) => {
        crate::unroll!($p in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19] {
            if $p < <$A>::P $body
        })
    };
}
macro_rules! each_slot {
    ($A:ty, $s:ident $body:block) => {
        crate::unroll!($s in [
            0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
            22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43
        ] { if $s < <$A>::NS $body })
    };
}
/// `$body` once per product term, with `$t` bound to the (constant) term and `$s` to its pair slot.
macro_rules! each_term {
    ($A:ty, $t:ident, $s:ident $body:block) => {
        crate::unroll!(ti in [
            0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23,
            24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47,
            48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63
        ] {
            if ti < <$A>::NT {
                let $t = <$A>::TERMS[ti];
                let $s = <$A>::SLOT[ti];
                $body
            }
        })
    };
}

/// [`each_term!`] with the term's index bound to `$ti` as well.
macro_rules! each_term_idx {
    ($A:ty, $ti:ident, $t:ident, $s:ident $body:block) => {
        crate::unroll!($ti in [
            0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23,
            24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47,
            48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63
        ] {
            if $ti < <$A>::NT {
                let $t = <$A>::TERMS[$ti];
                let $s = <$A>::SLOT[$ti];
                $body
            }
        })
    };
}

/// `acc + v` or `acc - v` for a constant sign.
#[inline(always)]
fn signed_add(acc: f32, neg: bool, v: f32) -> f32 {
    if neg { acc - v } else { acc + v }
}

/// The C components at `idx + c * stride`.
#[inline(always)]
fn load_mv<A: Algebra>(s: &Slice<f32>, idx: u64, stride: u64) -> Mv {
    let mut v = [0.0f32; 8];
    each_comp!(A, c {
        v[c] = s.get(idx + c as u64 * stride);
    });
    v
}

/// [`load_mv`] through the read-only cache (`ld.global.nc`): for inputs no thread writes.
#[inline(always)]
fn load_mv_ro<A: Algebra>(s: &Slice<f32>, idx: u64, stride: u64) -> Mv {
    let mut v = [0.0f32; 8];
    each_comp!(A, c {
        v[c] = s.get_ro(idx + c as u64 * stride);
    });
    v
}

#[inline(always)]
fn store_mv<A: Algebra>(s: &SliceMut<f32>, idx: u64, stride: u64, v: &Mv) {
    each_comp!(A, c {
        s.set(idx + c as u64 * stride, v[c]);
    });
}

/// Feature `f`'s weights `w[f, 0..P]`.
#[inline(always)]
fn load_weights<A: Algebra>(w: &Slice<f32>, f: u64) -> [f32; 20] {
    let mut v = [0.0f32; 20];
    each_path!(A, p {
        v[p] = w.get(f * A::P as u64 + p as u64);
    });
    v
}

/// MV-GELU gate: every component scaled by `Phi(x0)`; returns the gated multivector and `Phi(x0)`.
#[inline(always)]
fn gate<A: Algebra>(x: &Mv) -> (Mv, f32) {
    let phi = math::normal_cdf(x[0]);
    let mut g = [0.0f32; 8];
    each_comp!(A, c {
        g[c] = x[c] * phi;
    });
    (g, phi)
}

/// Gate backward: `gx0 = (Phi + x0 phi) gt0 + phi sum_{c>=1} x_c gt_c`, `gx_c = Phi gt_c`.
#[inline(always)]
fn gate_bwd<A: Algebra>(x: &Mv, cdf: f32, gt: &Mv) -> Mv {
    let pdf = math::normal_pdf(x[0]);
    let mut gx = [0.0f32; 8];
    let mut dot = 0.0f32;
    each_comp!(A, c {
        if c >= 1 {
            dot += x[c] * gt[c];
            gx[c] = cdf * gt[c];
        }
    });
    gx[0] = (cdf + x[0] * pdf) * gt[0] + pdf * dot;
    gx
}

/// The weighted geometric product of gated inputs.
#[inline(always)]
fn product<A: Algebra>(x: &Mv, y: &Mv, w: &[f32; 20]) -> Mv {
    let mut o = [0.0f32; 8];
    each_term!(A, t, _slot {
        o[t.j as usize] = signed_add(o[t.j as usize], t.neg, w[t.p as usize] * (x[t.i as usize] * y[t.k as usize]));
    });
    o
}

/// The weighted product with FMAs: the terms sharing an output component and a path (one pair slot)
/// are summed first, `S_s = sum ±x_i y_k`, and weighted once, `o_j = sum_s w_p(s) S_s`. 3D: 64 + 44
/// multiply-adds instead of [`product`]'s 64 x (mul, mul, add) (rustc does not contract).
#[inline(always)]
fn product_slots<A: Algebra>(x: &Mv, y: &Mv, w: &[f32; 20]) -> Mv {
    let mut sum = [0.0f32; 44];
    each_term_idx!(A, ti, t, s {
        let (xi, yk) = (x[t.i as usize], y[t.k as usize]);
        let xi = if t.neg { -xi } else { xi };
        sum[s] = if A::FIRST_IN_SLOT[ti] { xi * yk } else { math::fma(xi, yk, sum[s]) };
    });
    let mut o = [0.0f32; 8];
    each_slot!(A, s {
        let (j, p) = (A::SLOT_J[s], A::SLOT_P[s]);
        o[j] = if A::FIRST_SLOT_OF_J[s] { w[p] * sum[s] } else { math::fma(w[p], sum[s], o[j]) };
    });
    o
}

/// Sum of squares of each grade of `o`, added to `sq`.
#[inline(always)]
fn add_grade_squares<A: Algebra>(sq: &mut [f32; 4], o: &Mv) {
    each_comp!(A, c {
        sq[A::GRADE[c]] += o[c] * o[c];
    });
}

/// Block-wide grade norms of one row: `r_G = sqrt(sum / n + eps)`; thread 0 stores `r[G * rows + row]`.
/// Returns `1 / r_G`. Every thread of the block must call it.
#[inline(always)]
fn grade_norms<A: Algebra>(
    sq: [f32; 4],
    n: u64,
    r: &SliceMut<f32>,
    row: u64,
    rows: u64,
) -> [f32; 4] {
    grade_norms_of::<A>(block::reduce_sum4(sq), n, r, row, rows)
}

/// `1 / r_G` from the row's grade sums of squares `s`; thread 0 stores `r`.
#[inline(always)]
fn grade_norms_of<A: Algebra>(
    s: [f32; 4],
    n: u64,
    r: &SliceMut<f32>,
    row: u64,
    rows: u64,
) -> [f32; 4] {
    let mut inv = [1.0f32; 4];
    each_grade!(A, g {
        let rg = math::sqrt(s[g] / n as f32 + NORM_EPS);
        inv[g] = 1.0 / rg;
        if thread_idx_x() == 0 {
            r.set(g as u64 * rows + row, rg);
        }
    });
    inv
}

#[inline(always)]
fn scale_grades<A: Algebra>(o: &Mv, inv: &[f32; 4]) -> Mv {
    let mut v = [0.0f32; 8];
    each_comp!(A, c {
        v[c] = o[c] * inv[A::GRADE[c]];
    });
    v
}

/// Inputs and sizes of the fused op, as every thread of a launch sees them.
#[derive(Clone, Copy)]
struct Sgp {
    x: Slice<f32>,
    y: Slice<f32>,
    w: Slice<f32>,
    rows: u64,
    n: u64,
}

impl Sgp {
    /// Un-normalised output at (row, f).
    #[inline(always)]
    fn element<A: Algebra>(&self, row: u64, f: u64) -> Mv {
        let (bn, idx) = (self.rows * self.n, row * self.n + f);
        let (xt, _) = gate::<A>(&load_mv::<A>(&self.x, idx, bn));
        let (yt, _) = gate::<A>(&load_mv::<A>(&self.y, idx, bn));
        product::<A>(&xt, &yt, &load_weights::<A>(&self.w, f))
    }
}

/// Features `first ..` of one row (`block_dim * A::CACHE` of them) with the outputs in registers: read
/// once, written once. With `normalize` the whole row must fit (`first == 0`, `n <= block_dim * CACHE`).
#[inline(always)]
fn fwd_row_cached<A: Algebra>(
    s: &Sgp,
    o: &SliceMut<f32>,
    r: &SliceMut<f32>,
    row: u64,
    first: u64,
    normalize: bool,
) {
    let (tid, nt) = (first + thread_idx_x() as u64, block_dim_x() as u64);
    let mut out = [[0.0f32; 8]; 4];
    let mut sq = [0.0f32; 4];
    crate::unroll!(k in [0, 1, 2, 3] {
        let f = tid + k as u64 * nt;
        if k < A::CACHE && f < s.n {
            out[k] = s.element::<A>(row, f);
            add_grade_squares::<A>(&mut sq, &out[k]);
        }
    });
    let inv = if normalize {
        grade_norms::<A>(sq, s.n, r, row, s.rows)
    } else {
        [1.0; 4]
    };
    let bn = s.rows * s.n;
    crate::unroll!(k in [0, 1, 2, 3] {
        let f = tid + k as u64 * nt;
        if k < A::CACHE && f < s.n {
            store_mv::<A>(o, row * s.n + f, bn, &scale_grades::<A>(&out[k], &inv));
        }
    });
}

#[inline(always)]
unsafe fn sgp_fwd<A: Algebra>(s: Sgp, o: SliceMut<f32>, r: SliceMut<f32>, normalize: u32) {
    let mut row = block_idx_x() as u64;
    // Without the norm a row may be longer than the register cache: walk it in cache-sized pieces.
    let piece = if normalize != 0 {
        s.n.max(1)
    } else {
        block_dim_x() as u64 * A::CACHE as u64
    };
    while row < s.rows {
        let mut first = 0;
        while first < s.n {
            fwd_row_cached::<A>(
                &s,
                &o,
                &r,
                opaque_u64(row),
                opaque_u64(first),
                normalize != 0,
            );
            first += piece;
        }
        row += grid_dim_x() as u64;
    }
}

/// The C components at `idx + c * bn`, 32-bit offsets (the launcher keeps `C * B * N < 2^31`), through
/// the read-only cache. `bn` is hidden from the optimiser per call so `c * bn` is recomputed (one add a
/// component) instead of held across the row loop in a register each.
#[inline(always)]
fn load_mv32<A: Algebra>(s: &Slice<f32>, idx: u32, bn: u32) -> Mv {
    let bn = opaque_u32(bn);
    let mut v = [0.0f32; 8];
    each_comp!(A, c {
        v[c] = s.get_ro((idx + c as u32 * bn) as u64);
    });
    v
}

#[inline(always)]
fn store_mv32<A: Algebra>(s: &SliceMut<f32>, idx: u32, bn: u32, v: &Mv) {
    let bn = opaque_u32(bn);
    each_comp!(A, c {
        s.set((idx + c as u32 * bn) as u64, v[c]);
    });
}

/// Sizes of the v2 forward in 32 bits.
#[derive(Clone, Copy)]
struct Rows32 {
    rows: u32,
    n: u32,
    bn: u32,
}

/// x and y of feature `f` of `row`, or zeros past the row or the batch (a zero input gives a zero
/// output and adds nothing to the grade sums).
#[inline(always)]
fn load_pair32<A: Algebra>(s: &Sgp, z: Rows32, row: u32, f: u32) -> (Mv, Mv) {
    if f < z.n && row < z.rows {
        let idx = opaque_u32(row) * z.n + f;
        (
            load_mv32::<A>(&s.x, idx, z.bn),
            load_mv32::<A>(&s.y, idx, z.bn),
        )
    } else {
        ([0.0; 8], [0.0; 8])
    }
}

/// Forward v2: thread = feature, the block covers a whole row (`block_dim >= n`, at most
/// `FWD_V2_MAX_BLOCK`), and a persistent grid strides over rows. Each thread loads its feature's P
/// weights once (registers) instead of once per row, keeps one output in registers instead of
/// `CACHE` (at most 64 registers, so two 512-thread blocks per SM instead of one), computes the
/// product with FMAs over pair slots ([`product_slots`]), and loads the next row's x and y before the
/// block reduction so those loads are in flight during the barriers and the stores. Offsets are 32-bit
/// (`C * B * N < 2^31`, checked by the launcher).
#[inline(always)]
unsafe fn sgp_fwd_v2<A: Algebra>(s: Sgp, o: SliceMut<f32>, r: SliceMut<f32>, normalize: u32) {
    let z = Rows32 {
        rows: s.rows as u32,
        n: s.n as u32,
        bn: (s.rows * s.n) as u32,
    };
    let f = thread_idx_x();
    let mut w = [0.0f32; 20];
    if f < z.n {
        each_path!(A, p {
            w[p] = s.w.get_ro((f * A::P as u32 + p as u32) as u64);
        });
    }
    let step = grid_dim_x();
    let mut row = block_idx_x();
    let (mut xv, mut yv) = load_pair32::<A>(&s, z, row, f);
    while row < z.rows {
        let (xt, _) = gate::<A>(&xv);
        let (yt, _) = gate::<A>(&yv);
        let out = product_slots::<A>(&xt, &yt, &w);
        let next = row + step;
        (xv, yv) = load_pair32::<A>(&s, z, next, f);
        let inv = if normalize != 0 {
            let mut sq = [0.0f32; 4];
            add_grade_squares::<A>(&mut sq, &out);
            grade_norms::<A>(sq, s.n, &r, row as u64, s.rows)
        } else {
            [1.0; 4]
        };
        if f < z.n {
            let idx = opaque_u32(row) * z.n + f;
            store_mv32::<A>(&o, idx, z.bn, &scale_grades::<A>(&out, &inv));
        }
        row = next;
    }
}

crate::static_shared!(fn v3_partials() -> [f32; 64] as CLIFFORD_FWD_V3_PARTIALS);
// Two iteration parities x 8 warps x 4 grade slots.
const _: () = assert!(FWD_V3_BLOCK / 32 * 4 * 2 == 64);

/// Component `c` of feature quad `q` of `row` (`n` a multiple of 4): chunk `c * bn/4 + row * n/4 + q`.
#[inline(always)]
fn v3_chunk(c: u32, row: u32, q: u32, z: Rows32) -> u32 {
    opaque_u32(c) * (z.bn / 4) + row * (z.n / 4) + q
}

/// The weights of quad `q`'s 4 features (`[feature][path]`, zeros for a thread without a quad),
/// loaded once and kept in registers across rows.
#[inline(always)]
fn v3_weights(s: &Sgp, q: u32, active: bool) -> [[f32; 20]; 4] {
    type A = Cl2;
    let mut w = [[0.0f32; 20]; 4];
    if active {
        crate::unroll!(k in [0, 1, 2, 3] {
            each_path!(A, p {
                w[k][p] = s.w.get_ro(((4 * q + k as u32) * A::P as u32 + p as u32) as u64);
            });
        });
    }
    w
}

/// The products of quad `q`'s 4 features in one row: the un-normalised outputs
/// `[feature][component]` and their grade sums of squares.
#[inline(always)]
fn v3_products(
    xv: &[[f32; 4]; 4],
    yv: &[[f32; 4]; 4],
    w: &[[f32; 20]; 4],
) -> ([[f32; 8]; 4], [f32; 4]) {
    type A = Cl2;
    let mut out = [[0.0f32; 8]; 4];
    let mut sq = [0.0f32; 4];
    crate::unroll!(k in [0, 1, 2, 3] {
        let (mut xm, mut ym) = ([0.0f32; 8], [0.0f32; 8]);
        each_comp!(A, c {
            xm[c] = xv[c][k];
            ym[c] = yv[c][k];
        });
        let (xt, _) = gate::<A>(&xm);
        let (yt, _) = gate::<A>(&ym);
        out[k] = product_slots::<A>(&xt, &yt, &w[k]);
        add_grade_squares::<A>(&mut sq, &out[k]);
    });
    (out, sq)
}

/// Stores quad `q` of a valid `row`: each component's 4 features scaled by `1 / r_G`, one 16-byte
/// store a component.
#[inline(always)]
fn v3_store(out: &[[f32; 8]; 4], inv: &[f32; 4], row: u32, q: u32, z: Rows32, o: &SliceMut<f32>) {
    type A = Cl2;
    crate::unroll!(c in [0, 1, 2, 3] {
        let mut v = [0u32; 4];
        crate::unroll!(k in [0, 1, 2, 3] {
            v[k] = (out[k][c] * inv[A::GRADE[c]]).to_bits();
        });
        let i = v3_chunk(c as u32, row, q, z) as u64;
        check_index(i as usize * 4 + 3, o.len as usize);
        // SAFETY: as for the loads in `v3_load` (o has x's shape, `row < rows`, `4 q + 3 < n`); each
        // chunk is written by exactly one thread.
        unsafe { store_chunk(o.chunks(), i, Chunk16(v)) };
    });
}

/// x and y of the 4 features of quad `q` of `row`, `[component][feature]`, one 16-byte load a
/// component; zeros when `!valid` (zero inputs give zero outputs and add nothing to the grade sums).
#[inline(always)]
fn v3_load(s: &Sgp, z: Rows32, row: u32, q: u32, valid: bool) -> ([[f32; 4]; 4], [[f32; 4]; 4]) {
    let (mut xv, mut yv) = ([[0.0f32; 4]; 4], [[0.0f32; 4]; 4]);
    if valid {
        crate::unroll!(c in [0, 1, 2, 3] {
            let i = v3_chunk(c as u32, row, q, z) as u64;
            check_index(i as usize * 4 + 3, s.x.len as usize);
            check_index(i as usize * 4 + 3, s.y.len as usize);
            // SAFETY: `row < rows` and `4 q + 3 < n` (`valid`), so the chunk's 4 elements are inside x
            // and y (`C * B * N` elements); `n` and `B * N` are multiples of 4 and the bases 16-byte
            // aligned (checked by the launcher), so the chunk is aligned; x and y are never written.
            let (a, b) = unsafe { (load_chunk_ro(s.x.chunks(), i), load_chunk_ro(s.y.chunks(), i)) };
            xv[c] = a.0.map(f32::from_bits);
            yv[c] = b.0.map(f32::from_bits);
        });
    }
    (xv, yv)
}

/// Grade norms of the row of this thread's row slot `slot` (rows of `row_threads` threads, `warps_per_row`
/// warps): each warp reduces its grade sums with shuffles; a row of one warp is done (no barrier at
/// all); otherwise lane 0 of each warp writes its sums to shared slots of this iteration's parity, one
/// barrier, and every thread adds its row's warp sums in warp order (fixed: the same bits on every
/// run). Two parities of slots: a warp writes parity `p` again only after the next iteration's barrier,
/// which every warp reaches only after reading parity `p`, so one barrier an iteration suffices.
/// Thread `q == 0` of a valid row stores `r[G * rows + row]`. Returns `1 / r_G`. Every thread of the
/// block must call it (the barrier).
#[inline(always)]
fn v3_row_norms(
    sq: [f32; 4],
    warps_per_row: u32,
    slot: u32,
    parity: u32,
    row_store: Option<u32>,
    z: Rows32,
    r: &SliceMut<f32>,
) -> [f32; 4] {
    let mut sum = [0.0f32; 4];
    each_grade!(Cl2, g {
        sum[g] = warp::reduce_sum(sq[g]);
    });
    if warps_per_row > 1 {
        let slots = v3_partials();
        let base = parity as usize * 32;
        if lane_id() == 0 {
            each_grade!(Cl2, g {
                slots.store(base + warp_id() as usize * 4 + g, sum[g]);
            });
        }
        sync_threads();
        let first = (slot * warps_per_row) as usize;
        let mut total = [0.0f32; 4];
        let mut k = 0;
        while k < warps_per_row as usize {
            each_grade!(Cl2, g {
                total[g] += slots.load(base + (first + k) * 4 + g);
            });
            k += 1;
        }
        sum = total;
    }
    let mut inv = [1.0f32; 4];
    each_grade!(Cl2, g {
        let rg = math::sqrt(sum[g] / z.n as f32 + NORM_EPS);
        inv[g] = 1.0 / rg;
        if let Some(row) = row_store {
            r.set(g as u64 * z.rows as u64 + row as u64, rg);
        }
    });
    inv
}

/// Forward v3, 2D only: 4 consecutive features a thread, so every component of x, y and o moves as one
/// 16-byte access (4 loads of x, 4 of y, 4 stores a thread and row: v2 makes 16 scalar accesses for one
/// feature), and `FWD_V3_BLOCK / row_threads` rows a block at once (N = 512: 128 threads a row, 2 rows
/// a block; N = 128: 8 rows of one warp each). Why: v2's 2D row moves only 32 bytes a thread between
/// two block-wide barrier pairs, half of what its 3D row moves, and measured 0.63 of copy where 3D
/// reaches 0.81: too few bytes in flight a SM for the per-row latency (load, 2 barriers, store). Here a
/// thread has 128 bytes of loads in flight a row, the norm costs one barrier an iteration (none when a
/// row is one warp: N <= 128), and weights stay in registers (4 x 10, loaded once; a thread keeps its
/// features across rows). The next row group's x and y are loaded before the norm's barrier and the
/// stores (in flight during them; 32 more registers). Persistent grid over row groups.
/// Requires `n % 4 == 0`, `n <= FWD_V3_MAX_N`, `C * B * N < 2^31`, 16-byte aligned bases (launcher).
#[inline(always)]
unsafe fn sgp2d_fwd_v3(s: Sgp, o: SliceMut<f32>, r: SliceMut<f32>, normalize: u32) {
    let z = Rows32 {
        rows: s.rows as u32,
        n: s.n as u32,
        bn: (s.rows * s.n) as u32,
    };
    let row_threads = fwd_v3_row_threads(s.n);
    let rows_per_block = block_dim_x() / row_threads;
    let warps_per_row = row_threads / 32;
    let tid = thread_idx_x();
    let (slot, q) = (tid / row_threads, tid % row_threads);
    let active = q < z.n / 4;
    let w = v3_weights(&s, q, active);
    let groups = z.rows.div_ceil(rows_per_block);
    let step = grid_dim_x();
    let mut group = block_idx_x();
    let mut parity = 0u32;
    let row_of = |g: u32| g * rows_per_block + slot;
    let (mut xv, mut yv) = v3_load(&s, z, row_of(group), q, active && row_of(group) < z.rows);
    while group < groups {
        let row = row_of(opaque_u32(group));
        let valid = active && row < z.rows;
        let (out, sq) = v3_products(&xv, &yv, &w);
        let next = group + step;
        let next_row = row_of(next);
        (xv, yv) = v3_load(&s, z, next_row, q, active && next_row < z.rows);
        let inv = if normalize != 0 {
            let store = if valid && q == 0 { Some(row) } else { None };
            v3_row_norms(sq, warps_per_row, slot, parity, store, z, &r)
        } else {
            [1.0; 4]
        };
        if valid {
            v3_store(&out, &inv, row, q, z, &o);
        }
        group = next;
        parity ^= 1;
    }
}

/// Per row and grade: `s[G * rows + b] = sum_n sum_{c in G} go_c o_c` (`o` the normalised output).
/// With `r` non-empty (`apply`), a second pass writes the norm backward
/// `gu_c = go_c / r - o_c S / (N r)` into `gu`.
#[inline(always)]
unsafe fn grade_dot<A: Algebra>(
    go: Slice<f32>,
    o: Slice<f32>,
    s: SliceMut<f32>,
    r: Slice<f32>,
    gu: SliceMut<f32>,
    rows: u64,
    n: u64,
) {
    let (tid, nt) = (thread_idx_x() as u64, block_dim_x() as u64);
    let bn = rows * n;
    let apply = r.len > 0;
    let mut row = block_idx_x() as u64;
    while row < rows {
        let mut acc = [0.0f32; 4];
        let mut f = tid;
        while f < n {
            let idx = opaque_u64(row * n + f);
            let (g, ov) = (load_mv::<A>(&go, idx, bn), load_mv::<A>(&o, idx, bn));
            each_comp!(A, c {
                acc[A::GRADE[c]] += g[c] * ov[c];
            });
            f += nt;
        }
        let sum = block::reduce_sum4(acc);
        if apply {
            let (mut inv_r, mut coef) = ([0.0f32; 4], [0.0f32; 4]);
            each_grade!(A, gr {
                let rg = r.get(gr as u64 * rows + row);
                inv_r[gr] = 1.0 / rg;
                coef[gr] = sum[gr] / (n as f32 * rg);
            });
            let mut f = tid;
            while f < n {
                let idx = opaque_u64(row * n + f);
                let (g, ov) = (load_mv::<A>(&go, idx, bn), load_mv::<A>(&o, idx, bn));
                store_mv::<A>(&gu, idx, bn, &norm_bwd::<A>(&g, &ov, &inv_r, &coef));
                f += nt;
            }
        } else if tid == 0 {
            each_grade!(A, gr {
                s.set(gr as u64 * rows + row, sum[gr]);
            });
        }
        row += grid_dim_x() as u64;
    }
}

/// `gu_c = go_c / r - o_c S / (N r)` with `inv_r = 1 / r`, `coef = S / (N r)` per grade.
#[inline(always)]
fn norm_bwd<A: Algebra>(g: &Mv, o: &Mv, inv_r: &[f32; 4], coef: &[f32; 4]) -> Mv {
    let mut gu = [0.0f32; 8];
    each_comp!(A, c {
        gu[c] = g[c] * inv_r[A::GRADE[c]] - o[c] * coef[A::GRADE[c]];
    });
    gu
}

/// Gradients of one sgp backward launch.
#[derive(Clone, Copy)]
struct SgpGrads {
    go: Slice<f32>,
    o: Slice<f32>,
    r: Slice<f32>,
    s: Slice<f32>,
    gx: SliceMut<f32>,
    gy: SliceMut<f32>,
    partials: SliceMut<f32>,
}

/// Backward: thread = feature, grid y = chunk of `rows_per_chunk` batch rows; inputs through the
/// read-only cache and the product backward with FMAs: per term `gx~_i += ±(w_p go_j) y~_k` and
/// `gy~_k += ±(w_p go_j) x~_i` (the product `w_p go_j` shared by the terms of a pair slot), and the
/// weight gradient per slot, `dw_p += go_j S_s` with `S_s = sum ±x~_i y~_k` (flushed at the slot's last
/// term, so only the open slots of one output are live). 3D: about 280 FMA-class instructions a (b, n)
/// instead of 64 x 3 x (mul, mul, add).
#[inline(always)]
unsafe fn sgp_bwd_v2<A: Algebra>(s: Sgp, g: SgpGrads, rows_per_chunk: u64, normalize: u32) {
    let f = block_idx_x() as u64 * block_dim_x() as u64 + thread_idx_x() as u64;
    if f >= s.n {
        return;
    }
    let chunk = block_idx_y() as u64;
    let (b0, bn) = (chunk * rows_per_chunk, s.rows * s.n);
    let b1 = (b0 + rows_per_chunk).min(s.rows);
    let mut w = [0.0f32; 20];
    each_path!(A, p {
        w[p] = s.w.get_ro(f * A::P as u64 + p as u64);
    });
    let mut dw = [0.0f32; 20];
    let mut b = b0;
    while b < b1 {
        let idx = opaque_u64(b) * s.n + f;
        let mut gu = load_mv_ro::<A>(&g.go, idx, bn);
        if normalize != 0 {
            let (mut inv_r, mut coef) = ([0.0f32; 4], [0.0f32; 4]);
            each_grade!(A, gr {
                let rg = g.r.get_ro(gr as u64 * s.rows + b);
                inv_r[gr] = 1.0 / rg;
                coef[gr] = g.s.get_ro(gr as u64 * s.rows + b) / (s.n as f32 * rg);
            });
            gu = norm_bwd::<A>(&gu, &load_mv_ro::<A>(&g.o, idx, bn), &inv_r, &coef);
        }
        let (xv, yv) = (
            load_mv_ro::<A>(&s.x, idx, bn),
            load_mv_ro::<A>(&s.y, idx, bn),
        );
        let ((xt, cx), (yt, cy)) = (gate::<A>(&xv), gate::<A>(&yv));
        let (mut gxt, mut gyt) = ([0.0f32; 8], [0.0f32; 8]);
        let mut sum = [0.0f32; 44];
        each_term_idx!(A, ti, t, sl {
            let (i, j, k, p) = (t.i as usize, t.j as usize, t.k as usize, t.p as usize);
            let wg = w[p] * gu[j];
            let wg = if t.neg { -wg } else { wg };
            gxt[i] = math::fma(wg, yt[k], gxt[i]);
            gyt[k] = math::fma(wg, xt[i], gyt[k]);
            let xi = if t.neg { -xt[i] } else { xt[i] };
            sum[sl] = if A::FIRST_IN_SLOT[ti] { xi * yt[k] } else { math::fma(xi, yt[k], sum[sl]) };
            if A::LAST_IN_SLOT[ti] {
                dw[p] = math::fma(gu[j], sum[sl], dw[p]);
            }
        });
        store_mv::<A>(&g.gx, idx, bn, &gate_bwd::<A>(&xv, cx, &gxt));
        store_mv::<A>(&g.gy, idx, bn, &gate_bwd::<A>(&yv, cy, &gyt));
        b += 1;
    }
    each_path!(A, p {
        g.partials.set((chunk * s.n + f) * A::P as u64 + p as u64, dw[p]);
    });
}

/// Grade RMS norm alone: `o = u / r`, `r` per (grade, row). One block per row, two passes. `o` may
/// be `u` (the fc forward normalises in place): every element is read and written by one thread only.
#[inline(always)]
unsafe fn grade_norm<A: Algebra>(
    u: Slice<f32>,
    o: SliceMut<f32>,
    r: SliceMut<f32>,
    rows: u64,
    n: u64,
) {
    let (tid, nt) = (thread_idx_x() as u64, block_dim_x() as u64);
    let bn = rows * n;
    let mut row = block_idx_x() as u64;
    while row < rows {
        let mut sq = [0.0f32; 4];
        let mut f = tid;
        while f < n {
            add_grade_squares::<A>(&mut sq, &load_mv::<A>(&u, opaque_u64(row * n + f), bn));
            f += nt;
        }
        let inv = grade_norms::<A>(sq, n, &r, row, rows);
        let mut f = tid;
        while f < n {
            let idx = opaque_u64(row * n + f);
            store_mv::<A>(
                &o,
                idx,
                bn,
                &scale_grades::<A>(&load_mv::<A>(&u, idx, bn), &inv),
            );
            f += nt;
        }
        row += grid_dim_x() as u64;
    }
}

/// Elementwise over (b, n): the gated pair terms of the (output component, path) slots whose row
/// blocks lie in `lo..hi` (`params::clifford::slot_layout`), into a buffer of `hi - lo` row blocks
/// (all slots: `0..NUM_SLOTS`). `lo` and `hi` must be component boundaries: a slot is kept by its
/// component's first row block (`LAYOUT[s][0]`), and its elements span the component's rows.
#[inline(always)]
unsafe fn fc_pairs<A: Algebra>(
    x: Slice<f32>,
    y: Slice<f32>,
    pairs: SliceMut<f32>,
    bn: u64,
    n: u64,
    (lo, hi): (u64, u64),
) {
    let mut e = block_idx_x() as u64 * block_dim_x() as u64 + thread_idx_x() as u64;
    let step = grid_dim_x() as u64 * block_dim_x() as u64;
    while e < bn {
        e = opaque_u64(e);
        let (xt, _) = gate::<A>(&load_mv::<A>(&x, e, bn));
        let (yt, _) = gate::<A>(&load_mv::<A>(&y, e, bn));
        let mut v = [0.0f32; 44];
        each_term!(A, t, slot {
            v[slot] = signed_add(v[slot], t.neg, xt[t.i as usize] * yt[t.k as usize]);
        });
        let b = e / n;
        each_slot!(A, s {
            let row_block = A::LAYOUT[s][0] as u64;
            if row_block >= lo && row_block < hi {
                pairs.set(pair_at::<A>(s, bn, n, b, e) - lo * bn, v[s]);
            }
        });
        e += step;
    }
}

/// Elementwise over (b, n): y scaled by both gates, `ys_c = Phi(x_0) Phi(y_0) y_c`, so that a pair
/// term of the gated inputs is `x_i ys_k` (the fc forward's pair-term product,
/// `matmul_wg_pairs_*`, builds its A from x and ys).
#[inline(always)]
unsafe fn fc_gate_y<A: Algebra>(x: Slice<f32>, y: Slice<f32>, ys: SliceMut<f32>, bn: u64) {
    let mut e = block_idx_x() as u64 * block_dim_x() as u64 + thread_idx_x() as u64;
    let step = grid_dim_x() as u64 * block_dim_x() as u64;
    while e < bn {
        e = opaque_u64(e);
        let phi = math::normal_cdf(x.get(e));
        let (yt, _) = gate::<A>(&load_mv::<A>(&y, e, bn));
        let mut v = [0.0f32; 8];
        each_comp!(A, c {
            v[c] = yt[c] * phi;
        });
        store_mv::<A>(&ys, e, bn, &v);
        e += step;
    }
}

/// Index of element `e = b * n + (feature)` of pair slot `s` in the pair buffer
/// (`params::clifford::slot_layout`).
#[inline(always)]
fn pair_at<A: Algebra>(s: usize, bn: u64, n: u64, b: u64, e: u64) -> u64 {
    let [row_block, path, paths] = A::LAYOUT[s];
    row_block as u64 * bn + (b * paths as u64 + path as u64) * n + (e - b * n)
}

/// Backward of [`fc_pairs`] and of the gate for one phase of the fc backward: from the pair-term
/// gradients of the slots whose row blocks lie in the phase (`SECOND`: `SPLIT..NS`, else
/// `0..SPLIT`; held in a buffer of the phase's row blocks, as `fc_pairs` writes them) to grad x
/// and grad y, stored by the first phase and added to by the second. The gate's backward is
/// linear in the gated gradient, so the phases' shares sum. The phase is a constant rather than a
/// row-block range: with the range known per term at compile time the 3D body keeps its loads
/// and sums in registers (a runtime range made ptxas spill).
#[inline(always)]
unsafe fn fc_pairs_bwd<A: Algebra, const SECOND: bool>(
    x: Slice<f32>,
    y: Slice<f32>,
    gpairs: Slice<f32>,
    (gx, gy): (SliceMut<f32>, SliceMut<f32>),
    bn: u64,
    n: u64,
) {
    let lo = if SECOND { A::SPLIT as u64 } else { 0 };
    let mut e = block_idx_x() as u64 * block_dim_x() as u64 + thread_idx_x() as u64;
    let step = grid_dim_x() as u64 * block_dim_x() as u64;
    while e < bn {
        e = opaque_u64(e);
        let (xv, yv) = (load_mv::<A>(&x, e, bn), load_mv::<A>(&y, e, bn));
        let ((xt, cx), (yt, cy)) = (gate::<A>(&xv), gate::<A>(&yv));
        let (mut gxt, mut gyt) = ([0.0f32; 8], [0.0f32; 8]);
        let b = e / n;
        each_term!(A, t, slot {
            if (A::LAYOUT[slot][0] as usize >= A::SPLIT) == SECOND {
                let g = gpairs.get(pair_at::<A>(slot, bn, n, b, e) - lo * bn);
                let (i, k) = (t.i as usize, t.k as usize);
                gxt[i] = signed_add(gxt[i], t.neg, g * yt[k]);
                gyt[k] = signed_add(gyt[k], t.neg, g * xt[i]);
            }
        });
        let (mut dx, mut dy) = (gate_bwd::<A>(&xv, cx, &gxt), gate_bwd::<A>(&yv, cy, &gyt));
        if SECOND {
            each_comp!(A, c {
                dx[c] += gx.get(e + c as u64 * bn);
                dy[c] += gy.get(e + c as u64 * bn);
            });
        }
        store_mv::<A>(&gx, e, bn, &dx);
        store_mv::<A>(&gy, e, bn, &dy);
        e += step;
    }
}

macro_rules! clifford_fwd_v2_entry_points {
    ($($A:ty: $v2:ident;)*) => {$(
        // One thread a feature, up to 1024 a block, so at most 64 registers (two blocks of 512 per SM).
        crate::launch_bounds!($v2, FWD_V2_MAX_BLOCK, 1);
        /// Forward v2 ([`sgp_fwd_v2`]): block = `fwd_v2_block(n)` (one thread a feature), grid = the
        /// blocks resident at once (or fewer, one per row). Same arguments as the fused forward.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $v2(
            x: Slice<f32>, y: Slice<f32>, w: Slice<f32>, o: SliceMut<f32>, r: SliceMut<f32>,
            rows: u64, n: u64, normalize: u32,
        ) {
            unsafe { sgp_fwd_v2::<$A>(Sgp { x, y, w, rows, n }, o, r, normalize) }
        }
    )*};
}

clifford_fwd_v2_entry_points! {
    Cl2: sgp2d_fwd_v2_f32;
    Cl3: sgp3d_fwd_v2_f32;
}

// 256-thread blocks holding 4 features x 10 weights, 4 x 8 inputs and 16 outputs a thread, with the
// next row group prefetched: two blocks a SM, up to 128 registers (three, at 85, spilled 68 bytes).
crate::launch_bounds!(sgp2d_fwd_v3p_f32, FWD_V3_BLOCK, 2);
/// Forward v3, 2D ([`sgp2d_fwd_v3`]): block `FWD_V3_BLOCK`, grid = the blocks resident at once (or
/// fewer, one per row group of `FWD_V3_BLOCK / fwd_v3_row_threads(n)` rows). Same arguments as the
/// fused forward.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn sgp2d_fwd_v3p_f32(
    x: Slice<f32>,
    y: Slice<f32>,
    w: Slice<f32>,
    o: SliceMut<f32>,
    r: SliceMut<f32>,
    rows: u64,
    n: u64,
    normalize: u32,
) {
    unsafe { sgp2d_fwd_v3(Sgp { x, y, w, rows, n }, o, r, normalize) }
}

macro_rules! clifford_bwd_entry_points {
    ($($A:ty: $v2:ident, $blocks:expr;)*) => {$(
        crate::launch_bounds!($v2, BWD_BLOCK, $blocks);
        /// Backward ([`sgp_bwd_v2`]): grid (ceil(n / BWD_BLOCK), chunks), block `BWD_BLOCK`.
        /// `partials` is `(chunks, n, P)`.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $v2(
            x: Slice<f32>, y: Slice<f32>, w: Slice<f32>, go: Slice<f32>, o: Slice<f32>, r: Slice<f32>,
            s: Slice<f32>, gx: SliceMut<f32>, gy: SliceMut<f32>, partials: SliceMut<f32>,
            rows: u64, n: u64, rows_per_chunk: u64, normalize: u32,
        ) {
            let g = SgpGrads { go, o, r, s, gx, gy, partials };
            unsafe { sgp_bwd_v2::<$A>(Sgp { x, y, w, rows, n }, g, rows_per_chunk, normalize) }
        }
    )*};
}

clifford_bwd_entry_points! {
    Cl2: sgp2d_bwd_v2_f32, 4;
    Cl3: sgp3d_bwd_v2_f32, 3;
}

crate::static_shared!(fn chunk_scratch() -> [f32; 256] as CLIFFORD_CHUNK_SUM_SCRATCH);
const _: () = assert!(CHUNK_SUM_WARPS * 32 == 256);

crate::launch_bounds!(chunk_sum_tree_f32, CHUNK_SUM_WARPS * 32, 2);
/// `out[i] = sum_{c < chunks} partials[c * len + i]` as a fixed tree, for many chunks: a block of
/// `CHUNK_SUM_WARPS` warps takes 32 consecutive outputs (grid-stride over such groups); warp `v` sums
/// chunks `v, v + W, v + 2W, ...` in order (coalesced 128-byte rows, W loads in flight per output
/// instead of one), then lane `l` of warp 0 adds the W warp sums in warp order. The order depends on
/// `chunks` and `len` only: the same bits on every run and every GPU.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn chunk_sum_tree_f32(
    partials: Slice<f32>,
    out: SliceMut<f32>,
    chunks: u64,
    len: u64,
) {
    let (lane, warp) = (lane_id() as u64, warp_id() as u64);
    let slots = chunk_scratch();
    let mut group = block_idx_x() as u64;
    while group * 32 < len {
        let col = group * 32 + lane;
        let mut acc = 0.0f32;
        if col < len {
            let mut c = warp;
            while c < chunks {
                acc += partials.get_ro(opaque_u64(c) * len + col);
                c += CHUNK_SUM_WARPS as u64;
            }
        }
        // Barrier first: the previous group's warp 0 may still be reading the slots.
        sync_threads();
        slots.store((warp * 32 + lane) as usize, acc);
        sync_threads();
        if warp == 0 && col < len {
            let mut sum = slots.load(lane as usize);
            crate::unroll!(v in [1, 2, 3, 4, 5, 6, 7] {
                sum += slots.load(v * 32 + lane as usize);
            });
            out.set(col, sum);
        }
        group += grid_dim_x() as u64;
    }
}

macro_rules! clifford_entry_points {
    ($($A:ty: $fwd:ident, $dot:ident, $norm:ident, $pairs:ident, $pairs_bwd:ident, $gate_y:ident;)*) => {$(
        crate::launch_bounds!($fwd, FWD_MAX_BLOCK, 1);
        crate::launch_bounds!($dot, ROW_BLOCK, 2);
        crate::launch_bounds!($norm, ROW_BLOCK, 2);
        crate::launch_bounds!($pairs, ELEM_BLOCK, 2);
        crate::launch_bounds!($pairs_bwd, FC_BWD_BLOCK, 3);
        crate::launch_bounds!($gate_y, ELEM_BLOCK, 2);
        /// Fused forward: grid = rows (grid-stride), block = `fwd_block(n)`. `r` is `(G, B)` when
        /// `normalize != 0` (else unused, may be empty).
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $fwd(
            x: Slice<f32>, y: Slice<f32>, w: Slice<f32>, o: SliceMut<f32>, r: SliceMut<f32>,
            rows: u64, n: u64, normalize: u32,
        ) {
            unsafe { sgp_fwd::<$A>(Sgp { x, y, w, rows, n }, o, r, normalize) }
        }
        /// Grade dot products `s (G, B)` (with `r` empty), or with `r` the norm backward into `gu`.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $dot(
            go: Slice<f32>, o: Slice<f32>, s: SliceMut<f32>, r: Slice<f32>, gu: SliceMut<f32>,
            rows: u64, n: u64,
        ) {
            unsafe { grade_dot::<$A>(go, o, s, r, gu, rows, n) }
        }
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $norm(u: Slice<f32>, o: SliceMut<f32>, r: SliceMut<f32>, rows: u64, n: u64) {
            unsafe { grade_norm::<$A>(u, o, r, rows, n) }
        }
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $pairs(
            x: Slice<f32>, y: Slice<f32>, pairs: SliceMut<f32>, bn: u64, n: u64, lo: u64, hi: u64,
        ) {
            unsafe { fc_pairs::<$A>(x, y, pairs, bn, n, (lo, hi)) }
        }
        #[unsafe(no_mangle)]
        /// [`fc_pairs_bwd`] of phase `phase` (0: row blocks `0..SPLIT`, stored; otherwise
        /// `SPLIT..NS`, added), grid-stride over the `bn` = B N elements.
        pub unsafe extern "ptx-kernel" fn $pairs_bwd(
            x: Slice<f32>, y: Slice<f32>, gpairs: Slice<f32>, gx: SliceMut<f32>, gy: SliceMut<f32>,
            bn: u64, n: u64, phase: u32,
        ) {
            if phase == 0 {
                unsafe { fc_pairs_bwd::<$A, false>(x, y, gpairs, (gx, gy), bn, n) }
            } else {
                unsafe { fc_pairs_bwd::<$A, true>(x, y, gpairs, (gx, gy), bn, n) }
            }
        }
        /// `ys` = y scaled by both gates ([`fc_gate_y`]), grid-stride over the `bn` = B N elements.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $gate_y(x: Slice<f32>, y: Slice<f32>, ys: SliceMut<f32>, bn: u64) {
            unsafe { fc_gate_y::<$A>(x, y, ys, bn) }
        }
    )*};
}

clifford_entry_points! {
    Cl2: sgp2d_fwd_f32, grade_dot2d_f32, grade_norm2d_f32, fc_pairs2d_f32, fc_pairs_bwd2d_f32, fc_gate_y2d_f32;
    Cl3: sgp3d_fwd_f32, grade_dot3d_f32, grade_norm3d_f32, fc_pairs3d_f32, fc_pairs_bwd3d_f32, fc_gate_y3d_f32;
}

crate::launch_bounds!(fc_permute_blocks_f32, ELEM_BLOCK, 4);
/// Block permutation of a `(blocks, len)` matrix: row `i` of `dst` = row `perm(i)` of `src`, one grid
/// row (y) a block. The fc variant's weights stacked grade by grade and their gradient back to path
/// order, in one launch where per-block copies took one each. `perm` packed by
/// `params::clifford::pack_perm`; 16-byte accesses when `len` is a multiple of 4 (the host
/// allocates 256-byte aligned), element by element otherwise.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn fc_permute_blocks_f32(
    src: Slice<f32>,
    dst: SliceMut<f32>,
    len: u64,
    perm_lo: u64,
    perm_hi: u64,
) {
    let i = block_idx_y();
    // (Both words as values: a select between the parameters made LLVM take their addresses.)
    let from = perm_entry(opaque_u64(perm_lo), opaque_u64(perm_hi), i);
    let (src_at, dst_at) = (from * len, i as u64 * len);
    let step = grid_dim_x() as u64 * block_dim_x() as u64;
    let mut e = block_idx_x() as u64 * block_dim_x() as u64 + thread_idx_x() as u64;
    if len % 4 == 0 {
        check_index(((from + 1) * len) as usize, src.len as usize + 1);
        check_index((dst_at + len) as usize, dst.len as usize + 1);
        while e < len / 4 {
            // SAFETY: chunk e of the block lies inside both buffers (checked above in checked
            // builds; the host sized them `blocks * len`), 16-byte aligned (len % 4 == 0 and
            // 256-byte aligned bases).
            unsafe {
                let v = load_chunk_ro(src.chunks(), (src_at / 4) + e);
                store_chunk(dst.chunks(), (dst_at / 4) + e, v);
            }
            e += step;
        }
    } else {
        while e < len {
            dst.set(dst_at + e, src.get(src_at + e));
            e += step;
        }
    }
}

/// Column sums of a row-major `(rows, cols)` matrix by row chunks: grid (ceil(cols / block), chunks),
/// `partials[chunk * cols + col]` = sum of the chunk's rows, in row order.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn col_sum_partials_f32(
    x: Slice<f32>,
    partials: SliceMut<f32>,
    rows: u64,
    cols: u64,
    rows_per_chunk: u64,
) {
    let col = block_idx_x() as u64 * block_dim_x() as u64 + thread_idx_x() as u64;
    if col >= cols {
        return;
    }
    let chunk = block_idx_y() as u64;
    let b0 = chunk * rows_per_chunk;
    let b1 = (b0 + rows_per_chunk).min(rows);
    let mut acc = 0.0f32;
    let mut b = b0;
    while b < b1 {
        acc += x.get(b * cols + col);
        b += 1;
    }
    partials.set(chunk * cols + col, acc);
}
