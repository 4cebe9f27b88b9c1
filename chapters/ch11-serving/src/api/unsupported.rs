//! What a request may name that the engine does not do: the fields of OpenAI's API and of
//! llama-server's that it lacks, accepted only at the values that ask for nothing
//! ([`UNSUPPORTED`]); `samplers`, accepted only when it names chapter 4's chain as it is
//! ([`CHAIN`]); and any other field, refused in OpenAI's words.

use super::{ApiError, Sampling, echo};
use serde_json::Value;

// ANCHOR: unsupported
/// Fields of OpenAI's API and of llama-server's that the engine does not implement: each with
/// the values that ask for nothing (what the server does anyway, as JSON; null too), and why
/// any other value is a 400 naming the field rather than ignored. The settings of a sampler
/// the chain lacks are accepted at llama-server's defaults, which leave it off.
#[rustfmt::skip]
pub const UNSUPPORTED: &[(&str, &[&str], &str)] = &[
    ("presence_penalty", &["0"], "use repeat_penalty"),
    ("frequency_penalty", &["0"], "use repeat_penalty"),
    ("logit_bias", &["{}"], "the sampler chain has no per-token bias"),
    ("logprobs", &["false"], "the server reports no token probabilities"),
    ("top_logprobs", &["0"], "the server reports no token probabilities"),
    ("n_probs", &["0"], "the server reports no token probabilities"),
    ("best_of", &["1"], "the server makes one choice per request"),
    ("tools", &["[]"], "the server calls no tools"),
    ("tool_choice", &[r#""none""#], "the server calls no tools"),
    ("parallel_tool_calls", &["false"], "the server calls no tools"),
    ("functions", &["[]"], "the server calls no tools"),
    ("function_call", &[r#""none""#], "the server calls no tools"),
    ("user", &[], "the server keeps no record of end users"),
    ("safety_identifier", &[], "the server keeps no record of end users"),
    ("store", &["false"], "the server stores no completions"),
    ("metadata", &["{}"], "the server stores no completions to tag"),
    ("service_tier", &[r#""auto""#, r#""default""#], "the server has one tier"),
    ("reasoning_effort", &[], "the server has no setting for reasoning"),
    ("verbosity", &[], "the server bounds an answer by max_tokens only"),
    ("modalities", &[r#"["text"]"#], "the server generates text only"),
    ("audio", &[], "the server generates text only"),
    ("web_search_options", &[], "the server does not search the web"),
    ("cache_prompt", &["true"], "the server always reuses a cached prompt prefix"),
    ("mirostat", &["0"], "the sampler chain has no mirostat"),
    ("mirostat_tau", &["5"], "the sampler chain has no mirostat"),
    ("mirostat_eta", &["0.1"], "the sampler chain has no mirostat"),
    ("typical_p", &["1"], "the sampler chain has no locally typical sampling"),
    ("dry_multiplier", &["0"], "the sampler chain has no DRY"),
    ("dry_base", &["1.75"], "the sampler chain has no DRY"),
    ("dry_allowed_length", &["2"], "the sampler chain has no DRY"),
    ("dry_penalty_last_n", &["-1"], "the sampler chain has no DRY"),
    ("dry_sequence_breakers", &[r#"["\n", ":", "\"", "*"]"#], "the sampler chain has no DRY"),
    ("xtc_probability", &["0"], "the sampler chain has no XTC"),
    ("xtc_threshold", &["0.1"], "the sampler chain has no XTC"),
    ("top_n_sigma", &["-1"], "the sampler chain has no top-n-sigma"),
    ("dynatemp_range", &["0"], "the sampler chain has no dynamic temperature"),
    ("dynatemp_exponent", &["1"], "the sampler chain has no dynamic temperature"),
    ("min_keep", &["0"], "the sampler chain's filters keep no minimum"),
];
// ANCHOR_END: unsupported

/// Chapter 4's sampler chain by llama-server's names for its stages, in its order: what
/// `samplers` must name. llama-server's other stages ([`STAGES_OFF`]) may be listed too.
pub const CHAIN: [&str; 5] = ["penalties", "top_k", "top_p", "min_p", "temperature"];

/// llama-server's stages the chain lacks: listing them in `samplers` asks for nothing, since
/// their settings are accepted only at values that leave them off ([`UNSUPPORTED`]).
pub const STAGES_OFF: [&str; 4] = ["dry", "top_n_sigma", "typ_p", "xtc"];

/// llama-server's one-letter names of the stages, for `samplers` given as a string ("ekpmt").
const STAGE_LETTERS: [(char, &str); 9] = [
    ('e', "penalties"),
    ('k', "top_k"),
    ('p', "top_p"),
    ('m', "min_p"),
    ('t', "temperature"),
    ('d', "dry"),
    ('s', "top_n_sigma"),
    ('y', "typ_p"),
    ('x', "xtc"),
];

impl Sampling {
    /// The fields in [`Sampling::rest`]: an unknown one is refused in OpenAI's words, one of
    /// [`UNSUPPORTED`] unless it asks for nothing.
    pub(super) fn check_rest(&self) -> Result<(), ApiError> {
        let known = |k: &str| UNSUPPORTED.iter().any(|&(field, ..)| field == k);
        let unknown: Vec<&str> = (self.rest.keys().map(String::as_str))
            .filter(|k| !known(k))
            .collect();
        if !unknown.is_empty() {
            return Err(ApiError::unrecognized(&unknown));
        }
        for &(field, accepts, why) in UNSUPPORTED {
            let Some(v) = self.rest.get(field) else {
                continue;
            };
            if !v.is_null() && !accepts.iter().any(|a| is_value(v, a)) {
                let accepted = match accepts {
                    [] => "it only absent or null".to_string(),
                    _ => format!("only {}", accepts.join(" or ")),
                };
                return Err(ApiError::invalid(
                    field,
                    format!("`{field}` is not supported: {why} (this server accepts {accepted})"),
                ));
            }
        }
        Ok(())
    }

    /// `samplers` — a list of llama-server's names of stages, or a string of their letters —
    /// must name [`CHAIN`] in its order, with any of [`STAGES_OFF`] among them: the chain's
    /// stages can be neither left out nor reordered.
    pub(super) fn check_samplers(&self) -> Result<(), ApiError> {
        let refuse = |m: String| ApiError::invalid("samplers", m);
        let names: Vec<String> = match &self.samplers {
            None | Some(Value::Null) => return Ok(()),
            Some(Value::String(s)) => (s.chars())
                .map(|c| match STAGE_LETTERS.iter().find(|&&(l, _)| l == c) {
                    Some((_, name)) => name.to_string(),
                    None => c.to_string(),
                })
                .collect(),
            Some(Value::Array(list)) if list.iter().all(Value::is_string) => (list.iter())
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect(),
            Some(_) => {
                return Err(refuse(
                    "`samplers` must be a list of names of stages, or a string of their letters"
                        .into(),
                ));
            }
        };
        if let Some(other) = (names.iter())
            .find(|n| !CHAIN.contains(&n.as_str()) && !STAGES_OFF.contains(&n.as_str()))
        {
            return Err(refuse(format!(
                "`samplers` names {:?}, a stage this server does not have; its chain is {}",
                echo(other),
                CHAIN.join(", ")
            )));
        }
        let chain: Vec<&str> = (names.iter().map(String::as_str))
            .filter(|n| CHAIN.contains(n))
            .collect();
        if chain != CHAIN {
            return Err(refuse(format!(
                "`samplers` orders the chain's stages as [{}]; this server's chain is fixed: \
                 {}, each once and in that order",
                echo(&chain.join(", ")),
                CHAIN.join(", ")
            )));
        }
        Ok(())
    }
}

/// Whether `v` is the value written `text` in [`UNSUPPORTED`]. Numbers are compared as f32s:
/// llama-server reports its settings as f32s (0.1 as 0.10000000149011612), and a client may
/// send back what it reported.
fn is_value(v: &Value, text: &str) -> bool {
    let want: Value = serde_json::from_str(text).expect("UNSUPPORTED holds JSON");
    match (v.as_f64(), want.as_f64()) {
        (Some(a), Some(b)) => a as f32 == b as f32,
        _ => *v == want,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Cancel, ChatRequest, CompletionRequest, Formats, TextOnly};
    use ch04::GenParams;
    use serde_json::value::RawValue;
    use serde_json::{Map, json};

    fn sampling(v: Value) -> Result<(GenParams, Option<usize>), ApiError> {
        serde_json::from_value::<Sampling>(v).unwrap().params()
    }

    #[test]
    fn every_openai_field_the_engine_lacks_is_refused_by_name() {
        let raw = |s: &str| RawValue::from_string(s.to_string()).unwrap();
        for (format, grammar, field) in [
            (
                Some(raw(r#"{"type": "json_object"}"#)),
                None,
                "response_format",
            ),
            (None, Some(json!("root ::= \"a\"")), "grammar"),
        ] {
            let e = TextOnly
                .rule(format.as_deref(), grammar.as_ref(), &Cancel::default())
                .unwrap_err();
            assert_eq!((e.status, e.param), (400, Some(field)), "{}", e.message);
        }
        let text = raw(r#"{"type": "text"}"#);
        assert!(matches!(
            TextOnly.rule(Some(&text), Some(&Value::Null), &Cancel::default()),
            Ok(None)
        ));
        // OpenAI's fields, and llama-server's samplers the chain lacks, at values that ask for
        // something: each refused by name.
        for (field, value) in [
            ("tool_choice", json!("auto")),
            ("parallel_tool_calls", json!(true)),
            ("logit_bias", json!({"50256": -100})),
            ("logprobs", json!(true)),
            ("top_logprobs", json!(2)),
            ("best_of", json!(3)),
            ("user", json!("someone")),
            ("presence_penalty", json!(0.5)),
            ("tools", json!([{"type": "function"}])),
            ("store", json!(true)),
            ("metadata", json!({"k": "v"})),
            ("service_tier", json!("flex")),
            ("reasoning_effort", json!("low")),
            ("modalities", json!(["text", "audio"])),
            ("audio", json!({"voice": "alloy"})),
            ("web_search_options", json!({})),
            ("mirostat", json!(2)),
            ("mirostat_tau", json!(3.0)),
            ("mirostat_eta", json!(0.5)),
            ("typical_p", json!(0.9)),
            ("dry_multiplier", json!(0.8)),
            ("dry_base", json!(2)),
            ("dry_allowed_length", json!(3)),
            ("dry_penalty_last_n", json!(64)),
            ("dry_sequence_breakers", json!(["\n"])),
            ("xtc_probability", json!(0.5)),
            ("xtc_threshold", json!(0.2)),
            ("n_probs", json!(5)),
            ("cache_prompt", json!(false)),
        ] {
            let e = sampling(json!({ field: value })).unwrap_err();
            assert_eq!((e.status, e.param), (400, Some(field)), "{}", e.message);
            assert!(e.message.contains(field), "{}", e.message);
        }
        // What asks for nothing is accepted: the values clients send by default, and
        // llama-server's settings as it reports them (f32s).
        let harmless = json!({"tool_choice": "none",
            "parallel_tool_calls": false, "logit_bias": {}, "top_logprobs": 0, "best_of": 1,
            "user": null, "logprobs": false, "presence_penalty": 0, "frequency_penalty": 0.0,
            "tools": [], "store": false, "metadata": {}, "service_tier": "auto",
            "modalities": ["text"], "mirostat": 0, "mirostat_tau": 5.0,
            "mirostat_eta": 0.10000000149011612, "typical_p": 1.0, "dry_multiplier": 0,
            "dry_base": 1.75, "dry_allowed_length": 2, "dry_penalty_last_n": -1,
            "dry_sequence_breakers": ["\n", ":", "\"", "*"], "xtc_probability": 0,
            "xtc_threshold": 0.1, "n_probs": 0, "cache_prompt": true, "audio": null,
            "prompt_cache_key": "shared-prefix-7"});
        assert!(sampling(harmless).is_ok());
        for (field, value) in [
            ("max_tokens", json!(-5)),
            ("max_tokens", json!(0)),
            ("max_completion_tokens", json!(-1)),
            ("temperature", json!(-1)),
            ("temperature", json!(1e9)),
            ("temperature", json!(2.5)),
        ] {
            let e = sampling(json!({ field: value })).unwrap_err();
            assert_eq!((e.status, e.param), (400, Some(field)), "{field} {value}");
        }
        assert!(sampling(json!({"temperature": 2, "max_tokens": 1})).is_ok());
    }

    #[test]
    fn every_field_of_unsupported_takes_what_asks_nothing_and_refuses_the_rest() {
        for &(field, accepts, why) in UNSUPPORTED {
            assert!(sampling(json!({ field: null })).is_ok(), "{field} null");
            for text in accepts {
                let v: Value = serde_json::from_str(text).unwrap();
                assert!(sampling(json!({ field: v })).is_ok(), "{field} {text}");
            }
            let e = sampling(json!({ field: 7 })).unwrap_err();
            assert_eq!(e.param, Some(field), "{}", e.message);
            assert!(e.message.contains(why), "{}", e.message);
        }
    }

    #[test]
    fn an_unknown_field_is_refused_in_openais_words() {
        let e = sampling(json!({"foo": 1, "temperature": 0})).unwrap_err();
        assert_eq!(e.status, 400);
        assert_eq!(e.message, "Unrecognized request argument supplied: foo");
        let e = sampling(json!({"foo": 1, "bar": null})).unwrap_err();
        assert!(
            e.message
                .starts_with("Unrecognized request arguments supplied: ")
        );
        assert!(
            e.message.contains("foo") && e.message.contains("bar"),
            "{}",
            e.message
        );
        // Through the endpoints' requests, which flatten `Sampling`: their own fields, and those
        // the server reads beside `params`, stay known; another endpoint's field does not.
        let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "model": "m",
            "stream": true, "stream_options": {"include_usage": true},
            "response_format": {"type": "text"}, "grammar": null, "max_completion_tokens": 5,
            "speculative.n_max": 2});
        let r: ChatRequest = serde_json::from_value(chat.clone()).unwrap();
        let (p, asked) = r.sampling.params().unwrap();
        assert_eq!((p.max_tokens, asked), (5, Some(5)));
        let mut with_prompt = chat;
        with_prompt["prompt"] = json!("Hi");
        let r: ChatRequest = serde_json::from_value(with_prompt).unwrap();
        let e = r.sampling.params().unwrap_err();
        assert_eq!(e.message, "Unrecognized request argument supplied: prompt");
        let r: CompletionRequest = serde_json::from_value(json!({"prompt": "Hi", "echo": false,
            "suffix": null, "seed": 3, "stop": ["\n"]}))
        .unwrap();
        assert!(r.sampling.params().is_ok());
        let r: CompletionRequest =
            serde_json::from_value(json!({"prompt": "Hi", "messages": []})).unwrap();
        assert!(
            r.sampling
                .params()
                .unwrap_err()
                .message
                .ends_with(": messages")
        );
        // A body of many unknown fields gets a line, not all of them.
        let many: Map<String, Value> = (0..1000).map(|i| (format!("f{i}"), json!(1))).collect();
        let e = sampling(Value::Object(many)).unwrap_err();
        assert!(
            e.message.len() < 200 && e.message.contains("992 more"),
            "{}",
            e.message
        );
    }

    #[test]
    fn samplers_must_name_the_chain_as_it_is() {
        for ok in [
            json!(CHAIN),
            // llama-server's default, with the stages this chain lacks (and leaves off).
            json!([
                "penalties",
                "dry",
                "top_n_sigma",
                "top_k",
                "typ_p",
                "top_p",
                "min_p",
                "xtc",
                "temperature"
            ]),
            json!("edskypmxt"),
            json!("ekpmt"),
            Value::Null,
        ] {
            assert!(sampling(json!({ "samplers": ok })).is_ok(), "{ok}");
        }
        for bad in [
            json!(["top_k", "temperature"]),
            json!(["temperature", "top_k", "top_p", "min_p", "penalties"]),
            json!([
                "penalties",
                "top_k",
                "top_k",
                "top_p",
                "min_p",
                "temperature"
            ]),
            json!([
                "penalties",
                "top_k",
                "top_p",
                "min_p",
                "temperature",
                "mirostat"
            ]),
            json!("ekpmtz"),
            json!(5),
            json!([1, 2]),
        ] {
            let e = sampling(json!({ "samplers": bad })).unwrap_err();
            assert_eq!(e.param, Some("samplers"), "{bad}: {}", e.message);
        }
    }
}
