//! SentencePiece-style tokenization (`tokenizer.ggml.model = "llama"`), as llama.cpp's
//! `llm_tokenizer_spm` does it.
//!
//! There are no merge rules and no pre-tokenizer. Spaces become `▁` (U+2581), the text starts
//! as one symbol per character, and any two neighbours whose concatenation is a token may
//! merge; the pair whose token has the highest *score* goes first. Characters that end up in
//! no token are spelled as byte tokens `<0x..>` ("byte fallback").

use crate::vocab::Vocab;
use std::cmp::Ordering;
use std::collections::BinaryHeap;

const NONE: usize = usize::MAX;

#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: usize,
    /// Length in bytes; 0 once merged into its left neighbour.
    len: usize,
    prev: usize,
    next: usize,
}

/// A candidate merge: `left` and `right` neighbours whose joined text is a token.
#[derive(Debug, Clone, Copy)]
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    /// Byte length of the joined text: a bigram is stale once its sides' lengths changed.
    size: usize,
}

// Highest score first; among equal scores the leftmost (llama.cpp's `llm_bigram_spm`).
impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then(other.left.cmp(&self.left))
    }
}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}

/// Receives the symbols at the start and after every merge, with the merged token's score.
pub type Trace<'a> = dyn FnMut(Vec<&str>, Option<f32>) + 'a;

// ANCHOR: spm
/// Append the tokens of `text` (spaces already escaped to `▁`) to `out`. `byte_token` maps a
/// byte to its fallback token.
pub fn encode(
    vocab: &Vocab,
    text: &str,
    byte_token: impl Fn(u8) -> Option<u32>,
    out: &mut Vec<u32>,
    mut trace: Option<&mut Trace>,
) {
    let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
    for (start, c) in text.char_indices() {
        let i = symbols.len();
        symbols.push(Symbol {
            start,
            len: c.len_utf8(),
            prev: i.wrapping_sub(1),
            next: if start + c.len_utf8() < text.len() {
                i + 1
            } else {
                NONE
            },
        });
    }
    let piece = |s: &Symbol| &text[s.start..s.start + s.len];
    let mut queue = BinaryHeap::new();
    let try_add =
        |symbols: &[Symbol], queue: &mut BinaryHeap<Bigram>, left: usize, right: usize| {
            if left == NONE || right == NONE {
                return;
            }
            let l = symbols[left];
            let joined = &text[l.start..l.start + l.len + symbols[right].len];
            if let Some(id) = vocab.text_to_token(joined) {
                queue.push(Bigram {
                    score: vocab.scores[id as usize],
                    left,
                    right,
                    size: joined.len(),
                });
            }
        };
    for i in 1..symbols.len() {
        try_add(&symbols, &mut queue, i - 1, i);
    }
    if let Some(t) = trace.as_mut() {
        t(symbols.iter().map(piece).collect(), None);
    }
    // ANCHOR_END: spm

    // ANCHOR: spm_merge
    while let Some(b) = queue.pop() {
        let (l, r) = (symbols[b.left], symbols[b.right]);
        if l.len == 0 || r.len == 0 || l.len + r.len != b.size {
            continue;
        }
        symbols[b.left].len += r.len;
        symbols[b.left].next = r.next;
        symbols[b.right].len = 0;
        if r.next != NONE {
            symbols[r.next].prev = b.left;
        }
        if let Some(t) = trace.as_mut() {
            t(
                symbols.iter().filter(|s| s.len > 0).map(piece).collect(),
                Some(b.score),
            );
        }
        try_add(&symbols, &mut queue, l.prev, b.left);
        try_add(&symbols, &mut queue, b.left, r.next);
    }
    // Every merge made a token, so only single characters can lack one: spell them in bytes.
    for s in symbols.iter().filter(|s| s.len > 0) {
        match vocab.text_to_token(piece(s)) {
            Some(id) => out.push(id),
            None => out.extend(piece(s).bytes().filter_map(&byte_token)),
        }
    }
}
// ANCHOR_END: spm_merge

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::VocabOptions;

    #[test]
    fn highest_score_merges_first_and_unknown_characters_become_bytes() {
        let tokens = [
            "<unk>", "<s>", "</s>", "▁", "a", "b", "▁a", "ab", "▁ab", "<0xC3>", "<0xA9>",
        ];
        let scores = [0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -4.0, -0.5, -6.0, 0.0, 0.0];
        let types = [2, 3, 3, 1, 1, 1, 1, 1, 1, 6, 6];
        let vocab = Vocab::new(
            "llama",
            tokens.iter().map(|t| t.to_string()).collect(),
            types.to_vec(),
            scores.to_vec(),
            vec![],
            &VocabOptions::default(),
        )
        .unwrap();
        let byte = |b: u8| vocab.text_to_token(&format!("<0x{b:02X}>"));
        let mut out = Vec::new();
        let mut steps = Vec::new();
        let mut record = |s: Vec<&str>, _| steps.push(s.join("|"));
        encode(&vocab, "▁abé", byte, &mut out, Some(&mut record));
        // "ab" (-0.5) beats "▁a" (-4.0); then "▁" + "ab" = "▁ab" is a token; "é" is not.
        assert_eq!(steps, ["▁|a|b|é", "▁|ab|é", "▁ab|é"]);
        assert_eq!(out, [8, 9, 10]);
    }
}
