//! `llm-rs serve`: chapter 12's production server with every chapter's part in place. Its
//! flags are parsed once, with chapter 12's layering (each also from `LLM_RS_<FLAG>` and from
//! the TOML file of `--config`), into the settings of each part in turn:
//!
//! 1. chapter 11's server and chapter 10's engine under it: [`ServeArgs`], with chapter 17's
//!    way of opening a path, chapter 15's output forms (a request's `response_format` and
//!    `grammar`) and, with `--spec ngram`, chapter 16's prompt lookup for every request;
//! 2. chapter 12's production settings around it: [`ch12::Args`], and [`ch12::run_logged`].

use crate::common::ModelFlags;
use crate::settings;
use ch04::Architectures;
use ch11::{Guessing, NoGuessing, ServeArgs};
use ch12::LogFormat;
use ch15::Structured;
use ch16::LookupGuessing;
use ch16::runner::DRAFT_MAX;
use clap::{CommandFactory, Parser, ValueEnum};
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;

/// Where else a server's flags come from, for its `--help`.
const SETTINGS_HELP: &str = "Every flag can also be set by the environment variable shown \
    with it, or by a key of the TOML file given with --config (the flag's name: port = 8080). A \
    flag beats the variable, which beats the file, which beats the default.";

/// Serve GGUF models or Hugging Face directories over HTTP with OpenAI's API: metrics, logs, a
/// graceful shutdown; requests may ask for JSON or a grammar; --spec ngram guesses tokens
/// ahead.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "llm-rs serve",
    about = "Serve GGUF models or Hugging Face directories over HTTP with OpenAI's API: \
             metrics, logs, a graceful shutdown; requests may ask for JSON or a grammar; \
             --spec ngram guesses tokens ahead.",
    long_about = None,
    after_help = SETTINGS_HELP,
    max_term_width = 100
)]
pub struct Flags {
    #[command(flatten)]
    pub model: ModelFlags,

    // Chapter 11: the server (llama-server's names).
    /// Name of the model in /v1/models and in requests (default: the file name without .gguf).
    #[arg(long)]
    pub alias: Option<String>,
    /// Address to listen on.
    #[arg(long, default_value_t = ServeArgs::default().host)]
    pub host: String,
    /// Port to listen on (0: any free port; the one chosen is printed).
    #[arg(long, default_value_t = ServeArgs::default().port)]
    pub port: u16,
    /// Requests that run at once, advancing together in every forward pass.
    #[arg(long, short = 'p', default_value_t = ServeArgs::default().parallel)]
    pub parallel: usize,
    /// Requests that may wait for a place beyond those running; one more is answered 503.
    #[arg(long, default_value_t = ServeArgs::default().queue)]
    pub queue: usize,
    /// Positions in the KV cache that all requests share (default: --ctx). Requests that do
    /// not fit together wait, or are preempted and recomputed.
    #[arg(long)]
    pub kv_size: Option<usize>,
    /// Most tokens in one forward pass, decodes and prompt chunks together: it bounds the
    /// pause every decoding user sees while new prompts are read (chapter 11 explains the
    /// default).
    #[arg(long, default_value_t = ServeArgs::default().batch_tokens)]
    pub batch_tokens: usize,
    /// Longest time a request may run, in seconds; it then ends with finish_reason "length".
    #[arg(long, default_value_t = ServeArgs::default().timeout)]
    pub timeout: u64,
    /// Largest request body, in bytes.
    #[arg(long, default_value_t = ServeArgs::default().body_limit)]
    pub body_limit: usize,

    // Chapter 12: production.
    /// TOML file of settings, keyed by the flags' names.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Log lines as text or as JSON objects; the levels come from RUST_LOG (default "info").
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: Logs,
    /// On SIGTERM or SIGINT, seconds the requests in flight have to finish before they are
    /// ended (each with its final event); the process exits at most 2 s later.
    #[arg(long, default_value_t = ch12::Args::default().drain_timeout)]
    pub drain_timeout: u64,
    /// Seconds a client may take to send a request's headers, and a new connection its first
    /// request, before the connection is closed.
    #[arg(long, default_value_t = ch12::Args::default().header_timeout)]
    pub header_timeout: u64,
    /// Seconds a client may take to send a request's body before it is answered 408.
    #[arg(long, default_value_t = ch12::Args::default().body_timeout)]
    pub body_timeout: u64,
    /// Seconds a connection with no request in flight stays open (HTTP/1 keep-alive and
    /// HTTP/2 alike).
    #[arg(long, default_value_t = ch12::Args::default().idle_timeout)]
    pub idle_timeout: u64,
    /// Connections served at once; past them a few more get the probes (/health, /ready,
    /// /metrics) and a 503 for anything else, and the rest are closed.
    #[arg(long, default_value_t = ch12::Args::default().max_connections)]
    pub max_connections: usize,
    /// A second model to serve (A/B): requests naming it go to it, and a share of those naming
    /// no model (--split-b).
    #[arg(long)]
    pub model_b: Option<PathBuf>,
    /// Name of the second model (default: its file name without .gguf).
    #[arg(long)]
    pub alias_b: Option<String>,
    /// Share of requests naming no model that go to the second model, from 0 to 1.
    #[arg(long, default_value_t = ch12::Args::default().split_b)]
    pub split_b: f64,
    /// Test only: honour the X-Fault header (panic in a step, in a handler, or kill the engine;
    /// stall a grammar's compile; hold a request until the drain begins or ends it).
    #[arg(long, hide = true)]
    pub fault_injection: bool,
    /// An API key a request to /v1/ may carry (Authorization: Bearer KEY); give it again for
    /// more keys, each a tenant named api-key-1, api-key-2, … in order (the variable holds one
    /// key, the --config file a list: api-key = ["K1", "K2"]). Prefer the variable, a file, or
    /// better --api-keys to the command line, which other users can see.
    #[arg(long, value_name = "KEY")]
    pub api_key: Vec<String>,
    /// A file of API keys, one `NAME SHA256-HEX` per line (printf %s KEY | sha256sum); each key
    /// is a tenant with its own prefix cache.
    #[arg(long)]
    pub api_keys: Option<PathBuf>,
    /// Requests one API key may have in flight at once; past it, 429 (0: no limit).
    #[arg(long, default_value_t = 0)]
    pub key_max_in_flight: usize,
    /// Tokens, prompt and completion, one API key may use per minute; past it, 429 (0: no
    /// limit). A request is let in while its key is under the limit and is charged when it
    /// ends, so the requests in flight then may pass it: by less than --key-max-in-flight
    /// requests.
    #[arg(long, default_value_t = 0)]
    pub key_tokens_per_minute: u64,
    /// A series per API key name in /metrics (llmrs_key_requests_total, llmrs_key_tokens_total);
    /// by default every key is counted under key="all", since /metrics is open to anyone who
    /// reaches the port and a key's name often names a customer.
    #[arg(long)]
    pub metrics_per_key: bool,

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

/// `--log-format`: chapter 12's [`LogFormat`], by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Logs {
    /// One line of text per event, for a person at a terminal.
    Text,
    /// One JSON object per line, for a log collector.
    Json,
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
    let argv = std::iter::once(OsString::from("llm-rs serve"))
        .chain(rest)
        .collect();
    let flags: Flags = match settings::parse_from(argv, "config") {
        Ok(flags) => flags,
        Err(settings::ConfigError::Clap(e)) => e.exit(),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    // Chapter 16: each request's own prompt lookup, checked in the continuous batch.
    let guessing: Arc<dyn Guessing> = match flags.spec {
        ServeSpec::None => Arc::new(NoGuessing),
        ServeSpec::Ngram if flags.draft_max == 0 => {
            eprintln!("error: --draft-max 0 guesses nothing: give at least 1, or --spec none");
            std::process::exit(2);
        }
        ServeSpec::Ngram => Arc::new(LookupGuessing {
            draft_max: flags.draft_max,
            draft_min: flags.draft_min,
        }),
    };
    // Chapter 11: the server over chapter 10's engine, with chapter 17's files and chapter
    // 15's output forms.
    let serve = ServeArgs {
        model: flags.model.model.clone(),
        alias: flags.alias,
        host: flags.host,
        port: flags.port,
        parallel: flags.parallel,
        queue: flags.queue,
        ctx: flags.model.ctx,
        kv_size: flags.kv_size,
        batch_tokens: flags.batch_tokens,
        threads: flags.model.threads,
        timeout: flags.timeout,
        body_limit: flags.body_limit,
        no_repack: flags.model.no_repack,
        cache: flags.model.cache(),
        archs,
        files: Arc::new(flags.model.files()),
        formats: Arc::new(Structured::default()),
        guessing,
    };
    // Chapter 12: production around it.
    let mut args = ch12::Args {
        serve,
        log_format: match flags.log_format {
            Logs::Text => LogFormat::Text,
            Logs::Json => LogFormat::Json,
        },
        drain_timeout: flags.drain_timeout,
        header_timeout: flags.header_timeout,
        body_timeout: flags.body_timeout,
        idle_timeout: flags.idle_timeout,
        max_connections: flags.max_connections,
        model_b: flags.model_b,
        alias_b: flags.alias_b,
        split_b: flags.split_b,
        fault_injection: flags.fault_injection,
        api_key: flags.api_key,
        api_keys: flags.api_keys,
        key_max_in_flight: flags.key_max_in_flight,
        key_tokens_per_minute: flags.key_tokens_per_minute,
        metrics_per_key: flags.metrics_per_key,
    };
    if let Err(e) = args.check() {
        Flags::command()
            .error(clap::error::ErrorKind::ValueValidation, e)
            .exit();
    }
    // The default model (fetched on first use) if none is named.
    args.serve.model = match shared::model_or_default(args.serve.model.take()) {
        Ok(path) => Some(path),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    ch12::run_logged(&args);
}
