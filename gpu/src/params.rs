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

/// Elementwise kernels.
pub mod elementwise {
    /// Threads per block for every elementwise kernel.
    pub const BLOCK: u32 = 256;
    /// 16-byte chunks each thread handles per loop trip in the contiguous (vectorised) kernels.
    pub const CHUNKS_PER_THREAD: u32 = 2;
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
        let need = cols.div_ceil(CACHE_PER_THREAD as u64);
        let mut t: u64 = 32;
        while t < need && t < MAX_BLOCK as u64 {
            t *= 2;
        }
        t as u32
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
pub mod lrp {
    /// Output rows per block tile (rows of x / relevance).
    pub const BM: u64 = 64;
    /// Output columns per block tile (outputs j for the sums, inputs i for the spread).
    pub const BN: u64 = 128;
    /// Depth per shared-memory stage.
    pub const BK: u64 = 16;
    /// Threads per block: 8 warps as 2 (rows) x 4 (columns); a warp's lanes as 4 x 8.
    pub const THREADS: u32 = 256;
    pub const WARPS_M: u64 = 2;
    pub const WARPS_N: u64 = 4;
    pub const LANES_M: u64 = 4;
    pub const LANES_N: u64 = 8;
    /// Per-thread register tile.
    pub const TM: u64 = 8;
    pub const TN: u64 = 4;
    /// Shared rows are padded by 4 floats: transposed stores hit distinct banks and rows stay 16-byte
    /// aligned for `ld.shared.v4`.
    pub const PAD: u64 = 4;
    pub const A_STRIDE: u64 = BM + PAD;
    pub const B_STRIDE: u64 = BN + PAD;
    /// Blocks the split-K choice aims for (2 per SM of a 132-SM H100). A constant, not the device's SM
    /// count, so the summation order depends on the shape only.
    pub const TARGET_BLOCKS: u64 = 264;
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
    const _: () = assert!(WARPS_M * LANES_M * TM == BM && WARPS_N * LANES_N * TN == BN);
    const _: () = assert!(LANES_M * LANES_N == 32 && TN == 4 && TM == 8);
    const _: () = assert!(A_STRIDE % 4 == 0 && B_STRIDE % 4 == 0);
    // The tile loaders hard-code these (see kernels/lrp.rs).
    const _: () = assert!(BM == 64 && BN == 128 && BK == 16 && THREADS == 256);

    /// `(splits, k_per_split)` for an `m x n` output over depth `k`: enough splits that the grid has
    /// about `TARGET_BLOCKS` blocks, each split at least `MIN_K_PER_SPLIT` deep (a multiple of `BK`), and
    /// no empty split.
    pub const fn split_k(m: u64, n: u64, k: u64) -> (u64, u64) {
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
        let kps = k.div_ceil(splits).div_ceil(BK) * BK;
        let kps = if kps == 0 { BK } else { kps };
        let splits = k.div_ceil(kps);
        (if splits == 0 { 1 } else { splits }, kps)
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
