//! The production server's routes, in front of chapter 11's.
//!
//! Chapter 11's server answers OpenAI's API for one model. In front of it this chapter puts:
//! - a layer every request passes: its request id (the client's `X-Request-Id` if sensible,
//!   else a new one; returned in the response), a `tracing` span carrying it, one log line when
//!   the response ends, and the request counted by endpoint, status and variant;
//! - `/health` (alive), `/ready` (loaded and not draining) and `/metrics`;
//! - A/B: up to two models, variants `a` and `b`, each a whole chapter 11 server with its own
//!   engine thread. A request that names a model goes to it; one that does not goes to `b`
//!   with probability `--split-b`, chosen from its request id so that a retry with the same id
//!   lands on the same variant;
//! - a limit on the time a client may take to send its body (a 408), so that a slow client
//!   cannot hold a place for ever;
//! - API keys (`--api-key`, `--api-keys`): each a tenant with its own partition of the
//!   prefix cache, and per-key limits (see [`crate::keys`]);
//! - fault injection for the tests (hidden `--fault-injection`): a request with header
//!   `X-Fault` makes the engine panic inside its step, or makes the engine thread die, or is
//!   held, unfinished, until the server drains or ends it; one whose grammar is
//!   [`STALL_GRAMMAR`] is prepared until it is given up.

use crate::keys::Keys;
use crate::metrics::{EngineMetrics, Metrics};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use ch04::MakeRule;
use ch07::StepReport;
use ch11::api::ApiError;
use ch11::server::{RequestLabel, finish, model_card};
use ch11::worker::{Observer, Outcome, PoolStatus};
use ch11::{AppState, ServeArgs};
use ch11::{Cancel, Formats};
use http_body_util::BodyExt;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tower::ServiceExt;
use tracing::Instrument;

/// The header that carries a request's id, in and out.
pub const REQUEST_ID: &str = "x-request-id";
/// Longest request id taken from a client; a longer one (or one with other characters than
/// letters, digits and `._:-`) is replaced, so that logs cannot be flooded or forged through it.
pub const MAX_REQUEST_ID: usize = 128;
/// The test-only header that plants a fault (with `--fault-injection`).
pub const FAULT_HEADER: &str = "x-fault";
/// The header Anthropic's clients send their key in (OpenAI's send `Authorization`).
pub const X_API_KEY: &str = "x-api-key";

/// One model served: a chapter 11 server of its own.
pub struct Variant {
    /// `a` or `b`: the `variant` label of its metrics.
    pub name: &'static str,
    pub args: ServeArgs,
    pub state: Arc<AppState>,
    router: Router,
}

/// A fault planted by a test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Panic inside the engine's step, at the request's first token (`X-Fault: panic-in-step`).
    PanicInStep,
    /// Panic in the handler, before the engine sees the request (`panic-in-handler`).
    PanicInHandler,
    /// Panic on the engine thread outside a step, which ends the thread (`kill-engine`).
    KillEngine,
    /// From its first token, hold the request where it is until the server begins to drain
    /// (`hold-until-drain`); then it runs to its end.
    HoldUntilDrain,
    /// From its first token, hold the request where it is until the server ends it, at its
    /// drain's limit (`hold-until-close`); it never finishes by itself.
    HoldUntilClose,
}

impl Fault {
    fn parse(v: &str) -> Option<Fault> {
        match v {
            "panic-in-step" => Some(Fault::PanicInStep),
            "panic-in-handler" => Some(Fault::PanicInHandler),
            "kill-engine" => Some(Fault::KillEngine),
            "hold-until-drain" => Some(Fault::HoldUntilDrain),
            "hold-until-close" => Some(Fault::HoldUntilClose),
            _ => None,
        }
    }
}

// ANCHOR: stall
/// With `--fault-injection`, a request whose `grammar` is this text is never ready: its form
/// "compiles" until the request is given up — its client leaves, its time runs out, the server
/// shuts down — and says so in the log. It is how the tests hold a request in preparation, as
/// a huge grammar would, without depending on how fast this machine compiles one.
pub const STALL_GRAMMAR: &str = "root ::= \"stall\" # fault injection: compiles until given up";

/// The output forms of a variant under `--fault-injection`: its own, and [`STALL_GRAMMAR`].
#[derive(Debug)]
struct Stalling(Arc<dyn Formats>);

impl Formats for Stalling {
    fn rule(
        &self,
        response_format: Option<&RawValue>,
        grammar: Option<&Value>,
        cancel: &Cancel,
    ) -> Result<Option<Arc<dyn MakeRule>>, ApiError> {
        if grammar.and_then(Value::as_str) != Some(STALL_GRAMMAR) {
            return self.0.rule(response_format, grammar, cancel);
        }
        tracing::warn!("injected fault: a request's grammar compiles until it is given up");
        while !cancel.is_cancelled() {
            std::thread::sleep(STALL_POLL);
        }
        tracing::info!("injected fault: the stalled compile saw its request given up");
        Err(ApiError::invalid("grammar", "injected fault: given up"))
    }

    fn prepare(&self, tokenizer: &ch02::Tokenizer) {
        self.0.prepare(tokenizer);
    }
}

/// How often a stalled compile looks at its request (a real compile looks every few thousand
/// steps, well under a millisecond apart).
const STALL_POLL: Duration = Duration::from_millis(5);
// ANCHOR_END: stall

// ANCHOR: faults
/// Faults planted by request id, and whether the engine thread is to die after this step.
///
/// A held request (`hold-…`) holds the engine thread ([`Observer::hold`]) whenever every
/// request the engine has is held: no step runs, so a held request goes no further, and the
/// others run as usual (held requests take their steps with them). So a test keeps requests
/// running, unfinished, as long as it needs, however fast this machine decodes.
#[derive(Default)]
pub struct Faults {
    planted: Mutex<HashMap<String, Fault>>,
    kill: AtomicBool,
    /// Requests held, from their first token to their end, and how.
    held: Mutex<HashMap<String, Fault>>,
    /// Set when the server begins to drain: it lets `hold-until-drain` requests go.
    draining: AtomicBool,
}

impl Faults {
    /// Whether the requests `labels` are all held now.
    fn hold(&self, labels: &mut dyn Iterator<Item = &str>) -> bool {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if held.is_empty() {
            return false;
        }
        let draining = self.draining.load(Ordering::SeqCst);
        for l in labels {
            match held.get(l) {
                Some(Fault::HoldUntilClose) => {}
                Some(Fault::HoldUntilDrain) if !draining => {}
                _ => return false,
            }
        }
        true
    }

    /// Request `label` has ended: it holds nothing any more.
    fn ended(&self, label: &str) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.remove(label);
    }
}
// ANCHOR_END: faults

/// Everything the routes share.
pub struct App {
    pub variants: Vec<Variant>,
    /// Share of requests naming no model that go to variant `b`.
    pub split_b: f64,
    pub metrics: Metrics,
    /// `Some` with `--fault-injection`.
    pub faults: Option<Arc<Faults>>,
    pub body_timeout: Duration,
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    pub drain_timeout: Duration,
    /// Open connections served in full; past them, the probes only (`serve`'s docs).
    pub max_connections: usize,
    /// The API keys, their tenants and limits; none, and every request is let in.
    pub keys: Arc<Keys>,
    /// The paths of the endpoints that generate: chapter 11's, or those a later chapter handed
    /// in (the first variant's; every variant is made from the same flags).
    pub generating: Vec<&'static str>,
}

impl App {
    /// `variants`' servers, not loaded yet.
    pub fn new(
        variants: Vec<(&'static str, ServeArgs)>,
        split_b: f64,
        faults: bool,
        timeouts: [Duration; 4],
        max_connections: usize,
        keys: Keys,
    ) -> App {
        let [body_timeout, header_timeout, idle_timeout, drain_timeout] = timeouts;
        let variants: Vec<Variant> = variants
            .into_iter()
            .map(|(name, mut args)| {
                if faults {
                    args.formats = Arc::new(Stalling(args.formats));
                }
                let state = AppState::new(args.limits());
                let router = finish(ch11::server::routes(&*args.endpoints), Arc::clone(&state));
                Variant {
                    name,
                    args,
                    state,
                    router,
                }
            })
            .collect();
        let metrics = Metrics::new();
        keys.register(&metrics.registry);
        let generating: Vec<&'static str> = (variants.first())
            .map(|v| v.args.endpoints.routes())
            .into_iter()
            .flatten()
            .map(|(path, _)| path)
            .collect();
        App {
            generating,
            variants,
            split_b,
            metrics,
            keys: Arc::new(keys),
            faults: faults.then(Default::default),
            body_timeout,
            header_timeout,
            idle_timeout,
            drain_timeout,
            max_connections,
        }
    }

    /// The observer for variant `name`'s engine thread: metrics, logs, and planted faults.
    pub fn observer(&self, name: &'static str) -> Arc<dyn Observer> {
        Arc::new(EngineHooks {
            variant: name,
            keys: Arc::clone(&self.keys),
            metrics: self.metrics.observer(name),
            faults: self.faults.clone(),
        })
    }

    /// Whether every variant is loaded.
    pub fn is_loaded(&self) -> bool {
        self.variants.iter().all(|v| v.state.loaded.get().is_some())
    }

    /// A variant whose engine thread has ended, if one has.
    pub fn dead_engine(&self) -> Option<&'static str> {
        self.variants
            .iter()
            .find(|v| v.state.loaded.get().is_some_and(|l| !l.worker.is_alive()))
            .map(|v| v.name)
    }

    pub fn is_draining(&self) -> bool {
        self.variants.iter().any(|v| v.state.is_draining())
    }

    /// Requests holding a place, all variants together.
    pub fn in_flight(&self) -> usize {
        self.variants.iter().map(|v| v.state.in_flight()).sum()
    }

    /// Take no new requests (a 503 each); those in go on (and `hold-until-drain` requests
    /// are let go).
    pub fn drain(&self) {
        for v in &self.variants {
            v.state.drain();
        }
        if let Some(f) = &self.faults {
            f.draining.store(true, Ordering::SeqCst);
        }
    }

    /// End every request still running, each with its final event.
    pub fn close(&self) {
        for v in &self.variants {
            if let Some(l) = v.state.loaded.get() {
                l.worker.close();
            }
        }
    }

    /// The variant for a request whose body is `body`, labelled `label`.
    fn choose(&self, body: &[u8], label: &str) -> Result<&Variant, ApiError> {
        #[derive(serde::Deserialize)]
        struct Named {
            model: Option<Value>,
        }
        let asked = serde_json::from_slice::<Named>(body)
            .ok()
            .and_then(|n| n.model?.as_str().map(str::to_string))
            .filter(|m| !m.is_empty());
        let first = &self.variants[0];
        match asked {
            // Malformed bodies, and everything before the models are loaded, go to the first
            // variant, whose answer (a 400 naming the error, a 503 while loading) is the same.
            Some(m) if self.is_loaded() => {
                let found = self
                    .variants
                    .iter()
                    .find(|v| v.state.loaded.get().is_some_and(|l| l.model_id == m));
                found.ok_or_else(|| {
                    let served: Vec<&str> = self
                        .variants
                        .iter()
                        .filter_map(|v| Some(v.state.loaded.get()?.model_id.as_str()))
                        .collect();
                    ApiError::unknown_model(&m, &served.join(", "))
                })
            }
            _ if self.variants.len() > 1 && unit_interval(label) < self.split_b => {
                Ok(&self.variants[1])
            }
            _ => Ok(first),
        }
    }

    /// The routes, with the request layer in front.
    pub fn router(self: &Arc<App>) -> Router {
        let generating = self.generating.iter();
        let routes = generating
            .fold(Router::new(), |r, path| r.route(path, post(generation)))
            .route("/v1/models", get(models))
            .route("/health", get(health))
            .route("/ready", get(ready))
            .route("/metrics", get(metrics))
            .with_state(Arc::clone(self));
        // Chapter 11's unknown-path and wrong-method errors, its checks of the headers, and its
        // 500 for a handler's panic; the keys; outermost, the request's id, log line and count.
        finish(routes, Arc::clone(&self.variants[0].state))
            .layer(axum::middleware::from_fn_with_state(
                Arc::clone(self),
                authorize,
            ))
            .layer(axum::middleware::from_fn_with_state(
                Arc::clone(self),
                in_the_apis_shape,
            ))
            .layer(axum::middleware::from_fn_with_state(
                Arc::clone(self),
                each_request,
            ))
    }
}

/// A number in [0, 1) fixed by `label` (FNV-1a): the same request id, the same variant.
fn unit_interval(label: &str) -> f64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in label.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// The variant that answered, put in the response's extensions for the request layer.
#[derive(Clone, Copy)]
struct Answered(&'static str);

/// The endpoint label of a path: the routes by name, everything else `other`, so that no
/// client can create series at will.
fn endpoint(app: &App, path: &str) -> &'static str {
    const PROBES: [&str; 4] = ["/v1/models", "/health", "/ready", "/metrics"];
    (app.generating.iter().copied().chain(PROBES))
        .find(|k| *k == path)
        .unwrap_or("other")
}

// ANCHOR: request_id
/// The client's request id if it is sensible — 1 to [`MAX_REQUEST_ID`] letters, digits and
/// `._:-` — else a new one: 16 random hex digits.
fn request_id(req: &Request) -> String {
    // ANCHOR: yours_request_id
    let given = req
        .headers()
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|s| {
            !s.is_empty()
                && s.len() <= MAX_REQUEST_ID
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b))
        });
    match given {
        Some(s) => s.to_string(),
        None => format!("{:016x}", rand::random::<u64>()),
    }
    // ANCHOR_END: yours_request_id
}
// ANCHOR_END: request_id

// ANCHOR: each_request
/// Every request: its id, its span, its log line and its count. For a stream they are made
/// when its body ends (or is dropped, if the client leaves), when the last event is sent, not
/// when the headers are.
async fn each_request(State(app): State<Arc<App>>, mut req: Request, next: Next) -> Response {
    let started = Instant::now();
    let id = request_id(&req);
    let endpoint = endpoint(&app, req.uri().path());
    let span = tracing::info_span!(
        "request",
        id = %id,
        method = %req.method(),
        path = %req.uri().path(),
    );
    req.extensions_mut()
        .insert(RequestLabel(id.as_str().into()));
    let mut response = next.run(req).instrument(span.clone()).await;
    if let Ok(v) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(REQUEST_ID, v);
    }
    let status = response.status().as_u16();
    let variant = response.extensions().get::<Answered>().map_or("", |a| a.0);
    // ANCHOR_END: each_request
    // ANCHOR: ended
    // Counted and logged when the body ends or is dropped.
    struct Ended {
        app: Arc<App>,
        span: tracing::Span,
        endpoint: &'static str,
        status: u16,
        variant: &'static str,
        started: Instant,
    }
    impl Drop for Ended {
        fn drop(&mut self) {
            let took = self.started.elapsed();
            self.app
                .metrics
                .request(self.endpoint, self.status, self.variant, took);
            let ms = took.as_secs_f64() * 1e3;
            let _in = self.span.enter();
            if self.endpoint == "other" || self.status >= 400 {
                tracing::warn!(status = self.status, ms, variant = self.variant, "answered");
            } else if self.endpoint.starts_with("/v1/") {
                tracing::info!(status = self.status, ms, variant = self.variant, "answered");
            } else {
                // Probes and scrapes come every few seconds: not worth a line each at info.
                tracing::debug!(status = self.status, ms, "answered");
            }
        }
    }
    let ended = Ended {
        app,
        span,
        endpoint,
        status,
        variant,
        started,
    };
    // A stream's body runs on after this returns: the line and the count wait for its end,
    // carried by the body. Any other response is whole now.
    let streaming = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|t| t.as_bytes().starts_with(b"text/event-stream"));
    if !streaming {
        drop(ended);
        return response;
    }
    keep_until_sent(response, ended)
}
// ANCHOR_END: ended

/// `response`, with `guard` dropped when its body has been sent (or dropped, if the client
/// leaves) rather than now: what a stream's log line, a key's place and a connection's
/// in-flight count wait for. The body's size is kept, so a whole response keeps its length.
pub(crate) fn keep_until_sent<G: Send + Sync + 'static>(response: Response, guard: G) -> Response {
    let (parts, body) = response.into_parts();
    let body = body.map_frame(move |frame| {
        let _ = &guard;
        frame
    });
    Response::from_parts(parts, Body::new(body))
}

/// An error answered in front of an endpoint that generates — a missing key, an unknown model,
/// a body too slow — in its API's shape ([`Endpoints::error`](ch11::server::Endpoints::error)):
/// this server's own are OpenAI's.
async fn in_the_apis_shape(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    let response = next.run(req).await;
    if response.status().is_success() || !app.generating.contains(&path.as_str()) {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    // Errors are small: one that is not is passed on as it is (its length cut to the limit).
    let bytes = axum::body::to_bytes(body, 1 << 16)
        .await
        .unwrap_or_default();
    let Ok(error) = serde_json::from_slice::<Value>(&bytes) else {
        return Response::from_parts(parts, Body::from(bytes));
    };
    let endpoints = &app.variants[0].args.endpoints;
    let shaped = endpoints.error(&path, parts.status.as_u16(), error);
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(shaped.to_string()))
}

// ANCHOR: authorize
/// With API keys, a request to `/v1/` must carry one ([`Keys::admit`]): it then runs as its
/// key's partition of the prefix cache ([`CachePartition`](ch11::CachePartition)), holding a
/// place among the key's requests until its body has been sent.
async fn authorize(State(app): State<Arc<App>>, mut req: Request, next: Next) -> Response {
    if !app.keys.enabled() || !req.uri().path().starts_with("/v1/") {
        return next.run(req).await;
    }
    let label = req
        .extensions()
        .get::<RequestLabel>()
        .map_or_else(String::new, |l| l.0.to_string());
    // OpenAI's clients send `Authorization: Bearer KEY`; Anthropic's, `x-api-key: KEY`.
    fn text(v: Option<&HeaderValue>) -> Option<&str> {
        v.and_then(|v| v.to_str().ok())
    }
    let headers = req.headers();
    let presented = (
        text(headers.get(header::AUTHORIZATION)),
        text(headers.get(X_API_KEY)),
    );
    let authorization = match presented {
        (None, Some(key)) => Some(format!("Bearer {key}")),
        (a, _) => a.map(str::to_string),
    };
    let (tenant, admitted) = match app.keys.admit(authorization.as_deref(), &label) {
        Ok(a) => a,
        Err(refused) => return refused.into_error().into_response(),
    };
    req.extensions_mut().insert(tenant);
    keep_until_sent(next.run(req).await, admitted)
}
// ANCHOR_END: authorize

// ANCHOR: generation
/// `POST /v1/chat/completions` and `/v1/completions`: read the body (within the time limit),
/// choose the variant, and hand the request to its chapter 11 server.
async fn generation(State(app): State<Arc<App>>, req: Request) -> Response {
    let label = req
        .extensions()
        .get::<RequestLabel>()
        .map_or_else(String::new, |l| l.0.to_string());
    // The largest body a loaded variant takes (chapter 11's limit from its context).
    let limit = app
        .variants
        .iter()
        .map(|v| v.state.body_limit())
        .max()
        .unwrap_or(0);
    let (mut parts, body) = req.into_parts();
    // Reading the body is the first part of preparing the request: it takes a turn, which
    // chapter 11's handler keeps until the prompt is tokenized.
    let turn = app.variants[0].state.preparing().await;
    let read = tokio::time::timeout(app.body_timeout, axum::body::to_bytes(body, limit));
    let bytes: Bytes = match read.await {
        Err(_) => {
            let s = app.body_timeout.as_secs();
            let mut r = ApiError::new(
                408,
                "invalid_request_error",
                format!("the request body did not arrive within {s} s"),
            )
            .into_response();
            r.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            return r;
        }
        Ok(Err(e)) if ch11::server::is_length_limit(&e) => {
            return ApiError::too_large(limit).into_response();
        }
        Ok(Err(e)) => return ApiError::invalid("body", e.to_string()).into_response(),
        Ok(Ok(b)) => b,
    };
    let variant = match app.choose(&bytes, &label) {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    if let Some(faults) = &app.faults
        && let Some(fault) = parts
            .headers
            .get(FAULT_HEADER)
            .and_then(|v| Fault::parse(v.to_str().ok()?))
    {
        if fault == Fault::PanicInHandler {
            panic!("injected fault: a panic in the handler of request {label}");
        }
        let mut planted = faults.planted.lock().unwrap_or_else(|e| e.into_inner());
        planted.insert(label, fault);
    }
    parts.extensions.insert(turn);
    let req = Request::from_parts(parts, Body::from(bytes));
    let Ok(mut response) = variant.router.clone().oneshot(req).await;
    response.extensions_mut().insert(Answered(variant.name));
    response
}
// ANCHOR_END: generation

/// `GET /v1/models`: every variant's model.
async fn models(State(app): State<Arc<App>>) -> Response {
    let mut data = Vec::new();
    for v in &app.variants {
        let Some(mut card) = model_card(&v.state) else {
            return ApiError::loading().into_response();
        };
        card["meta"]["variant"] = json!(v.name);
        data.push(card);
    }
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

/// `GET /health`: alive. 200 while the process and its engine threads run — also while the
/// models load, so that an orchestrator does not kill a server that is starting — and 500
/// once an engine thread has died.
async fn health(State(app): State<Arc<App>>) -> Response {
    if let Some(v) = app.dead_engine() {
        let m = format!("the engine thread of variant {v} has stopped");
        return ApiError::internal(m).into_response();
    }
    let status = if app.is_loaded() { "ok" } else { "loading" };
    axum::Json(json!({"status": status})).into_response()
}

/// `GET /ready`: 200 when every model is loaded and the server is not draining; else 503 and
/// why. An orchestrator sends traffic only to ready servers.
async fn ready(State(app): State<Arc<App>>) -> Response {
    let why = if app.dead_engine().is_some() {
        Some("engine stopped")
    } else if !app.is_loaded() {
        Some("loading")
    } else if app.is_draining() {
        Some("draining")
    } else {
        None
    };
    match why {
        Some(w) => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"status": w})),
        )
            .into_response(),
        None => {
            let variants: HashMap<&str, Value> = app
                .variants
                .iter()
                .filter_map(|v| {
                    let l = v.state.loaded.get()?;
                    let status = serde_json::to_value(l.worker.status()).ok()?;
                    Some((v.name, json!({"model": l.model_id, "scheduler": status})))
                })
                .collect();
            axum::Json(json!({"status": "ready", "variants": variants})).into_response()
        }
    }
}

/// `GET /metrics`: Prometheus text.
async fn metrics(State(app): State<Arc<App>>) -> Response {
    for v in &app.variants {
        app.metrics.sample(v.name, &v.state);
    }
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        app.metrics.render(),
    )
        .into_response()
}

// ANCHOR: hooks
/// What one variant's engine thread tells: metrics, a log line per request, planted faults.
struct EngineHooks {
    variant: &'static str,
    keys: Arc<Keys>,
    metrics: EngineMetrics,
    faults: Option<Arc<Faults>>,
}

impl EngineHooks {
    fn fault(&self, label: &str) -> Option<Fault> {
        let faults = self.faults.as_ref()?;
        let mut planted = faults.planted.lock().unwrap_or_else(|e| e.into_inner());
        planted.remove(label)
    }
}
// ANCHOR_END: hooks

// ANCHOR: hooks_observer
impl Observer for EngineHooks {
    fn step(&self, report: &StepReport, took: Duration, status: &PoolStatus) {
        self.metrics.step(report, took, status);
        if let Some(f) = &self.faults
            && f.kill.load(Ordering::SeqCst)
        {
            panic!(
                "injected fault: the engine thread of variant {} dies",
                self.variant
            );
        }
    }

    fn token(&self, label: &str, first: bool, gap: Duration) {
        self.metrics.token(label, first, gap);
        if first {
            match self.fault(label) {
                Some(Fault::PanicInStep) => {
                    panic!("injected fault: a panic in the step of request {label}")
                }
                Some(Fault::KillEngine) => {
                    let faults = self.faults.as_ref().expect("a fault was planted");
                    faults.kill.store(true, Ordering::SeqCst);
                }
                Some(hold @ (Fault::HoldUntilDrain | Fault::HoldUntilClose)) => {
                    let faults = self.faults.as_ref().expect("a fault was planted");
                    let mut held = faults.held.lock().unwrap_or_else(|e| e.into_inner());
                    held.insert(label.to_string(), hold);
                }
                _ => {}
            }
        }
    }

    // ANCHOR_END: hooks_observer
    // ANCHOR: hooks_ended
    fn hold(&self, labels: &mut dyn Iterator<Item = &str>) -> bool {
        self.faults.as_ref().is_some_and(|f| f.hold(labels))
    }

    fn done(&self, label: &str, o: &Outcome) {
        if let Some(f) = &self.faults {
            f.ended(label);
        }
        self.metrics.done(label, o);
        self.keys
            .charge(label, (o.prompt_tokens + o.completion_tokens) as u64);
        tracing::info!(
            request_id = label,
            variant = self.variant,
            prompt_tokens = o.prompt_tokens,
            cached_tokens = o.cached_tokens,
            completion_tokens = o.completion_tokens,
            finish = o.stop.name(),
            ended_by_server = o.timed_out,
            "generated"
        );
    }

    fn failed(&self, label: &str, message: &str) {
        if let Some(f) = &self.faults {
            f.ended(label);
        }
        self.metrics.failed(label, message);
        tracing::error!(
            request_id = label,
            variant = self.variant,
            message,
            "failed"
        );
    }
}
// ANCHOR_END: hooks_ended

#[cfg(test)]
mod tests {
    use super::*;

    fn id_of(given: Option<&str>) -> String {
        let mut req = Request::builder().uri("/v1/completions");
        if let Some(g) = given {
            req = req.header(REQUEST_ID, g);
        }
        request_id(&req.body(Body::empty()).unwrap())
    }

    #[test]
    fn a_request_id_is_kept_only_when_it_is_sensible() {
        assert_eq!(id_of(Some("trace-42.a:b")), "trace-42.a:b");
        let longest = "x".repeat(MAX_REQUEST_ID);
        assert_eq!(id_of(Some(&longest)), longest);
        let fresh = |id: String| id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit());
        let too_long = "x".repeat(MAX_REQUEST_ID + 1);
        for bad in [
            None,
            Some(""),
            Some("a b"),
            Some("<script>"),
            Some(too_long.as_str()),
        ] {
            let id = id_of(bad);
            assert!(fresh(id.clone()), "{bad:?} gave {id:?}");
        }
        assert_ne!(id_of(None), id_of(None), "a new id each time");
    }
}
