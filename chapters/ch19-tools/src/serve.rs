//! Tools in chapter 11's server (feature `serve`): a chat request's `tools`, `tool_choice`,
//! `parallel_tool_calls`, `chat_template_kwargs` and `reasoning_format` read as chapter 11's
//! [`Chats`]: the prompt rendered with the tools, the calls held by the grammar of
//! [`Tooled::rule`], and the answer parsed into content, reasoning and calls while it streams.
//! And chapter 11's [`Endpoints`] grown by two APIs agents speak ([`Apis`]), each translated
//! to a chat request and its answer back ([`Relay`]).

use crate::conversation::{FieldError, RenderError};
use crate::messages::{self, Messages};
use crate::parse::{Delta, Parser, random_id};
use crate::relay::{Event, Relay};
use crate::request::{ToolRequest, Tooled};
use crate::responses::{self, Kept, Responses};
use axum::body::{Body, BodyDataStream};
use axum::extract::{Extension, State};
use axum::http::header;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, post};
use ch11::api::{AnswerPart, ApiError, Chat, Chats, Reader, TextBound};
use ch11::server::{AppState, CachePartition, Endpoints, OpenAi, Preparing, RequestLabel, chat};
use futures_util::StreamExt;
use futures_util::stream;
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;

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

// ANCHOR: apis
/// The endpoints: chapter 11's OpenAI two — chat requests now with tools and reasoning — and
/// two more APIs answered through the chat: OpenAI's Responses, whose responses are `kept`
/// for the next request to go on from, and Anthropic's Messages.
#[derive(Debug, Clone, Default)]
pub struct Apis {
    pub kept: Arc<Kept>,
}

impl Endpoints for Apis {
    fn routes(&self) -> Vec<(&'static str, MethodRouter<Arc<AppState>>)> {
        let mut routes = OpenAi.routes();
        let kept = Extension(Arc::clone(&self.kept));
        routes.push(("/v1/responses", post(responses).layer(kept)));
        routes.push(("/v1/messages", post(messages)));
        routes.push(("/v1/messages/count_tokens", post(count_tokens)));
        routes
    }

    /// Anthropic's endpoints answer Anthropic's errors (one already in that shape is left).
    fn error(&self, path: &str, status: u16, body: Value) -> Value {
        if path.starts_with("/v1/messages") && body["type"] != "error" {
            let message = body["error"]["message"]
                .as_str()
                .unwrap_or("the request failed");
            messages::error_body(status, message)
        } else {
            body
        }
    }
}
// ANCHOR_END: apis

/// What a layer in front of the routes told the request (chapter 11's extensions), passed on
/// to the chat.
type Told = (
    Option<Extension<RequestLabel>>,
    Option<Extension<CachePartition>>,
    Option<Extension<Preparing>>,
);

/// `POST /v1/messages`: Anthropic's Messages API.
async fn messages(
    State(s): State<Arc<AppState>>,
    label: Option<Extension<RequestLabel>>,
    partition: Option<Extension<CachePartition>>,
    turn: Option<Extension<Preparing>>,
    body: Body,
) -> Response {
    let relay = |model: &str| Messages::new(&random_id(24), model);
    let text = match read_body(&s, body).await {
        Ok(t) => t,
        Err(e) => return translated(e.into_response(), &relay("")).await,
    };
    let chat = match messages::chat_request(&text, false) {
        Ok(c) => c,
        Err(e) => return translated(api_error(e).into_response(), &relay("")).await,
    };
    let model = chat.fields["model"].as_str().unwrap_or_default();
    let relay = Box::new(relay(model));
    relayed(s, (label, partition, turn), chat.to_json(), relay).await
}

/// `POST /v1/responses`: OpenAI's Responses API. Its responses are kept per API key: the
/// prefix cache's partition, which chapter 12 gives each key.
async fn responses(
    State(s): State<Arc<AppState>>,
    Extension(kept): Extension<Arc<Kept>>,
    label: Option<Extension<RequestLabel>>,
    partition: Option<Extension<CachePartition>>,
    turn: Option<Extension<Preparing>>,
    body: Body,
) -> Response {
    let text = match read_body(&s, body).await {
        Ok(t) => t,
        Err(e) => return e.into_response(),
    };
    let key = partition
        .as_ref()
        .map_or(0, |Extension(CachePartition(p))| *p);
    let (chat, echo) = match responses::chat_request(&text, &|id| kept.get(key, id)) {
        Ok(c) => c,
        Err(e) => return api_error(e).into_response(),
    };
    let model = chat.fields["model"].as_str().unwrap_or_default();
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let relay = Responses::new(&random_id(24), model, created, echo).kept_in(kept, key);
    let relay = Box::new(relay);
    relayed(s, (label, partition, turn), chat.to_json(), relay).await
}

/// `POST /v1/messages/count_tokens`: the tokens a Messages request's prompt would take.
async fn count_tokens(
    State(s): State<Arc<AppState>>,
    turn: Option<Extension<Preparing>>,
    body: Body,
) -> Response {
    let relay = Messages::new("", "");
    let count = async {
        let turn = match turn {
            Some(Extension(t)) => t,
            None => s.preparing().await,
        };
        let text = read_body(&s, body).await?;
        let chat = messages::chat_request(&text, true).map_err(api_error)?;
        let body = chat.to_json();
        let state = Arc::clone(&s);
        let n = tokio::task::spawn_blocking(move || {
            let l = state.loaded.get().ok_or_else(ApiError::loading)?;
            let template = l.engine.template.as_ref().ok_or_else(|| {
                ApiError::invalid("messages", "the model file has no chat template")
            })?;
            let bound = TextBound {
                max_bytes: l.max_text_bytes,
                n_ctx: l.n_ctx,
            };
            let chat = l.chats.open(&body, template, &l.engine.tokenizer, bound)?;
            Ok::<_, ApiError>(chat.prompt.len())
        })
        .await
        .map_err(|_| ApiError::internal("counting the tokens failed"))??;
        turn.done();
        Ok::<_, ApiError>(n)
    };
    match count.await {
        Ok(n) => axum::Json(json!({ "input_tokens": n })).into_response(),
        Err(e) => translated(e.into_response(), &relay).await,
    }
}

/// The request's body as text (chapter 11's reader: 413 past the server's limit), 400 if it
/// is not UTF-8.
async fn read_body(s: &AppState, body: Body) -> Result<String, ApiError> {
    let bytes = ch11::server::read_body(s, body).await?;
    String::from_utf8(bytes.to_vec()).map_err(|e| ApiError::invalid("body", e.to_string()))
}

// ANCHOR: relayed
/// The chat request `body` answered by chapter 11's chat endpoint, and its answer — an
/// error, one completion, or a stream of chunks — relayed as `relay`'s API answers.
async fn relayed(
    s: Arc<AppState>,
    told: Told,
    body: String,
    mut relay: Box<dyn Relay>,
) -> Response {
    let (label, partition, turn) = told;
    let answer = chat(State(s), label, partition, turn, Body::from(body)).await;
    if !answer.status().is_success() {
        return translated(answer, &*relay).await;
    }
    let streaming = (answer.headers().get(header::CONTENT_TYPE))
        .is_some_and(|t| t.as_bytes().starts_with(b"text/event-stream"));
    let body = answer.into_body();
    if !streaming {
        let chat = axum::body::to_bytes(body, usize::MAX).await.ok();
        return match chat.and_then(|b| serde_json::from_slice::<Value>(&b).ok()) {
            Some(chat) => (
                [(header::CONTENT_TYPE, "application/json")],
                relay.answer(&chat),
            )
                .into_response(),
            None => ApiError::internal("the chat's answer was not JSON").into_response(),
        };
    }
    // The chat's Server-Sent Events in, this API's out. Dropping this stream (the client
    // left) drops the chat's, which gives the request up.
    let relaying = Relaying {
        frames: body.into_data_stream(),
        relay,
        buf: Vec::new(),
        queue: VecDeque::new(),
        over: false,
    };
    let events = stream::unfold(relaying, |mut r| async move {
        let event = r.next().await?;
        Some((Ok::<_, Infallible>(event), r))
    });
    Sse::new(events).into_response()
}
// ANCHOR_END: relayed

// ANCHOR: relaying
/// A chat's stream being relayed: its frames, the relay, the bytes of an event not yet whole,
/// the events made and not yet sent, and whether the chat's stream has ended.
struct Relaying {
    frames: BodyDataStream,
    relay: Box<dyn Relay>,
    buf: Vec<u8>,
    queue: VecDeque<Event>,
    over: bool,
}

impl Relaying {
    /// The next of the API's events; `None` once the chat's stream has ended and all are out.
    async fn next(&mut self) -> Option<SseEvent> {
        loop {
            if let Some((name, data)) = self.queue.pop_front() {
                return Some(SseEvent::default().event(name).data(data.to_string()));
            }
            if self.over {
                return None;
            }
            match self.buf.windows(2).position(|w| w == b"\n\n") {
                Some(end) => {
                    let event: Vec<u8> = self.buf.drain(..end + 2).collect();
                    self.read(&String::from_utf8_lossy(&event));
                }
                None => match self.frames.next().await {
                    Some(Ok(bytes)) => self.buf.extend_from_slice(&bytes),
                    _ => self.end(),
                },
            }
        }
    }

    /// A whole event of the chat's stream: its `data:` line is a chunk, or `[DONE]`.
    fn read(&mut self, event: &str) {
        for data in event.lines().filter_map(|l| l.strip_prefix("data:")) {
            match data.trim() {
                "[DONE]" => self.end(),
                json => {
                    if let Ok(chunk) = serde_json::from_str::<Value>(json) {
                        self.queue.extend(self.relay.chunk(&chunk));
                    }
                }
            }
        }
    }

    fn end(&mut self) {
        self.queue.extend(self.relay.done());
        self.over = true;
    }
}
// ANCHOR_END: relaying

/// An error response of chapter 11's in `relay`'s API's shape, its status and `Retry-After`
/// kept.
async fn translated(error: Response, relay: &dyn Relay) -> Response {
    let (parts, body) = error.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 20)
        .await
        .unwrap_or_default();
    let openai: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let mut r = (
        parts.status,
        axum::Json(relay.error(parts.status.as_u16(), &openai)),
    )
        .into_response();
    if let Some(v) = parts.headers.get(header::RETRY_AFTER) {
        r.headers_mut().insert(header::RETRY_AFTER, v.clone());
    }
    r
}
