//! Any bytes as a GGUF file, then its `tokenizer.ggml.*` metadata as a vocabulary:
//! `Tokenizer::from_gguf` never panics, and a tokenizer it builds encodes and decodes text
//! without panicking and gives ids inside its vocabulary.

#![no_main]

use ch02::Tokenizer;
use ch01::Gguf;
use libfuzzer_sys::fuzz_target;

/// Text that reaches every part of encoding: words, digits, contractions, whitespace runs,
/// characters outside ASCII, and special-token texts of the common vocabularies.
const TEXTS: &[&str] = &[
    "",
    " ",
    "Hello world, it's 2024!\n\n  x",
    "<|im_start|>user\nhé 👍<|im_end|><s></s><unk>",
    "\u{3000}龘\r\n'LL ",
];

fuzz_target!(|bytes: &[u8]| {
    let Ok(gguf) = Gguf::parse(bytes) else {
        return;
    };
    let Ok(tok) = Tokenizer::from_gguf(&gguf) else {
        return;
    };
    let n = tok.vocab_size();
    for text in TEXTS {
        for (add, parse) in [(false, false), (true, true)] {
            let ids = tok.encode(text, add, parse);
            assert!(
                ids.iter().all(|&id| (id as usize) < n),
                "{ids:?} (n_vocab {n})"
            );
            let _ = tok.decode(&ids);
            let _ = tok.detokenize(&ids, add, parse);
        }
    }
    // Ids past the vocabulary decode to U+FFFD and detokenize to an error.
    let outside = [0, n as u32, u32::MAX];
    let _ = tok.decode(&outside);
    assert!(n == 0 || tok.detokenize(&outside, false, true).is_err());
});
