//! Generate text with chapter 4's engine: f32 weights, no KV cache (slow on purpose).
//!
//! cargo run --release -p ch04 --example generate -- --prompt "The capital of France is" -n 16 --temp 0

use ch03::DenseLoader;
use ch04::{Model, Uncached};

/// This example's flags and `main`, in a file the later chapters' examples include too.
#[path = "common/generate_flags.rs"]
mod generate_flags;

fn main() {
    generate_flags::main(
        |file| Ok(Model::load(file, &DenseLoader, &ch04::architectures())?),
        |model, _| Box::new(Uncached::new(model)),
    );
}
