//! Qwen2: llama's blocks with two differences that are data, not code.
//!
//! llama.cpp's `qwen2` graph (`src/models/qwen2.cpp`) is llama's, with biases added to the
//! query, key and value projections (chapter 3's [`AttnBias`](crate::ch03::AttnBias), which a
//! llama file may carry too) and RoPE rotating halves (NeoX style) instead of adjacent pairs,
//! because Qwen2's GGUF files keep Hugging Face's order of the query and key rows. So this
//! family needs no blocks of its own: its loader reads the configuration, sets the RoPE style,
//! and builds chapter 4's llama model.

use crate::ch01::config::RopeStyle;
use crate::ch03::matrix::{LoadError, MatrixLoader};
use crate::{Config, FamilyInfo, GgufFile, Model};

/// `general.architecture` of Qwen2 files.
pub const ARCH: &str = "qwen2";

// ANCHOR: load
/// Build a Qwen2 model: llama's, rotating halves.
pub fn load(file: &GgufFile<&[u8]>, loader: &dyn MatrixLoader) -> Result<Model, LoadError> {
    let mut config =
        Config::from_gguf_any(&file.gguf).map_err(|e| LoadError::Other(e.to_string()))?;
    if config.arch != ARCH {
        return Err(LoadError::Other(format!(
            "the Qwen2 loader was given architecture {:?}",
            config.arch
        )));
    }
    config.rope_style = RopeStyle::Neox;
    Model::load_llama(file, loader, config)
}
// ANCHOR_END: load

/// The registry entry. Qwen2 files carry their own chat template.
pub const INFO: FamilyInfo = FamilyInfo {
    arch: ARCH,
    load,
    chat_template: None,
};
