//! What is refused before a byte of a request's body is read, from its headers alone: the
//! layer in front of every route ([`admit`]).

use super::AppState;
use crate::api::ApiError;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, Version, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use std::sync::Arc;
use std::time::Duration;

// ANCHOR: admit
/// What is refused from the headers alone, before a byte of the body is read:
/// - an HTTP/1.1 request without `Host` (RFC 9112 §3.2 says 400);
/// - a transfer coding other than `chunked` (501, [`unknown_transfer_coding`]);
/// - a POST whose body is not declared `application/json` (415): a web page can make a
///   browser send a "simple" cross-origin POST — `text/plain`, a form — to a server on the
///   same machine without asking it first, and only JSON is worth reading here;
/// - a declared `Content-Length` over the body limit (413 at once, not after waiting for the
///   bytes).
pub(super) async fn admit(State(s): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if req.version() == Version::HTTP_11 && !req.headers().contains_key(header::HOST) {
        return ApiError::new(
            400,
            "invalid_request_error",
            "an HTTP/1.1 request must have a Host header",
        )
        .into_response();
    }
    if let Some(refused) = unknown_transfer_coding(req.headers()) {
        return refused;
    }
    if req.method() == Method::POST {
        if !is_json(req.headers()) {
            return ApiError::new(
                415,
                "invalid_request_error",
                "the request body must be JSON, declared with Content-Type: application/json",
            )
            .into_response();
        }
        let limit = s.body_limit();
        if let Some(n) = declared_length(req.headers())
            && n > limit as u64
        {
            // A body a little too large is read and dropped first, so that the client reads
            // the 413 instead of a reset (closing a socket with unread bytes resets it); a
            // far larger one is not read at all.
            if n <= (limit + LINGER_BYTES) as u64 {
                let mut body = req.into_body();
                let drain = async {
                    let mut read = 0;
                    while let Some(Ok(frame)) = body.frame().await {
                        read += frame.data_ref().map_or(0, |d| d.len());
                        if read > limit + LINGER_BYTES {
                            break;
                        }
                    }
                };
                let _ = tokio::time::timeout(LINGER_TIME, drain).await;
            }
            let mut r = ApiError::too_large(limit).into_response();
            r.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            return r;
        }
    }
    next.run(req).await
}
// ANCHOR_END: admit

/// A body declared this much over the limit, or less, is read (and dropped) before its 413.
const LINGER_BYTES: usize = 1 << 20;
/// The longest time spent reading a body that will be refused.
const LINGER_TIME: Duration = Duration::from_secs(2);

/// A 501 for a transfer coding other than `chunked` in `Transfer-Encoding`. HTTP/1.1's
/// parser (hyper's) frames the body by a final `chunked` and passes any coding before it on
/// untouched: `gzip, chunked` would hand gzip's bytes to the JSON parser. RFC 9112 §6.1: a
/// server that receives a transfer coding it does not understand should answer 501.
fn unknown_transfer_coding(headers: &HeaderMap) -> Option<Response> {
    let mut codings = Vec::new();
    for value in headers.get_all(header::TRANSFER_ENCODING) {
        let value = String::from_utf8_lossy(value.as_bytes());
        codings.extend(value.split(',').map(|c| c.trim().to_string()));
    }
    // RFC 9110 §5.6.1: empty elements of a list are ignored.
    let coding = codings
        .into_iter()
        .find(|c| !c.is_empty() && !c.eq_ignore_ascii_case("chunked"))?;
    let message = format!(
        "Transfer-Encoding {:?}: this server decodes only `chunked`",
        crate::api::echo(&coding)
    );
    let mut r = ApiError::new(501, "invalid_request_error", message).into_response();
    // The body's framing is not understood: the connection cannot be read any further.
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    Some(r)
}

/// Whether `Content-Type` is `application/json` (parameters such as `charset` allowed).
fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|t| t.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}

/// The body's length as `Content-Length` declares it.
pub fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}
