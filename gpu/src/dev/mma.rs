//! Warp-level tensor-core matrix multiply-accumulate: `mma.sync.aligned.m16n8k16.row.col`, f16 or bf16
//! inputs, f32 accumulators (sm_80+).
//!
//! # The hardware model
//! One `mma.m16n8k16` is issued by a whole warp and computes `D = A B + C` for a 16x16 A, a 16x8 B
//! and a 16x8 C/D; every lane holds a fixed *fragment* of each operand in registers. With
//! `g = lane / 4` (the group) and `t = lane % 4` (the thread in the group), per the PTX ISA:
//! - A ([`FragA`], four 32-bit registers of two 16-bit elements, low half first):
//!   `a[0]` = row g, cols 2t, 2t+1; `a[1]` = row g+8, same cols; `a[2]` = row g, cols 2t+8, 2t+9;
//!   `a[3]` = row g+8, cols 2t+8, 2t+9.
//! - B (two registers): `b[0]` = rows (k) 2t, 2t+1 of column (n) g; `b[1]` = rows 2t+8, 2t+9.
//! - C/D ([`FragC`], four f32): `c[0], c[1]` = row g, cols 2t, 2t+1; `c[2], c[3]` = row g+8, same.
//!
//! Note that the accumulator of two adjacent n-tiles (`c` of columns 0-7 and of 8-15) holds exactly
//! the elements an A fragment of a 16x16 block needs: a product can be fed back as the A operand of
//! the next `mma` after converting to 16-bit, with no data exchange between lanes (FlashAttention's
//! P V). `ldmatrix` (see [`crate::dev::copy`]) loads A and B fragments from shared memory.
use crate::dev::elem::{BF16, Elem, F16, pack_bf16x2, pack_f16x2};

/// A fragment of a 16x16 A operand: four registers of two 16-bit elements.
pub type FragA = [u32; 4];
/// A fragment of a 16x8 B operand: two registers of two 16-bit elements.
pub type FragB = [u32; 2];
/// A fragment of a 16x8 f32 accumulator.
pub type FragC = [f32; 4];

/// 16-bit element types the tensor cores multiply (f32 accumulation).
pub trait MmaElem: Elem + crate::layout::Element {
    /// `d += a b` for one 16x8x16 tile (warp-collective).
    fn mma(d: &mut FragC, a: &FragA, b: FragB);
    /// Two f32 rounded to this type and packed (`lo` in the low half), as A/B registers hold them.
    fn pack2(lo: f32, hi: f32) -> u32;
}

macro_rules! mma_elem {
    ($t:ty, $ptx:literal, $pack:ident) => {
        impl MmaElem for $t {
            #[inline(always)]
            fn mma(d: &mut FragC, a: &FragA, b: FragB) {
                // SAFETY: register-only warp-collective instruction; kernels call it on paths that
                // all 32 lanes take (it is not `pure`, so the compiler does not move it into a branch).
                unsafe {
                    core::arch::asm!(
                        concat!("mma.sync.aligned.m16n8k16.row.col.f32.", $ptx, ".", $ptx, ".f32 ",
                            "{{{d0}, {d1}, {d2}, {d3}}}, {{{a0}, {a1}, {a2}, {a3}}}, {{{b0}, {b1}}}, ",
                            "{{{d0}, {d1}, {d2}, {d3}}};"),
                        d0 = inout(reg32) d[0], d1 = inout(reg32) d[1],
                        d2 = inout(reg32) d[2], d3 = inout(reg32) d[3],
                        a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],
                        b0 = in(reg32) b[0], b1 = in(reg32) b[1],
                        options(nostack, nomem)
                    )
                }
            }
            #[inline(always)]
            fn pack2(lo: f32, hi: f32) -> u32 {
                $pack(lo, hi)
            }
        }
    };
}
mma_elem!(F16, "f16", pack_f16x2);
mma_elem!(BF16, "bf16", pack_bf16x2);
