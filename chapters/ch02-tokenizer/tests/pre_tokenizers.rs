//! Every `tokenizer.ggml.pre` value llama.cpp knows, checked against llama.cpp: the
//! `pre_tokenizers` section of `reference-data/tokenizer/corpus.json` has llama.cpp's ids of
//! the corpus strings on the GPT-2 vocabulary with each value in its metadata. GPT-2's merges
//! never cross a word boundary, so a different split gives different ids; BOS shows the
//! flags that add it, and the decoding of a probe string shows whether spaces are cleaned up.

mod common;

use ch02::pretokenize::PRE_NAMES;
use ch02::{RegexSplitter, Tokenizer, Vocab, VocabOptions};
use common::{show, unhex};
use serde_json::Value;
use std::collections::BTreeSet;

fn section() -> Value {
    let corpus = testkit::refdata::json("tokenizer/corpus.json").unwrap_or_else(|e| panic!("{e}"));
    corpus["pre_tokenizers"].clone()
}

/// The GPT-2 vocabulary with `pre` as its `tokenizer.ggml.pre` (`None`: the key absent).
fn tokenizer(pre: Option<&str>) -> Tokenizer {
    let file = common::gguf("gpt-2");
    let mut opts = VocabOptions::from_gguf(&file.gguf).unwrap_or_else(|e| panic!("{e}"));
    opts.pre = pre.map(String::from);
    let vocab = Vocab::from_gguf_with(&file.gguf, &opts)
        .unwrap_or_else(|e| panic!("the GPT-2 vocabulary with pre-tokenizer {pre:?}: {e}"));
    Tokenizer::new(vocab)
}

#[test]
fn every_llama_cpp_name_is_in_the_table_and_no_other() {
    let section = section();
    let theirs: BTreeSet<&str> = section["names"]
        .as_object()
        .expect("names is an object")
        .keys()
        .map(String::as_str)
        .filter(|n| *n != "absent")
        .collect();
    let ours: BTreeSet<&str> = PRE_NAMES
        .iter()
        .flat_map(|row| row.names)
        .copied()
        .collect();
    assert_eq!(theirs, ours);
}

#[test]
fn every_pre_tokenizer_matches_llama_cpp() {
    let section = section();
    let strings: Vec<&str> = section["strings"]
        .as_array()
        .expect("strings is an array")
        .iter()
        .map(|s| s.as_str().expect("a string"))
        .collect();
    let probe = section["clean_probe"].as_str().expect("clean_probe");
    let mut failures = Vec::new();
    let mut checked = 0;
    for (name, case) in section["names"].as_object().expect("names is an object") {
        let pre = (name != "absent").then_some(name.as_str());
        let tok = tokenizer(pre);
        let regex = RegexSplitter::new(tok.pre_tokenizer().expect("a BPE vocabulary"));
        let ids = case["ids"].as_array().expect("ids is an array");
        assert_eq!(ids.len(), strings.len(), "{name}: one id list per string");
        for (text, want) in strings.iter().zip(ids) {
            // null: llama.cpp aborts on this string (see the section's "about").
            let Some(want) = want.as_array() else {
                continue;
            };
            let want: Vec<u32> = want.iter().map(|x| x.as_u64().unwrap() as u32).collect();
            let got = tok.encode(text, true, false);
            if got != want {
                failures.push(format!(
                    "{name}: {text:?}\n  llama.cpp {want:?}\n  ours      {got:?}"
                ));
            }
            let by_regex = tok.encode_with(&regex, text, true, false);
            if by_regex != want {
                failures.push(format!("{name} (regex splitter): {text:?}"));
            }
            checked += 1;
        }
        if let Some(hex) = case["probe_detok_hex"].as_str() {
            let ours = tok
                .detokenize(&tok.encode(probe, false, false), false, true)
                .unwrap();
            if ours != unhex(hex) {
                failures.push(format!(
                    "{name}: decoding the probe, llama.cpp {} ours {}",
                    show(&unhex(hex)),
                    show(&ours)
                ));
            }
        }
    }
    assert!(checked > 5000, "only {checked} strings checked");
    assert!(
        failures.is_empty(),
        "{} differences from llama.cpp:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
