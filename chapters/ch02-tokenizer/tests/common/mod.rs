//! Loading the vocabularies the tests compare with llama.cpp.

#![allow(dead_code)] // each test file uses part of this

use ch02::Tokenizer;
use ch02::ch01::GgufFile;
use std::sync::OnceLock;

/// The vocabularies of `reference-data/tokenizer/corpus.json`, by its names for them.
pub const VOCABS: [&str; 4] = ["default", "llama-spm", "llama-bpe", "gpt-2"];

/// The GGUF file behind a vocabulary name: the default model, or one of llama.cpp's
/// vocabulary-only test files copied into `reference-data/tokenizer/`.
pub fn gguf(name: &str) -> GgufFile {
    let path = if name == "default" {
        shared::default_model_path().unwrap_or_else(|e| panic!("{e}"))
    } else {
        shared::refdata::path(&format!("tokenizer/ggml-vocab-{name}.gguf"))
            .unwrap_or_else(|e| panic!("{e}"))
    };
    GgufFile::open(&path).unwrap_or_else(|e| panic!("{e}"))
}

/// The tokenizer of a vocabulary, built once per test binary.
pub fn tokenizer(name: &str) -> &'static Tokenizer {
    static CACHE: [OnceLock<Tokenizer>; 4] = [const { OnceLock::new() }; 4];
    let i = VOCABS
        .iter()
        .position(|&v| v == name)
        .unwrap_or_else(|| panic!("unknown vocabulary {name}"));
    CACHE[i].get_or_init(|| {
        Tokenizer::from_gguf(&gguf(name).gguf)
            .unwrap_or_else(|e| panic!("building the {name} tokenizer: {e}"))
    })
}

/// Bytes from the hex the reference data writes them in.
pub fn unhex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd-length hex string {s:?}");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex digits"))
        .collect()
}

/// Show bytes as text where they are UTF-8, for failure messages.
pub fn show(bytes: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(bytes))
}
