//! Attention forward: FlashAttention-2 on `mma.sync` ([`flash`], the sm_80 build), its Hopper wgmma
//! form (`flash_wgmma`, the sm_90 build: compute capability 9.0 runs that build, so the `mma.sync`
//! kernel would never run there), its warp-specialised TMA form (`flash_tma`, sm_90 build) and the
//! naive reference ([`naive`], both builds). Backward:
//! FlashAttention-2 on `mma.sync` ([`flash_bwd`], both builds until a wgmma form exists) and the
//! naive reference. Ring (context-parallel) attention's LSE merge and gradient accumulation:
//! [`ring`]. Decoding against a (paged) KV cache with split keys: [`decode`].
//! Semantics, layouts and the causal convention: `params::attention`.
mod decode;
#[cfg(not(target_feature = "sm_90a"))]
mod flash;
mod flash_bwd;
#[cfg(target_feature = "sm_90a")]
mod flash_tma;
#[cfg(target_feature = "sm_90a")]
mod flash_wg_bwd;
#[cfg(target_feature = "sm_90a")]
mod flash_wgmma;
mod naive;
mod ring;

#[cfg(target_feature = "sm_90a")]
use crate::dev::math::{LOG2_E, max, rcp};
use crate::dev::mem::{Slice, SliceMut};
use crate::dev::shared::check_index;
use crate::dev::warp::warp_uniform_u32;
use crate::params::attention::{AttentionLayout, AttentionShape, HeadStrides};

/// Where batch entry `b`'s query and key sequences lie. Dense batch: rows `0..seq_q` and `0..seq_k`
/// of batch index `b`. Packed (variable-length) batch: rows `cu_q[b]..cu_q[b + 1]` and
/// `cu_k[b]..cu_k[b + 1]`, batch index 0 (the operands have no batch dim).
#[derive(Clone, Copy)]
pub(super) struct Sequence {
    /// The batch index the operands' strides take.
    pub bi: u32,
    pub q0: u32,
    pub sq: u32,
    pub k0: u32,
    pub sk: u32,
}

impl Sequence {
    /// [`Self::of`] for kernels instantiated per batch kind: a dense kernel (`PACKED` false) reads
    /// no offsets and keeps its lengths the shape's (ptxas re-reads those from the parameters
    /// instead of keeping registers for them); a packed one reads them.
    #[inline(always)]
    pub(super) fn of_kind<const PACKED: bool>(
        l: &AttentionLayout,
        p: &AttentionShape,
        b: u32,
    ) -> Self {
        if PACKED {
            Self::of(l, p, b)
        } else {
            Self {
                bi: b,
                q0: 0,
                sq: p.seq_q,
                k0: 0,
                sk: p.seq_k,
            }
        }
    }

    #[inline(always)]
    pub(super) fn of(l: &AttentionLayout, p: &AttentionShape, b: u32) -> Self {
        if l.cu_seqlens_q == 0 {
            return Self {
                bi: b,
                q0: 0,
                sq: p.seq_q,
                k0: 0,
                sk: p.seq_k,
            };
        }
        let (cq, ck) = (l.cu_seqlens_q as *const u32, l.cu_seqlens_k as *const u32);
        // SAFETY: the launcher passes `batch + 1` offsets each (b < batch: the grid's z), validated
        // nondecreasing with the last one the operand's row count.
        let (q0, q1, k0, k1) = unsafe {
            (
                *cq.add(b as usize),
                *cq.add(b as usize + 1),
                *ck.add(b as usize),
                *ck.add(b as usize + 1),
            )
        };
        // Loaded values are not known uniform to ptxas; through `warp_uniform_u32` the walks'
        // bounds stay uniform (every lane of the CTA loaded the same offsets).
        let (q0, q1, k0, k1) = (
            warp_uniform_u32(q0),
            warp_uniform_u32(q1),
            warp_uniform_u32(k0),
            warp_uniform_u32(k1),
        );
        Self {
            bi: 0,
            q0,
            sq: q1 - q0,
            k0,
            sk: k1 - k0,
        }
    }

    /// `p` with this sequence's lengths (what the masks and walks take).
    #[inline(always)]
    pub(super) fn shape(&self, p: AttentionShape) -> AttentionShape {
        AttentionShape {
            seq_q: self.sq,
            seq_k: self.sk,
            ..p
        }
    }

    /// The LSE index of query row `row` (counted in the sequence) of head `h`.
    #[inline(always)]
    pub(super) fn lse_at(&self, l: &AttentionLayout, h: u32, row: u32) -> u64 {
        self.bi as u64 * l.lse.batch + h as u64 * l.lse.head + (self.q0 + row) as u64
    }
}

/// The ALiBi slope of query head `h` of batch entry `b` in the raw-score units the forward's softmax
/// takes (it multiplies scores by `c = |scale| log2 e`, clamped away from 0): `slope log2 e / c`,
/// which is `slope / |scale|` but for a zero scale, where the bias must still count; 0 without
/// slopes ([`AttentionLayout::alibi_slopes`]).
#[cfg(target_feature = "sm_90a")]
#[inline(always)]
pub(super) fn alibi_slope(l: &AttentionLayout, p: &AttentionShape, b: u32, h: u32) -> f32 {
    if l.alibi_slopes == 0 {
        return 0.0;
    }
    // SAFETY: a nonzero address, from the launcher's validated slopes.
    let slope = unsafe { alibi_slope_at((l.alibi_slopes, l.alibi_batch), b, h) };
    // (`rcp`: a `div.rn.f32` calls a slow-path subroutine, whose call made the backward spill.)
    slope * LOG2_E * rcp(max(p.scale.abs() * LOG2_E, 1e-30))
}

/// The ALiBi slope of query head `h` of batch entry `b` as given: from the slopes at address
/// `slopes` (f32, `alibi_batch` of them a batch entry, 0 for one row shared by all), as
/// [`AttentionLayout::alibi_slopes`] and the decoding shape hold them. (The callers test for a
/// zero address, no slopes, themselves: a test in here moved the forwards' code.)
///
/// # Safety
/// `slopes` is nonzero: the launchers then pass `batch * alibi_batch + heads` slopes or more
/// (b < batch: the grid's z; h < heads).
#[inline(always)]
pub(super) unsafe fn alibi_slope_at((slopes, alibi_batch): (u64, u64), b: u32, h: u32) -> f32 {
    // SAFETY: the caller's.
    unsafe { *(slopes as *const f32).add((b as u64 * alibi_batch + h as u64) as usize) }
}

/// The rows of one head of a strided `[batch, heads, seq, D]` operand (any strides, last dim
/// contiguous: [`HeadStrides`]): row `i` starts `i * stride` elements after `ptr`. What the
/// FlashAttention kernels read Q, K, V, O and dO through, so `[B, H, S, D]` and `[B, S, H, D]`
/// memory run the same code.
pub(super) struct HeadRows<T> {
    ptr: *const T,
    /// Below 2^32 (validated): `row * stride` is one 32 x 32 -> 64-bit multiply, which matters
    /// where the backward's copies compute addresses with every register taken.
    stride: u32,
    /// The head dim: the row's elements that exist. A kernel's tile may be wider (head dims are
    /// padded up to a tile's width): its loads zero-fill the columns past `cols` and its stores
    /// skip them.
    cols: u32,
}

// A pointer and a stride: copyable whatever `T` is (a derive would ask `T: Copy`).
impl<T> Clone for HeadRows<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for HeadRows<T> {}

impl<T> HeadRows<T> {
    /// Head `h` of batch entry `b` of `x` from row `first` (a packed sequence's first row, else 0),
    /// whose `rows` rows of `d` elements (the head dim) the kernel may read (checked builds: they
    /// lie inside `x`).
    #[inline(always)]
    pub(super) fn of(
        x: Slice<T>,
        s: HeadStrides,
        (b, h): (u32, u32),
        (first, rows): (u32, u32),
        d: u32,
    ) -> Self {
        check_index(
            s.head_end(b, h, first + rows, d) as usize,
            x.len as usize + 1,
        );
        Self {
            ptr: x
                .ptr
                .wrapping_add((s.head_at(b, h) + first as u64 * s.row) as usize),
            stride: s.row as u32,
            cols: d,
        }
    }

    /// Whether the 16-byte chunk `chunk` (elements `8 chunk..8 chunk + 8`) of a row exists (head
    /// dims are multiples of 8, so a chunk is wholly in or out).
    #[inline(always)]
    pub(super) fn has_chunk(self, chunk: u32) -> bool {
        8 * chunk < self.cols
    }

    /// The address of element `col` of row `row` (in bounds for the rows given to [`Self::of`]).
    #[inline(always)]
    pub(super) fn at(self, row: u32, col: u32) -> *const T {
        self.ptr
            .wrapping_add((row as u64 * self.stride as u64) as usize + col as usize)
    }
}

/// [`HeadRows`] of an output: the rows of one head of a strided `[batch, heads, seq, D]` tensor
/// the kernel writes.
pub(super) struct HeadRowsMut<T>(HeadRows<T>);

impl<T> Clone for HeadRowsMut<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for HeadRowsMut<T> {}

impl<T> HeadRowsMut<T> {
    /// [`HeadRows::of`] for an output: the rows the kernel may write.
    #[inline(always)]
    pub(super) fn of(
        x: SliceMut<T>,
        s: HeadStrides,
        bh: (u32, u32),
        rows: (u32, u32),
        d: u32,
    ) -> Self {
        let x = Slice {
            ptr: x.ptr as *const T,
            len: x.len,
        };
        Self(HeadRows::of(x, s, bh, rows, d))
    }

    /// The address of element `col` of row `row` (in bounds for the rows given to [`Self::of`]).
    #[inline(always)]
    pub(super) fn at(self, row: u32, col: u32) -> *mut T {
        self.0.at(row, col) as *mut T
    }

    /// [`HeadRows::has_chunk`].
    #[inline(always)]
    pub(super) fn has_chunk(self, chunk: u32) -> bool {
        self.0.has_chunk(chunk)
    }
}
