//! A request's place among those in flight ([`Place`]): taken once its body is checked,
//! given back when it is dropped, and the work done for the request before it runs
//! (tokenizing, compiling its output's form) done on blocking threads while it holds one.

use super::{AppState, Loaded};
use crate::api::{ApiError, Cancel, Sampling};
use crate::worker::{Ticket, Worker};
use axum::body::Bytes;
use serde_json::Value;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;
use tokio::sync::Semaphore;

// Only for the documentation's links:
#[cfg(doc)]
use super::Limits;
#[cfg(doc)]
use crate::api::Formats;

// ANCHOR: place
/// A place among the requests in flight ([`Limits::max_in_flight`]), and the request's ticket
/// once it has one. It is taken as soon as the body is parsed, so that everything done for the
/// request from then on counts — compiling its output's form, tokenizing, waiting, running —
/// and a flood is refused (503) before it costs work. Dropping it gives the place back, gives
/// the request up ([`Cancel`]: work still being done for it stops), and cancels it on the
/// engine thread if it has not ended: what happens when the client disconnects.
pub(super) struct Place {
    state: Arc<AppState>,
    worker: Worker,
    pub(super) ticket: Option<Ticket>,
    pub(super) ended: bool,
    cancel: Cancel,
}

impl Place {
    /// A place, or 503: the server is draining, or holds as many requests as it may.
    pub(super) fn take(s: &Arc<AppState>, l: &Loaded) -> Result<Place, ApiError> {
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
    pub(super) async fn prepare<T: Send + 'static>(
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

// ANCHOR: form
impl Place {
    /// The rule of the request's output form (`response_format`, `grammar`), from the
    /// server's [`Formats`], which get `response_format` as the text the client sent (`body`):
    /// a JSON schema's properties in their order. Compiling a grammar is work that grows with
    /// its size: it runs as [`Place::prepare`] runs work, taking one of the turns that
    /// compiles share ([`Limits::preparing`] of them), so that a request without a grammar
    /// never waits behind one.
    pub(super) async fn form(
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

impl Drop for Place {
    fn drop(&mut self) {
        self.cancel.cancel();
        if let (Some(t), false) = (self.ticket, self.ended) {
            self.worker.cancel(t);
        }
        self.state.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}
