//! What speculation buys a server: `llm-rs serve --spec ngram` answering `clients` requests at
//! once, all of them guessing or none of them (`"speculative.n_max": 0`), on spec-bench's three
//! tasks. Tokens generated per second of wall time, all clients together, prompt included;
//! greedy, the same text checked for both (else the row fails).
//!
//! `cargo run --release -p ch16 --example serve-bench -- [--model FILE] [--clients 1,4]
//! [--runs 5] [--tokens 128] [--threads 2]`

use clap::Parser;
use reqwest::blocking::Client;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Parser)]
struct Flags {
    /// GGUF model (default: the default model).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Requests sent at once, one row each.
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    clients: Vec<usize>,
    /// Runs per row; the table shows medians.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Tokens generated per request.
    #[arg(long, default_value_t = 128)]
    tokens: usize,
    /// The server's threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
}

/// spec-bench's tasks: a name and the user's message.
const TASKS: [(&str, &str); 3] = [
    (
        "extract",
        "The Rhine begins in the Swiss Alps, flows through Lake Constance, then north through \
         Germany, where it passes Mannheim, Mainz, Koblenz, Bonn, Cologne and Düsseldorf, before \
         entering the Netherlands and emptying into the North Sea.\n\nList every city named in \
         the text above, with the sentence that names it, quoted exactly.",
    ),
    (
        "code edit",
        "def total_price(items):\n    total = 0\n    for item in items:\n        total += \
         item.price * item.quantity\n    return total\n\n\ndef average_price(items):\n    if not \
         items:\n        return 0\n    return total_price(items) / len(items)\n\nRewrite this \
         code with the function total_price renamed to sum_prices everywhere. Reply with the \
         code only.",
    ),
    (
        "free",
        "Write a short story about a lighthouse keeper and a storm.",
    ),
];

/// `clients` copies of `body` at once: their answers and the wall time.
fn round(client: &Client, base: &str, body: &Value, clients: usize) -> (Vec<Value>, Duration) {
    let t0 = Instant::now();
    let answers = std::thread::scope(|s| {
        let running: Vec<_> = (0..clients)
            .map(|_| {
                s.spawn(|| {
                    let r = client
                        .post(format!("{base}/v1/chat/completions"))
                        .json(body)
                        .send()
                        .expect("the server answers");
                    assert_eq!(r.status(), 200);
                    r.json::<Value>().expect("JSON")
                })
            })
            .collect();
        running.into_iter().map(|h| h.join().unwrap()).collect()
    });
    (answers, t0.elapsed())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let flags = Flags::parse();
    let model = match &flags.model {
        Some(p) => p.clone(),
        None => shared::default_model_path()?,
    };
    let parallel = flags.clients.iter().copied().max().unwrap_or(1).max(1);
    let (threads, parallel) = (flags.threads.to_string(), parallel.to_string());
    let model_arg = model.to_string_lossy().into_owned();
    let args = ["--ctx", "2048", "--spec", "ngram", "--threads", &threads];
    let args = [&args[..], &["--parallel", &parallel, "--model", &model_arg]].concat();
    let (_server, base) = testkit::serve::llm_rs_serve(&args, Duration::from_secs(300));
    let client = Client::builder()
        .timeout(Duration::from_secs(600))
        .build()?;
    println!(
        "{}, {} tokens greedy per request, {} threads, median of {} runs\n",
        model.file_name().unwrap_or_default().to_string_lossy(),
        flags.tokens,
        flags.threads,
        flags.runs
    );
    println!(
        "| task | clients | plain tok/s | speculative tok/s | speed-up | acceptance | tokens/step |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (name, message) in TASKS {
        for &clients in &flags.clients {
            let body = |n_max: Option<usize>| {
                let mut b = json!({
                    "messages": [{"role": "user", "content": message}],
                    "max_tokens": flags.tokens,
                    "temperature": 0,
                });
                if let Some(n) = n_max {
                    b["speculative.n_max"] = json!(n);
                }
                b
            };
            let (mut plain, mut spec) = (Vec::new(), Vec::new());
            let (mut held, mut guessed, mut tokens) = (0, 0, 0);
            for run in 0..flags.runs {
                // Which goes first alternates, so that neither always meets a warmer machine.
                let (a, t, b, u) = if run % 2 == 0 {
                    let (a, t) = round(&client, &base, &body(Some(0)), clients);
                    let (b, u) = round(&client, &base, &body(None), clients);
                    (a, t, b, u)
                } else {
                    let (b, u) = round(&client, &base, &body(None), clients);
                    let (a, t) = round(&client, &base, &body(Some(0)), clients);
                    (a, t, b, u)
                };
                let n: u64 = a
                    .iter()
                    .map(|v| v["usage"]["completion_tokens"].as_u64().unwrap())
                    .sum();
                for (x, y) in a.iter().zip(&b) {
                    let text = |v: &Value| v["choices"][0]["message"]["content"].clone();
                    assert_eq!(text(x), text(y), "{name}: guesses changed the text");
                    let d = &y["usage"]["completion_tokens_details"];
                    held += d["accepted_prediction_tokens"].as_u64().unwrap_or(0);
                    guessed += held_and_rejected(d);
                }
                tokens += n;
                plain.push(n as f64 / t.as_secs_f64());
                spec.push(n as f64 / u.as_secs_f64());
            }
            let (p, s) = (median(plain), median(spec));
            println!(
                "| {name} | {clients} | {p:.1} | {s:.1} | {:.2}× | {:.0} % | {:.2} |",
                s / p,
                100.0 * held as f64 / guessed.max(1) as f64,
                tokens as f64 / (tokens - held).max(1) as f64,
            );
        }
    }
    Ok(())
}

/// Guesses checked: those that held and those that did not.
fn held_and_rejected(d: &Value) -> u64 {
    ["accepted_prediction_tokens", "rejected_prediction_tokens"]
        .iter()
        .filter_map(|k| d[k].as_u64())
        .sum()
}
