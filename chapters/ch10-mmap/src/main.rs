//! The engine's command line: `cargo run --release -p ch10 -- [--model PATH] [PROMPT]`, or
//! `--chat` for a conversation. `--help` lists the flags.

use ch10::engine::{self, EngineArgs};
use clap::{CommandFactory, Parser};

fn main() {
    let args = EngineArgs::parse();
    if !args.generation.chat && args.generation.prompt_text().is_empty() {
        EngineArgs::command()
            .error(
                clap::error::ErrorKind::MissingRequiredArgument,
                "give a PROMPT (or --prompt TEXT), or --chat for a conversation",
            )
            .exit();
    }
    if let Err(e) = engine::run(&args) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
