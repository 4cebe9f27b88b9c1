//! A request's answer as a stream of Server-Sent Events in OpenAI's chunk shape
//! ([`sse_events`]); the stream owns the request's place, so a client that disconnects
//! cancels it.

use super::place::Place;
use crate::api::{AnswerPart, ApiError, Endpoint, Head, Reader, Usage};
use crate::worker::Event;
use axum::response::sse::Event as SseEvent;
use futures_util::stream::{self, Stream};
use serde_json::Value;
use std::convert::Infallible;
use tokio::sync::mpsc::UnboundedReceiver;

/// The request's events as SSE: a first chunk with the role, a chunk per piece of text (a
/// chat's: per part its `reader` makes of the text), a last chunk with the finish reason, the
/// usage if asked, then `[DONE]`. The stream owns the request's [`Place`]: when the client
/// disconnects, the server drops the stream, and the request is cancelled.
pub(super) fn sse_events(
    head: Head,
    rx: UnboundedReceiver<Event>,
    place: Place,
    include_usage: bool,
    reader: Option<Box<dyn Reader>>,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    enum Phase {
        First,
        Text,
        Done,
    }
    let data = |v: Value| Ok(SseEvent::default().data(v.to_string()));
    // The chunks of `parts`, queued in the order they pop (last first); whether a call began.
    let queue_parts = move |head: &Head, parts: Vec<AnswerPart>, queued: &mut Vec<_>| {
        let called = parts.iter().any(|p| matches!(p, AnswerPart::Call { .. }));
        for p in parts.iter().rev() {
            queued.push(data(head.part_chunk(p)));
        }
        called
    };
    let state = (
        rx,
        place,
        Phase::First,
        Vec::<Result<SseEvent, Infallible>>::new(),
        (reader, false),
    );
    stream::unfold(
        state,
        move |(mut rx, mut place, phase, mut queued, mut read)| {
            let head = head.clone();
            async move {
                if let Some(e) = queued.pop() {
                    return Some((e, (rx, place, phase, queued, read)));
                }
                match phase {
                    Phase::Done => None,
                    // A chat stream opens with the role, as OpenAI's does.
                    Phase::First if head.endpoint == Endpoint::Chat => {
                        let chunk = head.chunk(Some(""), true, None);
                        Some((data(chunk), (rx, place, Phase::Text, queued, read)))
                    }
                    Phase::First | Phase::Text => match rx.recv().await {
                        Some(Event::Text(t)) => match &mut read.0 {
                            // A chat's text, as the parts it completes: none (held back), one or
                            // several chunks.
                            Some(reader) => {
                                read.1 |= queue_parts(&head, reader.read(&t), &mut queued);
                                let next = queued
                                    .pop()
                                    .unwrap_or_else(|| Ok(SseEvent::default().comment("")));
                                Some((next, (rx, place, Phase::Text, queued, read)))
                            }
                            None => Some((
                                data(head.chunk(Some(&t), false, None)),
                                (rx, place, Phase::Text, queued, read),
                            )),
                        },
                        Some(Event::Done(o)) if o.closed => {
                            // An error in OpenAI's shape, then [DONE]: the stream ends as a
                            // stream should, and the client knows the text is unfinished.
                            place.ended = true;
                            queued.push(Ok(SseEvent::default().data("[DONE]")));
                            let e = ApiError::ended_by_shutdown().body();
                            Some((data(e), (rx, place, Phase::Done, queued, read)))
                        }
                        Some(Event::Done(o)) => {
                            place.ended = true;
                            // Sent in reverse order of the pops: last chunk, usage, [DONE].
                            queued.push(Ok(SseEvent::default().data("[DONE]")));
                            if include_usage {
                                queued.push(data(head.usage_chunk(Usage {
                                    prompt_tokens: o.prompt_tokens,
                                    completion_tokens: o.completion_tokens,
                                    cached_tokens: o.cached_tokens,
                                    fed_ahead_tokens: o.fed_ahead_tokens,
                                    kept_ahead_tokens: o.kept_ahead_tokens,
                                })));
                            }
                            // A chat's parts held back to the end come before its last chunk.
                            let last = match &mut read.0 {
                                Some(reader) => {
                                    let mut held = Vec::new();
                                    read.1 |= queue_parts(&head, reader.finish(), &mut held);
                                    queued.push(data(head.last_chat_chunk(o.stop, read.1)));
                                    queued.extend(held);
                                    queued.pop().expect("the last chunk at least")
                                }
                                None => data(head.chunk(None, false, Some(o.stop))),
                            };
                            Some((last, (rx, place, Phase::Done, queued, read)))
                        }
                        Some(Event::Failed(m)) => {
                            place.ended = true;
                            let e = ApiError::internal(m).body();
                            Some((data(e), (rx, place, Phase::Done, queued, read)))
                        }
                        _ => {
                            place.ended = true;
                            let e = ApiError::internal("the engine thread has stopped").body();
                            Some((data(e), (rx, place, Phase::Done, queued, read)))
                        }
                    },
                }
            }
        },
    )
}
