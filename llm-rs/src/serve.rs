//! `llm-rs serve`: chapter 12's production server with every chapter's part in place. Its
//! flags — chapter 12's command line, and what chapters 16 and 17 add — are parsed once, with
//! chapter 12's layering (each also from `LLM_RS_<FLAG>` and from the TOML file of
//! `--config`), into chapter 12's settings ([`ch12::Args`], chapter 11's inside), with chapter
//! 17's way of opening a path, chapter 15's output forms (a request's `response_format` and
//! `grammar`), chapter 19's tools and its two more APIs (OpenAI's Responses, Anthropic's
//! Messages) and, with `--spec ngram`, chapter 16's prompt lookup for every request.

use crate::common::Quantize;
use crate::production_flags::{self, Production, parse_or_exit, run_checked};
use ch04::Architectures;
use ch11::Predicted;
use ch15::Structured;
use ch16::LookupGuessing;
use ch16::runner::DRAFT_MAX;
use ch19::serve::{Apis, ToolChats};
use clap::{Parser, ValueEnum};
use std::ffi::OsString;
use std::sync::Arc;

/// Where else a server's flags come from, for its `--help`.
const SETTINGS_HELP: &str = production_flags::SETTINGS_HELP;

/// Serve GGUF models or Hugging Face directories over HTTP with OpenAI's APIs (chat
/// completions, completions, responses) and Anthropic's Messages API, tool calls included:
/// metrics, logs, a graceful shutdown; requests may ask for JSON or a grammar; --spec ngram
/// guesses tokens ahead.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "llm-rs serve",
    about = "Serve GGUF models or Hugging Face directories over HTTP with OpenAI's APIs (chat \
             completions, completions, responses) and Anthropic's Messages API, tool calls \
             included: metrics, logs, a graceful shutdown; requests may ask for JSON or a \
             grammar; --spec ngram guesses tokens ahead.",
    long_about = None,
    after_help = SETTINGS_HELP,
    max_term_width = 100
)]
pub struct Flags {
    /// Chapter 12's command line (its `production` example's): chapter 11's server flags and
    /// chapter 12's.
    #[command(flatten)]
    pub production: Production,
    /// Chapter 17's `--quantize`.
    #[command(flatten)]
    pub quantize: Quantize,

    // Chapter 16.
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

/// `llm-rs serve` with the arguments after `serve`, for the architectures `archs`: exit 2 on
/// a bad configuration (naming the flag, the variable or the file's key), 1 on a failure.
pub fn serve(rest: Vec<OsString>, archs: Architectures) {
    let program = OsString::from("llm-rs serve");
    let argv = std::iter::once(program.clone()).chain(rest).collect();
    let flags: Flags = parse_or_exit(argv);
    // Chapter 11's server over chapter 10's engine, and chapter 12's settings around it, from
    // chapter 12's flags; chapter 17's files; chapter 15's output forms.
    let mut args = flags.production.args(archs);
    args.serve.files = Arc::new(flags.quantize.files());
    args.serve.formats = Arc::new(Structured::default());
    // Chapter 19: tools and reasoning in chat requests, and the Responses and Messages APIs.
    args.serve.chats = Arc::new(ToolChats);
    args.serve.endpoints = Arc::new(Apis::default());
    // Chapter 16: each request's own prompt lookup, checked in the continuous batch.
    args.serve.lookaheads = match flags.spec {
        ServeSpec::None => Arc::new(Predicted),
        ServeSpec::Ngram if flags.draft_max == 0 => {
            eprintln!("error: --draft-max 0 guesses nothing: give at least 1, or --spec none");
            std::process::exit(2);
        }
        ServeSpec::Ngram => Arc::new(LookupGuessing::new(flags.draft_max, flags.draft_min)),
    };
    // Checked (a usage error names the flag), the default model filled in, then served.
    run_checked::<Flags>(&mut args, &program);
}
