//! Qwen3-MoE: Qwen3's blocks with a mixture of experts in place of the SwiGLU network.
//!
//! llama.cpp's `qwen3moe` graph (`src/models/qwen3moe.cpp`, through `build_moe_ffn` of
//! `src/llama-graph.cpp`) keeps Qwen3's attention (per-head query and key norms before NeoX
//! RoPE, chapter 13's [`QkNormed`](ch13::qwen3::QkNormed)) and replaces each layer's
//! feed-forward network by this chapter's [`Moe`](crate::moe::Moe): the router's softmax,
//! top-k and renormalised weights, no shared expert.

use crate::moe::Family;
use crate::router::Weights;
use ch01::{Config, GgufFile};
use ch03::matrix::{LoadError, MatrixLoader};
use ch04::{Architecture, Blocks};

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
/// Qwen3-MoE's choices: Qwen3's norms, one head wide; without `expert_feed_forward_length`,
/// the dense width shared among the experts used (llama.cpp's fallback); weights renormalised.
pub const FAMILY: Family = Family {
    arch: ARCH,
    norm_widths: |c| (c.head_dim, c.head_dim),
    fallback_ff: |c, n_used| c.n_ff / n_used,
    weights: Weights::Normalised,
};

/// Read a Qwen3-MoE file's configuration and build its blocks.
pub fn load(
    file: &GgufFile<&[u8]>,
    loader: &dyn MatrixLoader,
) -> Result<(Config, Box<dyn Blocks>), LoadError> {
    FAMILY.load(file, loader)
}
// ANCHOR_END: load
