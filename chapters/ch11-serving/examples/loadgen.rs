//! A load generator for OpenAI-compatible servers: `clients` concurrent clients, each sending
//! streaming completions one after another, timed as their users would feel them.
//!
//! ```text
//! cargo run --release -p ch11 --example loadgen -- --url http://127.0.0.1:8080 \
//!     --clients 16 --requests 32 --prompt-tokens 128 --max-tokens 128
//! ```
//!
//! Every request asks for `max_tokens` greedy tokens after a prompt of about `prompt-tokens`
//! tokens that starts differently for every request (so no server can answer from a prefix
//! cache what another request computed). Prints one JSON line: requests, errors (503s
//! separately), generated tokens, wall time, throughput, and the 50th and 99th percentiles of
//! the time to first token and of the gap between tokens (inter-token latency).

use clap::Parser;
use futures_util::StreamExt;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
struct Args {
    /// The server's base URL.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    url: String,
    /// Concurrent clients.
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// Requests in all, shared out among the clients.
    #[arg(long, default_value_t = 16)]
    requests: usize,
    /// Prompt length, in tokens (about: words of a fixed text).
    #[arg(long, default_value_t = 128)]
    prompt_tokens: usize,
    /// Tokens to generate per request.
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// Run for this many seconds instead of `requests` requests.
    #[arg(long)]
    duration: Option<f64>,
    /// The `model` of every request (a server with several models routes by it).
    #[arg(long)]
    model: Option<String>,
}

/// Words for prompts: common English words, one token each for most tokenizers.
const WORDS: &str = "the quick brown fox jumps over a lazy dog while the old man reads his \
    book by the window and the children play in the green garden near the river where boats \
    sail slowly past the tall trees under a bright blue sky full of white clouds";

#[derive(Default)]
struct Tally {
    requests: usize,
    errors: usize,
    busy: usize,
    tokens: usize,
    ttft: Vec<f64>,
    itl: Vec<f64>,
}

fn prompt(i: usize, n: usize) -> String {
    let words: Vec<&str> = WORDS.split(' ').filter(|w| !w.is_empty()).collect();
    let mut p = format!("Story {i}:");
    for k in 0..n.saturating_sub(4) {
        p.push(' ');
        p.push_str(words[(k * 7 + i) % words.len()]);
    }
    p
}

async fn one(client: &reqwest::Client, args: &Args, i: usize, t: &mut Tally) {
    let mut body = json!({
        "prompt": prompt(i, args.prompt_tokens),
        "max_tokens": args.max_tokens,
        "temperature": 0,
        "stream": true,
    });
    if let Some(m) = &args.model {
        body["model"] = json!(m);
    }
    let t0 = Instant::now();
    t.requests += 1;
    let r = match client
        .post(format!("{}/v1/completions", args.url))
        .json(&body)
        .send()
        .await
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("loadgen: request {i}: {e}");
            t.errors += 1;
            return;
        }
    };
    if r.status() == 503 {
        t.busy += 1;
        return;
    }
    if !r.status().is_success() {
        eprintln!("loadgen: request {i}: status {}", r.status());
        t.errors += 1;
        return;
    }
    let mut stream = r.bytes_stream();
    let mut buf = Vec::new();
    let mut last: Option<Instant> = None;
    let mut done = false;
    while let Some(chunk) = stream.next().await {
        let Ok(chunk) = chunk else {
            eprintln!("loadgen: request {i}: the stream broke");
            t.errors += 1;
            return;
        };
        buf.extend_from_slice(&chunk);
        while let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = buf.drain(..end + 2).collect();
            let text = String::from_utf8_lossy(&event);
            let Some(data) = text.trim().strip_prefix("data: ") else {
                continue;
            };
            if data == "[DONE]" {
                done = true;
                continue;
            }
            let Ok(v) = serde_json::from_str::<Value>(data) else {
                continue;
            };
            if v.get("error").is_some() {
                eprintln!("loadgen: request {i}: {data}");
                t.errors += 1;
                return;
            }
            let has_text = v["choices"][0]["text"]
                .as_str()
                .is_some_and(|s| !s.is_empty());
            if has_text {
                let now = Instant::now();
                match last {
                    None => t.ttft.push((now - t0).as_secs_f64()),
                    Some(prev) => t.itl.push((now - prev).as_secs_f64()),
                }
                last = Some(now);
                t.tokens += 1;
            }
        }
    }
    if !done {
        eprintln!("loadgen: request {i}: the stream ended without [DONE]");
        t.errors += 1;
    }
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

#[tokio::main]
async fn main() {
    let args = std::sync::Arc::new(Args::parse());
    // A new connection per request: a server may close an idle kept-alive connection just as
    // the client reuses it (llama-server does), which would count as an error of the server.
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(600))
        .build()
        .unwrap();
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let t0 = Instant::now();
    let deadline = args.duration.map(|d| t0 + Duration::from_secs_f64(d));
    let tasks: Vec<_> = (0..args.clients)
        .map(|_| {
            let (client, args, next) = (client.clone(), args.clone(), next.clone());
            tokio::spawn(async move {
                let mut t = Tally::default();
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let more = match deadline {
                        Some(d) => Instant::now() < d,
                        None => i < args.requests,
                    };
                    if !more {
                        return t;
                    }
                    one(&client, &args, i, &mut t).await;
                }
            })
        })
        .collect();
    let mut all = Tally::default();
    for task in tasks {
        let t = task.await.unwrap();
        all.requests += t.requests;
        all.errors += t.errors;
        all.busy += t.busy;
        all.tokens += t.tokens;
        all.ttft.extend(t.ttft);
        all.itl.extend(t.itl);
    }
    let wall = t0.elapsed().as_secs_f64();
    println!(
        "{}",
        json!({
            "clients": args.clients,
            "requests": all.requests,
            "errors": all.errors,
            "busy_503": all.busy,
            "generated_tokens": all.tokens,
            "wall_s": wall,
            "tok_s": all.tokens as f64 / wall,
            "ttft_p50_ms": percentile(&mut all.ttft, 0.5) * 1e3,
            "ttft_p99_ms": percentile(&mut all.ttft, 0.99) * 1e3,
            "itl_p50_ms": percentile(&mut all.itl, 0.5) * 1e3,
            "itl_p99_ms": percentile(&mut all.itl, 0.99) * 1e3,
        })
    );
}
