//! A GGUF file as `reference-data/checkpoints/converted.json` records what llama.cpp's
//! `convert_hf_to_gguf.py` wrote: every metadata key's type and value (an array of more than
//! [`SHORT_ARRAY`] elements, or a string of more than [`LONG_STRING`] characters, by its length
//! and the sha256 of its bytes), every tensor's type, shape (ggml's order) and the sha256 of
//! its bytes — and the differences between two such records.

use ch01::Value;
use ch01::gguf::ValueType;
use serde_json::{Map, Value as Json, json};
use sha2::{Digest, Sha256};

/// The export's limits (`SHORT_ARRAY` and `LONG_STRING` in its `checkpoints.py`).
const SHORT_ARRAY: usize = 16;
const LONG_STRING: usize = 200;

pub fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn type_name(t: ValueType) -> &'static str {
    match t {
        ValueType::U8 => "u8",
        ValueType::I8 => "i8",
        ValueType::U16 => "u16",
        ValueType::I16 => "i16",
        ValueType::U32 => "u32",
        ValueType::I32 => "i32",
        ValueType::U64 => "u64",
        ValueType::I64 => "i64",
        ValueType::F32 => "f32",
        ValueType::F64 => "f64",
        ValueType::Bool => "bool",
        ValueType::String => "string",
        ValueType::Array => "array",
    }
}

/// A scalar as JSON (an f32 as the f64 of the same value, as the export writes it).
fn scalar(v: &Value) -> Json {
    match v {
        Value::U8(x) => json!(x),
        Value::I8(x) => json!(x),
        Value::U16(x) => json!(x),
        Value::I16(x) => json!(x),
        Value::U32(x) => json!(x),
        Value::I32(x) => json!(x),
        Value::U64(x) => json!(x),
        Value::I64(x) => json!(x),
        Value::F32(x) => json!(*x as f64),
        Value::F64(x) => json!(x),
        Value::Bool(x) => json!(x),
        Value::String(s) => json!(s),
        Value::Array(..) => panic!("an array of arrays"),
    }
}

/// An array element's bytes as GGUF stores them: a string as its u64 length and bytes, a
/// number little-endian, a bool as one byte.
fn put(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.extend(x.to_le_bytes()),
        Value::U16(x) => out.extend(x.to_le_bytes()),
        Value::I16(x) => out.extend(x.to_le_bytes()),
        Value::U32(x) => out.extend(x.to_le_bytes()),
        Value::I32(x) => out.extend(x.to_le_bytes()),
        Value::U64(x) => out.extend(x.to_le_bytes()),
        Value::I64(x) => out.extend(x.to_le_bytes()),
        Value::F32(x) => out.extend(x.to_le_bytes()),
        Value::F64(x) => out.extend(x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::String(s) => {
            out.extend((s.len() as u64).to_le_bytes());
            out.extend(s.as_bytes());
        }
        Value::Array(..) => panic!("an array of arrays"),
    }
}

/// One metadata value as the record holds it.
pub fn metadata_entry(v: &Value) -> Json {
    match v {
        Value::Array(t, items) => {
            let ty = format!("array[{}]", type_name(*t));
            if items.len() > SHORT_ARRAY {
                let mut bytes = Vec::new();
                items.iter().for_each(|i| put(&mut bytes, i));
                json!({"type": ty, "len": items.len(), "sha256": sha256(&bytes)})
            } else {
                json!({"type": ty, "value": items.iter().map(scalar).collect::<Vec<_>>()})
            }
        }
        Value::String(s) if s.chars().count() > LONG_STRING => {
            json!({"type": "string", "len": s.chars().count(), "sha256": sha256(s.as_bytes())})
        }
        v => json!({"type": type_name(v.value_type()), "value": scalar(v)}),
    }
}

/// Whether two recorded values are the same: f32 values compared as f32 (the JSON holds
/// each as the nearest f64, which names one f32 however it is printed), the rest exactly.
pub fn same_value(a: &Json, b: &Json) -> bool {
    let f32s = |v: &Json| -> Option<Vec<u32>> {
        let ty = v["type"].as_str()?;
        if ty != "f32" && ty != "array[f32]" || v.get("value").is_none() {
            return None;
        }
        let one = |x: &Json| x.as_f64().map(|f| (f as f32).to_bits());
        match &v["value"] {
            Json::Array(xs) => xs.iter().map(one).collect(),
            x => one(x).map(|b| vec![b]),
        }
    };
    match (f32s(a), f32s(b)) {
        (Some(x), Some(y)) => a["type"] == b["type"] && x == y,
        _ => a == b,
    }
}

/// The keys whose values differ between two records' metadata, each with both values
/// (`null` for a key one side does not write).
pub fn metadata_differences(
    ours: &Map<String, Json>,
    theirs: &Map<String, Json>,
) -> Vec<(String, String)> {
    let mut keys: Vec<&String> = ours.keys().chain(theirs.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter_map(|k| match (ours.get(k), theirs.get(k)) {
            (Some(a), Some(b)) if same_value(a, b) => None,
            (a, b) => Some((
                k.clone(),
                format!(
                    "ours {}, llama.cpp's {}",
                    a.unwrap_or(&Json::Null),
                    b.unwrap_or(&Json::Null)
                ),
            )),
        })
        .collect()
}
