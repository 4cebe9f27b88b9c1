//! The accept loop and the shutdown.
//!
//! Chapter 11 used `axum::serve`. Here the loop is ours, on hyper's connection builder, for
//! what a server that runs for real needs:
//! - deadlines on every connection, whatever its protocol: its first request must arrive
//!   within `--header-timeout` (a connection that sends nothing, or only HTTP/2's preface, is
//!   closed then), and a connection with nothing in flight is closed after `--idle-timeout`;
//!   HTTP/1 headers have the same time limit, and HTTP/2 connections are pinged and closed
//!   when the pings go unanswered. Without these, a client that opens connections and sends
//!   nothing (or one byte a minute: slowloris) holds them for ever, and enough of them exhaust
//!   the server's file descriptors;
//! - a cap on open connections (`--max-connections`). Past it, a few more are let in for the
//!   probes only ([`PROBE_CONNECTIONS`]): `/health`, `/ready` and `/metrics` answer, anything
//!   else is a 503, and the connection is closed after its answer, or after
//!   [`PROBE_DEADLINE`] if it asks nothing. When those places are full, a new connection takes
//!   the place of the oldest that has asked nothing yet — a flood of silent connections cannot
//!   keep a probe out — and is closed at once only if every place is answering. So the
//!   orchestrator still sees the server while it is flooded;
//! - a shutdown in phases. On SIGTERM, SIGINT or SIGHUP: stop accepting connections, answer
//!   new requests on open ones with 503 and `/ready` with 503, and let the requests in flight
//!   finish for up to `--drain-timeout`; then end those still running, each with a 503
//!   `shutting_down` in OpenAI's shape (for a stream, an error event and `[DONE]`: its text
//!   is unfinished, and a finish reason would say otherwise), give the responses
//!   [`FLUSH_GRACE`] to reach their clients, and return, so that the process exits 0. A
//!   request still being prepared (its grammar compiling) is given up and answered 503. An idle
//!   keep-alive connection is closed when the drain starts (hyper's graceful shutdown), so a
//!   client sees a closed connection, not a 503, for its next request.

use crate::app::{App, keep_until_sent};
use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use ch11::api::ApiError;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tower::ServiceExt;

/// After the drain limit, the time the ended requests' final events have to reach their
/// clients before the server returns anyway: writing a few hundred bytes to each open
/// connection takes milliseconds; 1.5 s leaves room for a busy machine, and with the
/// runtime's own shutdown (`SHUTDOWN_GRACE`, 0.5 s) the process ends within the 2 s that
/// `--drain-timeout` promises beyond the drain.
pub const FLUSH_GRACE: Duration = Duration::from_millis(1500);

/// How long to wait before accepting again after `accept` fails (out of file descriptors,
/// typically): failing again at once would spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Connections let in past `--max-connections` for the probes (`/health`, `/ready`,
/// `/metrics`), each closed after its first answer or `--header-timeout`: enough for an
/// orchestrator's probes and a scraper, few enough that a flood cannot use them.
pub const PROBE_CONNECTIONS: usize = 16;

/// How long a connection past the cap has to send its request (a probe sends at once).
pub const PROBE_DEADLINE: Duration = Duration::from_secs(2);

/// How often a connection's deadlines are looked at: a deadline is kept within this.
const DEADLINE_TICK: Duration = Duration::from_millis(250);

/// HTTP/2 keep-alive: a ping after this long without a frame, and the connection closed if
/// the pong does not come within [`H2_PING_TIMEOUT`] (a peer that vanished without a FIN).
const H2_PING_INTERVAL: Duration = Duration::from_secs(20);
const H2_PING_TIMEOUT: Duration = Duration::from_secs(10);

/// What a connection is doing, for its deadlines: requests seen, requests in flight (their
/// response bodies not yet sent), and when it was last busy; and a way to close it.
struct Activity {
    opened: Instant,
    seen: AtomicBool,
    active: AtomicUsize,
    /// Milliseconds from `opened` to the end of the last response.
    last_ms: AtomicU64,
    close: tokio::sync::Notify,
}

impl Activity {
    fn new() -> Arc<Activity> {
        Arc::new(Activity {
            opened: Instant::now(),
            seen: AtomicBool::new(false),
            active: AtomicUsize::new(0),
            last_ms: AtomicU64::new(0),
            close: tokio::sync::Notify::new(),
        })
    }

    /// Whether the connection has outlived its deadline: no request within `first` of
    /// opening, or nothing in flight for `idle`.
    fn expired(&self, first: Duration, idle: Duration) -> bool {
        if self.active.load(Ordering::SeqCst) > 0 {
            return false;
        }
        let now = self.opened.elapsed();
        if !self.seen.load(Ordering::SeqCst) {
            return now > first;
        }
        let last = Duration::from_millis(self.last_ms.load(Ordering::SeqCst));
        now.saturating_sub(last) > idle
    }

    /// A request begins: it is in flight until the returned guard is dropped with its body.
    fn begin(self: &Arc<Activity>) -> InFlight {
        self.seen.store(true, Ordering::SeqCst);
        self.active.fetch_add(1, Ordering::SeqCst);
        InFlight(Arc::clone(self))
    }
}

struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let a = &self.0;
        a.last_ms
            .store(a.opened.elapsed().as_millis() as u64, Ordering::SeqCst);
        a.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Open connections, and whether the cap has been logged as reached.
#[derive(Default)]
struct Open {
    count: AtomicUsize,
    capped: AtomicBool,
}

/// One open connection, counted until dropped.
struct Counted(Arc<Open>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.count.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A connection past the cap may ask the probes only.
fn probe_only(req: &Request) -> bool {
    matches!(req.uri().path(), "/health" | "/ready" | "/metrics")
}

/// The accept loop's connections: those served (at most `cap`), and those let in past the cap
/// for the probes, oldest first.
struct Connections {
    router: axum::Router,
    open: Arc<Open>,
    probes: VecDeque<Arc<Activity>>,
    cap: usize,
    /// The deadline for a connection's first request, and for being idle.
    first: Duration,
    idle: Duration,
}

impl Connections {
    // ANCHOR: connection
    /// Serve the accepted `stream`: counted among the connections served, or given a probe's
    /// place past the cap (or closed, if every such place is answering), and watched for its
    /// deadlines until it ends.
    fn accept(
        &mut self,
        stream: tokio::net::TcpStream,
        peer: std::net::SocketAddr,
        builder: &auto::Builder<TokioExecutor>,
        graceful: &GracefulShutdown,
    ) {
        let cap = self.cap;
        let activity = Activity::new();
        let n = self.open.count.load(Ordering::SeqCst);
        let over = n >= self.cap;
        let counted = if over {
            if !self.open.capped.swap(true, Ordering::SeqCst) {
                tracing::warn!(
                    max_connections = self.cap,
                    "connection cap reached: new connections get the probes only"
                );
            }
            // A place among the probes' connections: a free one, or that of the
            // oldest which has asked nothing yet.
            self.probes.retain(|p| Arc::strong_count(p) > 1);
            if self.probes.len() >= PROBE_CONNECTIONS {
                match self
                    .probes
                    .iter()
                    .position(|p| !p.seen.load(Ordering::SeqCst))
                {
                    Some(i) => {
                        let oldest = self.probes.remove(i).expect("found");
                        oldest.close.notify_one();
                    }
                    None => {
                        tracing::debug!(%peer, "refused: past the connection cap");
                        return; // dropping the stream closes it
                    }
                }
            }
            self.probes.push_back(Arc::clone(&activity));
            None
        } else {
            if n < self.cap * 9 / 10 && self.open.capped.swap(false, Ordering::SeqCst) {
                tracing::info!(open = n, "below the connection cap again");
            }
            self.open.count.fetch_add(1, Ordering::SeqCst);
            Some(Counted(Arc::clone(&self.open)))
        };
        // ANCHOR_END: connection
        // ANCHOR: connection_serve
        let tracked = Arc::clone(&activity);
        let router = self.router.clone();
        let service = tower::service_fn(move |req: Request<Incoming>| {
            let req = req.map(Body::new);
            let in_flight = tracked.begin();
            let router = router.clone();
            async move {
                let response = if over && !probe_only(&req) {
                    busy(cap)
                } else {
                    router.oneshot(req).await?
                };
                // The request is in flight until its body has been sent.
                Ok::<_, std::convert::Infallible>(keep_until_sent(response, in_flight))
            }
        });
        let io = TokioIo::new(stream);
        let service = TowerToHyperService::new(service);
        let conn = builder.serve_connection_with_upgrades(io, service);
        let conn = graceful.watch(conn.into_owned());
        // Past the cap a connection gets one answer's time; below it, the
        // deadlines of the module's docs.
        let (first, idle) = if over {
            (PROBE_DEADLINE.min(self.first), Duration::ZERO)
        } else {
            (self.first, self.idle)
        };
        tokio::spawn(async move {
            let _counted = counted;
            let mut conn = std::pin::pin!(conn);
            let mut tick = tokio::time::interval(DEADLINE_TICK);
            loop {
                tokio::select! {
                    ended = &mut conn => {
                        if let Err(e) = ended {
                            tracing::debug!("connection ended: {e}");
                        }
                        break;
                    }
                    _ = tick.tick() => if activity.expired(first, idle) {
                        tracing::debug!(%peer, "past its deadline: closed");
                        break;
                    },
                    () = activity.close.notified() => break,
                }
            }
        });
    }
    // ANCHOR_END: connection_serve
}

// ANCHOR: serve
/// Serve `app` on `listener` until `shutdown` completes, then drain as the module says.
pub async fn serve(
    listener: TcpListener,
    app: Arc<App>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let router = app.router();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(app.header_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(H2_PING_INTERVAL))
        .keep_alive_timeout(H2_PING_TIMEOUT);
    let graceful = GracefulShutdown::new();
    let mut conns = Connections {
        router,
        open: Arc::new(Open::default()),
        probes: Default::default(),
        cap: app.max_connections,
        first: app.header_timeout,
        idle: app.idle_timeout,
    };
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    conns.accept(stream, peer, &builder, &graceful);
                }
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
            () = &mut shutdown => break,
        }
    }
    // ANCHOR_END: serve
    // ANCHOR: drain
    // ANCHOR: yours_drain
    drop(listener);
    app.drain();
    tracing::info!(
        in_flight = app.in_flight(),
        connections = graceful.count(),
        drain_timeout_s = app.drain_timeout.as_secs_f64(),
        "shutting down: no new connections or requests; draining those in flight"
    );
    let mut open = std::pin::pin!(graceful.shutdown());
    if tokio::time::timeout(app.drain_timeout, &mut open)
        .await
        .is_ok()
    {
        tracing::info!("drained: every request finished");
        return Ok(());
    }
    tracing::warn!(
        in_flight = app.in_flight(),
        "drain limit reached: ending the requests still running"
    );
    app.close();
    if tokio::time::timeout(FLUSH_GRACE, &mut open).await.is_err() {
        tracing::warn!("connections still open after the final events; closing them");
    }
    Ok(())
    // ANCHOR_END: yours_drain
}
// ANCHOR_END: drain

/// The answer past the connection cap to anything but the probes: 503, and the connection
/// closed.
fn busy(cap: usize) -> Response {
    let mut r = ApiError {
        code: Some("too_many_connections"),
        retry_after: Some(1),
        ..ApiError::new(
            503,
            "unavailable_error",
            format!("the server holds {cap} connections, its limit; try again in 1 s"),
        )
    }
    .into_response();
    r.headers_mut().insert(
        axum::http::header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
    r
}

/// Completes on SIGTERM (what an orchestrator sends), SIGINT (Ctrl-C) or SIGHUP (the
/// terminal closed), each logged. SIGHUP drains like the others instead of killing the process
/// at once (its default action): the server reloads nothing — its settings and keys are read
/// at start — so a hang-up means the session that ran it is gone, and the requests in flight
/// deserve their drain.
pub async fn signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (term, hup) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    );
    let (mut term, mut hup) = match (term, hup) {
        (Ok(t), Ok(h)) => (t, h),
        (Err(e), _) | (_, Err(e)) => {
            tracing::warn!(
                "cannot listen for SIGTERM and SIGHUP ({e}); only Ctrl-C stops the server"
            );
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM"),
        _ = hup.recv() => tracing::info!("SIGHUP"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT"),
    }
}
