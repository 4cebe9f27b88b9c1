//! OpenAI's Responses API (`POST /v1/responses`) as a chat completion: `instructions` and
//! `input` (text, or items — messages, `function_call`s and their `function_call_output`s,
//! `reasoning`) become a chat's messages ([`chat_request`]), and the chat's answer a response
//! whose `output` is items — `reasoning`, a `message`, `function_call`s — whole or as the
//! Responses stream of semantic events ([`Responses`]). A response is kept, unless the request
//! says `store: false`, so that the next request may go on from it with
//! `previous_response_id` ([`Kept`]: per API key, bounded).

use crate::conversation::FieldError;
use crate::relay::{
    ChatAnswer, ChatBody, ChatFunction, ChatTool, ChunkPart, Event, JsonSchemaFormat, NamedSchema,
    Relay, Usage, chunk_parts, field, fields, name_model, read, renamed, text_content,
};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

/// The fields of a Responses request this reads. Those that change nothing here —
/// `metadata`, `user`, `safety_identifier`, `prompt_cache_key` (the prefix cache keeps every
/// prompt), `service_tier`, `include` (which asks for outputs this server does not make),
/// `truncation` — are read and left.
pub const FIELDS: [&str; 22] = [
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "max_output_tokens",
    "temperature",
    "top_p",
    "stream",
    "text",
    "reasoning",
    "store",
    "previous_response_id",
    "metadata",
    "user",
    "safety_identifier",
    "prompt_cache_key",
    "service_tier",
    "include",
    "truncation",
    "stream_options",
];

/// The chat's fields that are named otherwise here, for errors about them.
const RENAMED: [(&str, &str); 2] = [
    ("max_tokens", "max_output_tokens"),
    ("response_format", "text"),
];

/// The text parts a message item may hold.
const TEXT_PARTS: [&str; 3] = ["input_text", "output_text", "refusal"];

#[derive(Deserialize)]
struct Item<'a> {
    #[serde(rename = "type")]
    kind: Option<String>,
    role: Option<String>,
    #[serde(borrow)]
    content: Option<&'a RawValue>,
    call_id: Option<String>,
    name: Option<String>,
    arguments: Option<String>,
    #[serde(borrow)]
    output: Option<&'a RawValue>,
    #[serde(default)]
    summary: Vec<TextPart>,
}

#[derive(Deserialize)]
struct TextPart {
    text: Option<String>,
}

#[derive(Deserialize)]
struct Tool<'a> {
    #[serde(rename = "type")]
    kind: String,
    name: Option<String>,
    description: Option<String>,
    #[serde(borrow)]
    parameters: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Format<'a> {
    #[serde(rename = "type")]
    kind: String,
    name: Option<String>,
    #[serde(borrow)]
    schema: Option<&'a RawValue>,
    strict: Option<bool>,
}

/// What a response repeats of its request, and the conversation it answers.
#[derive(Debug, Clone, Default)]
pub struct Echo {
    /// The turns before the response's: the previous response's conversation, then `input`
    /// (the instructions are not among them: they are not carried over, as OpenAI has it).
    pub conversation: Vec<Value>,
    pub previous_response_id: Value,
    /// Whether the response is kept (`store`, true unless the request says otherwise).
    pub store: bool,
    pub instructions: Value,
    pub tools: Value,
    pub tool_choice: Value,
    pub parallel_tool_calls: bool,
    pub max_output_tokens: Value,
    pub temperature: Value,
    pub top_p: Value,
    pub text: Value,
}

/// A Responses request (JSON text) as a chat request, and what its response repeats.
/// `previous` gives the conversation of a kept response by its id (`None`: none such, for
/// this API key).
pub fn chat_request<'a>(
    body: &'a str,
    previous: &dyn Fn(&str) -> Option<Arc<Vec<Value>>>,
) -> Result<(ChatBody<'a>, Echo), FieldError> {
    let f = fields(body, &FIELDS, "Responses API")?;
    let mut chat = ChatBody::default();
    let mut echo = Echo {
        parallel_tool_calls: true,
        store: field::<bool>(&f, "store")?.unwrap_or(true),
        text: json!({"format": {"type": "text"}}),
        ..Echo::default()
    };
    if let Some(id) = field::<String>(&f, "previous_response_id")? {
        let kept = previous(&id).ok_or_else(|| {
            let message = format!(
                "no response {id:?} is kept for this key (not made here, stored with \
                 `store: false`, or forgotten: {KEPT_PER_KEY} responses are kept per key)"
            );
            FieldError::new("previous_response_id", "previous_response_id", message)
        })?;
        echo.conversation = kept.as_ref().clone();
        echo.previous_response_id = id.into();
    }
    chat.fields.insert(
        "model".into(),
        field::<Value>(&f, "model")?.unwrap_or(Value::Null),
    );
    for (ours, theirs, slot) in [
        (
            "max_tokens",
            "max_output_tokens",
            &mut echo.max_output_tokens,
        ),
        ("temperature", "temperature", &mut echo.temperature),
        ("top_p", "top_p", &mut echo.top_p),
    ] {
        if let Some(v) = field::<Value>(&f, theirs)? {
            *slot = v.clone();
            chat.fields.insert(ours.into(), v);
        }
    }
    // A reasoning effort of `none` turns a template's thinking off (Qwen3's `enable_thinking`).
    if let Some(r) = field::<Value>(&f, "reasoning")? {
        let on = r["effort"].as_str() != Some("none");
        chat.fields.insert(
            "chat_template_kwargs".into(),
            json!({ "enable_thinking": on }),
        );
    }
    match f.get("input") {
        None => return Err(FieldError::new("input", "input", "required")),
        Some(raw) => match serde_json::from_str::<String>(raw.get()) {
            Ok(text) => (echo.conversation).push(json!({"role": "user", "content": text})),
            Err(_) => {
                let items: Vec<Item> = read(raw, "input", "input")?;
                input_turns(items, &mut echo.conversation)?;
            }
        },
    }
    let mut turns = Vec::with_capacity(echo.conversation.len() + 1);
    if let Some(i) = field::<String>(&f, "instructions")? {
        echo.instructions = i.clone().into();
        turns.push(json!({"role": "system", "content": i}));
    }
    turns.extend(echo.conversation.iter().cloned());
    chat.fields.insert("messages".into(), Value::Array(turns));
    let tools: Vec<Tool> = field(&f, "tools")?.unwrap_or_default();
    for (i, t) in tools.into_iter().enumerate() {
        let path = format!("tools[{i}]");
        if t.kind != "function" {
            let message = format!(
                "a `{}` tool is not supported (this server runs no tools of its own: give \
                 function tools, and run them yourself)",
                t.kind
            );
            return Err(FieldError::new("tools", format!("{path}.type"), message));
        }
        let missing = |k: &str| FieldError::new("tools", format!("{path}.{k}"), "missing");
        let name = t.name.ok_or_else(|| missing("name"))?;
        let parameters = t.parameters.ok_or_else(|| missing("parameters"))?;
        chat.tools.push(ChatTool {
            kind: "function",
            function: ChatFunction {
                name,
                description: t.description,
                parameters,
            },
        });
    }
    if let Some(raw) = f.get("tools") {
        echo.tools = serde_json::from_str(raw.get()).unwrap_or(Value::Null);
    }
    echo.tool_choice = match field::<Value>(&f, "tool_choice")? {
        None => json!("auto"),
        Some(c @ Value::String(_)) => c,
        Some(c) if c["type"] == "function" && c["name"].is_string() => {
            let choice = json!({"type": "function", "function": {"name": c["name"]}});
            chat.fields.insert("tool_choice".into(), choice);
            c
        }
        Some(c) => {
            let message = format!("{c}: expected auto, none, required or a function");
            return Err(FieldError::new("tool_choice", "tool_choice", message));
        }
    };
    if echo.tool_choice.is_string() {
        chat.fields
            .insert("tool_choice".into(), echo.tool_choice.clone());
    }
    if let Some(p) = field::<bool>(&f, "parallel_tool_calls")? {
        echo.parallel_tool_calls = p;
    }
    if !chat.tools.is_empty() {
        chat.fields.insert(
            "parallel_tool_calls".into(),
            echo.parallel_tool_calls.into(),
        );
    }
    if let Some(raw) = f.get("text") {
        #[derive(Deserialize)]
        struct Text<'a> {
            #[serde(borrow)]
            format: Option<Format<'a>>,
        }
        let text: Text = read(raw, "text", "text")?;
        echo.text = serde_json::from_str(raw.get()).unwrap_or(Value::Null);
        chat.response_format = match text.format {
            None => None,
            Some(t) if t.kind == "text" => None,
            Some(t) if t.kind == "json_object" => Some(JsonSchemaFormat {
                kind: "json_object",
                json_schema: None,
            }),
            Some(t) if t.kind == "json_schema" => Some(JsonSchemaFormat {
                kind: "json_schema",
                json_schema: Some(NamedSchema {
                    name: t.name.unwrap_or_else(|| "response".into()),
                    schema: t
                        .schema
                        .ok_or_else(|| FieldError::new("text", "text.format.schema", "missing"))?,
                    strict: t.strict,
                }),
            }),
            Some(t) => {
                let message = format!("`{}`: expected text, json_object or json_schema", t.kind);
                return Err(FieldError::new("text", "text.format.type", message));
            }
        };
    }
    if field::<bool>(&f, "stream")? == Some(true) {
        chat.stream();
    }
    Ok((chat, echo))
}

/// `input`'s items as chat turns: messages as they are (`developer` a system turn), a
/// `function_call` a call of the assistant's turn (consecutive calls one turn), its
/// `function_call_output` a tool turn, `reasoning` the reasoning of the assistant's next turn.
fn input_turns(items: Vec<Item>, turns: &mut Vec<Value>) -> Result<(), FieldError> {
    let mut reasoning: Option<String> = None;
    // Whether the last turn is the assistant's and may take more calls.
    let mut calling = false;
    for (i, item) in items.into_iter().enumerate() {
        let path = format!("input[{i}]");
        let missing = |k: &str| FieldError::new("input", format!("{path}.{k}"), "missing");
        match item.kind.as_deref().unwrap_or("message") {
            "message" => {
                let role = match item.role.as_deref() {
                    Some("developer" | "system") => "system",
                    Some(r @ ("user" | "assistant")) => r,
                    Some(r) => {
                        let message =
                            format!("role `{r}`: expected user, assistant, system or developer");
                        return Err(FieldError::new("input", format!("{path}.role"), message));
                    }
                    None => return Err(missing("role")),
                };
                let content = item.content.ok_or_else(|| missing("content"))?;
                let content =
                    text_content(content, &TEXT_PARTS, "input", &format!("{path}.content"))?;
                let mut turn = json!({"role": role, "content": content});
                if role == "assistant"
                    && let Some(r) = reasoning.take()
                {
                    turn["reasoning_content"] = r.into();
                }
                calling = role == "assistant";
                turns.push(turn);
            }
            "function_call" => {
                let id = item.call_id.ok_or_else(|| missing("call_id"))?;
                let name = item.name.ok_or_else(|| missing("name"))?;
                let arguments = item.arguments.ok_or_else(|| missing("arguments"))?;
                let call = json!({"id": id, "type": "function",
                                  "function": {"name": name, "arguments": arguments}});
                if !calling {
                    turns.push(json!({"role": "assistant", "content": null}));
                    calling = true;
                }
                let turn = turns.last_mut().expect("pushed above");
                if let Some(r) = reasoning.take() {
                    turn["reasoning_content"] = r.into();
                }
                match turn["tool_calls"].as_array_mut() {
                    Some(calls) => calls.push(call),
                    None => turn["tool_calls"] = json!([call]),
                }
            }
            "function_call_output" => {
                let id = item.call_id.ok_or_else(|| missing("call_id"))?;
                let output = item.output.ok_or_else(|| missing("output"))?;
                let content =
                    text_content(output, &TEXT_PARTS, "input", &format!("{path}.output"))?;
                turns.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
                calling = false;
            }
            "reasoning" => {
                let content = match item.content {
                    Some(c) => {
                        let parts: Vec<TextPart> = read(c, "input", &format!("{path}.content"))?;
                        parts.into_iter().filter_map(|p| p.text).collect::<Vec<_>>()
                    }
                    None => item.summary.into_iter().filter_map(|p| p.text).collect(),
                };
                reasoning = Some(content.join("\n"));
            }
            k => {
                let message = format!(
                    "an item of type `{k}` is not supported (this server reads messages, \
                     function_call, function_call_output and reasoning)"
                );
                return Err(FieldError::new("input", format!("{path}.type"), message));
            }
        }
    }
    Ok(())
}

// ANCHOR: kept
/// The most responses kept for one API key, and the most bytes their conversations may take
/// (as JSON text): past either, that key's oldest are forgotten. Each response keeps its
/// whole conversation, so a chain of n turns keeps n² of them: the byte bound is what holds a
/// long chain. There are as many keys as the server was given, and one for requests without.
pub const KEPT_PER_KEY: usize = 256;
pub const KEPT_BYTES_PER_KEY: usize = 64 << 20;

/// Responses kept for `previous_response_id`: each one's conversation as chat turns (the
/// turns before it, its input, its output), per API key (chapter 11's `CachePartition`, so
/// one key cannot go on from another's response, nor learn that it exists).
#[derive(Debug, Default)]
pub struct Kept {
    keys: Mutex<HashMap<u64, VecDeque<Conversation>>>,
}

#[derive(Debug)]
struct Conversation {
    id: String,
    turns: Arc<Vec<Value>>,
    bytes: usize,
}

impl Kept {
    /// The conversation of response `id`, kept for `key`.
    pub fn get(&self, key: u64, id: &str) -> Option<Arc<Vec<Value>>> {
        let keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        let kept = keys.get(&key)?;
        let c = kept.iter().find(|c| c.id == id)?;
        Some(Arc::clone(&c.turns))
    }

    /// Keep `turns` as response `id`'s conversation for `key`, forgetting that key's oldest
    /// past the bounds (a conversation larger than all the bytes is not kept).
    pub fn keep(&self, key: u64, id: &str, turns: Vec<Value>) {
        let bytes = serde_json::to_string(&turns).map_or(usize::MAX, |t| t.len());
        if bytes > KEPT_BYTES_PER_KEY {
            return;
        }
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        let kept = keys.entry(key).or_default();
        let mut total: usize = kept.iter().map(|c| c.bytes).sum::<usize>() + bytes;
        while kept.len() >= KEPT_PER_KEY || total > KEPT_BYTES_PER_KEY {
            let Some(old) = kept.pop_front() else { break };
            total -= old.bytes;
        }
        kept.push_back(Conversation {
            id: id.to_string(),
            turns: Arc::new(turns),
            bytes,
        });
    }
}
// ANCHOR_END: kept

/// The chat's answer relayed as a response.
pub struct Responses {
    id: String,
    model: String,
    created_at: u64,
    echo: Echo,
    /// Stream: the next event's number; the items so far (the last may be open, and for a
    /// call its chat index); the finish reason and usage once known.
    sequence: u64,
    items: Vec<Value>,
    open: Option<Open>,
    finish: Option<String>,
    usage: Usage,
    ended: bool,
    /// Where the response is kept, and for which key, until it is; whether it is.
    kept: Option<(Arc<Kept>, u64)>,
    stored: bool,
}

#[derive(Clone, Copy, PartialEq)]
enum Open {
    Reasoning,
    Message,
    Call(usize),
}

fn usage_json(u: Usage) -> Value {
    json!({
        "input_tokens": u.prompt,
        "input_tokens_details": {"cached_tokens": u.cached},
        "output_tokens": u.completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.prompt + u.completion,
    })
}

impl Responses {
    pub fn new(id: &str, model: &str, created_at: u64, echo: Echo) -> Responses {
        Responses {
            id: format!("resp_{id}"),
            model: model.to_string(),
            created_at,
            echo,
            sequence: 0,
            items: Vec::new(),
            open: None,
            finish: None,
            usage: Usage::default(),
            ended: false,
            kept: None,
            stored: false,
        }
    }

    /// The response is kept in `kept` for `key`, if its request let it be.
    pub fn kept_in(mut self, kept: Arc<Kept>, key: u64) -> Responses {
        if self.echo.store {
            self.kept = Some((kept, key));
            self.stored = true;
        }
        self
    }

    /// The answer is whole: keep its conversation — the turns before it, and its output
    /// items read back as the input items they are.
    fn keep(&mut self) {
        let Some((kept, key)) = self.kept.take() else {
            return;
        };
        let mut turns = std::mem::take(&mut self.echo.conversation);
        let output = Value::Array(self.items.clone()).to_string();
        let read_back = serde_json::from_str::<Vec<Item>>(&output)
            .map_err(|e| e.to_string())
            .and_then(|items| input_turns(items, &mut turns).map_err(|e| e.to_string()));
        if read_back.is_ok() {
            kept.keep(key, &self.id, turns);
        }
    }

    fn item_id(&self, prefix: &str) -> String {
        format!("{prefix}_{}_{}", &self.id[5..], self.items.len())
    }

    /// The response object: `status` and, when done, its items and usage.
    fn response(&self, status: &str, usage: Option<Usage>) -> Value {
        let e = &self.echo;
        let incomplete = (status == "incomplete").then(|| json!({"reason": "max_output_tokens"}));
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": null,
            "incomplete_details": incomplete,
            "instructions": e.instructions,
            "max_output_tokens": e.max_output_tokens,
            "model": self.model,
            "output": if usage.is_some() { Value::Array(self.items.clone()) } else { json!([]) },
            "parallel_tool_calls": e.parallel_tool_calls,
            "previous_response_id": e.previous_response_id,
            "reasoning": {"effort": null, "summary": null},
            "store": self.stored,
            "temperature": e.temperature,
            "text": e.text,
            "tool_choice": e.tool_choice,
            "tools": if e.tools.is_null() { json!([]) } else { e.tools.clone() },
            "top_p": e.top_p,
            "truncation": "disabled",
            "usage": usage.map(usage_json),
            "metadata": {},
        })
    }

    fn event(&mut self, name: &'static str, mut data: Value) -> Event {
        data["type"] = name.into();
        data["sequence_number"] = self.sequence.into();
        self.sequence += 1;
        (name, data)
    }

    /// Close the open item unless it is `kind`; open `kind` unless it is open. The open
    /// item's index.
    fn to(&mut self, kind: Open, events: &mut Vec<Event>, call: Option<(&str, &str)>) -> usize {
        if self.open == Some(kind) {
            return self.items.len() - 1;
        }
        self.close(events);
        let item = match kind {
            Open::Reasoning => json!({"type": "reasoning", "id": self.item_id("rs"),
                                      "summary": [], "content": [], "status": "in_progress"}),
            Open::Message => json!({"type": "message", "id": self.item_id("msg"),
                                    "status": "in_progress", "role": "assistant", "content": []}),
            Open::Call(_) => {
                let (call_id, name) = call.unwrap_or_default();
                json!({"type": "function_call", "id": self.item_id("fc"), "call_id": call_id,
                       "name": name, "arguments": "", "status": "in_progress"})
            }
        };
        let output_index = self.items.len();
        let e = self.event(
            "response.output_item.added",
            json!({"output_index": output_index, "item": item}),
        );
        events.push(e);
        if kind == Open::Message {
            let part =
                json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []});
            let data = json!({"item_id": item["id"], "output_index": output_index,
                              "content_index": 0, "part": part});
            let e = self.event("response.content_part.added", data);
            events.push(e);
        }
        self.items.push(item);
        self.open = Some(kind);
        output_index
    }

    /// Close the open item: its last events, and it completed.
    fn close(&mut self, events: &mut Vec<Event>) {
        let Some(kind) = self.open.take() else {
            return;
        };
        let output_index = self.items.len() - 1;
        let item = &mut self.items[output_index];
        item["status"] = "completed".into();
        let id = item["id"].clone();
        let mut done = Vec::new();
        match kind {
            Open::Reasoning => {
                let text = item["text"].take();
                item.as_object_mut().expect("an object").remove("text");
                item["content"] = json!([{"type": "reasoning_text", "text": text}]);
                done.push((
                    "response.reasoning_text.done",
                    json!({"item_id": id,
                    "output_index": output_index, "content_index": 0, "text": text}),
                ));
            }
            Open::Message => {
                let text = item["text"].take();
                item.as_object_mut().expect("an object").remove("text");
                let part =
                    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []});
                item["content"] = json!([part]);
                done.push(("response.output_text.done", json!({"item_id": id,
                    "output_index": output_index, "content_index": 0, "text": text, "logprobs": []})));
                done.push((
                    "response.content_part.done",
                    json!({"item_id": id,
                    "output_index": output_index, "content_index": 0, "part": part}),
                ));
            }
            Open::Call(_) => {
                done.push((
                    "response.function_call_arguments.done",
                    json!({"item_id": id,
                    "output_index": output_index, "name": item["name"],
                    "arguments": item["arguments"]}),
                ));
            }
        }
        let item = self.items[output_index].clone();
        done.push((
            "response.output_item.done",
            json!({"output_index": output_index, "item": item}),
        ));
        for (name, data) in done {
            let e = self.event(name, data);
            events.push(e);
        }
    }

    /// Text added to the open item's `text` (kept there until it closes) or `arguments`.
    fn grow(&mut self, key: &str, delta: &str) {
        let item = self.items.last_mut().expect("an open item");
        let text = item[key].as_str().unwrap_or("").to_string() + delta;
        item[key] = text.into();
    }

    fn status(&self) -> &'static str {
        match self.finish.as_deref() {
            Some("length") => "incomplete",
            _ => "completed",
        }
    }
}

impl Relay for Responses {
    fn answer(&mut self, chat: &Value) -> String {
        name_model(&mut self.model, chat);
        let a = ChatAnswer::of(chat);
        if let Some(text) = a.reasoning {
            let id = self.item_id("rs");
            self.items.push(
                json!({"type": "reasoning", "id": id, "summary": [], "status": "completed",
                                   "content": [{"type": "reasoning_text", "text": text}]}),
            );
        }
        if let Some(text) = a.content {
            let id = self.item_id("msg");
            self.items.push(json!({"type": "message", "id": id, "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}));
        }
        for (call_id, name, arguments) in a.calls {
            let id = self.item_id("fc");
            self.items.push(
                json!({"type": "function_call", "id": id, "call_id": call_id,
                                   "name": name, "arguments": arguments, "status": "completed"}),
            );
        }
        self.finish = Some(a.finish_reason.to_string());
        self.keep();
        self.response(self.status(), Some(a.usage)).to_string()
    }

    fn chunk(&mut self, chunk: &Value) -> Vec<Event> {
        let mut events = Vec::new();
        if self.sequence == 0 {
            name_model(&mut self.model, chunk);
            let created = self.response("in_progress", None);
            let e = self.event("response.created", json!({"response": created.clone()}));
            events.push(e);
            let e = self.event("response.in_progress", json!({"response": created}));
            events.push(e);
        }
        if let Some(e) = chunk.get("error") {
            self.ended = true;
            let mut failed = self.response("failed", Some(self.usage));
            failed["error"] = json!({"code": "server_error", "message": e["message"]});
            let e = self.event("response.failed", json!({"response": failed}));
            events.push(e);
            return events;
        }
        for part in chunk_parts(chunk) {
            match part {
                ChunkPart::Reasoning(t) => {
                    let i = self.to(Open::Reasoning, &mut events, None);
                    self.grow("text", t);
                    let id = self.items[i]["id"].clone();
                    let data =
                        json!({"item_id": id, "output_index": i, "content_index": 0, "delta": t});
                    let e = self.event("response.reasoning_text.delta", data);
                    events.push(e);
                }
                ChunkPart::Content(t) => {
                    let i = self.to(Open::Message, &mut events, None);
                    self.grow("text", t);
                    let id = self.items[i]["id"].clone();
                    let data = json!({"item_id": id, "output_index": i, "content_index": 0,
                                      "delta": t, "logprobs": []});
                    let e = self.event("response.output_text.delta", data);
                    events.push(e);
                }
                ChunkPart::Call(index, id, name) => {
                    self.to(Open::Call(index), &mut events, Some((id, name)));
                }
                ChunkPart::Arguments(index, a) => {
                    if self.open == Some(Open::Call(index)) {
                        let i = self.items.len() - 1;
                        self.grow("arguments", a);
                        let id = self.items[i]["id"].clone();
                        let data = json!({"item_id": id, "output_index": i, "delta": a});
                        let e = self.event("response.function_call_arguments.delta", data);
                        events.push(e);
                    }
                }
                ChunkPart::Finish(f) => self.finish = Some(f.to_string()),
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
        self.close(&mut events);
        self.keep();
        let status = self.status();
        let response = self.response(status, Some(self.usage));
        let name = if status == "completed" {
            "response.completed"
        } else {
            "response.incomplete"
        };
        let e = self.event(name, json!({"response": response}));
        events.push(e);
        events
    }

    fn error(&self, _status: u16, error: &Value) -> Value {
        renamed(error, &RENAMED)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_become_a_chat() {
        let body = r#"{"model": "m", "instructions": "Be brief.", "max_output_tokens": 50,
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {"z": {}, "a": {}}}}],
            "input": [
              {"role": "user", "content": "Hi"},
              {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Think."}]},
              {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
              {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"},
              {"type": "function_call_output", "call_id": "c1", "output": "one"},
              {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "two"}]}]}"#;
        let (chat, echo) = chat_request(body, &|_| None).unwrap();
        let text = chat.to_json();
        assert!(
            text.contains(r#""properties": {"z": {}, "a": {}}"#),
            "{text}"
        );
        let chat: Value = serde_json::from_str(&text).unwrap();
        let roles: Vec<&str> = (chat["messages"].as_array().unwrap().iter())
            .map(|m| m["role"].as_str().unwrap())
            .collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "tool"]);
        assert_eq!(
            chat["messages"][2]["tool_calls"].as_array().unwrap().len(),
            2
        );
        assert_eq!(chat["messages"][2]["reasoning_content"], "Think.");
        assert_eq!(
            (chat["max_tokens"].as_u64(), echo.max_output_tokens.as_u64()),
            (Some(50), Some(50))
        );
        assert_eq!(chat["parallel_tool_calls"], true);
    }

    #[test]
    fn what_cannot_be_done_is_refused_by_name() {
        let cases = [
            (r#"{"model": "m"}"#, "input"),
            (
                r#"{"input": "x", "previous_response_id": "resp_unknown"}"#,
                "previous_response_id",
            ),
            (
                r#"{"input": "x", "tools": [{"type": "web_search"}]}"#,
                "tools[0].type",
            ),
            (
                r#"{"input": [{"type": "item_reference", "id": "x"}]}"#,
                "input[0].type",
            ),
            (
                r#"{"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}"#,
                "input[0].content[0].type",
            ),
            (r#"{"input": "x", "conversation": "c"}"#, "conversation"),
        ];
        for (body, path) in cases {
            assert_eq!(
                chat_request(body, &|_| None).err().map(|e| e.path),
                Some(path.to_string()),
                "{body}"
            );
        }
    }

    /// The chat's answer `text`, whole.
    fn answered(r: &mut Responses, text: &str) -> Value {
        let chat = json!({"choices": [{"message": {"role": "assistant", "content": text},
                                       "finish_reason": "stop"}]});
        serde_json::from_str(&r.answer(&chat)).unwrap()
    }

    #[test]
    fn a_kept_response_is_gone_on_from_with_its_key_only() {
        let kept = Arc::new(Kept::default());
        let open = |body: &str, key: u64| {
            let (chat, echo) = chat_request(body, &|id| kept.get(key, id))?;
            let chat: Value = serde_json::from_str(&chat.to_json()).unwrap();
            Ok::<_, FieldError>((chat, echo))
        };
        let (_, echo) = open(r#"{"instructions": "Be brief.", "input": "Hi"}"#, 7).unwrap();
        let mut r = Responses::new("1", "m", 0, echo).kept_in(Arc::clone(&kept), 7);
        assert_eq!(answered(&mut r, "Hello.")["store"], true);

        let next = r#"{"previous_response_id": "resp_1", "input": "And?"}"#;
        let (chat, echo) = open(next, 7).unwrap();
        // The instructions are not carried over; the turns before are.
        // (A message item's content reads back as the chat's text parts.)
        let text = |c: &Value| match c {
            Value::Array(parts) => parts.iter().map(|p| p["text"].to_string()).collect(),
            c => c.to_string(),
        };
        let turns: Vec<(String, String)> = (chat["messages"].as_array().unwrap().iter())
            .map(|m| (m["role"].to_string(), text(&m["content"])))
            .collect();
        let expected = [("user", "Hi"), ("assistant", "Hello."), ("user", "And?")];
        assert_eq!(
            turns,
            expected.map(|(r, c)| (format!("{r:?}"), format!("{c:?}")))
        );
        assert_eq!(echo.previous_response_id, "resp_1");
        // Another key does not see it.
        let e = open(next, 8).err().unwrap();
        assert_eq!(e.path, "previous_response_id");

        // `store: false` keeps nothing; past the bound, the oldest is forgotten.
        let (_, echo) = open(r#"{"input": "x", "store": false}"#, 7).unwrap();
        let mut r = Responses::new("2", "m", 0, echo).kept_in(Arc::clone(&kept), 7);
        assert_eq!(answered(&mut r, "y")["store"], false);
        assert!(kept.get(7, "resp_2").is_none());
        for i in 0..KEPT_PER_KEY {
            kept.keep(
                7,
                &format!("resp_x{i}"),
                vec![json!({"role": "user", "content": "x"})],
            );
        }
        assert!(kept.get(7, "resp_1").is_none());
        assert!(kept.get(7, "resp_x0").is_some());
    }

    #[test]
    fn a_stream_of_chunks_becomes_semantic_events() {
        let chunks = [
            json!({"choices": [{"delta": {"role": "assistant", "content": ""}, "finish_reason": null}]}),
            json!({"choices": [{"delta": {"content": "Sure"}, "finish_reason": null}]}),
            json!({"choices": [{"delta": {"content": "."}, "finish_reason": null}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                   "function": {"name": "f", "arguments": ""}}]}, "finish_reason": null}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}, "finish_reason": null}]}),
            json!({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]}),
            json!({"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 7}}),
        ];
        let mut r = Responses::new("1", "m", 0, Echo::default());
        let mut events: Vec<Event> = chunks.iter().flat_map(|c| r.chunk(c)).collect();
        events.extend(r.done());
        let names: Vec<&str> = events.iter().map(|e| e.0).collect();
        assert_eq!(
            names,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        let numbers: Vec<u64> = events
            .iter()
            .map(|e| e.1["sequence_number"].as_u64().unwrap())
            .collect();
        assert_eq!(numbers, (0..14).collect::<Vec<u64>>());
        let done = &events[13].1["response"];
        assert_eq!(done["output"][0]["content"][0]["text"], "Sure.");
        assert_eq!(done["output"][1]["call_id"], "call_1");
        assert_eq!(done["usage"]["total_tokens"], 17);
    }

    #[test]
    fn errors_name_the_fields_as_the_request_did() {
        let chat = json!({"error": {"message": "`max_tokens` is 0; it must be at least 1",
                                    "param": "max_tokens", "type": "invalid_request_error"}});
        let e = Responses::new("1", "m", 0, Echo::default()).error(400, &chat);
        assert_eq!(e["error"]["param"], "max_output_tokens");
        assert_eq!(
            e["error"]["message"],
            "`max_output_tokens` is 0; it must be at least 1"
        );
    }
}
