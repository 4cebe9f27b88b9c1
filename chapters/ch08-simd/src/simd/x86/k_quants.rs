//! Q2_K … Q6_K against Q8_K activations, 32 weights per 32-byte register.
//!
//! A super-block of 256 weights has 8 or 16 sub-block scales. The codes are unsigned bytes
//! (offsets such as Q6_K's `- 32` are taken out afterwards), so `vpmaddubsw` multiplies them
//! with the activation's bytes and adds pairs into 16 bits; `vpmaddwd` then multiplies those
//! pairs by the sub-block's scale and adds pairs again into 32 bits. The whole super-block is
//! summed in exact integers and meets the float scales once. Mins (Q2_K, Q4_K, Q5_K) need no
//! pass over the codes at all: `Σ min · y` is `min · Σ y`, and Q8_K stores `Σ y` per 16.
//!
//! VNNI does not help here: its four-way sums would need the scales applied in 32 bits, one
//! more multiply than `vpmaddwd`'s, so the AVX-512 VNNI set runs these AVX2 kernels.
//!
//! # Safety
//! Every function needs AVX2, FMA and F16C enabled by the caller.

use super::super::{scales_mins_k4, scales_q3_K};
use super::*;
use ch06::quants::blocks::*;

/// 32 bytes of `s` from element `i` on.
#[inline(always)]
unsafe fn load32_at<T: Copy>(s: &[T], i: usize) -> __m256i {
    const { assert!(32 % size_of::<T>() == 0) };
    let part = &s[i..i + 32 / size_of::<T>()];
    // SAFETY: `part` is a bounds-checked slice of exactly 32 bytes (`T`'s size divides 32, checked
    // at compile time above), and `vmovdqu` needs no alignment; AVX comes with the caller's AVX2.
    unsafe { _mm256_loadu_si256(part.as_ptr().cast()) }
}

/// A shuffle control that copies 16-bit lane `lo` of each 128-bit half into the low half's
/// lanes and lane `hi` into the high half's: with the scales of 8 groups in both halves, it
/// gives each 16-weight half of a 32-byte register its own group's scale.
#[inline(always)]
unsafe fn pick16(lo: usize, hi: usize) -> __m256i {
    let ctl = |i: usize| (((2 * i + 1) << 8) | (2 * i)) as i16;
    // SAFETY: SSE2 and AVX on registers only, which come with the caller's AVX2.
    unsafe { _mm256_set_m128i(_mm_set1_epi16(ctl(hi)), _mm_set1_epi16(ctl(lo))) }
}

/// Eight signed bytes, widened to 16 bits and copied into both 128-bit halves.
#[inline(always)]
unsafe fn scales16(bytes: u64, signed: bool) -> __m256i {
    // SAFETY: SSE4.1 and AVX2 on registers only, which come with the caller's AVX2.
    unsafe {
        let v = _mm_cvtsi64_si128(bytes as i64);
        let wide = if signed {
            _mm_cvtepi8_epi16(v)
        } else {
            _mm_cvtepu8_epi16(v)
        };
        _mm256_broadcastsi128_si256(wide)
    }
}

/// `codes · y` for 32 weights of two 16-weight groups, scaled by the groups' 16-bit scales
/// `scale` (one per 128-bit half), as eight 32-bit sums.
#[inline(always)]
unsafe fn scaled_dot(codes: __m256i, y: __m256i, scale: __m256i) -> __m256i {
    // SAFETY: AVX2 on registers only, which the caller enables.
    unsafe { _mm256_madd_epi16(scale, _mm256_maddubs_epi16(codes, y)) }
}

/// `ggml_vec_dot_q2_K_q8_K` for AVX2.
#[inline(always)]
pub(super) unsafe fn vec_dot_q2_K_q8_K(x: &[BlockQ2_K], y: &[BlockQ8_K]) -> f32 {
    // SAFETY: AVX2, FMA and F16C, which the caller enables; every load is of a whole field of the
    // blocks the zipped iterators hand out (`load16`, `load32`) or a bounds-checked part of one
    // (`load32_at`).
    unsafe {
        let m3 = _mm256_set1_epi8(3);
        let m4 = _mm_set1_epi8(0x0F);
        let mut acc = _mm256_setzero_ps();
        for (x, y) in x.iter().zip(y) {
            let d = y.d * fp16(x.d);
            let dmin = -y.d * fp16(x.dmin);

            // Scale in the low nibble, min in the high one, per 16 weights.
            let packed = load16(&x.scales);
            let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(packed), m4));
            let mins = _mm256_madd_epi16(mins, load32(&y.bsums));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(mins), acc);

            let scales = _mm256_cvtepu8_epi16(_mm_and_si128(packed, m4));
            let mut sumi = _mm256_setzero_si256();
            for half in 0..2 {
                // Scales of groups 8·half .. 8·half + 8 in both 128-bit halves.
                let sc = if half == 0 {
                    _mm256_permute2x128_si256::<0x00>(scales, scales)
                } else {
                    _mm256_permute2x128_si256::<0x11>(scales, scales)
                };
                let mut q2 = load32_at(&x.qs, 32 * half);
                for shift in 0..4 {
                    let codes = _mm256_and_si256(q2, m3);
                    q2 = _mm256_srli_epi16::<2>(q2);
                    let q8 = load32_at(&y.qs, 128 * half + 32 * shift);
                    let p = scaled_dot(
                        codes,
                        q8,
                        _mm256_shuffle_epi8(sc, pick16(2 * shift, 2 * shift + 1)),
                    );
                    sumi = _mm256_add_epi32(sumi, p);
                }
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
        hsum(acc)
    }
}

/// `ggml_vec_dot_q3_K_q8_K` for AVX2. A code is `low - 4·(high bit clear)`; both parts are
/// unsigned, so they are multiplied separately and subtracted in 16 bits.
#[inline(always)]
pub(super) unsafe fn vec_dot_q3_K_q8_K(x: &[BlockQ3_K], y: &[BlockQ8_K]) -> f32 {
    // SAFETY: as in `vec_dot_q2_K_q8_K`: the caller's instruction sets, and loads only of the
    // blocks' own fields.
    unsafe {
        let m3 = _mm256_set1_epi8(3);
        let mut acc = _mm256_setzero_ps();
        for (x, y) in x.iter().zip(y) {
            let d = y.d * fp16(x.d);
            let [s0, s1, s2, s3] = scales_q3_K(&x.scales).map(|w| w as i32);
            let biased = _mm_setr_epi32(s0, s1, s2, s3);
            let scales = _mm256_cvtepi8_epi16(_mm_sub_epi8(biased, _mm_set1_epi8(32)));
            let hmask = load32(&x.hmask);
            let mut bit = _mm256_set1_epi8(1);
            let mut sumi = _mm256_setzero_si256();
            for half in 0..2 {
                let sc = if half == 0 {
                    _mm256_permute2x128_si256::<0x00>(scales, scales)
                } else {
                    _mm256_permute2x128_si256::<0x11>(scales, scales)
                };
                let mut q3 = load32_at(&x.qs, 32 * half);
                for shift in 0..4 {
                    let low = _mm256_and_si256(q3, m3);
                    q3 = _mm256_srli_epi16::<2>(q3);
                    // 4 where the high bit is clear, else 0.
                    let clear =
                        _mm256_cmpeq_epi8(_mm256_and_si256(hmask, bit), _mm256_setzero_si256());
                    let four = _mm256_and_si256(clear, _mm256_set1_epi8(4));
                    bit = _mm256_add_epi8(bit, bit);

                    let q8 = load32_at(&y.qs, 128 * half + 32 * shift);
                    let p = _mm256_sub_epi16(
                        _mm256_maddubs_epi16(low, q8),
                        _mm256_maddubs_epi16(four, q8),
                    );
                    let p = _mm256_madd_epi16(
                        _mm256_shuffle_epi8(sc, pick16(2 * shift, 2 * shift + 1)),
                        p,
                    );
                    sumi = _mm256_add_epi32(sumi, p);
                }
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
        hsum(acc)
    }
}

/// `Σ_j mins[j] · (bsums[2j] + bsums[2j+1])`: a Q4_K/Q5_K block's mins against Q8_K's sums
/// per 16, as four 32-bit partial sums.
#[inline(always)]
unsafe fn mins_dot_bsums(mins: u64, bsums: &[i16; 16]) -> __m128i {
    // SAFETY: `load32` reads the 32 bytes of `bsums`; the rest is AVX2 and SSSE3 on registers,
    // which the caller enables.
    unsafe {
        let b = load32(bsums);
        let pairs = _mm_hadd_epi16(_mm256_castsi256_si128(b), _mm256_extracti128_si256::<1>(b));
        _mm_madd_epi16(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(mins as i64)), pairs)
    }
}

/// `ggml_vec_dot_q4_K_q8_K` for AVX2: 64 weights per step, the low nibbles of 32 bytes and
/// then their high nibbles, each 32 with its own 6-bit scale.
#[inline(always)]
pub(super) unsafe fn vec_dot_q4_K_q8_K(x: &[BlockQ4_K], y: &[BlockQ8_K]) -> f32 {
    // SAFETY: as in `vec_dot_q2_K_q8_K`: the caller's instruction sets, and loads only of the
    // blocks' own fields.
    unsafe {
        let m4 = _mm256_set1_epi8(0x0F);
        let mut acc = _mm256_setzero_ps();
        let mut acc_m = _mm_setzero_ps();
        for (x, y) in x.iter().zip(y) {
            let d = y.d * fp16(x.d);
            let dmin = -y.d * fp16(x.dmin);
            let (scales, mins) = scales_mins_k4(&x.scales);

            let m = mins_dot_bsums(mins, &y.bsums);
            acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(m), acc_m);

            let sc = scales16(scales, false);
            let mut sumi = _mm256_setzero_si256();
            for j in 0..4 {
                let q4 = load32_at(&x.qs, 32 * j);
                let lo = _mm256_and_si256(q4, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q4), m4);
                let s_lo = _mm256_shuffle_epi8(sc, pick16(2 * j, 2 * j));
                let s_hi = _mm256_shuffle_epi8(sc, pick16(2 * j + 1, 2 * j + 1));
                let p_lo = scaled_dot(lo, load32_at(&y.qs, 64 * j), s_lo);
                let p_hi = scaled_dot(hi, load32_at(&y.qs, 64 * j + 32), s_hi);
                sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p_lo, p_hi));
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
        hsum(acc) + hsum128(acc_m)
    }
}

/// `ggml_vec_dot_q5_K_q8_K` for AVX2: Q4_K's layout plus a fifth bit per weight, bit `2j`
/// (low nibbles) and `2j + 1` (high nibbles) of `qh` for step `j`.
#[inline(always)]
pub(super) unsafe fn vec_dot_q5_K_q8_K(x: &[BlockQ5_K], y: &[BlockQ8_K]) -> f32 {
    // SAFETY: as in `vec_dot_q2_K_q8_K`: the caller's instruction sets, and loads only of the
    // blocks' own fields.
    unsafe {
        let m4 = _mm256_set1_epi8(0x0F);
        let one = _mm256_set1_epi8(1);
        let two = _mm256_set1_epi8(2);
        let mut acc = _mm256_setzero_ps();
        let mut acc_m = _mm_setzero_ps();
        for (x, y) in x.iter().zip(y) {
            let d = y.d * fp16(x.d);
            let dmin = -y.d * fp16(x.dmin);
            let (scales, mins) = scales_mins_k4(&x.scales);

            let m = mins_dot_bsums(mins, &y.bsums);
            acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(m), acc_m);

            let sc = scales16(scales, false);
            let mut qh = load32(&x.qh);
            let mut sumi = _mm256_setzero_si256();
            for j in 0..4 {
                let q5 = load32_at(&x.qs, 32 * j);
                // Bits 0 and 1 of each byte of `qh` (shifted right by 2j) move to bit 4.
                let h_lo = _mm256_slli_epi16::<4>(_mm256_and_si256(qh, one));
                let h_hi = _mm256_slli_epi16::<3>(_mm256_and_si256(qh, two));
                qh = _mm256_srli_epi16::<2>(qh);
                let lo = _mm256_or_si256(_mm256_and_si256(q5, m4), h_lo);
                let hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(q5), m4), h_hi);
                let s_lo = _mm256_shuffle_epi8(sc, pick16(2 * j, 2 * j));
                let s_hi = _mm256_shuffle_epi8(sc, pick16(2 * j + 1, 2 * j + 1));
                let p_lo = scaled_dot(lo, load32_at(&y.qs, 64 * j), s_lo);
                let p_hi = scaled_dot(hi, load32_at(&y.qs, 64 * j + 32), s_hi);
                sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p_lo, p_hi));
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
        hsum(acc) + hsum128(acc_m)
    }
}

/// `ggml_vec_dot_q6_K_q8_K` for AVX2. The codes are stored as `q + 32` in `0..64`, unsigned,
/// so the kernel multiplies those and takes `32 Σ scale · Σ y` (from `bsums`) off at the end.
#[inline(always)]
pub(super) unsafe fn vec_dot_q6_K_q8_K(x: &[BlockQ6_K], y: &[BlockQ8_K]) -> f32 {
    // SAFETY: as in `vec_dot_q2_K_q8_K`: the caller's instruction sets, and loads only of the
    // blocks' own fields.
    unsafe {
        let m4 = _mm256_set1_epi8(0x0F);
        let mut acc = _mm256_setzero_ps();
        for (x, y) in x.iter().zip(y) {
            let d = y.d * fp16(x.d);
            let scales = _mm256_cvtepi8_epi16(load16(&x.scales));
            let offset = _mm256_slli_epi32::<5>(_mm256_madd_epi16(load32(&y.bsums), scales));

            let mut sumi = _mm256_setzero_si256();
            for half in 0..2 {
                let sc = if half == 0 {
                    _mm256_permute2x128_si256::<0x00>(scales, scales)
                } else {
                    _mm256_permute2x128_si256::<0x11>(scales, scales)
                };
                let ql0 = load32_at(&x.ql, 64 * half);
                let ql1 = load32_at(&x.ql, 64 * half + 32);
                let qh = load32_at(&x.qh, 32 * half);
                // Weights l, l+32, l+64, l+96 of this half: low or high nibble of ql byte l or
                // l+32, with two bits of qh byte l on top.
                let codes = [
                    _mm256_or_si256(
                        _mm256_and_si256(ql0, m4),
                        _mm256_slli_epi16::<4>(_mm256_and_si256(qh, _mm256_set1_epi8(0x03))),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(ql1, m4),
                        _mm256_slli_epi16::<2>(_mm256_and_si256(qh, _mm256_set1_epi8(0x0C))),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
                        _mm256_and_si256(qh, _mm256_set1_epi8(0x30)),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
                        _mm256_srli_epi16::<2>(_mm256_and_si256(
                            qh,
                            _mm256_set1_epi8(0xC0u8 as i8),
                        )),
                    ),
                ];
                for (k, c) in codes.into_iter().enumerate() {
                    let q8 = load32_at(&y.qs, 128 * half + 32 * k);
                    let s = _mm256_shuffle_epi8(sc, pick16(2 * k, 2 * k + 1));
                    sumi = _mm256_add_epi32(sumi, scaled_dot(c, q8, s));
                }
            }
            sumi = _mm256_sub_epi32(sumi, offset);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
        hsum(acc)
    }
}
