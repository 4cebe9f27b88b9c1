//! OLMoE: a second mixture-of-experts family, with its own attention and its own router rule.
//!
//! llama.cpp's `olmoe` graph (`src/models/olmoe.cpp`) differs from Qwen3-MoE in three places:
//!
//! - **Query and key norms across the whole width.** OLMoE RMS-normalises each token's queries
//!   (`attn_q_norm`, `(n_embd)`) and keys (`attn_k_norm`, `(n_embd_k_gqa)`) as one vector each,
//!   before splitting them into heads; Qwen3 normalises every head on its own. Chapter 13's
//!   `QkNormed` takes the width from the norm's weights, so only the widths it is given change.
//! - **The weights are the probabilities.** `build_moe_ffn` is called without normalising the
//!   chosen experts' weights: a token's output is its experts' outputs times their softmax
//!   probabilities over all experts, which add up to less than one
//!   ([`Weights::Probabilities`]).
//! - **The experts are `feed_forward_length` wide**: the file has no
//!   `expert_feed_forward_length`.
//!
//! OLMoE-1B-7B has 16 layers, d_model 2048, 16 heads of 128 (no grouped-query attention), 64
//! experts of 1024 of which 8 run per token, and a 50,304-token vocabulary.

use crate::moe::Family;
use crate::router::Weights;
use ch01::{Config, GgufFile};
use ch03::matrix::{LoadError, MatrixLoader};
use ch04::{Architecture, Blocks};

/// `general.architecture` of OLMoE files.
pub const ARCH: &str = "olmoe";

/// OLMoE in a set of [`Architectures`](ch04::Architectures). Its files carry their own chat
/// template.
pub const ARCHITECTURE: Architecture = Architecture {
    name: ARCH,
    load,
    chat_template: None,
};

// ANCHOR: load
/// OLMoE's choices: the norms across the queries' and keys' whole widths, experts
/// `feed_forward_length` wide, the probabilities as weights.
pub const FAMILY: Family = Family {
    arch: ARCH,
    norm_widths: |c| (c.n_head * c.head_dim, c.n_head_kv * c.head_dim),
    fallback_ff: |c, _| c.n_ff,
    weights: Weights::Probabilities,
};

/// Read an OLMoE file's configuration and build its blocks.
pub fn load(
    file: &GgufFile<&[u8]>,
    loader: &dyn MatrixLoader,
) -> Result<(Config, Box<dyn Blocks>), LoadError> {
    FAMILY.load(file, loader)
}
// ANCHOR_END: load
