//! llama.cpp's own tokenizer tests (`tests/test-tokenizer-0.cpp`): for each vocabulary-only
//! model, a `.inp` file of strings separated by `\n__ggml_vocab_test__\n` and a `.out` file
//! with the expected ids of each string on one line (encoded without BOS/EOS, without
//! special-token parsing).

mod common;

use ch02::RegexSplitter;

const SEPARATOR: &str = "\n__ggml_vocab_test__\n";

fn check(name: &str) {
    let read = |ext: &str| {
        let rel = format!("tokenizer/ggml-vocab-{name}.gguf.{ext}");
        let bytes = shared::refdata::read(&rel).unwrap_or_else(|e| panic!("{e}"));
        String::from_utf8(bytes).unwrap_or_else(|e| panic!("{rel} is not UTF-8: {e}"))
    };
    let (inp, out) = (read("inp"), read("out"));
    // As test-tokenizer-0.cpp splits: the file ends with a separator, not an empty test.
    let mut inputs = Vec::new();
    let mut rest = inp.as_str();
    while !rest.is_empty() {
        match rest.find(SEPARATOR) {
            Some(n) => {
                inputs.push(&rest[..n]);
                rest = &rest[n + SEPARATOR.len()..];
            }
            None => {
                inputs.push(rest);
                rest = "";
            }
        }
    }
    let expected: Vec<Vec<u32>> = out
        .lines()
        .map(|l| {
            l.split_whitespace()
                .map(|t| t.parse().expect("a token id"))
                .collect()
        })
        .collect();
    assert_eq!(
        inputs.len(),
        expected.len(),
        "{name}: .inp and .out disagree on the number of tests"
    );
    assert!(inputs.len() > 30, "{name}: only {} tests", inputs.len());

    let tok = common::tokenizer(name);
    let regex = tok.pre_tokenizer().map(RegexSplitter::new);
    let mut failures = Vec::new();
    for (text, want) in inputs.iter().zip(&expected) {
        let got = tok.encode(text, false, false);
        if &got != want {
            failures.push(format!(
                "{text:?}\n  llama.cpp {want:?}\n  ours      {got:?}"
            ));
        }
        if let Some(re) = &regex {
            let by_regex = tok.encode_with(re, text, false, false);
            if &by_regex != want {
                failures.push(format!(
                    "(regex splitter) {text:?}\n  llama.cpp {want:?}\n  ours      {by_regex:?}"
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{name}: {} of {} strings tokenize differently:\n{}",
        failures.len(),
        inputs.len(),
        failures.join("\n")
    );
}

#[test]
fn llama_spm_matches_llama_cpp_test_file() {
    check("llama-spm");
}

#[test]
fn llama_bpe_matches_llama_cpp_test_file() {
    check("llama-bpe");
}

#[test]
fn gpt2_matches_llama_cpp_test_file() {
    check("gpt-2");
}
