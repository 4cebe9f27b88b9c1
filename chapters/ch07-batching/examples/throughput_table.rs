//! The chapter's throughput table: generated tokens per second for 1, 2, 4, 8 and 16 concurrent
//! requests, one at a time (chapter 5's engine) against batched (this chapter's scheduler), the
//! median of a few runs each, printed as a Markdown table. The same measurement as
//! `cargo bench -p ch07`, without criterion's statistics, so that it is quick to regenerate.
//!
//! Throughput is shown per second on a CPU (the engine is single-threaded), which other work on
//! a shared machine does not disturb, and per wall-clock second, which it does.
//!
//! cargo run --release -p ch07 --example throughput_table
//! cargo run --release -p ch07 --example throughput_table -- --dense --runs 5

use ch01::GgufFile;
use ch02::Tokenizer;
use ch03::DenseLoader;
use ch04::Model;
use ch06::QuantLoader;
use ch07::throughput;
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

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let path = shared::default_model_path()?;
    let file = GgufFile::open(&path)?;
    let tok = Tokenizer::from_gguf(&file.gguf)?;
    let (model, weights) = if args.dense {
        (
            Model::load(&file, &DenseLoader, &ch04::architectures())?,
            "f32 weights (DenseLoader: chapter 3's scalar dot product)",
        )
    } else {
        (
            Model::load(&file, &QuantLoader, &ch04::architectures())?,
            "Q4_1 weights (QuantLoader: chapter 6's scalar kernels)",
        )
    };
    let runs = args.runs.max(1);
    print!("{}", throughput::table(&model, &tok, runs, true)?);
    println!();
    println!(
        "{} tokens generated per request (greedy) after prompts of 3 to 15 tokens; {weights}; \
         one thread; median of {runs} runs; {} ({} hardware threads).",
        throughput::N_GENERATE,
        throughput::cpu_name(),
        std::thread::available_parallelism().map_or(1, |n| n.get()),
    );
    Ok(())
}
