//! Norm/embedding family (`kernels/layer_norm.rs`, `kernels/embedding.rs`,
//! `host::ops::{layer_norm, embedding}`).

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
        crate::params::row_block(cols, NARROW_PER_THREAD, MAX_BLOCK)
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
        crate::params::row_block(cols, CACHE_PER_THREAD, MAX_BLOCK)
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
        crate::params::row_block(cols, BWD_CACHE, BWD_MAX_BLOCK)
    }
}
