//! Print what a GGUF file holds: metadata, tensor table and the model configuration, in the
//! spirit of llama.cpp's `gguf-dump`.
//!
//! ```text
//! cargo run -p ch01 --example inspect -- [PATH]
//! ```
//!
//! Without a path it inspects the default model (fetching it on first use).

use ch01::gguf::{Value, ValueType};
use ch01::{Config, GgufFile};
use std::path::PathBuf;
use std::process::ExitCode;

/// Array elements shown before "… N more".
const SHOW: usize = 6;

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
    let g = &file.gguf;
    println!("{}", path.file_name().unwrap_or_default().to_string_lossy());
    println!(
        "GGUF v{}, {} bytes: {} metadata keys, {} tensors, alignment {}, data section at byte {}",
        g.version,
        file.bytes().len(),
        g.metadata.len(),
        g.tensors.len(),
        g.alignment,
        g.data_offset
    );

    println!("\nmetadata:");
    let key_width = g.metadata.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (key, value) in &g.metadata {
        println!(
            "  {key:<key_width$}  {:<16} {}",
            type_name(value),
            show(value)
        );
    }

    println!("\ntensors:");
    let name_width = g.tensors.iter().map(|t| t.name.len()).max().unwrap_or(4);
    println!(
        "  {:>4}  {:<name_width$}  {:<6} {:<16} {:>10}",
        "#", "name", "type", "ne", "bytes"
    );
    for (i, t) in g.tensors.iter().enumerate() {
        let ne: Vec<String> = t.dims.iter().map(u64::to_string).collect();
        println!(
            "  {i:>4}  {:<name_width$}  {:<6} {:<16} {:>10}",
            t.name,
            t.ggml_type.name(),
            ne.join(" x "),
            t.n_bytes()
        );
    }
    let total: u64 = g.tensors.iter().map(|t| t.n_bytes()).sum();
    let params: u64 = g.tensors.iter().map(|t| t.n_elements()).sum();
    println!("  {params} parameters in {total} bytes");

    println!("\nconfig:");
    // Every architecture names the common keys as llama does, so read them whatever it is.
    let arch = g.architecture().unwrap_or("llama");
    match Config::from_gguf(g, &[arch]) {
        Ok(c) => print!("{c}"),
        Err(e) => println!("  (none: {e})"),
    }
    ExitCode::SUCCESS
}

/// `u32`, `string`, `[string; 49152]`.
fn type_name(v: &Value) -> String {
    match v {
        Value::Array(t, items) => format!("[{t}; {}]", items.len()),
        v => v.value_type().to_string(),
    }
}

/// The value, with long strings and arrays cut short.
fn show(v: &Value) -> String {
    match v {
        Value::String(s) => short_str(s),
        Value::Array(ValueType::String, items) if items.len() > SHOW => {
            let head: Vec<String> = items
                .iter()
                .take(SHOW)
                .map(|s| short_str(s.as_str().unwrap_or_default()))
                .collect();
            format!("[{}, … {} more]", head.join(", "), items.len() - SHOW)
        }
        Value::Array(_, items) if items.len() > SHOW => {
            let head: Vec<String> = items.iter().take(SHOW).map(show).collect();
            format!("[{}, … {} more]", head.join(", "), items.len() - SHOW)
        }
        Value::Array(_, items) => {
            let all: Vec<String> = items.iter().map(show).collect();
            format!("[{}]", all.join(", "))
        }
        v => v.to_string(),
    }
}

/// A string in quotes, cut to 60 characters (chat templates run to kilobytes).
fn short_str(s: &str) -> String {
    const MAX: usize = 60;
    if s.chars().count() <= MAX {
        format!("{s:?}")
    } else {
        let head: String = s.chars().take(MAX).collect();
        format!("{head:?}… ({} chars)", s.chars().count())
    }
}
