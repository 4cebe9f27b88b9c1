//! Q2_K … Q6_K against Q8_K activations with NEON: the codes of each 16- or 32-weight group
//! become signed bytes, meet the activation bytes in [`Dot`], and the group's sum (`addv`)
//! is multiplied by its integer scale; the super-block's exact integer sum meets the float
//! scales once. Mins use Q8_K's sums per 16 (`bsums`), as on x86.
//!
//! # Safety
//! Every function needs NEON, plus what its [`Dot`] needs, enabled by the caller.

use super::super::{scales_mins_k4, scales_q3_K};
use super::*;
use ch06::quants::blocks::*;

/// `Σ codes · y` over 16 weights.
#[inline(always)]
unsafe fn sum16<D: Dot>(codes: int8x16_t, y: int8x16_t) -> i32 {
    // SAFETY: NEON on registers and `D::dot`, which the caller enables.
    unsafe { vaddvq_s32(D::dot(vdupq_n_s32(0), codes, y)) }
}

/// `Σ codes · y` over 32 weights.
#[inline(always)]
unsafe fn sum32<D: Dot>(c: (int8x16_t, int8x16_t), y: (int8x16_t, int8x16_t)) -> i32 {
    // SAFETY: NEON on registers and `D::dot`, which the caller enables.
    unsafe { vaddvq_s32(D::dot(D::dot(vdupq_n_s32(0), c.0, y.0), c.1, y.1)) }
}

/// 32 bytes of `s` from element `i` on, as two registers.
#[inline(always)]
unsafe fn load32_at<T: Copy>(s: &[T], i: usize) -> (uint8x16_t, uint8x16_t) {
    let half = 16 / size_of::<T>();
    // SAFETY: `load16_at` bounds-checks both 16-byte halves; NEON is enabled by the caller.
    unsafe {
        (
            vreinterpretq_u8_s8(load16_at(s, i)),
            vreinterpretq_u8_s8(load16_at(s, i + half)),
        )
    }
}

/// `Σ_j mins[j] · (bsums[2j] + bsums[2j+1])` for Q4_K/Q5_K.
#[inline(always)]
unsafe fn mins_dot_bsums(mins: u64, bsums: &[i16; 16]) -> i32 {
    // SAFETY: the two loads read `bsums[0..8]` and `bsums[8..16]`, bounds-checked; the rest is NEON
    // on registers, which the caller enables.
    unsafe {
        let b = vreinterpretq_s16_s8(load16_at(bsums, 0));
        let b2 = vreinterpretq_s16_s8(load16_at(bsums, 8));
        let pairs = vpaddq_s16(b, b2);
        let m = vreinterpretq_s16_u16(vmovl_u8(vcreate_u8(mins)));
        let prod = vmlal_high_s16(vmull_s16(vget_low_s16(m), vget_low_s16(pairs)), m, pairs);
        vaddvq_s32(prod)
    }
}

/// `ggml_vec_dot_q2_K_q8_K` with NEON.
#[inline(always)]
pub(super) unsafe fn vec_dot_q2_K_q8_K<D: Dot>(x: &[BlockQ2_K], y: &[BlockQ8_K]) -> f32 {
    // SAFETY: every load is a bounds-checked part of a field of the zipped blocks (`load16_at`,
    // `load32_at`); the instructions are NEON and `D`'s, which the caller enables.
    unsafe {
        let mut sumf = 0.0f32;
        for (x, y) in x.iter().zip(y) {
            let d = y.d * fp16(x.d);
            let dmin = y.d * fp16(x.dmin);
            // Mins in the high nibbles, against the 16 sums of 16.
            let packed = vreinterpretq_u8_s8(load16_at(&x.scales, 0));
            let mins = vreinterpretq_s8_u8(vshrq_n_u8::<4>(packed));
            let b0 = vreinterpretq_s16_s8(load16_at(&y.bsums, 0));
            let b1 = vreinterpretq_s16_s8(load16_at(&y.bsums, 8));
            let m0 = vmovl_s8(vget_low_s8(mins));
            let m1 = vmovl_high_s8(mins);
            let prod = vmlal_high_s16(vmull_s16(vget_low_s16(m0), vget_low_s16(b0)), m0, b0);
            let prod = vmlal_high_s16(vmlal_s16(prod, vget_low_s16(m1), vget_low_s16(b1)), m1, b1);
            let summs = vaddvq_s32(prod);

            let mut isum = 0i32;
            for half in 0..2 {
                let (q0, q1) = load32_at(&x.qs, 32 * half);
                for shift in 0..4 {
                    let m3 = vdupq_n_u8(3);
                    let (c0, c1) = match shift {
                        0 => (vandq_u8(q0, m3), vandq_u8(q1, m3)),
                        1 => (
                            vandq_u8(vshrq_n_u8::<2>(q0), m3),
                            vandq_u8(vshrq_n_u8::<2>(q1), m3),
                        ),
                        2 => (
                            vandq_u8(vshrq_n_u8::<4>(q0), m3),
                            vandq_u8(vshrq_n_u8::<4>(q1), m3),
                        ),
                        _ => (vshrq_n_u8::<6>(q0), vshrq_n_u8::<6>(q1)),
                    };
                    let g = 8 * half + 2 * shift;
                    let yo = 128 * half + 32 * shift;
                    let s0 = sum16::<D>(vreinterpretq_s8_u8(c0), load16_at(&y.qs, yo));
                    let s1 = sum16::<D>(vreinterpretq_s8_u8(c1), load16_at(&y.qs, yo + 16));
                    isum += s0 * (x.scales[g] & 0xF) as i32 + s1 * (x.scales[g + 1] & 0xF) as i32;
                }
            }
            sumf += d * isum as f32 - dmin * summs as f32;
        }
        sumf
    }
}

/// `ggml_vec_dot_q3_K_q8_K` with NEON: codes `low - 4` where the high bit is clear.
#[inline(always)]
pub(super) unsafe fn vec_dot_q3_K_q8_K<D: Dot>(x: &[BlockQ3_K], y: &[BlockQ8_K]) -> f32 {
    // SAFETY: as in `vec_dot_q2_K_q8_K`; besides, `vld1q_u32` reads the four words of a
    // temporary array and `vst1q_s8` writes the 16 bytes of the local `scales`.
    unsafe {
        let mut sumf = 0.0f32;
        for (x, y) in x.iter().zip(y) {
            let d = y.d * fp16(x.d);
            let mut scales = [0i8; 16];
            let biased = vreinterpretq_s8_u32(vld1q_u32(scales_q3_K(&x.scales).as_ptr()));
            vst1q_s8(scales.as_mut_ptr(), vsubq_s8(biased, vdupq_n_s8(32)));
            let (h0, h1) = load32_at(&x.hmask, 0);
            let mut isum = 0i32;
            for half in 0..2 {
                let (q0, q1) = load32_at(&x.qs, 32 * half);
                for shift in 0..4 {
                    let m3 = vdupq_n_u8(3);
                    let (l0, l1) = match shift {
                        0 => (vandq_u8(q0, m3), vandq_u8(q1, m3)),
                        1 => (
                            vandq_u8(vshrq_n_u8::<2>(q0), m3),
                            vandq_u8(vshrq_n_u8::<2>(q1), m3),
                        ),
                        2 => (
                            vandq_u8(vshrq_n_u8::<4>(q0), m3),
                            vandq_u8(vshrq_n_u8::<4>(q1), m3),
                        ),
                        _ => (vshrq_n_u8::<6>(q0), vshrq_n_u8::<6>(q1)),
                    };
                    let bit = vdupq_n_u8(1 << (4 * half + shift));
                    let four = vdupq_n_u8(4);
                    let c0 = vsubq_s8(
                        vreinterpretq_s8_u8(l0),
                        vreinterpretq_s8_u8(vbicq_u8(four, vtstq_u8(h0, bit))),
                    );
                    let c1 = vsubq_s8(
                        vreinterpretq_s8_u8(l1),
                        vreinterpretq_s8_u8(vbicq_u8(four, vtstq_u8(h1, bit))),
                    );
                    let g = 8 * half + 2 * shift;
                    let yo = 128 * half + 32 * shift;
                    let s0 = sum16::<D>(c0, load16_at(&y.qs, yo));
                    let s1 = sum16::<D>(c1, load16_at(&y.qs, yo + 16));
                    isum += s0 * scales[g] as i32 + s1 * scales[g + 1] as i32;
                }
            }
            sumf += d * isum as f32;
        }
        sumf
    }
}

/// `ggml_vec_dot_q4_K_q8_K` with NEON.
#[inline(always)]
pub(super) unsafe fn vec_dot_q4_K_q8_K<D: Dot>(x: &[BlockQ4_K], y: &[BlockQ8_K]) -> f32 {
    // SAFETY: as in `vec_dot_q2_K_q8_K`: bounds-checked loads of the blocks' fields, and the
    // caller's instruction sets.
    unsafe {
        let mut sumf = 0.0f32;
        for (x, y) in x.iter().zip(y) {
            let d = y.d * fp16(x.d);
            let dmin = y.d * fp16(x.dmin);
            let (scales, mins) = scales_mins_k4(&x.scales);
            let summs = mins_dot_bsums(mins, &y.bsums);
            let m4 = vdupq_n_u8(0x0F);
            let mut isum = 0i32;
            for j in 0..4 {
                let (q0, q1) = load32_at(&x.qs, 32 * j);
                let lo = (vandq_u8(q0, m4), vandq_u8(q1, m4));
                let hi = (vshrq_n_u8::<4>(q0), vshrq_n_u8::<4>(q1));
                let s = |v: (uint8x16_t, uint8x16_t)| {
                    (vreinterpretq_s8_u8(v.0), vreinterpretq_s8_u8(v.1))
                };
                let y_lo = (load16_at(&y.qs, 64 * j), load16_at(&y.qs, 64 * j + 16));
                let y_hi = (load16_at(&y.qs, 64 * j + 32), load16_at(&y.qs, 64 * j + 48));
                let (p_lo, p_hi) = (sum32::<D>(s(lo), y_lo), sum32::<D>(s(hi), y_hi));
                isum += p_lo * (scales >> (16 * j)) as u8 as i32
                    + p_hi * (scales >> (16 * j + 8)) as u8 as i32;
            }
            sumf += d * isum as f32 - dmin * summs as f32;
        }
        sumf
    }
}

/// `ggml_vec_dot_q5_K_q8_K` with NEON: Q4_K plus bit `2j` (low nibbles) or `2j + 1` (high)
/// of `qh` as bit 4.
#[inline(always)]
pub(super) unsafe fn vec_dot_q5_K_q8_K<D: Dot>(x: &[BlockQ5_K], y: &[BlockQ8_K]) -> f32 {
    // SAFETY: as in `vec_dot_q2_K_q8_K`: bounds-checked loads of the blocks' fields, and the
    // caller's instruction sets.
    unsafe {
        let mut sumf = 0.0f32;
        for (x, y) in x.iter().zip(y) {
            let d = y.d * fp16(x.d);
            let dmin = y.d * fp16(x.dmin);
            let (scales, mins) = scales_mins_k4(&x.scales);
            let summs = mins_dot_bsums(mins, &y.bsums);
            let m4 = vdupq_n_u8(0x0F);
            let (one, two) = (vdupq_n_u8(1), vdupq_n_u8(2));
            let (mut h0, mut h1) = load32_at(&x.qh, 0);
            let mut isum = 0i32;
            for j in 0..4 {
                let (q0, q1) = load32_at(&x.qs, 32 * j);
                let lo0 = vorrq_u8(vandq_u8(q0, m4), vshlq_n_u8::<4>(vandq_u8(h0, one)));
                let lo1 = vorrq_u8(vandq_u8(q1, m4), vshlq_n_u8::<4>(vandq_u8(h1, one)));
                let hi0 = vorrq_u8(vshrq_n_u8::<4>(q0), vshlq_n_u8::<3>(vandq_u8(h0, two)));
                let hi1 = vorrq_u8(vshrq_n_u8::<4>(q1), vshlq_n_u8::<3>(vandq_u8(h1, two)));
                (h0, h1) = (vshrq_n_u8::<2>(h0), vshrq_n_u8::<2>(h1));
                let s =
                    |a: uint8x16_t, b: uint8x16_t| (vreinterpretq_s8_u8(a), vreinterpretq_s8_u8(b));
                let y_lo = (load16_at(&y.qs, 64 * j), load16_at(&y.qs, 64 * j + 16));
                let y_hi = (load16_at(&y.qs, 64 * j + 32), load16_at(&y.qs, 64 * j + 48));
                let (p_lo, p_hi) = (sum32::<D>(s(lo0, lo1), y_lo), sum32::<D>(s(hi0, hi1), y_hi));
                isum += p_lo * (scales >> (16 * j)) as u8 as i32
                    + p_hi * (scales >> (16 * j + 8)) as u8 as i32;
            }
            sumf += d * isum as f32 - dmin * summs as f32;
        }
        sumf
    }
}

/// `ggml_vec_dot_q6_K_q8_K` with NEON: codes `q - 32`, signed.
#[inline(always)]
pub(super) unsafe fn vec_dot_q6_K_q8_K<D: Dot>(x: &[BlockQ6_K], y: &[BlockQ8_K]) -> f32 {
    // SAFETY: as in `vec_dot_q2_K_q8_K`: bounds-checked loads of the blocks' fields, and the
    // caller's instruction sets.
    unsafe {
        let mut sumf = 0.0f32;
        for (x, y) in x.iter().zip(y) {
            let d = y.d * fp16(x.d);
            let m4 = vdupq_n_u8(0x0F);
            let m3 = vdupq_n_u8(0x03);
            let mut isum = 0i32;
            for half in 0..2 {
                let (a0, a1) = load32_at(&x.ql, 64 * half);
                let (b0, b1) = load32_at(&x.ql, 64 * half + 32);
                let (h0, h1) = load32_at(&x.qh, 32 * half);
                // Weights l, l+32, l+64, l+96 (l in 0..32) of this half, each as two registers.
                let code = |low: uint8x16_t, high2: uint8x16_t| {
                    vsubq_s8(
                        vreinterpretq_s8_u8(vorrq_u8(low, vshlq_n_u8::<4>(high2))),
                        vdupq_n_s8(32),
                    )
                };
                let c = [
                    (
                        code(vandq_u8(a0, m4), vandq_u8(h0, m3)),
                        code(vandq_u8(a1, m4), vandq_u8(h1, m3)),
                    ),
                    (
                        code(vandq_u8(b0, m4), vandq_u8(vshrq_n_u8::<2>(h0), m3)),
                        code(vandq_u8(b1, m4), vandq_u8(vshrq_n_u8::<2>(h1), m3)),
                    ),
                    (
                        code(vshrq_n_u8::<4>(a0), vandq_u8(vshrq_n_u8::<4>(h0), m3)),
                        code(vshrq_n_u8::<4>(a1), vandq_u8(vshrq_n_u8::<4>(h1), m3)),
                    ),
                    (
                        code(vshrq_n_u8::<4>(b0), vshrq_n_u8::<6>(h0)),
                        code(vshrq_n_u8::<4>(b1), vshrq_n_u8::<6>(h1)),
                    ),
                ];
                for (k, (c0, c1)) in c.into_iter().enumerate() {
                    let g = 8 * half + 2 * k;
                    let yo = 128 * half + 32 * k;
                    let s0 = sum16::<D>(c0, load16_at(&y.qs, yo));
                    let s1 = sum16::<D>(c1, load16_at(&y.qs, yo + 16));
                    isum += s0 * x.scales[g] as i32 + s1 * x.scales[g + 1] as i32;
                }
            }
            sumf += d * isum as f32;
        }
        sumf
    }
}
