//! The f32 matmul on Hopper tensor cores (sm_90 build only): `C (+)= op(A) op(B) (+ bias)` with
//! `wgmma` m64n128k8 tf32 products and f32 accumulation, in 3xTF32 (`matmul_wg_tf32x3_{n,t}_f32`)
//! or TF32 (`matmul_wg_tf32_{n,t}_f32`) precision, A stored either way (`n`: `M x K`, `t`:
//! `K x M`), any M, N, K, batched or split along the depth (`splitk.rs` sums the slices); TF32 also
//! on 128 x 256 tiles with m64n256k8 (`matmul_wg_tf32w_{n,t}_f32`, never split). The same body,
//! with an A built from two stored tiles instead of read (`ASource`: `Stored`, `Pairs`), is the
//! Clifford fc forward's feature mixing (`matmul_wg_pairs_{tf32x3,tf32}_f32`, `params::WgPairs`):
//! each pair term `±x_i y_k` is formed in the consumers' registers from the tiles of x and y, so
//! no pair buffer is written or read.
//! B comes as K-major tf32 parts written by `matmul_wg_split_b_f32` from B stored either
//! way; in TF32, a B stored `N x K` comes as it is stored (the host maps it in place), its f32
//! bits truncated by the tensor core. Tiles and the design notes: `params::matmul_wg_tf32`.
//!
//! Persistent CTAs (384 threads, at most one an SM) walk the 128 x 128 (wide: 128 x 256) tiles of C
//! of every batch entry or depth slice, `blockIdx.x, + gridDim.x, ...`:
//! ```text
//! warpgroup 0, thread 0 (copies): per tile, per k-tile kt: wait empty[s], expect the stage's bytes on
//!     full[s], TMA A's stored k-tile (f32, 128-byte swizzle) and B's parts' k-tiles (or, TF32
//!     with B stored `N x K`, B's stored k-tile) into stage s
//! warpgroups 1, 2 (consumers, rows 64 (w - 1)..): per tile, per k-tile: wait full[s]; read and
//!     split the A fragments of the 4 k8 steps; 12 (3xTF32) or 4 (TF32) wgmma; wait for them; add
//!     the partial (3xTF32); release stage s (TF32 with A stored `M x K`: A from shared memory,
//!     stage s released after the next k-tile's wgmma are queued);
//!     then each waits until the staging tile is free, writes its 64 x 128 rows of the
//!     accumulator there, arrives on `c_full` and goes on to the next tile (wide tiles: the
//!     first 128 columns, then, once the staging tile is free again, the other 128)
//! warpgroup 0, warps 1-3 (stores): per tile (and half of a wide tile): wait c_full; rows of 128
//!     floats, 16 bytes a lane, to C (bias, old C) or to the split's workspace; arrive on c_empty
//! ```
//! The copies run the ring's depth of k-tiles ahead and into the next tile, and the store warps
//! drain a tile's C while the consumers multiply the next one, so no tensor core waits on C's
//! stores. The two consumers share the tensor cores: one's adds and fragment reads overlap the
//! other's products.
//!
//! Every C element is one thread's fixed sequence of products and adds over k (and, when split, the
//! finishing kernel's fixed slice order): the same bits on every run.
use super::splitk::{chunks_aligned, store_element, store_element4};
use crate::dev::mbarrier::{MBarrier, PipeState, Pipeline, StageTiles};
use crate::dev::mem::{Slice, SliceMut};
use crate::dev::shared::{SharedScalar, dynamic_base, ld_shared_v4, st_shared_v2_f32};
use crate::dev::sync::sync_threads;
use crate::dev::thread::{
    block_idx_x, block_idx_y, block_idx_z, grid_dim_x, lane_id, thread_idx_x,
};
use crate::dev::tma::TensorMapRef;
use crate::dev::wgmma::{
    Accumulator, SwizzledTile, Tf32Wgmma, commit, fence, set_max_registers_dec,
    set_max_registers_inc,
};
use crate::params::lrp::v5::{split_tf32_fast, tf32_rna_bits};
use crate::params::matmul_wg_tf32::*;
use crate::params::{MatmulTf32, SplitB, WG_PAIRS_PATH_BITS, WgPairs, split_b_stored_offset};
use crate::unroll;

/// A K-major f32 tile of 128 rows by 32 floats (`BK`): one 128-byte swizzle panel, addressed as 64
/// 16-bit columns (element (r, k) at `elem_addr(r, 2 k)`). A stored `M x K`, and B's tf32 parts.
type KTile = SwizzledTile<128, 64>;
/// B's `hi` part on a wide tile: 256 rows of 32 floats.
type WideKTile = SwizzledTile<256, 64>;
/// The f32 tensor map of B's parts (or of a B stored `N x K`, TF32): `R` rows of 32 floats a box.
type PartsMap<const R: usize> = TensorMapRef<R, 3, 4>;

/// Shared tile `(rows, 16-bit cols)` of A's stored k-tile: k-contiguous (a [`KTile`]) or
/// outer-contiguous (32 k rows by 128 floats, four 128-byte panels); the box height of its tensor
/// map is `rows`.
const fn raw_tile(k_contig: bool) -> (usize, usize) {
    if k_contig { (128, 64) } else { (32, 256) }
}

/// Address of stored element (outer index `o`, depth `k`) of an operand's raw tile.
#[inline(always)]
fn raw_addr<const KC: bool, const R: usize, const C: usize>(
    t: SwizzledTile<R, C>,
    o: u32,
    k: u32,
) -> u32 {
    if KC {
        t.elem_addr(o, 2 * k)
    } else {
        t.elem_addr(k, 2 * o)
    }
}

/// The tf32 parts of `v`: (round-to-nearest hi, lo) for 3xTF32 (`passes` 3), (hi, unused) for
/// TF32 (a constant at every call, so the branch folds away).
#[inline(always)]
fn parts(v: u32, passes: u32) -> (u32, u32) {
    if passes == 3 {
        split_tf32_fast(f32::from_bits(v))
    } else {
        (tf32_rna_bits(v), 0)
    }
}

/// B's parts (`R` rows) in one pipeline stage: `hi` alone (TF32) or `hi` and `lo` (3xTF32); the type
/// fixes the precision, the tile's width, the stage's bytes and the copies that fill it.
trait BParts<const R: usize>: StageTiles {
    const PASSES: u32;
    /// The K-major descriptor of `hi` (all `R` rows) at k8 step `s`.
    fn hi(self, s: u32) -> u64;
    /// The same of `lo` (3xTF32).
    fn lo(self, s: u32) -> u64;
    /// Copies the parts' k-tile at depth `k0`, rows `n0..`, batch `z` into this stage.
    ///
    /// # Safety
    /// As [`TensorMapRef::load`]: one thread, the stage's `full` barrier expects these bytes.
    unsafe fn load(self, hi: PartsMap<R>, lo: PartsMap<R>, k0: i32, n0: i32, z: i32, bar: MBarrier);
}

impl<const R: usize> BParts<R> for SwizzledTile<R, 64> {
    const PASSES: u32 = 1;
    #[inline(always)]
    fn hi(self, s: u32) -> u64 {
        self.desc_k_major(0, s)
    }
    #[inline(always)]
    fn lo(self, s: u32) -> u64 {
        self.desc_k_major(0, s)
    }
    #[inline(always)]
    unsafe fn load(
        self,
        hi: PartsMap<R>,
        _lo: PartsMap<R>,
        k0: i32,
        n0: i32,
        z: i32,
        bar: MBarrier,
    ) {
        // SAFETY: the caller's.
        unsafe { hi.load(self, k0, n0, z, bar) }
    }
}

impl BParts<128> for (KTile, KTile) {
    const PASSES: u32 = 3;
    #[inline(always)]
    fn hi(self, s: u32) -> u64 {
        self.0.desc_k_major(0, s)
    }
    #[inline(always)]
    fn lo(self, s: u32) -> u64 {
        self.1.desc_k_major(0, s)
    }
    #[inline(always)]
    unsafe fn load(
        self,
        hi: PartsMap<128>,
        lo: PartsMap<128>,
        k0: i32,
        n0: i32,
        z: i32,
        bar: MBarrier,
    ) {
        // SAFETY: the caller's.
        unsafe {
            hi.load(self.0, k0, n0, z, bar);
            lo.load(self.1, k0, n0, z, bar);
        }
    }
}

/// A consumer thread's A fragments of the 4 k8 steps (rows `r0`, `r0 + 8`, depths `8 s + q`, `+ 4`
/// of the k-tile), each element's f32 bits `at(row, depth)`, split: `(hi, lo)` for 3xTF32, `(hi, _)`
/// for TF32.
#[inline(always)]
fn fragments_of(
    r0: u32,
    q: u32,
    passes: u32,
    at: impl Fn(u32, u32) -> u32,
) -> ([[u32; 4]; 4], [[u32; 4]; 4]) {
    let mut hi = [[0u32; 4]; 4];
    let mut lo = [[0u32; 4]; 4];
    unroll!(s in [0, 1, 2, 3] {
        let k = 8 * s as u32 + q;
        let v = [at(r0, k), at(r0 + 8, k), at(r0, k + 4), at(r0 + 8, k + 4)];
        unroll!(e in [0, 1, 2, 3] {
            (hi[s][e], lo[s][e]) = parts(v[e], passes);
        });
    });
    (hi, lo)
}

/// [`fragments_of`] a raw A tile.
#[inline(always)]
fn a_fragments<const A_KC: bool, const R: usize, const C: usize>(
    ta: SwizzledTile<R, C>,
    r0: u32,
    q: u32,
    passes: u32,
) -> ([[u32; 4]; 4], [[u32; 4]; 4]) {
    // SAFETY: r0 + 8 < BM and k + 4 < BK: inside the tile, which has landed (full barrier).
    fragments_of(r0, q, passes, |r, k| unsafe {
        u32::ld_shared(raw_addr::<A_KC, R, C>(ta, r, k))
    })
}

/// Where a product's A comes from, k-tile by k-tile: what a pipeline stage holds of it, the copies
/// that fill it, where B's matching k-tile lies, and the A fragments a consumer thread reads from
/// it. `Job` is what a tile's walk needs to know of its product `z`, worked out once a tile, from
/// the launch's parameters and the `TABLE_BYTES` of shared memory at `table` that `init` fills.
trait ASource: Copy {
    type Tile: StageTiles;
    type Job: Copy;
    /// wgmma may read the tile in shared memory as it is (a TF32 product of an A stored `M x K`):
    /// then no consumer thread touches it ([`ASource::stored_desc`]).
    const READ_AS_STORED: bool;
    /// Prefetches the source's tensor maps and writes its table.
    ///
    /// # Safety
    /// One thread, before the block barrier that precedes every [`ASource::job`].
    unsafe fn init(self, table: u32);
    fn job(self, table: u32, p: &MatmulTf32, z: u32) -> Self::Job;
    /// Copies the k-tile at depth `k0` of rows `m0..` into `tile`.
    ///
    /// # Safety
    /// As [`TensorMapRef::load`]: one thread, the stage's `full` barrier expects these bytes.
    unsafe fn load(self, job: Self::Job, tile: Self::Tile, m0: i32, k0: i32, bar: MBarrier);
    /// B's parts' (depth, batch entry) for the k-tile at depth `k0`.
    fn b_at(self, job: Self::Job, k0: i32) -> (i32, i32);
    /// A consumer thread's fragments of the k-tile at depth `k0`, as [`a_fragments`].
    fn fragments(
        self,
        job: Self::Job,
        tile: Self::Tile,
        k0: u32,
        r0: u32,
        q: u32,
        passes: u32,
    ) -> ([[u32; 4]; 4], [[u32; 4]; 4]);
    /// The K-major descriptor of rows `row..` at k8 step `s` (only where `READ_AS_STORED`).
    fn stored_desc(tile: Self::Tile, row: u32, s: u32) -> u64;
}

/// A stored A (`M x K` when `KC`, else `K x M`) through its tensor map; product `z` reads batch
/// entry `z` of A (none when A is broadcast) and B's entry [`MatmulTf32::b_entry`].
#[derive(Clone, Copy)]
struct Stored<const KC: bool, const R: usize, const C: usize>(TensorMapRef<R, 3, 4>);

impl<const KC: bool, const R: usize, const C: usize> ASource for Stored<KC, R, C> {
    type Tile = SwizzledTile<R, C>;
    /// A's and B's batch entries.
    type Job = (i32, i32);
    const READ_AS_STORED: bool = KC;
    #[inline(always)]
    unsafe fn init(self, _: u32) {
        self.0.prefetch();
    }
    #[inline(always)]
    fn job(self, _: u32, p: &MatmulTf32, z: u32) -> (i32, i32) {
        let za = if p.mm.stride_a != 0 { z as i32 } else { 0 };
        (za, p.b_entry(z) as i32)
    }
    #[inline(always)]
    unsafe fn load(self, (za, _): (i32, i32), tile: Self::Tile, m0: i32, k0: i32, bar: MBarrier) {
        // SAFETY: the caller's; the map's box is the tile (its type).
        unsafe {
            if KC {
                self.0.load(tile, k0, m0, za, bar);
            } else {
                self.0.load(tile, m0, k0, za, bar);
            }
        }
    }
    #[inline(always)]
    fn b_at(self, (_, zb): (i32, i32), k0: i32) -> (i32, i32) {
        (k0, zb)
    }
    #[inline(always)]
    fn fragments(
        self,
        _: (i32, i32),
        tile: Self::Tile,
        _: u32,
        r0: u32,
        q: u32,
        passes: u32,
    ) -> ([[u32; 4]; 4], [[u32; 4]; 4]) {
        a_fragments::<KC, R, C>(tile, r0, q, passes)
    }
    #[inline(always)]
    fn stored_desc(tile: Self::Tile, row: u32, s: u32) -> u64 {
        tile.desc_k_major(row, s)
    }
}

/// The Clifford fc forward's pair terms (`WgPairs`): A's k-tile `i` of product `z` (output
/// component `z`) is term `t = i / k_tiles` over features `n0 = BK (i % k_tiles) ..`,
/// `s_t x[t][b][n] y[k_t][b][n]`, built by the consumers from the stored tiles of x and y (`(C, B,
/// N)` through 3-D maps, boxes of `BM` rows of 32 features; past N or B the copies bring zeros).
/// B's k-tile is path `p_t`'s features `n0..` (B's parts batched over the paths).
#[derive(Clone, Copy)]
struct Pairs {
    x: TensorMapRef<128, 3, 4>,
    y: TensorMapRef<128, 3, 4>,
    k_tiles: u32,
    /// `WgPairs::k_neg` and `WgPairs::paths`, which `init` copies to shared memory: a walk picks
    /// its product's entries there by index (indexing the parameter itself would copy it to the
    /// stack).
    k_neg: [u32; 8],
    paths: [u64; 8],
}

impl Pairs {
    /// Term and first feature of the k-tile at depth `k0`.
    #[inline(always)]
    fn term(self, k0: u32) -> (u32, u32) {
        let i = k0 / BK;
        let t = i / self.k_tiles;
        (t, BK * (i - t * self.k_tiles))
    }
}

impl ASource for Pairs {
    type Tile = (KTile, KTile);
    /// Output component `z`'s term tables (`WgPairs::k_neg`, `WgPairs::paths`).
    type Job = (u32, u64);
    const READ_AS_STORED: bool = false;
    #[inline(always)]
    unsafe fn init(self, table: u32) {
        self.x.prefetch();
        self.y.prefetch();
        unroll!(c in [0, 1, 2, 3, 4, 5, 6, 7] {
            // SAFETY: inside the table (`TABLE_BYTES`: 8 words, then 8 pairs of words).
            unsafe {
                u32::st_shared(table + 4 * c as u32, self.k_neg[c]);
                u32::st_shared(table + 32 + 8 * c as u32, self.paths[c] as u32);
                u32::st_shared(table + 36 + 8 * c as u32, (self.paths[c] >> 32) as u32);
            }
        });
    }
    #[inline(always)]
    fn job(self, table: u32, _: &MatmulTf32, z: u32) -> (u32, u64) {
        let z = z % 8;
        // SAFETY: written by `init` before the block barrier (z < 8 as `WgPairs::mm.batch` is).
        unsafe {
            let lo = u32::ld_shared(table + 32 + 8 * z) as u64;
            let hi = u32::ld_shared(table + 36 + 8 * z) as u64;
            (u32::ld_shared(table + 4 * z), lo | hi << 32)
        }
    }
    #[inline(always)]
    unsafe fn load(
        self,
        (k_neg, _): (u32, u64),
        (tx, ty): (KTile, KTile),
        m0: i32,
        k0: i32,
        bar: MBarrier,
    ) {
        let (t, n0) = self.term(k0 as u32);
        let k = (k_neg >> (4 * t)) & 7;
        // SAFETY: the caller's; the maps' boxes are the tiles.
        unsafe {
            self.x.load(tx, n0 as i32, m0, t as i32, bar);
            self.y.load(ty, n0 as i32, m0, k as i32, bar);
        }
    }
    #[inline(always)]
    fn b_at(self, (_, paths): (u32, u64), k0: i32) -> (i32, i32) {
        let (t, n0) = self.term(k0 as u32);
        let path = (paths >> (WG_PAIRS_PATH_BITS * t)) & ((1 << WG_PAIRS_PATH_BITS) - 1);
        (n0 as i32, path as i32)
    }
    #[inline(always)]
    fn fragments(
        self,
        (k_neg, _): (u32, u64),
        (tx, ty): (KTile, KTile),
        k0: u32,
        r0: u32,
        q: u32,
        passes: u32,
    ) -> ([[u32; 4]; 4], [[u32; 4]; 4]) {
        let (t, _) = self.term(k0);
        // The term's sign as the f32 sign bit: negating is exact, so the sign may go on after the
        // product.
        let sign = ((k_neg >> (4 * t + 3)) & 1) << 31;
        // SAFETY: r0 + 8 < BM and k + 4 < BK: inside both tiles, which have landed. (Both tiles
        // share one layout: the swizzle's arithmetic is shared too.)
        fragments_of(r0, q, passes, |r, k| unsafe {
            (f32::ld_shared(raw_addr::<true, 128, 64>(tx, r, k))
                * f32::ld_shared(raw_addr::<true, 128, 64>(ty, r, k)))
            .to_bits()
                ^ sign
        })
    }
    #[inline(always)]
    fn stored_desc(_: Self::Tile, _: u32, _: u32) -> u64 {
        0
    }
}

/// The kernel body: A from `A` (a stored A, or pair terms), B's parts `P` (3xTF32: hi and lo; TF32:
/// hi), a ring of `ST` stages, tiles of `BNT` columns (128 or 256; the accumulator `AN` = `BNT / 2`
/// floats a thread). Grid: at most one CTA an SM (the walk covers every tile).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn matmul_wg_tf32<
    A: ASource,
    P: BParts<BNT>,
    const ST: usize,
    const BNT: usize,
    const AN: usize,
>(
    src: A,
    map_hi: PartsMap<BNT>,
    map_lo: PartsMap<BNT>,
    bias: Slice<f32>,
    c: SliceMut<f32>,
    ws: SliceMut<f32>,
    p: MatmulTf32,
) where
    [f32; AN]: Tf32Wgmma,
{
    const {
        let smem = if BNT == BN_WIDE as usize {
            SMEM_BYTES_WIDE
        } else {
            SMEM_BYTES
        };
        assert!(
            Pipeline::<(A::Tile, P), ST>::BYTES + (C_STAGING_BYTES + 16 + TABLE_BYTES) as usize
                <= smem as usize
        );
        // Wide tiles: TF32 only, never split (`params::matmul_wg_tf32::wide`).
        assert!(
            2 * AN == BNT && (BNT == BN as usize || (BNT == BN_WIDE as usize && P::PASSES == 1))
        );
    };
    // Column blocks of a tile that pass through the 128-column staging tile one after the other.
    let blocks = (BNT / BN as usize) as u32;

    let pipe = Pipeline::<(A::Tile, P), ST>::at(dynamic_base());
    // The C staging tile (16-byte aligned: the ring's size is) and its barriers: `c_full` completes
    // when every consumer thread has written its accumulator there, `c_empty` when every store
    // thread has read its rows out.
    let staging = dynamic_base() + Pipeline::<(A::Tile, P), ST>::BYTES as u32;
    let c_full = MBarrier::at(staging + C_STAGING_BYTES);
    let c_empty = MBarrier::at(staging + C_STAGING_BYTES + 8);
    // The source's table (pair products: their term tables).
    let table = staging + C_STAGING_BYTES + 16;
    let tid = thread_idx_x();
    if tid == 0 {
        // SAFETY: one thread, before the barrier below and any other use (the ring's init fences
        // the staging barriers' too; the barrier orders the source's table).
        unsafe {
            c_full.init(256);
            c_empty.init(STORE_THREADS);
            pipe.init(2);
            src.init(table);
        }
        map_hi.prefetch();
        if P::PASSES == 3 {
            map_lo.prefetch();
        }
    }
    sync_threads();

    let mm = p.mm;
    let tiles_n = mm.n.div_ceil(BNT as u32);
    let per_entry = tiles_n * mm.m.div_ceil(BM);
    let tiles = per_entry * if p.splits > 1 { p.splits } else { p.batch };
    // Tile `t` of the persistent walk (column tiles fastest, so the CTAs running at once share A's
    // rows): batch entry, depth slice, first row and column, first depth and k-tile count.
    let tile = |t: u32| {
        let zz = t / per_entry;
        let r = t - zz * per_entry;
        let (m0, n0) = ((r / tiles_n) * BM, (r % tiles_n) * BNT as u32);
        let (z, split) = if p.splits > 1 { (0u32, zz) } else { (zz, 0) };
        let k_begin = split * p.k_per_split;
        let k_end = {
            let e = k_begin as u64 + p.k_per_split as u64;
            if e < mm.k as u64 { e as u32 } else { mm.k }
        };
        let k_tiles = if k_end > k_begin {
            (k_end - k_begin).div_ceil(BK)
        } else {
            0
        };
        (z, split, m0, n0, k_begin, k_tiles)
    };

    if tid < 128 {
        set_max_registers_dec::<PRODUCER_REGS>();
        if tid == 0 {
            let mut at = PipeState::START;
            let mut t = block_idx_x();
            while t < tiles {
                let (z, _, m0, n0, k_begin, k_tiles) = tile(t);
                let job = src.job(table, &p, z);
                let mut kt = 0;
                while kt < k_tiles {
                    let k0 = (k_begin + kt * BK) as i32;
                    let (kb, zb) = src.b_at(job, k0);
                    // SAFETY: the one copying thread; the loads fill the stage's tiles, exactly the
                    // bytes announced; the maps' boxes are the tiles' (their types).
                    unsafe {
                        let ((ta, tb), full) = pipe.producer_acquire(at);
                        src.load(job, ta, m0 as i32, k0, full);
                        tb.load(map_hi, map_lo, kb, n0 as i32, zb, full);
                    }
                    at = at.next();
                    kt += 1;
                }
                t += grid_dim_x();
            }
        } else if tid >= 128 - STORE_THREADS {
            // The store warps: rows `warp, warp + 3, ...` of each tile, 16 bytes a lane.
            let s = tid - (128 - STORE_THREADS);
            let (warp, col_in) = (s / 32, 4 * (s % 32));
            let aligned = chunks_aligned(&p, &bias, &c, &ws);
            let mut parity = 0;
            let mut t = block_idx_x();
            while t < tiles {
                let (z, split, m0, n0, _, _) = tile(t);
                let mut b = 0;
                // (Column blocks past N pass through neither side.)
                while b < blocks && n0 + BN * b < mm.n {
                    c_full.wait(parity);
                    let col = n0 + BN * b + col_in;
                    let mut r = warp;
                    while r < BM && m0 + r < mm.m {
                        let row = m0 + r;
                        // SAFETY: inside the staging tile (r < BM, col_in + 4 <= BN), 16-byte
                        // aligned (C_PITCH and col_in multiples of 4); its writers arrived on
                        // `c_full` before the phase this thread waited for completed.
                        let v = unsafe { ld_shared_v4(staging + 4 * (r * C_PITCH + col_in)) }
                            .map(f32::from_bits);
                        store_element4(&p, &bias, &c, &ws, split, z as u64, (row, col), v, aligned);
                        r += STORE_THREADS / 32;
                    }
                    // SAFETY: one arrival a store thread a column block, after its last read of
                    // the block.
                    unsafe { c_empty.arrive() };
                    parity ^= 1;
                    b += 1;
                }
                t += grid_dim_x();
            }
        }
    } else {
        set_max_registers_inc::<CONSUMER_REGS>();
        let wg = tid / 128 - 1;
        let elected = tid % 128 == 0;
        let (lane, w) = (lane_id(), (tid % 128) / 32);
        let (g, q) = (lane / 4, lane % 4);
        let r0 = 64 * wg + 16 * w + g;
        let mut at = PipeState::START;
        let mut c_parity = 0;
        let mut t = block_idx_x();
        while t < tiles {
            let (z, _, _, n0, k_begin, k_tiles) = tile(t);
            let job = src.job(table, &p, z);
            let mut acc = [0f32; AN];
            if P::PASSES == 1 && A::READ_AS_STORED {
                // TF32 with A stored `M x K`: both operands K-major in shared memory, so wgmma reads
                // A's stored tile (truncated to tf32 by the tensor core) and no thread touches it; a
                // stage is released one k-tile later, once the next k-tile's products are queued.
                // SAFETY: the whole consumer warpgroup, `elected` on one thread; the products read
                // the stage only through their wgmma.
                at = unsafe {
                    pipe.consume_one_group_behind(at, k_tiles, elected, &mut acc, |acc, (ta, tb)| {
                        unroll!(s in [0, 1, 2, 3] {
                            let s = s as u32;
                            // SAFETY: the whole warpgroup, on a stage that has landed (the full
                            // barrier) and stays until the walk releases it after a covering wait.
                            unsafe { acc.mma_tf32_ss(A::stored_desc(ta, 64 * wg, s), tb.hi(s), 1) };
                        });
                    })
                };
            } else {
                let mut kt = 0;
                while kt < k_tiles {
                    let (ta, tb) = pipe.consumer_wait(at);
                    let k0 = k_begin + kt * BK;
                    let (ah, al) = src.fragments(job, ta, k0, r0, q, P::PASSES);
                    fence();
                    if P::PASSES == 3 {
                        let mut part = [0f32; AN];
                        unroll!(s in [0, 1, 2, 3] {
                            let s = s as u32;
                            // SAFETY: the whole warpgroup, on a stage that has landed (the full barrier)
                            // and stays until this warpgroup releases it after the wait below. The small
                            // terms first: they are lost least to the chain's truncation.
                            unsafe {
                                part.mma_tf32_rs(&al[s as usize], tb.hi(s), (s > 0) as u32);
                                part.mma_tf32_rs(&ah[s as usize], tb.lo(s), 1);
                                part.mma_tf32_rs(&ah[s as usize], tb.hi(s), 1);
                            }
                        });
                        commit();
                        part.wait::<0>();
                        let mut i = 0;
                        while i < AN {
                            acc[i] += part[i];
                            i += 1;
                        }
                    } else {
                        unroll!(s in [0, 1, 2, 3] {
                            let s = s as u32;
                            // SAFETY: as above.
                            unsafe { acc.mma_tf32_rs(&ah[s as usize], tb.hi(s), 1) };
                        });
                        commit();
                        acc.wait::<0>();
                    }
                    if elected {
                        // SAFETY: one thread a consumer; the wait above retired this stage's wgmma.
                        unsafe { pipe.consumer_release(at) };
                    }
                    at = at.next();
                    kt += 1;
                }
            }

            // Epilogue: acc[4 j + 2 h + e] is row r0 + 8 h, column 8 j + 2 q + e of this tile, into
            // the staging tile by blocks of 128 columns, each once the store warps have emptied it
            // of the previous block.
            let mut b = 0;
            while b < blocks && n0 + BN * b < mm.n {
                c_empty.wait(c_parity ^ 1);
                unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
                    unroll!(h in [0, 1] {
                        let (r, col) = (r0 + 8 * h as u32, 8 * j as u32 + 2 * q);
                        let i = 64 * b as usize + 4 * j + 2 * h;
                        // SAFETY: inside the staging tile (r < BM, col + 2 <= BN), 8-byte aligned;
                        // this thread's own pair, which no store thread reads before `c_full`
                        // completes.
                        unsafe {
                            st_shared_v2_f32(staging + 4 * (r * C_PITCH + col), [acc[i], acc[i + 1]])
                        };
                    });
                });
                // SAFETY: one arrival a consumer thread a column block (the barrier counts 256),
                // after its writes to the staging tile.
                unsafe { c_full.arrive() };
                c_parity ^= 1;
                b += 1;
            }
            t += grid_dim_x();
        }
    }
}

macro_rules! wg_tf32_entry_points {
    ($($name:ident, $parts:ty, $a_kc:literal, $stages:expr, $bn:expr;)*) => {$(
        // One CTA per SM with a register cap at entry, which `setmaxnreg` needs.
        crate::launch_bounds!($name, THREADS, 1);
        crate::tensor_map_params!($name, 0, 1, 2);
        /// `C (+)= op(A) op(B) (+ bias)` for one precision and storage of A (module doc): `a_map`
        /// is an f32 tensor map of the stored A, `hi_map` and `lo_map` of B's tf32 parts (TF32:
        /// `lo_map` is not read, and a B stored `N x K` is mapped as stored; boxes of the tile's
        /// columns as rows) (`host::ops::matmul`), grid
        /// `min(tiles, SMs)` (`tiles` of `params::matmul_wg_tf32`), `THREADS` threads, `SMEM_BYTES`
        /// (wide: `SMEM_BYTES_WIDE`) of dynamic shared memory. `ws` holds `splits * M * N` floats
        /// when split.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(
            _a_map: crate::params::TensorMapParam,
            _hi_map: crate::params::TensorMapParam,
            _lo_map: crate::params::TensorMapParam,
            bias: Slice<f32>,
            c: SliceMut<f32>,
            ws: SliceMut<f32>,
            p: MatmulTf32,
        ) {
            let map_a = crate::tensor_map_param!($name, 0, raw_tile($a_kc).0, 3, 4);
            let map_hi = crate::tensor_map_param!($name, 1, { $bn as usize }, 3, 4);
            let map_lo = crate::tensor_map_param!($name, 2, { $bn as usize }, 3, 4);
            let src = Stored::<$a_kc, { raw_tile($a_kc).0 }, { raw_tile($a_kc).1 }>(map_a);
            unsafe {
                matmul_wg_tf32::<_, $parts, { $stages as usize }, { $bn as usize }, { $bn as usize / 2 }>(
                    src, map_hi, map_lo, bias, c, ws, p,
                )
            }
        }
    )*};
}

// `n`: A stored M x K (k-contiguous); `t`: A stored K x M.
wg_tf32_entry_points! {
    matmul_wg_tf32x3_n_f32, (KTile, KTile), true, STAGES_TF32X3, BN;
    matmul_wg_tf32x3_t_f32, (KTile, KTile), false, STAGES_TF32X3, BN;
    matmul_wg_tf32_n_f32, KTile, true, STAGES_TF32, BN;
    matmul_wg_tf32_t_f32, KTile, false, STAGES_TF32, BN;
    matmul_wg_tf32w_n_f32, WideKTile, true, STAGES_WIDE, BN_WIDE;
    matmul_wg_tf32w_t_f32, WideKTile, false, STAGES_WIDE, BN_WIDE;
}

macro_rules! wg_pairs_entry_points {
    ($($name:ident, $parts:ty, $stages:expr;)*) => {$(
        crate::launch_bounds!($name, THREADS, 1);
        crate::tensor_map_params!($name, 0, 1, 2, 3);
        /// The Clifford fc forward's feature mixing, one product an output component
        /// (`params::WgPairs`): `x_map` and `y_map` are f32 tensor maps of x and of the scaled y
        /// (`(C, B, N)` as [component][row][feature]), boxes of `BM` rows; `hi_map` and `lo_map`
        /// of the weights' tf32 parts batched over the paths (TF32: `lo_map` is not read), boxes of
        /// `BN` rows (`host::ops::matmul`). Grid `min(tiles, SMs)`, `THREADS` threads,
        /// `SMEM_BYTES` of dynamic shared memory.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(
            _x_map: crate::params::TensorMapParam,
            _y_map: crate::params::TensorMapParam,
            _hi_map: crate::params::TensorMapParam,
            _lo_map: crate::params::TensorMapParam,
            c: SliceMut<f32>,
            p: WgPairs,
        ) {
            let src = Pairs {
                x: crate::tensor_map_param!($name, 0, { BM as usize }, 3, 4),
                y: crate::tensor_map_param!($name, 1, { BM as usize }, 3, 4),
                k_tiles: p.k_tiles,
                k_neg: p.k_neg,
                paths: p.paths,
            };
            let map_hi = crate::tensor_map_param!($name, 2, { BN as usize }, 3, 4);
            let map_lo = crate::tensor_map_param!($name, 3, { BN as usize }, 3, 4);
            // No bias and no split: neither is read.
            let bias = Slice { ptr: core::ptr::null(), len: 0 };
            let ws = SliceMut { ptr: core::ptr::null_mut(), len: 0 };
            unsafe {
                matmul_wg_tf32::<_, $parts, { $stages as usize }, { BN as usize }, { BN as usize / 2 }>(
                    src, map_hi, map_lo, bias, c, ws, p.mm,
                )
            }
        }
    )*};
}

wg_pairs_entry_points! {
    matmul_wg_pairs_tf32x3_f32, (KTile, KTile), STAGES_PAIRS_TF32X3;
    matmul_wg_pairs_tf32_f32, KTile, STAGES_PAIRS_TF32;
}

crate::launch_bounds!(matmul_wg_split_b_f32, SPLIT_THREADS, 1);
/// Writes B (`p.k x p.n`, stored as `SplitB` says) as K-major tf32 parts: `out[z][n][k]` = the
/// round-to-nearest tf32 `hi` of B(k, n) and, when `p.passes` is 3, `out[batch][n][pitch]` later
/// its `lo` (the split of `params::lrp::v5::split_tf32_fast`, as the products' A side). A block
/// moves a 32 x 32 tile through shared memory, reading rows of the stored B (in place, or gathered
/// from row blocks: `SplitB::block_rows`) and writing rows of the parts, both along their
/// contiguous dim. Grid (ceil(K / 32), ceil(N / 32), batch),
/// `SPLIT_THREADS` threads, `SPLIT_SMEM_BYTES` of dynamic shared memory.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn matmul_wg_split_b_f32(
    b: Slice<f32>,
    out: SliceMut<f32>,
    p: SplitB,
) {
    const PITCH: u32 = 33;
    let (tx, ty) = (thread_idx_x() % 32, thread_idx_x() / 32);
    let (k0, n0, z) = (block_idx_x() * 32, block_idx_y() * 32, block_idx_z());
    let tile = dynamic_base();
    // The tile is [n][k] (pitch 33: the transposing writes of a warp, one n row each, and the
    // row reads below land on 32 distinct banks).
    let mut r = ty;
    while r < 32 {
        let (n, k, at) = if p.k_contig != 0 {
            (n0 + r, k0 + tx, r * PITCH + tx)
        } else {
            (n0 + tx, k0 + r, tx * PITCH + r)
        };
        let v = if n < p.n && k < p.k {
            let (row, col) = if p.k_contig != 0 { (n, k) } else { (k, n) };
            let i = z as u64 * p.stride + split_b_stored_offset(&p, row) + col as u64;
            b.get(i)
        } else {
            0.0
        };
        // SAFETY: at < 32 * PITCH floats, inside the block's dynamic shared memory.
        unsafe { f32::st_shared(tile + 4 * at, v) };
        r += 8;
    }
    sync_threads();
    let plane = p.batch as u64 * p.n as u64 * p.pitch;
    let mut r = ty;
    while r < 32 {
        let (n, k) = (n0 + r, k0 + tx);
        if n < p.n && k < p.k {
            // SAFETY: written before the barrier above, by this block.
            let v = unsafe { f32::ld_shared(tile + 4 * (r * PITCH + tx)) };
            let i = (z as u64 * p.n as u64 + n as u64) * p.pitch + k as u64;
            let (h, l) = parts(v.to_bits(), p.passes);
            out.set(i, f32::from_bits(h));
            if p.passes == 3 {
                out.set(plane + i, f32::from_bits(l));
            }
        }
        r += 8;
    }
}
