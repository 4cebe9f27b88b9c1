//! The sampling and length fields both endpoints share ([`Sampling`]), each kept as the JSON
//! value the client sent ([`Field`]) until [`Sampling::params`] reads it as its type, checks
//! its value, and turns them all into chapter 4's [`GenParams`]: a bad one is a 400 naming it.
//! The fields the engine lacks, and unknown ones, are refused in `unsupported.rs`.

use super::{ApiError, echo};
use ch04::{GenParams, IgnoreEos, MakeRule, SamplerParams};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value, json};
use std::sync::Arc;

// Only for the documentation's links:
#[cfg(doc)]
use super::{CHAIN, Formats, Lookaheads, UNSUPPORTED};

/// Most stop strings a request may give (OpenAI allows 4).
pub const MAX_STOP_STRINGS: usize = 16;
/// Longest stop string, in bytes: a stop string is matched against the streamed text at every
/// token, so its length is work per token.
pub const MAX_STOP_BYTES: usize = 1024;
/// OpenAI's largest `temperature`: above it sampling is close to uniform noise.
pub const MAX_TEMPERATURE: f32 = 2.0;

/// The sampling and length fields common to both endpoints, each read as its type by
/// [`Sampling::params`] ([`Field`]). Fields OpenAI or llama-server define that the engine
/// cannot honour are refused by name unless they ask for nothing ([`UNSUPPORTED`]); an unknown
/// field is refused as OpenAI's API refuses it ("Unrecognized request argument supplied").
#[derive(Debug, Default, Deserialize)]
pub struct Sampling {
    pub model: Option<String>,
    /// At least 1; absent, generation runs until the context is full.
    pub max_tokens: Option<Field<i64>>,
    /// The chat endpoint's newer name for `max_tokens`.
    pub max_completion_tokens: Option<Field<i64>>,
    pub temperature: Option<Field<f32>>,
    pub top_p: Option<Field<f32>>,
    pub top_k: Option<Field<i64>>,
    pub min_p: Option<Field<f32>>,
    pub repeat_penalty: Option<Field<f32>>,
    /// llama-server's field: how many recent tokens the penalty looks at (0: none, -1: all).
    pub repeat_last_n: Option<Field<i64>>,
    pub seed: Option<Field<u64>>,
    pub stop: Option<Field<Stop>>,
    pub n: Option<Field<u64>>,
    /// llama-server's field: end-of-generation tokens never come next (chapter 4's
    /// [`IgnoreEos`]), so generation runs to its token limit — what a benchmark wants.
    pub ignore_eos: Option<Field<bool>>,
    /// llama-server's field: the stages of the sampler chain, in order; accepted when it names
    /// chapter 4's chain as it is ([`CHAIN`]).
    pub samplers: Option<Value>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    /// The form of the output: OpenAI's `{"type": "text"}`, or what the server's [`Formats`]
    /// accept (they are handed its text, so that a JSON schema's properties keep their order).
    pub response_format: Option<Value>,
    /// llama-server's field: a GBNF grammar the output must follow, where [`Formats`] accept it.
    pub grammar: Option<Value>,
    /// OpenAI's hint of which requests share a prompt prefix, so that its servers route them
    /// together: accepted, since this server's prefix cache finds a shared prefix by itself.
    pub prompt_cache_key: Option<Field<String>>,
    /// OpenAI's predicted output, `{"type": "content", "content": …}` (a string or text
    /// parts): what the client expects the answer to be, fed ahead where the server's
    /// [`Lookaheads`] take it. Read through [`Sampling::prediction`].
    prediction: Option<Value>,
    /// llama-server's fields for its speculative decoding, handed to the server's
    /// [`Lookaheads`]: most tokens fed ahead per step for this request (0: none; the server's
    /// own limit bounds it), how many to feed each step whatever they cost, and the
    /// probability a token fed must have (only 0: no probability is computed to hold them to).
    /// Each may also be given inside an object, `"speculative": {"n_max": 4}`, but not both ways.
    /// Read through [`Sampling::speculative_n_max`] and [`Sampling::speculative_n_min`].
    #[serde(rename = "speculative.n_max")]
    speculative_n_max: Option<Field<u64>>,
    #[serde(rename = "speculative.n_min")]
    speculative_n_min: Option<Field<u64>>,
    #[serde(rename = "speculative.p_min")]
    speculative_p_min: Option<Field<f64>>,
    speculative: Option<Field<Map<String, Value>>>,
    /// Every other field: one of [`UNSUPPORTED`], or unknown.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// A field's value, read as `T` when the request is checked ([`Sampling::params`]) rather than
/// when its body is parsed: a value of the wrong type (`"abc"`, or `-1` or 2⁶⁴ for a count)
/// is then a 400 that names the field, where serde's error would give a line and a column.
#[derive(Debug, Clone)]
pub struct Field<T>(Result<T, String>);

impl<T: DeserializeOwned> Field<T> {
    /// `v` read as `T`, or why it cannot be (at most a line of it: [`echo`]).
    pub fn of(v: Value) -> Field<T> {
        Field(T::deserialize(v).map_err(|e| {
            let m = e.to_string();
            match m.rsplit_once(", expected ") {
                Some((got, want)) => format!("{}, expected {want}", echo(got)),
                None => echo(&m),
            }
        }))
    }
}

impl<'de, T: DeserializeOwned> Deserialize<'de> for Field<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Field<T>, D::Error> {
        Value::deserialize(d).map(Field::of)
    }
}

/// The value of the field `name`: `None` where absent or null, a 400 naming it where it is not
/// a `T`.
fn read<'a, T>(name: &'static str, field: &'a Option<Field<T>>) -> Result<Option<&'a T>, ApiError> {
    match field {
        None => Ok(None),
        Some(Field(Ok(v))) => Ok(Some(v)),
        Some(Field(Err(e))) => Err(ApiError::invalid(
            name,
            format!("`{name}` is not valid: {e}"),
        )),
    }
}

/// `stop`: one string or a list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged, expecting = "a string or a list of strings")]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

impl Sampling {
    /// Chapter 4's parameters from the request, with llama-server's defaults for what it
    /// leaves out (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, a random seed) and no
    /// token limit but the context's. A value of the wrong type or out of its domain, a field
    /// the engine lacks at a value that asks for something, and an unknown field are each a
    /// 400 naming the field.
    pub fn params(&self) -> Result<(GenParams, Option<usize>), ApiError> {
        self.check_rest()?;
        self.prediction()?;
        self.speculative()?;
        self.check_samplers()?;
        read("prompt_cache_key", &self.prompt_cache_key)?;
        if let Some(&n) = read("n", &self.n)?
            && n != 1
        {
            return Err(ApiError::invalid(
                "n",
                format!("`n` is {n}; this server makes one choice per request (n = 1)"),
            ));
        }
        let max_tokens = read("max_tokens", &self.max_tokens)?.copied();
        let max_completion_tokens =
            read("max_completion_tokens", &self.max_completion_tokens)?.copied();
        for (name, v) in [
            ("max_tokens", max_tokens),
            ("max_completion_tokens", max_completion_tokens),
        ] {
            if let Some(n) = v
                && n < 1
            {
                return Err(ApiError::invalid(
                    name,
                    format!("`{name}` is {n}; it must be at least 1"),
                ));
            }
        }
        let temperature = read("temperature", &self.temperature)?.copied();
        if let Some(t) = temperature
            && !(0.0..=MAX_TEMPERATURE).contains(&t)
        {
            return Err(ApiError::invalid(
                "temperature",
                format!("`temperature` is {t}; OpenAI's range is 0 to {MAX_TEMPERATURE}"),
            ));
        }
        let d = SamplerParams::default();
        let top_k = match read("top_k", &self.top_k)?.copied() {
            None => d.top_k,
            Some(k) if k <= 0 => 0, // llama-server: 0 or less keeps every token
            Some(k) => usize::try_from(k).unwrap_or(usize::MAX),
        };
        let repeat_last_n = match read("repeat_last_n", &self.repeat_last_n)?.copied() {
            None => d.repeat_last_n,
            Some(-1) => usize::MAX, // llama-server: the whole context, all a request has
            Some(n) => usize::try_from(n).map_err(|_| {
                ApiError::invalid(
                    "repeat_last_n",
                    format!("`repeat_last_n` is {n}; it must be 0 or more, or -1 (all tokens)"),
                )
            })?,
        };
        let sampler = SamplerParams {
            temp: temperature.unwrap_or(d.temp),
            top_k,
            top_p: read("top_p", &self.top_p)?.copied().unwrap_or(d.top_p),
            min_p: read("min_p", &self.min_p)?.copied().unwrap_or(d.min_p),
            repeat_penalty: (read("repeat_penalty", &self.repeat_penalty)?.copied())
                .unwrap_or(d.repeat_penalty),
            repeat_last_n,
            seed: read("seed", &self.seed)?
                .copied()
                .unwrap_or_else(random_seed),
        };
        if let Err(e) = sampler.validate() {
            let field = if e.name == "temp" {
                "temperature"
            } else {
                e.name
            };
            return Err(ApiError::invalid(
                field,
                format!("`{field}` is {}; it must be {}", e.value, e.domain),
            ));
        }
        let stop = match read("stop", &self.stop)? {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        if stop.len() > MAX_STOP_STRINGS {
            return Err(ApiError::invalid(
                "stop",
                format!(
                    "`stop` has {} strings; at most {MAX_STOP_STRINGS}",
                    stop.len()
                ),
            ));
        }
        if let Some(s) = stop.iter().find(|s| s.len() > MAX_STOP_BYTES) {
            return Err(ApiError::invalid(
                "stop",
                format!(
                    "a stop string of {} bytes; at most {MAX_STOP_BYTES}",
                    s.len()
                ),
            ));
        }
        let stop = stop.into_iter().filter(|s| !s.is_empty()).collect();
        let ignore_eos = read("ignore_eos", &self.ignore_eos)?.copied() == Some(true);
        if ignore_eos && self.asks_form() {
            return Err(ApiError::invalid(
                "ignore_eos",
                "`ignore_eos` cannot be combined with `response_format` or `grammar`: an output \
                 of a given form ends where the form does",
            ));
        }
        let max_tokens = max_completion_tokens
            .or(max_tokens)
            .and_then(|n| usize::try_from(n).ok());
        let params = GenParams {
            max_tokens: max_tokens.unwrap_or(usize::MAX),
            sampler,
            stop,
            rule: ignore_eos.then(|| Arc::new(IgnoreEos) as Arc<dyn MakeRule>),
        };
        Ok((params, max_tokens))
    }

    /// This request's `speculative.n_max`, for the server's [`Lookaheads`] (checked by
    /// [`Sampling::params`]).
    pub fn speculative_n_max(&self) -> Option<u64> {
        self.speculative().ok().and_then(|(n_max, _)| n_max)
    }

    /// This request's `speculative.n_min`, for the server's [`Lookaheads`] (checked by
    /// [`Sampling::params`]).
    pub fn speculative_n_min(&self) -> Option<u64> {
        self.speculative().ok().and_then(|(_, n_min)| n_min)
    }

    /// The text of `prediction`, if given (`None` where absent or null): `{"type": "content",
    /// "content": …}`, its content a string or a list of `{"type": "text", "text": …}` parts,
    /// joined. Anything else is a 400 naming the field.
    pub fn prediction(&self) -> Result<Option<String>, ApiError> {
        let bad = |why: &str| {
            ApiError::invalid(
                "prediction",
                format!("`prediction` must be {{\"type\": \"content\", \"content\": …}}: {why}"),
            )
        };
        let Some(p) = self.prediction.as_ref().filter(|p| !p.is_null()) else {
            return Ok(None);
        };
        let p = p.as_object().ok_or_else(|| bad("it is not an object"))?;
        if let Some(k) = p.keys().find(|k| *k != "type" && *k != "content") {
            return Err(bad(&format!("{} is not one of its fields", echo(k))));
        }
        if p.get("type") != Some(&json!("content")) {
            return Err(bad("its type is not \"content\""));
        }
        match p.get("content") {
            Some(Value::String(t)) => Ok(Some(t.clone())),
            Some(Value::Array(parts)) => {
                let mut text = String::new();
                for part in parts {
                    match (part.get("type"), part.get("text")) {
                        (Some(k), Some(Value::String(t))) if k == "text" => text.push_str(t),
                        _ => return Err(bad("a part of its content is not a text part")),
                    }
                }
                Ok(Some(text))
            }
            _ => Err(bad("its content is not a string or a list of text parts")),
        }
    }

    /// `speculative.n_max` and `speculative.n_min`, each given as llama-server's field or
    /// inside the `speculative` object; `speculative.p_min` must be 0.
    fn speculative(&self) -> Result<(Option<u64>, Option<u64>), ApiError> {
        const KEYS: [&str; 3] = ["n_max", "n_min", "p_min"];
        let none = Map::new();
        let inside = read("speculative", &self.speculative)?.unwrap_or(&none);
        if let Some(k) = inside.keys().find(|k| !KEYS.contains(&k.as_str())) {
            return Err(ApiError::invalid(
                "speculative",
                format!(
                    "`speculative.{}` is not a field; `speculative` holds {}",
                    echo(k),
                    KEYS.join(", ")
                ),
            ));
        }
        let n_max = one_way(
            "speculative.n_max",
            &self.speculative_n_max,
            inside.get("n_max"),
        )?;
        let n_min = one_way(
            "speculative.n_min",
            &self.speculative_n_min,
            inside.get("n_min"),
        )?;
        let p_min = one_way(
            "speculative.p_min",
            &self.speculative_p_min,
            inside.get("p_min"),
        )?;
        if let Some(p) = p_min
            && p != 0.0
        {
            return Err(ApiError::invalid(
                "speculative.p_min",
                format!(
                    "`speculative.p_min` is {p}; this server accepts only 0: what a request feeds \
                     ahead is a number of tokens, not held to a probability"
                ),
            ));
        }
        Ok((n_max, n_min))
    }

    /// Whether the request asks its output to take a form ([`Formats`]): a `grammar`, or a
    /// `response_format` other than text.
    fn asks_form(&self) -> bool {
        let format = self.response_format.as_ref().filter(|f| !f.is_null());
        self.grammar.as_ref().is_some_and(|g| !g.is_null())
            || format.is_some_and(|f| f.get("type") != Some(&json!("text")))
    }
}

/// The field `name` (`speculative.n_max`, say) given as a field (`flat`) or inside the
/// `speculative` object (`inside`), not both.
fn one_way<T: DeserializeOwned + Clone>(
    name: &'static str,
    flat: &Option<Field<T>>,
    inside: Option<&Value>,
) -> Result<Option<T>, ApiError> {
    let inside = inside
        .filter(|v| !v.is_null())
        .map(|v| Field::of(v.clone()));
    if flat.is_some() && inside.is_some() {
        return Err(ApiError::invalid(
            name,
            format!("`{name}` is given twice, as a field and inside `speculative`; give it once"),
        ));
    }
    Ok(read(name, if flat.is_some() { flat } else { &inside })?.cloned())
}

/// A seed for a request that gives none: different for every request.
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::CompletionRequest;

    fn sampling(v: Value) -> Result<(GenParams, Option<usize>), ApiError> {
        serde_json::from_value::<Sampling>(v).unwrap().params()
    }

    #[test]
    fn defaults_are_llama_servers_and_bad_values_are_named() {
        let (p, max) = sampling(json!({})).unwrap();
        assert_eq!(max, None);
        assert_eq!((p.sampler.temp, p.sampler.top_k), (0.8, 40));
        let e = sampling(json!({"temperature": -0.0, "top_p": 1.5})).unwrap_err();
        assert_eq!((e.status, e.param), (400, Some("top_p")));
        let e = sampling(json!({"n": 2})).unwrap_err();
        assert_eq!(e.param, Some("n"));
        let (p, _) = sampling(json!({"stop": "\n", "top_k": -1, "max_tokens": 5})).unwrap();
        assert_eq!(
            (p.stop, p.sampler.top_k, p.max_tokens),
            (vec!["\n".into()], 0, 5)
        );
        let many: Vec<String> = (0..17).map(|i| i.to_string()).collect();
        assert_eq!(
            sampling(json!({"stop": many})).unwrap_err().param,
            Some("stop")
        );
    }

    #[test]
    fn a_value_of_the_wrong_type_is_a_400_naming_its_field() {
        let two_to_64: Value = serde_json::from_str("18446744073709551616").unwrap();
        for (field, value) in [
            ("max_tokens", two_to_64.clone()),
            ("max_tokens", json!("abc")),
            ("max_tokens", json!(1.5)),
            ("seed", json!(-1)),
            ("seed", two_to_64.clone()),
            ("n", json!(-1)),
            ("top_k", json!([])),
            ("temperature", json!("hot")),
            ("stop", json!(5)),
            ("ignore_eos", json!("yes")),
            ("repeat_last_n", json!(-2)),
            ("prompt_cache_key", json!(5)),
            ("speculative.n_max", json!("abc")),
            ("speculative.n_max", json!(-1)),
            ("speculative.n_max", two_to_64),
            ("speculative.n_max", json!([])),
            ("speculative.n_min", json!(0.5)),
            ("speculative.p_min", json!("x")),
        ] {
            let e = sampling(json!({ field: value })).unwrap_err();
            assert_eq!(
                (e.status, e.param),
                (400, Some(field)),
                "{value}: {}",
                e.message
            );
            assert!(e.message.contains(field), "{}", e.message);
        }
        let e = sampling(json!({"stop": 5})).unwrap_err();
        assert!(
            e.message.contains("a string or a list of strings"),
            "{}",
            e.message
        );
        // The same through an endpoint's request, whose flattened fields serde buffers.
        let r: CompletionRequest =
            serde_json::from_value(json!({"prompt": "x", "seed": -1})).unwrap();
        assert_eq!(r.sampling.params().unwrap_err().param, Some("seed"));
        // A long string is repeated only in part.
        let e = sampling(json!({"temperature": "x".repeat(10_000)})).unwrap_err();
        assert!(
            e.message.len() < 200 && e.message.contains("expected f32"),
            "{}",
            e.message
        );
    }

    #[test]
    fn speculative_limits_come_from_llama_servers_fields_or_the_object() {
        let limits = |v: Value| {
            let s: Sampling = serde_json::from_value(v).unwrap();
            s.params()
                .map(|_| (s.speculative_n_max(), s.speculative_n_min()))
        };
        assert_eq!(limits(json!({})).unwrap(), (None, None));
        assert_eq!(
            limits(json!({"speculative.n_max": 3, "speculative.n_min": 1})).unwrap(),
            (Some(3), Some(1))
        );
        assert_eq!(
            limits(json!({"speculative": {"n_max": 0}})).unwrap(),
            (Some(0), None)
        );
        let all = json!({"speculative": {"n_max": 0, "n_min": 0, "p_min": 0}});
        assert_eq!(limits(all).unwrap(), (Some(0), Some(0)));
        // One form given null, the other a value: the value.
        let v = json!({"speculative.n_max": null, "speculative": {"n_max": 2, "n_min": null}});
        assert_eq!(limits(v).unwrap(), (Some(2), None));
        for (v, field) in [
            (json!({"speculative": "abc"}), "speculative"),
            (json!({"speculative": -1}), "speculative"),
            (json!({"speculative": []}), "speculative"),
            (json!({"speculative": 5}), "speculative"),
            (
                json!({"speculative": {"n_max": 1, "foo": 2}}),
                "speculative",
            ),
            (
                json!({"speculative": {"n_max": "abc"}}),
                "speculative.n_max",
            ),
            (json!({"speculative": {"n_max": -1}}), "speculative.n_max"),
            (json!({"speculative": {"n_min": 1.5}}), "speculative.n_min"),
            (json!({"speculative": {"p_min": "x"}}), "speculative.p_min"),
            (json!({"speculative": {"p_min": 0.75}}), "speculative.p_min"),
            (json!({"speculative.p_min": 0.5}), "speculative.p_min"),
            (
                json!({"speculative.n_max": 1, "speculative": {"n_max": 1}}),
                "speculative.n_max",
            ),
            (
                json!({"speculative.n_min": 1, "speculative": {"n_min": 2}}),
                "speculative.n_min",
            ),
        ] {
            let e = limits(v.clone()).unwrap_err();
            assert_eq!(
                (e.status, e.param),
                (400, Some(field)),
                "{v}: {}",
                e.message
            );
        }
    }

    #[test]
    fn ignore_eos_and_repeat_last_n_reach_the_sampler() {
        let (p, _) = sampling(json!({})).unwrap();
        assert!(p.rule.is_none());
        assert_eq!(
            p.sampler.repeat_last_n,
            SamplerParams::default().repeat_last_n
        );
        let (p, _) = sampling(json!({"ignore_eos": true, "repeat_last_n": 0})).unwrap();
        assert_eq!(format!("{:?}", p.rule), "Some(IgnoreEos)");
        assert_eq!(p.sampler.repeat_last_n, 0);
        let (p, _) = sampling(json!({"ignore_eos": false, "repeat_last_n": -1})).unwrap();
        assert!(p.rule.is_none());
        assert_eq!(p.sampler.repeat_last_n, usize::MAX);
        let (p, _) =
            sampling(json!({"ignore_eos": true, "response_format": {"type": "text"}})).unwrap();
        assert!(p.rule.is_some());
        // A form's output ends where the form does: the two cannot be asked for together.
        for form in [
            json!({"grammar": "root ::= \"a\""}),
            json!({"response_format": {"type": "json_object"}}),
        ] {
            let mut v = form;
            v["ignore_eos"] = json!(true);
            assert_eq!(sampling(v).unwrap_err().param, Some("ignore_eos"));
        }
    }
}
