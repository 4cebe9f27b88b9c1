//! The finished engine of chapter 10: `cargo run --release -p ch10 --example engine --
//! [--model PATH] [PROMPT]`, or `--chat` for a conversation. `--help` lists the flags: chapter
//! 4's, and those of loading and the KV cache, turned into chapter 10's [`EngineArgs`].

/// Chapter 4's command line (the `generate` example's flags), which this one extends.
#[path = "../../ch04-forward/examples/common/generate_flags.rs"]
mod generate_flags;

use ch04::Architectures;
use ch05::{CacheTypes, RowType};
use ch06::cache::cache_row_type;
use ch10::GgufFiles;
use ch10::engine::{self, EngineArgs};
use ch10::mapped::PageAdvice;
use clap::{CommandFactory, Parser, ValueEnum};
use generate_flags::Generate;

/// Run a GGUF model: complete a prompt, or chat.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "engine",
    about = "Run a GGUF model: complete a prompt, or chat (--chat)."
)]
struct Engine {
    /// Chapter 4's flags: model, prompt, sampling, context size, --json.
    #[command(flatten)]
    generation: Generate,
    /// Read the file into memory instead of mapping it (llama.cpp's --no-mmap).
    #[arg(long)]
    no_mmap: bool,
    /// madvise hint for the mapped file (default: will-need when the weights are repacked,
    /// which reads every page at load; normal otherwise).
    #[arg(long, value_enum)]
    advice: Option<Advice>,
    /// Read every page of the file while mapping it (MAP_POPULATE), before the first token.
    #[arg(long)]
    populate: bool,
    /// Lock the model's pages in memory (mlock): read now, never evicted.
    #[arg(long)]
    mlock: bool,
    /// Keep every weight a view of the file: no repacking for chapter 8's micro-kernel, which
    /// by default interleaves the matrices where the CPU has one (faster products, but the
    /// packed weights are a private copy, no longer the mapped pages).
    #[arg(long)]
    no_repack: bool,
    /// Run the forward pass on a GPU (chapter 9), one sequence at a time: needs the engine
    /// built with the `gpu` feature.
    #[arg(long)]
    gpu: bool,
    /// What the KV cache keeps keys and values in.
    #[command(flatten)]
    cache: Cache,
}

/// `--cache-type-k`, `--cache-type-v`: llama.cpp's flags, names and default.
#[derive(clap::Args, Debug, Clone)]
struct Cache {
    /// Type of the keys in the KV cache: f32, f16 (half the memory, llama.cpp's default) or
    /// q8_0 (a little over a quarter). The GPU path keeps its own f32 cache.
    #[arg(long, default_value = "f16", value_parser = cache_row_type)]
    cache_type_k: RowType,
    /// Type of the values in the KV cache: f32, f16 or q8_0.
    #[arg(long, default_value = "f16", value_parser = cache_row_type)]
    cache_type_v: RowType,
}

impl Cache {
    fn types(&self) -> CacheTypes {
        CacheTypes {
            k: self.cache_type_k,
            v: self.cache_type_v,
        }
    }
}

/// `--advice`: chapter 10's [`PageAdvice`], by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Advice {
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
    fn args(&self, archs: Architectures) -> EngineArgs {
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

fn main() {
    let mut args = Engine::parse().args(ch04::architectures());
    if let Err(e) = ch04::cli::check(&args.generation) {
        Engine::command()
            .error(
                clap::error::ErrorKind::MissingRequiredArgument,
                e.to_string(),
            )
            .exit();
    }
    generate_flags::default_model(&mut args.generation);
    if let Err(e) = engine::run(&args) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
