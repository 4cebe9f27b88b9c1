//! The server of chapter 11: `cargo run --release -p ch11 --example server -- [--model PATH]
//! [--port 8080] [--parallel N]`. `--help` lists the flags.

/// This example's flags and `main`, in a file the `exchange` example and bigger servers
/// include too.
#[path = "common/server_flags.rs"]
mod server_flags;

fn main() {
    server_flags::main(ch04::architectures());
}
