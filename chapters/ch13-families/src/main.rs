//! The finished engine with every model family: chapter 10's command line, after
//! [`ch13::register`]. `cargo run --release -p ch13 -- [--model PATH] [PROMPT]`, or `--chat`.

use ch13::engine::{self, EngineArgs};
use clap::{CommandFactory, Parser};

fn main() {
    ch13::register();
    let args = EngineArgs::parse();
    if let Err(e) = ch13::cli::check(&args.generation) {
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
