//! Chapter 10's engine: chapter 4's flags and the loading ones, turned into chapter 10's
//! [`EngineArgs`].

use crate::generate::Generate;
use ch04::Architectures;
use ch05::{CacheTypes, RowType};
use ch06::cache::cache_row_type;
use ch10::engine::{self, EngineArgs};
use ch10::mapped::PageAdvice;
use clap::{CommandFactory, Parser, ValueEnum};
use std::ffi::OsString;

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
            files: std::sync::Arc::new(ch10::GgufFiles),
        }
    }
}

/// The engine's `main`: parse the flags, check them, run with the architectures `archs`, and
/// exit with an error message on failure. A later chapter's program calls it with its own set.
pub fn main(archs: Architectures) {
    main_from(std::env::args_os().collect(), archs)
}

/// [`main`] on the command line `argv` (its first item the program's name).
pub fn main_from(argv: Vec<OsString>, archs: Architectures) {
    let args = Engine::parse_from(argv).args(archs);
    if let Err(e) = ch04::cli::check(&args.generation) {
        Engine::command()
            .error(
                clap::error::ErrorKind::MissingRequiredArgument,
                e.to_string(),
            )
            .exit();
    }
    if let Err(e) = engine::run(&args) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
