//! Chapter 12's command line: chapter 11's server flags and this chapter's, each also from
//! `LLM_RS_<FLAG>` and from a TOML file ([`settings`]), turned into chapter 12's [`Args`]; and
//! the `production` example's `main`. The `metrics` example takes the same flags.

// Not every program that includes this file calls each of its functions.
#![allow(dead_code)]

/// Chapter 11's command line (the `server` example's flags), which this one extends.
#[path = "../../../ch11-serving/examples/common/server_flags.rs"]
pub mod server_flags;
/// Flags, then the environment, then a file.
#[path = "settings.rs"]
pub mod settings;

use ch04::Architectures;
use ch11::{Formats, TextOnly};
use ch12::{Args, LogFormat};
use clap::{CommandFactory, Parser, ValueEnum};
use server_flags::Server;
use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::sync::Arc;

/// Where else a server's flags come from, for its `--help`.
pub const SETTINGS_HELP: &str = "Every flag can also be set by the environment variable shown \
    with it, or by a key of the TOML file given with --config (the flag's name: port = 8080). A \
    flag beats the variable, which beats the file, which beats the default.";

/// The production server's flags: chapter 11's, and chapter 12's.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "production",
    about = "Serve GGUF models over HTTP with OpenAI's API: metrics, logs, a graceful shutdown.",
    long_about = None,
    after_help = SETTINGS_HELP,
    max_term_width = 100
)]
pub struct Production {
    #[command(flatten)]
    pub serve: Server,
    /// TOML file of settings, keyed by the flags' names.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Log lines as text or as JSON objects; the levels come from RUST_LOG (default "info").
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: Logs,
    /// On SIGTERM or SIGINT, seconds the requests in flight have to finish before they are
    /// ended (each with its final event); the process exits at most 2 s later.
    #[arg(long, default_value_t = Args::default().drain_timeout)]
    pub drain_timeout: u64,
    /// Seconds a client may take to send a request's headers, and a new connection its first
    /// request, before the connection is closed.
    #[arg(long, default_value_t = Args::default().header_timeout)]
    pub header_timeout: u64,
    /// Seconds a client may take to send a request's body before it is answered 408.
    #[arg(long, default_value_t = Args::default().body_timeout)]
    pub body_timeout: u64,
    /// Seconds a connection with no request in flight stays open (HTTP/1 keep-alive and
    /// HTTP/2 alike).
    #[arg(long, default_value_t = Args::default().idle_timeout)]
    pub idle_timeout: u64,
    /// Connections served at once; past them a few more get the probes (/health, /ready,
    /// /metrics) and a 503 for anything else, and the rest are closed.
    #[arg(long, default_value_t = Args::default().max_connections)]
    pub max_connections: usize,
    /// A second model to serve (A/B): requests naming it go to it, and a share of those naming
    /// no model (--split-b).
    #[arg(long)]
    pub model_b: Option<PathBuf>,
    /// Name of the second model (default: its file name without .gguf).
    #[arg(long)]
    pub alias_b: Option<String>,
    /// Share of requests naming no model that go to the second model, from 0 to 1.
    #[arg(long, default_value_t = Args::default().split_b)]
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
}

/// `--log-format`: chapter 12's [`LogFormat`], by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Logs {
    /// One line of text per event, for a person at a terminal.
    Text,
    /// One JSON object per line, for a log collector.
    Json,
}

impl Production {
    /// The settings these flags give, for the architectures `archs`.
    pub fn args(&self, archs: Architectures) -> Args {
        Args {
            serve: self.serve.args(archs),
            log_format: match self.log_format {
                Logs::Text => LogFormat::Text,
                Logs::Json => LogFormat::Json,
            },
            drain_timeout: self.drain_timeout,
            header_timeout: self.header_timeout,
            body_timeout: self.body_timeout,
            idle_timeout: self.idle_timeout,
            max_connections: self.max_connections,
            model_b: self.model_b.clone(),
            alias_b: self.alias_b.clone(),
            split_b: self.split_b,
            fault_injection: self.fault_injection,
            api_key: self.api_key.clone(),
            api_keys: self.api_keys.clone(),
            key_max_in_flight: self.key_max_in_flight,
            key_tokens_per_minute: self.key_tokens_per_minute,
            metrics_per_key: self.metrics_per_key,
        }
    }
}

/// The server's `main`: configuration from flags, environment and file, then
/// [`ch12::run_logged`] with the architectures `archs`; exit 2 on a bad configuration, 1 on a
/// failure. A later chapter's program calls it with its own set.
pub fn main(archs: Architectures) {
    main_from(std::env::args_os().collect(), archs)
}

/// [`main`] on the command line `argv` (its first item the program's name).
pub fn main_from(argv: Vec<OsString>, archs: Architectures) {
    main_with(argv, archs, Arc::new(TextOnly))
}

/// [`main_from`], the requests' output forms those of `formats` (a later chapter's).
pub fn main_with(argv: Vec<OsString>, archs: Architectures, formats: Arc<dyn Formats>) {
    let program = argv.first().cloned().unwrap_or_default();
    let flags: Production = parse_or_exit(argv);
    let mut args = flags.args(archs);
    args.serve.formats = formats;
    run_checked::<Production>(&mut args, &program);
}

/// The flags `P` (a server's: these, or a later chapter's around them) from `argv`, the
/// environment and the configuration file; exit 2 with a message when they are bad.
pub fn parse_or_exit<P: Parser>(argv: Vec<OsString>) -> P {
    match settings::parse_from::<P>(argv, "config") {
        Ok(flags) => flags,
        Err(settings::ConfigError::Clap(e)) => e.exit(),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    }
}

/// Check `args` (exit 2 naming the flag of `P` that is wrong, with the usage of `program`,
/// the command line's first item), then run the server.
pub fn run_checked<P: CommandFactory>(args: &mut Args, program: &OsStr) {
    if let Err(e) = args.check() {
        P::command()
            .bin_name(program.to_string_lossy())
            .error(clap::error::ErrorKind::ValueValidation, e)
            .exit();
    }
    server_flags::default_model(&mut args.serve.model);
    ch12::run_logged(args);
}
