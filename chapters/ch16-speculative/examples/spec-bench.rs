//! What speculation buys: speed with and without guesses on three tasks — one whose answer
//! copies from the prompt, a code edit, and free generation — at 1 and 2 threads: tokens
//! generated per second of the whole call, prompt, sampling and guessing included, as a user
//! waits for them. Greedy, chat-templated, the same output checked for both (else the row
//! fails).
//!
//! `cargo run --release -p ch16 --example spec-bench -- [--model FILE] [--runs 5]
//! [--tokens 128] [--draft-model FILE] [--llama-cpp DIR]`
//!
//! `--replay-wrong R` adds `replay` rows: guesses replayed from the plain run's own output,
//! each one made wrong with chance `R`. No prompt lookup copies from a generated model's random
//! text, so this is how to see what guesses that hold as often as the extract task's would buy
//! on chapter 14's 8B files, where a pass over the weights costs most
//! (`--model FILE --tasks extract --threads 2 --replay-wrong 0.1`).
//!
//! With `--llama-cpp DIR` (the directory `scripts/build-llama-server llama-lookup` prints), each
//! row also runs llama.cpp on the same model and prompt, in the same run: `llama-bench` for its
//! plain decode at the prompt's depth, and `llama-lookup` (its prompt lookup, n-grams of 1 to 4
//! tokens) for its speculative decode, with the same `--draft-max`.

use ch02::Message;
use ch04::{GenParams, SamplerParams, generate};
use ch05::{Cached, ContiguousCache};
use ch08::{FastLoader, PoolKind, new_pool};
use ch10::engine::{Engine, LoadMode};
use ch10::mapped::MapOptions;
use ch16::Proposer;
use ch16::{DraftLength, DraftModel, PromptLookup, speculate};
use clap::Parser;
use std::error::Error;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

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
    /// Shortest match prompt lookup proposes from.
    #[arg(long, default_value_t = PromptLookup::default().min_ngram)]
    ngram_min: usize,
    /// llama.cpp's programs (`llama-bench`, `llama-lookup`), to run beside ours.
    #[arg(long)]
    llama_cpp: Option<PathBuf>,
    /// Add `replay` rows: the plain run's tokens as guesses, each wrong with this chance.
    #[arg(long)]
    replay_wrong: Option<f64>,
    /// Thread counts, one set of rows each.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    threads: Vec<usize>,
    /// Only the tasks with these names (default: all).
    #[arg(long, value_delimiter = ',')]
    tasks: Vec<String>,
}

/// Guesses replayed from a known output, each made wrong with chance `wrong` (a fixed
/// pseudo-random stream, so runs are alike).
struct Replay {
    truth: Vec<u32>,
    wrong: f64,
    state: u64,
}

impl Proposer for Replay {
    fn propose(
        &mut self,
        tokens: &[u32],
        max: usize,
        out: &mut Vec<u32>,
    ) -> Result<(), ch04::ForwardError> {
        for &t in self.truth.iter().skip(tokens.len()).take(max) {
            // splitmix64
            self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            let u = (z ^ (z >> 31)) as f64 / u64::MAX as f64;
            out.push(if u >= self.wrong {
                t
            } else if t > 0 {
                t - 1
            } else {
                t + 1
            });
        }
        Ok(())
    }
}

/// llama.cpp's plain rate as ours is measured: `tokens` generated after a prompt of `depth`
/// tokens, per second of both (`llama-bench -pg depth,tokens`, its mean over `runs`).
fn llama_bench(
    dir: &Path,
    model: &Path,
    depth: usize,
    tokens: usize,
    threads: usize,
    runs: usize,
) -> Result<f64, Box<dyn Error>> {
    let out = Command::new(dir.join("llama-bench"))
        .arg("-m")
        .arg(model)
        .args(["-p", "0", "-n", "0", "-pg", &format!("{depth},{tokens}")])
        .args([
            "-t",
            &threads.to_string(),
            "-r",
            &runs.to_string(),
            "-o",
            "json",
        ])
        .output()?;
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("llama-bench: {e}: {}", String::from_utf8_lossy(&out.stderr)))?;
    let both = rows[0]["avg_ts"]
        .as_f64()
        .ok_or("llama-bench printed no avg_ts")?;
    Ok(tokens as f64 / ((depth + tokens) as f64 / both))
}

/// llama.cpp's prompt lookup on `text`, greedy: tokens generated per second of the prompt and
/// the generation, and the share of guesses held.
fn llama_lookup(
    dir: &Path,
    model: &Path,
    text: &str,
    f: &Flags,
    threads: usize,
) -> Result<(f64, f64), Box<dyn Error>> {
    let out = Command::new(dir.join("llama-lookup"))
        .arg("-m")
        .arg(model)
        .args([
            "-p",
            text,
            "-n",
            &f.tokens.to_string(),
            "--spec-draft-n-max",
            &f.draft_max.to_string(),
        ])
        .args(["-t", &threads.to_string(), "--temp", "0", "-c", "2048"])
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    let after = |key: &str, unit: &str| -> Option<f64> {
        let line = err.lines().find(|l| l.contains(key))?;
        let rest = line.split(key).nth(1)?;
        rest.split(unit)
            .next()?
            .split_whitespace()
            .last()?
            .parse()
            .ok()
    };
    let generated = err.lines().find_map(|l| {
        l.split("decoded")
            .nth(1)?
            .split_whitespace()
            .next()?
            .parse::<f64>()
            .ok()
    });
    let (encoding, decoding) = (after("encoded", "seconds"), after("decoded", "seconds"));
    match (generated, encoding, decoding, after("accept       =", "%")) {
        (Some(n), Some(e), Some(d), Some(accept)) => Ok((n / (e + d), accept)),
        _ => Err(format!("llama-lookup printed no speed and acceptance:\n{err}").into()),
    }
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
    let ours = "| task | threads | proposer | plain tok/s | speculative tok/s | speed-up | acceptance | tokens/pass |";
    if flags.llama_cpp.is_some() {
        println!(
            "{ours} llama.cpp tok/s | llama.cpp lookup tok/s | lookup acceptance | ours ÷ llama.cpp lookup |"
        );
        println!("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    } else {
        println!("{ours}");
        println!("|---|---:|---|---:|---:|---:|---:|---:|");
    }
    for &threads in &flags.threads {
        let fast = FastLoader::new(new_pool(PoolKind::Spin, threads));
        let load = |p: &PathBuf| {
            Engine::load(
                p,
                LoadMode::Map(MapOptions::default()),
                fast.clone(),
                &ch13::architectures(),
            )
        };
        let engine = load(&path)?;
        let draft = flags.draft_model.as_ref().map(load).transpose()?;
        let template = engine.template.as_ref();
        let model = &engine.model;
        let n_ctx = 2048.min(model.n_ctx());
        let params = GenParams {
            max_tokens: flags.tokens,
            sampler: SamplerParams::greedy(),
            stop: Vec::new(),
            rule: None,
        };
        for (task, message) in tasks() {
            if !flags.tasks.is_empty() && !flags.tasks.iter().any(|t| t == task) {
                continue;
            }
            // A generated model may have no chat template: then the message as it is.
            let prompt = match template {
                Some(t) => t.encode(&engine.tokenizer, &[Message::new("user", &message)], true)?,
                None => engine.tokenizer.encode(&message, true, false),
            };
            let mut names = vec!["ngram"];
            if draft.is_some() {
                names.push("draft");
            }
            if flags.replay_wrong.is_some() {
                names.push("replay");
            }
            for name in names {
                let (mut plain, mut spec, mut stats) = (Vec::new(), Vec::new(), Default::default());
                for _ in 0..flags.runs {
                    let mut session =
                        Cached::new(model, ContiguousCache::for_model(model, n_ctx), 256);
                    let t0 = Instant::now();
                    let g = generate(
                        &mut session,
                        &engine.tokenizer,
                        &prompt,
                        &params,
                        &mut |_| {},
                    )?;
                    plain.push(g.ids.len() as f64 / t0.elapsed().as_secs_f64());
                    let mut session =
                        Cached::new(model, ContiguousCache::for_model(model, n_ctx), 256);
                    let mut proposer: Box<dyn Proposer> = match &draft {
                        _ if name == "replay" => Box::new(Replay {
                            truth: [prompt.as_slice(), &g.ids].concat(),
                            wrong: flags.replay_wrong.unwrap_or(0.0),
                            state: 0,
                        }),
                        Some(d) if name == "draft" => Box::new(DraftModel::new(
                            &d.model,
                            &d.tokenizer,
                            &engine.tokenizer,
                            n_ctx,
                        )?),
                        _ => Box::new(PromptLookup {
                            min_ngram: flags.ngram_min,
                            ..PromptLookup::default()
                        }),
                    };
                    let t0 = Instant::now();
                    let (s, st) = speculate(
                        &mut session,
                        &mut *proposer,
                        &mut DraftLength::new(flags.draft_max),
                        &engine.tokenizer,
                        &prompt,
                        &params,
                        &mut |_| {},
                    )?;
                    let rate = s.ids.len() as f64 / t0.elapsed().as_secs_f64();
                    if s.ids != g.ids {
                        return Err(format!("{task}: speculation changed the output").into());
                    }
                    spec.push(rate);
                    stats = st;
                }
                let (p, s) = (median(plain), median(spec));
                print!(
                    "| {task} | {threads} | {name} | {p:.1} | {s:.1} | {:.2}× | {:.0} % | {:.2} |",
                    s / p,
                    100.0 * stats.acceptance(),
                    stats.tokens_per_pass()
                );
                match &flags.llama_cpp {
                    Some(dir) if name == "ngram" => {
                        let text = match template {
                            Some(t) => t.render(&[Message::new("user", &message)], true)?,
                            None => message.clone(),
                        };
                        let plain = llama_bench(
                            dir,
                            &path,
                            prompt.len(),
                            flags.tokens,
                            threads,
                            flags.runs,
                        )?;
                        let (mut speeds, mut accept) = (Vec::new(), 0.0);
                        for _ in 0..flags.runs {
                            let (speed, a) = llama_lookup(dir, &path, &text, &flags, threads)?;
                            speeds.push(speed);
                            accept = a;
                        }
                        let lookup = median(speeds);
                        println!(
                            " {plain:.1} | {lookup:.1} | {accept:.0} % | {:.2}× |",
                            s / lookup
                        );
                    }
                    Some(_) => println!(" | | | |"),
                    None => println!(),
                }
            }
        }
    }
    Ok(())
}
