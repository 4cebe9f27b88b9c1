//! The production server of chapter 12: `cargo run --release -p ch12 --example production --
//! [--config FILE] [--port 8080] …`. `--help` lists the flags and their environment variables.

fn main() {
    flags::production::main(ch04::architectures());
}
