//! What only the tests use: a dev-dependency of every chapter, never compiled into the engine.
//!
//! - [`refdata`]: reading what llama.cpp computed (`reference-data/`), with a hint on how to
//!   regenerate it when it is missing or stale.
//! - [`compare`]: the one tensor comparison helper that every check against llama.cpp goes
//!   through, with named tolerances and a report that says where two tensors diverge; and
//!   [`assert_same_sequence`], for lists that must be equal (token ids), which says where two
//!   lists first differ.
//! - [`alloc`]: a counting global allocator, for tests that a hot path allocates nothing.
//! - [`isa`]: whether a test whose subject needs an instruction set (chapter 8's SIMD
//!   kernels) can run here; a missing one fails unless `LLM_RS_ALLOW_MISSING_ISA` is set.
//! - [`program`]: a chapter's example or the `llm-rs` binary, built for a test that runs it.
//! - [`python`]: `python3` with OpenAI's client (`openai`, pinned), installed on first use.
//! - [`serve`]: a server program started on a free port for a test, killed when it ends.

pub mod alloc;
pub mod compare;
pub mod isa;
pub mod program;
pub mod python;
pub mod refdata;
pub mod serve;

pub use compare::{Tolerance, assert_close, assert_same_sequence, compare, sequence_mismatch};
pub use program::{Target, json_printed, llm_rs_run, program};

/// How far our hidden states (each layer's output) may be from llama.cpp's on the f32 path
/// (chapter 4's check, and every later one on the f32 path). Both sides compute in f32 but sum
/// in different orders, and each layer passes its rounding on to the next. The residual stream
/// holds values up to 20,000 (relative error about 4e-7 there) and values near zero left after
/// terms of several hundred cancel, whose error is absolute: f32's 6e-8 of those terms, grown
/// over 30 layers, is observed up to 1.6e-4. A wrong norm, activation or residual connection is
/// off by whole units.
pub const HIDDEN_TOL: Tolerance = Tolerance::new(1e-3, 1e-4);
