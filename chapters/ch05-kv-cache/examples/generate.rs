//! Generate text with chapter 5's engine: f32 weights, with a KV cache.
//!
//! cargo run --release -p ch05 --example generate -- --prompt "The capital of France is" -n 64 --temp 0

use ch05::cli::{self, Args};
use ch05::{Cached, ContiguousCache, DenseLoader, Model, Overflow};
use clap::Parser;

fn main() {
    let args = Args::parse();
    let result = cli::run(
        &args,
        |file| Ok(Model::load(file, &DenseLoader)?),
        |model| {
            let n_ctx = args.ctx.unwrap_or(model.config.context_length);
            let kv = ContiguousCache::new(
                model.config.n_layer,
                model.attention.kv_dim(),
                n_ctx,
                Overflow::Error,
            );
            Box::new(Cached::new(model, kv, 256))
        },
    );
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
