//! AArch64 kernels.
//!
//! Two instruction sets, one public module each, whose functions are the entry points:
//! - [`neon`]: Advanced SIMD, which every AArch64 CPU has;
//! - [`neondotprod`]: NEON with the dot-product extension (Armv8.2's `sdot`, in every Arm
//!   core since the Cortex-A76 and Apple M1), which multiplies signed bytes and adds groups of
//!   four into 32-bit lanes in one instruction.
//!
//! As on x86, the bodies are written once, generic over that one step ([`Dot`]: [`Mull`] or
//! [`Sdot`]), and inlined into each entry point. NEON multiplies signed by signed bytes, so
//! the codes are made signed (`q - 8`) and need no sign trick:
//! - `legacy`: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, 16 bytes per register;
//! - `k_quants`: Q2_K … Q6_K;
//! - `float`: F32, F16 and BF16 rows;
//! - `quantize`: the activation quantizers Q8_0, Q8_1 and Q8_K.
//!
//! `sdot` is written with `asm!`: its intrinsic (`vdotq_s32`) is not yet stable in Rust.
//!
//! # Safety
//!
//! The entry points are the only functions callers outside this module see: safe functions
//! with `#[target_feature]`, so calling one is unsafe only where the caller has not enabled the
//! same features ([`crate::kernels::KernelSet`] checks the CPU first). Everything below them
//! is an `unsafe fn` marked `#[inline(always)]`, whose one precondition, unless its own
//! documentation adds more, is that its caller enables NEON (and `dotprod` for [`Sdot`]).
//! None of them reads memory outside the slices and blocks it is given, whatever their
//! lengths: block kernels zip the two slices, and row kernels and quantizers assert their
//! lengths first.

use core::arch::aarch64::*;

mod float;
mod k_quants;
mod legacy;
mod quantize;

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

/// The kernels of every type for a set (`$dot` chooses the byte products), shared by the two
/// NEON modules.
macro_rules! dot_kernels {
    ($features:literal, $dot:ty) => {
        entry_points! { $features:
            /// Q4_0 weights · Q8_0 activations.
            fn vec_dot_q4_0_q8_0(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 =
                legacy::vec_dot_q4_0_q8_0::<$dot>(x, y);
            /// Q4_1 weights · Q8_1 activations.
            fn vec_dot_q4_1_q8_1(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 =
                legacy::vec_dot_q4_1_q8_1::<$dot>(x, y);
            /// Q5_0 weights · Q8_0 activations.
            fn vec_dot_q5_0_q8_0(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 =
                legacy::vec_dot_q5_0_q8_0::<$dot>(x, y);
            /// Q5_1 weights · Q8_1 activations.
            fn vec_dot_q5_1_q8_1(x: &[BlockQ5_1], y: &[BlockQ8_1]) -> f32 =
                legacy::vec_dot_q5_1_q8_1::<$dot>(x, y);
            /// Q8_0 weights · Q8_0 activations.
            fn vec_dot_q8_0_q8_0(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 =
                legacy::vec_dot_q8_0_q8_0::<$dot>(x, y);
            /// Q2_K weights · Q8_K activations.
            fn vec_dot_q2_K_q8_K(x: &[BlockQ2_K], y: &[BlockQ8_K]) -> f32 =
                k_quants::vec_dot_q2_K_q8_K::<$dot>(x, y);
            /// Q3_K weights · Q8_K activations.
            fn vec_dot_q3_K_q8_K(x: &[BlockQ3_K], y: &[BlockQ8_K]) -> f32 =
                k_quants::vec_dot_q3_K_q8_K::<$dot>(x, y);
            /// Q4_K weights · Q8_K activations.
            fn vec_dot_q4_K_q8_K(x: &[BlockQ4_K], y: &[BlockQ8_K]) -> f32 =
                k_quants::vec_dot_q4_K_q8_K::<$dot>(x, y);
            /// Q5_K weights · Q8_K activations.
            fn vec_dot_q5_K_q8_K(x: &[BlockQ5_K], y: &[BlockQ8_K]) -> f32 =
                k_quants::vec_dot_q5_K_q8_K::<$dot>(x, y);
            /// Q6_K weights · Q8_K activations.
            fn vec_dot_q6_K_q8_K(x: &[BlockQ6_K], y: &[BlockQ8_K]) -> f32 =
                k_quants::vec_dot_q6_K_q8_K::<$dot>(x, y);
        }
    };
}

/// NEON kernels: byte products with `smull` and pairwise adds.
pub mod neon {
    use super::*;
    use ch06::quants::blocks::*;

    dot_kernels!("neon", Mull);

    entry_points! { "neon":
        /// F32 · F32 on little-endian bytes, `n` elements.
        fn vec_dot_f32(n: usize, x: &[u8], y: &[u8]) -> f32 = float::vec_dot_f32(n, x, y);
        /// F16 · F16 on little-endian bytes, `n` elements.
        fn vec_dot_f16(n: usize, x: &[u8], y: &[u8]) -> f32 = float::vec_dot_f16(n, x, y);
        /// BF16 · BF16 on little-endian bytes, `n` elements.
        fn vec_dot_bf16(n: usize, x: &[u8], y: &[u8]) -> f32 = float::vec_dot_bf16(n, x, y);
        /// `quantize_row_q8_0`, byte for byte.
        fn quantize_row_q8_0(x: &[f32], y: &mut [BlockQ8_0]) = quantize::quantize_row_q8_0(x, y);
        /// `quantize_row_q8_1`, byte for byte.
        fn quantize_row_q8_1(x: &[f32], y: &mut [BlockQ8_1]) = quantize::quantize_row_q8_1(x, y);
        /// `quantize_row_q8_K`, byte for byte.
        fn quantize_row_q8_K(x: &[f32], y: &mut [BlockQ8_K]) = quantize::quantize_row_q8_K(x, y);
    }
}

/// NEON kernels with `sdot`.
pub mod neondotprod {
    use super::*;
    use ch06::quants::blocks::*;

    dot_kernels!("neon,dotprod", Sdot);
}

// ---------------------------------------------------------------------------------------------
// The one step that differs between NEON and NEON with `sdot`.

/// Signed byte products, added into 32-bit lanes.
pub(crate) trait Dot {
    /// `acc` plus the 16 products `a[i] * b[i]`, spread over the four lanes (which products
    /// land in which lane differs between implementations; callers use only lane sums, or
    /// all lanes with one scale).
    ///
    /// # Safety
    /// The CPU has, and the caller enables, NEON (and `dotprod` for [`Sdot`]).
    unsafe fn dot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t;
}

/// `smull`/`smull2` into 16 bits (a product of two bytes always fits), then `sadalp` adds
/// neighbouring pairs into the 32-bit lanes.
pub(crate) struct Mull;

impl Dot for Mull {
    #[inline(always)]
    unsafe fn dot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        // SAFETY: `smull`, `smull2` and `sadalp` on registers are NEON, which the caller enables.
        unsafe {
            let lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
            let hi = vmull_high_s8(a, b);
            vpadalq_s16(vpadalq_s16(acc, lo), hi)
        }
    }
}

/// `sdot`: lane `i` gains `a[4i..4i+4] · b[4i..4i+4]`, one instruction.
pub(crate) struct Sdot;

impl Dot for Sdot {
    #[inline(always)]
    unsafe fn dot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        let mut acc = acc;
        // SAFETY: `sdot` only reads and writes these registers; the caller enables `dotprod`.
        unsafe {
            core::arch::asm!(
                "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
                acc = inout(vreg) acc,
                a = in(vreg) a,
                b = in(vreg) b,
                options(pure, nomem, nostack, preserves_flags)
            );
        }
        acc
    }
}

// ---------------------------------------------------------------------------------------------
// Small functions shared by the kernels.

/// Four f16 values to f32 with `fcvtl` (Armv8.0; exact).
#[inline(always)]
unsafe fn fp16x4(h: uint16x4_t) -> float32x4_t {
    let out: float32x4_t;
    // SAFETY: `fcvtl` reads and writes only the registers named (no memory, stack or flags), and is
    // part of Armv8.0's Advanced SIMD, which the caller enables.
    unsafe {
        core::arch::asm!(
            "fcvtl {out:v}.4s, {h:v}.4h",
            out = lateout(vreg) out,
            h = in(vreg) h,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    out
}

/// The first four f16 fields of a block (`d`, then `m` or `s` where the block has one), read
/// as 8 bytes and converted together.
///
/// # Safety
/// NEON is enabled. (The block has at least 8 bytes and the alignment of u16, which
/// `vld1_u16` needs; both are checked at compile time.)
#[inline(always)]
unsafe fn fp16_fields<B>(block: &B) -> float32x4_t {
    const { assert!(size_of::<B>() >= 8 && align_of::<B>() >= align_of::<u16>()) };
    // SAFETY: `vld1_u16` reads 8 bytes at `block`, a live reference to at least 8 bytes aligned for
    // u16 (both checked at compile time above); `fcvtl` needs NEON, which the caller enables.
    unsafe { fp16x4(vld1_u16((block as *const B).cast())) }
}

/// One f16 scale to f32.
#[inline(always)]
unsafe fn fp16(h: half::f16) -> f32 {
    // SAFETY: NEON on registers only, which the caller enables.
    unsafe { vgetq_lane_f32::<0>(fp16x4(vdup_n_u16(h.to_bits()))) }
}

/// 16 bytes of `s` from element `i` on.
#[inline(always)]
unsafe fn load16_at<T: Copy>(s: &[T], i: usize) -> int8x16_t {
    const { assert!(16 % size_of::<T>() == 0) };
    let part = &s[i..i + 16 / size_of::<T>()];
    // SAFETY: `part` is a bounds-checked slice of exactly 16 bytes (`T`'s size divides 16, checked
    // at compile time above), and `vld1q_s8` reads bytes, with no alignment needed; NEON is enabled
    // by the caller.
    unsafe { vld1q_s8(part.as_ptr().cast()) }
}
