//! Chapter 2: the tokenizer, exact to the token against llama.cpp.
//!
//! A model reads token ids, not text. This chapter turns text into ids and ids back into
//! text the way llama.cpp does for the model files chapter 1 reads, for each kind of
//! vocabulary llama.cpp's GGUF files name in `tokenizer.ggml.model`:
//!
//! - BPE (`"gpt2"`: GPT-2, Llama 3, Qwen, SmolLM2, ...; `"gemma4"`): text is cut into words by
//!   a pre-tokenizer, each word's bytes (or characters) are merged by rank;
//! - SentencePiece (`"llama"`: Llama 2, Gemma 3): spaces become `▁`, characters merge by token
//!   score, and characters without a token fall back to byte tokens `<0x..>`;
//! - WordPiece (`"bert"`): the longest token that starts each word, again and again;
//! - Unigram (`"t5"`): the segmentation whose token scores add up highest.
//!
//! Modules:
//! - [`vocab`]: [`Vocab`], the token list with types, scores, merges, special ids and flags,
//!   with llama.cpp's defaults when metadata keys are absent;
//! - [`unicode`]: character classes for the pre-tokenizers, GPT-2's byte-to-character
//!   alphabet, lower case and decomposition (the tables are generated into `unicode_data.rs`);
//! - [`pretokenize`]: llama.cpp's table of pre-tokenizers, by `tokenizer.ggml.pre` name, and
//!   the word splitters, hand-written and by regex;
//! - [`bpe`], [`spm`], [`wpm`] and [`ugm`]: the four algorithms;
//! - [`special`]: recognising special tokens such as `<|im_start|>` in input text;
//! - [`decode`]: token pieces, space clean-up, UTF-8 reassembly;
//! - [`tokenizer`]: [`Tokenizer`] (encode, decode) and [`StreamDecoder`];
//! - [`chat`]: [`ChatTemplate`], the model's Jinja chat template.
//!
//! A model file is input like any other: what it may ask for is bounded, each limit a named
//! constant whose breach is a [`TokenizerError`] naming it. The vocabulary's size and its
//! longest token ([`vocab::MAX_VOCAB_TOKENS`], [`vocab::MAX_TOKEN_BYTES`]); the chat
//! template's work and output ([`chat::MAX_TEMPLATE_FUEL`], [`chat::MAX_RENDERED_BYTES`]).
//! Decoding takes time linear in its output, and encoding linear in the text up to a log
//! factor for the merge queues (SentencePiece also hashes each candidate merge, at most
//! twice the longest token; WordPiece and Unigram look up every span up to the longest token).
//!
//! Left out: llama.cpp's other tokenizers (RWKV, PLaMo-2, and the `"whitespace"` and
//! `"hybriddna"` variants of BPE). Chapter 4 uses this tokenizer to turn a prompt into ids
//! and generated ids into text.

pub mod bpe;
mod charsmap;
pub mod chat;
pub mod decode;
mod error;
pub mod pretokenize;
pub mod special;
pub mod spm;
pub mod template_json;
pub mod tokenizer;
pub mod ugm;
pub mod unicode;
mod unicode_data;
pub mod vocab;
pub mod wpm;

pub use chat::{ChatTemplate, Message, Rendered, Vars};
pub use error::TokenizerError;
pub use pretokenize::{PreTokenizer, RegexSplitter, Splitter};
pub use tokenizer::{Split, StreamDecoder, Tokenizer};
pub use vocab::{TokenAttr, Vocab, VocabKind, VocabOptions};
