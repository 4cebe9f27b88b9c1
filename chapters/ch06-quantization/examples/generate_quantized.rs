//! Generate text with chapter 6's engine: quantized weights (scalar kernels), KV cache.
//!
//! cargo run --release -p ch06 --example generate_quantized -- --prompt "The capital of France is" -n 64 --temp 0

use ch06::{Cached, Model, QuantLoader};

fn main() {
    flags::generate::main(
        |file| Ok(Model::load(file, &QuantLoader, &ch06::architectures())?),
        |model, args| Box::new(Cached::contiguous(model, args.ctx)),
    );
}
