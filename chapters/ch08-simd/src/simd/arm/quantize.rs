//! The activation quantizers Q8_0, Q8_1 and Q8_K with NEON, giving chapter 6's bytes exactly.
//!
//! NEON has the two roundings chapter 6 uses: `frinta` rounds half away from zero, like
//! `f32::round`, and `fcvtzs` then saturates and sends NaN to 0, like `as i8` after the
//! narrowing steps saturate too. The maximum uses `fmaxnm`, which skips a (quiet) NaN as
//! `f32::max` does. Q8_K's `nearest_int` is a float addition and two integer operations, done
//! lane by lane, and its `as i8` keeps the low byte (`xtn`).
//!
//! # Safety
//! Every function needs NEON enabled by the caller.

use super::super::first_with_abs;
use super::*;
use ch06::quants::blocks::*;
use half::f16;

/// `max(|v|)` over the floats of `x`, ignoring NaN.
#[inline(always)]
unsafe fn amax(x: &[f32]) -> f32 {
    // SAFETY: each load reads a chunk of exactly 4 floats of `x`; NEON is enabled by the caller.
    unsafe {
        let mut m = vdupq_n_f32(0.0);
        for c in x.chunks_exact(4) {
            m = vmaxnmq_f32(m, vabsq_f32(vld1q_f32(c.as_ptr())));
        }
        vmaxnmvq_f32(m)
    }
}

/// One block of 32: the scale `d` and the codes.
#[inline(always)]
unsafe fn q8_block(x: &[f32]) -> (f32, int8x16_t, int8x16_t) {
    // SAFETY: `amax` reads only inside `x`, and each load a chunk of exactly 4 of its floats; NEON
    // is enabled by the caller.
    unsafe {
        let d = amax(x) / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut q = [vdupq_n_s32(0); 8];
        for (q, c) in q.iter_mut().zip(x.chunks_exact(4)) {
            let v = vmulq_n_f32(vld1q_f32(c.as_ptr()), id);
            *q = vcvtq_s32_f32(vrndaq_f32(v));
        }
        (d, narrow(&q[..4]), narrow(&q[4..]))
    }
}

/// Sixteen 32-bit codes to bytes, saturating like `as i8`.
#[inline(always)]
unsafe fn narrow(q: &[int32x4_t]) -> int8x16_t {
    // SAFETY: NEON on registers only, which the caller enables.
    unsafe {
        let lo = vcombine_s16(vqmovn_s32(q[0]), vqmovn_s32(q[1]));
        let hi = vcombine_s16(vqmovn_s32(q[2]), vqmovn_s32(q[3]));
        vcombine_s8(vqmovn_s16(lo), vqmovn_s16(hi))
    }
}

/// `quantize_row_q8_0`.
#[inline(always)]
pub(super) unsafe fn quantize_row_q8_0(x: &[f32], y: &mut [BlockQ8_0]) {
    assert_eq!(x.len(), y.len() * QK8_0, "quantize_row_q8_0: lengths");
    for (x, y) in x.chunks_exact(QK8_0).zip(y) {
        // SAFETY: `q8_block` gets a chunk of 32 floats; the two 16-byte stores fill the block's 32
        // codes. NEON is enabled by the caller.
        unsafe {
            let (d, a, b) = q8_block(x);
            y.d = f16::from_f32(d);
            vst1q_s8(y.qs.as_mut_ptr(), a);
            vst1q_s8(y.qs.as_mut_ptr().add(16), b);
        }
    }
}

/// `quantize_row_q8_1`: Q8_0's codes and `s = d · Σ q`.
#[inline(always)]
pub(super) unsafe fn quantize_row_q8_1(x: &[f32], y: &mut [BlockQ8_1]) {
    assert_eq!(x.len(), y.len() * QK8_1, "quantize_row_q8_1: lengths");
    for (x, y) in x.chunks_exact(QK8_1).zip(y) {
        // SAFETY: as in `quantize_row_q8_0`.
        unsafe {
            let (d, a, b) = q8_block(x);
            let sum = vaddlvq_s8(a) as i32 + vaddlvq_s8(b) as i32;
            y.d = f16::from_f32(d);
            y.s = f16::from_f32(sum as f32 * d);
            vst1q_s8(y.qs.as_mut_ptr(), a);
            vst1q_s8(y.qs.as_mut_ptr().add(16), b);
        }
    }
}

/// `quantize_row_q8_K`.
#[inline(always)]
pub(super) unsafe fn quantize_row_q8_K(x: &[f32], y: &mut [BlockQ8_K]) {
    assert_eq!(x.len(), y.len() * QK_K, "quantize_row_q8_K: lengths");
    for (x, y) in x.chunks_exact(QK_K).zip(y) {
        // SAFETY: `amax` reads only inside the 256-float chunk; NEON is enabled by the caller.
        let amax = unsafe { amax(x) };
        if amax == 0.0 {
            *y = BlockQ8_K {
                d: 0.0,
                qs: [0; QK_K],
                bsums: [0; QK_K / 16],
            };
            continue;
        }
        let iscale = -127.0 / first_with_abs(x, amax);
        for (g, (xs, qs)) in x
            .chunks_exact(16)
            .zip(y.qs.chunks_exact_mut(16))
            .enumerate()
        {
            // SAFETY: each load reads a chunk of exactly 4 floats, and the store writes a chunk of
            // exactly 16 codes; NEON is enabled by the caller.
            unsafe {
                let mut q = [vdupq_n_s32(0); 4];
                for (q, c) in q.iter_mut().zip(xs.chunks_exact(4)) {
                    let v = vmulq_f32(vdupq_n_f32(iscale), vld1q_f32(c.as_ptr()));
                    // nearest_int: the rounded value sits in the low mantissa bits.
                    let bits = vreinterpretq_s32_f32(vaddq_f32(v, vdupq_n_f32(12582912.0)));
                    let n = vsubq_s32(
                        vandq_s32(bits, vdupq_n_s32(0x007f_ffff)),
                        vdupq_n_s32(0x0040_0000),
                    );
                    *q = vminq_s32(n, vdupq_n_s32(127));
                }
                // `as i8` keeps the low byte: narrow without saturation.
                let lo = vcombine_s16(vmovn_s32(q[0]), vmovn_s32(q[1]));
                let hi = vcombine_s16(vmovn_s32(q[2]), vmovn_s32(q[3]));
                let codes = vcombine_s8(vmovn_s16(lo), vmovn_s16(hi));
                vst1q_s8(qs.as_mut_ptr(), codes);
                y.bsums[g] = vaddlvq_s8(codes);
            }
        }
        y.d = 1.0 / iscale;
    }
}
