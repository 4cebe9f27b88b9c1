//! The HTTP side: axum routes, admission control, and the bridge from the engine thread's
//! events to JSON responses and Server-Sent Events.
//!
//! The life of a request: parse and check the body (400s), turn messages into token ids on a
//! blocking thread (chapter 2's template and tokenizer, content taken literally), take a place
//! in the bounded queue or answer 503, hand the job to the engine thread, wait for `Accepted`,
//! then either collect the text into one response or stream it as it comes. The place is
//! given back, and the request cancelled if it is still running, when the handler or its
//! stream is dropped — which is what happens when a client disconnects.
//!
//! One file for each part: `state.rs` the state every handler shares and the server's limits,
//! `admit.rs` what is refused from the headers alone, `handlers.rs` the endpoints, `place.rs` a
//! request's place in the queue and the work done for it before it runs, `generate.rs` running
//! it and answering in one response, `stream.rs` answering as a stream of Server-Sent Events.

mod admit;
mod generate;
mod handlers;
mod place;
mod state;
mod stream;

pub use admit::declared_length;
pub use handlers::{chat, completions, is_length_limit, model_card, read_body};
pub use state::{
    AppState, CachePartition, Limits, Loaded, Preparing, RequestLabel, body_limit_for,
    max_text_bytes,
};

use crate::api::ApiError;
use admit::admit;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post};
use handlers::{health, models};
use std::sync::Arc;

// ANCHOR: endpoints
/// The endpoints that generate, each a path and its handler: this chapter's [`OpenAi`], or
/// more that a later chapter hands in (another API's, say, answered through these). The server
/// holds one value of this ([`ServeArgs::endpoints`](crate::ServeArgs::endpoints)); a router in
/// front of it (chapter 12's) sends requests to the same paths.
pub trait Endpoints: Send + Sync + std::fmt::Debug {
    fn routes(&self) -> Vec<(&'static str, MethodRouter<Arc<AppState>>)>;

    /// An error answered at endpoint `path` before its handler ran, by a layer in front of
    /// the routes (a missing key, say), whose `body` is OpenAI's, in the shape of the API the
    /// endpoint speaks: OpenAI's as it is.
    fn error(&self, _path: &str, _status: u16, body: serde_json::Value) -> serde_json::Value {
        body
    }
}

/// OpenAI's two: chat completions and text completions.
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenAi;

impl Endpoints for OpenAi {
    fn routes(&self) -> Vec<(&'static str, MethodRouter<Arc<AppState>>)> {
        vec![
            ("/v1/chat/completions", post(chat)),
            ("/v1/completions", post(completions)),
        ]
    }
}
// ANCHOR_END: endpoints

// ANCHOR: router
/// The routes: the endpoints, `/v1/models`, llama-server's `/health`, and OpenAI errors for
/// everything else.
pub fn router(state: Arc<AppState>, endpoints: &dyn Endpoints) -> Router {
    finish(routes(endpoints).route("/health", get(health)), state)
}

/// The `endpoints` and `/v1/models`, without a state yet: [`router`] adds `/health`; a bigger
/// server adds its own.
pub fn routes(endpoints: &dyn Endpoints) -> Router<Arc<AppState>> {
    let routes = endpoints.routes().into_iter();
    routes
        .fold(Router::new(), |r, (path, handler)| r.route(path, handler))
        .route("/v1/models", get(models))
}

/// `routes` made a server: OpenAI errors for unknown paths and methods, the body limit, and
/// a 500 for a panic in a handler.
pub fn finish(routes: Router<Arc<AppState>>, state: Arc<AppState>) -> Router {
    let limit = state.limits.body_limit;
    routes
        .fallback(fallback)
        .method_not_allowed_fallback(wrong_method)
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            admit,
        ))
        // A panic in a handler is a 500 for that request; the server goes on.
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(
            |_: Box<dyn std::any::Any + Send>| {
                ApiError::internal("the request failed inside the server").into_response()
            },
        ))
        .with_state(state)
}
// ANCHOR_END: router

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut r = (status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}

async fn fallback(uri: Uri) -> ApiError {
    ApiError::not_found(uri.path())
}

async fn wrong_method(method: Method, uri: Uri) -> ApiError {
    ApiError::wrong_method(method.as_str(), uri.path())
}

/// `axum::serve` of the `endpoints` on `listener` until `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    endpoints: Arc<dyn Endpoints>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(state, &*endpoints))
        .with_graceful_shutdown(shutdown)
        .await
}
