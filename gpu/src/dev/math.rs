//! Math on f32 through PTX: fast exp2/log2, NaN-propagating max, and erfc for GELU.
//! There is no libm on the device; these are the only transcendental functions kernels use.

/// 2^x, `ex2.approx.ftz.f32` (max relative error about 2^-22).
#[inline(always)]
pub fn exp2(x: f32) -> f32 {
    let y: f32;
    // SAFETY: register math.
    unsafe {
        core::arch::asm!("ex2.approx.ftz.f32 {y}, {x};", y = out(reg32) y, x = in(reg32) x, options(nostack, nomem, pure))
    }
    y
}

/// log2(x), `lg2.approx.ftz.f32`.
#[inline(always)]
pub fn log2(x: f32) -> f32 {
    let y: f32;
    // SAFETY: register math.
    unsafe {
        core::arch::asm!("lg2.approx.ftz.f32 {y}, {x};", y = out(reg32) y, x = in(reg32) x, options(nostack, nomem, pure))
    }
    y
}

pub const LOG2_E: f32 = core::f32::consts::LOG2_E;
pub const LN_2: f32 = core::f32::consts::LN_2;

/// e^x through exp2.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    exp2(x * LOG2_E)
}

/// tanh(x) to a relative error of about 1e-6: `1 - 2 / (e^(2x) + 1)` through [`exp2`] and
/// [`rcp`] for |x| >= 1/8, and there below the odd series to x^7 (the exp form cancels there: its
/// absolute error of about 6e-8 is a large relative one for small x). (`div.rn.f32` in its place
/// calls a slow-path subroutine, and the call made the FlashAttention backward spill 224 bytes.)
/// `tanh.approx.f32`'s relative 2^-11 is too coarse for a logit softcap, whose cap multiplies it;
/// measured: a cap of 1e6 at scale 1 (x near 1e-5) put the exp form's O 3% off the uncapped one.
/// Saturates to +-1 for large |x|.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    let x2 = x * x;
    // x - x^3/3 + 2x^5/15 - 17x^7/315: the next term is below 2e-10 x at |x| = 1/8.
    let series = x * fma(
        x2,
        fma(x2, fma(x2, -17.0 / 315.0, 2.0 / 15.0), -1.0 / 3.0),
        1.0,
    );
    let exp_form = 1.0 - 2.0 * rcp(exp2(2.0 * LOG2_E * x) + 1.0);
    if x2 < 1.0 / 64.0 { series } else { exp_form }
}

/// 1 / x, `rcp.approx.ftz.f32` (max error about 1 ulp; 0 for infinite x).
#[inline(always)]
pub fn rcp(x: f32) -> f32 {
    let y: f32;
    // SAFETY: register math.
    unsafe {
        core::arch::asm!("rcp.approx.ftz.f32 {y}, {x};", y = out(reg32) y, x = in(reg32) x, options(nostack, nomem, pure))
    }
    y
}

/// |x| (`abs.f32`: ptxas folds it into the consuming instruction's operand).
#[inline(always)]
pub fn abs(x: f32) -> f32 {
    let y: f32;
    // SAFETY: register math.
    unsafe {
        core::arch::asm!("abs.f32 {y}, {x};", y = out(reg32) y, x = in(reg32) x, options(nostack, nomem, pure))
    }
    y
}

/// Natural log through log2.
#[inline(always)]
pub fn ln(x: f32) -> f32 {
    log2(x) * LN_2
}

/// Maximum that propagates NaN (`max.NaN.f32`), so a NaN in a row shows in its max and its softmax.
#[inline(always)]
pub fn max(a: f32, b: f32) -> f32 {
    let y: f32;
    // SAFETY: register math.
    unsafe {
        core::arch::asm!("max.NaN.f32 {y}, {a}, {b};", y = out(reg32) y, a = in(reg32) a, b = in(reg32) b, options(nostack, nomem, pure))
    }
    y
}

/// Full-precision division (`div.rn.f32`), for results compared at 1e-5 relative.
#[inline(always)]
pub fn div(a: f32, b: f32) -> f32 {
    a / b
}

/// Complementary error function. Chebyshev-fitted form from Numerical Recipes (erfcc), fractional error
/// under 1.2e-7 everywhere; computing GELU as `0.5 x erfc(-x/sqrt 2)` keeps relative accuracy in the
/// negative tail, where `1 + erf` would cancel.
#[inline(always)]
pub fn erfc(x: f32) -> f32 {
    let z = if x < 0.0 { -x } else { x };
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -1.265_512_2
        + t * (1.000_023_7
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let r = t * exp(-z * z + poly);
    if x >= 0.0 { r } else { 2.0 - r }
}

pub const FRAC_1_SQRT_2: f32 = core::f32::consts::FRAC_1_SQRT_2;
/// 1/sqrt(2 pi)
pub const INV_SQRT_2PI: f32 = 0.398_942_28;

/// Standard normal CDF `Phi(x) = 0.5 erfc(-x / sqrt 2)`.
#[inline(always)]
pub fn normal_cdf(x: f32) -> f32 {
    0.5 * erfc(-x * FRAC_1_SQRT_2)
}

/// Standard normal density `phi(x) = exp(-x^2/2) / sqrt(2 pi)`.
#[inline(always)]
pub fn normal_pdf(x: f32) -> f32 {
    INV_SQRT_2PI * exp(-0.5 * x * x)
}

/// Correctly rounded square root (`sqrt.rn.f32`).
#[inline(always)]
pub fn sqrt(x: f32) -> f32 {
    let y: f32;
    // SAFETY: register math.
    unsafe {
        core::arch::asm!("sqrt.rn.f32 {y}, {x};", y = out(reg32) y, x = in(reg32) x, options(nostack, nomem, pure))
    }
    y
}

/// Fused multiply-add `a * b + c` with one rounding (`fma.rn.f32`); rustc does not contract `a * b + c`.
#[inline(always)]
pub fn fma(a: f32, b: f32, c: f32) -> f32 {
    let y: f32;
    // SAFETY: register math.
    unsafe {
        core::arch::asm!("fma.rn.f32 {y}, {a}, {b}, {c};", y = out(reg32) y, a = in(reg32) a, b = in(reg32) b, c = in(reg32) c, options(nostack, nomem, pure))
    }
    y
}
