//! Tokens a request feeds ahead of its decode token, checked in the same step.
//!
//! A step already feeds a sequence several tokens at once: a prompt chunk computes all its
//! positions together, and each row depends only on the tokens before it, never on what else
//! is in the batch. The same holds for a decoding sequence. If it knows — or expects — the
//! tokens that will follow its decode token, it can feed them in the same step, each with its
//! row of logits; the scheduler samples from the rows in order, exactly as plain decoding
//! would, and keeps a fed token's position while it equals the token just sampled from the row
//! before it. From the first that differs on, the rows are dropped and the sequence's cache is
//! truncated back ([`PagedCache::truncate`](ch05::PagedCache::truncate)). Every token is still
//! sampled by the request's own generator from the row plain decoding computes, so the output
//! never changes — only the number of steps it takes.
//!
//! A [`Lookahead`] says what to feed. This chapter's own is [`Known`]: a continuation the
//! caller already has (a recorded answer, replayed or scored in a few steps instead of one per
//! token). The scheduler gives lookahead only what is left when a step is planned — budget and
//! free blocks, never an eviction or a preemption — so it changes none of the scheduler's
//! promises.

use ch04::ForwardError;
use std::time::Duration;

/// Where a step stands when a lookahead is asked what to feed, and when it hears what was
/// kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepRows {
    /// The step's number (the scheduler's [`Stats::steps`](crate::Stats) before it ran).
    pub step: usize,
    /// Rows of the step: planned so far (when asked), or all of them (when told).
    pub rows: usize,
}

// ANCHOR: lookahead
/// What a decoding request feeds after its decode token, in the same step.
pub trait Lookahead {
    /// Append to `out` up to `room` tokens to feed after `tokens` (the prompt and every token
    /// generated so far; the last one is this step's decode token). Called once a step, after
    /// the step is planned, for each decoding request that has a lookahead, oldest first, with
    /// `room` at least 1: what is left of the budget, of the free blocks and of the request's
    /// token limit. Feeding nothing is always right.
    fn ahead(
        &mut self,
        tokens: &[u32],
        room: usize,
        step: StepRows,
        out: &mut Vec<u32>,
    ) -> Result<(), ForwardError>;

    /// After the step (over `step.rows` rows, which took `took`): of the `fed` tokens, the
    /// first `kept` equalled what the model sampled. Called for every request that was asked
    /// in [`ahead`](Self::ahead), whether it fed anything or not.
    fn kept(&mut self, fed: usize, kept: usize, step: StepRows, took: Duration) {
        let _ = (fed, kept, step, took);
    }
}
// ANCHOR_END: lookahead

// ANCHOR: known
/// A continuation known in advance, fed as far as it goes: `tokens` are what is expected after
/// the prompt. Once a fed token is not kept, the rest is not fed again — it was written for a
/// different text.
#[derive(Debug, Clone)]
pub struct Known {
    /// Prompt length: `tokens[i]` is expected at position `prompt_len + i`.
    pub prompt_len: usize,
    pub tokens: Vec<u32>,
    /// Cleared at the first token not kept.
    pub going: bool,
}

impl Known {
    pub fn new(prompt_len: usize, tokens: Vec<u32>) -> Known {
        Known {
            prompt_len,
            tokens,
            going: true,
        }
    }
}

impl Lookahead for Known {
    fn ahead(
        &mut self,
        tokens: &[u32],
        room: usize,
        _: StepRows,
        out: &mut Vec<u32>,
    ) -> Result<(), ForwardError> {
        // The next expected token goes after the decode token, `tokens`' last.
        let next = tokens.len().saturating_sub(self.prompt_len);
        // Only while the text so far is the known one.
        let agrees = |i: usize| self.tokens.get(i) == Some(&tokens[self.prompt_len + i]);
        if self.going && next > 0 && agrees(next - 1) {
            out.extend(self.tokens.iter().skip(next).take(room));
        }
        Ok(())
    }

    fn kept(&mut self, fed: usize, kept: usize, _: StepRows, _: Duration) {
        self.going &= kept == fed;
    }
}
// ANCHOR_END: known
