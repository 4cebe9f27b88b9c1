//! From token ids back to bytes and text.
//!
//! Each token has a *piece*: the bytes it stands for. Joining pieces gives the text, with two
//! adjustments llama.cpp makes (`llama_vocab::impl::detokenize`): a vocabulary that adds a
//! space in front of the text drops it again, and some vocabularies "clean up" spaces before
//! punctuation.
//!
//! A piece need not be valid UTF-8 on its own: `é` may be two byte tokens, and a BPE token may
//! end in the middle of a character. [`StreamDecoder`] turns tokens into text one at a time
//! while a model generates them, holding back bytes until they form whole characters.

use crate::unicode::char_to_byte;
use crate::vocab::{TokenAttr, Vocab, VocabKind};

// ANCHOR: piece
/// The bytes token `id` stands for, with special tokens rendered as their text (llama.cpp's
/// `token_to_piece(..., special = true)`, which it computes once per token and caches).
/// Empty for an id outside the vocabulary.
pub fn token_piece(vocab: &Vocab, id: u32) -> Vec<u8> {
    let (Some(&attr), Some(text)) = (vocab.attrs.get(id as usize), vocab.tokens.get(id as usize))
    else {
        return Vec::new();
    };
    if attr.has(TokenAttr::UNKNOWN | TokenAttr::CONTROL | TokenAttr::USER_DEFINED) {
        return text.as_bytes().to_vec();
    }
    if attr.has(TokenAttr::NORMAL) {
        // Byte-level BPE spells bytes in GPT-2's alphabet; the others write spaces as `▁`.
        return match vocab.kind {
            VocabKind::Bpe(_) if !vocab.escape_whitespaces => byte_level_to_bytes(text),
            _ => text.replace('▁', " ").into_bytes(),
        };
    }
    if attr.has(TokenAttr::BYTE) {
        // "<0xE2>" → 0xE2
        let hex = text.get(3..5).unwrap_or("");
        return vec![u8::from_str_radix(hex, 16).unwrap_or(0)];
    }
    Vec::new() // unused and undefined tokens render as nothing
}
// ANCHOR_END: piece

// ANCHOR: byte_level_to_bytes
/// Byte-level characters back to bytes. A character outside the byte alphabet cannot come from
/// byte-level training, but such tokens exist (Command-R's vocabulary has 1 403, single symbols
/// such as `™`); llama.cpp writes each such character as a marker with its bytes in hex and the
/// whole token text, `[UNK_BYTE_0xe284a2™]`, and so does this. llama.cpp puts the token text
/// into every marker, which makes the piece quadratic in the token's length (268 MB for one
/// token of 16 384 spaces); here only the first marker carries it. The pieces are the same
/// for every real vocabulary, whose such tokens have one character outside the alphabet.
fn byte_level_to_bytes(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    let mut text_written = false;
    for c in text.chars() {
        match char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                out.extend_from_slice(b"[UNK_BYTE_0x");
                let mut buf = [0; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.extend_from_slice(&hex_byte(b));
                }
                if !text_written {
                    out.extend_from_slice(text.as_bytes());
                    text_written = true;
                }
                out.push(b']');
            }
        }
    }
    out
}

/// Two lower-case hex digits.
fn hex_byte(b: u8) -> [u8; 2] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    [DIGITS[(b >> 4) as usize], DIGITS[(b & 15) as usize]]
}
// ANCHOR_END: byte_level_to_bytes

// ANCHOR: clean_spaces
/// Hugging Face's `clean_up_tokenization_spaces`, in llama.cpp's three passes: drop the space
/// before `? ! . ,`; drop both spaces around a lone `'`; drop the space before `'s 'm 're 've`.
pub fn clean_spaces(text: &mut Vec<u8>) {
    // Each pass compacts in place, reading position i and writing at `total <= i`.
    let n = text.len();
    let mut total = n.min(1);
    for i in 1..n {
        let x = text[i];
        if text[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            total -= 1;
        }
        text[total] = x;
        total += 1;
    }

    let n = total;
    total = n.min(1);
    let mut i = 1;
    while i < n {
        let x = text[i];
        if x == b'\'' && i + 1 < n && text[i - 1] == b' ' && text[i + 1] == b' ' {
            total -= 1;
            i += 1;
            text[i] = 0; // the next space is skipped, and is no longer a space behind
        }
        text[total] = x;
        total += 1;
        i += 1;
    }

    let n = total;
    total = n.min(1);
    for i in 1..n {
        let x = text[i];
        if text[i - 1] == b' ' && x == b'\'' && i + 1 < n {
            // " 's", " 'm", " 're", " 've" lose the space; " 't", " 'd", " 'll" keep it.
            let x2 = if i + 2 < n { text[i + 2] } else { 0 };
            if matches!((text[i + 1], x2), (b's' | b'm', _) | (b'r' | b'v', b'e')) {
                total -= 1;
            }
        }
        text[total] = x;
        total += 1;
    }
    text.truncate(total);
}
// ANCHOR_END: clean_spaces

/// Whether [`clean_spaces`] of a text cut here equals cleaning the parts separately: true
/// when neither of the two bytes before the cut is a space or an apostrophe, since every rule
/// looks at most one byte behind a space or two bytes past an apostrophe.
pub fn can_clean_separately(before: &[u8]) -> bool {
    before.len() >= 2
        && before[before.len() - 2..]
            .iter()
            .all(|&b| b != b' ' && b != b'\'')
}

/// Turn complete UTF-8 at the front of `bytes` into text and remove it, replacing invalid
/// sequences with U+FFFD; keep a trailing incomplete sequence unless `flush`.
pub fn take_utf8(bytes: &mut Vec<u8>, flush: bool) -> String {
    let mut out = String::new();
    let mut done = 0;
    loop {
        match std::str::from_utf8(&bytes[done..]) {
            Ok(s) => {
                out.push_str(s);
                done = bytes.len();
                break;
            }
            Err(e) => {
                let valid = done + e.valid_up_to();
                out.push_str(std::str::from_utf8(&bytes[done..valid]).expect("checked valid"));
                match e.error_len() {
                    // Provably invalid: these bytes can start no character.
                    Some(n) => {
                        out.push(char::REPLACEMENT_CHARACTER);
                        done = valid + n;
                    }
                    // A character cut off at the end: wait for the rest, unless there is none.
                    None if !flush => {
                        done = valid;
                        break;
                    }
                    None => {
                        out.push(char::REPLACEMENT_CHARACTER);
                        done = bytes.len();
                        break;
                    }
                }
            }
        }
    }
    bytes.drain(..done);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clean(s: &str) -> String {
        let mut b = s.as_bytes().to_vec();
        clean_spaces(&mut b);
        String::from_utf8(b).unwrap()
    }

    #[test]
    fn clean_spaces_matches_llama_cpp_rules() {
        assert_eq!(clean("Hello , world !"), "Hello, world!");
        assert_eq!(clean("it ' s"), "it's");
        assert_eq!(
            clean("it 's we 're I 'm they 've"),
            "it's we're I'm they've"
        );
        assert_eq!(clean("do n't you 'll"), "do n't you 'll");
        assert_eq!(clean(" ."), ".");
        assert_eq!(clean(""), "");
    }

    #[test]
    fn take_utf8_holds_back_only_incomplete_characters() {
        let mut b = "aé".as_bytes()[..2].to_vec(); // 'a' and the first byte of 'é'
        assert_eq!(take_utf8(&mut b, false), "a");
        assert_eq!(b, [0xC3]);
        b.push(0xA9);
        assert_eq!(take_utf8(&mut b, false), "é");
        let mut bad = vec![b'x', 0xFF, b'y', 0xE2, 0x82];
        assert_eq!(take_utf8(&mut bad, false), "x\u{FFFD}y");
        assert_eq!(take_utf8(&mut bad, true), "\u{FFFD}");
        assert!(bad.is_empty());
    }
}
