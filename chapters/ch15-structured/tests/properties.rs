//! What the constrained sampler produces is in the language, whatever the sampler draws: random
//! seeds and temperatures, several requests with different grammars in one continuous batch
//! (chapter 7's scheduler, each request its own rule state), on the default model. A finished
//! text matches its grammar, parses as JSON where the grammar is a schema's, and is valid
//! under the schema by an independent validator (the `jsonschema` crate) — and so is a text
//! that ran into its token limit: each request's limit is drawn between the fewest tokens its
//! grammar needs and 48 more, and the rule ends the text in time (`ch15::budget`).

use ch02::Message;
use ch04::{GenParams, MakeRule, SamplerParams, StopReason};
use ch07::Request;
use ch10::engine::{Engine, Scheduled};
use ch15::budget::Shortest;
use ch15::matcher::{Partial, Scratch};
use ch15::{Constraint, Grammar, schema};
use proptest::prelude::*;
use std::sync::{Arc, OnceLock};

mod common;

/// Tokens per request beyond the fewest its grammar needs: up to enough for the small
/// documents asked for, few enough that a case of four requests runs in about a second.
const MAX_EXTRA_TOKENS: usize = 48;

/// Schemas and what to ask for, with grammars that are not JSON.
const SCHEMAS: [(&str, &str); 3] = [
    (
        r#"{"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "pets": {"type": "array", "items": {"enum": ["cat", "dog", "fish"]}, "maxItems": 3}},
          "required": ["name", "age"], "additionalProperties": false}"#,
        "Describe a person as JSON.",
    ),
    (
        r#"{"type": "array", "items": {"type": "object", "properties": {
            "fruit": {"type": "string", "maxLength": 12}, "ripe": {"type": "boolean"}},
            "required": ["fruit", "ripe"], "additionalProperties": false},
          "minItems": 1, "maxItems": 3}"#,
        "List some fruits as JSON.",
    ),
    (
        r#"{"type": "object", "properties": {"x": {"type": "number"},
            "label": {"oneOf": [{"type": "string", "maxLength": 8}, {"type": "null"}]}},
          "required": ["x", "label"], "additionalProperties": false}"#,
        "Give a point as JSON.",
    ),
];

const GRAMMARS: [(&str, &str); 2] = [
    (
        r#"root ::= [A-Z] [a-z]{1,8} (", " [A-Z] [a-z]{1,8}){0,3} ".""#,
        "Name some cities.",
    ),
    (
        r#"root ::= ("yes" | "no" | "maybe") (" — " [a-zé ]{1,30})?"#,
        "Is the sea salty?",
    ),
];

/// A case: its grammar, its rule, its question, its schema if any, and the fewest tokens a
/// whole sentence of it takes (its fewest bytes: a token per byte at most).
struct Case {
    grammar: Arc<Grammar>,
    rule: Arc<dyn MakeRule>,
    ask: &'static str,
    schema: Option<serde_json::Value>,
    fewest: usize,
}

fn fewest(g: &Grammar) -> usize {
    let sh = Shortest::new(g).expect("a small grammar is measured");
    let start = g.initial_stacks(&mut Scratch::default()).expect("starts");
    sh.of(&start, Partial::default()) as usize
}

struct Fixture {
    engine: Engine,
    cases: Vec<Case>,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let engine = common::engine();
        let mut cases = Vec::new();
        for (text, ask) in SCHEMAS {
            let gbnf = schema::schema_text_to_grammar(text).unwrap_or_else(|e| panic!("{e}"));
            let g = Grammar::parse(&gbnf, "root").unwrap_or_else(|e| panic!("{e}"));
            let v: serde_json::Value = serde_json::from_str(text).expect("schema JSON");
            cases.push(Case {
                grammar: Arc::new(g.clone()),
                fewest: fewest(&g),
                rule: rule(g),
                ask,
                schema: Some(v),
            });
        }
        for (text, ask) in GRAMMARS {
            let g = Grammar::parse(text, "root").unwrap_or_else(|e| panic!("{e}"));
            cases.push(Case {
                grammar: Arc::new(g.clone()),
                fewest: fewest(&g),
                rule: rule(g),
                ask,
                schema: None,
            });
        }
        Fixture { engine, cases }
    })
}

fn rule(g: Grammar) -> Arc<dyn MakeRule> {
    Arc::new(Constraint::new(g))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, ..ProptestConfig::default() })]

    #[test]
    fn every_sampled_text_is_in_the_language(
        picks in proptest::collection::vec(
            (0usize..5, 0u64..1000, 0.0f32..1.5, 0..=MAX_EXTRA_TOKENS), 4)
    ) {
        let f = fixture();
        let tok = &f.engine.tokenizer;
        let template = f.engine.template.as_ref().expect("a chat template");
        let mut runner = Scheduled::new(&f.engine, 2048, 4).unwrap_or_else(|e| panic!("{e}"));
        let mut ids = Vec::new();
        for &(case, seed, temp, extra) in &picks {
            let Case { rule, ask, fewest, .. } = &f.cases[case];
            let messages = [Message::new("user", ask)];
            let prompt = template.encode(tok, &messages, true).unwrap_or_else(|e| panic!("{e}"));
            let params = GenParams {
                max_tokens: fewest + extra,
                sampler: SamplerParams { temp, seed, ..SamplerParams::default() },
                stop: vec![],
                rule: Some(rule.clone()),
            };
            let id = runner.scheduler.submit(Request { prompt, params })
                .unwrap_or_else(|e| panic!("{e}"));
            ids.push((id, case));
        }
        let mut done = Vec::new();
        while done.len() < ids.len() {
            let report = runner.scheduler.step(&mut ()).unwrap_or_else(|e| panic!("{e}"));
            done.extend(report.finished);
        }
        for fin in done {
            let case = ids.iter().find(|(id, _)| *id == fin.id).expect("submitted").1;
            let Case { grammar, schema, .. } = &f.cases[case];
            let text = &fin.text;
            prop_assert!(matches!(fin.stop, StopReason::EndOfGeneration | StopReason::MaxTokens),
                "case {case}: ended by {:?}", fin.stop);
            // Ended by the model or by the limit, the text is whole.
            prop_assert!(grammar.matches(text.as_bytes()),
                "case {case}: text {text:?} ({:?}) is not in the language", fin.stop);
            if let Some(schema) = schema {
                let v: serde_json::Value = serde_json::from_str(text)
                    .map_err(|e| TestCaseError::fail(format!("{text:?}: {e}")))?;
                let validator = jsonschema::validator_for(schema)
                    .unwrap_or_else(|e| panic!("{e}"));
                let errors: Vec<String> =
                    validator.iter_errors(&v).map(|e| e.to_string()).collect();
                prop_assert!(errors.is_empty(),
                    "case {case}: {text:?} breaks its schema: {errors:?}");
            }
        }
    }
}
