//! Any bytes as text for the default model's tokenizer (SmolLM2's byte-level BPE): encoding
//! never panics and gives ids inside the vocabulary; decoding gives the text back, less the
//! bytes the vocabulary has no token for (llama.cpp drops them too); any id sequence decodes.
//!
//! The first byte chooses the encoding flags, the rest is the text, as lossy UTF-8.

#![no_main]

use ch02::Tokenizer;
use ch01::GgufFile;
use ch02::unicode::byte_to_char;
use libfuzzer_sys::fuzz_target;
use std::sync::LazyLock;

/// Built once per process from the default model's metadata (fetched on first use).
static TOKENIZER: LazyLock<Tokenizer> = LazyLock::new(|| {
    let path = shared::default_model_path().unwrap_or_else(|e| panic!("{e}"));
    let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{e}"));
    let tok = Tokenizer::from_gguf(&file.gguf).unwrap_or_else(|e| panic!("{e}"));
    // The round trip below holds for byte-level BPE without space clean-up.
    assert!(tok.bpe().is_some() && !tok.vocab().clean_spaces);
    tok
});

fuzz_target!(|data: &[u8]| {
    let tok = &*TOKENIZER;
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let (add_special, parse_special) = (flags & 1 != 0, flags & 2 != 0);
    let text = String::from_utf8_lossy(rest);
    let ids = tok.encode(&text, add_special, parse_special);
    let n = tok.vocab_size();
    assert!(ids.iter().all(|&id| (id as usize) < n), "{ids:?}");
    let decoded = tok.decode(&ids);
    if !add_special && !parse_special {
        let has_token = |b: &u8| {
            tok.vocab()
                .text_to_token(&byte_to_char(*b).to_string())
                .is_some()
        };
        let kept: Vec<u8> = text.bytes().filter(has_token).collect();
        assert_eq!(
            decoded,
            String::from_utf8_lossy(&kept),
            "text {text:?}, ids {ids:?}"
        );
    }
    // The same bytes as ids, some past the vocabulary.
    let ids: Vec<u32> = rest
        .chunks(2)
        .map(|c| c.iter().fold(0u32, |a, &b| a << 8 | b as u32))
        .collect();
    let _ = tok.decode(&ids);
    let _ = tok.detokenize(&ids, add_special, true);
});
