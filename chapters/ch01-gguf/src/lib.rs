//! Chapter 1: read a GGUF file and build the model configuration.
//!
//! A GGUF file holds everything llama.cpp needs to run a model: hyperparameters and the
//! tokenizer as key-value metadata, then every weight tensor, described by name, shape and
//! ggml type, and stored (often quantized) in an aligned data section. This chapter parses that
//! file, without trusting any length or count in it, and turns the metadata into a [`Config`].
//!
//! Modules:
//! - [`ggml_type`]: ggml's tensor types, their ids, block sizes and bytes per block;
//! - [`gguf`]: the parser ([`Gguf::parse`]), metadata [`Value`]s, [`TensorInfo`], and
//!   [`GgufFile`], which keeps the file's bytes to hand out each tensor's data;
//! - [`dequant`]: converting F32, F16, BF16, Q8_0 and Q4_1 data to f32, the plain way;
//! - [`config`]: the model's hyperparameters ([`Config`]) from the metadata;
//! - [`inspect`]: what a file holds, as text (the `inspect` example prints it).
//!
//! Left for later: the tokenizer (chapter 2) reads its vocabulary from the metadata parsed
//! here; quantized blocks as real types and dot products on them come in chapter 6; reading
//! the file through a memory map instead of into a `Vec` in chapter 10 (a `GgufFile<Mmap>`).

pub mod config;
pub mod dequant;
pub mod ggml_type;
pub mod gguf;
pub mod inspect;

pub use config::Config;
pub use ggml_type::GgmlType;
pub use gguf::{Gguf, GgufError, GgufFile, TensorInfo, Value};
