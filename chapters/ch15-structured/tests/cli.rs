//! `llm-rs run` with llama.cpp's grammar flags, on the default model: the output is held to
//! the grammar or schema, and one that cannot be used is a usage error naming the flag.

use testkit::{json_printed as json, llm_rs_run as llm_rs};

#[test]
fn grammar_flags_hold_the_output() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let grammar = dir.path().join("answer.gbnf");
    std::fs::write(&grammar, "root ::= (\"yes\" | \"no\") \".\"\n").expect("write");
    let schema = dir.path().join("city.json");
    std::fs::write(
        &schema,
        r#"{"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
            "country": {"type": "string", "maxLength": 16}}, "required": ["city", "country"]}"#,
    )
    .expect("write");
    let g = grammar.to_str().expect("utf-8 path");
    let s = schema.to_str().expect("utf-8 path");
    for (flags, prompt) in [
        (
            vec!["--grammar", "root ::= (\"yes\" | \"no\") \".\""],
            "Is the sky blue?",
        ),
        (vec!["--grammar-file", g], "Is fire cold?"),
        (
            vec!["--json-schema-file", s],
            "The capital of Italy, as JSON:",
        ),
        (
            vec![
                "-j",
                r#"{"type": "array", "items": {"type": "integer"}, "maxItems": 4}"#,
            ],
            "Primes:",
        ),
    ] {
        let mut args = vec!["--temp", "0", "-n", "64", "--json"];
        args.extend(flags.iter().copied());
        args.push(prompt);
        let out = json(&llm_rs(&args));
        let text = out["text"].as_str().expect("text");
        assert_eq!(out["stop"], "eog", "{flags:?}: {text:?}");
        match flags[0] {
            "--grammar" | "--grammar-file" => {
                assert!(["yes.", "no."].contains(&text), "{flags:?}: {text:?}")
            }
            "--json-schema-file" => {
                let v: serde_json::Value = serde_json::from_str(text).expect("JSON");
                assert!(v["city"].is_string() && v["country"].is_string(), "{text}");
            }
            _ => {
                let v: serde_json::Value = serde_json::from_str(text).expect("JSON");
                let items = v.as_array().expect("an array");
                assert!(
                    items.len() <= 4 && items.iter().all(|x| x.is_i64()),
                    "{text}"
                );
            }
        }
    }
}

#[test]
fn a_grammar_that_cannot_be_used_is_a_usage_error() {
    for (flag, value, words) in [
        ("--grammar", "root ::= root \"a\"", "left-recursive"),
        ("--grammar", "root ::= \"a", "line 1, column"),
        ("--json-schema", r#"{"type": "strin"}"#, "strin"),
        (
            "--json-schema",
            r#"{"type": "string", "format": "ipv9"}"#,
            "ipv9",
        ),
        (
            "--grammar-file",
            "/no/such/grammar.gbnf",
            "/no/such/grammar.gbnf",
        ),
    ] {
        let out = llm_rs(&[flag, value, "x"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}: {err}");
        assert!(
            err.contains(flag) && err.contains(words),
            "{flag} {value}: {err}"
        );
    }
}
