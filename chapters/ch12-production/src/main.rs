//! The production server: `cargo run --release -p ch12 -- [--config FILE] [--port 8080] …`.
//! `--help` lists the flags and their environment variables.

use ch12::Args;
use ch12::config::ConfigError;
use clap::CommandFactory;

fn main() {
    let args = match Args::load() {
        Ok(a) => a,
        Err(ConfigError::Clap(e)) => e.exit(),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = args.check() {
        Args::command()
            .error(clap::error::ErrorKind::ValueValidation, e)
            .exit();
    }
    ch12::init_logs(args.log_format);
    if let Err(e) = ch12::run(&args) {
        tracing::error!("{e}");
        std::process::exit(1);
    }
}
