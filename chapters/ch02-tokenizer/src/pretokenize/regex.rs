//! The regexes llama.cpp has no scanner for, run as llama.cpp runs them (`unicode_regex_split`).
//!
//! llama.cpp uses C++'s `std::regex`, which knows nothing of Unicode classes. So when a regex
//! names one (`\p{L}`), llama.cpp first *collapses* the text: every code point below 128 stays
//! itself, every other becomes one stand-in per class (all non-ASCII letters the same
//! stand-in, all non-ASCII digits another, whitespace `\x0B`), and `\p{L}` becomes a class of
//! the letter stand-in and `A-Za-z`. A regex without such classes runs on the code points
//! themselves, non-ASCII whitespace again turned into `\x0B`. Either way, only ASCII is ever
//! whitespace to the engine, and `\s`, `\d` are ASCII.
//!
//! The collapse has consequences that are part of the rule, and that this module keeps: a
//! regex cannot tell `é` from `ж` (both "a letter"), so `[^a-z]` matches every non-ASCII
//! letter, lower case or not.
//!
//! The regex engine here is `fancy-regex` (the rules need look-ahead). Its semantics for these
//! regexes are those of ECMAScript's: alternatives tried in order, the first that matches wins.
//! Each code point becomes one character of the text the engine sees, so match positions map
//! back to code points one to one.

use super::Codepoints;
use crate::unicode::{Class, class_of};
use std::ops::Range;

/// llama.cpp's `\p{...}` names and the class each stands for (`\p{Lu}`, `\p{Ll}`, ... all mean
/// any letter: the collapse keeps no case).
const CATEGORIES: [(&str, u16); 10] = [
    ("N", Class::NUMBER),
    ("L", Class::LETTER),
    ("P", Class::PUNCTUATION),
    ("M", Class::MARK),
    ("S", Class::SYMBOL),
    ("Lu", Class::LETTER),
    ("Ll", Class::LETTER),
    ("Lt", Class::LETTER),
    ("Lm", Class::LETTER),
    ("Lo", Class::LETTER),
];

/// What `\s` is to the engine: C's `isspace`.
const ASCII_WHITESPACE: &str = "\t\n\u{B}\u{C}\r ";

/// The character a non-ASCII code point of class `category` becomes (llama.cpp uses the bytes
/// 0xD0 to 0xD5; these private-use characters play their part here).
fn stand_in(category: u16) -> char {
    match category {
        Class::NUMBER => '\u{E0D1}',
        Class::LETTER => '\u{E0D2}',
        Class::PUNCTUATION => '\u{E0D3}',
        Class::MARK => '\u{E0D4}',
        Class::SYMBOL => '\u{E0D5}',
        _ => '\u{E0D0}', // separators that are not whitespace, controls, unassigned
    }
}

/// The text a regex runs on: one character per code point.
pub(crate) struct Mapped {
    text: String,
    /// Byte offset in `text` of each code point, and the length of `text` at the end.
    starts: Vec<usize>,
}

impl Mapped {
    /// llama.cpp's collapsed text.
    pub(crate) fn collapsed(cps: &Codepoints) -> Mapped {
        Mapped::new(cps, |c, class| {
            if c.is_ascii() {
                c
            } else if class.is_whitespace() {
                '\u{B}'
            } else {
                stand_in(class.category())
            }
        })
    }

    /// The code points, with non-ASCII whitespace as `\x0B` (llama.cpp's `std::wregex` path).
    pub(crate) fn wide(cps: &Codepoints) -> Mapped {
        Mapped::new(cps, |c, class| {
            if !c.is_ascii() && class.is_whitespace() {
                '\u{B}'
            } else {
                c
            }
        })
    }

    fn new(cps: &Codepoints, map: impl Fn(char, Class) -> char) -> Mapped {
        let mut text = String::with_capacity(cps.len());
        let mut starts = Vec::with_capacity(cps.len() + 1);
        for (&c, &class) in cps.chars.iter().zip(&cps.classes) {
            starts.push(text.len());
            text.push(map(c, class));
        }
        starts.push(text.len());
        Mapped { text, starts }
    }
}

/// One of llama.cpp's regexes, translated for the engine.
#[derive(Debug)]
pub(crate) struct LlamaRegex {
    re: fancy_regex::Regex,
    /// Runs on the collapsed text (the regex names a Unicode class).
    collapsed: bool,
}

impl LlamaRegex {
    /// Translate and compile `expr`, llama.cpp's spelling of a regex.
    pub(crate) fn new(expr: &str) -> Result<LlamaRegex, String> {
        let collapsed = CATEGORIES
            .iter()
            .any(|(name, _)| expr.contains(&format!("\\p{{{name}}}")));
        if collapsed && !expr.is_ascii() {
            // llama.cpp refuses these too: the collapsed text has no non-ASCII characters.
            return Err(format!(
                "{expr:?}: Unicode classes and non-ASCII characters in one regex"
            ));
        }
        let translated = translate(expr)?;
        let re = fancy_regex::Regex::new(&translated).map_err(|e| format!("{expr:?}: {e}"))?;
        Ok(LlamaRegex { re, collapsed })
    }

    pub(crate) fn collapsed(&self) -> bool {
        self.collapsed
    }

    /// Split code points `range` of `text` into the regex's matches and the stretches between
    /// them, pushing the end of each (as `unicode_regex_split_stl`). Matching stops where the
    /// range stops: `$` and look-ahead see the end of the piece.
    pub(crate) fn split(&self, text: &Mapped, range: Range<usize>, cuts: &mut Vec<usize>) {
        let (from, to) = (text.starts[range.start], text.starts[range.end]);
        let piece = &text.text[from..to];
        // Matches come in order: find their code points by walking forward.
        let mut cp = range.start;
        let mut code_point_at = |byte: usize| {
            while text.starts[cp] < from + byte {
                cp += 1;
            }
            cp
        };
        for m in self.re.find_iter(piece) {
            // A regex error here is the backtrack limit; treat the rest as one stretch.
            let Ok(m) = m else { break };
            cuts.push(code_point_at(m.start()));
            cuts.push(code_point_at(m.end()));
        }
        cuts.push(range.end);
    }
}

/// Rewrite llama.cpp's regex for the engine: `\p{X}` as a class of X's stand-in and X's ASCII
/// members, `\s` `\S` `\d` as ASCII classes, `.` as anything but a line end.
fn translate(expr: &str) -> Result<String, String> {
    let mut out = String::with_capacity(expr.len() * 2);
    let mut inside = false; // inside [...]
    let mut chars = expr.chars().peekable();
    // A class's members, bracketed unless already inside a class.
    fn class(out: &mut String, members: &str, negated: bool, inside: bool) {
        if inside && !negated {
            out.push_str(members);
        } else {
            out.push_str(if negated { "[^" } else { "[" });
            out.push_str(members);
            out.push(']');
        }
    }
    while let Some(c) = chars.next() {
        match c {
            '[' if !inside => {
                inside = true;
                out.push('[');
                if chars.peek() == Some(&'^') {
                    out.push(chars.next().expect("peeked"));
                }
            }
            ']' if inside => {
                inside = false;
                out.push(']');
            }
            // Literal in an ECMAScript class; nesting and set operators in the engine's.
            '[' | '&' | '~' if inside => {
                out.push('\\');
                out.push(c);
            }
            '.' if !inside => out.push_str("[^\n\r]"),
            '\\' => {
                let e = chars
                    .next()
                    .ok_or_else(|| format!("{expr:?}: ends in a backslash"))?;
                match e {
                    's' => class(&mut out, ASCII_WHITESPACE, false, inside),
                    'S' => class(&mut out, ASCII_WHITESPACE, true, inside),
                    'd' => class(&mut out, "0-9", false, inside),
                    'p' => {
                        let mut name = String::new();
                        if chars.next() != Some('{') {
                            return Err(format!("{expr:?}: \\p without {{...}}"));
                        }
                        for n in chars.by_ref() {
                            if n == '}' {
                                break;
                            }
                            name.push(n);
                        }
                        let (_, category) = CATEGORIES
                            .iter()
                            .find(|(known, _)| *known == name)
                            .ok_or_else(|| format!("{expr:?}: unknown class \\p{{{name}}}"))?;
                        class(&mut out, &category_members(*category), false, inside);
                    }
                    'D' | 'w' | 'W' | 'b' | 'B' => {
                        return Err(format!("{expr:?}: \\{e} is not supported"));
                    }
                    _ => {
                        out.push('\\');
                        out.push(e);
                    }
                }
            }
            _ => out.push(c),
        }
    }
    Ok(out)
}

/// The members of a `\p{...}` class in the collapsed text: the stand-in, and the ASCII
/// characters of that category (llama.cpp lists them by hand; they are the same).
fn category_members(category: u16) -> String {
    let mut members = String::from(stand_in(category));
    for b in 0..128u8 {
        let c = b as char;
        if class_of(c).category() == category {
            if matches!(c, '\\' | ']' | '[' | '^' | '-' | '&' | '~') {
                members.push('\\');
            }
            members.push(c);
        }
    }
    members
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_become_stand_ins_and_ascii_members() {
        assert_eq!(translate(r"\p{N}+").unwrap(), "[\u{E0D1}0123456789]+");
        assert_eq!(
            translate(r"[^\s\p{N}]").unwrap(),
            "[^\t\n\u{B}\u{C}\r \u{E0D1}0123456789]"
        );
        assert_eq!(
            translate(r"\s+(?!\S)").unwrap(),
            "[\t\n\u{B}\u{C}\r ]+(?![^\t\n\u{B}\u{C}\r ])"
        );
        assert!(LlamaRegex::new(r"\p{N}").unwrap().collapsed());
        assert!(!LlamaRegex::new(r"[0-9][0-9][0-9]").unwrap().collapsed());
        assert!(LlamaRegex::new(r"\p{Han}+").is_err());
        assert!(LlamaRegex::new(r"\p{L}é").is_err());
    }

    #[test]
    fn collapsed_text_cannot_tell_letters_apart() {
        let cps = Codepoints::new("Éa é\u{3000}1٣");
        let m = Mapped::collapsed(&cps);
        assert_eq!(m.text, "\u{E0D2}a \u{E0D2}\u{B}1\u{E0D1}");
        // [^a-z] takes every non-ASCII letter, whatever its case.
        let re = LlamaRegex::new(r"[^a-z ]+").unwrap();
        let mut cuts = Vec::new();
        re.split(&m, 0..cps.len(), &mut cuts);
        assert_eq!(cuts, [0, 1, 3, 7, 7]);
    }
}
