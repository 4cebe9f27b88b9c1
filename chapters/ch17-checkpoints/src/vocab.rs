//! `tokenizer.json` as chapter 2's tokenizer: the GGUF keys llama.cpp's converter writes for
//! it, so that chapter 2 runs it unchanged.
//!
//! `tokenizer.json` describes a pipeline — normalizer, pre-tokenizer, model, post-processor,
//! decoder — where GGUF names a tokenizer (`tokenizer.ggml.model`) and a pre-tokenizer rule
//! (`tokenizer.ggml.pre`) and lists the vocabulary. Two pipelines cover the families here:
//!
//! - **Byte-level BPE** (GPT-2, Llama 3, Qwen2, SmolLM2): a `ByteLevel` step maps bytes to
//!   printable characters, and the pre-tokenizer cuts words with regexes (`Split` steps,
//!   `ByteLevel`'s own GPT-2 regex, `Digits`). That is GGUF's `"gpt2"` model; the regexes are
//!   matched against chapter 2's table of llama.cpp's rules ([`PRE_NAMES`]), whose flags
//!   (merges ignored for whole words, spaces cleaned when decoding) must agree with
//!   `tokenizer.json`'s `ignore_merges` and `tokenizer_config.json`'s
//!   `clean_up_tokenization_spaces`.
//! - **SentencePiece-style BPE** (Gemma): spaces become `▁`, unknown characters fall back to
//!   byte tokens `<0x..>`. That is GGUF's `"llama"` model, which merges the pair whose result
//!   scores highest; a merge of rank `r` gives its result the score `-r`, so the first merge
//!   wins as in Hugging Face's BPE.
//!
//! A pipeline with any other step is an error naming the step: a tokenizer is either exact or
//! refused.

use crate::family::Meta;
use crate::files::{Checkpoint, CheckpointError, bad};
use ch01::Value;
use ch01::gguf::ValueType;
use ch02::pretokenize::{PRE_NAMES, PreTokenizer};
use ch02::vocab::{MAX_TOKEN_BYTES, MAX_VOCAB_TOKENS};
use serde_json::Value as Json;
use std::collections::HashMap;

/// llama.cpp's token types (`LLAMA_TOKEN_TYPE_*`).
const NORMAL: i32 = 1;
const UNKNOWN: i32 = 2;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;
const BYTE: i32 = 6;

/// Hugging Face spells the contractions of the Llama 3 and Qwen2 regexes case-insensitively;
/// llama.cpp spells them out (chapter 2 says why).
const HF_CONTRACTIONS: &str = "(?i:'s|'t|'re|'ve|'m|'ll|'d)";
const LLAMA_CPP_CONTRACTIONS: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])";

/// The tokens of `tokenizer.json` by id, whichever list they are in.
struct Tokens {
    text: Vec<Option<String>>,
    /// Added tokens: id → special.
    added: HashMap<usize, bool>,
}

// ANCHOR: keys
/// The `tokenizer.*` keys for `ckpt`'s tokenizer, and the number of tokens (at least
/// `config.json`'s `vocab_size`: llama.cpp pads the list with unused `[PADn]` tokens).
pub fn tokenizer_keys(ckpt: &Checkpoint) -> Result<(Meta, usize), CheckpointError> {
    let file = ckpt.dir.join("tokenizer.json");
    let err = |what: String| bad(&file, what);
    let tok = &ckpt.tokenizer;
    let model = tok.get("model").ok_or_else(|| err("no \"model\"".into()))?;
    match model.get("type").and_then(Json::as_str) {
        Some("BPE") => {}
        other => {
            let why = format!("model.type: {other:?} (the engine reads BPE tokenizers)");
            return Err(err(why));
        }
    }
    let config_vocab = ckpt.config.get("vocab_size").and_then(Json::as_u64);
    let tokens = read_tokens(tok, model, config_vocab).map_err(err)?;
    let n = tokens.text.len();
    let mut meta: Meta = Vec::new();
    let byte_level = has_step(tok.get("pre_tokenizer"), "ByteLevel")
        || has_step(tok.get("decoder"), "ByteLevel");
    let merges = read_merges(model).map_err(err)?;
    if byte_level {
        byte_level_normalizer(tok.get("normalizer")).map_err(err)?;
        let pre = pre_name(ckpt, model).map_err(err)?;
        meta.push(("tokenizer.ggml.model".into(), Value::String("gpt2".into())));
        meta.push(("tokenizer.ggml.pre".into(), Value::String(pre.into())));
        push_tokens(&mut meta, &tokens, None, |_, _| NORMAL);
        let merges = merges.into_iter().map(Value::String).collect();
        meta.push((
            "tokenizer.ggml.merges".into(),
            Value::Array(ValueType::String, merges),
        ));
    } else if model.get("byte_fallback").and_then(Json::as_bool) == Some(true) {
        let prefix = spm_space_prefix(tok).map_err(err)?;
        meta.push(("tokenizer.ggml.model".into(), Value::String("llama".into())));
        meta.push((
            "tokenizer.ggml.add_space_prefix".into(),
            Value::Bool(prefix),
        ));
        let unk = model.get("unk_token").and_then(Json::as_str);
        push_tokens(&mut meta, &tokens, unk, |_, t| {
            if is_byte_token(t) { BYTE } else { NORMAL }
        });
        meta.push(("tokenizer.ggml.scores".into(), scores(&tokens, &merges)));
    } else {
        let why = "a BPE model that neither works on bytes (a ByteLevel step) nor falls back \
                   to byte tokens as SentencePiece does (byte_fallback)";
        return Err(err(why.into()));
    }
    special_tokens(ckpt, &tokens, &mut meta)?;
    if let Some(t) = &ckpt.chat_template {
        meta.push(("tokenizer.chat_template".into(), Value::String(t.clone())));
    }
    Ok((meta, n))
}
// ANCHOR_END: keys

/// Every token of `model.vocab` and `added_tokens` by id; ids not used up to `config_vocab`
/// (the embedding's rows) become `[PADn]`.
fn read_tokens(tok: &Json, model: &Json, config_vocab: Option<u64>) -> Result<Tokens, String> {
    let vocab = model
        .get("vocab")
        .and_then(Json::as_object)
        .ok_or("model.vocab: missing, or not an object")?;
    let added_list = match tok.get("added_tokens") {
        None | Some(Json::Null) => &[][..],
        Some(Json::Array(a)) => a.as_slice(),
        Some(_) => return Err("added_tokens: not a list".into()),
    };
    let mut entries: Vec<(usize, String, Option<bool>)> = Vec::with_capacity(vocab.len());
    let id_of = |v: &Json, what: &str| -> Result<usize, String> {
        match v.as_u64() {
            Some(id) if (id as usize) < MAX_VOCAB_TOKENS => Ok(id as usize),
            _ => Err(format!("{what}: id {v} is not below {MAX_VOCAB_TOKENS}")),
        }
    };
    for (text, id) in vocab {
        entries.push((
            id_of(id, &format!("model.vocab[{text:?}]"))?,
            text.clone(),
            None,
        ));
    }
    for a in added_list {
        let text = a
            .get("content")
            .and_then(Json::as_str)
            .ok_or("added_tokens: no content")?;
        let id = id_of(
            a.get("id").unwrap_or(&Json::Null),
            &format!("added_tokens[{text:?}]"),
        )?;
        let special = a.get("special").and_then(Json::as_bool).unwrap_or(false);
        entries.push((id, text.to_string(), Some(special)));
    }
    let max_id = entries.iter().map(|e| e.0 + 1).max().unwrap_or(0);
    let padded = config_vocab.map_or(0, |v| v.min(MAX_VOCAB_TOKENS as u64) as usize);
    let n = max_id.max(padded);
    let mut text = vec![None; n];
    let mut added = HashMap::new();
    for (id, t, special) in entries {
        if t.len() > MAX_TOKEN_BYTES {
            return Err(format!(
                "token {id}: {} bytes, more than {MAX_TOKEN_BYTES}",
                t.len()
            ));
        }
        if let Some(s) = special {
            added.insert(id, s);
        } else if text[id].as_ref().is_some_and(|old: &String| *old != t) {
            return Err(format!(
                "model.vocab: id {id} is both {:?} and {t:?}",
                text[id]
            ));
        }
        text[id] = Some(t);
    }
    Ok(Tokens { text, added })
}

/// `model.merges` as llama.cpp stores them, `"a b"`: listed so already, or as pairs.
fn read_merges(model: &Json) -> Result<Vec<String>, String> {
    let list = match model.get("merges") {
        None | Some(Json::Null) => return Ok(Vec::new()),
        Some(Json::Array(l)) => l,
        Some(_) => return Err("model.merges: not a list".into()),
    };
    list.iter()
        .enumerate()
        .map(|(i, m)| match m {
            Json::String(s) if s.contains(' ') => Ok(s.clone()),
            Json::Array(p) if p.len() == 2 => match (p[0].as_str(), p[1].as_str()) {
                (Some(a), Some(b)) => Ok(format!("{a} {b}")),
                _ => Err(format!("model.merges[{i}]: not two strings")),
            },
            _ => Err(format!(
                "model.merges[{i}]: neither \"a b\" nor [\"a\", \"b\"]"
            )),
        })
        .collect()
}

/// `tokenizer.ggml.tokens` and `tokenizer.ggml.token_type`: the unknown token `unk` is one
/// (even when listed among the added tokens), other added tokens are control tokens (special)
/// or user-defined ones, unused ids `[PADn]`, the rest typed by `kind`.
fn push_tokens(
    meta: &mut Meta,
    tokens: &Tokens,
    unk: Option<&str>,
    kind: impl Fn(usize, &str) -> i32,
) {
    let mut texts = Vec::with_capacity(tokens.text.len());
    let mut types = Vec::with_capacity(tokens.text.len());
    for (id, t) in tokens.text.iter().enumerate() {
        let (text, ty) = match (t, tokens.added.get(&id)) {
            (None, _) => (format!("[PAD{id}]"), UNUSED),
            (Some(t), _) if Some(t.as_str()) == unk => (t.clone(), UNKNOWN),
            (Some(t), Some(true)) => (t.clone(), CONTROL),
            (Some(t), Some(false)) => (t.clone(), USER_DEFINED),
            (Some(t), None) => (t.clone(), kind(id, t)),
        };
        texts.push(Value::String(text));
        types.push(Value::I32(ty));
    }
    meta.push((
        "tokenizer.ggml.tokens".into(),
        Value::Array(ValueType::String, texts),
    ));
    meta.push((
        "tokenizer.ggml.token_type".into(),
        Value::Array(ValueType::I32, types),
    ));
}

/// Whether a step of type `ty` is in `step` (a pipeline step, or a `Sequence` of them).
fn has_step(step: Option<&Json>, ty: &str) -> bool {
    let Some(step) = step else { return false };
    match step.get("type").and_then(Json::as_str) {
        Some(t) if t == ty => true,
        Some("Sequence") => ["pretokenizers", "decoders", "normalizers"]
            .iter()
            .filter_map(|k| step.get(*k).and_then(Json::as_array))
            .flatten()
            .any(|s| has_step(Some(s), ty)),
        _ => false,
    }
}

/// A byte-level pipeline's normalizer: none, or Unicode's NFC (Qwen2's), which llama.cpp's
/// converter drops and its tokenizer does not apply either — text is almost always NFC
/// already, and on text that is not, both engines give the same ids, not Hugging Face's.
/// Anything else would change the ids of ordinary text: refused.
fn byte_level_normalizer(step: Option<&Json>) -> Result<(), String> {
    match step
        .filter(|s| !s.is_null())
        .map(|s| s.get("type").and_then(Json::as_str))
    {
        None | Some(Some("NFC")) => Ok(()),
        Some(other) => Err(format!(
            "normalizer: {} is not run by a byte-level tokenizer here",
            other.unwrap_or("?")
        )),
    }
}

/// The pre-tokenizer's steps as chapter 2's list of regexes.
fn regexes(step: &Json, out: &mut Vec<String>) -> Result<(), String> {
    let ty = step.get("type").and_then(Json::as_str).unwrap_or("");
    match ty {
        "Sequence" => {
            let steps = step.get("pretokenizers").and_then(Json::as_array);
            for s in steps.ok_or("pre_tokenizer: a Sequence without pretokenizers")? {
                regexes(s, out)?;
            }
        }
        "ByteLevel" => {
            if step.get("add_prefix_space").and_then(Json::as_bool) == Some(true) {
                return Err(
                    "pre_tokenizer: ByteLevel with add_prefix_space is not supported".into(),
                );
            }
            // `use_regex` (true unless said otherwise): GPT-2's rule.
            if step.get("use_regex").and_then(Json::as_bool) != Some(false) {
                out.push(PreTokenizer::Gpt2.regexes()[0].to_string());
            }
        }
        "Digits" => {
            let one = step.get("individual_digits").and_then(Json::as_bool) == Some(true);
            out.push(if one { r"\p{N}" } else { r"\p{N}+" }.to_string());
        }
        "Split" => {
            let regex = step
                .get("pattern")
                .and_then(|p| p.get("Regex"))
                .and_then(Json::as_str);
            let behavior = step.get("behavior").and_then(Json::as_str);
            let invert = step.get("invert").and_then(Json::as_bool).unwrap_or(false);
            match (regex, behavior, invert) {
                (Some(r), Some("Isolated"), false) => {
                    out.push(r.replace(HF_CONTRACTIONS, LLAMA_CPP_CONTRACTIONS))
                }
                _ => {
                    let why =
                        format!("pre_tokenizer: a Split step the engine does not run: {step}");
                    return Err(why);
                }
            }
        }
        other => {
            return Err(format!(
                "pre_tokenizer: a {other:?} step the engine does not run"
            ));
        }
    }
    Ok(())
}

// ANCHOR: pre_name
/// The `tokenizer.ggml.pre` name of chapter 2's table whose rule has the pre-tokenizer's
/// regexes and whose flags agree with the files'.
fn pre_name(ckpt: &Checkpoint, model: &Json) -> Result<&'static str, String> {
    let mut ours = Vec::new();
    if let Some(step) = ckpt.tokenizer.get("pre_tokenizer").filter(|s| !s.is_null()) {
        regexes(step, &mut ours)?;
    }
    let ignore_merges = model
        .get("ignore_merges")
        .and_then(Json::as_bool)
        .unwrap_or(false);
    let clean_spaces = ckpt
        .tokenizer_config
        .as_ref()
        .and_then(|c| c.get("clean_up_tokenization_spaces"))
        .and_then(Json::as_bool);
    let same_rule = |row: &&ch02::pretokenize::PreName| {
        row.pre
            .regexes()
            .iter()
            .copied()
            .eq(ours.iter().map(String::as_str))
    };
    let rows: Vec<_> = PRE_NAMES.iter().filter(same_rule).collect();
    let fits = rows.iter().find(|row| {
        row.ignore_merges == ignore_merges
            && clean_spaces.is_none_or(|c| c == row.clean_spaces)
            && !row.escape_whitespaces
    });
    match (fits, rows.first()) {
        (Some(row), _) => Ok(row.names[0]),
        (None, Some(row)) => Err(format!(
            "the pre-tokenizer is llama.cpp's {:?}, but ignore_merges {ignore_merges} and \
             clean_up_tokenization_spaces {clean_spaces:?} are not its flags",
            row.names[0]
        )),
        (None, None) => Err(format!(
            "pre_tokenizer: no rule of llama.cpp's has the regexes {ours:?}"
        )),
    }
}
// ANCHOR_END: pre_name

/// Whether the SentencePiece-style pipeline puts `▁` before the text: a `Prepend` normalizer,
/// or a `Metaspace` step that prepends. Its other steps must be ones SentencePiece does.
fn spm_space_prefix(tok: &Json) -> Result<bool, String> {
    let mut prefix = false;
    let mut steps = Vec::new();
    flatten(tok.get("normalizer"), "normalizers", &mut steps);
    flatten(tok.get("pre_tokenizer"), "pretokenizers", &mut steps);
    for s in steps {
        let ty = s.get("type").and_then(Json::as_str).unwrap_or("");
        let string = s
            .get("pattern")
            .and_then(|p| p.get("String"))
            .and_then(Json::as_str);
        match ty {
            "Prepend" if s.get("prepend").and_then(Json::as_str) == Some("▁") => prefix = true,
            "Replace"
                if string == Some(" ") && s.get("content").and_then(Json::as_str) == Some("▁") => {
            }
            // Splitting at spaces once they are all `▁` does nothing.
            "Split" if string == Some(" ") => {}
            "Metaspace" => {
                let scheme = s.get("prepend_scheme").and_then(Json::as_str);
                let legacy = s.get("add_prefix_space").and_then(Json::as_bool);
                prefix |= matches!(scheme, Some("always" | "first")) || legacy == Some(true);
            }
            _ => return Err(format!("a step SentencePiece does not do: {s}")),
        }
    }
    Ok(prefix)
}

fn flatten<'a>(step: Option<&'a Json>, key: &str, out: &mut Vec<&'a Json>) {
    let Some(step) = step.filter(|s| !s.is_null()) else {
        return;
    };
    match step.get(key).and_then(Json::as_array) {
        Some(list) if step.get("type").and_then(Json::as_str) == Some("Sequence") => {
            list.iter().for_each(|s| flatten(Some(s), key, out))
        }
        _ => out.push(step),
    }
}

fn is_byte_token(t: &str) -> bool {
    t.len() == 6
        && t.starts_with("<0x")
        && t.ends_with('>')
        && t[3..5].chars().all(|c| c.is_ascii_hexdigit())
}

/// SentencePiece scores from BPE ranks: the result of merge `r` scores `-r` (its first merge,
/// if several make it); a token no merge makes scores below every merge.
fn scores(tokens: &Tokens, merges: &[String]) -> Value {
    let ids: HashMap<&str, usize> = tokens
        .text
        .iter()
        .enumerate()
        .filter_map(|(i, t)| Some((t.as_deref()?, i)))
        .collect();
    let lowest = -(merges.len() as f32) - 1.0;
    let mut score = vec![lowest; tokens.text.len()];
    for (r, m) in merges.iter().enumerate().rev() {
        if let Some(&id) = ids.get(m.replacen(' ', "", 1).as_str()) {
            score[id] = -(r as f32);
        }
    }
    Value::Array(ValueType::F32, score.into_iter().map(Value::F32).collect())
}

// ANCHOR: special
/// BOS, EOS, unknown and padding ids, and whether BOS and EOS are added: from
/// `tokenizer_config.json`, else `config.json`'s ids and `tokenizer.json`'s post-processor.
fn special_tokens(
    ckpt: &Checkpoint,
    tokens: &Tokens,
    meta: &mut Meta,
) -> Result<(), CheckpointError> {
    let file = ckpt.dir.join("tokenizer_config.json");
    let tc = ckpt.tokenizer_config.as_ref();
    for (name, key) in [
        ("bos", "bos_token"),
        ("eos", "eos_token"),
        ("unknown", "unk_token"),
        ("padding", "pad_token"),
    ] {
        let text = tc.and_then(|c| c.get(key)).and_then(|v| {
            v.as_str()
                .or_else(|| v.get("content").and_then(Json::as_str))
        });
        let id = match text {
            Some(t) => {
                let id = tokens.text.iter().position(|x| x.as_deref() == Some(t));
                Some(id.ok_or_else(|| bad(&file, format!("{key}: {t:?} is not a token")))?)
            }
            None => {
                let id_key = format!("{key}_id");
                let v = ckpt.config.get(&id_key);
                let v = v.and_then(|v| v.as_array().and_then(|a| a.first()).or(Some(v)));
                v.and_then(Json::as_u64).map(|i| i as usize)
            }
        };
        if let Some(id) = id {
            if id >= tokens.text.len() {
                let why = format!(
                    "{key}: id {id} is not below the {} tokens",
                    tokens.text.len()
                );
                return Err(bad(&ckpt.dir.join("config.json"), why));
            }
            meta.push((
                format!("tokenizer.ggml.{name}_token_id"),
                Value::U32(id as u32),
            ));
        }
    }
    let post = ckpt.tokenizer.get("post_processor");
    for (what, key, at_end) in [
        ("bos", "add_bos_token", false),
        ("eos", "add_eos_token", true),
    ] {
        let said = tc.and_then(|c| c.get(key)).and_then(Json::as_bool);
        let added = said.unwrap_or_else(|| template_adds(post, at_end));
        meta.push((
            format!("tokenizer.ggml.add_{what}_token"),
            Value::Bool(added),
        ));
    }
    Ok(())
}
// ANCHOR_END: special

/// Whether a `TemplateProcessing` post-processor (alone or in a `Sequence`) puts a special
/// token at the start (or the end) of a single text.
fn template_adds(post: Option<&Json>, at_end: bool) -> bool {
    let mut steps = Vec::new();
    flatten(post, "processors", &mut steps);
    steps.iter().any(|p| {
        let single = p.get("single").and_then(Json::as_array);
        let edge = single.and_then(|s| if at_end { s.last() } else { s.first() });
        p.get("type").and_then(Json::as_str) == Some("TemplateProcessing")
            && edge.is_some_and(|e| e.get("SpecialToken").is_some())
    })
}
