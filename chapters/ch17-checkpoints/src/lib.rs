//! Chapter 17: Hugging Face checkpoints — a safetensors model directory run directly, or
//! converted to GGUF.
//!
//! Most models are published as Hugging Face directories, not GGUF files: `config.json` (the
//! hyperparameters), one or more `*.safetensors` files (the weights, with
//! `model.safetensors.index.json` saying which shard holds which tensor), `tokenizer.json` (the
//! whole tokenizer pipeline) and `tokenizer_config.json` (special tokens, the chat template).
//! llama.cpp converts them with `convert_hf_to_gguf.py`; this chapter does the same work in the
//! engine, so `llm-rs run --model DIR` runs a directory, and `llm-rs convert DIR OUT.gguf`
//! writes the tensors llama.cpp's converter writes, bit for bit, with its metadata but for the
//! few keys the tests list with their reasons. What it adds:
//!
//! - [`files`]: reading the directory — the JSON files (bounded), and each shard memory-mapped
//!   with its safetensors header checked by Hugging Face's own reader ([`Shard`]);
//! - [`family`]: what the formats disagree on, per architecture, as values ([`Family`]):
//!   `config.json`'s names for chapter 1's metadata keys, Hugging Face's tensor names for
//!   llama.cpp's, the rows of the query and key projections (llama.cpp's RoPE pairs adjacent
//!   values, Hugging Face's rotates halves: [`family::permute_rows`]), Gemma's norm weights
//!   (stored minus one), Llama 3's RoPE factors (a tensor llama.cpp computes from the config);
//! - [`vocab`]: `tokenizer.json` and `tokenizer_config.json` turned into chapter 2's GGUF
//!   tokenizer keys — the pre-tokenizer's regexes matched against chapter 2's table, merges,
//!   token types, special tokens, the chat template — so chapter 2's tokenizers run it;
//! - [`convert`]: the GGUF file the checkpoint makes ([`Checkpoint::plan`]): each tensor's
//!   type kept (F32, F16, BF16) or chosen by chapter 6's recipe for a file type
//!   (`--quantize Q4_K_M`), and its bytes ([`Checkpoint::tensor_data`]); written to disk
//!   ([`Checkpoint::write_gguf`]) or built in memory ([`Checkpoint::image`]);
//! - `assemble` (Unix): the image without copying the weights — the shards mapped side by side
//!   in one range of addresses after a little private memory for what the conversion writes,
//!   the header pointing into them;
//! - [`open`]: chapter 10's [`ModelFiles`](ch10::ModelFiles) for the finished engine
//!   ([`Checkpoints`]): a directory (or its `config.json`) becomes that image (or, with
//!   `--no-mmap` or off Unix, the converted file built in memory); a GGUF file opens as before.
//!
//! Left for later: Unigram and WordPiece `tokenizer.json` models; tokenizers
//! with normalizers other than SentencePiece's space escaping; families other than llama,
//! Qwen2 and Gemma 3.

#[cfg(unix)]
pub mod assemble;
pub mod convert;
pub mod family;
pub mod files;
pub mod open;
pub mod vocab;

pub use convert::Precision;
pub use family::{FAMILIES, Family};
pub use files::{Checkpoint, CheckpointError, Shard};
pub use open::Checkpoints;
