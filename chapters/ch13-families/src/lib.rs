//! Chapter 13: model families — Gemma 3, Qwen2 and Qwen3 beside llama, and llama's own variants.
//!
//! Every chapter so far ran one architecture, llama. This chapter adds Gemma 3, Qwen2 and Qwen3
//! through the value chapter 4 passes to its loader ([`Architectures`]): an architecture brings
//! its own blocks ([`Blocks`]) and its loader, and shares everything else — embeddings, output,
//! the KV caches, chapter 7's scheduler, chapter 8's kernels, chapter 10's mapped file, the
//! servers of chapters 11 and 12. No earlier chapter changes: this one builds a bigger set and
//! hands it to the engine and the server.
//!
//! - [`gemma3`]: Gemma 3's blocks (norms on queries and keys, sliding-window and global layers
//!   with their own RoPE bases, norms after each sub-block, the GELU gate), its loader, and its
//!   chat template for files that carry none.
//! - [`qwen2`]: Qwen2, which runs llama's blocks: its Q/K/V biases and its RoPE style are
//!   data (chapter 3's optional biases, the configuration's style), so only a loader is new.
//! - [`qwen3`]: Qwen3 (dense), llama's blocks with an attention of its own: a per-head RMSNorm
//!   of the queries and keys before RoPE, given to the blocks through chapter 4's
//!   [`AttentionBlock`](ch04::llama::AttentionBlock).
//! - Llama-family variants need no family at all: Llama 3's RoPE frequency factors and YaRN
//!   scaling are chapter 3's [`RopeScale`](ch03::RopeScale), read from the file.
//! - [`synthetic`]: models built from a recipe (real metadata and vocabulary, seeded weights),
//!   for checking those variants against llama.cpp without a real model of each.
//! - [`architectures()`]: chapter 12's set (llama) with Gemma 3, Qwen2 and Qwen3 added.
//!
//! The finished engine, the workspace's `llm-rs` binary (`run`, `chat`, `serve`, `inspect`), is
//! chapter 10's engine and chapter 12's server given a set built on this chapter's.

use ch04::Architectures;
pub mod gemma3;
pub mod qwen2;
pub mod qwen3;
pub mod synthetic;

// ANCHOR: architectures
/// Every architecture the chapters up to this one know: the earlier chapters' (llama) with
/// this chapter's.
pub fn architectures() -> Architectures {
    ch04::architectures()
        .with(gemma3::ARCHITECTURE)
        .with(qwen2::ARCHITECTURE)
        .with(qwen3::ARCHITECTURE)
}
// ANCHOR_END: architectures
