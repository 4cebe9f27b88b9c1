//! The production server with every model family: chapter 12's binary, after
//! [`ch13::register`]. `cargo run --release -p ch13 --bin serve -- --model PATH [--port 8080] …`.

use ch13::ch12::Args;
use ch13::ch12::config::ConfigError;
use clap::CommandFactory;

fn main() {
    ch13::register();
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
    ch13::ch12::init_logs(args.log_format);
    if let Err(e) = ch13::ch12::run(&args) {
        tracing::error!("{e}");
        std::process::exit(1);
    }
}
