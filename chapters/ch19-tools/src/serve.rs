//! Tools in chapter 11's server (feature `serve`): a chat request's `tools`, `tool_choice`,
//! `parallel_tool_calls`, `chat_template_kwargs` and `reasoning_format` read as chapter 11's
//! [`Chats`]: the prompt rendered with the tools, the calls held by the grammar of
//! [`Tooled::rule`], and the answer parsed into content, reasoning and calls while it streams.

use crate::conversation::{FieldError, RenderError};
use crate::parse::{Delta, Parser};
use crate::request::{ToolRequest, Tooled};
use ch11::api::{AnswerPart, ApiError, Chat, Chats, Reader, TextBound};

/// Chat requests with tools and reasoning.
#[derive(Debug, Clone, Copy, Default)]
pub struct ToolChats;

/// The request's fields this reads besides chapter 11's.
pub const FIELDS: [&str; 5] = [
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "chat_template_kwargs",
    "reasoning_format",
];

fn api_error(e: FieldError) -> ApiError {
    ApiError::invalid(e.field, e.to_string())
}

impl Chats for ToolChats {
    fn fields(&self) -> &'static [&'static str] {
        &FIELDS
    }

    fn open(
        &self,
        body: &str,
        template: &ch02::ChatTemplate,
        tokenizer: &ch02::Tokenizer,
        bound: TextBound,
    ) -> Result<Chat, ApiError> {
        let req = ToolRequest::read(body).map_err(api_error)?;
        // The tools are written into the prompt too: each part alone, then both, must fit.
        let tools: usize = (req.tools.iter())
            .map(|t| t.name.len() + t.description.len() + t.parameters.len())
            .sum();
        let turns: usize = req.turns.iter().map(|t| t.content.len()).sum();
        bound.check("tools", tools)?;
        bound.check("messages", tools + turns)?;
        let tooled = Tooled::new(template);
        let prompt = tooled
            .prompt(template, tokenizer, &req)
            .map_err(|e| match e {
                RenderError::Field(f) => api_error(f),
                RenderError::Template(t) => ApiError::invalid("messages", t.to_string()),
            })?;
        let rule = tooled.rule(&req, prompt.thinking_open).map_err(api_error)?;
        let parser = tooled.parser(&req, prompt.thinking_open);
        Ok(Chat {
            prompt: prompt.ids,
            rule,
            reader: Box::new(Parsing(parser)),
        })
    }
}

/// The parser as chapter 11's reader.
struct Parsing(Parser);

fn parts(deltas: Vec<Delta>) -> Vec<AnswerPart> {
    deltas
        .into_iter()
        .map(|d| match d {
            Delta::Content(t) => AnswerPart::Content(t),
            Delta::Reasoning(t) => AnswerPart::Reasoning(t),
            Delta::Call { index, id, name } => AnswerPart::Call { index, id, name },
            Delta::Arguments { index, text } => AnswerPart::Arguments { index, text },
        })
        .collect()
}

impl Reader for Parsing {
    fn read(&mut self, text: &str) -> Vec<AnswerPart> {
        parts(self.0.push(text))
    }

    fn finish(&mut self) -> Vec<AnswerPart> {
        parts(self.0.finish())
    }
}
