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
//!
//! One file for each part: `request.rs` the two endpoints' bodies and their own fields,
//! `sampling.rs` the fields they share and how they are checked, `unsupported.rs` what is
//! refused, `response.rs` the responses and stream chunks, `error.rs` the errors, and
//! `seams.rs` what later chapters hand in (the output forms, what a request feeds ahead, what
//! a chat's conversation and answer become).

mod error;
mod request;
mod response;
mod sampling;
mod seams;
mod unsupported;

pub use error::{ApiError, MAX_ECHOED_CHARS, echo};
pub use request::{ChatMessage, ChatRequest, CompletionRequest, Content, Part, Prompt, ROLES};
pub use response::{Answer, Endpoint, Head, Usage, chat_finish_reason, finish_reason};
pub use sampling::{
    Field, MAX_STOP_BYTES, MAX_STOP_STRINGS, MAX_TEMPERATURE, Sampling, Stop, StreamOptions,
};
pub use seams::{
    AnswerPart, Cancel, Chat, Chats, Formats, Lookaheads, PlainChats, Predicted, Reader, TextBound,
    TextOnly,
};
pub use unsupported::{CHAIN, STAGES_OFF, UNSUPPORTED};

// Only for the documentation's links:
#[cfg(doc)]
use ch04::GenParams;
