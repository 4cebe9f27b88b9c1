//! The finished engine: load a model (mapped by default) with chapter 8's kernels, and run
//! every prompt through chapter 7's scheduler on a paged KV cache with its prefix cache — one
//! sequence is the simplest batch, and a conversation finds its earlier turns in the prefix
//! cache. The command line around it is chapter 4's.
//!
//! Files, one job each:
//! - `args.rs`: the settings, [`EngineArgs`] and [`LoadMode`];
//! - `files.rs`: how a model path becomes a GGUF image: [`ModelFiles`], [`Opened`], [`Image`]
//!   and [`GgufFiles`];
//! - `open.rs`: loading: [`Engine`] and [`Engine::open`];
//! - `progress.rs`: [`LoadProgress`], the loading line on a terminal;
//! - `memory.rs`: [`MemoryStats`] from `/proc/self/status`;
//! - `scheduled.rs`: [`Scheduled`], the runner on chapter 7's scheduler, and [`report_engine`];
//! - `run.rs`: the command line's entry points, [`run`], [`load`] and [`drive`];
//! - `gpu.rs`: `--gpu`, chapter 9's model driven one sequence at a time.

mod args;
mod files;
mod gpu;
mod memory;
mod open;
mod progress;
mod run;
mod scheduled;

pub use args::{EngineArgs, LoadMode};
pub use files::{GgufFiles, Image, ImageBytes, ModelFiles, Opened};
pub use memory::{MemoryStats, memory_stats};
pub use open::Engine;
pub use progress::{LoadProgress, PROGRESS_AFTER};
pub use run::{drive, load, run};
pub use scheduled::{BLOCK_SIZE, MAX_BATCH_TOKENS, Scheduled, report_engine};
