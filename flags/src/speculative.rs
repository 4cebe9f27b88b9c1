//! Chapter 16's engine: chapter 15's flags and speculative decoding's (`--spec`,
//! `--draft-model`, `--draft-max`; llama.cpp's names where it has them), turned into chapter
//! 16's [`SpecArgs`].

use crate::scaling;
use crate::structured::Structured;
use ch16::Architectures;
use ch16::runner::{self, DRAFT_MAX, SpecArgs, SpecKind};
use clap::{Parser, ValueEnum};
use std::ffi::OsString;
use std::path::PathBuf;

/// Run a GGUF model: complete a prompt, or chat — guessing tokens ahead if asked.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "engine",
    about = "Run a GGUF model: complete a prompt, or chat (--chat); --grammar or --json-schema \
             holds the output to a form; --spec guesses tokens ahead (same output, fewer passes \
             over the weights)."
)]
pub struct Speculative {
    /// Chapter 15's flags: chapter 14's and the grammar ones.
    #[command(flatten)]
    pub structured: Structured,
    /// Speculative decoding: guess tokens and check them in one pass over the weights. ngram:
    /// find the last tokens earlier in the prompt or output and guess what followed; draft: a
    /// smaller model with the same vocabulary (--draft-model). The output does not change.
    /// (llama.cpp: --spec-type ngram-simple|draft-simple.)
    #[arg(long, visible_alias = "spec-type", value_enum, default_value = "none")]
    pub spec: Spec,
    /// The draft model's GGUF file, for --spec draft (llama.cpp: --spec-draft-model, -md).
    #[arg(long, visible_aliases = ["spec-draft-model", "model-draft"])]
    pub draft_model: Option<PathBuf>,
    /// Most tokens guessed per pass; fewer are guessed while guesses fail (llama.cpp:
    /// --spec-draft-n-max).
    #[arg(long, visible_alias = "spec-draft-n-max", default_value_t = DRAFT_MAX)]
    pub draft_max: usize,
}

/// `--spec`: chapter 16's [`SpecKind`], by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Spec {
    None,
    #[value(alias = "ngram-simple")]
    Ngram,
    #[value(alias = "draft-simple")]
    Draft,
}

impl From<Spec> for SpecKind {
    fn from(s: Spec) -> SpecKind {
        match s {
            Spec::None => SpecKind::None,
            Spec::Ngram => SpecKind::Ngram,
            Spec::Draft => SpecKind::Draft,
        }
    }
}

/// Chapter 15's `main_from` with speculation: parse, check, run with the architectures
/// `archs`, and exit with an error message on failure.
pub fn main_from(argv: Vec<OsString>, archs: Architectures) {
    let name = argv.first().map(|a| a.to_string_lossy().into_owned());
    let flags = Speculative::parse_from(argv);
    let rule = flags.structured.rule(name.as_deref());
    let args = SpecArgs {
        run: scaling::checked(flags.structured.scaling, archs, rule),
        spec: flags.spec.into(),
        draft_model: flags.draft_model,
        draft_max: flags.draft_max,
    };
    if let Err(e) = runner::run(&args) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
