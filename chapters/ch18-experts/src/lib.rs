//! Chapter 18: mixture of experts — a router, experts stored as 3-D tensors, and a batch run
//! expert by expert.
//!
//! A mixture-of-experts layer replaces the feed-forward network by many smaller ones, the
//! experts, and a router that picks a few of them for each token. A token reads only the
//! experts it is routed to: Qwen3-30B-A3B stores 30B weights and reads about 3B per token, so on
//! a CPU, where decoding is bound by the bytes read, it decodes about as fast as a 3B model.
//!
//! - [`router`]: the router's rule (a softmax over the experts, the top `k`, their weights
//!   renormalised) and its top-k selection.
//! - [`moe`]: the block: the sizes read and checked ([`MoeShape`](moe::MoeShape)), each expert a
//!   slice of the 3-D tensors ([`expert_matrix`](moe::expert_matrix)), the batch grouped by expert
//!   ([`group_by_expert`](moe::group_by_expert)) and run expert by expert, given to chapter 4's
//!   llama blocks through [`FfnBlock`](ch04::llama::FfnBlock).
//! - [`report`]: what a file's token reads, from its metadata
//!   ([`ExpertReport`](report::ExpertReport)), which `llm-rs inspect` prints.
//! - [`qwen3moe`]: Qwen3-MoE, chapter 13's Qwen3 attention with this chapter's block.
//! - [`olmoe`]: OLMoE, query and key norms across the whole width and the probabilities as the
//!   experts' weights.
//! - [`recipe`]: Qwen3-30B-A3B and OLMoE-1B-7B you can make, chapter 14's recipe with this
//!   chapter's tensors.
//! - [`architectures()`]: chapter 13's set with Qwen3-MoE and OLMoE added.

use ch04::Architectures;
pub mod moe;
pub mod olmoe;
pub mod qwen3moe;
pub mod recipe;
pub mod report;
pub mod router;

// ANCHOR: architectures
/// Every architecture the tower knows: chapter 13's with this chapter's.
pub fn architectures() -> Architectures {
    ch13::architectures()
        .with(qwen3moe::ARCHITECTURE)
        .with(olmoe::ARCHITECTURE)
}
// ANCHOR_END: architectures
