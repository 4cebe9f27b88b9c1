//! The command lines of the chapters' programs.
//!
//! Each chapter's library takes its settings as a plain value — chapter 4's
//! [`Args`](ch04::cli::Args), chapter 10's `EngineArgs`, chapter 11's `ServeArgs`, chapter 12's
//! `Args` — and knows nothing of flags. This crate is where the flags are: their names
//! (llama.cpp's where it has them), help texts and defaults, parsed with clap and turned into
//! those values, and the `main` of each program. Only programs depend on it: the chapters'
//! examples (as a dev-dependency) and the `llm-rs` binary.
//!
//! - [`generate`]: chapter 4's flags, which every `generate` example of chapters 4–8 takes;
//! - `engine` (feature `engine`): chapter 10's engine, those flags and the loading ones;
//! - `server` (feature `server`): chapter 11's OpenAI server;
//! - `production` (feature `production`): chapter 12's server, every flag also from the
//!   environment and a TOML file (`settings`);
//! - `scaling` (feature `scaling`): chapter 14's engine, chapter 10's flags and `--mem-budget`;
//! - `structured` (feature `structured`): chapter 15's engine, with `--grammar`,
//!   `--grammar-file`, `--json-schema` and `--json-schema-file`;
//! - `speculative` (feature `speculative`): chapter 16's engine, with `--spec`,
//!   `--draft-model` and `--draft-max`;
//! - `checkpoints` (feature `checkpoints`): chapter 17's engine and server, whose `--model`
//!   may name a Hugging Face directory, with `--quantize`.

#[cfg(feature = "checkpoints")]
pub mod checkpoints;
pub mod generate;

#[cfg(feature = "engine")]
pub mod engine;
#[cfg(feature = "production")]
pub mod production;
#[cfg(feature = "scaling")]
pub mod scaling;
#[cfg(feature = "server")]
pub mod server;
#[cfg(feature = "production")]
pub mod settings;
#[cfg(feature = "speculative")]
pub mod speculative;
#[cfg(feature = "structured")]
pub mod structured;

pub use ch04::cli::default_threads;
