//! Generated hostile input. Vocabularies from arbitrary metadata that still parses as GGUF
//! (empty, duplicate, non-UTF-8 and very long tokens, token types and scores of any value
//! and length, merges of tokens that do not exist, special ids anywhere, Unigram character
//! maps whose trie points anywhere, every kind of tokenizer and pre-tokenizer), and chat templates
//! glued from fragments of Jinja. Building, encoding, decoding and rendering give a value or
//! an error, never a panic. Vocabularies built like trained ones, with every byte a token and
//! every merge result a token, give back any text they encode.

mod common;

use ch01::Gguf;
use ch02::chat::{MAX_RENDERED_BYTES, MAX_TEMPLATE_FUEL};
use ch02::unicode::byte_level_encode;
use ch02::{ChatTemplate, Message, StreamDecoder, Tokenizer};
use common::{Meta, gguf_bytes};
use proptest::prelude::*;
use proptest::sample::{Index, select};
use std::collections::HashSet;

/// Texts that vocabularies give special meaning: end-of-generation and chat markers, the
/// texts gpt-oss's rules look for, SentencePiece's byte and control tokens.
const SPECIAL_TEXTS: &[&str] = &[
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|channel|>",
    "<|eom_id|>",
    "<|fim_prefix|>",
    "<PAD>",
    "<s>",
    "</s>",
    "<unk>",
    "[EOT]",
    "<tool>",
    "<unused0>",
];

/// `tokenizer.ggml.pre` values: rules of every kind (scanners, regexes, SentencePiece-style)
/// and a few that do not exist.
const PRES: &[&str] = &[
    "gpt-2",
    "smollm",
    "starcoder",
    "llama3",
    "dbrx",
    "qwen2",
    "qwen35",
    "stablelm2",
    "command-r",
    "deepseek-llm",
    "deepseek-v3",
    "falcon",
    "gpt-4o",
    "tekken",
    "kimi-k2",
    "afmoe",
    "tiny_aya",
    "chameleon",
    "poro-chat",
    "superbpe",
    "jais-2",
    "exaone-moe",
    "gemma4",
    "sarvam-moe",
    "whitespace",
    "",
    "no-such-rule",
];

/// A SentencePiece character map: its header (the trie's size, sometimes wrong), trie nodes
/// (random: any index may point anywhere) and replacement strings (NUL-terminated or not).
fn charsmap() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => (
            prop::collection::vec(any::<u32>(), 0..48),
            prop::collection::vec(prop_oneof![Just(0u8), any::<u8>()], 0..24),
            prop::option::of(any::<u32>()),
        )
            .prop_map(|(nodes, strings, size)| {
                let size = size.unwrap_or(nodes.len() as u32 * 4);
                let mut blob = size.to_le_bytes().to_vec();
                blob.extend(nodes.iter().flat_map(|n| n.to_le_bytes()));
                blob.extend(strings);
                blob
            }),
        1 => prop::collection::vec(any::<u8>(), 0..12),
    ]
}

/// The `tokenizer.ggml.*_token_id` keys, with the deprecated fill-in-the-middle ones.
const ID_KEYS: &[&str] = &[
    "bos",
    "eos",
    "eot",
    "eom",
    "unknown",
    "seperator",
    "padding",
    "mask",
    "fim_pre",
    "fim_suf",
    "fim_mid",
    "fim_pad",
    "fim_rep",
    "fim_sep",
    "prefix",
    "suffix",
    "middle",
];

fn token() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        // Short texts from a small alphabet: they collide, merge and spell each other.
        12 => "[abcĠĊé▁ ]{1,3}".prop_map(String::into_bytes),
        1 => Just(Vec::new()),
        3 => select(SPECIAL_TEXTS).prop_map(|s| s.as_bytes().to_vec()),
        2 => any::<u8>().prop_map(|b| format!("<0x{b:02X}>").into_bytes()),
        1 => "<0x.{0,3}".prop_map(String::into_bytes),
        1 => any::<String>().prop_map(String::into_bytes),
        1 => (select(&[" ", "a", "▁", "™", "Ġ"][..]), 1..2000usize)
            .prop_map(|(c, n)| c.repeat(n).into_bytes()),
    ]
}

/// A per-token array: one entry per token mostly, sometimes another number of them.
fn per_token<T: std::fmt::Debug + Clone + 'static>(
    n: usize,
    item: impl Strategy<Value = T> + Clone + 'static,
) -> impl Strategy<Value = Option<Vec<T>>> {
    let len = prop_oneof![12 => Just(n), 1 => 0..n + 3];
    prop::option::of(len.prop_flat_map(move |l| prop::collection::vec(item.clone(), l)))
}

fn score() -> impl Strategy<Value = f32> + Clone {
    prop_oneof![
        6 => -20.0f32..1.0,
        1 => Just(f32::NAN),
        1 => Just(f32::INFINITY),
        1 => Just(f32::NEG_INFINITY),
    ]
}

/// A merge rule: mostly two tokens of the vocabulary, else anything.
fn merge(tokens: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        8 => (any::<Index>(), any::<Index>()).prop_map(move |(a, b)| {
            if tokens.is_empty() {
                return b"a b".to_vec();
            }
            let mut m = tokens[a.index(tokens.len())].clone();
            m.push(b' ');
            m.extend_from_slice(&tokens[b.index(tokens.len())]);
            m
        }),
        1 => "[abĠ ]{0,5}".prop_map(String::into_bytes),
    ]
}

fn id_value(n: usize) -> impl Strategy<Value = Meta> + Clone {
    prop_oneof![
        4 => (0..n as u32 + 3).prop_map(Meta::U32),
        1 => any::<u32>().prop_map(Meta::U32),
    ]
}

fn flag() -> impl Strategy<Value = Option<Meta>> {
    prop::option::of(any::<bool>().prop_map(Meta::Bool))
}

/// What a damaged file may hold where a value should be: a string that is not UTF-8 (the
/// file does not parse), a value of the wrong type.
fn spoiled() -> impl Strategy<Value = Meta> {
    prop_oneof![
        Just(Meta::Str(vec![b'a', 0xFF])),
        Just(Meta::Strs(vec![vec![0xC3]])),
        Just(Meta::U32(7)),
        Just(Meta::str("one")),
        Just(Meta::F32s(vec![])),
        Just(Meta::Bool(true)),
    ]
}

/// Vocabulary metadata as key-value pairs.
fn metadata() -> impl Strategy<Value = Vec<(String, Meta)>> {
    (
        prop::collection::vec(token(), 0..24),
        prop::bool::weighted(0.8),
    )
        .prop_flat_map(|(mut tokens, dedupe)| {
            if dedupe {
                let mut seen = HashSet::new();
                tokens.retain(|t| seen.insert(t.clone()));
            }
            let n = tokens.len();
            let model = prop_oneof![
                4 => Just("gpt2".to_string()),
                4 => Just("llama".to_string()),
                2 => Just("t5".to_string()),
                2 => Just("bert".to_string()),
                1 => Just("gemma4".to_string()),
                1 => "[a-z0-9]{0,6}",
            ];
            let pre = prop::option::weighted(0.9, select(PRES));
            let types = per_token(n, -1i32..8);
            let scores = per_token(n, score());
            let merges =
                prop::option::weighted(0.9, prop::collection::vec(merge(tokens.clone()), 1..12));
            let ids =
                prop::collection::vec(prop::option::weighted(0.3, id_value(n)), ID_KEYS.len());
            let flags = (flag(), flag(), flag(), flag(), flag());
            let charsmap = prop::option::weighted(0.5, charsmap());
            let name = prop::option::weighted(0.2, select(&["Phi-3-mini", "other"][..]));
            let template = prop::bool::weighted(0.2);
            // Take one key out, or spoil its value.
            let damage = prop::option::weighted(0.2, (any::<Index>(), prop::option::of(spoiled())));
            (
                Just(tokens),
                model,
                pre,
                types,
                scores,
                merges,
                ids,
                flags,
                (name, template, charsmap),
                damage,
            )
        })
        .prop_map(
            |(
                tokens,
                model,
                pre,
                types,
                scores,
                merges,
                ids,
                flags,
                (name, template, charsmap),
                damage,
            )| {
                let mut kvs = vec![
                    ("tokenizer.ggml.model".to_string(), Meta::str(&model)),
                    ("tokenizer.ggml.tokens".to_string(), Meta::Strs(tokens)),
                ];
                let mut add = |key: &str, value: Option<Meta>| {
                    if let Some(v) = value {
                        kvs.push((key.to_string(), v));
                    }
                };
                add("tokenizer.ggml.pre", pre.map(Meta::str));
                add("tokenizer.ggml.token_type", types.map(Meta::I32s));
                add("tokenizer.ggml.scores", scores.map(Meta::F32s));
                add("tokenizer.ggml.merges", merges.map(Meta::Strs));
                for (key, id) in ID_KEYS.iter().zip(ids) {
                    add(&format!("tokenizer.ggml.{key}_token_id"), id);
                }
                add("tokenizer.ggml.add_bos_token", flags.0);
                add("tokenizer.ggml.add_eos_token", flags.1);
                add("tokenizer.ggml.add_space_prefix", flags.2);
                add("tokenizer.ggml.remove_extra_whitespaces", flags.3);
                add("tokenizer.ggml.normalizer.lowercase", flags.4);
                add(
                    "tokenizer.ggml.precompiled_charsmap",
                    charsmap.map(Meta::U8s),
                );
                add("general.name", name.map(Meta::str));
                add(
                    "tokenizer.chat_template",
                    template.then(|| {
                        Meta::str("{{ bos_token }}{{ messages[0].content }}{{ eos_token }}")
                    }),
                );
                match damage {
                    Some((i, Some(value))) => {
                        let i = i.index(kvs.len());
                        kvs[i].1 = value;
                    }
                    Some((i, None)) => {
                        kvs.remove(i.index(kvs.len()));
                    }
                    None => {}
                }
                kvs
            },
        )
}

/// Input text: any characters, plus the texts that special-token matching, the splitters and
/// space clean-up look for.
fn text() -> impl Strategy<Value = String> {
    let atom = prop_oneof![
        4 => any::<char>().prop_map(String::from),
        2 => select(SPECIAL_TEXTS).prop_map(String::from),
        2 => "[abcé▁ ]{1,6}",
        1 => "[ .,!?'\n]{1,3}",
        1 => "[0-9]{1,5}",
        1 => (select(&["a", " ", "\n", "1"][..]), 1..300usize).prop_map(|(c, n)| c.repeat(n)),
    ];
    prop::collection::vec(atom, 0..16).prop_map(|v| v.concat())
}

fn parse(kvs: &[(String, Meta)]) -> Result<Gguf, ch01::GgufError> {
    let kvs: Vec<(&str, Meta)> = kvs.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    Gguf::parse(&gguf_bytes(&kvs))
}

fn stream(tok: &Tokenizer, ids: &[u32]) -> String {
    let mut d = StreamDecoder::new(tok);
    let mut out: String = ids.iter().map(|&id| d.push(id)).collect();
    out.push_str(&d.finish());
    out
}

/// Encode and decode every way there is; check only what holds for any vocabulary.
fn exercise(tok: &Tokenizer, texts: &[String], ids: &[u32]) -> Result<(), TestCaseError> {
    let n = tok.vocab_size();
    for text in texts {
        for (add, special) in [(false, false), (true, true), (false, true)] {
            let encoded = tok.encode(text, add, special);
            prop_assert!(encoded.iter().all(|&id| (id as usize) < n));
            let decoded = tok.decode(&encoded);
            prop_assert_eq!(&stream(tok, &encoded), &decoded);
            prop_assert!(tok.detokenize(&encoded, add, special).is_ok());
        }
    }
    // Any ids, in range or not: decoding marks the bad ones, detokenizing names them.
    let decoded = tok.decode(ids);
    prop_assert_eq!(&stream(tok, ids), &decoded);
    for (remove, unparse) in [(false, true), (true, false)] {
        match tok.detokenize(ids, remove, unparse) {
            Ok(_) => {}
            Err(e) => prop_assert!(e.to_string().contains("out of range"), "{}", e),
        }
    }
    for &id in ids {
        let _ = tok.token_to_piece(id);
        let _ = (tok.is_eog(id), tok.is_control(id), tok.token_text(id));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn any_vocabulary_builds_or_fails_with_an_error(
        kvs in metadata(),
        texts in prop::collection::vec(text(), 0..4),
        ids in prop::collection::vec(prop_oneof![0..40u32, any::<u32>()], 0..24),
    ) {
        // A file that does not parse (a token that is not UTF-8) is chapter 1's error.
        let Ok(gguf) = parse(&kvs) else { return Ok(()) };
        match ChatTemplate::from_gguf(&gguf) {
            Ok(t) => {
                let _ = t.render(&[Message::new("user", "hi")], true);
            }
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
        match Tokenizer::from_gguf(&gguf) {
            Ok(tok) => exercise(&tok, &texts, &ids)?,
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }
}

/// A byte-level BPE vocabulary as training makes one: a token for each of the 256 bytes,
/// merges of existing tokens whose results are tokens, and some special tokens. Its
/// pre-tokenizer does not clean up spaces, so decoding gives back every byte.
fn trained_bpe(
    pairs: &[(Index, Index)],
    specials: &[(&str, i32)],
    pre: &str,
) -> Vec<(String, Meta)> {
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_level_encode(&[b])).collect();
    let mut seen: HashSet<String> = tokens.iter().cloned().collect();
    let mut merges = Vec::new();
    for (a, b) in pairs {
        let (left, right) = (
            &tokens[a.index(tokens.len())],
            &tokens[b.index(tokens.len())],
        );
        let joined = format!("{left}{right}");
        merges.push(format!("{left} {right}"));
        if seen.insert(joined.clone()) {
            tokens.push(joined);
        }
    }
    let mut types = vec![1; tokens.len()];
    for &(text, kind) in specials {
        if seen.insert(text.to_string()) {
            tokens.push(text.to_string());
            types.push(kind);
        }
    }
    let strs = |v: &[String]| Meta::Strs(v.iter().map(|s| s.as_bytes().to_vec()).collect());
    vec![
        ("tokenizer.ggml.model".into(), Meta::str("gpt2")),
        ("tokenizer.ggml.pre".into(), Meta::str(pre)),
        ("tokenizer.ggml.tokens".into(), strs(&tokens)),
        ("tokenizer.ggml.token_type".into(), Meta::I32s(types)),
        ("tokenizer.ggml.merges".into(), strs(&merges)),
    ]
}

/// A SentencePiece vocabulary as training makes one: `<unk>`, `<s>`, `</s>`, the 256 byte
/// tokens, `▁`, and scored pieces.
fn trained_spm(pieces: &[(String, f32)]) -> Vec<(String, Meta)> {
    let mut tokens: Vec<String> = ["<unk>", "<s>", "</s>", "▁"].map(String::from).to_vec();
    let mut types = vec![2, 3, 3, 1];
    let mut scores = vec![0.0, 0.0, 0.0, -1.0];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
        scores.push(0.0);
    }
    let mut seen: HashSet<String> = tokens.iter().cloned().collect();
    for (piece, score) in pieces {
        if seen.insert(piece.clone()) {
            tokens.push(piece.clone());
            types.push(1);
            scores.push(*score);
        }
    }
    let strs = Meta::Strs(tokens.iter().map(|s| s.as_bytes().to_vec()).collect());
    vec![
        ("tokenizer.ggml.model".into(), Meta::str("llama")),
        ("tokenizer.ggml.tokens".into(), strs),
        ("tokenizer.ggml.token_type".into(), Meta::I32s(types)),
        ("tokenizer.ggml.scores".into(), Meta::F32s(scores)),
    ]
}

fn build(kvs: &[(String, Meta)]) -> Result<Tokenizer, TestCaseError> {
    let gguf = parse(kvs).map_err(|e| TestCaseError::fail(e.to_string()))?;
    Tokenizer::from_gguf(&gguf).map_err(|e| TestCaseError::fail(e.to_string()))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn trained_byte_level_vocabularies_round_trip_any_text(
        pairs in prop::collection::vec(any::<(Index, Index)>(), 1..200),
        specials in prop::collection::vec((select(SPECIAL_TEXTS), select(&[3, 4][..])), 0..4),
        pre in select(&["smollm", "command-r", "qwen2", "deepseek-r1-qwen"][..]),
        texts in prop::collection::vec(text(), 1..4),
    ) {
        let tok = build(&trained_bpe(&pairs, &specials, pre))?;
        for text in &texts {
            for special in [false, true] {
                let ids = tok.encode(text, false, special);
                prop_assert_eq!(&tok.decode(&ids), text, "parse_special {}: {:?}", special, ids);
            }
        }
    }

    /// SentencePiece writes spaces as `▁`, so text with `▁` of its own comes back with
    /// spaces; any other text comes back whole.
    #[test]
    fn trained_sentencepiece_vocabularies_round_trip_text_without_the_space_mark(
        pieces in prop::collection::vec(("[abcé▁]{1,4}", -20.0f32..0.0), 0..80),
        texts in prop::collection::vec(text(), 1..4),
    ) {
        let tok = build(&trained_spm(&pieces))?;
        for text in texts.iter().filter(|t| !t.contains('▁')) {
            let ids = tok.encode(text, false, false);
            prop_assert_eq!(&tok.decode(&ids), text, "{:?}", ids);
        }
    }
}

/// Pieces of Jinja: delimiters, statements, expressions, filters, and things that are wrong.
const FRAGMENTS: &[&str] = &[
    "{{ ",
    " }}",
    "{% ",
    " %}",
    "{%- ",
    " -%}",
    "{# ",
    " #}",
    "for m in messages",
    "endfor",
    "if",
    "elif",
    "else",
    "endif",
    "set x = ",
    "macro f(a)",
    "endmacro",
    "call f(1)",
    "endcall",
    "caller()",
    "raw",
    "endraw",
    "recursive",
    "loop(m)",
    "in",
    "not",
    "is defined",
    "(",
    ")",
    "[",
    "]",
    ",",
    ":",
    "'",
    "\"",
    "\n",
    "filter upper",
    "endfilter",
    "with y = 2",
    "endwith",
    "include 'other'",
    "extends 'other'",
    "block b",
    "endblock",
    "break",
    "continue",
];

/// Expressions over what a chat template is given, and ones that fail.
const EXPRESSIONS: &[&str] = &[
    "m.content",
    "m['role']",
    "m.role == 'user'",
    "messages[0].content",
    "messages[-1]",
    "messages|length",
    "messages|tojson",
    "loop.index",
    "loop.last",
    "bos_token ~ eos_token",
    "add_generation_prompt",
    "raise_exception('refused')",
    "'a' * 30",
    "range(30)|list",
    "1/0",
    "x",
    "x|upper",
    "ns.a",
    "none",
    "nothing.here",
    "f(1)",
    "f(f(2))",
    "(m.content|trim)[1:3]",
    "m.content.upper()",
    "m.content.split(' ')",
    "messages|selectattr('role', 'equalto', 'user')|list",
];

fn expression() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => select(EXPRESSIONS).prop_map(String::from),
        1 => "[ -~]{0,6}",
    ]
}

/// A template: Jinja blocks that make sense, nested, with fragments of soup in between.
fn template() -> impl Strategy<Value = String> {
    let soup = prop::collection::vec(
        prop_oneof![
            3 => select(FRAGMENTS).prop_map(String::from),
            2 => expression(),
            1 => "[ -~]{0,6}",
        ],
        0..6,
    )
    .prop_map(|v| v.concat());
    let leaf = prop_oneof![
        2 => soup,
        3 => expression().prop_map(|e| format!("{{{{ {e} }}}}")),
        1 => expression().prop_map(|e| format!("{{% set x = {e} %}}")),
        1 => Just("{% set ns = namespace(a=1) %}".to_string()),
        1 => Just("{% macro f(a) %}{{ a }}{% endmacro %}".to_string()),
    ];
    leaf.prop_recursive(3, 32, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(|v| v.concat()),
            (expression(), inner.clone(), inner.clone())
                .prop_map(|(e, a, b)| format!("{{% if {e} %}}{a}{{% else %}}{b}{{% endif %}}")),
            inner
                .clone()
                .prop_map(|body| format!("{{% for m in messages %}}{body}{{% endfor %}}")),
            inner
                .clone()
                .prop_map(|body| format!("{{% for i in range(30) %}}{body}{{% endfor %}}")),
        ]
    })
}

fn message() -> impl Strategy<Value = Message> {
    let role = prop_oneof![
        select(&["system", "user", "assistant", "tool"][..]).prop_map(String::from),
        ".{0,6}",
    ];
    let content = prop_oneof![".{0,20}", template()];
    (role, content).prop_map(|(role, content)| Message::new(&role, &content))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn any_template_renders_or_fails_with_an_error(
        source in template(),
        messages in prop::collection::vec(message(), 0..6),
        generation_prompt in any::<bool>(),
    ) {
        let t = match ChatTemplate::new(&source, "<s>", "</s>") {
            Ok(t) => t,
            Err(e) => {
                prop_assert!(!e.to_string().is_empty());
                return Ok(());
            }
        };
        match t.render_counted(&messages, generation_prompt) {
            Ok((text, fuel)) => {
                prop_assert!(text.len() <= MAX_RENDERED_BYTES);
                prop_assert!(fuel <= MAX_TEMPLATE_FUEL);
            }
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }
}
