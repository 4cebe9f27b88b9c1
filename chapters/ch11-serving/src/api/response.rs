//! What the server answers: a whole response, or a stream's chunks, in OpenAI's shapes for
//! either endpoint ([`Head`]), with the token counts ([`Usage`]) and the finish reason.

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
