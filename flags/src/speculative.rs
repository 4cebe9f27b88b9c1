//! Chapter 16's engine: chapter 15's flags and speculative decoding's (`--spec`,
//! `--draft-model`, `--draft-max`; llama.cpp's names where it has them), turned into chapter
//! 16's [`SpecArgs`]; and chapter 12's server with chapter 15's output forms and `--spec
//! ngram` ([`LookupGuessing`]).

use crate::production::{self, Production};
use crate::scaling;
use crate::structured::Structured;
use ch04::Architectures;
use ch16::LookupGuessing;
use ch16::runner::{self, DRAFT_MAX, SpecArgs, SpecKind};
use clap::{Parser, ValueEnum};
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;

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
    run_or_exit(&args(flags, name.as_deref(), archs));
}

/// The settings `flags` give for `archs` (`name`: the program's, for messages); a usage error
/// exits.
pub fn args(flags: Speculative, name: Option<&str>, archs: Architectures) -> SpecArgs {
    let rule = flags.structured.rule(name);
    SpecArgs {
        run: scaling::checked(flags.structured.scaling, archs, rule),
        spec: flags.spec.into(),
        draft_model: flags.draft_model,
        draft_max: flags.draft_max,
    }
}

/// Run chapter 16's engine as `args` say; exit 1 with the error if it fails.
pub fn run_or_exit(args: &SpecArgs) {
    if let Err(e) = runner::run(args) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

// ANCHOR: serve_flags
/// The production server's flags and the server's speculation.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "production",
    about = "Serve GGUF models over HTTP with OpenAI's API: metrics, logs, a graceful shutdown; \
             requests may ask for JSON or a grammar; --spec ngram guesses tokens ahead.",
    long_about = None,
    after_help = production::SETTINGS_HELP,
    max_term_width = 100
)]
pub struct SpeculativeServer {
    #[command(flatten)]
    pub production: Production,
    /// Speculative decoding for every request: ngram guesses what followed the last tokens
    /// earlier in the request's prompt or output, checked in the same step (the output does
    /// not change). A request's `speculative.n_max` lowers its guesses, 0 turns them off.
    /// (llama.cpp: --spec-type ngram-simple.)
    #[arg(long, visible_alias = "spec-type", value_enum, default_value = "none")]
    pub spec: ServeSpec,
    /// Most tokens a request guesses per step (llama.cpp: --spec-draft-n-max).
    #[arg(long, visible_alias = "spec-draft-n-max", default_value_t = DRAFT_MAX)]
    pub draft_max: usize,
    /// Guesses checked each step whatever they cost; past these, only those expected to pay
    /// for their rows are (llama.cpp: --spec-draft-n-min).
    #[arg(long, visible_alias = "spec-draft-n-min", default_value_t = 0)]
    pub draft_min: usize,
}

/// `--spec` of the server: prompt lookup or nothing (a draft model in the server would need a
/// draft cache per request, which chapter 16 leaves for later).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ServeSpec {
    None,
    #[value(alias = "ngram-simple")]
    Ngram,
}

/// `llm-rs serve`: chapter 12's server with chapter 15's output forms and, with `--spec
/// ngram`, each request's guesses checked in the continuous batch.
pub fn serve_from(argv: Vec<OsString>, archs: Architectures) {
    let program = argv.first().cloned().unwrap_or_default();
    let flags: SpeculativeServer = production::parse_or_exit(argv);
    production::run_checked::<SpeculativeServer>(&serve_args(flags, archs), &program);
}

/// The server's settings `flags` give for `archs`; a usage error exits with status 2.
pub fn serve_args(flags: SpeculativeServer, archs: Architectures) -> ch12::Args {
    let mut args = flags.production.args(archs);
    args.serve.formats = Arc::new(ch15::Structured::default());
    if flags.spec == ServeSpec::Ngram {
        if flags.draft_max == 0 {
            eprintln!("error: --draft-max 0 guesses nothing: give at least 1, or --spec none");
            std::process::exit(2);
        }
        args.serve.guessing = Arc::new(LookupGuessing {
            draft_max: flags.draft_max,
            draft_min: flags.draft_min,
        });
    }
    args
}
// ANCHOR_END: serve_flags
