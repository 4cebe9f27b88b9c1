//! Hand-written scanners for the regexes llama.cpp does not give to a regex engine
//! (`unicode_regex_split_custom_*` in its `unicode.cpp`): one step per regex alternative, the
//! alternatives tried in order, each as a few lines of code.
//!
//! Each scanner reads the code points of one piece (a range of [`Codepoints`]) and pushes the
//! end of every word it cuts. Positions outside the piece read as "no character": a regex
//! never sees past the piece an earlier rule cut out.

use super::Codepoints;
use crate::unicode::{Class, is_han};
use std::ops::Range;

/// The hand-written scanners, by the regex llama.cpp recognises them by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scanner {
    /// GPT-2's rule.
    Gpt2,
    /// Llama 3's rule; `max_digits` 1 is Qwen 2's, and `marks` (Qwen 3.5) lets combining marks
    /// join letters.
    Llama3 { max_digits: usize, marks: bool },
    /// Kimi K2: Han characters in runs of their own, then Llama 3's rule with contractions
    /// glued to the word before them.
    KimiK2,
    /// Runs of digits cut into groups of three from the right: `1234567` is `1`, `234`, `567`
    /// (AFMoE, and Tiny Aya's `\d{1,3}(?=(?:\d{3})*\b)`).
    DigitGroups,
    /// `[^\n]+|[\n]+`: runs of newlines and runs of anything else.
    Newlines,
    /// `\p{N}`: every number character a piece of its own, and the stretches between them.
    /// (llama.cpp runs this one through its regex engine; SmolLM2 splits with it first, and a
    /// scan is four times faster.)
    Numbers,
}

impl Scanner {
    /// Append the end of each word of `cps[range]` to `cuts`. A scanner may cut twice at one
    /// place; the caller skips empty words, as llama.cpp's `_add_token` does.
    pub(crate) fn scan(self, cps: &Codepoints, range: Range<usize>, cuts: &mut Vec<usize>) {
        let w = Window {
            cps,
            start: range.start,
            end: range.end,
        };
        match self {
            Scanner::Gpt2 => gpt2(&w, cuts),
            Scanner::Llama3 { max_digits, marks } => llama3(&w, max_digits, marks, cuts),
            Scanner::KimiK2 => kimi_k2(&w, cuts),
            Scanner::DigitGroups => digit_groups(&w, cuts),
            Scanner::Newlines => newlines(&w, cuts),
            Scanner::Numbers => numbers(&w, cuts),
        }
    }
}

/// A view of `cps[start..end]` that answers "no character" outside the range.
struct Window<'a> {
    cps: &'a Codepoints,
    start: usize,
    end: usize,
}

impl Window<'_> {
    fn char(&self, i: usize) -> Option<char> {
        (self.start <= i && i < self.end).then(|| self.cps.chars[i])
    }
    fn class(&self, i: usize) -> Class {
        if self.start <= i && i < self.end {
            self.cps.classes[i]
        } else {
            Class::NONE
        }
    }
    fn is_rn(&self, i: usize) -> bool {
        matches!(self.char(i), Some('\r' | '\n'))
    }
}

/// `'s|'t|'re|'ve|'m|'ll|'d` after the apostrophe at `pos`: the length of the match, if any.
/// `fold` lower-cases ASCII first (Llama 3's `(?i:...)`; the only code points whose lower case
/// is one of these ASCII letters are their upper-case forms).
fn contraction(w: &Window, pos: usize, fold: bool) -> Option<usize> {
    let lower = |c: Option<char>| c.map(|c| if fold { c.to_ascii_lowercase() } else { c });
    if w.char(pos) != Some('\'') || pos + 1 >= w.end {
        return None;
    }
    let next = lower(w.char(pos + 1));
    if matches!(next, Some('s' | 't' | 'm' | 'd')) {
        return Some(2);
    }
    if pos + 2 < w.end {
        let pair = (next, lower(w.char(pos + 2)));
        if matches!(
            pair,
            (Some('r'), Some('e')) | (Some('v'), Some('e')) | (Some('l'), Some('l'))
        ) {
            return Some(3);
        }
    }
    None
}

/// The whitespace alternatives that end Llama 3's family of rules, at `pos`: `\s*[\r\n]+`
/// (whitespace up to and including its last newline), `\s+(?!\S)`, `\s+`, or one character
/// when nothing matches. Returns the end of the word.
fn whitespace_llama3(w: &Window, pos: usize) -> usize {
    let mut n_ws = 0;
    let mut after_last_rn = None;
    while w.class(pos + n_ws).is_whitespace() {
        if w.is_rn(pos + n_ws) {
            after_last_rn = Some(pos + n_ws + 1);
        }
        n_ws += 1;
    }
    if let Some(end) = after_last_rn {
        end
    } else {
        whitespace_gpt2(w, pos, n_ws)
    }
}

// ANCHOR: gpt2
/// GPT-2's rule: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
fn gpt2(w: &Window, cuts: &mut Vec<usize>) {
    let mut pos = w.start;
    while pos < w.end {
        let c = w.char(pos);
        // 's|'t|'re|'ve|'m|'ll|'d
        if let Some(n) = contraction(w, pos, false) {
            pos += n;
            cuts.push(pos);
            continue;
        }
        // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: an optional space, then a run of one
        // class, chosen by the character after the space.
        let space = usize::from(c == Some(' '));
        let first = w.class(pos + space);
        let same: Option<fn(Class) -> bool> = if first.is_letter() {
            Some(Class::is_letter)
        } else if first.is_number() {
            Some(Class::is_number)
        } else if first.is_other() {
            Some(Class::is_other)
        } else {
            None
        };
        if let Some(same) = same {
            pos += space;
            while same(w.class(pos)) {
                pos += 1;
            }
            cuts.push(pos);
            continue;
        }
        // \s+(?!\S)|\s+
        let mut n_ws = 0;
        while w.class(pos + n_ws).is_whitespace() {
            n_ws += 1;
        }
        pos = whitespace_gpt2(w, pos, n_ws);
        cuts.push(pos);
    }
}

/// `\s+(?!\S)` and `\s+` over the `n_ws` whitespace characters at `pos`: a run less its last
/// character when a non-space follows (that one joins the next word: "  the" is " " + " the");
/// at the end of the piece the whole run. One character when there is no whitespace.
fn whitespace_gpt2(w: &Window, pos: usize, n_ws: usize) -> usize {
    if n_ws > 1 && w.char(pos + n_ws).is_some() {
        pos + n_ws - 1
    } else {
        pos + n_ws.max(1)
    }
}
// ANCHOR_END: gpt2

/// Llama 3's rule, `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
/// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`, with `\p{N}{1,max_digits}`; with
/// `marks`, `[\p{L}\p{M}]` wherever it says `\p{L}` (Qwen 3.5).
fn llama3(w: &Window, max_digits: usize, marks: bool, cuts: &mut Vec<usize>) {
    let letter = |c: Class| c.is_letter() || (marks && c.is_mark());
    let mut pos = w.start;
    while pos < w.end {
        let c = w.char(pos);
        let class = w.class(pos);
        // (?i:'s|'t|'re|'ve|'m|'ll|'d)
        if let Some(n) = contraction(w, pos, true) {
            pos += n;
            cuts.push(pos);
            continue;
        }
        // [^\r\n\p{L}\p{N}]?\p{L}+ : letters, with at most one non-letter, non-digit in front
        if !(w.is_rn(pos) || class.is_number()) && (letter(class) || letter(w.class(pos + 1))) {
            pos += 1;
            while letter(w.class(pos)) {
                pos += 1;
            }
            cuts.push(pos);
            continue;
        }
        // \p{N}{1,3}: digits in groups of three from the left
        if class.is_number() {
            let mut group = pos;
            while w.class(pos).is_number() {
                pos += 1;
                if pos - group >= max_digits {
                    cuts.push(pos);
                    group = pos;
                }
            }
            cuts.push(pos);
            continue;
        }
        // ` ?[^\s\p{L}\p{N}]+[\r\n]*`: punctuation, with the newlines that follow it
        let after_space = if c == Some(' ') {
            w.class(pos + 1)
        } else {
            class
        };
        let not_word = |c: Class| !(c.is_whitespace() || letter(c) || c.is_number());
        if not_word(after_space) && class.bits() != 0 {
            pos += usize::from(c == Some(' '));
            while not_word(w.class(pos)) && w.class(pos).bits() != 0 {
                pos += 1;
            }
            while w.is_rn(pos) {
                pos += 1;
            }
            cuts.push(pos);
            continue;
        }
        pos = whitespace_llama3(w, pos);
        cuts.push(pos);
    }
}

/// Kimi K2: `[\p{Han}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*
/// [\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|...|\p{N}{1,3}|
/// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`, as llama.cpp scans it: letters of any
/// case (not Han) with an optional leading character and an optional contraction after.
fn kimi_k2(w: &Window, cuts: &mut Vec<usize>) {
    let han = |i: usize| w.char(i).is_some_and(is_han);
    let word_letter = |i: usize| w.class(i).is_letter() && !han(i);
    let mut pos = w.start;
    while pos < w.end {
        let c = w.char(pos);
        let class = w.class(pos);
        // [\p{Han}]+
        if han(pos) {
            while han(pos) {
                pos += 1;
            }
            cuts.push(pos);
            continue;
        }
        // Letters (not Han) after at most one character that is none of \r \n letter digit,
        // then an optional contraction.
        let can_lead = !(w.is_rn(pos) || class.is_letter() || class.is_number());
        if word_letter(pos) || (can_lead && word_letter(pos + 1)) {
            pos += usize::from(can_lead);
            while word_letter(pos) {
                pos += 1;
            }
            if let Some(n) = contraction(w, pos, true) {
                pos += n;
            }
            cuts.push(pos);
            continue;
        }
        // \p{N}{1,3}
        if class.is_number() {
            let mut group = pos;
            while w.class(pos).is_number() {
                pos += 1;
                if pos - group >= 3 {
                    cuts.push(pos);
                    group = pos;
                }
            }
            cuts.push(pos);
            continue;
        }
        // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
        let after_space = if c == Some(' ') {
            w.class(pos + 1)
        } else {
            class
        };
        if after_space.is_other() {
            pos += usize::from(c == Some(' '));
            while w.class(pos).is_other() {
                pos += 1;
            }
            while w.is_rn(pos) {
                pos += 1;
            }
            cuts.push(pos);
            continue;
        }
        pos = whitespace_llama3(w, pos);
        cuts.push(pos);
    }
}

/// Each run of digits in groups of three from the right. llama.cpp emits the first group as
/// the word that ends there, so the text before a run is glued to its first group (`ab1234`
/// is `ab1`, `234`); the rules that follow split such words again.
fn digit_groups(w: &Window, cuts: &mut Vec<usize>) {
    let mut pos = w.start;
    while pos < w.end {
        if !w.class(pos).is_number() {
            pos += 1;
            continue;
        }
        let start = pos;
        while w.class(pos).is_number() {
            pos += 1;
        }
        let mut at = start + (pos - start) % 3;
        if at > start {
            cuts.push(at);
        }
        while at < pos {
            at += 3;
            cuts.push(at);
        }
    }
    cuts.push(w.end);
}

/// `\p{N}`, as the regex engine splits with it: each match, and the text between.
fn numbers(w: &Window, cuts: &mut Vec<usize>) {
    for pos in w.start..w.end {
        if w.class(pos).is_number() {
            cuts.push(pos);
            cuts.push(pos + 1);
        }
    }
    cuts.push(w.end);
}

/// `[^\n]+|[\n]+`.
fn newlines(w: &Window, cuts: &mut Vec<usize>) {
    let mut pos = w.start;
    while pos < w.end {
        let newline = w.char(pos) == Some('\n');
        while pos < w.end && (w.char(pos) == Some('\n')) == newline {
            pos += 1;
        }
        cuts.push(pos);
    }
}
