//! Launch parameters and launch constants, defined once for the kernel and its host launcher.
//!
//! Every struct here is `#[repr(C)]` and passed to a kernel by value; the host wraps it in
//! `host::launch::ByValue` which is only implemented for types that implement [`KernelParam`].

/// Marker for plain-old-data launch parameters.
///
/// # Safety
/// Implement only for `#[repr(C)]` structs of integers/floats/arrays of them with no padding the
/// kernel reads, so the bytes the host writes are the bytes the kernel reads.
pub unsafe trait KernelParam: Copy {}

/// Highest tensor rank the strided (broadcasting) kernels index.
pub const MAX_DIMS: usize = 6;

/// Shape and element strides of a strided binary op `out = a (op) b` over a contiguous `out`.
/// Broadcast dimensions have stride 0. Shapes are right-aligned in the arrays: unused leading dims have
/// extent 1 (and stride 0), so kernels loop over all `MAX_DIMS` with constant indices.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Broadcast2 {
    pub numel: u64,
    pub shape: [u64; MAX_DIMS],
    pub a_strides: [u64; MAX_DIMS],
    pub b_strides: [u64; MAX_DIMS],
}
unsafe impl KernelParam for Broadcast2 {}

/// `out[o] = sum over the reduced dims of grad[...]`: used for the gradient of a broadcast operand.
/// `out_shape` has the full rank of `grad` with 1 on every reduced dim; `red_shape` has 1 on every kept
/// dim and the full extent on every reduced one; `grad_strides` are the contiguous strides of `grad`.
/// Right-aligned like [`Broadcast2`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReduceTo {
    pub out_numel: u64,
    pub red_numel: u64,
    pub out_shape: [u64; MAX_DIMS],
    pub red_shape: [u64; MAX_DIMS],
    pub grad_strides: [u64; MAX_DIMS],
}
unsafe impl KernelParam for ReduceTo {}

/// Threads for a block that covers a row of `cols` elements at `per_thread` elements a thread: a power
/// of two from one warp (32) up to `max_block`. Shared by the row kernels (softmax, layer norm, the
/// embedding backward), which hold the row in registers when it fits and loop otherwise.
pub const fn row_block(cols: u64, per_thread: u32, max_block: u32) -> u32 {
    let need = cols.div_ceil(per_thread as u64);
    let mut t: u64 = 32;
    while t < need && t < max_block as u64 {
        t *= 2;
    }
    t as u32
}

/// Elementwise kernels.
pub mod elementwise {
    /// Threads per block for every elementwise kernel.
    pub const BLOCK: u32 = 256;
    /// 16-byte chunks of each operand a thread loads before it stores, in one trip, in the contiguous
    /// binary kernels (and chunks a thread covers in the grid of every vectorised kernel).
    pub const CHUNKS_PER_THREAD: u32 = 2;
    /// Chunks a thread of the contiguous binary kernels (add, sub, mul, div) loads from each operand:
    /// one. Measured on an H200 (docs/results/2026-11-26, run r3), 8192^2 f32 add into a preallocated
    /// output: 256 threads x 1 chunk 0.1864 ms, x 2 chunks 0.1879, 128 x 1 0.1864, 512 x 1 0.1867,
    /// 512 x 2 0.1876 (f16/bf16 the same to 0.0001 ms); PyTorch eager 0.1871 in that run.
    pub const BINARY_CHUNKS_PER_THREAD: u32 = 1;
    /// Bytes in one vector access: `ld.global.v4.b32`.
    pub const VECTOR_BYTES: usize = 16;
}

/// Reductions over the last dimension and over all elements.
pub mod reduce {
    /// Threads per block for row reductions and both stages of the full reduction.
    pub const BLOCK: u32 = 256;
    /// Fixed number of partial sums of the first stage of a full reduction (upper bound). Fixed so that
    /// the summation order depends only on the element count: the same bits on every run.
    pub const MAX_PARTIALS: u32 = 1024;
    /// Elements each first-stage block covers at least, so small inputs use few blocks.
    pub const MIN_ELEMS_PER_BLOCK: u64 = 8192;
}

/// Softmax over the last dimension.
pub mod softmax {
    /// Elements each thread keeps in registers on the single-read path.
    pub const CACHE_PER_THREAD: u32 = 16;
    /// Most threads in a block. 512, not 1024: the kernels use 70-80 registers per thread and a block
    /// of 1024 would exceed the 64K registers of an SM (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES); Rust has no
    /// `__launch_bounds__` to make the compiler fit 1024.
    pub const MAX_BLOCK: u32 = 512;
    /// Longest row held in registers (read once, written once); longer rows are read twice.
    pub const MAX_CACHED_COLS: u64 = (CACHE_PER_THREAD * MAX_BLOCK) as u64;

    /// Threads for a row of `cols` elements: enough to cover the row with `CACHE_PER_THREAD` elements
    /// each, a power of two between one warp and `MAX_BLOCK`.
    pub const fn block_for(cols: u64) -> u32 {
        super::row_block(cols, CACHE_PER_THREAD, MAX_BLOCK)
    }
}

/// Layer norm over the last dimension (`kernels/layer_norm.rs`, `host::ops::layer_norm`).
///
/// Forward and backward: one block per row, the row in registers (`CACHE_PER_THREAD` elements a thread)
/// up to `MAX_CACHED_COLS`, two passes over memory beyond. The backward folds dgamma/dbeta of a chunk of
/// `rows_per_chunk(rows)` rows per block into one partial row (registers on the cached path), and a
/// second kernel adds the partials in chunk order: the same bits on every run.
pub mod layer_norm {
    /// Elements each thread keeps in registers on the single-read path.
    pub const CACHE_PER_THREAD: u32 = 16;
    /// Most threads in a row block (the launch bound written into the PTX).
    pub const MAX_BLOCK: u32 = 512;
    /// Longest row held in registers.
    pub const MAX_CACHED_COLS: u64 = (CACHE_PER_THREAD * MAX_BLOCK) as u64;
    /// Elements a thread of the narrow backward holds: rows up to `NARROW_MAX_COLS` get four times
    /// the threads, and registers to spare for the next row's loads (the 16-element backward put 64
    /// threads on a row of 1024, one row in flight: latency bound at 0.30 of copy bandwidth).
    pub const NARROW_PER_THREAD: u32 = 4;
    pub const NARROW_MAX_COLS: u64 = (NARROW_PER_THREAD * MAX_BLOCK) as u64;
    /// Threads for a row of `cols` at `NARROW_PER_THREAD` elements a thread.
    pub const fn narrow_block_for(cols: u64) -> u32 {
        super::row_block(cols, NARROW_PER_THREAD, MAX_BLOCK)
    }
    /// Rows a block of the pipelined backward has in flight (`cp.async` stages: this row plus
    /// `PIPE_STAGES - 1` ahead). At most 4 (`cp.async.wait_group` takes at most 3).
    pub const PIPE_STAGES: u32 = 4;
    /// Most threads of the pipelined backward (one 16-byte chunk of a row each): rows up to 2048 f32
    /// or 4096 f16/bf16 elements.
    pub const PIPE_MAX_BLOCK: u32 = 512;
    /// Dynamic shared memory of the pipelined backward with `threads` threads: x and dy, one 16-byte
    /// chunk a thread, per stage.
    pub const fn pipe_smem_bytes(threads: u32) -> u32 {
        PIPE_STAGES * 2 * threads * 16
    }
    const _: () = assert!(PIPE_STAGES >= 2 && PIPE_STAGES <= 4);
    /// Default epsilon added to the variance.
    pub const DEFAULT_EPS: f32 = 1e-5;
    /// Most dgamma/dbeta partial rows (blocks of the block-per-row backward). A constant, not the SM
    /// count, so that kernel's summation order depends on the shape only (the warp-per-row backward,
    /// the default where it applies, has one partial row per resident block instead).
    pub const MAX_CHUNKS: u64 = 2048;
    /// Fewest rows one backward block folds into its partial row.
    pub const MIN_ROWS_PER_CHUNK: u64 = 16;
    /// Threads of the partial-sum kernel: `FINISH_COLS` columns (one per lane) x `FINISH_WARPS` warps
    /// that split the chunks.
    pub const FINISH_COLS: u32 = 32;
    /// 16 warps (each with eight loads in flight): at 8 warps x 4 loads, the 32 blocks that 1024 columns
    /// give read the 16 MiB of partials (65536 rows: 2048 partial rows) at about 0.25 TB/s.
    pub const FINISH_WARPS: u32 = 16;
    pub const FINISH_BLOCK: u32 = FINISH_COLS * FINISH_WARPS;

    /// Threads for a row of `cols` elements: a power of two between one warp and `MAX_BLOCK` covering
    /// the row at `CACHE_PER_THREAD` elements a thread.
    pub const fn block_for(cols: u64) -> u32 {
        super::row_block(cols, CACHE_PER_THREAD, MAX_BLOCK)
    }
    /// Rows per backward block for `rows` rows: a function of the row count only.
    pub const fn rows_per_chunk(rows: u64) -> u64 {
        let r = rows.div_ceil(MAX_CHUNKS);
        if r > MIN_ROWS_PER_CHUNK {
            r
        } else {
            MIN_ROWS_PER_CHUNK
        }
    }
    /// Backward blocks (= partial rows) for `rows` rows (at least 1).
    pub const fn chunks(rows: u64) -> u64 {
        let c = rows.div_ceil(rows_per_chunk(rows));
        if c == 0 { 1 } else { c }
    }
    const _: () = assert!(chunks(1 << 40) <= MAX_CHUNKS && chunks(1) == 1 && chunks(16) == 1);
    const _: () = assert!(FINISH_COLS == 32 && FINISH_BLOCK <= MAX_BLOCK);

    /// Warp-per-row backward (variants, `kernels::layer_norm::backward_warp`): elements of a row one
    /// lane holds, as 16-byte chunks `lane, lane + 32, ...` (f32: 8 chunks of 4; f16/bf16: 4 of 8).
    pub const WARP_LANE_ELEMS: u32 = 32;
    /// Longest row the warp-per-row backward takes (one warp of `WARP_LANE_ELEMS` a lane).
    pub const WARP_MAX_COLS: u64 = (32 * WARP_LANE_ELEMS) as u64;
    /// Most warps in a block of the warp-per-row backward (its launch bound: 256 threads).
    pub const WARP_MAX_WARPS: u32 = 8;
    /// Dynamic shared memory of the warp-per-row backward with `warps` warps, `stages` rows of x and dy
    /// per warp, rows of `row_chunks` 16-byte chunks and `cols` elements: the `cp.async` stages
    /// (`stages` x {x, dy} x `ceil(row_chunks / 32)` chunks a lane), or, when larger, the end-of-kernel
    /// fold of the warps' dgamma/dbeta (`2 x warps x cols` f32), which reuses the same bytes.
    pub const fn warp_smem_bytes(warps: u32, stages: u32, row_chunks: u64, cols: u64) -> u64 {
        let stages_bytes = warps as u64 * stages as u64 * 2 * row_chunks.div_ceil(32) * 32 * 16;
        let fold_bytes = 2 * warps as u64 * cols * 4;
        if stages_bytes > fold_bytes {
            stages_bytes
        } else {
            fold_bytes
        }
    }
    // 1024 f32 columns, 4 warps, 2 stages: 64 KiB, three blocks an SM.
    const _: () = assert!(warp_smem_bytes(4, 2, 256, 1024) == 64 * 1024);
}

/// Embedding lookup (`kernels/embedding.rs`, `host::ops::embedding`).
pub mod embedding {
    /// Threads per block of the gather (one warp per output row, `BLOCK / 32` rows per block in flight).
    pub const BLOCK: u32 = 256;
    /// Threads per block of the id check.
    pub const CHECK_BLOCK: u32 = 256;
    /// Most blocks of the id check (grid-stride beyond).
    pub const CHECK_MAX_BLOCKS: u64 = 1024;
    /// Columns each thread of the backward accumulates in registers per column tile.
    pub const BWD_CACHE: u32 = 8;
    /// Most threads of a backward block (one block per row of dW).
    pub const BWD_MAX_BLOCK: u32 = 256;
    /// Threads for a backward row of `cols` columns: a power of two from 32 to `BWD_MAX_BLOCK`.
    pub const fn bwd_block_for(cols: u64) -> u32 {
        super::row_block(cols, BWD_CACHE, BWD_MAX_BLOCK)
    }
}

/// Kinds of binary op, as the kernels number them.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add = 0,
    Sub = 1,
    Mul = 2,
    Div = 3,
}

/// A device buffer as a kernel receives it: pointer and element count, passed by value together
/// (matches `dev::mem::Slice<T>` / `SliceMut<T>` bit for bit; a const assertion there checks it).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RawSlice {
    pub ptr: u64,
    pub len: u64,
}
unsafe impl KernelParam for RawSlice {}

/// Relevance propagation through a linear layer (`kernels/lrp.rs`, `host::ops::lrp`).
///
/// Three tiled GEMM-shaped kernels share one tile configuration: `lrp_sums` (per row and output: the
/// sums `A = sum |x||W|` and `S = sum x W`, from which `P = (A+S)/2`, `N = (A-S)/2`), `dense` (the forward
/// `x W^T`) and `lrp_spread` (`G = coef |W|`). A block computes a `BM x BN` tile of the output over one
/// slice of the depth (split-K); each split writes its own partial tile to a workspace, and an
/// elementwise kernel adds the splits in split order. The split count is a function of the shape alone,
/// so every run adds in the same order: the same bits every run.
///
/// The products run on the tensor cores as "3xTF32" (`mma.m16n8k8` with tf32 inputs, each f32 operand
/// split into a tf32 high part and a tf32 remainder; see `dev::mma::split_tf32`): fp32-level accuracy at
/// several times the FFMA rate. Each warp owns a `WARP_M x WARP_N` piece of the block tile as
/// `M_TILES x N_TILES` mma tiles of 16 x 8; the fragment addressing is below, as const fns the host
/// unit-tests against the PTX ISA's fragment definition.
pub mod lrp {
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
    const _: () = assert!(WARP_M % MMA_M == 0 && WARP_N % MMA_N == 0 && BK % MMA_K == 0);
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
    pub const fn acc_coords(
        warp: usize,
        lane: usize,
        mi: usize,
        ni: usize,
        r: usize,
    ) -> (u64, u64) {
        let m = (warp / WARPS_N as usize) * WARP_M as usize
            + mi * MMA_M as usize
            + lane / 4
            + 8 * (r >> 1);
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
        pub const fn frag_a_offset(
            warp: usize,
            lane: usize,
            mi: usize,
            s: usize,
            h: usize,
        ) -> usize {
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
            2 * (lane % 4) * KN_STRIDE as usize
                + (warp % WARPS_N as usize) * WARP_N as usize
                + lane / 4
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
                                        assert!(
                                            off.is_multiple_of(2) && off + 1 < STAGE_A as usize
                                        );
                                        let row = wm + 16 * mi + g + 8 * h;
                                        // ISA: a0 / a1 at slot t, a2 / a3 at slot t + 4.
                                        assert_eq!(decode_nk(off), (row, slot_depth(s, t, 0)));
                                        assert_eq!(decode_nk(off + 1), (row, slot_depth(s, t, 1)));
                                        let p = (off / 2) % 16;
                                        assert!(
                                            !pairs[p],
                                            "A bank conflict w{warp} s{s} mi{mi} h{h}"
                                        );
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
                                            acc[lane][r] += (0..8)
                                                .map(|k| ta[row][k] * tb[k][col])
                                                .sum::<i64>();
                                        }
                                    }
                                }
                                for lane in 0..32 {
                                    for r in 0..4 {
                                        let (m, n) =
                                            super::super::acc_coords(warp, lane, mi, ni, r);
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
                    assert!(
                        !v.is_normal() || rest.abs() as f64 <= (v.abs() as f64) * 2f64.powi(-11)
                    );
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
                            let mut banks = vec![false; 32];
                            for lane in 0..32 {
                                let (g, t) = (lane / 4, lane % 4);
                                let off = frag_a_offset(warp, lane, mi, ks, r);
                                assert!(off < STAGE_A);
                                // ISA: a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4).
                                let row = wm + 16 * mi + g + if r == 1 || r == 3 { 8 } else { 0 };
                                let col = ks + t + if r >= 2 { 4 } else { 0 };
                                assert_eq!(
                                    decode(off, A_STRIDE),
                                    (row, col),
                                    "A w{warp} l{lane} r{r}"
                                );
                                assert!(!banks[off % 32], "A bank conflict");
                                banks[off % 32] = true;
                            }
                        }
                    }
                    for ni in 0..N_TILES {
                        for r in 0..2 {
                            let mut banks = vec![false; 32];
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
}

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

/// Attention (naive and FlashAttention forward): the shape parameters and each kernel's one config.
pub mod attention {
    use super::KernelParam;
    use crate::layout::{TileLayout, Xor8};

    /// Which keys each query sees.
    #[repr(u32)]
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum MaskKind {
        /// Every query sees every key.
        None = 0,
        /// Query `i` sees key `j` iff `j <= i + seq_k - seq_q` (causal, aligned to the bottom-right
        /// corner of the score matrix when `seq_q != seq_k`, as PyTorch and FlashAttention do).
        Causal = 1,
    }

    /// Shapes and options of one attention launch. Q and O are `[batch, heads, seq_q, head_dim]`,
    /// K and V `[batch, heads, seq_k, head_dim]`, LSE `[batch, heads, seq_q]`, all contiguous.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, PartialEq)]
    pub struct AttentionShape {
        pub batch: u32,
        pub heads: u32,
        pub seq_q: u32,
        pub seq_k: u32,
        pub head_dim: u32,
        pub mask: MaskKind,
        /// Multiplies `Q K^T` before the softmax (default `1 / sqrt(head_dim)`).
        pub scale: f32,
        /// First (batch * heads + head) index of this launch (the naive path launches in chunks).
        pub bh_offset: u32,
    }
    // SAFETY: #[repr(C)], eight 4-byte fields, no padding; `mask` is always a valid discriminant
    // (only built from the enum on the host).
    unsafe impl KernelParam for AttentionShape {}

    /// The largest sequence length either path accepts: keeps every in-head index and the
    /// `i + seq_k - seq_q` causal limit inside i32.
    pub const MAX_SEQ: usize = 1 << 30;

    /// The compile-time configuration of one FlashAttention forward kernel. The kernel reads it as
    /// const generics and asserts its shared-memory plan matches [`FlashConfig::smem_bytes`]; the
    /// host launcher reads the same values for the grid, block and shared-memory size.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct FlashConfig {
        pub head_dim: usize,
        /// Query rows per CTA (16 per warp).
        pub block_q: usize,
        /// Keys per K/V tile.
        pub block_k: usize,
        /// K/V pipeline depth (2 = double buffering).
        pub stages: usize,
    }

    impl FlashConfig {
        /// Warps per CTA: each owns 16 query rows.
        pub const fn warps(&self) -> usize {
            self.block_q / 16
        }
        pub const fn threads(&self) -> usize {
            self.warps() * 32
        }
        /// Dynamic shared memory: the Q tile, then `stages` K tiles, then `stages` V tiles (the
        /// order the kernel carves them in), 16-bit elements, swizzled rows of `head_dim`.
        pub const fn smem_bytes(&self) -> usize {
            self.block_q * self.head_dim * 2 + 2 * self.stages * self.block_k * self.head_dim * 2
        }
    }

    /// Tuning notes (design rationale; no measurements yet — the integrator's H100 benchmark is the
    /// judge, and changing these numbers is all a re-tune needs):
    /// - 128 query rows and 8 warps per CTA (16 rows per warp) rather than 64 and 4: every K/V tile
    ///   brought into shared memory then feeds 8 warps, halving L2->SM traffic per FLOP (at S = 2048,
    ///   D = 128, 64-row blocks need about 5.5 TB/s of L2 bandwidth at 350 TFLOP/s; 128-row blocks
    ///   half that), and the B=4,H=8,S=512 seed shape gives 128 CTAs, one wave on 132 SMs.
    /// - 64-key tiles: with 16 rows per warp the S tile is 32 f32 registers per thread and the D=128
    ///   accumulator 64, leaving room for Q's fragments (32) without spills.
    /// - 2 stages: K(j+1) loads during S(j) and P V(j); V(j+1) during P V(j) and S(j+1).
    pub const FLASH_D64: FlashConfig = FlashConfig {
        head_dim: 64,
        block_q: 128,
        block_k: 64,
        stages: 2,
    };
    pub const FLASH_D128: FlashConfig = FlashConfig {
        head_dim: 128,
        block_q: 128,
        block_k: 64,
        stages: 2,
    };

    /// The FlashAttention config for a head dimension, or `None` if there is no kernel for it.
    pub const fn flash_config(head_dim: usize) -> Option<FlashConfig> {
        match head_dim {
            64 => Some(FLASH_D64),
            128 => Some(FLASH_D128),
            _ => None,
        }
    }

    /// Head dims with a FlashAttention kernel.
    pub const FLASH_HEAD_DIMS: [usize; 2] = [64, 128];

    // The configs' shared-memory plans, recomputed from the tile layouts the kernel uses.
    const _: () = {
        type D64Q = TileLayout<u16, { FLASH_D64.block_q }, { FLASH_D64.head_dim }, Xor8>;
        type D64K = TileLayout<u16, { FLASH_D64.block_k }, { FLASH_D64.head_dim }, Xor8>;
        type D128Q = TileLayout<u16, { FLASH_D128.block_q }, { FLASH_D128.head_dim }, Xor8>;
        type D128K = TileLayout<u16, { FLASH_D128.block_k }, { FLASH_D128.head_dim }, Xor8>;
        assert!(FLASH_D64.smem_bytes() == D64Q::BYTES + 2 * FLASH_D64.stages * D64K::BYTES);
        assert!(FLASH_D128.smem_bytes() == D128Q::BYTES + 2 * FLASH_D128.stages * D128K::BYTES);
    };

    /// The Hopper (`wgmma`, sm_90a) FlashAttention forward variant: one config per head dim. Each
    /// consumer warpgroup (128 threads) owns 64 query rows (wgmma M = 64); `block_q / 64` of them
    /// share each K/V tile. Q, K and V tiles use the 128-byte-swizzle layout of
    /// [`crate::layout::sw128`] (what wgmma descriptors read), so every tile is a multiple of 1024
    /// bytes and the carve keeps them 1024-aligned.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct FlashWgmmaConfig {
        pub head_dim: usize,
        /// Query rows per CTA (64 per warpgroup).
        pub block_q: usize,
        /// Keys per K/V tile (the N of `S = Q K^T`, the K of `O += P V`).
        pub block_k: usize,
        /// K/V pipeline depth (the kernel is written for 2).
        pub stages: usize,
        /// The launch bound's CTAs per SM (its `launch_bounds!`): 2 caps registers at 128 a thread.
        pub min_blocks: u32,
    }

    impl FlashWgmmaConfig {
        pub const fn warpgroups(&self) -> usize {
            self.block_q / 64
        }
        pub const fn threads(&self) -> usize {
            self.warpgroups() * 128
        }
        /// Dynamic shared memory: the Q tile, then `stages` K tiles, then `stages` V tiles.
        pub const fn smem_bytes(&self) -> usize {
            (self.block_q + 2 * self.stages * self.block_k) * self.head_dim * 2
        }
    }

    /// Tuning notes (design rationale, not measured yet):
    /// - D = 64: 64-key tiles keep S at 32 f32 a thread (O 32, P 16), so two CTAs of 256 threads fit
    ///   an SM at 128 registers, and one CTA's softmax overlaps the other's wgmma; 48 KiB a CTA.
    /// - D = 128: 128-key tiles (S 64 f32, O 64, P 32 a thread, up to 255 registers at one CTA per
    ///   SM): each K/V tile feeds two 64 x 128 x 128 products per warpgroup; 160 KiB a CTA.
    pub const FLASH_WG_D64: FlashWgmmaConfig = FlashWgmmaConfig {
        head_dim: 64,
        block_q: 128,
        block_k: 64,
        stages: 2,
        min_blocks: 2,
    };
    pub const FLASH_WG_D128: FlashWgmmaConfig = FlashWgmmaConfig {
        head_dim: 128,
        block_q: 128,
        block_k: 128,
        stages: 2,
        min_blocks: 1,
    };

    /// D = 64 with one consumer warpgroup (64 query rows, 128 threads) and 128-key tiles (entry points
    /// `flash_wg4_fwd_d64_*`): the overlapped schedule, per-thread state S 64, O 32, P 32 f32, in half
    /// the CTA of [`FLASH_WG_D64`], so short sequences launch twice the CTAs (B4 H8
    /// S512: 256 on 132 SMs) and several share an SM, overlapping one CTA's load latency with
    /// another's math. 72 KiB a CTA: 3 fit sm_90's 228 KiB, so the launch bound asks for 3 (up to
    /// 168 registers a thread).
    pub const FLASH_WG_D64_Q64: FlashWgmmaConfig = FlashWgmmaConfig {
        head_dim: 64,
        block_q: 64,
        block_k: 128,
        stages: 2,
        min_blocks: 3,
    };

    /// Every wgmma config a kernel is instantiated with.
    pub const FLASH_WG_CONFIGS: [FlashWgmmaConfig; 3] = [FLASH_WG_D64, FLASH_WG_D128, FLASH_WG_D64_Q64];

    /// The wgmma variants' default config for a head dimension (variants 1 and 2).
    pub const fn flash_wgmma_config(head_dim: usize) -> Option<FlashWgmmaConfig> {
        match head_dim {
            64 => Some(FLASH_WG_D64),
            128 => Some(FLASH_WG_D128),
            _ => None,
        }
    }

    /// The config of [`FLASH_WG_CONFIGS`] with these tile sizes (what a kernel checks its const
    /// parameters against).
    pub const fn flash_wgmma_config_of(
        head_dim: usize,
        block_q: usize,
        block_k: usize,
    ) -> Option<FlashWgmmaConfig> {
        let mut i = 0;
        while i < FLASH_WG_CONFIGS.len() {
            let c = FLASH_WG_CONFIGS[i];
            if c.head_dim == head_dim && c.block_q == block_q && c.block_k == block_k {
                return Some(c);
            }
            i += 1;
        }
        None
    }

    // Every tile a whole number of 1024-byte swizzle atoms (so consecutive tiles stay 1024-aligned),
    // and the shared memory within sm_90's 227 KiB a block.
    const _: () = {
        let cfgs = FLASH_WG_CONFIGS;
        let mut i = 0;
        while i < cfgs.len() {
            let c = cfgs[i];
            assert!(c.block_q % 64 == 0 && c.block_k % 16 == 0 && c.head_dim % 64 == 0);
            assert!((c.block_q * c.head_dim * 2) % 1024 == 0);
            assert!((c.block_k * c.head_dim * 2) % 1024 == 0);
            assert!(c.stages == 2 && c.smem_bytes() <= 227 * 1024);
            i += 1;
        }
    };

    /// Naive attention: one block per query row.
    pub mod naive {
        /// Threads per block.
        pub const BLOCK: u32 = 128;
        /// Largest head dim (the query row is cached in shared memory as f32).
        pub const MAX_HEAD_DIM: usize = 256;
        /// Most score elements (f32) the scratch buffer of one launch holds; larger problems are
        /// launched in chunks of whole (batch, head) pairs.
        pub const MAX_SCRATCH_ELEMS: usize = 1 << 28;
    }
}

/// Matrix-multiply limits shared by the f32 and tensor-core kernels.
pub mod matmul {
    /// Most blocks along grid y (M tiles) and z (batch) the driver accepts.
    pub const MAX_GRID_YZ: u64 = 65_535;
}

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

/// Clifford-algebra layers on Cl(2,0) and Cl(3,0) (../shared/specs/clifford.md): the product tables,
/// grades and weight paths, shared by the kernels and the host references, and the launch constants.
pub mod clifford {
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

    /// The 2D product, term by term in the spec's order: `t(j, i, k, p, sign)`.
    #[rustfmt::skip]
    pub const TERMS_2D: [Term; 16] = [
        t(0,0,0,0,1), t(0,1,1,3,1), t(0,2,2,3,1), t(0,3,3,7,-1),
        t(1,0,1,1,1), t(1,1,0,4,1), t(1,2,3,5,-1), t(1,3,2,8,1),
        t(2,0,2,1,1), t(2,1,3,5,1), t(2,2,0,4,1), t(2,3,1,8,-1),
        t(3,0,3,2,1), t(3,1,2,6,1), t(3,2,1,6,-1), t(3,3,0,9,1),
    ];
    /// The 3D product, term by term in the spec's order.
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
}
