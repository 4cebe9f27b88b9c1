//! Chapter 11's command line: the `server` example's flags (llama-server's names), turned into
//! chapter 11's [`ServeArgs`], and its `main`. The `exchange` example takes the same flags, and
//! a bigger server may add its own to them: they include this file
//! (`#[path = …] mod server_flags;`), so the flags are declared once.

// Not every program that includes this file calls each of its functions.
#![allow(dead_code)]

use ch04::Architectures;
use ch05::{CacheTypes, RowType};
use ch06::cache::cache_row_type;
use ch10::GgufFiles;
use ch11::server::OpenAi;
use ch11::{PlainChats, Predicted, ServeArgs, TextOnly};
use clap::{CommandFactory, Parser};
use std::path::PathBuf;

/// Serve a GGUF model over HTTP with OpenAI's API.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "server",
    about = "Serve a GGUF model over HTTP with OpenAI's API."
)]
pub struct Server {
    /// GGUF model file (default: the default model, fetched on first use).
    #[arg(long, short = 'm')]
    pub model: Option<PathBuf>,
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
    /// Positions one request may use, prompt and completion together (default: the model's,
    /// at most 4096).
    #[arg(long, short = 'c')]
    pub ctx: Option<usize>,
    /// Positions in the KV cache that all requests share (default: --ctx). Requests that do
    /// not fit together wait, or are preempted and recomputed.
    #[arg(long)]
    pub kv_size: Option<usize>,
    /// Most tokens in one forward pass, decodes and prompt chunks together: it bounds the
    /// pause every decoding user sees while new prompts are read (chapter 11 explains the
    /// default).
    #[arg(long, default_value_t = ServeArgs::default().batch_tokens)]
    pub batch_tokens: usize,
    /// Threads for the forward pass; by default the machine's physical cores, as llama.cpp
    /// chooses.
    #[arg(long, short = 't', default_value_t = ch04::cli::default_threads())]
    pub threads: usize,
    /// Longest time a request may run, in seconds; it then ends with finish_reason "length".
    #[arg(long, default_value_t = ServeArgs::default().timeout)]
    pub timeout: u64,
    /// Largest request body, in bytes.
    #[arg(long, default_value_t = ServeArgs::default().body_limit)]
    pub body_limit: usize,
    /// Keep every weight a view of the mapped file (no repacking for chapter 8's micro-kernel).
    #[arg(long)]
    pub no_repack: bool,
    /// Type of the keys in the shared KV cache: f32, f16 (half the memory, llama.cpp's
    /// default) or q8_0 (a little over a quarter).
    #[arg(long, default_value = "f16", value_parser = cache_row_type)]
    pub cache_type_k: RowType,
    /// Type of the values in the shared KV cache: f32, f16 or q8_0.
    #[arg(long, default_value = "f16", value_parser = cache_row_type)]
    pub cache_type_v: RowType,
}

impl Server {
    /// The settings these flags give, for the architectures `archs`.
    pub fn args(&self, archs: Architectures) -> ServeArgs {
        ServeArgs {
            model: self.model.clone(),
            alias: self.alias.clone(),
            host: self.host.clone(),
            port: self.port,
            parallel: self.parallel,
            queue: self.queue,
            ctx: self.ctx,
            kv_size: self.kv_size,
            batch_tokens: self.batch_tokens,
            threads: self.threads,
            timeout: self.timeout,
            body_limit: self.body_limit,
            no_repack: self.no_repack,
            cache: CacheTypes {
                k: self.cache_type_k,
                v: self.cache_type_v,
            },
            archs,
            files: std::sync::Arc::new(GgufFiles),
            formats: std::sync::Arc::new(TextOnly),
            lookaheads: std::sync::Arc::new(Predicted),
            chats: std::sync::Arc::new(PlainChats),
            endpoints: std::sync::Arc::new(OpenAi),
        }
    }
}

/// The server's `main`: parse and check the flags, serve the architectures `archs` until
/// Ctrl-C, and exit with an error message on failure.
pub fn main(archs: Architectures) {
    let mut args = Server::parse().args(archs);
    if let Err(e) = args.check() {
        Server::command()
            .error(clap::error::ErrorKind::ValueValidation, e)
            .exit();
    }
    default_model(&mut args.model);
    if let Err(e) = ch11::run(&args) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// The default model (fetched on first use) where `model` is `None`; exit 1 if it cannot be
/// had.
pub fn default_model(model: &mut Option<PathBuf>) {
    match shared::model_or_default(model.take()) {
        Ok(path) => *model = Some(path),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
