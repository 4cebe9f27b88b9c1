//! Chapter 10's command line: chapter 4's flags and those of loading and the KV cache, turned
//! into chapter 10's [`EngineArgs`]. The `engine` example parses them; the finished engine's
//! `llm-rs run` adds its own to them. Both include this file (`#[path = …] mod engine_flags;`),
//! so the flags are declared once.

// Not every program that includes this file uses each of its items.
#![allow(dead_code)]

/// Chapter 4's command line (the `generate` example's flags), which this one extends.
#[path = "../../../ch04-forward/examples/common/generate_flags.rs"]
pub mod generate_flags;

use ch04::Architectures;
use ch05::{CacheTypes, RowType};
use ch06::cache::cache_row_type;
use ch10::GgufFiles;
use ch10::engine::EngineArgs;
use ch10::mapped::PageAdvice;
use clap::{Parser, ValueEnum};
use generate_flags::Generate;

/// Run a GGUF model: complete a prompt, or chat.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "engine",
    about = "Run a GGUF model: complete a prompt, or chat (--chat)."
)]
pub struct Engine {
    /// Chapter 4's flags: model, prompt, sampling, context size, --json.
    #[command(flatten)]
    pub generation: Generate,
    /// Read the file into memory instead of mapping it (llama.cpp's --no-mmap).
    #[arg(long)]
    pub no_mmap: bool,
    /// madvise hint for the mapped file (default: will-need when the weights are repacked,
    /// which reads every page at load; normal otherwise).
    #[arg(long, value_enum)]
    pub advice: Option<Advice>,
    /// Read every page of the file while mapping it (MAP_POPULATE), before the first token.
    #[arg(long)]
    pub populate: bool,
    /// Lock the model's pages in memory (mlock): read now, never evicted.
    #[arg(long)]
    pub mlock: bool,
    /// Keep every weight a view of the file: no repacking for chapter 8's micro-kernel, which
    /// by default interleaves the matrices where the CPU has one (faster products, but the
    /// packed weights are a private copy, no longer the mapped pages).
    #[arg(long)]
    pub no_repack: bool,
    /// Run the forward pass on a GPU (chapter 9), one sequence at a time: needs the engine
    /// built with the `gpu` feature.
    #[arg(long)]
    pub gpu: bool,
    /// What the KV cache keeps keys and values in.
    #[command(flatten)]
    pub cache: Cache,
}

/// `--cache-type-k`, `--cache-type-v`: llama.cpp's flags, names and default.
#[derive(clap::Args, Debug, Clone)]
pub struct Cache {
    /// Type of the keys in the KV cache: f32, f16 (half the memory, llama.cpp's default) or
    /// q8_0 (a little over a quarter). The GPU path keeps its own f32 cache.
    #[arg(long, default_value = "f16", value_parser = cache_row_type)]
    pub cache_type_k: RowType,
    /// Type of the values in the KV cache: f32, f16 or q8_0.
    #[arg(long, default_value = "f16", value_parser = cache_row_type)]
    pub cache_type_v: RowType,
}

impl Cache {
    pub fn types(&self) -> CacheTypes {
        CacheTypes {
            k: self.cache_type_k,
            v: self.cache_type_v,
        }
    }
}

/// `--advice`: chapter 10's [`PageAdvice`], by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Advice {
    /// No hint: pages are read as they are first touched.
    Normal,
    /// MADV_WILLNEED: start reading the whole file in the background now.
    WillNeed,
    /// MADV_SEQUENTIAL: aggressive readahead, pages dropped soon after use.
    Sequential,
    /// MADV_RANDOM: no readahead; every fault reads one page.
    Random,
}

impl From<Advice> for PageAdvice {
    fn from(a: Advice) -> PageAdvice {
        match a {
            Advice::Normal => PageAdvice::Normal,
            Advice::WillNeed => PageAdvice::WillNeed,
            Advice::Sequential => PageAdvice::Sequential,
            Advice::Random => PageAdvice::Random,
        }
    }
}

impl Engine {
    /// The settings these flags give, for the architectures `archs`.
    pub fn args(&self, archs: Architectures) -> EngineArgs {
        EngineArgs {
            generation: self.generation.args(),
            no_mmap: self.no_mmap,
            advice: self.advice.map(Into::into),
            populate: self.populate,
            mlock: self.mlock,
            no_repack: self.no_repack,
            gpu: self.gpu,
            archs,
            cache: self.cache.types(),
            files: std::sync::Arc::new(GgufFiles),
        }
    }
}
