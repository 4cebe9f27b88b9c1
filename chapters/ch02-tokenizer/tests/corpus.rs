//! `reference-data/tokenizer/corpus.json`: llama.cpp's tokenization of hard strings (runs of
//! whitespace, digits, contractions in both cases, code, accents, CJK, RTL scripts, emoji with
//! joiners, special-token texts) for the default model, Gemma 3 and every vocabulary test
//! file, with special parsing on and off and BOS/EOS on and off, and llama.cpp's pieces and
//! detokenization of the resulting ids.

mod common;

use ch02::{RegexSplitter, VocabKind};
use common::{show, unhex};
use serde_json::Value;

fn corpus() -> Value {
    testkit::refdata::json("tokenizer/corpus.json").unwrap_or_else(|e| panic!("{e}"))
}

/// Every case of vocabulary `name`: `(text, add_special, parse_special, case)`.
fn cases(corpus: &Value, name: &str) -> Vec<(String, bool, bool, Value)> {
    let strings = corpus["vocabs"][name]["strings"]
        .as_array()
        .unwrap_or_else(|| panic!("corpus.json has no strings for vocabulary {name}"));
    let mut out = Vec::new();
    for s in strings {
        let text = s["text"].as_str().expect("text is a string").to_string();
        for case in s["cases"].as_array().expect("cases is an array") {
            let flag = |k: &str| {
                case[k]
                    .as_bool()
                    .unwrap_or_else(|| panic!("case lacks {k}"))
            };
            out.push((
                text.clone(),
                flag("add_special"),
                flag("parse_special"),
                case.clone(),
            ));
        }
    }
    assert!(out.len() >= 100, "{name}: only {} cases", out.len());
    out
}

fn ids(case: &Value) -> Vec<u32> {
    case["ids"]
        .as_array()
        .expect("ids is an array")
        .iter()
        .map(|x| x.as_u64().expect("an id") as u32)
        .collect()
}

fn check_vocab(name: &str) {
    let corpus = corpus();
    let tok = common::tokenizer(name);
    let meta = &corpus["vocabs"][name];
    assert_eq!(
        tok.vocab_size() as u64,
        meta["n_tokens"].as_u64().unwrap(),
        "{name}: n_tokens"
    );
    // llama.cpp's `llama_vocab_type`.
    let vocab_type = match tok.vocab().kind {
        VocabKind::Spm => 1,
        VocabKind::Bpe(_) => 2,
        VocabKind::Wpm => 3,
        VocabKind::Ugm => 4,
    };
    assert_eq!(
        Some(vocab_type),
        meta["vocab_type"].as_u64(),
        "{name}: vocab_type"
    );
    assert_eq!(
        tok.bos().map(u64::from),
        meta["bos"].as_u64(),
        "{name}: bos"
    );
    assert_eq!(
        tok.eos().map(u64::from),
        meta["eos"].as_u64(),
        "{name}: eos"
    );
    assert_eq!(
        tok.vocab().add_bos,
        meta["add_bos"].as_bool().unwrap(),
        "{name}: add_bos"
    );
    assert_eq!(
        tok.vocab().add_eos,
        meta["add_eos"].as_bool().unwrap(),
        "{name}: add_eos"
    );

    let mut failures = Vec::new();
    let all = cases(&corpus, name);
    for (text, add_special, parse_special, case) in &all {
        let want = ids(case);
        let what = format!("{text:?} (add_special {add_special}, parse_special {parse_special})");
        let got = tok.encode(text, *add_special, *parse_special);
        if got != want {
            let at = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
            failures.push(format!(
                "encode {what}: first difference at token {at}\n  llama.cpp {want:?}\n  ours      {got:?}"
            ));
            continue;
        }
        for (i, (&id, hex)) in want
            .iter()
            .zip(case["pieces_hex"].as_array().unwrap())
            .enumerate()
        {
            let (ours, theirs) = (tok.token_to_piece(id), unhex(hex.as_str().unwrap()));
            if ours != theirs {
                failures.push(format!(
                    "piece of token {i} (id {id}) of {what}: llama.cpp {} ours {}",
                    show(&theirs),
                    show(&ours)
                ));
            }
        }
        for (key, unparse) in [("detok_hex", true), ("detok_plain_hex", false)] {
            let theirs = unhex(case[key].as_str().unwrap());
            let ours = tok.detokenize(&want, false, unparse).unwrap();
            if ours != theirs {
                failures.push(format!(
                    "{key} of {what}: llama.cpp {} ours {}",
                    show(&theirs),
                    show(&ours)
                ));
            }
        }
        let theirs =
            String::from_utf8_lossy(&unhex(case["detok_hex"].as_str().unwrap())).into_owned();
        if tok.decode(&want) != theirs {
            failures.push(format!(
                "decode of {what}: llama.cpp {theirs:?} ours {:?}",
                tok.decode(&want)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{name}: {} of {} cases differ from llama.cpp:\n{}",
        failures.len(),
        all.len(),
        failures.join("\n")
    );
}

/// One test per vocabulary of the corpus.
macro_rules! corpus_tests {
    ($($test:ident: $name:literal,)*) => {
        $(
            #[test]
            fn $test() {
                check_vocab($name);
            }
        )*

        /// Every vocabulary of the corpus has its test above.
        #[test]
        fn every_vocabulary_is_checked() {
            let corpus = corpus();
            let mut in_corpus: Vec<&str> = corpus["vocabs"]
                .as_object()
                .expect("vocabs is an object")
                .keys()
                .map(String::as_str)
                .collect();
            in_corpus.sort();
            let mut tested = vec![$($name),*];
            tested.sort();
            assert_eq!(in_corpus, tested);
        }
    };
}

corpus_tests! {
    default_model_matches_llama_cpp: "default",
    gemma3_matches_llama_cpp: "gemma-3",
    llama_spm_matches_llama_cpp: "llama-spm",
    llama_bpe_matches_llama_cpp: "llama-bpe",
    gpt2_matches_llama_cpp: "gpt-2",
    aquila_matches_llama_cpp: "aquila",
    baichuan_matches_llama_cpp: "baichuan",
    bert_bge_matches_llama_cpp: "bert-bge",
    deepseek_coder_matches_llama_cpp: "deepseek-coder",
    deepseek_llm_matches_llama_cpp: "deepseek-llm",
    falcon_matches_llama_cpp: "falcon",
    gemma4_matches_llama_cpp: "gemma-4",
    gpt_neox_matches_llama_cpp: "gpt-neox",
    mpt_matches_llama_cpp: "mpt",
    nomic_bert_moe_matches_llama_cpp: "nomic-bert-moe",
    phi3_matches_llama_cpp: "phi-3",
    qwen2_matches_llama_cpp: "qwen2",
    qwen35_matches_llama_cpp: "qwen35",
    refact_matches_llama_cpp: "refact",
    starcoder_matches_llama_cpp: "starcoder",
}

/// The regex splitter, which runs llama.cpp's regexes where llama.cpp has hand-written
/// scanners, must give the same tokens on the corpus, for every BPE vocabulary.
#[test]
fn regex_splitter_matches_llama_cpp() {
    let corpus = corpus();
    let mut failures = Vec::new();
    for name in common::VOCABS {
        let tok = common::tokenizer(name);
        let Some(pre) = tok.pre_tokenizer() else {
            continue;
        };
        let re = RegexSplitter::new(pre);
        for (text, add, parse, case) in cases(&corpus, name) {
            if tok.encode_with(&re, &text, add, parse) != ids(&case) {
                failures.push(format!(
                    "{name}: {text:?} (add_special {add}, parse_special {parse})"
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "regex splitter differs:\n{}",
        failures.join("\n")
    );
}

/// decode(encode(s)) == s wherever llama.cpp round-trips (no BOS added, special tokens parsed
/// or not); and where it does not (SentencePiece's dropped leading space, clean-up of " ,"),
/// we do not either.
#[test]
fn round_trip_where_llama_cpp_round_trips() {
    let corpus = corpus();
    let mut round_trips = 0;
    for name in common::VOCABS {
        let tok = common::tokenizer(name);
        for (text, add, parse, case) in cases(&corpus, name) {
            if add {
                continue;
            }
            let theirs = unhex(case["detok_hex"].as_str().unwrap()) == text.as_bytes();
            let ours = tok.decode(&tok.encode(&text, false, parse)) == text;
            assert_eq!(
                ours, theirs,
                "{name}: {text:?} (parse_special {parse}) round-trips in one only"
            );
            round_trips += usize::from(ours);
        }
    }
    assert!(round_trips > 1500, "only {round_trips} round trips");
}
