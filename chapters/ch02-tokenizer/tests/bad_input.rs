//! Bad vocabularies give errors that name what is wrong, never a panic; what a file may ask
//! for (token count, token length, template work) is bounded. The GGUF files are written by
//! `common::gguf_bytes`, metadata only.

mod common;

use ch01::Gguf;
use ch02::chat::{MAX_RENDERED_BYTES, MAX_TEMPLATE_FUEL};
use ch02::vocab::{MAX_TOKEN_BYTES, MAX_VOCAB_TOKENS};
use ch02::{ChatTemplate, Message, Tokenizer, TokenizerError, Vocab, VocabOptions};
use common::{Meta, gguf_bytes};

fn error(kvs: &[(&str, Meta)]) -> String {
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
        ("tokenizer.ggml.model", Meta::str("gpt2")),
        ("tokenizer.ggml.pre", Meta::str("gpt-2")),
        ("tokenizer.ggml.tokens", Meta::strs(TOKENS)),
        ("tokenizer.ggml.merges", Meta::strs(&["a b"])),
    ];
    let gguf = Gguf::parse(&gguf_bytes(&kvs)).unwrap();
    let tok = Tokenizer::from_gguf(&gguf).unwrap();
    assert_eq!(tok.encode("abab", false, false), [2, 2]);
}

#[test]
fn missing_token_list_names_the_key() {
    let e = error(&[
        ("tokenizer.ggml.model", Meta::str("gpt2")),
        ("tokenizer.ggml.pre", Meta::str("gpt-2")),
    ]);
    assert!(e.contains("tokenizer.ggml.tokens"), "{e}");
}

#[test]
fn missing_model_names_the_key() {
    let e = error(&[("tokenizer.ggml.tokens", Meta::strs(TOKENS))]);
    assert!(e.contains("tokenizer.ggml.model"), "{e}");
}

#[test]
fn wrong_types_name_the_key() {
    let e = error(&[
        ("tokenizer.ggml.model", Meta::str("gpt2")),
        ("tokenizer.ggml.pre", Meta::str("gpt-2")),
        ("tokenizer.ggml.tokens", Meta::strs(TOKENS)),
        ("tokenizer.ggml.merges", Meta::F32s(vec![1.0])),
    ]);
    assert!(e.contains("tokenizer.ggml.merges"), "{e}");
    let e = error(&[
        ("tokenizer.ggml.model", Meta::str("gpt2")),
        ("tokenizer.ggml.pre", Meta::str("gpt-2")),
        ("tokenizer.ggml.tokens", Meta::strs(TOKENS)),
        ("tokenizer.ggml.merges", Meta::strs(&["a b"])),
        ("tokenizer.ggml.bos_token_id", Meta::str("one")),
    ]);
    assert!(e.contains("tokenizer.ggml.bos_token_id"), "{e}");
}

#[test]
fn malformed_merge_names_its_index() {
    let e = error(&[
        ("tokenizer.ggml.model", Meta::str("gpt2")),
        ("tokenizer.ggml.pre", Meta::str("gpt-2")),
        ("tokenizer.ggml.tokens", Meta::strs(TOKENS)),
        ("tokenizer.ggml.merges", Meta::strs(&["a b", "ab"])),
    ]);
    assert!(
        e.contains("tokenizer.ggml.merges[1]") && e.contains("\"ab\""),
        "{e}"
    );
}

#[test]
fn unknown_tokenizer_and_pre_tokenizer_are_named() {
    let e = error(&[
        ("tokenizer.ggml.model", Meta::str("rwkv")),
        ("tokenizer.ggml.tokens", Meta::strs(TOKENS)),
    ]);
    assert!(e.contains("\"rwkv\""), "{e}");
    let e = error(&[
        ("tokenizer.ggml.model", Meta::str("gpt2")),
        ("tokenizer.ggml.pre", Meta::str("no-such-rule")),
        ("tokenizer.ggml.tokens", Meta::strs(TOKENS)),
        ("tokenizer.ggml.merges", Meta::strs(&["a b"])),
    ]);
    assert!(e.contains("\"no-such-rule\""), "{e}");
}

#[test]
fn a_missing_pre_tokenizer_is_llama_cpp_default_rule() {
    let kvs = [
        ("tokenizer.ggml.model", Meta::str("gpt2")),
        ("tokenizer.ggml.tokens", Meta::strs(TOKENS)),
        ("tokenizer.ggml.merges", Meta::strs(&["a b"])),
    ];
    let tok = Tokenizer::from_gguf(&Gguf::parse(&gguf_bytes(&kvs)).unwrap()).unwrap();
    assert_eq!(tok.pre_tokenizer(), Some(ch02::PreTokenizer::Default));
}

#[test]
fn a_character_map_too_short_for_its_header_is_named() {
    let mut blob = 64u32.to_le_bytes().to_vec();
    blob.extend([0; 8]);
    let e = error(&[
        ("tokenizer.ggml.model", Meta::str("t5")),
        ("tokenizer.ggml.tokens", Meta::strs(TOKENS)),
        ("tokenizer.ggml.precompiled_charsmap", Meta::U8s(blob)),
    ]);
    assert!(
        e.contains("tokenizer.ggml.precompiled_charsmap has 12 bytes"),
        "{e}"
    );
    let e = error(&[
        ("tokenizer.ggml.model", Meta::str("t5")),
        ("tokenizer.ggml.tokens", Meta::strs(TOKENS)),
        (
            "tokenizer.ggml.precompiled_charsmap",
            Meta::str("not bytes"),
        ),
    ]);
    assert!(e.contains("tokenizer.ggml.precompiled_charsmap"), "{e}");
}

#[test]
fn short_scores_name_both_lengths() {
    let e = error(&[
        ("tokenizer.ggml.model", Meta::str("llama")),
        ("tokenizer.ggml.tokens", Meta::strs(TOKENS)),
        ("tokenizer.ggml.scores", Meta::F32s(vec![0.0, 0.0])),
    ]);
    assert!(
        e.contains("tokenizer.ggml.scores has 2 entries") && e.contains("has 3"),
        "{e}"
    );
}

#[test]
fn out_of_range_ids_are_errors_when_detokenizing() {
    let kvs = [
        ("tokenizer.ggml.model", Meta::str("gpt2")),
        ("tokenizer.ggml.pre", Meta::str("gpt-2")),
        ("tokenizer.ggml.tokens", Meta::strs(TOKENS)),
        ("tokenizer.ggml.merges", Meta::strs(&["a b"])),
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
        ("tokenizer.ggml.tokens", Meta::strs(TOKENS)),
        ("tokenizer.ggml.bos_token_id", Meta::U32(9)),
        ("tokenizer.chat_template", Meta::str("{{ bos_token }}")),
    ];
    let gguf = Gguf::parse(&gguf_bytes(&kvs)).unwrap();
    let e = ChatTemplate::from_gguf(&gguf).err().unwrap().to_string();
    assert!(
        e.contains("tokenizer.ggml.bos_token_id is 9") && e.contains("3 tokens"),
        "{e}"
    );
    let gguf = Gguf::parse(&gguf_bytes(&kvs[..1])).unwrap();
    let e = ChatTemplate::from_gguf(&gguf).err().unwrap().to_string();
    assert!(e.contains("tokenizer.chat_template"), "{e}");
}

#[test]
fn arrays_of_another_length_than_the_tokens_name_both_lengths() {
    let e = error(&[
        ("tokenizer.ggml.model", Meta::str("llama")),
        ("tokenizer.ggml.tokens", Meta::strs(TOKENS)),
        ("tokenizer.ggml.token_type", Meta::I32s(vec![1; 5])),
    ]);
    assert!(
        e.contains("tokenizer.ggml.token_type has 5 entries") && e.contains("has 3"),
        "{e}"
    );
}

#[test]
fn a_token_past_the_length_limit_is_named_with_its_length() {
    let long = "a".repeat(MAX_TOKEN_BYTES + 1);
    let e = error(&[
        ("tokenizer.ggml.model", Meta::str("llama")),
        ("tokenizer.ggml.tokens", Meta::strs(&["a", &long])),
    ]);
    let want = format!(
        "token 1 is {} bytes long, more than the limit of {MAX_TOKEN_BYTES} bytes",
        MAX_TOKEN_BYTES + 1
    );
    assert!(e.contains(&want), "{e}");
}

fn strings(n: usize, f: impl Fn(usize) -> String) -> Vec<String> {
    (0..n).map(f).collect()
}

#[test]
fn vocabulary_size_is_bounded_and_gemma_sized_vocabularies_fit() {
    // Gemma 3's SentencePiece vocabulary has 262 144 tokens.
    let gemma = strings(262_144, |i| format!("t{i}"));
    let v = Vocab::new(
        "llama",
        gemma,
        vec![],
        vec![],
        vec![],
        &VocabOptions::default(),
    );
    assert_eq!(v.map(|v| v.len()).ok(), Some(262_144));
    let too_many = strings(MAX_VOCAB_TOKENS + 1, |i| format!("t{i}"));
    let e = Vocab::new(
        "llama",
        too_many,
        vec![],
        vec![],
        vec![],
        &VocabOptions::default(),
    );
    assert!(
        matches!(e, Err(TokenizerError::TooManyTokens { n_tokens, limit })
            if n_tokens == MAX_VOCAB_TOKENS + 1 && limit == MAX_VOCAB_TOKENS),
        "{e:?}"
    );
}

/// A byte-level vocabulary whose tokens are the bytes `a` and `b`, plus `extra` as `kind`.
fn with_token(extra: &str, kind: i32) -> Tokenizer {
    let opts = VocabOptions {
        pre: Some("smollm".into()),
        ..VocabOptions::default()
    };
    let tokens = vec!["a".to_string(), "b".to_string(), extra.to_string()];
    let vocab = Vocab::new(
        "gpt2",
        tokens,
        vec![1, 1, kind],
        vec![],
        vec!["a b".into()],
        &opts,
    );
    Tokenizer::new(vocab.unwrap_or_else(|e| panic!("{e}")))
}

#[test]
fn tokens_at_the_length_limit_load_and_decode_in_linear_size() {
    // A user-defined token is recognised in text and decodes to itself.
    let long: String = "ab".repeat(MAX_TOKEN_BYTES / 2);
    let tok = with_token(&long, 4);
    let text = format!("a{long}b");
    let ids = tok.encode(&text, false, false);
    assert_eq!(ids, [0, 2, 1]);
    assert_eq!(tok.decode(&ids), text);

    // A normal token of characters outside the byte alphabet (spaces are `Ġ` there): each
    // becomes a marker. llama.cpp copies the whole token text into every marker, a piece of
    // 16 384 × 16 399 bytes; here the piece stays a small multiple of the token.
    let spaces = " ".repeat(MAX_TOKEN_BYTES);
    let tok = with_token(&spaces, 1);
    let piece = tok.token_to_piece(2);
    let marker = b"[UNK_BYTE_0x20]";
    assert_eq!(
        piece.len(),
        marker.len() * MAX_TOKEN_BYTES + MAX_TOKEN_BYTES,
        "one marker per space, the token text once"
    );
    assert!(piece.starts_with(b"[UNK_BYTE_0x20 "));
    assert!(piece.ends_with(marker));
    // As in llama.cpp, a token with one such character is its marker with the text.
    assert_eq!(
        with_token("a™", 1).token_to_piece(2),
        "a[UNK_BYTE_0xe284a2a™]".as_bytes()
    );
}

#[test]
fn a_long_run_of_tokens_decodes_in_linear_time() {
    // The gpt-2 vocabulary cleans up spaces, so the stream decoder holds every space back
    // (a comma may follow). Looking through all held bytes on every token took quadratic
    // time: 40 seconds for this run; now a few milliseconds.
    let tok = common::tokenizer("gpt-2");
    let space = tok
        .vocab()
        .text_to_token("Ġ")
        .expect("gpt-2 has a space token");
    let ids = vec![space; 200_000];
    assert_eq!(tok.decode(&ids), " ".repeat(200_000));
}

#[test]
fn a_template_that_never_ends_runs_out_of_fuel() {
    let endless =
        "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}";
    // At the top, inside a macro, inside a captured block: the same error.
    for source in [
        endless.to_string(),
        format!("{{% macro f() %}}{endless}{{% endmacro %}}{{{{ f() }}}}"),
        format!("{{% set x %}}{endless}{{% endset %}}{{{{ x }}}}"),
    ] {
        let t = ChatTemplate::new(&source, "", "").unwrap();
        let e = t.render(&[], true).unwrap_err();
        assert!(
            matches!(e, TokenizerError::TemplateOutOfFuel { limit } if limit == MAX_TEMPLATE_FUEL),
            "{source}: {e:?}"
        );
        let want = format!("{MAX_TEMPLATE_FUEL} instructions (MAX_TEMPLATE_FUEL)");
        assert!(e.to_string().contains(&want), "{e}");
    }
}

#[test]
fn a_template_that_writes_without_end_is_cut_at_the_size_limit() {
    // Each round writes 1 MB: the fuel would allow gigabytes.
    let source = "{% for a in range(100000) %}{{ 'x' * 1000000 }}{% endfor %}";
    let t = ChatTemplate::new(source, "", "").unwrap();
    let e = t.render(&[Message::new("user", "hi")], true).unwrap_err();
    assert!(
        matches!(e, TokenizerError::TemplateOutputTooLong { limit } if limit == MAX_RENDERED_BYTES),
        "{e:?}"
    );
    let want = format!("{MAX_RENDERED_BYTES} bytes (MAX_RENDERED_BYTES)");
    assert!(e.to_string().contains(&want), "{e}");
    // Just under the limit is fine.
    let source = format!("{{{{ 'x' * {MAX_RENDERED_BYTES} }}}}");
    let t = ChatTemplate::new(&source, "", "").unwrap();
    assert_eq!(
        t.render(&[], true).map(|s| s.len()).ok(),
        Some(MAX_RENDERED_BYTES)
    );
}
