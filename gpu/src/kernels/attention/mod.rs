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

use crate::dev::mem::{Slice, SliceMut};
use crate::dev::shared::check_index;
use crate::params::attention::HeadStrides;

/// The rows of one head of a strided `[batch, heads, seq, D]` operand (any strides, last dim
/// contiguous: [`HeadStrides`]): row `i` starts `i * stride` elements after `ptr`. What the
/// FlashAttention kernels read Q, K, V, O and dO through, so `[B, H, S, D]` and `[B, S, H, D]`
/// memory run the same code.
pub(super) struct HeadRows<T> {
    ptr: *const T,
    /// Below 2^32 (validated): `row * stride` is one 32 x 32 -> 64-bit multiply, which matters
    /// where the backward's copies compute addresses with every register taken.
    stride: u32,
}

// A pointer and a stride: copyable whatever `T` is (a derive would ask `T: Copy`).
impl<T> Clone for HeadRows<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for HeadRows<T> {}

impl<T> HeadRows<T> {
    /// Head `h` of batch entry `b` of `x`, whose first `rows` rows of `d` elements the kernel may
    /// read (checked builds: they lie inside `x`).
    #[inline(always)]
    pub(super) fn of(x: Slice<T>, s: HeadStrides, b: u32, h: u32, rows: u32, d: u32) -> Self {
        check_index(s.head_end(b, h, rows, d) as usize, x.len as usize + 1);
        Self {
            ptr: x.ptr.wrapping_add(s.head_at(b, h) as usize),
            stride: s.row as u32,
        }
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
pub(super) struct HeadRowsMut<T> {
    ptr: *mut T,
    /// Below 2^32 (validated), as [`HeadRows`]'s.
    stride: u32,
}

impl<T> Clone for HeadRowsMut<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for HeadRowsMut<T> {}

impl<T> HeadRowsMut<T> {
    /// Head `h` of batch entry `b` of `x`, whose first `rows` rows of `d` elements the kernel may
    /// write (checked builds: they lie inside `x`).
    #[inline(always)]
    pub(super) fn of(x: SliceMut<T>, s: HeadStrides, b: u32, h: u32, rows: u32, d: u32) -> Self {
        check_index(s.head_end(b, h, rows, d) as usize, x.len as usize + 1);
        Self {
            ptr: x.ptr.wrapping_add(s.head_at(b, h) as usize),
            stride: s.row as u32,
        }
    }

    /// The address of element `col` of row `row` (in bounds for the rows given to [`Self::of`]).
    #[inline(always)]
    pub(super) fn at(self, row: u32, col: u32) -> *mut T {
        self.ptr
            .wrapping_add((row as u64 * self.stride as u64) as usize + col as usize)
    }
}
