//! Chapter 12: production — chapter 11's server, ready to run for real and to be watched.
//!
//! Nothing here changes what the engine computes. This chapter adds what an operator needs to
//! run the server unattended, each on a seam chapter 11 exposes:
//! - [`metrics`]: `GET /metrics` in Prometheus's format, from an [`Observer`] of the engine
//!   thread and a layer in front of the routes;
//! - [`app`]: request ids, a `tracing` span per request and JSON logs (`--log-format json`),
//!   `/health` and `/ready`, A/B serving of two models, a time limit on request bodies, and the
//!   test-only fault injection;
//! - [`keys`]: API keys (hashed at rest), each a tenant with its own partition of the prefix
//!   cache, and per-key limits;
//! - [`serve`]: an accept loop with deadlines on every connection and a cap on how many are
//!   open (past it, the probes still answer), and a shutdown that drains (SIGTERM: stop
//!   accepting, finish what is in flight within `--drain-timeout`, end the rest with their
//!   final events, exit 0);
//!
//! Faults: a panic inside a step fails the requests of that step with a 500 and the engine
//! goes on with a fresh scheduler (chapter 11's worker catches it); a panic in a handler is a
//! 500 for that request. If an engine thread dies anyway, `/health` turns 500 and the process
//! exits with [`EXIT_ENGINE_DIED`], for the orchestrator to restart it: a process that cannot
//! serve is better replaced than kept.
//!
//! The `production` example is the server: `cargo run --release -p ch12 --example production
//! -- [--config FILE] [--port 8080] [--parallel N] …`; `--help` lists every flag with its
//! environment variable. Its flags, which also come from `LLM_RS_<FLAG>` and from a TOML file,
//! are the example's (`examples/common/`): the library takes its settings as a plain value. The
//! `metrics` example shows what `/metrics` says after one request.
//!
//! [`Observer`]: ch11::worker::Observer

pub mod app;
pub mod keys;
pub mod metrics;
pub mod serve;

use app::App;
use ch11::ServeArgs;
use std::error::Error;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The exit status when an engine thread has died: not 0, so that an orchestrator restarts
/// the server; 70 is `EX_SOFTWARE` of sysexits.h, "an internal software error".
pub const EXIT_ENGINE_DIED: i32 = 70;

/// The default `--max-connections`: a connection costs a file descriptor and a few KiB, and
/// 512 stays well under the usual limit of 1024 descriptors a process may open, leaving room
/// for the model file, logs and the probe connections.
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;

/// After the drain, how long the blocking threads have to give up what they were preparing
/// (a grammar being compiled looks at its request's cancel flag every few thousand steps:
/// milliseconds); with [`serve::FLUSH_GRACE`], within the 2 s promised beyond the drain.
const SHUTDOWN_GRACE: Duration = Duration::from_millis(500);

/// How often the watchdog looks at the engine threads.
const WATCHDOG_PERIOD: Duration = Duration::from_millis(250);

/// How logs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// One line of text per event, for a person at a terminal.
    Text,
    /// One JSON object per line, for a log collector.
    Json,
}

// ANCHOR: args
/// What the production server is asked to do: chapter 11's settings, and this chapter's. (The
/// `production` example's flags give them, from the command line, the environment or a file.)
#[derive(Debug, Clone)]
pub struct Args {
    pub serve: ServeArgs,
    /// Log lines as text or as JSON objects; the levels come from `RUST_LOG` (default "info").
    pub log_format: LogFormat,
    /// On SIGTERM or SIGINT, seconds the requests in flight have to finish before they are
    /// ended (each with its final event); the process exits at most 2 s later.
    pub drain_timeout: u64,
    /// Seconds a client may take to send a request's headers, and a new connection its first
    /// request, before the connection is closed.
    pub header_timeout: u64,
    /// Seconds a client may take to send a request's body before it is answered 408.
    pub body_timeout: u64,
    /// Seconds a connection with no request in flight stays open.
    pub idle_timeout: u64,
    /// Connections served at once; past them, only the probes are answered.
    pub max_connections: usize,
    /// A second model to serve (A/B): requests naming it go to it, and a share of those naming
    /// no model (`split_b`).
    pub model_b: Option<PathBuf>,
    /// Name of the second model (`None`: its file name without .gguf).
    pub alias_b: Option<String>,
    /// Share of requests naming no model that go to the second model, from 0 to 1.
    pub split_b: f64,
    /// Test only: honour the X-Fault header (panic in a step, in a handler, kill the engine,
    /// or hold a request until the drain begins or ends it) and [`app::STALL_GRAMMAR`].
    pub fault_injection: bool,
    /// API keys, one per `--api-key`: a request to `/v1/` must carry one of them or of
    /// `api_keys` (`Authorization: Bearer KEY`). Each is a tenant, named `api-key-1`,
    /// `api-key-2`, … in order ([`keys`]).
    pub api_key: Vec<String>,
    /// A file of API keys, `NAME SHA256-HEX` per line ([`keys`]).
    pub api_keys: Option<PathBuf>,
    /// Requests one key may have in flight at once (0: no limit).
    pub key_max_in_flight: usize,
    /// Tokens, prompt and completion, one key may use per minute (0: no limit); how far the
    /// requests in flight may pass it is [`keys::Keys::admit`]'s rule.
    pub key_tokens_per_minute: u64,
    /// A series per API key name in `/metrics` (`llmrs_key_*{key="NAME"}`); without it, every
    /// key's requests and tokens are added under `key="all"`, since `/metrics` is open and a
    /// name often names a customer.
    pub metrics_per_key: bool,
}
// ANCHOR_END: args

// ANCHOR: args_default
impl Default for Args {
    /// Chapter 11's defaults; text logs; 30 s to drain, 10 s for headers, 30 s for a body; one
    /// model; no keys, and no key names in `/metrics`.
    fn default() -> Args {
        Args {
            serve: ServeArgs::default(),
            log_format: LogFormat::Text,
            drain_timeout: 30,
            header_timeout: 10,
            body_timeout: 30,
            idle_timeout: 60,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            model_b: None,
            alias_b: None,
            split_b: 0.5,
            fault_injection: false,
            api_key: Vec::new(),
            api_keys: None,
            key_max_in_flight: 0,
            key_tokens_per_minute: 0,
            metrics_per_key: false,
        }
    }
}
// ANCHOR_END: args_default

impl Args {
    /// Refuse settings that cannot work, before anything loads.
    pub fn check(&self) -> Result<(), String> {
        self.serve.check()?;
        if !(0.0..=1.0).contains(&self.split_b) {
            return Err(format!(
                "--split-b {} must be between 0 and 1",
                self.split_b
            ));
        }
        for (flag, v) in [
            ("--header-timeout", self.header_timeout),
            ("--body-timeout", self.body_timeout),
            ("--idle-timeout", self.idle_timeout),
            ("--max-connections", self.max_connections as u64),
        ] {
            if v == 0 {
                return Err(format!("{flag} must be at least 1"));
            }
        }
        // A duration that overflows the clock is no limit; a day is past any use.
        const DAY: u64 = 86_400;
        for (flag, v) in [
            ("--drain-timeout", self.drain_timeout),
            ("--header-timeout", self.header_timeout),
            ("--body-timeout", self.body_timeout),
            ("--idle-timeout", self.idle_timeout),
            ("--timeout", self.serve.timeout),
        ] {
            if v > DAY {
                return Err(format!("{flag} {v} is more than a day ({DAY} s)"));
            }
        }
        if self.model_b.is_none() && self.alias_b.is_some() {
            return Err("--alias-b names a second model, but there is no --model-b".into());
        }
        Ok(())
    }

    /// The variants to serve: `a` from the flags, and `b` if `--model-b` is given.
    pub fn variants(&self) -> Vec<(&'static str, ServeArgs)> {
        let mut v = vec![("a", self.serve.clone())];
        if let Some(m) = &self.model_b {
            let mut b = self.serve.clone();
            b.model = Some(m.clone());
            b.alias = self.alias_b.clone();
            v.push(("b", b));
        }
        v
    }

    /// The application, not loaded yet: an error if the keys cannot be read.
    pub fn app(&self) -> Result<App, String> {
        let keys = keys::Keys::new(
            &self.api_key,
            self.api_keys.as_deref(),
            self.key_max_in_flight,
            self.key_tokens_per_minute,
            self.metrics_per_key,
        )?;
        Ok(App::new(
            self.variants(),
            self.split_b,
            self.fault_injection,
            [
                Duration::from_secs(self.body_timeout),
                Duration::from_secs(self.header_timeout),
                Duration::from_secs(self.idle_timeout),
                Duration::from_secs(self.drain_timeout),
            ],
            self.max_connections,
            keys,
        ))
    }
}

/// Logs to standard error as `format` says, at the levels of `RUST_LOG` (default `info`), and
/// panics as log lines too. Standard error is written unbuffered: nothing is left to flush at
/// exit.
pub fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().with_current_span(true).try_init(),
    };
    std::panic::set_hook(Box::new(|info| {
        let thread = std::thread::current();
        let location = info.location().map(|l| l.to_string()).unwrap_or_default();
        let payload = info.payload();
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        tracing::error!(
            thread = thread.name().unwrap_or("unnamed"),
            location,
            "panic: {message}"
        );
    }));
}

/// Load every variant, one after the other, on this thread; exit 1 if one fails.
fn load_all(app: &App) {
    for v in &app.variants {
        let started = Instant::now();
        match ch11::load_observed(&v.args, app.observer(v.name)) {
            Ok(l) => {
                let took = started.elapsed();
                app.metrics.model_loaded(v.name, took);
                tracing::info!(
                    variant = v.name,
                    model = l.model_id,
                    parallel = l.parallel,
                    n_ctx = l.n_ctx,
                    body_limit = l.body_limit,
                    max_text_bytes = ?l.max_text_bytes,
                    load_s = took.as_secs_f64(),
                    "loaded: {}",
                    l.description
                );
                let taken = app
                    .variants
                    .iter()
                    .filter_map(|o| o.state.loaded.get())
                    .any(|o| o.model_id == l.model_id);
                if taken {
                    tracing::error!(
                        "both variants are named {:?}: give --alias-b another name",
                        l.model_id
                    );
                    std::process::exit(1);
                }
                let _ = v.state.loaded.set(l);
            }
            Err(e) => {
                tracing::error!(variant = v.name, "cannot load the model: {e}");
                std::process::exit(1);
            }
        }
    }
    tracing::info!("ready");
}

// ANCHOR: run
/// The server: listen first (so that `/health` answers while the models load), load on
/// another thread, watch the engine threads, serve until SIGTERM or SIGINT, drain, return.
pub fn run(args: &Args) -> Result<(), Box<dyn Error>> {
    args.check()?;
    let app = Arc::new(args.app()?);
    let runtime = ch11::runtime()?;
    let served = runtime.block_on(async {
        let (host, port) = (&args.serve.host, args.serve.port);
        let listener = tokio::net::TcpListener::bind((host.as_str(), port))
            .await
            .map_err(|e| format!("--host {host} --port {port}: cannot listen: {e}"))?;
        tracing::info!("listening on http://{}", listener.local_addr()?);
        let loading = Arc::clone(&app);
        std::thread::Builder::new()
            .name("load".into())
            .spawn(move || load_all(&loading))?;
        let watched = Arc::clone(&app);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(WATCHDOG_PERIOD).await;
                if let Some(v) = watched.dead_engine() {
                    tracing::error!(
                        variant = v,
                        "the engine thread has died; exiting for the orchestrator to restart \
                         the server"
                    );
                    std::process::exit(EXIT_ENGINE_DIED);
                }
            }
        });
        serve::serve(listener, app, serve::signal()).await?;
        Ok::<_, Box<dyn Error>>(())
    });
    // Dropping the runtime drops every task left — a request still being prepared gives its
    // work up ([`ch11::Cancel`]) — and would then wait for the blocking threads however
    // long they take; this waits at most `SHUTDOWN_GRACE`.
    runtime.shutdown_timeout(SHUTDOWN_GRACE);
    tracing::info!("stopped");
    served
}
// ANCHOR_END: run

/// What the server's `main` does once its settings are known: logs as `args` say, [`run`],
/// and on a failure the error logged and exit status 1.
pub fn run_logged(args: &Args) {
    init_logs(args.log_format);
    if let Err(e) = run(args) {
        tracing::error!("{e}");
        std::process::exit(1);
    }
}
