//! Regular expressions (`pattern`) to grammar, llama.cpp's subset: literals, `.`, classes,
//! groups, alternatives and the quantifiers `*`, `+`, `?` and `{m,n}`, anchored with `^` and `$`.

use std::collections::HashMap;

use super::convert::Converter;
use super::syntax::build_repetition;
use super::{MAX_PATTERN_DEPTH, SchemaError, Strictness};

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

impl Converter<'_, '_> {
    /// The rule of a string `pattern`; an unsupported one accepts any string (as llama.cpp) or
    /// is an error (strict).
    pub(super) fn visit_pattern(
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
