//! Calls the default model makes, held by the grammars: random seeds, temperatures and token
//! limits, `tool_choice` `required`, a named function and `auto`, several requests in one
//! continuous batch (chapter 7's scheduler). Every answer is parsed with the format's parser;
//! under `required` and a named function it holds at least one call; every call names an
//! offered function (the named one, when named) and its arguments validate against that
//! tool's schema by an independent validator — also when the answer ran into its limit, which
//! chapter 15's budget makes the grammar close in time.

use ch04::{GenParams, SamplerParams, StopReason};
use ch07::Request;
use ch08::{FastLoader, PoolKind, new_pool};
use ch10::engine::{Engine, LoadMode, Scheduled};
use ch10::mapped::MapOptions;
use ch19::choice::ToolChoice;
use ch19::request::{ToolRequest, Tooled};
use proptest::prelude::*;
use std::sync::OnceLock;

const TOOLS: &str = r#"[
  {"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {
      "city": {"type": "string", "maxLength": 24},
      "unit": {"enum": ["celsius", "fahrenheit"]}},
      "required": ["city"], "additionalProperties": false}}},
  {"type": "function", "function": {"name": "set_alarm", "description": "Set an alarm.",
    "parameters": {"type": "object", "properties": {
      "hour": {"type": "integer", "minimum": 0, "maximum": 23},
      "minute": {"type": "integer", "minimum": 0, "maximum": 59},
      "confidence": {"type": "number", "minimum": 0, "maximum": 1}},
      "required": ["hour", "minute"], "additionalProperties": false}}}
]"#;

const ASKS: [&str; 3] = [
    "What is the weather in Paris?",
    "Wake me up at half past six.",
    "Hello! How are you?",
];

/// Token limits are drawn from `MIN_TOKENS` to `MAX_TOKENS`. The grammar closes a call within
/// its limit when the limit leaves a token for each byte of the shortest call (chapter 15's
/// budget): 80 covers the longest of the shortest calls here, `set_alarm`'s 75 bytes
/// (`<tool_call>{"name":"set_alarm","arguments":{"hour":0,"minute":0}}</tool_call>`). 128 is
/// enough for a call or two, few enough that four answers take about a second.
const MIN_TOKENS: usize = 80;
const MAX_TOKENS: usize = 128;

fn engine() -> &'static Engine {
    static E: OnceLock<Engine> = OnceLock::new();
    E.get_or_init(|| {
        let path = shared::default_model_path().unwrap_or_else(|e| panic!("{e}"));
        Engine::load(
            &path,
            LoadMode::Map(MapOptions::default()),
            FastLoader::new(new_pool(PoolKind::Spin, 2)),
            &ch13::architectures(),
        )
        .unwrap_or_else(|e| panic!("{e}"))
    })
}

fn choice_text(k: usize) -> &'static str {
    [
        r#""required""#,
        r#"{"type": "function", "function": {"name": "set_alarm"}}"#,
        r#""auto""#,
    ][k]
}

/// A request of a batch: which ask, which `tool_choice` ([`choice_text`]), whether calls may
/// be parallel, the seed, the temperature and the token limit.
type Pick = (usize, usize, bool, u64, f32, usize);

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, ..ProptestConfig::default() })]

    #[test]
    fn every_call_names_an_offered_function_and_its_arguments_validate(
        picks in proptest::collection::vec(
            (0usize..3, 0usize..3, any::<bool>(), 0u64..1000, 0.0f32..1.5, MIN_TOKENS..=MAX_TOKENS), 4)
    ) {
        let template = engine().template.as_ref().expect("a chat template");
        let tooled = Tooled::new(template);
        prop_assert_eq!(tooled.format.name, "generic");
        run_batch(&tooled, &picks)?;
    }
}

/// The shortest DeepSeek R1 call here, `set_alarm`'s, is 175 bytes: its markers are not the
/// default model's tokens. A token for each byte, and the grammar closes it within the limit.
const DEEPSEEK_TOKENS: usize = 176;

/// DeepSeek R1's format, whose calls name the function outside the JSON, held by its grammar on
/// the default model (never shown the format: the grammar writes the markers): under
/// `required` and a named function, one call or several, every answer is calls that validate.
#[test]
fn deepseek_r1_calls_are_held_to_their_schemas_too() {
    let template = engine().template.as_ref().expect("a chat template");
    let tooled = Tooled {
        format: ch19::format::DEEPSEEK_R1,
        ..Tooled::new(template)
    };
    let picks: [Pick; 4] = [
        (0, 0, false, 1, 0.7, DEEPSEEK_TOKENS),
        (1, 1, false, 2, 1.0, DEEPSEEK_TOKENS),
        (2, 0, true, 3, 1.3, DEEPSEEK_TOKENS),
        (1, 0, true, 4, 0.0, DEEPSEEK_TOKENS),
    ];
    run_batch(&tooled, &picks).unwrap_or_else(|e| panic!("{e}"));
}

/// `picks` run together in chapter 7's batch with `tooled`'s prompts and grammars; every answer
/// parsed with its parser and checked.
fn run_batch(tooled: &Tooled, picks: &[Pick]) -> Result<(), TestCaseError> {
    let e = engine();
    let template = e.template.as_ref().expect("a chat template");
    let mut runner = Scheduled::new(e, 4096, 4).unwrap_or_else(|e| panic!("{e}"));
    let mut submitted = Vec::new();
    for &(ask, choice, parallel, seed, temp, max_tokens) in picks {
        let body = format!(
            r#"{{"messages": [{{"role": "user", "content": {}}}], "tools": {TOOLS},
                "tool_choice": {}, "parallel_tool_calls": {parallel}}}"#,
            serde_json::to_string(ASKS[ask]).unwrap(),
            choice_text(choice)
        );
        let req = ToolRequest::read(&body).unwrap_or_else(|e| panic!("{e}"));
        let prompt =
            (tooled.prompt(template, &e.tokenizer, &req)).unwrap_or_else(|e| panic!("{e}"));
        let rule = (tooled.rule(&req, prompt.thinking_open)).unwrap_or_else(|e| panic!("{e}"));
        prop_assert!(rule.is_some());
        let params = GenParams {
            max_tokens,
            sampler: SamplerParams {
                temp,
                seed,
                ..SamplerParams::default()
            },
            stop: vec![],
            rule,
        };
        let request = Request {
            prompt: prompt.ids,
            params,
        };
        let id = (runner.scheduler.submit(request)).unwrap_or_else(|e| panic!("{e}"));
        submitted.push((id, req, prompt.thinking_open));
    }
    let mut done = Vec::new();
    while done.len() < submitted.len() {
        let report = runner
            .scheduler
            .step(&mut ())
            .unwrap_or_else(|e| panic!("{e}"));
        done.extend(report.finished);
    }
    let tools: serde_json::Value = serde_json::from_str(TOOLS).unwrap();
    for fin in done {
        let (_, req, open) = (submitted.iter())
            .find(|(id, _, _)| *id == fin.id)
            .expect("submitted");
        prop_assert!(matches!(
            fin.stop,
            StopReason::EndOfGeneration | StopReason::MaxTokens
        ));
        let mut parser = tooled.parser(req, *open);
        parser.push(&fin.text);
        parser.finish();
        let parsed = parser.parsed();
        let what = format!(
            "{:?} under {:?}: {:?} ({:?})",
            ASKS, req.choice, fin.text, fin.stop
        );
        if req.choice != ToolChoice::Auto {
            prop_assert!(!parsed.calls.is_empty(), "no call in {}", what);
            prop_assert!(
                parsed.content.is_empty(),
                "text beside the calls in {}",
                what
            );
        }
        if !req.parallel {
            prop_assert!(parsed.calls.len() <= 1, "several calls in {}", what);
        }
        // Under `auto` a call opens when the model writes its marker, which may come too late
        // to close: only an answer cut by its limit may end inside its last call.
        let whole = if req.choice == ToolChoice::Auto && fin.stop == StopReason::MaxTokens {
            parsed.calls.len().saturating_sub(1)
        } else {
            parsed.calls.len()
        };
        for call in &parsed.calls[..whole] {
            if let ToolChoice::Named(n) = &req.choice {
                prop_assert_eq!(&call.name, n);
            }
            let tool = (tools.as_array().unwrap().iter())
                .find(|t| t["function"]["name"] == call.name.as_str());
            prop_assert!(tool.is_some(), "{} is not offered: {}", call.name, what);
            let args: serde_json::Value = serde_json::from_str(&call.arguments)
                .map_err(|err| TestCaseError::fail(format!("{}: {err}", what)))?;
            let schema = &tool.unwrap()["function"]["parameters"];
            let validator = jsonschema::validator_for(schema).unwrap_or_else(|e| panic!("{e}"));
            let errors: Vec<String> = validator
                .iter_errors(&args)
                .map(|e| e.to_string())
                .collect();
            prop_assert!(
                errors.is_empty(),
                "{} breaks its schema: {:?}",
                what,
                errors
            );
        }
    }
    Ok(())
}

/// The lazy grammar under `auto`, fed the default model's own tokens: everything is allowed
/// until the trigger has been written — across several tokens — and from there on only what
/// continues a call.
#[test]
fn a_lazy_grammar_holds_the_answer_from_its_trigger_on() {
    let e = engine();
    let template = e.template.as_ref().expect("a chat template");
    let tooled = Tooled::new(template);
    let body = format!(
        r#"{{"messages": [{{"role": "user", "content": "Hi"}}], "tools": {TOOLS}, "tool_choice": "auto"}}"#
    );
    let req = ToolRequest::read(&body).unwrap_or_else(|e| panic!("{e}"));
    let rule = tooled.rule(&req, false).unwrap().expect("a lazy grammar");
    let tok = &e.tokenizer;
    let one = |text: &str| {
        let ids = tok.encode(text, false, false);
        assert_eq!(ids.len(), 1, "{text:?} is one token");
        ids[0]
    };
    let mut r = rule.start(tok);
    let before = tok.encode("Let me check the weather. <tool_call>", false, false);
    let (opening, trigger) = before.split_at(before.len() - 3);
    assert!(trigger.len() > 1, "the trigger spans several tokens");
    for &t in opening {
        assert!(r.allows(t));
        r.accept(t);
    }
    // Free text until the trigger is whole: even what a call could not hold.
    assert!(r.allows(one("x")));
    for &t in trigger {
        assert!(r.allows(t));
        r.accept(t);
    }
    // Now only a call: its object, not text.
    assert!(!r.allows(one("x")), "text after the trigger");
    assert!(r.allows(one("{")));
}
