//! f32 vector kernels for the non-product work of a layer (attention, RMSNorm, SwiGLU, the
//! residual add): eight lanes with AVX2 and FMA ([`Avx2`]), and sixteen with AVX-512 for the
//! two kernels that are bound by arithmetic, attention's scores and weighted sums ([`Avx512`]).
//!
//! The only function that is not a plain loop is [`exp8`]: `exp` of eight lanes by range
//! reduction (`x = n·ln 2 + r`, `|r| <= ln 2 / 2`), a degree-7 polynomial for `e^r` and `2^n`
//! written straight into the exponent bits — the way ggml's `ggml_v_expf` and every vector
//! math library do it. Its relative error is below 2⁻²³ (one f32 rounding) on the range the
//! model uses; the tests check it against `f32::exp`.
//!
//! # Safety
//! Every function needs AVX2, FMA and F16C enabled by the caller; [`Avx512`]'s also AVX-512 F.
//!
//! # The files
//!
//! - this one: [`exp8`], and SiLU on eight lanes built on it;
//! - `avx2.rs`: [`Avx2`], every kernel of [`F32Simd`] on eight lanes;
//! - `avx512.rs`: [`Avx512`], attention's scores and weighted sums on sixteen lanes, one query
//!   at a time or the query heads of a KV head together.

use super::*;
use crate::simd::F32Simd;

mod avx2;
mod avx512;

pub use avx2::Avx2;
pub use avx512::Avx512;

/// `exp`'s largest input: above it the result would pass f32's range.
const EXP_MAX: f32 = 88.0;
/// Below this the true `e^x` is under the smallest normal f32, and `exp` gives 0.
const EXP_UNDERFLOW: f32 = -87.33;
/// ln 2 in two parts, so that `n·LN2_HI` is exact for the `n` that occur.
const LN2_HI: f32 = 0.693_145_75;
const LN2_LO: f32 = 1.428_606_8e-6;
/// `e^r`'s Taylor coefficients, highest first, for Horner's rule: 1/7!, 1/6!, …, 1/1!, 1/0!.
const EXP_POLY: [f32; 8] = [
    1.0 / 5040.0,
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    0.5,
    1.0,
    1.0,
];

/// `e^x` for eight lanes. Inputs above 88 give `e^88` (they do not occur: softmax scores are
/// `<= 0` after the max is subtracted, and SiLU's `e^-x` only saturates its own result); inputs
/// below -87.3 give 0, as the true value is below the smallest normal f32; NaN stays NaN.
///
/// # Safety
/// AVX2 and FMA are enabled.
#[inline(always)]
pub unsafe fn exp8(x: __m256) -> __m256 {
    // SAFETY: AVX2 and FMA on registers only, which the caller enables (this function's contract).
    unsafe {
        // `min(88, x)` returns x when x is NaN, so NaN propagates.
        let x = _mm256_min_ps(_mm256_set1_ps(EXP_MAX), x);
        let underflow = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(EXP_UNDERFLOW));
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
        );
        // r = x - n·ln 2, with ln 2 split in two so that n·ln2_hi is exact.
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
        // e^r = 1 + r + r²/2! + … + r⁷/7!, by Horner's rule.
        let mut p = _mm256_set1_ps(EXP_POLY[0]);
        for c in &EXP_POLY[1..] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(*c));
        }
        // 2^n: the biased exponent n + 127 in bits 23..31.
        let e = _mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(127),
        ));
        _mm256_andnot_ps(underflow, _mm256_mul_ps(p, _mm256_castsi256_ps(e)))
    }
}

/// `g = silu(g)·u` for eight lanes at `g` and `u`. (A function, not a closure: a closure
/// does not inherit the caller's target features, and its intrinsics would not be inlined.)
///
/// # Safety
/// AVX2 and FMA are enabled; `u` is valid for reading 8 floats and `g` for reading and
/// writing 8.
#[inline(always)]
pub(super) unsafe fn silu_mul8(g: *mut f32, u: *const f32) {
    // SAFETY: the caller gives 8 readable floats at `u` and 8 readable and writable ones at `g`,
    // and unaligned loads and stores need no more; AVX2 and FMA are enabled by the caller.
    unsafe {
        let x = _mm256_loadu_ps(g);
        let e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
        let silu = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e));
        _mm256_storeu_ps(g, _mm256_mul_ps(silu, _mm256_loadu_ps(u)));
    }
}
