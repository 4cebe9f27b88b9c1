//! A request, what it streams while it runs, and what it reports when it is done.
//!
//! The per-request state of generation is chapter 4's [`ch04::Generator`]: the request's own
//! sampler (its seed, its random stream), streaming decoder and stop-string filter. The
//! scheduler keeps one per request and feeds it the request's row of each batch's logits, so a
//! request produces exactly the tokens and text that chapter 4's `generate` produces for its
//! prompt alone. Preemption drops the keys and values only: the generator continues where it
//! was, so a recomputed request writes what it would have written.

use ch04::{GenParams, StopReason};
use std::time::Duration;

/// A request's number: requests are numbered in the order they arrive, and that order is the
/// scheduler's priority (lower is older, older goes first).
pub type RequestId = usize;

/// A prompt to complete.
#[derive(Debug, Clone)]
pub struct Request {
    pub prompt: Vec<u32>,
    /// Token limit, sampler settings, stop strings.
    pub params: GenParams,
}

/// A request that is done.
#[derive(Debug, Clone)]
pub struct Finished {
    pub id: RequestId,
    pub prompt_len: usize,
    /// Generated ids, including a final end-of-generation token if there was one.
    pub ids: Vec<u32>,
    /// The generated text, ending before a stop string.
    pub text: String,
    pub stop: StopReason,
    /// Positions whose keys and values came from the prefix cache instead of being computed.
    pub cached_tokens: usize,
    /// Tokens this request put through the model, recomputation after preemption included.
    pub computed_tokens: usize,
    /// How often it was preempted (its cache dropped, to be recomputed later).
    pub preemptions: usize,
    /// Tokens fed ahead of its decode tokens (its [`Lookahead`](crate::Lookahead)'s), and
    /// those kept: each kept one is a token generated without a step of its own.
    pub fed_ahead: usize,
    pub kept_ahead: usize,
    /// From submission to the first generated token: waiting, then the prompt.
    pub ttft: Duration,
    /// From submission to the end.
    pub latency: Duration,
}

impl Finished {
    /// Generated tokens per second after the first one: the request's decode speed as its user
    /// sees it, slowed by everything it shares the steps with.
    pub fn decode_tok_s(&self) -> f64 {
        let secs = self.latency.saturating_sub(self.ttft).as_secs_f64();
        if self.ids.len() < 2 || secs == 0.0 {
            return 0.0;
        }
        (self.ids.len() - 1) as f64 / secs
    }
}
