//! The soak against a running server, for `scripts/soak`: mixed requests for a set time, the
//! server's metrics and resident memory sampled every second, all written as JSON.
//!
//!   cargo run --release -p ch12 --example soak -- --url http://127.0.0.1:PORT --pid PID \
//!       [--seconds 300] [--clients 16] [--body-limit BYTES] [--max-tokens 32] \
//!       [--api-key KEY] [--header-timeout SECONDS] > soak.json
//!
//! Loopback only: it refuses a URL that is not on 127.0.0.1.

#[path = "../tests/common/soak.rs"]
mod soak;

use serde_json::json;
use std::sync::Mutex;
use std::time::Duration;

fn main() {
    let mut url = String::new();
    let (mut pid, mut seconds, mut clients, mut body_limit, mut max_tokens) =
        (0u32, 300u64, 16usize, 8usize << 20, 32usize);
    let (mut api_key, mut header_timeout) = (String::new(), 10u64);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || {
            args.next()
                .unwrap_or_else(|| fail(&format!("{a} needs a value")))
        };
        let number = |v: String| {
            v.parse::<u64>()
                .unwrap_or_else(|_| fail(&format!("{a}: not a number: {v:?}")))
        };
        match a.as_str() {
            "--url" => url = value(),
            "--pid" => pid = number(value()) as u32,
            "--seconds" => seconds = number(value()),
            "--clients" => clients = number(value()) as usize,
            "--body-limit" => body_limit = number(value()) as usize,
            "--max-tokens" => max_tokens = number(value()) as usize,
            "--api-key" => api_key = value(),
            "--header-timeout" => header_timeout = number(value()),
            _ => fail(&format!("unknown argument {a:?}")),
        }
    }
    if !url.starts_with("http://127.0.0.1:") {
        fail("--url must be http://127.0.0.1:PORT (the soak runs over loopback only)");
    }
    if pid == 0 || clients == 0 {
        fail("--pid and --clients are needed");
    }
    let client = reqwest::blocking::Client::new();
    let samples = Mutex::new(Vec::new());
    let metrics_url = format!("{url}/metrics");
    let sample = |t: f64| {
        let Ok(text) = client.get(&metrics_url).send().and_then(|r| r.text()) else {
            return;
        };
        let m = soak::Metrics::parse(&text);
        let class = |c: &str| -> f64 {
            m.samples
                .iter()
                .filter(|(n, l, _)| {
                    n == "llmrs_requests_total"
                        && l.iter().any(|(k, v)| k == "status" && v.starts_with(c))
                })
                .map(|(_, _, v)| v)
                .sum()
        };
        samples.lock().unwrap().push(json!({
            "t": t,
            "rss_kib": soak::rss_kib(pid),
            "generated": m.sum("llmrs_generated_tokens_total", &[]),
            "requests_2xx": class("2"),
            "requests_4xx": class("4"),
            "requests_5xx": class("5"),
            "running": m.sum("llmrs_running_sequences", &[]),
            "queue": m.sum("llmrs_queue_depth", &[]),
            "in_flight": m.sum("llmrs_in_flight_requests", &[]),
            "kv_used": m.sum("llmrs_kv_blocks", &[("state", "used")]),
            "kv_cached": m.sum("llmrs_kv_blocks", &[("state", "cached")]),
            "kv_free": m.sum("llmrs_kv_blocks", &[("state", "free")]),
            "ttft_count": m.sum("llmrs_time_to_first_token_seconds_count", &[]),
            "ttft_sum": m.sum("llmrs_time_to_first_token_seconds_sum", &[]),
            "itl_count": m.sum("llmrs_inter_token_latency_seconds_count", &[]),
            "itl_sum": m.sum("llmrs_inter_token_latency_seconds_sum", &[]),
            "hit_ratio": m.sum("llmrs_prefix_cache_hit_ratio", &[]),
        }));
    };
    let config = soak::Config {
        base: url.clone(),
        clients,
        duration: Duration::from_secs(seconds),
        max_requests: usize::MAX,
        body_limit,
        max_tokens,
        api_key,
        header_timeout: Duration::from_secs(header_timeout),
    };
    let rss_start = soak::rss_kib(pid);
    let report = soak::run(&config, sample);
    let rss_end = soak::rss_kib(pid);
    let out = json!({
        "clients": clients,
        "max_tokens": max_tokens,
        "rss_start_kib": rss_start,
        "rss_end_kib": rss_end,
        "report": report,
        "samples": samples.into_inner().unwrap(),
    });
    println!("{out}");
}

fn fail(message: &str) -> ! {
    eprintln!("error: {message}");
    std::process::exit(2);
}
