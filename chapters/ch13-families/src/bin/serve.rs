//! The production server with every architecture of the tower: chapter 12's binary, given
//! [`ch13::architectures`]. `cargo run --release -p ch13 --bin serve -- --model PATH [--port
//! 8080] …` (`llm-rs serve` is the same).

fn main() {
    ch13::ch12::main(ch13::architectures());
}
