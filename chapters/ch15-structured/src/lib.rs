//! Chapter 15: structured output — grammar-constrained decoding, from GBNF and JSON Schema.
//!
//! - [`gbnf`]: llama.cpp's grammar language, parsed into rules of elements.
//! - [`matcher`]: which text a grammar still accepts, one code point at a time (stacks).
//! - [`mask`]: which tokens may come next — a trie of the vocabulary, masks cached by state —
//!   and the grammar as a rule of chapter 4's sampler ([`Constraint`]).
//! - [`schema`]: JSON Schema to a grammar, after llama.cpp's `json-schema-to-grammar`.
//! - [`formats`]: where users ask — the command line's flags and the server's
//!   `response_format` and `grammar` ([`Structured`]).

pub mod formats;
pub mod gbnf;
pub mod mask;
pub mod matcher;
pub mod schema;

pub use formats::{CompileError, Source, Structured, compile};
pub use gbnf::{Grammar, GrammarError};
pub use mask::{Constraint, TokenIndex};

/// Everything earlier chapters offer, so `ch15` reads as "the engine as of chapter 15".
pub use ch14::{self, *};
