//! The finished engine with every architecture of the tower: chapter 10's command line, given
//! [`ch13::architectures`]. `cargo run --release -p ch13 -- [--model PATH] [PROMPT]`, or
//! `--chat`. (`llm-rs run` is the same.)

fn main() {
    ch13::engine::main(ch13::architectures());
}
