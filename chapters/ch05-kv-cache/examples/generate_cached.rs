//! Generate text with chapter 5's engine: f32 weights, with a KV cache.
//!
//! cargo run --release -p ch05 --example generate_cached -- --prompt "The capital of France is" -n 64 --temp 0

use ch03::DenseLoader;
use ch04::Model;
use ch05::Cached;

/// Chapter 4's command line (the `generate` example's flags and `main`).
#[path = "../../ch04-forward/examples/common/generate_flags.rs"]
mod generate_flags;

fn main() {
    generate_flags::main(
        |file| Ok(Model::load(file, &DenseLoader, &ch04::architectures())?),
        |model, args| Box::new(Cached::contiguous(model, args.ctx)),
    );
}
