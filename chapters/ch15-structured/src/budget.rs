//! Answers that close within their budget: how many bytes a grammar's state still needs at
//! the least, and the text of one shortest way to finish.
//!
//! A grammar-held answer that runs into `max_tokens` stops wherever it is — inside a string,
//! before a required property — and is not valid JSON. No anchor prevents it. The fix is a
//! count: from any state, the grammar needs at least some number of bytes to become a whole
//! sentence (`"}` inside the last string of an object: 2). A vocabulary that has a token for
//! every byte on that way can always write it in that many tokens. So a rule that knows how
//! many tokens are left keeps, at every step, the shortest finish within the tokens left after
//! this one; the answer then always parses, and `finish_reason` stays `length` when the budget
//! cut it short.
//!
//! [`Shortest`] holds, for every position in the grammar's rules, the fewest bytes that finish
//! the rest of its alternative — each rule's fewest bytes found by iterating to a fixed point
//! — so a stack's fewest bytes to a whole sentence is the sum over its positions, and a
//! state's the least over its stacks. [`Shortest::text`] walks one such way, character by
//! character, for the steps where nothing else fits.

use crate::gbnf::{Elem, Grammar, class_end};
use crate::matcher::{Partial, Scratch, Stacks};

/// The most element visits the fixed point may take (a tenth of a second or so): a grammar
/// larger or deeper than that gets no budget, and runs to its token limit as before. A JSON
/// schema's grammar takes a few thousand.
pub const MAX_SHORTEST_WORK: u64 = 50_000_000;

/// How many of the likeliest tokens a mask tries, one by one, for one that leaves the
/// shortest finish within the budget, before it allows only the shortest finish's own
/// tokens: a token that fits is nearly always among the first few.
pub const MAX_BUDGET_TRIES: usize = 64;

/// The fewest bytes from each position of a grammar's rules to the end of its alternative.
#[derive(Debug, Clone)]
pub struct Shortest {
    /// `(elems)`: from `elems[p]` to the end of its alternative; `u32::MAX` where nothing
    /// finishes (an unproductive rule).
    rest: Vec<u32>,
    /// `(elems)`: the fewest bytes of the character a class at `elems[p]` matches (0 elsewhere).
    own: Vec<u32>,
}

const NEVER: u32 = u32::MAX;

/// The fewest UTF-8 bytes of a character the class starting at `elems[i]` matches.
fn class_bytes(elems: &[Elem], i: usize) -> u32 {
    match elems[i] {
        Elem::CharAny | Elem::CharNot(_) => 1,
        Elem::Char(c) => {
            let mut fewest = utf8_len(c);
            let mut j = i + 1;
            while let Some(&e) = elems.get(j) {
                match e {
                    Elem::CharAlt(c) => fewest = fewest.min(utf8_len(c)),
                    Elem::CharRngUpper(_) => {}
                    _ => break,
                }
                j += 1;
            }
            fewest
        }
        _ => 0,
    }
}

fn utf8_len(c: u32) -> u32 {
    char::from_u32(c).map_or(1, |c| c.len_utf8() as u32)
}

impl Shortest {
    /// The fewest bytes of every position of `g`, or `None` when finding them takes more than
    /// [`MAX_SHORTEST_WORK`].
    pub fn new(g: &Grammar) -> Option<Shortest> {
        let elems = &g.elems;
        let n_rules = g.starts.len();
        let mut rule = vec![NEVER; n_rules];
        let mut work = 0u64;
        // Each round lowers a rule's count where a rule it refers to got lower; a rule's
        // fewest bytes use rules of fewer steps, so at most one round per rule.
        for _ in 0..=n_rules {
            let mut changed = false;
            for r in 0..n_rules {
                let seq = g.rule(r as u32);
                work += seq.len() as u64;
                let (mut best, mut sum, mut i) = (NEVER, 0u32, 0);
                while i < seq.len() {
                    match seq[i] {
                        Elem::End | Elem::Alt => {
                            best = best.min(sum);
                            sum = 0;
                            i += 1;
                        }
                        Elem::RuleRef(n) => {
                            sum = sum.saturating_add(rule[n as usize]);
                            i += 1;
                        }
                        _ => {
                            let start = g.starts[r] as usize;
                            sum = sum.saturating_add(class_bytes(elems, start + i));
                            i = class_end(seq, i);
                        }
                    }
                }
                if best < rule[r] {
                    rule[r] = best;
                    changed = true;
                }
            }
            if work > MAX_SHORTEST_WORK {
                return None;
            }
            if !changed {
                break;
            }
        }
        // Each position's rest: its alternative's elements from there on, summed backwards.
        let mut rest = vec![0u32; elems.len()];
        let mut own = vec![0u32; elems.len()];
        let mut after = 0u32;
        for p in (0..elems.len()).rev() {
            rest[p] = match elems[p] {
                Elem::End | Elem::Alt => {
                    after = 0;
                    0
                }
                Elem::RuleRef(n) => {
                    after = after.saturating_add(rule[n as usize]);
                    after
                }
                Elem::CharAlt(_) | Elem::CharRngUpper(_) => after,
                _ => {
                    own[p] = class_bytes(elems, p);
                    after = after.saturating_add(own[p]);
                    after
                }
            };
        }
        Some(Shortest { rest, own })
    }

    /// The fewest bytes that make the text a whole sentence from `stacks`: the least over the
    /// stacks of the sum of their positions' rests. While a character is unfinished, each
    /// stack's top is the class it is matching: the bytes it still needs replace that class's
    /// shortest character (counting both would ask for bytes that never come, and refuse the
    /// tokens that write a character a byte at a time). `u32::MAX` when no stack can finish.
    pub fn of(&self, stacks: &Stacks, partial: Partial) -> u32 {
        let pending = partial.n_remain.max(0) as u32;
        stacks
            .iter()
            .map(|st| {
                let sum =
                    (st.iter()).fold(0u32, |acc, &p| acc.saturating_add(self.rest[p as usize]));
                match st.last() {
                    _ if sum == NEVER => NEVER,
                    Some(&top) if pending > 0 => sum
                        .saturating_sub(self.own[top as usize])
                        .saturating_add(pending),
                    _ => sum,
                }
            })
            .min()
            .unwrap_or(NEVER)
    }

    /// One shortest text that finishes the sentence from `stacks` (no character unfinished):
    /// at each step, the cheapest stack's class gives its shortest character, which the
    /// grammar then takes. Empty when the text is already whole; `None` when a step does not
    /// lower the count as it should (it always does on a grammar [`Shortest::new`] measured).
    pub fn text(&self, g: &Grammar, stacks: &Stacks) -> Option<Vec<u8>> {
        let mut cur = stacks.clone();
        let mut next = Stacks::default();
        let mut s = Scratch::default();
        let mut out = Vec::new();
        loop {
            let need = self.of(&cur, Partial::default());
            if need == 0 {
                return Some(out);
            }
            let top = cur
                .iter()
                .filter(|st| {
                    st.iter()
                        .fold(0u32, |a, &p| a.saturating_add(self.rest[p as usize]))
                        == need
                })
                .find_map(|st| st.last().copied())?;
            let c = shortest_char(&g.elems, top as usize)?;
            g.accept_char(&cur, c, &mut next, &mut s).ok()?;
            if self.of(&next, Partial::default()) >= need {
                return None;
            }
            std::mem::swap(&mut cur, &mut next);
            let mut buf = [0u8; 4];
            out.extend_from_slice(char::from_u32(c)?.encode_utf8(&mut buf).as_bytes());
        }
    }
}

/// A character of the fewest bytes that the class starting at `elems[i]` matches.
fn shortest_char(elems: &[Elem], i: usize) -> Option<u32> {
    match elems[i] {
        Elem::CharAny => Some(u32::from(b' ')),
        Elem::CharNot(_) => {
            // The first printable ASCII character the class does not exclude.
            let end = class_end(elems, i);
            (0x20..0x7f).find(|&c| !class_lists(&elems[i..end], c))
        }
        Elem::Char(_) => {
            let end = class_end(elems, i);
            let mut best: Option<u32> = None;
            let mut j = i;
            while j < end {
                let lo = match elems[j] {
                    Elem::Char(c) | Elem::CharAlt(c) => c,
                    _ => {
                        j += 1;
                        continue;
                    }
                };
                if best.is_none_or(|b| utf8_len(lo) < utf8_len(b)) {
                    best = Some(lo);
                }
                j += 1;
            }
            best
        }
        _ => None,
    }
}

/// Whether the class `elems` (its first element `CharNot`) lists `c`.
fn class_lists(elems: &[Elem], c: u32) -> bool {
    let mut j = 0;
    while j < elems.len() {
        let lo = match elems[j] {
            Elem::CharNot(x) | Elem::CharAlt(x) => x,
            _ => {
                j += 1;
                continue;
            }
        };
        let hi = match elems.get(j + 1) {
            Some(&Elem::CharRngUpper(h)) => {
                j += 1;
                h
            }
            _ => lo,
        };
        if (lo..=hi).contains(&c) {
            return true;
        }
        j += 1;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grammar(text: &str) -> Grammar {
        Grammar::parse(text, "root").unwrap()
    }

    #[test]
    fn the_fewest_bytes_follow_the_shortest_alternatives() {
        let g = grammar(
            r#"root ::= "{" item ("," item)* "}"
item ::= "\"" [a-z]* "\"" | [0-9]+ | "é""#,
        );
        let sh = Shortest::new(&g).unwrap();
        let mut s = Scratch::default();
        let start = g.initial_stacks(&mut s).unwrap();
        // `{` then the shortest item (one digit, or é's two bytes), then `}`.
        assert_eq!(sh.of(&start, Partial::default()), 3);
        assert_eq!(sh.text(&g, &start).unwrap(), b"{0}");
        // Inside a string: the closing quote and brace.
        let mut m = crate::matcher::Matcher::new(g.clone().into()).unwrap();
        m.accept_bytes(b"{1,\"ab").unwrap();
        assert_eq!(sh.of(&m.stacks, m.partial), 2);
        assert_eq!(sh.text(&g, &m.stacks).unwrap(), b"\"}");
        m.accept_bytes(b"\"}").unwrap();
        assert_eq!(sh.of(&m.stacks, m.partial), 0);
        assert_eq!(sh.text(&g, &m.stacks).unwrap(), b"");
    }

    #[test]
    fn a_negated_class_gives_a_character_it_does_not_exclude() {
        let g = grammar(r#"root ::= [^ !"a-z] "x""#);
        let sh = Shortest::new(&g).unwrap();
        let mut s = Scratch::default();
        let start = g.initial_stacks(&mut s).unwrap();
        assert_eq!(sh.text(&g, &start).unwrap(), b"#x");
    }

    /// A character written a byte at a time: while it is unfinished, the count is the bytes it
    /// still needs and what follows it — not its whole length again.
    #[test]
    fn an_unfinished_character_counts_only_its_missing_bytes() {
        let g = grammar(r#"root ::= "<｜a" [é-ï] "b""#);
        let sh = Shortest::new(&g).unwrap();
        let mut m = crate::matcher::Matcher::new(g.clone().into()).unwrap();
        assert_eq!(sh.of(&m.stacks, m.partial), 8);
        m.accept_bytes(b"<").unwrap();
        assert_eq!(sh.of(&m.stacks, m.partial), 7);
        let bar = "｜".as_bytes();
        m.accept_bytes(&bar[..1]).unwrap();
        assert_eq!(sh.of(&m.stacks, m.partial), 6);
        m.accept_bytes(&bar[1..2]).unwrap();
        assert_eq!(sh.of(&m.stacks, m.partial), 5);
        m.accept_bytes(&bar[2..]).unwrap();
        assert_eq!(sh.of(&m.stacks, m.partial), 4);
        m.accept_bytes(b"a").unwrap();
        // A class: its shortest character (two bytes), then `b`; one byte of it written.
        m.accept_bytes(&"ï".as_bytes()[..1]).unwrap();
        assert_eq!(sh.of(&m.stacks, m.partial), 2);
    }
}
