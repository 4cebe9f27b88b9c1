//! Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 against Q8_0/Q8_1 activations with NEON: a block of 32
//! is two 16-byte registers of signed codes, multiplied with the activation's two registers
//! into four 32-bit lanes, converted, and multiply-added with the block's `d_x · d_y` into
//! four float lanes. Two blocks are in flight at a time, each with its own accumulator.
//!
//! # Safety
//! Every function needs NEON, plus what its [`Dot`] needs, enabled by the caller.

use super::*;
use crate::ch06::quants::blocks::*;

/// Runs `step(x_block, y_block, acc) -> acc` over the blocks with two accumulators taking
/// turns, and returns their sum.
macro_rules! two_accumulators {
    ($x:expr, $y:expr, $step:expr) => {{
        let mut acc0 = vdupq_n_f32(0.0);
        let mut acc1 = vdupq_n_f32(0.0);
        let (mut xs, mut ys) = ($x.chunks_exact(2), $y.chunks_exact(2));
        for (xp, yp) in (&mut xs).zip(&mut ys) {
            acc0 = $step(&xp[0], &yp[0], acc0);
            acc1 = $step(&xp[1], &yp[1], acc1);
        }
        if let (Some(xb), Some(yb)) = (xs.remainder().first(), ys.remainder().first()) {
            acc0 = $step(xb, yb, acc0);
        }
        vaddvq_f32(vaddq_f32(acc0, acc1))
    }};
}

/// The 32 nibbles of a block as two registers: low nibbles (weights 0..16), high ones
/// (weights 16..32).
#[inline(always)]
unsafe fn nibbles(qs: &[u8; 16]) -> (uint8x16_t, uint8x16_t) {
    // SAFETY: `vld1q_u8` reads the 16 bytes of `qs`, with no alignment needed; NEON is enabled by
    // the caller.
    unsafe {
        let q = vld1q_u8(qs.as_ptr());
        (vandq_u8(q, vdupq_n_u8(0x0F)), vshrq_n_u8::<4>(q))
    }
}

/// The fifth bits of a Q5 block: `0x10` in the byte of each weight whose bit is set. Each
/// byte of `qh` is copied into 8 lanes, and lane `i` tests bit `i % 8`.
#[inline(always)]
unsafe fn fifth_bits(qh: [u8; 4]) -> (uint8x16_t, uint8x16_t) {
    // SAFETY: NEON on registers only, which the caller enables.
    unsafe {
        let bit = vreinterpretq_u8_u64(vdupq_n_u64(0x8040_2010_0804_0201));
        let sixteen = vdupq_n_u8(0x10);
        let lo = vcombine_u8(vdup_n_u8(qh[0]), vdup_n_u8(qh[1]));
        let hi = vcombine_u8(vdup_n_u8(qh[2]), vdup_n_u8(qh[3]));
        (
            vandq_u8(vtstq_u8(lo, bit), sixteen),
            vandq_u8(vtstq_u8(hi, bit), sixteen),
        )
    }
}

/// The 32 codes of a Q8 block as two registers.
#[inline(always)]
unsafe fn codes(qs: &[i8; 32]) -> (int8x16_t, int8x16_t) {
    // SAFETY: `load16_at` bounds-checks both halves of the 32 codes; NEON is enabled by the caller.
    unsafe { (load16_at(qs, 0), load16_at(qs, 16)) }
}

/// `Σ x · y` of a block as four 32-bit lanes.
#[inline(always)]
unsafe fn block_sums<D: Dot>(x: (int8x16_t, int8x16_t), y: (int8x16_t, int8x16_t)) -> int32x4_t {
    // SAFETY: `D::dot` needs NEON (and `dotprod` for `Sdot`), which the caller enables.
    unsafe { D::dot(D::dot(vdupq_n_s32(0), x.0, y.0), x.1, y.1) }
}

/// Unsigned codes as signed bytes, minus `offset`.
#[inline(always)]
unsafe fn signed(c: (uint8x16_t, uint8x16_t), offset: i8) -> (int8x16_t, int8x16_t) {
    // SAFETY: NEON on registers only, which the caller enables.
    unsafe {
        let o = vdupq_n_s8(offset);
        (
            vsubq_s8(vreinterpretq_s8_u8(c.0), o),
            vsubq_s8(vreinterpretq_s8_u8(c.1), o),
        )
    }
}

// ANCHOR: q4_0
/// One block of [`vec_dot_q4_0_q8_0`], added into `acc`.
#[inline(always)]
unsafe fn q4_0_step<D: Dot>(x: &BlockQ4_0, y: &BlockQ8_0, acc: float32x4_t) -> float32x4_t {
    // SAFETY: the loads read the blocks' own fields (`fp16_fields`: their first 8 bytes; `nibbles`,
    // `codes`: their code arrays); the instructions are NEON and `D`'s, which the caller enables.
    unsafe {
        let d = vgetq_lane_f32::<0>(fp16_fields(x)) * vgetq_lane_f32::<0>(fp16_fields(y));
        let sums = block_sums::<D>(signed(nibbles(&x.qs), 8), codes(&y.qs));
        vfmaq_n_f32(acc, vcvtq_f32_s32(sums), d)
    }
}

/// `ggml_vec_dot_q4_0_q8_0` with NEON.
#[inline(always)]
pub(super) unsafe fn vec_dot_q4_0_q8_0<D: Dot>(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
    // SAFETY: the steps get blocks the zipped chunks hold; the caller enables NEON and `D`'s set.
    unsafe { two_accumulators!(x, y, q4_0_step::<D>) }
}
// ANCHOR_END: q4_0

/// One block of [`vec_dot_q4_1_q8_1`]; the min's term `m · s` goes into lane 0.
#[inline(always)]
unsafe fn q4_1_step<D: Dot>(x: &BlockQ4_1, y: &BlockQ8_1, acc: float32x4_t) -> float32x4_t {
    // SAFETY: as in `q4_0_step`: loads of the blocks' own fields, and the caller's instruction
    // sets.
    unsafe {
        // Lanes 0 and 1: `d_x d_y` and `m s`.
        let p = vmulq_f32(fp16_fields(x), fp16_fields(y));
        let sums = block_sums::<D>(signed(nibbles(&x.qs), 0), codes(&y.qs));
        let acc = vfmaq_laneq_f32::<0>(acc, vcvtq_f32_s32(sums), p);
        vaddq_f32(
            acc,
            vsetq_lane_f32::<0>(vgetq_lane_f32::<1>(p), vdupq_n_f32(0.0)),
        )
    }
}

/// `ggml_vec_dot_q4_1_q8_1` with NEON.
#[inline(always)]
pub(super) unsafe fn vec_dot_q4_1_q8_1<D: Dot>(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
    // SAFETY: as in `vec_dot_q4_0_q8_0`.
    unsafe { two_accumulators!(x, y, q4_1_step::<D>) }
}

/// The five-bit codes of a Q5 block, unsigned.
#[inline(always)]
unsafe fn q5_codes(qs: &[u8; 16], qh: [u8; 4]) -> (uint8x16_t, uint8x16_t) {
    // SAFETY: NEON on registers, and `nibbles` reads the 16 bytes of `qs`; the caller enables NEON.
    unsafe {
        let (lo, hi) = nibbles(qs);
        let (h_lo, h_hi) = fifth_bits(qh);
        (vorrq_u8(lo, h_lo), vorrq_u8(hi, h_hi))
    }
}

/// One block of [`vec_dot_q5_0_q8_0`].
#[inline(always)]
unsafe fn q5_0_step<D: Dot>(x: &BlockQ5_0, y: &BlockQ8_0, acc: float32x4_t) -> float32x4_t {
    // SAFETY: as in `q4_0_step`: loads of the blocks' own fields, and the caller's instruction
    // sets.
    unsafe {
        let d = vgetq_lane_f32::<0>(fp16_fields(x)) * vgetq_lane_f32::<0>(fp16_fields(y));
        let sums = block_sums::<D>(signed(q5_codes(&x.qs, x.qh), 16), codes(&y.qs));
        vfmaq_n_f32(acc, vcvtq_f32_s32(sums), d)
    }
}

/// `ggml_vec_dot_q5_0_q8_0` with NEON.
#[inline(always)]
pub(super) unsafe fn vec_dot_q5_0_q8_0<D: Dot>(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 {
    // SAFETY: as in `vec_dot_q4_0_q8_0`.
    unsafe { two_accumulators!(x, y, q5_0_step::<D>) }
}

/// One block of [`vec_dot_q5_1_q8_1`].
#[inline(always)]
unsafe fn q5_1_step<D: Dot>(x: &BlockQ5_1, y: &BlockQ8_1, acc: float32x4_t) -> float32x4_t {
    // SAFETY: as in `q4_0_step`: loads of the blocks' own fields, and the caller's instruction
    // sets.
    unsafe {
        let p = vmulq_f32(fp16_fields(x), fp16_fields(y));
        let sums = block_sums::<D>(signed(q5_codes(&x.qs, x.qh), 0), codes(&y.qs));
        let acc = vfmaq_laneq_f32::<0>(acc, vcvtq_f32_s32(sums), p);
        vaddq_f32(
            acc,
            vsetq_lane_f32::<0>(vgetq_lane_f32::<1>(p), vdupq_n_f32(0.0)),
        )
    }
}

/// `ggml_vec_dot_q5_1_q8_1` with NEON.
#[inline(always)]
pub(super) unsafe fn vec_dot_q5_1_q8_1<D: Dot>(x: &[BlockQ5_1], y: &[BlockQ8_1]) -> f32 {
    // SAFETY: as in `vec_dot_q4_0_q8_0`.
    unsafe { two_accumulators!(x, y, q5_1_step::<D>) }
}

/// One block of [`vec_dot_q8_0_q8_0`] (signed products: a weight of -128 needs no care).
#[inline(always)]
unsafe fn q8_0_step<D: Dot>(x: &BlockQ8_0, y: &BlockQ8_0, acc: float32x4_t) -> float32x4_t {
    // SAFETY: as in `q4_0_step`: loads of the blocks' own fields, and the caller's instruction
    // sets.
    unsafe {
        let d = vgetq_lane_f32::<0>(fp16_fields(x)) * vgetq_lane_f32::<0>(fp16_fields(y));
        let sums = block_sums::<D>(codes(&x.qs), codes(&y.qs));
        vfmaq_n_f32(acc, vcvtq_f32_s32(sums), d)
    }
}

/// `ggml_vec_dot_q8_0_q8_0` with NEON.
#[inline(always)]
pub(super) unsafe fn vec_dot_q8_0_q8_0<D: Dot>(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    // SAFETY: as in `vec_dot_q4_0_q8_0`.
    unsafe { two_accumulators!(x, y, q8_0_step::<D>) }
}
