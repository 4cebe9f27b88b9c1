//! The server's errors in OpenAI's shape ([`ApiError`]: a status, and `{"error": {message,
//! type, param, code}}`), one constructor for each way a request fails, and [`echo`], which
//! cuts what an error message repeats of a request to a line.

use serde_json::{Value, json};

/// Longest piece of a request that an error message repeats (a model name, a path, a role):
/// a client's string is echoed, not its megabyte.
pub const MAX_ECHOED_CHARS: usize = 64;

/// `s` as an error message repeats it: at most [`MAX_ECHOED_CHARS`] characters, then "…".
pub fn echo(s: &str) -> String {
    match s.char_indices().nth(MAX_ECHOED_CHARS) {
        None => s.to_string(),
        Some((cut, _)) => format!("{}…", &s[..cut]),
    }
}

/// An error as OpenAI's API sends it: a status, and `{"error": {message, type, param, code}}`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub kind: &'static str,
    pub message: String,
    pub param: Option<&'static str>,
    pub code: Option<&'static str>,
    /// Seconds a client should wait before it tries again (`Retry-After`).
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: u16, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            kind,
            message: message.into(),
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// A parameter out of its domain: 400.
    pub fn invalid(param: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            param: Some(param),
            ..ApiError::new(400, "invalid_request_error", message)
        }
    }

    /// Fields the server does not know: 400 in OpenAI's words, naming them (a few, each at
    /// most a line; OpenAI's `param` is null here too).
    pub fn unrecognized(names: &[&str]) -> ApiError {
        const SHOWN: usize = 8;
        let mut list: Vec<String> = names.iter().take(SHOWN).map(|n| echo(n)).collect();
        if names.len() > SHOWN {
            list.push(format!("and {} more", names.len() - SHOWN));
        }
        let s = if names.len() == 1 { "" } else { "s" };
        ApiError::new(
            400,
            "invalid_request_error",
            format!(
                "Unrecognized request argument{s} supplied: {}",
                list.join(", ")
            ),
        )
    }

    /// A body that is not the JSON the endpoint reads: 400.
    pub fn bad_json(e: &serde_json::Error) -> ApiError {
        ApiError::new(
            400,
            "invalid_request_error",
            format!("the request body is not valid: {e}"),
        )
    }

    /// A body over the server's limit: 413.
    pub fn too_large(limit: usize) -> ApiError {
        ApiError {
            code: Some("request_too_large"),
            ..ApiError::new(
                413,
                "invalid_request_error",
                format!("the request body is larger than the server's limit of {limit} bytes"),
            )
        }
    }

    /// A model this server does not serve: 404.
    pub fn unknown_model(asked: &str, served: &str) -> ApiError {
        ApiError {
            param: Some("model"),
            code: Some("model_not_found"),
            ..ApiError::new(
                404,
                "invalid_request_error",
                format!(
                    "the model {:?} does not exist here; this server serves {served:?}",
                    echo(asked)
                ),
            )
        }
    }

    /// A prompt that does not fit the context: 400, saying how many tokens fit.
    pub fn context(param: &'static str, prompt: usize, n_ctx: usize) -> ApiError {
        ApiError::context_exceeded(
            param,
            format!(
                "the prompt is {prompt} tokens; the context holds {n_ctx} positions, so at most \
                 {n_ctx} prompt tokens (prompt and completion together are at most {} tokens: \
                 the last one generated takes no position)",
                n_ctx + 1
            ),
        )
    }

    /// A prompt with more bytes of text than the context's tokens can cover: 400, before it
    /// is tokenized.
    pub fn too_long_text(param: &'static str, bytes: usize, max: usize, n_ctx: usize) -> ApiError {
        ApiError::context_exceeded(
            param,
            format!(
                "the prompt is {bytes} bytes of text; the context holds {n_ctx} tokens, which \
                 cover at most {max} bytes"
            ),
        )
    }

    /// OpenAI's `context_length_exceeded`: 400 on `param`.
    fn context_exceeded(param: &'static str, message: String) -> ApiError {
        ApiError {
            param: Some(param),
            code: Some("context_length_exceeded"),
            ..ApiError::new(400, "invalid_request_error", message)
        }
    }

    /// Every place in the queue is taken: 503 with `Retry-After`.
    pub fn busy(limit: usize, retry_after: u64) -> ApiError {
        ApiError {
            code: Some("server_busy"),
            retry_after: Some(retry_after),
            ..ApiError::new(
                503,
                "unavailable_error",
                format!(
                    "the server is busy: {limit} requests are running or waiting, as many as it \
                     holds; try again in {retry_after} s"
                ),
            )
        }
    }

    /// The model is still loading: 503.
    pub fn loading() -> ApiError {
        ApiError {
            code: Some("loading"),
            retry_after: Some(1),
            ..ApiError::new(503, "unavailable_error", "the model is loading")
        }
    }

    /// The server is shutting down and takes no new requests: 503, to be retried elsewhere.
    pub fn shutting_down() -> ApiError {
        ApiError {
            code: Some("shutting_down"),
            retry_after: Some(1),
            ..ApiError::new(
                503,
                "unavailable_error",
                "the server is shutting down and takes no new requests",
            )
        }
    }

    /// The server shut down before the request finished (its drain limit was reached): 503,
    /// to be sent again elsewhere. Not a finish reason: the text is cut short, not complete.
    pub fn ended_by_shutdown() -> ApiError {
        ApiError {
            code: Some("shutting_down"),
            retry_after: Some(1),
            ..ApiError::new(
                503,
                "unavailable_error",
                "the server shut down before the request finished; send it again",
            )
        }
    }

    /// No such endpoint: 404.
    pub fn not_found(path: &str) -> ApiError {
        ApiError::new(
            404,
            "invalid_request_error",
            format!("no endpoint {} on this server", echo(path)),
        )
    }

    /// A method the endpoint does not take: 405.
    pub fn wrong_method(method: &str, path: &str) -> ApiError {
        ApiError::new(
            405,
            "invalid_request_error",
            format!("{path} does not take {method}"),
        )
    }

    /// Something failed inside the server: 500.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(500, "server_error", message)
    }

    pub fn body(&self) -> Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status, self.message)
    }
}

impl std::error::Error for ApiError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_repeats_at_most_a_line_of_what_the_client_sent() {
        let e = ApiError::unknown_model(&"m".repeat(1 << 20), "smol");
        assert!(e.message.len() < 200, "{}", e.message.len());
        assert_eq!(echo("short"), "short");
        assert_eq!(echo(&"é".repeat(100)).chars().count(), MAX_ECHOED_CHARS + 1);
    }
}
