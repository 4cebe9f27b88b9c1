//! The tokenizer: text to token ids and back, for every vocabulary kind.

use crate::TokenizerError;
use crate::bpe::{Bpe, PairHasher, Scratch};
use crate::decode::{can_clean_separately, clean_spaces, take_utf8, token_piece};
use crate::pretokenize::{PreTokenizer, RegexSplitter, Splitter};
use crate::special::{Fragment, partition_literal, special_tokens};
use crate::spm;
use crate::ugm::Ugm;
use crate::vocab::{TokenAttr, Vocab, VocabKind};
use crate::wpm::Wpm;
use std::collections::HashSet;
use std::hash::BuildHasherDefault;
use std::ops::Range;

/// Something that cuts text into words for BPE: llama.cpp's [`Splitter`] or the
/// [`RegexSplitter`].
pub trait Split {
    /// Append the byte ranges of `text`'s words to `out`.
    fn split(&self, text: &str, out: &mut Vec<Range<usize>>);
}

impl Split for Splitter {
    fn split(&self, text: &str, out: &mut Vec<Range<usize>>) {
        Splitter::split(self, text, out)
    }
}

impl Split for RegexSplitter {
    fn split(&self, text: &str, out: &mut Vec<Range<usize>>) {
        RegexSplitter::split(self, text, out)
    }
}

/// The tables each kind of vocabulary encodes with.
enum Model {
    Spm {
        /// Byte fallback: the `<0x..>` token of each byte.
        byte_tokens: [Option<u32>; 256],
        /// Every pair of neighbouring characters inside some token. Text can be cut between
        /// two characters that form no such pair: no merge will ever join them.
        pairs: HashSet<(char, char), BuildHasherDefault<PairHasher>>,
    },
    Bpe {
        splitter: Splitter,
        bpe: Bpe,
    },
    Wpm(Wpm),
    Ugm(Ugm),
}

/// A vocabulary with everything needed to encode and decode.
pub struct Tokenizer {
    vocab: Vocab,
    model: Model,
    /// Tokens recognised in input text, longest first.
    specials: Vec<u32>,
    /// The bytes of every token, special tokens rendered as text.
    pieces: Vec<Box<[u8]>>, // (n_vocab)
}

impl Tokenizer {
    /// Build the merge tables, special-token list and piece cache of `vocab`.
    pub fn new(vocab: Vocab) -> Tokenizer {
        let model = match vocab.kind {
            VocabKind::Bpe(pre) => Model::Bpe {
                splitter: Splitter::new(pre),
                bpe: Bpe::new(&vocab),
            },
            VocabKind::Spm => {
                let mut byte_tokens = [None; 256];
                for b in 0..=255u8 {
                    // llama.cpp's `byte_to_token`: "<0xE2>", else a token made of the byte.
                    byte_tokens[b as usize] =
                        vocab.text_to_token(&format!("<0x{b:02X}>")).or_else(|| {
                            b.is_ascii()
                                .then(|| vocab.text_to_token(&(b as char).to_string()))?
                        });
                }
                let mut pairs = HashSet::default();
                for text in &vocab.tokens {
                    let chars: Vec<char> = text.chars().collect();
                    pairs.extend(chars.windows(2).map(|w| (w[0], w[1])));
                }
                Model::Spm { byte_tokens, pairs }
            }
            VocabKind::Wpm => Model::Wpm(Wpm::new(&vocab)),
            VocabKind::Ugm => Model::Ugm(Ugm::new(&vocab)),
        };
        let specials = special_tokens(&vocab);
        let pieces = (0..vocab.len() as u32)
            .map(|id| token_piece(&vocab, id).into_boxed_slice())
            .collect();
        Tokenizer {
            vocab,
            model,
            specials,
            pieces,
        }
    }

    /// Read the vocabulary from GGUF metadata and build the tokenizer.
    pub fn from_gguf(gguf: &ch01::Gguf) -> Result<Tokenizer, TokenizerError> {
        Ok(Tokenizer::new(Vocab::from_gguf(gguf)?))
    }

    pub fn vocab(&self) -> &Vocab {
        &self.vocab
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab.len()
    }

    pub fn bos(&self) -> Option<u32> {
        self.vocab.special.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.vocab.special.eos
    }

    /// Whether generating `id` ends the answer: eos, end of turn (`<|im_end|>`), and the
    /// other tokens llama.cpp counts as end of generation.
    pub fn is_eog(&self, id: u32) -> bool {
        self.vocab.eog.contains(&id)
    }

    /// Whether `id` is a control token (BOS, EOS, chat markers): not text.
    pub fn is_control(&self, id: u32) -> bool {
        self.vocab
            .attrs
            .get(id as usize)
            .is_some_and(|a| a.has(TokenAttr::CONTROL))
    }

    /// The first control or unknown token whose text occurs in `text`: what a user typing
    /// `<|im_end|>` into a message would forge if the text were parsed for special tokens.
    pub fn control_token_in(&self, text: &str) -> Option<u32> {
        let control = TokenAttr::CONTROL | TokenAttr::UNKNOWN;
        partition_literal(&self.vocab, &self.specials, text, &[])
            .into_iter()
            .find_map(|f| match f {
                Fragment::Token(id) if self.vocab.attrs[id as usize].has(control) => Some(id),
                _ => None,
            })
    }

    /// The text of token `id` as stored in the vocabulary (`"Ġthe"`, `"▁the"`, `"<0x0A>"`).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.vocab.tokens.get(id as usize).map(String::as_str)
    }

    /// The pre-tokenizer rule of a BPE vocabulary.
    pub fn pre_tokenizer(&self) -> Option<PreTokenizer> {
        self.splitter().map(Splitter::pre_tokenizer)
    }

    /// The word splitter of a BPE vocabulary.
    pub fn splitter(&self) -> Option<&Splitter> {
        match &self.model {
            Model::Bpe { splitter, .. } => Some(splitter),
            _ => None,
        }
    }

    /// The BPE merge machinery (`None` for the other kinds).
    pub fn bpe(&self) -> Option<&Bpe> {
        match &self.model {
            Model::Bpe { bpe, .. } => Some(bpe),
            _ => None,
        }
    }

    /// Token ids of `text`. `add_special` adds BOS/EOS where the vocabulary asks for them;
    /// `parse_special` lets control tokens written in the text (`<|im_start|>`) become tokens.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let everything = 0..text.len();
        let literal: &[Range<usize>] = if parse_special {
            &[]
        } else {
            std::slice::from_ref(&everything)
        };
        self.encode_literal(text, add_special, literal)
    }

    /// [`Tokenizer::encode`] with control tokens parsed everywhere except in the byte ranges
    /// `literal` (sorted, not overlapping), whose text is taken as it is. Text on both sides of
    /// a range's edge is tokenized as one piece, as if the ranges were not there, so an
    /// innocent text gets exactly the tokens `encode` gives it.
    pub fn encode_literal(
        &self,
        text: &str,
        add_special: bool,
        literal: &[Range<usize>],
    ) -> Vec<u32> {
        self.encode_fragments(None, text, add_special, literal)
    }

    /// [`Tokenizer::encode`] with another word splitter (BPE only; the other kinds have none).
    pub fn encode_with(
        &self,
        splitter: &dyn Split,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Vec<u32> {
        let everything = 0..text.len();
        let literal: &[Range<usize>] = if parse_special {
            &[]
        } else {
            std::slice::from_ref(&everything)
        };
        self.encode_fragments(Some(splitter), text, add_special, literal)
    }

    // ANCHOR: encode
    fn encode_fragments(
        &self,
        splitter: Option<&dyn Split>,
        text: &str,
        add_special: bool,
        literal: &[Range<usize>],
    ) -> Vec<u32> {
        let v = &self.vocab;
        let wpm = v.kind == VocabKind::Wpm;
        let mut out = Vec::with_capacity(text.len() / 3);
        // WordPiece always frames the text as [CLS] ... [SEP].
        if add_special && (v.add_bos || wpm) {
            out.extend(v.special.bos);
        }
        let mut after_special = true;
        for fragment in partition_literal(v, &self.specials, text, literal) {
            match fragment {
                Fragment::Token(id) => {
                    out.push(id);
                    after_special = true;
                }
                Fragment::Text(range) => {
                    self.encode_text(splitter, &text[range], after_special, &mut out);
                    after_special = false;
                }
            }
        }
        if add_special && wpm {
            out.extend(v.special.sep);
        } else if add_special && v.add_eos {
            out.extend(v.special.eos);
        }
        out
    }
    // ANCHOR_END: encode

    // ANCHOR: encode_text
    /// Append the tokens of a text fragment (no special tokens in it) to `out`.
    fn encode_text(
        &self,
        splitter: Option<&dyn Split>,
        text: &str,
        after_special: bool,
        out: &mut Vec<u32>,
    ) {
        let v = &self.vocab;
        match &self.model {
            Model::Bpe { splitter: own, bpe } => {
                let escaped;
                let text = if v.escape_whitespaces {
                    escaped = text.replace(' ', "▁");
                    &escaped
                } else {
                    text
                };
                let mut words = Vec::new();
                splitter.unwrap_or(own).split(text, &mut words);
                let mut scratch = Scratch::default();
                for word in &words {
                    bpe.encode_word(&text.as_bytes()[word.clone()], out, &mut scratch);
                }
            }
            Model::Spm { byte_tokens, pairs } => {
                // A space goes in front of the text, and of text after a special token:
                // SentencePiece was trained on words that carry their leading space.
                let prefix = if v.add_space_prefix && after_special {
                    " "
                } else {
                    ""
                };
                let escaped = format!("{prefix}{text}").replace(' ', "▁");
                let byte_token = |b: u8| byte_tokens[b as usize].or(v.special.unk);
                // llama.cpp queues the candidate merges of the whole fragment in one heap.
                // Merges never cross a cut between characters that no token holds side by
                // side, so each stretch between such cuts can be merged on its own, with the
                // same result and a heap a few entries deep instead of millions.
                let mut start = 0;
                let mut prev: Option<char> = None;
                for (i, c) in escaped.char_indices() {
                    if prev.is_some_and(|p| !pairs.contains(&(p, c))) {
                        spm::encode(v, &escaped[start..i], byte_token, out, None);
                        start = i;
                    }
                    prev = Some(c);
                }
                spm::encode(v, &escaped[start..], byte_token, out, None);
            }
            Model::Wpm(wpm) => wpm.encode(v, text, out),
            Model::Ugm(ugm) => ugm.encode(v, text, out),
        }
    }
    // ANCHOR_END: encode_text

    /// The bytes of token `id` (special tokens rendered as their text); empty for an id
    /// outside the vocabulary.
    pub fn token_to_piece(&self, id: u32) -> Vec<u8> {
        self.pieces
            .get(id as usize)
            .map_or(Vec::new(), |p| p.to_vec())
    }

    // ANCHOR: detokenize
    /// llama.cpp's `detokenize`: the bytes of `ids`. `remove_special` drops a leading BOS and
    /// trailing EOS that the vocabulary adds; `unparse_special` renders control tokens as
    /// their text (otherwise they render as nothing).
    pub fn detokenize(
        &self,
        ids: &[u32],
        remove_special: bool,
        unparse_special: bool,
    ) -> Result<Vec<u8>, TokenizerError> {
        let v = &self.vocab;
        let mut ids = ids;
        // SentencePiece added a space in front of the text; take it off again.
        let mut remove_space = v.add_space_prefix;
        if remove_special && v.add_bos && ids.first().is_some_and(|&t| Some(t) == v.special.bos) {
            remove_space = false;
            ids = &ids[1..];
        }
        if remove_special && v.add_eos && ids.last().is_some_and(|&t| Some(t) == v.special.eos) {
            ids = &ids[..ids.len() - 1];
        }
        let mut out = Vec::new();
        for &id in ids {
            let piece = self.piece(id, unparse_special)?;
            let piece = match piece {
                [b' ', rest @ ..] if remove_space => rest,
                p => p,
            };
            out.extend_from_slice(piece);
            remove_space = false;
        }
        if v.clean_spaces {
            clean_spaces(&mut out);
        }
        Ok(out)
    }
    // ANCHOR_END: detokenize

    fn piece(&self, id: u32, unparse_special: bool) -> Result<&[u8], TokenizerError> {
        let piece = self
            .pieces
            .get(id as usize)
            .ok_or(TokenizerError::TokenOutOfRange {
                id,
                n_vocab: self.vocab.len(),
            })?;
        let hidden = TokenAttr::CONTROL | TokenAttr::UNKNOWN;
        Ok(
            if !unparse_special && self.vocab.attrs[id as usize].has(hidden) {
                &[]
            } else {
                piece
            },
        )
    }

    /// The text of `ids`, special tokens rendered, as llama.cpp's `common_detokenize`. Bytes
    /// that are not UTF-8 become U+FFFD, only here at the end; an id outside the vocabulary
    /// also decodes to U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut stream = StreamDecoder::new(self);
        let mut text: String = ids.iter().map(|&id| stream.push(id)).collect();
        text.push_str(&stream.finish());
        text
    }
}

// ANCHOR: stream
/// Decodes tokens one at a time, as a model generates them. [`StreamDecoder::push`] returns
/// the text that the new token completes: a character split across tokens comes out with
/// its last byte, and bytes that space clean-up might still remove wait for the next token.
/// Together, the pushes and [`StreamDecoder::finish`] give exactly [`Tokenizer::decode`].
pub struct StreamDecoder<'a> {
    tokenizer: &'a Tokenizer,
    /// Piece bytes not yet space-cleaned (only when the vocabulary cleans spaces).
    uncleaned: Vec<u8>,
    /// Cleaned bytes not yet returned: the start of a character whose rest is to come.
    unfinished: Vec<u8>,
    first: bool,
}

impl<'a> StreamDecoder<'a> {
    pub fn new(tokenizer: &'a Tokenizer) -> StreamDecoder<'a> {
        StreamDecoder {
            tokenizer,
            uncleaned: Vec::new(),
            unfinished: Vec::new(),
            first: true,
        }
    }
    // ANCHOR_END: stream

    // ANCHOR: stream_push
    /// Add one token; return the text it completes (often empty inside a character).
    pub fn push(&mut self, id: u32) -> String {
        const REPLACEMENT: &[u8] = "\u{FFFD}".as_bytes();
        let t = self.tokenizer;
        let piece = t.piece(id, true).unwrap_or(REPLACEMENT);
        let piece = match piece {
            [b' ', rest @ ..] if self.first && t.vocab.add_space_prefix => rest,
            p => p,
        };
        self.first = false;
        if !t.vocab.clean_spaces {
            self.unfinished.extend_from_slice(piece);
            return take_utf8(&mut self.unfinished, false);
        }
        let old_len = self.uncleaned.len();
        self.uncleaned.extend_from_slice(piece);
        // Clean up to the last point where cleaning in two parts gives the same result. Only
        // cuts inside the new piece need a look: whether a cut is possible depends on the two
        // bytes before it, and the held bytes had none, or the last push would have taken it.
        // (Looking through all held bytes again would make a run of spaces quadratic.)
        let cut = ((old_len + 1).max(2)..=self.uncleaned.len())
            .rev()
            .find(|&i| can_clean_separately(&self.uncleaned[..i]));
        if let Some(cut) = cut {
            let mut ready: Vec<u8> = self.uncleaned.drain(..cut).collect();
            clean_spaces(&mut ready);
            self.unfinished.extend_from_slice(&ready);
        }
        take_utf8(&mut self.unfinished, false)
    }

    /// The rest of the text: held-back bytes, with U+FFFD for an unfinished character (a
    /// token limit can cut generation inside one). Text is UTF-8, so the bytes cannot be
    /// passed on as they are; the replacement character says that the text ends inside a
    /// character, where dropping the bytes would hide it. llama-server's JSON does the same.
    pub fn finish(mut self) -> String {
        if self.tokenizer.vocab.clean_spaces {
            clean_spaces(&mut self.uncleaned);
        }
        self.unfinished.append(&mut self.uncleaned);
        take_utf8(&mut self.unfinished, true)
    }
}
// ANCHOR_END: stream_push
