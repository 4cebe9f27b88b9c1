//! Where users ask for structure: the command line's `--grammar`, `--grammar-file`,
//! `--json-schema`, `--json-schema-file` (llama.cpp's names), and the server's
//! `response_format` (OpenAI's `json_object` and `json_schema`) and `grammar` (llama-server's;
//! read in `serve`, with the feature of that name). Both end in [`compile`]: text of a grammar
//! or a schema, checked, as a [`Constraint`]. A server compiles with [`compile_until`], which
//! gives up once the request is cancelled, and keeps what it compiled in [`Structured`].

use crate::gbnf::{Grammar, GrammarError};
use crate::mask::{Constraint, IndexCell};
use crate::matcher::{MatchError, Scratch};
use crate::schema::{SchemaError, schema_text_to_grammar_until};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// The schema of OpenAI's `{"type": "json_object"}`: any JSON object.
pub const JSON_OBJECT_SCHEMA: &str = r#"{"type": "object"}"#;

/// Grammars a server keeps compiled, by their text, so that requests with the same schema
/// share the masks computed so far. Few applications use more than a handful of schemas; past
/// this many the server starts again. With [`MASK_CACHE_BYTES`](crate::mask::MASK_CACHE_BYTES)
/// each, the masks a server keeps stay under 64 MiB whatever its clients send.
pub const MAX_COMPILED: usize = 16;

/// The longest source text kept as a key of the compiled grammars: a grammar may be no longer
/// ([`MAX_GRAMMAR_BYTES`](crate::gbnf::MAX_GRAMMAR_BYTES)), and a schema that long is far
/// beyond any real one. The keys then hold at most 16 MiB, whatever the server's body limit;
/// a longer schema is compiled for each request that sends it.
pub const MAX_CACHED_SOURCE_BYTES: usize = crate::gbnf::MAX_GRAMMAR_BYTES;

// ANCHOR: compile
/// What to constrain output to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Source {
    /// GBNF text, root rule `root`.
    Grammar(String),
    /// A JSON Schema, as JSON text.
    JsonSchema(String),
}

/// A grammar or schema that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error("grammar: {0}")]
    Grammar(GrammarError),
    #[error("JSON schema: {0}")]
    Schema(SchemaError),
    #[error("JSON schema: the grammar made of it: {0}")]
    SchemaGrammar(GrammarError),
    #[error("grammar: {0}")]
    Start(MatchError),
    #[error("grammar: compiling stopped: the request was cancelled")]
    Cancelled,
}

/// The grammar `source` asks for, checked: parsed from rule `root`, or converted from the
/// schema and parsed, and its start computed. Every step is linear in the text (see
/// `cargo bench -p ch15 --bench compile`).
pub fn compile(source: &Source) -> Result<Grammar, CompileError> {
    compile_until(source, &|| false)
}

/// [`compile`], giving up with [`CompileError::Cancelled`] once `stop` says so: the server's
/// request was cancelled while its grammar compiled. Each step asks every
/// [`STOP_CHECK_STEPS`](crate::gbnf::STOP_CHECK_STEPS) steps.
pub fn compile_until(source: &Source, stop: &dyn Fn() -> bool) -> Result<Grammar, CompileError> {
    // A grammar whose every sentence has a NUL in it cannot be generated: refused here.
    let generable = |g: Grammar| {
        if g.needs_nul() {
            Err(GrammarError::NeedsNul)
        } else {
            Ok(g)
        }
    };
    let grammar = match source {
        Source::Grammar(text) => Grammar::parse_until(text, "root", stop).and_then(generable)?,
        Source::JsonSchema(text) => {
            let gbnf = schema_text_to_grammar_until(text, stop)?;
            let parsed = Grammar::parse_until(&gbnf, "root", stop).and_then(generable);
            parsed.map_err(|e| match e {
                GrammarError::Cancelled => CompileError::Cancelled,
                e => CompileError::SchemaGrammar(e),
            })?
        }
    };
    // A grammar whose readings explode before the first character is refused here, not at
    // the first generation.
    grammar.initial_stacks_until(&mut Scratch::default(), stop)?;
    Ok(grammar)
}
// ANCHOR_END: compile

/// A cancelled compile is one error, whichever step saw it.
impl From<GrammarError> for CompileError {
    fn from(e: GrammarError) -> Self {
        match e {
            GrammarError::Cancelled => CompileError::Cancelled,
            e => CompileError::Grammar(e),
        }
    }
}

impl From<SchemaError> for CompileError {
    fn from(e: SchemaError) -> Self {
        match e {
            SchemaError::Cancelled => CompileError::Cancelled,
            e => CompileError::Schema(e),
        }
    }
}

impl From<MatchError> for CompileError {
    fn from(e: MatchError) -> Self {
        match e {
            MatchError::Cancelled => CompileError::Cancelled,
            e => CompileError::Start(e),
        }
    }
}

// ANCHOR: structured
/// The grammars a server has compiled, by their text: all share the vocabulary's trie, and the
/// same text compiles once.
#[derive(Debug, Default)]
pub struct Structured {
    index: Arc<IndexCell>,
    compiled: Mutex<HashMap<Source, Constraint>>,
}

impl Structured {
    /// The rule of `source`, compiled once.
    pub fn constraint(&self, source: Source) -> Result<Constraint, CompileError> {
        self.constraint_until(source, &|| false)
    }

    /// [`Structured::constraint`], giving up once `stop` says so; a compile given up is not
    /// kept. The cache is locked to look up and to insert, not while compiling: one request's
    /// long grammar holds up no other request.
    pub fn constraint_until(
        &self,
        source: Source,
        stop: &dyn Fn() -> bool,
    ) -> Result<Constraint, CompileError> {
        let cached = self.compiled().get(&source).cloned();
        if let Some(c) = cached {
            return Ok(c);
        }
        let c = Constraint::sharing(compile_until(&source, stop)?, self.index.clone());
        let (Source::Grammar(text) | Source::JsonSchema(text)) = &source;
        if text.len() > MAX_CACHED_SOURCE_BYTES {
            return Ok(c);
        }
        let mut compiled = self.compiled();
        // Another request may have compiled the same text meanwhile: share its masks.
        if let Some(c) = compiled.get(&source) {
            return Ok(c.clone());
        }
        if compiled.len() >= MAX_COMPILED {
            compiled.clear();
        }
        compiled.insert(source, c.clone());
        Ok(c)
    }

    /// Build the vocabulary's trie now, before the first grammar needs it.
    pub fn build_index(&self, tokenizer: &ch02::Tokenizer) {
        self.index.get(tokenizer);
    }

    fn compiled(&self) -> MutexGuard<'_, HashMap<Source, Constraint>> {
        // A panic elsewhere while holding the lock leaves a valid map (inserts are whole).
        self.compiled.lock().unwrap_or_else(|e| e.into_inner())
    }
}
// ANCHOR_END: structured
