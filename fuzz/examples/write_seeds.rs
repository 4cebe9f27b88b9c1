//! Write the seed inputs of the fuzz targets into `seeds/<target>/`: small GGUF files made by
//! ch01's test writer, a configuration and a vocabulary cut down from the default model, and
//! short texts. libFuzzer grows its corpus from these.
//!
//! ```text
//! cd fuzz && cargo run --example write_seeds
//! ```

#[allow(dead_code, unused_imports)]
#[path = "../../chapters/ch01-gguf/tests/common/mod.rs"]
mod common;

use ch01::gguf::{Value, ValueType};
use ch01::{Config, GgmlType, Gguf, GgufFile};
use ch02::Tokenizer;
use common::Builder;
use std::collections::HashSet;
use std::path::Path;

/// Tokens of the default model kept in the cut-down vocabulary: its specials and byte
/// alphabet come first, then the first merged tokens.
const KEEP_TOKENS: usize = 600;

fn main() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds");
    let model = GgufFile::open(shared::default_model_path().unwrap_or_else(|e| panic!("{e}")))
        .unwrap_or_else(|e| panic!("{e}"));
    let model_config = model_config(&model);
    let model_vocab = model_vocab(&model);

    let ggufs = [
        ("sample", common::sample().build()),
        ("sample-v2", common::sample().version(2).build()),
        ("sample-align64", common::sample().alignment(64).build()),
        ("minimal-config", minimal_config().build()),
    ];
    for (name, bytes) in &ggufs {
        write(&dir, "gguf_parse", name, bytes);
    }
    // A seed that fails early would only teach the fuzzer the error path: check each one.
    for (name, b) in [
        ("minimal", minimal_config()),
        ("explicit", explicit_config()),
        ("default-model", model_config),
    ] {
        let bytes = b.build();
        Config::from_gguf(&Gguf::parse(&bytes).unwrap(), &["llama"]).unwrap();
        write(&dir, "config", name, &bytes);
    }
    for (name, b) in [("spm", spm_vocab()), ("default-model", model_vocab)] {
        let bytes = b.build();
        let tok = Tokenizer::from_gguf(&Gguf::parse(&bytes).unwrap()).unwrap();
        let ids = tok.encode("Hello world, the end", true, true);
        println!("vocab {name}: {} tokens; {ids:?}", tok.vocab_size());
        write(&dir, "vocab", name, &bytes);
    }

    // The tokenizer target reads the first byte as flags: bit 0 add_special, bit 1 parse_special.
    let texts: &[(&str, u8, &str)] = &[
        ("plain", 0, "Hello world, it's 2024!"),
        ("whitespace", 0, "a  b\n\n\tc \r\n  "),
        ("unicode", 0, "héllo 👍 龘 \u{3000} ﬁ"),
        ("contractions", 0, "I'LL don't we're 'S"),
        ("digits", 0, "1234567 3.14159 -42"),
        (
            "chat",
            3,
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
        ),
        ("specials-as-text", 0, "<|endoftext|><|im_start|>"),
    ];
    for (name, flags, text) in texts {
        let mut bytes = vec![*flags];
        bytes.extend_from_slice(text.as_bytes());
        write(&dir, "tokenizer", name, &bytes);
    }
    // Not UTF-8: lossy decoding turns these into U+FFFD.
    write(
        &dir,
        "tokenizer",
        "invalid-utf8",
        b"\x00ab\xff\xfe\xe2\x82 c\xf0\x9f",
    );
}

fn write(dir: &Path, target: &str, name: &str, bytes: &[u8]) {
    let dir = dir.join(target);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(name), bytes).unwrap();
    println!("{target}/{name}: {} bytes", bytes.len());
}

fn strings<S: AsRef<str>>(xs: &[S]) -> Value {
    let v = xs
        .iter()
        .map(|s| Value::String(s.as_ref().into()))
        .collect();
    Value::Array(ValueType::String, v)
}

/// The keys llama.cpp requires for a llama model, and nothing optional.
fn minimal_config() -> Builder {
    Builder::new()
        .kv("general.architecture", Value::String("llama".into()))
        .kv("llama.block_count", Value::U32(2))
        .kv("llama.embedding_length", Value::U32(64))
        .kv("llama.attention.head_count", Value::U32(4))
        .kv("llama.feed_forward_length", Value::U64(128))
        .kv("llama.context_length", Value::U32(256))
        .kv("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-6))
        .kv("tokenizer.ggml.tokens", strings(&["a", "b", "c"]))
}

/// Every optional key set, and an output tensor (untied embeddings).
fn explicit_config() -> Builder {
    minimal_config()
        .kv("llama.attention.head_count_kv", Value::U32(2))
        .kv("llama.attention.key_length", Value::U32(32))
        .kv("llama.rope.dimension_count", Value::U32(32))
        .kv("llama.rope.freq_base", Value::F32(500000.0))
        .kv("llama.vocab_size", Value::U32(7))
        .kv("llama.rope.scaling.type", Value::String("yarn".into()))
        .kv("llama.rope.scaling.factor", Value::F32(4.0))
        .kv("llama.rope.scale_linear", Value::F32(2.0))
        .tensor("output.weight", &[4, 2], GgmlType::F32, vec![0; 4 * 2 * 4])
}

/// The default model's metadata without its tokenizer arrays, and without tensors.
fn model_config(model: &GgufFile) -> Builder {
    let mut b = Builder::new();
    for (k, v) in &model.metadata {
        if !matches!(v, Value::Array(..)) {
            b = b.kv(k, v.clone());
        }
    }
    b.kv("tokenizer.ggml.tokens", strings(&["a", "b", "c"]))
}

/// The default model's vocabulary cut to its first tokens and the merges among them.
fn model_vocab(model: &GgufFile) -> Builder {
    let tokens = model.get_str_array("tokenizer.ggml.tokens").unwrap();
    let tokens = &tokens[..KEEP_TOKENS];
    let kept: HashSet<&str> = tokens.iter().copied().collect();
    let merges: Vec<&str> = model
        .get_str_array("tokenizer.ggml.merges")
        .unwrap()
        .into_iter()
        .filter(|m| {
            let (l, r) = m.split_once(' ').unwrap();
            kept.contains(l) && kept.contains(r) && kept.contains(format!("{l}{r}").as_str())
        })
        .collect();
    let types = model.get_i32_array("tokenizer.ggml.token_type").unwrap();
    let types = types[..KEEP_TOKENS]
        .iter()
        .map(|&t| Value::I32(t))
        .collect();
    let mut b = Builder::new();
    for (k, v) in &model.metadata {
        if k.starts_with("tokenizer.ggml.") && !matches!(v, Value::Array(..)) {
            b = b.kv(k, v.clone());
        }
    }
    b.kv("general.name", model.get("general.name").unwrap().clone())
        .kv("tokenizer.ggml.tokens", strings(tokens))
        .kv("tokenizer.ggml.merges", strings(&merges))
        .kv(
            "tokenizer.ggml.token_type",
            Value::Array(ValueType::I32, types),
        )
}

/// A small SentencePiece vocabulary: unknown, BOS, EOS, the 256 byte tokens, a few pieces.
fn spm_vocab() -> Builder {
    let mut tokens = vec!["<unk>".to_string(), "<s>".into(), "</s>".into()];
    let mut types = vec![2, 3, 3];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
    }
    for piece in [
        "▁", "▁t", "he", "▁the", "▁a", "e", "t", "h", "a", "l", "o", "▁w", "or", "ld",
    ] {
        tokens.push(piece.into());
        types.push(1);
    }
    let scores = (0..tokens.len()).map(|i| Value::F32(-(i as f32))).collect();
    let types = types.into_iter().map(Value::I32).collect();
    Builder::new()
        .kv("tokenizer.ggml.model", Value::String("llama".into()))
        .kv("tokenizer.ggml.tokens", strings(&tokens))
        .kv(
            "tokenizer.ggml.scores",
            Value::Array(ValueType::F32, scores),
        )
        .kv(
            "tokenizer.ggml.token_type",
            Value::Array(ValueType::I32, types),
        )
        .kv("tokenizer.ggml.bos_token_id", Value::U32(1))
        .kv("tokenizer.ggml.eos_token_id", Value::U32(2))
        .kv("tokenizer.ggml.add_bos_token", Value::Bool(true))
}
