//! Chapter 16: speculative decoding — more than one token per pass over the weights, with the
//! same output.
//!
//! A decode step reads every weight to produce one token; when memory is the wall (chapter
//! 14), a pass over a few tokens costs little more than a pass over one. So guess the next
//! tokens cheaply, run the model once over the last token and the guesses, and keep every guess
//! the model would have produced itself, plus the model's own token after the last one kept.
//! What this chapter adds:
//! - [`propose`]: who guesses — the [`Proposer`] trait; [`PromptLookup`], which finds the last
//!   few tokens earlier in the prompt or the output and proposes what followed them (no second
//!   model); [`DraftModel`], a smaller model with the same vocabulary decoding greedily ahead;
//!   and [`DraftLength`], which shortens the guesses when they fail and lengthens them when
//!   they hold.
//! - [`speculate`](mod@speculate): chapter 4's generation loop with guesses checked in one
//!   batch (chapter 5's [`Cached::last_logits`]) and the cache rewound past a rejected one
//!   ([`Cached::rewind`]). Each token is sampled by chapter 4's [`Generator`] from the target
//!   model's own logits, exactly as without guesses, so the output is the same token for
//!   token — greedy or sampled with the same seed.
//! - [`cost`] and [`batched`]: guesses inside chapter 7's continuous batch, as each request's
//!   [`Lookahead`](ch07::Lookahead) ([`Guessed`]), cut to those expected to pay for their rows
//!   at what the recent steps cost.
//! - [`runner`]: the finished engine's runner with speculation (`llm-rs run --spec ngram`,
//!   `--spec draft --draft-model FILE`), reporting acceptance in `--json`.
//! - `serving` (feature `serve`): the same in the server (`llm-rs serve --spec ngram`): each request's own
//!   [`Adaptive`] prompt lookup, [`Guessed`] in chapter 7's scheduler, which checks guesses
//!   inside the continuous batch and truncates the paged cache past a wrong one; acceptance in each
//!   response's `usage` and in chapter 12's metrics.
//!
//! Left for later: a draft model in the server (one draft cache per request); tree-shaped
//! guesses and Medusa-style heads.

pub mod batched;
pub mod cost;
pub mod propose;
pub mod runner;
#[cfg(feature = "serve")]
pub mod serving;
pub mod speculate;

pub use batched::{Guessed, Steps};
pub use propose::{Adaptive, DraftLength, DraftModel, PromptLookup, Proposer};
pub use runner::{SpecKind, SpecRunner};
#[cfg(feature = "serve")]
pub use serving::LookupGuessing;
pub use speculate::{SpecStats, speculate};
