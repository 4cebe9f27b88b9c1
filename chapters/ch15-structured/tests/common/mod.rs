//! What several of chapter 15's tests need: the default model's tokenizer and engine, and
//! llama.cpp's accept/reject verdicts checked against one of our grammars.

#![allow(dead_code)] // each test uses some of these

use ch01::GgufFile;
use ch02::Tokenizer;
use ch08::{FastLoader, PoolKind, new_pool};
use ch10::engine::{Engine, LoadMode};
use ch10::mapped::MapOptions;
use ch15::Grammar;
use serde_json::Value;

/// The default model's tokenizer (only the file's metadata is read).
pub fn tokenizer() -> Tokenizer {
    let path = shared::default_model_path().unwrap_or_else(|e| panic!("{e}"));
    let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Tokenizer::from_gguf(&file.gguf).unwrap_or_else(|e| panic!("{e}"))
}

/// The default model as the finished engine loads it: mapped, on a pool of 2 threads.
pub fn engine() -> Engine {
    let path = shared::default_model_path().unwrap_or_else(|e| panic!("{e}"));
    Engine::load(
        &path,
        LoadMode::Map(MapOptions::default()),
        FastLoader::new(new_pool(PoolKind::Spin, 2)),
        &ch13::architectures(),
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

/// A test string of llama.cpp's data: text, or bytes that are not UTF-8 written `{"hex": ".."}`.
pub fn bytes(v: &Value) -> Vec<u8> {
    match v {
        Value::String(s) => s.as_bytes().to_vec(),
        v => {
            let hex = v["hex"].as_str().expect("a string or {hex}");
            (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
                .collect()
        }
    }
}

/// Check `grammar` against a case's `pass` and `fail` strings (llama.cpp's verdicts); returns
/// how many strings were checked. `what` names the case in a failure.
pub fn check_verdicts(grammar: &Grammar, case: &Value, what: &str) -> usize {
    let mut checked = 0;
    for (key, want) in [("pass", true), ("fail", false)] {
        for s in case[key]
            .as_array()
            .unwrap_or_else(|| panic!("{what}: no {key}"))
        {
            let verdict = if want { "accepts" } else { "rejects" };
            assert_eq!(
                grammar.matches(&bytes(s)),
                want,
                "{what}: llama.cpp {verdict} {s}, we do not"
            );
            checked += 1;
        }
    }
    checked
}
