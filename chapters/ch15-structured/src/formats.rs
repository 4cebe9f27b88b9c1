//! Where users ask for structure: the command line's `--grammar`, `--grammar-file`,
//! `--json-schema`, `--json-schema-file` (llama.cpp's names), and the server's
//! `response_format` (OpenAI's `json_object` and `json_schema`) and `grammar` (llama-server's).
//! Both end in [`compile`]: text of a grammar or a schema, checked, as a [`Constraint`].
//! The server compiles with [`compile_until`], which gives up once the request is cancelled.

use crate::api::{ApiError, Cancel};
use crate::gbnf::{Grammar, GrammarError};
use crate::mask::{Constraint, IndexCell};
use crate::matcher::{MatchError, Scratch};
use crate::schema::{SchemaError, schema_text_to_grammar_until};
use crate::{Formats, MakeRule};
use serde_json::Value;
use serde_json::value::RawValue;
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
/// The server's output forms ([`Formats`]): plain text, `json_object`, `json_schema`, and a
/// GBNF `grammar`. All grammars share the vocabulary's trie; the same text compiles once.
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

    fn compiled(&self) -> MutexGuard<'_, HashMap<Source, Constraint>> {
        // A panic elsewhere while holding the lock leaves a valid map (inserts are whole).
        self.compiled.lock().unwrap_or_else(|e| e.into_inner())
    }
}
// ANCHOR_END: structured

/// The fields of a `response_format` this server reads. `schema` stays text, so that its
/// properties keep their order.
#[derive(serde::Deserialize)]
struct ResponseFormat<'a> {
    #[serde(rename = "type")]
    kind: String,
    #[serde(borrow)]
    json_schema: Option<JsonSchemaField<'a>>,
    /// llama-server's `{"type": "json_object", "schema": {…}}`.
    #[serde(borrow)]
    schema: Option<&'a RawValue>,
}

#[derive(serde::Deserialize)]
struct JsonSchemaField<'a> {
    #[serde(borrow)]
    schema: Option<&'a RawValue>,
}

// ANCHOR: formats_rule
impl Formats for Structured {
    fn rule(
        &self,
        response_format: Option<&RawValue>,
        grammar: Option<&Value>,
        cancel: &Cancel,
    ) -> Result<Option<Arc<dyn MakeRule>>, ApiError> {
        let bad_format = |m: String| ApiError::invalid("response_format", m);
        let from_format = match response_format.map(RawValue::get) {
            None | Some("null") => None,
            Some(text) => {
                let f: ResponseFormat = serde_json::from_str(text).map_err(|e| {
                    bad_format(format!(
                        "`response_format` must be an object with a `type`: {e}"
                    ))
                })?;
                match (f.kind.as_str(), f.json_schema, f.schema) {
                    ("text", _, _) => None,
                    ("json_object", _, None) => {
                        Some(Source::JsonSchema(JSON_OBJECT_SCHEMA.to_string()))
                    }
                    ("json_object", _, Some(s)) => Some(Source::JsonSchema(s.get().to_string())),
                    ("json_schema", Some(JsonSchemaField { schema: Some(s) }), _) => {
                        Some(Source::JsonSchema(s.get().to_string()))
                    }
                    ("json_schema", _, _) => {
                        return Err(bad_format(
                            "`response_format` of type `json_schema` needs \
                             `json_schema.schema`"
                                .into(),
                        ));
                    }
                    (other, _, _) => {
                        return Err(bad_format(format!(
                            "`response_format.type` is {:?}; this server knows `text`, \
                             `json_object` and `json_schema`",
                            crate::api::echo(other)
                        )));
                    }
                }
            }
        };
        // ANCHOR_END: formats_rule
        // ANCHOR: formats_choice
        let from_grammar = match grammar {
            None | Some(Value::Null) => None,
            Some(Value::String(g)) => Some(Source::Grammar(g.clone())),
            Some(_) => {
                return Err(ApiError::invalid(
                    "grammar",
                    "`grammar` must be a string of GBNF",
                ));
            }
        };
        let (source, field) = match (from_format, from_grammar) {
            (None, None) => return Ok(None),
            (Some(_), Some(_)) => {
                return Err(ApiError::invalid(
                    "grammar",
                    "give either `grammar` or a `response_format` with a schema, not both",
                ));
            }
            (Some(s), None) => (s, "response_format"),
            (None, Some(g)) => (g, "grammar"),
        };
        // A grammar at the size limit compiles in tens of milliseconds (`cargo bench -p ch15
        // --bench compile`); a request cancelled meanwhile stops it, and its error goes nowhere.
        let c = self
            .constraint_until(source, &|| cancel.is_cancelled())
            .map_err(|e| ApiError::invalid(field, e.to_string()))?;
        Ok(Some(Arc::new(c)))
    }

    /// Build the vocabulary's trie now, not in the first constrained request's time to first
    /// token (15 ms on the default model, 134 ms on Gemma 3's 262k tokens).
    fn prepare(&self, tokenizer: &crate::Tokenizer) {
        self.index.get(tokenizer);
    }
}
// ANCHOR_END: formats_choice
