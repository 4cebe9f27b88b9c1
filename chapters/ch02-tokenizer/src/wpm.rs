//! WordPiece tokenization (`tokenizer.ggml.model = "bert"`: BERT and the embedding models built
//! on it), as llama.cpp's `llm_tokenizer_wpm` does it.
//!
//! The text is normalized as BERT's `BasicTokenizer` does (lower case and no accents when the
//! vocabulary asks for them, control characters dropped) and cut into words at whitespace,
//! with every punctuation mark and every Chinese character a word of its own. Each word, with
//! a `▁` in front, is then cut greedily: the longest token that starts the word, then the
//! longest that starts the rest, and so on. A word that cannot be cut to the end becomes the
//! unknown token, whole.
//!
//! llama.cpp's GGUF conversion writes BERT's `##ing` (a token that continues a word) as `ing`
//! and a token that starts a word as `▁word`, which is why words get the `▁`.

use crate::unicode::{class_of, nfd_first, to_lower};
use crate::vocab::Vocab;

/// What a WordPiece vocabulary needs beyond the token list.
#[derive(Debug)]
pub struct Wpm {
    /// The longest token, in bytes: no match is longer.
    max_token_len: usize,
}

impl Wpm {
    pub fn new(vocab: &Vocab) -> Wpm {
        Wpm {
            max_token_len: vocab.tokens.iter().map(String::len).max().unwrap_or(0),
        }
    }

    // ANCHOR: wpm
    /// Append the tokens of `text` to `out`.
    pub fn encode(&self, vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
        for word in preprocess(text, vocab.lowercase, vocab.strip_accents) {
            let word = format!("▁{word}");
            let before = out.len();
            let mut start = 0;
            while start < word.len() {
                // The longest token that starts here (ends are tried longest first).
                let longest = (start + 1..=word.len().min(start + self.max_token_len))
                    .rev()
                    .find_map(|end| Some((end, vocab.text_to_token(word.get(start..end)?)?)));
                match longest {
                    Some((end, id)) => {
                        out.push(id);
                        start = end;
                    }
                    None => {
                        // The word cannot be cut to the end: it is unknown as a whole.
                        out.truncate(before);
                        break;
                    }
                }
            }
            if out.len() == before {
                out.extend(vocab.special.unk);
            }
        }
    }
    // ANCHOR_END: wpm
}

/// BERT's normalization and word split: the words of `text`.
fn preprocess(text: &str, lowercase: bool, strip_accents: bool) -> Vec<String> {
    let mut words = vec![String::new()];
    for c in text.chars() {
        let c = if strip_accents { nfd_first(c) } else { c };
        let class = class_of(c);
        if class.is_whitespace() {
            if !words.last().expect("never empty").is_empty() {
                words.push(String::new());
            }
            continue;
        }
        if c == '\0' || c == '\u{FFFD}' || class.is_control() {
            continue;
        }
        if strip_accents && class.is_mark() {
            continue;
        }
        let out = if lowercase { to_lower(c) } else { c };
        // Punctuation, ASCII symbols and Chinese characters are words of their own.
        if class.is_punctuation() || (c < '\u{7F}' && class.is_symbol()) || is_chinese(c) {
            if !words.last().expect("never empty").is_empty() {
                words.push(String::new());
            }
            words.last_mut().expect("never empty").push(out);
            words.push(String::new());
        } else {
            words.last_mut().expect("never empty").push(out);
        }
    }
    if words.last().is_some_and(String::is_empty) {
        words.pop();
    }
    words
}

/// The CJK ideograph blocks of BERT's `_is_chinese_char` (with llama.cpp's start of
/// extension E, 0x2B920, copied from Hugging Face's Rust code).
fn is_chinese(c: char) -> bool {
    matches!(c as u32,
        0x4E00..=0x9FFF | 0x3400..=0x4DBF | 0x20000..=0x2A6DF | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F | 0x2B920..=0x2CEAF | 0xF900..=0xFAFF | 0x2F800..=0x2FA1F)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::VocabOptions;

    #[test]
    fn words_split_at_punctuation_and_lose_accents() {
        assert_eq!(
            preprocess("Héllo, WORLD!你好\u{7}x", true, true),
            ["hello", ",", "world", "!", "你", "好", "x"]
        );
        assert_eq!(preprocess("  a  ", false, false), ["a"]);
        assert_eq!(preprocess("É", false, false), ["É"]);
    }

    #[test]
    fn longest_first_and_unknown_words_whole() {
        let tokens = ["[PAD]", "[UNK]", "▁un", "▁unbe", "lie", "vable", "▁x", "▁a"];
        let opts = VocabOptions {
            ids: crate::vocab::SpecialIds {
                unk: Some(1),
                ..Default::default()
            },
            ..VocabOptions::default()
        };
        let t = tokens.iter().map(|t| t.to_string()).collect();
        let v = Vocab::new(
            "bert",
            t,
            vec![3, 2, 1, 1, 1, 1, 1, 1],
            vec![],
            vec![],
            &opts,
        )
        .unwrap();
        let mut out = Vec::new();
        Wpm::new(&v).encode(&v, "unbelievable xyz a", &mut out);
        assert_eq!(out, [3, 4, 5, 1, 7]);
    }
}
