//! F32, F16 and BF16 rows with NEON: four accumulators of four f32 lanes, 16 elements per
//! step, the tail one by one. F16 is widened with `fcvtl`, BF16 with a 16-bit shift.
//!
//! # Safety
//! Every function needs NEON enabled by the caller.

use super::*;

/// An element format: its width in bytes and how 4 of them, or one, become f32.
trait Elem {
    const WIDTH: usize;
    /// Four elements from the first `4 * WIDTH` bytes of `b`.
    ///
    /// # Safety
    /// NEON is enabled; `b` holds at least `4 * WIDTH` bytes.
    unsafe fn load4(b: &[u8]) -> float32x4_t;
    /// One element from the first `WIDTH` bytes of `b`.
    ///
    /// # Safety
    /// NEON is enabled.
    unsafe fn one(b: &[u8]) -> f32;
}

struct F32;
impl Elem for F32 {
    const WIDTH: usize = 4;
    #[inline(always)]
    unsafe fn load4(b: &[u8]) -> float32x4_t {
        debug_assert!(b.len() >= 16);
        // SAFETY: the caller gives at least 16 bytes in `b` (this method's contract), and
        // `vld1q_u8` reads bytes, with no alignment needed; NEON is enabled by the caller.
        unsafe { vreinterpretq_f32_u8(vld1q_u8(b.as_ptr())) }
    }
    #[inline(always)]
    unsafe fn one(b: &[u8]) -> f32 {
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
}

struct F16;
impl Elem for F16 {
    const WIDTH: usize = 2;
    #[inline(always)]
    unsafe fn load4(b: &[u8]) -> float32x4_t {
        debug_assert!(b.len() >= 8);
        // SAFETY: the caller gives at least 8 bytes in `b` (this method's contract), and `vld1_u8`
        // reads bytes, with no alignment needed; NEON is enabled by the caller.
        unsafe { fp16x4(vreinterpret_u16_u8(vld1_u8(b.as_ptr()))) }
    }
    #[inline(always)]
    unsafe fn one(b: &[u8]) -> f32 {
        // SAFETY: `fp16` needs NEON, which the caller enables.
        unsafe { fp16(half::f16::from_le_bytes([b[0], b[1]])) }
    }
}

struct Bf16;
impl Elem for Bf16 {
    const WIDTH: usize = 2;
    #[inline(always)]
    unsafe fn load4(b: &[u8]) -> float32x4_t {
        debug_assert!(b.len() >= 8);
        // SAFETY: the caller gives at least 8 bytes in `b` (this method's contract), and `vld1_u8`
        // reads bytes, with no alignment needed; NEON is enabled by the caller.
        unsafe {
            let h = vreinterpret_u16_u8(vld1_u8(b.as_ptr()));
            vreinterpretq_f32_u32(vshll_n_u16::<16>(h))
        }
    }
    #[inline(always)]
    unsafe fn one(b: &[u8]) -> f32 {
        f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16)
    }
}

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
    // SAFETY: every `load4` gets the rest of a `16 · w`-byte chunk from offset `4 · w · k`, `k <
    // 4`: at least the `4 · w` bytes it reads. NEON is enabled by the caller.
    unsafe {
        let mut acc = [vdupq_n_f32(0.0); 4];
        let (xs, ys) = (x.chunks_exact(16 * w), y.chunks_exact(16 * w));
        let (xt, yt) = (xs.remainder(), ys.remainder());
        for (xc, yc) in xs.zip(ys) {
            for (k, a) in acc.iter_mut().enumerate() {
                *a = vfmaq_f32(*a, E::load4(&xc[4 * w * k..]), E::load4(&yc[4 * w * k..]));
            }
        }
        let mut tail = 0.0f32;
        for (a, b) in xt.chunks_exact(w).zip(yt.chunks_exact(w)) {
            tail += E::one(a) * E::one(b);
        }
        vaddvq_f32(vaddq_f32(
            vaddq_f32(acc[0], acc[1]),
            vaddq_f32(acc[2], acc[3]),
        )) + tail
    }
}

/// F32 · F32.
#[inline(always)]
pub(super) unsafe fn vec_dot_f32(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: forwarded: the caller enables NEON; `dot_rows` checks the lengths.
    unsafe { dot_rows::<F32>(n, x, y) }
}

/// F16 · F16.
#[inline(always)]
pub(super) unsafe fn vec_dot_f16(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: forwarded: the caller enables NEON; `dot_rows` checks the lengths.
    unsafe { dot_rows::<F16>(n, x, y) }
}

/// BF16 · BF16.
#[inline(always)]
pub(super) unsafe fn vec_dot_bf16(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: forwarded: the caller enables NEON; `dot_rows` checks the lengths.
    unsafe { dot_rows::<Bf16>(n, x, y) }
}
