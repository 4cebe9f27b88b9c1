//! Hostile grammars and schemas, through [`compile`] (what the command line and the server
//! call): each is a clear error naming the problem, or bounded work under a named limit —
//! never a hang, a stack overflow or unbounded memory.

use ch15::gbnf::{MAX_GRAMMAR_BYTES, MAX_GROUP_DEPTH};
use ch15::matcher::{MAX_STACKS, MatchError, Matcher};
use ch15::{Source, compile};
use std::sync::Arc;

mod common;

fn grammar_error(text: &str) -> String {
    match compile(&Source::Grammar(text.to_string())) {
        Ok(_) => panic!("{:.80}: compiled", text),
        Err(e) => e.to_string(),
    }
}

fn schema_error(text: &str) -> String {
    match compile(&Source::JsonSchema(text.to_string())) {
        Ok(_) => panic!("{:.80}: compiled", text),
        Err(e) => e.to_string(),
    }
}

#[test]
fn left_recursion_and_empty_languages_are_named() {
    let e = grammar_error("root ::= expr\nexpr ::= expr \"+\" term | term\nterm ::= [0-9]");
    assert!(e.contains("`expr` is left-recursive"), "{e}");
    let e = grammar_error("root ::= \"(\" root \")\"");
    assert!(e.contains("accepts no text"), "{e}");
    let e = grammar_error("root ::= [^\\x00-\\U0010FFFF]+");
    assert!(e.contains("accepts no text"), "{e}");
}

#[test]
fn size_and_nesting_are_bounded() {
    let big = format!("root ::= \"{}\"", "x".repeat(10 << 20));
    let e = grammar_error(&big);
    assert!(e.contains(&MAX_GRAMMAR_BYTES.to_string()), "{e}");
    let deep = format!("root ::= {}\"x\"{}", "(".repeat(10_000), ")".repeat(10_000));
    let e = grammar_error(&deep);
    assert!(
        e.contains(&format!("nested more than {MAX_GROUP_DEPTH}")),
        "{e}"
    );
    let e = grammar_error("root ::= \"x\"{1000000}");
    assert!(e.contains("at most 2000"), "{e}");
    // A schema nested 10,000 deep, as text (the server's form).
    let nested = format!(
        "{}{{\"type\": \"string\"}}{}",
        "{\"type\": \"array\", \"items\": ".repeat(10_000),
        "}".repeat(10_000)
    );
    let e = schema_error(&nested);
    assert!(e.contains("MAX_"), "{e}");
    let e = schema_error(r#"{"type": "array", "maxItems": 1000000000}"#);
    assert!(e.contains("MAX_REPETITION") || e.contains("2000"), "{e}");
    let e = schema_error(r#"{"type": "object", "propertees": {}}"#);
    assert!(e.contains("propertees"), "{e}");
}

#[test]
fn an_ambiguous_grammar_is_bounded_not_exponential() {
    // After each "a" either "x" or "y" is owed: a run of k "a"s has 2^k readings. The
    // matcher follows at most MAX_STACKS of them, then says so.
    let g = compile(&Source::Grammar(
        "root ::= s\ns ::= \"a\" s \"x\" | \"a\" s \"y\" | \"b\"".to_string(),
    ))
    .expect("a valid grammar");
    let mut m = Matcher::new(Arc::new(g)).expect("start");
    let mut refused = None;
    for i in 0..200 {
        match m.accept_bytes(b"a") {
            Ok(()) => assert!(m.stacks.len() <= MAX_STACKS),
            Err(e) => {
                refused = Some((i, e));
                break;
            }
        }
    }
    let (at, e) = refused.expect("the readings outgrow the limit within 200 characters");
    assert_eq!(e, MatchError::TooManyStacks, "after {at} characters");
}

#[test]
fn a_mask_over_thousands_of_readings_is_bounded() {
    // Like the grammar above, but any letter opens a reading: after ten letters, thousands of
    // readings, and most of the vocabulary's letter tokens fit each of them. The walk goes
    // through all of them at every node until the mask's work limit (or, a letter later, the
    // readings' limit) stops it; then no token is allowed, and generation ends there. (Work is
    // counted, not timed: the same every run.)
    let tok = common::tokenizer();
    let index = ch15::TokenIndex::new(&tok);
    let g = compile(&Source::Grammar(
        "root ::= s\ns ::= [a-z] s \"x\" | [a-z] s \"y\" | \"b\"".to_string(),
    ))
    .expect("a valid grammar");
    let mut m = Matcher::new(Arc::new(g.clone())).expect("start");
    m.accept_bytes(b"aaaaaaaaaa").expect("ten letters");
    assert!(m.stacks.len() > 1000, "{} readings", m.stacks.len());
    let bits = index.allowed(&g, &m.stacks, m.partial);
    let allowed: u32 = bits.iter().map(|w| w.count_ones()).sum();
    assert_eq!(
        allowed, 0,
        "the walk should have run into MAX_MASK_WORK or MAX_STACKS"
    );
}
