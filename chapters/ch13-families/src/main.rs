//! The finished engine with every model family: chapter 10's command line, after
//! [`ch13::register`]. `cargo run --release -p ch13 -- [--model PATH] [PROMPT]`, or `--chat`.

fn main() {
    ch13::register();
    ch13::engine::main();
}
