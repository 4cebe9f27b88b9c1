//! The vocabulary's keys in a GGUF file, as the table at the top of chapter 2: what each key
//! means and what the file holds. For `scripts/tokenizer-tables`.
//!
//! cargo run -q -p ch02 --example vocab_table [-- FILE.gguf]   (default: the default model)

use ch01::GgufFile;
use ch01::gguf::Value;
use std::collections::BTreeMap;

/// GGUF's token types (`llama_token_type` in llama.cpp), by number.
const TOKEN_TYPES: [&str; 7] = [
    "undefined",
    "normal",
    "unknown",
    "control",
    "user-defined",
    "unused",
    "byte",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = match std::env::args_os().nth(1) {
        Some(p) => p.into(),
        None => shared::default_model_path()?,
    };
    let file = GgufFile::open(&path)?;
    let g = &file.gguf;
    let tokens = g.get_str_array("tokenizer.ggml.tokens")?;
    let len = |key: &str| g.get(key).and_then(Value::as_array).map(<[Value]>::len);
    let text = |key: &str| g.get(key).and_then(Value::as_str).map(|s| format!("`{s}`"));
    let token = |key: &str| {
        let id = g.get(key)?.as_u64()?;
        let t = tokens.get(id as usize)?.replace('|', "\\|");
        Some(format!("{id} `{t}`"))
    };
    let mut types: BTreeMap<&str, usize> = BTreeMap::new();
    for v in g.get_array("tokenizer.ggml.token_type").unwrap_or(&[]) {
        let name = v
            .as_u64()
            .and_then(|t| TOKEN_TYPES.get(t as usize))
            .unwrap_or(&"out of range");
        *types.entry(name).or_default() += 1;
    }
    let (most, _) = types
        .iter()
        .max_by_key(|(_, n)| **n)
        .map_or(("", 0), |(t, n)| (*t, *n));
    let mut type_list: Vec<String> = types
        .iter()
        .filter(|(t, _)| **t != most)
        .map(|(t, n)| format!("{n} {t}"))
        .collect();
    type_list.push(format!("the rest {most}"));
    let template = g.get("tokenizer.chat_template").and_then(Value::as_str);
    let template = match template {
        None => "absent".to_string(),
        Some(t) if t.contains("<|im_start|>") => "ChatML, in Jinja".to_string(),
        Some(t) => format!("Jinja, {} characters", t.chars().count()),
    };
    let absent = || "absent".to_string();
    let specials = [
        token("tokenizer.ggml.bos_token_id"),
        token("tokenizer.ggml.eos_token_id"),
    ]
    .into_iter()
    .flatten()
    .collect::<Vec<_>>()
    .join(", ");
    let add_bos = g
        .get("tokenizer.ggml.add_bos_token")
        .and_then(Value::as_bool)
        .map_or("absent (the model type's default)".to_string(), |b| {
            b.to_string()
        });
    let name = path.file_name().map_or(String::new(), |n| {
        let n = n.to_string_lossy();
        n.strip_suffix(".gguf").unwrap_or(&n).to_string()
    });
    let rows = [
        (
            "`tokenizer.ggml.model`",
            "the algorithm: `gpt2` is byte-level BPE, `llama` is SentencePiece",
            text("tokenizer.ggml.model").unwrap_or_else(absent),
        ),
        (
            "`tokenizer.ggml.pre`",
            "the pre-tokenizer (how text is cut into words before BPE)",
            text("tokenizer.ggml.pre").unwrap_or_else(absent),
        ),
        (
            "`tokenizer.ggml.tokens`",
            "the text of each token, by id",
            format!("{} strings", tokens.len()),
        ),
        (
            "`tokenizer.ggml.token_type`",
            "normal, control, byte, user-defined, unused, unknown",
            type_list.join(", "),
        ),
        (
            "`tokenizer.ggml.merges`",
            "BPE merge rules, best first",
            len("tokenizer.ggml.merges").map_or_else(absent, |n| format!("{n} rules")),
        ),
        (
            "`tokenizer.ggml.scores`",
            "SentencePiece merge priorities",
            len("tokenizer.ggml.scores").map_or_else(absent, |n| format!("{n} scores")),
        ),
        (
            "`tokenizer.ggml.bos_token_id`, `eos_token_id`, ...",
            "special tokens",
            specials,
        ),
        (
            "`tokenizer.ggml.add_bos_token`",
            "put BOS before every prompt",
            add_bos,
        ),
        (
            "`tokenizer.chat_template`",
            "how to write a conversation",
            template,
        ),
    ];
    println!("| key | meaning | {name} |");
    println!("|---|---|---|");
    for (key, meaning, value) in rows {
        println!("| {key} | {meaning} | {value} |");
    }
    Ok(())
}
