//! What `/metrics` says after one request: the production server on 127.0.0.1 at a port the
//! system picks, one greedy chat request, then — once the engine thread is idle — an excerpt
//! of `GET /metrics`.
//!
//! ```text
//! cargo run --release -p ch12 --example metrics -- [the production example's flags]
//! ```
//!
//! The excerpt keeps the series whose values depend only on the request — requests, tokens,
//! the number of time-to-first-token and inter-token samples, the size of every step's batch,
//! the KV blocks — with each family's `# TYPE` line. The histograms of times are left out
//! (their buckets and sums are this machine's), and so are the `# HELP` lines, which are longer
//! than a page; `curl http://127.0.0.1:8080/metrics` on the `production` example shows all.

/// The `production` example's flags.
#[path = "common/production_flags.rs"]
mod production_flags;

use ch12::app::App;
use ch12::serve;
use std::error::Error;
use std::sync::Arc;

/// The request: greedy (`temperature` 0), so its tokens, and the counts below, are the same on
/// every run.
const CHAT: &str = r#"{
  "messages": [{"role": "user", "content": "Name the capital of France."}],
  "max_tokens": 16,
  "temperature": 0
}"#;

/// The series shown: a line is kept when its metric's name is one of these (a histogram's
/// `_bucket`, `_sum` and `_count` lines are named after it).
const SHOWN: [&str; 9] = [
    "llmrs_requests_total",
    "llmrs_prompt_tokens_total",
    "llmrs_prompt_tokens_cached_total",
    "llmrs_generated_tokens_total",
    "llmrs_time_to_first_token_seconds_count",
    "llmrs_inter_token_latency_seconds_count",
    "llmrs_batch_tokens",
    "llmrs_kv_blocks",
    "llmrs_queue_depth",
];

/// How long the engine may take to record the last step after the answer arrived: one step of
/// the default model takes milliseconds, so this only bounds a wait that went wrong.
const IDLE_WITHIN: std::time::Duration = std::time::Duration::from_secs(30);

fn main() -> Result<(), Box<dyn Error>> {
    let production = production_flags::settings::parse_from::<production_flags::Production>(
        std::env::args_os().collect(),
        "config",
    )?;
    let mut args = production.args(ch04::architectures());
    (args.serve.host, args.serve.port) = ("127.0.0.1".into(), 0);
    args.check()?;
    production_flags::server_flags::default_model(&mut args.serve.model);
    let app: Arc<App> = Arc::new(args.app()?);
    for v in &app.variants {
        let loaded = ch11::load_observed(&v.args, app.observer(v.name))?;
        if v.state.loaded.set(loaded).is_err() {
            unreachable!("loaded once");
        }
    }
    // The server on its own runtime's threads; the client, blocking, on this one.
    let runtime = ch11::runtime()?;
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let base = format!("http://{}", listener.local_addr()?);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = runtime.spawn(serve::serve(listener, Arc::clone(&app), async {
        let _ = stopped.await;
    }));

    let client = reqwest::blocking::Client::new();
    let answer: serde_json::Value = client
        .post(format!("{base}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(CHAT)
        .send()?
        .error_for_status()?
        .json()?;
    println!(
        "POST /v1/chat/completions: {} ({} prompt tokens, {} generated)\n",
        answer["choices"][0]["message"]["content"],
        answer["usage"]["prompt_tokens"],
        answer["usage"]["completion_tokens"],
    );
    // The answer can reach the client before the engine thread has recorded the step that
    // ended the request (the step's metrics, the KV blocks): wait until it has nothing left.
    let idle = |v: &ch12::app::Variant| {
        v.state
            .loaded
            .get()
            .is_some_and(|l| l.worker.status().running + l.worker.status().waiting == 0)
    };
    let deadline = std::time::Instant::now() + IDLE_WITHIN;
    while !app.variants.iter().all(idle) {
        if std::time::Instant::now() > deadline {
            return Err(format!("the engine did not go idle within {IDLE_WITHIN:?}").into());
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let metrics = client
        .get(format!("{base}/metrics"))
        .send()?
        .error_for_status()?
        .text()?;
    println!("GET /metrics (excerpt)");
    for line in metrics.lines() {
        let name = match line.strip_prefix("# TYPE ") {
            Some(t) => t.split(' ').next(),
            None if line.starts_with('#') => None,
            None => line.split(['{', ' ']).next(),
        };
        let shown = name.is_some_and(|n| {
            SHOWN.iter().any(|s| {
                n == *s
                    || (s.ends_with("_count") && n == s.trim_end_matches("_count"))
                    || n.strip_prefix(s)
                        .is_some_and(|r| ["_bucket", "_sum", "_count"].contains(&r))
            })
        });
        if shown {
            println!("{line}");
        }
    }

    drop(client);
    let _ = stop.send(());
    runtime.block_on(server)??;
    Ok(())
}
