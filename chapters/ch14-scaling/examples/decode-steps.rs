//! What a decode step costs as the number of sequences in it grows, against what the same
//! number of prompt tokens costs.
//!
//! A decode step over `n` sequences reads every weight once, as a prompt chunk of `n` tokens
//! does, so ideally it costs what `n` prompt tokens cost. This example measures both with the
//! finished engine's pieces: chapter 7's scheduler running `n` requests (distinct prompts, no
//! prefix cache) until every one is decoding, then the median time of a step in which all `n`
//! decode; and a prompt chunk of `n` tokens of one sequence at the same context, in one
//! forward pass. It prints, per `n`: the step's time (each stream's time between tokens), the
//! aggregate decode rate, the chunk's time, and their ratio (1 would be a step costing what its
//! tokens cost as a prompt), also against the chunk with every row's logits (as a step needs).
//! Last, the rate of one whole prompt as long as the steps' context, for the decode rates to be
//! set against.
//!
//! ```sh
//! cargo run --release -p ch14 --example decode-steps -- [--model PATH] [--threads 2] \
//!     [--seqs 1,2,4,8,16,32] [--steps 24] [--prompt-tokens 64] [--cache f16] [--greedy]
//! ```

use ch04::{Batch, GenParams, SamplerParams};
use ch05::{CacheTypes, PagedCache};
use ch07::{Request, Scheduler, SchedulerConfig};
use ch08::{FastLoader, PoolKind, new_pool};
use ch10::engine::{Engine, LoadMode};
use ch10::mapped::MapOptions;
use clap::Parser;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Parser)]
struct Cli {
    /// GGUF model file (default: the default model).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Threads.
    #[arg(long, short = 't', default_value_t = ch04::cli::default_threads())]
    threads: usize,
    /// Sequence counts to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32")]
    seqs: Vec<usize>,
    /// Decode steps timed per count (all sequences decoding).
    #[arg(long, default_value_t = 24)]
    steps: usize,
    /// Sample greedily (the default samples at llama.cpp's default settings, seeded).
    #[arg(long)]
    greedy: bool,
    /// Tokens of each request's prompt.
    #[arg(long, default_value_t = 64)]
    prompt_tokens: usize,
    /// What the KV cache keeps keys and values in (f32, f16, q8_0).
    #[arg(long, default_value = "f16")]
    cache: String,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cli = Cli::parse();
    let path = match &cli.model {
        Some(p) => p.clone(),
        None => shared::default_model_path()?,
    };
    let archs = ch13::architectures();
    let fast = FastLoader::new(new_pool(PoolKind::Spin, cli.threads));
    let engine = Engine::load(&path, LoadMode::Map(MapOptions::default()), fast, &archs)?;
    let model = &engine.model;
    let row = ch06::cache::cache_row_type(&cli.cache)?;
    let cache = CacheTypes { k: row, v: row };
    let vocab = model.config.vocab_size as u32;
    // Distinct prompts: token ids spread over the vocabulary, a different start per sequence.
    let prompt = |s: usize| -> Vec<u32> {
        (0..cli.prompt_tokens)
            .map(|i| ((s * 7919 + i * 104_729 + 1000) as u32) % vocab)
            .collect()
    };

    // An empty paged cache of the chosen type for one sequence of `positions`.
    let fresh = |positions: usize| {
        let (n_layer, kv_dim) = (model.config.n_layer, model.attention.kv_dim());
        PagedCache::try_typed(n_layer, kv_dim, 16, positions.div_ceil(16), cache)
    };
    // ANCHOR: chunk
    // What `n` prompt tokens cost at the context the decode steps see: a chunk of `n` tokens
    // after the `prompt_tokens` of one sequence, one forward pass, in a cache of the chosen
    // type; best of three. The context before it is prefilled untimed.
    let past = cli.prompt_tokens;
    let chunk_ms = |n: usize, logits: bool| -> Result<f64, Box<dyn std::error::Error>> {
        let ids: Vec<u32> = prompt(0).into_iter().cycle().take(past + n).collect();
        let mut best = f64::INFINITY;
        for _ in 0..3 {
            let mut kv = fresh(past + n)?;
            let before = Batch::sequence(0, &ids[..past], 0, false);
            model.forward(&before, &mut kv, &mut ch03::NoObserver)?;
            let batch = Batch::sequence(0, &ids[past..], past, logits);
            let t = Instant::now();
            model.forward(&batch, &mut kv, &mut ch03::NoObserver)?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        Ok(best * 1e3)
    };
    // ANCHOR_END: chunk
    println!(
        "{}: {} threads",
        path.file_name().unwrap_or_default().to_string_lossy(),
        cli.threads,
    );
    // A step gives every stream one token: its time is each stream's time between tokens.
    println!(
        "| sequences | step, ms | tok/s, all streams | n prompt tokens, ms | step ÷ prompt \
         | with n rows' logits, ms | step ÷ that |"
    );
    println!("|---|---|---|---|---|---|---|");

    for &n in &cli.seqs {
        let config = SchedulerConfig {
            max_batch_tokens: 256.max(n),
            max_running: n,
            block_size: 16,
            n_blocks: n * (cli.prompt_tokens + 2 * cli.steps + 32).div_ceil(16),
            prefix_cache: false,
            cache,
        };
        let mut sched = Scheduler::new(model, &engine.tokenizer, config)?;
        for s in 0..n {
            sched.submit(Request {
                prompt: prompt(s),
                params: GenParams {
                    max_tokens: 2 * cli.steps + 16,
                    // Sampled, so that a sequence rarely ends early; steps where one has
                    // ended are not counted.
                    sampler: if cli.greedy {
                        SamplerParams::greedy()
                    } else {
                        SamplerParams {
                            seed: s as u64,
                            ..SamplerParams::default()
                        }
                    },
                    stop: vec![],
                    rule: None,
                },
            })?;
        }
        // ANCHOR: step
        let mut times = Vec::new();
        while times.len() < cli.steps && !sched.is_idle() {
            let t = Instant::now();
            let r = sched.step(&mut ())?;
            let dt = t.elapsed().as_secs_f64();
            if r.n_decode == n && r.n_tokens == n {
                times.push(dt);
            }
        }
        if times.is_empty() {
            println!("| {n} | (no step with all {n} decoding) | | | | | |");
            continue;
        }
        times.sort_by(f64::total_cmp);
        let step = times[times.len() / 2] * 1e3;
        let (prompt, all) = (chunk_ms(n, false)?, chunk_ms(n, true)?);
        // ANCHOR_END: step
        println!(
            "| {n} | {step:.1} | {:.1} | {prompt:.1} | {:.2} | {all:.1} | {:.2} |",
            n as f64 / step * 1e3,
            step / prompt,
            step / all
        );
    }
    // The engine's prefill rate: a whole prompt as long as the context of the steps, in one
    // forward pass (as llama.cpp's batched-bench reports S_PP beside S_TG).
    let ids: Vec<u32> = prompt(1)
        .into_iter()
        .cycle()
        .take(past + cli.steps)
        .collect();
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let mut kv = fresh(ids.len())?;
        let t = Instant::now();
        model.forward(
            &Batch::sequence(0, &ids, 0, false),
            &mut kv,
            &mut ch03::NoObserver,
        )?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    println!(
        "\nprefill of one {}-token prompt: {:.1} tok/s",
        ids.len(),
        ids.len() as f64 / best
    );
    Ok(())
}
