//! What the other APIs share: a request of theirs becomes a chat request ([`ChatBody`]), the
//! chat path answers it, and its answer — one chat completion, or a stream of chunks — becomes
//! theirs ([`Relay`]). Schemas and call arguments pass through as the client wrote them
//! (`RawValue`), so their keys keep their order: the prompt and the grammar follow it.

use crate::conversation::FieldError;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// An API's answer translated from the chat's: the whole answer of a request without
/// `stream`, or, for a stream, the events each chunk makes (an event's name and its data).
pub trait Relay: Send + Sync {
    /// The chat completion, as this API's answer.
    fn answer(&mut self, chat: &Value) -> String;
    /// A chunk of the chat's stream (or its error): the events it makes.
    fn chunk(&mut self, chunk: &Value) -> Vec<Event>;
    /// The chat's stream has ended (`[DONE]`, or the connection): the last events.
    fn done(&mut self) -> Vec<Event>;
    /// An error the chat path answered with (OpenAI's body), as this API's body.
    fn error(&self, status: u16, error: &Value) -> Value;
}

/// An event of a stream: its name (SSE's `event:`) and its data.
pub type Event = (&'static str, Value);

/// A chat request made from another API's: its fields, and its tools and response format,
/// whose schemas are the client's text.
#[derive(Serialize, Default)]
pub struct ChatBody<'a> {
    #[serde(flatten)]
    pub fields: Map<String, Value>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ChatTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_format: Option<JsonSchemaFormat<'a>>,
}

/// A function tool, as chat requests give it.
#[derive(Serialize)]
pub struct ChatTool<'a> {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: ChatFunction<'a>,
}

#[derive(Serialize)]
pub struct ChatFunction<'a> {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub parameters: &'a RawValue,
}

/// `response_format` of a chat request: `json_object`, or `json_schema` with its schema.
#[derive(Serialize)]
pub struct JsonSchemaFormat<'a> {
    #[serde(rename = "type")]
    pub kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub json_schema: Option<NamedSchema<'a>>,
}

#[derive(Serialize)]
pub struct NamedSchema<'a> {
    pub name: String,
    pub schema: &'a RawValue,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

impl ChatBody<'_> {
    /// Stream the answer, with the usage as the stream's last chunk (the other APIs report
    /// it in their last events).
    pub fn stream(&mut self) {
        self.fields.insert("stream".into(), true.into());
        let usage = serde_json::json!({"include_usage": true});
        self.fields.insert("stream_options".into(), usage);
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("strings, numbers and JSON text")
    }
}

/// A request's top-level fields, each still the client's text.
pub type Fields<'a> = BTreeMap<String, &'a RawValue>;

/// The request's fields, refusing any not in `known` by name (`api` names the API).
pub fn fields<'a>(body: &'a str, known: &[&str], api: &str) -> Result<Fields<'a>, FieldError> {
    let fields: Fields =
        serde_json::from_str(body).map_err(|e| FieldError::new("body", "body", e.to_string()))?;
    if let Some(k) = fields.keys().find(|k| !known.contains(&k.as_str())) {
        let message = format!("`{k}` is not supported by this server's {api}");
        return Err(FieldError::new("body", k.clone(), message));
    }
    Ok(fields)
}

/// Field `name` read as a `T`, if present and not null.
pub fn field<'a, T: Deserialize<'a>>(
    fields: &Fields<'a>,
    name: &'static str,
) -> Result<Option<T>, FieldError> {
    match fields.get(name) {
        None => Ok(None),
        Some(raw) if raw.get() == "null" => Ok(None),
        Some(raw) => serde_json::from_str(raw.get())
            .map(Some)
            .map_err(|e| FieldError::new(name, name, e.to_string())),
    }
}

/// `raw` read as a `T`, an error naming `path` otherwise.
pub fn read<'a, T: Deserialize<'a>>(
    raw: &'a RawValue,
    field: &'static str,
    path: &str,
) -> Result<T, FieldError> {
    serde_json::from_str(raw.get()).map_err(|e| FieldError::new(field, path, e.to_string()))
}

/// The text of content that is a string or a list of text blocks (`{"type": T, "text": …}`
/// with `T` one of `kinds`), as chat content: the string, or the list of text parts.
pub fn text_content(
    raw: &RawValue,
    kinds: &[&str],
    field: &'static str,
    path: &str,
) -> Result<Value, FieldError> {
    if let Ok(s) = serde_json::from_str::<String>(raw.get()) {
        return Ok(Value::String(s));
    }
    #[derive(Deserialize)]
    struct Part {
        #[serde(rename = "type")]
        kind: String,
        text: Option<String>,
    }
    let parts: Vec<Part> = read(raw, field, path)?;
    let mut out = Vec::with_capacity(parts.len());
    for (i, p) in parts.into_iter().enumerate() {
        match (kinds.contains(&p.kind.as_str()), p.text) {
            (true, Some(text)) => out.push(serde_json::json!({"type": "text", "text": text})),
            (true, None) => {
                return Err(FieldError::new(
                    field,
                    format!("{path}[{i}].text"),
                    "missing",
                ));
            }
            (false, _) => {
                let message = format!(
                    "a `{}` part is not supported (this server reads text: {})",
                    p.kind,
                    kinds.join(", ")
                );
                return Err(FieldError::new(field, format!("{path}[{i}].type"), message));
            }
        }
    }
    Ok(Value::Array(out))
}

/// An error of the chat path (OpenAI's body) about the chat request's fields, told in the
/// names of the API's request: each `(chat's, API's)` pair of `names` renamed in its `param` and
/// in its message (where it is quoted: `` `max_tokens` ``).
pub fn renamed(error: &Value, names: &[(&str, &str)]) -> Value {
    let mut e = error.clone();
    for &(ours, theirs) in names {
        if e["error"]["param"] == ours {
            e["error"]["param"] = theirs.into();
        }
        if let Some(m) = e["error"]["message"].as_str() {
            let m = m.replace(&format!("`{ours}`"), &format!("`{theirs}`"));
            e["error"]["message"] = m.into();
        }
    }
    e
}

/// The model the chat answered with (its answer's or chunk's `model`), where the client named
/// none.
pub fn name_model(model: &mut String, chat: &Value) {
    if model.is_empty() {
        *model = chat["model"].as_str().unwrap_or_default().to_string();
    }
}

/// The chat's answer: its message's reasoning, content and calls, its finish reason, usage.
pub struct ChatAnswer<'a> {
    pub reasoning: Option<&'a str>,
    pub content: Option<&'a str>,
    /// Each call's id, function name and arguments (JSON text).
    pub calls: Vec<(&'a str, &'a str, &'a str)>,
    pub finish_reason: &'a str,
    pub usage: Usage,
}

/// Tokens read and written, and of those read, how many the prefix cache held.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt: u64,
    pub completion: u64,
    pub cached: u64,
}

impl Usage {
    pub fn of(usage: &Value) -> Usage {
        let n = |v: &Value| v.as_u64().unwrap_or(0);
        Usage {
            prompt: n(&usage["prompt_tokens"]),
            completion: n(&usage["completion_tokens"]),
            cached: n(&usage["prompt_tokens_details"]["cached_tokens"]),
        }
    }
}

impl<'a> ChatAnswer<'a> {
    pub fn of(chat: &'a Value) -> ChatAnswer<'a> {
        let choice = &chat["choices"][0];
        let message = &choice["message"];
        let text = |v: &'a Value| v.as_str().filter(|s| !s.is_empty());
        let calls = message["tool_calls"]
            .as_array()
            .map_or(Vec::new(), |calls| {
                (calls.iter())
                    .map(|c| {
                        let f = &c["function"];
                        let s = |v: &'a Value| v.as_str().unwrap_or("");
                        (s(&c["id"]), s(&f["name"]), s(&f["arguments"]))
                    })
                    .collect()
            });
        ChatAnswer {
            reasoning: text(&message["reasoning_content"]),
            content: text(&message["content"]),
            calls,
            finish_reason: choice["finish_reason"].as_str().unwrap_or("stop"),
            usage: Usage::of(&chat["usage"]),
        }
    }
}

/// A part of a chat stream's chunk, in the order it came.
#[derive(Debug, PartialEq)]
pub enum ChunkPart<'a> {
    Reasoning(&'a str),
    Content(&'a str),
    /// Call `index` begins: its id and name.
    Call(usize, &'a str, &'a str),
    Arguments(usize, &'a str),
    Finish(&'a str),
    Usage(Usage),
}

/// The parts of a chat stream's chunk.
pub fn chunk_parts(chunk: &Value) -> Vec<ChunkPart<'_>> {
    fn text(v: &Value) -> Option<&str> {
        v.as_str().filter(|s| !s.is_empty())
    }
    let mut parts = Vec::new();
    if let Some(choice) = chunk["choices"].get(0) {
        let delta = &choice["delta"];
        if let Some(t) = text(&delta["reasoning_content"]) {
            parts.push(ChunkPart::Reasoning(t));
        }
        if let Some(t) = text(&delta["content"]) {
            parts.push(ChunkPart::Content(t));
        }
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            let index = call["index"].as_u64().unwrap_or(0) as usize;
            if let Some(id) = call["id"].as_str() {
                let name = call["function"]["name"].as_str().unwrap_or("");
                parts.push(ChunkPart::Call(index, id, name));
            }
            if let Some(a) = text(&call["function"]["arguments"]) {
                parts.push(ChunkPart::Arguments(index, a));
            }
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            parts.push(ChunkPart::Finish(f));
        }
    }
    if chunk["usage"].is_object() {
        parts.push(ChunkPart::Usage(Usage::of(&chunk["usage"])));
    }
    parts
}
