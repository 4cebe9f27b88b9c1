//! Special tokens in input text: `<|im_start|>` typed into a prompt is one token, not eleven
//! characters, but only when the caller asks for it: text from a user should not be able to
//! forge a control token. llama.cpp's `tokenizer_st_partition`.

use crate::vocab::{TokenAttr, Vocab};
use std::ops::Range;

/// A piece of input: text still to tokenize, or a special token already recognised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fragment {
    Text(Range<usize>),
    Token(u32),
}

/// The tokens that can be recognised in text, longest text first so that a token containing
/// another (`<|im_start|>` and a hypothetical `<|im`) wins. Control, user-defined and unknown
/// tokens qualify. (llama.cpp sorts with an unstable sort, so its order among tokens of equal
/// length is unspecified; here it is by id.)
pub fn special_tokens(vocab: &Vocab) -> Vec<u32> {
    let qualifies = TokenAttr::CONTROL | TokenAttr::USER_DEFINED | TokenAttr::UNKNOWN;
    let mut ids: Vec<u32> = (0..vocab.len() as u32)
        .filter(|&i| vocab.attrs[i as usize].has(qualifies))
        .collect();
    ids.sort_by_key(|&i| std::cmp::Reverse(vocab.tokens[i as usize].len()));
    ids
}

// ANCHOR: partition
/// Cut `text` at every occurrence of a special token. Without `parse_special`, control and
/// unknown tokens are left as text; user-defined tokens are always recognised.
pub fn partition(
    vocab: &Vocab,
    specials: &[u32],
    text: &str,
    parse_special: bool,
) -> Vec<Fragment> {
    let everything = 0..text.len();
    let literal: &[Range<usize>] = if parse_special {
        &[]
    } else {
        std::slice::from_ref(&everything)
    };
    partition_literal(vocab, specials, text, literal)
}
// ANCHOR_END: partition

// ANCHOR: partition_literal
/// [`partition`] with control and unknown tokens recognised everywhere except where they
/// overlap a range of `literal` (byte ranges, sorted, not overlapping). A chat prompt is
/// the template's text, whose markers are tokens, around the messages' content, which is
/// the user's: `<|im_end|>` typed in a message stays eleven characters.
pub fn partition_literal(
    vocab: &Vocab,
    specials: &[u32],
    text: &str,
    literal: &[Range<usize>],
) -> Vec<Fragment> {
    let mut fragments = if text.is_empty() {
        vec![]
    } else {
        vec![Fragment::Text(0..text.len())]
    };
    for &id in specials {
        let attr = vocab.attrs[id as usize];
        let may_be_literal = attr.has(TokenAttr::CONTROL | TokenAttr::UNKNOWN);
        if may_be_literal && literal.iter().any(|r| r.start == 0 && r.end >= text.len()) {
            continue;
        }
        let needle = vocab.tokens[id as usize].as_str();
        let Some(first) = needle.chars().next() else {
            continue;
        };
        let mut next = Vec::with_capacity(fragments.len());
        for fragment in fragments {
            let Fragment::Text(range) = fragment else {
                next.push(fragment);
                continue;
            };
            // ANCHOR_END: partition_literal
            // ANCHOR: partition_cut
            let (mut start, end) = (range.start, range.end);
            let mut from = start;
            while let Some(at) = text[from..end].find(needle) {
                let at = from + at;
                let found = at..at + needle.len();
                if may_be_literal
                    && literal
                        .iter()
                        .any(|r| r.start < found.end && found.start < r.end)
                {
                    from = at + first.len_utf8(); // the user's text: look further on
                    continue;
                }
                let mut left_end = at;
                if attr.has(TokenAttr::LSTRIP) {
                    while left_end > start && text.as_bytes()[left_end - 1].is_ascii_whitespace_c()
                    {
                        left_end -= 1;
                    }
                }
                if left_end > start {
                    next.push(Fragment::Text(start..left_end));
                }
                next.push(Fragment::Token(id));
                start = found.end;
                if attr.has(TokenAttr::RSTRIP) {
                    while start < end && text.as_bytes()[start].is_ascii_whitespace_c() {
                        start += 1;
                    }
                }
                from = start;
            }
            if start < end {
                next.push(Fragment::Text(start..end));
            }
        }
        fragments = next;
    }
    fragments
}
// ANCHOR_END: partition_cut

/// C's `isspace`, which llama.cpp uses for LSTRIP/RSTRIP: unlike Rust's
/// `is_ascii_whitespace`, it includes the vertical tab.
trait CWhitespace {
    fn is_ascii_whitespace_c(&self) -> bool;
}

impl CWhitespace for u8 {
    fn is_ascii_whitespace_c(&self) -> bool {
        matches!(self, b' ' | b'\t' | b'\n' | b'\x0B' | b'\x0C' | b'\r')
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::VocabOptions;

    fn vocab(phi3: bool) -> Vocab {
        let tokens = ["<|im_start|>", "<|im_end|>", "<tool>", "a", "b"];
        let opts = VocabOptions {
            pre: Some("gpt-2".into()),
            model_name: phi3.then(|| "Phi-3".to_string()),
            ..VocabOptions::default()
        };
        let t = tokens.iter().map(|t| t.to_string()).collect();
        Vocab::new(
            "gpt2",
            t,
            vec![3, 3, 4, 1, 1],
            vec![],
            vec!["a b".into()],
            &opts,
        )
        .unwrap()
    }

    fn show(text: &str, fragments: &[Fragment]) -> Vec<String> {
        fragments
            .iter()
            .map(|f| match f {
                Fragment::Text(r) => text[r.clone()].to_string(),
                Fragment::Token(id) => format!("#{id}"),
            })
            .collect()
    }

    #[test]
    fn control_tokens_only_with_parse_special_user_defined_always() {
        let v = vocab(false);
        let specials = special_tokens(&v);
        let text = "<|im_start|>user\nhi <tool> x<|im_end|>";
        assert_eq!(
            show(text, &partition(&v, &specials, text, true)),
            ["#0", "user\nhi ", "#2", " x", "#1"]
        );
        assert_eq!(
            show(text, &partition(&v, &specials, text, false)),
            ["<|im_start|>user\nhi ", "#2", " x<|im_end|>"]
        );
        assert!(partition(&v, &specials, "", true).is_empty());
    }

    #[test]
    fn rstrip_tokens_swallow_following_whitespace() {
        let v = vocab(true);
        let specials = special_tokens(&v);
        let text = "<|im_end|> \n x";
        assert_eq!(
            show(text, &partition(&v, &specials, text, true)),
            ["#1", "x"]
        );
    }
}
