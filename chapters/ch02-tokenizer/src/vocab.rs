//! The vocabulary: token texts, types and scores, merge rules, special tokens and the flags
//! that steer encoding, with the defaults and fix-ups llama.cpp applies when it loads them.
//!
//! [`Vocab::new`] takes plain vectors, so it can be built and tested without a file;
//! [`Vocab::from_gguf`] reads the same vectors from `tokenizer.ggml.*` metadata.

use crate::TokenizerError;
use crate::pretokenize::PreTokenizer;
use std::collections::{BTreeSet, HashMap};

/// The most tokens a vocabulary may have. The largest vocabularies of open models, Gemma 3's
/// and 4's, have 262 144; four times that leaves room for the next generation while bounding
/// what a file's token count can make the loader allocate (a few hundred bytes per token
/// across the tables built here).
pub const MAX_VOCAB_TOKENS: usize = 1 << 20;

/// The longest token text, in bytes. Real tokens are at most a kilobyte: 1 024 bytes in
/// Command-R's, MPT's and GPT-NeoX's vocabularies (512 spaces, each written `Ġ`), 256 in
/// GPT-2's, Llama 3's and Qwen 2's, 93 in Gemma 4's, 48 in Llama 2's. 16 KiB is 16 times
/// the longest. Loading and decoding are linear in a token's length, but SentencePiece
/// looks up every candidate merge by its text, up to twice the longest token: a vocabulary
/// built for it (`b`, `bb`, ..., `b` × 16 384, equal scores) makes encoding a run of `b`
/// cost about 18 µs a byte at this limit, 2 µs when built up to a kilobyte; real
/// SentencePiece vocabularies, with tokens under 100 bytes, cost far less.
pub const MAX_TOKEN_BYTES: usize = 16 << 10;

/// Token attributes: llama.cpp's `llama_token_attr` bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TokenAttr(pub u32);

impl TokenAttr {
    pub const UNDEFINED: u32 = 0;
    pub const UNKNOWN: u32 = 1 << 0;
    pub const UNUSED: u32 = 1 << 1;
    pub const NORMAL: u32 = 1 << 2;
    pub const CONTROL: u32 = 1 << 3;
    pub const USER_DEFINED: u32 = 1 << 4;
    pub const BYTE: u32 = 1 << 5;
    pub const NORMALIZED: u32 = 1 << 6;
    /// Special-token matching eats the whitespace before the token.
    pub const LSTRIP: u32 = 1 << 7;
    /// Special-token matching eats the whitespace after the token.
    pub const RSTRIP: u32 = 1 << 8;
    pub const SINGLE_WORD: u32 = 1 << 9;

    /// The attribute for a `tokenizer.ggml.token_type` value (llama.cpp's `LLAMA_TOKEN_TYPE_*`:
    /// 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte).
    pub fn from_token_type(t: i32) -> TokenAttr {
        TokenAttr(match t {
            1 => Self::NORMAL,
            2 => Self::UNKNOWN,
            3 => Self::CONTROL,
            4 => Self::USER_DEFINED,
            5 => Self::UNUSED,
            6 => Self::BYTE,
            _ => Self::UNDEFINED,
        })
    }

    pub fn has(self, bits: u32) -> bool {
        self.0 & bits != 0
    }
}

/// Which algorithm turns text into tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VocabKind {
    /// SentencePiece (`tokenizer.ggml.model = "llama"`): merges chosen by token score.
    Spm,
    /// Byte-level BPE (`"gpt2"`): text pre-split into words, merges chosen by rank.
    Bpe(PreTokenizer),
}

/// The special token ids llama.cpp tracks. `None`: the vocabulary has no such token.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpecialIds {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    /// End of turn: `<|eot_id|>`, `<|im_end|>`, ...
    pub eot: Option<u32>,
    /// End of message (Llama 3.1's `<|eom_id|>`).
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
    pub pad: Option<u32>,
    pub mask: Option<u32>,
    pub fim_pre: Option<u32>,
    pub fim_suf: Option<u32>,
    pub fim_mid: Option<u32>,
    pub fim_pad: Option<u32>,
    pub fim_rep: Option<u32>,
    pub fim_sep: Option<u32>,
}

/// What the metadata says beyond the token arrays. Every field is `None` when its key is
/// absent, and [`Vocab::new`] then applies llama.cpp's default for the vocabulary kind.
#[derive(Debug, Clone, Default)]
pub struct VocabOptions {
    /// `tokenizer.ggml.pre`.
    pub pre: Option<String>,
    /// `tokenizer.ggml.*_token_id`, as stored (ids past the vocabulary are ignored, as
    /// llama.cpp does, keeping the default).
    pub ids: SpecialIds,
    /// `tokenizer.ggml.add_bos_token`.
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`.
    pub add_eos: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix`.
    pub add_space_prefix: Option<bool>,
    /// `general.name`: llama.cpp sets per-token attributes for a few models by name.
    pub model_name: Option<String>,
}

/// A vocabulary as llama.cpp holds it after loading.
#[derive(Debug, Clone)]
pub struct Vocab {
    pub kind: VocabKind,
    /// Token texts, by id: byte-level characters (`Ġthe`) for BPE, `▁the` for SentencePiece.
    pub tokens: Vec<String>, // (n_vocab)
    /// SentencePiece's merge priority: higher merges first.
    pub scores: Vec<f32>, // (n_vocab)
    pub attrs: Vec<TokenAttr>, // (n_vocab)
    /// BPE merge rules, highest priority first: `("Ġ", "t")` means "Ġ" + "t" → "Ġt".
    pub merges: Vec<(String, String)>, // (n_merges)
    pub special: SpecialIds,
    /// Tokens that end generation: eos, eot, eom and the ones llama.cpp finds by their text.
    pub eog: BTreeSet<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
    /// SentencePiece: put a space before the text (and after each special token).
    pub add_space_prefix: bool,
    /// Detokenizing removes spaces before punctuation (" ," → ",") as Hugging Face's
    /// `clean_up_tokenization_spaces` does.
    pub clean_spaces: bool,
    /// Llama 3: a word that is already a token is taken whole, without merging.
    pub ignore_merges: bool,
    token_to_id: HashMap<String, u32>,
}

/// Settings that follow from `tokenizer.ggml.pre` for byte-level BPE, as llama.cpp sets them.
struct PreSettings {
    splitter: PreTokenizer,
    clean_spaces: bool,
    ignore_merges: bool,
    add_bos: bool,
}

fn pre_settings(pre: &str) -> Option<PreSettings> {
    let s = |splitter, clean_spaces, ignore_merges, add_bos| PreSettings {
        splitter,
        clean_spaces,
        ignore_merges,
        add_bos,
    };
    use PreTokenizer::*;
    Some(match pre {
        "gpt-2" | "phi-2" | "mpt" | "olmo" | "jais" => s(Gpt2, true, false, false),
        "smollm" | "command-r" => s(Smollm, false, false, false),
        "starcoder" | "refact" => s(Smollm, true, false, false),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "pixtral" => s(Llama3, true, true, true),
        "dbrx" | "smaug-bpe" => s(Llama3, true, false, false),
        "qwen2" | "deepseek-r1-qwen" => s(Qwen2, false, false, false),
        "stablelm2" => s(Qwen2, true, false, false),
        _ => return None,
    })
}

// Texts by which llama.cpp recognises special tokens that the metadata does not name.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// A per-token array has one entry per token, or is absent (`len` 0). llama.cpp reads the
/// arrays by token id without checking: a short one would read past its end, and one of
/// another length does not describe these tokens.
fn check_array_len(key: &'static str, len: usize, n_tokens: usize) -> Result<(), TokenizerError> {
    if len != 0 && len != n_tokens {
        return Err(TokenizerError::ArrayLength { key, len, n_tokens });
    }
    Ok(())
}

impl Vocab {
    /// Build a vocabulary from the `tokenizer.ggml.*` arrays. `model` is
    /// `tokenizer.ggml.model`; `types` and `scores` may be empty (keys absent: every token
    /// normal, every score 0); `merges` are the `"left right"` strings of a BPE vocabulary.
    pub fn new(
        model: &str,
        tokens: Vec<String>,
        types: Vec<i32>,
        scores: Vec<f32>,
        merges: Vec<String>,
        opts: &VocabOptions,
    ) -> Result<Vocab, TokenizerError> {
        let n = tokens.len();
        if n > MAX_VOCAB_TOKENS {
            return Err(TokenizerError::TooManyTokens {
                n_tokens: n,
                limit: MAX_VOCAB_TOKENS,
            });
        }
        // Defaults by kind, then by pre-tokenizer (llama_vocab::impl::load).
        let (kind, mut special, add_space_prefix, clean_spaces, ignore_merges, add_bos) =
            match model {
                "llama" => {
                    let ids = SpecialIds {
                        bos: Some(1),
                        eos: Some(2),
                        unk: Some(0),
                        ..SpecialIds::default()
                    };
                    (VocabKind::Spm, ids, true, false, false, true)
                }
                "gpt2" => {
                    if merges.is_empty() {
                        return Err(TokenizerError::NoMerges);
                    }
                    let pre = opts.pre.as_deref();
                    let settings = pre
                        .and_then(pre_settings)
                        .ok_or_else(|| TokenizerError::UnsupportedPre(pre.map(String::from)))?;
                    let ids = SpecialIds {
                        bos: Some(11),
                        eos: Some(11),
                        ..SpecialIds::default()
                    };
                    (
                        VocabKind::Bpe(settings.splitter),
                        ids,
                        false,
                        settings.clean_spaces,
                        settings.ignore_merges,
                        settings.add_bos,
                    )
                }
                other => return Err(TokenizerError::UnsupportedModel(other.to_string())),
            };
        for (key, len) in [
            ("tokenizer.ggml.token_type", types.len()),
            ("tokenizer.ggml.scores", scores.len()),
        ] {
            check_array_len(key, len, n)?;
        }

        let mut tokens = tokens;
        let mut token_to_id = HashMap::with_capacity(n);
        for (i, text) in tokens.iter_mut().enumerate() {
            if text.is_empty() {
                *text = format!("[EMPTY_{i}]");
            }
            if text.len() > MAX_TOKEN_BYTES {
                return Err(TokenizerError::TokenTooLong {
                    id: i as u32,
                    len: text.len(),
                    limit: MAX_TOKEN_BYTES,
                });
            }
            if let Some(first) = token_to_id.insert(text.clone(), i as u32) {
                return Err(TokenizerError::DuplicateToken {
                    text: text.clone(),
                    first,
                    second: i as u32,
                });
            }
        }
        let attrs = if types.is_empty() {
            vec![TokenAttr(TokenAttr::NORMAL); n]
        } else {
            types
                .iter()
                .map(|&t| TokenAttr::from_token_type(t))
                .collect()
        };
        let scores = if scores.is_empty() {
            vec![0.0; n]
        } else {
            scores
        };
        let merges = merges
            .iter()
            .enumerate()
            .map(|(index, m)| {
                // llama.cpp splits at the first space after the first byte, so that a merge
                // may start with a literal space in vocabularies without a byte alphabet.
                match m.bytes().skip(1).position(|b| b == b' ') {
                    Some(p) => Ok((m[..p + 1].to_string(), m[p + 2..].to_string())),
                    None => Err(TokenizerError::BadMerge {
                        index,
                        text: m.clone(),
                    }),
                }
            })
            .collect::<Result<Vec<_>, _>>()?;

        // A default id past the vocabulary is dropped; a stored id past it is ignored.
        let fit = |id: Option<u32>| id.filter(|&i| (i as usize) < n);
        let pick = |default: Option<u32>, stored: Option<u32>| fit(stored).or(fit(default));
        let o = &opts.ids;
        special = SpecialIds {
            bos: pick(special.bos, o.bos),
            eos: pick(special.eos, o.eos),
            eot: pick(None, o.eot),
            eom: pick(None, o.eom),
            unk: pick(special.unk, o.unk),
            sep: pick(None, o.sep),
            pad: pick(None, o.pad),
            mask: pick(None, o.mask),
            fim_pre: pick(None, o.fim_pre),
            fim_suf: pick(None, o.fim_suf),
            fim_mid: pick(None, o.fim_mid),
            fim_pad: pick(None, o.fim_pad),
            fim_rep: pick(None, o.fim_rep),
            fim_sep: pick(None, o.fim_sep),
        };

        let mut vocab = Vocab {
            kind,
            tokens,
            scores,
            attrs,
            merges,
            special,
            eog: BTreeSet::new(),
            add_bos: opts.add_bos.unwrap_or(add_bos),
            add_eos: opts.add_eos.unwrap_or(false),
            add_space_prefix: opts.add_space_prefix.unwrap_or(add_space_prefix),
            clean_spaces,
            ignore_merges,
            token_to_id,
        };
        vocab.find_special_tokens_by_text();
        vocab.apply_name_rules(opts.model_name.as_deref());
        Ok(vocab)
    }

    /// Read the vocabulary from GGUF metadata.
    pub fn from_gguf(gguf: &ch01::Gguf) -> Result<Vocab, TokenizerError> {
        let has = |key: &str| gguf.get(key).is_some();
        let opt_id = |key: &str| -> Result<Option<u32>, TokenizerError> {
            Ok(if has(key) {
                Some(gguf.get_u32(key)?)
            } else {
                None
            })
        };
        let opt_bool = |key: &str| -> Result<Option<bool>, TokenizerError> {
            Ok(if has(key) {
                Some(gguf.get_bool(key)?)
            } else {
                None
            })
        };
        let opt_str = |key: &str| -> Result<Option<String>, TokenizerError> {
            Ok(if has(key) {
                Some(gguf.get_str(key)?.to_string())
            } else {
                None
            })
        };

        let model = gguf.get_str("tokenizer.ggml.model")?;
        // Sizes first, before copying anything whose size they set.
        let n_tokens = gguf.get_array("tokenizer.ggml.tokens")?.len();
        if n_tokens > MAX_VOCAB_TOKENS {
            return Err(TokenizerError::TooManyTokens {
                n_tokens,
                limit: MAX_VOCAB_TOKENS,
            });
        }
        for key in ["tokenizer.ggml.token_type", "tokenizer.ggml.scores"] {
            if has(key) {
                check_array_len(key, gguf.get_array(key)?.len(), n_tokens)?;
            }
        }
        let tokens: Vec<String> = gguf
            .get_str_array("tokenizer.ggml.tokens")?
            .into_iter()
            .map(String::from)
            .collect();
        let types = if has("tokenizer.ggml.token_type") {
            gguf.get_i32_array("tokenizer.ggml.token_type")?
        } else {
            Vec::new()
        };
        // Scores are f32, or whole numbers in some conversions.
        let scores = match gguf.get("tokenizer.ggml.scores") {
            None => Vec::new(),
            Some(_) => match gguf.get_f32_array("tokenizer.ggml.scores") {
                Ok(s) => s,
                Err(_) => gguf
                    .get_i32_array("tokenizer.ggml.scores")?
                    .into_iter()
                    .map(|s| s as f32)
                    .collect(),
            },
        };
        let merges: Vec<String> = if has("tokenizer.ggml.merges") {
            gguf.get_str_array("tokenizer.ggml.merges")?
                .into_iter()
                .map(String::from)
                .collect()
        } else {
            Vec::new()
        };
        // The deprecated prefix/suffix/middle keys come last and win, as in llama.cpp, unless
        // they are out of range.
        let fim = |new: &str, old: &str| -> Result<Option<u32>, TokenizerError> {
            let old = opt_id(old)?.filter(|&id| (id as usize) < n_tokens);
            Ok(old.or(opt_id(new)?))
        };
        let k = |name: &str| format!("tokenizer.ggml.{name}_token_id");
        let ids = SpecialIds {
            bos: opt_id(&k("bos"))?,
            eos: opt_id(&k("eos"))?,
            eot: opt_id(&k("eot"))?,
            eom: opt_id(&k("eom"))?,
            unk: opt_id(&k("unknown"))?,
            sep: opt_id(&k("seperator"))?,
            pad: opt_id(&k("padding"))?,
            mask: opt_id(&k("mask"))?,
            fim_pre: fim(&k("fim_pre"), &k("prefix"))?,
            fim_suf: fim(&k("fim_suf"), &k("suffix"))?,
            fim_mid: fim(&k("fim_mid"), &k("middle"))?,
            fim_pad: opt_id(&k("fim_pad"))?,
            fim_rep: opt_id(&k("fim_rep"))?,
            fim_sep: opt_id(&k("fim_sep"))?,
        };
        let opts = VocabOptions {
            pre: opt_str("tokenizer.ggml.pre")?,
            ids,
            add_bos: opt_bool("tokenizer.ggml.add_bos_token")?,
            add_eos: opt_bool("tokenizer.ggml.add_eos_token")?,
            add_space_prefix: opt_bool("tokenizer.ggml.add_space_prefix")?,
            model_name: opt_str("general.name")?,
        };
        Vocab::new(model, tokens, types, scores, merges, &opts)
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The id of the token whose text is exactly `text`.
    pub fn text_to_token(&self, text: &str) -> Option<u32> {
        self.token_to_id.get(text).copied()
    }

    /// Special tokens the metadata does not name, found by their text, and the set of
    /// end-of-generation tokens (llama.cpp: "auto-detect special tokens by text"). Where
    /// llama.cpp walks a hash map and keeps whichever match it meets first, this takes the
    /// lowest id, so that the choice does not depend on hashing.
    fn find_special_tokens_by_text(&mut self) {
        let find = |list: &[&str]| -> Option<u32> {
            (0..self.tokens.len() as u32)
                .find(|&i| list.contains(&self.tokens[i as usize].as_str()))
        };
        let mut found = Vec::new();
        let s = &mut self.special;
        for (slot, list) in [
            (&mut s.eot, EOT_TEXTS),
            (&mut s.eom, &["<|eom_id|>"][..]),
            (&mut s.fim_pre, FIM_PRE_TEXTS),
            (&mut s.fim_suf, FIM_SUF_TEXTS),
            (&mut s.fim_mid, FIM_MID_TEXTS),
            (&mut s.fim_pad, FIM_PAD_TEXTS),
            (&mut s.fim_rep, FIM_REP_TEXTS),
            (&mut s.fim_sep, FIM_SEP_TEXTS),
        ] {
            if slot.is_none() {
                *slot = find(list);
                found.extend(*slot);
            }
        }
        // A token recognised as special is a control token, whatever its type said.
        for id in found {
            self.attrs[id as usize].0 |= TokenAttr::CONTROL;
        }
        // Control tokens named "...unused..." are placeholders.
        for (text, attr) in self.tokens.iter().zip(self.attrs.iter_mut()) {
            if attr.has(TokenAttr::CONTROL) && text.contains("unused") {
                attr.0 |= TokenAttr::UNUSED;
            }
        }

        let s = self.special;
        let mut eog: BTreeSet<u32> = [s.fim_pad, s.fim_rep, s.fim_sep]
            .into_iter()
            .flatten()
            .collect();
        for (i, text) in self.tokens.iter().enumerate() {
            if EOG_TEXTS.contains(&text.as_str()) {
                eog.insert(i as u32);
                self.attrs[i].0 |= TokenAttr::CONTROL;
            }
        }
        // gpt-oss's channel markers are always rendered, like user-defined tokens.
        for (text, attr) in self.tokens.iter().zip(self.attrs.iter_mut()) {
            if matches!(
                text.as_str(),
                "<|channel|>" | "<|message|>" | "<|start|>" | "<|constrain|>"
            ) {
                *attr = TokenAttr(TokenAttr::USER_DEFINED);
            }
        }
        eog.extend([s.eos, s.eot, s.eom].into_iter().flatten());
        // In vocabularies with `<|return|>`/`<|call|>` (gpt-oss) or `<|calls|>`/`<|flush|>`
        // (Solar Open), `<|end|>` ends a message, not generation.
        let has = |t: &str| eog.iter().any(|&i| self.tokens[i as usize] == t);
        if has("<|end|>")
            && ((has("<|return|>") && has("<|call|>")) || (has("<|calls|>") && has("<|flush|>")))
        {
            let end = eog
                .iter()
                .copied()
                .find(|&i| self.tokens[i as usize] == "<|end|>");
            if let Some(end) = end {
                eog.remove(&end);
                self.attrs[end as usize] = TokenAttr(TokenAttr::USER_DEFINED);
            }
        }
        self.eog = eog;
    }

    /// Per-model attributes llama.cpp sets by `general.name`: Phi-3's special tokens swallow
    /// the whitespace after them.
    fn apply_name_rules(&mut self, model_name: Option<&str>) {
        let name = model_name.unwrap_or("").to_lowercase();
        if !(name.contains("phi-3") || name.contains("phi3")) {
            return;
        }
        let special = TokenAttr::CONTROL | TokenAttr::USER_DEFINED | TokenAttr::UNKNOWN;
        for attr in &mut self.attrs {
            if attr.has(special) {
                attr.0 |= TokenAttr::RSTRIP;
            }
        }
        for (text, on) in [
            ("</s>", true),
            ("<unk>", false),
            ("<s>", false),
            ("<|endoftext|>", false),
        ] {
            if let Some(id) = self.text_to_token(text) {
                let a = &mut self.attrs[id as usize].0;
                *a = if on {
                    *a | TokenAttr::RSTRIP
                } else {
                    *a & !TokenAttr::RSTRIP
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn smollm_like(opts: &VocabOptions) -> Result<Vocab, TokenizerError> {
        let tokens = strings(&[
            "<|endoftext|>",
            "<|im_start|>",
            "<|im_end|>",
            "a",
            "b",
            "ab",
        ]);
        let types = vec![3, 3, 3, 1, 1, 1];
        Vocab::new("gpt2", tokens, types, vec![], strings(&["a b"]), opts)
    }

    #[test]
    fn bpe_defaults_follow_llama_cpp() {
        let opts = VocabOptions {
            pre: Some("smollm".into()),
            ..VocabOptions::default()
        };
        let v = smollm_like(&opts).unwrap();
        // Default BOS/EOS for BPE is 11: past this 6-token vocabulary, so dropped.
        assert_eq!((v.special.bos, v.special.eos), (None, None));
        assert!(!v.add_bos && !v.add_space_prefix && !v.clean_spaces);
        // Found by text: the first end-of-turn text is <|endoftext|>; it and <|im_end|> end generation.
        assert_eq!(v.special.eot, Some(0));
        assert_eq!(v.eog, BTreeSet::from([0, 2]));
        assert_eq!(v.merges, [("a".to_string(), "b".to_string())]);
    }

    #[test]
    fn stored_ids_override_defaults_unless_out_of_range() {
        let mut opts = VocabOptions {
            pre: Some("smollm".into()),
            ..VocabOptions::default()
        };
        opts.ids.bos = Some(1);
        opts.ids.eos = Some(99);
        let v = smollm_like(&opts).unwrap();
        assert_eq!((v.special.bos, v.special.eos), (Some(1), None));
    }

    #[test]
    fn errors_name_what_is_wrong() {
        let opts = VocabOptions {
            pre: Some("smollm".into()),
            ..VocabOptions::default()
        };
        let e = Vocab::new(
            "gpt2",
            strings(&["a"]),
            vec![],
            vec![],
            strings(&["ab"]),
            &opts,
        );
        assert!(matches!(e, Err(TokenizerError::BadMerge { index: 0, .. })));
        let e = Vocab::new(
            "gpt2",
            strings(&["a", "a"]),
            vec![],
            vec![],
            strings(&["a a"]),
            &opts,
        );
        assert!(matches!(
            e,
            Err(TokenizerError::DuplicateToken {
                first: 0,
                second: 1,
                ..
            })
        ));
        let e = Vocab::new(
            "gpt2",
            strings(&["a", "b"]),
            vec![1],
            vec![],
            strings(&["a b"]),
            &opts,
        );
        assert!(
            e.unwrap_err()
                .to_string()
                .contains("token_type has 1 entries")
        );
        let e = Vocab::new("bert", strings(&["a"]), vec![], vec![], vec![], &opts);
        assert!(e.unwrap_err().to_string().contains("\"bert\""));
        let no_pre = VocabOptions::default();
        let e = Vocab::new(
            "gpt2",
            strings(&["a", "b"]),
            vec![],
            vec![],
            strings(&["a b"]),
            &no_pre,
        );
        assert!(matches!(e, Err(TokenizerError::UnsupportedPre(None))));
    }

    #[test]
    fn spm_defaults_add_bos_and_a_space_prefix() {
        let tokens = strings(&["<unk>", "<s>", "</s>", "▁a"]);
        let v = Vocab::new(
            "llama",
            tokens,
            vec![2, 3, 3, 1],
            vec![0.0; 4],
            vec![],
            &VocabOptions::default(),
        )
        .unwrap();
        assert_eq!(
            (v.special.bos, v.special.eos, v.special.unk),
            (Some(1), Some(2), Some(0))
        );
        assert!(v.add_bos && !v.add_eos && v.add_space_prefix);
        assert_eq!(v.eog, BTreeSet::from([2]));
    }
}
