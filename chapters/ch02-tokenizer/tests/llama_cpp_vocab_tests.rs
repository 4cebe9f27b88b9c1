//! llama.cpp's own tokenizer tests (`tests/test-tokenizer-0.cpp`): for each vocabulary-only
//! model, a `.inp` file of strings separated by `\n__ggml_vocab_test__\n` and a `.out` file
//! with the expected ids of each string on one line (encoded without BOS/EOS, without
//! special-token parsing). For the four vocabularies llama.cpp ships without tests (aquila,
//! baichuan, gpt-neox, nomic-bert-moe) the export wrote llama-spm's strings with llama.cpp's
//! ids.

mod common;

use ch02::RegexSplitter;

const SEPARATOR: &str = "\n__ggml_vocab_test__\n";

fn check(name: &str) {
    let read = |ext: &str| {
        let rel = format!("tokenizer/ggml-vocab-{name}.gguf.{ext}");
        let bytes = testkit::refdata::read(&rel).unwrap_or_else(|e| panic!("{e}"));
        String::from_utf8(bytes).unwrap_or_else(|e| panic!("{rel} is not UTF-8: {e}"))
    };
    let (inp, out) = (read("inp"), read("out"));
    // As test-tokenizer-0.cpp splits: the file ends with a separator (or, in Gemma 4's, not),
    // not an empty test.
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

/// One test per vocabulary file.
macro_rules! vocab_tests {
    ($($test:ident: $name:literal,)*) => {
        $(
            #[test]
            fn $test() {
                check($name);
            }
        )*

        /// Every test file in `reference-data/tokenizer/` has its test above.
        #[test]
        fn every_test_file_is_checked() {
            let dir = testkit::refdata::path("tokenizer").unwrap_or_else(|e| panic!("{e}"));
            let mut files: Vec<String> = std::fs::read_dir(&dir)
                .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
                .filter_map(|e| {
                    let name = e.ok()?.file_name().into_string().ok()?;
                    Some(name.strip_prefix("ggml-vocab-")?.strip_suffix(".gguf.inp")?.to_string())
                })
                .collect();
            files.sort();
            let mut tested = vec![$($name.to_string()),*];
            tested.sort();
            assert_eq!(files, tested);
        }
    };
}

vocab_tests! {
    llama_spm_matches_llama_cpp_test_file: "llama-spm",
    llama_bpe_matches_llama_cpp_test_file: "llama-bpe",
    gpt2_matches_llama_cpp_test_file: "gpt-2",
    aquila_matches_llama_cpp: "aquila",
    baichuan_matches_llama_cpp: "baichuan",
    bert_bge_matches_llama_cpp_test_file: "bert-bge",
    deepseek_coder_matches_llama_cpp_test_file: "deepseek-coder",
    deepseek_llm_matches_llama_cpp_test_file: "deepseek-llm",
    falcon_matches_llama_cpp_test_file: "falcon",
    gemma4_matches_llama_cpp_test_file: "gemma-4",
    gpt_neox_matches_llama_cpp: "gpt-neox",
    mpt_matches_llama_cpp_test_file: "mpt",
    nomic_bert_moe_matches_llama_cpp: "nomic-bert-moe",
    phi3_matches_llama_cpp_test_file: "phi-3",
    qwen2_matches_llama_cpp_test_file: "qwen2",
    qwen35_matches_llama_cpp_test_file: "qwen35",
    refact_matches_llama_cpp_test_file: "refact",
    starcoder_matches_llama_cpp_test_file: "starcoder",
}
