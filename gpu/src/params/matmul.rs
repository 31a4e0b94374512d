//! Matmul family (`kernels/matmul/`, `host::ops::matmul`): the f32 kernel's tiles, the tensor-core
//! kernel's configuration and the launch parameters of both.
use super::KernelParam;

/// Matrix-multiply limits shared by the f32 and tensor-core kernels.
/// Most blocks along grid y (M tiles) and z (batch) the driver accepts.
pub const MAX_GRID_YZ: u64 = 65_535;

/// The f32 matmul on CUDA cores (`matmul_simt_*_f32`, `kernels/matmul/simt.rs`): 128 x 128 tiles of
/// C a block, two shared stages, k ascending with one fma per product (the same bits on every run).
pub mod matmul_f32v {
    pub const BM: u32 = 128;
    pub const BN: u32 = 128;
    /// Shared tile row pitch in floats: 16-byte aligned rows, and the scalar transposing stores of a
    /// k-contiguous operand land on distinct banks.
    pub const LDS: u32 = BM + 4;

    /// The kernel's shape. A thread owns rows `{ty * 4 + 0..4, 64 + ty * 4 + 0..4}` and `col_quads`
    /// groups of 4 columns `q * (BN / col_quads) + tx * 4 + 0..4` (4: an 8 x 16 micro-tile with 128
    /// threads; 2: 8 x 8 with 256). `bk` is the depth of one k-tile (8 or 16).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Config {
        pub col_quads: u32,
        pub bk: u32,
        /// Blocks that should fit an SM at once (launch bounds: caps registers at
        /// `65536 / (threads * min_blocks)`).
        pub min_blocks: u32,
    }

    impl Config {
        pub const fn threads(&self) -> u32 {
            16 * (32 / self.col_quads)
        }
        /// Two stages of the A and B tiles, `bk x LDS` floats each.
        pub const fn smem_bytes(&self) -> u32 {
            2 * 2 * self.bk * LDS * 4
        }
    }

    /// 128 threads with 8 x 16 micro-tiles (128 accumulators), 8-deep k-tiles filled through
    /// registers, at most 255 registers: 8 warps an SM, twice the independent fma per warp of 8 x 8.
    /// Two blocks per SM (4096^3: 1024 tiles over 264 block slots of an H100, 3.9 waves). Measured
    /// on an H100 (2026-11-26, commit 440db9e): 4096^3 3.1331 ms = 0.849 of cuBLAS SGEMM; the other
    /// shapes tried are in docs/PERF_NOTES.md ("Deleted kernels").
    pub const CONFIG: Config = Config {
        col_quads: 4,
        bk: 8,
        min_blocks: 2,
    };
    const _: () = {
        // Every thread moves whole 4-float groups of both tiles (BM * bk / 4 groups each).
        assert!((BM * CONFIG.bk / 4).is_multiple_of(CONFIG.threads()));
        // No opt-in needed: under the 48 KiB every device gives a block.
        assert!(CONFIG.smem_bytes() <= 48 * 1024);
    };
}

/// Parameters of one f32 matmul launch. Element (r, c) of a non-transposed operand is at
/// `r * ld + c`; of a transposed one (stored as its transpose) at `c * ld + r`. Batch `z` adds
/// `z * stride_*` (0 broadcasts an operand over the batch).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Matmul {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub trans_a: u32,
    pub trans_b: u32,
    /// 1: `C += A B` (read C first); 0: `C = A B`.
    pub accumulate: u32,
    pub lda: u64,
    pub ldb: u64,
    pub ldc: u64,
    pub stride_a: u64,
    pub stride_b: u64,
    pub stride_c: u64,
}

unsafe impl KernelParam for Matmul {}

/// Tensor-core matrix multiply `C = op(A) op(B)` for f16/bf16 (`kernels/matmul/tensor_core.rs`,
/// `host::ops::matmul`): f32 accumulation, C in the input dtype, batched over `grid.z`.
///
/// A block computes a `BM x BN` tile of C from `BK`-deep slices of A and B that `STAGES` shared-memory
/// stages stream in by 16-byte `cp.async` (XOR-swizzled rows, so `ldmatrix` reads are conflict-free);
/// its `WARPS_M x WARPS_N` warps each own a `WM x WN` tile of `mma.m16n8k16` accumulators.
///
/// Design notes (these constants are all a re-tune needs to change):
/// - 256 x 128 x 64 with 8 warps of 64 x 64: per k16 step a warp issues 8 `ldmatrix.x4` for 32
///   `mma`, and every byte brought into shared memory feeds 2 (B) or 4 (A) warps. The accumulators
///   take 128 registers a thread, so one block per SM (launch bounds: up to 255 registers).
/// - BK = 64: rows of a k-contiguous tile are 128 bytes, exactly one `Xor8` swizzle period.
/// - 3 stages of 48 KiB: 144 KiB, within the 163 KiB an sm_80 block may use (227 KiB on sm_90).
/// - Tiles are visited in groups of `GROUP_M` tile rows, column by column inside a group, so blocks
///   resident at the same time share A rows and B columns in L2.
///
/// The kernel is generic over a [`matmul_tc::Config`]; [`matmul_tc::DEFAULT`] is the shipped one.
pub mod matmul_tc {
    /// One tuning of the tensor-core kernel: block tile `bm x bn`, `bk`-deep k-tiles, `stages`
    /// pipeline stages, `warps_m x warps_n` warps (each a `bm / warps_m x bn / warps_n` tile of C),
    /// the launch bound's blocks per SM, and whether the k loop double-buffers the `ldmatrix`
    /// fragments in registers (`frag_pipe`: fragments of k16 step s + 1, including the first step of
    /// the next k-tile, are loaded before the `mma` of step s; the barrier moves before the last step).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Config {
        pub bm: u32,
        pub bn: u32,
        pub bk: u32,
        pub stages: u32,
        pub warps_m: u32,
        pub warps_n: u32,
        pub min_blocks: u32,
        pub frag_pipe: bool,
    }

    impl Config {
        /// Rows of C one warp owns.
        pub const fn wm(&self) -> u32 {
            self.bm / self.warps_m
        }
        /// Columns of C one warp owns.
        pub const fn wn(&self) -> u32 {
            self.bn / self.warps_n
        }
        pub const fn threads(&self) -> u32 {
            self.warps_m * self.warps_n * 32
        }
        /// Bytes of one stage of A plus B (16-bit elements).
        pub const fn stage_bytes(&self) -> u32 {
            (self.bm * self.bk + self.bk * self.bn) * 2
        }
        /// Dynamic shared memory of one block: the pipeline stages, or the `bm x bn` staging tile of
        /// C that the epilogue lays over them, whichever is larger.
        pub const fn smem_bytes(&self) -> u32 {
            let pipe = self.stages * self.stage_bytes();
            let staging = self.bm * self.bn * 2;
            if pipe > staging { pipe } else { staging }
        }
        /// Output tiles of an `m x n` product (grid.x).
        pub const fn tiles(&self, m: u64, n: u64) -> u64 {
            m.div_ceil(self.bm as u64) * n.div_ceil(self.bn as u64)
        }
        /// The shapes the kernel supports: warp tiles of whole 16 x 16 (A) and 16 x 8 pairs (B)
        /// blocks, 64-deep k-tiles (one `Xor8` period per k-contiguous row; the `ldmatrix`
        /// addressing needs power-of-two rows), 2 to 5 stages, at most 16 unrolled copies per
        /// thread, and at most 227 KiB of shared memory (the sm_90 per-block limit; see
        /// [`Self::fits_sm80`]).
        pub const fn valid(&self) -> bool {
            let (wm, wn, t) = (self.wm(), self.wn(), self.threads());
            self.bm.is_power_of_two()
                && self.bn.is_power_of_two()
                && self.bk == 64
                && wm * self.warps_m == self.bm
                && wn * self.warps_n == self.bn
                && wm.is_multiple_of(16)
                && wn.is_multiple_of(16)
                && wm / 16 <= 16
                && wn / 8 <= 16
                && self.stages >= 2
                && self.stages <= 5
                && (self.bm * self.bk / 8).is_multiple_of(t)
                && (self.bn * self.bk / 8).is_multiple_of(t)
                && self.bm * self.bk / 8 / t <= 16
                && self.bn * self.bk / 8 / t <= 16
                && self.bm * self.bn / 8 / t <= 16
                && t.is_multiple_of(self.bm / 8)
                && t.is_multiple_of(self.bn / 8)
                && self.min_blocks >= 1
                && self.smem_bytes() <= 227 * 1024
        }
        /// Whether one block fits the 163 KiB of dynamic shared memory an sm_80 block may use
        /// (sm_90: 227 KiB). Larger configurations launch only on devices that allow them.
        pub const fn fits_sm80(&self) -> bool {
            self.smem_bytes() <= 163 * 1024
        }
    }

    /// The shipped configuration (`matmul_tc_*`): 256 x 128 tiles, 3 stages, 4 x 2 warps of 64 x 64,
    /// fragments pipelined. Measured side by side on an H200 against cuBLAS through cudarc in the
    /// same run (f16/bf16 4096^3 and 8192^3): 0.60-0.63 of cuBLAS; the other tiles and depths tried
    /// (0.55-0.63) are in docs/PERF_NOTES.md ("Deleted kernels").
    pub const DEFAULT: Config = Config {
        bm: 256,
        bn: 128,
        bk: 64,
        stages: 3,
        warps_m: 4,
        warps_n: 2,
        min_blocks: 1,
        frag_pipe: true,
    };

    const _: () = assert!(DEFAULT.valid() && DEFAULT.fits_sm80());

    pub const BM: u32 = DEFAULT.bm;
    pub const BN: u32 = DEFAULT.bn;
    pub const BK: u32 = DEFAULT.bk;
    pub const STAGES: u32 = DEFAULT.stages;
    pub const WARPS_M: u32 = DEFAULT.warps_m;
    pub const WARPS_N: u32 = DEFAULT.warps_n;
    /// Rows and columns of C one warp owns.
    pub const WM: u32 = DEFAULT.wm();
    pub const WN: u32 = DEFAULT.wn();
    pub const THREADS: u32 = DEFAULT.threads();
    /// Tile rows per rasterisation group.
    pub const GROUP_M: u32 = 8;
    /// Bytes of one stage of A plus B (16-bit elements).
    pub const STAGE_BYTES: u32 = DEFAULT.stage_bytes();
    /// Dynamic shared memory of one block: the pipeline stages; the epilogue reuses the start of it
    /// as a `BM x BN` staging tile of C.
    pub const SMEM_BYTES: u32 = DEFAULT.smem_bytes();
    /// Largest M, N or K: row and column indices (plus one tile) stay inside u32.
    pub const MAX_DIM: u64 = 1 << 31;
    /// Most output tiles of one product (grid.x).
    pub const MAX_TILES: u64 = i32::MAX as u64;
    /// Most products in a batch (grid.z).
    pub const MAX_BATCH: u64 = 65_535;

    const _: () = assert!(WM == 64 && WN == 64 && THREADS == 256 && BK.is_multiple_of(16));
    const _: () = assert!(BM * BN * 2 <= SMEM_BYTES && SMEM_BYTES <= 163 * 1024);

    /// Output tiles of an `m x n` product (grid.x) for the default configuration.
    pub const fn tiles(m: u64, n: u64) -> u64 {
        DEFAULT.tiles(m, n)
    }

    /// The (tile row, tile column) block `bid` computes: groups of `GROUP_M` tile rows, each walked
    /// column by column (consecutive blocks share a column of B and a group of rows of A).
    pub const fn tile_coords(bid: u32, tiles_m: u32, tiles_n: u32) -> (u32, u32) {
        // Never 0 for a launched grid (tiles_n >= 1, bid < tiles_m * tiles_n); the guards only
        // keep a division by zero (a panic path in the kernel) out of the code.
        let per_group = GROUP_M * if tiles_n == 0 { 1 } else { tiles_n };
        let group = bid / per_group;
        let first_m = group * GROUP_M;
        let left = tiles_m.saturating_sub(first_m);
        let size = if left == 0 {
            1
        } else if left < GROUP_M {
            left
        } else {
            GROUP_M
        };
        let in_group = bid % per_group;
        (first_m + in_group % size, in_group / size)
    }
}

/// The Hopper f16/bf16 matmul (`matmul_tma_{nn,nt,tn,tt}_{f16,bf16}`, `kernels/matmul/tma.rs`, sm_90
/// build): TMA copies into a `STAGES`-deep mbarrier pipeline, `wgmma` from shared memory, one producer
/// warpgroup and two consumer warpgroups, persistent CTAs.
///
/// Design notes:
/// - CTA tile `BM x BN = 128 x 256`, `BK = 64`-deep k-tiles: each consumer warpgroup owns 64 rows of
///   C as one m64n256 accumulator (128 f32 a thread) and issues four k16 wgmma a k-tile.
/// - A stage is A's tile (16 KiB) and B's tile (32 KiB), both 128-byte-swizzled in the layout the wgmma
///   descriptors read; the tensor maps' boxes are 64 elements wide (one swizzle panel), so a K-major
///   tile is one box and an MN-major tile one box per 64 columns.
/// - The producer warpgroup gives registers back (`setmaxnreg.dec` to [`PRODUCER_REGS`]), the
///   consumers take them ([`CONSUMER_REGS`]); one producer thread issues every copy.
/// - Epilogue: each consumer writes its 64 x 256 tile in two 64 x 128 halves to its own staging
///   tile ([`STAGING_BYTES`]) and stores each half with TMA without waiting for it, so the copy to
///   global memory overlaps the next tile's first k-tiles.
/// - Persistent: `min(tiles, SMs)` CTAs walk the tiles `blockIdx.x, + gridDim.x, ...` in
///   [`matmul_tc::tile_coords`] order within each batch; the producer runs ahead into the next tile
///   while the consumers store the last one.
/// - Each C element is one thread's fixed sequence of wgmma over k ascending: the same bits on every
///   run.
pub mod matmul_tma {
    pub const BM: u32 = 128;
    pub const BN: u32 = 256;
    pub const BK: u32 = 64;
    pub const STAGES: u32 = 4;
    /// One producer and two consumer warpgroups.
    pub const THREADS: u32 = 384;
    pub const PRODUCER_REGS: u32 = 40;
    pub const CONSUMER_REGS: u32 = 232;
    /// Bytes of one stage: A's `BM x BK` and B's `BN x BK` tiles.
    pub const STAGE_BYTES: u32 = (BM + BN) * BK * 2;
    /// Shared memory of the pipeline (its stages and two 8-byte barriers a stage), rounded up to a
    /// 1024-byte swizzle atom.
    pub const PIPELINE_BYTES: u32 = (STAGES * STAGE_BYTES + 16 * STAGES).next_multiple_of(1024);
    /// One consumer's staging tile for C: 64 rows x 128 columns of 16-bit elements.
    pub const STAGING_BYTES: u32 = 64 * 128 * 2;
    /// Dynamic shared memory: the pipeline, then the two consumers' staging tiles.
    pub const SMEM_BYTES: u32 = PIPELINE_BYTES + 2 * STAGING_BYTES;
    /// Largest M, N or K (TMA coordinates are signed 32-bit).
    pub const MAX_DIM: u64 = (1 << 31) - 256;
    /// Most output tiles of one product times its batch (the persistent loop's u32 tile index).
    pub const MAX_TILES: u64 = u32::MAX as u64 / 2;

    const _: () = assert!(
        crate::params::register_split_fits(THREADS, PRODUCER_REGS, CONSUMER_REGS)
            && SMEM_BYTES <= 227 * 1024
    );

    /// Output tiles of an `m x n` product.
    pub const fn tiles(m: u64, n: u64) -> u64 {
        m.div_ceil(BM as u64) * n.div_ceil(BN as u64)
    }
}

/// The f32 matmul on Hopper tensor cores (`matmul_wg_tf32x3_{n,t}_f32`, `matmul_wg_tf32_{n,t}_f32`,
/// `kernels/matmul/wg_tf32.rs`, sm_90 build): `wgmma` m64n128k8 with tf32 inputs and f32
/// accumulation, the same precisions, split-K and epilogue as `matmul_tf32` (whose tiles it shares,
/// so the split and with it the summation order are the same function of the shape).
///
/// Design notes:
/// - wgmma reads tf32 operands from shared memory only K-major (`imm-trans` exists for 16-bit types
///   alone), and 3xTF32 needs B's low parts there as well. So a first pass
///   (`matmul_wg_split_b_f32`) writes B once as K-major tf32 parts, `hi` (and `lo`) `[batch][N][Kp]`
///   (`Kp` = K rounded up to 4 floats, 16-byte rows); the copy engine then brings A's stored k-tile
///   (f32, either orientation) and B's parts' k-tiles, and each consumer warpgroup reads its A
///   fragments with `ld.shared`, splits them in registers and passes them as wgmma's register
///   operand. Every storage combination runs with one kernel per A orientation.
/// - TF32 with A stored `M x K` skips the register split: A's stored tile is already K-major, so
///   wgmma reads it from shared memory (the tensor core truncates it to tf32) and a stage is
///   released one k-tile later, after the next k-tile's products are queued.
/// - Persistent CTAs (at most one an SM) walk the tiles of every batch entry or depth slice, so
///   the copies of a CTA's next tile run while its consumers store C: the Clifford layers'
///   products are only 16 k-tiles deep, and a fresh CTA a tile paid its fill and store unhidden.
/// - The consumers hand C to the producer warpgroup's idle warps through a staging tile (8-byte
///   shared stores, then two mbarriers) and go on to the next tile's products; those warps add
///   the bias and old C and write 16-byte chunks while the tensor cores work. With both consumers
///   storing C from registers, the tensor cores idled through every tile's store. The staging
///   tile's 68 KiB leave room for three 3xTF32 stages (four TF32).
/// - A batch may gather B (`MatmulTf32::b_gathered`): product `z` reads B's entry from a table,
///   so the per-grade weights of the Clifford `Layer` serve all components in one launch.
/// - Splitting B in shared memory instead (converter warps rewriting each k-tile; 1af17ba) costs
///   shared-memory bandwidth the products need: the wgmma reads of B alone take half of it at the
///   tensor cores' tf32 rate.
/// - 128 x 128 tiles of C, two consumer warpgroups of 64 rows; `BK = 32` floats, one 128-byte
///   swizzle row, so a k8 step of a K-major tile is the same 32-byte descriptor step as a k16 step
///   of 16-bit elements.
/// - 3xTF32 sums each k-tile's 12 products in a fresh register chain from zero and adds that partial
///   to the f32 accumulator with a round-to-nearest add (as `matmul_tf32`): 64 + 64 registers.
/// - TF32 products at least 2048 deep whose wide tiles, 128 x 256, take fewer waves of the SMs
///   run on them (`matmul_wg_tf32w_{n,t}_f32`, [`matmul_wg_tf32::wide`]): each consumer issues
///   m64n256k8. A k-tile then moves 48 KiB of copies and 80 KiB of wgmma reads per 2.1 MFLOP,
///   against 32 and 48 KiB per 1.05 MFLOP on 128 x 128 tiles: at the TF32 rate (about 2,140
///   FLOP a clock an SM) 130 bytes a clock of shared memory against 167, where shared memory
///   serves 128. C still
///   leaves through the 128 x 128 staging tile, one half of the tile's columns after the other.
///   3xTF32 keeps 128 x 128: its partial chain beside a 128-float accumulator does not fit the
///   registers.
pub mod matmul_wg_tf32 {
    pub use super::matmul_tf32::{BK, BM, BN};
    /// Pipeline stages of the 3xTF32 kernels (A and B's two parts a stage) and of the TF32 ones (A
    /// and B's `hi`): what fits beside the C staging tile.
    pub const STAGES_TF32X3: u32 = 3;
    pub const STAGES_TF32: u32 = 4;
    /// One producer warpgroup (thread 0 issues the copies, warps 1-3 store C) and two consumers.
    pub const THREADS: u32 = 384;
    /// The producer warpgroup's threads that store C from the staging tile (warps 1-3).
    pub const STORE_THREADS: u32 = 96;
    pub const PRODUCER_REGS: u32 = 56;
    pub const CONSUMER_REGS: u32 = 224;
    /// Bytes of one f32 tile of `BM` (or `BN`) rows by `BK` floats: A's stored tile and each of
    /// B's parts.
    pub const TILE_BYTES: u32 = BM * BK * 4;
    /// Floats between the rows of the C staging tile: `BN + 8`, 8 banks past a multiple of 32, so
    /// that a half-warp's 8-byte writes (four rows, four column pairs each) meet 16 distinct bank
    /// pairs.
    pub const C_PITCH: u32 = BN + 8;
    /// The C staging tile: `BM` rows of `C_PITCH` floats, which the consumers fill and the store
    /// warps empty while the consumers go on to the next tile.
    pub const C_STAGING_BYTES: u32 = BM * C_PITCH * 4;
    /// The larger of the two rings (tiles and two barriers a stage).
    const RING_BYTES: u32 = {
        let x3 = STAGES_TF32X3 * 3 * TILE_BYTES + 16 * STAGES_TF32X3;
        let x1 = STAGES_TF32 * 2 * TILE_BYTES + 16 * STAGES_TF32;
        if x3 > x1 { x3 } else { x1 }
    };
    /// The pair products' term tables (`WgPairs::k_neg`, then `WgPairs::paths` as word pairs), in
    /// shared memory behind the staging tile's barriers.
    pub const TABLE_BYTES: u32 = 96;
    /// Dynamic shared memory: the ring, the C staging tile, its two barriers (full, empty) and the
    /// pair products' tables.
    pub const SMEM_BYTES: u32 = RING_BYTES + C_STAGING_BYTES + 16 + TABLE_BYTES;
    /// Pipeline stages of the pair-term products (`matmul_wg_pairs_*`: x's and y's tiles, then B's
    /// parts, a stage): the rings fit in [`SMEM_BYTES`] beside the staging tile.
    pub const STAGES_PAIRS_TF32X3: u32 = 2;
    pub const STAGES_PAIRS_TF32: u32 = 3;
    /// Columns of C a wide tile (`matmul_wg_tf32w_*`): rows of B's `hi` part a stage.
    pub const BN_WIDE: u32 = 256;
    /// Pipeline stages of the wide kernels (A, 128 rows, and B's `hi`, 256 rows, a stage).
    pub const STAGES_WIDE: u32 = 3;
    /// Dynamic shared memory of the wide kernels: their ring, the staging tile and its barriers.
    pub const SMEM_BYTES_WIDE: u32 = STAGES_WIDE * (BM + BN_WIDE) * BK * 4
        + 16 * STAGES_WIDE
        + C_STAGING_BYTES
        + 16
        + TABLE_BYTES;
    /// Threads of a `matmul_wg_split_b_f32` block: a 32 x 32 tile of B, 8 rows of 32.
    pub const SPLIT_THREADS: u32 = 256;
    /// Its dynamic shared memory: the 32 x 32 tile at a 33-float pitch.
    pub const SPLIT_SMEM_BYTES: u32 = 32 * 33 * 4;

    const _: () = {
        assert!(BM == 128 && BN == 128 && BK == 32);
        assert!(crate::params::register_split_fits(
            THREADS,
            PRODUCER_REGS,
            CONSUMER_REGS
        ));
        assert!(SMEM_BYTES <= 227 * 1024 && SMEM_BYTES_WIDE <= 227 * 1024);
        assert!(STAGES_PAIRS_TF32X3 * 4 * TILE_BYTES + 16 * STAGES_PAIRS_TF32X3 <= RING_BYTES);
        assert!(STAGES_PAIRS_TF32 * 3 * TILE_BYTES + 16 * STAGES_PAIRS_TF32 <= RING_BYTES);
        assert!(BN_WIDE == 2 * BN);
        assert!(TILE_BYTES.is_multiple_of(1024));
        assert!(C_PITCH % 32 == 8 && STORE_THREADS == 96);
    };

    /// Most output tiles of one launch (the persistent walk's u32 tile index).
    pub const MAX_TILES: u64 = u32::MAX as u64 / 2;

    /// Output tiles `BM x bn` of `entries` (batch entries or depth slices) `m x n` products: the
    /// persistent walk's length.
    pub const fn tiles(m: u64, n: u64, entries: u64, bn: u32) -> u64 {
        m.div_ceil(BM as u64) * n.div_ceil(bn as u64) * entries
    }

    /// The time of a wide tile against a 128 x 128 one, in fifths: twice the work at the rate the
    /// shared-memory count above allows (0.98 of the TF32 rate against 0.77), about 1.6.
    pub const WIDE_TILE_COST_FIFTHS: u64 = 8;

    /// The shallowest product that takes the wide tiles. A wide tile's consumers wait for the store
    /// warps to drain its first column block before they write the second, about 2,000 clocks; on
    /// 16-32 k-tiles that outweighs the products' gain, from 64 k-tiles on it does not
    /// (docs/PERF_NOTES.md, "TF32 on 128 x 256 tiles").
    pub const WIDE_MIN_DEPTH: u64 = 2048;

    /// Whether a TF32 product (one launch: `entries` products `m x n` of depth `k`, on a GPU of
    /// `sms` SMs) takes the wide tiles: at least [`WIDE_MIN_DEPTH`] deep, and when their waves of
    /// persistent CTAs (`ceil(tiles / sms)`), each [`WIDE_TILE_COST_FIFTHS`] of a narrow wave,
    /// take less time than the narrow tiles' waves. A 4096 x 512 product stays narrow (one wave of
    /// 128 tiles against one of 64 twice as long); an 8192 x 512 one goes wide (128 wide tiles in
    /// one wave against 256 narrow ones in two).
    pub const fn wide(m: u64, n: u64, k: u64, entries: u64, sms: u64) -> bool {
        let sms = if sms == 0 { 1 } else { sms };
        let (narrow, wide) = (
            tiles(m, n, entries, BN).div_ceil(sms),
            tiles(m, n, entries, BN_WIDE).div_ceil(sms),
        );
        n > BN as u64 && k >= WIDE_MIN_DEPTH && WIDE_TILE_COST_FIFTHS * wide < 5 * narrow
    }

    /// Floats between the rows of B's parts: K rounded up to whole 16-byte chunks.
    pub const fn parts_pitch(k: u64) -> u64 {
        k.div_ceil(4) * 4
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        #[test]
        fn wide_tiles_where_their_waves_are_shorter() {
            let h100 = 132;
            // (m, n, entries, wide) at depth 2048
            for (m, n, e, want) in [
                (4096, 512, 1, false), // 1 wave either way
                (8192, 512, 1, true),  // 1 against 2
                (4096, 4096, 1, true), // 4 against 8
                (8192, 128, 4, false), // no second column block
                (4096, 512, 4, true),  // batched: 2 against 4
                (128, 256, 1, false),
                (4096, 1536, 1, false), // 2 against 3: 3.2 narrow waves' time
            ] {
                assert_eq!(wide(m, n, 2048, e, h100), want, "{m} x {n} x {e}");
            }
            // Too shallow.
            assert!(!wide(4096, 512, WIDE_MIN_DEPTH - 1, 4, h100));
        }
    }
}

/// Parameters of `matmul_wg_split_b_f32`: B (`K x N`, stored `[k][n]` unless `k_contig`, then
/// `[n][k]`; `ld` floats between stored rows, `stride` between batch entries) written as tf32 parts
/// `hi[z][n][k]` (and `lo` behind them, `batch * n * pitch` floats later, when `passes` is 3) with
/// rows `pitch` floats apart. Grid (ceil(K / 32), ceil(N / 32), batch).
///
/// With `block_rows` > 0 the stored rows are gathered from equal blocks of one allocation: stored
/// row `r` is row `r % block_rows` of block `(block_of >> SPLIT_GATHER_BITS * (r / block_rows)) &
/// 31`, and block `i` starts `i * block_stride` floats in ([`split_b_stored_offset`]). The Clifford
/// fc products' B is the `(N, M)` weight blocks of their paths, one after the other: read this way,
/// no stacked copy of the weights is made.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SplitB {
    pub k: u32,
    pub n: u32,
    pub batch: u32,
    pub k_contig: u32,
    pub passes: u32,
    pub block_rows: u32,
    pub ld: u64,
    pub stride: u64,
    pub pitch: u64,
    pub block_of: u64,
    pub block_stride: u64,
}

// SAFETY: #[repr(C)], six 4-byte fields then five 8-byte fields (offset 24): no padding.
unsafe impl KernelParam for SplitB {}

/// Bits of one block index in [`SplitB::block_of`].
pub const SPLIT_GATHER_BITS: u32 = 5;
/// Most blocks one gathered split reads (the entries of [`SplitB::block_of`]).
pub const SPLIT_GATHER_MAX: usize = (u64::BITS / SPLIT_GATHER_BITS) as usize;

/// Offset (floats, batch entry 0) of stored row `row` of the B that `p` describes: `row * ld`, or,
/// gathered, the row's place in its block.
pub const fn split_b_stored_offset(p: &SplitB, row: u32) -> u64 {
    if p.block_rows == 0 {
        return row as u64 * p.ld;
    }
    let i = row / p.block_rows;
    let block = (p.block_of >> (SPLIT_GATHER_BITS * i)) & ((1 << SPLIT_GATHER_BITS) - 1);
    block * p.block_stride + (row % p.block_rows) as u64 * p.ld
}

/// Parameters of one `matmul_tma_*` launch (A, B and C come as tensor maps: see
/// `host::ops::matmul`). `a_batched` / `b_batched` say whether an operand has a batch dim (0: one
/// matrix broadcast over the batch).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatmulTma {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub batch: u32,
    pub tiles_m: u32,
    pub tiles_n: u32,
    pub a_batched: u32,
    pub b_batched: u32,
}

// SAFETY: #[repr(C)], eight 4-byte fields: no padding.
unsafe impl KernelParam for MatmulTma {}

/// How a kernel reaches the rows of a 16-bit operand in global memory.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowAccess {
    /// Every row starts 16-byte aligned and holds whole 16-byte chunks (base 16-byte aligned,
    /// leading dim and batch stride multiples of 8 elements): `cp.async` / vector stores.
    Chunks16 = 0,
    /// Element by element (a row start is not 16-byte aligned): correct for any layout, slower.
    Elements = 1,
}

/// Parameters of one `matmul_tc_*` launch. The entry point fixes the storage of A (`M x K`, or
/// `K x M` when transposed) and B (`K x N`, or `N x K`); element (r, c) of a stored operand is at
/// `r * ld + c`, batch `z` adds `z * stride_*` (0 broadcasts an operand). C is `M x N`, ld `ldc`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatmulTc {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub a_access: RowAccess,
    pub b_access: RowAccess,
    pub c_access: RowAccess,
    pub lda: u64,
    pub ldb: u64,
    pub ldc: u64,
    pub stride_a: u64,
    pub stride_b: u64,
    pub stride_c: u64,
}

// SAFETY: #[repr(C)], six 4-byte fields then six 8-byte fields (offset 24): no padding; the access
// fields are only built from the enum on the host.
unsafe impl KernelParam for MatmulTc {}

/// The f32 matmul on tensor cores (`matmul_tf32x3_*_f32`, `matmul_tf32_*_f32`,
/// `kernels/matmul/tf32.rs`): `mma.m16n8k8` with tf32 inputs, f32 accumulation. "3xTF32" splits each
/// operand `v = hi + lo` and takes `a b` as `a_lo b_hi + a_hi b_lo + a_hi b_hi` (f32 accuracy, see
/// docs/math/matmul.md); "TF32" takes `a_hi b_hi` alone (10-bit mantissas, as cuBLAS's TF32 mode).
///
/// Design notes:
/// - 128 x 128 tiles of C a block, 8 warps of 64 x 32 (2 along M, 4 along N): per k8 step a warp
///   loads 16 A and 8 B words of fragments and issues 16 (TF32) or 48 (3xTF32) `mma`.
/// - `BK = 32`-deep k-tiles in `STAGES = 3` shared stages filled by 16-byte `cp.async` (a copy whose
///   chunk runs past the matrix reads only the bytes inside and zero-fills the rest, so the tails of
///   M, N and K need no other path). Tiles keep the stored orientation: a k-contiguous tile
///   (`[m][k]`, `[n][k]`) has a row pitch of [`PITCH_K`] = 36 floats, an outer-contiguous one
///   (`[k][m]`, `[k][n]`) [`PITCH_O`] = 136: the fragment reads of a warp, `(row g, k t)` or
///   `(k t, col g)` for `g < 8`, `t < 4`, land on 32 distinct banks in both (4g + t and 8t + g mod 32).
/// - 3xTF32 sums each k-tile's products in a fresh fragment chain from zero (12 `mma` a tile and
///   product), then adds that partial to the f32 accumulator with a round-to-nearest `add`: the
///   tensor core's truncating accumulation then costs about 2 ulp of a 32-term partial, not one ulp
///   per 8 terms over the whole depth. Accumulators and partials are 128 registers a thread, so
///   one block per SM (launch bounds: up to 255 registers).
/// - Split-K for products with few output tiles (weight gradients: C is `N x N`, the depth is the
///   batch): grid z runs `splits` depth slices of `k_per_split` (a multiple of `BK`); each writes
///   its partial tile to a workspace `[splits][M][N]`, and `matmul_splitk_finish_f32` adds the
///   slices in slice order (then the bias and the old C). The split is a function of (M, N, K) only,
///   so the bits do not depend on the device.
pub mod matmul_tf32 {
    pub const BM: u32 = 128;
    pub const BN: u32 = 128;
    pub const BK: u32 = 32;
    pub const STAGES: u32 = 3;
    pub const WARPS_M: u32 = 2;
    pub const WARPS_N: u32 = 4;
    pub const THREADS: u32 = WARPS_M * WARPS_N * 32;
    /// Row pitch (floats) of a k-contiguous shared tile.
    pub const PITCH_K: u32 = BK + 4;
    /// Row pitch (floats) of an outer-contiguous shared tile.
    pub const PITCH_O: u32 = BM + 8;
    /// Floats of one operand's tile in one stage (the larger of the two orientations).
    pub const TILE_FLOATS: u32 = {
        let a = BM * PITCH_K;
        let b = BK * PITCH_O;
        if a > b { a } else { b }
    };
    /// Dynamic shared memory of a block: `STAGES` stages of an A and a B tile.
    pub const SMEM_BYTES: u32 = STAGES * 2 * TILE_FLOATS * 4;
    /// Blocks the split-K heuristic aims to fill (about one per SM of an H100; a constant, so the
    /// split, and with it the bits, is the same on every device).
    pub const TARGET_BLOCKS: u64 = 128;
    /// Least depth a slice keeps (shorter slices cost more in partial traffic than they gain).
    pub const MIN_SPLIT_DEPTH: u64 = 256;
    /// Threads a block of `matmul_splitk_finish_f32`.
    pub const FINISH_THREADS: u32 = 256;

    const _: () = {
        assert!(BM == WARPS_M * 64 && BN == WARPS_N * 32);
        // 16-byte rows for cp.async in both orientations.
        assert!(PITCH_K.is_multiple_of(4) && PITCH_O.is_multiple_of(4));
        // Every thread issues whole 16-byte copies: BM * BK / 4 chunks an operand.
        assert!((BM * BK / 4).is_multiple_of(THREADS) && (BN * BK / 4).is_multiple_of(THREADS));
        assert!(SMEM_BYTES <= 160 * 1024);
    };

    /// `(splits, k_per_split)` for a single (unbatched) `m x n x k` product: as many depth slices as
    /// bring the block count near [`TARGET_BLOCKS`], each at least [`MIN_SPLIT_DEPTH`] deep and a
    /// multiple of `BK`. `(1, k)` when the tiles alone fill the target.
    pub const fn split_k(m: u64, n: u64, k: u64) -> (u32, u32) {
        let tiles = m.div_ceil(BM as u64) * n.div_ceil(BN as u64);
        let want = if tiles >= TARGET_BLOCKS {
            1
        } else {
            TARGET_BLOCKS / tiles
        };
        let most = k / MIN_SPLIT_DEPTH;
        let splits = if want < most { want } else { most };
        if splits <= 1 || k > u32::MAX as u64 {
            return (
                1,
                if k > u32::MAX as u64 {
                    u32::MAX
                } else {
                    k as u32
                },
            );
        }
        let kps = k.div_ceil(splits).div_ceil(BK as u64) * BK as u64;
        (k.div_ceil(kps) as u32, kps as u32)
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        #[test]
        fn split_k_covers_the_depth_in_whole_k_tiles() {
            // Weight gradients of the Clifford layer: 512 x 512 outputs, depth 2 * 4096.
            assert_eq!(split_k(512, 512, 8192), (8, 1024));
            assert_eq!(split_k(4096, 4096, 4096), (1, 4096));
            for (m, n, k) in [
                (512, 512, 24576),
                (1, 1, 100_000),
                (128, 128, 257),
                (200, 300, 9999),
            ] {
                let (s, kps) = split_k(m, n, k);
                assert!(s >= 1);
                if s > 1 {
                    assert!((kps as u64).is_multiple_of(BK as u64), "({m}, {n}, {k})");
                    assert!((s as u64 - 1) * (kps as u64) < k && s as u64 * kps as u64 >= k);
                    assert!(kps as u64 >= MIN_SPLIT_DEPTH);
                }
            }
        }
    }
}

/// Parameters of one tensor-core f32 matmul launch (`matmul_tf32*_f32`): the product as [`Matmul`]
/// describes it, and its depth split. With `splits > 1` (only for a single product) grid z is the
/// slice, slice `s` covers depths `s * k_per_split ..` and writes its partial tile to the workspace;
/// `matmul_splitk_finish_f32` (same parameters) then writes C.
///
/// `b_gathered` (read by the sm_90 kernels only; the host sets it for them alone): when 1, product
/// `z` (< 16) multiplies B's batch entry `(b_entry_of >> 4 z) & 15` instead of entry `z`: several
/// products share one B (the Clifford layers' per-grade weights over the components) in one launch.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MatmulTf32 {
    pub mm: Matmul,
    pub splits: u32,
    pub k_per_split: u32,
    pub b_gathered: u32,
    /// Products (grid z of the sm_80 kernels; the sm_90 kernels' persistent walk covers them).
    pub batch: u32,
    pub b_entry_of: u64,
}

impl MatmulTf32 {
    /// Most products of one launch with a gathered B (4-bit entries of `b_entry_of`).
    pub const MAX_GATHERED: usize = 16;

    /// B's batch entry for product `z`.
    #[inline(always)]
    pub fn b_entry(&self, z: u32) -> u32 {
        if self.b_gathered != 0 {
            ((self.b_entry_of >> (4 * (z % 16))) & 15) as u32
        } else if self.mm.stride_b != 0 {
            z
        } else {
            0
        }
    }
}

unsafe impl KernelParam for MatmulTf32 {}

/// Parameters of `matmul_wg_pairs_{tf32x3,tf32}_f32`: the Clifford fc forward's feature mixing as
/// one product whose A is built from pair terms in shared memory (`kernels/matmul/wg_tf32.rs`,
/// `Pairs`). Product `z` is output component `z` of `(C, B, M)`:
/// `out[z][b][m] = sum_t sum_n s_t x[t][b][n] y[k_t][b][n] W[p_t][n][m]` over its C terms `t`
/// (term `t` takes x's component `t`; its y component `k_t`, sign `s_t` and weight path `p_t` come
/// from the tables below), the weights `W (P, N, M)` as tf32 parts of `matmul_wg_split_b_f32`.
///
/// `mm` describes the output as the products' C: `m` = B, `n` = M, `k` = C terms x `k_tiles` x BK
/// (the walk's depth: k-tile `i` is term `i / k_tiles`, features `BK (i % k_tiles) ..`),
/// `batch` = C, `ldc` = M, `stride_c` = B M, `splits` 1, never accumulating.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WgPairs {
    pub mm: MatmulTf32,
    /// k-tiles of one term: ceil(N / BK).
    pub k_tiles: u32,
    pub _pad: u32,
    /// Per output component, 4 bits a term (term `t` at bit `4 t`): y's component (3 bits) and
    /// the sign (bit 3: negative).
    pub k_neg: [u32; 8],
    /// Per output component, [`WG_PAIRS_PATH_BITS`] bits a term: its weight path.
    pub paths: [u64; 8],
}

// SAFETY: #[repr(C)], `MatmulTf32` (96 bytes, 8-aligned), two 4-byte fields, eight 4-byte fields
// (offset 104) and eight 8-byte fields (offset 136): no padding.
unsafe impl KernelParam for WgPairs {}

/// Bits of one term's path in [`WgPairs::paths`] (20 paths in 3D).
pub const WG_PAIRS_PATH_BITS: u32 = 5;
