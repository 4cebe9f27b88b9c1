//! The default model read by this chapter agrees with llama.cpp and gguf-py
//! (`reference-data/model/facts.json`, `reference-data/model/dequant.safetensors`).

use ch01::config::{RopeScalingType, RopeStyle};
use ch01::gguf::{Value, ValueType};
use ch01::{Config, GgufFile, dequant};
use serde_json::Value as Json;
use std::sync::OnceLock;
use testkit::refdata::{self, TensorFile};
use testkit::{Tolerance, assert_close};

/// gguf-py and this crate apply the same f32 operations in the same order (`q * d + m`, no
/// fused multiply-add), so the dequantized weights must be bit-identical.
const DEQUANT_TOL: Tolerance = Tolerance::EXACT;

fn model() -> &'static GgufFile {
    static MODEL: OnceLock<GgufFile> = OnceLock::new();
    MODEL.get_or_init(|| {
        let path = shared::default_model_path().unwrap_or_else(|e| panic!("{e}"));
        GgufFile::open(&path).unwrap_or_else(|e| panic!("{e}"))
    })
}

fn facts() -> &'static Json {
    static FACTS: OnceLock<Json> = OnceLock::new();
    FACTS.get_or_init(|| refdata::json("model/facts.json").unwrap_or_else(|e| panic!("{e}")))
}

fn fact_u64(key: &str) -> u64 {
    facts()[key]
        .as_u64()
        .unwrap_or_else(|| panic!("facts.json: {key} is not an integer"))
}

/// An f32 from gguf-py's `bits_hex` (the value's bytes, most significant first).
fn f32_from_bits_hex(hex: &Json) -> f32 {
    let hex = hex.as_str().expect("bits_hex is a string");
    f32::from_bits(u32::from_str_radix(hex, 16).expect("bits_hex is hex"))
}

#[test]
fn config_equals_llama_cpp() {
    let c = Config::from_gguf(model(), &["llama"]).unwrap();
    let f = facts();
    let api = &f["llama_api"];
    assert_eq!(c.arch, "llama");
    assert_eq!(c.d_model as u64, fact_u64("n_embd"));
    assert_eq!(c.n_layer as u64, fact_u64("n_layer"));
    assert_eq!(c.n_head as u64, fact_u64("n_head"));
    assert_eq!(c.n_head_kv as u64, fact_u64("n_head_kv"));
    assert_eq!(c.head_dim as u64, fact_u64("head_dim"));
    assert_eq!(c.n_ff as u64, fact_u64("n_ff"));
    assert_eq!(c.vocab_size as u64, fact_u64("n_vocab"));
    assert_eq!(c.context_length as u64, fact_u64("n_ctx_train"));
    assert_eq!(c.rope_dim, c.head_dim);
    assert_eq!(
        c.rope_freq_base as f64,
        f["rope_freq_base"].as_f64().unwrap()
    );
    assert_eq!(c.rms_norm_eps, f32_from_bits_hex(&f["rms_eps_bits_hex"]));
    // llama.h: LLAMA_ROPE_TYPE_NORM = 0, LLAMA_ROPE_TYPE_NEOX = 2.
    let style = match api["rope_type"].as_i64() {
        Some(0) => RopeStyle::Normal,
        Some(2) => RopeStyle::Neox,
        other => panic!("facts.json: unexpected rope_type {other:?}"),
    };
    assert_eq!(c.rope_style, style);
    // llama.cpp keeps the inverse of the scaling factor; 1 means no scaling.
    let freq_scale = api["rope_freq_scale_train"].as_f64().unwrap() as f32;
    match c.rope_scaling {
        None => assert_eq!(freq_scale, 1.0),
        Some(s) => {
            assert_eq!(s.kind, RopeScalingType::Linear);
            assert_eq!(1.0 / s.factor, freq_scale);
        }
    }
    let has_output = f["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["name"] == "output.weight");
    assert_eq!(c.tied_embeddings, !has_output);
    assert!(c.tied_embeddings, "the default model ties its embeddings");
}

#[test]
fn special_token_ids_equal_llama_cpp() {
    let m = model();
    let bos = m.get_u32("tokenizer.ggml.bos_token_id").unwrap();
    let eos = m.get_u32("tokenizer.ggml.eos_token_id").unwrap();
    assert_eq!(
        (bos as u64, eos as u64),
        (fact_u64("bos_id"), fact_u64("eos_id"))
    );
}

#[test]
fn header_equals_gguf_py() {
    let m = model();
    let g = &facts()["gguf"];
    assert_eq!(m.version as u64, g["version"].as_u64().unwrap());
    assert_eq!(m.tensors.len() as u64, g["tensor_count"].as_u64().unwrap());
    assert_eq!(m.metadata.len() as u64, g["kv_count"].as_u64().unwrap());
    assert_eq!(m.alignment, g["alignment"].as_u64().unwrap());
    assert_eq!(m.data_offset, g["data_offset"].as_u64().unwrap());
}

#[test]
fn tensor_list_equals_llama_cpp() {
    let m = model();
    let want = facts()["tensors"].as_array().unwrap();
    assert_eq!(m.tensors.len(), want.len());
    for (t, w) in m.tensors.iter().zip(want) {
        let ne: Vec<u64> = w["ne"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap())
            .collect();
        assert_eq!(t.name, w["name"].as_str().unwrap());
        assert_eq!(
            t.ggml_type.name(),
            w["type"].as_str().unwrap(),
            "{}",
            t.name
        );
        assert_eq!(
            t.ggml_type.id() as u64,
            w["type_id"].as_u64().unwrap(),
            "{}",
            t.name
        );
        assert_eq!(t.dims, ne, "{}", t.name);
        assert_eq!(t.n_bytes(), w["n_bytes"].as_u64().unwrap(), "{}", t.name);
        assert_eq!(t.offset, w["offset"].as_u64().unwrap(), "{}", t.name);
    }
    // llama.cpp's own totals over the loaded model.
    let api = &facts()["llama_api"];
    let params: u64 = m.tensors.iter().map(|t| t.n_elements()).sum();
    let bytes: u64 = m.tensors.iter().map(|t| t.n_bytes()).sum();
    assert_eq!(params, api["n_params"].as_u64().unwrap());
    assert_eq!(bytes, api["model_size_bytes"].as_u64().unwrap());
}

/// gguf-py's name for a value type.
fn gguf_py_type(t: ValueType) -> &'static str {
    match t {
        ValueType::U8 => "UINT8",
        ValueType::I8 => "INT8",
        ValueType::U16 => "UINT16",
        ValueType::I16 => "INT16",
        ValueType::U32 => "UINT32",
        ValueType::I32 => "INT32",
        ValueType::F32 => "FLOAT32",
        ValueType::Bool => "BOOL",
        ValueType::String => "STRING",
        ValueType::Array => "ARRAY",
        ValueType::U64 => "UINT64",
        ValueType::I64 => "INT64",
        ValueType::F64 => "FLOAT64",
    }
}

/// Whether a scalar value equals gguf-py's JSON rendering of it.
fn same_scalar(v: &Value, want: &Json) -> bool {
    match v {
        Value::String(s) => want.as_str() == Some(s),
        Value::Bool(b) => want.as_bool() == Some(*b),
        Value::F32(x) => want.as_f64() == Some(*x as f64),
        Value::F64(x) => want.as_f64() == Some(*x),
        v => v.as_i64() == want.as_i64() && v.as_u64() == want.as_u64(),
    }
}

#[test]
fn metadata_equals_gguf_py() {
    let m = model();
    let want = facts()["metadata"].as_object().unwrap();
    assert_eq!(m.metadata.len(), want.len());
    for (key, value) in &m.metadata {
        let w = &want
            .get(key)
            .unwrap_or_else(|| panic!("gguf-py does not list {key}"));
        assert_eq!(gguf_py_type(value.value_type()), w["type"], "{key}");
        match value {
            Value::Array(t, items) => {
                assert_eq!(gguf_py_type(*t), w["item_type"], "{key}");
                assert_eq!(items.len() as u64, w["len"].as_u64().unwrap(), "{key}");
                let first = w["first"].as_array().unwrap();
                assert!(!first.is_empty() || items.is_empty(), "{key}");
                for (i, (got, want)) in items.iter().zip(first).enumerate() {
                    assert!(same_scalar(got, want), "{key}[{i}]: {got} vs {want}");
                }
            }
            Value::F32(x) => assert_eq!(*x, f32_from_bits_hex(&w["bits_hex"]), "{key}"),
            v => assert!(same_scalar(v, &w["value"]), "{key}: {v} vs {}", w["value"]),
        }
    }
}

#[test]
fn dequantized_rows_equal_gguf_py() {
    let m = model();
    let reference = TensorFile::open("model/dequant.safetensors").unwrap_or_else(|e| panic!("{e}"));
    let names = reference.names();
    assert!(!names.is_empty(), "dequant.safetensors holds no tensors");
    let mut types = vec![];
    for name in names {
        let want = reference.f32(&name).unwrap();
        let info = m
            .tensor(&name)
            .unwrap_or_else(|| panic!("no tensor {name}"));
        let (rows, ne0) = (want.shape[0], want.shape[1]);
        assert_eq!(ne0 as u64, info.dims[0], "{name}: row length");
        // Dequantize only the first rows: their bytes are the start of the tensor's data.
        let row_bytes = info.ggml_type.row_bytes(ne0 as u64).unwrap() as usize;
        let bytes = &m.tensor_bytes(&name).unwrap()[..rows * row_bytes];
        let got = dequant::dequantize(info.ggml_type, bytes, rows * ne0).unwrap();
        assert_close(&name, &want.shape, &got, &want.data, DEQUANT_TOL);
        types.push(info.ggml_type);
    }
    // The check must cover the types the model stores.
    for t in [
        ch01::GgmlType::Q4_1,
        ch01::GgmlType::Q8_0,
        ch01::GgmlType::F32,
    ] {
        assert!(types.contains(&t), "no {t} tensor in dequant.safetensors");
    }
}

#[test]
fn whole_tensors_dequantize_to_their_element_count() {
    let m = model();
    for name in [
        "token_embd.weight",
        "blk.0.ffn_down.weight",
        "output_norm.weight",
    ] {
        let info = m.tensor(name).unwrap();
        let v = m.tensor_f32(name).unwrap();
        assert_eq!(v.len() as u64, info.n_elements(), "{name}");
        assert!(
            v.iter().all(|x| x.is_finite()),
            "{name} has non-finite weights"
        );
    }
}
