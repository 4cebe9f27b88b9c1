//! Chapter 15: structured output — grammar-constrained decoding, from GBNF and JSON Schema.
//!
//! - [`gbnf`]: llama.cpp's grammar language, parsed into rules of elements.
//! - [`matcher`]: which text a grammar still accepts, one code point at a time (stacks).
//! - [`mask`]: which tokens may come next — a trie of the vocabulary, masks cached by state —
//!   and the grammar as a rule of chapter 4's sampler ([`Constraint`]).
//! - [`budget`]: the fewest bytes a grammar's state needs to finish, so that a held answer
//!   closes within its token budget ([`Shortest`](budget::Shortest)).
//! - [`schema`]: JSON Schema to a grammar, after llama.cpp's `json-schema-to-grammar`.
//! - [`formats`]: where users ask — text of a grammar or a schema compiled and checked
//!   ([`compile`]), and kept by its text for a server's requests ([`Structured`]).
//! - `serve` (feature `serve`): the server's `response_format` and `grammar` fields, read as
//!   chapter 11's `Formats`. The rest of the chapter builds without the server.

pub mod budget;
pub mod formats;
pub mod gbnf;
pub mod mask;
pub mod matcher;
pub mod schema;
#[cfg(feature = "serve")]
pub mod serve;

pub use formats::{CompileError, Source, Structured, compile};
pub use gbnf::{Grammar, GrammarError};
pub use mask::{Constraint, TokenIndex};
