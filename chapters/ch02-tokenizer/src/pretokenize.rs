//! Pre-tokenization: cutting text into words before BPE sees it.
//!
//! BPE merges never cross a word boundary, so the split decides, for instance, that `" the"`
//! (with its space) is one word, that digits are not glued to letters, and that `"'s"` stands
//! alone. Each vocabulary was trained with one splitting rule, written as a regex in its
//! `tokenizer.json`; GGUF names the rule in `tokenizer.ggml.pre`.
//!
//! Two implementations of every rule live here:
//! - [`PreTokenizer::split`]: hand-written scanners, one step per regex alternative, as
//!   llama.cpp's `unicode_regex_split_custom_gpt2` / `_llama3` do. Their character classes
//!   come from [`crate::unicode`], the same Unicode version as llama.cpp's. This is the one the
//!   tokenizer uses.
//! - [`RegexSplitter`]: the regexes themselves, run by `fancy-regex` (they need the look-ahead
//!   `(?!\S)`). Shorter to read, slower to run; the benchmark compares the two.

use crate::unicode::{Class, class_of};
use std::ops::Range;

/// The pre-tokenizers this chapter implements, by the regex they stand for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizer {
    /// GPT-2: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
    Gpt2,
    /// GPT-2's rule after first isolating every number character (`\p{N}`), so numbers become
    /// one token per digit: SmolLM, StarCoder, Refact, Command-R.
    Smollm,
    /// Llama 3: `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
    /// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`.
    Llama3,
    /// Qwen 2: Llama 3's rule with `\p{N}` (one digit at a time) instead of `\p{N}{1,3}`.
    Qwen2,
}

impl PreTokenizer {
    /// Append the byte ranges of `text`'s words to `out`. The ranges tile `text`.
    pub fn split(self, text: &str, out: &mut Vec<Range<usize>>) {
        let cps = Codepoints::new(text);
        let mut cuts = Vec::with_capacity(cps.len() / 3 + 1);
        let all = 0..cps.len();
        match self {
            PreTokenizer::Gpt2 => split_gpt2(&cps, all, &mut cuts),
            PreTokenizer::Smollm => {
                // First rule, `\p{N}`: every number character is a piece of its own; the second
                // rule then splits each stretch between them, never across.
                let mut start = 0;
                for i in all {
                    if cps.class(i).is_number() {
                        split_gpt2(&cps, start..i, &mut cuts);
                        cuts.push(i + 1);
                        start = i + 1;
                    }
                }
                split_gpt2(&cps, start..cps.len(), &mut cuts);
            }
            PreTokenizer::Llama3 => split_llama3(&cps, all, 3, &mut cuts),
            PreTokenizer::Qwen2 => split_llama3(&cps, all, 1, &mut cuts),
        }
        let mut prev = 0;
        // A scanner may cut twice at one place (after a full group of digits); llama.cpp's
        // `_add_token` skips the empty word, and so does this.
        for end in cuts {
            if end > prev {
                out.push(cps.offset(prev)..cps.offset(end));
                prev = end;
            }
        }
    }

    /// The words of `text`, as slices of it.
    pub fn pieces(self, text: &str) -> Vec<&str> {
        let mut ranges = Vec::new();
        self.split(text, &mut ranges);
        ranges.into_iter().map(|r| &text[r]).collect()
    }
}

/// A text as code points with their classes, for scanners that look one or two characters
/// ahead. Positions outside the scanned stretch read as "no character", as in llama.cpp.
struct Codepoints {
    chars: Vec<char>,
    classes: Vec<Class>,
    /// Byte offset of each code point, plus the text length at the end.
    offsets: Vec<usize>,
}

impl Codepoints {
    fn new(text: &str) -> Codepoints {
        let n = text.len();
        let mut chars = Vec::with_capacity(n);
        let mut classes = Vec::with_capacity(n);
        let mut offsets = Vec::with_capacity(n + 1);
        for (off, c) in text.char_indices() {
            chars.push(c);
            classes.push(class_of(c));
            offsets.push(off);
        }
        offsets.push(n);
        Codepoints {
            chars,
            classes,
            offsets,
        }
    }
    fn len(&self) -> usize {
        self.chars.len()
    }
    fn class(&self, i: usize) -> Class {
        self.classes[i]
    }
    fn offset(&self, i: usize) -> usize {
        self.offsets[i]
    }
}

/// A view of `cps[range]` that answers "no character" outside the range: the regex
/// alternatives must not see past the piece an earlier rule cut out.
struct Window<'a> {
    cps: &'a Codepoints,
    end: usize,
    start: usize,
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

// ANCHOR: gpt2
/// GPT-2's rule over `cps[range]`, pushing the end of each word to `cuts`.
fn split_gpt2(cps: &Codepoints, range: Range<usize>, cuts: &mut Vec<usize>) {
    let w = Window {
        cps,
        start: range.start,
        end: range.end,
    };
    let mut pos = range.start;
    while pos < w.end {
        let c = w.char(pos);
        // 's|'t|'re|'ve|'m|'ll|'d
        if let Some(n) = contraction(&w, pos, false) {
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
        // `\s+(?!\S)`: a run of whitespace, less its last character when a non-space follows
        // (that one joins the next word: "  the" is " " + " the"). At the end of the piece the
        // whole run is taken by the last alternative, `\s+`.
        let mut n_ws = 0;
        while w.class(pos + n_ws).is_whitespace() {
            n_ws += 1;
        }
        if n_ws > 1 && w.char(pos + n_ws).is_some() {
            pos += n_ws - 1;
        } else if n_ws > 0 {
            pos += n_ws;
        } else {
            pos += 1;
        }
        cuts.push(pos);
    }
}
// ANCHOR_END: gpt2

/// Llama 3's rule over `cps[range]` (Qwen 2's with `max_digits` 1).
fn split_llama3(cps: &Codepoints, range: Range<usize>, max_digits: usize, cuts: &mut Vec<usize>) {
    let w = Window {
        cps,
        start: range.start,
        end: range.end,
    };
    let is_rn = |c: Option<char>| matches!(c, Some('\r' | '\n'));
    let mut pos = range.start;
    while pos < w.end {
        let c = w.char(pos);
        let class = w.class(pos);
        // (?i:'s|'t|'re|'ve|'m|'ll|'d)
        if let Some(n) = contraction(&w, pos, true) {
            pos += n;
            cuts.push(pos);
            continue;
        }
        // [^\r\n\p{L}\p{N}]?\p{L}+ : letters, with at most one non-letter, non-digit in front
        if !(is_rn(c) || class.is_number()) && (class.is_letter() || w.class(pos + 1).is_letter()) {
            pos += 1;
            while w.class(pos).is_letter() {
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
        if !(after_space.is_whitespace() || after_space.is_letter() || after_space.is_number())
            && class.bits() != 0
        {
            pos += usize::from(c == Some(' '));
            while w.class(pos).is_other() {
                pos += 1;
            }
            while is_rn(w.char(pos)) {
                pos += 1;
            }
            cuts.push(pos);
            continue;
        }
        // \s*[\r\n]+ : whitespace up to and including its last newline
        let mut n_ws = 0;
        let mut after_last_rn = None;
        while w.class(pos + n_ws).is_whitespace() {
            if is_rn(w.char(pos + n_ws)) {
                after_last_rn = Some(pos + n_ws + 1);
            }
            n_ws += 1;
        }
        if let Some(end) = after_last_rn {
            pos = end;
        } else if n_ws > 1 && w.char(pos + n_ws).is_some() {
            // \s+(?!\S)
            pos += n_ws - 1;
        } else if n_ws > 0 {
            // \s+
            pos += n_ws;
        } else {
            pos += 1;
        }
        cuts.push(pos);
    }
}

/// The same rules as [`PreTokenizer`], run by a regex engine.
pub struct RegexSplitter {
    /// A first rule whose matches are cut out as pieces of their own (SmolLM's `\p{N}`).
    isolate: Option<fancy_regex::Regex>,
    main: fancy_regex::Regex,
}

// ANCHOR: regexes
const GPT2_REGEX: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
// llama.cpp spells `(?i:'s|...)` out as ASCII classes: `(?i)` in a Unicode regex would also
// let `'ſ` (long s) and `'K` (Kelvin sign) through.
// The two differ only in their digits: runs of up to three, or one at a time.
const LLAMA3_REGEX: &str = concat!(
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+",
    r"|\p{N}{1,3}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
);
const QWEN2_REGEX: &str = concat!(
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+",
    r"|\p{N}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
);
// ANCHOR_END: regexes

impl RegexSplitter {
    /// The regexes of `pre`.
    pub fn new(pre: PreTokenizer) -> RegexSplitter {
        let re = |s: &str| fancy_regex::Regex::new(s).expect("the pre-tokenizer regexes compile");
        let (isolate, main) = match pre {
            PreTokenizer::Gpt2 => (None, GPT2_REGEX),
            PreTokenizer::Smollm => (Some(re(r"\p{N}")), GPT2_REGEX),
            PreTokenizer::Llama3 => (None, LLAMA3_REGEX),
            PreTokenizer::Qwen2 => (None, QWEN2_REGEX),
        };
        RegexSplitter {
            isolate,
            main: re(main),
        }
    }

    /// Append the byte ranges of `text`'s words to `out`.
    pub fn split(&self, text: &str, out: &mut Vec<Range<usize>>) {
        let mut pieces = Vec::new();
        match &self.isolate {
            Some(re) => matches_and_gaps(re, text, 0..text.len(), &mut pieces),
            None => pieces.push(0..text.len()),
        }
        for piece in pieces {
            matches_and_gaps(&self.main, text, piece, out);
        }
    }

    /// The words of `text`, as slices of it.
    pub fn pieces<'t>(&self, text: &'t str) -> Vec<&'t str> {
        let mut ranges = Vec::new();
        self.split(text, &mut ranges);
        ranges.into_iter().map(|r| &text[r]).collect()
    }
}

/// Split `text[range]` into the regex's matches and the stretches between them, as llama.cpp's
/// `unicode_regex_split_stl` does. Matching stops where the range stops.
fn matches_and_gaps(
    re: &fancy_regex::Regex,
    text: &str,
    range: Range<usize>,
    out: &mut Vec<Range<usize>>,
) {
    let piece = &text[range.clone()];
    let mut done = 0;
    for m in re.find_iter(piece) {
        // A regex error here is the backtrack limit; treat the rest as one gap.
        let Ok(m) = m else { break };
        if m.start() > done {
            out.push(range.start + done..range.start + m.start());
        }
        if m.end() > m.start() {
            out.push(range.start + m.start()..range.start + m.end());
        }
        done = m.end();
    }
    if done < piece.len() {
        out.push(range.start + done..range.end);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn both(pre: PreTokenizer, text: &str) -> Vec<&str> {
        let hand = pre.pieces(text);
        let regex = RegexSplitter::new(pre).pieces(text);
        assert_eq!(
            hand, regex,
            "hand-written and regex splitters differ on {text:?}"
        );
        hand
    }

    #[test]
    fn gpt2_words_keep_their_leading_space() {
        assert_eq!(
            both(PreTokenizer::Gpt2, "Hello world, it's 2024!"),
            ["Hello", " world", ",", " it", "'s", " 2024", "!"]
        );
    }

    #[test]
    fn whitespace_runs_leave_one_space_for_the_next_word() {
        assert_eq!(both(PreTokenizer::Gpt2, "a   b"), ["a", "  ", " b"]);
        assert_eq!(
            both(PreTokenizer::Gpt2, "a \n\n b  "),
            ["a", " \n\n", " b", "  "]
        );
    }

    #[test]
    fn smollm_isolates_every_digit() {
        assert_eq!(
            both(PreTokenizer::Smollm, "in 2024, x1"),
            ["in", " ", "2", "0", "2", "4", ",", " x", "1"]
        );
    }

    #[test]
    fn llama3_groups_digits_by_three_and_folds_contractions() {
        assert_eq!(
            both(PreTokenizer::Llama3, "1234567 WE'RE here\n\n"),
            ["123", "456", "7", " WE", "'RE", " here", "\n\n"]
        );
        assert_eq!(both(PreTokenizer::Llama3, "(x)\n y"), ["(x", ")\n", " y"]);
    }

    #[test]
    fn qwen2_takes_one_digit_at_a_time() {
        assert_eq!(
            both(PreTokenizer::Qwen2, "x 123"),
            ["x", " ", "1", "2", "3"]
        );
    }
}
