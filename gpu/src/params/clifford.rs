//! Clifford family: layers on Cl(2,0) and Cl(3,0) (docs/math/clifford.md): the product tables,
//! grades and weight paths, shared by the kernels and the host references, and the launch constants.

/// One term of the weighted geometric product: `o[j] += (neg ? -1 : 1) * w[p] * x[i] * y[k]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Term {
    pub j: u8,
    pub i: u8,
    pub k: u8,
    pub p: u8,
    pub neg: bool,
}

const fn t(j: u8, i: u8, k: u8, p: u8, sign: i8) -> Term {
    Term {
        j,
        i,
        k,
        p,
        neg: sign < 0,
    }
}

/// Blade grades, 2D order `[1, e1, e2, e12]`.
pub const GRADES_2D: [u8; 4] = [0, 1, 1, 2];
/// Blade grades, 3D order `[1, e1, e2, e3, e12, e13, e23, e123]`.
pub const GRADES_3D: [u8; 8] = [0, 1, 1, 1, 2, 2, 2, 3];
/// Weight paths (grade of x, grade of output, grade of y), in weight order.
pub const PATHS_2D: [[u8; 3]; 10] = [
    [0, 0, 0],
    [0, 1, 1],
    [0, 2, 2],
    [1, 0, 1],
    [1, 1, 0],
    [1, 1, 2],
    [1, 2, 1],
    [2, 0, 2],
    [2, 1, 1],
    [2, 2, 0],
];
pub const PATHS_3D: [[u8; 3]; 20] = [
    [0, 0, 0],
    [0, 1, 1],
    [0, 2, 2],
    [0, 3, 3],
    [1, 0, 1],
    [1, 1, 0],
    [1, 1, 2],
    [1, 2, 1],
    [1, 2, 3],
    [1, 3, 2],
    [2, 0, 2],
    [2, 1, 1],
    [2, 1, 3],
    [2, 2, 0],
    [2, 2, 2],
    [2, 3, 1],
    [3, 0, 3],
    [3, 1, 2],
    [3, 2, 1],
    [3, 3, 0],
];

/// The 2D product, term by term in the order of docs/math/clifford.md: `t(j, i, k, p, sign)`.
#[rustfmt::skip]
pub const TERMS_2D: [Term; 16] = [
    t(0,0,0,0,1), t(0,1,1,3,1), t(0,2,2,3,1), t(0,3,3,7,-1),
    t(1,0,1,1,1), t(1,1,0,4,1), t(1,2,3,5,-1), t(1,3,2,8,1),
    t(2,0,2,1,1), t(2,1,3,5,1), t(2,2,0,4,1), t(2,3,1,8,-1),
    t(3,0,3,2,1), t(3,1,2,6,1), t(3,2,1,6,-1), t(3,3,0,9,1),
];
/// The 3D product, term by term in the order of docs/math/clifford.md.
#[rustfmt::skip]
pub const TERMS_3D: [Term; 64] = [
    // o0 = w0 x0y0 + w4 (x1y1 + x2y2 + x3y3) - w10 (x4y4 + x5y5 + x6y6) - w16 x7y7
    t(0,0,0,0,1), t(0,1,1,4,1), t(0,2,2,4,1), t(0,3,3,4,1),
    t(0,4,4,10,-1), t(0,5,5,10,-1), t(0,6,6,10,-1), t(0,7,7,16,-1),
    // o1 = w1 x0y1 + w5 x1y0 - w6 (x2y4 + x3y5) + w11 (x4y2 + x5y3) - w12 x6y7 - w17 x7y6
    t(1,0,1,1,1), t(1,1,0,5,1), t(1,2,4,6,-1), t(1,3,5,6,-1),
    t(1,4,2,11,1), t(1,5,3,11,1), t(1,6,7,12,-1), t(1,7,6,17,-1),
    // o2 = w1 x0y2 + w6 x1y4 + w5 x2y0 - w6 x3y6 - w11 x4y1 + w12 x5y7 + w11 x6y3 + w17 x7y5
    t(2,0,2,1,1), t(2,1,4,6,1), t(2,2,0,5,1), t(2,3,6,6,-1),
    t(2,4,1,11,-1), t(2,5,7,12,1), t(2,6,3,11,1), t(2,7,5,17,1),
    // o3 = w1 x0y3 + w6 (x1y5 + x2y6) + w5 x3y0 - w12 x4y7 - w11 (x5y1 + x6y2) - w17 x7y4
    t(3,0,3,1,1), t(3,1,5,6,1), t(3,2,6,6,1), t(3,3,0,5,1),
    t(3,4,7,12,-1), t(3,5,1,11,-1), t(3,6,2,11,-1), t(3,7,4,17,-1),
    // o4 = w2 x0y4 + w7 (x1y2 - x2y1) + w8 x3y7 + w13 x4y0 - w14 x5y6 + w14 x6y5 + w18 x7y3
    t(4,0,4,2,1), t(4,1,2,7,1), t(4,2,1,7,-1), t(4,3,7,8,1),
    t(4,4,0,13,1), t(4,5,6,14,-1), t(4,6,5,14,1), t(4,7,3,18,1),
    // o5 = w2 x0y5 + w7 (x1y3 - x3y1) - w8 x2y7 + w14 x4y6 + w13 x5y0 - w14 x6y4 - w18 x7y2
    t(5,0,5,2,1), t(5,1,3,7,1), t(5,3,1,7,-1), t(5,2,7,8,-1),
    t(5,4,6,14,1), t(5,5,0,13,1), t(5,6,4,14,-1), t(5,7,2,18,-1),
    // o6 = w2 x0y6 + w8 x1y7 + w7 (x2y3 - x3y2) - w14 x4y5 + w14 x5y4 + w13 x6y0 + w18 x7y1
    t(6,0,6,2,1), t(6,1,7,8,1), t(6,2,3,7,1), t(6,3,2,7,-1),
    t(6,4,5,14,-1), t(6,5,4,14,1), t(6,6,0,13,1), t(6,7,1,18,1),
    // o7 = w3 x0y7 + w9 (x1y6 - x2y5 + x3y4) + w15 (x4y3 - x5y2 + x6y1) + w19 x7y0
    t(7,0,7,3,1), t(7,1,6,9,1), t(7,2,5,9,-1), t(7,3,4,9,1),
    t(7,4,3,15,1), t(7,5,2,15,-1), t(7,6,1,15,1), t(7,7,0,19,1),
];

/// Slot of each term in the fully connected variant's pair buffer `(slots, B, N)`. Slots are ordered
/// by output grade, then path, then output component, so the pair terms of path `p` for all the
/// components of its output grade form one contiguous `(n_g * B, N)` matrix: the A operand of that
/// path's matmul, whose product lands on the contiguous `(n_g * B, N_out)` slab of the output.
pub const fn pair_slots<const NT: usize, const NP: usize, const C: usize>(
    terms: &[Term; NT],
    paths: &[[u8; 3]; NP],
    grades: &[u8; C],
) -> [u8; NT] {
    let mut slots = [0u8; NT];
    let mut next = 0u8;
    let mut g = 0u8;
    while g <= grades[C - 1] {
        let mut p = 0;
        while p < NP {
            if paths[p][1] == g {
                let mut j = 0;
                while j < C {
                    if grades[j] == g {
                        let mut ti = 0;
                        while ti < NT {
                            if terms[ti].j as usize == j && terms[ti].p as usize == p {
                                slots[ti] = next;
                            }
                            ti += 1;
                        }
                        next += 1;
                    }
                    j += 1;
                }
            }
            p += 1;
        }
        g += 1;
    }
    slots
}
pub const SLOTS_2D: [u8; 16] = pair_slots(&TERMS_2D, &PATHS_2D, &GRADES_2D);
pub const SLOTS_3D: [u8; 64] = pair_slots(&TERMS_3D, &PATHS_3D, &GRADES_3D);
/// Where each pair slot's `(B, N)` plane lives in the pair buffer (`fc_pairs`): the slots of one
/// output grade `g` form one row-major matrix of `count_g * B` rows (component, then b) and
/// `paths_g * N` columns (path, then n), so the fc mixing of a grade is one matrix product with a
/// depth of `paths_g * N` (against the grade's weights stacked along the depth). Per slot
/// `[row_block, path, paths_g]`: element `(b, n)` of slot `s` is at
/// `row_block * B * N + (b * paths_g + path) * N + n`, where `row_block` is the number of slots of
/// earlier grades plus (component within the grade) times `paths_g`. The slot numbering is
/// [`pair_slots`]' (grade, then path, then component), which makes the grades' matrices consecutive.
pub const fn slot_layout<const NP: usize, const C: usize>(
    paths: &[[u8; 3]; NP],
    grades: &[u8; C],
) -> [[u32; 3]; 44] {
    let mut out = [[0u32; 3]; 44];
    let (mut next, mut off, mut g) = (0usize, 0u32, 0u8);
    while g <= grades[C - 1] {
        let (pg, count) = grade_shape(paths, grades, g);
        let mut pl = 0u32;
        let mut p = 0;
        while p < NP {
            if paths[p][1] == g {
                let mut jl = 0u32;
                let mut j = 0;
                while j < C {
                    if grades[j] == g {
                        out[next] = [off + jl * pg, pl, pg];
                        next += 1;
                        jl += 1;
                    }
                    j += 1;
                }
                pl += 1;
            }
            p += 1;
        }
        off += pg * count;
        g += 1;
    }
    out
}
pub const SLOT_LAYOUT_2D: [[u32; 3]; 44] = slot_layout(&PATHS_2D, &GRADES_2D);
pub const SLOT_LAYOUT_3D: [[u32; 3]; 44] = slot_layout(&PATHS_3D, &GRADES_3D);
/// The row block at which the fc forward's second phase begins. A forward writes and mixes the
/// pairs of row blocks `0..split`, frees them, then does the same for `split..NUM_SLOTS`, so it
/// holds about half the pair buffer at a time (`fc_pairs` writes a range of row blocks). The split
/// is the boundary between two output components (row block `g0 + j * paths_g`, where `g0` is the
/// first row block of grade `g` in [`slot_layout`]) that leaves the larger phase smallest, the
/// lower one on a tie: each phase then mixes whole components, a range of rows of its grades'
/// products. 2D: 7 of 14 (grade 0 and grade 1's first component, then the rest); 3D: 22 of 44
/// (grades 0 and 1, then 2 and 3).
pub const fn fc_phase_split<const NP: usize, const C: usize>(
    paths: &[[u8; 3]; NP],
    grades: &[u8; C],
) -> u32 {
    let mut total = 0u32;
    let mut g = 0u8;
    while g <= grades[C - 1] {
        let (pg, count) = grade_shape(paths, grades, g);
        total += pg * count;
        g += 1;
    }
    let (mut best, mut best_larger) = (0u32, u32::MAX);
    let mut off = 0u32;
    g = 0;
    while g <= grades[C - 1] {
        let (pg, count) = grade_shape(paths, grades, g);
        let mut j = 0;
        while j <= count {
            let b = off + j * pg;
            let larger = if 2 * b > total { b } else { total - b };
            if b > 0 && b < total && larger < best_larger {
                (best, best_larger) = (b, larger);
            }
            j += 1;
        }
        off += pg * count;
        g += 1;
    }
    best
}
/// Paths into output grade `g` and components of it.
const fn grade_shape<const NP: usize, const C: usize>(
    paths: &[[u8; 3]; NP],
    grades: &[u8; C],
    g: u8,
) -> (u32, u32) {
    let (mut pg, mut count) = (0u32, 0u32);
    let mut p = 0;
    while p < NP {
        if paths[p][1] == g {
            pg += 1;
        }
        p += 1;
    }
    let mut j = 0;
    while j < C {
        if grades[j] == g {
            count += 1;
        }
        j += 1;
    }
    (pg, count)
}
pub const FC_PHASE_SPLIT_2D: usize = fc_phase_split(&PATHS_2D, &GRADES_2D) as usize;
pub const FC_PHASE_SPLIT_3D: usize = fc_phase_split(&PATHS_3D, &GRADES_3D) as usize;
const _: () = assert!(FC_PHASE_SPLIT_2D == 7 && FC_PHASE_SPLIT_3D == 22);
/// Pair-buffer slots: sum over output grades of (paths into it) x (components of it).
pub const NUM_SLOTS_2D: usize = 14;
pub const NUM_SLOTS_3D: usize = 44;

/// Added to the mean square before the square root of the grade RMS norm.
pub const NORM_EPS: f32 = 1e-6;
/// Features each thread of the fused forward holds in registers, per algebra: a row of up to
/// `cache * FWD_MAX_BLOCK` features is read once and written once. With 4 the 3D kernel sits at the
/// 128 registers a 512-thread block allows, with no spills (`cargo xtask build-ptx`: sgp3d_fwd_f32
/// 128 regs, 0 B stack on sm_80 and sm_90); longer rows take the unfused path.
pub const FWD_CACHE_2D: u32 = 4;
pub const FWD_CACHE_3D: u32 = 4;
/// Most threads of a fused-forward block.
pub const FWD_MAX_BLOCK: u32 = 512;
/// Longest row held in registers for a given per-thread cache.
pub const fn fwd_max_cached(cache: u32) -> u64 {
    (cache * FWD_MAX_BLOCK) as u64
}
/// Threads for a row of `n` features: a multiple of 32 covering the row at `cache` a thread.
pub const fn fwd_block(n: u64, cache: u32) -> u32 {
    let need = n.div_ceil(cache as u64).div_ceil(32) * 32;
    if need < 32 {
        32
    } else if need > FWD_MAX_BLOCK as u64 {
        FWD_MAX_BLOCK
    } else {
        need as u32
    }
}
/// Most threads of a forward-v2 block (one thread a feature): rows up to this many features.
pub const FWD_V2_MAX_BLOCK: u32 = 1024;
/// Threads of a forward-v2 block for a row of `n <= FWD_V2_MAX_BLOCK` features: `n` rounded up to
/// whole warps.
pub const fn fwd_v2_block(n: u64) -> u32 {
    let t = n.div_ceil(32) * 32;
    if t < 32 { 32 } else { t as u32 }
}
/// Threads of a forward-v3 block (2D): several rows at once, 4 features a thread.
pub const FWD_V3_BLOCK: u32 = 256;
/// Features a forward-v3 thread takes: one 16-byte load a component of x and y, one store of o.
pub const FWD_V3_FEATURES: u64 = 4;
/// Longest row of forward v3: one row at most a block.
pub const FWD_V3_MAX_N: u64 = FWD_V3_FEATURES * FWD_V3_BLOCK as u64;
/// Threads of one row of forward v3 (`n` a multiple of 4, at most [`FWD_V3_MAX_N`]): the row's
/// `n / 4` feature quads rounded up to a power of two of at least a warp, so a block holds a whole
/// number of rows (`FWD_V3_BLOCK / row_threads`) and a warp never spans two rows.
pub const fn fwd_v3_row_threads(n: u64) -> u32 {
    let quads = n.div_ceil(FWD_V3_FEATURES);
    let mut t = 32u32;
    while (t as u64) < quads && t < FWD_V3_BLOCK {
        t *= 2;
    }
    t
}
const _: () = assert!(fwd_v3_row_threads(FWD_V3_MAX_N) == FWD_V3_BLOCK);
const _: () = assert!(fwd_v3_row_threads(4) == 32 && fwd_v3_row_threads(132) == 64);

/// Threads of the per-feature backward (one feature a thread) and of the elementwise kernels.
pub const BWD_BLOCK: u32 = 128;
/// Threads of the per-row reductions (grade dot products, grade norms of the fc variant).
pub const ROW_BLOCK: u32 = 256;
pub const ELEM_BLOCK: u32 = 256;
/// Entries of a block permutation of `fc_permute_blocks` (`PERM_BITS` each, packed little end first
/// into two u64 parameters of `PERM_PER_WORD` entries): the fc weights' 20 paths (3D) at most.
pub const PERM_BITS: u32 = 5;
pub const PERM_PER_WORD: u32 = 12;
pub const MAX_PERM_BLOCKS: usize = 2 * PERM_PER_WORD as usize;
const _: () = assert!(PATHS_3D.len() <= MAX_PERM_BLOCKS && MAX_PERM_BLOCKS <= 1 << PERM_BITS);
const _: () = assert!(PERM_PER_WORD * PERM_BITS <= 64);

/// Entry `i` of a permutation packed by [`pack_perm`].
#[inline(always)]
pub const fn perm_entry(lo: u64, hi: u64, i: u32) -> u64 {
    let word = if i < PERM_PER_WORD { lo } else { hi };
    (word >> (PERM_BITS * (i % PERM_PER_WORD))) & ((1 << PERM_BITS) - 1)
}

/// `perm` packed as `fc_permute_blocks` reads it ([`perm_entry`]): entry `i` in bits `PERM_BITS * (i % PERM_PER_WORD)`
/// of word `i / PERM_PER_WORD`. `None` past `MAX_PERM_BLOCKS` entries or for an entry that does not
/// fit its bits.
pub fn pack_perm(perm: &[usize]) -> Option<[u64; 2]> {
    if perm.len() > MAX_PERM_BLOCKS {
        return None;
    }
    let mut words = [0u64; 2];
    for (i, &p) in perm.iter().enumerate() {
        if p >= 1 << PERM_BITS {
            return None;
        }
        let i = i as u32;
        words[(i / PERM_PER_WORD) as usize] |= (p as u64) << (PERM_BITS * (i % PERM_PER_WORD));
    }
    Some(words)
}
/// Threads of `fc_pairs_bwd` (3D holds 44 pair gradients a thread: 3 blocks of 128 at up to 170
/// registers fit an SM without spills).
pub const FC_BWD_BLOCK: u32 = 128;
/// Batch rows each backward block folds into one weight-gradient partial (at least).
pub const ROWS_PER_CHUNK: u64 = 32;
/// Rows per chunk for a batch of `rows`: a function of the batch size only, so the partials and
/// their fixed-order sum give the same bits on every run and every GPU.
pub const fn rows_per_chunk(rows: u64) -> u64 {
    let min = rows.div_ceil(super::matmul::MAX_GRID_YZ);
    if min > ROWS_PER_CHUNK {
        min
    } else {
        ROWS_PER_CHUNK
    }
}
/// Warps of a `chunk_sum_tree` block (each sums every W-th chunk of 32 outputs).
pub const CHUNK_SUM_WARPS: u32 = 8;
/// Backward v2: threads (features x chunks) to aim for, and the fewest rows a chunk folds.
pub const BWD_V2_TARGET_THREADS: u64 = 1 << 17;
pub const BWD_V2_MIN_ROWS_PER_CHUNK: u64 = 4;
/// Backward v2 rows per chunk: small enough that `n * chunks` reaches `BWD_V2_TARGET_THREADS`
/// (B = 1024, N = 128 gets 256 chunks of 4 rows where [`rows_per_chunk`] gives 32 chunks: 32
/// blocks for 132 SMs), between `BWD_V2_MIN_ROWS_PER_CHUNK` and `ROWS_PER_CHUNK`. A function of
/// B and N only: the same bits on every run and every GPU.
pub const fn rows_per_chunk_v2(rows: u64, n: u64) -> u64 {
    let mut rpc = rows.saturating_mul(n) / BWD_V2_TARGET_THREADS;
    if rpc < BWD_V2_MIN_ROWS_PER_CHUNK {
        rpc = BWD_V2_MIN_ROWS_PER_CHUNK;
    }
    if rpc > ROWS_PER_CHUNK {
        rpc = ROWS_PER_CHUNK;
    }
    let min = rows.div_ceil(super::matmul::MAX_GRID_YZ);
    if min > rpc { min } else { rpc }
}
/// Number of row chunks (weight-gradient partials) for a batch of `rows`.
pub const fn chunks(rows: u64) -> u64 {
    let c = rows.div_ceil(rows_per_chunk(rows));
    if c == 0 { 1 } else { c }
}

const _: () = assert!(rows_per_chunk(1 << 40) * super::matmul::MAX_GRID_YZ >= 1 << 40);

#[cfg(test)]
mod perm_tests {
    use super::*;

    #[test]
    fn pack_perm_and_perm_entry_round_trip() {
        let perm: [usize; 20] = core::array::from_fn(|i| (7 * i + 3) % 20);
        let [lo, hi] = pack_perm(&perm).unwrap();
        for (i, &p) in perm.iter().enumerate() {
            assert_eq!(perm_entry(lo, hi, i as u32), p as u64, "entry {i}");
        }
        assert_eq!(pack_perm(&[0; MAX_PERM_BLOCKS + 1]), None);
        assert_eq!(pack_perm(&[1 << PERM_BITS]), None);
        assert_eq!(pack_perm(&[]), Some([0, 0]));
    }
}
