//! A conversation with tools as a client sends it — OpenAI's `messages` (assistant turns with
//! `tool_calls`, `tool` turns with their `tool_call_id`) and `tools` — read, checked, and handed
//! to the model's own template the way llama.cpp hands them: each message as
//! `{role, content, reasoning_content?, name?, tool_call_id?, tool_calls?}`, each tool as
//! `{type, function: {name, description, parameters}}`, a call's `arguments` an object for
//! templates that read them as one ([`Caps`]), and the variables `tools`, `enable_thinking`,
//! `date_string` and the request's `chat_template_kwargs`.

use ch02::chat::object;
use ch02::{ChatTemplate, Message, Tokenizer, TokenizerError};
use minijinja::Value;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::collections::HashSet;

/// The most tools one request may offer. OpenAI's own limit: every tool is written into the
/// prompt and into the grammar of its calls, and 128 already take tens of thousands of tokens.
pub const MAX_TOOLS: usize = 128;

/// The longest tool name: OpenAI's `^[a-zA-Z0-9_-]{1,64}$`. A name is written into the
/// template's text and into grammars, so it is held to that alphabet too.
pub const MAX_NAME_LEN: usize = 64;

/// What is wrong with a request's tools or messages: the field, as a path into the request
/// (`tools[2].function.name`), and why.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{path}: {message}")]
pub struct FieldError {
    /// The top-level field: `tools`, `messages`, `tool_choice`, `chat_template_kwargs`.
    pub field: &'static str,
    pub path: String,
    pub message: String,
}

impl FieldError {
    pub fn new(field: &'static str, path: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError {
            field,
            path: path.into(),
            message: message.into(),
        }
    }
}

/// One function the model may call.
#[derive(Debug, Clone)]
pub struct Tool {
    pub name: String,
    pub description: String,
    /// Its arguments' JSON Schema, as the client wrote it (chapter 15 reads the text, so that
    /// properties keep their order).
    pub parameters: String,
}

#[derive(Deserialize)]
struct WireTool<'a> {
    #[serde(rename = "type")]
    kind: Option<String>,
    #[serde(borrow)]
    function: Option<WireFunction<'a>>,
}

#[derive(Deserialize)]
struct WireFunction<'a> {
    name: Option<String>,
    #[serde(default)]
    description: Option<String>,
    #[serde(borrow, default)]
    parameters: Option<&'a RawValue>,
}

/// A name a template and a grammar may hold: 1 to 64 of `a-z A-Z 0-9 _ -`.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = (1..=MAX_NAME_LEN).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{:?} is not a function name: 1 to {MAX_NAME_LEN} letters, digits, `_` or `-`",
            shorten(name)
        ))
    }
}

/// The `tools` of a request (its JSON text): function tools, at most [`MAX_TOOLS`], each named
/// once, each with an object schema (an absent or empty one means no arguments).
pub fn read_tools(text: &str) -> Result<Vec<Tool>, FieldError> {
    let bad = |path: String, m: String| FieldError::new("tools", path, m);
    let list: Vec<WireTool> = serde_json::from_str(text)
        .map_err(|e| bad("tools".into(), format!("expected a list of tools: {e}")))?;
    if list.len() > MAX_TOOLS {
        return Err(bad(
            "tools".into(),
            format!("{} tools; at most {MAX_TOOLS} may be offered", list.len()),
        ));
    }
    let mut names = HashSet::new();
    let mut tools = Vec::with_capacity(list.len());
    for (i, t) in list.into_iter().enumerate() {
        if t.kind.as_deref() != Some("function") {
            return Err(bad(
                format!("tools[{i}].type"),
                format!(
                    "is {:?}; only \"function\" tools are supported",
                    t.kind.as_deref().map(shorten)
                ),
            ));
        }
        let f = t
            .function
            .ok_or_else(|| bad(format!("tools[{i}].function"), "is missing".into()))?;
        let name = f
            .name
            .ok_or_else(|| bad(format!("tools[{i}].function.name"), "is missing".into()))?;
        check_name(&name).map_err(|m| bad(format!("tools[{i}].function.name"), m))?;
        if !names.insert(name.clone()) {
            return Err(bad(
                format!("tools[{i}].function.name"),
                format!("{name:?} names two tools"),
            ));
        }
        let parameters = match f.parameters.map(RawValue::get) {
            None | Some("null") => "{}".to_string(),
            Some(p) if p.trim_start().starts_with('{') => p.to_string(),
            Some(_) => {
                return Err(bad(
                    format!("tools[{i}].function.parameters"),
                    "must be a JSON Schema object".into(),
                ));
            }
        };
        tools.push(Tool {
            name,
            description: f.description.unwrap_or_default(),
            parameters,
        });
    }
    Ok(tools)
}

/// A conversation's turn as the client sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Turn {
    pub role: String,
    pub content: String,
    pub reasoning_content: String,
    /// A tool result's tool name (OpenAI's older `name` on a `tool`/`function` turn).
    pub name: String,
    pub tool_call_id: String,
    pub tool_calls: Vec<Call>,
}

/// A call a model made: its id, the function's name and its arguments (JSON text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

#[derive(Deserialize)]
struct WireMessage<'a> {
    role: Option<String>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tool_calls: Option<Vec<WireCall<'a>>>,
    #[serde(default)]
    tool_call_id: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    reasoning_content: Option<String>,
}

#[derive(Deserialize)]
struct WireCall<'a> {
    #[serde(default)]
    id: Option<String>,
    #[serde(borrow)]
    function: Option<WireCallFunction<'a>>,
}

#[derive(Deserialize)]
struct WireCallFunction<'a> {
    name: Option<String>,
    #[serde(borrow)]
    arguments: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
}

/// The roles a turn may have (`developer` is OpenAI's newer name for `system`).
pub const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// The `messages` of a request (its JSON text), checked: a known role, content that is text
/// (a string, or text parts joined by newlines as llama.cpp joins them), calls with a valid
/// name and arguments that are a JSON object (as text, or an object).
pub fn read_messages(text: &str) -> Result<Vec<Turn>, FieldError> {
    let bad = |path: String, m: String| FieldError::new("messages", path, m);
    let list: Vec<WireMessage> = serde_json::from_str(text).map_err(|e| {
        bad(
            "messages".into(),
            format!("expected a list of messages: {e}"),
        )
    })?;
    if list.is_empty() {
        return Err(bad("messages".into(), "must not be empty".into()));
    }
    let mut turns = Vec::with_capacity(list.len());
    for (i, m) in list.into_iter().enumerate() {
        let role = m.role.unwrap_or_default();
        if !ROLES.contains(&role.as_str()) {
            return Err(bad(
                format!("messages[{i}].role"),
                format!(
                    "is {:?}; expected one of {}",
                    shorten(&role),
                    ROLES.join(", ")
                ),
            ));
        }
        let role = if role == "developer" {
            "system".to_string()
        } else {
            role
        };
        let content = match m.content.map(RawValue::get) {
            None | Some("null") => String::new(),
            Some(t) if t.starts_with('"') => serde_json::from_str(t)
                .map_err(|e| bad(format!("messages[{i}].content"), e.to_string()))?,
            Some(t) => {
                let parts: Vec<Part> = serde_json::from_str(t).map_err(|e| {
                    bad(
                        format!("messages[{i}].content"),
                        format!("expected a string or a list of text parts: {e}"),
                    )
                })?;
                let mut texts = Vec::with_capacity(parts.len());
                for (j, p) in parts.into_iter().enumerate() {
                    match (p.kind.as_str(), p.text) {
                        ("text", Some(t)) => texts.push(t),
                        (kind, _) => {
                            return Err(bad(
                                format!("messages[{i}].content[{j}]"),
                                format!(
                                    "is of type {:?}: this model reads text parts only",
                                    shorten(kind)
                                ),
                            ));
                        }
                    }
                }
                texts.join("\n")
            }
        };
        let mut tool_calls = Vec::new();
        for (j, c) in m.tool_calls.unwrap_or_default().into_iter().enumerate() {
            let at = format!("messages[{i}].tool_calls[{j}]");
            let f = c
                .function
                .ok_or_else(|| bad(format!("{at}.function"), "is missing".into()))?;
            let name = f
                .name
                .ok_or_else(|| bad(format!("{at}.function.name"), "is missing".into()))?;
            check_name(&name).map_err(|m| bad(format!("{at}.function.name"), m))?;
            let arguments = match f.arguments.map(RawValue::get) {
                None | Some("null") => "{}".to_string(),
                Some(t) if t.starts_with('"') => serde_json::from_str::<String>(t)
                    .map_err(|e| bad(format!("{at}.function.arguments"), e.to_string()))?,
                Some(t) => t.to_string(),
            };
            // Arguments are a JSON object: templates print them, grammars and parsers hold
            // calls to that.
            match serde_json::from_str::<serde_json::Value>(&arguments) {
                Ok(serde_json::Value::Object(_)) => {}
                _ => {
                    return Err(bad(
                        format!("{at}.function.arguments"),
                        "must be a JSON object (or its text)".into(),
                    ));
                }
            }
            tool_calls.push(Call {
                id: c.id.unwrap_or_default(),
                name,
                arguments,
            });
        }
        turns.push(Turn {
            role,
            content,
            reasoning_content: m.reasoning_content.unwrap_or_default(),
            name: m.name.unwrap_or_default(),
            tool_call_id: m.tool_call_id.unwrap_or_default(),
            tool_calls,
        });
    }
    Ok(turns)
}

/// What a template can take, found by rendering probes (llama.cpp's `caps` do the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// A system turn's content is written (else it is merged into the next turn).
    pub system_role: bool,
    /// A call's arguments are read as an object (else they are given as their text).
    pub object_arguments: bool,
    /// The template writes the tools it is given.
    pub tools: bool,
    /// The template writes an assistant turn's calls.
    pub tool_calls: bool,
}

const MARK: &str = "MARK_91c2e7";

impl Caps {
    /// Render small conversations and look for what they put in: a system turn's text; a
    /// tool's name; a call's id and its argument's value given as an object.
    pub fn probe(template: &ChatTemplate) -> Caps {
        let render = |turns: &[Turn], tools: &[Tool], object_arguments| {
            let caps = Caps {
                system_role: true,
                object_arguments,
                tools: true,
                tool_calls: true,
            };
            let (messages, vars) = template_input(turns, tools, caps, &[]).ok()?;
            template
                .render_with(&messages, true, &vars)
                .ok()
                .map(|(t, _)| t)
        };
        let turn = |role: &str, content: &str| Turn {
            role: role.into(),
            content: content.into(),
            reasoning_content: String::new(),
            name: String::new(),
            tool_call_id: String::new(),
            tool_calls: Vec::new(),
        };
        let system_role = render(
            &[
                turn("system", &format!("{MARK}S")),
                turn("user", "User message"),
            ],
            &[],
            false,
        )
        .is_some_and(|t| t.contains(&format!("{MARK}S")));
        let tool = Tool {
            name: format!("{MARK}tool"),
            description: "Tool description".into(),
            parameters: r#"{"type": "object", "properties": {"arg": {"type": "string"}}, "required": ["arg"]}"#.into(),
        };
        let mut called = turn("assistant", "");
        called.tool_calls.push(Call {
            id: "call00001".into(),
            name: format!("{MARK}tool"),
            arguments: format!(r#"{{"arg": "{MARK}A"}}"#),
        });
        let mut result = turn("tool", "Tool response");
        result.tool_call_id = "call00001".into();
        let conversation = [
            turn("user", "User message"),
            called,
            result,
            turn("assistant", "The tool response was 'tool response'"),
            turn("user", "User message"),
        ];
        let as_object = render(&conversation, std::slice::from_ref(&tool), true);
        let object_arguments = as_object
            .as_ref()
            .is_some_and(|t| t.contains(&format!("{MARK}A")));
        let written = if object_arguments {
            as_object
        } else {
            render(&conversation, std::slice::from_ref(&tool), false)
        };
        let tools = written.as_ref().is_some_and(|t| {
            t.matches(&format!("{MARK}tool")).count() > usize::from(t.contains(&format!("{MARK}A")))
        });
        let tool_calls = written.is_some_and(|t| t.contains(&format!("{MARK}A")));
        Caps {
            system_role,
            object_arguments,
            tools,
            tool_calls,
        }
    }
}

/// A template's variables besides the messages, each name and value (chapter 2's
/// [`Vars`](ch02::Vars)).
pub type TemplateVars = Vec<(String, Value)>;

/// The template's messages and variables for `turns` and `tools`, as llama.cpp gives them to
/// a template with `caps`, with the request's `chat_template_kwargs` (`kwargs`, name and JSON
/// text) last, so that they win.
pub fn template_input(
    turns: &[Turn],
    tools: &[Tool],
    caps: Caps,
    kwargs: &[(String, String)],
) -> Result<(Vec<Message>, TemplateVars), FieldError> {
    let mut messages: Vec<Message> = turns.iter().map(|t| to_message(t, caps)).collect();
    // A template without a system turn gets the system text at the head of the next turn.
    if !caps.system_role && messages.first().is_some_and(|m| m.role == "system") {
        let system = messages.remove(0);
        if let Some(next) = messages.first_mut() {
            next.content = format!("{}\n{}", system.content, next.content);
        }
    }
    let mut vars: Vec<(String, Value)> = Vec::new();
    if !tools.is_empty() {
        let list: Vec<Value> = tools.iter().map(tool_value).collect();
        vars.push(("tools".into(), Value::from(list)));
    }
    vars.push(("enable_thinking".into(), Value::from(true)));
    let (datetime, date_string) = today();
    vars.push(("datetime".into(), Value::from(datetime)));
    vars.push(("date_string".into(), Value::from(date_string)));
    for (name, text) in kwargs {
        let v: Value = serde_json::from_str(text).map_err(|e| {
            FieldError::new(
                "chat_template_kwargs",
                format!("chat_template_kwargs.{name}"),
                format!("not JSON: {e}"),
            )
        })?;
        vars.retain(|(k, _)| k != name);
        vars.push((name.clone(), v));
    }
    Ok((messages, vars))
}

// ANCHOR: to_message
/// A turn as chapter 2's message: its other fields in llama.cpp's order, a call's arguments
/// an object for a template that reads them as one.
fn to_message(t: &Turn, caps: Caps) -> Message {
    // ANCHOR: yours_to_message
    let mut m = Message::new(&t.role, &t.content);
    let mut field = |k: &str, v: Value| m.fields.push((k.to_string(), v));
    if !t.reasoning_content.is_empty() {
        field(
            "reasoning_content",
            Value::from(t.reasoning_content.as_str()),
        );
    }
    if !t.name.is_empty() {
        field("name", Value::from(t.name.as_str()));
    }
    if !t.tool_call_id.is_empty() {
        field("tool_call_id", Value::from(t.tool_call_id.as_str()));
    }
    if !t.tool_calls.is_empty() {
        let calls: Vec<Value> = t
            .tool_calls
            .iter()
            .map(|c| {
                let arguments = if caps.object_arguments {
                    // Checked to be an object by `read_messages`; its keys keep their order.
                    serde_json::from_str::<Value>(&c.arguments)
                        .unwrap_or_else(|_| Value::from(c.arguments.as_str()))
                } else {
                    Value::from(c.arguments.as_str())
                };
                let function = object([
                    ("name", Value::from(c.name.as_str())),
                    ("arguments", arguments),
                ]);
                let mut call = vec![("type", Value::from("function")), ("function", function)];
                if !c.id.is_empty() {
                    call.push(("id", Value::from(c.id.as_str())));
                }
                object(call)
            })
            .collect();
        field("tool_calls", Value::from(calls));
    }
    m
    // ANCHOR_END: yours_to_message
}
// ANCHOR_END: to_message

fn tool_value(t: &Tool) -> Value {
    let parameters: Value = serde_json::from_str(&t.parameters).unwrap_or_else(|_| Value::from(()));
    let function = object([
        ("name", Value::from(t.name.as_str())),
        ("description", Value::from(t.description.as_str())),
        ("parameters", parameters),
    ]);
    object([("type", Value::from("function")), ("function", function)])
}

/// Today as llama.cpp gives it to templates: `datetime` ("Jul 26 2024") and `date_string`
/// ("26 Jul 2024"), in UTC.
fn today() -> (String, String) {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let mon = MONTHS[(m - 1) as usize];
    (format!("{mon} {d:02} {y}"), format!("{d:02} {mon} {y}"))
}

/// The Gregorian date of a day counted from 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// A conversation rendered with its tools: the prompt's text, and its token ids with the
/// messages' content taken literally (chapter 2's rule).
pub fn render(
    template: &ChatTemplate,
    caps: Caps,
    turns: &[Turn],
    tools: &[Tool],
    kwargs: &[(String, String)],
) -> Result<String, RenderError> {
    let (messages, vars) = template_input(turns, tools, caps, kwargs)?;
    Ok(template.render_with(&messages, true, &vars)?.0)
}

/// [`render`], as token ids.
pub fn encode(
    template: &ChatTemplate,
    tokenizer: &Tokenizer,
    caps: Caps,
    turns: &[Turn],
    tools: &[Tool],
    kwargs: &[(String, String)],
) -> Result<Vec<u32>, RenderError> {
    let (messages, vars) = template_input(turns, tools, caps, kwargs)?;
    Ok(template.encode_with(tokenizer, &messages, true, &vars)?)
}

/// Why a conversation could not be rendered: a field of the request, or the template.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error(transparent)]
    Field(#[from] FieldError),
    #[error("the chat template: {0}")]
    Template(#[from] TokenizerError),
}

/// At most 80 characters of `s`, for an error message.
pub fn shorten(s: &str) -> String {
    match s.char_indices().nth(80) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_become_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_930), (2024, 7, 26));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }

    #[test]
    fn tools_are_checked_by_field() {
        for (tools, path) in [
            (r#"[{"type": "retrieval"}]"#, "tools[0].type"),
            (r#"[{"type": "function"}]"#, "tools[0].function"),
            (
                r#"[{"type": "function", "function": {"name": "a b"}}]"#,
                "tools[0].function.name",
            ),
            (
                r#"[{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}]"#,
                "tools[1].function.name",
            ),
            (
                r#"[{"type": "function", "function": {"name": "f", "parameters": 3}}]"#,
                "tools[0].function.parameters",
            ),
        ] {
            assert_eq!(read_tools(tools).unwrap_err().path, path, "{tools}");
        }
        let many = format!(
            "[{}]",
            vec![r#"{"type": "function", "function": {"name": "f"}}"#; MAX_TOOLS + 1].join(",")
        );
        assert!(read_tools(&many).unwrap_err().message.contains("at most"));
    }

    #[test]
    fn messages_are_checked_by_field() {
        for (messages, path) in [
            (
                r#"[{"role": "wizard", "content": "x"}]"#,
                "messages[0].role",
            ),
            (
                r#"[{"role": "user", "content": [{"type": "image_url"}]}]"#,
                "messages[0].content[0]",
            ),
            (
                r#"[{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}]"#,
                "messages[0].tool_calls[0].function.arguments",
            ),
            (
                r#"[{"role": "assistant", "tool_calls": [{"function": {"name": "<|im_end|>"}}]}]"#,
                "messages[0].tool_calls[0].function.name",
            ),
        ] {
            assert_eq!(
                read_messages(messages).unwrap_err().path,
                path,
                "{messages}"
            );
        }
    }
}
