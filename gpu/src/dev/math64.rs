//! Math on f64, for per-element epilogues that must agree with an f64 CPU reference (the relevance
//! coefficients compare activation values for exact equality, so f32 rounding would change the branch).
//! No libm on the device: `exp` is a range reduction plus a Taylor polynomial (within about 1 ulp),
//! the rest is built on it. These run once per output element, never in a GEMM inner loop.

/// Round to nearest integer (ties to even), `cvt.rni.f64.f64`.
#[inline(always)]
pub fn round(x: f64) -> f64 {
    let y: f64;
    // SAFETY: register math.
    unsafe {
        core::arch::asm!("cvt.rni.f64.f64 {y}, {x};", y = out(reg64) y, x = in(reg64) x, options(nostack, nomem, pure))
    }
    y
}

/// 2^e for a normal exponent (-1022 <= e <= 1023), built from its bits.
#[inline(always)]
fn pow2(e: i32) -> f64 {
    f64::from_bits(((e + 1023) as u64) << 52)
}

const LN2_HI: f64 = 6.931_471_803_691_238_164_90e-1;
const LN2_LO: f64 = 1.908_214_929_270_587_700_02e-10;
const INV_LN2: f64 = core::f64::consts::LOG2_E;

/// e^x: `x = k ln2 + r` with |r| <= ln2/2 (Cody-Waite split of ln2), e^r by Taylor to r^14 (truncation
/// under 1e-17 relative), times 2^k applied as two factors so subnormal results come out too.
#[inline(always)]
pub fn exp(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    if x > 709.782_712_893_384 {
        return f64::INFINITY;
    }
    if x < -745.2 {
        return 0.0;
    }
    let k = round(x * INV_LN2);
    let r = (x - k * LN2_HI) - k * LN2_LO;
    // 1/n! for n = 14 down to 2.
    const C: [f64; 13] = [
        1.0 / 87_178_291_200.0,
        1.0 / 6_227_020_800.0,
        1.0 / 479_001_600.0,
        1.0 / 39_916_800.0,
        1.0 / 3_628_800.0,
        1.0 / 362_880.0,
        1.0 / 40_320.0,
        1.0 / 5_040.0,
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
    ];
    let mut p = C[0];
    crate::unroll!(n in [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12] {
        p = p * r + C[n];
    });
    let er = 1.0 + r * (1.0 + r * p);
    let ki = k as i32;
    let h = ki >> 1;
    er * pow2(h) * pow2(ki - h)
}

/// e^y - 1 without cancellation for |y| <= 1 (Taylor to y^20); through `exp` beyond.
#[inline(always)]
pub fn expm1(y: f64) -> f64 {
    if !(y.abs() <= 1.0) {
        return exp(y) - 1.0;
    }
    // Horner on 1 + y/2 (1 + y/3 (1 + ... (1 + y/20))).
    let mut p = 1.0f64;
    let mut n = 20.0f64;
    while n >= 2.0 {
        p = 1.0 + y / n * p;
        n -= 1.0;
    }
    y * p
}

/// tanh(x): `expm1(2|x|) / (expm1(2|x|) + 2)` for small |x| (no cancellation), `1 - 2 / (e^{2|x|} + 1)`
/// beyond 0.5, exactly +-1 past 22 (where f64 tanh rounds to 1 anyway).
#[inline(always)]
pub fn tanh(x: f64) -> f64 {
    let a = x.abs();
    let t = if a > 22.0 {
        1.0
    } else if a >= 0.5 {
        1.0 - 2.0 / (exp(2.0 * a) + 1.0)
    } else {
        let e = expm1(2.0 * a);
        e / (e + 2.0)
    };
    if x.is_nan() {
        x
    } else if x < 0.0 {
        -t
    } else {
        t
    }
}

/// 1 / (1 + e^-x).
#[inline(always)]
pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + exp(-x))
}
