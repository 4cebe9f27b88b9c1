//! What `llm-rs run`, `chat` and `serve` add to the chapters' command lines alike: chapter
//! 17's `--quantize`, and the way a path is opened that comes with it.

use ch06::recipe::LlamaFtype;
use ch17::Checkpoints;

/// `--quantize`: how a Hugging Face directory's matrices are stored when it is loaded.
#[derive(clap::Args, Debug, Clone)]
pub struct Quantize {
    /// Store a Hugging Face directory's matrices as this file type when loading it (F32, F16,
    /// BF16, Q8_0, Q4_0, Q4_K_M, …; chapter 6's recipe); by default they keep the
    /// checkpoint's own type.
    // ANCHOR: quantize
    #[arg(long, value_parser = ftype)]
    pub quantize: Option<LlamaFtype>,
    // ANCHOR_END: quantize
}

impl Quantize {
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
