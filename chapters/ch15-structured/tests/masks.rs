//! The mask from the token trie is exactly the set of tokens the matcher accepts one by one,
//! on the default model's real vocabulary, at states along JSON documents — split characters,
//! strings, numbers, nesting and the finished document included.

use ch01::GgufFile;
use ch02::Tokenizer;
use ch15::matcher::feed;
use ch15::matcher::{Matcher, Scratch};
use ch15::{Grammar, TokenIndex};
use std::sync::Arc;
use testkit::refdata;

mod common;

fn json_grammar() -> Grammar {
    let text = refdata::read("grammar/gbnf/json.gbnf").unwrap_or_else(|e| panic!("{e}"));
    Grammar::parse(std::str::from_utf8(&text).expect("utf-8"), "root").expect("json.gbnf")
}

#[test]
fn the_trie_mask_is_every_token_the_matcher_accepts() {
    let tok = common::tokenizer();
    let index = TokenIndex::new(&tok);
    let g = Arc::new(json_grammar());
    let doc = "{\"name\": \"Zoë ☃\", \"n\": [1, -2.5e3, true], \"o\": {}}";
    let bytes = doc.as_bytes();
    // States after these prefixes: the start, inside a key, in a string between the two bytes
    // of `ë`, after a number's digit, in an array, and the whole document.
    let cuts = [0, 3, 13, 14, 30, 33, 40, bytes.len()];
    let mut s = Scratch::default();
    for &cut in &cuts {
        let mut m = Matcher::new(g.clone()).expect("start");
        m.accept_bytes(&bytes[..cut])
            .unwrap_or_else(|e| panic!("prefix {cut}: {e}"));
        let mask = index.allowed(&g, &m.stacks, m.partial);
        let mut n_allowed = 0;
        for t in 0..tok.vocab_size() as u32 {
            let piece = tok.token_to_piece(t);
            let want = !tok.is_eog(t)
                && !piece.is_empty()
                && piece[0] != 0
                && feed(&g, &m.stacks, m.partial, &piece, &mut s).is_ok();
            let got = mask[t as usize / 64] >> (t % 64) & 1 == 1;
            assert_eq!(
                got,
                want,
                "prefix {:?}: token {t} {:?}",
                &doc[..doc.floor_char_boundary(cut)],
                String::from_utf8_lossy(&piece)
            );
            n_allowed += want as usize;
        }
        // The property could hold trivially with an empty or a full mask: it is neither.
        if cut < bytes.len() {
            assert!(n_allowed > 0, "prefix {cut}: nothing allowed");
        }
        assert!(
            n_allowed < tok.vocab_size(),
            "prefix {cut}: everything allowed"
        );
    }
}

#[test]
fn each_vocabulary_gets_its_own_trie_built_once() {
    let smol = common::tokenizer();
    let gemma_path = shared::ensure_cached(&shared::GEMMA3_MODEL).unwrap_or_else(|e| panic!("{e}"));
    let file = GgufFile::open(&gemma_path).unwrap_or_else(|e| panic!("{e}"));
    let gemma = Tokenizer::from_gguf(&file.gguf).unwrap_or_else(|e| panic!("{e}"));
    let cell = ch15::mask::IndexCell::default();
    let a = cell.get(&smol);
    let b = cell.get(&gemma);
    assert_eq!(
        (a.n_vocab(), b.n_vocab()),
        (smol.vocab_size(), gemma.vocab_size())
    );
    assert!(
        Arc::ptr_eq(&a, &cell.get(&smol)),
        "built again for the same vocabulary"
    );
    assert!(
        Arc::ptr_eq(&b, &cell.get(&gemma)),
        "built again for the same vocabulary"
    );
}
