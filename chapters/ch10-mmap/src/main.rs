//! The engine's command line: `cargo run --release -p ch10 -- [--model PATH] [PROMPT]`, or
//! `--chat` for a conversation. `--help` lists the flags.

use ch10::engine::{self, EngineArgs};
use clap::{CommandFactory, Parser};

fn main() {
    let args = EngineArgs::parse();
    if let Err(e) = ch10::cli::check(&args.generation) {
        EngineArgs::command()
            .error(
                clap::error::ErrorKind::MissingRequiredArgument,
                e.to_string(),
            )
            .exit();
    }
    if let Err(e) = engine::run(&args) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
