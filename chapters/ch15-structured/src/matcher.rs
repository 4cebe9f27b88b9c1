//! Which text a grammar still accepts: llama.cpp's pushdown stacks, one code point at a time.
//!
//! A *stack* is a list of positions in the grammar's rules, the top being the character class
//! to match next and those below it where to go on once the rule above finishes. Because a
//! grammar is ambiguous in general, the matcher keeps a *set* of stacks — every way the text so
//! far can be read. Accepting a character keeps the stacks whose top class matches it, moves
//! each past that class, and *advances* it: while its top is a rule reference, replace the
//! reference with each alternative of the rule (llama.cpp's `llama_grammar_advance_stack`).
//! An empty stack means the text so far is a whole sentence; no stacks at all means the text
//! can no longer become one.
//!
//! Text arrives as token bytes, and a token may end in the middle of a UTF-8 character, so the
//! matcher also carries the start of an unfinished character ([`Partial`]) and keeps a token
//! only if some class could still match a character starting with those bytes.

use crate::gbnf::{Elem, Grammar, STOP_CHECK_STEPS};
use rustc_hash::FxHasher;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

// ANCHOR: limits
/// The most stacks one state may hold. A grammar whose readings multiply (`x ::= "a"* "a"*`,
/// nested) can double its stacks with every character; 4096 readings of one text is far more
/// than any practical grammar has (JSON grammars keep a handful), and bounds each step's work.
pub const MAX_STACKS: usize = 4096;

/// The deepest stack: nesting in the text (`[[[[…` under a JSON grammar) pushes one position
/// per level. 4096 levels is far beyond any real document and keeps a stack small.
pub const MAX_STACK_DEPTH: usize = 4096;
// ANCHOR_END: limits

/// Text the grammar refuses, or a state too large to follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MatchError {
    #[error("the text cannot continue any sentence of the grammar")]
    Rejected,
    #[error(
        "the grammar reads the text in more than {MAX_STACKS} ways at once, or nests it more \
         than {MAX_STACK_DEPTH} deep; simplify the grammar (it is ambiguous)"
    )]
    TooManyStacks,
    #[error("stopped: the request was cancelled")]
    Cancelled,
}

// ANCHOR: stacks
/// A set of stacks, stored flat: stack `i` is `data[ends[i-1]..ends[i]]`, top last.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stacks {
    /// A hash of each stack, compared before the stack itself: deep stacks that differ only
    /// at the top would otherwise be compared position by position, and finding one among
    /// thousands would cost their depth times their number.
    hashes: Vec<u64>,
    data: Vec<u32>,
    ends: Vec<u32>,
}
// ANCHOR_END: stacks

/// The stacks' hashes stand for them (equal stacks have equal hashes).
impl Hash for Stacks {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.hashes.hash(state);
    }
}

fn stack_hash(s: &[u32]) -> u64 {
    let mut h = FxHasher::default();
    s.hash(&mut h);
    h.finish()
}

impl Stacks {
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    pub fn clear(&mut self) {
        self.hashes.clear();
        self.data.clear();
        self.ends.clear();
    }

    pub fn get(&self, i: usize) -> &[u32] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.data[start..self.ends[i] as usize]
    }

    pub fn iter(&self) -> impl Iterator<Item = &[u32]> {
        (0..self.len()).map(|i| self.get(i))
    }

    fn contains(&self, s: &[u32]) -> bool {
        self.contains_hashed(s, stack_hash(s))
    }

    fn contains_hashed(&self, s: &[u32], hash: u64) -> bool {
        (self.hashes.iter().enumerate()).any(|(i, &h)| h == hash && self.get(i) == s)
    }

    fn push(&mut self, s: &[u32]) {
        self.push_hashed(s, stack_hash(s));
    }

    fn push_hashed(&mut self, s: &[u32], hash: u64) {
        self.hashes.push(hash);
        self.data.extend_from_slice(s);
        self.ends.push(self.data.len() as u32);
    }

    fn pop_into(&mut self, out: &mut Vec<u32>) -> bool {
        let Some(_) = self.ends.pop() else {
            return false;
        };
        self.hashes.pop();
        let start = self.ends.last().map_or(0, |&e| e as usize);
        out.clear();
        out.extend_from_slice(&self.data[start..]);
        self.data.truncate(start);
        true
    }

    /// Whether one of the stacks is empty: the text so far is a whole sentence.
    pub fn accepts_here(&self) -> bool {
        self.iter().any(<[u32]>::is_empty)
    }
}

// ANCHOR: partial
/// The start of a UTF-8 character whose last bytes are still to come (llama.cpp's
/// `llama_partial_utf8`): its bits so far and how many bytes remain; `n_remain < 0` marks
/// bytes that are not UTF-8.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Partial {
    pub value: u32,
    pub n_remain: i8,
}

impl Partial {
    /// Take one byte: a finished code point, or none yet (then `self` holds the start).
    /// Invalid bytes set `n_remain` to -1.
    pub fn push(&mut self, b: u8) -> Option<u32> {
        // ANCHOR: yours_partial_push
        if self.n_remain > 0 {
            if b & 0xC0 != 0x80 {
                self.n_remain = -1;
                return None;
            }
            self.value = (self.value << 6) | (b & 0x3F) as u32;
            self.n_remain -= 1;
            return (self.n_remain == 0).then_some(self.value);
        }
        if self.n_remain < 0 {
            return None;
        }
        let (n, bits) = match b {
            0x00..=0x7F => return Some(b as u32),
            0xC0..=0xDF => (1, b & 0x1F),
            0xE0..=0xEF => (2, b & 0x0F),
            0xF0..=0xF7 => (3, b & 0x07),
            _ => {
                self.n_remain = -1;
                return None;
            }
        };
        self.value = bits as u32;
        self.n_remain = n;
        None
        // ANCHOR_END: yours_partial_push
    }
}
// ANCHOR_END: partial

/// Reusable buffers for advancing stacks, so that a step allocates nothing once warm.
#[derive(Debug, Default)]
pub struct Scratch {
    todo: Stacks,
    seen: Stacks,
    cur: Vec<u32>,
    next: Vec<u32>,
    /// Stacks advanced so far, weighted by their depth: the work a caller may bound.
    pub work: u64,
}

// ANCHOR: match_char
/// Whether `c` matches the class at `pos`, and the position after the class.
fn match_char(elems: &[Elem], pos: usize, c: u32) -> (bool, usize) {
    // ANCHOR: yours_match_char
    let positive = !matches!(elems[pos], Elem::CharNot(_));
    let mut found = false;
    let mut i = pos;
    loop {
        match elems[i] {
            Elem::CharAny => {
                found = true;
                i += 1;
            }
            Elem::Char(lo) | Elem::CharNot(lo) | Elem::CharAlt(lo) => {
                if let Elem::CharRngUpper(hi) = elems[i + 1] {
                    found |= lo <= c && c <= hi;
                    i += 2;
                } else {
                    found |= lo == c;
                    i += 1;
                }
            }
            _ => unreachable!("a stack's top is a character class"),
        }
        if !matches!(elems[i], Elem::CharAlt(_)) {
            return (found == positive, i);
        }
    }
    // ANCHOR_END: yours_match_char
}
// ANCHOR_END: match_char

// ANCHOR: match_partial
/// Whether some character starting with the bytes of `partial` could match the class at
/// `pos` (llama.cpp's `llama_grammar_match_partial_char`).
fn match_partial(elems: &[Elem], pos: usize, partial: Partial) -> bool {
    let n = partial.n_remain as u32;
    if partial.n_remain < 0 || (n == 1 && partial.value < 2) {
        return false; // not UTF-8, or an overlong 2-byte start
    }
    let mut low = partial.value << (n * 6);
    let high = low | ((1 << (n * 6)) - 1);
    if low == 0 {
        low = match n {
            2 => 1 << 11,
            3 => 1 << 16,
            _ => low,
        };
    }
    // ANCHOR: yours_match_partial
    let positive = !matches!(elems[pos], Elem::CharNot(_));
    let mut i = pos;
    loop {
        match elems[i] {
            Elem::CharAny => return true,
            Elem::Char(lo) | Elem::CharNot(lo) | Elem::CharAlt(lo) => {
                if let Elem::CharRngUpper(hi) = elems[i + 1] {
                    if lo <= high && low <= hi {
                        return positive;
                    }
                    i += 2;
                } else {
                    if low <= lo && lo <= high {
                        return positive;
                    }
                    i += 1;
                }
            }
            _ => unreachable!("a stack's top is a character class"),
        }
        if !matches!(elems[i], Elem::CharAlt(_)) {
            return !positive;
        }
    }
    // ANCHOR_END: yours_match_partial
}
// ANCHOR_END: match_partial

// ANCHOR: advance
impl Grammar {
    /// Add to `out` every stack `stack` becomes once its top is a character class (or it is
    /// empty), expanding rule references into their alternatives (llama.cpp's
    /// `llama_grammar_advance_stack`; stacks already seen in this call are skipped, which
    /// ends the loops of rules that can match nothing).
    pub fn advance(
        &self,
        stack: &[u32],
        out: &mut Stacks,
        s: &mut Scratch,
    ) -> Result<(), MatchError> {
        self.advance_until(stack, out, s, &|| false)
    }

    /// [`Grammar::advance`], giving up with [`MatchError::Cancelled`] once `stop` says so
    /// (asked every [`STOP_CHECK_STEPS`] stacks).
    fn advance_until(
        &self,
        stack: &[u32],
        out: &mut Stacks,
        s: &mut Scratch,
        stop: &dyn Fn() -> bool,
    ) -> Result<(), MatchError> {
        let elems = &self.elems;
        s.todo.clear();
        s.seen.clear();
        s.todo.push(stack);
        let mut steps = 0usize;
        while s.todo.pop_into(&mut s.cur) {
            steps += 1;
            if steps.is_multiple_of(STOP_CHECK_STEPS) && stop() {
                return Err(MatchError::Cancelled);
            }
            let hash = stack_hash(&s.cur);
            if s.seen.contains_hashed(&s.cur, hash) {
                continue;
            }
            if s.seen.len() >= MAX_STACKS || s.cur.len() > MAX_STACK_DEPTH {
                return Err(MatchError::TooManyStacks);
            }
            // Each stack is compared with those seen: the work grows with both.
            s.work += (s.cur.len() + 1) as u64 * (s.seen.len() + 1) as u64;
            s.seen.push_hashed(&s.cur, hash);
            let Some(&top) = s.cur.last() else {
                if !out.contains(&[]) {
                    out.push(&[]);
                }
                continue;
            };
            // ANCHOR_END: advance
            // ANCHOR: advance_rule
            match elems[top as usize] {
                Elem::RuleRef(r) => {
                    let base = s.cur.len() - 1;
                    let rule = self.starts[r as usize] as usize;
                    let mut alt = rule;
                    loop {
                        s.next.clear();
                        s.next.extend_from_slice(&s.cur[..base]);
                        if !elems[top as usize + 1].ends_sequence() {
                            s.next.push(top + 1);
                        }
                        if !elems[alt].ends_sequence() {
                            s.next.push(alt as u32);
                        }
                        s.todo.push(&s.next);
                        while !elems[alt].ends_sequence() {
                            alt += 1;
                        }
                        if elems[alt] == Elem::Alt {
                            alt += 1;
                        } else {
                            break;
                        }
                    }
                }
                _ => {
                    if !out.contains_hashed(&s.cur, hash) {
                        if out.len() >= MAX_STACKS {
                            return Err(MatchError::TooManyStacks);
                        }
                        out.push_hashed(&s.cur, hash);
                    }
                }
            }
        }
        Ok(())
    }
    // ANCHOR_END: advance_rule

    /// The stacks at the start: rule `root`'s alternatives, advanced.
    pub fn initial_stacks(&self, s: &mut Scratch) -> Result<Stacks, MatchError> {
        self.initial_stacks_until(s, &|| false)
    }

    /// [`Grammar::initial_stacks`], giving up with [`MatchError::Cancelled`] once `stop` says
    /// so (asked every [`STOP_CHECK_STEPS`] stacks and alternatives).
    pub fn initial_stacks_until(
        &self,
        s: &mut Scratch,
        stop: &dyn Fn() -> bool,
    ) -> Result<Stacks, MatchError> {
        let mut out = Stacks::default();
        let elems = &self.elems;
        let mut alt = self.starts[self.root as usize] as usize;
        let mut steps = 0usize;
        loop {
            steps += 1;
            if steps.is_multiple_of(STOP_CHECK_STEPS) && stop() {
                return Err(MatchError::Cancelled);
            }
            if elems[alt].ends_sequence() {
                if !out.contains(&[]) {
                    out.push(&[]);
                }
            } else {
                self.advance_until(&[alt as u32], &mut out, s, stop)?;
            }
            while !elems[alt].ends_sequence() {
                alt += 1;
            }
            if elems[alt] == Elem::Alt {
                alt += 1;
            } else {
                return Ok(out);
            }
        }
    }

    // ANCHOR: accept_char
    /// The stacks after code point `c`: those of `stacks` whose top class matches it, moved
    /// past the class and advanced (llama.cpp's `llama_grammar_accept`).
    pub fn accept_char(
        &self,
        stacks: &Stacks,
        c: u32,
        out: &mut Stacks,
        s: &mut Scratch,
    ) -> Result<(), MatchError> {
        // ANCHOR: yours_accept_char
        out.clear();
        let mut stack = Vec::new();
        for st in stacks.iter() {
            let Some((&top, below)) = st.split_last() else {
                continue;
            };
            let (ok, after) = match_char(&self.elems, top as usize, c);
            if ok {
                stack.clear();
                stack.extend_from_slice(below);
                if !self.elems[after].ends_sequence() {
                    stack.push(after as u32);
                }
                self.advance(&stack, out, s)?;
            }
        }
        Ok(())
        // ANCHOR_END: yours_accept_char
    }
    // ANCHOR_END: accept_char

    /// Whether some stack's class could match a character starting with `partial`.
    pub fn partial_fits(&self, stacks: &Stacks, partial: Partial) -> bool {
        stacks.iter().any(|st| {
            st.last()
                .is_some_and(|&top| match_partial(&self.elems, top as usize, partial))
        })
    }

    /// Whether the whole of `text` is a sentence of the grammar.
    pub fn matches(&self, text: &[u8]) -> bool {
        let mut s = Scratch::default();
        let Ok(start) = self.initial_stacks(&mut s) else {
            return false;
        };
        match feed(self, &start, Partial::default(), text, &mut s) {
            Ok((stacks, partial)) => partial.n_remain == 0 && stacks.accepts_here(),
            Err(_) => false,
        }
    }
}

// ANCHOR: feed
/// The stacks and unfinished character after `bytes`, from `stacks` and `partial`; or why the
/// bytes cannot come next.
pub fn feed(
    g: &Grammar,
    stacks: &Stacks,
    mut partial: Partial,
    bytes: &[u8],
    s: &mut Scratch,
) -> Result<(Stacks, Partial), MatchError> {
    let mut cur = stacks.clone();
    let mut next = Stacks::default();
    for &b in bytes {
        if let Some(c) = partial.push(b) {
            partial = Partial::default();
            g.accept_char(&cur, c, &mut next, s)?;
            std::mem::swap(&mut cur, &mut next);
            if cur.is_empty() {
                return Err(MatchError::Rejected);
            }
        } else if partial.n_remain < 0 {
            return Err(MatchError::Rejected);
        }
    }
    if partial.n_remain != 0 && !g.partial_fits(&cur, partial) {
        return Err(MatchError::Rejected);
    }
    Ok((cur, partial))
}
// ANCHOR_END: feed

/// A grammar's state over a growing text: the stacks and an unfinished character.
#[derive(Debug)]
pub struct Matcher {
    pub grammar: Arc<Grammar>,
    pub stacks: Stacks,
    pub partial: Partial,
    scratch: Scratch,
}

impl Matcher {
    /// The state before any text.
    pub fn new(grammar: Arc<Grammar>) -> Result<Matcher, MatchError> {
        let mut scratch = Scratch::default();
        let stacks = grammar.initial_stacks(&mut scratch)?;
        Ok(Matcher {
            grammar,
            stacks,
            partial: Partial::default(),
            scratch,
        })
    }

    /// Take `bytes`; on an error the state is unchanged.
    pub fn accept_bytes(&mut self, bytes: &[u8]) -> Result<(), MatchError> {
        let (stacks, partial) = self.feed(bytes)?;
        self.stacks = stacks;
        self.partial = partial;
        Ok(())
    }

    /// Whether `bytes` can come next, without taking them.
    pub fn allows(&mut self, bytes: &[u8]) -> bool {
        self.feed(bytes).is_ok()
    }

    /// The state after `bytes`, or why they cannot come next.
    fn feed(&mut self, bytes: &[u8]) -> Result<(Stacks, Partial), MatchError> {
        feed(
            &self.grammar,
            &self.stacks,
            self.partial,
            bytes,
            &mut self.scratch,
        )
    }

    /// Whether the text so far is a whole sentence (no character left unfinished).
    pub fn is_complete(&self) -> bool {
        self.partial.n_remain == 0 && self.stacks.accepts_here()
    }

    /// Whether the text can still grow: some stack expects more.
    pub fn can_continue(&self) -> bool {
        self.stacks.iter().any(|s| !s.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(text: &str) -> Grammar {
        Grammar::parse(text, "root").unwrap()
    }

    #[test]
    fn a_small_grammar_accepts_its_sentences_only() {
        let x = g(r#"root ::= "[" item ("," item)* "]"
item ::= [0-9]+ | "\"" [^"]* "\"""#);
        for ok in [r#"[1]"#, r#"[12,"a b",3]"#, r#"["é"]"#] {
            assert!(x.matches(ok.as_bytes()), "{ok}");
        }
        for bad in [r#"[]"#, r#"[1,]"#, r#"[1"#, r#"[a]"#, r#"["]"#] {
            assert!(!x.matches(bad.as_bytes()), "{bad}");
        }
    }

    #[test]
    fn a_character_split_across_pieces_is_held_until_complete() {
        let x = Arc::new(g("root ::= \"é\" [a-z]"));
        let mut m = Matcher::new(x.clone()).unwrap();
        let e = "é".as_bytes();
        m.accept_bytes(&e[..1]).unwrap();
        assert!(!m.is_complete());
        assert!(!m.allows(&[0xA8])); // è: same first byte, different character
        m.accept_bytes(&e[1..]).unwrap();
        m.accept_bytes(b"q").unwrap();
        assert!(m.is_complete() && !m.can_continue());
        let mut m = Matcher::new(x).unwrap();
        assert!(!m.allows(&[0xC3, b'a']), "a cut character");
        assert!(!m.allows(&[0xE2]), "no class starts with this byte");
    }

    /// `C3` starts one of U+00C0..=U+00FF: a class fits it when one of its characters or
    /// ranges meets that span (a negated class, when none does).
    #[test]
    fn a_partial_character_fits_a_class_when_their_ranges_meet() {
        let fits = |class: &str| {
            let x = g(&format!("root ::= {class}"));
            let mut s = Scratch::default();
            let stacks = x.initial_stacks(&mut s).unwrap();
            let mut p = Partial::default();
            assert_eq!(p.push(0xC3), None);
            x.partial_fits(&stacks, p)
        };
        assert!(fits("[é]"), "a character inside the span");
        assert!(fits("[a-ê]"), "a range that overlaps the span's start");
        assert!(
            fits(r"[a-z\u0100-\u0200ÿ]"),
            "the last of three alternatives"
        );
        assert!(!fits("[a-z]"), "a range below the span");
        assert!(fits("[^a-z]"), "negated, its ranges below the span");
        assert!(
            !fits(r"[^\u00C5-\u00C6]"),
            "negated, a range inside the span"
        );
    }

    /// As llama.cpp's `decode_utf8`: a byte that cannot continue the character begun (an
    /// ASCII byte, or a lead byte) marks the text as not UTF-8, and it stays so: no later
    /// byte starts a character again.
    #[test]
    fn bytes_that_are_not_utf8_spoil_what_follows() {
        let mut p = Partial::default();
        assert_eq!(
            [0xE2, 0x82, 0xAC].map(|b| p.push(b)),
            [None, None, Some(0x20AC)]
        );
        for cut in [b'0', b'a', 0xC3] {
            let mut p = Partial::default();
            assert_eq!(p.push(0xE2), None);
            assert_eq!(
                p.push(cut),
                None,
                "{cut:#x} where a continuation byte belongs"
            );
            assert_eq!(p.n_remain, -1, "after {cut:#x}");
            assert_eq!(p.push(b'b'), None, "a byte after bytes that are not UTF-8");
            assert_eq!(p.n_remain, -1);
        }
    }

    #[test]
    fn ambiguity_is_bounded() {
        // Every split of a run of `a`s between nested stars is a reading.
        let x = Arc::new(g("root ::= x* \"b\"\nx ::= \"a\"* \"a\"+ | \"a\"+ \"a\"*"));
        let mut m = Matcher::new(x).unwrap();
        assert!(m.accept_bytes(&[b'a'; 64]).is_ok());
        assert!(m.stacks.len() <= MAX_STACKS);
    }
}
