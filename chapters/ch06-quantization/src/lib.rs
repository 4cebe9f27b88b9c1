//! Chapter 6: block quantization.
//!
//! A model's weights are stored in ggml's block formats: small integer codes with one scale
//! (and perhaps a min) per block of 32 or 256 weights. This chapter implements those formats
//! as ggml defines them — the block layouts, the reference quantizers that produce the bytes of
//! a GGUF file, the dequantizers, and the integer dot products that let a matrix-vector product
//! run on the codes without expanding them to floats — and a table that picks the kernels of a
//! tensor's type at run time.
//!
//! Modules:
//! - [`quants`]: the formats and their scalar reference kernels (see its docs for the layout).
//! - [`qmatrix`]: [`QMatrix`], a weight matrix that stays quantized, and the loaders that make
//!   one from each tensor of a file ([`QuantLoader`]) or requantize it ([`RequantLoader`]). The
//!   model of chapters 4 and 5 runs on it unchanged, through chapter 3's `Matrix` trait.
//! - [`gguf_write`]: a GGUF writer ([`GgufWriter`](gguf_write::GgufWriter)), the first file the
//!   project writes.
//! - [`recipe`]: llama.cpp's choice of type for each tensor of a file type such as Q4_K_M
//!   ([`Plan`](recipe::Plan)), lists of per-tensor types, and `llama_model_quantize`
//!   ([`quantize_gguf`](recipe::quantize_gguf)).
//! - [`cache`]: chapter 5's KV cache kept in Q8_0 ([`ROW_Q8_0`](cache::ROW_Q8_0)), and the
//!   cache types by llama.cpp's names.
//! - [`agreement`]: how a quantized model is judged against llama.cpp (or another engine):
//!   KL divergence and mean |Δlogit| of the next-token distribution, and teacher-forced greedy
//!   tokens that may differ only at near-ties, with the named tolerances every such check uses.
//!
//! Left for later: SIMD versions of the dot products, chosen at run time and tested against
//! these scalar ones, and threads (chapter 8); weights mapped from the file instead of copied
//! (chapter 10).

pub mod agreement;
pub mod cache;
pub mod gguf_write;
pub mod qmatrix;
pub mod quants;
pub mod recipe;

pub use qmatrix::{QMatrix, QuantLoader, RequantLoader, requantize};
pub use quants::{Block, TypeTraits, WEIGHT_TYPES, quantize_chunk, type_traits};
