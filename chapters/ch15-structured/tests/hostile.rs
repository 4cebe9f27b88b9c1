//! Hostile grammars and schemas, through [`compile`] (what the command line and the server
//! call): each is a clear error naming the problem, or bounded work under a named limit —
//! never a hang, a stack overflow or unbounded memory. Grammars at the size limit compile (how
//! fast, `cargo bench -p ch15 --bench compile` shows: tests read no clock), and a compile stops
//! when asked to.

use ch15::formats::compile_until;
use ch15::gbnf::{MAX_GRAMMAR_BYTES, MAX_GROUP_DEPTH, STOP_CHECK_STEPS};
use ch15::matcher::{MAX_STACKS, MatchError, Matcher, Scratch};
use ch15::{CompileError, Source, Structured, compile};
use std::cell::Cell;
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

/// `head`, then `unit` as many times as fit with `tail` in `limit` bytes, then `tail`.
fn fill(head: &str, unit: &str, tail: &str, limit: usize) -> String {
    let n = (limit - head.len() - tail.len()) / unit.len();
    format!("{head}{}{tail}", unit.repeat(n))
}

/// `root ::= r0`, then `rK ::= "x" rK+1` up to `rN ::= "x"`: each rule productive only once
/// the next one is, so written top down (as here) or bottom up (`reversed`) the productivity
/// check must follow the whole chain. As many rules as fit in `limit` bytes.
fn chain(limit: usize, reversed: bool) -> String {
    let mut rules = Vec::new();
    let mut bytes = "root ::= r0\n".len();
    for k in 0.. {
        let rule = format!("r{k} ::= \"x\" r{}\n", k + 1);
        let last = format!("r{} ::= \"x\"\n", k + 1);
        if bytes + rule.len() + last.len() > limit {
            rules.push(format!("r{k} ::= \"x\"\n"));
            break;
        }
        bytes += rule.len();
        rules.push(rule);
    }
    if reversed {
        rules.reverse();
    }
    format!("root ::= r0\n{}", rules.concat())
}

#[test]
fn grammars_at_the_size_limit_compile() {
    let literal = fill("root ::= \"", "ab", "\"", MAX_GRAMMAR_BYTES);
    let g = compile(&Source::Grammar(literal.clone())).expect("a megabyte literal");
    let text = &literal["root ::= \"".len()..literal.len() - 1];
    assert!(g.matches(text.as_bytes()));
    assert!(!g.matches(&text.as_bytes()[1..]));

    // Characters of every width, and ranges.
    let class = fill("root ::= [", "aé☃😀0-9", "]", MAX_GRAMMAR_BYTES);
    let g = compile(&Source::Grammar(class)).expect("a megabyte class");
    for c in ["é", "7", "😀"] {
        assert!(g.matches(c.as_bytes()), "{c}");
    }
    assert!(!g.matches(b"b") && !g.matches(b"aa"));

    for reversed in [false, true] {
        let text = chain(MAX_GRAMMAR_BYTES, reversed);
        assert!(text.len() <= MAX_GRAMMAR_BYTES && text.len() > MAX_GRAMMAR_BYTES - 100);
        let g = compile(&Source::Grammar(text)).expect("a chain of rules");
        let n = g.starts.len() - 1; // the rules r0 … and root
        assert!(g.matches("x".repeat(n).as_bytes()), "{n} rules");
        assert!(!g.matches("x".repeat(n - 1).as_bytes()));
    }
    // The same chain whose last rule never ends accepts nothing, which only the whole chain
    // shows.
    let text = chain(MAX_GRAMMAR_BYTES - 100, false);
    let (rest, last) = text.trim_end().rsplit_once('\n').expect("lines");
    let name = last.split(' ').next().expect("a rule");
    let e = grammar_error(&format!("{rest}\n{name} ::= \"x\" {name}\n"));
    assert!(e.contains("accepts no text: rule `root`"), "{e}");

    // A schema of thousands of required properties (the server's way in).
    let mut properties = Vec::new();
    let mut required = Vec::new();
    for k in 0..5000 {
        properties.push(format!("\"p{k}\": {{\"type\": \"integer\"}}"));
        required.push(format!("\"p{k}\""));
    }
    let schema = format!(
        "{{\"type\": \"object\", \"properties\": {{{}}}, \"required\": [{}]}}",
        properties.join(", "),
        required.join(", ")
    );
    compile(&Source::JsonSchema(schema)).expect("a schema of 5000 properties");
}

#[test]
fn schemas_that_name_many_things_alike_compile() {
    // Each name of one letter of another script becomes the rule name `-`: 3000 rules under
    // one name, numbered `-0`, `-1`, ….
    let properties: Vec<String> = ('\u{4e00}'..)
        .take(3000)
        .enumerate()
        .map(|(k, c)| format!("\"{c}\": {{\"const\": {k}}}"))
        .collect();
    let schema = format!("{{\"properties\": {{{}}}}}", properties.join(", "));
    compile(&Source::JsonSchema(schema)).expect("3000 properties named alike");
    // Thousands of `$defs`, each reached by a `$ref`.
    let defs: Vec<String> = (0..3000)
        .map(|k| format!("\"d{k}\": {{\"const\": {k}}}"))
        .collect();
    let refs: Vec<String> = (0..3000)
        .map(|k| format!("\"p{k}\": {{\"$ref\": \"#/$defs/d{k}\"}}"))
        .collect();
    let schema = format!(
        "{{\"$defs\": {{{}}}, \"properties\": {{{}}}}}",
        defs.join(", "),
        refs.join(", ")
    );
    compile(&Source::JsonSchema(schema)).expect("3000 $refs into 3000 $defs");
}

#[test]
fn escapes_that_are_no_character_are_refused() {
    for (escape, why) in [
        ("\\uD800", "surrogate"),
        ("\\uDFFF", "surrogate"),
        ("\\U0000DC00", "surrogate"),
        ("\\U00110000", "past U+10FFFF"),
        ("\\UFFFFFFFF", "past U+10FFFF"),
    ] {
        for grammar in [
            format!("root ::= \"{escape}\""),
            format!("root ::= [a-{escape}]"),
        ] {
            let e = grammar_error(&grammar);
            assert!(e.contains(escape) && e.contains(why), "{grammar}: {e}");
        }
    }
    // Either side of the gaps, and the ends of the range, are characters (beside `x`: a
    // grammar that needs NUL is refused for another reason).
    for escape in ["\\x00", "\\uD7FF", "\\uE000", "\\U0010FFFF"] {
        let grammar = format!("root ::= [x{escape}]");
        compile(&Source::Grammar(grammar.clone())).unwrap_or_else(|e| panic!("{grammar}: {e}"));
    }
}

#[test]
fn a_grammar_that_needs_nul_is_refused() {
    // As in llama.cpp, no token whose piece starts with NUL is ever allowed (it reads pieces as
    // 0-terminated strings). A grammar whose every sentence has a NUL would be masked shut
    // there, and the text end early where the grammar rejects it: it is refused, naming NUL.
    for grammar in [
        r#"root ::= "x" [\x00]"#,
        r#"root ::= "x" [^\x01-\U0010FFFF]"#,
        r#"root ::= "x\x00""#,
        r#"root ::= "x" [^\x01-\U0010FFFF]"#,
        "root ::= \"x\" n+\nn ::= [\\x00] | \"\\x00\" n",
    ] {
        let e = grammar_error(grammar);
        assert!(e.contains("NUL character (`\\x00`)"), "{grammar}: {e}");
    }
    let e = schema_error(r#"{"type": "string", "pattern": "^a\\x00$"}"#);
    assert!(e.contains("NUL character"), "{e}");
    // NUL where the grammar does not need it, and its neighbour, are fine.
    for grammar in [
        r#"root ::= "x" [\x00]?"#,
        r#"root ::= "x" [\x00-\x01]"#,
        r#"root ::= "x" [\x01]"#,
        r#"root ::= "x" [\x00a]"#,
        r#"root ::= "x" [^\x00]"#,
    ] {
        if let Err(e) = compile(&Source::Grammar(grammar.to_string())) {
            panic!("{grammar}: {e}");
        }
    }
    // The matcher itself reads NUL like any other character.
    let g = compile(&Source::Grammar(r#"root ::= "x" [\x00-\x01]"#.into())).expect("NUL");
    assert!(g.matches(b"x\0") && g.matches(b"x\x01") && !g.matches(b"x"));
}

#[test]
fn a_compile_stops_when_asked() {
    let big = Source::Grammar(fill("root ::= \"", "a", "\"", MAX_GRAMMAR_BYTES));
    let schema = Source::JsonSchema(format!(
        "{{\"properties\": {{{}}}}}",
        (0..5000)
            .map(|k| format!("\"p{k}\": {{\"type\": \"string\"}}"))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    for source in [&big, &schema] {
        compile(source).expect("compiles when not stopped");
        // Stopped from the start: the first question gives up.
        assert!(matches!(
            compile_until(source, &|| true),
            Err(CompileError::Cancelled)
        ));
        // Stopped on the third question: a compile asks as it goes, not only at the start.
        let asked = Cell::new(0);
        let stop = || {
            asked.set(asked.get() + 1);
            asked.get() >= 3
        };
        match compile_until(source, &stop) {
            Err(CompileError::Cancelled) => assert_eq!(asked.get(), 3),
            other => panic!("asked {} times: {other:?}", asked.get()),
        }
    }
    // Computing the start asks too: 5000 alternatives of `root`, each advanced.
    let wide = format!("root ::= x{}\nx ::= \"a\"", " | x".repeat(4999));
    let g = compile(&Source::Grammar(wide)).expect("5000 alternatives");
    let mut s = Scratch::default();
    assert_eq!(g.initial_stacks(&mut s).expect("one reading").len(), 1);
    assert_eq!(
        g.initial_stacks_until(&mut s, &|| true),
        Err(MatchError::Cancelled)
    );
    // Below STOP_CHECK_STEPS steps nothing is asked.
    let asked = Cell::new(0);
    let small = Source::Grammar("root ::= [a-z]+".to_string());
    assert!(
        compile_until(&small, &|| {
            asked.set(asked.get() + 1);
            true
        })
        .is_ok()
    );
    assert_eq!(asked.get(), 0, "asked every {STOP_CHECK_STEPS} steps");
    assert_eq!(
        CompileError::Cancelled.to_string(),
        "grammar: compiling stopped: the request was cancelled"
    );

    // A cancelled compile is not kept: the next request for the same text compiles it.
    let server = Structured::default();
    assert!(matches!(
        server.constraint_until(big.clone(), &|| true),
        Err(CompileError::Cancelled)
    ));
    let a = server.constraint(big.clone()).expect("compiles");
    let b = server.constraint(big).expect("cached");
    assert!(
        Arc::ptr_eq(&a.grammar, &b.grammar),
        "the second request shares the first's"
    );
}
