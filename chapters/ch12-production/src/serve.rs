//! The accept loop and the shutdown.
//!
//! Chapter 11 used `axum::serve`. Here the loop is ours, on hyper's connection builder, for two
//! things a server that runs for real needs:
//! - a limit on the time a client may take to send a request's headers (`--header-timeout`):
//!   without it a client that sends one byte a minute (slowloris) holds a connection for ever,
//!   and enough of them exhaust the server's file descriptors;
//! - a shutdown in phases. On SIGTERM or SIGINT: stop accepting connections, answer new
//!   requests on open ones with 503 and `/ready` with 503, and let the requests in flight
//!   finish for up to `--drain-timeout`; then end those still running, each with its final
//!   event (`finish_reason` `length`, and `[DONE]` for a stream), give the responses
//!   [`FLUSH_GRACE`] to reach their clients, and return, so that the process exits 0.

use crate::app::App;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// After the drain limit, the time the ended requests' final events have to reach their
/// clients before the server returns anyway: writing a few hundred bytes to each open
/// connection takes milliseconds; two seconds leaves room for a busy machine.
pub const FLUSH_GRACE: Duration = Duration::from_secs(2);

/// How long to wait before accepting again after `accept` fails (out of file descriptors,
/// typically): failing again at once would spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

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
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let io = TokioIo::new(stream);
                    let service = TowerToHyperService::new(router.clone());
                    let conn = builder.serve_connection_with_upgrades(io, service);
                    let conn = graceful.watch(conn.into_owned());
                    tokio::spawn(async move {
                        if let Err(e) = conn.await {
                            tracing::debug!("connection ended: {e}");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
            () = &mut shutdown => break,
        }
    }
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
}
// ANCHOR_END: serve

/// Completes on SIGTERM (what an orchestrator sends) or SIGINT (Ctrl-C).
pub async fn signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("cannot listen for SIGTERM ({e}); only Ctrl-C stops the server");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT"),
    }
}
