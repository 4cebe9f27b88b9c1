//! The seams through which a later chapter changes what a request may ask for: the output
//! forms it may take ([`Formats`]; this chapter's own is plain text) and what it feeds ahead
//! ([`Lookaheads`]; this chapter's own feeds the output the client predicted) — and the flag
//! that tells their work a request was given up ([`Cancel`]).

use super::{ApiError, Sampling};
use ch04::MakeRule;
use ch07::{Known, Lookahead};
use serde_json::value::RawValue;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

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

// ANCHOR: lookaheads
/// What a request feeds ahead of its decode tokens, for chapter 7's scheduler to keep where
/// the model agrees ([`Lookahead`]): the output never changes, only the steps it takes. The
/// server holds one value of this ([`ServeArgs::lookaheads`](crate::ServeArgs::lookaheads)):
/// this chapter's [`Predicted`], or one that a later chapter hands in.
pub trait Lookaheads: Send + Sync + std::fmt::Debug {
    /// The lookahead of a request whose prompt has `prompt_len` tokens, whose client predicted
    /// the output `predicted` (OpenAI's `prediction`, tokenized; empty where absent), with its
    /// fields `sampling`; `None` for none.
    fn lookahead(
        &self,
        prompt_len: usize,
        predicted: Vec<u32>,
        sampling: &Sampling,
    ) -> Option<Box<dyn Lookahead + Send>>;
}

/// OpenAI's predicted outputs: the text the client expects the answer to be (an edited file,
/// say), fed ahead as chapter 7's [`Known`] continuation, as far as the model agrees. The
/// response's `usage` counts the predicted tokens kept (`accepted_prediction_tokens`) and those
/// not (`rejected_prediction_tokens`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Predicted;

impl Lookaheads for Predicted {
    fn lookahead(
        &self,
        prompt_len: usize,
        predicted: Vec<u32>,
        _: &Sampling,
    ) -> Option<Box<dyn Lookahead + Send>> {
        (!predicted.is_empty())
            .then(|| Box::new(Known::new(prompt_len, predicted)) as Box<dyn Lookahead + Send>)
    }
}
// ANCHOR_END: lookaheads

// ANCHOR: chats
/// What a chat request's conversation becomes — its prompt, and the rule its answer is held
/// to — and what the answer's text becomes: parts of the assistant's message ([`AnswerPart`]). The
/// server holds one value of this ([`ServeArgs::chats`](crate::ServeArgs::chats)): this
/// chapter's [`PlainChats`], whose answer is all content, or one a later chapter hands in
/// (tool calls, reasoning).
pub trait Chats: Send + Sync + std::fmt::Debug {
    /// The top-level fields of a chat request this reads besides this chapter's own, which
    /// the server would otherwise refuse by name (`tools`, `tool_choice`, …).
    fn fields(&self) -> &'static [&'static str] {
        &[]
    }

    /// Read the request (its body, JSON text) and its messages, and render its prompt with
    /// the model's `template`; `bound` is the most bytes of text a prompt that fits the
    /// context can have, where such a bound holds, and the context's tokens (a longer
    /// conversation is refused before it is tokenized). Called on a blocking thread.
    fn open(
        &self,
        body: &str,
        template: &ch02::ChatTemplate,
        tokenizer: &ch02::Tokenizer,
        bound: TextBound,
    ) -> Result<Chat, ApiError>;
}
// ANCHOR_END: chats

/// The most bytes of text a prompt that fits the context can have (`None`: no bound holds),
/// and the context's tokens.
#[derive(Debug, Clone, Copy)]
pub struct TextBound {
    pub max_bytes: Option<usize>,
    pub n_ctx: usize,
}

impl TextBound {
    /// A 400 naming `param` when `bytes` of text cannot fit.
    pub fn check(self, param: &'static str, bytes: usize) -> Result<(), ApiError> {
        match self.max_bytes {
            Some(max) if bytes > max => Err(ApiError::too_long_text(param, bytes, max, self.n_ctx)),
            _ => Ok(()),
        }
    }
}

/// A chat request, opened: its prompt's token ids, the rule its answer is held to (if any),
/// and the reader of its answer.
pub struct Chat {
    pub prompt: Vec<u32>,
    pub rule: Option<Arc<dyn MakeRule>>,
    pub reader: Box<dyn Reader>,
}

// ANCHOR: reader
/// Turns the answer's text, as it streams, into parts of the assistant's message.
pub trait Reader: Send {
    /// The next piece of text: the parts it completes.
    fn read(&mut self, text: &str) -> Vec<AnswerPart>;
    /// The text has ended: the parts still held back.
    fn finish(&mut self) -> Vec<AnswerPart>;
}

/// A part of an assistant's message, as it becomes known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AnswerPart {
    /// Text of the answer (OpenAI's `content`).
    Content(String),
    /// Text of the model's reasoning (llama-server's `reasoning_content`).
    Reasoning(String),
    /// Call `index` begins: its id and the function's name.
    Call {
        index: usize,
        id: String,
        name: String,
    },
    /// More of call `index`'s arguments (JSON text).
    Arguments { index: usize, text: String },
}
// ANCHOR_END: reader

// ANCHOR: plain_chats
/// The messages as chapter 2's, rendered by the template; the answer all content.
#[derive(Debug, Clone, Copy, Default)]
pub struct PlainChats;

impl Chats for PlainChats {
    fn open(
        &self,
        body: &str,
        template: &ch02::ChatTemplate,
        tokenizer: &ch02::Tokenizer,
        bound: TextBound,
    ) -> Result<Chat, ApiError> {
        let req: super::ChatRequest =
            serde_json::from_str(body).map_err(|e| ApiError::bad_json(&e))?;
        let messages = req.messages()?;
        bound.check("messages", messages.iter().map(|m| m.content.len()).sum())?;
        let prompt = template
            .encode(tokenizer, &messages, true)
            .map_err(|e| ApiError::invalid("messages", e.to_string()))?;
        Ok(Chat {
            prompt,
            rule: None,
            reader: Box::new(AllContent),
        })
    }
}

/// Every piece of text is content.
struct AllContent;

impl Reader for AllContent {
    fn read(&mut self, text: &str) -> Vec<AnswerPart> {
        vec![AnswerPart::Content(text.to_string())]
    }
    fn finish(&mut self) -> Vec<AnswerPart> {
        Vec::new()
    }
}
// ANCHOR_END: plain_chats
