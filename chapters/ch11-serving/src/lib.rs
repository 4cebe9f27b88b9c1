//! Chapter 11: serving — the engine as a service that many clients use at once.
//!
//! Chapter 7's scheduler already runs many requests in the same forward passes; chapter 10
//! made it the engine. This chapter puts an HTTP server in front of it that speaks
//! the OpenAI API, as llama-server, vLLM and TGI do, so that any OpenAI client can use it:
//! - [`api`]: the requests and responses as JSON, OpenAI's error shape, and the checks that
//!   turn a request's fields into chapter 4's [`GenParams`] (each bad value a 400 naming it);
//! - [`worker`]: the engine's own thread, which owns the scheduler and runs a step whenever
//!   there is work, fed through a channel, so that the async runtime never waits on the model;
//! - [`server`]: the axum routes, the bounded queue (a 503 with `Retry-After` beyond it),
//!   streaming with Server-Sent Events, and cancellation: a client that disconnects drops its
//!   stream, which cancels its request and frees its KV blocks before the next step.
//!
//! Chat messages go through chapter 2's special-token rule: the template's markers are control
//! tokens, what users wrote is text. The `server` example is the server:
//! `cargo run --release -p ch11 --example server -- [--model PATH] [--port 8080] [--parallel N]`.
//! The `exchange` example serves on loopback, sends one chat request (`--stream`: streamed) and
//! prints both sides of the exchange.

pub mod api;
pub mod server;
pub mod worker;

pub use api::{Cancel, Chats, Formats, Lookaheads, PlainChats, Predicted, TextOnly};
use ch04::cli;
use ch07::SchedulerConfig;
use ch08::{FastLoader, PoolKind, new_pool};
use ch10::engine::BLOCK_SIZE;
use ch10::{Engine, LoadMode, MapOptions};
pub use server::{AppState, CachePartition, Limits, Loaded};
use std::error::Error;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
pub use worker::{PoolStatus, Worker};

/// The server's default `--batch-tokens` (see there).
pub const SERVE_BATCH_TOKENS: usize = 64;

// ANCHOR: args
/// What the server is asked to do (the `server` example's flags, llama-server's names).
#[derive(Debug, Clone)]
pub struct ServeArgs {
    /// GGUF model file (`None`: the default model, fetched on first use).
    pub model: Option<PathBuf>,
    /// Name of the model in /v1/models and in requests (`None`: the file name without .gguf).
    pub alias: Option<String>,
    /// Address and port to listen on (port 0: any free port; the one chosen is printed).
    pub host: String,
    pub port: u16,
    /// Requests that run at once, advancing together in every forward pass.
    pub parallel: usize,
    /// Requests that may wait for a place beyond those running; one more is answered 503.
    pub queue: usize,
    /// Positions one request may use, prompt and completion together (`None`: the model's,
    /// at most 4096).
    pub ctx: Option<usize>,
    /// Positions in the KV cache that all requests share (`None`: `ctx`). Requests that do
    /// not fit together wait, or are preempted and recomputed.
    pub kv_size: Option<usize>,
    /// Most tokens in one forward pass, decodes and prompt chunks together. It bounds a
    /// step's length, so the pause every decoding user sees while new prompts are read: 64
    /// kept the 99th percentile of the gap between tokens under 100 ms with 16 users on two
    /// cores, where 256 (chapter 10's, best for one user's long prompt) let it reach 200 ms.
    pub batch_tokens: usize,
    /// Threads for the forward pass.
    pub threads: usize,
    /// Longest time a request may run, in seconds; it then ends with finish_reason "length".
    pub timeout: u64,
    /// Largest request body, in bytes.
    pub body_limit: usize,
    /// Keep every weight a view of the mapped file (no repacking for chapter 8's micro-kernel).
    pub no_repack: bool,
    /// What the shared KV cache keeps keys and values in (`--cache-type-k`, `--cache-type-v`).
    pub cache: ch05::CacheTypes,
    /// The architectures the server loads: chapter 4's, unless a later chapter hands in a
    /// bigger set.
    pub archs: ch04::Architectures,
    /// How the model path becomes a GGUF image: chapter 10's GGUF files, unless a later
    /// chapter hands in more formats.
    pub files: Arc<dyn ch10::ModelFiles>,
    /// The output forms requests may ask for: plain text ([`TextOnly`]), unless a later
    /// chapter hands in more.
    pub formats: Arc<dyn Formats>,
    /// What requests feed ahead: the output a client predicted ([`Predicted`]), unless a
    /// later chapter hands in more.
    pub lookaheads: Arc<dyn Lookaheads>,
    /// What a chat's conversation and answer become: chapter 2's messages and all content
    /// ([`PlainChats`]), unless a later chapter hands in more (tool calls, reasoning).
    pub chats: Arc<dyn Chats>,
    /// The endpoints that generate: OpenAI's two ([`server::OpenAi`]), unless a later chapter
    /// hands in more (another API's).
    pub endpoints: Arc<dyn server::Endpoints>,
}
// ANCHOR_END: args

// ANCHOR: args_default
impl Default for ServeArgs {
    /// llama-server's defaults where it has them (host, port, `--parallel` 4), the machine's
    /// physical cores, 64 queued, 64 tokens a step, 10 minutes a request, 8 MiB a body.
    fn default() -> ServeArgs {
        ServeArgs {
            model: None,
            alias: None,
            host: "127.0.0.1".into(),
            port: 8080,
            parallel: 4,
            queue: 64,
            ctx: None,
            kv_size: None,
            batch_tokens: SERVE_BATCH_TOKENS,
            threads: ch04::cli::default_threads(),
            timeout: 600,
            body_limit: 8 << 20,
            no_repack: false,
            cache: ch05::CacheTypes::F32,
            archs: ch04::architectures(),
            files: Arc::new(ch10::GgufFiles),
            formats: Arc::new(TextOnly),
            lookaheads: Arc::new(Predicted),
            chats: Arc::new(PlainChats),
            endpoints: Arc::new(server::OpenAi),
        }
    }
}
// ANCHOR_END: args_default

impl ServeArgs {
    /// Refuse flags that cannot work, before anything loads.
    pub fn check(&self) -> Result<(), String> {
        // Chapter 4's bound: 0 threads, or so many that starting them would fail, is refused.
        cli::check_threads(self.threads)?;
        let positive = [
            ("--parallel", self.parallel),
            ("--batch-tokens", self.batch_tokens),
            ("--body-limit", self.body_limit),
            ("--timeout", self.timeout as usize),
        ];
        for (flag, v) in positive {
            if v == 0 {
                return Err(format!("{flag} must be at least 1"));
            }
        }
        if let (Some(ctx), Some(kv)) = (self.ctx, self.kv_size)
            && kv < ctx
        {
            return Err(format!(
                "--kv-size {kv} is smaller than --ctx {ctx}: one request could not fit the cache"
            ));
        }
        Ok(())
    }

    pub fn limits(&self) -> Limits {
        Limits {
            max_in_flight: self.parallel.saturating_add(self.queue),
            timeout: Duration::from_secs(self.timeout),
            body_limit: self.body_limit,
            retry_after: 1,
            preparing: std::thread::available_parallelism().map_or(2, |n| n.get().max(2)),
        }
    }
}

// ANCHOR: load
/// Load the model as `args` say and start the engine thread.
pub fn load(args: &ServeArgs) -> Result<Loaded, Box<dyn Error>> {
    load_observed(args, Arc::new(()))
}

/// [`load`], with `observer` told what the engine thread does.
pub fn load_observed(
    args: &ServeArgs,
    observer: Arc<dyn worker::Observer>,
) -> Result<Loaded, Box<dyn Error>> {
    // A program fills in its default model, if it has one: the library fetches nothing.
    let path = args
        .model
        .clone()
        .ok_or("no model file: give --model PATH")?;
    let mut fast = FastLoader::new(new_pool(PoolKind::Spin, args.threads));
    fast.pack = !args.no_repack;
    let mut engine = Engine::open(
        &*args.files,
        &path,
        LoadMode::Map(MapOptions::default()),
        fast,
        &args.archs,
        Box::new(|_, _| {}),
    )?;
    cli::set_context(&mut engine.model, args.ctx)?;
    let n_ctx = engine.model.n_ctx();
    let kv_size = args.kv_size.unwrap_or(n_ctx);
    if kv_size < n_ctx {
        return Err(format!(
            "--kv-size {kv_size} is smaller than the context of {n_ctx} positions: one request \
             could not fit the cache (give a smaller --ctx or a larger --kv-size)"
        )
        .into());
    }
    args.formats.prepare(&engine.tokenizer);
    let description = engine.describe(&path);
    let max_text_bytes = server::max_text_bytes(&engine.tokenizer, n_ctx);
    let body_limit = max_text_bytes.map_or(args.body_limit, |b| {
        server::body_limit_for(b, n_ctx).min(args.body_limit)
    });
    // ANCHOR_END: load
    // ANCHOR: load_worker
    let config = SchedulerConfig {
        max_batch_tokens: args.batch_tokens.max(args.parallel),
        max_running: args.parallel,
        block_size: BLOCK_SIZE,
        n_blocks: kv_size.div_ceil(BLOCK_SIZE),
        prefix_cache: true,
        cache: args.cache,
    };
    let model_id = args.alias.clone().unwrap_or_else(|| {
        let name = path
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        name.strip_suffix(".gguf").unwrap_or(&name).to_string()
    });
    let engine = Arc::new(engine);
    let worker = Worker::spawn(Arc::clone(&engine), config, observer)
        .map_err(|e| format!("--parallel {} --kv-size {kv_size}: {e}", args.parallel))?;
    Ok(Loaded {
        model_id,
        engine,
        worker,
        n_ctx,
        parallel: args.parallel,
        description,
        max_text_bytes,
        body_limit,
        formats: Arc::clone(&args.formats),
        lookaheads: Arc::clone(&args.lookaheads),
        chats: Arc::clone(&args.chats),
    })
}
// ANCHOR_END: load_worker

/// The async runtime of a server: two threads are plenty for HTTP, since the model runs on
/// its own thread and tokenizing on tokio's blocking pool.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
}

/// The server: listen first (so `/health` answers "loading" while the model loads), load on
/// another thread, serve until Ctrl-C.
pub fn run(args: &ServeArgs) -> Result<(), Box<dyn Error>> {
    args.check()?;
    runtime()?.block_on(async {
        let addr = format!("{}:{}", args.host, args.port);
        let listener = tokio::net::TcpListener::bind(&addr).await.map_err(|e| {
            format!(
                "--host {} --port {}: cannot listen: {e}",
                args.host, args.port
            )
        })?;
        eprintln!("listening on http://{}", listener.local_addr()?);
        let state = AppState::new(args.limits());
        let loading = Arc::clone(&state);
        let load_args = args.clone();
        std::thread::spawn(move || match load(&load_args) {
            Ok(l) => {
                eprintln!("{}", l.description);
                eprintln!(
                    "ready: {} ({} at once, {} positions each)",
                    l.model_id, l.parallel, l.n_ctx
                );
                let _ = loading.loaded.set(l);
            }
            Err(e) => {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
        });
        let ctrl_c = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        server::serve(listener, state, Arc::clone(&args.endpoints), ctrl_c).await?;
        Ok(())
    })
}
