//! The server: `cargo run --release -p ch11 -- [--model PATH] [--port 8080] [--parallel N]`.
//! `--help` lists the flags.

use ch11::ServeArgs;
use clap::{CommandFactory, Parser};

fn main() {
    let args = ServeArgs::parse();
    if let Err(e) = args.check() {
        ServeArgs::command()
            .error(clap::error::ErrorKind::ValueValidation, e)
            .exit();
    }
    if let Err(e) = ch11::run(&args) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
