//! The checks a parsed grammar must pass before a matcher runs it: no rule left-recursive, a
//! language that is not empty (every character class matching something), and whether every
//! sentence needs a NUL character, which generation never gives.

use super::{Elem, Grammar, class_end};

impl Grammar {
    /// Whether every sentence of the grammar has a NUL character (`\x00`) in it. Generation
    /// cannot give such a grammar what it needs: as in llama.cpp, whose token pieces are
    /// 0-terminated strings, no token whose piece starts with NUL is ever allowed (`mask.rs`),
    /// so where the grammar needs NUL every token would be masked.
    pub fn needs_nul(&self) -> bool {
        !self.productive(false)[self.root as usize]
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
    pub(super) fn productive(&self, nul: bool) -> Vec<bool> {
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
    pub(super) fn left_recursive_rule(&self) -> Option<usize> {
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
