//! Attention (naive, FlashAttention forward and backward): the shape parameters and each kernel's
//! one config.
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
/// K and V `[batch, kv_heads, seq_k, head_dim]`, LSE `[batch, heads, seq_q]`, all contiguous. Query
/// head `h` reads key/value head `h / (heads / kv_heads)` (grouped-query attention; `kv_heads =
/// heads` is multi-head attention).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionShape {
    pub batch: u32,
    pub heads: u32,
    /// Key/value heads: divides `heads`.
    pub kv_heads: u32,
    /// Backward launches take one query head of each group (see [`AttentionShape::bwd_heads`]):
    /// which one, `0..heads / kv_heads`; or, for the wgmma backward only, [`GROUP_ALL`]: each CTA
    /// walks every query head of its key/value head's group in turn.
    pub group_member: u32,
    pub seq_q: u32,
    pub seq_k: u32,
    pub head_dim: u32,
    pub mask: MaskKind,
    /// Multiplies `Q K^T` before the softmax (default `1 / sqrt(head_dim)`).
    pub scale: f32,
    /// First (batch * heads + head) index of this launch (the naive path launches in chunks).
    pub bh_offset: u32,
    /// A sliding window (the wgmma FlashAttention kernels): query `i` sees key `j` only if
    /// `i + diag - window_left <= j <= i + diag + window_right`, with `diag = seq_k - seq_q` of its
    /// sequence (the causal mask's alignment; the causal mask caps the right side at 0).
    /// [`NO_WINDOW`]: unbounded on that side.
    pub window_left: u32,
    pub window_right: u32,
    /// A logit softcap `c > 0` (the sm_90 kernels: each score `s = scale q . k` becomes `c tanh(s /
    /// c)` before the softmax) in the kernels' raw-score units, `k = c / |scale|` (the scale
    /// clamped to at least 1e-30; `k tanh(s / k)` is even in `k`, so the backward's signed raw units
    /// take it too), and its inverse; both 0 without a softcap. From the host
    /// ([`AttentionShape::softcap_raw`]), so that the backward reads them from the parameters
    /// rather than holding registers for them.
    pub softcap_k: f32,
    pub softcap_inv_k: f32,
}
// SAFETY: #[repr(C)], fourteen 4-byte fields, no padding; `mask` is always a valid discriminant
// (only built from the enum on the host).
unsafe impl KernelParam for AttentionShape {}
// The kernels receive it by value: its bytes must not move when a field is edited.
const _: () = assert!(core::mem::size_of::<AttentionShape>() == 56);

impl AttentionShape {
    /// [`AttentionShape::softcap_k`] and `softcap_inv_k` of a softcap `cap` (0: none) at `scale`.
    pub fn softcap_raw(cap: f32, scale: f32) -> (f32, f32) {
        if cap > 0.0 {
            let s = scale.abs().max(1e-30);
            (cap / s, s / cap)
        } else {
            (0.0, 0.0)
        }
    }
}

/// [`AttentionShape::window_left`] / `window_right` of a side without a bound: `i32::MAX`, so that
/// `i + diag` plus or minus it saturates (i32 arithmetic) past every key.
pub const NO_WINDOW: u32 = i32::MAX as u32;

/// The keys query row `i` sees, as i32 bounds around `i + diag`: `lo(i) <= j < hi(i)` before the
/// `0..seq_k` bounds. From the mask and the window of an [`AttentionShape`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Band {
    /// Keys before the row's aligned position it sees (i32::MAX: all).
    pub left: i32,
    /// Keys after it (0 under the causal mask; i32::MAX: all).
    pub right: i32,
}

impl Band {
    #[inline(always)]
    pub const fn of(p: &AttentionShape) -> Self {
        let right = if matches!(p.mask, MaskKind::Causal) {
            0
        } else {
            p.window_right as i32
        };
        Self {
            left: p.window_left as i32,
            right,
        }
    }
    /// The first key row `i` (aligned position `i + diag`) sees, unbounded below 0 (may be
    /// negative, saturating at i32::MIN).
    #[inline(always)]
    pub const fn lo(&self, i: i32, diag: i32) -> i32 {
        (i + diag).saturating_sub(self.left)
    }
    /// One past the last key row `i` sees, before the `seq_k` bound (saturating at i32::MAX).
    #[inline(always)]
    pub const fn hi(&self, i: i32, diag: i32) -> i32 {
        (i + diag).saturating_add(self.right).saturating_add(1)
    }
}

impl AttentionShape {
    /// Query heads a key/value head serves.
    #[inline(always)]
    pub const fn group(&self) -> u32 {
        self.heads / self.kv_heads
    }
    /// A forward CTA at grid `(y, z)` = (query head, batch): its query head's index into
    /// `batch * heads` and its key/value head's into `batch * kv_heads`.
    #[inline(always)]
    pub const fn fwd_heads(&self, y: u32, z: u32) -> (u64, u64) {
        (
            z as u64 * self.heads as u64 + y as u64,
            z as u64 * self.kv_heads as u64 + (y / self.group()) as u64,
        )
    }
    /// A backward CTA at grid `(y, z)` = (key/value head, batch): query head `y * group +
    /// group_member` into `batch * heads`, and key/value head `y` into `batch * kv_heads`. One launch
    /// a group member, so each dK/dV row has one writer a launch (they add in member order).
    #[inline(always)]
    pub const fn bwd_heads(&self, y: u32, z: u32) -> (u64, u64) {
        (
            z as u64 * self.heads as u64 + (y * self.group() + self.group_member) as u64,
            z as u64 * self.kv_heads as u64 + y as u64,
        )
    }
}

/// Element strides of one attention operand seen as `[batch, heads, seq, head_dim]` with a
/// contiguous last dim: element `(b, h, i, c)` at `b batch + h head + i row + c`. `[B, H, S, D]`
/// contiguous is [`HeadStrides::dense`]; `[B, S, H, D]` memory (FlashAttention's and candle's
/// layout, reached as a transposed view) has `head = D`, `row = H D`. Every stride is a multiple
/// of 8 elements (16 bytes: the kernels' copies move 16-byte chunks) and `row` is below 2^32,
/// validated on the host.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadStrides {
    pub batch: u64,
    pub head: u64,
    pub row: u64,
}

// SAFETY: #[repr(C)], three u64 fields, no padding, every bit pattern valid.
unsafe impl KernelParam for HeadStrides {}

impl HeadStrides {
    /// Contiguous `[batch, heads, seq, head_dim]`.
    pub const fn dense(heads: u64, seq: u64, head_dim: u64) -> Self {
        Self {
            batch: heads * seq * head_dim,
            head: seq * head_dim,
            row: head_dim,
        }
    }
    /// The offset of row 0 of head `h` of batch entry `b`.
    #[inline(always)]
    pub const fn head_at(&self, b: u32, h: u32) -> u64 {
        b as u64 * self.batch + h as u64 * self.head
    }
    /// One past the last element of head `(b, h)`'s first `rows` rows of `head_dim` elements (0
    /// when `rows` is 0): what the operand must span. The checked builds compare it with the
    /// operand's length.
    #[inline(always)]
    pub const fn head_end(&self, b: u32, h: u32, rows: u32, head_dim: u32) -> u64 {
        if rows == 0 {
            0
        } else {
            self.head_at(b, h) + (rows as u64 - 1) * self.row + head_dim as u64
        }
    }
}

/// Where the rows of every operand of the FlashAttention kernels lie (one by-value argument, the
/// last one, of each): per-operand strides (the forward reads `q`, `k`, `v` and writes `o` and the
/// LSE; the backward reads `q`, `k`, `v`, `o`, `d_o` and writes `dk`, `dv` (rounded to the input
/// type) and `dq` (the dQ conversion); its f32 accumulators are contiguous and use none of these),
/// and for a packed variable-length batch the sequences' row offsets.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionLayout {
    pub q: HeadStrides,
    pub k: HeadStrides,
    pub v: HeadStrides,
    pub o: HeadStrides,
    pub d_o: HeadStrides,
    pub dq: HeadStrides,
    pub dk: HeadStrides,
    pub dv: HeadStrides,
    /// The LSE's index of (batch entry, head, row): `batch * lse.batch + head * lse.head + row`
    /// (`row` counted from the sequence's first row, [`AttentionLayout::cu_seqlens_q`]); `lse.row` is
    /// 1. Dense: `[batch, heads, seq_q]`; packed: `[heads, total_q]`.
    pub lse: HeadStrides,
    /// 0 for a dense batch. For a packed (variable-length) batch, the device address of `batch + 1`
    /// u32 row offsets: sequence `b` is rows `cu[b]..cu[b + 1]` of Q (and O, LSE); the operands'
    /// batch strides are then unused (the launcher sets them to 0) and `seq_q` of the shape is the
    /// longest sequence.
    pub cu_seqlens_q: u64,
    /// The same for K and V (`seq_k` the longest).
    pub cu_seqlens_k: u64,
    /// 0, or the device address of f32 ALiBi slopes (the FlashAttention kernels of the sm_90
    /// build): query head `h` of batch entry `b` subtracts `slope[b * alibi_batch + h] |i + diag -
    /// j|` from its score of key `j` (after the softcap; `diag = seq_k - seq_q` of its sequence).
    pub alibi_slopes: u64,
    /// Slopes between batch entries: 0 (one slope a head for the whole batch) or `heads`.
    pub alibi_batch: u64,
}
// SAFETY: #[repr(C)], 31 u64 fields, no padding; the row offsets and slopes are only read when
// nonzero, and the launcher passes live device arrays of `batch + 1` offsets and of the slopes
// every (batch entry, head) indexes.
unsafe impl KernelParam for AttentionLayout {}
const _: () = assert!(core::mem::size_of::<AttentionLayout>() == 248);

/// [`AttentionShape::group_member`] of a wgmma backward launch that walks every group member in each
/// CTA (one launch a call; dK and dV summed in registers, in member order).
pub const GROUP_ALL: u32 = u32::MAX;

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

/// The head dims the FlashAttention kernels are built for: their tiles' widths (a kernel's `D`).
/// 256 runs in the sm_90 build only (the warp-specialised forward, the wgmma backward): the sm_80
/// build takes head dims up to [`FLASH_MAX_HEAD_DIM_SM80`].
pub const FLASH_TILE_DIMS: [usize; 3] = [64, 128, 256];

/// The widest head dim FlashAttention takes. It takes every multiple of 8 from 8 up to this: a head
/// dim that is not one of [`FLASH_TILE_DIMS`] runs on the narrowest tile that holds it
/// ([`flash_tile_dim`]). The tiles' columns past the head dim are zero-filled on load (zero terms of
/// every dot product over the head dim, zero columns of O and of every gradient) and never stored.
pub const FLASH_MAX_HEAD_DIM: usize = 256;
/// The widest head dim the sm_80 build's FlashAttention (forward and backward) takes.
pub const FLASH_MAX_HEAD_DIM_SM80: usize = 128;

/// Whether FlashAttention takes head dim `head_dim`: a multiple of 8 (a 16-byte chunk of 16-bit
/// elements, the unit of every copy) in `8..=FLASH_MAX_HEAD_DIM`.
pub const fn flash_head_dim_supported(head_dim: usize) -> bool {
    head_dim > 0 && head_dim.is_multiple_of(8) && head_dim <= FLASH_MAX_HEAD_DIM
}

/// The tile width a supported head dim runs at: the narrowest of [`FLASH_TILE_DIMS`] that holds
/// it (the widest for a head dim past them all, which validation refuses first).
pub const fn flash_tile_dim(head_dim: usize) -> usize {
    narrowest_holding(&FLASH_TILE_DIMS, head_dim)
}

/// The first of the ascending `dims` that is at least `head_dim` (the last if none is).
const fn narrowest_holding(dims: &[usize], head_dim: usize) -> usize {
    let mut i = 0;
    while i < dims.len() {
        if head_dim <= dims[i] {
            return dims[i];
        }
        i += 1;
    }
    dims[dims.len() - 1]
}
const _: () = assert!(FLASH_MAX_HEAD_DIM == FLASH_TILE_DIMS[FLASH_TILE_DIMS.len() - 1]);

/// The head-dim columns the sm_90 build's products cover (`flash_tma_fwd_d{N}_*`; the backward's
/// dense kernels at 32 and 96 too): every tile width, and 32, 96 and 192 on the tile above them
/// (`Q K^T` over fewer k-steps, `P V` and the gradients' products over fewer columns). 32-column
/// steps are what the 128-byte-swizzled tiles allow: an MN-major operand narrower than a 64-column
/// panel starts at a panel's first column.
pub const FLASH_PRODUCT_DIMS: [usize; 6] = [32, 64, 96, 128, 192, 256];

/// The columns the products cover for a supported head dim: the narrowest of
/// [`FLASH_PRODUCT_DIMS`] that holds it (zero columns past the head dim add nothing).
pub const fn flash_product_dim(head_dim: usize) -> usize {
    narrowest_holding(&FLASH_PRODUCT_DIMS, head_dim)
}
// Every product width lies in its head dim's tile (16-column k-steps, 32-column N steps).
const _: () = {
    let mut i = 0;
    while i < FLASH_PRODUCT_DIMS.len() {
        let n = FLASH_PRODUCT_DIMS[i];
        assert!(n.is_multiple_of(32) && n <= flash_tile_dim(n));
        i += 1;
    }
};

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
    /// Threads of the warp-specialised forward at this config: a producer warpgroup beside the
    /// consumers.
    pub const fn tma_threads(&self) -> usize {
        self.threads() + 128
    }
    /// The warp-specialised forward's registers a thread (`setmaxnreg`): (producer, consumers).
    /// Two consumer warpgroups take 232 each; three, 160 (the producer gives up all but 24).
    pub const fn tma_registers(&self) -> (u32, u32) {
        if self.warpgroups() == 2 {
            (40, 232)
        } else {
            (24, 160)
        }
    }
    /// Dynamic shared memory: the Q tile, then `stages` K tiles, then `stages` V tiles.
    pub const fn smem_bytes(&self) -> usize {
        (self.block_q + 2 * self.stages * self.block_k) * self.head_dim * 2
    }
}

/// D = 64 with one consumer warpgroup (64 query rows, 128 threads) and 128-key tiles (entry points
/// `flash_wg4_fwd_d64_*`): the overlapped schedule, per-thread state S 64, O 32, P 32 f32, in half
/// the CTA of [`FLASH_TMA_D64`] (without its producer), so short sequences launch twice the CTAs (B4 H8
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

/// The warp-specialised TMA forward (`flash_tma_fwd_d{64,128}_*`, `kernels/attention/flash_tma.rs`): two
/// consumer warpgroups of 64 query rows and one producer warpgroup that loads Q once and K and V
/// tiles by TMA into two mbarrier rings of `stages` each. D = 128: 128-key tiles (S 64 f32, O 64,
/// P 32 a thread), 160 KiB a CTA.
pub const FLASH_TMA_D128: FlashWgmmaConfig = FlashWgmmaConfig {
    head_dim: 128,
    block_q: 128,
    block_k: 128,
    stages: 2,
    min_blocks: 1,
};
/// D = 64 on the same pipeline with three consumer warpgroups (192 query rows): 128-key tiles (S
/// 64 f32 a thread, O 32, in the 160 registers three consumers leave), 90 KiB a CTA. At D = 64 a
/// warpgroup's softmax of a tile is about as long as another's products, so a third warpgroup
/// gives each scheduler a second softmax warp to issue from.
pub const FLASH_TMA_D64: FlashWgmmaConfig = FlashWgmmaConfig {
    head_dim: 64,
    block_q: 192,
    block_k: 128,
    stages: 2,
    min_blocks: 1,
};
/// D = 256 on the same pipeline: 64-key tiles (O 128 f32 a thread, S 32, P 16: what fits the
/// consumers' 232 registers), 194 KiB a CTA (Q 64 KiB, each ring 2 x 32 KiB).
pub const FLASH_TMA_D256: FlashWgmmaConfig = FlashWgmmaConfig {
    head_dim: 256,
    block_q: 128,
    block_k: 64,
    stages: 2,
    min_blocks: 1,
};
/// The warp-specialised forward's config for a head dim.
pub const fn flash_tma_config(head_dim: usize) -> Option<FlashWgmmaConfig> {
    match head_dim {
        64 => Some(FLASH_TMA_D64),
        128 => Some(FLASH_TMA_D128),
        256 => Some(FLASH_TMA_D256),
        _ => None,
    }
}
/// Its dynamic shared memory: the Q tile, the K ring and the V ring (each `stages` tiles and two
/// 8-byte barriers a stage, rounded up to 1024 bytes), and Q's barrier.
pub const fn flash_tma_smem_bytes(c: FlashWgmmaConfig) -> usize {
    let tile = c.block_k * c.head_dim * 2;
    let ring = (c.stages * tile + 16 * c.stages).next_multiple_of(1024);
    c.block_q * c.head_dim * 2 + 2 * ring + 8
}
const fn flash_tma_config_fits(c: FlashWgmmaConfig) -> bool {
    let (producer, consumer) = c.tma_registers();
    crate::params::register_split_fits(c.tma_threads() as u32, producer, consumer)
        && flash_tma_smem_bytes(c) <= 227 * 1024
        && (c.warpgroups() == 2 || c.warpgroups() == 3)
}
const _: () = assert!(
    flash_tma_config_fits(FLASH_TMA_D64)
        && flash_tma_config_fits(FLASH_TMA_D128)
        && flash_tma_config_fits(FLASH_TMA_D256)
);

/// Every wgmma forward config a kernel is instantiated with.
pub const FLASH_WG_CONFIGS: [FlashWgmmaConfig; 4] = [
    FLASH_TMA_D64,
    FLASH_TMA_D128,
    FLASH_TMA_D256,
    FLASH_WG_D64_Q64,
];

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
        assert!(
            c.block_q.is_multiple_of(64)
                && c.block_k.is_multiple_of(16)
                && c.head_dim.is_multiple_of(64)
        );
        assert!((c.block_q * c.head_dim * 2).is_multiple_of(1024));
        assert!((c.block_k * c.head_dim * 2).is_multiple_of(1024));
        assert!(c.stages == 2 && c.smem_bytes() <= 227 * 1024);
        i += 1;
    }
};

/// The compile-time configuration of one FlashAttention backward kernel (`flash_bwd_d*`). One CTA per
/// (block of `block_k` keys, head, batch) keeps its K and V block in shared memory and its dK, dV
/// accumulators in registers, each warp owning 16 keys; it loops over the query blocks of
/// `block_q` rows that see its keys. The kernel reads these as const generics and asserts its
/// shared-memory plan matches [`FlashBwdConfig::smem_bytes`]; the launcher reads the same values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlashBwdConfig {
    pub head_dim: usize,
    /// Keys per CTA (16 per warp).
    pub block_k: usize,
    /// Query rows per step of the loop, and the granularity of the dQ accumulation order: every
    /// step adds one `block_q x head_dim` partial dQ block. 32 or 64.
    pub block_q: usize,
    /// The launch bound's CTAs per SM.
    pub min_blocks: u32,
}

impl FlashBwdConfig {
    /// Warps per CTA: each owns 16 keys (and a share of the dQ product, see [`Self::dq_col_split`]).
    pub const fn warps(&self) -> usize {
        self.block_k / 16
    }
    pub const fn threads(&self) -> usize {
        self.warps() * 32
    }
    /// For `dQ += dS K`, warps split the `block_q` rows into groups of 16 and, when there are more
    /// warps than row groups, the head dim into this many column ranges.
    pub const fn dq_col_split(&self) -> usize {
        self.warps() / (self.block_q / 16)
    }
    /// Columns of the dS^T tile: `block_q`, but at least 64 (128-byte rows, what the `Xor8`
    /// swizzle needs; with 32 queries a step half of each row is unused).
    pub const fn ds_cols(&self) -> usize {
        if self.block_q < 64 { 64 } else { self.block_q }
    }
    /// Dynamic shared memory, in the order the kernel carves it: K and V blocks, two stages each of
    /// the Q and dO blocks, the dS^T block (`block_k x ds_cols`), and two stages of the per-row
    /// statistics (LSE and D, f32, `2 x block_q`). 16-bit elements, rows swizzled.
    pub const fn smem_bytes(&self) -> usize {
        2 * self.block_k * self.head_dim * 2
            + 2 * 2 * self.block_q * self.head_dim * 2
            + self.block_k * self.ds_cols() * 2
            + 2 * 2 * self.block_q * 4
    }
}

/// Rows per block of the backward's pre-pass (`flash_bwd_pre_*`, one CTA each); the per-row
/// statistics are padded to a multiple of it: `[2, batch * heads, ceil(seq_q / 128) * 128]` f32,
/// the LSE in log2 units, then D. Every backward kernel's `block_q` divides it, so a step's
/// statistics copy never reads past the padding.
pub const FLASH_BWD_PRE_ROWS: usize = 128;
/// Query rows per turn counter of the deterministic dQ accumulation (`batch * heads *
/// ceil(seq_q / 8)` u32). The `mma.sync` kernel uses the first counter of each `block_q` rows; the
/// wgmma kernel one per warp (its 8 warps add disjoint parts of a dQ block, each in its own turn
/// order, so no block barrier stands between a warp's additions and its release).
pub const FLASH_BWD_TURN_ROWS: usize = 8;

/// How the wgmma backward walks the query blocks and adds the key blocks' partial dQ blocks (its
/// last kernel argument): an OR of these flags (`gpu/src/kernels/attention/flash_bwd.rs` has the
/// argument for each order).
/// - `DQ_ORDERED`: each addition waits for its turn (deterministic); without it the blocks are
///   added as they arrive (the explicit nondeterministic mode).
/// - `DQ_ROTATED`: CTA j starts its walk at query block `j * n_qblocks / n_kblocks` (under the
///   causal mask at its first visible block) and walks upward, and each block takes its additions
///   in the order the CTAs reach it, so CTAs in step with one another never wait; a CTA may wait
///   for a later-started CTA of its head, so the host takes it only when a head's CTAs fit on the
///   GPU at once. Without it every CTA walks last-first and the turns ascend with the key block,
///   so a CTA waits only for CTAs started before it (any grid).
/// - `DQ_LATE_RELEASE` (with both): a warp releases its turn on a block not right after its
///   additions but one step later, before its next turn: by then the additions have landed, so the
///   release's memory barrier does not stall the warp. Only where the CTA that waits for the
///   release reaches the block at a later step (rotated, no two CTAs starting at one block).
/// - `DQ_REVERSED_GRID` (with `DQ_ROTATED`, causal): CTA `x` of the grid takes key block
///   `n_k - 1 - x`. Under the causal mask a rotated CTA waits only for the CTA of the next key
///   block (never cyclically), so with the grid reversed every CTA waits only for CTAs started
///   before it, and the rotated order needs no co-residency: it serves any length.
pub const DQ_ORDERED: u32 = 1;
pub const DQ_ROTATED: u32 = 2;
pub const DQ_LATE_RELEASE: u32 = 4;
pub const DQ_REVERSED_GRID: u32 = 8;

/// The member-grid backward's dK or dV parameter (`flash_wg_bwd_members_*`, the kernels'
/// `MemberSum<T>` bit for bit): the f32 sums of a key/value head's rows over its group's query
/// heads (scratch: `[batch, kv_heads, seq_k, head_dim]`, written by the kernel before it reads
/// them) and the rounded output.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemberSumParam {
    pub sums: super::RawSlice,
    pub out: super::RawSlice,
}
// SAFETY: plain data, laid out as the kernels read it.
unsafe impl super::KernelParam for MemberSumParam {}

/// What fixes a head's dQ walks and turns: its query and key blocks (`ceil(seq / block)`), the
/// mask, and the causal diagonal `seq_k - seq_q` (query q sees key k iff `k <= q + diag`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DqWalk {
    pub n_qblocks: u32,
    pub n_kblocks: u32,
    pub block_q: u32,
    pub block_k: u32,
    pub causal: bool,
    pub diag: i32,
    /// The keys each query sees ([`Band::of`] the shape; a window only with the plain order).
    pub band: Band,
}

impl DqWalk {
    /// The first query block that sees key block `j`: 0, or under the causal mask (or a window's
    /// right side) the block of the first query that sees its first key (i32 arithmetic: a key
    /// block's first key and the diagonal are within [`MAX_SEQ`] < 2^30 in magnitude; the window
    /// saturates).
    pub const fn first_qblock(&self, j: u32) -> u32 {
        let first = (j * self.block_k) as i32 - self.diag;
        // (The causal mask's test first: a dense kernel's band is a constant without a window.)
        let first = if self.causal {
            first
        } else if self.band.right == i32::MAX {
            0
        } else {
            first.saturating_sub(self.band.right)
        };
        (if first > 0 { first as u32 } else { 0 }) / self.block_q
    }

    /// One past the last query block that sees key block `j`: `n_qblocks`, or under a window's
    /// left side the block of the last query that sees its last key (0 if none does).
    pub const fn end_qblock(&self, j: u32) -> u32 {
        if self.band.left == i32::MAX {
            return self.n_qblocks;
        }
        let last = (((j + 1) * self.block_k - 1) as i32 - self.diag).saturating_add(self.band.left);
        if last < 0 {
            0
        } else {
            let end = last as u32 / self.block_q + 1;
            if end < self.n_qblocks {
                end
            } else {
                self.n_qblocks
            }
        }
    }

    /// The first key block that query block `i` sees: 0, or under a window's left side the block
    /// of the first key its first query sees.
    pub const fn first_kblock(&self, i: u32) -> u32 {
        if self.band.left == i32::MAX {
            return 0;
        }
        let lo = ((i * self.block_q) as i32 + self.diag).saturating_sub(self.band.left);
        (if lo > 0 { lo as u32 } else { 0 }) / self.block_k
    }
}

/// The query block that key block `j` walks at step `step` (< `end_qblock(j) - first_qblock(j)`)
/// in dQ order `order`: last-first, except in the rotated order (see [`dq_turn_at`]; never with a
/// window).
#[inline(always)]
pub const fn dq_block_at(w: &DqWalk, j: u32, step: u32, order: u32) -> u32 {
    // Every order's block is computed and one selected: branches around the arithmetic, which
    // the kernels run while wgmma are in flight, made ptxas serialise those.
    let last_first = w.end_qblock(j).wrapping_sub(1).wrapping_sub(step);
    let causal = w.first_qblock(j).wrapping_add(step);
    // u32 arithmetic ([`dq_rotated_fits`]): a 64-bit division is a call in the PTX.
    let start = j.wrapping_mul(w.n_qblocks) / max1(w.n_kblocks);
    let i = start.wrapping_add(step);
    let wrapped = if i >= w.n_qblocks {
        i.wrapping_sub(w.n_qblocks)
    } else {
        i
    };
    let rotated = if w.causal { causal } else { wrapped };
    if order & DQ_ROTATED != 0 {
        rotated
    } else {
        last_first
    }
}

const fn max1(x: u32) -> u32 {
    if x > 1 { x } else { 1 }
}

/// Whether the rotated walk of `w` has every CTA that meets a query block reach it at a step of
/// its own walk strictly after the CTA whose turn comes before its own, so that `DQ_LATE_RELEASE`
/// holds no CTA back: without a mask, at least as many query blocks as key blocks (distinct
/// starts); under the causal mask, `seq_k <= seq_q` and key blocks at least as long as query blocks
/// (distinct first visible blocks).
pub const fn dq_late_release_fits(w: &DqWalk) -> bool {
    if w.causal {
        w.diag <= 0 && w.block_k >= w.block_q
    } else {
        w.n_qblocks >= w.n_kblocks
    }
}

/// Whether a head's blocks allow the rotated order: its walk and turns use 32-bit arithmetic.
pub const fn dq_rotated_fits(n_qblocks: u32, n_kblocks: u32) -> bool {
    (n_qblocks as u64 + 1) * (n_kblocks as u64 + 1) < 1 << 32
}

/// The turn (how many key blocks add to query block `i` before it) of key block `j`, which walks
/// block `i`, in dQ order `order`. Ascending: `j - first_kblock(i)`, for the key blocks that meet
/// block i are exactly `first_kblock(i)..=j_max(i)` (`0..` but under a window). Rotated (never with
/// a window): each block takes its additions in the order of the steps at
/// which the key blocks walk it. Without a mask block j walks up from `s_j = j n_q / n_k`
/// (wrapping), so it meets block i at step `(i - s_j) mod n_q`: the block with the latest start
/// `s_J <= i` meets it first, then J - 1, ..., 0, then n_k - 1, ..., J + 1 (blocks with equal
/// starts meet it at the same step and go highest first too): turn `(J - j) mod n_k`, with
/// `J = ((i + 1) n_k - 1) / n_q`, the largest j with `j n_q < (i + 1) n_k`. Under the causal mask
/// block j walks up from its first visible block `f_j` (non-decreasing in j) and meets block i at
/// step `i - f_j`: the blocks meeting block i are `0..=J` with `J` the largest j with `f_j <= i`,
/// i.e. `j BK - diag <= (i + 1) BQ - 1`, met highest first: turn `J - j`.
#[inline(always)]
pub const fn dq_turn_at(w: &DqWalk, j: u32, i: u32, order: u32) -> u32 {
    // Computed whole and selected, as in [`dq_block_at`].
    let n_k = w.n_kblocks;
    let bound = (i as i64 + 1) * w.block_q as i64 + w.diag as i64 - 1;
    // Block j meets block i, so `j BK <= bound`: the quotient is >= j >= 0. `block_k` is a
    // constant in the kernels: the i64 division is a shift there, never a call.
    let last_causal = bound / w.block_k as i64;
    let last_causal = if last_causal > n_k as i64 - 1 {
        n_k.wrapping_sub(1)
    } else {
        last_causal as u32
    };
    let last = (i.wrapping_add(1).wrapping_mul(n_k).wrapping_sub(1)) / max1(w.n_qblocks);
    let last = if last > n_k.wrapping_sub(1) {
        n_k.wrapping_sub(1)
    } else {
        last
    };
    let wrapped = if last >= j {
        last.wrapping_sub(j)
    } else {
        last.wrapping_add(n_k).wrapping_sub(j)
    };
    let rotated = if w.causal {
        last_causal.wrapping_sub(j)
    } else {
        wrapped
    };
    // Ascending: the key blocks that meet block i are `first_kblock(i)..`, in order.
    let ascending = j.wrapping_sub(w.first_kblock(i));
    if order & DQ_ROTATED != 0 {
        rotated
    } else {
        ascending
    }
}

/// Design notes (no measurements yet; the H100 benchmark is the judge):
/// - 128 keys a CTA (8 warps, 16 keys each): every Q and dO block brought into shared memory feeds
///   128 keys, and each dQ partial block added to the f32 accumulator covers 128 keys, halving the
///   L2 traffic per FLOP of 64-key CTAs.
/// - 64 query rows a step: per thread, S^T and dP^T are 32 f32 each (16 keys x 64 queries a warp);
///   the dK and dV accumulators are `head_dim / 2` f32 each (64 + 64 at D = 128). `block_q = 32`
///   halves S^T and dP^T (the kernel supports it; 128-byte dS^T rows keep its swizzle).
/// - One CTA per SM (up to 255 registers a thread); 81 KiB (D = 64) and 145 KiB (D = 128) of
///   shared memory.
pub const FLASH_BWD_D64: FlashBwdConfig = FlashBwdConfig {
    head_dim: 64,
    block_k: 128,
    block_q: 64,
    min_blocks: 1,
};
pub const FLASH_BWD_D128: FlashBwdConfig = FlashBwdConfig {
    head_dim: 128,
    block_k: 128,
    block_q: 64,
    min_blocks: 1,
};

/// The backward config for a head dimension, or `None` if there is no kernel for it.
pub const fn flash_bwd_config(head_dim: usize) -> Option<FlashBwdConfig> {
    match head_dim {
        64 => Some(FLASH_BWD_D64),
        128 => Some(FLASH_BWD_D128),
        _ => None,
    }
}

/// Threads a block of the backward's pre-pass (`flash_bwd_pre_*`: D, the LSE in log2 units, zeroed
/// dQ accumulator and turn counters; one block per [`FLASH_BWD_PRE_ROWS`] rows) and of the dQ conversion
/// (`flash_bwd_dq_*`, grid-stride over 8-element chunks).
pub mod flash_bwd {
    pub const PRE_THREADS: u32 = 256;
    pub const CONVERT_THREADS: u32 = 256;
}

// Every backward config: warps split evenly into dQ row groups and column ranges, 16-byte chunked
// tiles, and the shared memory within sm_80's 163 KiB a block (sm_90: 227 KiB).
const _: () = {
    let cfgs = [FLASH_BWD_D64, FLASH_BWD_D128];
    let mut i = 0;
    while i < cfgs.len() {
        let c = cfgs[i];
        assert!(c.block_q.is_multiple_of(FLASH_BWD_TURN_ROWS));
        assert!(FLASH_BWD_PRE_ROWS.is_multiple_of(c.block_q));
        assert!(c.block_k.is_multiple_of(16) && c.head_dim.is_multiple_of(64));
        assert!(c.warps().is_multiple_of(c.block_q / 16) && c.dq_col_split() >= 1);
        assert!((c.head_dim / 8).is_multiple_of(2 * c.dq_col_split()));
        assert!(c.smem_bytes() <= 163 * 1024);
        // The pre-pass covers its rows in whole passes of its threads.
        assert!((flash_bwd::PRE_THREADS as usize).is_multiple_of(c.head_dim / 8));
        assert!(
            FLASH_BWD_PRE_ROWS.is_multiple_of(flash_bwd::PRE_THREADS as usize / (c.head_dim / 8))
        );
        i += 1;
    }
};

/// The Hopper (`wgmma`, sm_90a) FlashAttention backward (`flash_wg_bwd_d*`): one CTA of two
/// warpgroups per (block of keys, head, batch). Up to D = 128 the block has 128 keys and warpgroup
/// `w` owns keys `64 w..64 w + 64` (the M = 64 of `S^T = K Q^T`, `dP^T = V dO^T`, `dV += P^T dO`,
/// `dK += dS^T Q`); at D = 256 and in the scored kernels at D = 128 ([`Self::split_head`]) the
/// block has 64 keys, each warpgroup computes S^T and dP^T for half its queries, and warpgroup `w`
/// owns columns `D/2 w..D/2 (w + 1)` of its dK and dV (at head dim 192 on the 256 tile, warpgroup
/// 0 columns 0..128 and warpgroup 1 128..192: [`Self::wg_cols_of`]).
/// Both share the `dQ = dS K` product of a step (`block_q x head_dim`) as two shares: by query rows
/// when `block_q` = 128, else by columns (each share one or two 64 x 64 parts,
/// [`Self::dq_parts_of`]). Tiles use the
/// 128-byte-swizzle layout (what wgmma descriptors read). The pre-pass, the statistics, the turn
/// counters and the dQ conversion are those of [`FlashBwdConfig`]'s kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlashWgBwdConfig {
    /// The tiles' width (a multiple of 64: whole 128-byte swizzle panels).
    pub head_dim: usize,
    /// The head-dim columns the products cover (`<= head_dim`): the tile's width, or 32 / 96 / 192
    /// in the dense kernels of those head dims (`flash_wg_bwd_d{32,96,192}_*`), whose `S^T` and
    /// `dP^T` take fewer k-steps and whose dK, dV (and at 32 dQ) products fewer columns.
    pub cols: usize,
    /// Keys per CTA: 64 per warpgroup.
    pub block_k: usize,
    /// Query rows a step (the N of `S^T`, the K of `dV += P^T dO`).
    pub block_q: usize,
    /// Whether a step's dQ product stays in flight into the next step and is added while that
    /// step's first S^T / dP^T run (`true`), or is waited for and added at the step's end. Needs
    /// 32 more registers through the S^T / dP^T phase.
    pub defer_dq: bool,
    /// Stages of the Q / dO / statistics pipeline: 2, or 3 with `defer_dq` (a step's last dV/dK
    /// products then retire only in the next step, after that step's loads were issued).
    pub stages: usize,
    /// Whether the two warpgroups own the same 64 keys and split the head dim's columns of dK and
    /// dV between them (each computing S^T and dP^T for half the step's queries), instead of
    /// owning 64 keys each: 128 columns of dK and dV are what a warpgroup's registers hold (at
    /// D = 256), and 64 leave the scored kernels' modifications registers (at D = 128).
    pub split_head: bool,
}

impl FlashWgBwdConfig {
    /// Two warpgroups, whichever way they split the work.
    pub const fn threads(&self) -> usize {
        256
    }
    /// Columns of dK and dV a warpgroup accumulates at most (the N of its `dV += P^T dO`, `dK +=
    /// dS^T Q`; its registers hold this many).
    pub const fn wg_cols(&self) -> usize {
        if self.split_head {
            self.head_dim / 2
        } else {
            self.cols
        }
    }
    /// Whether the head dim splits unevenly: product columns short of the tile with the split
    /// (192 on the 256 tile), warpgroup 0 keeping the first half of the tile's columns of dK and dV
    /// and warpgroup 1 the rest of the product columns.
    pub const fn uneven_split(&self) -> bool {
        self.split_head && self.cols < self.head_dim
    }
    /// Columns of dK and dV warpgroup `wg` accumulates, from its first ([`Self::wg_col0`]).
    pub const fn wg_cols_of(&self, wg: usize) -> usize {
        if self.uneven_split() && wg == 1 {
            self.cols - self.head_dim / 2
        } else {
            self.wg_cols()
        }
    }
    /// The first column of dK and dV warpgroup `wg` accumulates.
    pub const fn wg_col0(&self, wg: usize) -> usize {
        if self.split_head {
            self.head_dim / 2 * wg
        } else {
            0
        }
    }
    /// 64 x 64 dQ parts of warpgroup `wg`'s share with the head dim split. Uneven, each takes the
    /// columns of dK and dV the other keeps (warpgroup 0 one part, 1 two at 192), so that the
    /// step's products balance: 128 + 64 columns of dK and dV against 64 + 128 of dQ.
    pub const fn dq_parts_of(&self, wg: usize) -> usize {
        if self.uneven_split() {
            self.wg_cols_of(1 - wg) / 64
        } else {
            self.dq_parts()
        }
    }
    /// The first column of warpgroup `wg`'s dQ share with the head dim split (its parts follow).
    pub const fn dq_col0_of(&self, wg: usize) -> usize {
        if self.uneven_split() {
            self.wg_col0(1 - wg)
        } else {
            self.wg_col0(wg)
        }
    }
    /// Columns of one dQ part (the N of its wgmma chain): 64, or the product columns below 64
    /// (a part past them adds only its columns within them).
    pub const fn dq_part_cols(&self) -> usize {
        if self.cols < 64 { self.cols } else { 64 }
    }
    /// dQ splits over the warpgroups: by query rows (`block_q / 64` halves) times by columns.
    pub const fn dq_row_splits(&self) -> usize {
        self.block_q / 64
    }
    pub const fn dq_col_splits(&self) -> usize {
        2 / self.dq_row_splits()
    }
    /// 64-query sub-blocks of a step in which both warpgroups compute S^T and dP^T for their own
    /// keys: all of the step's (`block_q / 64`), or none with the head dim split (whose step takes
    /// another path).
    pub const fn paired_sub_blocks(&self) -> usize {
        if self.split_head {
            0
        } else {
            self.block_q / 64
        }
    }
    /// 64 x 64 parts of a warpgroup's dQ share (one m64n64 wgmma chain each).
    pub const fn dq_parts(&self) -> usize {
        self.head_dim / self.dq_col_splits() / 64
    }
    /// Dynamic shared memory, in the order the kernel carves it: K and V blocks, `stages` stages of
    /// Q, as many of dO, two of the dS^T block (`block_k x block_q`; with the head dim split the
    /// step's P^T takes the stage its dS^T does not), and `stages` of the per-row statistics (LSE
    /// and D, f32, `2 x block_q`). Every 16-bit tile is whole 1024-byte swizzle atoms.
    pub const fn smem_bytes(&self) -> usize {
        2 * self.block_k * self.head_dim * 2
            + 2 * self.stages * self.block_q * self.head_dim * 2
            + 2 * self.block_k * self.block_q * 2
            + self.stages * 2 * self.block_q * 4
    }
}

/// Design notes (the H100 benchmark is the judge):
/// - D = 128: 64 query rows a step: per thread S^T and dP^T are 32 f32 each, dK and dV 64 + 64,
///   the dQ half 32, waited for at the step's end: kept in flight into the next step as at
///   D = 64, ptxas serialised the wgmma for lack of registers; 161 KiB.
/// - D = 64: 128 query rows a step (the dQ block splits by rows into two 64 x 64 halves, and each
///   step's barriers and turn wait serve twice the products), computed as two 64-query sub-blocks
///   so that S^T and dP^T stay 32 f32 each (128 rows at once spilled: 255 registers, 140 bytes);
///   dK and dV 32 + 32, the dQ half 32 in flight into the next step's S^T / dP^T; 3 stages of
///   Q / dO; 195 KiB.
/// - D = 256: 64 keys a CTA, 64 query rows a step, the head dim split between the warpgroups
///   ([`FlashWgBwdConfig::split_head`]): per thread dK and dV 64 + 64 f32 (128 columns each), S^T
///   and dP^T 16 + 16 (each warpgroup computes both for 32 of the step's queries; the P^T and dS^T
///   halves cross through shared memory), the dQ share two 64 x 64 parts one after the other;
///   209 KiB. 128 keys a CTA with 64 each would need 256 f32 of dK and dV a thread.
/// - One CTA per SM (up to 255 registers a thread).
pub const FLASH_WG_BWD_D64: FlashWgBwdConfig = FlashWgBwdConfig {
    head_dim: 64,
    cols: 64,
    block_k: 128,
    block_q: 128,
    defer_dq: true,
    stages: 3,
    split_head: false,
};
pub const FLASH_WG_BWD_D128: FlashWgBwdConfig = FlashWgBwdConfig {
    head_dim: 128,
    cols: 128,
    block_k: 128,
    block_q: 64,
    defer_dq: false,
    stages: 2,
    split_head: false,
};
pub const FLASH_WG_BWD_D256: FlashWgBwdConfig = FlashWgBwdConfig {
    head_dim: 256,
    cols: 256,
    block_k: 64,
    block_q: 64,
    defer_dq: false,
    stages: 2,
    split_head: true,
};

/// Head dim 192 on the 256-wide tiles ([`FLASH_WG_BWD_D256`]'s split step): `S^T`, `dP^T` over 12
/// k-steps; warpgroup 0 keeps columns 0..128 of dK and dV and adds dQ's columns 128..192,
/// warpgroup 1 keeps 128..192 and adds 0..128 ([`FlashWgBwdConfig::uneven_split`]). On the
/// 256-column products it did 4/3 of the work and walked the general kernel's plain dQ order.
pub const FLASH_WG_BWD_D192: FlashWgBwdConfig = FlashWgBwdConfig {
    cols: 192,
    ..FLASH_WG_BWD_D256
};

/// Head dim 32 on the 64-wide tiles ([`FLASH_WG_BWD_D64`]'s walk and deferred dQ): `S^T`, `dP^T`
/// over 2 k-steps, dV, dK and the dQ parts 32 columns wide (16 + 16 + 16 f32 a thread).
pub const FLASH_WG_BWD_D32: FlashWgBwdConfig = FlashWgBwdConfig {
    cols: 32,
    ..FLASH_WG_BWD_D64
};
/// Head dim 96 on the 128-wide tiles ([`FLASH_WG_BWD_D128`]'s walk): `S^T`, `dP^T` over 6 k-steps,
/// dV and dK 96 columns (48 + 48 f32 a thread); the dQ parts stay 64 x 64 (an MN-major operand of
/// 32 columns must start a 64-column panel), and warpgroup 1 adds the 32 of its 64 columns that
/// are the head dim's.
pub const FLASH_WG_BWD_D96: FlashWgBwdConfig = FlashWgBwdConfig {
    cols: 96,
    ..FLASH_WG_BWD_D128
};

/// The wgmma backward's general kernels (packed batches, head dims narrower than the tile) at
/// D = 64: the plain order (no deferred dQ, 2 stages). A packed walk keeps its sequence's lengths
/// and offsets in registers, and a narrow head dim its width, which the deferred order has none left
/// for (ptxas spilled 88 bytes, and 104 with the width alone). D = 128 takes
/// [`FLASH_WG_BWD_D128`].
pub const FLASH_WG_BWD_D64_GENERAL: FlashWgBwdConfig = FlashWgBwdConfig {
    head_dim: 64,
    cols: 64,
    block_k: 128,
    block_q: 128,
    defer_dq: false,
    stages: 2,
    split_head: false,
};

/// The scored backward (`flash_wg_bwd_scored_d128_*`: the softcap and ALiBi) at D = 128: 64 keys
/// a CTA with the head dim split ([`FlashWgBwdConfig::split_head`]), so that a warpgroup keeps 64
/// columns of dK and dV (32 + 32 f32 a thread) and the score's modification has registers. The
/// 128-key pairing of [`FLASH_WG_BWD_D128`] keeps 128 and spilled 56-224 bytes with it.
pub const FLASH_WG_BWD_D128_SCORED: FlashWgBwdConfig = FlashWgBwdConfig {
    head_dim: 128,
    cols: 128,
    block_k: 64,
    block_q: 64,
    defer_dq: false,
    stages: 2,
    split_head: true,
};

/// The wgmma backward's config for a tile width, for the dense tile-wide kernels (`general`
/// false), the general ones, or the scored ones (`scored`: the softcap and ALiBi; general too).
pub const fn flash_wg_bwd_config_of(
    head_dim: usize,
    general: bool,
    scored: bool,
) -> Option<FlashWgBwdConfig> {
    match (head_dim, general, scored) {
        (128, _, true) => Some(FLASH_WG_BWD_D128_SCORED),
        (64, true, _) | (64, _, true) => Some(FLASH_WG_BWD_D64_GENERAL),
        _ => flash_wg_bwd_config(head_dim),
    }
}

/// The dense kernels' config for a head dim (their product columns, [`FlashWgBwdConfig::cols`]).
pub const fn flash_wg_bwd_config(head_dim: usize) -> Option<FlashWgBwdConfig> {
    match head_dim {
        32 => Some(FLASH_WG_BWD_D32),
        64 => Some(FLASH_WG_BWD_D64),
        96 => Some(FLASH_WG_BWD_D96),
        128 => Some(FLASH_WG_BWD_D128),
        192 => Some(FLASH_WG_BWD_D192),
        256 => Some(FLASH_WG_BWD_D256),
        _ => None,
    }
}

// Every wgmma backward config: two warpgroups of 64 keys each, or one block of 64 keys with the
// head dim split (never deferring dQ: its dS^T tile is written half by each warpgroup); each dQ
// share one or two 64 x 64 parts; a warpgroup's dK and dV at most 128 columns (its registers); the
// step's rows cover whole turn counters and divide the statistics' padding; sm_90's 227 KiB.
const _: () = {
    let cfgs = [
        FLASH_WG_BWD_D64,
        FLASH_WG_BWD_D128,
        FLASH_WG_BWD_D256,
        FLASH_WG_BWD_D64_GENERAL,
        FLASH_WG_BWD_D128_SCORED,
        FLASH_WG_BWD_D32,
        FLASH_WG_BWD_D96,
        FLASH_WG_BWD_D192,
    ];
    let mut i = 0;
    while i < cfgs.len() {
        let c = cfgs[i];
        // Product columns: whole 32-column steps inside the tile, less than a panel short of it;
        // with the split, whole panels, each warpgroup keeping some of dK and dV and adding some
        // of dQ, the dQ shares covering the product columns.
        let short = c.head_dim - c.cols;
        assert!(c.cols.is_multiple_of(32) && c.cols <= c.head_dim && (short < 64 || c.split_head));
        assert!(!c.split_head || (c.cols.is_multiple_of(64) && c.cols > c.head_dim / 2));
        assert!(!c.split_head || c.wg_col0(1) + c.wg_cols_of(1) == c.cols);
        assert!(!c.split_head || 64 * (c.dq_parts_of(0) + c.dq_parts_of(1)) == c.cols);
        assert!(
            !c.split_head || c.dq_parts_of(0) <= c.dq_parts() && c.dq_parts_of(1) <= c.dq_parts()
        );
        assert!(c.dq_part_cols() == 64 || c.dq_col_splits() == 1);
        assert!(c.block_k == if c.split_head { 64 } else { 128 });
        assert!(!(c.split_head && c.defer_dq) && (!c.split_head || c.block_q == 64));
        assert!(c.block_q.is_multiple_of(64) && c.head_dim.is_multiple_of(64));
        assert!(c.wg_cols() <= 128 && c.block_q <= 128);
        assert!(c.dq_row_splits() * c.dq_col_splits() == 2);
        assert!(c.dq_parts() >= 1 && c.dq_parts() <= 2);
        assert!(c.head_dim == c.dq_col_splits() * c.dq_parts() * 64);
        // A turn counter for each of the 8 warps within every block's rows.
        assert!(c.block_q.is_multiple_of(FLASH_BWD_TURN_ROWS));
        assert!(c.block_q / FLASH_BWD_TURN_ROWS >= c.threads() / 32);
        assert!(FLASH_BWD_PRE_ROWS.is_multiple_of(c.block_q));
        assert!(c.smem_bytes() <= 227 * 1024);
        assert!(c.stages == if c.defer_dq { 3 } else { 2 });
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

/// Shapes of one decoding launch (`decode_split_*`, then `decode_merge_*`): Q `[batch, q_heads,
/// seq_q, head_dim]` contiguous against keys and values read through a block table, so one kernel
/// serves a dense cache and a paged one. Key `j` of sequence `b`, key/value head `h`, lives at
/// element `page * page_stride + (j % page_size) * row_stride + h * head_stride` of K (and V), with
/// `page = block_table[b * max_pages + j / page_size]` (or `b` with an empty table); sequence `b` has
/// `seq_lens[b]` keys (or `dense_len`). Query
/// head `hq` reads key/value head `hq / (q_heads / kv_heads)` (GQA). Causal: query row `i` sees key
/// `j` iff `j <= i + seq_lens[b] - seq_q`. Split `s` covers keys `s * keys_per_split ..` and writes
/// its normalised partial O (f32) and LSE; the merge kernel combines the splits through the LSEs.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DecodeShape {
    pub batch: u32,
    pub q_heads: u32,
    pub kv_heads: u32,
    pub seq_q: u32,
    /// Q's, the cache's and O's head dim: a multiple of 8 up to the kernel's tile (64, 128 or
    /// 256; the columns past it are zero-filled on load and not stored).
    pub head_dim: u32,
    pub page_size: u32,
    pub max_pages: u32,
    pub keys_per_split: u32,
    pub splits: u32,
    pub mask: MaskKind,
    /// Multiplies `Q K^T` before the softmax.
    pub scale: f32,
    /// Keys of every sequence when the block table and lengths are empty (a dense cache: sequence
    /// `b` is page `b`, one page of `page_size >= dense_len` keys).
    pub dense_len: u32,
    /// A sliding window as in [`AttentionShape::window_left`] (`off = len - seq_q` per sequence;
    /// [`NO_WINDOW`]: unbounded): the splits cover the keys from the first row's first visible key.
    pub window_left: u32,
    pub window_right: u32,
    /// The logit softcap in the kernel's base-2 units (`cap log2 e`, and its inverse; 0: none):
    /// a score `s` (the scale and `log2 e` folded in) becomes `k tanh(s / k)`. The `_general_`
    /// kernels only.
    pub softcap_k: f32,
    pub softcap_inv_k: f32,
    /// Elements between pages, between a page's consecutive keys, and between heads.
    pub page_stride: u64,
    pub row_stride: u64,
    pub head_stride: u64,
    /// ALiBi slopes as [`AttentionLayout::alibi_slopes`] (0: none; f32 `[batch, heads]` with
    /// `alibi_batch` = heads, or `[heads]` with 0): query head `h` of sequence `b` subtracts
    /// `slope |i + len - seq_q - j|` from its score of key `j`, after the softcap. The `_general_`
    /// kernels only.
    pub alibi_slopes: u64,
    pub alibi_batch: u64,
}
// SAFETY: #[repr(C)], sixteen 4-byte fields then five 8-byte ones at offset 64: no padding;
// `mask` is only built from the enum on the host.
unsafe impl KernelParam for DecodeShape {}
// The kernel receives it by value: its bytes must not move when a field is edited.
const _: () = assert!(
    core::mem::size_of::<DecodeShape>() == 104 && core::mem::align_of::<DecodeShape>() == 8
);

/// Threads of a decoding CTA: four warps; each warp's lanes work in groups of 8 (16 at the
/// 256-column tile), a group on two keys at a time.
pub const DECODE_THREADS: u32 = 128;
/// Keys of one shared-memory tile of K and of V: 16 lane groups x 4 keys each (8 x 8 at the
/// 256-column tile).
pub const DECODE_TILE_KEYS: u32 = 64;
/// Tiles in flight: `cp.async` fills the next `DECODE_STAGES - 1` while the CTA reads one.
pub const DECODE_STAGES: u32 = 3;
/// Dynamic shared memory of a decoding CTA at head dim `d`: `DECODE_STAGES` tiles of K and of V,
/// 16-bit elements (96 KiB at d = 128, so two CTAs share an SM; 192 KiB at 256, one).
pub const fn decode_smem_bytes(d: u32) -> u32 {
    DECODE_STAGES * 2 * DECODE_TILE_KEYS * d * 2
}
/// The most splits a decoding launch uses (the merge kernel holds one weight a split in shared
/// memory): two CTAs an SM fill 256 SMs.
pub const DECODE_MAX_SPLITS: u32 = 512;
/// Query rows a pass of a decoding CTA holds in registers (more rows take more passes over the
/// split's keys, which then come from L2).
pub const DECODE_ROWS: u32 = 4;
