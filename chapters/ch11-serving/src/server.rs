//! The HTTP side: axum routes, admission control, and the bridge from the engine thread's
//! events to JSON responses and Server-Sent Events.
//!
//! The life of a request: parse and check the body (400s), turn messages into token ids on a
//! blocking thread (chapter 2's template and tokenizer, content taken literally), take a place
//! in the bounded queue or answer 503, hand the job to the engine thread, wait for `Accepted`,
//! then either collect the text into one response or stream it as it comes. The place is
//! given back, and the request cancelled if it is still running, when the handler or its
//! stream is dropped — which is what happens when a client disconnects.

use crate::api::{
    ApiError, Cancel, ChatRequest, CompletionRequest, Endpoint, Formats, Guessing, Head, Prompt,
    Sampling, Usage,
};
use crate::worker::{Event, Job, Ticket, Worker};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Extension, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, Version, header};
use axum::middleware::Next;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use ch02::Message;
use ch04::GenParams;
use ch07::Proposer;
use ch10::Engine;
use futures_util::stream::{self, Stream};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The server's limits.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Requests running or waiting at once; one more is a 503.
    pub max_in_flight: usize,
    /// Longest time a request may run; then it ends with `finish_reason` `length`.
    pub timeout: Duration,
    /// Largest request body, in bytes; a larger one is a 413.
    pub body_limit: usize,
    /// `Retry-After` of a 503, in seconds.
    pub retry_after: u64,
    /// Requests being prepared at once — body read, JSON parsed, prompt tokenized — before
    /// they take a place in the queue; others wait for a turn. This bounds the memory and CPU
    /// that requests cost before `max_in_flight` applies: a request refused afterwards (a
    /// prompt too long for the context, the queue full) has already been read and tokenized.
    pub preparing: usize,
}

/// What the handlers use once the model is loaded.
pub struct Loaded {
    /// The name `/v1/models` gives and requests may ask for.
    pub model_id: String,
    pub engine: Arc<Engine>,
    pub worker: Worker,
    /// Positions one request may use, prompt and completion together.
    pub n_ctx: usize,
    /// Requests that run at once (`--parallel`).
    pub parallel: usize,
    /// What was loaded, in a line: the file, its format, the kernels and threads.
    pub description: String,
    /// Most bytes of text a prompt that fits the context can have ([`max_text_bytes`]);
    /// `None` where the tokenizer's normalization may shrink text, and no bound holds.
    pub max_text_bytes: Option<usize>,
    /// The largest body a request that fits the context needs ([`body_limit_for`]), at most
    /// the configured limit.
    pub body_limit: usize,
    /// The output forms requests may ask for ([`ServeArgs::formats`](crate::ServeArgs)).
    pub formats: Arc<dyn Formats>,
    /// Who guesses requests' next tokens ([`ServeArgs::guessing`](crate::ServeArgs)).
    pub guessing: Arc<dyn Guessing>,
}

/// Most bytes of text that `n_ctx` tokens can cover: no token covers more than the longest
/// token's bytes (its text, or what it decodes to). A longer prompt cannot fit, whatever it
/// says, so it is refused before it is tokenized. Sound where tokenizing keeps every byte of
/// the text in some token (SentencePiece and BPE); WordPiece and Unigram normalize text
/// (accents dropped, runs of spaces collapsed), and get `None`.
pub fn max_text_bytes(tokenizer: &ch02::Tokenizer, n_ctx: usize) -> Option<usize> {
    use ch02::VocabKind;
    if !matches!(tokenizer.vocab().kind, VocabKind::Spm | VocabKind::Bpe(_)) {
        return None;
    }
    let longest = (0..tokenizer.vocab_size() as u32)
        .map(|id| {
            let text = tokenizer.token_text(id).map_or(0, str::len);
            text.max(tokenizer.token_to_piece(id).len())
        })
        .max()?;
    n_ctx.checked_mul(longest.max(1))
}

/// JSON writes one byte of text as at most 6 (`\u001f`).
const JSON_BYTES_PER_TEXT_BYTE: usize = 6;
/// JSON around each message (`{"role":"assistant","content":""},`) is under 64 bytes, and a
/// conversation that fits has at most `n_ctx` messages (each adds a token of the template).
const JSON_BYTES_PER_MESSAGE: usize = 64;
/// Everything else a request holds: its other fields, up to 16 stop strings of 1 KiB.
const JSON_BYTES_OTHER: usize = 64 << 10;

/// The largest body that a request fitting a context of `n_ctx` tokens can need, given
/// [`max_text_bytes`]: its text escaped as JSON at worst, the syntax of `n_ctx` messages, and
/// the other fields. A larger body is refused unread (413): it cannot be a request the model
/// can run.
pub fn body_limit_for(max_text_bytes: usize, n_ctx: usize) -> usize {
    max_text_bytes
        .saturating_mul(JSON_BYTES_PER_TEXT_BYTE)
        .saturating_add(n_ctx.saturating_mul(JSON_BYTES_PER_MESSAGE))
        .saturating_add(JSON_BYTES_OTHER)
}

/// Shared by every handler.
pub struct AppState {
    pub limits: Limits,
    /// Set once the model is loaded; until then every endpoint but `/health` answers 503.
    pub loaded: OnceLock<Loaded>,
    in_flight: AtomicUsize,
    preparing: Arc<Semaphore>,
    /// Turns of the requests' output forms to be compiled ([`Place::form`]).
    compiling: Arc<Semaphore>,
    /// Whether the server drains: a flag, and a channel that requests being prepared wait on.
    draining: AtomicBool,
    drained: tokio::sync::watch::Sender<bool>,
    next_response: AtomicU64,
    started: u64,
}

/// A request's name, put in its extensions by a layer in front of the routes (chapter 12's
/// request id). The engine thread's [`Job::label`] is this, or the response's id without one.
#[derive(Debug, Clone)]
pub struct RequestLabel(pub Arc<str>);

/// Who sent a request, put in its extensions by a layer in front of the routes that knows
/// (chapter 12's API keys): its requests read and fill the prefix cache's partition `salt`
/// only, so no other client can learn from a cache hit — or from `cached_tokens` — what it
/// sent. A request without one is in partition 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tenant {
    pub salt: u64,
}

impl AppState {
    pub fn new(limits: Limits) -> Arc<AppState> {
        Arc::new(AppState {
            preparing: Arc::new(Semaphore::new(limits.preparing.max(1))),
            compiling: Arc::new(Semaphore::new(limits.preparing.max(1))),
            limits,
            loaded: OnceLock::new(),
            in_flight: AtomicUsize::new(0),
            draining: AtomicBool::new(false),
            drained: tokio::sync::watch::Sender::new(false),
            next_response: AtomicU64::new(0),
            started: unix_now(),
        })
    }

    /// Requests holding a place: running, waiting, or streaming their last bytes.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Take no new requests (each is a 503 `shutting_down`), and give up those still being
    /// prepared (also a 503: they would not be let in once ready); those already submitted go
    /// on.
    pub fn drain(&self) {
        self.draining.store(true, Ordering::SeqCst);
        self.drained.send_replace(true);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// The largest body taken now: the configured limit, or less once the model is loaded
    /// ([`body_limit_for`]).
    pub fn body_limit(&self) -> usize {
        self.loaded
            .get()
            .map_or(self.limits.body_limit, |l| l.body_limit)
            .min(self.limits.body_limit)
    }

    /// A turn to prepare a request (see [`Limits::preparing`]), when one is free.
    pub async fn preparing(&self) -> Preparing {
        let permit = Arc::clone(&self.preparing)
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        Preparing(Arc::new(std::sync::Mutex::new(Some(permit))))
    }
}

/// A request's turn to be prepared ([`AppState::preparing`]). A layer in front of the routes
/// that reads the body itself (chapter 12's) takes the turn first and puts it in the
/// request's extensions; the handler keeps it until the prompt is tokenized.
#[derive(Clone)]
pub struct Preparing(Arc<std::sync::Mutex<Option<OwnedSemaphorePermit>>>);

impl Preparing {
    /// Give the turn back.
    pub fn done(&self) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

// ANCHOR: router
/// The routes: OpenAI's, llama-server's `/health`, and OpenAI errors for everything else.
pub fn router(state: Arc<AppState>) -> Router {
    finish(routes().route("/health", get(health)), state)
}

/// OpenAI's routes, without a state yet: [`router`] adds `/health`; chapter 12 adds its own.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
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

// ANCHOR: admit
/// What is refused from the headers alone, before a byte of the body is read:
/// - an HTTP/1.1 request without `Host` (RFC 9112 §3.2 says 400);
/// - a transfer coding other than `chunked` (501, [`unknown_transfer_coding`]);
/// - a POST whose body is not declared `application/json` (415): a web page can make a
///   browser send a "simple" cross-origin POST — `text/plain`, a form — to a server on the
///   same machine without asking it first, and only JSON is worth reading here;
/// - a declared `Content-Length` over the body limit (413 at once, not after waiting for the
///   bytes).
async fn admit(State(s): State<Arc<AppState>>, req: Request, next: Next) -> Response {
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

/// `GET /health`: 200 `{"status": "ok", …}` once the model is loaded, with the scheduler's
/// state; 503 `{"status": "loading"}` before.
async fn health(State(s): State<Arc<AppState>>) -> Response {
    match s.loaded.get() {
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"status": "loading"})),
        )
            .into_response(),
        Some(l) if !l.worker.is_alive() => {
            ApiError::internal("the engine thread has stopped").into_response()
        }
        Some(l) => {
            let mut v = json!({"status": "ok", "in_flight": s.in_flight()});
            v["scheduler"] = serde_json::to_value(l.worker.status()).unwrap_or(Value::Null);
            axum::Json(v).into_response()
        }
    }
}

/// `GET /v1/models`: the one model.
async fn models(State(s): State<Arc<AppState>>) -> Response {
    match model_card(&s) {
        None => ApiError::loading().into_response(),
        Some(card) => axum::Json(json!({"object": "list", "data": [card]})).into_response(),
    }
}

/// The model's entry in `/v1/models`; `None` while it loads.
pub fn model_card(s: &AppState) -> Option<Value> {
    let l = s.loaded.get()?;
    let c = &l.engine.model.config;
    Some(json!({
        "id": l.model_id,
        "object": "model",
        "created": s.started,
        "owned_by": "llm-rs",
        "meta": {
            "n_ctx": l.n_ctx,
            "n_ctx_train": c.context_length,
            "n_vocab": c.vocab_size,
            "n_layer": c.n_layer,
            "parallel": l.parallel,
        },
    }))
}

/// The body, read and parsed: 413 over the limit, 400 for anything else.
async fn parse<T: serde::de::DeserializeOwned>(
    s: &AppState,
    body: Body,
) -> Result<(T, Bytes), ApiError> {
    let limit = s.body_limit();
    let bytes: Bytes = axum::body::to_bytes(body, limit).await.map_err(|e| {
        if is_length_limit(&e) {
            ApiError::too_large(limit)
        } else {
            ApiError::invalid("body", e.to_string())
        }
    })?;
    let parsed = serde_json::from_slice(&bytes).map_err(|e| ApiError::bad_json(&e))?;
    Ok((parsed, bytes))
}

/// Whether reading a body failed because it passed the limit.
pub fn is_length_limit(e: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if s.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = s.source();
    }
    false
}

/// Refuse a prompt of `bytes` bytes of text that cannot fit the context (see
/// [`max_text_bytes`]), before tokenizing it.
fn check_text_bytes(l: &Loaded, param: &'static str, bytes: usize) -> Result<(), ApiError> {
    match l.max_text_bytes {
        Some(max) if bytes > max => Err(ApiError::too_long_text(param, bytes, max, l.n_ctx)),
        _ => Ok(()),
    }
}

fn check_model(l: &Loaded, asked: Option<&str>) -> Result<(), ApiError> {
    match asked {
        Some(m) if !m.is_empty() && m != l.model_id => Err(ApiError::unknown_model(m, &l.model_id)),
        _ => Ok(()),
    }
}

// ANCHOR: chat
/// `POST /v1/chat/completions`.
async fn chat(
    State(s): State<Arc<AppState>>,
    label: Option<Extension<RequestLabel>>,
    tenant: Option<Extension<Tenant>>,
    turn: Option<Extension<Preparing>>,
    body: Body,
) -> Response {
    let run = async {
        let deadline = Instant::now() + s.limits.timeout;
        let l = s.loaded.get().ok_or_else(ApiError::loading)?;
        // Reading, parsing and tokenizing take turns (`Limits::preparing`).
        let turn = match turn {
            Some(Extension(t)) => t,
            None => s.preparing().await,
        };
        let (req, body): (ChatRequest, _) = parse(&s, body).await?;
        check_model(l, req.sampling.model.as_deref())?;
        let (mut params, asked) = req.sampling.params()?;
        let messages = req.messages()?;
        check_text_bytes(
            l,
            "messages",
            messages.iter().map(|m| m.content.len()).sum(),
        )?;
        if l.engine.template.is_none() {
            return Err(ApiError::invalid(
                "messages",
                "the model file has no chat template; use /v1/completions",
            ));
        }
        // From here on the request holds a place: what is done for it counts.
        let place = Place::take(&s, l)?;
        // Rendering and tokenizing a long conversation takes milliseconds: off the runtime.
        let engine = Arc::clone(&l.engine);
        let prompt = place
            .prepare(deadline, None, move |_| encode_chat(&engine, &messages))
            .await?;
        turn.done();
        // The form's rule, or the one `params` set (`ignore_eos`; never both, `params` says).
        let form = place.form(&s, l, body, &req.sampling, deadline).await?;
        params.rule = form.or(params.rule.take());
        let mut request =
            Generate::new(Endpoint::Chat, label, prompt, params, asked, &req.sampling);
        request.cache_salt = tenant.map_or(0, |Extension(t)| t.salt);
        request.proposer = l.guessing.proposer(
            req.sampling.speculative_n_max(),
            req.sampling.speculative_n_min(),
        );
        generate(&s, l, request, place, deadline).await
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}
// ANCHOR_END: chat

// ANCHOR: form
impl Place {
    /// The rule of the request's output form (`response_format`, `grammar`), from the
    /// server's [`Formats`], which get `response_format` as the text the client sent (`body`):
    /// a JSON schema's properties in their order. Compiling a grammar is work that grows with
    /// its size: it runs as [`Place::prepare`] runs work, taking one of the turns that
    /// compiles share ([`Limits::preparing`] of them), so that a request without a grammar
    /// never waits behind one.
    async fn form(
        &self,
        s: &AppState,
        l: &Loaded,
        body: Bytes,
        sampling: &Sampling,
        deadline: Instant,
    ) -> Result<Option<Arc<dyn ch04::MakeRule>>, ApiError> {
        #[derive(serde::Deserialize)]
        struct Format<'a> {
            #[serde(borrow, default)]
            response_format: Option<&'a serde_json::value::RawValue>,
        }
        let asks = sampling
            .response_format
            .as_ref()
            .is_some_and(|v| !v.is_null());
        let grammar = sampling.grammar.clone();
        if !asks && grammar.as_ref().is_none_or(Value::is_null) {
            return Ok(None);
        }
        let formats = Arc::clone(&l.formats);
        let compile = move |cancel: &Cancel| {
            let raw = match asks {
                false => None,
                true => {
                    serde_json::from_slice::<Format>(&body)
                        .map_err(|e| ApiError::bad_json(&e))?
                        .response_format
                }
            };
            formats.rule(raw, grammar.as_ref(), cancel)
        };
        self.prepare(deadline, Some(&s.compiling), compile).await
    }
}
// ANCHOR_END: form

/// The conversation's token ids: the template's markers as control tokens, the messages'
/// content as text (chapter 2's special-token rule).
fn encode_chat(engine: &Engine, messages: &[Message]) -> Result<Vec<u32>, ApiError> {
    let template = engine.template.as_ref().expect("checked by the caller");
    template
        .encode(&engine.tokenizer, messages, true)
        .map_err(|e| ApiError::invalid("messages", e.to_string()))
}

/// `POST /v1/completions`. The prompt is the client's whole text, as in llama-server: special
/// tokens written in it are parsed (there is no template whose markers to protect).
async fn completions(
    State(s): State<Arc<AppState>>,
    label: Option<Extension<RequestLabel>>,
    tenant: Option<Extension<Tenant>>,
    turn: Option<Extension<Preparing>>,
    body: Body,
) -> Response {
    let run = async {
        let deadline = Instant::now() + s.limits.timeout;
        let l = s.loaded.get().ok_or_else(ApiError::loading)?;
        let turn = match turn {
            Some(Extension(t)) => t,
            None => s.preparing().await,
        };
        let (req, body): (CompletionRequest, _) = parse(&s, body).await?;
        check_model(l, req.sampling.model.as_deref())?;
        let (mut params, asked) = req.sampling.params()?;
        let prompt = req.prompt()?;
        if let Prompt::Text(text) = &prompt {
            check_text_bytes(l, "prompt", text.len())?;
        }
        let place = Place::take(&s, l)?;
        let prompt = match prompt {
            Prompt::Tokens(ids) => ids,
            Prompt::Text(text) => {
                let engine = Arc::clone(&l.engine);
                let tokenize = move |_: &Cancel| Ok(engine.tokenizer.encode(&text, true, true));
                place.prepare(deadline, None, tokenize).await?
            }
            Prompt::Texts(_) => unreachable!("prompt() returns one text"),
        };
        turn.done();
        // The form's rule, or the one `params` set (`ignore_eos`; never both, `params` says).
        let form = place.form(&s, l, body, &req.sampling, deadline).await?;
        params.rule = form.or(params.rule.take());
        // Token ids outside the vocabulary are refused by the scheduler's `submit` (a 400).
        let mut request = Generate::new(
            Endpoint::Completions,
            label,
            prompt,
            params,
            asked,
            &req.sampling,
        );
        request.cache_salt = tenant.map_or(0, |Extension(t)| t.salt);
        request.proposer = l.guessing.proposer(
            req.sampling.speculative_n_max(),
            req.sampling.speculative_n_min(),
        );
        generate(&s, l, request, place, deadline).await
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

// ANCHOR: place
/// A place among the requests in flight ([`Limits::max_in_flight`]), and the request's ticket
/// once it has one. It is taken as soon as the body is parsed, so that everything done for the
/// request from then on counts — compiling its output's form, tokenizing, waiting, running —
/// and a flood is refused (503) before it costs work. Dropping it gives the place back, gives
/// the request up ([`Cancel`]: work still being done for it stops), and cancels it on the
/// engine thread if it has not ended: what happens when the client disconnects.
struct Place {
    state: Arc<AppState>,
    worker: Worker,
    ticket: Option<Ticket>,
    ended: bool,
    cancel: Cancel,
}

impl Place {
    /// A place, or 503: the server is draining, or holds as many requests as it may.
    fn take(s: &Arc<AppState>, l: &Loaded) -> Result<Place, ApiError> {
        if s.is_draining() {
            return Err(ApiError::shutting_down());
        }
        let max = s.limits.max_in_flight;
        if s.in_flight
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < max).then_some(n + 1)
            })
            .is_err()
        {
            return Err(ApiError::busy(max, s.limits.retry_after));
        }
        Ok(Place {
            state: Arc::clone(s),
            worker: l.worker.clone(),
            ticket: None,
            ended: false,
            cancel: Cancel::default(),
        })
    }
    // ANCHOR_END: place

    // ANCHOR: prepare
    /// Run `work` — tokenizing, compiling the output's form — on tokio's blocking threads, so
    /// that the runtime's threads stay free for other requests, `/health` and the signals
    /// however long it takes; with `turns`, once one of them is free (held until `work` has
    /// returned, also when the request was given up before: its thread is busy until then).
    /// It must be done by `deadline` (the request's time limit), and before the server
    /// drains: else the request is given up, `work` is told to stop, and the answer is a 503.
    async fn prepare<T: Send + 'static>(
        &self,
        deadline: Instant,
        turns: Option<&Arc<Semaphore>>,
        work: impl FnOnce(&Cancel) -> Result<T, ApiError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let cancel = self.cancel.clone();
        let run = async {
            let turn = match turns {
                Some(t) => Some(Arc::clone(t).acquire_owned().await.expect("never closed")),
                None => None,
            };
            tokio::task::spawn_blocking(move || {
                let _turn = turn;
                work(&cancel)
            })
            .await
        };
        let mut draining = self.state.drained.subscribe();
        let ready = tokio::select! {
            ready = tokio::time::timeout_at(deadline.into(), run) => ready,
            _ = draining.wait_for(|&d| d) => {
                self.cancel.cancel();
                return Err(ApiError::shutting_down());
            }
        };
        match ready {
            Ok(Ok(done)) => done,
            // A blocking task is cancelled only when the runtime shuts down.
            Ok(Err(e)) if e.is_cancelled() => Err(ApiError::shutting_down()),
            Ok(Err(_)) => Err(ApiError::internal("the request failed inside the server")),
            Err(_) => {
                self.cancel.cancel();
                let limit = self.state.limits.timeout.as_secs_f64();
                Err(ApiError {
                    code: Some("timeout"),
                    retry_after: Some(self.state.limits.retry_after),
                    ..ApiError::new(
                        503,
                        "unavailable_error",
                        format!(
                            "the request was not ready to run within its time limit ({limit} s)"
                        ),
                    )
                })
            }
        }
    }
    // ANCHOR_END: prepare
}

impl Drop for Place {
    fn drop(&mut self) {
        self.cancel.cancel();
        if let (Some(t), false) = (self.ticket, self.ended) {
            self.worker.cancel(t);
        }
        self.state.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A checked request, ready to run.
struct Generate {
    endpoint: Endpoint,
    label: Option<Arc<str>>,
    prompt: Vec<u32>,
    params: GenParams,
    /// The client's token limit, if it gave one.
    asked: Option<usize>,
    stream: bool,
    include_usage: bool,
    /// The prefix cache's partition ([`Tenant`]).
    cache_salt: u64,
    /// Who guesses its next tokens ([`Guessing`]), if anyone.
    proposer: Option<Box<dyn Proposer + Send>>,
}

impl Generate {
    fn new(
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
            cache_salt: 0,
            proposer: None,
        }
    }
}

// ANCHOR: generate
/// Run `prompt` and answer: one JSON response, or a stream of chunks.
async fn generate(
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
        cache_salt,
        proposer,
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
        cache_salt,
        proposer,
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
        let events = sse_events(head, rx, place, include_usage);
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
                    proposed_tokens: o.proposed_tokens,
                    accepted_tokens: o.accepted_tokens,
                };
                return Ok(axum::Json(head.response(&text, o.stop, usage)).into_response());
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

/// The request's events as SSE: a first chunk with the role, a chunk per piece of text, a last
/// chunk with the finish reason, the usage if asked, then `[DONE]`. The stream owns the
/// request's [`Place`]: when the client disconnects, the server drops the stream, and the
/// request is cancelled.
fn sse_events(
    head: Head,
    rx: UnboundedReceiver<Event>,
    place: Place,
    include_usage: bool,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    enum Phase {
        First,
        Text,
        Done,
    }
    let data = |v: Value| Ok(SseEvent::default().data(v.to_string()));
    let state = (
        rx,
        place,
        Phase::First,
        Vec::<Result<SseEvent, Infallible>>::new(),
    );
    stream::unfold(state, move |(mut rx, mut place, phase, mut queued)| {
        let head = head.clone();
        async move {
            if let Some(e) = queued.pop() {
                return Some((e, (rx, place, phase, queued)));
            }
            match phase {
                Phase::Done => None,
                // A chat stream opens with the role, as OpenAI's does.
                Phase::First if head.endpoint == Endpoint::Chat => {
                    let chunk = head.chunk(Some(""), true, None);
                    Some((data(chunk), (rx, place, Phase::Text, queued)))
                }
                Phase::First | Phase::Text => match rx.recv().await {
                    Some(Event::Text(t)) => Some((
                        data(head.chunk(Some(&t), false, None)),
                        (rx, place, Phase::Text, queued),
                    )),
                    Some(Event::Done(o)) if o.closed => {
                        // An error in OpenAI's shape, then [DONE]: the stream ends as a
                        // stream should, and the client knows the text is unfinished.
                        place.ended = true;
                        queued.push(Ok(SseEvent::default().data("[DONE]")));
                        let e = ApiError::ended_by_shutdown().body();
                        Some((data(e), (rx, place, Phase::Done, queued)))
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
                                proposed_tokens: o.proposed_tokens,
                                accepted_tokens: o.accepted_tokens,
                            })));
                        }
                        let last = head.chunk(None, false, Some(o.stop));
                        Some((data(last), (rx, place, Phase::Done, queued)))
                    }
                    Some(Event::Failed(m)) => {
                        place.ended = true;
                        let e = ApiError::internal(m).body();
                        Some((data(e), (rx, place, Phase::Done, queued)))
                    }
                    _ => {
                        place.ended = true;
                        let e = ApiError::internal("the engine thread has stopped").body();
                        Some((data(e), (rx, place, Phase::Done, queued)))
                    }
                },
            }
        }
    })
}

/// `axum::serve` on `listener` until `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
}
