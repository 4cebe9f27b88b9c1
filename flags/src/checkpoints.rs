//! Chapter 17's engine: chapter 16's flags, with `--model` also naming a Hugging Face
//! directory and `--quantize TYPE` storing its matrices as a chapter 6 file type; and chapter
//! 16's server the same way.

use crate::production;
use crate::speculative::{self, Speculative, SpeculativeServer};
use ch04::Architectures;
use ch06::recipe::LlamaFtype;
use ch17::Checkpoints;
use clap::Parser;
use std::ffi::OsString;
use std::sync::Arc;

/// A file type by llama.cpp's name (`Q4_K_M`, `F16`, …).
fn ftype(name: &str) -> Result<LlamaFtype, String> {
    LlamaFtype::from_name(name).map_err(|e| e.to_string())
}

// ANCHOR: flags
#[derive(Parser, Debug, Clone)]
#[command(
    name = "engine",
    about = "Run a GGUF model or a Hugging Face directory: complete a prompt, or chat \
             (--chat); --grammar or --json-schema holds the output to a form; --spec guesses \
             tokens ahead."
)]
pub struct Checkpoint {
    #[command(flatten)]
    pub speculative: Speculative,
    /// Store a Hugging Face directory's matrices as this file type when loading it (F32, F16,
    /// BF16, Q8_0, Q4_0, Q4_K_M, …; chapter 6's recipe); by default they keep the
    /// checkpoint's own type.
    #[arg(long, value_parser = ftype)]
    pub quantize: Option<LlamaFtype>,
}
// ANCHOR_END: flags

pub fn main_from(argv: Vec<OsString>, archs: Architectures) {
    let name = argv.first().map(|a| a.to_string_lossy().into_owned());
    let flags = Checkpoint::parse_from(argv);
    let mut args = speculative::args(flags.speculative, name.as_deref(), archs);
    args.run.engine.files = Arc::new(Checkpoints {
        precision: flags.quantize,
    });
    speculative::run_or_exit(&args);
}

#[derive(Parser, Debug, Clone)]
#[command(
    name = "production",
    about = "Serve a GGUF model or a Hugging Face directory over HTTP with OpenAI's API: \
             metrics, logs, a graceful shutdown; requests may ask for JSON or a grammar; \
             --spec ngram guesses tokens ahead.",
    long_about = None,
    after_help = production::SETTINGS_HELP,
    max_term_width = 100
)]
pub struct CheckpointServer {
    #[command(flatten)]
    pub speculative: SpeculativeServer,
    /// Store a Hugging Face directory's matrices as this file type when loading it.
    #[arg(long, value_parser = ftype)]
    pub quantize: Option<LlamaFtype>,
}

pub fn serve_from(argv: Vec<OsString>, archs: Architectures) {
    let program = argv.first().cloned().unwrap_or_default();
    let flags: CheckpointServer = production::parse_or_exit(argv);
    let mut args = speculative::serve_args(flags.speculative, archs);
    args.serve.files = Arc::new(Checkpoints {
        precision: flags.quantize,
    });
    production::run_checked::<CheckpointServer>(&args, &program);
}
