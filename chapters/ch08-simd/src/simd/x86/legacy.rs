//! Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 against Q8_0/Q8_1 activations, one block of 32 per
//! 32-byte register, with chapter 6's arithmetic exactly.
//!
//! Every kernel has the same shape: widen the block's codes to 32 bytes, multiply them with
//! the activation's 32 bytes and add in groups of four ([`Dot`]), giving eight exact 32-bit
//! partial sums ([`q4_0_sums`] and its siblings). From there on the kernels do what chapter 6's
//! `vec_dot`s do, in their order: each block's integer sum taken whole, the block's float
//! expression (`d_x · d_y · Σ`, plus `m · s` where the block has a min), and that added to one
//! running sum, block after block. So the result is chapter 6's bit for bit, and that of the
//! packed micro-kernel, which keeps the same order in each of its lanes.
//!
//! The order matters beyond the last bit. A product's output is quantized again before the next
//! product, and rounding to a code is discontinuous: a last-bit difference flips a code now and
//! then, and the flips grow through the layers (chapter 6's `agreement` module measures how
//! far). Eight float lanes that each add a share of every block give the same value to within
//! a few ulps, and a model's logits that wander by that noise from the other paths' (and from
//! chapter 6's); with the same order the engine's logits do not depend on the weights' layout.
//!
//! The price is paid after the integer sums: a horizontal sum per block, which four blocks
//! share ([`block_totals`]: three `vphaddd` and an add, where each block alone needs three
//! shuffles and three adds), and one chain of float additions, one per block, each waiting for
//! the one before, where eight lanes would have eight chains.
//!
//! # Safety
//! Every function needs AVX2, FMA and F16C, plus what its [`Dot`] needs, enabled by the
//! caller.

use super::*;
use ch06::quants::blocks::*;

// ANCHOR: in_block_order
/// The integer sums of four blocks, each from its eight partial sums: `[Σ s0, Σ s1, Σ s2, Σ s3]`.
#[inline(always)]
pub(super) unsafe fn block_totals(s: [__m256i; 4]) -> __m128i {
    // SAFETY: AVX2 on registers only, which the caller enables.
    unsafe {
        // Pairwise adds within each 128-bit half: the low half ends as the four blocks' sums of
        // lanes 0..4, the high half as their sums of lanes 4..8.
        let h = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
        _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h))
    }
}

/// `sumf + t[0] + t[1] + t[2] + t[3]`, one addition after another.
#[inline(always)]
pub(super) unsafe fn add_in_order(sumf: f32, t: __m128) -> f32 {
    // SAFETY: SSE3 on registers only, which comes with the AVX2 the caller enables.
    unsafe {
        let s = sumf + _mm_cvtss_f32(t);
        let s = s + _mm_cvtss_f32(_mm_movehdup_ps(t));
        let s = s + _mm_cvtss_f32(_mm_movehl_ps(t, t));
        s + _mm_cvtss_f32(_mm_shuffle_ps::<3>(t, t))
    }
}

/// Chapter 6's sum over the blocks of `$x` and `$y`, in block order, one float. `$four(x4, y4)`
/// gives the partial sums of four blocks at a time, which [`block_totals`] takes whole;
/// `$terms(x, y, Σ)` gives chapter 6's float expressions of (up to four) blocks, lane by lane,
/// from their integer sums `Σ`; a block of the tail goes alone, its sums from `$one(x, y)`.
macro_rules! in_block_order {
    ($x:expr, $y:expr, |$x4:ident, $y4:ident| $four:expr, $one:expr, $terms:expr) => {{
        let mut sumf = 0.0f32;
        let (mut xs, mut ys) = ($x.chunks_exact(4), $y.chunks_exact(4));
        for ($x4, $y4) in (&mut xs).zip(&mut ys) {
            let sums = _mm_cvtepi32_ps(block_totals($four));
            sumf = add_in_order(sumf, $terms($x4, $y4, sums));
        }
        for (xb, yb) in xs.remainder().iter().zip(ys.remainder()) {
            let sums = _mm_set_ss(hsum_i32($one(xb, yb)) as f32);
            let (xb, yb) = (core::slice::from_ref(xb), core::slice::from_ref(yb));
            sumf += _mm_cvtss_f32($terms(xb, yb, sums));
        }
        sumf
    }};
}
// ANCHOR_END: in_block_order
pub(super) use in_block_order;

/// The first f16 field (`d`) of up to four blocks, as f32 lanes (zero past the last block).
///
/// The fields are gathered in a general register and moved over in one piece: building the
/// vector by inserting into another register would make it wait for whatever that register
/// held last, which can be the running sum, and so chain every block's loads to the previous
/// block's addition.
#[inline(always)]
unsafe fn first_fields<B>(b: &[B]) -> __m128 {
    const { assert!(size_of::<B>() >= 2) };
    let mut bits = 0u64;
    for (i, b) in b.iter().take(4).enumerate() {
        // SAFETY: the first 2 bytes of a live block (at least 2, checked at compile time above),
        // read unaligned.
        bits |= (unsafe { (b as *const B).cast::<u16>().read_unaligned() } as u64) << (16 * i);
    }
    // SAFETY: `vmovq` and `vcvtph2ps` on registers are SSE2 and F16C, which the caller enables.
    unsafe { _mm_cvtph_ps(_mm_cvtsi64_si128(bits as i64)) }
}

/// The first two f16 fields (`d`, and `m` or `s`) of up to four blocks, as two vectors of f32
/// lanes (zero past the last block).
#[inline(always)]
unsafe fn field_pairs<B>(b: &[B]) -> (__m128, __m128) {
    const { assert!(size_of::<B>() >= 4) };
    let w = |i: usize| {
        b.get(i).map_or(0, |b| {
            // SAFETY: the first 4 bytes of a live block (at least 4, checked at compile time
            // above), read unaligned.
            unsafe { (b as *const B).cast::<i32>().read_unaligned() }
        })
    };
    // SAFETY: SSE2, AVX and F16C on registers, which the caller enables.
    unsafe {
        // `[d0, m0, d1, m1, d2, m2, d3, m3]`, then the even lanes and the odd ones.
        let f = _mm256_cvtph_ps(_mm_setr_epi32(w(0), w(1), w(2), w(3)));
        let (lo, hi) = (_mm256_castps256_ps128(f), _mm256_extractf128_ps::<1>(f));
        (
            _mm_shuffle_ps::<0b10_00_10_00>(lo, hi),
            _mm_shuffle_ps::<0b11_01_11_01>(lo, hi),
        )
    }
}

/// Chapter 6's expression for Q5_0 and Q8_0 blocks, `d_x d_y · Σ`, lane by lane.
#[inline(always)]
pub(super) unsafe fn scaled_terms<X, Y>(x: &[X], y: &[Y], sums: __m128) -> __m128 {
    // SAFETY: as in `q4_0_terms`.
    unsafe { _mm_mul_ps(_mm_mul_ps(first_fields(x), first_fields(y)), sums) }
}

/// [`in_block_order!`] with 32-byte registers: `$one` on each of the four blocks.
macro_rules! one_by_one {
    ($x:expr, $y:expr, $one:expr, $terms:expr) => {
        in_block_order!(
            $x,
            $y,
            |x4, y4| [
                $one(&x4[0], &y4[0]),
                $one(&x4[1], &y4[1]),
                $one(&x4[2], &y4[2]),
                $one(&x4[3], &y4[3]),
            ],
            $one,
            $terms
        )
    };
}

// ANCHOR: q4_0
/// One Q4_0 block times one Q8_0 block: eight exact partial sums of `(q - 8) · y`.
#[inline(always)]
pub(super) unsafe fn q4_0_sums<D: Dot>(x: &BlockQ4_0, y: &BlockQ8_0) -> __m256i {
    // SAFETY: `nibbles` and `load32` read the blocks' code arrays; the instructions are AVX2 and
    // `D`'s, which the caller enables.
    unsafe {
        // ANCHOR: yours_q4_0_sums
        // Codes 0..16 become the weights' signed values -8..8.
        let qx = _mm256_sub_epi8(nibbles(&x.qs), _mm256_set1_epi8(8));
        dot_i8::<D>(_mm256_setzero_si256(), qx, load32(&y.qs))
        // ANCHOR_END: yours_q4_0_sums
    }
}

/// Chapter 6's expression for Q4_0 blocks, `Σ · d_x · d_y` in that order, lane by lane.
#[inline(always)]
pub(super) unsafe fn q4_0_terms(x: &[BlockQ4_0], y: &[BlockQ8_0], sums: __m128) -> __m128 {
    // SAFETY: the loads read the blocks' own fields; SSE and F16C, which the caller enables.
    unsafe { _mm_mul_ps(_mm_mul_ps(sums, first_fields(x)), first_fields(y)) }
}

/// `ggml_vec_dot_q4_0_q8_0`: `Σ_blocks d_x d_y Σ (q - 8) · y`.
#[inline(always)]
pub(super) unsafe fn vec_dot_q4_0_q8_0<D: Dot>(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
    // SAFETY: the blocks are those the zipped chunks hold; the caller enables AVX2, FMA, F16C and
    // `D`'s set.
    unsafe { one_by_one!(x, y, q4_0_sums::<D>, q4_0_terms) }
}
// ANCHOR_END: q4_0

// ANCHOR: q4_1
/// One Q4_1 block times one Q8_1 block: eight exact partial sums of `q · y`. The codes are
/// unsigned, so they go straight into [`Dot`].
#[inline(always)]
pub(super) unsafe fn q4_1_sums<D: Dot>(x: &BlockQ4_1, y: &BlockQ8_1) -> __m256i {
    // SAFETY: as in `q4_0_sums`.
    unsafe { D::dot(_mm256_setzero_si256(), nibbles(&x.qs), load32(&y.qs)) }
}

/// Chapter 6's expression for blocks with a min (Q4_1, Q5_1), `d_x d_y · Σ + m · s`, lane by
/// lane: the min needs only `s = d_y Σ y`, which the activation quantizer stored.
#[inline(always)]
pub(super) unsafe fn min_terms<X, Y>(x: &[X], y: &[Y], sums: __m128) -> __m128 {
    // SAFETY: as in `q4_0_terms`.
    unsafe {
        let ((dx, m), (dy, s)) = (field_pairs(x), field_pairs(y));
        _mm_add_ps(_mm_mul_ps(_mm_mul_ps(dx, dy), sums), _mm_mul_ps(m, s))
    }
}

/// `ggml_vec_dot_q4_1_q8_1`: `Σ_blocks (d_x d_y Σ q · y + m · s)`.
#[inline(always)]
pub(super) unsafe fn vec_dot_q4_1_q8_1<D: Dot>(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
    // SAFETY: as in `vec_dot_q4_0_q8_0`.
    unsafe { one_by_one!(x, y, q4_1_sums::<D>, min_terms) }
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

/// One Q5_0 block times one Q8_0 block: eight exact partial sums of `(q - 16) · y`.
#[inline(always)]
pub(super) unsafe fn q5_0_sums<D: Dot>(x: &BlockQ5_0, y: &BlockQ8_0) -> __m256i {
    // SAFETY: as in `q4_0_sums`; `q5_codes` reads the block's own fields.
    unsafe {
        let qx = _mm256_sub_epi8(q5_codes::<D>(&x.qs, x.qh), _mm256_set1_epi8(16));
        dot_i8::<D>(_mm256_setzero_si256(), qx, load32(&y.qs))
    }
}

/// `ggml_vec_dot_q5_0_q8_0`: as Q4_0 with five-bit codes, offset by 16.
#[inline(always)]
pub(super) unsafe fn vec_dot_q5_0_q8_0<D: Dot>(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 {
    // SAFETY: as in `vec_dot_q4_0_q8_0`.
    unsafe { one_by_one!(x, y, q5_0_sums::<D>, scaled_terms) }
}

/// One Q5_1 block times one Q8_1 block: eight exact partial sums of `q · y`.
#[inline(always)]
pub(super) unsafe fn q5_1_sums<D: Dot>(x: &BlockQ5_1, y: &BlockQ8_1) -> __m256i {
    // SAFETY: as in `q5_0_sums`.
    unsafe {
        D::dot(
            _mm256_setzero_si256(),
            q5_codes::<D>(&x.qs, x.qh),
            load32(&y.qs),
        )
    }
}

/// `ggml_vec_dot_q5_1_q8_1`: as Q4_1 with five-bit codes.
#[inline(always)]
pub(super) unsafe fn vec_dot_q5_1_q8_1<D: Dot>(x: &[BlockQ5_1], y: &[BlockQ8_1]) -> f32 {
    // SAFETY: as in `vec_dot_q4_0_q8_0`.
    unsafe { one_by_one!(x, y, q5_1_sums::<D>, min_terms) }
}

/// One Q8_0 block times one Q8_0 block: eight exact partial sums of `x · y`.
#[inline(always)]
pub(super) unsafe fn q8_0_sums<D: Dot>(x: &BlockQ8_0, y: &BlockQ8_0) -> __m256i {
    // SAFETY: as in `q4_0_sums`.
    unsafe { dot_i8::<D>(_mm256_setzero_si256(), load32(&x.qs), load32(&y.qs)) }
}

/// `ggml_vec_dot_q8_0_q8_0`. Weight codes may be -128 (only activations are kept off it),
/// which `|x|` turns into 128: still right, read as the unsigned byte it is.
#[inline(always)]
pub(super) unsafe fn vec_dot_q8_0_q8_0<D: Dot>(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    // SAFETY: as in `vec_dot_q4_0_q8_0`.
    unsafe { one_by_one!(x, y, q8_0_sums::<D>, scaled_terms) }
}
