//! Loading the vocabularies the tests compare with llama.cpp.

#![allow(dead_code)] // each test file uses part of this

use ch01::GgufFile;
use ch02::Tokenizer;
use std::sync::OnceLock;

/// The vocabularies of `reference-data/tokenizer/corpus.json`, by its names for them: the
/// default model's, Gemma 3's, and llama.cpp's vocabulary-only test files.
pub const VOCABS: [&str; 20] = [
    "default",
    "gemma-3",
    "llama-spm",
    "llama-bpe",
    "gpt-2",
    "aquila",
    "baichuan",
    "bert-bge",
    "deepseek-coder",
    "deepseek-llm",
    "falcon",
    "gemma-4",
    "gpt-neox",
    "mpt",
    "nomic-bert-moe",
    "phi-3",
    "qwen2",
    "qwen35",
    "refact",
    "starcoder",
];

/// The GGUF file behind a vocabulary name: the default model, Gemma 3 (both fetched into the
/// cache on first use), or one of llama.cpp's vocabulary-only test files copied into
/// `reference-data/tokenizer/`.
pub fn gguf(name: &str) -> GgufFile {
    let path = match name {
        "default" => shared::default_model_path().unwrap_or_else(|e| panic!("{e}")),
        "gemma-3" => shared::ensure_cached(&shared::GEMMA3_MODEL).unwrap_or_else(|e| panic!("{e}")),
        _ => testkit::refdata::path(&format!("tokenizer/ggml-vocab-{name}.gguf"))
            .unwrap_or_else(|e| panic!("{e}")),
    };
    GgufFile::open(&path).unwrap_or_else(|e| panic!("{e}"))
}

/// The tokenizer of a vocabulary, built once per test binary.
pub fn tokenizer(name: &str) -> &'static Tokenizer {
    static CACHE: [OnceLock<Tokenizer>; VOCABS.len()] = [const { OnceLock::new() }; VOCABS.len()];
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

/// A metadata value for [`gguf_bytes`]: the few types a vocabulary uses. Strings are bytes,
/// so that a test can write what is not UTF-8.
#[derive(Debug, Clone)]
pub enum Meta {
    Str(Vec<u8>),
    U32(u32),
    Bool(bool),
    Strs(Vec<Vec<u8>>),
    F32s(Vec<f32>),
    I32s(Vec<i32>),
    U8s(Vec<u8>),
}

impl Meta {
    pub fn str(s: &str) -> Meta {
        Meta::Str(s.as_bytes().to_vec())
    }

    pub fn strs(items: &[&str]) -> Meta {
        Meta::Strs(items.iter().map(|s| s.as_bytes().to_vec()).collect())
    }
}

/// A GGUF file (version 3) of metadata only, no tensors.
pub fn gguf_bytes(kvs: &[(&str, Meta)]) -> Vec<u8> {
    // GGUF value type ids.
    const U8: u32 = 0;
    const U32: u32 = 4;
    const I32: u32 = 5;
    const F32: u32 = 6;
    const BOOL: u32 = 7;
    const STRING: u32 = 8;
    const ARRAY: u32 = 9;
    fn string(out: &mut Vec<u8>, s: &[u8]) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s);
    }
    fn array_header(out: &mut Vec<u8>, element: u32, len: usize) {
        out.extend(ARRAY.to_le_bytes());
        out.extend(element.to_le_bytes());
        out.extend((len as u64).to_le_bytes());
    }
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend(0u64.to_le_bytes()); // tensors
    out.extend((kvs.len() as u64).to_le_bytes());
    for (key, value) in kvs {
        string(&mut out, key.as_bytes());
        match value {
            Meta::Str(s) => {
                out.extend(STRING.to_le_bytes());
                string(&mut out, s);
            }
            Meta::U32(x) => {
                out.extend(U32.to_le_bytes());
                out.extend(x.to_le_bytes());
            }
            Meta::Bool(b) => {
                out.extend(BOOL.to_le_bytes());
                out.push(u8::from(*b));
            }
            Meta::Strs(items) => {
                array_header(&mut out, STRING, items.len());
                for s in items {
                    string(&mut out, s);
                }
            }
            Meta::U8s(items) => {
                array_header(&mut out, U8, items.len());
                out.extend(items);
            }
            Meta::F32s(items) => {
                array_header(&mut out, F32, items.len());
                for x in items {
                    out.extend(x.to_le_bytes());
                }
            }
            Meta::I32s(items) => {
                array_header(&mut out, I32, items.len());
                for x in items {
                    out.extend(x.to_le_bytes());
                }
            }
        }
    }
    out
}
