//! Chapter 4: the whole model, and the first text it writes.
//!
//! What this chapter adds to chapter 3:
//! - [`compute`]: RMSNorm and the gate activations (SiLU, GELU), and [`Compute`], chapter 3's
//!   compute seam extended with RMSNorm, the feed-forward gate and the residual add (their
//!   scalar code is the default); [`Scratch`], the buffers a forward pass reuses so that a
//!   decode step allocates nothing.
//! - [`layer`]: the gated feed-forward block, one transformer block's weights.
//! - [`arch`]: architectures as values: the [`Blocks`] trait a model's layers implement, and
//!   [`Architectures`], the set of architectures [`Model::load`] is given.
//! - [`llama`]: llama, the first architecture: its blocks, their attention as a value
//!   ([`llama::AttentionBlock`], chapter 3's for llama), and its loader.
//! - [`memory`]: sizes multiplied without overflow and checked against the machine's memory
//!   before a buffer of that size is allocated (a hostile file's context length, a flag's).
//! - [`batch`]: the tokens of one forward pass, each with its sequence and position.
//! - [`model`]: token embeddings, the architecture's blocks, the final norm and the output
//!   projection (tied to the embeddings when the file has no `output.weight`), and
//!   [`Model::forward`] over a [`Batch`] of tokens.
//! - [`sampling`]: greedy, temperature, top-k, top-p, min-p and repetition penalty, chained in
//!   llama.cpp's default order, with a seeded random number generator.
//! - [`generate`]: one step of generation ([`Generator`]: sample, stream the text through
//!   chapter 2's streaming detokenizer, stop on end-of-generation tokens, stop strings or a
//!   token limit) and the loop that runs it over a [`Session`].
//! - [`by_hand`]: one token through llama with every seam inlined, in reading order: the
//!   forward pass in one function, checked against [`Model::forward`] and llama.cpp.
//! - [`cli`]: the command line every later chapter's engine keeps: flags, one prompt or a
//!   conversation, timings and `--json`, with seams for each chapter's loading and running.
//!
//! Generation here is deliberately O(n²): the [`Uncached`] session recomputes the whole sequence
//! for every new token. Chapter 5 keeps the keys and values between steps (the KV cache) through
//! the same [`Session`] trait. Weights are f32 ([`ch03::DenseLoader`]); chapter 6 keeps them
//! quantized through the same [`ch03::MatrixLoader`] trait.

pub mod arch;
pub mod batch;
pub mod by_hand;
pub mod cli;
pub mod compute;
pub mod generate;
pub mod layer;
pub mod llama;
pub mod memory;
pub mod model;
pub mod sampling;

pub use arch::{ArchSet, Architecture, Architectures, Blocks, Ctx, LoadBlocks, Named};
pub use compute::{Activation, Compute, FfnScratch, Scratch};

pub use generate::{
    GenParams, Generation, Generator, Session, StepError, StopFilter, StopReason, Uncached,
    generate,
};
pub use model::{Batch, ContextError, ForwardError, Model, NonFinite, Weights, check_context};
pub use sampling::{BadSamplerParam, IgnoreEos, MakeRule, Sampler, SamplerParams, TokenRule};

/// The architectures of this chapter: llama. Every later chapter passes this set on, or a
/// bigger one.
pub fn architectures() -> Architectures {
    Architectures::new().with(llama::ARCHITECTURE)
}
