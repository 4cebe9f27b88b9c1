//! Chapter 7's throughput table on this chapter's kernels: the same prompts one at a time and
//! batched through chapter 7's scheduler, with chapter 8's matrices (packed where the CPU has
//! the micro-kernel) and `SimdCompute` on `--threads` threads. Batching shares each weight read
//! among the requests of a step; with fast kernels, reading the weights is what a decode step
//! costs, so this is where batching pays.
//!
//! cargo run --release -p ch08 --example throughput_simd -- --threads 2

use ch01::GgufFile;
use ch02::Tokenizer;
use ch04::Model;
use ch07::throughput;
use ch08::FastLoader;
use ch08::pool::{PoolKind, new_pool};
use clap::Parser;

#[derive(Parser, Debug)]
struct Args {
    /// Runs of each measurement; the table shows the median.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Threads of the pool the products and attention run on (default: the physical cores).
    #[arg(long, short = 't', default_value_t = ch04::cli::default_threads())]
    threads: usize,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let file = GgufFile::open(shared::default_model_path()?)?;
    let tok = Tokenizer::from_gguf(&file.gguf)?;
    let fast = FastLoader::new(new_pool(PoolKind::Spin, args.threads.max(1)));
    let model = Model::load(&file, &fast, &ch04::architectures())?.with_compute(fast.compute());
    let runs = args.runs.max(1);
    // With one thread the caller's on-CPU time is the engine's; with more, only wall-clock
    // time counts every thread's work.
    print!(
        "{}",
        throughput::table(&model, &tok, runs, args.threads <= 1)?
    );
    println!();
    println!(
        "{} tokens generated per request (greedy) after prompts of 3 to 15 tokens; {} weights, \
         chapter 8's kernels ({}), {} thread{}; median of {runs} runs; {}.",
        throughput::N_GENERATE,
        model
            .blocks_as::<ch04::llama::Llama>()
            .expect("llama blocks")
            .layers[0]
            .attn
            .wq
            .describe(),
        fast.kernels.isa,
        args.threads,
        if args.threads == 1 { "" } else { "s" },
        throughput::cpu_name(),
    );
    Ok(())
}
