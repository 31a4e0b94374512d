//! Shared-memory tile layouts: where element (row, col) of a tile lives, as pure integer math that
//! compiles for the host too (so it is unit-tested and its compile-time checks are doctested here).
//!
//! # The hardware model
//! Shared memory is 32 banks of 4 bytes; a warp's access is split into phases, and two lanes of one
//! phase that touch different words of the same bank serialise (a bank conflict). The tensor-core
//! paths move data in 16-byte *chunks*:
//! - `cp.async.cg ... 16` copies one 16-byte chunk from global to shared memory; its shared address
//!   must be 16-byte aligned (a misaligned one is error 716, or silently wrong data on some parts).
//! - `ldmatrix ... m8n8 .b16` reads 8x8 matrices of 16-bit values; each of eight lanes per matrix
//!   supplies the address of one 16-byte matrix row, which must be 16-byte aligned. One 8-lane phase
//!   reads 8 chunks, 128 bytes: conflict-free exactly when the 8 chunks fall in 8 different 16-byte
//!   bank groups (`address / 16 mod 8`).
//!
//! A tile here is `ROWS x COLS` elements, row-major, each row a whole number of chunks. Reading a
//! column of 8 chunks (8 rows at the same logical chunk, as `ldmatrix` does) from an unswizzled tile
//! whose row is a multiple of 128 bytes hits one bank group 8 times. [`Xor8`] stores logical chunk
//! `c` of row `r` at physical chunk `c ^ (r % 8)`: the 8 rows of any 8-row-aligned column then occupy
//! 8 different bank groups, and a row's chunks are still all in that row (the XOR only permutes the
//! low 3 bits), so 16-byte copies of consecutive chunks stay conflict-free too.
//!
//! # Alignment by construction
//! A tile's byte size and row stride are multiples of 16, and tile base offsets are multiples of 16;
//! all three are checked by const assertions that every constructor evaluates, so a layout that
//! could put a `cp.async`/`ldmatrix` target off 16-byte alignment does not compile:
//!
//! A row of 7 f16 (14 bytes) is rejected:
//! ```compile_fail,E0080
//! use gpu::layout::{Linear, TileLayout};
//! let _ = TileLayout::<u16, 64, 7, Linear>::new();
//! ```
//! A tile placed 2 bytes past a 16-byte boundary is rejected:
//! ```compile_fail,E0080
//! use gpu::layout::{TileLayout, Xor8};
//! let _ = TileLayout::<u16, 64, 64, Xor8>::offset_checked::<2>();
//! ```
//! A swizzle that would move chunks across rows (a 4-chunk row under an 8-chunk XOR) is rejected:
//! ```compile_fail,E0080
//! use gpu::layout::{TileLayout, Xor8};
//! let _ = TileLayout::<u16, 64, 32, Xor8>::new();
//! ```
//! The layouts the attention kernels use compile:
//! ```
//! use gpu::layout::{TileLayout, Xor8};
//! type K = TileLayout<u16, 64, 128, Xor8>;
//! let _ = K::new();
//! assert_eq!(K::BYTES, 16384);
//! assert_eq!(K::offset_checked::<32768>(), 32768);
//! assert_eq!(K::chunk_offset(3, 5) % 16, 0);
//! ```
use core::marker::PhantomData;

/// Bytes in one `cp.async`/`ldmatrix`-row chunk.
pub const CHUNK_BYTES: usize = 16;

/// Element types a tile can hold (only their size matters to the layout).
pub trait Element: Copy {
    const BYTES: usize;
}
impl Element for u16 {
    const BYTES: usize = 2;
}
impl Element for u32 {
    const BYTES: usize = 4;
}
impl Element for f32 {
    const BYTES: usize = 4;
}

/// A permutation of the 16-byte chunks within each row.
pub trait Swizzle {
    /// The row's chunk count must be a multiple of this, so that the permutation stays inside the row.
    const PERIOD: usize;
    /// Whether moving a 16x16 block by an even chunk `c0` is `XOR 16 c0` on the lane's address and
    /// by a multiple-of-8 row is an add (see [`TileLayout::block_addr`]).
    const XOR_BLOCKS: bool;
    /// Physical chunk index of logical chunk `chunk` in row `row`.
    fn chunk(row: u32, chunk: u32) -> u32;
}

/// No swizzle: logical chunk = physical chunk.
pub struct Linear;
impl Swizzle for Linear {
    const PERIOD: usize = 1;
    const XOR_BLOCKS: bool = true;
    #[inline(always)]
    fn chunk(_row: u32, chunk: u32) -> u32 {
        chunk
    }
}

/// Chunk `c` of row `r` stored at `c ^ (r % 8)` (see the module doc for why this removes conflicts).
pub struct Xor8;
impl Swizzle for Xor8 {
    const PERIOD: usize = 8;
    const XOR_BLOCKS: bool = true;
    #[inline(always)]
    fn chunk(row: u32, chunk: u32) -> u32 {
        chunk ^ (row & 7)
    }
}

/// The layout of a `ROWS x COLS` tile of `E` under swizzle `S`. A zero-sized type: all of its facts
/// are associated constants and its offsets are functions of (row, chunk).
pub struct TileLayout<E, const ROWS: usize, const COLS: usize, S>(PhantomData<(E, S)>);

impl<E: Element, const ROWS: usize, const COLS: usize, S: Swizzle> TileLayout<E, ROWS, COLS, S> {
    pub const ROW_BYTES: usize = COLS * E::BYTES;
    pub const CHUNKS_PER_ROW: usize = Self::ROW_BYTES / CHUNK_BYTES;
    pub const ELEMS_PER_CHUNK: usize = CHUNK_BYTES / E::BYTES;
    pub const CHUNKS: usize = ROWS * Self::CHUNKS_PER_ROW;
    pub const BYTES: usize = ROWS * Self::ROW_BYTES;

    /// The alignment facts every constructor and offset function evaluates (a failure is a compile
    /// error at the use that instantiates the layout).
    pub const VALID: () = {
        assert!(
            ROWS > 0 && COLS > 0,
            "a tile needs at least one row and one column"
        );
        assert!(
            CHUNK_BYTES.is_multiple_of(E::BYTES),
            "element size must divide 16 bytes"
        );
        assert!(
            Self::ROW_BYTES.is_multiple_of(CHUNK_BYTES),
            "tile row is not a multiple of 16 bytes: cp.async/ldmatrix row targets would be misaligned"
        );
        assert!(
            Self::CHUNKS_PER_ROW.is_multiple_of(S::PERIOD),
            "the swizzle period must divide the chunks per row (else chunks move across rows)"
        );
    };

    /// A value witnessing that the layout is valid.
    pub const fn new() -> Self {
        let () = Self::VALID;
        Self(PhantomData)
    }

    /// `OFFSET` as the byte offset of a tile of this layout inside a 16-byte aligned region;
    /// a compile-time error unless it is a multiple of 16.
    pub const fn offset_checked<const OFFSET: usize>() -> u32 {
        let () = Self::VALID;
        const {
            assert!(
                OFFSET.is_multiple_of(CHUNK_BYTES),
                "tile base offset is not a multiple of 16 bytes"
            )
        };
        OFFSET as u32
    }

    /// Byte offset (from the tile base) of logical chunk `chunk` of row `row`: a multiple of 16.
    #[inline(always)]
    pub fn chunk_offset(row: u32, chunk: u32) -> u32 {
        let () = Self::VALID;
        row * Self::ROW_BYTES as u32 + S::chunk(row, chunk) * CHUNK_BYTES as u32
    }

    /// The `ldmatrix` address of a 16x16 block split into a per-lane part and per-block constants.
    ///
    /// For `lane_part = chunk_offset(r, c)` (the lane's row `r < 16` and chunk `c < 2` within the
    /// block) and a block at row `row0` (a multiple of 8) and chunk `chunk0` (even), and any tile base
    /// that is a multiple of `ROW_BYTES` (a power of two):
    /// `base + chunk_offset(row0 + r, chunk0 + c) == ((base + lane_part) ^ (16 chunk0)) + ROW_BYTES row0`.
    /// The XOR only touches bits below `ROW_BYTES`, where `base` and `ROW_BYTES row0` are zero. So a
    /// kernel keeps one register per lane pattern (`base + lane_part`, which changes with the
    /// pipeline stage) and spends one XOR per `ldmatrix`, with `ROW_BYTES row0` an immediate offset,
    /// instead of keeping one precomputed address per block in registers.
    #[inline(always)]
    pub fn block_addr(base_plus_lane_part: u32, row0: u32, chunk0: u32) -> u32 {
        let () = Self::BLOCK_ADDRESSING;
        (base_plus_lane_part ^ (chunk0 * CHUNK_BYTES as u32)) + row0 * Self::ROW_BYTES as u32
    }

    /// Conditions of [`Self::block_addr`] that the type can check.
    pub const BLOCK_ADDRESSING: () = {
        let () = Self::VALID;
        assert!(
            Self::ROW_BYTES.is_power_of_two(),
            "XOR block addressing needs a power-of-two row"
        );
        assert!(
            S::XOR_BLOCKS,
            "this swizzle does not support XOR block addressing"
        );
    };

    /// Byte offset of element (row, col).
    #[inline(always)]
    pub fn elem_offset(row: u32, col: u32) -> u32 {
        let epc = Self::ELEMS_PER_CHUNK as u32;
        Self::chunk_offset(row, col / epc) + (col % epc) * E::BYTES as u32
    }
}

impl<E: Element, const ROWS: usize, const COLS: usize, S: Swizzle> Default
    for TileLayout<E, ROWS, COLS, S>
{
    fn default() -> Self {
        Self::new()
    }
}

/// `ldmatrix.x4` address patterns over a 16x16 block of 16-bit elements (16 rows x 2 chunks).
///
/// `ldmatrix.x4` loads four 8x8 matrices; lane `l` supplies the address of row `l % 8` of matrix
/// `l / 8`, and matrix `i` lands in destination register `i`, where lane `l` receives the two
/// elements at row `l / 4`, columns `2 (l % 4)` and `+1` (with `.trans`: row and column swapped).
/// The two functions below return `(row, chunk)` within the block for each lane.
pub mod ldmatrix {
    /// Matrices in the order (rows 0-7, chunk 0), (rows 8-15, chunk 0), (rows 0-7, chunk 1),
    /// (rows 8-15, chunk 1). Non-transposed on a row-major `[m][k]` tile this is the `mma` A operand
    /// `{a0, a1, a2, a3}`; transposed on a `[k][n]` tile (V) it is the B operands `{b0, b1}` of the
    /// n-tile at chunk 0 followed by those of the n-tile at chunk 1.
    #[inline(always)]
    pub const fn col_major_quads(lane: u32) -> (u32, u32) {
        (lane % 16, lane / 16)
    }

    /// Matrices in the order (rows 0-7, chunk 0), (rows 0-7, chunk 1), (rows 8-15, chunk 0),
    /// (rows 8-15, chunk 1). Non-transposed on an `[n][k]` tile (K, the B operand of `Q K^T` stored
    /// row per key) this is `{b0, b1}` of the n-tile of rows 0-7, then `{b0, b1}` of rows 8-15.
    #[inline(always)]
    pub const fn row_major_quads(lane: u32) -> (u32, u32) {
        ((lane / 16) * 8 + lane % 8, (lane / 8) % 2)
    }
}

/// The 128-byte-swizzle layout that Hopper's `wgmma` reads from shared memory (and TMA writes), for
/// 16-bit tiles of `rows x cols` (`cols` a multiple of 64): the tile is `cols / 64` *panels* of
/// `rows x 64` elements one after another (`rows * 128` bytes each); in a panel, row `r` starts at
/// `128 r`, and its 16-byte chunk `c` (elements `8c..8c+8`) is stored at chunk position `c ^ (r % 8)`.
/// With the panel 1024-byte aligned, that is the hardware's XOR of address bits [4, 7) with bits
/// [7, 10). `crate::dev::wgmma` builds its descriptors on this layout.
pub mod sw128 {
    /// Bytes of one 64-column panel of `rows` rows.
    pub const fn panel_bytes(rows: usize) -> usize {
        rows * 128
    }

    /// Byte offset of logical 16-byte chunk `chunk` (`0..cols / 8`) of row `row` in a tile of `rows`
    /// rows.
    #[inline(always)]
    pub const fn chunk_offset(rows: u32, row: u32, chunk: u32) -> u32 {
        (chunk / 8) * rows * 128 + row * 128 + ((chunk % 8) ^ (row % 8)) * 16
    }
}

#[cfg(test)]
mod tests {
    //! A CPU emulation of `ldmatrix` and `mma.m16n8k16` as the PTX ISA defines their fragments, used to
    //! check that the address patterns above, the swizzle and the register bookkeeping of the
    //! attention kernel compute `Q K^T` and `P V`, and that every `ldmatrix` phase is conflict-free.
    use super::ldmatrix::{col_major_quads, row_major_quads};
    use super::*;
    extern crate std;
    use std::vec;
    use std::vec::Vec;

    #[test]
    fn sw128_is_a_bijection_with_the_hardware_xor() {
        for (rows, cols) in [(64u32, 64u32), (128, 128), (64, 128), (8, 64)] {
            let chunks = cols / 8;
            let mut seen = vec![false; (rows * cols * 2 / 16) as usize];
            for r in 0..rows {
                for c in 0..chunks {
                    let off = sw128::chunk_offset(rows, r, c);
                    assert_eq!(off % 16, 0);
                    // The unswizzled address of (r, c) in its panel, then the hardware XOR of
                    // bits [4, 7) with bits [7, 10) (panel bases are multiples of 1024).
                    let plain = (c / 8) * rows * 128 + r * 128 + (c % 8) * 16;
                    assert_eq!(
                        off,
                        plain ^ (((plain >> 7) & 7) << 4),
                        "rows {rows} r {r} c {c}"
                    );
                    let slot = &mut seen[(off / 16) as usize];
                    assert!(!*slot, "two chunks at {off}");
                    *slot = true;
                }
            }
            assert!(seen.iter().all(|&s| s));
            assert_eq!(sw128::panel_bytes(rows as usize) % 1024, 0);
        }
    }

    /// Shared memory as bytes; tiles store element values as u16 "ids" we can trace.
    struct Smem(Vec<u8>);
    impl Smem {
        fn put(&mut self, addr: u32, v: u16) {
            self.0[addr as usize..addr as usize + 2].copy_from_slice(&v.to_le_bytes());
        }
        fn get(&self, addr: u32) -> u16 {
            u16::from_le_bytes([self.0[addr as usize], self.0[addr as usize + 1]])
        }
    }

    /// `ldmatrix.x4` (optionally `.trans`): `addr[l]` is lane l's row address; returns per-lane
    /// registers as pairs (low, high) of 16-bit values.
    fn ldmatrix_x4(smem: &Smem, addr: &[u32; 32], trans: bool) -> [[(u16, u16); 4]; 32] {
        let mut out = [[(0, 0); 4]; 32];
        for (lane, regs) in out.iter_mut().enumerate() {
            for (m, reg) in regs.iter_mut().enumerate() {
                let (r, c) = (lane / 4, 2 * (lane % 4));
                let at = |row: usize, col: usize| smem.get(addr[m * 8 + row] + 2 * col as u32);
                *reg = if trans {
                    (at(c, r), at(c + 1, r))
                } else {
                    (at(r, c), at(r, c + 1))
                };
            }
        }
        out
    }

    /// Bank groups of each 8-lane phase must be distinct.
    fn assert_conflict_free(addr: &[u32; 32]) {
        for phase in addr.chunks(8) {
            let mut groups: Vec<u32> = phase.iter().map(|a| (a / 16) % 8).collect();
            groups.sort();
            groups.dedup();
            assert_eq!(groups.len(), 8, "bank conflict in phase {phase:?}");
        }
    }

    /// `mma.m16n8k16.row.col` on values: a[lane] = 4 regs of (lo, hi), b[lane] = 2 regs; returns
    /// d[lane] = 4 f64 accumulators, using the PTX ISA fragment layouts.
    fn mma(a: &[[(f64, f64); 4]; 32], b: &[[(f64, f64); 2]; 32], c: &mut [[f64; 4]; 32]) {
        let mut am = [[0f64; 16]; 16];
        let mut bm = [[0f64; 8]; 16];
        for lane in 0..32 {
            let (g, t) = (lane / 4, lane % 4);
            for i in 0..8 {
                let row = if i < 2 || (4..6).contains(&i) {
                    g
                } else {
                    g + 8
                };
                let col = t * 2 + (i & 1) + if i >= 4 { 8 } else { 0 };
                let r = a[lane][i / 2];
                am[row][col] = if i % 2 == 0 { r.0 } else { r.1 };
            }
            for i in 0..4 {
                let row = t * 2 + (i & 1) + if i >= 2 { 8 } else { 0 };
                let r = b[lane][i / 2];
                bm[row][g] = if i % 2 == 0 { r.0 } else { r.1 };
            }
        }
        for (lane, cl) in c.iter_mut().enumerate() {
            let (g, t) = (lane / 4, lane % 4);
            for (i, ci) in cl.iter_mut().enumerate() {
                let row = if i < 2 { g } else { g + 8 };
                let col = t * 2 + (i & 1);
                *ci += (0..16).map(|k| am[row][k] * bm[k][col]).sum::<f64>();
            }
        }
    }

    /// Deterministic small integers as test values (exact in f64 products and sums).
    fn val(id: u16) -> f64 {
        ((id as u32 * 37 + 11) % 13) as f64 - 6.0
    }

    fn fill<const R: usize, const C: usize>(smem: &mut Smem, base: u32, id0: u16) -> Vec<Vec<u16>> {
        type L<const R: usize, const C: usize> = TileLayout<u16, R, C, Xor8>;
        let mut ids = vec![vec![0u16; C]; R];
        for (r, row) in ids.iter_mut().enumerate() {
            for (c, id) in row.iter_mut().enumerate() {
                *id = id0 + (r * C + c) as u16;
                smem.put(base + L::<R, C>::elem_offset(r as u32, c as u32), *id);
            }
        }
        ids
    }

    fn to_vals<const N: usize>(regs: [(u16, u16); N]) -> [(f64, f64); N] {
        regs.map(|(lo, hi)| (val(lo), val(hi)))
    }

    /// One warp's `S = Q K^T` and `O = P V` exactly as the kernel issues them, for head dim `D` and
    /// a key tile of `BC`, compared with the plain matrix products.
    fn warp_gemms<const D: usize, const BC: usize>() {
        type L<const R: usize, const C: usize> = TileLayout<u16, R, C, Xor8>;
        const WARP_ROW0: usize = 16; // the second warp's rows, to exercise a non-zero row base
        let mut smem = Smem(vec![0; 3 * 32 * 1024]);
        let (q_base, k_base, v_base) = (0u32, 8192u32, 8192u32 * 4);
        let q = fill::<32, D>(&mut smem, q_base, 0);
        let k = fill::<BC, D>(&mut smem, k_base, 5000);
        let v = fill::<BC, D>(&mut smem, v_base, 20000);

        // Q fragments: A operands over k-steps of 16 (chunk pairs), col-major quads.
        let mut qa = vec![];
        for kd in 0..D / 16 {
            let addr: [u32; 32] = core::array::from_fn(|l| {
                let (r, c) = col_major_quads(l as u32);
                q_base + L::<32, D>::chunk_offset(WARP_ROW0 as u32 + r, kd as u32 * 2 + c)
            });
            assert_conflict_free(&addr);
            qa.push(ldmatrix_x4(&smem, &addr, false).map(to_vals));
        }
        // S tiles: n-tiles of 8 keys, two per ldmatrix.x4 (row-major quads over K).
        let mut s = vec![[[0f64; 4]; 32]; BC / 8];
        for (kd, a) in qa.iter().enumerate() {
            for np in 0..BC / 16 {
                let addr: [u32; 32] = core::array::from_fn(|l| {
                    let (r, c) = row_major_quads(l as u32);
                    k_base + L::<BC, D>::chunk_offset(np as u32 * 16 + r, kd as u32 * 2 + c)
                });
                assert_conflict_free(&addr);
                let kb = ldmatrix_x4(&smem, &addr, false).map(to_vals);
                let b0: [[(f64, f64); 2]; 32] = core::array::from_fn(|l| [kb[l][0], kb[l][1]]);
                let b1: [[(f64, f64); 2]; 32] = core::array::from_fn(|l| [kb[l][2], kb[l][3]]);
                mma(a, &b0, &mut s[2 * np]);
                mma(a, &b1, &mut s[2 * np + 1]);
            }
        }
        for (n, tile) in s.iter().enumerate() {
            for (lane, c) in tile.iter().enumerate() {
                for (i, &got) in c.iter().enumerate() {
                    let row = WARP_ROW0 + lane / 4 + if i >= 2 { 8 } else { 0 };
                    let key = n * 8 + 2 * (lane % 4) + (i & 1);
                    let want: f64 = (0..D).map(|d| val(q[row][d]) * val(k[key][d])).sum();
                    assert_eq!(got, want, "S row {row} key {key}");
                }
            }
        }

        // P = S (any values will do) repacked as A operands, V through ldmatrix.trans.
        let mut o = vec![[[0f64; 4]; 32]; D / 8];
        for ks in 0..BC / 16 {
            let pa: [[(f64, f64); 4]; 32] = core::array::from_fn(|l| {
                let (t0, t1) = (&s[2 * ks][l], &s[2 * ks + 1][l]);
                [
                    (t0[0], t0[1]),
                    (t0[2], t0[3]),
                    (t1[0], t1[1]),
                    (t1[2], t1[3]),
                ]
            });
            for np in 0..D / 16 {
                let addr: [u32; 32] = core::array::from_fn(|l| {
                    let (r, c) = col_major_quads(l as u32);
                    v_base + L::<BC, D>::chunk_offset(ks as u32 * 16 + r, np as u32 * 2 + c)
                });
                assert_conflict_free(&addr);
                let vb = ldmatrix_x4(&smem, &addr, true).map(to_vals);
                let b0: [[(f64, f64); 2]; 32] = core::array::from_fn(|l| [vb[l][0], vb[l][1]]);
                let b1: [[(f64, f64); 2]; 32] = core::array::from_fn(|l| [vb[l][2], vb[l][3]]);
                mma(&pa, &b0, &mut o[2 * np]);
                mma(&pa, &b1, &mut o[2 * np + 1]);
            }
        }
        let s_at = |row: usize, key: usize| -> f64 {
            (0..D).map(|d| val(q[row][d]) * val(k[key][d])).sum()
        };
        for (n, tile) in o.iter().enumerate() {
            for (lane, c) in tile.iter().enumerate() {
                for (i, &got) in c.iter().enumerate() {
                    let row = WARP_ROW0 + lane / 4 + if i >= 2 { 8 } else { 0 };
                    let col = n * 8 + 2 * (lane % 4) + (i & 1);
                    let want: f64 = (0..BC).map(|j| s_at(row, j) * val(v[j][col])).sum();
                    assert_eq!(got, want, "O row {row} col {col}");
                }
            }
        }
    }

    #[test]
    fn fragments_compute_qk_and_pv_for_d64() {
        warp_gemms::<64, 64>();
        warp_gemms::<64, 128>();
    }

    #[test]
    fn fragments_compute_qk_and_pv_for_d128() {
        warp_gemms::<128, 64>();
    }

    /// Shared memory holding f64 values by element byte address (for tiles whose values are
    /// computed, like the backward's dS^T tile).
    struct ValSmem(std::collections::HashMap<u32, f64>);

    impl ValSmem {
        /// `ldmatrix.x4` (optionally `.trans`) on values; see [`ldmatrix_x4`].
        fn ldmatrix_x4(&self, addr: &[u32; 32], trans: bool) -> [[(f64, f64); 4]; 32] {
            let mut out = [[(0.0, 0.0); 4]; 32];
            for (lane, regs) in out.iter_mut().enumerate() {
                for (m, reg) in regs.iter_mut().enumerate() {
                    let (r, c) = (lane / 4, 2 * (lane % 4));
                    let at = |row: usize, col: usize| self.0[&(addr[m * 8 + row] + 2 * col as u32)];
                    *reg = if trans {
                        (at(c, r), at(c + 1, r))
                    } else {
                        (at(r, c), at(r, c + 1))
                    };
                }
            }
            out
        }

        /// A `R x C` Xor8 tile at `base` with values `f(row, col)`.
        fn fill<const R: usize, const C: usize>(
            &mut self,
            base: u32,
            f: impl Fn(usize, usize) -> f64,
        ) {
            type L<const R: usize, const C: usize> = TileLayout<u16, R, C, Xor8>;
            for r in 0..R {
                for c in 0..C {
                    self.0
                        .insert(base + L::<R, C>::elem_offset(r as u32, c as u32), f(r, c));
                }
            }
        }
    }

    /// A warp's B fragments (two registers of value pairs per lane).
    type LaneB = [[(f64, f64); 2]; 32];

    /// The two n-tiles' B fragments an `ldmatrix.x4` returns.
    fn pairs2(m: [[(f64, f64); 4]; 32]) -> (LaneB, LaneB) {
        (
            core::array::from_fn(|l| [m[l][0], m[l][1]]),
            core::array::from_fn(|l| [m[l][2], m[l][3]]),
        )
    }

    /// One warp's step of the FlashAttention backward (`kernels/attention/flash_bwd.rs`) with the
    /// kernel's address patterns and fragment bookkeeping, for a key block of `BK` keys (`BK / 16`
    /// warps) and a query block of `BQ`: `S^T = K Q^T` (K rows as A, Q as `[n][k]` B), `dV += P^T dO`
    /// (P^T from the accumulator as A, dO through `.trans`), dS^T stored to its tile word by word,
    /// and `dQ += dS K` for every warp's share (dS^T through `ldmatrix.trans` as A, K as `[k][n]` B),
    /// each compared with the plain product; every `ldmatrix` phase conflict-free.
    fn backward_warp_step<const D: usize, const BK: usize, const BQ: usize>() {
        type L<const R: usize, const C: usize> = TileLayout<u16, R, C, Xor8>;
        let (kb, qb, dob, dsb) = (0u32, 1u32 << 16, 2u32 << 16, 3u32 << 16);
        let mut smem = ValSmem(Default::default());
        let kv = |r: usize, c: usize| ((r * 7 + c * 3) % 11) as f64 - 5.0;
        let qv = |r: usize, c: usize| ((r * 5 + c * 2) % 9) as f64 - 4.0;
        let dov = |r: usize, c: usize| ((r * 3 + c * 7) % 13) as f64 - 6.0;
        smem.fill::<BK, D>(kb, kv);
        smem.fill::<BQ, D>(qb, qv);
        smem.fill::<BQ, D>(dob, dov);
        let warps = BK / 16;
        // Every warp's S^T (kept for the dS^T tile); checks of S^T and dV on each warp.
        for w in 0..warps {
            let key_row = 16 * w as u32;
            let mut s = vec![[[0f64; 4]; 32]; BQ / 8];
            for kd in 0..D / 16 {
                let addr: [u32; 32] = core::array::from_fn(|l| {
                    let (r, c) = col_major_quads(l as u32);
                    kb + L::<BK, D>::chunk_offset(key_row + r, 2 * kd as u32 + c)
                });
                assert_conflict_free(&addr);
                let ka = smem.ldmatrix_x4(&addr, false);
                for np in 0..BQ / 16 {
                    let addr: [u32; 32] = core::array::from_fn(|l| {
                        let (r, c) = row_major_quads(l as u32);
                        qb + L::<BQ, D>::chunk_offset(16 * np as u32 + r, 2 * kd as u32 + c)
                    });
                    assert_conflict_free(&addr);
                    let (b0, b1) = pairs2(smem.ldmatrix_x4(&addr, false));
                    mma(&ka, &b0, &mut s[2 * np]);
                    mma(&ka, &b1, &mut s[2 * np + 1]);
                }
            }
            let s_at = |key: usize, q: usize| (0..D).map(|d| kv(key, d) * qv(q, d)).sum::<f64>();
            for (n, tile) in s.iter().enumerate() {
                for (lane, c) in tile.iter().enumerate() {
                    for (e, &got) in c.iter().enumerate() {
                        let key = key_row as usize + lane / 4 + 8 * (e / 2);
                        let q = 8 * n + 2 * (lane % 4) + e % 2;
                        assert_eq!(got, s_at(key, q), "S^T key {key} query {q}");
                    }
                }
            }
            // dV += P^T dO with P^T = S^T, and dS^T = S^T stored as the kernel stores it.
            let mut dv = vec![[[0f64; 4]; 32]; D / 8];
            for ks in 0..BQ / 16 {
                let (lo, hi) = (&s[2 * ks], &s[2 * ks + 1]);
                let a: [[(f64, f64); 4]; 32] = core::array::from_fn(|l| {
                    [
                        (lo[l][0], lo[l][1]),
                        (lo[l][2], lo[l][3]),
                        (hi[l][0], hi[l][1]),
                        (hi[l][2], hi[l][3]),
                    ]
                });
                for (l, regs) in a.iter().enumerate() {
                    let (g, t) = ((l / 4) as u32, (l % 4) as u32);
                    let col = 16 * ks as u32 + 2 * t;
                    for (i, (row, col)) in [(g, col), (g + 8, col), (g, col + 8), (g + 8, col + 8)]
                        .into_iter()
                        .enumerate()
                    {
                        let at = dsb + L::<BK, BQ>::elem_offset(key_row + row, col);
                        smem.0.insert(at, regs[i].0);
                        smem.0.insert(at + 2, regs[i].1);
                    }
                }
                for np in 0..D / 16 {
                    let addr: [u32; 32] = core::array::from_fn(|l| {
                        let (r, c) = col_major_quads(l as u32);
                        dob + L::<BQ, D>::chunk_offset(16 * ks as u32 + r, 2 * np as u32 + c)
                    });
                    assert_conflict_free(&addr);
                    let (b0, b1) = pairs2(smem.ldmatrix_x4(&addr, true));
                    mma(&a, &b0, &mut dv[2 * np]);
                    mma(&a, &b1, &mut dv[2 * np + 1]);
                }
            }
            for (n, tile) in dv.iter().enumerate() {
                for (lane, c) in tile.iter().enumerate() {
                    for (e, &got) in c.iter().enumerate() {
                        let key = key_row as usize + lane / 4 + 8 * (e / 2);
                        let col = 8 * n + 2 * (lane % 4) + e % 2;
                        let want: f64 = (0..BQ).map(|q| s_at(key, q) * dov(q, col)).sum();
                        assert_eq!(got, want, "dV key {key} col {col}");
                    }
                }
            }
        }
        // dQ = dS K with dS = S (every warp's keys now in the dS^T tile), each warp's share.
        let row_groups = BQ / 16;
        let nq = D / 8 / (warps / row_groups);
        let s_at = |key: usize, q: usize| (0..D).map(|d| kv(key, d) * qv(q, d)).sum::<f64>();
        let mut covered = vec![vec![false; D]; BQ];
        for w in 0..warps {
            let (dq_rows, dq_tile0) = (16 * (w % row_groups), (w / row_groups) * nq);
            let mut acc = vec![[[0f64; 4]; 32]; nq];
            for ks in 0..BK / 16 {
                let addr: [u32; 32] = core::array::from_fn(|l| {
                    let (r, c) = row_major_quads(l as u32);
                    dsb + L::<BK, BQ>::chunk_offset(16 * ks as u32 + r, (dq_rows / 8) as u32 + c)
                });
                assert_conflict_free(&addr);
                let a = smem.ldmatrix_x4(&addr, true);
                for np in 0..nq / 2 {
                    let addr: [u32; 32] = core::array::from_fn(|l| {
                        let (r, c) = col_major_quads(l as u32);
                        kb + L::<BK, D>::chunk_offset(
                            16 * ks as u32 + r,
                            (dq_tile0 + 2 * np) as u32 + c,
                        )
                    });
                    assert_conflict_free(&addr);
                    let (b0, b1) = pairs2(smem.ldmatrix_x4(&addr, true));
                    mma(&a, &b0, &mut acc[2 * np]);
                    mma(&a, &b1, &mut acc[2 * np + 1]);
                }
            }
            for (n, tile) in acc.iter().enumerate() {
                for (lane, c) in tile.iter().enumerate() {
                    for (e, &got) in c.iter().enumerate() {
                        let q = dq_rows + lane / 4 + 8 * (e / 2);
                        let col = 8 * (dq_tile0 + n) + 2 * (lane % 4) + e % 2;
                        let want: f64 = (0..BK).map(|key| s_at(key, q) * kv(key, col)).sum();
                        assert_eq!(got, want, "dQ query {q} col {col} (warp {w})");
                        covered[q][col] = true;
                    }
                }
            }
        }
        assert!(
            covered.iter().flatten().all(|&c| c),
            "the warps' dQ shares cover the block"
        );
    }

    #[test]
    fn fragments_compute_the_flash_backward_products() {
        use crate::params::attention::{FLASH_BWD_D64, FLASH_BWD_D128};
        const D64: (usize, usize, usize) = (64, FLASH_BWD_D64.block_k, FLASH_BWD_D64.block_q);
        const D128: (usize, usize, usize) = (128, FLASH_BWD_D128.block_k, FLASH_BWD_D128.block_q);
        backward_warp_step::<{ D64.0 }, { D64.1 }, { D64.2 }>();
        backward_warp_step::<{ D128.0 }, { D128.1 }, { D128.2 }>();
    }

    /// One warp's k-tile of the tensor-core matmul exactly as `kernels/matmul/tensor_core.rs` issues
    /// it, for each storage order: A from a `[m][k]` tile (`ldmatrix`, col-major quads) or a `[k][m]`
    /// tile (`ldmatrix.trans`, row-major quads); B from a `[k][n]` tile (`.trans`, col-major quads) or
    /// an `[n][k]` tile (row-major quads). Checked against the plain product, and every `ldmatrix`
    /// phase must be conflict-free.
    fn matmul_warp_tile<const A_T: bool, const B_T: bool>() {
        use crate::params::matmul_tc::{BK, BM, BN, WM, WN};
        const M: usize = BM as usize;
        const N: usize = BN as usize;
        const K: usize = BK as usize;
        type L<const R: usize, const C: usize> = TileLayout<u16, R, C, Xor8>;
        let mut smem = Smem(vec![0; 64 * 1024]);
        // B's tile right after A's (the default 256 x 128 config has a 32 KiB A tile).
        let (a_base, b_base) = (0u32, (M * K * 2) as u32);
        // Logical A (m, k) and B (k, n) as ids, whichever way the tile stores them.
        let (a_at, b_at): (Vec<Vec<u16>>, Vec<Vec<u16>>);
        if A_T {
            let t = fill::<K, M>(&mut smem, a_base, 0);
            a_at = (0..M).map(|m| (0..K).map(|k| t[k][m]).collect()).collect();
        } else {
            a_at = fill::<M, K>(&mut smem, a_base, 0);
        }
        if B_T {
            let t = fill::<N, K>(&mut smem, b_base, 9000);
            b_at = (0..K).map(|k| (0..N).map(|n| t[n][k]).collect()).collect();
        } else {
            b_at = fill::<K, N>(&mut smem, b_base, 9000);
        }
        // The last warp (e.g. (192, 64) for 256 x 128) exercises non-zero warp offsets in both dims.
        let (wm0, wn0) = (BM - WM, BN - WN);
        let mut acc = vec![[[0f64; 4]; 32]; 4 * 8];
        for ks in 0..K as u32 / 16 {
            let k16 = 16 * ks;
            let mut af = vec![];
            for i in 0..4u32 {
                let m = wm0 + 16 * i;
                let addr: [u32; 32] = core::array::from_fn(|l| {
                    if A_T {
                        let (r, c) = row_major_quads(l as u32);
                        a_base + L::<K, M>::chunk_offset(k16 + r, m / 8 + c)
                    } else {
                        let (r, c) = col_major_quads(l as u32);
                        a_base + L::<M, K>::chunk_offset(m + r, k16 / 8 + c)
                    }
                });
                assert_conflict_free(&addr);
                af.push(ldmatrix_x4(&smem, &addr, A_T).map(to_vals));
            }
            let mut bf = vec![];
            for j in 0..4u32 {
                let n = wn0 + 16 * j;
                let addr: [u32; 32] = core::array::from_fn(|l| {
                    if B_T {
                        let (r, c) = row_major_quads(l as u32);
                        b_base + L::<N, K>::chunk_offset(n + r, k16 / 8 + c)
                    } else {
                        let (r, c) = col_major_quads(l as u32);
                        b_base + L::<K, N>::chunk_offset(k16 + r, n / 8 + c)
                    }
                });
                assert_conflict_free(&addr);
                let m4 = ldmatrix_x4(&smem, &addr, !B_T).map(to_vals);
                let b0: [[(f64, f64); 2]; 32] = core::array::from_fn(|l| [m4[l][0], m4[l][1]]);
                let b1: [[(f64, f64); 2]; 32] = core::array::from_fn(|l| [m4[l][2], m4[l][3]]);
                bf.push(b0);
                bf.push(b1);
            }
            for i in 0..4 {
                for j in 0..8 {
                    mma(&af[i], &bf[j], &mut acc[i * 8 + j]);
                }
            }
        }
        for i in 0..4 {
            for j in 0..8 {
                for (lane, c) in acc[i * 8 + j].iter().enumerate() {
                    for (e, &got) in c.iter().enumerate() {
                        let m = wm0 as usize + 16 * i + lane / 4 + if e >= 2 { 8 } else { 0 };
                        let n = wn0 as usize + 8 * j + 2 * (lane % 4) + (e & 1);
                        let want: f64 = (0..K).map(|k| val(a_at[m][k]) * val(b_at[k][n])).sum();
                        assert_eq!(got, want, "A_T={A_T} B_T={B_T} C({m}, {n})");
                    }
                }
            }
        }
    }

    #[test]
    fn matmul_fragments_compute_the_product_for_every_storage_order() {
        matmul_warp_tile::<false, false>();
        matmul_warp_tile::<false, true>();
        matmul_warp_tile::<true, false>();
        matmul_warp_tile::<true, true>();
    }

    #[test]
    fn matmul_tile_copies_and_epilogue_stores_are_conflict_free() {
        use crate::params::matmul_tc::{Config, DEFAULT};
        // cp.async: thread t copies chunk (t / cpr, t % cpr) (+ whole rows per further copy); a
        // warp's 32 chunks must spread over 8 bank groups per 8-lane phase, for every tile shape.
        fn copies<const R: usize, const C: usize>(threads: u32) {
            type L<const R: usize, const C: usize> = TileLayout<u16, R, C, Xor8>;
            let cpr = (C / 8) as u32;
            for warp in 0..threads / 32 {
                for i in 0..(R * C / 8) as u32 / threads {
                    let addr: [u32; 32] = core::array::from_fn(|l| {
                        let t = warp * 32 + l as u32;
                        L::<R, C>::chunk_offset(t / cpr + i * (threads / cpr), t % cpr)
                    });
                    assert_conflict_free(&addr);
                }
            }
        }
        // Epilogue: lane (g, t) stores the word at row g, column 8 j + 2 t of the staging tile: the
        // 32 words of one store must fall in 32 different banks.
        fn epilogue<const R: usize, const C: usize>() {
            type S<const R: usize, const C: usize> = TileLayout<u16, R, C, Xor8>;
            for j in 0..(C / 8) as u32 {
                let mut banks: Vec<u32> = (0..32u32)
                    .map(|l| (S::<R, C>::elem_offset(l / 4, 8 * j + 2 * (l % 4)) / 4) % 32)
                    .collect();
                banks.sort();
                banks.dedup();
                assert_eq!(banks.len(), 32, "epilogue store j={j}");
            }
        }
        fn config<const BM: usize, const BN: usize>(c: Config) {
            assert_eq!((c.bm as usize, c.bn as usize, c.bk), (BM, BN, 64));
            let t = c.threads();
            copies::<BM, 64>(t);
            copies::<64, BM>(t);
            copies::<64, BN>(t);
            copies::<BN, 64>(t);
            epilogue::<BM, BN>();
        }
        config::<256, 128>(DEFAULT);
    }

    #[test]
    fn block_addressing_identity_holds_for_every_lane_and_block() {
        fn check<const C: usize>() {
            type L<const C: usize> = TileLayout<u16, 64, C, Xor8>;
            for base in [0u32, 8192, 3 * L::<C>::ROW_BYTES as u32, 1 << 20] {
                for lane in 0..32 {
                    for (r, c) in [col_major_quads(lane), row_major_quads(lane)] {
                        let lp = base + L::<C>::chunk_offset(r, c);
                        for row0 in (0..64 - 15).step_by(8) {
                            for chunk0 in (0..L::<C>::CHUNKS_PER_ROW as u32).step_by(2) {
                                assert_eq!(
                                    L::<C>::block_addr(lp, row0, chunk0),
                                    base + L::<C>::chunk_offset(row0 + r, chunk0 + c),
                                    "C={C} base={base} lane={lane} row0={row0} chunk0={chunk0}"
                                );
                            }
                        }
                    }
                }
            }
        }
        check::<64>();
        check::<128>();
    }

    #[test]
    fn swizzle_is_a_permutation_within_each_row() {
        type L = TileLayout<u16, 16, 128, Xor8>;
        for r in 0..16 {
            let mut seen: Vec<u32> = (0..16).map(|c| L::chunk_offset(r, c)).collect();
            seen.sort();
            let want: Vec<u32> = (0..16).map(|c| r * 256 + c * 16).collect();
            assert_eq!(seen, want);
        }
    }

    #[test]
    fn sixteen_byte_copies_of_a_row_are_conflict_free() {
        // A warp copying 32 consecutive chunks (the cp.async loop order) hits 8 groups per phase.
        type L = TileLayout<u16, 64, 64, Xor8>;
        for first in [0u32, 32, 64] {
            let addr: [u32; 32] = core::array::from_fn(|l| {
                let c = first + l as u32;
                L::chunk_offset(c / 8, c % 8)
            });
            assert_conflict_free(&addr);
        }
    }
}
