//! Element types as stored in global memory, and their conversion to the f32 that all math uses.
//!
//! f16 and bf16 are kept as `u16` bit patterns ([`F16`], [`BF16`]) and converted with PTX `cvt`; Rust's own
//! `f16` type is unstable and not dependable on nvptx. A 32-bit word holds one f32 or two halves; the
//! vectorised kernels work on 16-byte chunks of four words through [`Elem::map_word2`] and friends.

#[repr(transparent)]
#[derive(Clone, Copy)]
pub struct F16(pub u16);

#[repr(transparent)]
#[derive(Clone, Copy)]
pub struct BF16(pub u16);

#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    let f: f32;
    // SAFETY: register conversion.
    unsafe {
        core::arch::asm!("cvt.f32.f16 {f}, {h};", f = out(reg32) f, h = in(reg16) h, options(nostack, nomem, pure))
    }
    f
}
#[inline(always)]
pub fn f32_to_f16(f: f32) -> u16 {
    let h: u16;
    // SAFETY: register conversion (round to nearest even).
    unsafe {
        core::arch::asm!("cvt.rn.f16.f32 {h}, {f};", h = out(reg16) h, f = in(reg32) f, options(nostack, nomem, pure))
    }
    h
}
/// bf16 is the top half of an f32: widening is exact and needs no instruction (works on sm_80).
#[inline(always)]
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}
#[inline(always)]
pub fn f32_to_bf16(f: f32) -> u16 {
    let h: u16;
    // SAFETY: register conversion (round to nearest even; NaN stays NaN).
    unsafe {
        core::arch::asm!("cvt.rn.bf16.f32 {h}, {f};", h = out(reg16) h, f = in(reg32) f, options(nostack, nomem, pure))
    }
    h
}
/// Packs two f32 into an f16x2 word (`lo` in the low half), as `mma` A/B operands expect.
#[inline(always)]
pub fn pack_f16x2(lo: f32, hi: f32) -> u32 {
    let w: u32;
    // SAFETY: register conversion; cvt.rn.f16x2.f32 takes the high element first.
    unsafe {
        core::arch::asm!("cvt.rn.f16x2.f32 {w}, {hi}, {lo};", w = out(reg32) w, hi = in(reg32) hi, lo = in(reg32) lo, options(nostack, nomem, pure))
    }
    w
}
/// Packs two f32 into a bf16x2 word (`lo` in the low half).
#[inline(always)]
pub fn pack_bf16x2(lo: f32, hi: f32) -> u32 {
    let w: u32;
    // SAFETY: as above.
    unsafe {
        core::arch::asm!("cvt.rn.bf16x2.f32 {w}, {hi}, {lo};", w = out(reg32) w, hi = in(reg32) hi, lo = in(reg32) lo, options(nostack, nomem, pure))
    }
    w
}

/// A storage element type. All arithmetic happens in f32.
pub trait Elem: Copy {
    /// Elements per 32-bit word.
    const PER_WORD: usize;
    fn to_f32(self) -> f32;
    fn from_f32(v: f32) -> Self;
    /// Applies `f` lane-wise to the elements packed in two words.
    fn map_word2(a: u32, b: u32, f: impl Fn(f32, f32) -> f32) -> u32;
    /// Applies `f` to each element packed in a word.
    fn map_word(a: u32, f: impl Fn(f32) -> f32) -> u32;
    /// Folds the elements packed in a word into `acc`, in index order.
    fn fold_word(w: u32, acc: f32, f: impl Fn(f32, f32) -> f32) -> f32;
    /// The elements of a word, widened, in index order (`[v, 0]` when a word holds one element).
    fn unpack_word(w: u32) -> [f32; 2];
    /// A word holding `lo` (and `hi` when a word holds two elements), rounded to this type.
    fn pack_word(lo: f32, hi: f32) -> u32;
}

impl Elem for f32 {
    const PER_WORD: usize = 1;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
    #[inline(always)]
    fn map_word2(a: u32, b: u32, f: impl Fn(f32, f32) -> f32) -> u32 {
        f(f32::from_bits(a), f32::from_bits(b)).to_bits()
    }
    #[inline(always)]
    fn map_word(a: u32, f: impl Fn(f32) -> f32) -> u32 {
        f(f32::from_bits(a)).to_bits()
    }
    #[inline(always)]
    fn fold_word(w: u32, acc: f32, f: impl Fn(f32, f32) -> f32) -> f32 {
        f(acc, f32::from_bits(w))
    }
    #[inline(always)]
    fn unpack_word(w: u32) -> [f32; 2] {
        [f32::from_bits(w), 0.0]
    }
    #[inline(always)]
    fn pack_word(lo: f32, _hi: f32) -> u32 {
        lo.to_bits()
    }
}

macro_rules! half_elem {
    ($t:ident, $to:ident, $from:ident, $pack:ident) => {
        impl Elem for $t {
            const PER_WORD: usize = 2;
            #[inline(always)]
            fn to_f32(self) -> f32 {
                $to(self.0)
            }
            #[inline(always)]
            fn from_f32(v: f32) -> Self {
                $t($from(v))
            }
            #[inline(always)]
            fn map_word2(a: u32, b: u32, f: impl Fn(f32, f32) -> f32) -> u32 {
                let lo = $from(f($to(a as u16), $to(b as u16)));
                let hi = $from(f($to((a >> 16) as u16), $to((b >> 16) as u16)));
                lo as u32 | (hi as u32) << 16
            }
            #[inline(always)]
            fn map_word(a: u32, f: impl Fn(f32) -> f32) -> u32 {
                let lo = $from(f($to(a as u16)));
                let hi = $from(f($to((a >> 16) as u16)));
                lo as u32 | (hi as u32) << 16
            }
            #[inline(always)]
            fn fold_word(w: u32, acc: f32, f: impl Fn(f32, f32) -> f32) -> f32 {
                f(f(acc, $to(w as u16)), $to((w >> 16) as u16))
            }
            #[inline(always)]
            fn unpack_word(w: u32) -> [f32; 2] {
                [$to(w as u16), $to((w >> 16) as u16)]
            }
            #[inline(always)]
            fn pack_word(lo: f32, hi: f32) -> u32 {
                $pack(lo, hi)
            }
        }
    };
}
half_elem!(F16, f16_to_f32, f32_to_f16, pack_f16x2);
half_elem!(BF16, bf16_to_f32, f32_to_bf16, pack_bf16x2);

impl crate::layout::Element for F16 {
    const BYTES: usize = 2;
}
impl crate::layout::Element for BF16 {
    const BYTES: usize = 2;
}
