//! Typed shared-memory tiles: `SharedTile<E, ROWS, COLS, S>` is a `ROWS x COLS` tile of `E` in shared
//! memory, stored row-major with the 16-byte chunks of each row permuted by swizzle `S`
//! ([`crate::layout`] holds the layout math and explains the bank model).
//!
//! # Alignment by construction
//! A tile's base address is 16-byte aligned by construction, and its rows and size are multiples of 16
//! bytes (const assertions of [`TileLayout::VALID`]), so every chunk address it hands to `cp.async`,
//! `ldmatrix` or a 16-byte load is 16-byte aligned:
//! - the dynamic shared window is declared `.align 1024`;
//! - [`SharedTile::at_dynamic`] places a tile at a compile-time offset that must be a multiple of 16
//!   (else: compile error), and [`SharedCarve`] hands out consecutive tiles, each starting where the
//!   previous (a multiple of 16 bytes long) ended;
//! - [`SharedTile::stage`] steps by whole tiles.
//!
//! The `ldmatrix` loads also need the base to be a multiple of the row size (their swizzle XOR acts
//! on absolute addresses, see [`TileLayout::block_addr`]): true for the tiles the kernels carve
//! (1024-aligned window, tiles of equal row size), and checked in `checked` builds.
//!
//! Bounds (row and chunk inside the tile) are checked in `checked` builds (a failure traps).
//! Synchronisation is the caller's: a tile read must follow the barrier that orders the writes.
use core::marker::PhantomData;

use crate::dev::copy::{cp_async_16, ldmatrix_x4, ldmatrix_x4_trans};
use crate::dev::mma::{FragA, FragB};
use crate::dev::shared::{
    SharedScalar, check_index, dynamic_base, ld_shared_v2_f32, ld_shared_v4, st_shared_v4,
};
use crate::dev::thread::lane_id;
use crate::layout::{CHUNK_BYTES, Element, Swizzle, TileLayout, ldmatrix};

/// A tile of shared memory (see the module doc). A 32-bit shared-window address and a type.
pub struct SharedTile<E, const ROWS: usize, const COLS: usize, S> {
    base: u32,
    _layout: PhantomData<TileLayout<E, ROWS, COLS, S>>,
}

impl<E, const ROWS: usize, const COLS: usize, S> Clone for SharedTile<E, ROWS, COLS, S> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<E, const ROWS: usize, const COLS: usize, S> Copy for SharedTile<E, ROWS, COLS, S> {}

impl<E: Element, const ROWS: usize, const COLS: usize, S: Swizzle> SharedTile<E, ROWS, COLS, S> {
    /// Bytes of one tile (a multiple of 16).
    pub const BYTES: usize = TileLayout::<E, ROWS, COLS, S>::BYTES;
    /// 16-byte chunks per row.
    pub const CHUNKS_PER_ROW: usize = TileLayout::<E, ROWS, COLS, S>::CHUNKS_PER_ROW;

    /// The tile at byte `OFFSET` of this launch's dynamic shared memory; a compile error unless
    /// `OFFSET` is a multiple of 16. The launch must provide at least `OFFSET + BYTES` bytes.
    #[inline(always)]
    pub fn at_dynamic<const OFFSET: usize>() -> Self {
        let offset = TileLayout::<E, ROWS, COLS, S>::offset_checked::<OFFSET>();
        Self::from_aligned(dynamic_base() + offset)
    }

    /// `base` must be 16-byte aligned (all uses) and a multiple of `ROW_BYTES` (for the `ldmatrix`
    /// block addressing); the latter is checked in checked builds.
    #[inline(always)]
    fn from_aligned(base: u32) -> Self {
        let () = TileLayout::<E, ROWS, COLS, S>::VALID;
        check_index(
            (base as usize) % TileLayout::<E, ROWS, COLS, S>::ROW_BYTES,
            1,
        );
        Self {
            base,
            _layout: PhantomData,
        }
    }

    /// Stage `i` of consecutive tiles of this layout starting at `self` (double buffering); the
    /// stages must have been reserved together ([`SharedCarve::take`] with `stages > i`).
    #[inline(always)]
    pub fn stage(self, i: u32) -> Self {
        Self::from_aligned(self.base + i * Self::BYTES as u32)
    }

    /// The same tile, its base passed through [`crate::dev::opaque_dep_u32`]. Inside a loop, with
    /// `dep` the loop counter, the optimiser can no longer treat the tile's `ldmatrix` addresses as
    /// loop-invariant: otherwise it computes every block address of a fixed tile (one XOR per block,
    /// see [`TileLayout::block_addr`]) once before the loop and keeps them all in registers for the
    /// whole loop, tens of registers a kernel with large accumulators lacks.
    #[inline(always)]
    pub fn in_step(self, dep: u32) -> Self {
        Self {
            base: crate::dev::opaque_dep_u32(self.base, dep),
            _layout: PhantomData,
        }
    }

    /// Shared address of logical chunk `chunk` of row `row` (16-byte aligned).
    #[inline(always)]
    pub fn chunk_addr(&self, row: u32, chunk: u32) -> u32 {
        check_index(row as usize, ROWS);
        check_index(chunk as usize, Self::CHUNKS_PER_ROW);
        self.base + TileLayout::<E, ROWS, COLS, S>::chunk_offset(row, chunk)
    }

    /// Starts a 16-byte `cp.async` of `src` into chunk (row, chunk); zero-fills it when `fill` is
    /// false. Complete with `cp_async_commit`, `cp_async_wait` and a barrier before reading.
    ///
    /// # Safety
    /// When `fill` is true, `src` is 16-byte aligned and points at 16 readable bytes of global memory
    /// that nothing writes during the kernel; no thread touches the chunk until the copy is complete.
    #[inline(always)]
    pub unsafe fn copy_chunk_async(&self, row: u32, chunk: u32, src: *const u8, fill: bool) {
        // SAFETY: the chunk address is 16-byte aligned and inside the tile (type invariant, bounds
        // checked in checked builds); `src` is the caller's obligation.
        unsafe { cp_async_16(self.chunk_addr(row, chunk), src, fill) }
    }

    /// 16 bytes of chunk (row, chunk) as four words.
    #[inline(always)]
    pub fn load_chunk(&self, row: u32, chunk: u32) -> [u32; 4] {
        // SAFETY: aligned and in the tile (type invariant; bounds checked in checked builds).
        unsafe { ld_shared_v4(self.chunk_addr(row, chunk)) }
    }

    /// Stores 16 bytes (four words) into chunk (row, chunk): the synchronous counterpart of
    /// [`Self::copy_chunk_async`] for data assembled in registers.
    #[inline(always)]
    pub fn store_chunk(&self, row: u32, chunk: u32, words: [u32; 4]) {
        // SAFETY: aligned and in the tile (type invariant; bounds checked in checked builds); the
        // caller orders other threads' accesses with barriers, as for every tile write.
        unsafe { st_shared_v4(self.chunk_addr(row, chunk), words) }
    }

    /// Stores one 32-bit word at element (row, col), which must be the first of the elements that
    /// share the word (`col` a multiple of `4 / E::BYTES`).
    #[inline(always)]
    pub fn store_word(&self, row: u32, col: u32, word: u32) {
        let off = TileLayout::<E, ROWS, COLS, S>::elem_offset(row, col);
        check_index(row as usize, ROWS);
        check_index((off % 4) as usize, 1);
        // SAFETY: 4-byte aligned (checked above in checked builds) and inside the tile.
        unsafe { u32::st_shared(self.base + off, word) }
    }
}

impl<const ROWS: usize, const COLS: usize, S: Swizzle> SharedTile<f32, ROWS, COLS, S> {
    /// Elements (row, col) and (row, col + 1) with one `ld.shared.v2.f32`; `col` must be even (the
    /// pair then lies in one 16-byte chunk, 8-byte aligned).
    #[inline(always)]
    pub fn load_pair(&self, row: u32, col: u32) -> [f32; 2] {
        check_index(row as usize, ROWS);
        check_index(col as usize + 1, COLS);
        check_index((col % 2) as usize, 1);
        let off = TileLayout::<f32, ROWS, COLS, S>::elem_offset(row, col);
        // SAFETY: in the tile (checked in checked builds) and 8-byte aligned (even column, 16-byte
        // aligned chunks); the caller orders the writes before this read, as for every tile read.
        unsafe { ld_shared_v2_f32(self.base + off) }
    }
}

/// `ldmatrix` loads of 16x16 blocks of a 16-bit tile, in `mma` fragment order. Every lane of the warp
/// must call these together. `row0` is the block's first row (a multiple of 8 keeps the reads
/// conflict-free) and `chunk0` its first 16-byte chunk (8 elements per chunk).
impl<E: Element, const ROWS: usize, const COLS: usize, S: Swizzle> SharedTile<E, ROWS, COLS, S> {
    const IS_16_BIT: () = assert!(E::BYTES == 2, "ldmatrix .b16 needs a 16-bit element tile");

    /// Address lane `(r, c)` of the 16x16 block at (row0, chunk0) reads: `block_addr` form (one
    /// register per lane pattern and stage, an XOR and an immediate per block; see
    /// [`TileLayout::block_addr`]), bounds-checked in checked builds.
    #[inline(always)]
    fn block_addr(&self, (r, c): (u32, u32), row0: u32, chunk0: u32) -> u32 {
        let () = Self::IS_16_BIT;
        check_index((row0 % 8 + chunk0 % 2) as usize, 1);
        check_index((row0 + 15) as usize, ROWS);
        check_index((chunk0 + 1) as usize, Self::CHUNKS_PER_ROW);
        let lane_part = self.base + TileLayout::<E, ROWS, COLS, S>::chunk_offset(r, c);
        TileLayout::<E, ROWS, COLS, S>::block_addr(lane_part, row0, chunk0)
    }

    /// The A operand (rows = M, chunks along K) of the block at (row0, chunk0) of a row-major tile.
    #[inline(always)]
    pub fn load_a(&self, row0: u32, chunk0: u32) -> FragA {
        let addr = self.block_addr(ldmatrix::col_major_quads(lane_id()), row0, chunk0);
        // SAFETY: aligned in-tile address (type invariant); the warp calls this converged.
        unsafe { ldmatrix_x4(addr) }
    }

    /// The A operand of the block at M chunk `chunk0`, K rows `row0..row0 + 16` of a tile stored
    /// `[k][m]` (A transposed in memory), through `ldmatrix.trans`: matrix `i` holds K rows
    /// `row0 + 8 (i / 2)`, M chunk `chunk0 + i % 2`, transposed into (m, k) order.
    #[inline(always)]
    pub fn load_a_km(&self, row0: u32, chunk0: u32) -> FragA {
        let addr = self.block_addr(ldmatrix::row_major_quads(lane_id()), row0, chunk0);
        // SAFETY: as for `load_a`.
        unsafe { ldmatrix_x4_trans(addr) }
    }

    /// B operands of two n-tiles from a tile stored `[n][k]` (one row per output column, e.g. K in
    /// `Q K^T`): rows row0..row0+8 then row0+8..row0+16, K chunks chunk0 and chunk0+1.
    #[inline(always)]
    pub fn load_b_pair_nk(&self, row0: u32, chunk0: u32) -> [FragB; 2] {
        let addr = self.block_addr(ldmatrix::row_major_quads(lane_id()), row0, chunk0);
        // SAFETY: as for `load_a`.
        let m = unsafe { ldmatrix_x4(addr) };
        [[m[0], m[1]], [m[2], m[3]]]
    }

    /// B operands of two n-tiles from a tile stored `[k][n]` (e.g. V in `P V`), through
    /// `ldmatrix.trans`: K rows row0..row0+16, n columns in chunk0 then chunk0+1.
    #[inline(always)]
    pub fn load_b_pair_kn(&self, row0: u32, chunk0: u32) -> [FragB; 2] {
        let addr = self.block_addr(ldmatrix::col_major_quads(lane_id()), row0, chunk0);
        // SAFETY: as for `load_a`.
        let m = unsafe { ldmatrix_x4_trans(addr) };
        [[m[0], m[1]], [m[2], m[3]]]
    }
}

/// Hands out consecutive tiles of the dynamic shared memory. The window starts 1024-byte aligned and
/// every tile is a multiple of 16 bytes (and of its row size) long, so every tile it returns starts
/// 16-byte aligned; tiles of one row size carved in a row also start at multiples of that row size
/// (checked in checked builds), as their `ldmatrix` addressing needs.
pub struct SharedCarve {
    next: u32,
    used: usize,
}

impl SharedCarve {
    /// Starts at the beginning of this launch's dynamic shared memory.
    #[inline(always)]
    pub fn dynamic() -> Self {
        check_index((dynamic_base() % 1024) as usize, 1);
        Self {
            next: dynamic_base(),
            used: 0,
        }
    }

    /// Reserves `stages` consecutive tiles of one layout and returns stage 0 (reach the others with
    /// [`SharedTile::stage`]).
    #[inline(always)]
    pub fn take<E: Element, const ROWS: usize, const COLS: usize, S: Swizzle>(
        &mut self,
        stages: u32,
    ) -> SharedTile<E, ROWS, COLS, S> {
        let tile = SharedTile::from_aligned(self.next);
        let bytes = stages as usize * SharedTile::<E, ROWS, COLS, S>::BYTES;
        self.next += bytes as u32;
        self.used += bytes;
        tile
    }

    /// Bytes reserved so far (the launch must provide at least this many).
    #[inline(always)]
    pub fn used(&self) -> usize {
        self.used
    }
}

const _: () = assert!(CHUNK_BYTES == 16);
