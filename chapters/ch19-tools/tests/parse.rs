//! The streaming parser against llama.cpp's chat-parser vectors (`tests/data/`, from its
//! `tests/test-chat.cpp`): the whole text parsed at once gives llama.cpp's message, and so does
//! the text fed in every possible way of cutting it — one character at a time, as llama.cpp's
//! own test feeds its parser every prefix, and at random cuts — with every delta adding to
//! the message (nothing taken back).

use ch02::ChatTemplate;
use ch19::conversation::Caps;
use ch19::format::Format;
use ch19::parse::{Delta, Options, Parsed, Parser};
use proptest::prelude::*;
use serde::Deserialize;
use serde_json::Value;
use testkit::refdata;

#[derive(Deserialize, Clone, Debug)]
struct Case {
    source: String,
    template: String,
    input: String,
    thinking_open: bool,
    reasoning: bool,
    tools: bool,
    expect: Expect,
}

#[derive(Deserialize, Clone, Debug)]
struct Expect {
    content: String,
    reasoning: String,
    calls: Vec<Value>,
}

fn cases() -> Vec<Case> {
    #[derive(Deserialize)]
    struct File {
        cases: Vec<Case>,
    }
    let text = include_str!("data/llama_cpp_chat_parser.json");
    serde_json::from_str::<File>(text).expect("cases").cases
}

/// The format of a reference template, as the server finds it.
fn format_of(template: &str) -> Format {
    let source = String::from_utf8(
        refdata::read(&format!("tools/templates/{template}.jinja"))
            .unwrap_or_else(|e| panic!("{e}")),
    )
    .expect("UTF-8");
    let t = ChatTemplate::new(&source, "<s>", "</s>").unwrap_or_else(|e| panic!("{e}"));
    Format::detect(&source, Caps::probe(&t))
}

fn options(c: &Case) -> Options {
    Options {
        reasoning: c.reasoning,
        calls: c.tools,
        thinking_open: c.thinking_open,
    }
}

/// Whether `got` is llama.cpp's message: the same content and reasoning, the same calls by
/// name, arguments (as JSON) and id where llama.cpp has one.
fn check(c: &Case, got: &Parsed, how: &str) {
    let what = format!("{} ({}, {how}): {:?}", c.source, c.template, c.input);
    assert_eq!(got.content, c.expect.content, "content of {what}");
    assert_eq!(got.reasoning, c.expect.reasoning, "reasoning of {what}");
    assert_eq!(
        got.calls.len(),
        c.expect.calls.len(),
        "calls of {what}: {:?}",
        got.calls
    );
    for (g, w) in got.calls.iter().zip(&c.expect.calls) {
        assert_eq!(g.name, w["name"], "name of a call of {what}");
        let args: Value = serde_json::from_str(&g.arguments)
            .unwrap_or_else(|e| panic!("arguments of {what}: {e}: {:?}", g.arguments));
        assert_eq!(args, w["arguments"], "arguments of {what}");
        match w.get("id") {
            Some(id) => assert_eq!(g.id, *id, "id of {what}"),
            None => assert!(!g.id.is_empty(), "a call of {what} has no id"),
        }
    }
}

/// `input` fed in the pieces `cuts` makes (byte offsets, kept to character boundaries).
fn streamed(format: Format, options: Options, input: &str, cuts: &[usize]) -> Parsed {
    let mut p = Parser::new(format, options);
    let mut whole = Parsed::default();
    let mut at = 0;
    let mut feed = |deltas: Vec<Delta>| {
        for d in &deltas {
            whole.apply(d);
        }
    };
    for &cut in cuts.iter().chain(std::iter::once(&input.len())) {
        let mut cut = cut.min(input.len()).max(at);
        while !input.is_char_boundary(cut) {
            cut += 1;
        }
        feed(p.push(&input[at..cut]));
        at = cut;
    }
    feed(p.finish());
    assert_eq!(
        &whole,
        p.parsed(),
        "the deltas add up to the parser's message"
    );
    whole
}

#[test]
fn whole_texts_parse_as_llama_cpp_parses_them() {
    let cases = cases();
    assert!(cases.len() >= 20);
    for c in &cases {
        let got = Parser::parse(format_of(&c.template), options(c), &c.input);
        check(c, &got, "whole");
    }
}

#[test]
fn a_character_at_a_time_gives_the_same_message() {
    for c in &cases() {
        let cuts: Vec<usize> = (1..c.input.len()).collect();
        let got = streamed(format_of(&c.template), options(c), &c.input, &cuts);
        check(c, &got, "one character at a time");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    #[test]
    fn random_cuts_give_the_same_message(seed in any::<u64>(), n in 1usize..8) {
        for c in &cases() {
            let len = c.input.len().max(1) as u64;
            let mut cuts: Vec<usize> = (0..n as u64)
                .map(|k| (seed.wrapping_mul(k * 2 + 1).rotate_left(k as u32 * 7) % len) as usize)
                .collect();
            cuts.sort_unstable();
            let got = streamed(format_of(&c.template), options(c), &c.input, &cuts);
            check(c, &got, &format!("cut at {cuts:?}"));
        }
    }
}
