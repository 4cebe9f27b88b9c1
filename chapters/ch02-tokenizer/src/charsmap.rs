//! SentencePiece's compiled character map (`tokenizer.ggml.precompiled_charsmap`), which a
//! Unigram vocabulary normalizes its input with: read and checked when the vocabulary loads,
//! used by the tokenizer ([`crate::ugm`]).

/// SentencePiece's compiled character map: a double-array trie of the prefixes to replace
/// (XOR-compressed, as in Kanda's "Space- and Time-Efficient String Dictionaries"), then the
/// replacement strings, each ending in a NUL byte.
#[derive(Debug)]
pub(crate) struct CharsMap {
    /// Each node: BASE in bits 10..31 (shifted left by 8 more when bit 9 is set), LEAF in bit
    /// 8, LCHECK in bits 0..7 (with bit 31, so that a value node never matches a byte).
    nodes: Vec<u32>,
    replacements: Vec<u8>,
}

impl CharsMap {
    /// Split the blob of `tokenizer.ggml.precompiled_charsmap`: a little-endian u32 with the
    /// trie's size in bytes, the trie, the strings. `None` when the sizes do not fit (the
    /// vocabulary refuses such a blob when it loads, [`check_charsmap`]).
    pub(crate) fn parse(blob: &[u8]) -> Option<CharsMap> {
        let size = u32::from_le_bytes(blob.get(..4)?.try_into().ok()?) as usize;
        // llama.cpp also wants at least one byte of strings after the trie.
        let trie = blob.get(4..4usize.checked_add(size)?)?;
        let replacements = blob.get(4 + size..).filter(|r| !r.is_empty())?;
        Some(CharsMap {
            nodes: trie
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().expect("four bytes")))
                .collect(),
            replacements: replacements.to_vec(),
        })
    }

    fn node(&self, i: u32) -> Option<u32> {
        self.nodes.get(i as usize).copied()
    }
    fn base(packed: u32) -> u32 {
        (packed >> 10) << ((packed & (1 << 9)) >> 6)
    }
    fn lcheck(packed: u32) -> u32 {
        packed & ((1 << 31) | 0xFF)
    }
    fn leaf(packed: u32) -> bool {
        (packed >> 8) & 1 == 1
    }
    fn value(packed: u32) -> u32 {
        packed & ((1 << 31) - 1)
    }

    /// The longest prefix of `input` the map replaces: its length and its replacement. Stops
    /// at a NUL byte. llama.cpp throws on an index outside the map; this stops matching.
    pub(crate) fn longest_prefix(&self, input: &[u8]) -> Option<(usize, &[u8])> {
        let mut node = Self::base(self.node(0)?);
        let mut found = None;
        for (i, &c) in input.iter().enumerate() {
            if c == 0 {
                break;
            }
            node ^= c as u32;
            let Some(packed) = self.node(node) else { break };
            if Self::lcheck(packed) != c as u32 {
                break;
            }
            node ^= Self::base(packed);
            if Self::leaf(packed) {
                let Some(v) = self.node(node) else { break };
                found = Some((i + 1, Self::value(v) as usize));
            }
        }
        let (len, offset) = found?;
        let rest = self.replacements.get(offset..)?;
        let end = rest.iter().position(|&b| b == 0)?; // unterminated: no replacement
        Some((len, &rest[..end]))
    }
}

/// Whether a charsmap blob's sizes fit, as llama.cpp checks when it loads one: the header, the
/// trie, and at least one byte of strings. An empty blob is no map at all.
pub(crate) fn check_charsmap(blob: &[u8]) -> bool {
    blob.is_empty() || CharsMap::parse(blob).is_some()
}
