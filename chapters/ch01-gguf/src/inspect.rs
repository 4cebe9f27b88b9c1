//! What a GGUF file holds, as text: its header, metadata (long values cut short) and tensor
//! table, in the spirit of llama.cpp's `gguf-dump`. The `inspect` example prints it, and so
//! does the finished engine's `llm-rs inspect`.

use crate::gguf::{GgufFile, Value, ValueType};
use std::fmt::Write;

/// Array elements shown before "… N more".
const SHOW: usize = 6;

/// The header, the metadata and the tensor table of `file`, named `name`.
pub fn summary<B: AsRef<[u8]>>(file: &GgufFile<B>, name: &str) -> String {
    let g = &file.gguf;
    let mut out = String::new();
    // Writing to a String cannot fail.
    let o = &mut out;
    let _ = writeln!(o, "{name}");
    let _ = writeln!(
        o,
        "GGUF v{}, {} bytes: {} metadata keys, {} tensors, alignment {}, data section at byte {}",
        g.version,
        file.bytes().len(),
        g.metadata.len(),
        g.tensors.len(),
        g.alignment,
        g.data_offset
    );

    let _ = writeln!(o, "\nmetadata:");
    let key_width = g.metadata.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (key, value) in &g.metadata {
        let _ = writeln!(
            o,
            "  {key:<key_width$}  {:<16} {}",
            type_name(value),
            show(value)
        );
    }

    let _ = writeln!(o, "\ntensors:");
    let name_width = g.tensors.iter().map(|t| t.name.len()).max().unwrap_or(4);
    let _ = writeln!(
        o,
        "  {:>4}  {:<name_width$}  {:<6} {:<16} {:>10}",
        "#", "name", "type", "ne", "bytes"
    );
    for (i, t) in g.tensors.iter().enumerate() {
        let ne: Vec<String> = t.dims.iter().map(u64::to_string).collect();
        let _ = writeln!(
            o,
            "  {i:>4}  {:<name_width$}  {:<6} {:<16} {:>10}",
            t.name,
            t.ggml_type.name(),
            ne.join(" x "),
            t.n_bytes()
        );
    }
    let total: u64 = g.tensors.iter().map(|t| t.n_bytes()).sum();
    let params: u64 = g.tensors.iter().map(|t| t.n_elements()).sum();
    let _ = writeln!(o, "  {params} parameters in {total} bytes");
    out
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
