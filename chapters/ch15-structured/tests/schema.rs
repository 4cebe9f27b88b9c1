//! JSON Schema to grammar, checked against llama.cpp: the expected grammars of its
//! `tests/test-json-schema-to-grammar.cpp` (byte for byte, after its `trim`), and the strings
//! its `tests/test-grammar-integration.cpp` says each converted schema must accept or reject
//! (run through our grammar matcher). Then what hostile schemas must not do: overflow the
//! stack, take exponential time, or ask for gigantic grammars.

use ch15::gbnf::Grammar;
use ch15::schema::{
    self, Conversion, MAX_JSON_DEPTH, MAX_REPETITION, MAX_SCHEMA_DEPTH, MAX_SCHEMA_NODES,
    MAX_VISITS, SchemaError, Strictness,
};
use proptest::prelude::*;
use serde_json::{Value, json};
use testkit::refdata;

mod common;

fn cases(file: &str, key: &str) -> Vec<Value> {
    let json = refdata::json(file).unwrap_or_else(|e| panic!("{e}"));
    json[key]
        .as_array()
        .unwrap_or_else(|| panic!("{file}: no {key}"))
        .clone()
}

fn text<'a>(case: &'a Value, key: &str) -> &'a str {
    case[key]
        .as_str()
        .unwrap_or_else(|| panic!("case without {key}: {case}"))
}

/// llama.cpp's test `trim`: whitespace off both ends, and off the start of every line.
fn trim(s: &str) -> String {
    s.trim_matches([' ', '\n', '\r', '\t'])
        .split('\n')
        .map(|l| l.trim_start_matches([' ', '\t']))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Cases of `tests/test-json-schema-to-grammar.cpp` that llama.cpp converts by dropping a
/// constraint, which the strict conversion refuses instead, with why.
const STRICT_REFUSES: &[(&str, &str)] = &[
    (
        "array with empty items and prefixItems",
        "prefixItems is dropped for items",
    ),
    (
        "unanchored regexp",
        "a pattern without ^…$ becomes any string",
    ),
    (
        "regexp with unsupported shorthand",
        "\\w has no equivalent, any string instead",
    ),
    (
        "unsupported regexp in a property",
        "a lookahead has no equivalent, any string instead",
    ),
];

/// Schemas of `tests/test-grammar-integration.cpp` the strict conversion refuses, with why.
const STRICT_REFUSES_INTEGRATION: &[(&str, &str)] = &[(
    "required props",
    "exclusiveMinimum on a number and uniqueItems are dropped",
)];

/// Convert each llama.cpp case and compare: failure where llama.cpp fails, its grammar where
/// it succeeds. Returns how many matched, out of how many.
fn compare_with_llama_cpp(strictness: Strictness, refused: &[(&str, &str)]) -> (usize, usize) {
    let cases = cases("grammar/json-schema-to-grammar.json", "cases");
    assert!(cases.len() >= 80, "too few cases: {}", cases.len());
    let mut matched = 0;
    let mut refused_seen = Vec::new();
    for case in &cases {
        let name = text(case, "name");
        let got = schema::convert_text(text(case, "schema"), strictness);
        if let Some((_, why)) = refused.iter().find(|(n, _)| *n == name) {
            assert_eq!(
                text(case, "outcome"),
                "success",
                "{name}: listed as refused but fails"
            );
            match got {
                Err(SchemaError::Unsupported { .. } | SchemaError::UnsupportedPattern { .. }) => {}
                other => panic!("{name} ({why}): expected a refusal, got {other:?}"),
            }
            refused_seen.push(name);
            continue;
        }
        match (text(case, "outcome"), got) {
            ("success", Ok(Conversion { grammar, .. })) => {
                assert_eq!(trim(&grammar), trim(text(case, "grammar")), "case {name}");
            }
            ("failure", Err(_)) => {}
            (outcome, got) => panic!("case {name}: llama.cpp's outcome is {outcome}, ours {got:?}"),
        }
        matched += 1;
    }
    for (name, _) in refused {
        assert!(
            refused_seen.contains(name),
            "no case named {name} (stale list entry)"
        );
    }
    (matched, cases.len())
}

#[test]
fn like_llama_cpp_every_case_gives_its_grammar() {
    let (matched, total) = compare_with_llama_cpp(Strictness::LikeLlamaCpp, &[]);
    assert_eq!(matched, total);
    eprintln!("{matched}/{total} cases give llama.cpp's outcome and grammar");
}

#[test]
fn strict_gives_llama_cpps_grammar_or_refuses_by_name() {
    let (matched, total) = compare_with_llama_cpp(Strictness::Strict, STRICT_REFUSES);
    assert_eq!(matched + STRICT_REFUSES.len(), total);
    eprintln!(
        "{matched}/{total} cases as llama.cpp, {} refused by name",
        STRICT_REFUSES.len()
    );
}

/// A schema read into a `serde_json::Value` (keys sorted) converts as its sorted text does:
/// the two ways in hold the same schema, numbers included.
#[test]
fn value_input_converts_as_its_text() {
    for case in cases("grammar/json-schema-to-grammar.json", "cases") {
        let value: Value = serde_json::from_str(text(&case, "schema")).expect("schema JSON");
        let from_value = schema::convert(&value, Strictness::LikeLlamaCpp);
        let from_text = schema::convert_text(&value.to_string(), Strictness::LikeLlamaCpp);
        assert_eq!(from_value, from_text, "case {}", text(&case, "name"));
    }
    let order = json!({"properties": {"b": {"type": "null"}, "a": {"type": "null"}}});
    assert_eq!(
        schema::schema_to_grammar(&order).ok(),
        schema::schema_text_to_grammar(&order.to_string()).ok()
    );
}

/// Each schema of llama.cpp's integration test, converted and parsed by our grammar parser,
/// accepts every string llama.cpp's test says it must and rejects every one it must not.
#[test]
fn converted_schemas_accept_and_reject_what_llama_cpp_says() {
    let schemas = cases("grammar/integration.json", "schemas");
    assert!(schemas.len() >= 30, "too few schemas: {}", schemas.len());
    let (mut strings, mut refused) = (0, Vec::new());
    for case in &schemas {
        let name = text(case, "name");
        let line = &case["line"];
        let schema_text = text(case, "schema");
        let conv = schema::convert_text(schema_text, Strictness::LikeLlamaCpp)
            .unwrap_or_else(|e| panic!("{name} (line {line}): {e}"));
        let grammar = Grammar::parse(&conv.grammar, "root")
            .unwrap_or_else(|e| panic!("{name} (line {line}): {e}\n{}", conv.grammar));
        strings += common::check_verdicts(&grammar, case, &format!("{name} (line {line})"));
        // Strictly, the same grammar, or a refusal listed by name.
        match schema::convert_text(schema_text, Strictness::Strict) {
            Ok(strict) => assert_eq!(strict.grammar, conv.grammar, "{name} (line {line})"),
            Err(e) => {
                assert!(
                    STRICT_REFUSES_INTEGRATION.iter().any(|(n, _)| *n == name),
                    "{name} (line {line}) refused strictly: {e}"
                );
                refused.push(name);
            }
        }
    }
    assert_eq!(
        refused.len(),
        STRICT_REFUSES_INTEGRATION.len(),
        "refused: {refused:?}"
    );
    eprintln!(
        "{} schemas, {strings} strings as llama.cpp says",
        schemas.len()
    );
}

// ---------------------------------------------------------------------------------------------
// Properties checked through the grammar matcher
// ---------------------------------------------------------------------------------------------

fn grammar_of(schema: &Value) -> Grammar {
    let g = schema::schema_to_grammar(schema).unwrap_or_else(|e| panic!("{schema}: {e}"));
    Grammar::parse(&g, "root").unwrap_or_else(|e| panic!("{schema}: {e}\n{g}"))
}

/// Bounds and values within ±10^12: well inside the 16 digits llama.cpp's integer rules allow
/// on an unbounded side, so only the bounds decide.
const INT_SPAN: i64 = 1_000_000_000_000;

fn int_bound() -> impl Strategy<Value = Option<i64>> {
    prop_oneof![
        Just(None),
        (-INT_SPAN..=INT_SPAN).prop_map(Some),
        (-1000i64..=1000).prop_map(Some),
    ]
}

/// A decimal `m / 10^k`, exactly: the bounds and values of the number-range property.
#[derive(Debug, Clone, Copy)]
struct Dec {
    m: i64,
    k: u32,
}

impl Dec {
    /// Compared at a common scale, exactly.
    fn cmp(self, o: Dec) -> std::cmp::Ordering {
        let k = self.k.max(o.k);
        let at = |d: Dec| d.m as i128 * 10i128.pow(k - d.k);
        at(self).cmp(&at(o))
    }

    /// As JSON text, without an exponent (trailing zeros kept: `1.50`).
    fn text(self) -> String {
        let (sign, abs) = (if self.m < 0 { "-" } else { "" }, self.m.unsigned_abs());
        let p = 10u64.pow(self.k);
        match self.k {
            0 => format!("{sign}{abs}"),
            k => format!("{sign}{}.{:0k$}", abs / p, abs % p, k = k as usize),
        }
    }

    fn value(self) -> f64 {
        self.m as f64 / 10f64.powi(self.k as i32)
    }
}

fn dec(span: i64, scales: u32) -> impl Strategy<Value = Dec> {
    (-span..=span, 0..=scales).prop_map(|(m, k)| Dec { m, k })
}

/// A bound: none, or a decimal with up to 3 decimals within ±1000, inclusive or exclusive.
fn num_bound() -> impl Strategy<Value = Option<(Dec, bool)>> {
    prop_oneof![
        1 => Just(None),
        4 => (dec(1_000_000, 3), any::<bool>()).prop_map(Some),
        2 => (dec(30, 1), any::<bool>()).prop_map(Some),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(600))]

    /// A number's range (strict conversion) accepts exactly the decimals between its bounds,
    /// at each bound's side inclusive or exclusive, and refuses a range with none in it.
    #[test]
    fn number_ranges_accept_exactly_their_numbers(
        lo in num_bound(),
        hi in num_bound(),
        probes in prop::collection::vec(dec(2_000_000, 4), 8),
        near in prop::collection::vec((-3i64..=3, 0u32..=2), 8),
    ) {
        let mut schema = json!({"type": "number"});
        if let Some((d, excl)) = lo {
            schema[if excl { "exclusiveMinimum" } else { "minimum" }] = json!(d.value());
        }
        if let Some((d, excl)) = hi {
            schema[if excl { "exclusiveMaximum" } else { "maximum" }] = json!(d.value());
        }
        use std::cmp::Ordering::*;
        let inside = |v: Dec| {
            lo.is_none_or(|(b, excl)| matches!((v.cmp(b), excl), (Greater, _) | (Equal, false)))
                && hi.is_none_or(|(b, excl)| matches!((v.cmp(b), excl), (Less, _) | (Equal, false)))
        };
        let empty = match (lo, hi) {
            (Some((a, ea)), Some((b, eb))) => match a.cmp(b) {
                Greater => true,
                Equal => ea || eb,
                Less => false,
            },
            _ => false,
        };
        let converted = schema::schema_to_grammar(&schema);
        if empty {
            prop_assert!(converted.is_err(), "{} converted", schema);
            return Ok(());
        }
        let g = converted.unwrap_or_else(|e| panic!("{schema}: {e}"));
        let g = Grammar::parse(&g, "root").unwrap_or_else(|e| panic!("{schema}: {e}\n{g}"));
        // Values anywhere, at and around each bound (one ten-thousandth apart, written with
        // up to two more trailing zeros).
        let mut values = probes;
        for (d, extra) in near {
            for (b, _) in lo.iter().chain(hi.iter()) {
                let k = b.k + 4;
                let m = b.m * 10i64.pow(4) + d;
                values.push(Dec { m: m * 10i64.pow(extra), k: k + extra });
                values.push(Dec { m: b.m * 10i64.pow(extra), k: b.k + extra });
            }
        }
        for v in values {
            prop_assert_eq!(g.matches(v.text().as_bytes()), inside(v), "{} for {}", v.text(), schema);
        }
        prop_assert!(!g.matches(b"00") && !g.matches(b"-0.") && !g.matches(b".5"));
        // A bounded number is written without an exponent.
        prop_assert!(lo.is_none() && hi.is_none() || !g.matches(b"1e3"));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    /// An integer's digit-by-digit range accepts exactly the integers between its bounds.
    #[test]
    fn integer_ranges_accept_exactly_their_integers(
        lo in int_bound(),
        hi in int_bound(),
        probes in prop::collection::vec(-INT_SPAN..=INT_SPAN, 8),
        near in prop::collection::vec(-3i64..=3, 8),
    ) {
        let (lo, hi) = match (lo, hi) {
            (Some(a), Some(b)) => (Some(a.min(b)), Some(a.max(b))),
            other => other,
        };
        let mut schema = json!({"type": "integer"});
        if let Some(lo) = lo {
            schema["minimum"] = json!(lo);
        }
        if let Some(hi) = hi {
            schema["maximum"] = json!(hi);
        }
        let g = grammar_of(&schema);
        // Values around each bound, and anywhere.
        let mut values = probes;
        for d in near {
            values.extend(lo.map(|b| b.saturating_add(d)));
            values.extend(hi.map(|b| b.saturating_add(d)));
        }
        for v in values {
            let inside = lo.is_none_or(|b| v >= b) && hi.is_none_or(|b| v <= b);
            prop_assert_eq!(g.matches(v.to_string().as_bytes()), inside, "{} for {}", v, schema);
        }
        // No leading zeros.
        prop_assert!(!g.matches(b"00"));
    }

    /// A string with length bounds accepts exactly the JSON strings of those lengths.
    #[test]
    fn string_lengths_accept_exactly_their_lengths(
        min in 0u64..6,
        extra in prop::option::of(0u64..6),
        s in "[a-z\"\\\\é]{0,12}",
    ) {
        let mut schema = json!({"type": "string", "minLength": min});
        if let Some(e) = extra {
            schema["maxLength"] = json!(min + e);
        }
        let g = grammar_of(&schema);
        let n = s.chars().count() as u64;
        let inside = n >= min && extra.is_none_or(|e| n <= min + e);
        prop_assert_eq!(g.matches(Value::from(s.clone()).to_string().as_bytes()), inside);
    }

    /// An array with item bounds accepts exactly the arrays of those sizes.
    #[test]
    fn array_sizes_accept_exactly_their_sizes(
        min in 0u64..5,
        extra in prop::option::of(0u64..5),
        items in prop::collection::vec(any::<bool>(), 0..10),
    ) {
        let mut schema = json!({"type": "array", "items": {"type": "boolean"}, "minItems": min});
        if let Some(e) = extra {
            schema["maxItems"] = json!(min + e);
        }
        let g = grammar_of(&schema);
        let n = items.len() as u64;
        let inside = n >= min && extra.is_none_or(|e| n <= min + e);
        prop_assert_eq!(g.matches(Value::from(items).to_string().as_bytes()), inside);
    }
}

/// `enum` and `const` values come out as llama.cpp's JSON library writes them (numbers
/// included: `1e+100`, `1e-05`, `-12750.0`), so the text a model writes is that text.
#[test]
fn enum_values_are_written_as_llama_cpps_json_library_does() {
    let g = schema::schema_text_to_grammar(
        r#"{"enum": [1e100, 1e-5, 0.0001, -12.75e3, 123456789012345680000.0, -0.0,
                     12345678901234567890123, {"b": 1, "a": "é\u0001"}]}"#,
    )
    .expect("converts");
    let want = r#"root ::= ("1e+100" | "1e-05" | "0.0001" | "-12750.0" | "1.2345678901234568e+20" | "-0.0" | "1.2345678901234568e+22" | "{\"b\":1,\"a\":\"é\\u0001\"}")"#;
    assert_eq!(g.lines().find(|l| l.starts_with("root")), Some(want));
}

// ---------------------------------------------------------------------------------------------
// Strictness
// ---------------------------------------------------------------------------------------------

fn strict_error(schema: &Value) -> SchemaError {
    schema::schema_to_grammar(schema).expect_err("refused")
}

#[test]
fn a_keyword_the_grammar_would_not_enforce_is_named() {
    let schema = json!({"properties": {"price": {"type": "number", "multipleOf": 0.01}}});
    match strict_error(&schema) {
        SchemaError::Unsupported { path, keyword, .. } => {
            assert_eq!(
                (path.as_str(), keyword.as_str()),
                ("#/properties/price", "multipleOf")
            );
        }
        e => panic!("{e:?}"),
    }
    // Like llama.cpp: converted, and the warning names it.
    let conv = schema::convert(&schema, Strictness::LikeLlamaCpp).expect("converts");
    assert!(
        conv.warnings
            .iter()
            .any(|w| w.contains("`multipleOf`") && w.contains("#/properties/price")),
        "{:?}",
        conv.warnings
    );
}

/// A number's bounds are enforced strictly (llama.cpp drops them, and so does the conversion
/// like it, saying so): a confidence between 0 and 1 is what tools' schemas ask.
#[test]
fn a_numbers_bounds_are_enforced_strictly_and_only_reported_otherwise() {
    let schema = json!({"type": "number", "minimum": 0, "maximum": 1});
    let g = grammar_of(&schema);
    for (text, ok) in [
        ("0", true),
        ("0.25", true),
        ("1", true),
        ("1.000", true),
        ("1.5", false),
        ("-0.1", false),
        ("7", false),
        ("0.9999999999999999", true),
    ] {
        assert_eq!(g.matches(text.as_bytes()), ok, "{text}");
    }
    let conv = schema::convert(&schema, Strictness::LikeLlamaCpp).expect("converts");
    assert!(
        conv.warnings.iter().any(|w| w.contains("`minimum`")),
        "{:?}",
        conv.warnings
    );
    let refused = strict_error(&json!({"type": "number", "exclusiveMinimum": 1, "maximum": 1}));
    assert!(refused.to_string().contains("no number lies"), "{refused}");
}

#[test]
fn an_unknown_keyword_is_named() {
    let e = strict_error(&json!({"type": "string", "maxLenght": 3}));
    assert!(
        matches!(&e, SchemaError::Unsupported { keyword, .. } if keyword == "maxLenght"),
        "{e}"
    );
    assert!(e.to_string().contains("maxLenght"), "{e}");
}

#[test]
fn annotations_and_keywords_that_cannot_apply_are_fine() {
    let schema = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "x", "title": "t",
        "description": "d", "$comment": "c", "examples": ["a"], "default": "a",
        "type": "string", "minimum": 3, "items": {"type": "null"},
    });
    let g = schema::schema_to_grammar(&schema).expect("converts");
    assert!(g.contains("root ::= \"\\\"\" char* \"\\\"\""), "{g}");
    // A format is an annotation to a validator, but a constraint to whoever asks for output:
    // one the grammar cannot spell out is named, not dropped.
    let e = strict_error(&json!({"type": "string", "format": "email"}));
    assert!(
        matches!(&e, SchemaError::Unsupported { keyword, .. } if keyword == "format"),
        "{e}"
    );
    assert!(e.to_string().contains("email"), "{e}");
}

#[test]
fn refs_only_into_the_document() {
    let remote = json!({"$ref": "https://example.com/schema.json"});
    assert!(matches!(strict_error(&remote),
        SchemaError::Ref { reference, .. } if reference == "https://example.com/schema.json"));
    let missing = json!({"$ref": "#/$defs/nothing", "$defs": {}});
    assert!(matches!(strict_error(&missing),
        SchemaError::Ref { reference, .. } if reference == "#/$defs/nothing"));
    // A recursive schema converts: the recursion goes through an object's braces.
    // (As text: its properties keep their order, `value` before `next`.)
    let list = r##"{
        "$ref": "#/$defs/node",
        "$defs": {"node": {"type": "object", "properties": {
            "value": {"type": "integer"}, "next": {"$ref": "#/$defs/node"}}}}
    }"##;
    let g = schema::schema_text_to_grammar(list).expect("converts");
    let g = Grammar::parse(&g, "root").unwrap_or_else(|e| panic!("{e}\n{g}"));
    assert!(g.matches(br#"{"value": 1, "next": {"value": 2, "next": {}}}"#));
    assert!(!g.matches(br#"{"value": 1, "next": {"value": "2"}}"#));
}

#[test]
fn a_ref_cycle_that_matches_nothing_is_left_recursion() {
    for schema in [
        json!({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}),
        json!({"$ref": "#/$defs/a", "$defs": {"a": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/a"}]}}}),
    ] {
        for strictness in [Strictness::Strict, Strictness::LikeLlamaCpp] {
            let e = schema::convert(&schema, strictness).expect_err("left recursion");
            assert!(
                matches!(&e, SchemaError::LeftRecursion { reference } if reference == "#/$defs/a"),
                "{e}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Hostile schemas
// ---------------------------------------------------------------------------------------------

/// `{"items": {"items": … {} …}}`, `depth` levels, built without recursion.
fn nested_items(depth: usize) -> Value {
    let mut v = json!({});
    for _ in 0..depth {
        v = wrap("items", v);
    }
    v
}

/// `{key: inner}`, moving `inner` in (`json!` would copy it, recursively).
fn wrap(key: &str, inner: Value) -> Value {
    let mut m = serde_json::Map::new();
    m.insert(key.to_string(), inner);
    Value::Object(m)
}

/// Take a deep value apart level by level: dropping it whole recurses once per level.
fn dismantle(mut v: Value) {
    while let Some(inner) = v.get_mut("items").map(Value::take) {
        v = inner;
    }
}

#[test]
fn ten_thousand_levels_deep_is_an_error_not_a_stack_overflow() {
    let deep = nested_items(10_000);
    for strictness in [Strictness::Strict, Strictness::LikeLlamaCpp] {
        let e = schema::convert(&deep, strictness).expect_err("too deep");
        assert_eq!(
            e,
            SchemaError::JsonTooDeep {
                limit: MAX_JSON_DEPTH
            }
        );
        assert!(e.to_string().contains("MAX_JSON_DEPTH"), "{e}");
    }
    dismantle(deep);
    let text = format!(
        "{}{{}}{}",
        r#"{"items":"#.repeat(10_000),
        "}".repeat(10_000)
    );
    let e = schema::schema_text_to_grammar(&text).expect_err("too deep");
    assert_eq!(
        e,
        SchemaError::JsonTooDeep {
            limit: MAX_JSON_DEPTH
        }
    );

    // Within the JSON limit but past the schema limit.
    let e = schema::schema_to_grammar(&nested_items(MAX_SCHEMA_DEPTH + 10)).expect_err("too deep");
    assert!(
        matches!(
            e,
            SchemaError::TooDeep {
                limit: MAX_SCHEMA_DEPTH,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("MAX_SCHEMA_DEPTH"), "{e}");
    // And just within it, fine.
    schema::schema_to_grammar(&nested_items(MAX_SCHEMA_DEPTH - 2)).expect("converts");
}

/// A chain of 5,000 `$ref`s, each target first met (and read) near the top, so that only
/// following the chain goes deep.
#[test]
fn a_long_ref_chain_is_bounded() {
    let n = 5000;
    let mut defs = serde_json::Map::new();
    for i in 0..n {
        let next = if i + 1 < n {
            json!({"$ref": format!("#/$defs/d{}", i + 1)})
        } else {
            json!({"type": "null"})
        };
        defs.insert(
            format!("d{i}"),
            json!({"anyOf": [next, {"type": "boolean"}]}),
        );
    }
    let alts: Vec<Value> = (0..n)
        .rev()
        .map(|i| json!({"$ref": format!("#/$defs/d{i}")}))
        .collect();
    // `type` next to `anyOf` is checked against every alternative, down the whole chain.
    let schema = json!({"anyOf": alts, "type": ["null", "boolean"], "$defs": defs});
    let e = schema::schema_to_grammar(&schema).expect_err("too deep");
    assert!(
        matches!(
            e,
            SchemaError::TooDeep {
                limit: MAX_SCHEMA_DEPTH,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn huge_counts_are_errors_not_huge_grammars() {
    let limit = MAX_REPETITION;
    for schema in [
        json!({"type": "array", "items": {"type": "integer"}, "maxItems": 1_000_000_000u64}),
        json!({"type": "array", "minItems": 5000}),
        json!({"type": "string", "maxLength": u64::MAX}),
        json!({"type": "string", "pattern": "^a{100000}$"}),
    ] {
        for strictness in [Strictness::Strict, Strictness::LikeLlamaCpp] {
            let e = schema::convert(&schema, strictness).expect_err("too many");
            assert!(
                matches!(e, SchemaError::RepetitionTooLarge { limit: l, .. } if l == limit),
                "{schema}: {e}"
            );
        }
    }
    // At the limit, fine.
    schema::schema_to_grammar(&json!({"type": "array", "maxItems": limit + 1})).expect("converts");
}

/// `type` lists inside `type` lists: each level copies the schema below once per type.
#[test]
fn type_lists_cannot_multiply_without_bound() {
    let mut v = json!({});
    for _ in 0..40 {
        v = wrap("items", v);
        v["type"] = json!(["array", "array"]);
    }
    let e = schema::convert(&v, Strictness::LikeLlamaCpp).expect_err("too big");
    assert_eq!(
        e,
        SchemaError::TooManyNodes {
            limit: MAX_SCHEMA_NODES
        }
    );
}

/// `allOf`s that combine the same object twice, nested: each level doubles llama.cpp's work.
#[test]
fn nested_all_ofs_cannot_double_without_bound() {
    let levels = 38;
    let mut defs = serde_json::Map::new();
    for i in 0..levels {
        let next = format!("#/$defs/x{}", i + 1);
        let p = if i + 1 < levels {
            json!({"allOf": [{"$ref": next}, {"$ref": next}]})
        } else {
            json!({"type": "null"})
        };
        defs.insert(format!("x{i}"), json!({"properties": {"p": p}}));
    }
    let schema = json!({"$defs": defs, "allOf": [{"$ref": "#/$defs/x0"}, {"$ref": "#/$defs/x0"}]});
    let e = schema::convert(&schema, Strictness::LikeLlamaCpp).expect_err("too much work");
    assert_eq!(e, SchemaError::TooMuchWork { limit: MAX_VISITS });
    // Strictly, a property in two parts is refused before that.
    assert!(
        matches!(strict_error(&schema), SchemaError::Unsupported { keyword, .. } if keyword == "allOf")
    );
}

#[test]
fn big_grammars_are_refused() {
    let names: serde_json::Map<String, Value> = (0..30_000)
        .map(|i| (format!("p{i}"), json!({"type": "null"})))
        .collect();
    let e = schema::schema_to_grammar(&json!({"properties": names})).expect_err("too many rules");
    assert!(matches!(e, SchemaError::TooManyRules { .. }), "{e}");

    let long = "x".repeat(2_000_000);
    let e = schema::schema_to_grammar(&json!({"enum": [long]})).expect_err("too big");
    assert!(matches!(e, SchemaError::GrammarTooLarge { .. }), "{e}");
}

#[test]
fn bad_schemas_say_what_is_wrong() {
    for (schema, needle) in [
        (json!({"type": "kaboom"}), "unrecognized type kaboom"),
        (
            json!({"type": "integer", "minimum": 10, "maximum": 3}),
            "no integer",
        ),
        (
            json!({"type": "array", "minItems": 4, "maxItems": 2}),
            "at least 4 but at most 2",
        ),
        (
            json!({"type": "string", "pattern": "^(a$"}),
            "unbalanced parentheses",
        ),
        (json!({"enum": []}), "enum must be a non-empty array"),
        (
            json!({"type": "integer", "minimum": 1e30}),
            "out of the 64-bit integer range",
        ),
        (json!({"type": "integer", "minimum": 1e17}), "more digits"),
    ] {
        let e = schema::convert(&schema, Strictness::LikeLlamaCpp).expect_err("refused");
        assert!(e.to_string().contains(needle), "{schema}: {e}");
    }
}
