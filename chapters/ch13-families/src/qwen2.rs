//! Qwen2: llama's blocks with two differences that are data, not code.
//!
//! llama.cpp's `qwen2` graph (`src/models/qwen2.cpp`) is llama's, with biases added to the
//! query, key and value projections (chapter 3's [`AttnBias`](ch03::AttnBias), which a
//! llama file may carry too) and RoPE rotating halves (NeoX style) instead of adjacent pairs,
//! because Qwen2's GGUF files keep Hugging Face's order of the query and key rows. So this
//! architecture needs no blocks of its own: its loader reads the configuration, sets the RoPE
//! style, and builds chapter 4's llama blocks.

use ch01::config::RopeStyle;
use ch01::{Config, GgufFile};
use ch03::matrix::{LoadError, MatrixLoader};
use ch04::llama::Llama;
use ch04::{Architecture, Blocks};

/// `general.architecture` of Qwen2 files.
pub const ARCH: &str = "qwen2";

// ANCHOR: load
/// Read a Qwen2 file's configuration and build its blocks: llama's, rotating halves.
pub fn load(
    file: &GgufFile<&[u8]>,
    loader: &dyn MatrixLoader,
) -> Result<(Config, Box<dyn Blocks>), LoadError> {
    let mut config =
        Config::from_gguf(&file.gguf, &[ARCH]).map_err(|e| LoadError::Other(e.to_string()))?;
    config.rope_style = RopeStyle::Neox;
    let blocks = Llama::load(file, loader, &config)?;
    Ok((config, Box::new(blocks)))
}
// ANCHOR_END: load

/// Qwen2 in a set of [`Architectures`](ch04::Architectures). Qwen2 files carry their own
/// chat template.
pub const ARCHITECTURE: Architecture = Architecture {
    name: ARCH,
    load,
    chat_template: None,
};
