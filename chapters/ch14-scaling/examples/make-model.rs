//! Make a 7–9B-shaped model from a recipe into the model cache, and print its path.
//!
//! ```sh
//! cargo run --release -p ch14 --example make-model -- llama3-8b Q4_0
//! cargo run --release -p ch14 --example make-model -- qwen2-7b Q4_K_M --layers 2
//! cargo run --release -p ch14 --example make-model -- qwen3-8b Q8_0
//! ```
//!
//! A file already in the cache is reused (its name holds the shape, layers, type, seed and
//! recipe version); `--out PATH` writes somewhere else instead.

#[path = "common/make_model.rs"]
mod make_model;

fn main() -> std::process::ExitCode {
    make_model::main_with(&ch14::large::SHAPES)
}
