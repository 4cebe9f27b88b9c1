//! Chapter 3: the attention block of a llama layer.
//!
//! What this chapter adds to chapter 2:
//! - [`matrix`]: the first dense f32 operations (dot product, matrix product over row-major
//!   weights) and the [`Matrix`] trait through which the model uses every weight. Weights are
//!   loaded by a [`MatrixLoader`]; here [`DenseLoader`] dequantizes them to f32.
//! - [`rope`]: rotary position embeddings, both pairing conventions.
//! - [`attention`]: scaled dot-product attention with a causal mask and a stable softmax,
//!   multi-head and grouped-query, an optional sliding window, and one layer's Q/K/V/O
//!   projections.
//! - [`ops`]: the compute seam for the non-product work of attention ([`AttentionOps`]: RoPE and
//!   the attention of a batch of queries), whose default methods are this chapter's scalar
//!   code; chapter 8 implements it with SIMD kernels on threads.
//! - [`kv`]: where keys and values are kept between positions. Here a plain growable store,
//!   rebuilt for every pass; chapter 5 turns it into a real KV cache.
//! - [`observe`]: intermediate tensors by llama.cpp's graph names, so tests can compare ours
//!   with llama.cpp's one by one.
//!
//! What it leaves for later: the rest of the layer (norms, feed-forward) and the model (chapter
//! 4), keeping keys and values across calls (chapter 5), quantized weights (chapter 6).

pub mod attention;
pub mod kv;
pub mod matrix;
pub mod observe;
pub mod ops;
pub mod rope;

pub use attention::{Attention, AttentionWeights, AttnBias, TokenPos, softmax};
pub use kv::{KvDyn, KvError, KvRows, KvStore, KvView, VecKv};
pub use matrix::{DenseLoader, DenseMatrix, LoadError, Matrix, MatrixLoader};
pub use observe::{NoObserver, Observer, Recorder};
pub use ops::{AttentionOps, AttnScratch, Scalar};
pub use rope::{RopeScale, RopeTable};
