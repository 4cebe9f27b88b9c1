//! Chapter 2: the tokenizer, exact to the token against llama.cpp.
//!
//! A model reads token ids, not text. This chapter turns text into ids and ids back into
//! text the way llama.cpp does for the model files chapter 1 reads, for both kinds of
//! vocabulary found in llama-architecture GGUF files:
//!
//! - byte-level BPE (`tokenizer.ggml.model = "gpt2"`: GPT-2, Llama 3, SmolLM2): text is cut
//!   into words by a pre-tokenizer, each word's bytes are merged by rank;
//! - SentencePiece (`"llama"`: Llama 2): spaces become `▁`, characters merge by token score,
//!   and characters without a token fall back to byte tokens `<0x..>`.
//!
//! Modules:
//! - [`vocab`]: [`Vocab`], the token list with types, scores, merges, special ids and flags,
//!   with llama.cpp's defaults when metadata keys are absent;
//! - [`unicode`]: character classes for the pre-tokenizers, GPT-2's byte-to-character
//!   alphabet (the class table itself is generated into `unicode_data.rs`);
//! - [`pretokenize`]: the word splitters, hand-written and by regex;
//! - [`bpe`] and [`spm`]: the two merge algorithms;
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
//! twice the longest token).
//!
//! Left out: llama.cpp's other tokenizers (WordPiece for BERT, Unigram for T5, RWKV, ...) and
//! the pre-tokenizers of other model families. Chapter 4 uses this tokenizer to turn a
//! prompt into ids and generated ids into text.

pub mod bpe;
pub mod chat;
pub mod decode;
mod error;
pub mod pretokenize;
pub mod special;
pub mod spm;
pub mod tokenizer;
pub mod unicode;
mod unicode_data;
pub mod vocab;

pub use ch01;
pub use chat::{ChatTemplate, Message, Rendered};
pub use error::TokenizerError;
pub use pretokenize::{PreTokenizer, RegexSplitter};
pub use tokenizer::{Split, StreamDecoder, Tokenizer};
pub use vocab::{TokenAttr, Vocab, VocabKind, VocabOptions};
