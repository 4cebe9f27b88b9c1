//! Constrained greedy decoding against llama.cpp's: the reference pipeline ran llama.cpp on
//! the default model with a grammar sampler in front of greedy (`grammar/constrained.json`:
//! JSON, a JSON array, schemas, small grammars, characters split across tokens). Teacher-forced
//! on llama.cpp's tokens, at every step:
//!
//! - our mask allows exactly as many tokens as llama.cpp's grammar sampler left (the same set
//!   is checked token by token in `masks.rs`; the count catches a different vocabulary rule);
//! - llama.cpp's token is one we allow;
//! - our most likely allowed token is llama.cpp's, except at near-ties (chapter 6's rule: a
//!   quantized model's logits differ from llama.cpp's by a little).

use ch04::TokenRule;
use ch06::agreement::{TIE_MARGIN, check_tie_fraction};
use ch15::{Constraint, Grammar};
use testkit::refdata;

mod common;

fn u32s(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("an array of ids")
        .iter()
        .map(|x| x.as_u64().expect("an id") as u32)
        .collect()
}

#[test]
fn constrained_greedy_decoding_follows_llama_cpp() {
    let json = refdata::json("grammar/constrained.json").unwrap_or_else(|e| panic!("{e}"));
    let cases = json["cases"].as_array().expect("cases");
    assert!(cases.len() >= 6, "too few constrained cases");
    let engine = common::engine();
    let (model, tok) = (&engine.model, &engine.tokenizer);
    let vocab = model.config.vocab_size;
    let (mut steps, mut near_ties) = (0, 0);
    for case in cases {
        let id = case["id"].as_str().expect("id");
        let text = case["grammar"].as_str().expect("grammar");
        let grammar = Grammar::parse(text, "root").unwrap_or_else(|e| panic!("{id}: {e}"));
        let prompt = u32s(&case["prompt_ids"]);
        let cont = u32s(&case["tokens"]);
        let n_allowed = u32s(&case["n_allowed"]);
        let all: Vec<u32> = prompt.iter().chain(&cont).copied().collect();
        let logits = model
            .logits_at_every_position(&all)
            .unwrap_or_else(|e| panic!("{e}"));
        let mut rule = Constraint::new(grammar.clone())
            .state(tok)
            .unwrap_or_else(|e| panic!("{id}: {e}"));
        for (step, &want) in cont.iter().enumerate() {
            let row = &logits[(prompt.len() - 1 + step) * vocab..][..vocab];
            let mut masked = row.to_vec();
            rule.mask(&mut masked);
            let allowed = masked.iter().filter(|l| l.is_finite()).count();
            assert_eq!(
                allowed, n_allowed[step] as usize,
                "{id}, step {step}: we allow {allowed} tokens, llama.cpp {}",
                n_allowed[step]
            );
            assert!(
                rule.allows(want),
                "{id}, step {step}: llama.cpp chose token {want} {:?}, which we refuse",
                String::from_utf8_lossy(&tok.token_to_piece(want))
            );
            let best = ch04::sampling::argmax(&masked);
            if best != want as usize {
                let gap = masked[best] - masked[want as usize];
                assert!(
                    gap < TIE_MARGIN,
                    "{id}, step {step}: we pick {best}, llama.cpp {want}, {gap:.3} logits apart \
                     (tie margin {TIE_MARGIN})"
                );
                near_ties += 1;
            }
            rule.accept(want);
            steps += 1;
        }
        if case["stop"] == "eog" {
            let body = &cont[..cont.len() - 1];
            let text = tok.decode(body);
            assert!(
                grammar.matches(text.as_bytes()),
                "{id}: llama.cpp's finished text {text:?} does not match the grammar"
            );
            assert!(rule.is_complete(), "{id}: finished, but the grammar is not");
        }
    }
    check_tie_fraction(near_ties, steps).unwrap_or_else(|e| panic!("{e}"));
}
