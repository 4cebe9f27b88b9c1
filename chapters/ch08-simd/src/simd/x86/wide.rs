//! AVX-512 kernels: 64-byte registers, two legacy blocks or 128 k-quant weights at a time.
//!
//! The arithmetic is that of the 32-byte kernels; what changes is how the bytes are brought
//! together. Two legacy blocks are not adjacent in memory (a Q4_0 block's 16 code bytes sit
//! between scales), so each register is assembled from two loads, and the two blocks' scales
//! are converted together and spread over their halves of the register. AVX-512 has no
//! `vpsignb`; the signed products use `|x|` and a masked negation instead. The legacy kernels
//! then finish as the 32-byte ones do, in chapter 6's order (`legacy`'s `in_block_order!`): two
//! registers are four blocks' partial sums, taken whole together; the tail's blocks go through
//! the 32-byte kernel's sums.
//!
//! # Safety
//! Every function needs AVX2, FMA, F16C, AVX-512 F, BW and VL, plus what its [`Dot`] needs,
//! enabled by the caller.

use super::legacy::{
    add_in_order, block_totals, in_block_order, min_terms, q4_0_sums, q4_0_terms, q4_1_sums,
    q5_0_sums, q8_0_sums, scaled_terms,
};
use super::*;
use ch06::quants::blocks::*;

/// Signed-by-signed byte products on 64-byte registers: `|x| · (y · sign(x))`.
#[inline(always)]
unsafe fn dot_i8_512<D: Dot>(acc: __m512i, x: __m512i, y: __m512i) -> __m512i {
    // SAFETY: AVX-512 BW on registers and `D::dot512`, all of which the caller enables.
    unsafe {
        let negative = _mm512_movepi8_mask(x);
        let y = _mm512_mask_sub_epi8(y, negative, _mm512_setzero_si512(), y);
        D::dot512(acc, _mm512_abs_epi8(x), y)
    }
}

/// 16 code bytes of each of two legacy blocks → 64 bytes: each block's low nibbles, then its
/// high nibbles.
#[inline(always)]
unsafe fn nibbles2(q0: &[u8; 16], q1: &[u8; 16]) -> __m512i {
    // SAFETY: `load16` reads the 16 bytes of each array; the rest is AVX-512 F on registers, which
    // the caller enables.
    unsafe {
        let both =
            _mm512_mask_broadcast_i32x4(_mm512_broadcast_i32x4(load16(q0)), 0xFF00, load16(q1));
        let shift = _mm512_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4, 0, 0, 0, 0, 4, 4, 4, 4);
        _mm512_and_si512(_mm512_srlv_epi32(both, shift), _mm512_set1_epi8(0x0F))
    }
}

/// 32 bytes of each of two arrays in one register.
#[inline(always)]
unsafe fn join32<T, const N: usize>(a: &[T; N], b: &[T; N]) -> __m512i {
    // SAFETY: `load32` reads 32 bytes of each array, which has at least that many (checked at
    // compile time in `load32`); `vinserti64x4` is AVX-512 F, which the caller enables.
    unsafe { _mm512_inserti64x4::<1>(_mm512_castsi256_si512(load32(a)), load32(b)) }
}

/// The sum of 16 floats.
#[inline(always)]
unsafe fn hsum512(v: __m512) -> f32 {
    // SAFETY: AVX-512 F and AVX on registers only, which the caller enables.
    unsafe {
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
        hsum(_mm256_add_ps(_mm512_castps512_ps256(v), hi))
    }
}

/// Two registers of two blocks' partial sums each → the four blocks' eight partial sums.
#[inline(always)]
unsafe fn quarters_of(a: __m512i, b: __m512i) -> [__m256i; 4] {
    // SAFETY: AVX-512 F on registers only, which the caller enables.
    unsafe {
        [
            _mm512_castsi512_si256(a),
            _mm512_extracti64x4_epi64::<1>(a),
            _mm512_castsi512_si256(b),
            _mm512_extracti64x4_epi64::<1>(b),
        ]
    }
}

/// [`in_block_order!`] with 64-byte registers: `$pair` on blocks 0 and 1 and on 2 and 3 of
/// each four; `$one`, the 32-byte kernel's sums, on the tail.
macro_rules! two_by_two {
    ($x:expr, $y:expr, $pair:expr, $one:expr, $terms:expr) => {
        in_block_order!(
            $x,
            $y,
            |x4, y4| quarters_of($pair(&x4[..2], &y4[..2]), $pair(&x4[2..], &y4[2..])),
            $one,
            $terms
        )
    };
}

/// `ggml_vec_dot_q4_0_q8_0`, two blocks per register.
#[inline(always)]
pub(super) unsafe fn vec_dot_q4_0_q8_0<D: Dot>(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
    #[inline(always)]
    unsafe fn pair<D: Dot>(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> __m512i {
        // SAFETY: the pair's blocks are indexed with bounds checks and read only through their own
        // fields; the instructions are AVX-512 F and BW and `D`'s, which the caller enables.
        unsafe {
            let qx = _mm512_sub_epi8(nibbles2(&x[0].qs, &x[1].qs), _mm512_set1_epi8(8));
            dot_i8_512::<D>(_mm512_setzero_si512(), qx, join32(&y[0].qs, &y[1].qs))
        }
    }
    // SAFETY: `pair` and the 32-byte kernel's functions get the chunks and blocks the zipped
    // iterators hand out; the caller enables AVX-512 F, BW, VL, AVX2, FMA, F16C and `D`'s set.
    unsafe { two_by_two!(x, y, pair::<D>, q4_0_sums::<D>, q4_0_terms) }
}

/// `ggml_vec_dot_q4_1_q8_1`, two blocks per register.
#[inline(always)]
pub(super) unsafe fn vec_dot_q4_1_q8_1<D: Dot>(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
    #[inline(always)]
    unsafe fn pair<D: Dot>(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> __m512i {
        // SAFETY: as in `vec_dot_q4_0_q8_0`'s `pair`.
        unsafe {
            D::dot512(
                _mm512_setzero_si512(),
                nibbles2(&x[0].qs, &x[1].qs),
                join32(&y[0].qs, &y[1].qs),
            )
        }
    }
    // SAFETY: as in `vec_dot_q4_0_q8_0`.
    unsafe { two_by_two!(x, y, pair::<D>, q4_1_sums::<D>, min_terms) }
}

/// `ggml_vec_dot_q5_0_q8_0`, two blocks per register. AVX-512 BW turns the 64 fifth bits
/// into 64 bytes in one instruction (`vpmovm2b`).
#[inline(always)]
pub(super) unsafe fn vec_dot_q5_0_q8_0<D: Dot>(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 {
    #[inline(always)]
    unsafe fn pair<D: Dot>(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> __m512i {
        // SAFETY: as in `vec_dot_q4_0_q8_0`'s `pair`.
        unsafe {
            let bits =
                u32::from_le_bytes(x[0].qh) as u64 | (u32::from_le_bytes(x[1].qh) as u64) << 32;
            let high = _mm512_and_si512(_mm512_movm_epi8(bits), _mm512_set1_epi8(0x10));
            let codes = _mm512_or_si512(nibbles2(&x[0].qs, &x[1].qs), high);
            let qx = _mm512_sub_epi8(codes, _mm512_set1_epi8(16));
            dot_i8_512::<D>(_mm512_setzero_si512(), qx, join32(&y[0].qs, &y[1].qs))
        }
    }
    // SAFETY: as in `vec_dot_q4_0_q8_0`.
    unsafe { two_by_two!(x, y, pair::<D>, q5_0_sums::<D>, scaled_terms) }
}

/// `ggml_vec_dot_q8_0_q8_0`, two blocks per register.
#[inline(always)]
pub(super) unsafe fn vec_dot_q8_0_q8_0<D: Dot>(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    #[inline(always)]
    unsafe fn pair<D: Dot>(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> __m512i {
        // SAFETY: as in `vec_dot_q4_0_q8_0`'s `pair`.
        unsafe {
            let qx = join32(&x[0].qs, &x[1].qs);
            dot_i8_512::<D>(_mm512_setzero_si512(), qx, join32(&y[0].qs, &y[1].qs))
        }
    }
    // SAFETY: as in `vec_dot_q4_0_q8_0`.
    unsafe { two_by_two!(x, y, pair::<D>, q8_0_sums::<D>, scaled_terms) }
}

/// 64 bytes of `s` from element `i` on.
#[inline(always)]
unsafe fn load64_at<T: Copy>(s: &[T], i: usize) -> __m512i {
    const { assert!(64 % size_of::<T>() == 0) };
    let part = &s[i..i + 64 / size_of::<T>()];
    // SAFETY: `part` is a bounds-checked slice of exactly 64 bytes (`T`'s size divides 64, checked
    // at compile time above), and `vmovdqu64` needs no alignment; AVX-512 F is enabled by the
    // caller.
    unsafe { _mm512_loadu_si512(part.as_ptr().cast()) }
}

/// 32 bytes of `s` at element `i` and 32 at element `j`, in one register.
#[inline(always)]
unsafe fn load2x32_at<T: Copy>(s: &[T], i: usize, j: usize) -> __m512i {
    const { assert!(32 % size_of::<T>() == 0) };
    let (a, b) = (
        &s[i..i + 32 / size_of::<T>()],
        &s[j..j + 32 / size_of::<T>()],
    );
    // SAFETY: `a` and `b` are bounds-checked slices of exactly 32 bytes each (`T`'s size divides
    // 32, checked at compile time above); the loads need no alignment, and AVX-512 F is enabled by
    // the caller.
    unsafe {
        let lo = _mm256_loadu_si256(a.as_ptr().cast());
        _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(lo),
            _mm256_loadu_si256(b.as_ptr().cast()),
        )
    }
}

/// A `vpermw` index giving each 128-bit quarter of a register the 16-bit lane `q[k]`.
#[inline(always)]
unsafe fn quarters(q: [i16; 4]) -> __m512i {
    // SAFETY: AVX-512 F and AVX on registers only, which the caller enables.
    unsafe {
        _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(_mm256_set_m128i(_mm_set1_epi16(q[1]), _mm_set1_epi16(q[0]))),
            _mm256_set_m128i(_mm_set1_epi16(q[3]), _mm_set1_epi16(q[2])),
        )
    }
}

/// `ggml_vec_dot_q4_K_q8_K`, 128 weights per step: 64 code bytes hold weights
/// `0..32, 64..96` in their low nibbles and `32..64, 96..128` in their high ones, so the
/// activations are loaded in that order too.
#[inline(always)]
pub(super) unsafe fn vec_dot_q4_K_q8_K(x: &[BlockQ4_K], y: &[BlockQ8_K]) -> f32 {
    // SAFETY: every load is of a whole field of the zipped blocks or a bounds-checked part of one
    // (`load64_at`, `load2x32_at`); the instructions are AVX-512 F and BW, AVX2, FMA and F16C,
    // which the caller enables.
    unsafe {
        let m4 = _mm512_set1_epi8(0x0F);
        let mut acc = _mm512_setzero_ps();
        let mut acc_m = _mm_setzero_ps();
        for (x, y) in x.iter().zip(y) {
            let d = y.d * fp16(x.d);
            let dmin = -y.d * fp16(x.dmin);
            let (scales, mins) = super::super::scales_mins_k4(&x.scales);

            let b = load32(&y.bsums);
            let pairs = _mm_hadd_epi16(_mm256_castsi256_si128(b), _mm256_extracti128_si256::<1>(b));
            let m = _mm_madd_epi16(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(mins as i64)), pairs);
            acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(m), acc_m);

            let sc = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(scales as i64)));
            let mut sumi = _mm512_setzero_si512();
            for h in 0..2 {
                let q4 = load64_at(&x.qs, 64 * h);
                let lo = _mm512_and_si512(q4, m4);
                let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(q4), m4);
                let y_lo = load2x32_at(&y.qs, 128 * h, 128 * h + 64);
                let y_hi = load2x32_at(&y.qs, 128 * h + 32, 128 * h + 96);
                // Sub-blocks 4h, 4h+2 for the low nibbles; 4h+1, 4h+3 for the high.
                let j = 4 * h as i16;
                let s_lo = _mm512_permutexvar_epi16(quarters([j, j, j + 2, j + 2]), sc);
                let s_hi = _mm512_permutexvar_epi16(quarters([j + 1, j + 1, j + 3, j + 3]), sc);
                let p_lo = _mm512_madd_epi16(s_lo, _mm512_maddubs_epi16(lo, y_lo));
                let p_hi = _mm512_madd_epi16(s_hi, _mm512_maddubs_epi16(hi, y_hi));
                sumi = _mm512_add_epi32(sumi, _mm512_add_epi32(p_lo, p_hi));
            }
            acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc);
        }
        hsum512(acc) + hsum128(acc_m)
    }
}

/// `ggml_vec_dot_q6_K_q8_K`, 128 weights per step: the 64 `ql` bytes of a half super-block
/// give weights `0..64` from their low nibbles and `64..128` from their high ones, each with
/// two bits from the same 32 `qh` bytes, loaded twice.
#[inline(always)]
pub(super) unsafe fn vec_dot_q6_K_q8_K(x: &[BlockQ6_K], y: &[BlockQ8_K]) -> f32 {
    // SAFETY: as in `vec_dot_q4_K_q8_K`; the `qh` load reads 32 bytes from `x.qh[32h..]`, `h < 2`,
    // inside its 64.
    unsafe {
        let m4 = _mm512_set1_epi8(0x0F);
        let m3 = _mm512_set1_epi8(0x03);
        let mut acc = _mm256_setzero_ps();
        for (x, y) in x.iter().zip(y) {
            let d = y.d * fp16(x.d);
            let scales = _mm256_cvtepi8_epi16(load16(&x.scales));
            let offset = _mm256_slli_epi32::<5>(_mm256_madd_epi16(load32(&y.bsums), scales));
            let sc = _mm512_castsi256_si512(scales);

            let mut sumi = _mm512_setzero_si512();
            for h in 0..2 {
                let ql = load64_at(&x.ql, 64 * h);
                let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(x.qh[32 * h..].as_ptr().cast()));
                // Bits 0-1 (weights 0..32) and 2-3 (32..64) of qh under the low nibbles;
                // bits 4-5 (64..96) and 6-7 (96..128) under the high ones.
                let shift_lo = _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2);
                let shift_hi = _mm512_setr_epi64(4, 4, 4, 4, 6, 6, 6, 6);
                let h_lo = _mm512_and_si512(_mm512_srlv_epi64(qh, shift_lo), m3);
                let h_hi = _mm512_and_si512(_mm512_srlv_epi64(qh, shift_hi), m3);
                let c_lo = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_slli_epi16::<4>(h_lo));
                let c_hi = _mm512_or_si512(
                    _mm512_and_si512(_mm512_srli_epi16::<4>(ql), m4),
                    _mm512_slli_epi16::<4>(h_hi),
                );
                let g = 8 * h as i16;
                let s_lo = _mm512_permutexvar_epi16(quarters([g, g + 1, g + 2, g + 3]), sc);
                let s_hi = _mm512_permutexvar_epi16(quarters([g + 4, g + 5, g + 6, g + 7]), sc);
                let p_lo = _mm512_maddubs_epi16(c_lo, load64_at(&y.qs, 128 * h));
                let p_hi = _mm512_maddubs_epi16(c_hi, load64_at(&y.qs, 128 * h + 64));
                let p =
                    _mm512_add_epi32(_mm512_madd_epi16(s_lo, p_lo), _mm512_madd_epi16(s_hi, p_hi));
                sumi = _mm512_add_epi32(sumi, p);
            }
            let sumi = _mm256_add_epi32(
                _mm512_castsi512_si256(sumi),
                _mm512_extracti64x4_epi64::<1>(sumi),
            );
            let sumi = _mm256_sub_epi32(sumi, offset);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
        hsum(acc)
    }
}

/// F32 · F32: four accumulators of 16 lanes, 64 elements per step; the tail as in the 32-byte
/// kernel.
#[inline(always)]
pub(super) unsafe fn vec_dot_f32(n: usize, x: &[u8], y: &[u8]) -> f32 {
    assert!(
        x.len() == n * 4 && y.len() == n * 4,
        "vec_dot_f32: {n} elements need {} bytes, got {} and {}",
        n * 4,
        x.len(),
        y.len()
    );
    // SAFETY: each 64-byte load starts at `64k`, `k < 4`, of a 256-byte chunk; the tail goes
    // through the checked 32-byte kernel. AVX-512 F, AVX2, FMA and F16C are enabled by the caller.
    unsafe {
        let mut acc = [_mm512_setzero_ps(); 4];
        let (xs, ys) = (x.chunks_exact(256), y.chunks_exact(256));
        let (xt, yt) = (xs.remainder(), ys.remainder());
        for (xc, yc) in xs.zip(ys) {
            for (k, a) in acc.iter_mut().enumerate() {
                let xv = _mm512_loadu_ps(xc[64 * k..].as_ptr().cast());
                let yv = _mm512_loadu_ps(yc[64 * k..].as_ptr().cast());
                *a = _mm512_fmadd_ps(xv, yv, *a);
            }
        }
        let sum = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
        hsum512(sum) + float::vec_dot_f32(xt.len() / 4, xt, yt)
    }
}
