//! Unit tests of the grammar parser and its checks: errors with line and column, left recursion
//! and empty languages refused, hostile sizes bounded, NUL needed or not.

use super::parser::GENERATED_NAME_BASE_BYTES;
use super::*;

fn err(text: &str) -> String {
    Grammar::parse(text, "root").unwrap_err().to_string()
}

#[test]
fn errors_name_line_and_column() {
    assert_eq!(
        err("root ::= \"a\"\nx ::= \"b\" )\n"),
        "line 2, column 11: expected a new line or the end after rule `x`, found `)`"
    );
    assert!(err("root ::= foo").contains("`foo` is used but never defined"));
    assert!(err("root ::= \"a\" |\n  \"\\q\"").starts_with("line 2, column 4: unknown escape"));
    assert!(err("rot ::= \"a\"").contains("no rule `root`"));
}

#[test]
fn left_recursion_and_empty_languages_are_refused() {
    assert!(err("root ::= \"a\" | root \"a\"").contains("left-recursive"));
    assert!(err("root ::= e root\ne ::= \"x\" | ").contains("left-recursive"));
    assert!(err("root ::= \"a\" root").contains("accepts no text"));
    assert!(err("root ::= [z-a]").contains("accepts no text"));
    assert!(err("root ::= [^\\x00-\\U0010FFFF]").contains("accepts no text"));
    assert!(Grammar::parse("root ::= ( [x]* )*", "root").is_ok());
}

/// A negated class matches what its ranges leave, however little: one code point at the
/// top of Unicode, or one between two ranges. Ranges that meet leave nothing.
#[test]
fn a_negated_class_matches_the_code_points_its_ranges_leave() {
    assert!(Grammar::parse("root ::= [^\\x00-\\U0010FFFE]", "root").is_ok());
    assert!(Grammar::parse("root ::= [^\\x00-ac-\\U0010FFFF]", "root").is_ok());
    assert!(err("root ::= [^\\x00-bc-\\U0010FFFF]").contains("accepts no text"));
}

#[test]
fn hostile_sizes_are_bounded() {
    assert!(err("root ::= \"a\"{3000}").contains("at most 2000"));
    // Nested repetitions multiply (llama.cpp's rule of thumb, kept for the same answers).
    assert!(err("root ::= (\"a\"? \"b\"? \"c\"?){1000}").contains("multiply"));
    // A long literal repeated is refused before it is built.
    let long = format!("root ::= \"{}\"{{2000}}", "a".repeat(1000));
    assert!(err(&long).contains("more than"));
    let deep = format!("root ::= {}\"a\"{}", "(".repeat(10_000), ")".repeat(10_000));
    assert!(err(&deep).contains("nested more than"));
    let big = format!("root ::= \"{}\"", "a".repeat(MAX_GRAMMAR_BYTES));
    assert!(err(&big).contains("bytes; at most"));
}

#[test]
fn generated_names_keep_a_bounded_part_of_the_rule_name() {
    let long = "n".repeat(10_000);
    let g = Grammar::parse(
        &format!("root ::= {long}\n{long} ::= (\"a\") (\"b\")*"),
        "root",
    )
    .expect("a long rule name");
    let base = &long[..GENERATED_NAME_BASE_BYTES];
    let generated: Vec<&String> = g.names.iter().filter(|n| n.contains('_')).collect();
    assert_eq!(generated.len(), 3, "{:?}", g.names);
    for (name, id) in generated.iter().zip(2..) {
        assert_eq!(**name, format!("{base}_{id}"));
    }
}

#[test]
fn nul_is_needed_only_when_every_sentence_has_one() {
    let needs = |text: &str| Grammar::parse(text, "root").expect(text).needs_nul();
    assert!(needs(r#"root ::= "a" [\x00]"#));
    assert!(needs(r#"root ::= "a" ([\x00] | [^\x01-\U0010FFFF])+"#));
    assert!(!needs(r#"root ::= "a" | "b" [\x00]"#));
    assert!(!needs(r#"root ::= [\x00-\x01]"#));
    assert!(!needs(r#"root ::= [^\x01]"#));
    assert!(!needs("root ::= \"a\" .*"));
}
