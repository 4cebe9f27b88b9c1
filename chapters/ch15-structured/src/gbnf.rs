//! GBNF, llama.cpp's grammar language, parsed into rules a matcher can walk.
//!
//! A grammar is a list of rules, `name ::= alternatives`. An alternative is a sequence of
//! literals (`"abc"`, with `\n`, `\t`, `\r`, `\\`, `\"`, `\xHH`, `\uHHHH`, `\UHHHHHHHH`),
//! character classes (`[a-z0-9_]`, negated `[^"\\]`), any character (`.`), references to other
//! rules, and groups (`( … )`), each optionally repeated (`*`, `+`, `?`, `{m}`, `{m,}`,
//! `{m,n}`). `#` starts a comment. The grammar accepts what its root rule (`root`) derives.
//!
//! The parsed form is llama.cpp's (`llama_grammar_parser`): every rule is one array of
//! elements, its alternatives separated by `Alt` and closed by `End`; a character class is a
//! run of elements (`Char` or `CharNot`, then `CharAlt`s, each possibly followed by a
//! `CharRngUpper`). Groups and repetitions become rules of their own, so the matcher only
//! ever sees sequences, alternatives and references:
//!
//! ```text
//! S*      →  S' ::= S S' |            S+  →  S S'   (S' as for *)
//! S?      →  S' ::= S |               S{2,4}  →  S S S'(2),  S'(x) ::= S S'(x-1) |
//! ```
//!
//! Everything a hostile grammar could blow up is bounded by a named limit: its size, the
//! elements repetitions expand to, the depth of nested groups.

use std::collections::HashMap;

// ANCHOR: limits
/// The largest grammar text accepted, in bytes. The JSON grammars of real schemas are a few
/// kilobytes; a megabyte leaves room for big generated grammars while keeping parsing (linear
/// in the text) and the rule arrays small.
pub const MAX_GRAMMAR_BYTES: usize = 1 << 20;

/// The most elements all rules may hold after repetitions are expanded. `x{2000}` of a
/// 10-element group is 20,000; nested repetitions multiply, which is how a short grammar
/// would otherwise ask for gigabytes.
pub const MAX_ELEMENTS: usize = 1 << 20;

/// llama.cpp's `MAX_REPETITION_THRESHOLD`: the largest count in `{m,n}`. A larger `n` means
/// "unbounded" (as in llama.cpp); a larger `m` is an error.
pub const MAX_REPETITION: u64 = 2000;

/// The deepest nesting of groups. Parsing recurses once per `(`; 256 levels is far beyond any
/// written grammar and far within the smallest thread stack.
pub const MAX_GROUP_DEPTH: usize = 256;
// ANCHOR_END: limits

/// How often a compile asks whether to give up (a request cancelled while its grammar is being
/// compiled): every 4096 characters parsed, subschemas visited or stacks advanced. A step takes
/// from tens of nanoseconds (a character) to microseconds (a stack thousands deep), so a
/// cancelled compile stops within milliseconds, and asking (an atomic load) costs nothing
/// beside the steps.
pub const STOP_CHECK_STEPS: usize = 4096;

/// The longest part of a rule's name that the generated names of its groups and repetitions
/// repeat (`root_3`). Names are for messages; without a bound, a rule named with half a megabyte
/// of text holding a hundred thousand groups would store half a megabyte per group.
const GENERATED_NAME_BASE_BYTES: usize = 64;

// ANCHOR: elem
/// One element of a rule (llama.cpp's `llama_grammar_element`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Elem {
    /// The end of a rule.
    End,
    /// The start of the next alternative.
    Alt,
    /// A reference to rule `n`.
    RuleRef(u32),
    /// A character class starting with code point `c` (also a literal's character).
    Char(u32),
    /// A negated class starting with code point `c`: any character but those listed.
    CharNot(u32),
    /// Makes the element before it the lower end of an inclusive range up to `c`.
    CharRngUpper(u32),
    /// One more character (or range start) of the class before it.
    CharAlt(u32),
    /// Any character (`.`).
    CharAny,
}

impl Elem {
    /// Whether the element ends an alternative.
    pub fn ends_sequence(self) -> bool {
        matches!(self, Elem::End | Elem::Alt)
    }
}
// ANCHOR_END: elem

/// A grammar that could not be built, with where and why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GrammarError {
    #[error("line {line}, column {column}: {what}")]
    Syntax {
        line: usize,
        column: usize,
        what: String,
    },
    #[error("rule `{0}` is used but never defined")]
    Undefined(String),
    #[error("the grammar has no rule `{0}` to start from")]
    NoRoot(String),
    #[error(
        "rule `{0}` is left-recursive (it can reach itself before matching a character), \
         which a top-down matcher cannot run; rewrite it with repetition, e.g. `x ::= a (b)*`"
    )]
    LeftRecursion(String),
    #[error(
        "the grammar accepts no text: rule `{0}` can never finish (every alternative needs \
         itself again, or a character class that matches nothing)"
    )]
    Empty(String),
    #[error("the grammar is {0} bytes; at most {MAX_GRAMMAR_BYTES} are accepted")]
    TooLarge(usize),
    #[error(
        "the grammar expands to more than {MAX_ELEMENTS} elements (repetitions multiply); \
         reduce the repetition counts"
    )]
    TooManyElements,
    #[error(
        "the grammar accepts only text with a NUL character (`\\x00`) in it, which generation \
         never gives: as in llama.cpp, no token whose text starts with NUL is allowed"
    )]
    NeedsNul,
    #[error("compiling stopped: the request was cancelled")]
    Cancelled,
}

// ANCHOR: parse
/// A parsed grammar: its rules, their names, and the rule it starts from.
#[derive(Debug, Clone)]
pub struct Grammar {
    /// All rules' elements, one after another; rule `r` starts at `starts[r]`.
    pub elems: Vec<Elem>,
    pub starts: Vec<u32>,
    /// Rule names by id (groups and repetitions get `name_N`, as in llama.cpp).
    pub names: Vec<String>,
    pub root: u32,
}

impl Grammar {
    /// Parse GBNF text and check it can be run from rule `root`: every rule defined, none
    /// left-recursive, and the language not empty. Each step is linear in the text.
    pub fn parse(text: &str, root: &str) -> Result<Grammar, GrammarError> {
        Grammar::parse_until(text, root, &|| false)
    }

    /// [`Grammar::parse`], giving up with [`GrammarError::Cancelled`] once `stop` says so
    /// (asked every [`STOP_CHECK_STEPS`] characters).
    pub fn parse_until(
        text: &str,
        root: &str,
        stop: &dyn Fn() -> bool,
    ) -> Result<Grammar, GrammarError> {
        if text.len() > MAX_GRAMMAR_BYTES {
            return Err(GrammarError::TooLarge(text.len()));
        }
        let mut p = Parser {
            text,
            src: text.as_bytes(),
            pos: 0,
            symbols: HashMap::new(),
            names: Vec::new(),
            rules: Vec::new(),
            n_elems: 0,
            depth: 0,
            steps: 0,
            stop,
        };
        p.parse_grammar()?;
        // ANCHOR_END: parse
        // ANCHOR: parse_checks
        let Parser { names, rules, .. } = p;
        for (id, rule) in rules.iter().enumerate() {
            if rule.is_none() {
                return Err(GrammarError::Undefined(names[id].clone()));
            }
        }
        let rules: Vec<Vec<Elem>> = rules.into_iter().map(Option::unwrap_or_default).collect();
        let root = names
            .iter()
            .position(|n| n == root)
            .ok_or_else(|| GrammarError::NoRoot(root.to_string()))? as u32;
        let mut elems = Vec::with_capacity(rules.iter().map(Vec::len).sum());
        let mut starts = Vec::with_capacity(rules.len());
        for r in &rules {
            starts.push(elems.len() as u32);
            elems.extend_from_slice(r);
        }
        let g = Grammar {
            elems,
            starts,
            names,
            root,
        };
        if let Some(r) = g.left_recursive_rule() {
            return Err(GrammarError::LeftRecursion(g.names[r].clone()));
        }
        if !g.productive(true)[root as usize] {
            return Err(GrammarError::Empty(g.names[root as usize].clone()));
        }
        Ok(g)
    }
    // ANCHOR_END: parse_checks

    /// Whether every sentence of the grammar has a NUL character (`\x00`) in it. Generation
    /// cannot give such a grammar what it needs: as in llama.cpp, whose token pieces are
    /// 0-terminated strings, no token whose piece starts with NUL is ever allowed (`mask.rs`),
    /// so where the grammar needs NUL every token would be masked.
    pub fn needs_nul(&self) -> bool {
        !self.productive(false)[self.root as usize]
    }

    /// The elements of rule `r`, its `End` included.
    pub fn rule(&self, r: u32) -> &[Elem] {
        let start = self.starts[r as usize] as usize;
        let end = self
            .starts
            .get(r as usize + 1)
            .map_or(self.elems.len(), |&e| e as usize);
        &self.elems[start..end]
    }

    /// The alternatives of rule `r`, each without its closing `Alt`/`End`.
    fn alternatives(&self, r: u32) -> impl Iterator<Item = &[Elem]> {
        let rule = self.rule(r);
        rule[..rule.len() - 1].split(|e| *e == Elem::Alt)
    }

    /// Whether each rule has an empty alternative. llama.cpp's left-recursion check looks
    /// through a rule only when it has one (not through rules that are empty only by way of
    /// others); the matcher's own bounds cover what that lets through.
    fn has_empty_alternative(&self) -> Vec<bool> {
        (0..self.starts.len() as u32)
            .map(|r| self.alternatives(r).any(<[Elem]>::is_empty))
            .collect()
    }

    /// Whether a rule derives at least one finite string, for every rule: a rule is productive
    /// when one alternative has only classes that match something and references to productive
    /// rules. Found with a worklist, in time linear in the grammar: each alternative counts
    /// its references still waiting, and each rule found productive takes one off the count of
    /// every alternative that refers to it; an alternative whose count reaches zero makes its
    /// rule productive. (Going over all rules until nothing changes would take one pass per
    /// link of the longest chain of rules: quadratic in the grammar.) With `nul` false, a
    /// class must match a character other than NUL.
    fn productive(&self, nul: bool) -> Vec<bool> {
        let n = self.starts.len();
        let mut productive = vec![false; n];
        let mut found: Vec<u32> = Vec::new();
        // Per alternative that can match at all: its rule and its references still waiting.
        let mut owner: Vec<u32> = Vec::new();
        let mut waiting: Vec<u32> = Vec::new();
        // (referenced rule, referring alternative), once per reference.
        let mut refs: Vec<(u32, u32)> = Vec::new();
        for r in 0..n as u32 {
            for alt in self.alternatives(r) {
                let a = owner.len() as u32;
                let first_ref = refs.len();
                let mut matches = true;
                let mut i = 0;
                while i < alt.len() {
                    match alt[i] {
                        Elem::RuleRef(x) => {
                            refs.push((x, a));
                            i += 1;
                        }
                        Elem::Char(_) | Elem::CharNot(_) | Elem::CharAny => {
                            let end = class_end(alt, i);
                            let class = &alt[i..end];
                            matches &= match class {
                                // A literal's character matches itself.
                                [Elem::Char(c)] => nul || *c != 0,
                                _ if nul => class_matches_something(class),
                                _ => class_matches_besides_nul(class),
                            };
                            i = end;
                        }
                        _ => i += 1,
                    }
                }
                if !matches {
                    refs.truncate(first_ref);
                    continue;
                }
                owner.push(r);
                waiting.push((refs.len() - first_ref) as u32);
                if refs.len() == first_ref && !productive[r as usize] {
                    productive[r as usize] = true;
                    found.push(r);
                }
            }
        }
        // The alternatives referring to each rule, grouped by rule (a counting sort).
        let mut first = vec![0usize; n + 1];
        for &(x, _) in &refs {
            first[x as usize + 1] += 1;
        }
        for r in 0..n {
            first[r + 1] += first[r];
        }
        let mut users = vec![0u32; refs.len()];
        let mut next = first.clone();
        for &(x, a) in &refs {
            users[next[x as usize]] = a;
            next[x as usize] += 1;
        }
        while let Some(r) = found.pop() {
            for &a in &users[first[r as usize]..first[r as usize + 1]] {
                waiting[a as usize] -= 1;
                let o = owner[a as usize] as usize;
                if waiting[a as usize] == 0 && !productive[o] {
                    productive[o] = true;
                    found.push(o as u32);
                }
            }
        }
        productive
    }

    /// A rule that can reach itself without matching a character first (llama.cpp's
    /// `llama_grammar_detect_left_recursion`), found without recursion: an edge `a → b` means
    /// `b` can be the first thing `a` matches (after rules with an empty alternative), and a
    /// cycle is left recursion.
    fn left_recursive_rule(&self) -> Option<usize> {
        let n = self.starts.len();
        let nullable = self.has_empty_alternative();
        let firsts: Vec<Vec<u32>> = (0..n as u32)
            .map(|r| {
                let mut out = Vec::new();
                for alt in self.alternatives(r) {
                    for e in alt {
                        match *e {
                            Elem::RuleRef(x) => {
                                out.push(x);
                                if !nullable[x as usize] {
                                    break;
                                }
                            }
                            _ => break,
                        }
                    }
                }
                out
            })
            .collect();
        // Iterative depth-first search with three colours: 0 unseen, 1 on the path, 2 done.
        let mut colour = vec![0u8; n];
        for start in 0..n {
            if colour[start] != 0 {
                continue;
            }
            let mut path: Vec<(usize, usize)> = vec![(start, 0)];
            colour[start] = 1;
            while let Some(&mut (r, ref mut next)) = path.last_mut() {
                if let Some(&x) = firsts[r].get(*next) {
                    *next += 1;
                    match colour[x as usize] {
                        0 => {
                            colour[x as usize] = 1;
                            path.push((x as usize, 0));
                        }
                        1 => return Some(x as usize),
                        _ => {}
                    }
                } else {
                    colour[r] = 2;
                    path.pop();
                }
            }
        }
        None
    }
}

/// The index just past the character class starting at `i` of `seq`.
pub fn class_end(seq: &[Elem], i: usize) -> usize {
    let mut j = i + 1;
    while j < seq.len() && matches!(seq[j], Elem::CharAlt(_) | Elem::CharRngUpper(_)) {
        j += 1;
    }
    j
}

// ANCHOR: class_matches_something
/// Whether a class (its elements, from its `Char`/`CharNot`/`CharAny` on) matches at least one
/// code point: `[z-a]` and `[^\x00-\U0010FFFF]` match none.
fn class_matches_something(class: &[Elem]) -> bool {
    // ANCHOR: yours_class_matches_something
    let mut ranges = Vec::new();
    let negated = matches!(class[0], Elem::CharNot(_));
    let mut i = 0;
    while i < class.len() {
        let lo = match class[i] {
            Elem::CharAny => return true,
            Elem::Char(c) | Elem::CharNot(c) | Elem::CharAlt(c) => c,
            _ => unreachable!("a class starts with a character"),
        };
        let hi = match class.get(i + 1) {
            Some(Elem::CharRngUpper(c)) => {
                i += 1;
                *c
            }
            _ => lo,
        };
        if lo <= hi {
            ranges.push((lo, hi));
        }
        i += 1;
    }
    if !negated {
        return !ranges.is_empty();
    }
    // A negated class matches something unless its ranges cover every code point.
    ranges.sort_unstable();
    let mut covered_to = 0u32; // everything below is covered
    for (lo, hi) in ranges {
        if lo > covered_to {
            return true;
        }
        covered_to = covered_to.max(hi.saturating_add(1));
    }
    covered_to <= char::MAX as u32
    // ANCHOR_END: yours_class_matches_something
}
// ANCHOR_END: class_matches_something

/// Whether a class matches a code point other than NUL: the same class with NUL taken out —
/// added to a negated class's list, cut from the bottom of a positive class's ranges — still
/// matches something.
fn class_matches_besides_nul(class: &[Elem]) -> bool {
    let mut without = Vec::with_capacity(class.len() + 2);
    for (k, &e) in class.iter().enumerate() {
        match e {
            // A range starting at NUL starts at 1; NUL alone becomes the empty range 1..0.
            Elem::Char(0) | Elem::CharAlt(0) => {
                without.push(if matches!(e, Elem::Char(_)) {
                    Elem::Char(1)
                } else {
                    Elem::CharAlt(1)
                });
                if !matches!(class.get(k + 1), Some(Elem::CharRngUpper(_))) {
                    without.push(Elem::CharRngUpper(0));
                }
            }
            _ => without.push(e),
        }
    }
    if matches!(class[0], Elem::CharNot(_)) {
        without.push(Elem::CharAlt(0));
    }
    class_matches_something(&without)
}

/// llama.cpp's grammar parser, remembering where it is for error messages. It looks at the
/// text a byte at a time (every character of the syntax is ASCII) and decodes a character
/// only inside literals and classes, from where it stands: each byte is read once, so parsing
/// is linear in the text.
struct Parser<'a> {
    text: &'a str,
    src: &'a [u8],
    pos: usize,
    /// Rule names written in the text. Generated names (`root_3`) are not here: `_` is not a
    /// name character, so the text cannot refer to them.
    symbols: HashMap<String, u32>,
    names: Vec<String>,
    rules: Vec<Option<Vec<Elem>>>,
    n_elems: usize,
    depth: usize,
    /// Steps taken, and the question whose answer stops the parse (see [`STOP_CHECK_STEPS`]).
    steps: usize,
    stop: &'a dyn Fn() -> bool,
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

    fn parse_grammar(&mut self) -> Result<(), GrammarError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        Grammar::parse(text, "root").unwrap_err().to_string()
    }

    #[test]
    fn errors_name_line_and_column() {
        assert_eq!(
            err("root ::= \"a\"\nx ::= \"b\" )\n"),
            "line 2, column 11: expected a new line or the end after rule `x`, found `)`"
        );
        assert!(err("root ::= foo").contains("`foo` is used but never defined"));
        assert!(err("root ::= \"a\" |\n  \"\\q\"").starts_with("line 2, column 4: unknown escape"));
        assert!(err("rot ::= \"a\"").contains("no rule `root`"));
    }

    #[test]
    fn left_recursion_and_empty_languages_are_refused() {
        assert!(err("root ::= \"a\" | root \"a\"").contains("left-recursive"));
        assert!(err("root ::= e root\ne ::= \"x\" | ").contains("left-recursive"));
        assert!(err("root ::= \"a\" root").contains("accepts no text"));
        assert!(err("root ::= [z-a]").contains("accepts no text"));
        assert!(err("root ::= [^\\x00-\\U0010FFFF]").contains("accepts no text"));
        assert!(Grammar::parse("root ::= ( [x]* )*", "root").is_ok());
    }

    /// A negated class matches what its ranges leave, however little: one code point at the
    /// top of Unicode, or one between two ranges. Ranges that meet leave nothing.
    #[test]
    fn a_negated_class_matches_the_code_points_its_ranges_leave() {
        assert!(Grammar::parse("root ::= [^\\x00-\\U0010FFFE]", "root").is_ok());
        assert!(Grammar::parse("root ::= [^\\x00-ac-\\U0010FFFF]", "root").is_ok());
        assert!(err("root ::= [^\\x00-bc-\\U0010FFFF]").contains("accepts no text"));
    }

    #[test]
    fn hostile_sizes_are_bounded() {
        assert!(err("root ::= \"a\"{3000}").contains("at most 2000"));
        // Nested repetitions multiply (llama.cpp's rule of thumb, kept for the same answers).
        assert!(err("root ::= (\"a\"? \"b\"? \"c\"?){1000}").contains("multiply"));
        // A long literal repeated is refused before it is built.
        let long = format!("root ::= \"{}\"{{2000}}", "a".repeat(1000));
        assert!(err(&long).contains("more than"));
        let deep = format!("root ::= {}\"a\"{}", "(".repeat(10_000), ")".repeat(10_000));
        assert!(err(&deep).contains("nested more than"));
        let big = format!("root ::= \"{}\"", "a".repeat(MAX_GRAMMAR_BYTES));
        assert!(err(&big).contains("bytes; at most"));
    }

    #[test]
    fn generated_names_keep_a_bounded_part_of_the_rule_name() {
        let long = "n".repeat(10_000);
        let g = Grammar::parse(
            &format!("root ::= {long}\n{long} ::= (\"a\") (\"b\")*"),
            "root",
        )
        .expect("a long rule name");
        let base = &long[..GENERATED_NAME_BASE_BYTES];
        let generated: Vec<&String> = g.names.iter().filter(|n| n.contains('_')).collect();
        assert_eq!(generated.len(), 3, "{:?}", g.names);
        for (name, id) in generated.iter().zip(2..) {
            assert_eq!(**name, format!("{base}_{id}"));
        }
    }

    #[test]
    fn nul_is_needed_only_when_every_sentence_has_one() {
        let needs = |text: &str| Grammar::parse(text, "root").expect(text).needs_nul();
        assert!(needs(r#"root ::= "a" [\x00]"#));
        assert!(needs(r#"root ::= "a" ([\x00] | [^\x01-\U0010FFFF])+"#));
        assert!(!needs(r#"root ::= "a" | "b" [\x00]"#));
        assert!(!needs(r#"root ::= [\x00-\x01]"#));
        assert!(!needs(r#"root ::= [^\x01]"#));
        assert!(!needs("root ::= \"a\" .*"));
    }
}
