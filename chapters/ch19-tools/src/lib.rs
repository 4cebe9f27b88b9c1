//! Chapter 19: tools and agents — a conversation with tools rendered through the model's own
//! template, the calls parsed out of the generated text while it streams, and calls held to
//! their tools' schemas by chapter 15's grammars.
//!
//! - [`conversation`]: OpenAI's `tools` and `messages` (calls and their results) read and
//!   checked, and handed to the template as llama.cpp hands them ([`Caps`](conversation::Caps)
//!   says what a template can take).
//! - [`format`]: how a family writes its calls and its reasoning, read from its template.
//! - [`generic`]: tools for a template that knows none (the default model's).
//! - [`parse`]: the answer cut into content, reasoning and calls while it streams.
//! - [`choice`]: `tool_choice`, and the grammar of a turn's calls.
//! - [`lazy`]: a grammar that starts when the model opens a call.
//! - [`request`]: a chat request with tools, end to end ([`Tooled`](request::Tooled)).
//! - [`relay`], [`responses`], [`messages`]: OpenAI's Responses API and Anthropic's Messages
//!   API as chat requests, and the chat's answers as theirs.

pub mod choice;
pub mod conversation;
pub mod format;
pub mod generic;
pub mod lazy;
pub mod messages;
pub mod parse;
pub mod relay;
pub mod request;
pub mod responses;
#[cfg(feature = "serve")]
pub mod serve;
