//! Bad vocabularies give errors that name what is wrong, never a panic. The GGUF files are
//! written here, metadata only, with the few value types a vocabulary uses.

use ch02::ch01::Gguf;
use ch02::{ChatTemplate, Tokenizer};

enum V<'a> {
    Str(&'a str),
    U32(u32),
    Strs(&'a [&'a str]),
    F32s(&'a [f32]),
}

fn gguf_bytes(kvs: &[(&str, V)]) -> Vec<u8> {
    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend(0u64.to_le_bytes()); // tensors
    out.extend((kvs.len() as u64).to_le_bytes());
    for (key, value) in kvs {
        string(&mut out, key);
        match value {
            V::Str(s) => {
                out.extend(8u32.to_le_bytes());
                string(&mut out, s);
            }
            V::U32(x) => {
                out.extend(4u32.to_le_bytes());
                out.extend(x.to_le_bytes());
            }
            V::Strs(items) => {
                out.extend(9u32.to_le_bytes());
                out.extend(8u32.to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                for s in *items {
                    string(&mut out, s);
                }
            }
            V::F32s(items) => {
                out.extend(9u32.to_le_bytes());
                out.extend(6u32.to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                for x in *items {
                    out.extend(x.to_le_bytes());
                }
            }
        }
    }
    out
}

fn error(kvs: &[(&str, V)]) -> String {
    let gguf = Gguf::parse(&gguf_bytes(kvs)).expect("the test file parses");
    match Tokenizer::from_gguf(&gguf) {
        Ok(_) => panic!("the vocabulary was accepted"),
        Err(e) => e.to_string(),
    }
}

const TOKENS: &[&str] = &["a", "b", "ab"];

#[test]
fn a_good_file_is_accepted() {
    let kvs = [
        ("tokenizer.ggml.model", V::Str("gpt2")),
        ("tokenizer.ggml.pre", V::Str("gpt-2")),
        ("tokenizer.ggml.tokens", V::Strs(TOKENS)),
        ("tokenizer.ggml.merges", V::Strs(&["a b"])),
    ];
    let gguf = Gguf::parse(&gguf_bytes(&kvs)).unwrap();
    let tok = Tokenizer::from_gguf(&gguf).unwrap();
    assert_eq!(tok.encode("abab", false, false), [2, 2]);
}

#[test]
fn missing_token_list_names_the_key() {
    let e = error(&[
        ("tokenizer.ggml.model", V::Str("gpt2")),
        ("tokenizer.ggml.pre", V::Str("gpt-2")),
    ]);
    assert!(e.contains("tokenizer.ggml.tokens"), "{e}");
}

#[test]
fn missing_model_names_the_key() {
    let e = error(&[("tokenizer.ggml.tokens", V::Strs(TOKENS))]);
    assert!(e.contains("tokenizer.ggml.model"), "{e}");
}

#[test]
fn wrong_types_name_the_key() {
    let e = error(&[
        ("tokenizer.ggml.model", V::Str("gpt2")),
        ("tokenizer.ggml.pre", V::Str("gpt-2")),
        ("tokenizer.ggml.tokens", V::Strs(TOKENS)),
        ("tokenizer.ggml.merges", V::F32s(&[1.0])),
    ]);
    assert!(e.contains("tokenizer.ggml.merges"), "{e}");
    let e = error(&[
        ("tokenizer.ggml.model", V::Str("gpt2")),
        ("tokenizer.ggml.pre", V::Str("gpt-2")),
        ("tokenizer.ggml.tokens", V::Strs(TOKENS)),
        ("tokenizer.ggml.merges", V::Strs(&["a b"])),
        ("tokenizer.ggml.bos_token_id", V::Str("one")),
    ]);
    assert!(e.contains("tokenizer.ggml.bos_token_id"), "{e}");
}

#[test]
fn malformed_merge_names_its_index() {
    let e = error(&[
        ("tokenizer.ggml.model", V::Str("gpt2")),
        ("tokenizer.ggml.pre", V::Str("gpt-2")),
        ("tokenizer.ggml.tokens", V::Strs(TOKENS)),
        ("tokenizer.ggml.merges", V::Strs(&["a b", "ab"])),
    ]);
    assert!(
        e.contains("tokenizer.ggml.merges[1]") && e.contains("\"ab\""),
        "{e}"
    );
}

#[test]
fn unknown_tokenizer_and_pre_tokenizer_are_named() {
    let e = error(&[
        ("tokenizer.ggml.model", V::Str("t5")),
        ("tokenizer.ggml.tokens", V::Strs(TOKENS)),
    ]);
    assert!(e.contains("\"t5\""), "{e}");
    let e = error(&[
        ("tokenizer.ggml.model", V::Str("gpt2")),
        ("tokenizer.ggml.pre", V::Str("deepseek-llm")),
        ("tokenizer.ggml.tokens", V::Strs(TOKENS)),
        ("tokenizer.ggml.merges", V::Strs(&["a b"])),
    ]);
    assert!(e.contains("\"deepseek-llm\""), "{e}");
}

#[test]
fn short_scores_name_both_lengths() {
    let e = error(&[
        ("tokenizer.ggml.model", V::Str("llama")),
        ("tokenizer.ggml.tokens", V::Strs(TOKENS)),
        ("tokenizer.ggml.scores", V::F32s(&[0.0, 0.0])),
    ]);
    assert!(
        e.contains("tokenizer.ggml.scores has 2 entries") && e.contains("has 3"),
        "{e}"
    );
}

#[test]
fn out_of_range_ids_are_errors_when_detokenizing() {
    let kvs = [
        ("tokenizer.ggml.model", V::Str("gpt2")),
        ("tokenizer.ggml.pre", V::Str("gpt-2")),
        ("tokenizer.ggml.tokens", V::Strs(TOKENS)),
        ("tokenizer.ggml.merges", V::Strs(&["a b"])),
    ];
    let tok = Tokenizer::from_gguf(&Gguf::parse(&gguf_bytes(&kvs)).unwrap()).unwrap();
    let e = tok
        .detokenize(&[0, 7], false, true)
        .unwrap_err()
        .to_string();
    assert!(e.contains("token id 7") && e.contains("3 tokens"), "{e}");
    // decode, which has no error path, marks the bad id instead of dropping it silently.
    assert_eq!(tok.decode(&[0, 7, 1]), "a\u{FFFD}b");
    assert!(tok.token_to_piece(7).is_empty());
}

#[test]
fn chat_template_errors_name_the_problem() {
    let kvs = [
        ("tokenizer.ggml.tokens", V::Strs(TOKENS)),
        ("tokenizer.ggml.bos_token_id", V::U32(9)),
        ("tokenizer.chat_template", V::Str("{{ bos_token }}")),
    ];
    let gguf = Gguf::parse(&gguf_bytes(&kvs)).unwrap();
    let e = ChatTemplate::from_gguf(&gguf).err().unwrap().to_string();
    assert!(e.contains("token id 9"), "{e}");
    let gguf = Gguf::parse(&gguf_bytes(&kvs[..1])).unwrap();
    let e = ChatTemplate::from_gguf(&gguf).err().unwrap().to_string();
    assert!(e.contains("tokenizer.chat_template"), "{e}");
}
