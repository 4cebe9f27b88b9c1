//! What every handler shares ([`AppState`]): the server's limits, the model once it is
//! loaded, the count of requests in flight, the turns to prepare them, and whether the server
//! drains — with the limits that follow from the model ([`max_text_bytes`],
//! [`body_limit_for`]) and what a layer in front of the routes may tell a handler about a
//! request ([`RequestLabel`], [`CachePartition`], [`Preparing`]).

use crate::api::{Chats, Formats, Lookaheads};
use crate::worker::Worker;
use ch10::Engine;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

// Only for the documentation's links:
#[cfg(doc)]
use super::place::Place;
#[cfg(doc)]
use crate::worker::Job;

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
    /// What requests feed ahead ([`ServeArgs::lookaheads`](crate::ServeArgs)).
    pub lookaheads: Arc<dyn Lookaheads>,
    /// What a chat's conversation and answer become ([`ServeArgs::chats`](crate::ServeArgs)).
    pub chats: Arc<dyn Chats>,
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
    pub(super) in_flight: AtomicUsize,
    preparing: Arc<Semaphore>,
    /// Turns of the requests' output forms to be compiled ([`Place::form`]).
    pub(super) compiling: Arc<Semaphore>,
    /// Whether the server drains: a flag, and a channel that requests being prepared wait on.
    draining: AtomicBool,
    pub(super) drained: tokio::sync::watch::Sender<bool>,
    pub(super) next_response: AtomicU64,
    pub(super) started: u64,
}

/// A request's name, put in its extensions by a layer in front of the routes (a request id
/// it was sent with, say). The engine thread's [`Job::label`] is this, or the response's id without one.
#[derive(Debug, Clone)]
pub struct RequestLabel(pub Arc<str>);

/// The prefix cache's partition a request reads and fills (chapter 7's
/// [`Submit::partition`](ch07::Submit)), put in its extensions by a layer in front of the
/// routes that knows who sent it: a request in another partition cannot learn from a cache
/// hit — or from `cached_tokens` — what it sent. A request without one is in partition 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CachePartition(pub u64);

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
/// that reads the body itself takes the turn first and puts it in the
/// request's extensions; the handler keeps it until the prompt is tokenized.
#[derive(Clone)]
pub struct Preparing(Arc<std::sync::Mutex<Option<OwnedSemaphorePermit>>>);

impl Preparing {
    /// Give the turn back.
    pub fn done(&self) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
}

pub(super) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
