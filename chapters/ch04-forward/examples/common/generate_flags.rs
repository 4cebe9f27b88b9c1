//! Chapter 4's command line: the flags of the `generate` example (llama.cpp's names), turned
//! into chapter 4's settings, [`Args`], and the example's whole `main`.
//!
//! A module of the examples, not of the library: chapter 4's library takes its settings as a
//! plain value and knows no command line. The `generate` examples of chapters 5, 6 and 8 are
//! this program with another loader or session, and chapter 10's engine adds its flags to
//! these: they include this file (`#[path = …] mod generate_flags;`), so the flags are
//! declared once.

// Not every program that includes this file calls each of its functions.
#![allow(dead_code)]

use ch04::cli::{self, Args};
use ch04::{ForwardError, Model, Session};
use clap::Parser;
use std::path::PathBuf;

/// Generate text with a GGUF model.
#[derive(Parser, Debug, Clone)]
pub struct Generate {
    /// GGUF model file (default: the default model, fetched on first use).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// The prompt (or give it as the last argument).
    #[arg(long, short)]
    pub prompt: Option<String>,
    /// The prompt, as a positional argument.
    #[arg(value_name = "PROMPT", conflicts_with = "prompt")]
    pub prompt_arg: Option<String>,
    /// A file holding the prompt, less one final newline: for prompts longer than a command
    /// line takes.
    #[arg(
        long = "file",
        short = 'f',
        value_name = "FNAME",
        conflicts_with_all = ["prompt", "prompt_arg"]
    )]
    pub prompt_file: Option<PathBuf>,
    /// Number of tokens to generate.
    #[arg(short = 'n', long = "n-predict", default_value_t = Args::default().n)]
    pub n: usize,
    /// Temperature; 0 is greedy.
    #[arg(long, default_value_t = Args::default().temp)]
    pub temp: f32,
    #[arg(long, default_value_t = Args::default().top_k)]
    pub top_k: usize,
    #[arg(long, default_value_t = Args::default().top_p)]
    pub top_p: f32,
    #[arg(long, default_value_t = Args::default().min_p)]
    pub min_p: f32,
    #[arg(long, default_value_t = Args::default().repeat_penalty)]
    pub repeat_penalty: f32,
    /// Random seed (default: from the clock; printed so a run can be repeated).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Threads (used from chapter 8 on); by default the machine's physical cores, as
    /// llama.cpp chooses; at most 4 per hardware thread, more is refused.
    #[arg(long, short = 't', default_value_t = cli::default_threads())]
    pub threads: usize,
    /// Context size: positions a run holds (default: 4096, or the model's context if
    /// shorter).
    #[arg(long, short = 'c', visible_alias = "ctx-size")]
    pub ctx: Option<usize>,
    /// Chat: the prompt (if any) is the first user message, then one message per line of
    /// stdin, each answered through the model's chat template; /exit or end of input stops.
    #[arg(long)]
    pub chat: bool,
    /// The system message of a --chat conversation (default: the template's own, if any).
    #[arg(long, requires = "chat")]
    pub system: Option<String>,
    /// Stop when the text contains this (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Print one JSON object instead of streaming text (not with --chat).
    #[arg(long, conflicts_with = "chat")]
    pub json: bool,
    /// Never end at an end-of-generation token: generate all -n tokens (for benchmarks).
    #[arg(long)]
    pub ignore_eos: bool,
}

impl Generate {
    /// The settings these flags give; exit 1 with the reason if `--file` cannot be read.
    pub fn args(&self) -> Args {
        let from_file = self.prompt_file.as_deref().map(|path| {
            cli::read_prompt_file(path).unwrap_or_else(|e| {
                eprintln!("error: {e}");
                std::process::exit(1);
            })
        });
        Args {
            model: self.model.clone(),
            prompt: self
                .prompt
                .clone()
                .or(self.prompt_arg.clone())
                .or(from_file),
            n: self.n,
            temp: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            seed: self.seed,
            threads: self.threads,
            ctx: self.ctx,
            chat: self.chat,
            system: self.system.clone(),
            stop: self.stop.clone(),
            json: self.json,
            rule: self.ignore_eos.then(|| {
                std::sync::Arc::new(ch04::IgnoreEos) as std::sync::Arc<dyn ch04::MakeRule>
            }),
        }
    }
}

/// The whole `main` of a `generate` example: parse the flags, run chapter 4's
/// [`cli::run`], and exit with a message on error.
pub fn main(
    load: impl FnOnce(&ch01::GgufFile) -> Result<Model, Box<dyn std::error::Error>>,
    session: impl for<'m> Fn(&'m Model, &Args) -> Box<dyn Session<Error = ForwardError> + 'm>,
) {
    let mut args = Generate::parse().args();
    default_model(&mut args);
    if let Err(e) = cli::run(&args, load, |model| session(model, &args)) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// The default model (fetched on first use) where `args` names none; exit 1 if it cannot be
/// had.
pub fn default_model(args: &mut Args) {
    match shared::model_or_default(args.model.take()) {
        Ok(path) => args.model = Some(path),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
