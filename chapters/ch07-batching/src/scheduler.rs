//! Continuous batching: a scheduler that runs many requests through one forward pass per step.
//!
//! Each step the scheduler packs a batch — one token for every request that is decoding, then
//! chunks of prompts that are still being read — runs the model once on it, samples one token
//! for every request whose batch rows reached the end of its tokens, and streams the text.
//! Requests join and leave between any two steps: a finished request's place is taken at the
//! next step, not when the whole batch is done (that would be *static* batching).
//!
//! # Policy
//!
//! Priority is arrival order: requests are numbered as they arrive and a lower number always
//! wins.
//! - **Budget.** A step computes at most `max_batch_tokens` tokens and runs at most
//!   `max_running` sequences (`max_running <= max_batch_tokens`). Decodes go first, one token
//!   each, because they are cheap and a user is waiting for each of them. The rest of the
//!   budget goes to prompt chunks, oldest first (chunked prefill): a long prompt takes several
//!   steps, and decodes keep flowing meanwhile.
//! - **Admission** is first come, first served: a waiting request is admitted when there is a
//!   free sequence slot, budget left and KV blocks for its first chunk; nobody overtakes the
//!   head of the queue.
//! - **Memory.** When a chunk needs KV blocks and none are free, the scheduler first evicts
//!   prefix-cache blocks that no sequence uses (least recently used first), then shortens the
//!   chunk to what fits, and only if not even one token fits does it *preempt* the newest
//!   running request that is newer than the one in need. A preempted request drops its keys and
//!   values (its full blocks are offered to the prefix cache first), goes back to waiting in its
//!   arrival place, and is recomputed when admitted again — often largely from the prefix
//!   cache. Its sampler and text stream are kept, so its output does not change. A decode that
//!   finds no newer request to preempt preempts itself.
//! - **No starvation.** The oldest unfinished request advances by at least one token every
//!   step: it gets budget (decodes of others take at most `max_running - 1`), it may preempt
//!   newer requests for a slot, budget or blocks, and it always fits once they are gone, since
//!   `submit` refuses a request that could not fit in the whole pool. So request `r` is done
//!   within `a_r + Σ_{j ≤ r} (prompt_j + max_tokens_j)` steps, `a_r` being the step it arrived
//!   at: every request ahead of it finishes first, then it runs alone at the front.
//! - **Lookahead.** A request with a [`Lookahead`] may feed tokens after its decode token, in
//!   the same step ([`lookahead`](crate::lookahead)). They get only what is left when
//!   everything above is planned — budget, and free blocks (never an eviction or a
//!   preemption) — so they change none of the promises above. The rows after the first token
//!   not kept are dropped and the sequence's cache is truncated to the tokens kept
//!   ([`PagedCache::truncate`]); every token is still sampled by the request's own generator
//!   from the row plain decoding computes, so its output does not change.

use crate::lookahead::{Lookahead, StepRows};
use crate::prefix::PrefixCache;
use crate::request::{Finished, Request, RequestId};
use ch02::Tokenizer;
use ch03::NoObserver;
use ch04::{
    BadSamplerParam, Batch, ForwardError, Generator, Model, NonFinite, Scratch, StopReason,
};
use ch05::{CacheTypes, PagedCache};
use std::fmt;
use std::time::{Duration, Instant};

// ANCHOR: batch_model
/// What the scheduler needs from a model: the shape of its KV cache and a forward pass over a
/// batch of tokens from many sequences on a paged cache. [`Model`] is one; tests use a fake one
/// that is fast and checks what the scheduler feeds it.
pub trait BatchModel {
    /// The buffers a forward pass keeps from step to step.
    type Scratch: Default;
    fn n_layer(&self) -> usize;
    /// Width of a key or value row: `n_head_kv * head_dim`.
    fn kv_dim(&self) -> usize;
    /// Values in one head of a key or value row.
    fn head_dim(&self) -> usize;
    fn vocab_size(&self) -> usize;
    /// Positions a sequence may reach.
    fn n_ctx(&self) -> usize;
    /// Logits `(n_out, vocab)` of the tokens flagged in `batch`, in batch order, in `scratch`.
    fn forward_batch<'s>(
        &self,
        batch: &Batch,
        kv: &mut PagedCache,
        scratch: &'s mut Self::Scratch,
    ) -> Result<&'s [f32], ForwardError>;
}

impl BatchModel for Model {
    type Scratch = Scratch;
    fn n_layer(&self) -> usize {
        self.config.n_layer
    }
    fn kv_dim(&self) -> usize {
        self.attention.kv_dim()
    }
    fn head_dim(&self) -> usize {
        self.attention.head_dim
    }
    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }
    fn n_ctx(&self) -> usize {
        self.attention.rope.n_pos()
    }
    fn forward_batch<'s>(
        &self,
        batch: &Batch,
        kv: &mut PagedCache,
        scratch: &'s mut Scratch,
    ) -> Result<&'s [f32], ForwardError> {
        self.forward_with(batch, kv, &mut NoObserver, scratch)
    }
}
// ANCHOR_END: batch_model

/// Limits of the scheduler and the size of its KV pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Most tokens in one forward pass, decodes and prompt chunks together. It bounds the time
    /// of a step (so the latency of every decode in it) and the activation memory.
    pub max_batch_tokens: usize,
    /// Most sequences running at once; at most `max_batch_tokens`, so every running decode
    /// fits in every step.
    pub max_running: usize,
    /// Positions per KV block.
    pub block_size: usize,
    /// Blocks in the pool: the KV memory of all sequences and the prefix cache together.
    pub n_blocks: usize,
    /// Keep computed prefixes for later requests.
    pub prefix_cache: bool,
    /// What the pool keeps keys and values in (chapter 5's [`CacheTypes`]).
    pub cache: CacheTypes,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            max_batch_tokens: 256,
            max_running: 16,
            block_size: 16,
            n_blocks: 256,
            prefix_cache: true,
            cache: CacheTypes::F32,
        }
    }
}

/// What a request may come with besides its prompt and settings
/// ([`Scheduler::submit_with`]).
#[derive(Default)]
pub struct Submit<'m> {
    /// The prefix cache's partition it reads and fills ([`PrefixCache`]): requests of
    /// different partitions never share a cached block. 0 unless given.
    pub partition: u64,
    /// What it feeds ahead of its decode tokens, if anything ([`Lookahead`]).
    pub lookahead: Option<Box<dyn Lookahead + Send + 'm>>,
}

/// Why the scheduler refused a configuration or a request, or stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SchedulerError {
    /// The configuration is unusable; the message says which field and why.
    Config(String),
    /// A request with no prompt tokens: there is nothing to predict from.
    EmptyPrompt,
    /// A sampling setting of the request is out of its domain (the message names it).
    BadParams(String),
    /// A prompt token is not in the model's vocabulary.
    TokenOutOfRange {
        index: usize,
        token: u32,
        vocab: usize,
    },
    /// Prompt and generation together need more positions than the model has.
    TooLong { positions: usize, n_ctx: usize },
    /// Prompt and generation together need more KV blocks than the whole pool.
    TooBigForCache { blocks: usize, n_blocks: usize },
    /// No request could be scheduled. The policy makes this impossible; it is reported rather
    /// than looped on.
    Stalled,
    /// The forward pass failed (a bug in a model or in the scheduler's bookkeeping: requests
    /// are checked when submitted). The scheduler's state is then unspecified.
    Forward(ForwardError),
}

impl fmt::Display for SchedulerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SchedulerError::Config(m) => write!(f, "scheduler configuration: {m}"),
            SchedulerError::EmptyPrompt => write!(f, "the request's prompt has no tokens"),
            SchedulerError::BadParams(e) => write!(f, "the request's sampling settings: {e}"),
            SchedulerError::TokenOutOfRange {
                index,
                token,
                vocab,
            } => write!(
                f,
                "prompt token {token} at index {index} is not below the vocabulary size {vocab}"
            ),
            SchedulerError::TooLong { positions, n_ctx } => write!(
                f,
                "prompt and max_tokens need {positions} positions, the model has {n_ctx}"
            ),
            SchedulerError::TooBigForCache { blocks, n_blocks } => write!(
                f,
                "prompt and max_tokens need {blocks} KV blocks, the pool has {n_blocks}"
            ),
            SchedulerError::Stalled => write!(f, "no request could be scheduled"),
            SchedulerError::Forward(e) => write!(f, "forward pass: {e}"),
        }
    }
}

impl std::error::Error for SchedulerError {}

impl From<ForwardError> for SchedulerError {
    fn from(e: ForwardError) -> Self {
        SchedulerError::Forward(e)
    }
}

/// Receives what requests produce, as they produce it.
pub trait Sink {
    /// Text of request `id`, streamed: complete UTF-8, never part of a stop string.
    fn text(&mut self, _id: RequestId, _text: &str) {}
    /// Request `id` sampled `token` from `logits` (`(vocab)`).
    fn token(&mut self, _id: RequestId, _token: u32, _logits: &[f32]) {}
}

/// Ignores everything.
impl Sink for () {}

/// What one step did.
#[derive(Debug, Clone, Default)]
pub struct StepReport {
    /// Tokens in the batch (at most `max_batch_tokens`).
    pub n_tokens: usize,
    /// Sequences in the batch (at most `max_running`).
    pub n_seqs: usize,
    /// Sequences in the batch decoding: feeding back the token they generated last.
    pub n_decode: usize,
    /// Requests admitted this step, and preempted this step.
    pub admitted: usize,
    pub preempted: usize,
    /// Prefix-cache blocks evicted this step.
    pub evicted: usize,
    /// Tokens fed ahead this step ([`Lookahead`]), and those kept.
    pub fed_ahead: usize,
    pub kept_ahead: usize,
    /// How long the forward pass took.
    pub took: Duration,
    /// Requests that finished this step, oldest first.
    pub finished: Vec<Finished>,
}

/// Totals since the scheduler started.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub steps: usize,
    /// Tokens put through the model.
    pub computed_tokens: usize,
    /// Positions taken from the prefix cache instead.
    pub cached_tokens: usize,
    pub generated_tokens: usize,
    pub preemptions: usize,
    pub evicted_blocks: usize,
    /// Tokens fed ahead ([`Lookahead`]), and those kept.
    pub fed_ahead_tokens: usize,
    pub kept_ahead_tokens: usize,
}

/// A request the scheduler holds, waiting or running.
struct Seq<'t> {
    id: RequestId,
    prompt_len: usize,
    /// Prompt and generated tokens; the last generated one is not in the cache yet.
    tokens: Vec<u32>,
    /// Its sequence number in the paged cache while running; `None` while waiting.
    slot: Option<usize>,
    /// Positions of `tokens` whose keys and values are in the cache.
    n_kv: usize,
    out: Generator<'t>,
    cached_tokens: usize,
    computed_tokens: usize,
    preemptions: usize,
    submitted: Instant,
    ttft: Option<Duration>,
    /// The prefix cache's partition this request reads and fills.
    partition: u64,
    max_tokens: usize,
    /// What it feeds ahead, if anything; this step's tokens fed ahead; how many so far.
    lookahead: Option<Box<dyn Lookahead + Send + 't>>,
    ahead: Vec<u32>,
    fed_ahead: usize,
    kept_ahead: usize,
}

impl Seq<'_> {
    fn pending(&self) -> usize {
        self.tokens.len() - self.n_kv
    }
    fn is_decoding(&self) -> bool {
        self.slot.is_some() && self.pending() == 1
    }

    /// After a step that fed `fed` tokens ahead and kept the first `kept`: the cache keeps the
    /// positions of those, the ones after them go, and the lookahead hears how it did (`step`:
    /// the step's number, rows and time).
    fn keep_ahead(
        &mut self,
        fed: usize,
        kept: usize,
        kv: &mut PagedCache,
        (step, rows, took): (usize, usize, Duration),
    ) {
        self.n_kv += kept;
        if kept < fed {
            kv.truncate(self.slot.expect("planned sequences run"), self.n_kv);
        }
        self.fed_ahead += fed;
        self.kept_ahead += kept;
        if let Some(l) = self.lookahead.as_mut() {
            l.kept(fed, kept, StepRows { step, rows }, took);
        }
    }
}

/// One entry of a step's plan: `n` tokens of `seqs[seq]` and the first `ahead` of the tokens
/// it feeds ahead (`asked`: its lookahead was asked), needing `blocks` new KV blocks.
#[derive(Debug, Clone, Copy)]
struct Chunk {
    seq: usize,
    n: usize,
    ahead: usize,
    asked: bool,
    blocks: usize,
}

// ANCHOR: scheduler
/// Runs requests through a model in batches, on a paged KV cache with a prefix cache.
pub struct Scheduler<'m, M: BatchModel> {
    model: &'m M,
    tokenizer: &'m Tokenizer,
    config: SchedulerConfig,
    kv: PagedCache,
    prefix: PrefixCache,
    seqs: Vec<Seq<'m>>,     // unfinished requests, oldest first
    free_slots: Vec<usize>, // sequence numbers of the paged cache not in use
    next_id: RequestId,
    stats: Stats,
    // Kept from step to step, so that a step allocates little: the batch, the plan and the
    // activations of the forward pass.
    batch: Batch,
    plan: Vec<Chunk>,
    scratch: M::Scratch,
}
// ANCHOR_END: scheduler

impl<'m, M: BatchModel> Scheduler<'m, M> {
    /// A scheduler for `model`, with a pool of `config.n_blocks` KV blocks.
    pub fn new(
        model: &'m M,
        tokenizer: &'m Tokenizer,
        config: SchedulerConfig,
    ) -> Result<Self, SchedulerError> {
        let bad = |m: &str| Err(SchedulerError::Config(m.to_string()));
        if config.max_batch_tokens == 0 || config.max_running == 0 {
            return bad("max_batch_tokens and max_running must be at least 1");
        }
        if config.max_running > config.max_batch_tokens {
            return bad(
                "max_running must not exceed max_batch_tokens, or running decodes would not fit in a step",
            );
        }
        if config.block_size == 0 || config.n_blocks == 0 {
            return bad("block_size and n_blocks must be at least 1");
        }
        Ok(Scheduler {
            model,
            tokenizer,
            kv: config
                .cache
                .check_head_dim(model.head_dim())
                .and_then(|()| {
                    PagedCache::try_typed(
                        model.n_layer(),
                        model.kv_dim(),
                        config.block_size,
                        config.n_blocks,
                        config.cache,
                    )
                })
                .map_err(|e| SchedulerError::Config(e.to_string()))?,
            prefix: PrefixCache::new(config.block_size),
            seqs: Vec::new(),
            free_slots: (0..config.max_running).rev().collect(),
            next_id: 0,
            stats: Stats::default(),
            batch: Batch::default(),
            plan: Vec::new(),
            scratch: M::Scratch::default(),
            config,
        })
    }

    /// The model the requests run on.
    pub fn model(&self) -> &'m M {
        self.model
    }
    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }
    pub fn stats(&self) -> &Stats {
        &self.stats
    }
    /// The paged KV cache, with its block allocator.
    pub fn kv(&self) -> &PagedCache {
        &self.kv
    }
    pub fn prefix_cache(&self) -> &PrefixCache {
        &self.prefix
    }
    /// Empty the prefix cache, releasing its reference to every block it holds (blocks that
    /// running sequences use stay with them).
    pub fn clear_prefix_cache(&mut self) {
        self.prefix.clear(&mut self.kv.allocator);
    }
    /// Requests not finished.
    pub fn n_unfinished(&self) -> usize {
        self.seqs.len()
    }
    pub fn n_running(&self) -> usize {
        self.seqs.iter().filter(|s| s.slot.is_some()).count()
    }
    pub fn is_idle(&self) -> bool {
        self.seqs.is_empty()
    }
    /// The paged-cache sequence numbers of running requests, by request id.
    pub fn running_slots(&self) -> Vec<(RequestId, usize)> {
        self.seqs
            .iter()
            .filter_map(|s| s.slot.map(|slot| (s.id, slot)))
            .collect()
    }

    // ANCHOR: submit
    /// Queue a request. It is checked now, so that it can always run to the end: its sampling
    /// settings are in their domains, its tokens are in the vocabulary, and prompt plus
    /// `max_tokens` fit the model's context and the whole KV pool.
    pub fn submit(&mut self, request: Request) -> Result<RequestId, SchedulerError> {
        self.submit_with(request, Submit::default())
    }

    /// [`submit`](Self::submit), with the prefix cache's partition and a lookahead
    /// ([`Submit`]).
    pub fn submit_with(
        &mut self,
        request: Request,
        with: Submit<'m>,
    ) -> Result<RequestId, SchedulerError> {
        let Request { prompt, params } = request;
        if prompt.is_empty() {
            return Err(SchedulerError::EmptyPrompt);
        }
        // One request's bad settings must not reach the sampler of a batch others share.
        params
            .sampler
            .validate()
            .map_err(|e: BadSamplerParam| SchedulerError::BadParams(e.to_string()))?;
        let vocab = self.model.vocab_size();
        if let Some((index, &token)) = prompt
            .iter()
            .enumerate()
            .find(|(_, t)| **t as usize >= vocab)
        {
            return Err(SchedulerError::TokenOutOfRange {
                index,
                token,
                vocab,
            });
        }
        // ANCHOR_END: submit
        // ANCHOR: submit_fits
        // The last generated token is never fed back, so it takes no position.
        let positions = prompt
            .len()
            .saturating_add(params.max_tokens.saturating_sub(1));
        if positions > self.model.n_ctx() {
            return Err(SchedulerError::TooLong {
                positions,
                n_ctx: self.model.n_ctx(),
            });
        }
        let blocks = positions.div_ceil(self.config.block_size);
        if blocks > self.config.n_blocks {
            return Err(SchedulerError::TooBigForCache {
                blocks,
                n_blocks: self.config.n_blocks,
            });
        }
        let id = self.next_id;
        self.next_id += 1;
        self.seqs.push(Seq {
            id,
            prompt_len: prompt.len(),
            tokens: prompt,
            slot: None,
            n_kv: 0,
            out: Generator::new(self.tokenizer, &params),
            cached_tokens: 0,
            computed_tokens: 0,
            preemptions: 0,
            submitted: Instant::now(),
            ttft: None,
            partition: with.partition,
            max_tokens: params.max_tokens,
            lookahead: with.lookahead,
            ahead: Vec::new(),
            fed_ahead: 0,
            kept_ahead: 0,
        });
        Ok(id)
    }
    // ANCHOR_END: submit_fits

    /// Run steps until every request is done. Returns them in the order they finished.
    pub fn run(&mut self, sink: &mut dyn Sink) -> Result<Vec<Finished>, SchedulerError> {
        let mut done = Vec::new();
        while !self.is_idle() {
            done.extend(self.step(sink)?.finished);
        }
        Ok(done)
    }

    // ANCHOR: step
    /// One step: plan a batch, run the model once on it, sample, stream, retire finished
    /// requests.
    pub fn step(&mut self, sink: &mut dyn Sink) -> Result<StepReport, SchedulerError> {
        let mut report = StepReport::default();
        let mut plan = std::mem::take(&mut self.plan);
        let mut budget = self.config.max_batch_tokens;
        self.plan(&mut plan, &mut budget, &mut report);
        self.plan_ahead(&mut plan, budget)?;
        if plan.is_empty() && self.seqs.iter().any(|s| s.out.stop.is_none()) {
            // Cannot happen: the oldest request can always run (see the module docs).
            return Err(SchedulerError::Stalled);
        }

        // One batch: every planned chunk, logits only where a chunk reaches its last token.
        self.batch.clear();
        for c in &plan {
            let s = &self.seqs[c.seq];
            report.n_decode += usize::from(!s.out.ids.is_empty() && s.pending() == 1);
            let slot = s.slot.expect("planned sequences run");
            for pos in s.n_kv..s.n_kv + c.n {
                self.batch
                    .push(s.tokens[pos], slot, pos, pos + 1 == s.tokens.len());
            }
            // Tokens fed ahead follow the decode token, each with its row of logits.
            for (j, &t) in s.ahead[..c.ahead].iter().enumerate() {
                self.batch.push(t, slot, s.tokens.len() + j, true);
            }
        }
        let started = Instant::now();
        let logits: &[f32] = if self.batch.is_empty() {
            &[]
        } else {
            self.model
                .forward_batch(&self.batch, &mut self.kv, &mut self.scratch)?
        };
        report.took = started.elapsed();
        self.stats.steps += 1;
        self.stats.computed_tokens += self.batch.len();
        report.n_tokens = self.batch.len();
        report.n_seqs = plan.len();
        // ANCHOR_END: step

        // ANCHOR: step_sample
        // Sample for every sequence whose chunk reached its end, in batch order: from the row
        // of its last token, then from the row of each token fed ahead while the token sampled
        // before it equals it.
        let vocab = self.model.vocab_size();
        let mut rows = logits.chunks_exact(vocab);
        for c in &plan {
            let s = &mut self.seqs[c.seq];
            s.n_kv += c.n;
            s.computed_tokens += c.n + c.ahead;
            if s.n_kv < s.tokens.len() {
                continue; // a prompt chunk that is not the last
            }
            let (mut kept, mut done) = (0, false);
            for (r, row) in rows.by_ref().take(1 + c.ahead).enumerate() {
                if done {
                    continue; // computed after a token not kept: dropped
                }
                // A NaN from broken weights would be sampled as some token and printed as
                // garbage; the model's weights are shared, so the step fails for everyone.
                NonFinite::check(row, s.out.ids.len(), &s.tokens)
                    .map_err(|e| SchedulerError::Forward(e.into()))?;
                let (token, text) = s.out.sample(row, &s.tokens);
                s.ttft.get_or_insert_with(|| s.submitted.elapsed());
                s.tokens.push(token);
                self.stats.generated_tokens += 1;
                sink.token(s.id, token, row);
                if !text.is_empty() {
                    sink.text(s.id, &text);
                }
                let held = r < c.ahead && s.ahead[r] == token;
                kept += usize::from(held);
                done = !held || s.out.stop.is_some();
            }
            if c.asked {
                let step = (self.stats.steps - 1, report.n_tokens, report.took);
                s.keep_ahead(c.ahead, kept, &mut self.kv, step);
                report.fed_ahead += c.ahead;
                report.kept_ahead += kept;
            }
        }
        self.stats.fed_ahead_tokens += report.fed_ahead;
        self.stats.kept_ahead_tokens += report.kept_ahead;
        // Offer the newly filled blocks of prompts to the prefix cache, so that requests
        // arriving meanwhile with the same beginning find them.
        for c in &plan {
            if self.seqs[c.seq].n_kv <= self.seqs[c.seq].prompt_len {
                self.offer_to_prefix_cache(c.seq);
            }
        }
        self.retire_finished(&mut report);
        plan.clear();
        self.plan = plan;
        Ok(report)
    }
    // ANCHOR_END: step_sample

    // ANCHOR: plan
    /// Decide this step's batch: decodes first, then prompt chunks and admissions oldest
    /// first, preempting and evicting as the module docs describe, within `budget` tokens.
    fn plan(&mut self, plan: &mut Vec<Chunk>, budget: &mut usize, report: &mut StepReport) {
        // Requests that are done already (max_tokens 0) are not scheduled.
        let live = |s: &Seq| s.out.stop.is_none();

        for i in 0..self.seqs.len() {
            if live(&self.seqs[i]) && self.seqs[i].is_decoding() {
                match self.make_room(i, 1, plan, budget, report) {
                    Some(c) => {
                        *budget -= 1;
                        plan.push(c);
                    }
                    None => self.preempt(i, plan, budget, report),
                }
            }
        }

        let mut admitting = true;
        for i in 0..self.seqs.len() {
            if !live(&self.seqs[i]) || plan.iter().any(|c| c.seq == i) {
                continue;
            }
            let waiting = self.seqs[i].slot.is_none();
            if waiting {
                if !admitting {
                    continue;
                }
                // Only the oldest request takes a slot or budget from newer running ones.
                while i == 0
                    && (self.free_slots.is_empty() || *budget == 0)
                    && let Some(j) = self.newest_running_after(i)
                {
                    self.preempt(j, plan, budget, report);
                }
                if self.free_slots.is_empty() || *budget == 0 {
                    admitting = false; // first come, first served: nobody overtakes it
                    continue;
                }
                self.admit(i, report);
            }
            if *budget == 0 {
                continue;
            }
            let want = self.seqs[i].pending().min(*budget);
            match self.make_room(i, want, plan, budget, report) {
                Some(c) => {
                    *budget -= c.n;
                    plan.push(c);
                }
                None if waiting => {
                    // Not even one token fits: back to waiting, and nobody overtakes it.
                    self.unadmit(i, report);
                    admitting = false;
                }
                None => {} // a running prompt that must wait for blocks
            }
        }
    }
    // ANCHOR_END: plan

    // ANCHOR: plan_ahead
    /// Give what is left of the budget to lookahead, oldest request first: each decode of a
    /// request with a [`Lookahead`] may feed up to the budget left, the free blocks (no
    /// eviction, no preemption for it) and its token limit — the last fed token's row gives
    /// one more token, so a request that may generate `r` more feeds at most `r - 1`, and
    /// stays within the positions [`submit`](Self::submit) checked.
    fn plan_ahead(&mut self, plan: &mut [Chunk], mut budget: usize) -> Result<(), ForwardError> {
        let (bs, vocab, step) = (
            self.config.block_size,
            self.model.vocab_size(),
            self.stats.steps,
        );
        let mut rows: usize = plan.iter().map(|c| c.n).sum();
        // Blocks the plan takes so far: those left are free for lookahead.
        let mut planned: usize = plan.iter().map(|c| c.blocks).sum();
        for chunk in plan.iter_mut() {
            let i = chunk.seq;
            if budget == 0 {
                break;
            }
            if self.seqs[i].lookahead.is_none() || !self.seqs[i].is_decoding() {
                continue;
            }
            let blocks = self.blocks_held(i) + chunk.blocks + self.kv.allocator.n_free() - planned;
            let s = &mut self.seqs[i];
            let left = s.max_tokens - s.out.ids.len() - 1;
            let room = left.min(budget).min(blocks * bs - s.n_kv - 1);
            let Some(lookahead) = s.lookahead.as_mut().filter(|_| room > 0) else {
                continue;
            };
            s.ahead.clear();
            lookahead.ahead(&s.tokens, room, StepRows { step, rows }, &mut s.ahead)?;
            // A token outside the vocabulary would index past the embedding table.
            let k = s.ahead[..s.ahead.len().min(room)]
                .iter()
                .take_while(|&&t| (t as usize) < vocab)
                .count();
            (chunk.ahead, chunk.asked) = (k, true);
            rows += k;
            budget -= k;
            let blocks = self.blocks_for(i, 1 + k);
            planned += blocks - chunk.blocks;
            chunk.blocks = blocks;
        }
        Ok(())
    }
    // ANCHOR_END: plan_ahead

    fn newest_running_after(&self, i: usize) -> Option<usize> {
        (i + 1..self.seqs.len())
            .rev()
            .find(|&j| self.seqs[j].slot.is_some())
    }

    /// Blocks in `seqs[i]`'s block table.
    fn blocks_held(&self, i: usize) -> usize {
        let slot = self.seqs[i].slot;
        slot.and_then(|slot| self.kv.table(slot))
            .map_or(0, |t| t.blocks.len())
    }

    /// New blocks `seqs[i]` needs to add `n` tokens.
    fn blocks_for(&self, i: usize, n: usize) -> usize {
        let total = (self.seqs[i].n_kv + n).div_ceil(self.config.block_size);
        total.saturating_sub(self.blocks_held(i))
    }

    // ANCHOR: make_room
    /// Find blocks for up to `want` tokens of `seqs[i]` on top of what `plan` already takes:
    /// evict unused prefix-cache blocks, else shorten the chunk, else preempt the newest running
    /// request newer than `i`, else forget the prefix cache if it holds a block nobody uses.
    /// `None` when not even one token fits.
    fn make_room(
        &mut self,
        i: usize,
        want: usize,
        plan: &mut Vec<Chunk>,
        budget: &mut usize,
        report: &mut StepReport,
    ) -> Option<Chunk> {
        loop {
            let planned: usize = plan.iter().map(|c| c.blocks).sum();
            let free = self.kv.allocator.n_free() - planned;
            let need = self.blocks_for(i, want);
            if need <= free {
                return Some(Chunk {
                    seq: i,
                    n: want,
                    ahead: 0,
                    asked: false,
                    blocks: need,
                });
            }
            let evicted = self.prefix.evict(need - free, &mut self.kv.allocator);
            report.evicted += evicted;
            self.stats.evicted_blocks += evicted;
            if evicted > 0 {
                continue;
            }
            // What fits: the rest of its last block, and the free blocks.
            let room = (self.blocks_held(i) + free) * self.config.block_size - self.seqs[i].n_kv;
            if room > 0 {
                let n = room.min(want);
                return Some(Chunk {
                    seq: i,
                    n,
                    ahead: 0,
                    asked: false,
                    blocks: self.blocks_for(i, n),
                });
            }
            let Some(j) = self.newest_running_after(i) else {
                // Nobody newer to preempt. Eviction takes leaves, so a block only the tree
                // holds can still sit above blocks a running sequence uses (two requests with
                // the same beginning, admitted in one step, computed it twice, and the second
                // hung its later blocks below the first's). Such a block is freed only by
                // forgetting the cache; with a pool this short of blocks, that is the price.
                let alloc = &self.kv.allocator;
                if self.prefix.blocks().any(|b| alloc.ref_count(b) == 1) {
                    self.prefix.clear(&mut self.kv.allocator);
                    continue;
                }
                return None;
            };
            self.preempt(j, plan, budget, report);
        }
    }
    // ANCHOR_END: make_room

    // ANCHOR: admit
    /// Give `seqs[i]` a slot, starting its cache from the longest cached prefix of its tokens.
    /// At least one token is left to compute: the last one's logits are needed.
    fn admit(&mut self, i: usize, report: &mut StepReport) {
        let slot = self.free_slots.pop().expect("a free slot was checked for");
        let s = &self.seqs[i];
        let blocks = if self.config.prefix_cache {
            self.prefix
                .lookup(s.partition, &s.tokens[..s.tokens.len() - 1])
        } else {
            Vec::new()
        };
        let n = blocks.len() * self.config.block_size;
        self.kv
            .attach(slot, &blocks, n)
            .expect("slot is free and the blocks hold n positions");
        let s = &mut self.seqs[i];
        s.slot = Some(slot);
        s.n_kv = n;
        s.cached_tokens += n;
        self.stats.cached_tokens += n;
        report.admitted += 1;
    }
    // ANCHOR_END: admit

    /// Undo an admission that found no room this step.
    fn unadmit(&mut self, i: usize, report: &mut StepReport) {
        let s = &mut self.seqs[i];
        let slot = s.slot.take().expect("admitted");
        self.stats.cached_tokens -= s.n_kv;
        s.cached_tokens -= s.n_kv;
        s.n_kv = 0;
        self.kv.free(slot);
        self.free_slots.push(slot);
        report.admitted -= 1;
    }

    // ANCHOR: preempt
    /// Drop `seqs[i]`'s keys and values and send it back to waiting (in its arrival place).
    /// Its full blocks go to the prefix cache first, so recomputing it may be cheap.
    fn preempt(
        &mut self,
        i: usize,
        plan: &mut Vec<Chunk>,
        budget: &mut usize,
        report: &mut StepReport,
    ) {
        for c in plan.iter().filter(|c| c.seq == i) {
            *budget += c.n;
        }
        plan.retain(|c| c.seq != i);
        self.offer_to_prefix_cache(i);
        let s = &mut self.seqs[i];
        let slot = s.slot.take().expect("only running requests are preempted");
        s.n_kv = 0;
        s.preemptions += 1;
        self.kv.free(slot);
        self.free_slots.push(slot);
        self.stats.preemptions += 1;
        report.preempted += 1;
    }
    // ANCHOR_END: preempt

    /// Let the prefix cache keep the full blocks of `seqs[i]`'s computed tokens.
    fn offer_to_prefix_cache(&mut self, i: usize) {
        let s = &self.seqs[i];
        if !self.config.prefix_cache {
            return;
        }
        if let Some(table) = s.slot.and_then(|slot| self.kv.table(slot)) {
            let blocks = table.blocks.clone();
            self.prefix.insert(
                s.partition,
                &s.tokens[..s.n_kv],
                &blocks,
                &mut self.kv.allocator,
            );
        }
    }

    // ANCHOR: cancel
    /// End request `id` now, wherever it is: waiting, reading its prompt or decoding. Its slot
    /// and KV blocks are free before the next step (the full blocks it computed go to the
    /// prefix cache, as at any end). Returns its report, stopped as
    /// [`StopReason::Cancelled`] unless it had already stopped, or `None` if no unfinished
    /// request has that id.
    pub fn cancel(&mut self, id: RequestId) -> Option<Finished> {
        let i = self.seqs.iter().position(|s| s.id == id)?;
        let s = &mut self.seqs[i];
        s.out.stop.get_or_insert(StopReason::Cancelled);
        Some(self.retire(i))
    }
    // ANCHOR_END: cancel

    /// Remove finished requests, freeing their slots (their blocks go to the prefix cache).
    fn retire_finished(&mut self, report: &mut StepReport) {
        let mut i = 0;
        while i < self.seqs.len() {
            if self.seqs[i].out.stop.is_none() {
                i += 1;
                continue;
            }
            let done = self.retire(i);
            report.finished.push(done);
        }
    }

    /// Remove `seqs[i]`, freeing its slot (its blocks go to the prefix cache).
    fn retire(&mut self, i: usize) -> Finished {
        self.offer_to_prefix_cache(i);
        let s = self.seqs.remove(i);
        if let Some(slot) = s.slot {
            self.kv.free(slot);
            self.free_slots.push(slot);
        }
        let latency = s.submitted.elapsed();
        Finished {
            id: s.id,
            prompt_len: s.prompt_len,
            text: s.out.text().to_string(),
            stop: s.out.stop.unwrap_or(StopReason::MaxTokens),
            ids: s.out.ids,
            cached_tokens: s.cached_tokens,
            computed_tokens: s.computed_tokens,
            preemptions: s.preemptions,
            fed_ahead: s.fed_ahead,
            kept_ahead: s.kept_ahead,
            ttft: s.ttft.unwrap_or(latency),
            latency,
        }
    }
}
