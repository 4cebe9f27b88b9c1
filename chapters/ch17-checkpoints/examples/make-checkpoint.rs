//! Make a Hugging Face checkpoint from a GGUF model, as its publisher would have uploaded it
//! before llama.cpp's converter made the GGUF file: the tests' checkpoints, for trying
//! `llm-rs run --model DIR` and `llm-rs convert DIR OUT.gguf` by hand.
//!
//! ```sh
//! cargo run --release -p ch17 --example make-checkpoint -- OUT_DIR [--layers 4] [--dtype bf16]
//! ```
//!
//! Weights are written by Hugging Face's `safetensors`, the tokenizer by its `tokenizers`
//! (see `tests/common`). With `--reference`, `OUT_DIR.reference.gguf` beside it holds the
//! values the directory stores in llama.cpp's layout, in F32: what converting the directory
//! must compute.

#[path = "../tests/common/mod.rs"]
mod common;

use clap::{Parser, ValueEnum};
use safetensors::Dtype;
use std::path::PathBuf;

#[derive(Parser)]
struct Args {
    /// The directory to write (replaced if it exists).
    out: PathBuf,
    /// The GGUF model (default: the default model).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Keep only the first N layers (full width).
    #[arg(long)]
    layers: Option<usize>,
    #[arg(long, value_enum, default_value = "f32")]
    dtype: Stored,
    /// Split the weights into this many shards, with an index.
    #[arg(long, default_value_t = 1)]
    shards: usize,
    /// Also write OUT_DIR.reference.gguf (F32: four times a BF16 directory's size).
    #[arg(long)]
    reference: bool,
}

#[derive(Clone, Copy, ValueEnum)]
enum Stored {
    F32,
    F16,
    Bf16,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let model = match args.model {
        Some(m) => m,
        None => shared::default_model_path()?,
    };
    let src = ch01::GgufFile::open(&model)?;
    let recipe = common::Recipe {
        layers: args.layers,
        dtype: match args.dtype {
            Stored::F32 => Dtype::F32,
            Stored::F16 => Dtype::F16,
            Stored::Bf16 => Dtype::BF16,
        },
        shards: args.shards,
        rope_scaling: None,
        reference_in_dtype: false,
    };
    let _ = std::fs::remove_dir_all(&args.out);
    let reference = common::make(&src, &recipe, &args.out);
    let mut ref_path = args.out.clone().into_os_string();
    ref_path.push(".reference.gguf");
    if args.reference {
        std::fs::write(&ref_path, reference)?;
    }
    let mut files: Vec<String> = std::fs::read_dir(&args.out)?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    files.sort();
    println!("{}: {}", args.out.display(), files.join(", "));
    if args.reference {
        println!("reference: {}", PathBuf::from(ref_path).display());
    }
    Ok(())
}
