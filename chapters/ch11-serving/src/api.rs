//! The OpenAI API as JSON: the requests the server accepts, the responses and stream chunks it
//! sends, and its errors — with llama-server's extensions (`top_k`, `min_p`,
//! `repeat_penalty`, `repeat_last_n`, `ignore_eos`, `samplers`, `speculative.n_max`) and its
//! defaults where OpenAI's API says nothing.
//!
//! A request is parsed in two steps: serde reads the JSON into the types below (a body that is
//! not JSON, or not an object of the endpoint's shape, is a 400 naming line and column), then
//! [`Sampling::params`] reads each field as its type and checks its value, and turns them into
//! chapter 4's [`GenParams`]: a field of the wrong type or out of its domain is a 400 naming
//! it. Every field either works or is refused by name: one the engine lacks is accepted only
//! at a value that asks for nothing ([`UNSUPPORTED`]), and an unknown one is refused as
//! OpenAI's API refuses it.

use ch02::Message;
use ch04::{GenParams, IgnoreEos, MakeRule, SamplerParams, StopReason};
use ch07::Proposer;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Most stop strings a request may give (OpenAI allows 4).
pub const MAX_STOP_STRINGS: usize = 16;
/// Longest stop string, in bytes: a stop string is matched against the streamed text at every
/// token, so its length is work per token.
pub const MAX_STOP_BYTES: usize = 1024;
/// OpenAI's largest `temperature`: above it sampling is close to uniform noise.
pub const MAX_TEMPERATURE: f32 = 2.0;

/// Longest piece of a request that an error message repeats (a model name, a path, a role):
/// a client's string is echoed, not its megabyte.
pub const MAX_ECHOED_CHARS: usize = 64;

/// `s` as an error message repeats it: at most [`MAX_ECHOED_CHARS`] characters, then "…".
pub fn echo(s: &str) -> String {
    match s.char_indices().nth(MAX_ECHOED_CHARS) {
        None => s.to_string(),
        Some((cut, _)) => format!("{}…", &s[..cut]),
    }
}

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
    /// llama-server's fields: most tokens guessed ahead per step for this request (0: none),
    /// where the server guesses ([`Guessing`]; the server's own limit bounds it); guesses to
    /// check each step whatever they cost; and the probability a guess must have (only 0:
    /// [`Guessing`] is asked for a number of guesses, with no probability to hold them to).
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
    ("prediction", &[], "the server takes no predicted output"),
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

// ANCHOR: cancel
/// Set when the request it belongs to is given up — its client disconnected, its time ran
/// out, or the server is shutting down — so that work done for it on another thread can stop
/// early instead of finishing for nobody. Cloning shares the flag.
#[derive(Debug, Clone, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    /// Give the request up.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Whether the request has been given up.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}
// ANCHOR_END: cancel

// ANCHOR: formats
/// What a request may ask of its output's form — OpenAI's `response_format`, llama-server's
/// `grammar` — turned into a rule of the sampler ([`MakeRule`]). The server holds one value
/// of this ([`ServeArgs::formats`](crate::ServeArgs::formats)): this chapter's [`TextOnly`],
/// or a richer one that a later chapter hands in.
pub trait Formats: Send + Sync + std::fmt::Debug {
    /// The rule for a request with these fields (`None` where absent); `Ok(None)` for plain
    /// text; a 400 naming the field for what cannot be done. The server calls it on a
    /// blocking thread, the request holding its place; work that can take long looks at
    /// `cancel` now and then and gives up once it is set (the client left, or the request's
    /// time ran out).
    fn rule(
        &self,
        response_format: Option<&RawValue>,
        grammar: Option<&Value>,
        cancel: &Cancel,
    ) -> Result<Option<Arc<dyn MakeRule>>, ApiError>;

    /// Get ready for the model's vocabulary, once, when the server loads it (before any request
    /// waits for it). Plain text needs nothing.
    fn prepare(&self, _tokenizer: &ch02::Tokenizer) {}
}

/// Plain text only: `response_format` `{"type": "text"}` (what clients send by default), no
/// `grammar`; anything else is refused by name.
#[derive(Debug, Clone, Copy, Default)]
pub struct TextOnly;

impl Formats for TextOnly {
    fn rule(
        &self,
        response_format: Option<&RawValue>,
        grammar: Option<&Value>,
        _: &Cancel,
    ) -> Result<Option<Arc<dyn MakeRule>>, ApiError> {
        let format: Option<Value> =
            response_format.and_then(|r| serde_json::from_str(r.get()).ok());
        if format.is_some_and(|v| !v.is_null() && v != json!({"type": "text"})) {
            return Err(ApiError::invalid(
                "response_format",
                "`response_format` is not supported \
                 (this server accepts only {\"type\": \"text\"})",
            ));
        }
        if grammar.is_some_and(|v| !v.is_null()) {
            return Err(ApiError::invalid(
                "grammar",
                "`grammar` is not supported (this server generates plain text)",
            ));
        }
        Ok(None)
    }
}
// ANCHOR_END: formats

// ANCHOR: guessing
/// Who guesses a request's next tokens for chapter 7's scheduler to check ([`Proposer`]). The
/// server holds one value of this ([`ServeArgs::guessing`](crate::ServeArgs::guessing)): this
/// chapter's [`NoGuessing`], or one that a later chapter hands in. Guesses never change what a
/// request generates, only how many steps it takes.
pub trait Guessing: Send + Sync + std::fmt::Debug {
    /// A proposer for a request whose `speculative.n_max` and `speculative.n_min` are `n_max`
    /// and `n_min` (`None` where absent): `None` for no guessing.
    fn proposer(&self, n_max: Option<u64>, n_min: Option<u64>) -> Option<Box<dyn Proposer + Send>>;
}

/// Guesses nothing: every request decodes a token a step.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoGuessing;

impl Guessing for NoGuessing {
    fn proposer(&self, _: Option<u64>, _: Option<u64>) -> Option<Box<dyn Proposer + Send>> {
        None
    }
}
// ANCHOR_END: guessing

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

/// `POST /v1/chat/completions`.
#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessage>,
    #[serde(flatten)]
    pub sampling: Sampling,
}

#[derive(Debug, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    /// A string, a list of parts (`{"type": "text", "text": …}`), or null (only in an
    /// assistant turn, which may have called tools instead).
    #[serde(default)]
    pub content: Option<Content>,
    /// A participant's name: refused, since the chat templates have no place for it.
    #[serde(default)]
    pub name: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Deserialize)]
pub struct Part {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

/// `POST /v1/completions`.
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub prompt: Prompt,
    #[serde(default)]
    pub echo: bool,
    pub suffix: Option<String>,
    #[serde(flatten)]
    pub sampling: Sampling,
}

/// `prompt`: a string, a list of one string, or token ids.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
}

/// The roles a message may have. The role is written among the template's markers, so it is
/// never free text.
pub const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

impl ChatRequest {
    /// The conversation as chapter 2's messages: at least one, each checked by
    /// [`ChatMessage::to_message`].
    pub fn messages(&self) -> Result<Vec<Message>, ApiError> {
        if self.messages.is_empty() {
            return Err(ApiError::invalid(
                "messages",
                "`messages` must not be empty",
            ));
        }
        self.messages
            .iter()
            .enumerate()
            .map(|(i, m)| m.to_message(i))
            .collect()
    }
}

// ANCHOR: message
impl ChatMessage {
    /// Message `i` of a conversation as chapter 2's message, or a 400 naming what is wrong: a
    /// role outside [`ROLES`] (`developer` is OpenAI's newer name for `system`), a participant's
    /// name, no content outside an assistant's turn, a part that is not text.
    pub fn to_message(&self, i: usize) -> Result<Message, ApiError> {
        // ANCHOR: yours_message
        if !ROLES.contains(&self.role.as_str()) {
            return Err(ApiError::invalid(
                "messages",
                format!(
                    "messages[{i}].role is {:?}; expected one of {}",
                    echo(&self.role),
                    ROLES.join(", ")
                ),
            ));
        }
        let role = if self.role == "developer" {
            "system"
        } else {
            &self.role
        };
        if self.name.as_ref().is_some_and(|n| !n.is_null()) {
            return Err(ApiError::invalid(
                "messages",
                format!(
                    "messages[{i}].name is not supported: the chat template has no place for a \
                     participant's name"
                ),
            ));
        }
        let content = match &self.content {
            None if self.role == "assistant" => String::new(),
            None => {
                return Err(ApiError::invalid(
                    "messages",
                    format!(
                        "messages[{i}].content is missing or null; only an assistant message may \
                         have none"
                    ),
                ));
            }
            Some(c) => c.text(i)?,
        };
        Ok(Message::new(role, &content))
        // ANCHOR_END: yours_message
    }
}
// ANCHOR_END: message

impl Content {
    /// The text of message `i`'s content: a string as it is, or its text parts joined (a part
    /// of another type is a 400).
    pub fn text(&self, i: usize) -> Result<String, ApiError> {
        let parts = match self {
            Content::Text(t) => return Ok(t.clone()),
            Content::Parts(parts) => parts,
        };
        let mut text = String::new();
        for (j, p) in parts.iter().enumerate() {
            match (p.kind.as_str(), &p.text) {
                ("text", Some(t)) => text.push_str(t),
                (kind, _) => {
                    return Err(ApiError::invalid(
                        "messages",
                        format!(
                            "messages[{i}].content[{j}] is of type {:?}: this model reads text \
                             parts only",
                            echo(kind)
                        ),
                    ));
                }
            }
        }
        Ok(text)
    }
}

impl CompletionRequest {
    /// The prompt: text to tokenize, or token ids as given.
    pub fn prompt(&self) -> Result<Prompt, ApiError> {
        if self.echo {
            return Err(ApiError::invalid("echo", "`echo` is not supported"));
        }
        if self.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::invalid("suffix", "`suffix` is not supported"));
        }
        match &self.prompt {
            Prompt::Texts(t) if t.len() != 1 => Err(ApiError::invalid(
                "prompt",
                format!(
                    "`prompt` is a list of {} strings; this server completes one prompt per request",
                    t.len()
                ),
            )),
            Prompt::Texts(t) => Ok(Prompt::Text(t[0].clone())),
            Prompt::Text(t) => Ok(Prompt::Text(t.clone())),
            Prompt::Tokens(t) => Ok(Prompt::Tokens(t.clone())),
        }
    }
}

impl Sampling {
    /// Chapter 4's parameters from the request, with llama-server's defaults for what it
    /// leaves out (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, a random seed) and no
    /// token limit but the context's. A value of the wrong type or out of its domain, a field
    /// the engine lacks at a value that asks for something, and an unknown field are each a
    /// 400 naming the field.
    pub fn params(&self) -> Result<(GenParams, Option<usize>), ApiError> {
        self.check_rest()?;
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

    /// This request's `speculative.n_max`, for [`Guessing::proposer`] (checked by
    /// [`Sampling::params`]).
    pub fn speculative_n_max(&self) -> Option<u64> {
        self.speculative().ok().and_then(|(n_max, _)| n_max)
    }

    /// This request's `speculative.n_min`, for [`Guessing::proposer`] (checked by
    /// [`Sampling::params`]).
    pub fn speculative_n_min(&self) -> Option<u64> {
        self.speculative().ok().and_then(|(_, n_min)| n_min)
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
                    "`speculative.p_min` is {p}; this server accepts only 0: a request's guesses \
                     are a number of tokens, not held to a probability"
                ),
            ));
        }
        Ok((n_max, n_min))
    }

    /// The fields in [`Sampling::rest`]: an unknown one is refused in OpenAI's words, one of
    /// [`UNSUPPORTED`] unless it asks for nothing.
    fn check_rest(&self) -> Result<(), ApiError> {
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
    fn check_samplers(&self) -> Result<(), ApiError> {
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

/// A seed for a request that gives none: different for every request.
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now())
}

/// OpenAI's `finish_reason`: `stop` for an end-of-generation token or a stop string, `length`
/// for the token limit, the context, or the server's time limit.
pub fn finish_reason(stop: StopReason) -> &'static str {
    match stop {
        StopReason::EndOfGeneration | StopReason::StopString => "stop",
        StopReason::MaxTokens | StopReason::ContextFull | StopReason::Cancelled => "length",
    }
}

/// Token counts of a finished request.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens found in the prefix cache.
    pub cached_tokens: usize,
    /// Tokens guessed ahead and checked, and those the model agreed with.
    pub proposed_tokens: usize,
    pub accepted_tokens: usize,
}

impl Usage {
    /// OpenAI's usage object. A request whose tokens were guessed ahead also gets
    /// `completion_tokens_details` with OpenAI's names for guessed tokens kept and thrown away
    /// (`accepted_prediction_tokens`, `rejected_prediction_tokens`).
    pub fn to_json(self) -> Value {
        let mut v = json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": { "cached_tokens": self.cached_tokens },
        });
        if self.proposed_tokens > 0 {
            v["completion_tokens_details"] = json!({
                "accepted_prediction_tokens": self.accepted_tokens,
                "rejected_prediction_tokens": self.proposed_tokens - self.accepted_tokens,
            });
        }
        v
    }
}

/// Which endpoint a response is for: the two differ in object names and in where the text goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
}

/// The fixed fields of one response: its id, creation time and model.
#[derive(Debug, Clone)]
pub struct Head {
    pub endpoint: Endpoint,
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl Head {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completions, _) => "text_completion",
        }
    }

    fn with_choices(&self, chunk: bool, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }

    /// The whole answer of a request without `stream`.
    pub fn response(&self, text: &str, stop: StopReason, usage: Usage) -> Value {
        let choice = match self.endpoint {
            Endpoint::Chat => json!({
                "index": 0,
                "message": { "role": "assistant", "content": text },
                "logprobs": null,
                "finish_reason": finish_reason(stop),
            }),
            Endpoint::Completions => json!({
                "index": 0,
                "text": text,
                "logprobs": null,
                "finish_reason": finish_reason(stop),
            }),
        };
        let mut v = self.with_choices(false, json!([choice]));
        v["usage"] = usage.to_json();
        v
    }

    // ANCHOR: chunk
    /// A stream chunk: the first one of a chat names the role; text chunks carry a delta; the
    /// last carries the finish reason.
    pub fn chunk(&self, text: Option<&str>, first: bool, stop: Option<StopReason>) -> Value {
        // ANCHOR: yours_chunk
        let finish = stop.map(finish_reason);
        let choice = match self.endpoint {
            Endpoint::Chat => {
                let mut delta = serde_json::Map::new();
                if first {
                    delta.insert("role".into(), "assistant".into());
                }
                if let Some(t) = text {
                    delta.insert("content".into(), t.into());
                }
                json!({ "index": 0, "delta": delta, "logprobs": null, "finish_reason": finish })
            }
            Endpoint::Completions => json!({
                "index": 0,
                "text": text.unwrap_or(""),
                "logprobs": null,
                "finish_reason": finish,
            }),
        };
        self.with_choices(true, json!([choice]))
        // ANCHOR_END: yours_chunk
    }
    // ANCHOR_END: chunk

    /// The chunk after the last choice when the client asked for `include_usage`.
    pub fn usage_chunk(&self, usage: Usage) -> Value {
        let mut v = self.with_choices(true, json!([]));
        v["usage"] = usage.to_json();
        v
    }
}

/// An error as OpenAI's API sends it: a status, and `{"error": {message, type, param, code}}`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub kind: &'static str,
    pub message: String,
    pub param: Option<&'static str>,
    pub code: Option<&'static str>,
    /// Seconds a client should wait before it tries again (`Retry-After`).
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: u16, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            kind,
            message: message.into(),
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// A parameter out of its domain: 400.
    pub fn invalid(param: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            param: Some(param),
            ..ApiError::new(400, "invalid_request_error", message)
        }
    }

    /// Fields the server does not know: 400 in OpenAI's words, naming them (a few, each at
    /// most a line; OpenAI's `param` is null here too).
    pub fn unrecognized(names: &[&str]) -> ApiError {
        const SHOWN: usize = 8;
        let mut list: Vec<String> = names.iter().take(SHOWN).map(|n| echo(n)).collect();
        if names.len() > SHOWN {
            list.push(format!("and {} more", names.len() - SHOWN));
        }
        let s = if names.len() == 1 { "" } else { "s" };
        ApiError::new(
            400,
            "invalid_request_error",
            format!(
                "Unrecognized request argument{s} supplied: {}",
                list.join(", ")
            ),
        )
    }

    /// A body that is not the JSON the endpoint reads: 400.
    pub fn bad_json(e: &serde_json::Error) -> ApiError {
        ApiError::new(
            400,
            "invalid_request_error",
            format!("the request body is not valid: {e}"),
        )
    }

    /// A body over the server's limit: 413.
    pub fn too_large(limit: usize) -> ApiError {
        ApiError {
            code: Some("request_too_large"),
            ..ApiError::new(
                413,
                "invalid_request_error",
                format!("the request body is larger than the server's limit of {limit} bytes"),
            )
        }
    }

    /// A model this server does not serve: 404.
    pub fn unknown_model(asked: &str, served: &str) -> ApiError {
        ApiError {
            param: Some("model"),
            code: Some("model_not_found"),
            ..ApiError::new(
                404,
                "invalid_request_error",
                format!(
                    "the model {:?} does not exist here; this server serves {served:?}",
                    echo(asked)
                ),
            )
        }
    }

    /// A prompt that does not fit the context: 400, saying how many tokens fit.
    pub fn context(param: &'static str, prompt: usize, n_ctx: usize) -> ApiError {
        ApiError::context_exceeded(
            param,
            format!(
                "the prompt is {prompt} tokens; the context holds {n_ctx} positions, so at most \
                 {n_ctx} prompt tokens (prompt and completion together are at most {} tokens: \
                 the last one generated takes no position)",
                n_ctx + 1
            ),
        )
    }

    /// A prompt with more bytes of text than the context's tokens can cover: 400, before it
    /// is tokenized.
    pub fn too_long_text(param: &'static str, bytes: usize, max: usize, n_ctx: usize) -> ApiError {
        ApiError::context_exceeded(
            param,
            format!(
                "the prompt is {bytes} bytes of text; the context holds {n_ctx} tokens, which \
                 cover at most {max} bytes"
            ),
        )
    }

    /// OpenAI's `context_length_exceeded`: 400 on `param`.
    fn context_exceeded(param: &'static str, message: String) -> ApiError {
        ApiError {
            param: Some(param),
            code: Some("context_length_exceeded"),
            ..ApiError::new(400, "invalid_request_error", message)
        }
    }

    /// Every place in the queue is taken: 503 with `Retry-After`.
    pub fn busy(limit: usize, retry_after: u64) -> ApiError {
        ApiError {
            code: Some("server_busy"),
            retry_after: Some(retry_after),
            ..ApiError::new(
                503,
                "unavailable_error",
                format!(
                    "the server is busy: {limit} requests are running or waiting, as many as it \
                     holds; try again in {retry_after} s"
                ),
            )
        }
    }

    /// The model is still loading: 503.
    pub fn loading() -> ApiError {
        ApiError {
            code: Some("loading"),
            retry_after: Some(1),
            ..ApiError::new(503, "unavailable_error", "the model is loading")
        }
    }

    /// The server is shutting down and takes no new requests: 503, to be retried elsewhere.
    pub fn shutting_down() -> ApiError {
        ApiError {
            code: Some("shutting_down"),
            retry_after: Some(1),
            ..ApiError::new(
                503,
                "unavailable_error",
                "the server is shutting down and takes no new requests",
            )
        }
    }

    /// The server shut down before the request finished (its drain limit was reached): 503,
    /// to be sent again elsewhere. Not a finish reason: the text is cut short, not complete.
    pub fn ended_by_shutdown() -> ApiError {
        ApiError {
            code: Some("shutting_down"),
            retry_after: Some(1),
            ..ApiError::new(
                503,
                "unavailable_error",
                "the server shut down before the request finished; send it again",
            )
        }
    }

    /// No such endpoint: 404.
    pub fn not_found(path: &str) -> ApiError {
        ApiError::new(
            404,
            "invalid_request_error",
            format!(
                "no endpoint {}; this server has /v1/chat/completions, /v1/completions, /v1/models and /health",
                echo(path)
            ),
        )
    }

    /// A method the endpoint does not take: 405.
    pub fn wrong_method(method: &str, path: &str) -> ApiError {
        ApiError::new(
            405,
            "invalid_request_error",
            format!("{path} does not take {method}"),
        )
    }

    /// Something failed inside the server: 500.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(500, "server_error", message)
    }

    pub fn body(&self) -> Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status, self.message)
    }
}

impl std::error::Error for ApiError {}

#[cfg(test)]
mod tests {
    use super::*;

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
            ("prediction", json!({"type": "content", "content": "x"})),
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
            "prompt_cache_key": "tenant-7"});
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

    #[test]
    fn a_message_needs_content_unless_it_is_the_assistants_and_has_no_name() {
        for (message, expect) in [
            (
                json!({"role": "user", "content": null}),
                "messages[0].content",
            ),
            (json!({"role": "system"}), "messages[0].content"),
            (
                json!({"role": "user", "content": "Hi", "name": "bob"}),
                "messages[0].name",
            ),
        ] {
            let r: ChatRequest = serde_json::from_value(json!({ "messages": [message] })).unwrap();
            let e = r.messages().unwrap_err();
            assert_eq!(e.param, Some("messages"));
            assert!(e.message.contains(expect), "{}", e.message);
        }
        // What clients send that must pass: a name that is JSON null (some clients write every
        // field), and an assistant's turn with no content.
        for message in [
            json!({"role": "user", "content": "Hi", "name": null}),
            json!({"role": "assistant"}),
            json!({"role": "assistant", "content": null, "name": null}),
        ] {
            let r: ChatRequest =
                serde_json::from_value(json!({ "messages": [message.clone()] })).unwrap();
            let m = r
                .messages()
                .unwrap_or_else(|e| panic!("{message} refused: {}", e.message));
            assert_eq!(m.len(), 1, "{message}");
        }
    }

    #[test]
    fn stream_chunks_have_openais_shape() {
        let head = |endpoint| Head {
            endpoint,
            id: "chatcmpl-7".into(),
            created: 1,
            model: "m".into(),
        };
        let chat = head(Endpoint::Chat);
        let first = chat.chunk(Some(""), true, None);
        assert_eq!(first["object"], "chat.completion.chunk");
        assert_eq!(
            (&first["id"], &first["created"]),
            (&json!("chatcmpl-7"), &json!(1))
        );
        assert_eq!(
            first["choices"],
            json!([{"index": 0, "delta": {"role": "assistant", "content": ""},
                    "logprobs": null, "finish_reason": null}])
        );
        let text = chat.chunk(Some(" Paris"), false, None);
        assert_eq!(text["choices"][0]["delta"], json!({"content": " Paris"}));
        assert_eq!(text["choices"][0]["finish_reason"], Value::Null);
        let last = chat.chunk(None, false, Some(StopReason::EndOfGeneration));
        assert_eq!(last["choices"][0]["delta"], json!({}));
        assert_eq!(last["choices"][0]["finish_reason"], "stop");
        let completion = head(Endpoint::Completions);
        let c = completion.chunk(Some(" Paris"), false, None);
        assert_eq!(c["object"], "text_completion");
        assert_eq!(
            c["choices"],
            json!([{"index": 0, "text": " Paris", "logprobs": null, "finish_reason": null}])
        );
        let c = completion.chunk(None, false, Some(StopReason::MaxTokens));
        assert_eq!(
            (&c["choices"][0]["text"], &c["choices"][0]["finish_reason"]),
            (&json!(""), &json!("length"))
        );
    }

    #[test]
    fn an_error_repeats_at_most_a_line_of_what_the_client_sent() {
        let e = ApiError::unknown_model(&"m".repeat(1 << 20), "smol");
        assert!(e.message.len() < 200, "{}", e.message.len());
        assert_eq!(echo("short"), "short");
        assert_eq!(echo(&"é".repeat(100)).chars().count(), MAX_ECHOED_CHARS + 1);
    }

    #[test]
    fn messages_take_text_parts_and_refuse_unknown_roles() {
        let r: ChatRequest = serde_json::from_value(json!({"messages": [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "!"}]},
            {"role": "assistant", "content": null},
        ]}))
        .unwrap();
        let m = r.messages().unwrap();
        assert_eq!(m[0], Message::new("system", "Be brief."));
        assert_eq!(m[1], Message::new("user", "Hi!"));
        assert_eq!(m[2], Message::new("assistant", ""));
        let r: ChatRequest =
            serde_json::from_value(json!({"messages": [{"role": "<|im_start|>", "content": ""}]}))
                .unwrap();
        assert!(
            r.messages()
                .unwrap_err()
                .message
                .contains("messages[0].role")
        );
    }
}
