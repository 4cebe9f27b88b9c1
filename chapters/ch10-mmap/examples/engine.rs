//! The finished engine of chapter 10: `cargo run --release -p ch10 --example engine --
//! [--model PATH] [PROMPT]`, or `--chat` for a conversation. `--help` lists the flags.

fn main() {
    flags::engine::main(ch04::architectures());
}
