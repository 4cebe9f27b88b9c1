//! Generate text with chapter 4's engine: f32 weights, no KV cache (slow on purpose).
//!
//! cargo run --release -p ch04 --example generate -- --prompt "The capital of France is" -n 16 --temp 0

use ch04::cli::{self, Args};
use ch04::{DenseLoader, Model, Uncached};
use clap::Parser;

fn main() {
    let args = Args::parse();
    let result = cli::run(
        &args,
        |file| Ok(Model::load(file, &DenseLoader)?),
        |model| Box::new(Uncached { model }),
    );
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
