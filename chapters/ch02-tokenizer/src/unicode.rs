//! Character classes for the pre-tokenizers, GPT-2's byte-to-character mapping, and the
//! lower-casing and accent stripping of BERT's normalizer.
//!
//! The classes are Unicode general categories folded into the eight groups that the
//! pre-tokenizer regexes name: `\p{L}` letters, `\p{N}` numbers, `\p{P}` punctuation and so on,
//! plus `\s` whitespace. They come from a generated table (`unicode_data.rs`, Unicode 15.1, the
//! version llama.cpp's tables were made from): a letter added in a later Unicode version would
//! otherwise split differently here than in llama.cpp. The same file has llama.cpp's simplified
//! case and decomposition tables: one lower-case code point per code point, and the first code
//! point of each decomposition.

pub use crate::unicode_data::UNICODE_VERSION;
use crate::unicode_data::{CLASS_RANGES, LOWERCASE, NFD_FIRST};
use std::sync::OnceLock;

/// The classes of one code point: one category bit, plus [`Class::WHITESPACE`] when the code
/// point is `\s`. Bit values follow llama.cpp's `unicode_cpt_flags`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Class(u16);

impl Class {
    /// Unassigned in this Unicode version (`Cn`).
    pub const UNDEFINED: u16 = 0x0001;
    pub const NUMBER: u16 = 0x0002;
    pub const LETTER: u16 = 0x0004;
    pub const SEPARATOR: u16 = 0x0008;
    pub const MARK: u16 = 0x0010;
    pub const PUNCTUATION: u16 = 0x0020;
    pub const SYMBOL: u16 = 0x0040;
    pub const CONTROL: u16 = 0x0080;
    pub const WHITESPACE: u16 = 0x0100;

    /// The class of "no code point": what a splitter sees past the end of its text. It has no
    /// bit set, so it is neither a letter nor whitespace nor "anything else".
    pub const NONE: Class = Class(0);

    pub fn bits(self) -> u16 {
        self.0
    }
    pub fn is_letter(self) -> bool {
        self.0 & Self::LETTER != 0
    }
    pub fn is_number(self) -> bool {
        self.0 & Self::NUMBER != 0
    }
    pub fn is_whitespace(self) -> bool {
        self.0 & Self::WHITESPACE != 0
    }
    /// `\p{M}`: combining marks (llama.cpp's `is_accent_mark`).
    pub fn is_mark(self) -> bool {
        self.0 & Self::MARK != 0
    }
    pub fn is_punctuation(self) -> bool {
        self.0 & Self::PUNCTUATION != 0
    }
    pub fn is_symbol(self) -> bool {
        self.0 & Self::SYMBOL != 0
    }
    /// `\p{C}` less unassigned code points: controls, formats, private use, surrogates.
    pub fn is_control(self) -> bool {
        self.0 & Self::CONTROL != 0
    }
    /// The general-category bit alone, without [`Class::WHITESPACE`].
    pub fn category(self) -> u16 {
        self.0 & !Self::WHITESPACE
    }
    /// `[^\s\p{L}\p{N}]`: a real code point that is none of whitespace, letter, number.
    pub fn is_other(self) -> bool {
        self.0 != 0 && self.0 & (Self::WHITESPACE | Self::LETTER | Self::NUMBER) == 0
    }
}

/// `\s`: Unicode's White_Space property. All of `\p{Z}` is in it, plus six control characters.
fn is_whitespace(cp: u32, category: u16) -> bool {
    matches!(cp, 0x09..=0x0D | 0x85) || category == Class::SEPARATOR
}

/// One byte per code point, expanded once from the range table: a lookup is then one load.
fn table() -> &'static [u8] {
    static TABLE: OnceLock<Box<[u8]>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = vec![Class::UNDEFINED as u8; 0x11_0000].into_boxed_slice();
        for (i, &(start, bits)) in CLASS_RANGES.iter().enumerate() {
            let end = CLASS_RANGES.get(i + 1).map_or(0x11_0000, |r| r.0);
            t[start as usize..end as usize].fill(bits);
        }
        t
    })
}

/// The class of `c`.
pub fn class_of(c: char) -> Class {
    let cp = c as u32;
    let category = table()[cp as usize] as u16;
    let ws = if is_whitespace(cp, category) {
        Class::WHITESPACE
    } else {
        0
    };
    Class(category | ws)
}

/// The lower case of `c`, one code point for one (llama.cpp's `unicode_tolower`, from the simple
/// mapping of UnicodeData.txt: `İ` becomes `i`, not `i` and a combining dot).
pub fn to_lower(c: char) -> char {
    match LOWERCASE.binary_search_by_key(&(c as u32), |&(from, _)| from) {
        Ok(i) => char::from_u32(LOWERCASE[i].1).unwrap_or(c),
        Err(_) => c,
    }
}

/// The first code point of the canonical decomposition (NFD) of `c`: `é` becomes `e`, `Å`
/// becomes `A`. llama.cpp's `unicode_cpts_normalize_nfd` maps each code point to just this one,
/// and drops nothing: BERT's accent stripping then removes the marks that were already
/// separate code points in the input.
pub fn nfd_first(c: char) -> char {
    let cp = c as u32;
    let i = NFD_FIRST.partition_point(|&(first, _, _)| first <= cp);
    match i.checked_sub(1).map(|i| NFD_FIRST[i]) {
        Some((first, last, nfd)) if first <= cp && cp <= last => char::from_u32(nfd).unwrap_or(c),
        _ => c,
    }
}

/// Han characters, as llama.cpp's `unicode_cpt_is_han` lists them: the CJK unified ideographs
/// with extensions A to F, and the compatibility ideographs.
pub fn is_han(c: char) -> bool {
    matches!(c as u32,
        0x4E00..=0x9FFF | 0x3400..=0x4DBF | 0x20000..=0x2A6DF | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F | 0x2B820..=0x2CEAF | 0x2CEB0..=0x2EBEF | 0xF900..=0xFAFF
        | 0x2F800..=0x2FA1F)
}

// ANCHOR: bytes_to_unicode
/// GPT-2's byte-level alphabet: every byte gets a printable character, so that a vocabulary of
/// strings can hold any byte sequence. Printable Latin-1 bytes stand for themselves; the other
/// 68 (controls, space, DEL, NBSP, soft hyphen, ...) are moved to U+0100 and up, in byte order.
/// Space (0x20) becomes `Ġ` (U+0120), newline becomes `Ċ` (U+010A).
pub fn byte_to_char(b: u8) -> char {
    BYTE_TABLES.get_or_init(build_byte_tables).0[b as usize]
}

/// The inverse of [`byte_to_char`]: `None` for characters outside the 256-character alphabet.
pub fn char_to_byte(c: char) -> Option<u8> {
    let cp = c as u32;
    if cp < 0x144 {
        let b = BYTE_TABLES.get_or_init(build_byte_tables).1[cp as usize];
        (b != u16::MAX).then_some(b as u8)
    } else {
        None
    }
}

static BYTE_TABLES: OnceLock<([char; 256], [u16; 0x144])> = OnceLock::new();

fn build_byte_tables() -> ([char; 256], [u16; 0x144]) {
    let stands_for_itself = |b: u32| matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut to_char = ['\0'; 256];
    let mut to_byte = [u16::MAX; 0x144];
    let mut next = 0x100;
    for b in 0..256u32 {
        let cp = if stands_for_itself(b) {
            b
        } else {
            next += 1;
            next - 1
        };
        to_char[b as usize] = char::from_u32(cp).expect("below U+0144");
        to_byte[cp as usize] = b as u16;
    }
    (to_char, to_byte)
}
// ANCHOR_END: bytes_to_unicode

/// Decode a byte-level token text (`"Ġthe"`) to the bytes it stands for (`b" the"`); `None` if
/// a character is outside the byte alphabet (as in special tokens written in plain text with a
/// space).
pub fn byte_level_decode(text: &str) -> Option<Vec<u8>> {
    text.chars().map(char_to_byte).collect()
}

/// Encode bytes in the byte-level alphabet: the inverse of [`byte_level_decode`].
pub fn byte_level_encode(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| byte_to_char(b)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_alphabet_is_a_bijection_with_known_anchors() {
        let mut seen = std::collections::HashSet::new();
        for b in 0..=255u8 {
            let c = byte_to_char(b);
            assert!(seen.insert(c), "byte {b:#04x} maps to {c:?} twice");
            assert_eq!(char_to_byte(c), Some(b));
        }
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(b'A'), 'A');
        assert_eq!(byte_to_char(0xAD), 'Ń'); // soft hyphen: the last byte moved
        assert_eq!(char_to_byte('€'), None);
        assert_eq!(byte_level_decode("Ġthe"), Some(b" the".to_vec()));
    }

    #[test]
    fn classes_of_sample_characters() {
        assert!(
            class_of('a').is_letter() && class_of('Ж').is_letter() && class_of('中').is_letter()
        );
        assert!(
            class_of('7').is_number() && class_of('½').is_number() && class_of('٣').is_number()
        );
        assert!(class_of(' ').is_whitespace() && class_of('\u{3000}').is_whitespace());
        assert!(class_of('\n').is_whitespace() && class_of('\u{85}').is_whitespace());
        assert!(!class_of('\u{200B}').is_whitespace()); // zero-width space is Cf, not \s
        assert!(
            class_of('!').is_other() && class_of('€').is_other() && class_of('\u{301}').is_other()
        );
        // U+31EF arrived in Unicode 15.1; U+1C89 in 16.0, so it is still unassigned here.
        assert_eq!(class_of('\u{31EF}').bits(), Class::SYMBOL);
        assert_eq!(class_of('\u{1C89}').bits(), Class::UNDEFINED);
        assert!(!Class::NONE.is_other());
    }

    #[test]
    fn lower_case_and_first_decomposed_code_point() {
        assert_eq!(to_lower('A'), 'a');
        assert_eq!(to_lower('Ж'), 'ж');
        assert_eq!(to_lower('\u{130}'), 'i');
        assert_eq!(to_lower('a'), 'a');
        assert_eq!(nfd_first('é'), 'e');
        assert_eq!(nfd_first('Å'), 'A');
        assert_eq!(nfd_first('ǖ'), 'u'); // two marks: both dropped from the decomposition
        assert_eq!(nfd_first('x'), 'x');
        assert_eq!(nfd_first('가'), '\u{1100}'); // Hangul syllables decompose to jamo
        assert!(is_han('中') && !is_han('あ'));
    }
}
