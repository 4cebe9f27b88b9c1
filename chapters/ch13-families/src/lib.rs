//! Chapter 13: model families — Gemma 3 and Qwen2 beside llama, and llama's own variants.
//!
//! Every chapter so far ran one architecture, llama. This chapter adds Gemma 3 through the seam
//! chapter 4 left where the forward pass is defined ([`ch12::Family`]): a family brings its
//! own blocks and its loader, registered by `general.architecture`, and shares everything else
//! — embeddings, output, the KV caches, chapter 7's scheduler, chapter 8's kernels, chapter
//! 10's mapped file, the servers of chapters 11 and 12.
//!
//! - [`gemma3`]: Gemma 3's blocks (norms on queries and keys, sliding-window and global layers
//!   with their own RoPE bases, norms after each sub-block, the GELU gate), its loader, and its
//!   chat template for files that carry none.
//! - [`qwen2`]: Qwen2, which runs llama's blocks: its Q/K/V biases and its RoPE style are
//!   data (chapter 3's optional biases, the configuration's style), so only a loader is new.
//! - Llama-family variants need no family at all: Llama 3's RoPE frequency factors and YaRN
//!   scaling are chapter 3's [`RopeScale`](crate::ch03::RopeScale), read from the file.
//! - [`synthetic`]: models built from a recipe (real metadata and vocabulary, seeded weights),
//!   for checking those variants against llama.cpp without a real model of each.
//! - [`register`]: make every family of this chapter loadable; the binaries call it first.
//!
//! The binaries are the finished engine and its server with the families registered:
//! `cargo run --release -p ch13 -- --model gemma-3-270m-q4_k_m.gguf PROMPT` (chapter 10's
//! command line), and `cargo run --release -p ch13 --bin serve -- --model …` (chapter 12's).

pub mod gemma3;
pub mod qwen2;
pub mod synthetic;

/// Everything earlier chapters offer, so `ch13` reads as "the engine as of chapter 13".
pub use ch12::{self, *};

/// Register this chapter's families with chapter 4's loader registry. Idempotent.
pub fn register() {
    ch12::family::register(gemma3::INFO);
    ch12::family::register(qwen2::INFO);
}
