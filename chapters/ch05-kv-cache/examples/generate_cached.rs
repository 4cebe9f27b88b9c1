//! Generate text with chapter 5's engine: f32 weights, with a KV cache.
//!
//! cargo run --release -p ch05 --example generate_cached -- --prompt "The capital of France is" -n 64 --temp 0

use ch03::DenseLoader;
use ch04::Model;
use ch05::Cached;

fn main() {
    flags::generate::main(
        |file| Ok(Model::load(file, &DenseLoader, &ch04::architectures())?),
        |model, args| Box::new(Cached::contiguous(model, args.ctx)),
    );
}
