//! A chat request with tools, end to end: its fields read ([`ToolRequest::read`]), its prompt
//! rendered through the model's template ([`Tooled::prompt`]), the rule that holds its calls
//! ([`Tooled::rule`]) and the parser of its answer ([`Tooled::parser`]). [`Tooled`] is what the
//! server keeps per model: the template's [`Caps`] and [`Format`], found once.

use crate::choice::{ToolChoice, read_tool_choice, rule};
use crate::conversation::{
    Caps, FieldError, RenderError, Tool, Turn, read_messages, read_tools, template_input,
};
use crate::format::Format;
use crate::generic;
use crate::parse::{Options, Parser};
use ch02::{ChatTemplate, Tokenizer};
use ch04::MakeRule;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::sync::Arc;

/// The most `chat_template_kwargs` one request may give, and the longest name: each is a
/// variable of the template; real templates read one or two (`enable_thinking`).
pub const MAX_KWARGS: usize = 16;
pub const MAX_KWARG_NAME: usize = 64;

/// The fields of a chat request this chapter reads.
#[derive(Deserialize)]
pub struct WireFields<'a> {
    #[serde(borrow)]
    pub messages: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub tools: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub tool_choice: Option<&'a RawValue>,
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    #[serde(borrow, default)]
    pub chat_template_kwargs: Option<&'a RawValue>,
    #[serde(default)]
    pub reasoning_format: Option<String>,
}

/// A chat request's conversation, tools and choices, checked.
#[derive(Debug, Clone)]
pub struct ToolRequest {
    pub turns: Vec<Turn>,
    pub tools: Vec<Tool>,
    pub choice: ToolChoice,
    /// Several calls in one turn (OpenAI's `parallel_tool_calls`; llama-server's default,
    /// one call, when absent).
    pub parallel: bool,
    /// `chat_template_kwargs`: each name and its value's JSON text.
    pub kwargs: Vec<(String, String)>,
    /// Reasoning kept apart from the content (llama-server's `reasoning_format` other than
    /// `none`; its default, `auto`, does).
    pub reasoning: bool,
}

impl ToolRequest {
    /// Read the fields of a chat request's body (its JSON text).
    pub fn read(body: &str) -> Result<ToolRequest, FieldError> {
        let f: WireFields = serde_json::from_str(body)
            .map_err(|e| FieldError::new("body", "body", e.to_string()))?;
        ToolRequest::from_fields(&f)
    }

    pub fn from_fields(f: &WireFields) -> Result<ToolRequest, FieldError> {
        let messages = f
            .messages
            .ok_or_else(|| FieldError::new("messages", "messages", "is missing"))?;
        let turns = read_messages(messages.get())?;
        let tools = match f.tools.map(RawValue::get) {
            None | Some("null") => Vec::new(),
            Some(t) => read_tools(t)?,
        };
        let choice = read_tool_choice(f.tool_choice, &tools)?;
        let kwargs = match f.chat_template_kwargs.map(RawValue::get) {
            None | Some("null") => Vec::new(),
            Some(t) => read_kwargs(t)?,
        };
        let reasoning = match f.reasoning_format.as_deref() {
            None | Some("auto") | Some("deepseek") | Some("deepseek-legacy") => true,
            Some("none") => false,
            Some(other) => {
                return Err(FieldError::new(
                    "reasoning_format",
                    "reasoning_format",
                    format!(
                        "is {:?}; expected \"none\", \"auto\", \"deepseek\" or \"deepseek-legacy\"",
                        crate::conversation::shorten(other)
                    ),
                ));
            }
        };
        Ok(ToolRequest {
            turns,
            tools,
            choice,
            parallel: f.parallel_tool_calls.unwrap_or(false),
            kwargs,
            reasoning,
        })
    }

    /// Whether the template is asked to let the model think (`enable_thinking`, true unless
    /// the request says false).
    pub fn thinking(&self) -> bool {
        !self
            .kwargs
            .iter()
            .any(|(k, v)| k == "enable_thinking" && v.trim() == "false")
    }
}

fn read_kwargs(text: &str) -> Result<Vec<(String, String)>, FieldError> {
    let bad = |path: String, m: String| FieldError::new("chat_template_kwargs", path, m);
    let map: std::collections::BTreeMap<String, &RawValue> =
        serde_json::from_str(text).map_err(|e| {
            bad(
                "chat_template_kwargs".into(),
                format!("expected an object: {e}"),
            )
        })?;
    if map.len() > MAX_KWARGS {
        return Err(bad(
            "chat_template_kwargs".into(),
            format!("{} variables; at most {MAX_KWARGS}", map.len()),
        ));
    }
    let mut out = Vec::with_capacity(map.len());
    for (k, v) in map {
        let ok = !k.is_empty()
            && k.len() <= MAX_KWARG_NAME
            && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            && !k.as_bytes()[0].is_ascii_digit();
        // The variables the template is rendered with are not the request's to replace.
        let reserved = [
            "messages",
            "tools",
            "bos_token",
            "eos_token",
            "add_generation_prompt",
        ];
        if !ok || reserved.contains(&k.as_str()) {
            return Err(bad(
                format!("chat_template_kwargs.{}", crate::conversation::shorten(&k)),
                "is not a variable a request may set: a name of letters, digits and `_`, \
                 other than messages, tools, bos_token, eos_token, add_generation_prompt"
                    .into(),
            ));
        }
        out.push((k, v.get().to_string()));
    }
    Ok(out)
}

/// What a model's template does with tools: found once, when the model is loaded.
#[derive(Debug, Clone, Copy)]
pub struct Tooled {
    pub caps: Caps,
    pub format: Format,
}

/// A request's prompt, and whether it leaves the model's reasoning open.
pub struct Prompt {
    pub ids: Vec<u32>,
    pub thinking_open: bool,
}

impl Tooled {
    pub fn new(template: &ChatTemplate) -> Tooled {
        let caps = Caps::probe(template);
        Tooled {
            caps,
            format: Format::detect(template.source(), caps),
        }
    }

    /// The prompt of `req` through `template`: its token ids (the messages' content taken
    /// literally), and whether the text ends inside an opened reasoning block.
    pub fn prompt(
        &self,
        template: &ChatTemplate,
        tokenizer: &Tokenizer,
        req: &ToolRequest,
    ) -> Result<Prompt, RenderError> {
        let (turns, tools) = if self.format.describe_tools && !req.tools.is_empty() {
            (generic::rewrite(&req.turns, &req.tools), &[][..])
        } else {
            (req.turns.clone(), &req.tools[..])
        };
        let (messages, vars) = template_input(&turns, tools, self.caps, &req.kwargs)?;
        let ids = template.encode_with(tokenizer, &messages, true, &vars)?;
        let thinking_open = match self.format.think {
            Some((open, _)) if req.thinking() => {
                let (text, _) = template.render_with(&messages, true, &vars)?;
                text.trim_end().ends_with(open)
            }
            _ => false,
        };
        Ok(Prompt { ids, thinking_open })
    }

    /// The rule that holds `req`'s calls (`None`: the answer is free).
    pub fn rule(
        &self,
        req: &ToolRequest,
        thinking_open: bool,
    ) -> Result<Option<Arc<dyn MakeRule>>, FieldError> {
        rule(
            self.format,
            &req.tools,
            &req.choice,
            req.parallel,
            thinking_open,
        )
    }

    /// The parser of `req`'s answer.
    pub fn parser(&self, req: &ToolRequest, thinking_open: bool) -> Parser {
        Parser::new(
            self.format,
            Options {
                reasoning: req.reasoning,
                calls: !req.tools.is_empty() && req.choice != ToolChoice::None,
                thinking_open,
            },
        )
    }
}
