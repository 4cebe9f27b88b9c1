//! The instruction sets the layer's kernels are compiled for: [`Portable`], plain Rust that
//! the compiler vectorises as it can (the fallback, and the reference the vector versions are
//! tested against), and [`F32Isa`], which names the one a [`SimdCompute`](super::SimdCompute)
//! runs.

use crate::kernels::{Isa, KernelSet};
use crate::simd::F32Simd;

/// Plain Rust: the fallback on CPUs without a vector set here, and the reference the vector
/// versions are tested against.
pub struct Portable;

impl F32Simd for Portable {
    #[inline(always)]
    unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        ch03::matrix::dot(a, b)
    }
    #[inline(always)]
    unsafe fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
        for (y, x) in y.iter_mut().zip(x) {
            *y += a * x;
        }
    }
    #[inline(always)]
    unsafe fn scale(y: &mut [f32], a: f32) {
        y.iter_mut().for_each(|y| *y *= a);
    }
    #[inline(always)]
    unsafe fn max(x: &[f32]) -> f32 {
        x.iter().copied().fold(f32::NEG_INFINITY, f32::max)
    }
    #[inline(always)]
    unsafe fn exp_sum(x: &mut [f32], m: f32) -> f32 {
        let mut sum = 0.0;
        for v in x.iter_mut() {
            *v = (*v - m).exp();
            sum += *v;
        }
        sum
    }
    #[inline(always)]
    unsafe fn silu_mul(g: &mut [f32], u: &[f32]) {
        for (g, u) in g.iter_mut().zip(u) {
            *g = ch04::compute::silu(*g) * u;
        }
    }
    #[inline(always)]
    unsafe fn sum_squares(x: &[f32]) -> f32 {
        // SAFETY: `Portable::dot` is plain Rust.
        unsafe { Self::dot(x, x) }
    }
    #[inline(always)]
    unsafe fn scale_mul(x: &[f32], s: f32, w: &[f32], out: &mut [f32]) {
        for ((o, &v), &w) in out.iter_mut().zip(x).zip(w) {
            *o = (v * s) * w;
        }
    }
    #[inline(always)]
    unsafe fn add(x: &mut [f32], y: &[f32]) {
        for (a, b) in x.iter_mut().zip(y) {
            *a += b;
        }
    }
}

/// Which implementation of [`F32Simd`] the kernels are compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum F32Isa {
    Portable,
    /// x86-64 AVX2 + FMA + F16C (every kernel set from AVX2 up has all three).
    Avx2,
    /// [`F32Isa::Avx2`], with AVX-512 F for attention's scores and weighted sums.
    Avx512,
}

impl F32Isa {
    /// The one a kernel set can run: a set exists only for an instruction set the CPU has.
    pub fn for_kernels(k: &KernelSet) -> F32Isa {
        match k.isa {
            Isa::Avx2 if cfg!(target_arch = "x86_64") => F32Isa::Avx2,
            Isa::Avx512 | Isa::Avx512Vnni if cfg!(target_arch = "x86_64") => F32Isa::Avx512,
            _ => F32Isa::Portable,
        }
    }

    /// Whether this CPU has the instructions the kernels are compiled for.
    pub fn is_available(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        let (avx2, avx512) = (
            is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c"),
            is_x86_feature_detected!("avx512f"),
        );
        #[cfg(not(target_arch = "x86_64"))]
        let (avx2, avx512) = (false, false);
        match self {
            F32Isa::Portable => true,
            F32Isa::Avx2 => avx2,
            F32Isa::Avx512 => avx2 && avx512,
        }
    }
}
