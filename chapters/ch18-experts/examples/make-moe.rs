//! Make a mixture-of-experts model from a recipe into the model cache, and print its path:
//! chapter 14's program on this chapter's shapes.
//!
//! ```sh
//! cargo run --release -p ch18 --example make-moe -- qwen3-30b-a3b Q4_0
//! cargo run --release -p ch18 --example make-moe -- qwen3-30b-a3b Q4_K_M --layers 1
//! ```

#[path = "../../ch14-scaling/examples/common/make_model.rs"]
mod make_model;

fn main() -> std::process::ExitCode {
    make_model::main_with(&ch18::recipe::SHAPES)
}
