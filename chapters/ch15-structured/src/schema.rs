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
//! llama.cpp's integer ranges are mended too (see `IntRange`), and a few schemas whose
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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;

use crate::gbnf::STOP_CHECK_STEPS;

use serde_json::Value;

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

// ---------------------------------------------------------------------------------------------
// JSON that keeps the order of object keys
// ---------------------------------------------------------------------------------------------

/// A JSON value whose objects keep their keys in order (llama.cpp's `common_json` does).
#[derive(Debug, Clone, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

fn get<'j>(obj: &'j [(String, Json)], key: &str) -> Option<&'j Json> {
    obj.iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

fn has(obj: &[(String, Json)], key: &str) -> bool {
    get(obj, key).is_some()
}

impl Json {
    fn from_value(v: &Value, depth: usize) -> Result<Json, SchemaError> {
        if depth > MAX_JSON_DEPTH {
            return Err(SchemaError::JsonTooDeep {
                limit: MAX_JSON_DEPTH,
            });
        }
        Ok(match v {
            Value::Null => Json::Null,
            Value::Bool(b) => Json::Bool(*b),
            Value::Number(n) => {
                if let Some(i) = n.as_i64() {
                    Json::Int(i)
                } else if let Some(u) = n.as_u64() {
                    Json::UInt(u)
                } else {
                    Json::Float(n.as_f64().unwrap_or(f64::NAN))
                }
            }
            Value::String(s) => Json::Str(s.clone()),
            Value::Array(a) => Json::Array(
                a.iter()
                    .map(|x| Json::from_value(x, depth + 1))
                    .collect::<Result<_, _>>()?,
            ),
            Value::Object(o) => Json::Object(
                o.iter()
                    .map(|(k, x)| Ok((k.clone(), Json::from_value(x, depth + 1)?)))
                    .collect::<Result<_, SchemaError>>()?,
            ),
        })
    }

    fn parse(text: &str) -> Result<Json, SchemaError> {
        let mut p = JsonParser {
            s: text.as_bytes(),
            pos: 0,
        };
        p.ws();
        let v = p.value(0)?;
        p.ws();
        if p.pos != p.s.len() {
            return Err(p.err("unexpected text after the JSON value"));
        }
        Ok(v)
    }

    fn as_str(&self) -> Option<&str> {
        match self {
            Json::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The text of this value as llama.cpp writes it (nlohmann's `dump()`: no spaces, keys in
    /// order, UTF-8 unescaped, shortest round-trip floats).
    fn dump(&self, out: &mut String) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Int(i) => {
                let _ = write!(out, "{i}");
            }
            Json::UInt(u) => {
                let _ = write!(out, "{u}");
            }
            Json::Float(f) => dump_float(*f, out),
            Json::Str(s) => dump_string(s, out),
            Json::Array(a) => {
                out.push('[');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    x.dump(out);
                }
                out.push(']');
            }
            Json::Object(o) => {
                out.push('{');
                for (i, (k, x)) in o.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    dump_string(k, out);
                    out.push(':');
                    x.dump(out);
                }
                out.push('}');
            }
        }
    }

    fn dumped(&self) -> String {
        let mut s = String::new();
        self.dump(&mut s);
        s
    }
}

fn dump_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// nlohmann's float text: the shortest digits that read back to the same double, written
/// plainly while the decimal point is within 15 digits of them (with `.0` on whole numbers),
/// as `d.ddde+XX` otherwise.
fn dump_float(f: f64, out: &mut String) {
    if !f.is_finite() {
        out.push_str("null");
        return;
    }
    if f.is_sign_negative() {
        out.push('-');
    }
    if f == 0.0 {
        out.push_str("0.0");
        return;
    }
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let exp: i64 = exp.parse().unwrap_or(0);
    let k = digits.len() as i64;
    let n = exp + 1;
    if k <= n && n <= 15 {
        out.push_str(&digits);
        out.extend(std::iter::repeat_n('0', (n - k) as usize));
        out.push_str(".0");
    } else if 0 < n && n <= 15 {
        out.push_str(&digits[..n as usize]);
        out.push('.');
        out.push_str(&digits[n as usize..]);
    } else if -4 < n && n <= 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', (-n) as usize));
        out.push_str(&digits);
    } else {
        out.push_str(&digits[..1]);
        if k > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let e = n - 1;
        let _ = write!(out, "e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs());
    }
}

/// A JSON reader that keeps key order; a repeated key keeps its first place and its last
/// value (as nlohmann's ordered map does).
struct JsonParser<'a> {
    s: &'a [u8],
    pos: usize,
}

impl JsonParser<'_> {
    fn err(&self, message: &str) -> SchemaError {
        SchemaError::Json {
            offset: self.pos,
            message: message.to_string(),
        }
    }

    fn ws(&mut self) {
        while self.pos < self.s.len() && matches!(self.s[self.pos], b' ' | b'\t' | b'\n' | b'\r') {
            self.pos += 1;
        }
    }

    fn eat(&mut self, b: u8) -> bool {
        if self.s.get(self.pos) == Some(&b) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn value(&mut self, depth: usize) -> Result<Json, SchemaError> {
        if depth > MAX_JSON_DEPTH {
            return Err(SchemaError::JsonTooDeep {
                limit: MAX_JSON_DEPTH,
            });
        }
        match self.s.get(self.pos) {
            Some(b'{') => self.object(depth),
            Some(b'[') => {
                self.pos += 1;
                let mut items = Vec::new();
                self.ws();
                if self.eat(b']') {
                    return Ok(Json::Array(items));
                }
                loop {
                    self.ws();
                    items.push(self.value(depth + 1)?);
                    self.ws();
                    if self.eat(b']') {
                        return Ok(Json::Array(items));
                    }
                    if !self.eat(b',') {
                        return Err(self.err("expected `,` or `]`"));
                    }
                }
            }
            Some(b'"') => Ok(Json::Str(self.string()?)),
            Some(b't') => self.word("true", Json::Bool(true)),
            Some(b'f') => self.word("false", Json::Bool(false)),
            Some(b'n') => self.word("null", Json::Null),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(_) => Err(self.err("expected a JSON value")),
            None => Err(self.err("unexpected end of text")),
        }
    }

    fn word(&mut self, w: &str, v: Json) -> Result<Json, SchemaError> {
        if self.s[self.pos..].starts_with(w.as_bytes()) {
            self.pos += w.len();
            Ok(v)
        } else {
            Err(self.err("expected a JSON value"))
        }
    }

    fn object(&mut self, depth: usize) -> Result<Json, SchemaError> {
        self.pos += 1;
        let mut entries: Vec<(String, Json)> = Vec::new();
        let mut index: HashMap<String, usize> = HashMap::new();
        self.ws();
        if self.eat(b'}') {
            return Ok(Json::Object(entries));
        }
        loop {
            self.ws();
            if self.s.get(self.pos) != Some(&b'"') {
                return Err(self.err("expected a string key"));
            }
            let key = self.string()?;
            self.ws();
            if !self.eat(b':') {
                return Err(self.err("expected `:`"));
            }
            self.ws();
            let v = self.value(depth + 1)?;
            match index.get(&key) {
                Some(&i) => entries[i].1 = v,
                None => {
                    index.insert(key.clone(), entries.len());
                    entries.push((key, v));
                }
            }
            self.ws();
            if self.eat(b'}') {
                return Ok(Json::Object(entries));
            }
            if !self.eat(b',') {
                return Err(self.err("expected `,` or `}`"));
            }
        }
    }

    fn hex4(&mut self) -> Result<u32, SchemaError> {
        let h = self
            .s
            .get(self.pos..self.pos + 4)
            .ok_or_else(|| self.err("short \\u escape"))?;
        let h = std::str::from_utf8(h).map_err(|_| self.err("bad \\u escape"))?;
        let v = u32::from_str_radix(h, 16).map_err(|_| self.err("bad \\u escape"))?;
        self.pos += 4;
        Ok(v)
    }

    fn string(&mut self) -> Result<String, SchemaError> {
        self.pos += 1;
        let mut out = String::new();
        loop {
            let start = self.pos;
            while self.pos < self.s.len() && !matches!(self.s[self.pos], b'"' | b'\\' | 0..=0x1f) {
                self.pos += 1;
            }
            // The text is a `&str` and the run stops at ASCII bytes, so it is whole characters.
            out.push_str(std::str::from_utf8(&self.s[start..self.pos]).unwrap_or_default());
            match self.s.get(self.pos) {
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.pos += 1;
                    let Some(&e) = self.s.get(self.pos) else {
                        return Err(self.err("unterminated string"));
                    };
                    self.pos += 1;
                    match e {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let mut c = self.hex4()?;
                            if (0xD800..0xDC00).contains(&c) {
                                if !(self.eat(b'\\') && self.eat(b'u')) {
                                    return Err(self.err("lone surrogate in \\u escape"));
                                }
                                let lo = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&lo) {
                                    return Err(self.err("lone surrogate in \\u escape"));
                                }
                                c = 0x10000 + ((c - 0xD800) << 10) + (lo - 0xDC00);
                            }
                            out.push(
                                char::from_u32(c)
                                    .ok_or_else(|| self.err("lone surrogate in \\u escape"))?,
                            );
                        }
                        _ => return Err(self.err("unknown escape")),
                    }
                }
                Some(_) => return Err(self.err("control character in string")),
                None => return Err(self.err("unterminated string")),
            }
        }
    }

    fn number(&mut self) -> Result<Json, SchemaError> {
        let start = self.pos;
        self.eat(b'-');
        let digits = |p: &mut Self| {
            let s = p.pos;
            while p.pos < p.s.len() && p.s[p.pos].is_ascii_digit() {
                p.pos += 1;
            }
            p.pos - s
        };
        if self.eat(b'0') {
        } else if digits(self) == 0 {
            return Err(self.err("expected digits"));
        }
        let mut float = false;
        if self.eat(b'.') {
            float = true;
            if digits(self) == 0 {
                return Err(self.err("expected digits after `.`"));
            }
        }
        if self.eat(b'e') || self.eat(b'E') {
            float = true;
            if !self.eat(b'+') {
                self.eat(b'-');
            }
            if digits(self) == 0 {
                return Err(self.err("expected exponent digits"));
            }
        }
        let text = std::str::from_utf8(&self.s[start..self.pos]).unwrap_or_default();
        if !float {
            if let Ok(i) = text.parse::<i64>() {
                return Ok(Json::Int(i));
            }
            if let Ok(u) = text.parse::<u64>() {
                return Ok(Json::UInt(u));
            }
        }
        text.parse::<f64>()
            .map(Json::Float)
            .map_err(|_| self.err("bad number"))
    }
}

// ---------------------------------------------------------------------------------------------
// Types and keywords
// ---------------------------------------------------------------------------------------------

/// A set of JSON types, one bit each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Types(u8);

impl Types {
    const NONE: Types = Types(0);
    const NULL: Types = Types(1);
    const BOOLEAN: Types = Types(2);
    const NUMBER: Types = Types(4);
    const INTEGER: Types = Types(8);
    const STRING: Types = Types(16);
    const ARRAY: Types = Types(32);
    const OBJECT: Types = Types(64);
    const ALL: Types = Types(127);

    fn or(self, o: Types) -> Types {
        Types(self.0 | o.0)
    }
    fn and(self, o: Types) -> Types {
        Types(self.0 & o.0)
    }
    fn within(self, o: Types) -> bool {
        self.0 & !o.0 == 0
    }

    /// The values `"type": name` allows (a number may be an integer).
    fn named(name: &str) -> Option<Types> {
        Some(match name {
            "null" => Types::NULL,
            "boolean" => Types::BOOLEAN,
            "number" => Types::NUMBER.or(Types::INTEGER),
            "integer" => Types::INTEGER,
            "string" => Types::STRING,
            "array" => Types::ARRAY,
            "object" => Types::OBJECT,
            _ => return None,
        })
    }

    /// The values a `type` keyword allows, or None when it is not a type name or a list of them.
    fn declared(ty: &Json) -> Option<Types> {
        match ty {
            Json::Str(s) => Types::named(s),
            Json::Array(a) => a.iter().try_fold(Types::NONE, |acc, t| {
                Some(acc.or(Types::named(t.as_str()?)?))
            }),
            _ => None,
        }
    }

    /// The type of a value (a whole-numbered float counts as an integer too).
    fn of(v: &Json) -> Types {
        match v {
            Json::Null => Types::NULL,
            Json::Bool(_) => Types::BOOLEAN,
            Json::Int(_) | Json::UInt(_) => Types::INTEGER,
            Json::Float(f) if f.fract() == 0.0 => Types::NUMBER.or(Types::INTEGER),
            Json::Float(_) => Types::NUMBER,
            Json::Str(_) => Types::STRING,
            Json::Array(_) => Types::ARRAY,
            Json::Object(_) => Types::OBJECT,
        }
    }

    /// Whether a value of type `self` is allowed by `declared`.
    fn allowed_by(self, declared: Types) -> bool {
        self.and(declared) != Types::NONE
    }
}

// ANCHOR: keyword_class
/// What a keyword does, for deciding whether leaving it out loosens the grammar.
enum KeywordClass {
    /// Says something about the schema, constrains nothing.
    Annotation,
    /// Constrains only values of these types.
    Typed(Types),
    /// Constrains values of every type.
    General,
    /// Not a keyword this converter knows.
    Unknown,
}

fn keyword_class(key: &str) -> KeywordClass {
    use KeywordClass::*;
    match key {
        // `format` and the `content*` keywords annotate by default in JSON Schema 2020-12.
        "title" | "description" | "$schema" | "$id" | "$comment" | "examples" | "default"
        | "deprecated" | "readOnly" | "writeOnly" | "$anchor" | "$dynamicAnchor"
        | "$recursiveAnchor" | "$vocabulary" | "$defs" | "definitions" | "format"
        | "contentEncoding" | "contentMediaType" | "contentSchema" => Annotation,
        "minLength" | "maxLength" | "pattern" => Typed(Types::STRING),
        "minimum" | "maximum" | "exclusiveMinimum" | "exclusiveMaximum" | "multipleOf" => {
            Typed(Types::NUMBER.or(Types::INTEGER))
        }
        "items" | "prefixItems" | "additionalItems" | "minItems" | "maxItems" | "uniqueItems"
        | "contains" | "minContains" | "maxContains" | "unevaluatedItems" => Typed(Types::ARRAY),
        "properties"
        | "required"
        | "additionalProperties"
        | "patternProperties"
        | "propertyNames"
        | "minProperties"
        | "maxProperties"
        | "dependentRequired"
        | "dependentSchemas"
        | "dependencies"
        | "unevaluatedProperties" => Typed(Types::OBJECT),
        "type" | "enum" | "const" | "allOf" | "anyOf" | "oneOf" | "not" | "if" | "then"
        | "else" | "$ref" | "$dynamicRef" | "$recursiveRef" => General,
        _ => Unknown,
    }
}
// ANCHOR_END: keyword_class

const NOT_ENFORCED: &str = "the grammar would not enforce it";

// ---------------------------------------------------------------------------------------------
// The schema tree (llama.cpp's `common_chat_schema`)
// ---------------------------------------------------------------------------------------------

type NodeId = usize;

/// The string formats llama.cpp has rules for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    None,
    Uuid,
    Date,
    Time,
    DateTime,
}

#[derive(Debug, Clone)]
struct Property {
    name: String,
    schema: NodeId,
    required: bool,
}

/// One node of the schema tree: the part of a schema the conversion understands.
#[derive(Debug, Clone)]
enum Kind {
    /// Any JSON value.
    Any,
    /// A `$ref` into the document; the target is in [`Document::refs`].
    Ref(String),
    /// `anyOf`, `oneOf`, or a `type` list (one alternative per type).
    AnyOf(Vec<NodeId>),
    AllOf(Vec<NodeId>),
    Const(Json),
    Enum(Vec<Json>),
    Null,
    Boolean,
    Number,
    /// Inclusive bounds; `i64::MIN` / `i64::MAX` for none.
    Integer {
        min: i64,
        max: i64,
    },
    String {
        /// Empty when absent (as in llama.cpp, an empty pattern constrains nothing).
        pattern: String,
        format: Format,
        min_length: u64,
        max_length: Option<u64>,
    },
    Array {
        items: NodeId,
        min_items: u64,
        max_items: Option<u64>,
    },
    Tuple(Vec<NodeId>),
    Object {
        properties: Vec<Property>,
        /// None when no other properties are allowed.
        additional: Option<NodeId>,
    },
}

#[derive(Debug, Clone)]
struct Node {
    kind: Kind,
    /// JSON pointer of the schema this node came from, for messages.
    path: String,
    /// A `type` next to `$ref`, `anyOf` or `allOf`, which the conversion leaves out: checked to
    /// add nothing (the alternatives' types already fall within it).
    declared: Option<Types>,
}

struct Document {
    nodes: Vec<Node>,
    refs: HashMap<String, NodeId>,
    root: NodeId,
}

impl Document {
    fn kind(&self, id: NodeId) -> &Kind {
        &self.nodes[id].kind
    }

    fn target(&self, reference: &str) -> Option<NodeId> {
        self.refs.get(reference).copied()
    }

    /// The types of the values a node allows, as llama.cpp computes them (a `$ref` cycle adds
    /// nothing).
    fn value_types(
        &self,
        id: NodeId,
        visiting: &mut HashSet<NodeId>,
        depth: usize,
        budget: &mut usize,
    ) -> Result<Types, SchemaError> {
        *budget = budget
            .checked_sub(1)
            .ok_or(SchemaError::TooMuchWork { limit: MAX_VISITS })?;
        if depth > MAX_SCHEMA_DEPTH {
            return Err(SchemaError::TooDeep {
                path: self.nodes[id].path.clone(),
                limit: MAX_SCHEMA_DEPTH,
            });
        }
        Ok(match self.kind(id) {
            Kind::Any => Types::ALL,
            Kind::Null => Types::NULL,
            Kind::Boolean => Types::BOOLEAN,
            Kind::Number => Types::NUMBER.or(Types::INTEGER),
            Kind::Integer { .. } => Types::INTEGER,
            Kind::String { .. } => Types::STRING,
            Kind::Array { .. } | Kind::Tuple(_) => Types::ARRAY,
            Kind::Object { .. } => Types::OBJECT,
            Kind::Const(v) => Types::of(v),
            Kind::Enum(vs) => vs.iter().fold(Types::NONE, |t, v| t.or(Types::of(v))),
            Kind::Ref(r) => {
                let Some(t) = self.target(r) else {
                    return Ok(Types::NONE);
                };
                if !visiting.insert(t) {
                    return Ok(Types::NONE);
                }
                let types = self.value_types(t, visiting, depth + 1, budget)?;
                visiting.remove(&t);
                types
            }
            Kind::AnyOf(children) => {
                let mut types = Types::NONE;
                for &c in children {
                    types = types.or(self.value_types(c, visiting, depth + 1, budget)?);
                }
                types
            }
            Kind::AllOf(children) => {
                let mut types = Types::ALL;
                for &c in children {
                    types = types.and(self.value_types(c, visiting, depth + 1, budget)?);
                }
                types
            }
        })
    }
}

/// Reads a schema into a [`Document`] (llama.cpp's `common_chat_schema_from_json`), checking
/// each keyword is used, an annotation, or cannot apply.
struct Builder<'j, 'w> {
    root: &'j Json,
    nodes: Vec<Node>,
    /// Each `$ref` built once; None while its target is being built (a cycle stops there).
    refs: HashMap<String, Option<NodeId>>,
    /// The keys of the large objects `$ref`s lead through (`$defs` with thousands of
    /// entries), by the object's address: found by a hash, not by reading the entries before.
    keys: HashMap<usize, HashMap<&'j str, &'j Json>>,
    warnings: &'w mut Warnings,
    stop: Stop<'w>,
}

/// Objects with more entries than this get an index of their keys when a `$ref` leads through
/// them; reading a few entries is quicker than hashing.
const INDEXED_OBJECT_ENTRIES: usize = 16;

impl<'j, 'w> Builder<'j, 'w> {
    fn build(
        root: &'j Json,
        warnings: &'w mut Warnings,
        stop: Stop<'w>,
    ) -> Result<Document, SchemaError> {
        let mut b = Builder {
            root,
            nodes: Vec::new(),
            refs: HashMap::new(),
            keys: HashMap::new(),
            warnings,
            stop,
        };
        let root_id = b.build_node(root, "#", 0, None)?;
        let refs = b
            .refs
            .iter()
            .filter_map(|(k, v)| v.map(|id| (k.clone(), id)))
            .collect::<HashMap<_, _>>();
        let doc = Document {
            nodes: std::mem::take(&mut b.nodes),
            refs,
            root: root_id,
        };
        check_left_recursion(&doc)?;
        // A `type` next to `$ref` or `anyOf` is left out: it must hold for every alternative.
        let mut budget = MAX_VISITS;
        for (id, node) in doc.nodes.iter().enumerate() {
            let Some(declared) = node.declared else {
                continue;
            };
            if matches!(node.kind, Kind::Ref(_) | Kind::AnyOf(_)) {
                let types = doc.value_types(id, &mut HashSet::new(), 0, &mut budget)?;
                if !types.within(declared) {
                    b.warnings.report(unsupported(
                        &node.path,
                        "type",
                        "some alternative allows another type, and the grammar would not \
                         enforce `type`",
                    ))?;
                }
            }
        }
        Ok(doc)
    }

    fn add(
        &mut self,
        kind: Kind,
        path: &str,
        declared: Option<Types>,
    ) -> Result<NodeId, SchemaError> {
        if self.nodes.len() >= MAX_SCHEMA_NODES {
            return Err(SchemaError::TooManyNodes {
                limit: MAX_SCHEMA_NODES,
            });
        }
        self.nodes.push(Node {
            kind,
            path: path.to_string(),
            declared,
        });
        Ok(self.nodes.len() - 1)
    }

    /// Report every keyword of `obj` that is neither used (`used`), an annotation, nor unable
    /// to apply to the values the node allows (`types`).
    fn check_rest(
        &mut self,
        obj: &[(String, Json)],
        used: &[&str],
        types: Types,
        path: &str,
    ) -> Result<(), SchemaError> {
        for (key, value) in obj {
            if used.contains(&key.as_str()) {
                continue;
            }
            match keyword_class(key) {
                KeywordClass::Annotation => {}
                KeywordClass::Typed(t) if !t.allowed_by(types) => {}
                KeywordClass::Unknown => self.warnings.report(unsupported(
                    path,
                    key,
                    "not a JSON Schema keyword this converter knows",
                ))?,
                _ if key == "additionalProperties" && *value == Json::Bool(true) => {}
                _ => self.warnings.report(unsupported(path, key, NOT_ENFORCED))?,
            }
        }
        Ok(())
    }

    /// Build the node of `schema`. `type_override` is one entry of a `type` list being
    /// expanded, `outer` what the whole list allows.
    fn build_node(
        &mut self,
        schema: &'j Json,
        path: &str,
        depth: usize,
        type_override: Option<(&'j Json, Option<Types>)>,
    ) -> Result<NodeId, SchemaError> {
        if depth > MAX_SCHEMA_DEPTH {
            return Err(SchemaError::TooDeep {
                path: path.to_string(),
                limit: MAX_SCHEMA_DEPTH,
            });
        }
        self.stop.step()?;
        let Json::Object(obj) = schema else {
            return Err(invalid(path, "schema must be an object"));
        };
        if let Some(r) = get(obj, "$ref") {
            return self.build_ref(obj, r, path, depth);
        }
        if has(obj, "oneOf") || has(obj, "anyOf") {
            let key = if has(obj, "oneOf") { "oneOf" } else { "anyOf" };
            let children =
                self.build_list(get(obj, key).unwrap_or(&Json::Null), path, key, depth)?;
            let declared = self.declared_type(obj, path)?;
            self.check_rest(obj, &[key, "type"], Types::ALL, path)?;
            return self.add(Kind::AnyOf(children), path, declared);
        }

        let (ty, outer) = match type_override {
            Some((t, outer)) => (Some(t), outer),
            None => (get(obj, "type"), None),
        };
        if let Some(Json::Array(types)) = ty {
            if types.is_empty() {
                return Err(invalid(path, "type must not be empty"));
            }
            let outer = Types::declared(ty.unwrap_or(&Json::Null));
            let mut children = Vec::with_capacity(types.len());
            for (i, t) in types.iter().enumerate() {
                let p = format!("{path}/type/{i}");
                children.push(self.build_node(schema, &p, depth, Some((t, outer)))?);
            }
            return self.add(Kind::AnyOf(children), path, None);
        }
        if let Some(v) = get(obj, "const") {
            self.check_value_types(std::slice::from_ref(v), ty, outer, path)?;
            self.check_rest(obj, &["const", "type"], Types::of(v), path)?;
            return self.add(Kind::Const(v.clone()), path, None);
        }
        if let Some(values) = get(obj, "enum") {
            let Json::Array(values) = values else {
                return Err(invalid(path, "enum must be a non-empty array"));
            };
            if values.is_empty() {
                return Err(invalid(path, "enum must be a non-empty array"));
            }
            self.check_value_types(values, ty, outer, path)?;
            let types = values.iter().fold(Types::NONE, |t, v| t.or(Types::of(v)));
            self.check_rest(obj, &["enum", "type"], types, path)?;
            return self.add(Kind::Enum(values.clone()), path, None);
        }
        let type_name = match ty {
            None | Some(Json::Null) => "",
            Some(Json::Str(s)) => s.as_str(),
            Some(_) => {
                return Err(invalid(
                    path,
                    "type must be a string or an array of strings",
                ));
            }
        };
        let has_properties = has(obj, "properties")
            || get(obj, "additionalProperties").is_some_and(|a| *a != Json::Bool(true));

        match type_name {
            "" => {
                if has_properties {
                    self.build_object(obj, path, depth)
                } else if has(obj, "allOf") {
                    self.build_all_of(obj, path, depth, None)
                } else if has(obj, "items") || has(obj, "prefixItems") {
                    self.build_array(obj, path, depth)
                } else if has(obj, "pattern")
                    || has(obj, "minLength")
                    || has(obj, "maxLength")
                    || get_format(obj, path)? != Format::None
                {
                    self.build_string(obj, path)
                } else {
                    self.check_rest(obj, &[], Types::ALL, path)?;
                    self.add(Kind::Any, path, None)
                }
            }
            "object" => {
                if !has_properties && has(obj, "allOf") {
                    self.build_all_of(obj, path, depth, Some(Types::OBJECT))
                } else {
                    self.build_object(obj, path, depth)
                }
            }
            "string" => {
                if has(obj, "allOf") {
                    self.build_all_of(obj, path, depth, Some(Types::STRING))
                } else {
                    self.build_string(obj, path)
                }
            }
            "array" => self.build_array(obj, path, depth),
            "integer" => self.build_integer(obj, path),
            "number" => self.simple(obj, path, Kind::Number, Types::NUMBER.or(Types::INTEGER)),
            "boolean" => self.simple(obj, path, Kind::Boolean, Types::BOOLEAN),
            "null" => self.simple(obj, path, Kind::Null, Types::NULL),
            other => Err(invalid(path, format!("unrecognized type {other}"))),
        }
    }

    fn simple(
        &mut self,
        obj: &[(String, Json)],
        path: &str,
        kind: Kind,
        types: Types,
    ) -> Result<NodeId, SchemaError> {
        self.check_rest(obj, &["type"], types, path)?;
        self.add(kind, path, None)
    }

    /// The `type` next to a keyword that leaves it out, for a later check.
    fn declared_type(
        &mut self,
        obj: &[(String, Json)],
        path: &str,
    ) -> Result<Option<Types>, SchemaError> {
        let Some(ty) = get(obj, "type") else {
            return Ok(None);
        };
        match Types::declared(ty) {
            Some(t) => Ok(Some(t)),
            None => {
                self.warnings.report(unsupported(
                    path,
                    "type",
                    "not a type name or a list of them",
                ))?;
                Ok(None)
            }
        }
    }

    /// `const` and `enum` leave `type` out: each value must be of the declared type.
    fn check_value_types(
        &mut self,
        values: &[Json],
        ty: Option<&Json>,
        outer: Option<Types>,
        path: &str,
    ) -> Result<(), SchemaError> {
        let Some(ty) = ty else { return Ok(()) };
        let Some(declared) = outer.or_else(|| Types::declared(ty)) else {
            return self.warnings.report(unsupported(
                path,
                "type",
                "not a type name or a list of them",
            ));
        };
        for v in values {
            if !Types::of(v).allowed_by(declared) {
                return self.warnings.report(unsupported(
                    path,
                    "type",
                    format!(
                        "the value {} is not of this type, and the grammar would allow it",
                        v.dumped()
                    ),
                ));
            }
        }
        Ok(())
    }

    fn build_list(
        &mut self,
        alts: &'j Json,
        path: &str,
        key: &str,
        depth: usize,
    ) -> Result<Vec<NodeId>, SchemaError> {
        let p = format!("{path}/{key}");
        let Json::Array(alts) = alts else {
            return Err(invalid(&p, "must be an array of schemas"));
        };
        if alts.is_empty() {
            return Err(invalid(&p, "must not be empty"));
        }
        let mut children = Vec::with_capacity(alts.len());
        for (i, alt) in alts.iter().enumerate() {
            children.push(self.build_node(alt, &format!("{p}/{i}"), depth + 1, None)?);
        }
        Ok(children)
    }

    fn build_ref(
        &mut self,
        obj: &'j [(String, Json)],
        r: &'j Json,
        path: &str,
        depth: usize,
    ) -> Result<NodeId, SchemaError> {
        let Json::Str(reference) = r else {
            return Err(invalid(path, "$ref must be a string"));
        };
        if !reference.starts_with("#/") {
            return Err(SchemaError::Ref {
                path: path.to_string(),
                reference: reference.clone(),
                reason: "only references into the same document (`#/…`) are followed; nothing \
                         is fetched"
                    .to_string(),
            });
        }
        if !self.refs.contains_key(reference) {
            self.refs.insert(reference.clone(), None);
            let target = self.resolve(reference, path)?;
            let id = self.build_node(target, reference, depth + 1, None)?;
            self.refs.insert(reference.clone(), Some(id));
        }
        let declared = self.declared_type(obj, path)?;
        self.check_rest(obj, &["$ref", "type"], Types::ALL, path)?;
        self.add(Kind::Ref(reference.clone()), path, declared)
    }

    /// The value a `#/a/b/0` pointer names (segments as written, as llama.cpp reads them).
    fn resolve(&mut self, reference: &str, path: &str) -> Result<&'j Json, SchemaError> {
        let mut target = self.root;
        for sel in reference[1..].split('/').skip(1) {
            let fail = |what: &str| SchemaError::Ref {
                path: path.to_string(),
                reference: reference.to_string(),
                reason: format!("`{sel}` {what}"),
            };
            target = match target {
                Json::Object(o) if o.len() > INDEXED_OBJECT_ENTRIES => {
                    let keys = self.keys.entry(o.as_ptr() as usize).or_insert_with(|| {
                        // Keys are unique: the reader keeps one entry per key.
                        o.iter().map(|(k, v)| (k.as_str(), v)).collect()
                    });
                    keys.get(sel).copied().ok_or_else(|| fail("not found"))?
                }
                Json::Object(o) => get(o, sel).ok_or_else(|| fail("not found"))?,
                Json::Array(a) => sel
                    .parse::<usize>()
                    .ok()
                    .and_then(|i| a.get(i))
                    .ok_or_else(|| fail("is out of range"))?,
                _ => return Err(fail("not found")),
            };
        }
        Ok(target)
    }

    fn build_all_of(
        &mut self,
        obj: &'j [(String, Json)],
        path: &str,
        depth: usize,
        declared: Option<Types>,
    ) -> Result<NodeId, SchemaError> {
        let children = self.build_list(
            get(obj, "allOf").unwrap_or(&Json::Null),
            path,
            "allOf",
            depth,
        )?;
        self.check_rest(obj, &["allOf", "type"], Types::ALL, path)?;
        self.add(Kind::AllOf(children), path, declared)
    }

    fn build_object(
        &mut self,
        obj: &'j [(String, Json)],
        path: &str,
        depth: usize,
    ) -> Result<NodeId, SchemaError> {
        let mut required: Vec<&str> = Vec::new();
        match get(obj, "required") {
            Some(Json::Array(names)) => {
                for n in names {
                    match n {
                        Json::Str(s) => required.push(s),
                        _ => self.warnings.report(unsupported(
                            path,
                            "required",
                            format!("{} is not a property name", n.dumped()),
                        ))?,
                    }
                }
            }
            Some(_) => self
                .warnings
                .report(unsupported(path, "required", "not an array"))?,
            None => {}
        }

        let mut properties = Vec::new();
        let required_set: HashSet<&str> = required.iter().copied().collect();
        let mut names: HashSet<&str> = HashSet::new();
        if let Some(props) = get(obj, "properties") {
            let Json::Object(props) = props else {
                return Err(invalid(path, "properties must be an object"));
            };
            for (name, prop) in props {
                let p = format!("{path}/properties/{name}");
                let schema = self.build_node(prop, &p, depth + 1, None)?;
                properties.push(Property {
                    name: name.clone(),
                    schema,
                    required: required_set.contains(name.as_str()),
                });
                names.insert(name);
            }
        }
        for name in &required {
            if !names.contains(name) {
                self.warnings.report(unsupported(
                    path,
                    "required",
                    format!(
                        "`{name}` is not among `properties`, and the grammar would not require it"
                    ),
                ))?;
            }
        }

        let additional = match get(obj, "additionalProperties") {
            Some(Json::Bool(true)) => Some(self.add(Kind::Any, path, None)?),
            Some(Json::Bool(false)) => None,
            Some(a @ Json::Object(_)) => Some(self.build_node(
                a,
                &format!("{path}/additionalProperties"),
                depth + 1,
                None,
            )?),
            Some(_) => {
                return Err(invalid(
                    path,
                    "additionalProperties must be a boolean or a schema",
                ));
            }
            // `{"type": "object"}` on its own allows any object; with `properties`, llama.cpp
            // allows no others.
            None if !has(obj, "properties") => Some(self.add(Kind::Any, path, None)?),
            None => None,
        };
        self.check_rest(
            obj,
            &["type", "properties", "required", "additionalProperties"],
            Types::OBJECT,
            path,
        )?;
        self.add(
            Kind::Object {
                properties,
                additional,
            },
            path,
            None,
        )
    }

    fn build_array(
        &mut self,
        obj: &'j [(String, Json)],
        path: &str,
        depth: usize,
    ) -> Result<NodeId, SchemaError> {
        let key = if has(obj, "items") {
            "items"
        } else if has(obj, "prefixItems") {
            "prefixItems"
        } else {
            ""
        };
        if key == "items" && has(obj, "prefixItems") {
            self.warnings.report(unsupported(
                path,
                "prefixItems",
                "`items` is there too and is used instead (as in llama.cpp)",
            ))?;
        }
        if let Some(Json::Array(items)) = get(obj, key) {
            let mut ids = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                ids.push(self.build_node(item, &format!("{path}/{key}/{i}"), depth + 1, None)?);
            }
            // A tuple has exactly its items: bounds that allow that many add nothing.
            let n = items.len() as u64;
            let mut used = vec!["type", key, "prefixItems"];
            if count_ok(obj, "minItems").is_some_and(|m| m <= n) {
                used.push("minItems");
            }
            if count_ok(obj, "maxItems").is_some_and(|m| m >= n) {
                used.push("maxItems");
            }
            if get(obj, "additionalItems") == Some(&Json::Bool(false)) {
                used.push("additionalItems");
            }
            self.check_rest(obj, &used, Types::ARRAY, path)?;
            return self.add(Kind::Tuple(ids), path, None);
        }
        let items = match get(obj, key) {
            Some(item) => self.build_node(item, &format!("{path}/{key}"), depth + 1, None)?,
            None => self.add(Kind::Any, path, None)?,
        };
        let min_items = get_count(obj, "minItems", path)?.unwrap_or(0);
        let max_items = get_count(obj, "maxItems", path)?;
        self.check_rest(
            obj,
            &["type", "items", "prefixItems", "minItems", "maxItems"],
            Types::ARRAY,
            path,
        )?;
        self.add(
            Kind::Array {
                items,
                min_items,
                max_items,
            },
            path,
            None,
        )
    }

    fn build_string(&mut self, obj: &[(String, Json)], path: &str) -> Result<NodeId, SchemaError> {
        let pattern = match get(obj, "pattern") {
            Some(Json::Str(p)) => p.clone(),
            Some(_) => return Err(invalid(path, "pattern must be a string")),
            None => String::new(),
        };
        let format = get_format(obj, path)?;
        if format == Format::None
            && let Some(Json::Str(f)) = get(obj, "format")
        {
            // A format the grammar cannot spell out would let any string through.
            self.warnings.report(unsupported(
                path,
                "format",
                format!("format `{f}` (the grammar knows date, time, date-time and uuid)"),
            ))?;
        }
        let min_length = get_count(obj, "minLength", path)?;
        let max_length = get_count(obj, "maxLength", path)?;
        // The pattern wins over a format, which wins over the lengths.
        let mut used = vec!["type", "pattern"];
        if pattern.is_empty() && format == Format::None {
            used.extend(["minLength", "maxLength"]);
        }
        self.check_rest(obj, &used, Types::STRING, path)?;
        let kind = Kind::String {
            pattern,
            format,
            min_length: min_length.unwrap_or(0),
            max_length,
        };
        self.add(kind, path, None)
    }

    fn build_integer(&mut self, obj: &[(String, Json)], path: &str) -> Result<NodeId, SchemaError> {
        let strict = self.warnings.strictness == Strictness::Strict;
        // llama.cpp reads `minimum` and only without it `exclusiveMinimum`; strictly, both
        // apply and the tighter one wins.
        let mut min = i64::MIN;
        if has(obj, "minimum") {
            min = get_bound(obj, "minimum", path, true)?;
        }
        if has(obj, "exclusiveMinimum") {
            if has(obj, "minimum") && !strict {
                self.warnings.report(unsupported(
                    path,
                    "exclusiveMinimum",
                    "`minimum` is used instead (as in llama.cpp)",
                ))?;
            } else {
                let b = get_bound(obj, "exclusiveMinimum", path, false)?;
                let b = b
                    .checked_add(1)
                    .ok_or_else(|| invalid(path, "exclusiveMinimum is too large"))?;
                min = min.max(b);
            }
        }
        let mut max = i64::MAX;
        if has(obj, "maximum") {
            max = get_bound(obj, "maximum", path, false)?;
        }
        if has(obj, "exclusiveMaximum") {
            if has(obj, "maximum") && !strict {
                self.warnings.report(unsupported(
                    path,
                    "exclusiveMaximum",
                    "`maximum` is used instead (as in llama.cpp)",
                ))?;
            } else {
                let b = get_bound(obj, "exclusiveMaximum", path, true)?;
                let b = b
                    .checked_sub(1)
                    .ok_or_else(|| invalid(path, "exclusiveMaximum is too small"))?;
                max = max.min(b);
            }
        }
        if min > max {
            return Err(invalid(
                path,
                format!("no integer lies between {min} and {max}"),
            ));
        }
        self.check_rest(
            obj,
            &[
                "type",
                "minimum",
                "maximum",
                "exclusiveMinimum",
                "exclusiveMaximum",
            ],
            Types::INTEGER,
            path,
        )?;
        self.add(Kind::Integer { min, max }, path, None)
    }
}

/// A non-negative integer keyword (`minItems`, `maxLength`, …), or an error naming it.
fn get_count(obj: &[(String, Json)], key: &str, path: &str) -> Result<Option<u64>, SchemaError> {
    match get(obj, key) {
        None => Ok(None),
        Some(v) => count_of(v)
            .map(Some)
            .ok_or_else(|| invalid(path, format!("{key} must be a non-negative integer"))),
    }
}

fn count_ok(obj: &[(String, Json)], key: &str) -> Option<u64> {
    get(obj, key).and_then(count_of)
}

fn count_of(v: &Json) -> Option<u64> {
    match v {
        Json::Int(i) => u64::try_from(*i).ok(),
        Json::UInt(u) => Some(*u),
        _ => None,
    }
}

/// An integer bound; a fractional one is rounded inwards, to the integers it still allows.
fn get_bound(
    obj: &[(String, Json)],
    key: &str,
    path: &str,
    round_up: bool,
) -> Result<i64, SchemaError> {
    let out_of_range = || invalid(path, format!("{key} is out of the 64-bit integer range"));
    match get(obj, key) {
        Some(Json::Int(i)) => Ok(*i),
        Some(Json::UInt(u)) => i64::try_from(*u).map_err(|_| out_of_range()),
        Some(Json::Float(f)) => {
            let r = if round_up { f.ceil() } else { f.floor() };
            // 2^63 is the first double past i64::MAX.
            if (-9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0).contains(&r) {
                Ok(r as i64)
            } else {
                Err(out_of_range())
            }
        }
        _ => Err(invalid(path, format!("{key} must be a number"))),
    }
}

fn get_format(obj: &[(String, Json)], path: &str) -> Result<Format, SchemaError> {
    let Some(f) = get(obj, "format") else {
        return Ok(Format::None);
    };
    let Json::Str(f) = f else {
        return Err(invalid(path, "format must be a string"));
    };
    Ok(match f.as_str() {
        "date" => Format::Date,
        "time" => Format::Time,
        "date-time" => Format::DateTime,
        "uuid" | "uuid1" | "uuid2" | "uuid3" | "uuid4" | "uuid5" => Format::Uuid,
        _ => Format::None,
    })
}

/// A cycle of `$ref`s and alternatives matches no text before coming back to where it started:
/// its grammar would be left-recursive. Found by an iterative depth-first walk.
fn check_left_recursion(doc: &Document) -> Result<(), SchemaError> {
    let edges = |id: NodeId| -> Vec<NodeId> {
        match doc.kind(id) {
            Kind::Ref(r) => doc.target(r).into_iter().collect(),
            Kind::AnyOf(c) => c.clone(),
            _ => Vec::new(),
        }
    };
    // 0 = not seen, 1 = on the current walk, 2 = done.
    let mut state = vec![0u8; doc.nodes.len()];
    for start in 0..doc.nodes.len() {
        if state[start] != 0 {
            continue;
        }
        let mut stack = vec![(start, edges(start), 0usize)];
        state[start] = 1;
        while let Some((node, next, i)) = stack.last_mut() {
            if *i >= next.len() {
                state[*node] = 2;
                stack.pop();
                continue;
            }
            let child = next[*i];
            *i += 1;
            match state[child] {
                0 => {
                    state[child] = 1;
                    stack.push((child, edges(child), 0));
                }
                1 => {
                    let reference = stack
                        .iter()
                        .map(|f| f.0)
                        .skip_while(|&n| n != child)
                        .find_map(|n| match doc.kind(n) {
                            Kind::Ref(r) => Some(r.clone()),
                            _ => None,
                        })
                        .unwrap_or_default();
                    return Err(SchemaError::LeftRecursion { reference });
                }
                _ => {}
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The grammar's building blocks
// ---------------------------------------------------------------------------------------------

/// llama.cpp's whitespace between JSON tokens: none, one space, or one or two newlines and up
/// to 20 spaces or tabs of indentation.
const SPACE_RULE: &str = r#"| " " | "\n"{1,2} [ \t]{0,20}"#;

/// llama.cpp's rules for JSON's primitives and the string formats it knows: (name, body,
/// the rules the body uses).
const PRIMITIVE_RULES: &[(&str, &str, &[&str])] = &[
    ("boolean", r#"("true" | "false")"#, &[]),
    ("decimal-part", "[0-9]{1,16}", &[]),
    ("integral-part", "[0] | [1-9] [0-9]{0,15}", &[]),
    (
        "number",
        r#"("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)?"#,
        &["integral-part", "decimal-part"],
    ),
    ("integer", r#"("-"? integral-part)"#, &["integral-part"]),
    (
        "value",
        "object | array | string | number | boolean | null",
        &["object", "array", "string", "number", "boolean", "null"],
    ),
    (
        "object",
        r#""{" space ( string ":" space value ("," space string ":" space value)* )? space "}""#,
        &["string", "value"],
    ),
    (
        "array",
        r#""[" space ( value ("," space value)* )? space "]""#,
        &["value"],
    ),
    (
        "uuid",
        r#""\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12} "\"""#,
        &[],
    ),
    (
        "char",
        r#"[^"\\\x7F\x00-\x1F] | [\\] (["\\bfnrt] | "u" [0-9a-fA-F]{4})"#,
        &[],
    ),
    ("string", r#""\"" char* "\"""#, &["char"]),
    ("null", r#""null""#, &[]),
    (
        "date",
        r#"[0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [1-2] [0-9] | "3" [0-1] )"#,
        &[],
    ),
    (
        "time",
        r#"([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{3} )? ( "Z" | ( "+" | "-" ) ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )"#,
        &[],
    ),
    ("date-time", r#"date "T" time"#, &["date", "time"]),
    ("date-string", r#""\"" date "\"""#, &["date"]),
    ("time-string", r#""\"" time "\"""#, &["time"]),
    ("date-time-string", r#""\"" date-time "\"""#, &["date-time"]),
];

fn primitive(name: &str) -> Option<(&'static str, &'static [&'static str])> {
    PRIMITIVE_RULES
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, body, deps)| (*body, *deps))
}

/// Names a schema's rule may not take (it gets a `-` appended): `root` and the primitives.
fn is_reserved_name(name: &str) -> bool {
    name == "root" || primitive(name).is_some()
}

/// A rule name from any text: each run of characters other than `a-zA-Z0-9-` becomes `-`.
fn rule_name_of(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut in_run = false;
    for c in name.chars() {
        if c.is_ascii_alphanumeric() || c == '-' {
            out.push(c);
            in_run = false;
        } else if !in_run {
            out.push('-');
            in_run = true;
        }
    }
    out
}

/// A GBNF string literal of `text`.
fn format_literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '\r' => out.push_str("\\r"),
            '\n' => out.push_str("\\n"),
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// One character inside a GBNF character class. llama.cpp writes it as it is; the characters
/// that would end the class, start a range or negate it are escaped here.
fn class_char(c: char, first: bool, out: &mut String) {
    match c {
        '\\' => out.push_str("\\\\"),
        ']' => out.push_str("\\]"),
        '-' => out.push_str("\\-"),
        '^' if first => out.push_str("\\x5E"),
        c => out.push(c),
    }
}

/// `item` repeated `min` to `max` times (no `max`: unbounded), with `separator` between items.
fn build_repetition(
    item: &str,
    min: u64,
    max: Option<u64>,
    separator: &str,
    path: &str,
) -> Result<String, SchemaError> {
    if let Some(max) = max {
        if min > max {
            return Err(invalid(
                path,
                format!("at least {min} but at most {max} repetitions"),
            ));
        }
        if max == 0 {
            return Ok(String::new());
        }
    }
    if min == 0 && max == Some(1) {
        return Ok(format!("{item}?"));
    }
    if separator.is_empty() {
        return Ok(match (min, max) {
            (1, None) => format!("{item}+"),
            (0, None) => format!("{item}*"),
            _ => {
                for count in std::iter::once(min).chain(max) {
                    if count > MAX_REPETITION {
                        return Err(SchemaError::RepetitionTooLarge {
                            path: path.to_string(),
                            count,
                            limit: MAX_REPETITION,
                        });
                    }
                }
                let max = max.map(|m| m.to_string()).unwrap_or_default();
                format!("{item}{{{min},{max}}}")
            }
        });
    }
    let rest = build_repetition(
        &format!("({separator} {item})"),
        min.saturating_sub(1),
        max.map(|m| m - 1),
        "",
        path,
    )?;
    let result = format!("{item} {rest}");
    Ok(if min == 0 {
        format!("({result})?")
    } else {
        result
    })
}

// ---------------------------------------------------------------------------------------------
// Integer ranges, digit by digit
// ---------------------------------------------------------------------------------------------

/// Writes the alternatives that match the decimal integers in `min..=max` (`i64::MIN` /
/// `i64::MAX`: unbounded), as llama.cpp's `build_min_max_int`: numbers of fewer digits than a
/// bound, then digit by digit along it. An unbounded side allows `decimals_left` digits.
struct IntRange<'o> {
    out: &'o mut String,
    path: &'o str,
    /// Mend two slips of llama.cpp's construction (strict): see `at_least` and `build`.
    exact: bool,
}

impl IntRange<'_> {
    fn digit_range(&mut self, from: u8, to: u8) {
        self.out.push('[');
        self.out.push(from as char);
        if from != to {
            self.out.push('-');
            self.out.push(to as char);
        }
        self.out.push(']');
    }

    /// The digits that may follow a minimum's first digit when the number has as many digits
    /// as the minimum: as many as `tail` and not less, or more. llama.cpp reads `tail` as a
    /// number, which loses its leading zeros (after `1` of `1005`, `5` would allow `15`);
    /// strictly, a leading zero is kept: `[1-9]` and any `len - 1` digits, or `0` and the rest.
    fn at_least(&mut self, tail: &[u8], decimals_left: i32) -> Result<(), SchemaError> {
        if self.exact && tail.len() > 1 && tail[0] == b'0' {
            let less_decimals = (decimals_left - 1).max(1);
            self.out.push_str("[1-9] ");
            self.more_digits(tail.len() as i32 - 1, less_decimals)?;
            self.out.push_str(" | [0] (");
            self.at_least(&tail[1..], less_decimals)?;
            self.out.push(')');
            return Ok(());
        }
        let value = std::str::from_utf8(tail)
            .unwrap_or("0")
            .parse()
            .unwrap_or(0);
        self.build(value, i64::MAX, decimals_left, false)
    }

    /// `[0-9]{min,max}`; `max` of `i32::MAX` is unbounded.
    fn more_digits(&mut self, min: i32, max: i32) -> Result<(), SchemaError> {
        if min > max {
            return Err(invalid(
                self.path,
                "an integer bound has more digits than the 16 llama.cpp's integers allow",
            ));
        }
        self.out.push_str("[0-9]");
        if min == max && min == 1 {
            return Ok(());
        }
        let _ = write!(self.out, "{{{min}");
        if max != min {
            self.out.push(',');
            if max != i32::MAX {
                let _ = write!(self.out, "{max}");
            }
        }
        self.out.push('}');
        Ok(())
    }

    /// The numbers from `from` to `to`, both of the same number of digits.
    fn uniform_range(&mut self, from: &[u8], to: &[u8]) -> Result<(), SchemaError> {
        let mut i = 0;
        while i < from.len() && i < to.len() && from[i] == to[i] {
            i += 1;
        }
        if i > 0 {
            self.out.push('"');
            self.out
                .push_str(std::str::from_utf8(&from[..i]).unwrap_or_default());
            self.out.push('"');
        }
        if i < from.len() && i < to.len() {
            if i > 0 {
                self.out.push(' ');
            }
            let sub_len = from.len() - i - 1;
            if sub_len > 0 {
                let from_sub = &from[i + 1..];
                let to_sub = &to[i + 1..];
                let zeros = vec![b'0'; sub_len];
                let nines = vec![b'9'; sub_len];
                let n = sub_len as i32;
                let mut to_reached = false;
                self.out.push('(');
                if from_sub == zeros.as_slice() {
                    self.digit_range(from[i], to[i] - 1);
                    self.out.push(' ');
                    self.more_digits(n, n)?;
                } else {
                    let _ = write!(self.out, "[{}] (", from[i] as char);
                    self.uniform_range(from_sub, &nines)?;
                    self.out.push(')');
                    if from[i] < to[i] - 1 {
                        self.out.push_str(" | ");
                        if to_sub == nines.as_slice() {
                            self.digit_range(from[i] + 1, to[i]);
                            to_reached = true;
                        } else {
                            self.digit_range(from[i] + 1, to[i] - 1);
                        }
                        self.out.push(' ');
                        self.more_digits(n, n)?;
                    }
                }
                if !to_reached {
                    self.out.push_str(" | ");
                    self.digit_range(to[i], to[i]);
                    self.out.push(' ');
                    self.uniform_range(&zeros, to_sub)?;
                }
                self.out.push(')');
            } else {
                let _ = write!(self.out, "[{}-{}]", from[i] as char, to[i] as char);
            }
        }
        Ok(())
    }

    fn build(
        &mut self,
        mut min: i64,
        max: i64,
        decimals_left: i32,
        top_level: bool,
    ) -> Result<(), SchemaError> {
        let has_min = min != i64::MIN;
        let has_max = max != i64::MAX;
        let neg = |v: i64| {
            v.checked_neg()
                .ok_or_else(|| invalid(self.path, "integer bound out of range"))
        };

        if has_min && has_max {
            if min < 0 && max < 0 {
                let (lo, hi) = (neg(max)?, neg(min)?);
                self.out.push_str("\"-\" (");
                self.build(lo, hi, decimals_left, true)?;
                self.out.push(')');
                return Ok(());
            }
            if min < 0 {
                let hi = neg(min)?;
                self.out.push_str("\"-\" (");
                self.build(0, hi, decimals_left, true)?;
                self.out.push_str(") | ");
                min = 0;
            }
            let mut min_s = min.to_string().into_bytes();
            let max_s = max.to_string().into_bytes();
            for digits in min_s.len()..max_s.len() {
                self.uniform_range(&min_s, &vec![b'9'; digits])?;
                min_s = std::iter::once(b'1')
                    .chain(std::iter::repeat_n(b'0', digits))
                    .collect();
                self.out.push_str(" | ");
            }
            return self.uniform_range(&min_s, &max_s);
        }

        let less_decimals = (decimals_left - 1).max(1);

        if has_min {
            if min < 0 {
                let hi = neg(min)?;
                self.out.push_str("\"-\" (");
                self.build(i64::MIN, hi, decimals_left, false)?;
                self.out.push_str(") | [0] | [1-9] ");
                self.more_digits(0, decimals_left - 1)?;
            } else if min == 0 {
                if top_level {
                    self.out.push_str("[0] | [1-9] ");
                    self.more_digits(0, less_decimals)?;
                } else {
                    self.more_digits(1, decimals_left)?;
                }
            } else if min <= 9 {
                let c = b'0' + min as u8;
                let range_start = if top_level { b'1' } else { b'0' };
                if c > range_start {
                    self.digit_range(range_start, c - 1);
                    self.out.push(' ');
                    self.more_digits(1, less_decimals)?;
                    self.out.push_str(" | ");
                }
                self.digit_range(c, b'9');
                self.out.push(' ');
                self.more_digits(0, less_decimals)?;
            } else {
                let min_s = min.to_string().into_bytes();
                let len = min_s.len() as i32;
                let c = min_s[0];
                // Inside a number, a first digit below `c` needs one digit more; llama.cpp
                // leaves out `0` there when `c` is `1` (`4` `0…` after `410`), strictly kept.
                if c > b'1' || (self.exact && !top_level) {
                    self.digit_range(if top_level { b'1' } else { b'0' }, c - 1);
                    self.out.push(' ');
                    self.more_digits(len, less_decimals)?;
                    self.out.push_str(" | ");
                }
                self.digit_range(c, c);
                self.out.push_str(" (");
                self.at_least(&min_s[1..], less_decimals)?;
                self.out.push(')');
                if c < b'9' {
                    self.out.push_str(" | ");
                    self.digit_range(c + 1, b'9');
                    self.out.push(' ');
                    self.more_digits(len - 1, less_decimals)?;
                }
            }
            return Ok(());
        }

        if has_max {
            if max >= 0 {
                if top_level {
                    self.out.push_str("\"-\" [1-9] ");
                    self.more_digits(0, less_decimals)?;
                    self.out.push_str(" | ");
                }
                self.build(0, max, decimals_left, true)?;
            } else {
                let lo = neg(max)?;
                self.out.push_str("\"-\" (");
                self.build(lo, i64::MAX, decimals_left, false)?;
                self.out.push(')');
            }
            return Ok(());
        }
        Err(invalid(
            self.path,
            "an integer range needs a minimum or a maximum",
        ))
    }
}

// ---------------------------------------------------------------------------------------------
// Regular expressions (`pattern`) to grammar
// ---------------------------------------------------------------------------------------------

/// Characters that end a run of literal text in a pattern.
const NON_LITERAL: &[char] = &[
    '|', '.', '(', ')', '[', ']', '{', '}', '*', '+', '?', '^', '$',
];

/// Characters a pattern escapes with `\` that a GBNF literal holds as they are.
const ESCAPED_IN_REGEXPS_BUT_NOT_IN_LITERALS: &[char] = &[
    '^', '$', '.', '[', ']', '(', ')', '|', '{', '}', '*', '+', '?',
];

/// How long the GBNF escape at `pos` is (`\n`, `\x41`, `\u00e9`, …), 0 when it is none.
fn gbnf_escape_length(p: &[char], pos: usize) -> usize {
    if pos + 1 >= p.len() || p[pos] != '\\' {
        return 0;
    }
    let n_hex = match p[pos + 1] {
        'x' => 2,
        'u' => 4,
        'U' => 8,
        't' | 'r' | 'n' | '\\' | '"' | '[' | ']' | '-' => return 2,
        _ => return 0,
    };
    if pos + 2 + n_hex > p.len()
        || !p[pos + 2..pos + 2 + n_hex]
            .iter()
            .all(char::is_ascii_hexdigit)
    {
        return 0;
    }
    2 + n_hex
}

/// Why a pattern was not converted.
enum PatternFail {
    /// A valid regular expression with no grammar equivalent here.
    Unsupported(String),
    /// Not a regular expression.
    Invalid(String),
    /// A limit of the grammar.
    Limit(SchemaError),
}

impl From<SchemaError> for PatternFail {
    fn from(e: SchemaError) -> Self {
        PatternFail::Limit(e)
    }
}

/// The state of converting one pattern.
struct PatternCx {
    p: Vec<char>,
    i: usize,
    paren_depth: usize,
    name: String,
    path: String,
    sub_rule_ids: HashMap<String, String>,
}

/// A piece of a converted pattern: literal text (not yet quoted) or grammar.
type Piece = (String, bool);

fn piece_rule((s, literal): &Piece) -> String {
    if *literal {
        format!("\"{s}\"")
    } else {
        s.clone()
    }
}

/// Parse a count the way C's `stoi` does: leading spaces, a sign, digits, anything after
/// ignored; None when there are no digits or the number does not fit an `int`.
fn stoi(s: &str) -> Option<i64> {
    let t = s.trim_start_matches([' ', '\t', '\n', '\r', '\x0b', '\x0c']);
    let (neg, t) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let digits: &str = &t[..t.bytes().take_while(u8::is_ascii_digit).count()];
    if digits.is_empty() {
        return None;
    }
    let v: i64 = digits
        .parse()
        .ok()
        .filter(|v| *v <= i64::from(i32::MAX) + 1)?;
    let v = if neg { -v } else { v };
    (i64::from(i32::MIN)..=i64::from(i32::MAX))
        .contains(&v)
        .then_some(v)
}

// ---------------------------------------------------------------------------------------------
// The conversion (llama.cpp's `common_chat_schema_converter`)
// ---------------------------------------------------------------------------------------------

struct Converter<'d, 'w> {
    doc: &'d Document,
    warnings: &'w mut Warnings,
    stop: Stop<'w>,
    rules: BTreeMap<String, String>,
    /// What `add_rule` learnt of the numbered names of each name taken by another body.
    numbered: HashMap<String, Numbered>,
    /// Bytes the grammar text will have.
    bytes: usize,
    visits: usize,
    /// Rules added since a pattern's conversion began, to take back if it fails.
    journal: Option<Vec<String>>,
    refs_being_resolved: HashSet<String>,
}

/// The names `name0`, `name1`, … that `add_rule` found taken, for one `name`.
#[derive(Default)]
struct Numbered {
    /// `name0` up to `name{taken - 1}` are all rules.
    taken: usize,
    /// The first of those numbers that has each body.
    bodies: HashMap<String, usize>,
}

impl<'d, 'w> Converter<'d, 'w> {
    fn new(doc: &'d Document, warnings: &'w mut Warnings, stop: Stop<'w>) -> Self {
        let mut c = Converter {
            doc,
            warnings,
            stop,
            rules: BTreeMap::new(),
            numbered: HashMap::new(),
            bytes: 0,
            visits: 0,
            journal: None,
            refs_being_resolved: HashSet::new(),
        };
        c.bytes = "space".len() + " ::= ".len() + SPACE_RULE.len() + 1;
        c.rules.insert("space".to_string(), SPACE_RULE.to_string());
        c
    }

    fn format_grammar(&self) -> String {
        let mut out = String::with_capacity(self.bytes);
        for (name, body) in &self.rules {
            let _ = writeln!(out, "{name} ::= {body}");
        }
        out
    }

    /// Add a rule under `name` (made a valid rule name), or under `name0`, `name1`, … when the
    /// name is taken by another body; the name it got.
    fn add_rule(&mut self, name: &str, body: &str) -> Result<String, SchemaError> {
        let esc = rule_name_of(name);
        let key = match self.rules.get(&esc) {
            None => esc,
            Some(b) if b == body => return Ok(esc),
            Some(_) => {
                // llama.cpp's name is the first `esc{i}` that is free or has this body. Many
                // names can make the same `esc` (every property named with one letter of
                // another script makes `-`), so what was tried is kept: the numbers before
                // `taken` are not tried again, and the bodies found there are looked up.
                let numbered = self.numbered.entry(esc.clone()).or_default();
                if let Some(&i) = numbered.bodies.get(body) {
                    return Ok(format!("{esc}{i}"));
                }
                loop {
                    let key = format!("{esc}{}", numbered.taken);
                    match self.rules.get(&key) {
                        Some(b) => {
                            numbered.bodies.entry(b.clone()).or_insert(numbered.taken);
                            numbered.taken += 1;
                            if b == body {
                                return Ok(key);
                            }
                        }
                        None => break key,
                    }
                }
            }
        };
        if self.rules.len() >= MAX_RULES {
            return Err(SchemaError::TooManyRules { limit: MAX_RULES });
        }
        self.bytes += key.len() + " ::= ".len() + body.len() + 1;
        if self.bytes > MAX_GRAMMAR_BYTES {
            return Err(SchemaError::GrammarTooLarge {
                limit: MAX_GRAMMAR_BYTES,
            });
        }
        if let Some(j) = &mut self.journal {
            j.push(key.clone());
        }
        self.rules.insert(key.clone(), body.to_string());
        Ok(key)
    }

    /// Add a primitive rule under `name`, and the primitives it uses under their own names.
    fn add_primitive(&mut self, name: &str, primitive_name: &str) -> Result<String, SchemaError> {
        let (body, deps) = primitive(primitive_name).unwrap_or(("", &[]));
        let n = self.add_rule(name, body)?;
        for dep in deps {
            if !self.rules.contains_key(*dep) {
                self.add_primitive(dep, dep)?;
            }
        }
        Ok(n)
    }

    fn visit_primitive(&mut self, rule_name: &str, ty: &str) -> Result<String, SchemaError> {
        self.add_primitive(if rule_name == "root" { "root" } else { ty }, ty)
    }

    /// The rule that derives the values node `id` allows, named after `name`.
    fn visit(&mut self, id: NodeId, name: &str, depth: usize) -> Result<String, SchemaError> {
        let doc = self.doc;
        let path = &doc.nodes[id].path;
        if depth > MAX_SCHEMA_DEPTH {
            return Err(SchemaError::TooDeep {
                path: path.clone(),
                limit: MAX_SCHEMA_DEPTH,
            });
        }
        self.visits += 1;
        if self.visits > MAX_VISITS {
            return Err(SchemaError::TooMuchWork { limit: MAX_VISITS });
        }
        self.stop.step()?;
        let rule_name = if is_reserved_name(name) {
            format!("{name}-")
        } else if name.is_empty() {
            "root".to_string()
        } else {
            name.to_string()
        };
        let sub_name = if name.is_empty() {
            String::new()
        } else {
            format!("{name}-")
        };

        match doc.kind(id) {
            Kind::Ref(r) => {
                let body = self.resolve_ref(r, depth)?;
                self.add_rule(&rule_name, &body)
            }
            Kind::AnyOf(alts) => {
                let mut rules = Vec::with_capacity(alts.len());
                for (i, &alt) in alts.iter().enumerate() {
                    let n = if name.is_empty() {
                        format!("alternative-{i}")
                    } else {
                        format!("{name}-{i}")
                    };
                    rules.push(self.visit(alt, &n, depth + 1)?);
                }
                self.add_rule(&rule_name, &rules.join(" | "))
            }
            Kind::AllOf(children) => self.visit_all_of(id, children, name, &rule_name, depth),
            Kind::Const(v) => self.add_rule(&rule_name, &format_literal(&v.dumped())),
            Kind::Enum(values) => {
                let alts: Vec<String> =
                    values.iter().map(|v| format_literal(&v.dumped())).collect();
                self.add_rule(&rule_name, &format!("({})", alts.join(" | ")))
            }
            Kind::Object {
                properties,
                additional,
            } => {
                if properties.is_empty()
                    && additional.is_some_and(|a| matches!(doc.kind(a), Kind::Any))
                {
                    let object = self.add_primitive("object", "object")?;
                    return self.add_rule(&rule_name, &object);
                }
                let props: Vec<(String, NodeId)> = properties
                    .iter()
                    .map(|p| (p.name.clone(), p.schema))
                    .collect();
                let required: HashSet<String> = properties
                    .iter()
                    .filter(|p| p.required)
                    .map(|p| p.name.clone())
                    .collect();
                let body = self.build_object_rule(&props, &required, name, *additional, depth)?;
                self.add_rule(&rule_name, &body)
            }
            Kind::Tuple(items) => {
                let mut rule = String::from("\"[\" space ");
                for (i, &item) in items.iter().enumerate() {
                    if i > 0 {
                        rule.push_str(" \",\" space ");
                    }
                    rule.push_str(&self.visit(item, &format!("{sub_name}tuple-{i}"), depth + 1)?);
                }
                rule.push_str(" space \"]\"");
                self.add_rule(&rule_name, &rule)
            }
            Kind::Array {
                items,
                min_items,
                max_items,
            } => {
                if matches!(doc.kind(*items), Kind::Any) && *min_items == 0 && max_items.is_none() {
                    return self.visit_primitive(&rule_name, "array");
                }
                let item = self.visit(*items, &format!("{sub_name}item"), depth + 1)?;
                let rep = build_repetition(&item, *min_items, *max_items, "\",\" space", path)?;
                self.add_rule(&rule_name, &format!("\"[\" space {rep} space \"]\""))
            }
            Kind::String {
                pattern,
                format,
                min_length,
                max_length,
            } => {
                if !pattern.is_empty() {
                    return self.visit_pattern(pattern, &rule_name, path);
                }
                match format {
                    Format::Uuid => return self.visit_primitive(&rule_name, "uuid"),
                    Format::Date | Format::Time | Format::DateTime => {
                        let prim = match format {
                            Format::Date => "date-string",
                            Format::Time => "time-string",
                            _ => "date-time-string",
                        };
                        let r = self.add_primitive(prim, prim)?;
                        return self.add_rule(&rule_name, &r);
                    }
                    Format::None => {}
                }
                if *min_length > 0 || max_length.is_some() {
                    let char_rule = self.add_primitive("char", "char")?;
                    let rep = build_repetition(&char_rule, *min_length, *max_length, "", path)?;
                    return self.add_rule(&rule_name, &format!("\"\\\"\" {rep} \"\\\"\""));
                }
                self.visit_primitive(&rule_name, "string")
            }
            Kind::Integer { min, max } => {
                if *min == i64::MIN && *max == i64::MAX {
                    return self.visit_primitive(&rule_name, "integer");
                }
                let mut out = String::from("(");
                let exact = self.warnings.strictness == Strictness::Strict;
                IntRange {
                    out: &mut out,
                    path,
                    exact,
                }
                .build(*min, *max, 16, true)?;
                out.push(')');
                self.add_rule(&rule_name, &out)
            }
            Kind::Number => self.visit_primitive(&rule_name, "number"),
            Kind::Boolean => self.visit_primitive(&rule_name, "boolean"),
            Kind::Null => self.visit_primitive(&rule_name, "null"),
            Kind::Any => {
                let value = self.add_primitive("value", "value")?;
                self.add_rule(&rule_name, &value)
            }
        }
    }

    /// The rule a `$ref` stands for: `ref-` and its pointer, built on first use.
    fn resolve_ref(&mut self, reference: &str, depth: usize) -> Result<String, SchemaError> {
        let fragment = reference.split_once('#').map_or(reference, |(_, f)| f);
        let mut ref_name = format!("ref{}", rule_name_of(fragment));
        if !self.rules.contains_key(&ref_name) && !self.refs_being_resolved.contains(reference) {
            let Some(target) = self.doc.target(reference) else {
                return Err(SchemaError::Ref {
                    path: String::new(),
                    reference: reference.to_string(),
                    reason: "unresolved".to_string(),
                });
            };
            self.refs_being_resolved.insert(reference.to_string());
            ref_name = self.visit(target, &ref_name, depth + 1)?;
            self.refs_being_resolved.remove(reference);
        }
        Ok(ref_name)
    }

    /// An object (or the values common to enums) from `allOf`, as llama.cpp combines them: the
    /// properties of every object part (those inside an `anyOf` part optional), no others.
    fn visit_all_of(
        &mut self,
        id: NodeId,
        children: &[NodeId],
        name: &str,
        rule_name: &str,
        depth: usize,
    ) -> Result<String, SchemaError> {
        let doc = self.doc;
        let mut parts = AllOfParts::default();
        for &child in children {
            if let Kind::AnyOf(alts) = doc.kind(child) {
                for &alt in alts {
                    self.add_component(alt, false, &mut parts, depth + 1)?;
                }
            } else {
                self.add_component(child, true, &mut parts, depth + 1)?;
            }
        }
        let path = &doc.nodes[id].path;
        let declared = doc.nodes[id].declared;
        if !parts.enum_values.is_empty() {
            let common: Vec<&String> = parts
                .enum_values
                .iter()
                .filter(|(_, (count, _))| *count == children.len())
                .map(|(lit, _)| lit)
                .collect();
            if !common.is_empty() {
                let types = parts
                    .enum_values
                    .values()
                    .filter(|(count, _)| *count == children.len())
                    .fold(Types::NONE, |t, (_, ty)| t.or(*ty));
                if parts.objects > 0 {
                    self.warnings.report(unsupported(
                        path,
                        "allOf",
                        "its object parts are dropped for the values its enums share",
                    ))?;
                }
                if declared.is_some_and(|d| !types.within(d)) {
                    self.warnings
                        .report(unsupported(path, "type", NOT_ENFORCED))?;
                }
                let body = format!(
                    "({})",
                    common
                        .iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(" | ")
                );
                return self.add_rule(rule_name, &body);
            }
            self.warnings.report(unsupported(
                path,
                "allOf",
                "its enums share no value and are dropped",
            ))?;
        }
        let mut seen = HashSet::new();
        for (prop, _) in &parts.properties {
            if !seen.insert(prop.as_str()) {
                self.warnings.report(unsupported(
                    path,
                    "allOf",
                    format!("property `{prop}` is in more than one part, and only one part's schema would hold"),
                ))?;
            }
        }
        if declared.is_some_and(|d| !Types::OBJECT.within(d)) {
            self.warnings
                .report(unsupported(path, "type", NOT_ENFORCED))?;
        }
        let body = self.build_object_rule(&parts.properties, &parts.required, name, None, depth)?;
        self.add_rule(rule_name, &body)
    }

    fn add_component(
        &mut self,
        comp: NodeId,
        is_required: bool,
        parts: &mut AllOfParts,
        depth: usize,
    ) -> Result<(), SchemaError> {
        let doc = self.doc;
        let node = &doc.nodes[comp];
        if depth > MAX_SCHEMA_DEPTH {
            return Err(SchemaError::TooDeep {
                path: node.path.clone(),
                limit: MAX_SCHEMA_DEPTH,
            });
        }
        match &node.kind {
            Kind::Ref(r) => {
                if let Some(t) = doc.target(r) {
                    self.add_component(t, is_required, parts, depth + 1)?;
                }
            }
            Kind::Object { properties, .. } => {
                parts.objects += 1;
                for p in properties {
                    parts.properties.push((p.name.clone(), p.schema));
                    if is_required {
                        parts.required.insert(p.name.clone());
                    } else if p.required {
                        self.warnings.report(unsupported(
                            &node.path,
                            "required",
                            format!(
                                "`{}` is made optional by the enclosing allOf's anyOf",
                                p.name
                            ),
                        ))?;
                    }
                }
            }
            Kind::Enum(values) => {
                for v in values {
                    let e = parts
                        .enum_values
                        .entry(format_literal(&v.dumped()))
                        .or_insert((0, Types::of(v)));
                    e.0 += 1;
                }
            }
            Kind::Any => {}
            _ => self.warnings.report(unsupported(
                &node.path,
                "allOf",
                "only objects, enums and $refs to them can be combined; this part is dropped",
            ))?,
        }
        Ok(())
    }

    /// The body of an object rule: required properties in order, then the optional ones, each
    /// alternative starting at one of them and allowing those after it (llama.cpp's `-rest`
    /// rules), then additional properties.
    fn build_object_rule(
        &mut self,
        properties: &[(String, NodeId)],
        required: &HashSet<String>,
        name: &str,
        additional: Option<NodeId>,
        depth: usize,
    ) -> Result<String, SchemaError> {
        let sep = if name.is_empty() { "" } else { "-" };
        let mut kv_rules: HashMap<&str, String> = HashMap::new();
        let mut required_props: Vec<&str> = Vec::new();
        let mut optional_props: Vec<&str> = Vec::new();
        let mut prop_names: Vec<&str> = Vec::new();
        for (prop, schema) in properties {
            let prop_rule = self.visit(*schema, &format!("{name}{sep}{prop}"), depth + 1)?;
            let kv = self.add_rule(
                &format!("{name}{sep}{prop}-kv"),
                &format!(
                    "{} space \":\" space {prop_rule}",
                    format_literal(&Json::Str(prop.clone()).dumped())
                ),
            )?;
            kv_rules.insert(prop, kv);
            if required.contains(prop) {
                required_props.push(prop);
            } else {
                optional_props.push(prop);
            }
            prop_names.push(prop);
        }
        // Optional entries: (kv rule, whether it is the additional properties' own, name).
        let mut optional: Vec<(String, bool, &str)> = optional_props
            .iter()
            .map(|p| (kv_rules[p].clone(), false, *p))
            .collect();
        if let Some(add) = additional {
            let sub_name = format!("{name}{sep}additional");
            let value_rule = if matches!(self.doc.kind(add), Kind::Any) {
                self.add_primitive("value", "value")?
            } else {
                self.visit(add, &format!("{sub_name}-value"), depth + 1)?
            };
            let key_rule = if prop_names.is_empty() {
                self.add_primitive("string", "string")?
            } else {
                let body = self.not_strings(&prop_names)?;
                self.add_rule(&format!("{sub_name}-k"), &body)?
            };
            let kv = self.add_rule(
                &format!("{sub_name}-kv"),
                &format!("{key_rule} \":\" space {value_rule}"),
            )?;
            optional.push((kv, true, "*"));
        }

        if required_props.is_empty() && optional.is_empty() {
            return Ok("\"{\" space \"}\"".to_string());
        }
        let mut rule = String::from("\"{\" space ");
        for (i, p) in required_props.iter().enumerate() {
            if i > 0 {
                rule.push_str(" \",\" space ");
            }
            rule.push_str(&kv_rules[p]);
        }
        if !optional.is_empty() {
            rule.push_str(" (");
            if !required_props.is_empty() {
                rule.push_str(" \",\" space ( ");
            }
            // rest[j]: the rule for "optionally the j-th entry, then the rest", named after the
            // entry before it; added last to first, the order llama.cpp's recursion adds them.
            let n = optional.len();
            let mut rest: Vec<String> = vec![String::new(); n + 1];
            for j in (1..n).rev() {
                let (kv, is_additional, _) = &optional[j];
                let mut body = format!(
                    "( \",\" space {kv} ){}",
                    if *is_additional { "*" } else { "?" }
                );
                if j + 1 < n {
                    body.push(' ');
                    body.push_str(&rest[j + 1]);
                }
                rest[j] =
                    self.add_rule(&format!("{name}{sep}{}-rest", optional[j - 1].2), &body)?;
            }
            for (i, (kv, is_additional, _)) in optional.iter().enumerate() {
                if i > 0 {
                    rule.push_str(" | ");
                }
                rule.push_str(kv);
                if *is_additional {
                    let _ = write!(rule, " ( \",\" space {kv} )*");
                }
                if i + 1 < n {
                    rule.push(' ');
                    rule.push_str(&rest[i + 1]);
                }
            }
            if !required_props.is_empty() {
                rule.push_str(" )");
            }
            rule.push_str(" )?");
        }
        rule.push_str(" space \"}\"");
        Ok(rule)
    }

    /// A JSON string that is none of `strings`, from a trie of them: at each node, one of its
    /// characters followed by more, or another character followed by anything.
    fn not_strings(&mut self, strings: &[&str]) -> Result<String, SchemaError> {
        // children[node]: (character, child) in character order; ends[node]: a string ends here.
        let mut children: Vec<BTreeMap<char, usize>> = vec![BTreeMap::new()];
        let mut ends = vec![false];
        for s in strings {
            let mut node = 0;
            for c in s.chars() {
                node = match children[node].get(&c) {
                    Some(&n) => n,
                    None => {
                        children.push(BTreeMap::new());
                        ends.push(false);
                        let n = children.len() - 1;
                        children[node].insert(c, n);
                        n
                    }
                };
            }
            ends[node] = true;
        }
        let children: Vec<Vec<(char, usize)>> = children
            .into_iter()
            .map(|m| m.into_iter().collect())
            .collect();

        let char_rule = self.add_primitive("char", "char")?;
        let mut out = String::from("[\"] ( ");
        // An explicit stack: property names may be longer than the call stack is deep.
        struct Frame {
            node: usize,
            next: usize,
            rejects: String,
        }
        let mut stack = vec![Frame {
            node: 0,
            next: 0,
            rejects: String::new(),
        }];
        while let Some(top) = stack.last_mut() {
            let kids = &children[top.node];
            if top.next < kids.len() {
                let (c, child) = kids[top.next];
                if top.next > 0 {
                    out.push_str(" | ");
                }
                top.next += 1;
                class_char(c, false, &mut top.rejects);
                out.push('[');
                class_char(c, true, &mut out);
                out.push(']');
                if children[child].is_empty() {
                    let _ = write!(out, " {char_rule}+");
                } else {
                    out.push_str(" (");
                    stack.push(Frame {
                        node: child,
                        next: 0,
                        rejects: String::new(),
                    });
                }
            } else {
                if !kids.is_empty() {
                    let _ = write!(out, " | [^\"{}] {char_rule}*", top.rejects);
                }
                stack.pop();
                if !stack.is_empty() {
                    out.push(')');
                }
            }
            if out.len() > MAX_GRAMMAR_BYTES {
                return Err(SchemaError::GrammarTooLarge {
                    limit: MAX_GRAMMAR_BYTES,
                });
            }
        }
        out.push_str(" )");
        if !ends[0] {
            out.push('?');
        }
        out.push_str(" [\"]");
        Ok(out)
    }

    /// The rule of a string `pattern`; an unsupported one accepts any string (as llama.cpp) or
    /// is an error (strict).
    fn visit_pattern(
        &mut self,
        pattern: &str,
        name: &str,
        path: &str,
    ) -> Result<String, SchemaError> {
        self.journal = Some(Vec::new());
        let result = self.pattern_to_rule(pattern, name, path);
        let journal = self.journal.take().unwrap_or_default();
        let rollback = |c: &mut Self| {
            for key in &journal {
                if let Some(body) = c.rules.remove(key) {
                    c.bytes -= key.len() + " ::= ".len() + body.len() + 1;
                }
            }
            // A number found taken may be free again.
            c.numbered.clear();
        };
        match result {
            Ok(rule) => Ok(rule),
            Err(PatternFail::Limit(e)) => Err(e),
            Err(PatternFail::Invalid(reason)) => {
                rollback(self);
                Err(SchemaError::InvalidPattern {
                    path: path.to_string(),
                    pattern: pattern.to_string(),
                    reason,
                })
            }
            Err(PatternFail::Unsupported(reason)) => {
                rollback(self);
                let err = SchemaError::UnsupportedPattern {
                    path: path.to_string(),
                    pattern: pattern.to_string(),
                    reason,
                };
                if self.warnings.strictness == Strictness::Strict {
                    return Err(err);
                }
                self.warnings
                    .warn(format!("{err}; any string is accepted instead"));
                let string = self.add_primitive("string", "string")?;
                self.add_rule(name, &string)
            }
        }
    }

    fn pattern_to_rule(
        &mut self,
        pattern: &str,
        name: &str,
        path: &str,
    ) -> Result<String, PatternFail> {
        let chars: Vec<char> = pattern.chars().collect();
        if chars.len() < 2 || chars[0] != '^' || chars[chars.len() - 1] != '$' {
            return Err(PatternFail::Unsupported(
                "not anchored with '^' and '$'".to_string(),
            ));
        }
        let mut cx = PatternCx {
            p: chars[1..chars.len() - 1].to_vec(),
            i: 0,
            paren_depth: 0,
            name: name.to_string(),
            path: path.to_string(),
            sub_rule_ids: HashMap::new(),
        };
        let rule = piece_rule(&self.transform(&mut cx)?);
        if cx.paren_depth != 0 {
            return Err(PatternFail::Invalid("unbalanced parentheses".to_string()));
        }
        Ok(self.add_rule(name, &format!("\"\\\"\" ({rule}) \"\\\"\""))?)
    }

    /// Convert the pattern from `cx.i` to the end of the current group.
    fn transform(&mut self, cx: &mut PatternCx) -> Result<Piece, PatternFail> {
        let mut seq: Vec<Piece> = Vec::new();
        let len = cx.p.len();
        let substr =
            |p: &[char], i: usize, n: usize| p[i..(i + n).min(p.len())].iter().collect::<String>();
        while cx.i < len {
            self.stop.step()?;
            let c = cx.p[cx.i];
            match c {
                '.' => {
                    let dot = self.add_rule("dot", "[^\\x0A\\x0D]")?;
                    seq.push((dot, false));
                    cx.i += 1;
                }
                '(' => {
                    cx.i += 1;
                    if cx.i < len && cx.p[cx.i] == '?' {
                        if cx.i + 1 < len && cx.p[cx.i + 1] == ':' {
                            cx.i += 2;
                        } else {
                            return Err(PatternFail::Unsupported(
                                "unsupported group syntax".to_string(),
                            ));
                        }
                    }
                    cx.paren_depth += 1;
                    if cx.paren_depth > MAX_PATTERN_DEPTH {
                        return Err(PatternFail::Unsupported(
                            "pattern nesting too deep".to_string(),
                        ));
                    }
                    let inner = self.transform(cx)?;
                    seq.push((format!("({})", piece_rule(&inner)), false));
                }
                ')' => {
                    cx.i += 1;
                    if cx.paren_depth == 0 {
                        return Err(PatternFail::Invalid("unbalanced parentheses".to_string()));
                    }
                    cx.paren_depth -= 1;
                    return Ok(join_seq(&seq));
                }
                '^' | '$' => {
                    return Err(PatternFail::Unsupported(
                        "anchor inside the pattern".to_string(),
                    ));
                }
                '[' => {
                    let mut class = String::from("[");
                    cx.i += 1;
                    while cx.i < len && cx.p[cx.i] != ']' {
                        if cx.p[cx.i] == '\\' {
                            let n = gbnf_escape_length(&cx.p, cx.i);
                            if n == 0 {
                                return Err(PatternFail::Unsupported(format!(
                                    "unsupported escape in character class: {}",
                                    substr(&cx.p, cx.i, 2)
                                )));
                            }
                            class.push_str(&substr(&cx.p, cx.i, n));
                            cx.i += n;
                        } else {
                            class.push(cx.p[cx.i]);
                            cx.i += 1;
                        }
                    }
                    if cx.i >= len {
                        return Err(PatternFail::Invalid(
                            "unterminated character class".to_string(),
                        ));
                    }
                    class.push(']');
                    cx.i += 1;
                    seq.push((class, false));
                }
                '|' => {
                    seq.push(("|".to_string(), false));
                    cx.i += 1;
                }
                '*' | '+' | '?' => {
                    let Some(last) = seq.last_mut() else {
                        return Err(PatternFail::Invalid("nothing to repeat".to_string()));
                    };
                    // In place: copying the piece for each of a run of quantifiers (`a****…`)
                    // would be quadratic in the run.
                    if last.1 {
                        *last = (format!("{}{c}", piece_rule(last)), false);
                    } else {
                        last.0.push(c);
                    }
                    cx.i += 1;
                }
                '{' => {
                    let start = cx.i + 1;
                    cx.i += 1;
                    while cx.i < len && cx.p[cx.i] != '}' {
                        cx.i += 1;
                    }
                    if cx.i >= len {
                        return Err(PatternFail::Unsupported(
                            "unterminated curly brackets".to_string(),
                        ));
                    }
                    let inner: String = cx.p[start..cx.i].iter().collect();
                    cx.i += 1;
                    let nums: Vec<&str> = inner.split(',').collect();
                    let bad =
                        || PatternFail::Unsupported("invalid number in curly brackets".to_string());
                    let (min, max) = match nums.as_slice() {
                        [n] => {
                            let v = stoi(n).ok_or_else(bad)?;
                            (v, v)
                        }
                        [a, b] => {
                            let min = if a.is_empty() {
                                0
                            } else {
                                stoi(a).ok_or_else(bad)?
                            };
                            let max = if b.is_empty() {
                                i64::from(i32::MAX)
                            } else {
                                stoi(b).ok_or_else(bad)?
                            };
                            (min, max)
                        }
                        _ => {
                            return Err(PatternFail::Unsupported(
                                "wrong number of values in curly brackets".to_string(),
                            ));
                        }
                    };
                    if min < 0 || max < 0 {
                        return Err(bad());
                    }
                    if min > max {
                        return Err(PatternFail::Invalid(format!(
                            "{{{inner}}} has its minimum above its maximum"
                        )));
                    }
                    let Some(last) = seq.last_mut() else {
                        return Err(PatternFail::Invalid("nothing to repeat".to_string()));
                    };
                    let (sub, is_literal) = std::mem::take(last);
                    let item = if is_literal {
                        format!("\"{sub}\"")
                    } else if let Some(id) = cx.sub_rule_ids.get(&sub) {
                        id.clone()
                    } else {
                        let n = cx.sub_rule_ids.len() + 1;
                        let id = self.add_rule(&format!("{}-{n}", cx.name), &sub)?;
                        cx.sub_rule_ids.insert(sub, id.clone());
                        id
                    };
                    let max = (max != i64::from(i32::MAX)).then_some(max as u64);
                    let rep = build_repetition(&item, min as u64, max, "", &cx.path)?;
                    if let Some(last) = seq.last_mut() {
                        *last = (rep, false);
                    }
                }
                _ => {
                    let mut literal = String::new();
                    let non_literal = |c: char| NON_LITERAL.contains(&c);
                    while cx.i < len {
                        let ch = cx.p[cx.i];
                        if ch == '\\' {
                            if cx.i == len - 1 {
                                return Err(PatternFail::Invalid("trailing backslash".to_string()));
                            }
                            let next = cx.p[cx.i + 1];
                            if ESCAPED_IN_REGEXPS_BUT_NOT_IN_LITERALS.contains(&next) {
                                literal.push(next);
                                cx.i += 2;
                            } else {
                                let n = gbnf_escape_length(&cx.p, cx.i);
                                if n == 0 {
                                    return Err(PatternFail::Unsupported(format!(
                                        "unsupported escape: {}",
                                        substr(&cx.p, cx.i, 2)
                                    )));
                                }
                                literal.push_str(&substr(&cx.p, cx.i, n));
                                cx.i += n;
                            }
                        } else if ch == '"' {
                            literal.push_str("\\\"");
                            cx.i += 1;
                        } else if !non_literal(ch)
                            && (cx.i == len - 1
                                || literal.is_empty()
                                || cx.p[cx.i + 1] == '.'
                                || !non_literal(cx.p[cx.i + 1]))
                        {
                            literal.push(ch);
                            cx.i += 1;
                        } else {
                            break;
                        }
                    }
                    if literal.is_empty() {
                        return Err(PatternFail::Unsupported(format!(
                            "unsupported character: {c}"
                        )));
                    }
                    seq.push((literal, true));
                }
            }
        }
        Ok(join_seq(&seq))
    }
}

/// The pieces of a sequence joined by spaces, neighbouring literals merged into one.
fn join_seq(seq: &[Piece]) -> Piece {
    let mut results: Vec<String> = Vec::new();
    let mut literal = String::new();
    for (s, is_literal) in seq {
        if *is_literal {
            literal.push_str(s);
        } else {
            if !literal.is_empty() {
                results.push(format!("\"{literal}\""));
                literal.clear();
            }
            results.push(s.clone());
        }
    }
    if !literal.is_empty() {
        results.push(format!("\"{literal}\""));
    }
    (results.join(" "), false)
}

/// What an `allOf` gathers from its parts.
#[derive(Default)]
struct AllOfParts {
    properties: Vec<(String, NodeId)>,
    required: HashSet<String>,
    /// Each enum value's literal: how many parts list it, and its type.
    enum_values: BTreeMap<String, (usize, Types)>,
    objects: usize,
}
