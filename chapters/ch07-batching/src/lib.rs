//! Chapter 7: batching — many requests through one forward pass.
//!
//! Chapter 4's forward pass already takes a batch of tokens from several sequences, and
//! chapter 5's paged cache already holds many sequences in one pool of blocks. This chapter
//! puts them to work for many users at once:
//! - [`scheduler`]: continuous batching. Requests arrive and finish between steps; each step
//!   packs one decode token per running request and chunks of prompts up to a token budget into
//!   one batch, runs the model once, and streams every request's text. It documents and tests
//!   its policy for fairness (oldest first, decodes before prompt chunks, no starvation) and for
//!   running out of KV blocks (evict the prefix cache, shorten the chunk, preempt the newest
//!   request and recompute it later).
//! - [`prefix`]: a prefix cache in the spirit of RadixAttention, a radix tree over token ids
//!   whose edges own KV blocks, shared with running sequences through the block allocator's
//!   reference counts and evicted least recently used first.
//! - [`lookahead`]: tokens a decoding request feeds after its decode token in the same step,
//!   each with its row, kept while they equal what the model samples — [`Known`], a
//!   continuation the caller already has, replayed in a few steps.
//! - [`request`]: a request and the report of a finished request; its sampler, streaming
//!   decoder and stop-string filter are chapter 4's `Generator`, one per request.
//! - [`throughput`]: the measurement behind the chapter's table: the same prompts batched and
//!   one at a time.
//!
//! The scheduler runs any [`BatchModel`]: here chapter 6's scalar kernels, and from chapter 10
//! on chapter 10's engine's (chapter 8's kernels over mapped weights), which runs even a single
//! prompt through it. Requests come from a loop in the same process; chapter 11 puts a network
//! in front.

pub mod lookahead;
pub mod prefix;
pub mod request;
pub mod scheduler;
pub mod throughput;

pub use lookahead::{Known, Lookahead, StepRows};
pub use prefix::PrefixCache;
pub use request::{Finished, Request, RequestId};
pub use scheduler::{
    BatchModel, Scheduler, SchedulerConfig, SchedulerError, Sink, Stats, StepReport, Submit,
};
