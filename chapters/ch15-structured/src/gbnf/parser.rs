//! llama.cpp's grammar parser (`llama_grammar_parser`): GBNF text read a byte at a time into
//! rules of elements, each group and repetition rewritten as a rule of its own, every size
//! bounded by the limits as it goes.

use std::collections::HashMap;

use super::{Elem, GrammarError, MAX_ELEMENTS, MAX_GROUP_DEPTH, MAX_REPETITION, STOP_CHECK_STEPS};

/// The longest part of a rule's name that the generated names of its groups and repetitions
/// repeat (`root_3`). Names are for messages; without a bound, a rule named with half a megabyte
/// of text holding a hundred thousand groups would store half a megabyte per group.
pub(super) const GENERATED_NAME_BASE_BYTES: usize = 64;

/// llama.cpp's grammar parser, remembering where it is for error messages. It looks at the
/// text a byte at a time (every character of the syntax is ASCII) and decodes a character
/// only inside literals and classes, from where it stands: each byte is read once, so parsing
/// is linear in the text.
pub(super) struct Parser<'a> {
    pub(super) text: &'a str,
    pub(super) src: &'a [u8],
    pub(super) pos: usize,
    /// Rule names written in the text. Generated names (`root_3`) are not here: `_` is not a
    /// name character, so the text cannot refer to them.
    pub(super) symbols: HashMap<String, u32>,
    pub(super) names: Vec<String>,
    pub(super) rules: Vec<Option<Vec<Elem>>>,
    pub(super) n_elems: usize,
    pub(super) depth: usize,
    /// Steps taken, and the question whose answer stops the parse (see [`STOP_CHECK_STEPS`]).
    pub(super) steps: usize,
    pub(super) stop: &'a dyn Fn() -> bool,
}

fn is_word_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'-'
}

impl Parser<'_> {
    fn peek(&self) -> u8 {
        self.src.get(self.pos).copied().unwrap_or(0)
    }

    fn peek_at(&self, k: usize) -> u8 {
        self.src.get(self.pos + k).copied().unwrap_or(0)
    }

    fn error(&self, what: impl Into<String>) -> GrammarError {
        self.error_at(self.pos, what)
    }

    fn error_at(&self, pos: usize, what: impl Into<String>) -> GrammarError {
        let before = &self.src[..pos.min(self.src.len())];
        let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
        let line_start = before
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
        let column = String::from_utf8_lossy(&before[line_start..])
            .chars()
            .count()
            + 1;
        GrammarError::Syntax {
            line,
            column,
            what: what.into(),
        }
    }

    /// What is at the current position, for an error: a few characters, or "end of input".
    fn here(&self) -> String {
        if self.pos >= self.src.len() {
            return "end of input".into();
        }
        let rest = String::from_utf8_lossy(&self.src[self.pos..self.src.len().min(self.pos + 16)]);
        let line = rest.lines().next().unwrap_or("");
        format!("`{line}`")
    }

    fn skip_space(&mut self, newline_ok: bool) {
        loop {
            match self.peek() {
                b' ' | b'\t' => self.pos += 1,
                b'#' => {
                    while !matches!(self.peek(), 0 | b'\r' | b'\n') {
                        self.pos += 1;
                    }
                }
                b'\r' | b'\n' if newline_ok => self.pos += 1,
                _ => return,
            }
        }
    }

    fn symbol(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.symbols.get(name) {
            return id;
        }
        self.new_symbol(name.to_string())
    }

    fn new_symbol(&mut self, name: String) -> u32 {
        let id = self.names.len() as u32;
        self.symbols.insert(name.clone(), id);
        self.names.push(name);
        self.rules.push(None);
        id
    }

    /// llama.cpp's `generate_symbol_id`: `base_N`, N the number of symbols so far (`base`
    /// cut to [`GENERATED_NAME_BASE_BYTES`]).
    fn generated_symbol(&mut self, base: &str) -> u32 {
        let mut cut = base.len().min(GENERATED_NAME_BASE_BYTES);
        while !base.is_char_boundary(cut) {
            cut -= 1;
        }
        let base = &base[..cut];
        let id = self.names.len() as u32;
        self.names.push(format!("{base}_{id}"));
        self.rules.push(None);
        id
    }

    /// Count a step, and every [`STOP_CHECK_STEPS`] ask whether to give up.
    fn step(&mut self) -> Result<(), GrammarError> {
        self.steps += 1;
        if self.steps.is_multiple_of(STOP_CHECK_STEPS) && (self.stop)() {
            return Err(GrammarError::Cancelled);
        }
        Ok(())
    }

    fn add_rule(&mut self, id: u32, rule: Vec<Elem>) -> Result<(), GrammarError> {
        self.grow(rule.len())?;
        self.rules[id as usize] = Some(rule);
        Ok(())
    }

    fn grow(&mut self, n: usize) -> Result<(), GrammarError> {
        self.n_elems += n;
        if self.n_elems > MAX_ELEMENTS {
            return Err(GrammarError::TooManyElements);
        }
        Ok(())
    }

    pub(super) fn parse_grammar(&mut self) -> Result<(), GrammarError> {
        self.skip_space(true);
        while self.pos < self.src.len() {
            self.parse_rule()?;
        }
        Ok(())
    }

    fn parse_name(&mut self) -> Result<String, GrammarError> {
        let start = self.pos;
        while is_word_char(self.peek()) {
            self.pos += 1;
        }
        if self.pos == start {
            return Err(self.error(format!("expected a rule name, found {}", self.here())));
        }
        Ok(String::from_utf8_lossy(&self.src[start..self.pos]).into_owned())
    }

    fn parse_rule(&mut self) -> Result<(), GrammarError> {
        let name = self.parse_name()?;
        self.skip_space(false);
        let id = self.symbol(&name);
        if !self.src[self.pos..].starts_with(b"::=") {
            return Err(self.error(format!(
                "expected `::=` after `{name}`, found {}",
                self.here()
            )));
        }
        self.pos += 3;
        self.skip_space(true);
        self.parse_alternates(&name, id, false)?;
        match self.peek() {
            b'\r' => self.pos += if self.peek_at(1) == b'\n' { 2 } else { 1 },
            b'\n' => self.pos += 1,
            0 if self.pos >= self.src.len() => {}
            _ => {
                return Err(self.error(format!(
                    "expected a new line or the end after rule `{name}`, found {}",
                    self.here()
                )));
            }
        }
        self.skip_space(true);
        Ok(())
    }

    fn parse_alternates(&mut self, name: &str, id: u32, nested: bool) -> Result<(), GrammarError> {
        let mut rule = Vec::new();
        self.parse_sequence(name, &mut rule, nested)?;
        while self.peek() == b'|' {
            rule.push(Elem::Alt);
            self.pos += 1;
            self.skip_space(true);
            self.parse_sequence(name, &mut rule, nested)?;
        }
        rule.push(Elem::End);
        self.add_rule(id, rule)
    }

    /// One escape or character of a literal or class, as a code point.
    fn parse_char(&mut self) -> Result<u32, GrammarError> {
        self.step()?;
        let start = self.pos;
        match self.peek() {
            b'\\' => {
                let kind = self.peek_at(1);
                self.pos += 2;
                let hex = |p: &mut Self, n: usize| -> Result<u32, GrammarError> {
                    let digits = p.src.get(p.pos..p.pos + n).unwrap_or(&[]);
                    let text = std::str::from_utf8(digits).unwrap_or("");
                    match u32::from_str_radix(text, 16) {
                        Ok(v) if text.len() == n && text.bytes().all(|b| b.is_ascii_hexdigit()) => {
                            p.pos += n;
                            Ok(v)
                        }
                        _ => Err(p.error_at(
                            start,
                            format!("expected {n} hex digits after `\\{}`", kind as char),
                        )),
                    }
                };
                // `\u` and `\U` can write numbers that are no character: UTF-16's surrogates
                // and what lies past U+10FFFF. No text holds them, so a class or literal with
                // one would mean something other than what it says.
                let code_point = |p: &mut Self, n: usize| -> Result<u32, GrammarError> {
                    let v = hex(p, n)?;
                    let written = String::from_utf8_lossy(&p.src[start..p.pos]).into_owned();
                    if (0xD800..=0xDFFF).contains(&v) {
                        Err(p.error_at(
                            start,
                            format!(
                                "`{written}` is a UTF-16 surrogate (U+D800 to U+DFFF), not a \
                                 character"
                            ),
                        ))
                    } else if v > char::MAX as u32 {
                        Err(p.error_at(
                            start,
                            format!("`{written}` is past U+10FFFF, the last character"),
                        ))
                    } else {
                        Ok(v)
                    }
                };
                match kind {
                    b'x' => hex(self, 2),
                    b'u' => code_point(self, 4),
                    b'U' => code_point(self, 8),
                    b't' => Ok('\t' as u32),
                    b'r' => Ok('\r' as u32),
                    b'n' => Ok('\n' as u32),
                    b'\\' | b'"' | b'[' | b']' | b'-' => Ok(kind as u32),
                    0 => Err(self.error_at(start, "unexpected end of input after `\\`")),
                    _ => Err(self.error_at(
                        start,
                        format!("unknown escape `\\{}`", String::from_utf8_lossy(&[kind])),
                    )),
                }
            }
            0 if self.pos >= self.src.len() => Err(self.error("unexpected end of input")),
            _ => {
                // One character, decoded where it starts: the parser moves over ASCII a byte at
                // a time and over other characters whole, so it stands on a boundary.
                let c = (self.text.get(self.pos..))
                    .and_then(|rest| rest.chars().next())
                    .ok_or_else(|| self.error("expected a character"))?;
                self.pos += c.len_utf8();
                Ok(c as u32)
            }
        }
    }

    fn parse_int(&mut self) -> Result<u64, GrammarError> {
        let start = self.pos;
        while self.peek().is_ascii_digit() {
            self.pos += 1;
        }
        if start == self.pos {
            return Err(self.error(format!("expected a number, found {}", self.here())));
        }
        let text = std::str::from_utf8(&self.src[start..self.pos]).unwrap_or("");
        // A count too large for u64 is certainly beyond MAX_REPETITION.
        Ok(text.parse().unwrap_or(u64::MAX))
    }

    fn parse_sequence(
        &mut self,
        name: &str,
        rule: &mut Vec<Elem>,
        nested: bool,
    ) -> Result<(), GrammarError> {
        let mut last_sym_start = rule.len();
        // llama.cpp's `n_prev_rules`: how many rules the last symbol stands for, multiplied by
        // each repetition applied to it; above MAX_REPETITION it refuses the grammar.
        let mut n_prev_rules: u64 = 1;
        while self.pos < self.src.len() {
            self.step()?;
            let c = self.peek();
            match c {
                b'"' => {
                    self.pos += 1;
                    last_sym_start = rule.len();
                    n_prev_rules = 1;
                    while self.peek() != b'"' {
                        if self.pos >= self.src.len() {
                            return Err(self.error("unexpected end of input inside a string"));
                        }
                        let ch = self.parse_char()?;
                        rule.push(Elem::Char(ch));
                    }
                    self.pos += 1;
                    self.skip_space(nested);
                }
                b'[' => {
                    self.pos += 1;
                    let negated = self.peek() == b'^';
                    if negated {
                        self.pos += 1;
                    }
                    last_sym_start = rule.len();
                    n_prev_rules = 1;
                    while self.peek() != b']' {
                        if self.pos >= self.src.len() {
                            return Err(self.error("unexpected end of input inside `[...]`"));
                        }
                        let ch = self.parse_char()?;
                        rule.push(if last_sym_start < rule.len() {
                            Elem::CharAlt(ch)
                        } else if negated {
                            Elem::CharNot(ch)
                        } else {
                            Elem::Char(ch)
                        });
                        if self.peek() == b'-' && self.peek_at(1) != b']' {
                            if self.pos + 1 >= self.src.len() {
                                return Err(self.error("unexpected end of input inside `[...]`"));
                            }
                            self.pos += 1;
                            let hi = self.parse_char()?;
                            rule.push(Elem::CharRngUpper(hi));
                        }
                    }
                    if last_sym_start == rule.len() {
                        // `[]` matches nothing and `[^]` anything: llama.cpp leaves such a
                        // class without elements, which breaks its matcher; say so here.
                        return Err(self.error("an empty character class `[]`"));
                    }
                    self.pos += 1;
                    self.skip_space(nested);
                }
                b'<' | b'!' => {
                    return Err(self.error(
                        "token references (`<[id]>`, `<|name|>`, `!<…>`) are not supported: \
                         this grammar constrains text, not token ids",
                    ));
                }
                c if is_word_char(c) => {
                    let n = self.parse_name()?;
                    let id = self.symbol(&n);
                    self.skip_space(nested);
                    last_sym_start = rule.len();
                    n_prev_rules = 1;
                    rule.push(Elem::RuleRef(id));
                }
                b'(' => {
                    let open = self.pos;
                    self.pos += 1;
                    self.skip_space(true);
                    self.depth += 1;
                    if self.depth > MAX_GROUP_DEPTH {
                        return Err(self.error_at(
                            open,
                            format!("groups nested more than {MAX_GROUP_DEPTH} deep"),
                        ));
                    }
                    let before = self.names.len();
                    let sub = self.generated_symbol(name);
                    self.parse_alternates(name, sub, true)?;
                    self.depth -= 1;
                    n_prev_rules = (self.names.len() - before).max(1) as u64;
                    last_sym_start = rule.len();
                    rule.push(Elem::RuleRef(sub));
                    if self.peek() != b')' {
                        return Err(self.error(format!(
                            "expected `)` to close the group opened at {}, found {}",
                            self.where_is(open),
                            self.here()
                        )));
                    }
                    self.pos += 1;
                    self.skip_space(nested);
                }
                b'.' => {
                    last_sym_start = rule.len();
                    n_prev_rules = 1;
                    rule.push(Elem::CharAny);
                    self.pos += 1;
                    self.skip_space(nested);
                }
                b'*' | b'+' | b'?' => {
                    let at = self.pos;
                    self.pos += 1;
                    self.skip_space(nested);
                    let (min, max) = match c {
                        b'*' => (0, None),
                        b'+' => (1, None),
                        _ => (0, Some(1)),
                    };
                    self.repeat(
                        name,
                        rule,
                        last_sym_start,
                        (min, max),
                        at,
                        &mut n_prev_rules,
                    )?;
                }
                b'{' => {
                    let at = self.pos;
                    self.pos += 1;
                    self.skip_space(nested);
                    let min = self.parse_int()?;
                    self.skip_space(nested);
                    let max = match self.peek() {
                        b'}' => Some(min),
                        b',' => {
                            self.pos += 1;
                            self.skip_space(nested);
                            let max = if self.peek().is_ascii_digit() {
                                let m = self.parse_int()?;
                                self.skip_space(nested);
                                Some(m)
                            } else {
                                None
                            };
                            if self.peek() != b'}' {
                                return Err(
                                    self.error(format!("expected `}}`, found {}", self.here()))
                                );
                            }
                            max
                        }
                        _ => {
                            return Err(
                                self.error(format!("expected `,` or `}}`, found {}", self.here()))
                            );
                        }
                    };
                    self.pos += 1;
                    self.skip_space(nested);
                    if min > MAX_REPETITION {
                        return Err(self.error_at(
                            at,
                            format!("a repetition of at least {min}; at most {MAX_REPETITION}"),
                        ));
                    }
                    if let Some(m) = max
                        && m < min
                    {
                        return Err(self.error_at(
                            at,
                            format!(
                                "a repetition {{{min},{m}}} with its maximum below its minimum"
                            ),
                        ));
                    }
                    // As llama.cpp: a maximum beyond the threshold means no maximum.
                    let max = max.filter(|&m| m <= MAX_REPETITION);
                    self.repeat(
                        name,
                        rule,
                        last_sym_start,
                        (min, max),
                        at,
                        &mut n_prev_rules,
                    )?;
                }
                _ => break,
            }
        }
        Ok(())
    }

    /// "line L, column C", for pointing back at an earlier position.
    fn where_is(&self, pos: usize) -> String {
        match self.error_at(pos, "") {
            GrammarError::Syntax { line, column, .. } => format!("line {line}, column {column}"),
            _ => String::new(),
        }
    }

    // ANCHOR: repeat
    /// llama.cpp's `handle_repetitions`: rewrite the last symbol of `rule` (from
    /// `last_sym_start`) as `min` copies, then `max - min` nested optional rules (or one
    /// recursive rule when unbounded).
    fn repeat(
        &mut self,
        name: &str,
        rule: &mut Vec<Elem>,
        last_sym_start: usize,
        (min, max): (u64, Option<u64>),
        at: usize,
        n_prev_rules: &mut u64,
    ) -> Result<(), GrammarError> {
        if last_sym_start == rule.len() {
            return Err(self.error_at(
                at,
                "a repetition (`*`, `+`, `?`, `{…}`) with nothing before it",
            ));
        }
        let total = match max {
            Some(m) if m > 0 => m,
            _ => min.max(1),
        };
        *n_prev_rules = n_prev_rules.saturating_mul(total);
        if *n_prev_rules > MAX_REPETITION {
            return Err(self.error_at(
                at,
                format!(
                    "nested repetitions multiply to more than {MAX_REPETITION} copies; \
                     reduce the repetition counts"
                ),
            ));
        }
        let prev: Vec<Elem> = rule[last_sym_start..].to_vec();
        // ANCHOR_END: repeat
        // ANCHOR: repeat_expand
        // Bound what the expansion will add before making it.
        let n_opt = match max {
            None => 1,
            Some(m) => m - min,
        };
        let added = (min as usize + n_opt as usize).saturating_mul(prev.len() + 3);
        if self
            .n_elems
            .saturating_add(rule.len())
            .saturating_add(added)
            > MAX_ELEMENTS
        {
            return Err(GrammarError::TooManyElements);
        }
        if min == 0 {
            rule.truncate(last_sym_start);
        } else {
            for _ in 1..min {
                rule.extend_from_slice(&prev);
            }
        }
        let mut last_rec = 0;
        for i in 0..n_opt {
            let id = self.generated_symbol(name);
            let mut rec = prev.clone();
            if i > 0 || max.is_none() {
                rec.push(Elem::RuleRef(if max.is_none() { id } else { last_rec }));
            }
            rec.push(Elem::Alt);
            rec.push(Elem::End);
            self.add_rule(id, rec)?;
            last_rec = id;
        }
        if n_opt > 0 {
            rule.push(Elem::RuleRef(last_rec));
        }
        Ok(())
    }
    // ANCHOR_END: repeat_expand
}
