//! Support for every chapter that is not itself a lesson.
//!
//! - [`model`]: where the default model lives, and fetching it on first need.
//! - [`refdata`]: reading what llama.cpp computed (`reference-data/`), with a hint on how to
//!   regenerate it when it is missing or stale.
//! - [`alloc`]: a counting global allocator, for tests that a hot path allocates nothing.
//! - [`memory`]: sizes multiplied without overflow and checked against the machine's memory
//!   before anything is allocated.
//! - [`compare`]: the one tensor comparison helper that every check against llama.cpp goes
//!   through, with named tolerances and a report that says where two tensors diverge.

pub mod alloc;
pub mod compare;
pub mod memory;
pub mod model;
pub mod refdata;

pub use compare::{Tolerance, assert_close, compare};
pub use model::{
    DEFAULT_MODEL, GEMMA3_MODEL, ModelSpec, WheelPart, cache_dir, default_model_path, ensure_cached,
};
