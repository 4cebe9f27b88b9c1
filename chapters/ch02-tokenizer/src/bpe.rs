//! Byte-level BPE: each word starts as one symbol per byte, and the pair of neighbours with
//! the best (lowest) merge rank is joined, again and again, until no neighbouring pair has a
//! merge rule. What is left are tokens.
//!
//! SentencePiece-style BPE (Gemma 4) is the same algorithm on raw UTF-8: tokens are plain text
//! with `▁` for spaces, a word starts as one symbol per character, and a character without a
//! token is spelled with byte tokens `<0x..>`.
//!
//! llama.cpp (`llm_tokenizer_bpe_session`) works on the byte-level *strings* (`"Ġ"`, `"t"`,
//! `"Ġt"`) and looks merges up by string pair. Here every string that can occur is numbered
//! once, when the tokenizer is built: tokens keep their ids, and merge results that are not
//! tokens get ids past the vocabulary. A merge is then one hash lookup of two integers, and a
//! symbol is a range of the word's bytes plus an id. The order of merges is the same.

use crate::pretokenize::PreTokenizer;
use crate::unicode::byte_level_decode;
use crate::vocab::{Vocab, VocabKind};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

/// No id: a byte whose character is neither a token nor part of any merge rule.
const NONE: u32 = u32::MAX;

/// A merge rule, by the ids of its two sides.
#[derive(Debug, Clone, Copy)]
struct Merge {
    /// Position in `tokenizer.ggml.merges`: lower merges first.
    rank: u32,
    /// Id of the joined string.
    id: u32,
}

/// The merge machinery of a byte-level BPE vocabulary.
pub struct Bpe {
    n_vocab: u32,
    /// Tokens are in GPT-2's byte alphabet (else raw UTF-8, and symbols start as characters).
    byte_encode: bool,
    /// Llama 3: take a word whole when it is a token, without merging.
    ignore_merges: bool,
    /// Gemma 4: a word of newlines only is taken whole when it is a token.
    whole_newlines: bool,
    /// The bytes every token (and every merge result) stands for, and its id.
    ids: HashMap<Box<[u8]>, u32>,
    /// `(left id << 32) | right id` → merge.
    merges: HashMap<u64, Merge, BuildHasherDefault<PairHasher>>,
    /// Id of the one-byte symbol for each byte.
    byte_ids: [u32; 256],
    /// A word byte that ends up in no token is looked up as a one-character token, as
    /// llama.cpp does (that only finds printable ASCII), or without the byte alphabet as its
    /// byte token `<0x..>`.
    fallback: [u32; 256],
}

// ANCHOR: symbol
/// One symbol of a word being merged: a run of its bytes, in a linked list of neighbours.
#[derive(Debug, Clone, Copy)]
pub struct Symbol {
    /// Token id (or merge-result id past the vocabulary; [`NONE`] for unknown bytes).
    pub id: u32,
    pub start: usize,
    /// Length in bytes; 0 once merged into its left neighbour.
    pub len: usize,
    prev: usize,
    next: usize,
}

/// A candidate merge of neighbours `left` and `right`:
/// `(rank, left, right, left id, right id, merged id)`. The heap pops the lowest rank first,
/// and among equal ranks the leftmost pair, as llama.cpp's `llm_bigram_bpe::comparator`.
type Candidate = Reverse<(u32, usize, usize, u32, u32, u32)>;
// ANCHOR_END: symbol

impl Bpe {
    /// Number every token and merge result, and index the merge rules by id pair.
    pub fn new(vocab: &Vocab) -> Bpe {
        let n_vocab = vocab.tokens.len() as u32;
        let pre = match vocab.kind {
            VocabKind::Bpe(pre) => Some(pre),
            _ => None,
        };
        let byte_encode = pre.is_none_or(|p| p.byte_encode());
        // The bytes a token's text stands for.
        let bytes = |text: &str| {
            if byte_encode {
                byte_level_decode(text)
            } else {
                Some(text.as_bytes().to_vec())
            }
        };
        let mut ids: HashMap<Box<[u8]>, u32> = HashMap::with_capacity(vocab.tokens.len());
        for (id, text) in vocab.tokens.iter().enumerate() {
            // Texts outside the byte alphabet (a control token with a plain space, say) can
            // never equal a byte-encoded word, so they need no entry.
            if let Some(bytes) = bytes(text) {
                ids.insert(bytes.into_boxed_slice(), id as u32);
            }
        }
        let mut next_extra = n_vocab;
        let mut intern = |ids: &mut HashMap<Box<[u8]>, u32>, bytes: Vec<u8>| -> u32 {
            *ids.entry(bytes.into_boxed_slice()).or_insert_with(|| {
                next_extra += 1;
                next_extra - 1
            })
        };
        let mut merges = HashMap::with_capacity_and_hasher(vocab.merges.len(), Default::default());
        for (rank, (left, right)) in vocab.merges.iter().enumerate() {
            let (Some(l), Some(r)) = (bytes(left), bytes(right)) else {
                continue;
            };
            let joined = [l.as_slice(), r.as_slice()].concat();
            let (l, r, id) = (
                intern(&mut ids, l),
                intern(&mut ids, r),
                intern(&mut ids, joined),
            );
            // A repeated rule keeps its first (best) rank, as `bpe_ranks.emplace` does.
            merges.entry(pair_key(l, r)).or_insert(Merge {
                rank: rank as u32,
                id,
            });
        }
        let mut byte_ids = [NONE; 256];
        let mut fallback = [NONE; 256];
        for b in 0..=255u8 {
            byte_ids[b as usize] = ids.get(&[b][..]).copied().unwrap_or(NONE);
            let token = if byte_encode {
                (0x21..=0x7E)
                    .contains(&b)
                    .then(|| vocab.text_to_token(&(b as char).to_string()))
                    .flatten()
            } else {
                vocab.text_to_token(&format!("<0x{b:02X}>"))
            };
            fallback[b as usize] = token.unwrap_or(NONE);
        }
        Bpe {
            n_vocab,
            byte_encode,
            ignore_merges: vocab.ignore_merges,
            whole_newlines: pre == Some(PreTokenizer::Gemma4),
            ids,
            merges,
            byte_ids,
            fallback,
        }
    }

    /// Append the tokens of one pre-tokenized word (raw bytes) to `out`.
    pub fn encode_word(&self, word: &[u8], out: &mut Vec<u32>, scratch: &mut Scratch) {
        let whole = self.ignore_merges || (self.whole_newlines && word.iter().all(|&b| b == b'\n'));
        if whole
            && let Some(&id) = self.ids.get(word)
            && id < self.n_vocab
        {
            out.push(id);
            return;
        }
        self.merge(word, scratch, |_, _| {});
        for s in scratch.symbols.iter().filter(|s| s.len > 0) {
            if s.id < self.n_vocab {
                out.push(s.id);
            } else {
                let bytes = &word[s.start..s.start + s.len];
                out.extend(
                    bytes
                        .iter()
                        .map(|&b| self.fallback[b as usize])
                        .filter(|&id| id != NONE),
                );
            }
        }
    }

    /// The symbols of `word` after each merge with the rank of the merge, starting with its
    /// bytes (rank `None`): the trace the book prints to show BPE at work.
    pub fn merge_steps(&self, word: &[u8]) -> Vec<(Option<u32>, Vec<Vec<u8>>)> {
        let mut steps = Vec::new();
        let mut scratch = Scratch::default();
        self.merge(word, &mut scratch, |symbols, rank| {
            let alive = symbols.iter().filter(|s| s.len > 0);
            let pieces = alive.map(|s| word[s.start..s.start + s.len].to_vec());
            steps.push((rank, pieces.collect()));
        });
        steps
    }

    // ANCHOR: merge
    /// Merge the bytes of `word` into symbols, leaving them in `scratch.symbols` (merged-away
    /// symbols have length 0). `trace` sees the symbols at the start and after every merge,
    /// with the merge's rank.
    fn merge(
        &self,
        word: &[u8],
        scratch: &mut Scratch,
        mut trace: impl FnMut(&[Symbol], Option<u32>),
    ) {
        let Scratch { symbols, queue } = scratch;
        symbols.clear();
        queue.clear();
        // One symbol per byte, or per character without the byte alphabet.
        let n = word.len();
        let mut start = 0;
        while start < n {
            let len = if self.byte_encode {
                1
            } else {
                utf8_len(word[start]).min(n - start)
            };
            let id = if len == 1 {
                self.byte_ids[word[start] as usize]
            } else {
                self.ids
                    .get(&word[start..start + len])
                    .copied()
                    .unwrap_or(NONE)
            };
            let i = symbols.len();
            symbols.push(Symbol {
                id,
                start,
                len,
                prev: i.wrapping_sub(1), // usize::MAX: no neighbour
                next: if start + len < n { i + 1 } else { usize::MAX },
            });
            start += len;
        }
        trace(symbols, None);
        for i in 1..symbols.len() {
            self.push_candidate(symbols, queue, i - 1, i);
        }
        // ANCHOR_END: merge

        // ANCHOR: merge_loop
        // ANCHOR: yours_merge_loop
        while let Some(Reverse((rank, left, right, left_id, right_id, merged))) = queue.pop() {
            let (l, r) = (symbols[left], symbols[right]);
            // Stale: one side has merged since this pair was queued.
            if l.len == 0 || r.len == 0 || l.id != left_id || r.id != right_id {
                continue;
            }
            symbols[left].id = merged;
            symbols[left].len += r.len;
            symbols[left].next = r.next;
            symbols[right].len = 0;
            if r.next != usize::MAX {
                symbols[r.next].prev = left;
            }
            trace(symbols, Some(rank));
            // The merged symbol has new neighbours to pair with.
            self.push_candidate(symbols, queue, l.prev, left);
            self.push_candidate(symbols, queue, left, r.next);
        }
        // ANCHOR_END: yours_merge_loop
    }
    // ANCHOR_END: merge_loop

    // ANCHOR: push_candidate
    fn push_candidate(
        &self,
        symbols: &[Symbol],
        queue: &mut BinaryHeap<Candidate>,
        l: usize,
        r: usize,
    ) {
        // ANCHOR: yours_push_candidate
        if l == usize::MAX || r == usize::MAX {
            return;
        }
        let (a, b) = (symbols[l].id, symbols[r].id);
        if a == NONE || b == NONE {
            return;
        }
        if let Some(m) = self.merges.get(&pair_key(a, b)) {
            queue.push(Reverse((m.rank, l, r, a, b, m.id)));
        }
        // ANCHOR_END: yours_push_candidate
    }
    // ANCHOR_END: push_candidate
}

/// The length of the UTF-8 sequence that `first` starts (1 for a stray continuation byte), as
/// llama.cpp's `unicode_len_utf8`.
fn utf8_len(first: u8) -> usize {
    match first >> 4 {
        0xC | 0xD => 2,
        0xE => 3,
        0xF => 4,
        _ => 1,
    }
}

/// Buffers reused from word to word.
#[derive(Default)]
pub struct Scratch {
    symbols: Vec<Symbol>,
    queue: BinaryHeap<Candidate>,
}

fn pair_key(left: u32, right: u32) -> u64 {
    ((left as u64) << 32) | right as u64
}

/// A multiply-rotate hash for the merge table's integer keys (the scheme of Firefox's and
/// rustc's FxHash). The default SipHash resists hash flooding, which a table built once from a
/// trusted file does not need, and costs several times more per lookup.
#[derive(Default, Clone, Copy)]
pub struct PairHasher(u64);

impl Hasher for PairHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u32(&mut self, x: u32) {
        self.write_u64(x as u64);
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::VocabOptions;

    fn toy() -> Bpe {
        let tokens = ["a", "b", "c", "ab", "abc", "bc", "Ġ", "Ġa"];
        let merges = ["a b", "ab c", "b c", "Ġ a"];
        let opts = VocabOptions {
            pre: Some("gpt-2".into()),
            ..VocabOptions::default()
        };
        let s = |v: &[&str]| v.iter().map(|t| t.to_string()).collect();
        Bpe::new(&Vocab::new("gpt2", s(&tokens), vec![], vec![], s(&merges), &opts).unwrap())
    }

    fn encode(bpe: &Bpe, word: &[u8]) -> Vec<u32> {
        let mut out = Vec::new();
        bpe.encode_word(word, &mut out, &mut Scratch::default());
        out
    }

    #[test]
    fn lowest_rank_merges_first() {
        let bpe = toy();
        // "a b" (rank 0) beats "b c" (rank 2), then "ab c" (rank 1) applies.
        assert_eq!(encode(&bpe, b"abc"), [4]);
        assert_eq!(encode(&bpe, b"bc"), [5]);
        assert_eq!(encode(&bpe, b" a"), [7]);
        let steps = bpe.merge_steps(b"abc");
        assert_eq!(
            steps,
            [
                (None, vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]),
                (Some(0), vec![b"ab".to_vec(), b"c".to_vec()]),
                (Some(1), vec![b"abc".to_vec()])
            ]
        );
    }

    #[test]
    fn bytes_without_tokens_fall_back_to_one_character_tokens_or_vanish() {
        // 'd' has no token: llama.cpp looks it up as a one-character token, finds none and
        // drops it.
        assert_eq!(encode(&toy(), b"abd"), [3]);
    }
}
