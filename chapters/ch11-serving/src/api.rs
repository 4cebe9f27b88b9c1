//! The OpenAI API as JSON: the requests the server accepts, the responses and stream chunks it
//! sends, and its errors — with llama-server's extensions (`top_k`, `min_p`,
//! `repeat_penalty`) and its defaults where OpenAI's API says nothing.
//!
//! A request is parsed in two steps: serde reads the JSON into the types below (a malformed
//! body or a wrong type is a 400 naming line, column and field), then [`Sampling::params`]
//! checks the values and turns them into chapter 4's [`GenParams`].

use ch10::{GenParams, MakeRule, Message, Proposer, SamplerParams, StopReason};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use std::sync::Arc;

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

/// The sampling and length fields common to both endpoints. Fields OpenAI defines that the
/// engine cannot honour are refused by name rather than ignored ([`Sampling::params`]); an
/// unknown field is ignored, as OpenAI's API and llama-server ignore it.
#[derive(Debug, Default, Deserialize)]
pub struct Sampling {
    pub model: Option<String>,
    /// At least 1; absent, generation runs until the context is full.
    pub max_tokens: Option<i64>,
    /// The chat endpoint's newer name for `max_tokens`.
    pub max_completion_tokens: Option<i64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub seed: Option<u64>,
    pub stop: Option<Stop>,
    pub n: Option<u64>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub logprobs: Option<Value>,
    pub tools: Option<Vec<Value>>,
    /// The form of the output: OpenAI's `{"type": "text"}`, or what the server's [`Formats`]
    /// accept (they are handed its text, so that a JSON schema's properties keep their order).
    pub response_format: Option<Value>,
    /// llama-server's field: a GBNF grammar the output must follow, where [`Formats`] accept it.
    pub grammar: Option<Value>,
    /// llama-server's field: most tokens guessed ahead per step for this request (0: none),
    /// where the server guesses ([`Guessing`]); the server's own limit bounds it.
    #[serde(rename = "speculative.n_max")]
    pub speculative_n_max: Option<u64>,
    /// llama-server's field: guesses to check each step whatever they cost.
    #[serde(rename = "speculative.n_min")]
    pub speculative_n_min: Option<u64>,
    /// Refused unless they ask for what the server does anyway (see [`UNSUPPORTED`]).
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<Value>,
    pub logit_bias: Option<Value>,
    pub top_logprobs: Option<Value>,
    pub best_of: Option<Value>,
    pub user: Option<Value>,
}

/// OpenAI's fields the engine does not implement, each with the values that ask for nothing
/// (what the server does anyway): any other value is a 400 naming the field, never ignored.
/// `user` (an end-user id for the provider's abuse monitoring) is refused because this server
/// keeps no such records. (`response_format` and `grammar` are the [`Formats`]'.)
pub const UNSUPPORTED: [(&str, &str); 6] = [
    ("tool_choice", r#""none""#),
    ("parallel_tool_calls", "false"),
    ("logit_bias", "{}"),
    ("top_logprobs", "0"),
    ("best_of", "1"),
    ("user", "no value"),
];

// ANCHOR: formats
/// What a request may ask of its output's form — OpenAI's `response_format`, llama-server's
/// `grammar` — turned into a rule of the sampler ([`MakeRule`]). The server holds one value
/// of this ([`ServeArgs::formats`](crate::ServeArgs::formats)): this chapter's [`TextOnly`],
/// or a richer one that a later chapter hands in.
pub trait Formats: Send + Sync + std::fmt::Debug {
    /// The rule for a request with these fields (`None` where absent); `Ok(None)` for plain
    /// text; a 400 naming the field for what cannot be done.
    fn rule(
        &self,
        response_format: Option<&RawValue>,
        grammar: Option<&Value>,
    ) -> Result<Option<Arc<dyn MakeRule>>, ApiError>;

    /// Get ready for the model's vocabulary, once, when the server loads it (before any request
    /// waits for it). Plain text needs nothing.
    fn prepare(&self, _tokenizer: &ch10::Tokenizer) {}
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
#[derive(Debug, Deserialize)]
#[serde(untagged)]
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
    /// token limit but the context's. Each value out of its domain is a 400 naming it.
    pub fn params(&self) -> Result<(GenParams, Option<usize>), ApiError> {
        if let Some(n) = self.n
            && n != 1
        {
            return Err(ApiError::invalid(
                "n",
                format!("`n` is {n}; this server makes one choice per request (n = 1)"),
            ));
        }
        for (name, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if v.is_some_and(|v| v != 0.0) {
                return Err(ApiError::invalid(
                    name,
                    format!("`{name}` is not supported (use repeat_penalty)"),
                ));
            }
        }
        if self
            .logprobs
            .as_ref()
            .is_some_and(|v| v != &json!(false) && !v.is_null())
        {
            return Err(ApiError::invalid("logprobs", "`logprobs` is not supported"));
        }
        if self.tools.as_ref().is_some_and(|t| !t.is_empty()) {
            return Err(ApiError::invalid("tools", "`tools` is not supported"));
        }
        let given = [
            &self.tool_choice,
            &self.parallel_tool_calls,
            &self.logit_bias,
            &self.top_logprobs,
            &self.best_of,
            &self.user,
        ];
        for ((name, harmless), v) in UNSUPPORTED.into_iter().zip(given) {
            let asks_nothing = match (name, v) {
                (_, None | Some(Value::Null)) => true,
                ("tool_choice", Some(v)) => *v == "none",
                ("parallel_tool_calls", Some(v)) => v == &json!(false),
                ("logit_bias", Some(v)) => v.as_object().is_some_and(|m| m.is_empty()),
                ("top_logprobs", Some(v)) => v == &json!(0),
                ("best_of", Some(v)) => v == &json!(1),
                _ => false,
            };
            if !asks_nothing {
                return Err(ApiError::invalid(
                    name,
                    format!("`{name}` is not supported (this server accepts only {harmless})"),
                ));
            }
        }
        for (name, v) in [
            ("max_tokens", self.max_tokens),
            ("max_completion_tokens", self.max_completion_tokens),
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
        if let Some(t) = self.temperature
            && !(0.0..=MAX_TEMPERATURE).contains(&t)
        {
            return Err(ApiError::invalid(
                "temperature",
                format!("`temperature` is {t}; OpenAI's range is 0 to {MAX_TEMPERATURE}"),
            ));
        }
        let d = SamplerParams::default();
        let top_k = match self.top_k {
            None => d.top_k,
            Some(k) if k <= 0 => 0, // llama-server: 0 or less keeps every token
            Some(k) => usize::try_from(k).unwrap_or(usize::MAX),
        };
        let sampler = SamplerParams {
            temp: self.temperature.unwrap_or(d.temp),
            top_k,
            top_p: self.top_p.unwrap_or(d.top_p),
            min_p: self.min_p.unwrap_or(d.min_p),
            repeat_penalty: self.repeat_penalty.unwrap_or(d.repeat_penalty),
            repeat_last_n: d.repeat_last_n,
            seed: self.seed.unwrap_or_else(random_seed),
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
        let stop = match &self.stop {
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
        let max_tokens = self
            .max_completion_tokens
            .or(self.max_tokens)
            .and_then(|n| usize::try_from(n).ok());
        let params = GenParams {
            max_tokens: max_tokens.unwrap_or(usize::MAX),
            sampler,
            stop,
            rule: None,
        };
        Ok((params, max_tokens))
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
                .rule(format.as_deref(), grammar.as_ref())
                .unwrap_err();
            assert_eq!((e.status, e.param), (400, Some(field)), "{}", e.message);
        }
        let text = raw(r#"{"type": "text"}"#);
        assert!(matches!(
            TextOnly.rule(Some(&text), Some(&Value::Null)),
            Ok(None)
        ));
        for (field, value) in [
            ("tool_choice", json!("auto")),
            ("parallel_tool_calls", json!(true)),
            ("logit_bias", json!({"50256": -100})),
            ("top_logprobs", json!(2)),
            ("best_of", json!(3)),
            ("user", json!("someone")),
        ] {
            let e = sampling(json!({ field: value })).unwrap_err();
            assert_eq!((e.status, e.param), (400, Some(field)), "{}", e.message);
            assert!(e.message.contains(field), "{}", e.message);
        }
        // What asks for nothing is accepted: the values clients send by default.
        let harmless = json!({"tool_choice": "none",
            "parallel_tool_calls": false, "logit_bias": {}, "top_logprobs": 0, "best_of": 1,
            "user": null});
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
