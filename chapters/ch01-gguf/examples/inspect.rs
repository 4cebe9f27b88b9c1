//! Print what a GGUF file holds: metadata, tensor table and the model configuration, in the
//! spirit of llama.cpp's `gguf-dump`.
//!
//! ```text
//! cargo run -p ch01 --example inspect -- [PATH]
//! ```
//!
//! Without a path it inspects the default model (fetching it on first use).

use ch01::{Config, GgufFile, inspect};
use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let path = match std::env::args_os().nth(1) {
        Some(p) => PathBuf::from(p),
        None => match shared::default_model_path() {
            Ok(p) => p,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    let file = match GgufFile::open(&path) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    print!("{}", inspect::summary(&file, &name));
    let g = &file.gguf;

    println!("\nconfig:");
    // Every architecture names the common keys as llama does, so read them whatever it is.
    let arch = g.architecture().unwrap_or("llama");
    match Config::from_gguf(g, &[arch]) {
        Ok(c) => print!("{c}"),
        Err(e) => println!("  (none: {e})"),
    }
    ExitCode::SUCCESS
}
