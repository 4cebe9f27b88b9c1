//! What speculation buys: decode speed with and without guesses on three tasks — one whose
//! answer copies from the prompt, a code edit, and free generation — at 1 and 2 threads.
//! Greedy, chat-templated, the same output checked for both (else the row fails).
//!
//! `cargo run --release -p ch16 --example spec-bench -- [--model FILE] [--runs 5]
//! [--tokens 128] [--draft-model FILE]`

use ch16::engine::{Engine, LoadMode};
use ch16::mapped::MapOptions;
use ch16::{
    Cached, ContiguousCache, DraftLength, DraftModel, FastLoader, GenParams, Message, PoolKind,
    PromptLookup, Proposer, SamplerParams, generate, new_pool, speculate,
};
use clap::Parser;
use std::path::PathBuf;

#[derive(Parser)]
struct Flags {
    /// GGUF model (default: the default model).
    #[arg(long)]
    model: Option<PathBuf>,
    /// A draft model with the same vocabulary: adds `draft` rows.
    #[arg(long)]
    draft_model: Option<PathBuf>,
    /// Runs per row; the table shows medians.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Tokens generated per run.
    #[arg(long, default_value_t = 128)]
    tokens: usize,
    /// Most guesses per pass.
    #[arg(long, default_value_t = ch16::runner::DRAFT_MAX)]
    draft_max: usize,
}

const DOCUMENT: &str = "The Rhine is a river that begins in the Swiss Alps, flows through \
Lake Constance, and forms part of the border between Switzerland and Germany. It then \
flows north through Germany, where it passes the cities of Mannheim, Mainz, Koblenz, Bonn, \
Cologne and Düsseldorf, before entering the Netherlands and emptying into the North Sea. \
With a length of about 1,230 kilometres, it is one of the longest rivers in Europe.";

const CODE: &str = "def total_price(items):\n    total = 0\n    for item in items:\n        \
total += item.price * item.quantity\n    return total\n\n\ndef average_price(items):\n    \
if not items:\n        return 0\n    return total_price(items) / len(items)\n";

/// The tasks: a name and the user's message.
fn tasks() -> Vec<(&'static str, String)> {
    vec![
        (
            "extract",
            format!(
                "{DOCUMENT}\n\nList every city named in the text above, with the sentence that names it, quoted exactly."
            ),
        ),
        (
            "code edit",
            format!(
                "{CODE}\nRewrite this code with the function total_price renamed to sum_prices everywhere. Reply with the code only."
            ),
        ),
        (
            "free",
            "Write a short story about a lighthouse keeper and a storm.".to_string(),
        ),
    ]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let flags = Flags::parse();
    let path = match &flags.model {
        Some(p) => p.clone(),
        None => shared::default_model_path()?,
    };
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("model name")?
                    .split(':')
                    .nth(1)
                    .map(|s| s.trim().to_string())
            })
        })
        .unwrap_or_else(|| "unknown CPU".into());
    println!(
        "{} ({}), {} tokens greedy, median of {} runs; {cpu}, {} cores\n",
        path.file_name().unwrap_or_default().to_string_lossy(),
        flags
            .model
            .as_ref()
            .map_or("the default model", |_| "given"),
        flags.tokens,
        flags.runs,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    println!(
        "| task | threads | proposer | plain tok/s | speculative tok/s | speed-up | acceptance | tokens/pass |"
    );
    println!("|---|---:|---|---:|---:|---:|---:|---:|");
    for threads in [1, 2] {
        let fast = FastLoader::new(new_pool(PoolKind::Spin, threads));
        let load = |p: &PathBuf| {
            Engine::load(
                p,
                LoadMode::Map(MapOptions::default()),
                fast.clone(),
                &ch16::architectures(),
            )
        };
        let engine = load(&path)?;
        let draft = flags.draft_model.as_ref().map(load).transpose()?;
        let template = engine
            .template
            .as_ref()
            .ok_or("the model has no chat template")?;
        let model = &engine.model;
        let n_ctx = 2048.min(model.n_ctx());
        let params = GenParams {
            max_tokens: flags.tokens,
            sampler: SamplerParams::greedy(),
            stop: Vec::new(),
            rule: None,
        };
        for (task, message) in tasks() {
            let prompt =
                template.encode(&engine.tokenizer, &[Message::new("user", &message)], true)?;
            let names: &[&str] = if draft.is_some() {
                &["ngram", "draft"]
            } else {
                &["ngram"]
            };
            for &name in names {
                let (mut plain, mut spec, mut stats) = (Vec::new(), Vec::new(), Default::default());
                for _ in 0..flags.runs {
                    let mut session =
                        Cached::new(model, ContiguousCache::for_model(model, n_ctx), 256);
                    let g = generate(
                        &mut session,
                        &engine.tokenizer,
                        &prompt,
                        &params,
                        &mut |_| {},
                    )?;
                    plain.push(g.decode_tok_s());
                    let mut session =
                        Cached::new(model, ContiguousCache::for_model(model, n_ctx), 256);
                    let mut proposer: Box<dyn Proposer> = match &draft {
                        Some(d) if name == "draft" => Box::new(DraftModel::new(
                            &d.model,
                            &d.tokenizer,
                            &engine.tokenizer,
                            n_ctx,
                        )?),
                        _ => Box::new(PromptLookup::default()),
                    };
                    let (s, st) = speculate(
                        &mut session,
                        &mut *proposer,
                        &mut DraftLength::new(flags.draft_max),
                        &engine.tokenizer,
                        &prompt,
                        &params,
                        &mut |_| {},
                    )?;
                    if s.ids != g.ids {
                        return Err(format!("{task}: speculation changed the output").into());
                    }
                    spec.push(s.decode_tok_s());
                    stats = st;
                }
                let (p, s) = (median(plain), median(spec));
                println!(
                    "| {task} | {threads} | {name} | {p:.1} | {s:.1} | {:.2}× | {:.0} % | {:.2} |",
                    s / p,
                    100.0 * stats.acceptance(),
                    stats.tokens_per_pass()
                );
            }
        }
    }
    Ok(())
}
