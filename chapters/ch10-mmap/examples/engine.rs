//! The finished engine of chapter 10: `cargo run --release -p ch10 --example engine --
//! [--model PATH] [PROMPT]`, or `--chat` for a conversation. `--help` lists the flags.

/// This example's flags, in a file the finished engine's `llm-rs run` includes too.
#[path = "common/engine_flags.rs"]
mod engine_flags;

use ch10::engine;
use clap::{CommandFactory, Parser};
use engine_flags::Engine;
use engine_flags::generate_flags;

fn main() {
    let mut args = Engine::parse().args(ch04::architectures());
    if let Err(e) = ch04::cli::check(&args.generation) {
        Engine::command()
            .error(
                clap::error::ErrorKind::MissingRequiredArgument,
                e.to_string(),
            )
            .exit();
    }
    generate_flags::default_model(&mut args.generation);
    if let Err(e) = engine::run(&args) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
