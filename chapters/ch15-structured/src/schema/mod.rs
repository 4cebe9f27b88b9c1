//! JSON Schema to a GBNF grammar, after llama.cpp's `common/json-schema-to-grammar.cpp`.
//!
//! A schema becomes a grammar in two steps, as in llama.cpp. First the schema document is read
//! into a tree of `Node`s of the subset the conversion understands (`type`, `properties`,
//! `items`, `enum`, `anyOf`, `$ref`, …), with every `$ref` resolved inside the document. Then
//! the tree is visited and each node adds the rules that derive the JSON text it allows:
//! `"{" space a-kv "," space b-kv space "}"` for an object with two required properties,
//! `"[" space item ("," space item){2,4} space "]"` for an array of three to five items, a
//! digit-by-digit construction for an integer range. Rule names and rule text are llama.cpp's,
//! so its expected grammars can be compared with ours byte for byte.
//!
//! What llama.cpp does with a keyword it cannot turn into grammar is to drop it: the grammar
//! then accepts text the schema rejects. Here that depends on [`Strictness`]: by default
//! ([`Strictness::Strict`]) such a keyword is an error naming it and where it is; with
//! [`Strictness::LikeLlamaCpp`] the conversion does what llama.cpp does and says what it
//! dropped in [`Conversion::warnings`]. Keywords that only annotate (`title`, `description`,
//! `examples`, …) are never a problem, nor is a keyword that cannot apply to the one type the
//! grammar produces (`minLength` next to `"type": "integer"`). Strictly, two slips of
//! llama.cpp's integer ranges are mended too (see `IntRange`), a number's `minimum` and
//! `maximum` are enforced as an integer's are (llama.cpp drops them: see `NumRange`), and a few schemas whose
//! llama.cpp grammar would be unparsable or unsatisfiable (a minimum above the maximum,
//! `{5,3}`) are errors in both modes.
//!
//! Properties keep the order the schema gives them, as llama.cpp's do: [`convert_text`] reads
//! that order from the text; a [`Value`] has it only with `serde_json`'s `preserve_order`.
//!
//! Everything hostile input could blow up is bounded by a named limit: nesting
//! ([`MAX_JSON_DEPTH`], [`MAX_SCHEMA_DEPTH`]), the tree `type` lists expand into
//! ([`MAX_SCHEMA_NODES`]), the work of the visit ([`MAX_VISITS`]), the grammar
//! ([`MAX_RULES`], [`MAX_GRAMMAR_BYTES`]) and every `{m,n}` count in it ([`MAX_REPETITION`]).
//!
//! The files, in the order a schema goes through them: this one holds the entry points, the
//! limits, the errors and what is strict; `json` reads the schema's text keeping key order;
//! `keywords` says what each keyword constrains; `read` builds the schema tree (`tree`) from the
//! document, with `refs` following `$ref`s; `convert` visits the tree and adds rules, with
//! `objects` for objects and `allOf`, `integers` for integer ranges, `decimals` for number
//! ranges and `pattern` for
//! regular expressions; `primitives` and `syntax` are the rules and the GBNF text they share.

mod convert;
mod decimals;
mod integers;
mod json;
mod keywords;
mod objects;
mod pattern;
mod primitives;
mod read;
mod refs;
mod syntax;
mod tree;

use std::collections::HashSet;

use crate::gbnf::STOP_CHECK_STEPS;

use serde_json::Value;

use convert::Converter;
use json::Json;
use read::Builder;

/// The deepest JSON nesting read, from text or from a [`Value`]: a schema at
/// [`MAX_SCHEMA_DEPTH`] through `properties` takes two JSON levels per schema level, and the
/// rest leaves room for `enum` values. Reading, converting and dropping such a tree recurses
/// once per level, far within the smallest thread stack.
pub const MAX_JSON_DEPTH: usize = 512;

/// The deepest nesting of subschemas, counting each `$ref` followed as one more level. Real
/// schemas nest a dozen levels; each level costs a few stack frames of the reader and of the
/// visit, so 128 stays far from the stack's end while allowing any schema a person writes.
pub const MAX_SCHEMA_DEPTH: usize = 128;

/// The most nodes the schema tree may have. A `type` list is read as one copy of the schema
/// per type, so `type` lists nested in each other multiply; this bounds that growth. Real
/// schemas have hundreds of nodes.
pub const MAX_SCHEMA_NODES: usize = 50_000;

/// The most schema nodes the visit may enter. Each node is normally entered once; an `allOf`
/// enters the properties of every object it combines again, and `allOf`s that combine the
/// same object twice, nested, would double the work at each level.
pub const MAX_VISITS: usize = 4 * MAX_SCHEMA_NODES;

/// The most rules a grammar may have: a few per schema node, and the matcher keeps one entry
/// per rule for every decoding step, so ten times a large tool schema's count (about 2,000).
pub const MAX_RULES: usize = 20_000;

/// The largest grammar text produced: the most the grammar parser accepts.
pub const MAX_GRAMMAR_BYTES: usize = crate::gbnf::MAX_GRAMMAR_BYTES;

/// The largest count written in `{m,n}` (for `minItems`, `maxLength`, a pattern's `{m,n}`):
/// llama.cpp's grammar parser refuses larger ones (`MAX_REPETITION_THRESHOLD`), because each
/// count becomes that many copies of the repeated rule.
pub const MAX_REPETITION: u64 = crate::gbnf::MAX_REPETITION;

/// llama.cpp's limit on nested groups in a `pattern`; a deeper pattern is not converted.
pub const MAX_PATTERN_DEPTH: usize = 100;

/// Why a schema could not be converted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SchemaError {
    /// The schema text is not JSON.
    #[error("schema is not valid JSON at byte {offset}: {message}")]
    Json { offset: usize, message: String },
    /// The JSON nests deeper than [`MAX_JSON_DEPTH`].
    #[error("schema JSON nests deeper than MAX_JSON_DEPTH ({limit} levels)")]
    JsonTooDeep { limit: usize },
    /// Subschemas (and `$ref`s followed) nest deeper than [`MAX_SCHEMA_DEPTH`].
    #[error(
        "schema at `{path}` nests deeper than MAX_SCHEMA_DEPTH ({limit} levels of subschemas and $refs)"
    )]
    TooDeep { path: String, limit: usize },
    /// The schema tree, `type` lists expanded, has more than [`MAX_SCHEMA_NODES`] nodes.
    #[error("schema expands to more than MAX_SCHEMA_NODES ({limit}) subschemas")]
    TooManyNodes { limit: usize },
    /// The visit entered more than [`MAX_VISITS`] nodes.
    #[error("converting the schema enters more than MAX_VISITS ({limit}) subschemas")]
    TooMuchWork { limit: usize },
    /// The schema breaks a rule of JSON Schema that the conversion relies on.
    #[error("invalid schema at `{path}`: {message}")]
    Invalid { path: String, message: String },
    /// A keyword the grammar would not enforce ([`Strictness::Strict`] only), or one this
    /// converter does not know.
    #[error("keyword `{keyword}` at `{path}` is not supported: {reason}")]
    Unsupported {
        path: String,
        keyword: String,
        reason: String,
    },
    /// A `$ref` that cannot be followed: not into this document, or to nothing in it.
    #[error("$ref `{reference}` at `{path}` cannot be followed: {reason}")]
    Ref {
        path: String,
        reference: String,
        reason: String,
    },
    /// A `$ref` cycle that consumes no text, which would make a left-recursive grammar.
    #[error("$ref `{reference}` leads back to itself before any text is matched (left recursion)")]
    LeftRecursion { reference: String },
    /// A `pattern` that is not a regular expression.
    #[error("pattern `{pattern}` at `{path}` is not a valid regular expression: {reason}")]
    InvalidPattern {
        path: String,
        pattern: String,
        reason: String,
    },
    /// A `pattern` outside the subset llama.cpp converts ([`Strictness::Strict`] only).
    #[error("pattern `{pattern}` at `{path}` is not supported: {reason}")]
    UnsupportedPattern {
        path: String,
        pattern: String,
        reason: String,
    },
    /// A count above [`MAX_REPETITION`] in `{m,n}`.
    #[error("repetition count {count} at `{path}` exceeds MAX_REPETITION ({limit})")]
    RepetitionTooLarge {
        path: String,
        count: u64,
        limit: u64,
    },
    /// The grammar needs more than [`MAX_RULES`] rules.
    #[error("the grammar needs more than MAX_RULES ({limit}) rules")]
    TooManyRules { limit: usize },
    /// The grammar text grows past [`MAX_GRAMMAR_BYTES`].
    #[error("the grammar grows past MAX_GRAMMAR_BYTES ({limit} bytes)")]
    GrammarTooLarge { limit: usize },
    /// The conversion was given up ([`schema_text_to_grammar_until`]).
    #[error("converting stopped: the request was cancelled")]
    Cancelled,
}

// ANCHOR: strictness
/// What the conversion does with a constraint it cannot put into the grammar.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Strictness {
    /// Refuse the schema: an error names the keyword (or pattern) and where it is. The grammar
    /// never accepts text the schema rejects because of something dropped.
    #[default]
    Strict,
    /// Do what llama.cpp does: drop it, accept what the rest allows, and say so in
    /// [`Conversion::warnings`]. The grammars are llama.cpp's, byte for byte.
    LikeLlamaCpp,
}
// ANCHOR_END: strictness

/// A converted schema.
#[derive(Debug, Clone, PartialEq)]
pub struct Conversion {
    /// The grammar, root rule `root`, one `name ::= body` line per rule in name order.
    pub grammar: String,
    /// What was dropped ([`Strictness::LikeLlamaCpp`]), one message each.
    pub warnings: Vec<String>,
}

/// The grammar of a JSON Schema, strictly ([`Strictness::Strict`]).
///
/// Properties come in the order of `schema`'s maps: a `serde_json` map keeps insertion order
/// only with its `preserve_order` feature, and is sorted by name otherwise. To keep the order
/// a schema's text gives, use [`schema_text_to_grammar`].
pub fn schema_to_grammar(schema: &Value) -> Result<String, SchemaError> {
    convert(schema, Strictness::Strict).map(|c| c.grammar)
}

/// The grammar of a JSON Schema given as text, strictly; properties in the text's order.
pub fn schema_text_to_grammar(text: &str) -> Result<String, SchemaError> {
    schema_text_to_grammar_until(text, &|| false)
}

/// [`schema_text_to_grammar`], giving up with [`SchemaError::Cancelled`] once `stop` says so
/// (asked every [`STOP_CHECK_STEPS`] subschemas read or visited, or pattern characters).
pub fn schema_text_to_grammar_until(
    text: &str,
    stop: &dyn Fn() -> bool,
) -> Result<String, SchemaError> {
    convert_json(&Json::parse(text)?, Strictness::Strict, stop).map(|c| c.grammar)
}

/// Convert a schema held as a [`Value`] (see [`schema_to_grammar`] on property order).
pub fn convert(schema: &Value, strictness: Strictness) -> Result<Conversion, SchemaError> {
    convert_json(&Json::from_value(schema, 0)?, strictness, &|| false)
}

/// Convert a schema given as JSON text, keeping the order of its properties, as llama.cpp
/// does (its JSON objects keep insertion order).
pub fn convert_text(text: &str, strictness: Strictness) -> Result<Conversion, SchemaError> {
    convert_json(&Json::parse(text)?, strictness, &|| false)
}

fn convert_json(
    schema: &Json,
    strictness: Strictness,
    stop: &dyn Fn() -> bool,
) -> Result<Conversion, SchemaError> {
    let mut warnings = Warnings {
        strictness,
        list: Vec::new(),
        seen: HashSet::new(),
    };
    let doc = Builder::build(schema, &mut warnings, Stop::new(stop))?;
    let mut conv = Converter::new(&doc, &mut warnings, Stop::new(stop));
    conv.visit(doc.root, "", 0)?;
    let grammar = conv.format_grammar();
    Ok(Conversion {
        grammar,
        warnings: warnings.list,
    })
}

/// The question whose answer gives the conversion up, asked every [`STOP_CHECK_STEPS`] steps.
struct Stop<'s> {
    ask: &'s dyn Fn() -> bool,
    steps: usize,
}

impl<'s> Stop<'s> {
    fn new(ask: &'s dyn Fn() -> bool) -> Self {
        Stop { ask, steps: 0 }
    }

    fn step(&mut self) -> Result<(), SchemaError> {
        self.steps += 1;
        if self.steps.is_multiple_of(STOP_CHECK_STEPS) && (self.ask)() {
            return Err(SchemaError::Cancelled);
        }
        Ok(())
    }
}

/// Problems that are errors when strict and warnings otherwise.
struct Warnings {
    strictness: Strictness,
    list: Vec<String>,
    seen: HashSet<String>,
}

impl Warnings {
    fn report(&mut self, err: SchemaError) -> Result<(), SchemaError> {
        match self.strictness {
            Strictness::Strict => Err(err),
            Strictness::LikeLlamaCpp => {
                self.warn(err.to_string());
                Ok(())
            }
        }
    }

    fn warn(&mut self, msg: String) {
        if self.seen.insert(msg.clone()) {
            self.list.push(msg);
        }
    }
}

fn invalid(path: &str, message: impl Into<String>) -> SchemaError {
    SchemaError::Invalid {
        path: path.to_string(),
        message: message.into(),
    }
}

fn unsupported(path: &str, keyword: &str, reason: impl Into<String>) -> SchemaError {
    SchemaError::Unsupported {
        path: path.to_string(),
        keyword: keyword.to_string(),
        reason: reason.into(),
    }
}
