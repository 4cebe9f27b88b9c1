//! The production server of chapter 12: `cargo run --release -p ch12 --example production --
//! [--config FILE] [--port 8080] …`. `--help` lists the flags and their environment variables.

/// This example's flags and `main`, in a file the `metrics` example includes too.
#[path = "common/production_flags.rs"]
mod production_flags;

fn main() {
    production_flags::main(ch04::architectures());
}
