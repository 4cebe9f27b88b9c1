//! OLMoE: a second mixture-of-experts family, with its own attention and its own router rule.
//!
//! llama.cpp's `olmoe` graph (`src/models/olmoe.cpp`) differs from Qwen3-MoE in three places:
//!
//! - **Query and key norms across the whole width.** OLMoE RMS-normalises each token's queries
//!   (`attn_q_norm`, `(n_embd)`) and keys (`attn_k_norm`, `(n_embd_k_gqa)`) as one vector each,
//!   before splitting them into heads; Qwen3 normalises every head on its own. Chapter 13's
//!   [`QkNormed`] takes the width from the norm's weights, so only the widths it is given change.
//! - **The weights are the probabilities.** `build_moe_ffn` is called without normalising the
//!   chosen experts' weights: a token's output is its experts' outputs times their softmax
//!   probabilities over all experts, which add up to less than one
//!   ([`Weights::Probabilities`]).
//! - **The experts are `feed_forward_length` wide**: the file has no
//!   `expert_feed_forward_length`.
//!
//! OLMoE-1B-7B has 16 layers, d_model 2048, 16 heads of 128 (no grouped-query attention), 64
//! experts of 1024 of which 8 run per token, and a 50,304-token vocabulary.

use crate::moe::{Moe, MoeShape};
use crate::router::Weights;
use ch01::config::RopeStyle;
use ch01::{Config, GgufFile};
use ch03::matrix::{LoadError, MatrixLoader};
use ch04::llama::Llama;
use ch04::{Architecture, Blocks};
use ch13::qwen3::QkNormed;

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
/// Read an OLMoE file's configuration and build its blocks: llama's, rotating halves, with
/// query and key norms across the whole width and a mixture of experts weighted by their
/// probabilities.
pub fn load(
    file: &GgufFile<&[u8]>,
    loader: &dyn MatrixLoader,
) -> Result<(Config, Box<dyn Blocks>), LoadError> {
    let mut config =
        Config::from_gguf(&file.gguf, &[ARCH]).map_err(|e| LoadError::Other(e.to_string()))?;
    config.rope_style = RopeStyle::Neox;
    let shape = MoeShape::read(file, &config, ARCH, |_| config.n_ff)?;
    let (q, k) = (
        config.n_head * config.head_dim,
        config.n_head_kv * config.head_dim,
    );
    let attention = QkNormed::load_widths(file, &config, q, k)?;
    let blocks = Llama::load_with_ffn(file, loader, &config, attention, |l| {
        Moe::load(file, loader, &config, shape, Weights::Probabilities, l)
    })?;
    Ok((config, Box::new(blocks)))
}
// ANCHOR_END: load
