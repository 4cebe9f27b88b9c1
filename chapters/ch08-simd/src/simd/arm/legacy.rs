//! Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 against Q8_0/Q8_1 activations with NEON: a block of 32
//! is two 16-byte registers of signed codes, multiplied with the activation's two registers
//! into four 32-bit lanes; `addv` adds those into the block's integer sum, and the rest is
//! chapter 6's arithmetic in its order — the block's float expression, added to one running
//! sum block after block — so the result is chapter 6's bit for bit (why that matters: the
//! x86 `legacy` module).
//!
//! # Safety
//! Every function needs NEON, plus what its [`Dot`] needs, enabled by the caller.

use super::*;
use ch06::quants::blocks::*;

/// Chapter 6's sum over the blocks of `$x` and `$y`: `$term(x, y, Σ)` of each block, added in
/// block order to one float, where `$sums(x, y)` gives the block's four partial integer sums.
macro_rules! in_block_order {
    ($x:expr, $y:expr, $sums:expr, $term:expr) => {{
        let mut sumf = 0.0f32;
        for (xb, yb) in $x.iter().zip($y) {
            sumf += $term(xb, yb, vaddvq_s32($sums(xb, yb)));
        }
        sumf
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
/// One Q4_0 block times one Q8_0 block: four exact partial sums of `(q - 8) · y`.
#[inline(always)]
unsafe fn q4_0_sums<D: Dot>(x: &BlockQ4_0, y: &BlockQ8_0) -> int32x4_t {
    // SAFETY: `nibbles` and `codes` read the blocks' code arrays; the instructions are NEON and
    // `D`'s, which the caller enables.
    unsafe { block_sums::<D>(signed(nibbles(&x.qs), 8), codes(&y.qs)) }
}

/// Chapter 6's expression for one block, `Σ · d_x · d_y`, in its order.
#[inline(always)]
unsafe fn q4_0_term(x: &BlockQ4_0, y: &BlockQ8_0, sumi: i32) -> f32 {
    // SAFETY: `fp16_fields` reads the first 8 bytes of each block; NEON is enabled by the caller.
    unsafe {
        sumi as f32 * vgetq_lane_f32::<0>(fp16_fields(x)) * vgetq_lane_f32::<0>(fp16_fields(y))
    }
}

/// `ggml_vec_dot_q4_0_q8_0` with NEON.
#[inline(always)]
pub(super) unsafe fn vec_dot_q4_0_q8_0<D: Dot>(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
    // SAFETY: the blocks are those the zipped slices hold; the caller enables NEON and `D`'s set.
    unsafe { in_block_order!(x, y, q4_0_sums::<D>, q4_0_term) }
}
// ANCHOR_END: q4_0

/// One Q4_1 block times one Q8_1 block: four exact partial sums of `q · y`.
#[inline(always)]
unsafe fn q4_1_sums<D: Dot>(x: &BlockQ4_1, y: &BlockQ8_1) -> int32x4_t {
    // SAFETY: as in `q4_0_sums`.
    unsafe { block_sums::<D>(signed(nibbles(&x.qs), 0), codes(&y.qs)) }
}

/// Chapter 6's expression for a block with a min, `d_x d_y · Σ + m · s` (Q4_1 and Q5_1).
#[inline(always)]
unsafe fn with_min_term<X, Y>(x: &X, y: &Y, sumi: i32) -> f32 {
    // SAFETY: as in `q4_0_term`.
    unsafe {
        let (fx, fy) = (fp16_fields(x), fp16_fields(y));
        let (dx, m) = (vgetq_lane_f32::<0>(fx), vgetq_lane_f32::<1>(fx));
        let (dy, s) = (vgetq_lane_f32::<0>(fy), vgetq_lane_f32::<1>(fy));
        (dx * dy) * sumi as f32 + m * s
    }
}

/// `ggml_vec_dot_q4_1_q8_1` with NEON.
#[inline(always)]
pub(super) unsafe fn vec_dot_q4_1_q8_1<D: Dot>(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
    // SAFETY: as in `vec_dot_q4_0_q8_0`.
    unsafe { in_block_order!(x, y, q4_1_sums::<D>, with_min_term) }
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

/// One Q5_0 block times one Q8_0 block: four exact partial sums of `(q - 16) · y`.
#[inline(always)]
unsafe fn q5_0_sums<D: Dot>(x: &BlockQ5_0, y: &BlockQ8_0) -> int32x4_t {
    // SAFETY: as in `q4_0_sums`; `q5_codes` reads the block's own fields.
    unsafe { block_sums::<D>(signed(q5_codes(&x.qs, x.qh), 16), codes(&y.qs)) }
}

/// Chapter 6's expression for one block, `d_x d_y · Σ`.
#[inline(always)]
unsafe fn q5_0_term(x: &BlockQ5_0, y: &BlockQ8_0, sumi: i32) -> f32 {
    // SAFETY: as in `q4_0_term`.
    unsafe {
        (vgetq_lane_f32::<0>(fp16_fields(x)) * vgetq_lane_f32::<0>(fp16_fields(y))) * sumi as f32
    }
}

/// `ggml_vec_dot_q5_0_q8_0` with NEON.
#[inline(always)]
pub(super) unsafe fn vec_dot_q5_0_q8_0<D: Dot>(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 {
    // SAFETY: as in `vec_dot_q4_0_q8_0`.
    unsafe { in_block_order!(x, y, q5_0_sums::<D>, q5_0_term) }
}

/// One Q5_1 block times one Q8_1 block: four exact partial sums of `q · y`.
#[inline(always)]
unsafe fn q5_1_sums<D: Dot>(x: &BlockQ5_1, y: &BlockQ8_1) -> int32x4_t {
    // SAFETY: as in `q5_0_sums`.
    unsafe { block_sums::<D>(signed(q5_codes(&x.qs, x.qh), 0), codes(&y.qs)) }
}

/// `ggml_vec_dot_q5_1_q8_1` with NEON.
#[inline(always)]
pub(super) unsafe fn vec_dot_q5_1_q8_1<D: Dot>(x: &[BlockQ5_1], y: &[BlockQ8_1]) -> f32 {
    // SAFETY: as in `vec_dot_q4_0_q8_0`.
    unsafe { in_block_order!(x, y, q5_1_sums::<D>, with_min_term) }
}

/// One Q8_0 block times one Q8_0 block: four exact partial sums of `x · y` (signed products: a
/// weight of -128 needs no care).
#[inline(always)]
unsafe fn q8_0_sums<D: Dot>(x: &BlockQ8_0, y: &BlockQ8_0) -> int32x4_t {
    // SAFETY: as in `q4_0_sums`.
    unsafe { block_sums::<D>(codes(&x.qs), codes(&y.qs)) }
}

/// Chapter 6's expression for one block, `Σ · (d_x d_y)`.
#[inline(always)]
unsafe fn q8_0_term(x: &BlockQ8_0, y: &BlockQ8_0, sumi: i32) -> f32 {
    // SAFETY: as in `q4_0_term`.
    unsafe {
        sumi as f32 * (vgetq_lane_f32::<0>(fp16_fields(x)) * vgetq_lane_f32::<0>(fp16_fields(y)))
    }
}

/// `ggml_vec_dot_q8_0_q8_0` with NEON.
#[inline(always)]
pub(super) unsafe fn vec_dot_q8_0_q8_0<D: Dot>(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    // SAFETY: as in `vec_dot_q4_0_q8_0`.
    unsafe { in_block_order!(x, y, q8_0_sums::<D>, q8_0_term) }
}
