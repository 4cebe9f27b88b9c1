//! Block quantization as ggml does it: the formats, their reference quantizers, dequantizers
//! and integer dot products, all scalar.
//!
//! Modules:
//! - [`blocks`](mod@blocks): the block structs (`BlockQ4_0` … `BlockQ8_K`) with ggml's
//!   layouts, the [`Block`] trait, and checked views of bytes as blocks;
//! - [`legacy`]: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and the activation format Q8_1;
//! - [`search`]: how the k-quants choose their scales (`nearest_int`, `make_qx_quants`,
//!   `make_q3_quants`, `make_qkx2_quants`);
//! - [`k_quants`]: Q2_K … Q6_K and the activation format Q8_K;
//! - [`float`]: F32, F16 and BF16 rows and their dot products;
//! - [`traits`]: the byte-level table of kernels per type ([`type_traits`]) and the chunk
//!   quantizers `llama_model_quantize` uses ([`quantize_chunk`], `quantize_q4_0`, …).
//!
//! Every function is named after the ggml function it ports and gives the same bits: the
//! quantizers reproduce `ggml-quants.c`'s reference functions byte for byte, the dot products
//! add in the order of ggml-cpu's `_generic` versions. They are written to be read, and stay
//! as the reference that faster versions are tested against.

// ggml's names, kept so a reader can put this code beside ggml's: `BlockQ4_K`, `vec_dot_q4_K_q8_K`.
#![allow(non_camel_case_types, non_snake_case)]
// Index loops, as in ggml's C, so the two read line by line side by side.
#![allow(clippy::needless_range_loop)]

pub mod blocks;
pub mod float;
pub mod k_quants;
pub mod legacy;
pub mod search;
pub mod traits;

pub use blocks::*;
pub use float::{vec_dot_bf16, vec_dot_f16, vec_dot_f32};
pub use k_quants::*;
pub use legacy::*;
pub use traits::*;
