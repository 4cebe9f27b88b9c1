//! Anthropic's Messages API (`POST /v1/messages`) as a chat completion: the request becomes a
//! chat request ([`chat_request`]) — `system` a system turn, `tool_use` blocks calls,
//! `tool_result` blocks tool turns, `input_schema` a function's parameters — and the chat's
//! answer becomes a message: `thinking`, `text` and `tool_use` blocks, whole or as Anthropic's
//! stream of events ([`Messages`]).

use crate::conversation::FieldError;
use crate::relay::{
    ChatAnswer, ChatBody, ChatFunction, ChatTool, ChunkPart, Event, JsonSchemaFormat, NamedSchema,
    Relay, Usage, chunk_parts, field, fields, name_model, read, renamed, text_content,
};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Value, json};

/// The fields of a Messages request this reads. Those that change nothing here are read and
/// left: `metadata`, `service_tier`, `speed`, `inference_geo`, `diagnostics`,
/// `user_profile_id`, `workspace_id`, and `cache_control` (here or on a block), since the
/// prefix cache keeps every prompt's tokens without being asked. `temperature`, `top_p` and
/// `top_k`, which Anthropic's newer models no longer take, are still read where a client
/// sends them.
pub const FIELDS: [&str; 21] = [
    "model",
    "messages",
    "max_tokens",
    "system",
    "stop_sequences",
    "stream",
    "temperature",
    "top_p",
    "top_k",
    "tools",
    "tool_choice",
    "thinking",
    "output_config",
    "metadata",
    "service_tier",
    "speed",
    "inference_geo",
    "diagnostics",
    "user_profile_id",
    "workspace_id",
    "cache_control",
];

/// The chat's fields that are named otherwise here, for errors about them.
const RENAMED: [(&str, &str); 2] = [
    ("stop", "stop_sequences"),
    ("response_format", "output_config"),
];

#[derive(Deserialize)]
struct Turn<'a> {
    role: String,
    #[serde(borrow)]
    content: &'a RawValue,
}

#[derive(Deserialize)]
struct Block<'a> {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
    thinking: Option<String>,
    id: Option<String>,
    name: Option<String>,
    #[serde(borrow)]
    input: Option<&'a RawValue>,
    tool_use_id: Option<String>,
    #[serde(borrow)]
    content: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Tool<'a> {
    #[serde(rename = "type")]
    kind: Option<String>,
    name: String,
    description: Option<String>,
    #[serde(borrow)]
    input_schema: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct ToolChoice {
    #[serde(rename = "type")]
    kind: String,
    name: Option<String>,
    #[serde(default)]
    disable_parallel_tool_use: bool,
}

/// A Messages request (JSON text) as a chat request; `count` for `count_tokens`, which has no
/// `max_tokens`.
pub fn chat_request(body: &str, count: bool) -> Result<ChatBody<'_>, FieldError> {
    let f = fields(body, &FIELDS, "Messages API")?;
    let mut chat = ChatBody::default();
    let mut put = |k: &str, v: Value| chat.fields.insert(k.into(), v);
    put("model", field::<Value>(&f, "model")?.unwrap_or(Value::Null));
    match field::<u64>(&f, "max_tokens")? {
        Some(n) => put("max_tokens", n.into()),
        None if count => None,
        None => return Err(FieldError::new("max_tokens", "max_tokens", "required")),
    };
    for (ours, theirs) in [
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("top_k", "top_k"),
        ("stop", "stop_sequences"),
    ] {
        if let Some(v) = field::<Value>(&f, theirs)? {
            put(ours, v);
        }
    }
    // `thinking` turns a template's thinking on or off (Qwen3's `enable_thinking`).
    if let Some(t) = field::<Value>(&f, "thinking")? {
        let on = t["type"].as_str() != Some("disabled");
        put("chat_template_kwargs", json!({ "enable_thinking": on }));
    }
    // `output_config.format`: the answer's JSON Schema, held by chapter 15's grammar.
    if let Some(raw) = f.get("output_config").filter(|r| r.get() != "null") {
        #[derive(Deserialize)]
        struct Config<'a> {
            #[serde(borrow)]
            format: Option<OutputFormat<'a>>,
        }
        #[derive(Deserialize)]
        struct OutputFormat<'a> {
            #[serde(rename = "type")]
            kind: String,
            #[serde(borrow)]
            schema: Option<&'a RawValue>,
        }
        let config: Config = read(raw, "output_config", "output_config")?;
        if let Some(format) = config.format {
            let path = "output_config.format";
            if format.kind != "json_schema" {
                let message = format!("`{}`: expected json_schema", format.kind);
                return Err(FieldError::new(
                    "output_config",
                    format!("{path}.type"),
                    message,
                ));
            }
            let schema = format.schema.ok_or_else(|| {
                FieldError::new("output_config", format!("{path}.schema"), "missing")
            })?;
            chat.response_format = Some(JsonSchemaFormat {
                kind: "json_schema",
                json_schema: Some(NamedSchema {
                    name: "output".into(),
                    schema,
                    strict: Some(true),
                }),
            });
        }
    }
    let mut turns = Vec::new();
    if let Some(system) = f.get("system").filter(|r| r.get() != "null") {
        turns.push(json!({"role": "system", "content": text_content(system, &["text"], "system", "system")?}));
    }
    let messages: Vec<Turn> = match f.get("messages") {
        Some(raw) => read(raw, "messages", "messages")?,
        None => return Err(FieldError::new("messages", "messages", "required")),
    };
    for (i, m) in messages.iter().enumerate() {
        turns.extend(turn(m, &format!("messages[{i}]"))?);
    }
    put("messages", Value::Array(turns));
    let tools: Vec<Tool> = field(&f, "tools")?.unwrap_or_default();
    for (i, t) in tools.into_iter().enumerate() {
        let path = format!("tools[{i}]");
        if let Some(k) = t.kind.as_deref().filter(|k| *k != "custom") {
            let message = format!(
                "a `{k}` tool is not supported (this server runs no tools of its own: \
                 give the tool's `input_schema`, and run it yourself)"
            );
            return Err(FieldError::new("tools", format!("{path}.type"), message));
        }
        let Some(parameters) = t.input_schema else {
            return Err(FieldError::new(
                "tools",
                format!("{path}.input_schema"),
                "missing",
            ));
        };
        chat.tools.push(ChatTool {
            kind: "function",
            function: ChatFunction {
                name: t.name,
                description: t.description,
                parameters,
            },
        });
    }
    // Anthropic's models may call several tools in a turn unless told not to.
    let mut parallel = !chat.tools.is_empty();
    if let Some(c) = field::<ToolChoice>(&f, "tool_choice")? {
        let choice = match (c.kind.as_str(), c.name) {
            ("auto", _) => json!("auto"),
            ("any", _) => json!("required"),
            ("none", _) => json!("none"),
            ("tool", Some(name)) => json!({"type": "function", "function": {"name": name}}),
            ("tool", None) => {
                return Err(FieldError::new(
                    "tool_choice",
                    "tool_choice.name",
                    "missing",
                ));
            }
            (k, _) => {
                let message = format!("`{k}`: expected auto, any, tool or none");
                return Err(FieldError::new("tool_choice", "tool_choice.type", message));
            }
        };
        parallel &= !c.disable_parallel_tool_use;
        chat.fields.insert("tool_choice".into(), choice);
    }
    if !chat.tools.is_empty() {
        chat.fields
            .insert("parallel_tool_calls".into(), parallel.into());
    }
    if field::<bool>(&f, "stream")? == Some(true) {
        chat.stream();
    }
    Ok(chat)
}

/// One Anthropic turn as chat turns: a user's `tool_result` blocks become tool turns (before
/// its text, as Anthropic orders them); an assistant's `tool_use` blocks its calls, its
/// `thinking` its reasoning.
fn turn(m: &Turn, path: &str) -> Result<Vec<Value>, FieldError> {
    let field = "messages";
    if let Ok(text) = serde_json::from_str::<String>(m.content.get()) {
        return match m.role.as_str() {
            "user" | "assistant" => Ok(vec![json!({"role": m.role, "content": text})]),
            r => Err(role_error(r, path)),
        };
    }
    let blocks: Vec<Block> = read(m.content, field, &format!("{path}.content"))?;
    let (mut texts, mut out, mut calls, mut reasoning) = (Vec::new(), Vec::new(), Vec::new(), None);
    for (j, b) in blocks.into_iter().enumerate() {
        let at = format!("{path}.content[{j}]");
        let missing = |k: &str| FieldError::new(field, format!("{at}.{k}"), "missing");
        match (m.role.as_str(), b.kind.as_str()) {
            (_, "text") => {
                let text = b.text.ok_or_else(|| missing("text"))?;
                texts.push(json!({"type": "text", "text": text}));
            }
            ("user", "tool_result") => {
                let id = b.tool_use_id.ok_or_else(|| missing("tool_use_id"))?;
                let content = match b.content {
                    Some(c) => text_content(c, &["text"], field, &format!("{at}.content"))?,
                    None => Value::String(String::new()),
                };
                out.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
            }
            ("assistant", "tool_use") => {
                let (id, name) = (
                    b.id.ok_or_else(|| missing("id"))?,
                    b.name.ok_or_else(|| missing("name"))?,
                );
                let input = b.input.map_or("{}", RawValue::get);
                calls.push(json!({"id": id, "type": "function",
                                  "function": {"name": name, "arguments": input}}));
            }
            ("assistant", "thinking") => reasoning = b.thinking,
            ("assistant", "redacted_thinking") => {}
            (r @ ("user" | "assistant"), k) => {
                let message = format!("a `{k}` block is not supported in a {r} turn");
                return Err(FieldError::new(field, format!("{at}.type"), message));
            }
            (r, _) => return Err(role_error(r, path)),
        }
    }
    if m.role == "assistant" {
        let content = if texts.is_empty() {
            Value::Null
        } else {
            texts.into()
        };
        let mut t = json!({"role": "assistant", "content": content});
        if !calls.is_empty() {
            t["tool_calls"] = calls.into();
        }
        if let Some(r) = reasoning {
            t["reasoning_content"] = r.into();
        }
        out.push(t);
    } else if !texts.is_empty() || out.is_empty() {
        out.push(json!({"role": "user", "content": texts}));
    }
    Ok(out)
}

fn role_error(role: &str, path: &str) -> FieldError {
    let message =
        format!("role `{role}`: expected user or assistant (a system prompt goes in `system`)");
    FieldError::new("messages", format!("{path}.role"), message)
}

/// Anthropic's `stop_reason` for a chat's `finish_reason`.
pub fn stop_reason(finish_reason: &str) -> &'static str {
    match finish_reason {
        "tool_calls" => "tool_use",
        "length" => "max_tokens",
        _ => "end_turn",
    }
}

/// Anthropic's error `type` for an HTTP status.
pub fn error_type(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    }
}

/// Anthropic's error body.
pub fn error_body(status: u16, message: &str) -> Value {
    json!({"type": "error", "error": {"type": error_type(status), "message": message}})
}

fn usage_json(u: Usage) -> Value {
    json!({
        "input_tokens": u.prompt - u.cached.min(u.prompt),
        "output_tokens": u.completion,
        "cache_read_input_tokens": u.cached,
        "cache_creation_input_tokens": 0,
    })
}

/// A block of an answer, whole.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum OutBlock<'a> {
    Thinking {
        thinking: &'a str,
        signature: &'a str,
    },
    Text {
        text: &'a str,
    },
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: Box<RawValue>,
    },
}

/// The chat's answer relayed as a message; `model` as the client named it.
pub struct Messages {
    id: String,
    model: String,
    /// Stream: whether `message_start` went out; the open block (its index, and for a call
    /// its chat index); the blocks opened; the stop reason and usage once known.
    started: bool,
    open: Option<(usize, Open)>,
    blocks: usize,
    stop: Option<&'static str>,
    usage: Usage,
    ended: bool,
}

#[derive(Clone, Copy, PartialEq)]
enum Open {
    Thinking,
    Text,
    Call(usize),
}

impl Messages {
    pub fn new(id: &str, model: &str) -> Messages {
        Messages {
            id: format!("msg_{id}"),
            model: model.to_string(),
            started: false,
            open: None,
            blocks: 0,
            stop: None,
            usage: Usage::default(),
            ended: false,
        }
    }

    // ANCHOR: open_block
    /// Close the open block unless it is `kind`; open `kind` (with `start`, its first
    /// state) unless it is open. The open block's index.
    fn to(&mut self, kind: Open, start: Value, events: &mut Vec<Event>) -> usize {
        // ANCHOR: yours_open_block
        if let Some((i, k)) = self.open {
            if k == kind {
                return i;
            }
            events.push((
                "content_block_stop",
                json!({"type": "content_block_stop", "index": i}),
            ));
        }
        let i = self.blocks;
        self.blocks += 1;
        self.open = Some((i, kind));
        events.push((
            "content_block_start",
            json!({"type": "content_block_start", "index": i, "content_block": start}),
        ));
        i
        // ANCHOR_END: yours_open_block
    }
    // ANCHOR_END: open_block

    fn delta(i: usize, delta: Value) -> Event {
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": i, "delta": delta}),
        )
    }
}

impl Relay for Messages {
    fn answer(&mut self, chat: &Value) -> String {
        name_model(&mut self.model, chat);
        let a = ChatAnswer::of(chat);
        let mut content = Vec::new();
        if let Some(thinking) = a.reasoning {
            content.push(OutBlock::Thinking {
                thinking,
                signature: "",
            });
        }
        if let Some(text) = a.content {
            content.push(OutBlock::Text { text });
        }
        for (id, name, arguments) in a.calls {
            // Arguments cut short by `max_tokens` are not JSON: the input is then empty.
            let input = RawValue::from_string(arguments.to_string())
                .unwrap_or_else(|_| RawValue::from_string("{}".into()).expect("JSON"));
            content.push(OutBlock::ToolUse { id, name, input });
        }
        #[derive(Serialize)]
        struct Message<'a> {
            id: &'a str,
            #[serde(rename = "type")]
            kind: &'a str,
            role: &'a str,
            model: &'a str,
            content: Vec<OutBlock<'a>>,
            stop_reason: &'a str,
            stop_sequence: Option<&'a str>,
            usage: Value,
        }
        let m = Message {
            id: &self.id,
            kind: "message",
            role: "assistant",
            model: &self.model,
            content,
            stop_reason: stop_reason(a.finish_reason),
            stop_sequence: None,
            usage: usage_json(a.usage),
        };
        serde_json::to_string(&m).expect("strings and JSON text")
    }

    fn chunk(&mut self, chunk: &Value) -> Vec<Event> {
        let mut events = Vec::new();
        if !self.started {
            self.started = true;
            name_model(&mut self.model, chunk);
            let message = json!({
                "id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": usage_json(Usage::default()),
            });
            events.push((
                "message_start",
                json!({"type": "message_start", "message": message}),
            ));
        }
        if let Some(e) = chunk.get("error") {
            self.ended = true;
            let message = e["message"].as_str().unwrap_or("the request failed");
            events.push(("error", error_body(500, message)));
            return events;
        }
        for part in chunk_parts(chunk) {
            match part {
                ChunkPart::Reasoning(t) => {
                    let start = json!({"type": "thinking", "thinking": "", "signature": ""});
                    let i = self.to(Open::Thinking, start, &mut events);
                    events.push(Self::delta(
                        i,
                        json!({"type": "thinking_delta", "thinking": t}),
                    ));
                }
                ChunkPart::Content(t) => {
                    let i = self.to(Open::Text, json!({"type": "text", "text": ""}), &mut events);
                    events.push(Self::delta(i, json!({"type": "text_delta", "text": t})));
                }
                ChunkPart::Call(index, id, name) => {
                    let start = json!({"type": "tool_use", "id": id, "name": name, "input": {}});
                    self.to(Open::Call(index), start, &mut events);
                }
                ChunkPart::Arguments(index, a) => {
                    if let Some((i, Open::Call(c))) = self.open
                        && c == index
                    {
                        let delta = json!({"type": "input_json_delta", "partial_json": a});
                        events.push(Self::delta(i, delta));
                    }
                }
                ChunkPart::Finish(f) => self.stop = Some(stop_reason(f)),
                ChunkPart::Usage(u) => self.usage = u,
            }
        }
        events
    }

    fn done(&mut self) -> Vec<Event> {
        let mut events = Vec::new();
        if self.ended {
            return events;
        }
        self.ended = true;
        if let Some((i, _)) = self.open.take() {
            events.push((
                "content_block_stop",
                json!({"type": "content_block_stop", "index": i}),
            ));
        }
        let usage = usage_json(self.usage);
        events.push((
            "message_delta",
            json!({
                "type": "message_delta",
                "delta": {"stop_reason": self.stop.unwrap_or("end_turn"), "stop_sequence": null},
                "usage": usage,
            }),
        ));
        events.push(("message_stop", json!({"type": "message_stop"})));
        events
    }

    fn error(&self, status: u16, error: &Value) -> Value {
        let error = renamed(error, &RENAMED);
        let message = error["error"]["message"].as_str();
        error_body(status, message.unwrap_or("the request failed"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conversation_with_tools_becomes_a_chat() {
        let body = r#"{"model": "m", "max_tokens": 64, "system": "Be brief.",
            "tools": [{"name": "get_weather", "description": "Weather.",
                       "input_schema": {"type": "object", "properties": {"z": {}, "a": {}}}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "messages": [
              {"role": "user", "content": "Weather in Paris?"},
              {"role": "assistant", "content": [{"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"z": 1, "a": 2}}]},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C"},
                {"type": "text", "text": "Thanks"}]}]}"#;
        let chat: Value =
            serde_json::from_str(&chat_request(body, false).unwrap().to_json()).unwrap();
        assert_eq!(chat["tool_choice"], "required");
        assert_eq!(chat["parallel_tool_calls"], false);
        let roles: Vec<&str> = (chat["messages"].as_array().unwrap().iter())
            .map(|m| m["role"].as_str().unwrap())
            .collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
        let call = &chat["messages"][2]["tool_calls"][0]["function"];
        // The input's keys keep the client's order.
        assert_eq!(call["arguments"], r#"{"z": 1, "a": 2}"#);
        assert_eq!(chat["messages"][3]["tool_call_id"], "toolu_1");
        let text = chat_request(body, false).unwrap().to_json();
        assert!(
            text.contains(r#""properties": {"z": {}, "a": {}}"#),
            "{text}"
        );
    }

    #[test]
    fn what_cannot_be_done_is_refused_by_name() {
        let cases = [
            (r#"{"messages": []}"#, "max_tokens"),
            (
                r#"{"max_tokens": 1, "messages": [], "container": "c"}"#,
                "container",
            ),
            (
                r#"{"max_tokens": 1, "messages": [], "tools": [{"type": "web_search_20250305", "name": "w"}]}"#,
                "tools[0].type",
            ),
            (
                r#"{"max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}"#,
                "messages[0].content[0].type",
            ),
            (
                r#"{"max_tokens": 1, "messages": [{"role": "system", "content": "x"}]}"#,
                "messages[0].role",
            ),
        ];
        for (body, path) in cases {
            assert_eq!(
                chat_request(body, false).err().map(|e| e.path),
                Some(path.to_string()),
                "{body}"
            );
        }
    }

    #[test]
    fn a_stream_of_chunks_becomes_anthropics_events() {
        let chunks = [
            json!({"choices": [{"delta": {"role": "assistant", "content": ""}, "finish_reason": null}]}),
            json!({"choices": [{"delta": {"reasoning_content": "Hm."}, "finish_reason": null}]}),
            json!({"choices": [{"delta": {"content": "Sure."}, "finish_reason": null}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                   "function": {"name": "f", "arguments": ""}}]}, "finish_reason": null}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"a\""}}]}, "finish_reason": null}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}, "finish_reason": null}]}),
            json!({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]}),
            json!({"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 7,
                   "prompt_tokens_details": {"cached_tokens": 4}}}),
        ];
        let mut m = Messages::new("1", "m");
        let mut events: Vec<Event> = chunks.iter().flat_map(|c| m.chunk(c)).collect();
        events.extend(m.done());
        let names: Vec<&str> = events.iter().map(|e| e.0).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop",
            ]
        );
        let indexes: Vec<u64> = events
            .iter()
            .filter_map(|e| e.1["index"].as_u64())
            .collect();
        assert_eq!(indexes, [0, 0, 0, 1, 1, 1, 2, 2, 2, 2]);
        let delta = &events[11].1;
        assert_eq!(delta["delta"]["stop_reason"], "tool_use");
        assert_eq!(
            (
                delta["usage"]["input_tokens"].as_u64(),
                delta["usage"]["output_tokens"].as_u64()
            ),
            (Some(6), Some(7))
        );
    }
}
