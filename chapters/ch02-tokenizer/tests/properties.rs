//! Properties over generated inputs: no input makes the tokenizer panic; every pre-tokenizer
//! cuts text into pieces that put back together give the text, the same with its scanners as
//! with regexes; streaming detokenization equals one-shot detokenization for any id sequence.

mod common;

use ch02::pretokenize::PRE_NAMES;
use ch02::unicode::byte_to_char;
use ch02::{RegexSplitter, Splitter, StreamDecoder, Tokenizer};
use proptest::prelude::*;
use std::sync::LazyLock;

/// Every pre-tokenizer rule, both ways, built once.
static SPLITTERS: LazyLock<Vec<(Splitter, RegexSplitter)>> = LazyLock::new(|| {
    let mut rules = Vec::new();
    for row in PRE_NAMES {
        if !rules.contains(&row.pre) {
            rules.push(row.pre);
        }
    }
    rules
        .into_iter()
        .map(|pre| (Splitter::new(pre), RegexSplitter::new(pre)))
        .collect()
});

/// Text that stresses the splitters and merges: any Unicode, plus pieces that trigger their
/// rules (contractions, digit runs, whitespace runs, special-token texts).
fn text() -> impl Strategy<Value = String> {
    let atom = prop_oneof![
        any::<char>().prop_map(String::from),
        Just("'s".to_string()),
        Just("'LL".to_string()),
        Just("  ".to_string()),
        Just("\r\n".to_string()),
        Just("\u{3000}".to_string()),
        Just("12345".to_string()),
        Just("<|im_start|>".to_string()),
        Just("<s>".to_string()),
        Just("e\u{301}".to_string()),
        Just("漢字".to_string()),
        Just("ＡＢ".to_string()),
        "[a-zA-Z]{1,8}",
        "[ .,!?']{1,3}",
    ];
    prop::collection::vec(atom, 0..24).prop_map(|v| v.concat())
}

/// One-shot detokenization, as llama.cpp's `common_detokenize`, then lossy UTF-8.
fn one_shot(tok: &Tokenizer, ids: &[u32]) -> String {
    String::from_utf8_lossy(&tok.detokenize(ids, false, true).unwrap()).into_owned()
}

/// Ids that make detokenization hard: single bytes of multi-byte characters, spaces,
/// apostrophes and punctuation (space clean-up), special tokens; and any id at all.
fn ids(tok: &'static Tokenizer) -> impl Strategy<Value = Vec<u32>> {
    let tricky: Vec<u32> = [
        "é",
        "👍",
        " ",
        "'",
        " '",
        "s",
        "re",
        " ,",
        ".",
        "?",
        "\n",
        "<s>",
        "<|endoftext|>",
    ]
    .iter()
    .flat_map(|s| tok.encode(s, false, true))
    .collect();
    let n = tok.vocab_size() as u32;
    let id = prop_oneof![0..n, prop::sample::select(tricky)];
    prop::collection::vec(id, 0..40)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn encoding_never_panics(s in text(), add in any::<bool>(), parse in any::<bool>()) {
        for name in common::VOCABS {
            let tok = common::tokenizer(name);
            let ids = tok.encode(&s, add, parse);
            prop_assert!(ids.iter().all(|&id| (id as usize) < tok.vocab_size()));
        }
    }

    /// Byte-level BPE without space clean-up loses nothing but the bytes that have no token
    /// (SmolLM2's vocabulary lacks 21 of the 256, such as 0xF1: llama.cpp drops them).
    #[test]
    fn default_model_round_trips_any_text_but_bytes_without_token(s in text()) {
        let tok = common::tokenizer("default");
        let has_token = |b: &u8| tok.vocab().text_to_token(&byte_to_char(*b).to_string()).is_some();
        let kept: Vec<u8> = s.bytes().filter(has_token).collect();
        prop_assert_eq!(tok.decode(&tok.encode(&s, false, false)), String::from_utf8_lossy(&kept));
    }

    /// Every rule's pieces put back together give the text, and where llama.cpp has a
    /// scanner the scanner cuts where the regex does.
    #[test]
    fn pre_tokenizer_pieces_tile_the_text(s in text()) {
        for (splitter, regex) in SPLITTERS.iter() {
            let pre = splitter.pre_tokenizer();
            let pieces = splitter.pieces(&s);
            prop_assert!(pieces.iter().all(|p| !p.is_empty()), "{:?}: empty piece in {:?}", pre, pieces);
            prop_assert_eq!(pieces.concat(), s.clone());
            prop_assert_eq!(&pieces, &regex.pieces(&s), "{:?}: scanner and regex differ", pre);
        }
    }

    #[test]
    fn streaming_equals_one_shot_gpt2(ids in ids(common::tokenizer("gpt-2"))) {
        let tok = common::tokenizer("gpt-2");
        prop_assert_eq!(stream(tok, &ids), one_shot(tok, &ids));
    }

    #[test]
    fn streaming_equals_one_shot_llama_spm(ids in ids(common::tokenizer("llama-spm"))) {
        let tok = common::tokenizer("llama-spm");
        prop_assert_eq!(stream(tok, &ids), one_shot(tok, &ids));
    }

    #[test]
    fn streaming_equals_one_shot_wordpiece(ids in ids(common::tokenizer("bert-bge"))) {
        let tok = common::tokenizer("bert-bge");
        prop_assert_eq!(stream(tok, &ids), one_shot(tok, &ids));
    }

    #[test]
    fn streaming_equals_one_shot_unigram(ids in ids(common::tokenizer("nomic-bert-moe"))) {
        let tok = common::tokenizer("nomic-bert-moe");
        prop_assert_eq!(stream(tok, &ids), one_shot(tok, &ids));
    }

    #[test]
    fn streaming_equals_one_shot_gemma4(ids in ids(common::tokenizer("gemma-4"))) {
        let tok = common::tokenizer("gemma-4");
        prop_assert_eq!(stream(tok, &ids), one_shot(tok, &ids));
    }

    #[test]
    fn streaming_equals_one_shot_default(ids in ids(common::tokenizer("default"))) {
        let tok = common::tokenizer("default");
        prop_assert_eq!(stream(tok, &ids), one_shot(tok, &ids));
    }
}

/// Decode by pushing one id at a time; every returned chunk must be whole characters that
/// later tokens cannot change.
fn stream(tok: &Tokenizer, ids: &[u32]) -> String {
    let mut d = StreamDecoder::new(tok);
    let mut out = String::new();
    for &id in ids {
        out.push_str(&d.push(id));
    }
    out + &d.finish()
}

#[test]
fn stream_holds_back_a_split_character_until_it_is_complete() {
    let tok = common::tokenizer("llama-spm");
    // '龘' has no token there: it is spelled as its three UTF-8 bytes, <0xE9> <0xBE> <0x98>.
    let ids = tok.encode("龘", false, false);
    let is_byte_token = |id: &u32| tok.token_text(*id).unwrap().starts_with("<0x");
    let bytes: Vec<u32> = ids.iter().copied().filter(is_byte_token).collect();
    assert_eq!(bytes.len(), 3, "{ids:?}");
    let mut d = StreamDecoder::new(tok);
    assert_eq!(d.push(bytes[0]), "");
    assert_eq!(d.push(bytes[1]), "");
    assert_eq!(d.push(bytes[2]), "龘");
    assert_eq!(d.finish(), "");
    // Cut off, the incomplete character becomes U+FFFD at the end, not before.
    let mut d = StreamDecoder::new(tok);
    assert_eq!(d.push(bytes[0]) + &d.push(bytes[1]), "");
    assert_eq!(d.finish(), "\u{FFFD}");
}

#[test]
fn stream_holds_back_a_space_that_clean_up_may_remove() {
    let tok = common::tokenizer("gpt-2"); // cleans " ," to ","
    let id = |t: &str| tok.vocab().text_to_token(t).unwrap();
    let mut d = StreamDecoder::new(tok);
    assert_eq!(d.push(id("Hi")), "Hi");
    assert_eq!(d.push(id("Ġ")), "", "the space waits: a comma may follow");
    // Still held: the clean-up rules look up to two bytes around a space or apostrophe.
    assert_eq!(d.push(id(",")), "");
    assert_eq!(d.push(id("Ġthere")), ", there");
    assert_eq!(d.finish(), "");
    assert_eq!(
        one_shot(tok, &[id("Hi"), id("Ġ"), id(","), id("Ġthere")]),
        "Hi, there"
    );
}
