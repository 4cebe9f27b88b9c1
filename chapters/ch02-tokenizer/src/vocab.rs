//! The vocabulary: token texts, types and scores, merge rules, special tokens and the flags
//! that steer encoding, with the defaults and fix-ups llama.cpp applies when it loads them.
//!
//! [`Vocab::new`] takes plain vectors, so it can be built and tested without a file;
//! [`Vocab::from_gguf`] reads the same vectors from `tokenizer.ggml.*` metadata.

use crate::TokenizerError;
use crate::pretokenize::{PreTokenizer, pre_name};
use ch01::gguf::{Value, ValueType};
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

/// Which algorithm turns text into tokens (`tokenizer.ggml.model`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VocabKind {
    /// SentencePiece (`"llama"`): merges chosen by token score.
    Spm,
    /// BPE (`"gpt2"`, and Gemma 4's `"gemma4"`): text pre-split into words by a rule, merges
    /// chosen by rank.
    Bpe(PreTokenizer),
    /// WordPiece (`"bert"`): the longest token that starts each word, again and again.
    Wpm,
    /// Unigram (`"t5"`): the segmentation whose tokens' scores sum highest.
    Ugm,
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
    /// `tokenizer.ggml.remove_extra_whitespaces` (Unigram: runs of spaces become one).
    pub remove_extra_whitespaces: Option<bool>,
    /// `tokenizer.ggml.normalizer.lowercase` (WordPiece).
    pub lowercase: Option<bool>,
    /// `tokenizer.ggml.normalizer.strip_accents` (WordPiece; default: as `lowercase`).
    pub strip_accents: Option<bool>,
    /// `tokenizer.ggml.precompiled_charsmap`: Unigram's normalization rules.
    pub precompiled_charsmap: Option<Vec<u8>>,
    /// `general.name`: llama.cpp sets per-token attributes for a few models by name.
    pub model_name: Option<String>,
    /// `general.architecture`: likewise, for a few architectures.
    pub architecture: Option<String>,
}

impl VocabOptions {
    /// Read the options from GGUF metadata: every key that is present, of the right type.
    pub fn from_gguf(gguf: &ch01::Gguf) -> Result<VocabOptions, TokenizerError> {
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

        let n_tokens = gguf.get_array("tokenizer.ggml.tokens")?.len();
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
        let charsmap_key = "tokenizer.ggml.precompiled_charsmap";
        let precompiled_charsmap = match gguf.get(charsmap_key) {
            None => None,
            Some(Value::Array(ValueType::U8 | ValueType::I8, items)) => Some(
                items
                    .iter()
                    .map(|x| x.as_i128().map_or(0, |b| b as u8))
                    .collect(),
            ),
            Some(other) => {
                return Err(TokenizerError::Gguf(ch01::GgufError::WrongType {
                    key: charsmap_key.to_string(),
                    expected: "array of u8",
                    found: other.describe(),
                }));
            }
        };
        let opts = VocabOptions {
            pre: opt_str("tokenizer.ggml.pre")?,
            ids,
            add_bos: opt_bool("tokenizer.ggml.add_bos_token")?,
            add_eos: opt_bool("tokenizer.ggml.add_eos_token")?,
            add_space_prefix: opt_bool("tokenizer.ggml.add_space_prefix")?,
            remove_extra_whitespaces: opt_bool("tokenizer.ggml.remove_extra_whitespaces")?,
            lowercase: opt_bool("tokenizer.ggml.normalizer.lowercase")?,
            strip_accents: opt_bool("tokenizer.ggml.normalizer.strip_accents")?,
            precompiled_charsmap,
            model_name: opt_str("general.name")?,
            architecture: opt_str("general.architecture")?,
        };
        Ok(opts)
    }
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
    /// Spaces become `▁` before tokenizing (SentencePiece-style BPE, Unigram).
    pub escape_whitespaces: bool,
    /// Unigram: runs of spaces become one, and every word gets a space in front.
    pub remove_extra_whitespaces: bool,
    /// WordPiece: lower-case the text.
    pub lowercase: bool,
    /// WordPiece: replace each code point by the first of its decomposition, drop marks.
    pub strip_accents: bool,
    /// Unigram: the normalization rules, SentencePiece's compiled character map.
    pub precompiled_charsmap: Vec<u8>,
    token_to_id: HashMap<String, u32>,
}

/// What the model type sets before the metadata is read.
struct Defaults {
    kind: VocabKind,
    special: SpecialIds,
    add_space_prefix: bool,
    clean_spaces: bool,
    ignore_merges: bool,
    escape_whitespaces: bool,
    add_bos: bool,
    add_eos: bool,
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

/// llama.cpp's defaults for tokenizer `model` (`llama_vocab::impl::load`), and for BPE those of
/// the `tokenizer.ggml.pre` value `pre` (absent: `default`).
fn defaults(model: &str, pre: Option<&str>, no_merges: bool) -> Result<Defaults, TokenizerError> {
    let none = SpecialIds::default();
    let d = |kind, special, add_space_prefix, clean_spaces, add_bos, add_eos| Defaults {
        kind,
        special,
        add_space_prefix,
        clean_spaces,
        ignore_merges: false,
        escape_whitespaces: true,
        add_bos,
        add_eos,
    };
    Ok(match model {
        "llama" => {
            let ids = SpecialIds {
                bos: Some(1),
                eos: Some(2),
                unk: Some(0),
                ..none
            };
            d(VocabKind::Spm, ids, true, false, true, false)
        }
        "bert" => {
            let ids = SpecialIds {
                bos: Some(101),
                unk: Some(100),
                sep: Some(102),
                pad: Some(0),
                mask: Some(103),
                ..none
            };
            d(VocabKind::Wpm, ids, false, true, true, false)
        }
        "t5" => {
            let ids = SpecialIds {
                eos: Some(1),
                unk: Some(2),
                pad: Some(0),
                ..none
            };
            d(VocabKind::Ugm, ids, false, false, false, true)
        }
        "gpt2" | "gemma4" => {
            // Gemma 4's vocabulary is always its own pre-tokenizer, and names no default ids.
            let pre = if model == "gemma4" {
                "gemma4"
            } else {
                pre.unwrap_or("default")
            };
            let row = pre_name(pre).ok_or_else(|| TokenizerError::UnsupportedPre(pre.into()))?;
            // Kimi K2 tokenizes without merge rules.
            if no_merges && pre != "kimi-k2" {
                return Err(TokenizerError::NoMerges);
            }
            let ids = if model == "gemma4" || row.no_bos {
                SpecialIds {
                    eos: (model == "gpt2").then_some(11),
                    ..none
                }
            } else {
                SpecialIds {
                    bos: Some(11),
                    eos: Some(11),
                    ..none
                }
            };
            Defaults {
                ignore_merges: row.ignore_merges,
                escape_whitespaces: row.escape_whitespaces,
                ..d(
                    VocabKind::Bpe(row.pre),
                    ids,
                    false,
                    row.clean_spaces,
                    row.add_bos,
                    false,
                )
            }
        }
        other => return Err(TokenizerError::UnsupportedModel(other.to_string())),
    })
}

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
        let d = defaults(model, opts.pre.as_deref(), merges.is_empty())?;
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
        let default = d.special;
        let special = SpecialIds {
            bos: pick(default.bos, o.bos),
            eos: pick(default.eos, o.eos),
            eot: pick(None, o.eot),
            eom: pick(None, o.eom),
            unk: pick(default.unk, o.unk),
            sep: pick(default.sep, o.sep),
            pad: pick(default.pad, o.pad),
            mask: pick(default.mask, o.mask),
            fim_pre: pick(None, o.fim_pre),
            fim_suf: pick(None, o.fim_suf),
            fim_mid: pick(None, o.fim_mid),
            fim_pad: pick(None, o.fim_pad),
            fim_rep: pick(None, o.fim_rep),
            fim_sep: pick(None, o.fim_sep),
        };

        let precompiled_charsmap = opts.precompiled_charsmap.clone().unwrap_or_default();
        if d.kind == VocabKind::Ugm && !crate::charsmap::check_charsmap(&precompiled_charsmap) {
            return Err(TokenizerError::BadCharsMap {
                len: precompiled_charsmap.len(),
            });
        }
        // llama.cpp lower-cases by default (BERT uncased), and strips accents when it does.
        let lowercase = opts.lowercase.unwrap_or(true);
        let mut vocab = Vocab {
            kind: d.kind,
            tokens,
            scores,
            attrs,
            merges,
            special,
            eog: BTreeSet::new(),
            // Gemma 4's BOS is added whatever the file says (llama.cpp's workaround).
            add_bos: opts.add_bos.unwrap_or(d.add_bos)
                || d.kind == VocabKind::Bpe(PreTokenizer::Gemma4),
            add_eos: opts.add_eos.unwrap_or(d.add_eos),
            add_space_prefix: opts.add_space_prefix.unwrap_or(d.add_space_prefix),
            clean_spaces: d.clean_spaces,
            ignore_merges: d.ignore_merges,
            escape_whitespaces: d.escape_whitespaces,
            remove_extra_whitespaces: opts.remove_extra_whitespaces.unwrap_or(false),
            lowercase,
            strip_accents: opts.strip_accents.unwrap_or(lowercase),
            precompiled_charsmap,
            token_to_id,
        };
        vocab.find_special_tokens_by_text();
        vocab.apply_name_rules(opts);
        Ok(vocab)
    }

    /// Read the vocabulary from GGUF metadata.
    pub fn from_gguf(gguf: &ch01::Gguf) -> Result<Vocab, TokenizerError> {
        Vocab::from_gguf_with(gguf, &VocabOptions::from_gguf(gguf)?)
    }

    /// Read the token arrays from GGUF metadata, with `opts` in place of what the metadata
    /// says beyond them (to try another pre-tokenizer on a vocabulary, say).
    pub fn from_gguf_with(gguf: &ch01::Gguf, opts: &VocabOptions) -> Result<Vocab, TokenizerError> {
        let has = |key: &str| gguf.get(key).is_some();
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
        Vocab::new(model, tokens, types, scores, merges, opts)
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
        // Gemma 4 and PLaMo have a normal `</s>`, which is text, not the end.
        let marker = eog.iter().any(|&i| {
            matches!(
                self.tokens[i as usize].as_str(),
                "<|tool_response>" | "<|plamo:eos|>"
            )
        });
        let s_id = eog
            .iter()
            .copied()
            .find(|&i| self.tokens[i as usize] == "</s>");
        if let (true, Some(s_id)) = (marker, s_id) {
            eog.remove(&s_id);
            self.attrs[s_id as usize] = TokenAttr(TokenAttr::NORMAL);
        }
        self.eog = eog;
    }

    /// Per-model attributes llama.cpp sets by name: the mask token of some embedding models
    /// swallows the whitespace before it, Phi-3's special tokens the whitespace after them.
    fn apply_name_rules(&mut self, opts: &VocabOptions) {
        let name = opts.model_name.as_deref().unwrap_or("").to_lowercase();
        let pre = opts.pre.as_deref().unwrap_or("");
        let arch = opts.architecture.as_deref().unwrap_or("");
        let any = |s: &str, parts: &[&str]| parts.iter().any(|p| s.contains(p));
        if any(pre, &["jina-v2-de", "jina-v2-es", "jina-v2-code"])
            || any(arch, &["nomic-bert-moe", "jina-bert-v3"])
        {
            self.set_attr("<mask>", TokenAttr::LSTRIP, true);
        } else if any(&name, &["phi-3", "phi3"]) {
            let special = TokenAttr::CONTROL | TokenAttr::USER_DEFINED | TokenAttr::UNKNOWN;
            for attr in &mut self.attrs {
                if attr.has(special) {
                    attr.0 |= TokenAttr::RSTRIP;
                }
            }
            self.set_attr("</s>", TokenAttr::RSTRIP, true);
            for text in ["<unk>", "<s>", "<|endoftext|>"] {
                self.set_attr(text, TokenAttr::RSTRIP, false);
            }
        } else if name.contains("modern-bert") {
            self.set_attr("[MASK]", TokenAttr::LSTRIP, true);
        }
    }

    /// Set or clear attribute `bit` of the token `text`, if there is one.
    fn set_attr(&mut self, text: &str, bit: u32, on: bool) {
        if let Some(&id) = self.token_to_id.get(text) {
            let a = &mut self.attrs[id as usize].0;
            *a = if on { *a | bit } else { *a & !bit };
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
        let e = Vocab::new("rwkv", strings(&["a"]), vec![], vec![], vec![], &opts);
        assert!(e.unwrap_err().to_string().contains("\"rwkv\""));
        let bad_pre = VocabOptions {
            pre: Some("no-such-rule".into()),
            ..VocabOptions::default()
        };
        let e = Vocab::new(
            "gpt2",
            strings(&["a", "b"]),
            vec![],
            vec![],
            strings(&["a b"]),
            &bad_pre,
        );
        assert!(e.unwrap_err().to_string().contains("\"no-such-rule\""));
        // No pre-tokenizer named: llama.cpp's default rule.
        let v = Vocab::new(
            "gpt2",
            strings(&["a", "b"]),
            vec![],
            vec![],
            strings(&["a b"]),
            &VocabOptions::default(),
        )
        .unwrap();
        assert_eq!(v.kind, VocabKind::Bpe(PreTokenizer::Default));
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
