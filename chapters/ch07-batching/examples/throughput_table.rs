//! The chapter's throughput table: generated tokens per second for 1, 2, 4 and 8 concurrent
//! requests, one at a time (chapter 5's engine) against batched (this chapter's scheduler), the
//! median of a few runs each, printed as a Markdown table. The same measurement as
//! `cargo bench -p ch07`, without criterion's statistics, so that it is quick to regenerate.
//!
//! Throughput is shown per second on a CPU (the engine is single-threaded), which other work on
//! a shared machine does not disturb, and per wall-clock second, which it does.
//!
//! cargo run --release -p ch07 --example throughput_table
//! cargo run --release -p ch07 --example throughput_table -- --dense --runs 5

use ch07::throughput::{self, PROMPTS, Run};
use ch07::{DenseLoader, GgufFile, Model, QuantLoader, Tokenizer};
use clap::Parser;

#[derive(Parser, Debug)]
struct Args {
    /// Runs of each measurement; the table shows the median.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// f32 weights (chapter 3's loader) instead of the file's quantized blocks.
    #[arg(long)]
    dense: bool,
}

/// The median of `runs` by `key`.
fn median(runs: &[Run], key: impl Fn(&Run) -> Option<f64>) -> Option<f64> {
    let mut v: Vec<f64> = runs.iter().map(key).collect::<Option<_>>()?;
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

fn show(x: Option<f64>) -> String {
    x.map_or("n/a".to_string(), |x| format!("{x:.1}"))
}

fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|n| n.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".to_string())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let path = shared::default_model_path()?;
    let file = GgufFile::open(&path)?;
    let tok = Tokenizer::from_gguf(&file.gguf)?;
    let (model, weights) = if args.dense {
        (
            Model::load(&file, &DenseLoader)?,
            "f32 weights (DenseLoader)",
        )
    } else {
        (
            Model::load(&file, &QuantLoader)?,
            "Q4_1 weights (QuantLoader)",
        )
    };
    let params = throughput::params();
    let runs = args.runs.max(1);

    println!(
        "| concurrent requests | one at a time (tok/s on CPU) | batched (tok/s on CPU) | speed-up | one at a time (tok/s wall) | batched (tok/s wall) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    for n in [1, 2, 4, 8] {
        let prompts: Vec<Vec<u32>> = PROMPTS[..n]
            .iter()
            .map(|p| tok.encode(p, true, true))
            .collect();
        let config = throughput::config_for(&prompts, &params);
        let mut alone = Vec::new();
        let mut batched = Vec::new();
        for _ in 0..runs {
            alone.push(throughput::one_at_a_time(&model, &tok, &prompts, &params)?);
            batched.push(throughput::batched(
                &model,
                &tok,
                &prompts,
                &params,
                config.clone(),
            )?);
        }
        // Validate: batching must not change a single token.
        for (a, b) in alone.iter().zip(&batched) {
            if a.outputs != b.outputs {
                return Err(
                    format!("{n} requests: batched tokens differ from one at a time").into(),
                );
            }
        }
        let (a_cpu, b_cpu) = (
            median(&alone, Run::tok_per_cpu_s),
            median(&batched, Run::tok_per_cpu_s),
        );
        let (a_wall, b_wall) = (
            median(&alone, |r| Some(r.tok_s())),
            median(&batched, |r| Some(r.tok_s())),
        );
        let speedup = match (a_cpu.zip(b_cpu), a_wall.zip(b_wall)) {
            (Some((a, b)), _) | (None, Some((a, b))) => format!("{:.2}×", b / a),
            _ => "n/a".to_string(),
        };
        println!(
            "| {n} | {} | {} | {speedup} | {} | {} |",
            show(a_cpu),
            show(b_cpu),
            show(a_wall),
            show(b_wall)
        );
    }
    println!();
    println!(
        "{} tokens generated per request (greedy) after prompts of 3 to 15 tokens; {weights}; one thread; \
         median of {runs} runs; {} ({} hardware threads).",
        params.max_tokens,
        cpu_name(),
        std::thread::available_parallelism().map_or(1, |n| n.get()),
    );
    Ok(())
}
