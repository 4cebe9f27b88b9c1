//! What can go wrong building a tokenizer or using it, said so that the reader can find the
//! bad key, token or merge.

use std::fmt;

/// Any error from this crate.
#[derive(Debug)]
pub enum TokenizerError {
    /// Reading the GGUF metadata failed (a missing key, a value of the wrong type).
    Gguf(ch01::GgufError),
    /// `tokenizer.ggml.model` names a tokenizer this chapter does not implement.
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer llama.cpp does not know either.
    UnsupportedPre(String),
    /// A per-token array (scores, token types) does not have one entry per token.
    ArrayLength {
        key: &'static str,
        len: usize,
        n_tokens: usize,
    },
    /// More tokens than [`crate::vocab::MAX_VOCAB_TOKENS`].
    TooManyTokens { n_tokens: usize, limit: usize },
    /// A token text longer than [`crate::vocab::MAX_TOKEN_BYTES`].
    TokenTooLong { id: u32, len: usize, limit: usize },
    /// A special token id (`tokenizer.ggml.bos_token_id`, ...) past the end of the vocabulary,
    /// where its text is needed (the chat template's `bos_token`). The vocabulary itself
    /// ignores such an id, as llama.cpp does.
    SpecialIdOutOfRange {
        key: &'static str,
        id: u32,
        n_tokens: usize,
    },
    /// Two tokens have the same text: text-to-id lookup would be ambiguous.
    DuplicateToken {
        text: String,
        first: u32,
        second: u32,
    },
    /// A merge rule is not two symbols separated by a space.
    BadMerge { index: usize, text: String },
    /// A BPE vocabulary without merges.
    NoMerges,
    /// `tokenizer.ggml.precompiled_charsmap` is shorter than the sizes in its header.
    BadCharsMap { len: usize },
    /// A token id past the end of the vocabulary.
    TokenOutOfRange { id: u32, n_vocab: usize },
    /// The chat template does not compile or fails to render.
    Template(String),
    /// The chat template ran more than [`crate::chat::MAX_TEMPLATE_FUEL`] instructions.
    TemplateOutOfFuel { limit: u64 },
    /// The rendered conversation would be longer than [`crate::chat::MAX_RENDERED_BYTES`].
    TemplateOutputTooLong { limit: usize },
}

impl fmt::Display for TokenizerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenizerError::Gguf(e) => write!(f, "{e}"),
            TokenizerError::UnsupportedModel(m) => write!(
                f,
                "tokenizer.ggml.model is {m:?}; this tokenizer implements \"llama\" \
                 (SentencePiece), \"gpt2\" and \"gemma4\" (BPE), \"bert\" (WordPiece) and \"t5\" \
                 (Unigram)"
            ),
            TokenizerError::UnsupportedPre(p) => write!(
                f,
                "tokenizer.ggml.pre is {p:?}, a pre-tokenizer that llama.cpp's table (and so \
                 this one) does not have"
            ),
            TokenizerError::ArrayLength { key, len, n_tokens } => write!(
                f,
                "{key} has {len} entries but tokenizer.ggml.tokens has {n_tokens}: one per \
                 token expected"
            ),
            TokenizerError::TooManyTokens { n_tokens, limit } => write!(
                f,
                "tokenizer.ggml.tokens has {n_tokens} tokens, more than the limit of {limit} \
                 (MAX_VOCAB_TOKENS)"
            ),
            TokenizerError::TokenTooLong { id, len, limit } => write!(
                f,
                "token {id} is {len} bytes long, more than the limit of {limit} bytes \
                 (MAX_TOKEN_BYTES)"
            ),
            TokenizerError::SpecialIdOutOfRange { key, id, n_tokens } => write!(
                f,
                "{key} is {id}, past the end of the vocabulary of {n_tokens} tokens"
            ),
            TokenizerError::DuplicateToken {
                text,
                first,
                second,
            } => write!(f, "tokens {first} and {second} have the same text {text:?}"),
            TokenizerError::BadMerge { index, text } => write!(
                f,
                "tokenizer.ggml.merges[{index}] is {text:?}: expected two symbols separated by \
                 a space"
            ),
            TokenizerError::NoMerges => write!(
                f,
                "tokenizer.ggml.merges is missing: a BPE vocabulary needs its merge rules"
            ),
            TokenizerError::BadCharsMap { len } => write!(
                f,
                "tokenizer.ggml.precompiled_charsmap has {len} bytes, too few for the character \
                 map its header describes"
            ),
            TokenizerError::TokenOutOfRange { id, n_vocab } => write!(
                f,
                "token id {id} is out of range: the vocabulary has {n_vocab} tokens"
            ),
            TokenizerError::Template(msg) => write!(f, "chat template: {msg}"),
            TokenizerError::TemplateOutOfFuel { limit } => write!(
                f,
                "chat template: rendering stopped after {limit} instructions \
                 (MAX_TEMPLATE_FUEL); the template runs too long for a chat prompt"
            ),
            TokenizerError::TemplateOutputTooLong { limit } => write!(
                f,
                "chat template: the rendered text passes {limit} bytes (MAX_RENDERED_BYTES)"
            ),
        }
    }
}

impl std::error::Error for TokenizerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TokenizerError::Gguf(e) => Some(e),
            _ => None,
        }
    }
}

impl From<ch01::GgufError> for TokenizerError {
    fn from(e: ch01::GgufError) -> TokenizerError {
        TokenizerError::Gguf(e)
    }
}

impl From<minijinja::Error> for TokenizerError {
    fn from(e: minijinja::Error) -> TokenizerError {
        // The alternate form includes the template line the error points at.
        TokenizerError::Template(format!("{e:#}"))
    }
}
