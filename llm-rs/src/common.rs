//! The settings `llm-rs run`, `chat` and `serve` share: which model, how it is loaded, how
//! many threads, how long a context, what the KV cache keeps. Declared once here; each
//! subcommand's flags flatten them.

use ch05::{CacheTypes, RowType};
use ch06::cache::cache_row_type;
use ch06::recipe::LlamaFtype;
use ch17::Checkpoints;
use std::path::PathBuf;

/// The model and how it is held in memory.
#[derive(clap::Args, Debug, Clone)]
pub struct ModelFlags {
    /// GGUF model file or Hugging Face directory (default: the default model, fetched on first
    /// use).
    #[arg(long, short = 'm')]
    pub model: Option<PathBuf>,
    /// Store a Hugging Face directory's matrices as this file type when loading it (F32, F16,
    /// BF16, Q8_0, Q4_0, Q4_K_M, …; chapter 6's recipe); by default they keep the
    /// checkpoint's own type.
    // ANCHOR: quantize
    #[arg(long, value_parser = ftype)]
    pub quantize: Option<LlamaFtype>,
    // ANCHOR_END: quantize
    /// Threads for the forward pass; by default the machine's physical cores, as llama.cpp
    /// chooses; at most 4 per hardware thread, more is refused.
    #[arg(long, short = 't', default_value_t = ch04::cli::default_threads())]
    pub threads: usize,
    /// Context size: positions a run holds, or one request of the server, prompt and
    /// completion together (default: 4096, or the model's context if shorter).
    #[arg(long, short = 'c', visible_alias = "ctx-size")]
    pub ctx: Option<usize>,
    /// Keep every weight a view of the file: no repacking for chapter 8's micro-kernel, which
    /// by default interleaves the matrices where the CPU has one (faster products, but the
    /// packed weights are a private copy, no longer the mapped pages).
    #[arg(long)]
    pub no_repack: bool,
    /// Type of the keys in the KV cache: f32, f16 (half the memory, llama.cpp's default) or
    /// q8_0 (a little over a quarter). The GPU path keeps its own f32 cache.
    #[arg(long, default_value = "f16", value_parser = cache_row_type)]
    pub cache_type_k: RowType,
    /// Type of the values in the KV cache: f32, f16 or q8_0.
    #[arg(long, default_value = "f16", value_parser = cache_row_type)]
    pub cache_type_v: RowType,
}

impl ModelFlags {
    /// What the KV cache keeps keys and values in.
    pub fn cache(&self) -> CacheTypes {
        CacheTypes {
            k: self.cache_type_k,
            v: self.cache_type_v,
        }
    }

    /// How a path becomes a GGUF image: chapter 17's, which opens a Hugging Face directory
    /// (its matrices stored as `--quantize` says) and anything else as chapter 10 does.
    pub fn files(&self) -> Checkpoints {
        Checkpoints {
            precision: self.quantize,
        }
    }
}

/// A file type by llama.cpp's name (`Q4_K_M`, `F16`, …).
pub fn ftype(name: &str) -> Result<LlamaFtype, String> {
    LlamaFtype::from_name(name).map_err(|e| e.to_string())
}
