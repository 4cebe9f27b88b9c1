//! The production server: `cargo run --release -p ch12 -- [--config FILE] [--port 8080] …`.
//! `--help` lists the flags and their environment variables.

fn main() {
    ch12::main(ch12::architectures());
}
