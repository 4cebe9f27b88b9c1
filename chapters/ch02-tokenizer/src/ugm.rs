//! Unigram tokenization (`tokenizer.ggml.model = "t5"`: T5, XLM-RoBERTa and the embedding
//! models built on it), as llama.cpp's `llm_tokenizer_ugm` does it.
//!
//! A Unigram vocabulary gives every token a score, the log of its probability, and a text is
//! cut into the tokens whose scores add up to the most: the most probable segmentation. That is
//! a shortest-path problem over the byte positions of the text, solved left to right (Viterbi):
//! the best segmentation of the first `i` bytes is the best of (best of the first `j` bytes,
//! plus a token spanning `j..i`). The tokens that start at a position are found by walking a
//! trie of the token texts. A character no token covers becomes the unknown token, scored 10
//! below the worst real token, and unknown tokens in a row are merged into one.
//!
//! Before that the text is normalized, as SentencePiece does: each prefix the vocabulary's
//! compiled character map knows is replaced (full-width letters become ASCII, odd spaces
//! become spaces, ...), spaces become `▁`, a space goes in front of the text, and with
//! `remove_extra_whitespaces` runs of spaces shrink to one.

use crate::vocab::{TokenAttr, Vocab};
use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use crate::bpe::PairHasher;
use crate::charsmap::CharsMap;

/// How far below the worst token's score an unknown character scores (llama.cpp's
/// `unknown_token_score_penalty`).
const UNKNOWN_PENALTY: f32 = 10.0;

/// A trie of byte strings, as llama.cpp's `naive_trie`: node 0 is the root.
#[derive(Debug, Default)]
struct Trie {
    /// `(node << 8) | byte` → child node.
    children: HashMap<u64, u32, BuildHasherDefault<PairHasher>>,
    /// The token that ends at each node, if any.
    values: Vec<Option<u32>>,
}

impl Trie {
    fn new() -> Trie {
        Trie {
            children: HashMap::default(),
            values: vec![None],
        }
    }

    fn insert(&mut self, key: &[u8], value: u32) {
        let mut node = 0;
        for &b in key {
            let next = self.values.len() as u32;
            node = *self
                .children
                .entry(((node as u64) << 8) | b as u64)
                .or_insert_with(|| {
                    self.values.push(None);
                    next
                });
        }
        self.values[node as usize] = Some(value);
    }

    fn child(&self, node: u32, b: u8) -> Option<u32> {
        self.children
            .get(&(((node as u64) << 8) | b as u64))
            .copied()
    }

    /// How many bytes of `key` the trie can follow from the root, whether or not a key ends
    /// there (llama.cpp's `get_longest_prefix` answers this, not "the longest key").
    fn path_len(&self, key: &[u8]) -> usize {
        let mut node = 0;
        for (i, &b) in key.iter().enumerate() {
            match self.child(node, b) {
                Some(next) => node = next,
                None => return i,
            }
        }
        key.len()
    }
}

/// What a Unigram vocabulary needs beyond the token list.
#[derive(Debug)]
pub struct Ugm {
    charsmap: Option<CharsMap>,
    /// Normal, user-defined and unused tokens: the ones a segmentation may use.
    tokens: Trie,
    /// User-defined tokens: normalization leaves them alone.
    user_defined: Trie,
    unknown_score: f32,
}

/// The best segmentation of the text up to a byte position: its last token, where that token
/// starts, and the sum of the scores.
#[derive(Debug, Clone, Copy)]
struct Best {
    token: Option<u32>,
    start: usize,
    score: f64,
}

impl Ugm {
    pub fn new(vocab: &Vocab) -> Ugm {
        let mut tokens = Trie::new();
        let mut user_defined = Trie::new();
        let mut min = f32::MAX;
        for (id, (text, attr)) in vocab.tokens.iter().zip(&vocab.attrs).enumerate() {
            let id = id as u32;
            if attr.has(TokenAttr::NORMAL) {
                min = min.min(vocab.scores[id as usize]);
            }
            if attr.has(TokenAttr::NORMAL | TokenAttr::USER_DEFINED | TokenAttr::UNUSED) {
                tokens.insert(text.as_bytes(), id);
            }
            if attr.has(TokenAttr::USER_DEFINED) {
                user_defined.insert(text.as_bytes(), id);
            }
        }
        Ugm {
            charsmap: CharsMap::parse(&vocab.precompiled_charsmap),
            tokens,
            user_defined,
            unknown_score: min - UNKNOWN_PENALTY,
        }
    }

    // ANCHOR: ugm
    /// Append the tokens of `text` to `out`: the segmentation with the highest total score.
    pub fn encode(&self, vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
        let text = self.normalize(vocab, text.as_bytes());
        let n = text.len();
        if n == 0 {
            return;
        }
        let unk = vocab.special.unk;
        let mut best = vec![
            Best {
                token: unk,
                start: 0,
                score: f64::MIN,
            };
            n + 1
        ];
        best[0].score = 0.0;
        let mut start = 0;
        while start < n {
            let char_len = utf8_len(text[start]).min(n - start);
            let here = best[start];
            // Every token that starts here: walk the trie along the text.
            let mut covers_char = false;
            let mut node = Some(0);
            let mut end = start;
            while let Some(at) = node {
                if let Some(id) = self.tokens.values[at as usize] {
                    covers_char |= end - start == char_len;
                    // User-defined tokens score 0, higher than any real token's log
                    // probability, so that they are chosen whenever they fit.
                    let score = if vocab.attrs[id as usize].has(TokenAttr::USER_DEFINED) {
                        0.0
                    } else {
                        vocab.scores[id as usize] as f64
                    };
                    if here.score + score > best[end].score {
                        best[end] = Best {
                            token: Some(id),
                            start,
                            score: here.score + score,
                        };
                    }
                }
                node = text.get(end).and_then(|&b| self.tokens.child(at, b));
                end += 1;
            }
            // A character no token covers is unknown.
            if !covers_char {
                let score = here.score + self.unknown_score as f64;
                let end = start + char_len;
                if score > best[end].score {
                    best[end] = Best {
                        token: unk,
                        start,
                        score,
                    };
                }
            }
            start += char_len;
        }
        // ANCHOR_END: ugm

        // ANCHOR: ugm_back
        // Walk back from the end, merging unknown tokens in a row into one.
        let first = out.len();
        let mut at = n;
        let mut prev_unknown = false;
        loop {
            let b = best[at];
            let unknown = b.token == unk;
            if !(prev_unknown && unknown) {
                out.extend(b.token);
            }
            if b.start == 0 {
                break;
            }
            prev_unknown = unknown;
            at = b.start;
        }
        out[first..].reverse();
    }
    // ANCHOR_END: ugm_back

    /// SentencePiece's normalization: the character map's replacements, then spaces. Works on
    /// bytes, because a replacement, or a user-defined token's prefix, may cut a character.
    fn normalize(&self, vocab: &Vocab, input: &[u8]) -> Vec<u8> {
        let space: &[u8] = if vocab.escape_whitespaces {
            "▁".as_bytes()
        } else {
            b" "
        };
        // llama.cpp's `treat_whitespace_as_suffix` is always false: the space goes in front.
        let prepend = vocab.add_space_prefix;
        let merge_spaces = vocab.remove_extra_whitespaces;
        let mut out = Vec::with_capacity(input.len() * 3);
        let (mut prepended, mut in_word) = (false, false);
        let mut at = 0;
        while at < input.len() {
            let (chunk, consumed) = self.normalize_prefix(&input[at..]);
            for &c in chunk {
                if c != b' ' {
                    if !in_word {
                        in_word = true;
                        if (prepend && !prepended) || merge_spaces {
                            out.extend_from_slice(space);
                            prepended = true;
                        }
                    }
                    out.push(c);
                } else {
                    in_word = false;
                    if !merge_spaces {
                        out.extend_from_slice(space);
                    }
                }
            }
            at += consumed;
        }
        out
    }

    /// The normalized form of the start of `input`, and how many bytes of it that consumed.
    fn normalize_prefix<'a>(&'a self, input: &'a [u8]) -> (&'a [u8], usize) {
        // A user-defined token passes unchanged: as far as the trie of them reaches.
        let n = self.user_defined.path_len(input);
        if n > 0 {
            return (&input[..n], n);
        }
        let map = self.charsmap.as_ref();
        if let Some((len, replacement)) = map.and_then(|m| m.longest_prefix(input)) {
            return (replacement, len);
        }
        match utf8_char_len(input) {
            Some(len) => (&input[..len], len),
            // Not UTF-8 here (a cut character): one byte becomes U+FFFD.
            None => ("\u{FFFD}".as_bytes(), 1),
        }
    }
}

/// The length of the UTF-8 sequence that `first` starts (1 for a stray continuation byte).
fn utf8_len(first: u8) -> usize {
    match first >> 4 {
        0xC | 0xD => 2,
        0xE => 3,
        0xF => 4,
        _ => 1,
    }
}

/// The length of the character at the start of `bytes`, if its bytes are there and well
/// formed as llama.cpp checks them (lead byte, continuation bytes).
fn utf8_char_len(bytes: &[u8]) -> Option<usize> {
    let first = *bytes.first()?;
    let len = match first {
        0x00..=0x7F => 1,
        0x80..=0xBF => return None,
        0xC0..=0xDF => 2,
        0xE0..=0xEF => 3,
        0xF0..=0xF7 => 4,
        _ => return None,
    };
    let rest = bytes.get(1..len)?;
    rest.iter().all(|&b| b & 0xC0 == 0x80).then_some(len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::VocabOptions;

    fn vocab(tokens: &[(&str, f32, i32)], opts: VocabOptions) -> Vocab {
        Vocab::new(
            "t5",
            tokens.iter().map(|t| t.0.to_string()).collect(),
            tokens.iter().map(|t| t.2).collect(),
            tokens.iter().map(|t| t.1).collect(),
            vec![],
            &opts,
        )
        .unwrap()
    }

    fn encode(v: &Vocab, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        Ugm::new(v).encode(v, text, &mut out);
        out
    }

    #[test]
    fn highest_total_score_wins_and_unknowns_merge() {
        let v = vocab(
            &[
                ("<pad>", 0.0, 3),
                ("</s>", 0.0, 3),
                ("<unk>", 0.0, 2),
                ("▁", -1.0, 1),
                ("▁ab", -5.0, 1),
                ("▁a", -1.0, 1),
                ("b", -1.0, 1),
                ("c", -1.0, 1),
            ],
            VocabOptions {
                add_space_prefix: Some(true),
                ..VocabOptions::default()
            },
        );
        // "▁a" + "b" (-2) beats "▁ab" (-5); the two unknown characters are one <unk>.
        assert_eq!(encode(&v, "abc"), [5, 6, 7]);
        assert_eq!(encode(&v, "ab"), [5, 6]);
        assert_eq!(encode(&v, "a日本c"), [5, 2, 7]);
        assert_eq!(encode(&v, ""), Vec::<u32>::new());
    }

    #[test]
    fn extra_spaces_shrink_when_asked() {
        let opts = |merge| VocabOptions {
            add_space_prefix: Some(true),
            remove_extra_whitespaces: Some(merge),
            ..VocabOptions::default()
        };
        let tokens = [("<unk>", 0.0, 2), ("▁", -1.0, 1), ("a", -1.0, 1)];
        let v = vocab(&tokens, opts(true));
        let u = Ugm::new(&v);
        assert_eq!(u.normalize(&v, b"  a   a "), "▁a▁a".as_bytes());
        let v = vocab(&tokens, opts(false));
        let u = Ugm::new(&v);
        assert_eq!(u.normalize(&v, b" a  a"), "▁▁a▁▁a".as_bytes());
    }
}
