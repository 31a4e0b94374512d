//! Warp-level tensor-core matrix multiply-accumulate: `mma.sync.aligned.m16n8k16.row.col`, f16 or bf16
//! inputs, f32 accumulators (sm_80+); and `m16n8k8` with tf32 inputs ([`mma_tf32`], [`split_tf32`]:
//! the "3xTF32" fp32-accuracy form the LRP kernels use).
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

/// A fragment of an 8x8 B operand of `mma.m16n8k8` (.tf32): two registers, `b[0]` = row (k) t,
/// `b[1]` = row t+4, both of column (n) g.
pub type FragBTf32 = [u32; 2];

/// `d = a b + c` for one 16x8x8 tile with tf32 inputs and f32 accumulation:
/// `mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32` (sm_80+). The fragments follow the PTX ISA
/// with `g = lane / 4`, `t = lane % 4`: A (16x8, [`FragA`] of tf32 bit patterns): `a[0]` = (row g,
/// col t), `a[1]` = (g+8, t), `a[2]` = (g, t+4), `a[3]` = (g+8, t+4); B: see [`FragBTf32`]; C/D as for
/// m16n8k16 (`c[0], c[1]` = row g, cols 2t, 2t+1; `c[2], c[3]` = row g+8).
///
/// The hardware reads the top 19 bits of each input (sign, exponent, 10 mantissa bits); pass values
/// already rounded by [`split_tf32`].
#[inline(always)]
pub fn mma_tf32(c: FragC, a: &FragA, b: &FragBTf32) -> FragC {
    let mut d = c;
    // SAFETY: register-only warp-collective instruction; kernels call it on paths that all 32 lanes
    // take (it is not `pure`, so the compiler does not move it into a branch).
    unsafe {
        core::arch::asm!(
            "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {{{d0}, {d1}, {d2}, {d3}}}, {{{a0}, {a1}, {a2}, {a3}}}, {{{b0}, {b1}}}, {{{d0}, {d1}, {d2}, {d3}}};",
            d0 = inout(reg32) d[0], d1 = inout(reg32) d[1],
            d2 = inout(reg32) d[2], d3 = inout(reg32) d[3],
            a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],
            b0 = in(reg32) b[0], b1 = in(reg32) b[1],
            options(nostack, nomem)
        )
    }
    d
}

/// `cvt.rna.tf32.f32`: `v` rounded to tf32 (11 significant bits, to nearest, ties away from zero),
/// as an f32 bit pattern whose low 13 bits are zero. Rounding is symmetric: `tf32(-v) = -tf32(v)`.
#[inline(always)]
pub fn to_tf32(v: f32) -> u32 {
    let r: u32;
    // SAFETY: register conversion.
    unsafe {
        core::arch::asm!("cvt.rna.tf32.f32 {r}, {v};", r = out(reg32) r, v = in(reg32) v, options(nostack, nomem, pure))
    }
    r
}

/// The "3xTF32" split of an f32: `(hi, lo)` with `hi = tf32(v)` and `lo = tf32(v - hi)` (`v - hi` is
/// exact in f32). `|v - hi| <= 2^-11 |v|` and `|v - hi - lo| <= 2^-11 |v - hi| <= 2^-22 |v|`, so
/// `a b ~ a_hi b_hi + a_hi b_lo + a_lo b_hi` (three mma) within `3 * 2^-22 |a b|` (the dropped
/// `a_lo b_lo` and the two roundings of `lo`).
#[inline(always)]
pub fn split_tf32(v: f32) -> (u32, u32) {
    let hi = to_tf32(v);
    (hi, to_tf32(v - f32::from_bits(hi)))
}

/// The split of `|v|` from the split `(hi, lo)` of `v`, without a second conversion: `|v|` rounds to
/// `|hi|` (the rounding is symmetric), and its remainder is `lo` with `v`'s sign applied, which is
/// `hi`'s sign bit (also when `hi` is a signed zero). Note `lo` may have the opposite sign to `v`, so
/// `|lo|` would be wrong.
#[inline(always)]
pub fn split_abs(hi: u32, lo: u32) -> (u32, u32) {
    (hi & 0x7fff_ffff, lo ^ (hi & 0x8000_0000))
}
