//! Chapter 10: memory-mapped loading, and the engine the later chapters extend.
//!
//! Until now every chapter read the model file into a `Vec<u8>` and copied each weight out of
//! it: the weights existed twice while loading, and every run paid a full read before its first
//! token. This chapter maps the file instead and lets the matrices point into the map, so the
//! weights are the page cache's own pages — loaded in milliseconds, read from disk only as they
//! are touched, shared by every process that runs the same file, and still there for the next
//! run. Then it puts the chapters together into the engine's command line.
//!
//! Modules:
//! - [`mapped`]: [`SharedBytes`] (a range of a shared buffer that keeps it alive; a
//!   [`MappedBytes`] when the buffer is a memory map), [`map_gguf`] with its page-cache hints
//!   ([`MapOptions`]: `madvise`, populate, `mlock`), [`read_gguf`] for the `--no-mmap` path,
//!   and the safety contract of mapping a file: [`MappedFile`] remembers the file's size and
//!   modification time ([`MappedFile::check_unchanged`] → [`FileChanged`]), and on Linux a
//!   read past the end of a file truncated while mapped ends the process with a message;
//! - [`loader`]: [`ViewLoader`] (a [`MappedLoader`] over a map), the `MatrixLoader` that makes
//!   chapter 8's fast matrices over views of the file, copying only a tensor whose bytes are
//!   not aligned for its blocks;
//! - [`engine`]: [`Engine`] (model, tokenizer and template, loaded one way or another),
//!   [`EngineArgs`] (chapter 4's settings plus this chapter's), [`Scheduled`] (chapter 4's
//!   `Runner` on chapter 7's scheduler, paged cache and prefix cache) and [`engine::run`];
//!   [`ModelFiles`], how a model path becomes a GGUF image ([`GgufFiles`] here; a later
//!   chapter reads other formats through it).
//!
//! The `engine` example is the engine, the sum of the chapters so far: chapter 4's
//! command line, chapter 7's scheduler with the paged and prefix caches, chapter 8's kernels
//! (repacked by default where the CPU has the micro-kernel) and this chapter's mapped file:
//! `cargo run --release -p ch10 --example engine -- [--model PATH] [PROMPT]`, or `--chat`.
//! Built with the `gpu` feature, `--gpu` runs chapter 9's GPU model instead, one sequence at a
//! time.
//!
//! Left for later: a server in front of the scheduler, more model architectures than llama
//! (handed in as a bigger set of chapter 4's architectures), the scheduler's batches on the
//! GPU, and loading tensors straight from disk into device memory.

pub mod engine;
pub mod loader;
pub mod mapped;

pub use engine::{
    Engine, EngineArgs, GgufFiles, Image, ImageBytes, LoadMode, LoadProgress, MemoryStats,
    ModelFiles, Opened, Scheduled, memory_stats,
};
pub use loader::{MappedLoader, TensorBytes, ViewLoader, block_align};
pub use mapped::{
    AlignedBuf, FileChanged, MapOptions, MappedBytes, MappedFile, OpenError, PageAdvice, ReadBytes,
    ReleasePages, SharedBytes, held_gguf, map_gguf, read_gguf,
};
