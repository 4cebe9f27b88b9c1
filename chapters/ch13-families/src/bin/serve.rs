//! The production server with every model family: chapter 12's binary, after
//! [`ch13::register`]. `cargo run --release -p ch13 --bin serve -- --model PATH [--port 8080] …`.

fn main() {
    ch13::register();
    ch13::ch12::main();
}
