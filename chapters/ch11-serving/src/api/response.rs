//! What the server answers: a whole response, or a stream's chunks, in OpenAI's shapes for
//! either endpoint ([`Head`]), with the token counts ([`Usage`]) and the finish reason.

use super::AnswerPart;
use ch04::StopReason;
use serde_json::{Value, json};

/// OpenAI's `finish_reason`: `stop` for an end-of-generation token or a stop string, `length`
/// for the token limit, the context, or the server's time limit.
pub fn finish_reason(stop: StopReason) -> &'static str {
    match stop {
        StopReason::EndOfGeneration | StopReason::StopString => "stop",
        StopReason::MaxTokens | StopReason::ContextFull | StopReason::Cancelled => "length",
    }
}

/// A chat's `finish_reason`: `tool_calls` when the model ended its turn having called tools,
/// [`finish_reason`] otherwise.
pub fn chat_finish_reason(stop: StopReason, called: bool) -> &'static str {
    match stop {
        StopReason::EndOfGeneration | StopReason::StopString if called => "tool_calls",
        _ => finish_reason(stop),
    }
}

/// An assistant's message: the [`AnswerPart`]s of its answer put together.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Answer {
    pub content: String,
    pub reasoning: String,
    /// Each call's id, function name and arguments (JSON text).
    pub calls: Vec<(String, String, String)>,
}

impl Answer {
    pub fn add(&mut self, part: &AnswerPart) {
        match part {
            AnswerPart::Content(t) => self.content.push_str(t),
            AnswerPart::Reasoning(t) => self.reasoning.push_str(t),
            AnswerPart::Call { id, name, .. } => {
                self.calls.push((id.clone(), name.clone(), String::new()))
            }
            AnswerPart::Arguments { index, text } => {
                if let Some(c) = self.calls.get_mut(*index) {
                    c.2.push_str(text);
                }
            }
        }
    }

    /// OpenAI's message object: `content` (null when the turn only calls tools),
    /// llama-server's `reasoning_content` when there is any, and `tool_calls`.
    pub fn to_json(&self) -> Value {
        let mut m = json!({ "role": "assistant", "content": self.content });
        if self.content.is_empty() && !self.calls.is_empty() {
            m["content"] = Value::Null;
        }
        if !self.reasoning.is_empty() {
            m["reasoning_content"] = self.reasoning.clone().into();
        }
        if !self.calls.is_empty() {
            m["tool_calls"] = (self.calls.iter())
                .map(|(id, name, arguments)| {
                    json!({"id": id, "type": "function",
                           "function": {"name": name, "arguments": arguments}})
                })
                .collect();
        }
        m
    }
}

/// Token counts of a finished request.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens found in the prefix cache.
    pub cached_tokens: usize,
    /// Tokens fed ahead (chapter 7's lookahead), and those kept.
    pub fed_ahead_tokens: usize,
    pub kept_ahead_tokens: usize,
}

impl Usage {
    /// OpenAI's usage object. A request that fed tokens ahead (its prediction, say) also gets
    /// `completion_tokens_details` with OpenAI's names for the predicted tokens kept and thrown
    /// away (`accepted_prediction_tokens`, `rejected_prediction_tokens`).
    pub fn to_json(self) -> Value {
        let mut v = json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": { "cached_tokens": self.cached_tokens },
        });
        if self.fed_ahead_tokens > 0 {
            v["completion_tokens_details"] = json!({
                "accepted_prediction_tokens": self.kept_ahead_tokens,
                "rejected_prediction_tokens": self.fed_ahead_tokens - self.kept_ahead_tokens,
            });
        }
        v
    }
}

/// Which endpoint a response is for: the two differ in object names and in where the text goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
}

/// The fixed fields of one response: its id, creation time and model.
#[derive(Debug, Clone)]
pub struct Head {
    pub endpoint: Endpoint,
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl Head {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completions, _) => "text_completion",
        }
    }

    fn with_choices(&self, chunk: bool, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }

    /// The whole answer of a request without `stream`.
    pub fn response(&self, text: &str, stop: StopReason, usage: Usage) -> Value {
        let choice = match self.endpoint {
            Endpoint::Chat => json!({
                "index": 0,
                "message": { "role": "assistant", "content": text },
                "logprobs": null,
                "finish_reason": finish_reason(stop),
            }),
            Endpoint::Completions => json!({
                "index": 0,
                "text": text,
                "logprobs": null,
                "finish_reason": finish_reason(stop),
            }),
        };
        let mut v = self.with_choices(false, json!([choice]));
        v["usage"] = usage.to_json();
        v
    }

    /// The whole answer of a chat request without `stream`, made of its parts.
    pub fn answer(&self, answer: &Answer, stop: StopReason, usage: Usage) -> Value {
        let choice = json!({
            "index": 0,
            "message": answer.to_json(),
            "logprobs": null,
            "finish_reason": chat_finish_reason(stop, !answer.calls.is_empty()),
        });
        let mut v = self.with_choices(false, json!([choice]));
        v["usage"] = usage.to_json();
        v
    }

    /// A chat stream's chunk carrying one part: a `content` or `reasoning_content` delta, or a
    /// `tool_calls` delta — a call's start (its index, id, type and name, no arguments yet)
    /// or more of its arguments.
    pub fn part_chunk(&self, part: &AnswerPart) -> Value {
        let delta = match part {
            AnswerPart::Content(t) => json!({ "content": t }),
            AnswerPart::Reasoning(t) => json!({ "reasoning_content": t }),
            AnswerPart::Call { index, id, name } => json!({ "tool_calls": [{
                "index": index, "id": id, "type": "function",
                "function": {"name": name, "arguments": ""},
            }]}),
            AnswerPart::Arguments { index, text } => json!({ "tool_calls": [{
                "index": index, "function": {"arguments": text},
            }]}),
        };
        let choice = json!({ "index": 0, "delta": delta, "logprobs": null, "finish_reason": null });
        self.with_choices(true, json!([choice]))
    }

    /// The last chunk of a chat stream whose answer called tools or not.
    pub fn last_chat_chunk(&self, stop: StopReason, called: bool) -> Value {
        let choice = json!({ "index": 0, "delta": {}, "logprobs": null,
                             "finish_reason": chat_finish_reason(stop, called) });
        self.with_choices(true, json!([choice]))
    }

    // ANCHOR: chunk
    /// A stream chunk: the first one of a chat names the role; text chunks carry a delta; the
    /// last carries the finish reason.
    pub fn chunk(&self, text: Option<&str>, first: bool, stop: Option<StopReason>) -> Value {
        // ANCHOR: yours_chunk
        let finish = stop.map(finish_reason);
        let choice = match self.endpoint {
            Endpoint::Chat => {
                let mut delta = serde_json::Map::new();
                if first {
                    delta.insert("role".into(), "assistant".into());
                }
                if let Some(t) = text {
                    delta.insert("content".into(), t.into());
                }
                json!({ "index": 0, "delta": delta, "logprobs": null, "finish_reason": finish })
            }
            Endpoint::Completions => json!({
                "index": 0,
                "text": text.unwrap_or(""),
                "logprobs": null,
                "finish_reason": finish,
            }),
        };
        self.with_choices(true, json!([choice]))
        // ANCHOR_END: yours_chunk
    }
    // ANCHOR_END: chunk

    /// The chunk after the last choice when the client asked for `include_usage`.
    pub fn usage_chunk(&self, usage: Usage) -> Value {
        let mut v = self.with_choices(true, json!([]));
        v["usage"] = usage.to_json();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_chunks_have_openais_shape() {
        let head = |endpoint| Head {
            endpoint,
            id: "chatcmpl-7".into(),
            created: 1,
            model: "m".into(),
        };
        let chat = head(Endpoint::Chat);
        let first = chat.chunk(Some(""), true, None);
        assert_eq!(first["object"], "chat.completion.chunk");
        assert_eq!(
            (&first["id"], &first["created"]),
            (&json!("chatcmpl-7"), &json!(1))
        );
        assert_eq!(
            first["choices"],
            json!([{"index": 0, "delta": {"role": "assistant", "content": ""},
                    "logprobs": null, "finish_reason": null}])
        );
        let text = chat.chunk(Some(" Paris"), false, None);
        assert_eq!(text["choices"][0]["delta"], json!({"content": " Paris"}));
        assert_eq!(text["choices"][0]["finish_reason"], Value::Null);
        let last = chat.chunk(None, false, Some(StopReason::EndOfGeneration));
        assert_eq!(last["choices"][0]["delta"], json!({}));
        assert_eq!(last["choices"][0]["finish_reason"], "stop");
        let completion = head(Endpoint::Completions);
        let c = completion.chunk(Some(" Paris"), false, None);
        assert_eq!(c["object"], "text_completion");
        assert_eq!(
            c["choices"],
            json!([{"index": 0, "text": " Paris", "logprobs": null, "finish_reason": null}])
        );
        let c = completion.chunk(None, false, Some(StopReason::MaxTokens));
        assert_eq!(
            (&c["choices"][0]["text"], &c["choices"][0]["finish_reason"]),
            (&json!(""), &json!("length"))
        );
    }
}
