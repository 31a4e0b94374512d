//! Relevance propagation through a linear layer (`kernels/lrp.rs`, `host::ops::lrp`).
//!
//! Three tiled GEMM-shaped kernels share one tile configuration: `lrp_sums` (per row and output: the
//! sums `A = sum |x||W|` and `S = sum x W`, from which `P = (A+S)/2`, `N = (A-S)/2`), `dense` (the forward
//! `x W^T`) and `lrp_spread` (`G = coef |W|`). A block computes a `BM x BN` tile of the output over one
//! slice of the depth (split-K); each split writes its own partial tile to a workspace, and an
//! elementwise kernel adds the splits in split order. The split count is a function of the shape alone,
//! so every run adds in the same order: the same bits every run.
//!
//! The products run on the tensor cores as "3xTF32" (`mma.m16n8k8` with tf32 inputs, each f32 operand
//! split into a tf32 high part and a tf32 remainder; see `dev::mma::split_tf32`): fp32-level accuracy at
//! several times the FFMA rate. Each warp owns a `WARP_M x WARP_N` piece of the block tile as
//! `M_TILES x N_TILES` mma tiles of 16 x 8; the fragment addressing is below, as const fns the host
//! unit-tests against the PTX ISA's fragment definition.
use super::KernelParam;

/// Output rows per block tile (rows of x / relevance).
pub const BM: u64 = 64;
/// Output columns per block tile (outputs j for the sums, inputs i for the spread).
pub const BN: u64 = 128;
/// Depth per shared-memory stage (two mma k-steps of 8).
pub const BK: u64 = 16;
/// Threads per block: 8 warps as 2 (rows) x 4 (columns).
pub const THREADS: u32 = 256;
pub const WARPS_M: u64 = 2;
pub const WARPS_N: u64 = 4;
/// A warp's tile of the output, in mma tiles of `MMA_M x MMA_N` over depth steps of `MMA_K`.
pub const WARP_M: u64 = 32;
pub const WARP_N: u64 = 32;
pub const MMA_M: u64 = 16;
pub const MMA_N: u64 = 8;
pub const MMA_K: u64 = 8;
pub const M_TILES: usize = (WARP_M / MMA_M) as usize;
pub const N_TILES: usize = (WARP_N / MMA_N) as usize;
/// Both operands are held in shared memory depth-major (`[k][m]`, `[k][n]`) with rows padded by 8
/// floats: a row stride of 8 (mod 32) words puts the fragment reads of a warp (lane `4g + t` reads
/// depth `t` (+4), row/column `g` (+8)) at banks `8t + g`, all 32 distinct; rows stay 16-byte aligned.
pub const PAD: u64 = 8;
pub const A_STRIDE: u64 = BM + PAD;
pub const B_STRIDE: u64 = BN + PAD;
/// Floats of one stage of each operand (two stages are double buffered).
pub const STAGE_A: usize = (BK * A_STRIDE) as usize;
pub const STAGE_B: usize = (BK * B_STRIDE) as usize;
/// Blocks the split-K choice aims for: about two waves of a 132-SM H100/H200 at one block per SM,
/// and a power of two, so `64 x 4096` outputs (32 tiles) split 4096 deep into 8 slices of 512. A
/// constant, not the device's SM count, so the summation order depends on the shape only.
pub const TARGET_BLOCKS: u64 = 256;
/// Fewest depth elements one split covers.
pub const MIN_K_PER_SPLIT: u64 = 256;
pub const MAX_SPLITS: u64 = 16;
/// Threads per block of the elementwise kernels (coefficients, finish, check).
pub const EW_BLOCK: u32 = 256;
/// Blocks of the non-finite check (upper bound; partial counts come back to the host).
pub const CHECK_BLOCKS: u64 = 256;
/// Largest grid y extent (row tiles).
pub const MAX_GRID_Y: u64 = 65_535;

const _: () = assert!(WARPS_M * WARPS_N * 32 == THREADS as u64);
const _: () = assert!(WARPS_M * WARP_M == BM && WARPS_N * WARP_N == BN);
const _: () = assert!(
    WARP_M.is_multiple_of(MMA_M) && WARP_N.is_multiple_of(MMA_N) && BK.is_multiple_of(MMA_K)
);
const _: () = assert!(A_STRIDE % 32 == 8 && B_STRIDE % 32 == 8);
// The tile loaders hard-code these (see kernels/lrp.rs).
const _: () = assert!(BM == 64 && BN == 128 && BK == 16 && THREADS == 256);

/// Offset within an A stage (`[k][m]`, stride `A_STRIDE`) of register `r` of the A fragment of
/// m-tile `mi` at depth step `ks` (0 or `MMA_K`), for lane `lane` of warp `warp`: the thread's base
/// [`frag_a_base`] plus a constant [`frag_a_delta`]. The fragment (PTX ISA, m16n8k8 tf32,
/// `g = lane / 4`, `t = lane % 4`): `r = 0` (row g, depth t), `1` (g+8, t), `2` (g, t+4),
/// `3` (g+8, t+4), rows counted from the mma tile's first row.
pub const fn frag_a_offset(warp: usize, lane: usize, mi: usize, ks: usize, r: usize) -> usize {
    frag_a_base(warp, lane) + frag_a_delta(mi, ks, r)
}
#[inline(always)]
pub const fn frag_a_base(warp: usize, lane: usize) -> usize {
    (lane % 4) * A_STRIDE as usize + (warp / WARPS_N as usize) * WARP_M as usize + lane / 4
}
#[inline(always)]
pub const fn frag_a_delta(mi: usize, ks: usize, r: usize) -> usize {
    (ks + 4 * (r >> 1)) * A_STRIDE as usize + mi * MMA_M as usize + 8 * (r & 1)
}

/// Offset within a B stage (`[k][n]`, stride `B_STRIDE`) of register `r` of the B fragment of
/// n-tile `ni` at depth step `ks`: `r = 0` (depth t, column g), `1` (depth t+4, column g).
pub const fn frag_b_offset(warp: usize, lane: usize, ni: usize, ks: usize, r: usize) -> usize {
    frag_b_base(warp, lane) + frag_b_delta(ni, ks, r)
}
#[inline(always)]
pub const fn frag_b_base(warp: usize, lane: usize) -> usize {
    (lane % 4) * B_STRIDE as usize + (warp % WARPS_N as usize) * WARP_N as usize + lane / 4
}
#[inline(always)]
pub const fn frag_b_delta(ni: usize, ks: usize, r: usize) -> usize {
    (ks + 4 * r) * B_STRIDE as usize + ni * MMA_N as usize
}

/// Block-tile `(row, column)` of accumulator register `r` of mma tile `(mi, ni)`: `r = 0, 1` at
/// row g, columns 2t, 2t+1; `r = 2, 3` at row g+8.
#[inline(always)]
pub const fn acc_coords(warp: usize, lane: usize, mi: usize, ni: usize, r: usize) -> (u64, u64) {
    let m =
        (warp / WARPS_N as usize) * WARP_M as usize + mi * MMA_M as usize + lane / 4 + 8 * (r >> 1);
    let n = (warp % WARPS_N as usize) * WARP_N as usize
        + ni * MMA_N as usize
        + 2 * (lane % 4)
        + (r & 1);
    (m as u64, n as u64)
}

/// `(splits, k_per_split)` for an `m x n` output over depth `k`: enough splits that the grid has
/// about `TARGET_BLOCKS` blocks, each split at least `MIN_K_PER_SPLIT` deep (a multiple of `BK`), and
/// no empty split.
pub const fn split_k(m: u64, n: u64, k: u64) -> (u64, u64) {
    split_k_in(m, n, k, BK)
}

/// [`split_k`] for stages `bk` deep: the slices are multiples of `bk`.
pub const fn split_k_in(m: u64, n: u64, k: u64, bk: u64) -> (u64, u64) {
    let tiles = m.div_ceil(BM) * n.div_ceil(BN);
    let want = if tiles == 0 {
        1
    } else {
        TARGET_BLOCKS.div_ceil(tiles)
    };
    let most = k.div_ceil(MIN_K_PER_SPLIT);
    let mut splits = if want < most { want } else { most };
    if splits > MAX_SPLITS {
        splits = MAX_SPLITS;
    }
    if splits == 0 {
        splits = 1;
    }
    let kps = k.div_ceil(splits).div_ceil(bk) * bk;
    let kps = if kps == 0 { bk } else { kps };
    let splits = k.div_ceil(kps);
    (if splits == 0 { 1 } else { splits }, kps)
}

/// GEMM-pass variant 3 (`lrp_sums_v3_f32`, `lrp_spread_v3_f32`, `dense_v3_f32`; see the
/// kernels/lrp.rs module doc): the default's block tile, warps and mma tiles, but stages `BK = 32`
/// deep, filled by 16-byte `cp.async` copies into `STAGES` buffers of dynamic shared memory, each
/// operand tile stored in its global orientation (`[row][k]`, or `[k][n]` for the spread pass's B).
///
/// Depth slots: the mma adds the 8 products of a k-step in any order, so which depth of the stage
/// feeds which fragment slot only has to agree between A and B. Here slot `t` (`t = lane % 4`) of
/// k-step `s` is depth `8 s + 2 t` and slot `t + 4` is `8 s + 2 t + 1` ([`slot_depth`]): a lane's
/// two A values of a row (`a0`, `a2`), and its two B values of a column in `[n][k]` tiles, are
/// adjacent, one 8-byte `ld.shared.v2` each.
pub mod v3 {
    use super::{BM, BN, MMA_K, MMA_M, MMA_N, THREADS, WARP_M, WARP_N, WARPS_N};

    /// Depth per stage: four k-steps of 8; one fresh 3xTF32 partial per tile and stage.
    pub const BK: u64 = 32;
    pub const K_STEPS: usize = (BK / MMA_K) as usize;
    /// Pipeline buffers: while one stage is computed, up to `STAGES - 1` newer ones are in flight.
    pub const STAGES: u32 = 4;
    /// Row stride (floats) of the depth-contiguous tiles `[row][k]` (A; B of the sums and dense
    /// passes, whose `W` is `[N][K]`). Fragment reads are 8-byte pairs at float `row * 40 + 8 s +
    /// 2 t`; a half-warp (rows g = 0..3 or 4..7, t = 0..3) reads pairs `20 g + t` mod 16 =
    /// `4 g + t`: 16 distinct bank pairs, no conflict. Rows of 160 bytes keep chunks 16-byte
    /// aligned, and the 8 chunks of a row (one `cp.async` phase) land in 8 distinct 16-byte bank
    /// groups.
    pub const NK_STRIDE: u64 = BK + 8;
    /// Row stride of the spread pass's B tile `[k][n]` (its `W` is `[K][N]`, N contiguous): the
    /// scalar fragment reads (depth `2 t` and `2 t + 1`, column `g`) fall on banks
    /// `264 t + g = 8 t + g` (+ 4) mod 32: all 32 distinct. Rows of 528 bytes.
    pub const KN_STRIDE: u64 = BN + 4;
    /// Floats of one stage of A (`[BM][NK_STRIDE]`) and of B (`[BN][NK_STRIDE]` or
    /// `[BK][KN_STRIDE]`).
    pub const STAGE_A: u32 = (BM * NK_STRIDE) as u32;
    pub const STAGE_B_NK: u32 = (BN * NK_STRIDE) as u32;
    pub const STAGE_B_KN: u32 = (BK * KN_STRIDE) as u32;
    /// 16-byte copies per thread and stage: A (64 rows of 8 chunks), B (128 rows of 8 chunks, or
    /// 32 depth rows of 32 chunks).
    pub const A_COPIES: usize = (BM * BK / 4 / THREADS as u64) as usize;
    pub const B_COPIES: usize = (BN * BK / 4 / THREADS as u64) as usize;
    /// Blocks per SM the launch bounds ask for. The sums pass holds two accumulator sets and two
    /// stage partials (128 registers before any operand): one block of 8 warps per SM, up to 255
    /// registers. The spread and dense passes (32 + 32) are to fit 128 registers: two blocks per
    /// SM, whose barriers and pipeline bubbles overlap (2 x 106 KiB of stages fit an sm_90 SM).
    pub const SUMS_BLOCKS_PER_SM: u32 = 1;
    pub const SPREAD_BLOCKS_PER_SM: u32 = 2;

    const _: () = assert!(BK.is_multiple_of(MMA_K) && K_STEPS == 4);
    const _: () = assert!(NK_STRIDE % 32 == 8 && KN_STRIDE % 16 == 4);
    const _: () = assert!(NK_STRIDE.is_multiple_of(4) && KN_STRIDE.is_multiple_of(4));
    // The loaders (kernels/lrp.rs) hard-code these.
    const _: () = assert!(BM == 64 && BN == 128 && THREADS == 256);
    const _: () = assert!(A_COPIES == 2 && B_COPIES == 4);
    // One sums block, or two spread blocks, within an sm_90 SM's 228 KiB (1 KiB per block reserved).
    const _: () = assert!(smem_bytes(false) <= 227 * 1024);
    const _: () = assert!(2 * (smem_bytes(true) + 1024) <= 228 * 1024);

    /// Floats of one stage (A then B); `kn`: B stored `[k][n]` (the spread pass).
    pub const fn stage_floats(kn: bool) -> u32 {
        STAGE_A + if kn { STAGE_B_KN } else { STAGE_B_NK }
    }
    /// Dynamic shared memory of a launch: `STAGES` stages.
    pub const fn smem_bytes(kn: bool) -> u32 {
        STAGES * stage_floats(kn) * 4
    }

    /// `(splits, k_per_split)` as [`super::split_k`], with slices a multiple of `BK = 32`.
    pub const fn split_k(m: u64, n: u64, k: u64) -> (u64, u64) {
        super::split_k_in(m, n, k, BK)
    }

    /// Depth within the stage that fragment slot `t + 4 h` (`h` = 0 or 1) of k-step `s` holds.
    pub const fn slot_depth(s: usize, t: usize, h: usize) -> usize {
        MMA_K as usize * s + 2 * t + h
    }

    /// Float offset within an A stage of the pair of A fragment registers of m-tile `mi` at
    /// k-step `s`: `h = 0` the pair (`a0`, `a2`) of row `g`, `h = 1` (`a1`, `a3`) of row `g + 8`.
    /// The thread's base [`frag_a_base`] plus a constant [`frag_a_delta`].
    pub const fn frag_a_offset(warp: usize, lane: usize, mi: usize, s: usize, h: usize) -> usize {
        frag_a_base(warp, lane) + frag_a_delta(mi, s, h)
    }
    #[inline(always)]
    pub const fn frag_a_base(warp: usize, lane: usize) -> usize {
        ((warp / WARPS_N as usize) * WARP_M as usize + lane / 4) * NK_STRIDE as usize
            + 2 * (lane % 4)
    }
    #[inline(always)]
    pub const fn frag_a_delta(mi: usize, s: usize, h: usize) -> usize {
        (mi * MMA_M as usize + 8 * h) * NK_STRIDE as usize + MMA_K as usize * s
    }

    /// Float offset within a `[n][k]` B stage of the pair (`b0`, `b1`) of n-tile `ni` at k-step `s`.
    pub const fn frag_b_nk_offset(warp: usize, lane: usize, ni: usize, s: usize) -> usize {
        frag_b_nk_base(warp, lane) + frag_b_nk_delta(ni, s)
    }
    #[inline(always)]
    pub const fn frag_b_nk_base(warp: usize, lane: usize) -> usize {
        ((warp % WARPS_N as usize) * WARP_N as usize + lane / 4) * NK_STRIDE as usize
            + 2 * (lane % 4)
    }
    #[inline(always)]
    pub const fn frag_b_nk_delta(ni: usize, s: usize) -> usize {
        ni * MMA_N as usize * NK_STRIDE as usize + MMA_K as usize * s
    }

    /// Float offset within a `[k][n]` B stage of register `r` (`b0`, `b1`) of n-tile `ni` at
    /// k-step `s`.
    pub const fn frag_b_kn_offset(
        warp: usize,
        lane: usize,
        ni: usize,
        s: usize,
        r: usize,
    ) -> usize {
        frag_b_kn_base(warp, lane) + frag_b_kn_delta(ni, s, r)
    }
    #[inline(always)]
    pub const fn frag_b_kn_base(warp: usize, lane: usize) -> usize {
        2 * (lane % 4) * KN_STRIDE as usize + (warp % WARPS_N as usize) * WARP_N as usize + lane / 4
    }
    #[inline(always)]
    pub const fn frag_b_kn_delta(ni: usize, s: usize, r: usize) -> usize {
        (MMA_K as usize * s + r) * KN_STRIDE as usize + ni * MMA_N as usize
    }

    /// (row, 16-byte chunk) of a `[row][k]` tile (A, or B of `[n][k]`) that copy `i` of thread
    /// `tid` fills: 8 threads a row, 32 rows per round.
    #[inline(always)]
    pub const fn nk_copy(tid: usize, i: usize) -> (usize, usize) {
        (tid / 8 + 32 * i, tid % 8)
    }
    /// (depth row, 16-byte chunk) of the `[k][n]` B tile that copy `i` of thread `tid` fills: a
    /// warp a row (512 contiguous bytes), 8 rows per round.
    #[inline(always)]
    pub const fn kn_copy(tid: usize, i: usize) -> (usize, usize) {
        (tid / 32 + 8 * i, tid % 32)
    }

    #[cfg(test)]
    mod tests {
        //! The variant's fragment addressing against the PTX ISA's m16n8k8 (tf32) fragments (by
        //! emulating the warp-level mma on the CPU over a whole stage), its bank behaviour, and the
        //! copy coverage of a stage.
        use super::*;
        extern crate std;
        use std::vec;

        /// (row or column, depth) of a `[row][k]` stage offset; (column, depth) of a `[k][n]` one.
        fn decode_nk(off: usize) -> (usize, usize) {
            (off / NK_STRIDE as usize, off % NK_STRIDE as usize)
        }
        fn decode_kn(off: usize) -> (usize, usize) {
            (off % KN_STRIDE as usize, off / KN_STRIDE as usize)
        }

        #[test]
        fn fragments_hold_matching_depths_and_reads_are_conflict_free() {
            for warp in 0..8 {
                let (wm, wn) = ((warp / 4) * 32, (warp % 4) * 32);
                for s in 0..K_STEPS {
                    for mi in 0..super::super::M_TILES {
                        for h in 0..2 {
                            // 8-byte reads: two phases of 16 lanes, 16 distinct bank pairs each.
                            for half in 0..2 {
                                let mut pairs = [false; 16];
                                for lane in 16 * half..16 * half + 16 {
                                    let (g, t) = (lane / 4, lane % 4);
                                    let off = frag_a_offset(warp, lane, mi, s, h);
                                    assert!(off.is_multiple_of(2) && off + 1 < STAGE_A as usize);
                                    let row = wm + 16 * mi + g + 8 * h;
                                    // ISA: a0 / a1 at slot t, a2 / a3 at slot t + 4.
                                    assert_eq!(decode_nk(off), (row, slot_depth(s, t, 0)));
                                    assert_eq!(decode_nk(off + 1), (row, slot_depth(s, t, 1)));
                                    let p = (off / 2) % 16;
                                    assert!(!pairs[p], "A bank conflict w{warp} s{s} mi{mi} h{h}");
                                    pairs[p] = true;
                                }
                            }
                        }
                    }
                    for ni in 0..super::super::N_TILES {
                        for half in 0..2 {
                            let mut pairs = [false; 16];
                            for lane in 16 * half..16 * half + 16 {
                                let (g, t) = (lane / 4, lane % 4);
                                let off = frag_b_nk_offset(warp, lane, ni, s);
                                assert!(off.is_multiple_of(2) && off + 1 < STAGE_B_NK as usize);
                                let n = wn + 8 * ni + g;
                                // ISA: b0 at slot t, b1 at slot t + 4, column g.
                                assert_eq!(decode_nk(off), (n, slot_depth(s, t, 0)));
                                assert_eq!(decode_nk(off + 1), (n, slot_depth(s, t, 1)));
                                let p = (off / 2) % 16;
                                assert!(!pairs[p], "B[n][k] bank conflict");
                                pairs[p] = true;
                            }
                        }
                        for r in 0..2 {
                            let mut banks = [false; 32];
                            for lane in 0..32 {
                                let (g, t) = (lane / 4, lane % 4);
                                let off = frag_b_kn_offset(warp, lane, ni, s, r);
                                assert!(off < STAGE_B_KN as usize);
                                let n = wn + 8 * ni + g;
                                assert_eq!(decode_kn(off), (n, slot_depth(s, t, r)));
                                assert!(!banks[off % 32], "B[k][n] bank conflict");
                                banks[off % 32] = true;
                            }
                        }
                    }
                }
            }
        }

        /// One stage of the block tile through emulated mma (ISA fragment semantics, slots as
        /// loaded): every output once, equal to the product over the stage's 32 depths, for both
        /// B orientations.
        #[test]
        fn emulated_block_stage_computes_the_product() {
            let (rows, cols, depth) = (BM as usize, BN as usize, BK as usize);
            let a = |m: usize, k: usize| ((m * 7 + k * 3) % 11) as i64 - 5;
            let b = |k: usize, n: usize| ((k * 5 + n * 13) % 9) as i64 - 4;
            let mut sa = vec![0i64; STAGE_A as usize];
            let mut snk = vec![0i64; STAGE_B_NK as usize];
            let mut skn = vec![0i64; STAGE_B_KN as usize];
            for k in 0..depth {
                for m in 0..rows {
                    sa[m * NK_STRIDE as usize + k] = a(m, k);
                }
                for n in 0..cols {
                    snk[n * NK_STRIDE as usize + k] = b(k, n);
                    skn[k * KN_STRIDE as usize + n] = b(k, n);
                }
            }
            for kn in [false, true] {
                let mut out = vec![None; rows * cols];
                for warp in 0..8 {
                    for mi in 0..super::super::M_TILES {
                        for ni in 0..super::super::N_TILES {
                            let mut acc = [[0i64; 4]; 32];
                            for s in 0..K_STEPS {
                                let (mut ta, mut tb) = ([[0i64; 8]; 16], [[0i64; 8]; 8]);
                                for lane in 0..32 {
                                    let (g, t) = (lane / 4, lane % 4);
                                    for h in 0..2 {
                                        let off = frag_a_offset(warp, lane, mi, s, h);
                                        // (a0, a2) of row g, (a1, a3) of row g + 8.
                                        ta[g + 8 * h][t] = sa[off];
                                        ta[g + 8 * h][t + 4] = sa[off + 1];
                                    }
                                    let (b0, b1) = if kn {
                                        (
                                            skn[frag_b_kn_offset(warp, lane, ni, s, 0)],
                                            skn[frag_b_kn_offset(warp, lane, ni, s, 1)],
                                        )
                                    } else {
                                        let off = frag_b_nk_offset(warp, lane, ni, s);
                                        (snk[off], snk[off + 1])
                                    };
                                    tb[t][g] = b0;
                                    tb[t + 4][g] = b1;
                                }
                                for lane in 0..32 {
                                    let (g, t) = (lane / 4, lane % 4);
                                    for r in 0..4 {
                                        let (row, col) = (g + 8 * (r >> 1), 2 * t + (r & 1));
                                        acc[lane][r] +=
                                            (0..8).map(|k| ta[row][k] * tb[k][col]).sum::<i64>();
                                    }
                                }
                            }
                            for lane in 0..32 {
                                for r in 0..4 {
                                    let (m, n) = super::super::acc_coords(warp, lane, mi, ni, r);
                                    let slot = &mut out[m as usize * cols + n as usize];
                                    assert!(slot.is_none(), "output ({m}, {n}) written twice");
                                    *slot = Some(acc[lane][r]);
                                }
                            }
                        }
                    }
                }
                for m in 0..rows {
                    for n in 0..cols {
                        let want: i64 = (0..depth).map(|k| a(m, k) * b(k, n)).sum();
                        assert_eq!(out[m * cols + n], Some(want), "kn {kn} ({m}, {n})");
                    }
                }
            }
        }

        /// The copies of a stage: every 16-byte chunk of each tile exactly once, 16-byte aligned,
        /// inside the stage; the 8 threads of a `cp.async` phase write distinct 16-byte bank groups.
        #[test]
        fn copies_cover_each_stage_chunk_once() {
            let threads = THREADS as usize;
            let mut a = vec![0u32; (BM * BK / 4) as usize];
            let mut bnk = vec![0u32; (BN * BK / 4) as usize];
            let mut bkn = vec![0u32; (BN * BK / 4) as usize];
            for tid in 0..threads {
                for i in 0..A_COPIES {
                    let (r, c) = nk_copy(tid, i);
                    assert!(r < BM as usize && c < (BK / 4) as usize);
                    a[r * (BK / 4) as usize + c] += 1;
                }
                for i in 0..B_COPIES {
                    let (r, c) = nk_copy(tid, i);
                    assert!(r < BN as usize && c < (BK / 4) as usize);
                    bnk[r * (BK / 4) as usize + c] += 1;
                    let (k, c) = kn_copy(tid, i);
                    assert!(k < BK as usize && c < (BN / 4) as usize);
                    bkn[k * (BN / 4) as usize + c] += 1;
                    let off = k * KN_STRIDE as usize + 4 * c;
                    assert!(off.is_multiple_of(4) && off + 4 <= STAGE_B_KN as usize);
                }
            }
            assert!(a.iter().chain(&bnk).chain(&bkn).all(|&n| n == 1));
            for i in 0..B_COPIES {
                for phase in 0..threads / 8 {
                    let (mut nk, mut kn) = ([false; 8], [false; 8]);
                    for tid in 8 * phase..8 * phase + 8 {
                        let (r, c) = nk_copy(tid, i);
                        let off = r * NK_STRIDE as usize + 4 * c;
                        assert!(off.is_multiple_of(4) && off + 4 <= STAGE_B_NK as usize);
                        assert!(!nk[(off / 4) % 8], "[n][k] copy conflict");
                        nk[(off / 4) % 8] = true;
                        let (k, c) = kn_copy(tid, i);
                        let off = k * KN_STRIDE as usize + 4 * c;
                        assert!(!kn[(off / 4) % 8], "[k][n] copy conflict");
                        kn[(off / 4) % 8] = true;
                    }
                }
            }
        }

        #[test]
        fn split_k_slices_are_whole_stages() {
            // R = 64, I = O = 4096: 32 tiles, 8 slices of 512 (the default's split too).
            assert_eq!(split_k(64, 4096, 4096), (8, 512));
            assert_eq!(split_k(1024, 4096, 4096), (1, 4096));
            for (m, n, k) in [(64, 200, 4104), (3, 9, 4097), (1, 16, 24), (65, 129, 4120)] {
                let (splits, kps) = split_k(m, n, k);
                assert!(kps.is_multiple_of(BK) && splits >= 1, "({m}, {n}, {k})");
                assert!(
                    (splits - 1) * kps < k && splits * kps >= k,
                    "({m}, {n}, {k})"
                );
            }
        }
    }
}

/// GEMM-pass variant 5 (`lrp_sums_v5_f32`, `lrp_spread_v5_f32`, `lrp_spread_v5_finish_f32`,
/// `dense_v5_f32`): variant 3's kernels (tiles, pipeline, chains, occupancy) with the 3xTF32 split
/// done by integer operations ([`split_tf32_fast`]) instead of `cvt.rna.tf32.f32`.
///
/// Why: sm_90 has no tf32 conversion instruction; ptxas expands each `cvt.rna.tf32.f32` into about
/// four (FSETP for the finite check, an add of half an ulp, the mask, a SEL), and every split
/// converts twice. In variant 3's SASS (sm_90) that is about half the issue slots of a stage: the
/// sums pass issues 995 instructions a warp and stage for 192 HMMA, the spread pass 745 for 96.
/// The fast split is four instructions a value (IADD, LOP3, FADD, LOP3) where variant 3 spends
/// about nine.
///
/// The split: `hi` = `v` rounded to tf32 to nearest, ties away from zero (what `cvt.rna` gives for
/// every finite `v`: adding half a tf32 ulp to the bit pattern rounds the magnitude, a carry into
/// the exponent is the correct rounding), `lo` = `v - hi` (exact) truncated to tf32 (its low 13
/// bits cleared) instead of rounded. Error per product: `|v - hi| <= 2^-11 |v|`, the truncation
/// of `lo` costs `< 2^-10 |lo| <= 2^-21 |v|`, so `a b` is taken within `(2^-21 + 2^-21 + 2^-22)
/// |a b| = 5 2^-22 |a b|` (~1.2e-6; variant 3: `3 2^-22`), still far below the stage chain's
/// truncation bound (module doc of kernels/lrp.rs), so the pass bound grows from `2.2e-6` to
/// about `2.7e-6` (plus the f32 sum's `(K/32) 2^-24`). The split is odd (`split(-v)` is
/// `split(v)` with both signs flipped), so `split_abs` of it is the split of `|v|` and the
/// one-sign identity `A = |S|` still holds bit for bit.
///
/// Non-finite `v`: `lo` is truncated rather than rounded so that a NaN never vanishes (a rounding
/// add would carry the canonical NaN `0x7fffffff` into the sign bit and give -0); an infinite `v`
/// gives `hi = inf`, `lo = NaN`, as `cvt.rna` does. The products, and so the row's relevance, are
/// NaN as in variant 3.
pub mod v5 {
    /// Half a tf32 ulp, and the mask that keeps a tf32's 19 bits (sign, exponent, 10 mantissa).
    pub const TF32_HALF_ULP: u32 = 0x1000;
    pub const TF32_MASK: u32 = 0xffff_e000;

    /// The bit pattern of `v` rounded to tf32, to nearest, ties away from zero (`cvt.rna.tf32.f32`
    /// for finite values; the NaNs `0x7ffff000..=0x7fffffff` and their negatives wrap, which
    /// [`split_tf32_fast`] makes harmless).
    #[inline(always)]
    pub const fn tf32_rna_bits(bits: u32) -> u32 {
        bits.wrapping_add(TF32_HALF_ULP) & TF32_MASK
    }

    /// `(hi, lo)` as tf32 bit patterns: `hi` = [`tf32_rna_bits`] of `v`, `lo` = `v - hi` with its
    /// low 13 bits cleared (see the module doc for the error and the non-finite cases).
    #[inline(always)]
    pub fn split_tf32_fast(v: f32) -> (u32, u32) {
        let hi = tf32_rna_bits(v.to_bits());
        let lo = (v - f32::from_bits(hi)).to_bits() & TF32_MASK;
        (hi, lo)
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        extern crate std;

        /// `v` rounded to 11 significant bits, to nearest, ties away from zero, by f64 arithmetic
        /// (normal range; f64 holds every f32 and the half-ulp sums exactly).
        fn rna_model(v: f32) -> f32 {
            if v == 0.0 || !v.is_finite() {
                return v;
            }
            let a = (v as f64).abs();
            let e = a.log2().floor() as i32;
            // Guard the log2 rounding at powers of two.
            let e = if 2f64.powi(e) > a {
                e - 1
            } else if 2f64.powi(e + 1) <= a {
                e + 1
            } else {
                e
            };
            let ulp = 2f64.powi(e.max(-126) - 10);
            let q = (a / ulp).floor();
            let r = a - q * ulp;
            let m = if 2.0 * r >= ulp { q + 1.0 } else { q };
            (v.signum() as f64 * m * ulp) as f32
        }

        #[test]
        fn hi_is_round_to_nearest_ties_away_and_lo_the_truncated_rest() {
            let mut s = 0x9e37_79b9u32;
            let check = |v: f32| {
                let (hi, lo) = split_tf32_fast(v);
                assert_eq!(
                    f32::from_bits(hi),
                    rna_model(v),
                    "hi of {v:e} ({:#x})",
                    v.to_bits()
                );
                assert_eq!(hi & !TF32_MASK, 0);
                assert_eq!(lo & !TF32_MASK, 0);
                let rest = v - f32::from_bits(hi);
                // Truncation: the same sign, not larger, within a tf32 ulp of the rest.
                let l = f32::from_bits(lo);
                // (A subnormal rest keeps tf32's absolute grid, 2^-136, as with `cvt.rna`.)
                let grid = (rest.abs() * 2f32.powi(-10)).max(f32::from_bits(0x2000)); // 2^-136
                assert!(
                    l.abs() <= rest.abs() && (rest - l).abs() <= grid,
                    "{v:e} {:#x} rest {rest:e} lo {l:e}",
                    v.to_bits()
                );
                assert!(rest == 0.0 || l == 0.0 || l.signum() == rest.signum());
                assert!(!v.is_normal() || rest.abs() as f64 <= (v.abs() as f64) * 2f64.powi(-11));
                // Odd: split(-v) flips both signs.
                let (nh, nl) = split_tf32_fast(-v);
                assert_eq!(nh, hi ^ 0x8000_0000);
                if lo & 0x7fff_ffff == 0 {
                    assert_eq!(nl & 0x7fff_ffff, 0);
                } else {
                    assert_eq!(nl, lo ^ 0x8000_0000);
                }
            };
            for bits in [
                0x3f80_0000u32,
                0x3f80_1000,
                0x3f80_0fff,
                0x3fff_f000,
                0x3fff_ffff,
                0x7f7f_efff,
                0x0000_1000,
                0x0080_0000,
                0x4049_0fdb,
            ] {
                check(f32::from_bits(bits));
            }
            for _ in 0..200_000 {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                let v = f32::from_bits(s);
                if v.is_finite() && v.abs() < 3.0e38 && v.abs() > 1e-37 {
                    check(v);
                }
            }
        }

        #[test]
        fn non_finite_values_stay_non_finite() {
            for bits in [
                0x7fff_ffffu32,
                0xffff_ffff,
                0x7fc0_0000,
                0x7fff_f000,
                0x7f80_0000,
                0xff80_0000,
                0x7f80_0001,
            ] {
                let v = f32::from_bits(bits);
                let (hi, lo) = split_tf32_fast(v);
                assert!(
                    !f32::from_bits(hi).is_finite() || f32::from_bits(lo).is_nan(),
                    "{bits:#x}: ({hi:#x}, {lo:#x})"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The fragment addressing against the PTX ISA's m16n8k8 (tf32) fragments, by emulating the
    //! warp-level mma on the CPU.
    use super::*;
    extern crate std;
    use std::vec;

    const A_ROWS: usize = BM as usize;
    const B_COLS: usize = BN as usize;
    const DEPTH: usize = BK as usize;

    /// (row or column, depth) of a shared offset in a depth-major stage of stride `stride`.
    fn decode(off: usize, stride: u64) -> (usize, usize) {
        (off % stride as usize, off / stride as usize)
    }

    #[test]
    fn fragments_are_the_isa_layout_and_conflict_free() {
        for warp in 0..8 {
            let (wm, wn) = ((warp / 4) * 32, (warp % 4) * 32);
            for ks in [0, 8] {
                for mi in 0..M_TILES {
                    for r in 0..4 {
                        let mut banks = [false; 32];
                        for lane in 0..32 {
                            let (g, t) = (lane / 4, lane % 4);
                            let off = frag_a_offset(warp, lane, mi, ks, r);
                            assert!(off < STAGE_A);
                            // ISA: a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4).
                            let row = wm + 16 * mi + g + if r == 1 || r == 3 { 8 } else { 0 };
                            let col = ks + t + if r >= 2 { 4 } else { 0 };
                            assert_eq!(decode(off, A_STRIDE), (row, col), "A w{warp} l{lane} r{r}");
                            assert!(!banks[off % 32], "A bank conflict");
                            banks[off % 32] = true;
                        }
                    }
                }
                for ni in 0..N_TILES {
                    for r in 0..2 {
                        let mut banks = [false; 32];
                        for lane in 0..32 {
                            let (g, t) = (lane / 4, lane % 4);
                            let off = frag_b_offset(warp, lane, ni, ks, r);
                            assert!(off < STAGE_B);
                            // ISA: b0 (k = t, n = g), b1 (k = t+4, n = g).
                            let n = wn + 8 * ni + g;
                            let k = ks + t + 4 * r;
                            assert_eq!(decode(off, B_STRIDE), (n, k), "B w{warp} l{lane} r{r}");
                            assert!(!banks[off % 32], "B bank conflict");
                            banks[off % 32] = true;
                        }
                    }
                }
            }
        }
    }

    /// One stage of the block tile through emulated mma: every output once, equal to the product.
    #[test]
    fn emulated_block_stage_computes_the_product() {
        let a = |m: usize, k: usize| ((m * 7 + k * 3) % 11) as i64 - 5;
        let b = |k: usize, n: usize| ((k * 5 + n * 13) % 9) as i64 - 4;
        let mut sa = vec![0i64; STAGE_A];
        let mut sb = vec![0i64; STAGE_B];
        for k in 0..DEPTH {
            for m in 0..A_ROWS {
                sa[k * A_STRIDE as usize + m] = a(m, k);
            }
            for n in 0..B_COLS {
                sb[k * B_STRIDE as usize + n] = b(k, n);
            }
        }
        let mut out = vec![None; A_ROWS * B_COLS];
        for warp in 0..8 {
            for mi in 0..M_TILES {
                for ni in 0..N_TILES {
                    // Per lane accumulators of this mma tile.
                    let mut acc = [[0i64; 4]; 32];
                    for ks in [0, 8] {
                        // Gather the 16x8 A and 8x8 B tiles from the lanes' registers (ISA layout).
                        let (mut ta, mut tb) = ([[0i64; 8]; 16], [[0i64; 8]; 8]);
                        for lane in 0..32 {
                            let (g, t) = (lane / 4, lane % 4);
                            for r in 0..4 {
                                let v = sa[frag_a_offset(warp, lane, mi, ks, r)];
                                ta[g + 8 * (r & 1)][t + 4 * (r >> 1)] = v;
                            }
                            for r in 0..2 {
                                tb[t + 4 * r][g] = sb[frag_b_offset(warp, lane, ni, ks, r)];
                            }
                        }
                        for lane in 0..32 {
                            let (g, t) = (lane / 4, lane % 4);
                            for r in 0..4 {
                                let (row, col) = (g + 8 * (r >> 1), 2 * t + (r & 1));
                                acc[lane][r] +=
                                    (0..8).map(|k| ta[row][k] * tb[k][col]).sum::<i64>();
                            }
                        }
                    }
                    for lane in 0..32 {
                        for r in 0..4 {
                            let (m, n) = acc_coords(warp, lane, mi, ni, r);
                            let slot = &mut out[m as usize * B_COLS + n as usize];
                            assert!(slot.is_none(), "output ({m}, {n}) written twice");
                            *slot = Some(acc[lane][r]);
                        }
                    }
                }
            }
        }
        for m in 0..A_ROWS {
            for n in 0..B_COLS {
                let want: i64 = (0..DEPTH).map(|k| a(m, k) * b(k, n)).sum();
                assert_eq!(out[m * B_COLS + n], Some(want), "({m}, {n})");
            }
        }
    }
}

/// Saturation kinds, as the coefficient kernel numbers them.
pub const KIND_MONO: u32 = 0;
pub const KIND_NON_MONO: u32 = 1;
pub const KIND_NULL: u32 = 2;

/// Activation functions (for `non_mono` ties), as the coefficient kernel numbers them.
pub const FUNC_IDENTITY: u32 = 0;
pub const FUNC_SIGMOID: u32 = 1;
pub const FUNC_SWISH: u32 = 2;
pub const FUNC_WAVE: u32 = 3;
pub const FUNC_PULSE: u32 = 4;
pub const FUNC_ABSOLUTE: u32 = 5;
pub const FUNC_HARD_SIGMOID: u32 = 6;
pub const FUNC_TANH: u32 = 7;

/// Forward nonlinearities of the dense epilogue (softmax runs as its own op afterwards).
pub const FWD_LINEAR: u32 = 0;
pub const FWD_RELU: u32 = 1;
pub const FWD_TANH: u32 = 2;
pub const FWD_SIGMOID: u32 = 3;

/// A tiled GEMM-shaped pass: output `rows x cols`, summed over `depth`, split-K by `k_per_split`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LrpGemm {
    pub rows: u64,
    pub cols: u64,
    pub depth: u64,
    pub k_per_split: u64,
}

unsafe impl KernelParam for LrpGemm {}

/// The per-(row, output) coefficient pass: reads `splits` partial sums of `rows x cols`.
/// Missing bounds are -inf / +inf.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LrpCoeff {
    pub rows: u64,
    pub cols: u64,
    pub splits: u64,
    pub has_bias: u32,
    pub kind: u32,
    pub func: u32,
    pub lower: f32,
    pub upper: f32,
    pub _pad: u32,
}

unsafe impl KernelParam for LrpCoeff {}

/// Finishing an elementwise pass over `rows x cols` outputs from `splits` partials.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LrpFinish {
    pub rows: u64,
    pub cols: u64,
    pub splits: u64,
    pub has_bias: u32,
    /// `lrp::FWD_*` for the dense epilogue; unused by the relevance finish.
    pub func: u32,
}

unsafe impl KernelParam for LrpFinish {}
