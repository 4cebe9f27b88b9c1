//! The engine's command line: `cargo run --release -p ch10 -- [--model PATH] [PROMPT]`, or
//! `--chat` for a conversation. `--help` lists the flags.

fn main() {
    ch10::engine::main(ch10::architectures());
}
