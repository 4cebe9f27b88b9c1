//! F32, F16 and BF16 rows: four accumulators of eight f32 lanes, 32 elements per step.
//!
//! Chapter 6 adds the products in f64; these add them in f32, as ggml's SIMD `ggml_vec_dot_f32`
//! does, each lane summing one in 32 of the products. The tail (fewer than 32 elements) is
//! added one by one into lane 0.
//!
//! The rows are little-endian bytes, read with unaligned loads, so F16/BF16 rows need no
//! alignment and F32 rows need no cast.
//!
//! # Safety
//! Every function needs AVX2, FMA and F16C enabled by the caller.

use super::*;

/// An element format: its width in bytes and how 8 of them, or one, become f32.
trait Elem {
    const WIDTH: usize;
    /// Eight elements from the first `8 * WIDTH` bytes of `b`.
    ///
    /// # Safety
    /// AVX2 and F16C are enabled; `b` holds at least `8 * WIDTH` bytes.
    unsafe fn load8(b: &[u8]) -> __m256;
    /// One element from the first `WIDTH` bytes of `b`.
    ///
    /// # Safety
    /// F16C is enabled.
    unsafe fn one(b: &[u8]) -> f32;
}

struct F32;
impl Elem for F32 {
    const WIDTH: usize = 4;
    #[inline(always)]
    unsafe fn load8(b: &[u8]) -> __m256 {
        debug_assert!(b.len() >= 32);
        // SAFETY: the caller gives at least 32 bytes in `b` (this method's contract), and `vmovups`
        // needs no alignment; AVX comes with the caller's AVX2.
        unsafe { _mm256_loadu_ps(b.as_ptr().cast()) }
    }
    #[inline(always)]
    unsafe fn one(b: &[u8]) -> f32 {
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
}

/// F16, widened with F16C's `vcvtph2ps`.
struct F16;
impl Elem for F16 {
    const WIDTH: usize = 2;
    #[inline(always)]
    unsafe fn load8(b: &[u8]) -> __m256 {
        debug_assert!(b.len() >= 16);
        // SAFETY: the caller gives at least 16 bytes in `b` (this method's contract), and `movdqu`
        // needs no alignment; `vcvtph2ps` is F16C, which the caller enables.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(b.as_ptr().cast())) }
    }
    #[inline(always)]
    unsafe fn one(b: &[u8]) -> f32 {
        // SAFETY: `fp16` needs F16C, which the caller enables.
        unsafe { fp16(f16::from_le_bytes([b[0], b[1]])) }
    }
}

/// BF16: the top half of an f32, so widening is a 16-bit shift.
struct Bf16;
impl Elem for Bf16 {
    const WIDTH: usize = 2;
    #[inline(always)]
    unsafe fn load8(b: &[u8]) -> __m256 {
        debug_assert!(b.len() >= 16);
        // SAFETY: the caller gives at least 16 bytes in `b` (this method's contract), and `movdqu`
        // needs no alignment; the widening and shift are AVX2, which the caller enables.
        unsafe {
            let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(b.as_ptr().cast()));
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(h))
        }
    }
    #[inline(always)]
    unsafe fn one(b: &[u8]) -> f32 {
        f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16)
    }
}

/// The dot product of two rows of `n` elements of format `E`.
#[inline(always)]
unsafe fn dot_rows<E: Elem>(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let w = E::WIDTH;
    assert!(
        x.len() == n * w && y.len() == n * w,
        "vec_dot: {n} elements need {} bytes, got {} and {}",
        n * w,
        x.len(),
        y.len()
    );
    // SAFETY: every `load8` gets the rest of a `32 · w`-byte chunk from offset `8 · w · k`, `k <
    // 4`: at least the `8 · w` bytes it reads. The instructions are AVX2, FMA and F16C, which the
    // caller enables.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); 4];
        let (xs, ys) = (x.chunks_exact(32 * w), y.chunks_exact(32 * w));
        let (xt, yt) = (xs.remainder(), ys.remainder());
        for (xc, yc) in xs.zip(ys) {
            for (k, a) in acc.iter_mut().enumerate() {
                let (xk, yk) = (&xc[8 * w * k..], &yc[8 * w * k..]);
                *a = _mm256_fmadd_ps(E::load8(xk), E::load8(yk), *a);
            }
        }
        let mut tail = 0.0f32;
        for (a, b) in xt.chunks_exact(w).zip(yt.chunks_exact(w)) {
            tail += E::one(a) * E::one(b);
        }
        let sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        hsum(sum) + tail
    }
}

/// F32 · F32.
#[inline(always)]
pub(super) unsafe fn vec_dot_f32(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: forwarded: the caller enables AVX2, FMA and F16C; `dot_rows` checks the lengths.
    unsafe { dot_rows::<F32>(n, x, y) }
}

/// F16 · F16.
#[inline(always)]
pub(super) unsafe fn vec_dot_f16(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: forwarded: the caller enables AVX2, FMA and F16C; `dot_rows` checks the lengths.
    unsafe { dot_rows::<F16>(n, x, y) }
}

/// BF16 · BF16.
#[inline(always)]
pub(super) unsafe fn vec_dot_bf16(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: forwarded: the caller enables AVX2, FMA and F16C; `dot_rows` checks the lengths.
    unsafe { dot_rows::<Bf16>(n, x, y) }
}
