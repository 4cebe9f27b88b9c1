//! Generate text with chapter 6's engine: quantized weights (scalar kernels), KV cache.
//!
//! cargo run --release -p ch06 --example generate_quantized -- --prompt "The capital of France is" -n 64 --temp 0

use ch04::Model;
use ch05::Cached;
use ch06::QuantLoader;

/// Chapter 4's command line (the `generate` example's flags and `main`).
#[path = "../../ch04-forward/examples/common/generate_flags.rs"]
mod generate_flags;

fn main() {
    generate_flags::main(
        |file| Ok(Model::load(file, &QuantLoader, &ch04::architectures())?),
        |model, args| Box::new(Cached::contiguous(model, args.ctx)),
    );
}
