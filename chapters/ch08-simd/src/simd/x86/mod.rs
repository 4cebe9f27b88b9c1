//! x86-64 kernels.
//!
//! Three instruction sets, one public module of entry points each:
//! - [`avx2`]: AVX2 with FMA and F16C (every x86-64 CPU that has AVX2 has both);
//! - [`avx512`]: AVX-512 F, BW and VL: 64-byte registers, two legacy blocks or 128 weights of
//!   a k-quant super-block per instruction;
//! - [`avx512vnni`]: the same plus VNNI's `vpdpbusd`, which multiplies unsigned by signed bytes
//!   and adds groups of four into 32-bit lanes in one instruction, where AVX2 needs
//!   `vpmaddubsw` (pairs into 16 bits) and `vpmaddwd` (pairs of those into 32); and
//!   [`avx512vnni::ymm`], the same instructions on 32-byte registers.
//!
//! Wider is not always faster: some CPUs (AMD's Zen 4) run a 64-byte instruction as two
//! 32-byte halves, and two legacy blocks must be gathered into one register from two places.
//! Which variant each kernel set uses is decided by measurement, in
//! [`crate::kernels`]; all of them are tested and benchmarked.
//!
//! The bodies are written once, generic over the steps VNNI changes ([`Dot`]: [`Madd`] or
//! [`Vnni`]), and marked `#[inline(always)]`, so that each entry point's `#[target_feature]`
//! applies to the whole kernel once it is inlined:
//! - `legacy`: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (blocks of 32), 32-byte registers, adding the
//!   blocks in chapter 6's order (its bits exactly);
//! - `k_quants`: Q2_K … Q6_K (super-blocks of 256), 32-byte registers;
//! - `wide`: the 64-byte versions of the most used ones;
//! - `float`: F32, F16 and BF16 rows;
//! - `quantize`: the activation quantizers Q8_0, Q8_1 and Q8_K.
//!
//! # Safety
//!
//! The entry points are the only functions callers outside this module see: safe functions
//! with `#[target_feature]`, so calling one is unsafe only where the caller has not enabled the
//! same features ([`crate::kernels::KernelSet`] checks the CPU first). Everything below them
//! is an `unsafe fn` marked `#[inline(always)]`, whose one precondition, unless its own
//! documentation adds more, is that its caller enables the instruction sets it uses (the
//! module documentation of each file says which). None of them reads memory outside the
//! slices and blocks it is given, whatever their lengths: block kernels zip the two slices, and
//! row kernels and quantizers assert their lengths first.

use core::arch::x86_64::*;
use half::f16;

pub mod act;
mod float;
mod k_quants;
mod legacy;
mod quantize;
mod wide;

/// Defines entry points: each is a safe function compiled with `$features`, which makes it
/// unsafe to call from code that does not enable the same features.
macro_rules! entry_points {
    ($features:literal: $(
        $(#[$doc:meta])*
        fn $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)? = $body:expr;
    )*) => {$(
        $(#[$doc])*
        ///
        /// # Safety
        #[doc = concat!("The CPU has `", $features, "`, the features this is compiled for.")]
        #[target_feature(enable = $features)]
        pub fn $name($($arg: $ty),*) $(-> $ret)? {
            // SAFETY: the body uses only instructions of `$features`, which this function
            // enables and its caller promised the CPU has; it reads and writes only inside the
            // slices it is given (see the module's safety section).
            unsafe { $body }
        }
    )*};
}

/// AVX2 kernels (with FMA and F16C).
pub mod avx2 {
    use super::*;
    use ch06::quants::blocks::*;

    entry_points! { "avx2,fma,f16c":
        /// Q4_0 weights · Q8_0 activations.
        fn vec_dot_q4_0_q8_0(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 =
            legacy::vec_dot_q4_0_q8_0::<Madd>(x, y);
        /// Q4_1 weights · Q8_1 activations.
        fn vec_dot_q4_1_q8_1(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 =
            legacy::vec_dot_q4_1_q8_1::<Madd>(x, y);
        /// Q5_0 weights · Q8_0 activations.
        fn vec_dot_q5_0_q8_0(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 =
            legacy::vec_dot_q5_0_q8_0::<Madd>(x, y);
        /// Q5_1 weights · Q8_1 activations.
        fn vec_dot_q5_1_q8_1(x: &[BlockQ5_1], y: &[BlockQ8_1]) -> f32 =
            legacy::vec_dot_q5_1_q8_1::<Madd>(x, y);
        /// Q8_0 weights · Q8_0 activations.
        fn vec_dot_q8_0_q8_0(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 =
            legacy::vec_dot_q8_0_q8_0::<Madd>(x, y);
        /// Q2_K weights · Q8_K activations.
        fn vec_dot_q2_K_q8_K(x: &[BlockQ2_K], y: &[BlockQ8_K]) -> f32 =
            k_quants::vec_dot_q2_K_q8_K(x, y);
        /// Q3_K weights · Q8_K activations.
        fn vec_dot_q3_K_q8_K(x: &[BlockQ3_K], y: &[BlockQ8_K]) -> f32 =
            k_quants::vec_dot_q3_K_q8_K(x, y);
        /// Q4_K weights · Q8_K activations.
        fn vec_dot_q4_K_q8_K(x: &[BlockQ4_K], y: &[BlockQ8_K]) -> f32 =
            k_quants::vec_dot_q4_K_q8_K(x, y);
        /// Q5_K weights · Q8_K activations.
        fn vec_dot_q5_K_q8_K(x: &[BlockQ5_K], y: &[BlockQ8_K]) -> f32 =
            k_quants::vec_dot_q5_K_q8_K(x, y);
        /// Q6_K weights · Q8_K activations.
        fn vec_dot_q6_K_q8_K(x: &[BlockQ6_K], y: &[BlockQ8_K]) -> f32 =
            k_quants::vec_dot_q6_K_q8_K(x, y);
        /// F32 · F32 on little-endian bytes, `n` elements.
        fn vec_dot_f32(n: usize, x: &[u8], y: &[u8]) -> f32 = float::vec_dot_f32(n, x, y);
        /// F16 · F16 on little-endian bytes, `n` elements.
        fn vec_dot_f16(n: usize, x: &[u8], y: &[u8]) -> f32 = float::vec_dot_f16(n, x, y);
        /// BF16 · BF16 on little-endian bytes, `n` elements.
        fn vec_dot_bf16(n: usize, x: &[u8], y: &[u8]) -> f32 = float::vec_dot_bf16(n, x, y);
        /// `quantize_row_q8_0`, byte for byte.
        fn quantize_row_q8_0(x: &[f32], y: &mut [BlockQ8_0]) =
            quantize::quantize_row_q8_0::<quantize::Ymm>(x, y);
        /// `quantize_row_q8_1`, byte for byte.
        fn quantize_row_q8_1(x: &[f32], y: &mut [BlockQ8_1]) =
            quantize::quantize_row_q8_1::<quantize::Ymm>(x, y);
        /// `quantize_row_q8_K`, byte for byte.
        fn quantize_row_q8_K(x: &[f32], y: &mut [BlockQ8_K]) = quantize::quantize_row_q8_K(x, y);
    }
}

/// AVX-512 (F, BW, VL) kernels with 64-byte registers.
pub mod avx512 {
    use super::*;
    use ch06::quants::blocks::*;

    entry_points! { "avx2,fma,f16c,avx512f,avx512bw,avx512vl":
        /// Q4_0 weights · Q8_0 activations, two blocks per register.
        fn vec_dot_q4_0_q8_0(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 =
            wide::vec_dot_q4_0_q8_0::<Madd>(x, y);
        /// Q4_1 weights · Q8_1 activations, two blocks per register.
        fn vec_dot_q4_1_q8_1(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 =
            wide::vec_dot_q4_1_q8_1::<Madd>(x, y);
        /// Q5_0 weights · Q8_0 activations, two blocks per register.
        fn vec_dot_q5_0_q8_0(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 =
            wide::vec_dot_q5_0_q8_0::<Madd>(x, y);
        /// Q8_0 weights · Q8_0 activations, two blocks per register.
        fn vec_dot_q8_0_q8_0(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 =
            wide::vec_dot_q8_0_q8_0::<Madd>(x, y);
        /// Q4_K weights · Q8_K activations, 128 weights per register.
        fn vec_dot_q4_K_q8_K(x: &[BlockQ4_K], y: &[BlockQ8_K]) -> f32 =
            wide::vec_dot_q4_K_q8_K(x, y);
        /// Q6_K weights · Q8_K activations, 128 weights per register.
        fn vec_dot_q6_K_q8_K(x: &[BlockQ6_K], y: &[BlockQ8_K]) -> f32 =
            wide::vec_dot_q6_K_q8_K(x, y);
        /// F32 · F32 with 64-byte registers.
        fn vec_dot_f32(n: usize, x: &[u8], y: &[u8]) -> f32 = wide::vec_dot_f32(n, x, y);
        /// `quantize_row_q8_0`, byte for byte, sixteen floats per register.
        fn quantize_row_q8_0(x: &[f32], y: &mut [BlockQ8_0]) =
            quantize::quantize_row_q8_0::<quantize::Zmm>(x, y);
        /// `quantize_row_q8_1`, byte for byte, sixteen floats per register.
        fn quantize_row_q8_1(x: &[f32], y: &mut [BlockQ8_1]) =
            quantize::quantize_row_q8_1::<quantize::Zmm>(x, y);
    }
}

/// Q8_0 activations (Q8_1 with `q8_1`) of `x` straight into a packed product's panels, with
/// AVX-512: block `b`'s 32 codes at `qs + 32·b·stride`, its scale, Q8_1's `s` and the codes' sum
/// at `b·stride` from `d`, `s` and `sums`, as f32, f32 and i32 — the numbers
/// `quantize_row_q8_0`/`_1` put in their blocks (the f16s widened back).
///
/// # Safety
/// The CPU has AVX2, FMA, F16C and AVX-512 F; `x.len()` is a multiple of 32; for each of its
/// blocks every address above is valid for writing (`s` only with `q8_1`) and written by no
/// one else during the call.
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
pub unsafe fn quantize_q8_panel(
    x: &[f32],
    q8_1: bool,
    qs: *mut u8,
    d: *mut f32,
    s: *mut f32,
    sums: *mut i32,
    stride: usize,
) {
    assert!(
        x.len().is_multiple_of(32),
        "quantize_q8_panel: {} values",
        x.len()
    );
    // SAFETY: forwarded from the caller.
    unsafe {
        if q8_1 {
            quantize::quantize_q8_panel::<true>(x, qs, d, s, sums, stride)
        } else {
            quantize::quantize_q8_panel::<false>(x, qs, d, s, sums, stride)
        }
    }
}

/// AVX-512 VNNI kernels with 64-byte registers: `vpdpbusd` in place of `vpmaddubsw` +
/// `vpmaddwd`.
pub mod avx512vnni {
    use super::*;
    use ch06::quants::blocks::*;

    entry_points! { "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni":
        /// Q4_0 weights · Q8_0 activations, two blocks per register.
        fn vec_dot_q4_0_q8_0(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 =
            wide::vec_dot_q4_0_q8_0::<Vnni>(x, y);
        /// Q4_1 weights · Q8_1 activations, two blocks per register.
        fn vec_dot_q4_1_q8_1(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 =
            wide::vec_dot_q4_1_q8_1::<Vnni>(x, y);
        /// Q5_0 weights · Q8_0 activations, two blocks per register.
        fn vec_dot_q5_0_q8_0(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 =
            wide::vec_dot_q5_0_q8_0::<Vnni>(x, y);
        /// Q8_0 weights · Q8_0 activations, two blocks per register.
        fn vec_dot_q8_0_q8_0(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 =
            wide::vec_dot_q8_0_q8_0::<Vnni>(x, y);
    }

    /// AVX-512 VNNI kernels with 32-byte registers (`avx512vl`): the AVX2 kernels with
    /// `vpdpbusd`, and `vpmovm2b` for Q5's fifth bits.
    pub mod ymm {
        use super::*;

        entry_points! { "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni":
            /// Q4_0 weights · Q8_0 activations.
            fn vec_dot_q4_0_q8_0(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 =
                legacy::vec_dot_q4_0_q8_0::<Vnni>(x, y);
            /// Q4_1 weights · Q8_1 activations.
            fn vec_dot_q4_1_q8_1(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 =
                legacy::vec_dot_q4_1_q8_1::<Vnni>(x, y);
            /// Q5_0 weights · Q8_0 activations.
            fn vec_dot_q5_0_q8_0(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 =
                legacy::vec_dot_q5_0_q8_0::<Vnni>(x, y);
            /// Q5_1 weights · Q8_1 activations.
            fn vec_dot_q5_1_q8_1(x: &[BlockQ5_1], y: &[BlockQ8_1]) -> f32 =
                legacy::vec_dot_q5_1_q8_1::<Vnni>(x, y);
            /// Q8_0 weights · Q8_0 activations.
            fn vec_dot_q8_0_q8_0(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 =
                legacy::vec_dot_q8_0_q8_0::<Vnni>(x, y);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The steps that differ between AVX2 and AVX-512 VNNI.

/// The steps an AVX-512 VNNI kernel does differently from an AVX2 one: mainly unsigned-by-signed
/// byte products, added in groups of four into 32-bit lanes.
pub(crate) trait Dot {
    /// `acc + Σ_{k<4} a[4i+k] * b[4i+k]` in each 32-bit lane `i`; `a` unsigned, `b` signed.
    ///
    /// # Safety
    /// The CPU has, and the caller enables, AVX2 (and AVX-512 VNNI + VL for [`Vnni`]).
    unsafe fn dot(acc: __m256i, a: __m256i, b: __m256i) -> __m256i;
    /// [`Dot::dot`] on 64-byte registers.
    ///
    /// # Safety
    /// The CPU has, and the caller enables, AVX-512 BW (and VNNI for [`Vnni`]).
    unsafe fn dot512(acc: __m512i, a: __m512i, b: __m512i) -> __m512i;
    /// 32 bits → 32 bytes, `0xFF` where the bit is set ([`bits_to_bytes`], or AVX-512's
    /// one-instruction `vpmovm2b` where the set has it).
    ///
    /// # Safety
    /// As for [`Dot::dot`].
    unsafe fn bits(qh: [u8; 4]) -> __m256i;
}

/// `vpmaddubsw` then `vpmaddwd`. The first adds pairs into 16 bits with saturation, which
/// never happens here: the unsigned side is at most 128 (`|-128|`, a Q8_0 weight) and the
/// signed side at most 127 in magnitude (activations are never -128), so a pair is at most
/// 2 · 128 · 127 = 32512.
pub(crate) struct Madd;

impl Dot for Madd {
    #[inline(always)]
    unsafe fn dot(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: `vpmaddubsw`, `vpmaddwd` and `vpaddd` on registers are AVX2, which the caller
        // enables (this method's contract).
        unsafe {
            let pairs = _mm256_maddubs_epi16(a, b);
            _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
        }
    }
    #[inline(always)]
    unsafe fn dot512(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: the 64-byte `vpmaddubsw`, `vpmaddwd` and `vpaddd` on registers are AVX-512 BW and
        // F, which the caller enables (this method's contract).
        unsafe {
            let pairs = _mm512_maddubs_epi16(a, b);
            _mm512_add_epi32(acc, _mm512_madd_epi16(pairs, _mm512_set1_epi16(1)))
        }
    }
    #[inline(always)]
    unsafe fn bits(qh: [u8; 4]) -> __m256i {
        // SAFETY: `bits_to_bytes` needs AVX2 only, which the caller enables.
        unsafe { bits_to_bytes(qh) }
    }
}

/// `vpdpbusd`: the four products and their sum in 32 bits, one instruction. (Its sets have
/// AVX-512 BW and VL too, which [`Dot::bits`] uses.)
pub(crate) struct Vnni;

impl Dot for Vnni {
    #[inline(always)]
    unsafe fn dot(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: `vpdpbusd` on 32-byte registers is AVX-512 VNNI with VL; the caller enables both
        // for `Vnni`.
        unsafe { _mm256_dpbusd_epi32(acc, a, b) }
    }
    #[inline(always)]
    unsafe fn dot512(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: `vpdpbusd` on 64-byte registers is AVX-512 VNNI; the caller enables it for
        // `Vnni`.
        unsafe { _mm512_dpbusd_epi32(acc, a, b) }
    }
    #[inline(always)]
    unsafe fn bits(qh: [u8; 4]) -> __m256i {
        // SAFETY: `vpmovm2b` on a 32-byte register is AVX-512 BW with VL, which every set that uses
        // `Vnni` has and the caller enables.
        unsafe { _mm256_movm_epi8(u32::from_le_bytes(qh)) }
    }
}

/// Signed-by-signed byte products through [`Dot`]: `|x| · (y · sign(x))` has an unsigned left
/// side and the same value. Needs `y != -128`, whose negation does not fit in a byte.
#[inline(always)]
unsafe fn dot_i8<D: Dot>(acc: __m256i, x: __m256i, y: __m256i) -> __m256i {
    // SAFETY: `vpsignb` is AVX2 and `D::dot` needs what `D` needs; the caller enables both (the
    // module's contract).
    unsafe { D::dot(acc, _mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)) }
}

// ---------------------------------------------------------------------------------------------
// Small functions shared by the kernels.

/// An f16 scale to f32 with F16C (exact, like `half::f16::to_f32`).
#[inline(always)]
unsafe fn fp16(h: f16) -> f32 {
    // SAFETY: `vcvtph2ps` on a register is F16C, which the caller enables.
    unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h.to_bits() as i32))) }
}

/// An f32 to f16, rounding to nearest even like `half::f16::from_f32` (both keep NaN a NaN;
/// only a NaN's payload bits could differ, and no scale here is NaN).
#[inline(always)]
unsafe fn to_fp16(v: f32) -> f16 {
    // SAFETY: `vcvtps2ph` and `pextrw` on registers are F16C and SSE2, which the caller enables.
    unsafe {
        let h = _mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(v));
        f16::from_bits(_mm_extract_epi16::<0>(h) as u16)
    }
}

/// 32 bytes from an array of at least 32 bytes.
#[inline(always)]
unsafe fn load32<T, const N: usize>(a: &[T; N]) -> __m256i {
    const { assert!(size_of::<[T; N]>() >= 32) };
    // SAFETY: `a` is a live array of at least 32 bytes (checked at compile time above), and
    // `vmovdqu` needs no alignment; AVX is enabled with AVX2 by the caller.
    unsafe { _mm256_loadu_si256(a.as_ptr().cast()) }
}

/// 16 bytes from an array of at least 16 bytes.
#[inline(always)]
unsafe fn load16<T, const N: usize>(a: &[T; N]) -> __m128i {
    const { assert!(size_of::<[T; N]>() >= 16) };
    // SAFETY: `a` is a live array of at least 16 bytes (checked at compile time above), and
    // `movdqu` needs no alignment.
    unsafe { _mm_loadu_si128(a.as_ptr().cast()) }
}

/// 16 bytes of packed nibbles → 32 bytes: the low nibbles (weights 0..16 of a legacy block),
/// then the high ones (weights 16..32), each in `0..16`. The bytes are loaded into both halves
/// at once (a load, not a shuffle), and the upper half shifted.
#[inline(always)]
unsafe fn nibbles(qs: &[u8; 16]) -> __m256i {
    // SAFETY: `load16` reads the 16 bytes of `qs`; the rest is AVX2 on registers, which the caller
    // enables.
    unsafe {
        let both = _mm256_broadcastsi128_si256(load16(qs));
        let shifted = _mm256_srlv_epi32(both, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
        _mm256_and_si256(shifted, _mm256_set1_epi8(0x0F))
    }
}

/// 32 bits → 32 bytes, `0xFF` where the bit is set: byte `i` gets a copy of the byte that holds
/// bit `i`, keeps only that bit, and compares it with itself.
#[inline(always)]
unsafe fn bits_to_bytes(qh: [u8; 4]) -> __m256i {
    // SAFETY: AVX2 on registers only, which the caller enables.
    unsafe {
        let spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32(i32::from_le_bytes(qh)),
            _mm256_set_epi64x(
                0x0303_0303_0303_0303,
                0x0202_0202_0202_0202,
                0x0101_0101_0101_0101,
                0,
            ),
        );
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit)
    }
}

/// The sum of 8 floats.
#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    // SAFETY: AVX and SSE3 on registers only, which come with the AVX2 the caller enables.
    unsafe {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        hsum128(s)
    }
}

/// The largest of 8 floats.
#[inline(always)]
unsafe fn hmax(v: __m256) -> f32 {
    // SAFETY: AVX and SSE on registers only, which come with the AVX2 the caller enables.
    unsafe {
        let s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)))
    }
}

/// The sum of 4 floats.
#[inline(always)]
unsafe fn hsum128(s: __m128) -> f32 {
    // SAFETY: SSE3 on registers only, which comes with the AVX2 the caller enables.
    unsafe {
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }
}

/// The sum of 8 32-bit integers (wrapping, which the callers' ranges never reach).
#[inline(always)]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    // SAFETY: AVX2 on registers only, which the caller enables.
    unsafe {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
        _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<0b01>(s)))
    }
}
