//! The server of chapter 11: `cargo run --release -p ch11 --example server -- [--model PATH]
//! [--port 8080] [--parallel N]`. `--help` lists the flags.

fn main() {
    flags::server::main(ch04::architectures());
}
