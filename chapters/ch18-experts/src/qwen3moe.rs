//! Qwen3-MoE: Qwen3's blocks with a mixture of experts in place of the SwiGLU network.
//!
//! llama.cpp's `qwen3moe` graph (`src/models/qwen3moe.cpp`, through `build_moe_ffn` of
//! `src/llama-graph.cpp`) keeps Qwen3's attention (per-head query and key norms before NeoX
//! RoPE, chapter 13's [`QkNormed`]) and replaces each layer's feed-forward network by this
//! chapter's [`Moe`]: the router's softmax, top-k and renormalised weights, no shared expert.

use crate::moe::{Moe, MoeShape};
use crate::router::Weights;
use ch01::config::RopeStyle;
use ch01::{Config, GgufFile};
use ch03::matrix::{LoadError, MatrixLoader};
use ch04::llama::Llama;
use ch04::{Architecture, Blocks};
use ch13::qwen3::QkNormed;

/// `general.architecture` of Qwen3-MoE files.
pub const ARCH: &str = "qwen3moe";

/// Qwen3-MoE in a set of [`Architectures`](ch04::Architectures). Its files carry their own chat
/// template.
pub const ARCHITECTURE: Architecture = Architecture {
    name: ARCH,
    load,
    chat_template: None,
};

// ANCHOR: load
/// Read a Qwen3-MoE file's configuration and build its blocks: Qwen3's, with a [`Moe`] as each
/// layer's feed-forward network.
pub fn load(
    file: &GgufFile<&[u8]>,
    loader: &dyn MatrixLoader,
) -> Result<(Config, Box<dyn Blocks>), LoadError> {
    let mut config =
        Config::from_gguf(&file.gguf, &[ARCH]).map_err(|e| LoadError::Other(e.to_string()))?;
    config.rope_style = RopeStyle::Neox;
    // Without `expert_feed_forward_length`, llama.cpp splits the dense width among the used.
    let shape = MoeShape::read(file, &config, ARCH, |n_used| config.n_ff / n_used)?;
    let attention = QkNormed::load(file, &config)?;
    let blocks = Llama::load_with_ffn(file, loader, &config, attention, |l| {
        Moe::load(file, loader, &config, shape, Weights::Normalised, l)
    })?;
    Ok((config, Box::new(blocks)))
}
// ANCHOR_END: load
