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
//!
//! This file holds the elements, the parsed grammar, its errors and limits, and
//! [`Grammar::parse`]; `parser` reads the text into rules, and `checks` refuses what a matcher
//! cannot run (left recursion, an empty language).

mod checks;
mod parser;
#[cfg(test)]
mod tests;

use std::collections::HashMap;

use parser::Parser;

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

    /// The elements of rule `r`, its `End` included.
    pub fn rule(&self, r: u32) -> &[Elem] {
        let start = self.starts[r as usize] as usize;
        let end = self
            .starts
            .get(r as usize + 1)
            .map_or(self.elems.len(), |&e| e as usize);
        &self.elems[start..end]
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
