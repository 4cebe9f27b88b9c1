//! A checked request run on the engine thread ([`generate`]): submitted, then answered with
//! one JSON response, or handed to [`sse_events`] to be streamed.

use super::place::Place;
use super::state::unix_now;
use super::stream::sse_events;
use super::{AppState, Loaded, RequestLabel};
use crate::api::{Answer, ApiError, Endpoint, Head, Reader, Usage};
use crate::worker::{Event, Job};
use axum::extract::Extension;
use axum::response::sse::Sse;
use axum::response::{IntoResponse, Response};
use ch04::GenParams;
use ch07::Lookahead;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;
use tokio::sync::mpsc::unbounded_channel;

// Only for the documentation's links:
#[cfg(doc)]
use super::CachePartition;
#[cfg(doc)]
use crate::api::Lookaheads;

/// A checked request, ready to run.
pub(super) struct Generate {
    endpoint: Endpoint,
    label: Option<Arc<str>>,
    prompt: Vec<u32>,
    params: GenParams,
    /// The client's token limit, if it gave one.
    asked: Option<usize>,
    stream: bool,
    include_usage: bool,
    /// The prefix cache's partition ([`CachePartition`]).
    pub(super) partition: u64,
    /// What it feeds ahead ([`Lookaheads`]), if anything.
    pub(super) lookahead: Option<Box<dyn Lookahead + Send>>,
    /// A chat's reader of its answer ([`Chats`](crate::api::Chats)); a completion has none.
    pub(super) reader: Option<Box<dyn Reader>>,
}

impl Generate {
    pub(super) fn new(
        endpoint: Endpoint,
        label: Option<Extension<RequestLabel>>,
        prompt: Vec<u32>,
        params: GenParams,
        asked: Option<usize>,
        sampling: &crate::api::Sampling,
    ) -> Generate {
        Generate {
            endpoint,
            label: label.map(|Extension(RequestLabel(l))| l),
            prompt,
            params,
            asked,
            stream: sampling.stream,
            include_usage: sampling
                .stream_options
                .as_ref()
                .is_some_and(|o| o.include_usage),
            partition: 0,
            lookahead: None,
            reader: None,
        }
    }
}

impl Generate {
    pub(super) fn prompt_len(&self) -> usize {
        self.prompt.len()
    }
}

// ANCHOR: generate
/// Run `prompt` and answer: one JSON response, or a stream of chunks.
pub(super) async fn generate(
    s: &Arc<AppState>,
    l: &Loaded,
    request: Generate,
    mut place: Place,
    deadline: Instant,
) -> Result<Response, ApiError> {
    let Generate {
        endpoint,
        label,
        prompt,
        mut params,
        asked,
        stream,
        include_usage,
        partition,
        lookahead,
        reader,
    } = request;
    let param = match endpoint {
        Endpoint::Chat => "messages",
        Endpoint::Completions => "prompt",
    };
    if prompt.is_empty() {
        return Err(ApiError::invalid(param, "the prompt has no tokens"));
    }
    if prompt.len() > l.n_ctx {
        return Err(ApiError::context(param, prompt.len(), l.n_ctx));
    }
    // Generation ends when the context is full (the last token takes no position): that, or
    // the client's limit if smaller.
    params.max_tokens = asked.unwrap_or(usize::MAX).min(l.n_ctx - prompt.len() + 1);
    // ANCHOR_END: generate

    // A request that was prepared while the server began to drain does not start.
    if s.is_draining() {
        return Err(ApiError::shutting_down());
    }

    // ANCHOR: submit
    let (tx, mut rx) = unbounded_channel();
    let prompt_tokens = prompt.len();
    let response_id = format!(
        "{}-{}",
        if endpoint == Endpoint::Chat {
            "chatcmpl"
        } else {
            "cmpl"
        },
        s.next_response.fetch_add(1, Ordering::Relaxed)
    );
    let job = Job {
        label: label.unwrap_or_else(|| response_id.as_str().into()),
        prompt,
        params,
        deadline,
        partition,
        lookahead,
        events: tx,
    };
    place.ticket = Some(
        l.worker
            .submit(job)
            .ok_or_else(|| ApiError::internal("the engine thread has stopped"))?,
    );
    match rx.recv().await {
        Some(Event::Accepted) => {}
        Some(Event::Rejected(m)) => {
            place.ended = true;
            return Err(ApiError::invalid(param, m));
        }
        _ => return Err(ApiError::internal("the engine thread has stopped")),
    }
    // ANCHOR_END: submit

    // ANCHOR: answer
    let head = Head {
        endpoint,
        id: response_id,
        created: unix_now(),
        model: l.model_id.clone(),
    };
    if stream {
        let events = sse_events(head, rx, place, include_usage, reader);
        return Ok(Sse::new(events).into_response());
    }
    // ANCHOR: yours_collect
    let mut text = String::new();
    loop {
        match rx.recv().await {
            Some(Event::Text(t)) => text.push_str(&t),
            Some(Event::Done(o)) if o.closed => {
                place.ended = true;
                return Err(ApiError::ended_by_shutdown());
            }
            Some(Event::Done(o)) => {
                place.ended = true;
                let usage = Usage {
                    prompt_tokens,
                    completion_tokens: o.completion_tokens,
                    cached_tokens: o.cached_tokens,
                    fed_ahead_tokens: o.fed_ahead_tokens,
                    kept_ahead_tokens: o.kept_ahead_tokens,
                };
                let body = match reader {
                    // A chat's answer: its parts, read from the whole text.
                    Some(mut reader) => {
                        let mut answer = Answer::default();
                        for part in reader.read(&text).iter().chain(&reader.finish()) {
                            answer.add(part);
                        }
                        head.answer(&answer, o.stop, usage)
                    }
                    None => head.response(&text, o.stop, usage),
                };
                return Ok(axum::Json(body).into_response());
            }
            Some(Event::Failed(m)) => {
                place.ended = true;
                return Err(ApiError::internal(m));
            }
            Some(Event::Accepted | Event::Rejected(_)) | None => {
                return Err(ApiError::internal("the engine thread has stopped"));
            }
        }
    }
    // ANCHOR_END: yours_collect
}
// ANCHOR_END: answer
