//! Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 against Q8_0/Q8_1 activations, one block of 32 per
//! 32-byte register.
//!
//! Every kernel has the same shape: widen the block's codes to 32 bytes, multiply them with
//! the activation's 32 bytes and add in groups of four ([`Dot`]), giving eight exact 32-bit
//! sums; convert those to floats and multiply-add them, scaled by `d_x · d_y`, into eight float
//! lanes; add the lanes at the end. Two blocks are in flight at a time, each with its own
//! accumulator, so a block's multiply-add does not wait for the previous block's.
//!
//! # Safety
//! Every function needs AVX2, FMA and F16C, plus what its [`Dot`] needs, enabled by the
//! caller.

use super::*;
use crate::ch06::quants::blocks::*;

/// Runs `step(x_block, y_block, acc) -> acc` over the block pairs with two accumulators taking
/// turns, and returns their sum.
macro_rules! two_accumulators {
    ($x:expr, $y:expr, $step:expr) => {{
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let (mut xs, mut ys) = ($x.chunks_exact(2), $y.chunks_exact(2));
        for (xp, yp) in (&mut xs).zip(&mut ys) {
            acc0 = $step(&xp[0], &yp[0], acc0);
            acc1 = $step(&xp[1], &yp[1], acc1);
        }
        if let (Some(xb), Some(yb)) = (xs.remainder().first(), ys.remainder().first()) {
            acc0 = $step(xb, yb, acc0);
        }
        _mm256_add_ps(acc0, acc1)
    }};
}

// ANCHOR: q4_0
/// One block of [`vec_dot_q4_0_q8_0`], added into `acc`.
#[inline(always)]
pub(super) unsafe fn q4_0_step<D: Dot>(x: &BlockQ4_0, y: &BlockQ8_0, acc: __m256) -> __m256 {
    // SAFETY: the loads read fields of the two blocks (`fp16_pair`: their first 8 bytes, `nibbles`
    // and `load32`: their code arrays); the instructions are AVX2, FMA, F16C and `D`'s, which the
    // caller enables.
    unsafe {
        // ANCHOR: yours_q4_0_step
        let d = _mm256_set1_ps(fp16_pair(x).0 * fp16_pair(y).0);
        // Codes 0..16 become the weights' signed values -8..8.
        let qx = _mm256_sub_epi8(nibbles(&x.qs), _mm256_set1_epi8(8));
        let sums = dot_i8::<D>(_mm256_setzero_si256(), qx, load32(&y.qs));
        _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sums), acc)
        // ANCHOR_END: yours_q4_0_step
    }
}

/// `ggml_vec_dot_q4_0_q8_0` for AVX2: `d_x d_y Σ (q - 8) · y` per block.
#[inline(always)]
pub(super) unsafe fn vec_dot_q4_0_q8_0<D: Dot>(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
    // SAFETY: the steps get blocks the zipped chunks hold; the caller enables AVX2, FMA, F16C and
    // `D`'s set.
    unsafe { hsum(two_accumulators!(x, y, q4_0_step::<D>)) }
}
// ANCHOR_END: q4_0

// ANCHOR: q4_1
/// One block of [`vec_dot_q4_1_q8_1`], added into `acc`.
#[inline(always)]
pub(super) unsafe fn q4_1_step<D: Dot>(x: &BlockQ4_1, y: &BlockQ8_1, acc: __m256) -> __m256 {
    // SAFETY: as in `q4_0_step`: loads of the blocks' own fields, and the caller's instruction
    // sets.
    unsafe {
        let ((dx, m), (dy, s)) = (fp16_pair(x), fp16_pair(y));
        let sums = D::dot(_mm256_setzero_si256(), nibbles(&x.qs), load32(&y.qs));
        let acc = _mm256_fmadd_ps(_mm256_set1_ps(dx * dy), _mm256_cvtepi32_ps(sums), acc);
        // The min's term goes into lane 0 of the same accumulator.
        _mm256_add_ps(acc, _mm256_castps128_ps256(_mm_set_ss(m * s)))
    }
}

/// `ggml_vec_dot_q4_1_q8_1` for AVX2: `d_x d_y Σ q · y + m · s` per block. The codes are
/// unsigned, so they go straight into [`Dot`]; the min needs only `s = d_y Σ y`, which the
/// activation quantizer stored.
#[inline(always)]
pub(super) unsafe fn vec_dot_q4_1_q8_1<D: Dot>(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
    // SAFETY: as in `vec_dot_q4_0_q8_0`.
    unsafe { hsum(two_accumulators!(x, y, q4_1_step::<D>)) }
}
// ANCHOR_END: q4_1

/// The 32 five-bit codes of a Q5 block: the nibbles, with bit `i` of `qh` as bit 4 of code `i`.
#[inline(always)]
unsafe fn q5_codes<D: Dot>(qs: &[u8; 16], qh: [u8; 4]) -> __m256i {
    // SAFETY: `nibbles` reads the 16 bytes of `qs`; `D::bits` and the rest need only what the
    // caller enables.
    unsafe {
        let high = _mm256_and_si256(D::bits(qh), _mm256_set1_epi8(0x10));
        _mm256_or_si256(nibbles(qs), high)
    }
}

/// One block of [`vec_dot_q5_0_q8_0`], added into `acc`.
#[inline(always)]
pub(super) unsafe fn q5_0_step<D: Dot>(x: &BlockQ5_0, y: &BlockQ8_0, acc: __m256) -> __m256 {
    // SAFETY: as in `q4_0_step`: loads of the blocks' own fields, and the caller's instruction
    // sets.
    unsafe {
        let d = _mm256_set1_ps(fp16_pair(x).0 * fp16_pair(y).0);
        let qx = _mm256_sub_epi8(q5_codes::<D>(&x.qs, x.qh), _mm256_set1_epi8(16));
        let sums = dot_i8::<D>(_mm256_setzero_si256(), qx, load32(&y.qs));
        _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sums), acc)
    }
}

/// `ggml_vec_dot_q5_0_q8_0` for AVX2: as Q4_0 with five-bit codes, offset by 16.
#[inline(always)]
pub(super) unsafe fn vec_dot_q5_0_q8_0<D: Dot>(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 {
    // SAFETY: as in `vec_dot_q4_0_q8_0`.
    unsafe { hsum(two_accumulators!(x, y, q5_0_step::<D>)) }
}

/// One block of [`vec_dot_q5_1_q8_1`], added into `acc`.
#[inline(always)]
pub(super) unsafe fn q5_1_step<D: Dot>(x: &BlockQ5_1, y: &BlockQ8_1, acc: __m256) -> __m256 {
    // SAFETY: as in `q4_0_step`: loads of the blocks' own fields, and the caller's instruction
    // sets.
    unsafe {
        let ((dx, m), (dy, s)) = (fp16_pair(x), fp16_pair(y));
        let sums = D::dot(
            _mm256_setzero_si256(),
            q5_codes::<D>(&x.qs, x.qh),
            load32(&y.qs),
        );
        let acc = _mm256_fmadd_ps(_mm256_set1_ps(dx * dy), _mm256_cvtepi32_ps(sums), acc);
        _mm256_add_ps(acc, _mm256_castps128_ps256(_mm_set_ss(m * s)))
    }
}

/// `ggml_vec_dot_q5_1_q8_1` for AVX2: as Q4_1 with five-bit codes.
#[inline(always)]
pub(super) unsafe fn vec_dot_q5_1_q8_1<D: Dot>(x: &[BlockQ5_1], y: &[BlockQ8_1]) -> f32 {
    // SAFETY: as in `vec_dot_q4_0_q8_0`.
    unsafe { hsum(two_accumulators!(x, y, q5_1_step::<D>)) }
}

/// One block of [`vec_dot_q8_0_q8_0`], added into `acc`.
#[inline(always)]
pub(super) unsafe fn q8_0_step<D: Dot>(x: &BlockQ8_0, y: &BlockQ8_0, acc: __m256) -> __m256 {
    // SAFETY: as in `q4_0_step`: loads of the blocks' own fields, and the caller's instruction
    // sets.
    unsafe {
        let d = _mm256_set1_ps(fp16_pair(x).0 * fp16_pair(y).0);
        let sums = dot_i8::<D>(_mm256_setzero_si256(), load32(&x.qs), load32(&y.qs));
        _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sums), acc)
    }
}

/// `ggml_vec_dot_q8_0_q8_0` for AVX2. Weight codes may be -128 (only activations are kept
/// off it), which `|x|` turns into 128: still right, read as the unsigned byte it is.
#[inline(always)]
pub(super) unsafe fn vec_dot_q8_0_q8_0<D: Dot>(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    // SAFETY: as in `vec_dot_q4_0_q8_0`.
    unsafe { hsum(two_accumulators!(x, y, q8_0_step::<D>)) }
}
