//! Chapter 8: SIMD kernels and threads — the same engine, fast.
//!
//! Nothing that is computed changes: the forward pass of chapters 4 and 5, chapter 6's
//! quantized weights and its activation quantizers (byte for byte). What this chapter adds is
//! how the matrix products run:
//! - [`kernels`]: the kernel set chosen at run time (scalar, AVX2, AVX-512, AVX-512 VNNI, NEON):
//!   for every weight type, an activation quantizer and a dot product;
//! - [`simd`]: those SIMD kernels, one module per architecture, tested against chapter 6's;
//! - [`gemm`]: rows interleaved in groups of 16 at load time, and micro-kernels that multiply
//!   16 rows by up to 8 tokens with AVX-512 VNNI, loading each weight once per product;
//! - [`pool`]: a persistent spin-then-sleep thread pool for products of a few microseconds, and
//!   rayon behind the same [`Parallel`] trait for comparison;
//! - [`fast_matrix`]: [`FastMatrix`], chapter 3's `Matrix` on all of the above, and [`FastLoader`],
//!   the `MatrixLoader` that makes one from each tensor;
//! - [`simd_compute`]: [`SimdCompute`], chapter 4's `Compute` seam — tiled attention with an online
//!   softmax (split over keys when decoding), RMSNorm, SwiGLU and the residual add — with
//!   vector kernels on the same pool, so the whole layer is fast, not only its products.
//!
//! Left for later: weights are copied out of the file instead of mapped (chapter 10).

pub mod fast_matrix;
pub mod gemm;
pub mod kernels;
pub mod pool;
pub mod simd;
pub mod simd_compute;

pub use fast_matrix::{FastLoader, FastMatrix};
pub use pool::{Parallel, PoolKind, RayonPool, SpinPool, new_pool};
pub use simd_compute::SimdCompute;
