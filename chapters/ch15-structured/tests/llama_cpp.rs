//! llama.cpp's own grammar tests, run against ours: the reference pipeline read the cases out
//! of its `tests/test-grammar-parser.cpp` and `tests/test-grammar-integration.cpp`
//! (`reference-data/grammar/`), so these are the grammars, rule arrays and verdicts llama.cpp
//! asserts.

use ch15::gbnf::{Elem, Grammar};
use serde_json::Value;
use testkit::refdata;

mod common;

fn cases(file: &str, key: &str) -> Vec<Value> {
    let json = refdata::json(file).unwrap_or_else(|e| panic!("{e}"));
    json[key]
        .as_array()
        .unwrap_or_else(|| panic!("{file}: no {key}"))
        .clone()
}

/// An element as llama.cpp's test dumps it: `["CHAR_ALT", 100]`.
fn dump(e: Elem) -> (String, u64) {
    let (name, v) = match e {
        Elem::End => ("END", 0),
        Elem::Alt => ("ALT", 0),
        Elem::RuleRef(r) => ("RULE_REF", r),
        Elem::Char(c) => ("CHAR", c),
        Elem::CharNot(c) => ("CHAR_NOT", c),
        Elem::CharRngUpper(c) => ("CHAR_RNG_UPPER", c),
        Elem::CharAlt(c) => ("CHAR_ALT", c),
        Elem::CharAny => ("CHAR_ANY", 0),
    };
    (name.to_string(), v as u64)
}

#[test]
fn grammars_parse_into_llama_cpps_rules() {
    let parses = cases("grammar/parser.json", "parses");
    assert!(parses.len() >= 15, "too few parser cases");
    let mut token_grammars = 0;
    for case in &parses {
        let text = case["grammar"].as_str().expect("grammar");
        let line = &case["line"];
        if uses_tokens(text) {
            // Token references constrain token ids, which this chapter leaves out: such a
            // grammar is refused, by name.
            let e = Grammar::parse(text, "root").expect_err("a token reference");
            assert!(
                e.to_string().contains("token references"),
                "line {line}: {e}"
            );
            token_grammars += 1;
            continue;
        }
        // The parser test checks symbols and rules, not a root: parse from the first rule.
        let first = case["symbols"]
            .as_array()
            .and_then(|s| s.iter().find(|s| s[1] == 0))
            .and_then(|s| s[0].as_str())
            .expect("symbol 0");
        let g = Grammar::parse(text, first)
            .unwrap_or_else(|e| panic!("line {line}: llama.cpp parses it, we say: {e}"));
        let want_symbols: Vec<(String, u64)> = case["symbols"]
            .as_array()
            .expect("symbols")
            .iter()
            .map(|s| {
                (
                    s[0].as_str().expect("name").to_string(),
                    s[1].as_u64().expect("id"),
                )
            })
            .collect();
        let mut got_symbols: Vec<(String, u64)> = g
            .names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), i as u64))
            .collect();
        got_symbols.sort();
        let mut want_sorted = want_symbols.clone();
        want_sorted.sort();
        assert_eq!(got_symbols, want_sorted, "line {line}: symbols");
        let want_rules: Vec<(String, u64)> = case["rules"]
            .as_array()
            .expect("rules")
            .iter()
            .map(|e| {
                (
                    e[0].as_str().expect("type").to_string(),
                    e[1].as_u64().expect("value"),
                )
            })
            .collect();
        let got_rules: Vec<(String, u64)> = g.elems.iter().map(|&e| dump(e)).collect();
        testkit::assert_same_sequence(&format!("line {line}: rules"), &got_rules, &want_rules);
    }
    assert!(
        token_grammars <= 2,
        "{token_grammars} grammars with tokens: the data changed"
    );
}

/// Whether a grammar uses token references (`<[id]>`, `<|name|>`, `!<…>`) outside literals and
/// classes.
fn uses_tokens(text: &str) -> bool {
    let (mut in_str, mut in_class, mut escaped) = (false, false, false);
    for c in text.chars() {
        match c {
            _ if escaped => escaped = false,
            '\\' if in_str || in_class => escaped = true,
            '"' if !in_class => in_str = !in_str,
            '[' if !in_str => in_class = true,
            ']' if in_class => in_class = false,
            '<' | '!' if !in_str && !in_class => return true,
            _ => {}
        }
    }
    false
}

#[test]
fn grammars_llama_cpp_refuses_are_refused_with_a_place() {
    let fails = cases("grammar/parser.json", "fails");
    assert!(fails.len() >= 5, "too few failing parser cases");
    for case in &fails {
        let text = case["grammar"].as_str().expect("grammar");
        match Grammar::parse(text, "root") {
            Ok(_) => panic!(
                "line {}: llama.cpp refuses {text:?}, we parse it",
                case["line"]
            ),
            // Each is a syntax error: where it is must be said.
            Err(e) => assert!(
                matches!(e, ch15::GrammarError::Syntax { line, column, .. } if line > 0 && column > 0),
                "line {}: {e}",
                case["line"]
            ),
        }
    }
    for case in cases("grammar/integration.json", "build_failures") {
        let text = case["grammar"].as_str().expect("grammar");
        let root = case["root"].as_str().expect("root");
        assert!(
            Grammar::parse(text, root).is_err(),
            "{}: llama.cpp cannot build it, we can",
            case["name"]
        );
    }
    for case in cases("grammar/integration.json", "build_successes") {
        let text = case["grammar"].as_str().expect("grammar");
        let root = case["root"].as_str().expect("root");
        if let Err(e) = Grammar::parse(text, root) {
            panic!("{}: llama.cpp builds it, we say: {e}", case["name"]);
        }
    }
}

#[test]
fn grammars_accept_and_reject_llama_cpps_strings() {
    let grammars = cases("grammar/integration.json", "grammars");
    assert!(grammars.len() >= 10, "too few grammar cases");
    let mut checked = 0;
    for case in &grammars {
        let name = &case["name"];
        let text = case["grammar"].as_str().expect("grammar");
        let root = case["root"].as_str().expect("root");
        let g = Grammar::parse(text, root).unwrap_or_else(|e| panic!("{name}: {e}"));
        checked += common::check_verdicts(&g, case, &name.to_string());
    }
    assert!(checked >= 100, "only {checked} strings checked");
}

#[test]
fn llama_cpps_example_grammars_parse() {
    let dir = refdata::dir().join("grammar/gbnf");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("entry").path();
        let text = std::fs::read_to_string(&path).expect("read");
        if let Err(e) = Grammar::parse(&text, "root") {
            panic!("{}: {e}", path.display());
        }
        n += 1;
    }
    assert!(n >= 8, "expected llama.cpp's 8 example grammars, found {n}");
    let json = std::fs::read_to_string(dir.join("json.gbnf")).expect("json.gbnf");
    let json = Grammar::parse(&json, "root").expect("json.gbnf");
    for ok in [
        r#"{"a": [1, 2.5e3, true, null], "b": {"c": "d\n\u00e9"}}"#,
        "{}",
    ] {
        assert!(json.matches(ok.as_bytes()), "{ok}");
    }
    for bad in [r#"{"a": }"#, "[1, 2]", r#"{"a": 01}"#, r#"{'a': 1}"#] {
        assert!(!json.matches(bad.as_bytes()), "{bad}");
    }
}
