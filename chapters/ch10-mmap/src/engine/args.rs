//! The engine's settings: [`EngineArgs`] (chapter 4's settings plus how this chapter loads the
//! model) and [`LoadMode`], how the weights get from the file into the engine.

use super::{GgufFiles, ModelFiles};
use crate::mapped::{MapOptions, PageAdvice};
use ch04::Architectures;
use ch04::cli::Args;
use ch05::CacheTypes;
use ch08::{FastLoader, PoolKind, new_pool};
use std::sync::Arc;

// ANCHOR: args
/// What the engine is asked to do: chapter 4's settings, and how the model loads.
#[derive(Debug, Clone)]
pub struct EngineArgs {
    /// Chapter 4's settings: model, prompt, sampling, context size, `--json`.
    pub generation: Args,
    /// Read the file into memory instead of mapping it (llama.cpp's `--no-mmap`).
    pub no_mmap: bool,
    /// `madvise` hint for the mapped file; `None` chooses: `WillNeed` when the matrices are
    /// repacked (the load reads every page anyway, and reading ahead of the packer made a cold
    /// 8B load 1.7× faster), no hint otherwise.
    pub advice: Option<PageAdvice>,
    /// Read every page of the file while mapping it (`MAP_POPULATE`), before the first token.
    pub populate: bool,
    /// Lock the model's pages in memory (`mlock`): read now, never evicted.
    pub mlock: bool,
    /// Keep every weight a view of the file: no repacking for chapter 8's micro-kernel, which
    /// by default interleaves the matrices where the CPU has one (faster products, but the
    /// packed weights are a private copy, no longer the mapped pages).
    pub no_repack: bool,
    /// Run the forward pass on a GPU (chapter 9), one sequence at a time: needs the engine
    /// built with the `gpu` feature.
    pub gpu: bool,
    /// The architectures the engine loads: chapter 4's, unless a later chapter hands in a
    /// bigger set.
    pub archs: Architectures,
    /// What the KV cache keeps keys and values in (chapter 5's f32 or f16, chapter 6's Q8_0;
    /// llama.cpp's `--cache-type-k`, `--cache-type-v`). The GPU path keeps its own f32 cache.
    pub cache: CacheTypes,
    /// How `--model PATH` becomes the GGUF image the engine loads: GGUF files ([`GgufFiles`]),
    /// unless a later chapter hands in a value that reads other formats too.
    pub files: Arc<dyn ModelFiles>,
}
// ANCHOR_END: args

/// How the weights get from the file into the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadMode {
    /// Memory-map the file; the matrices view the mapped pages.
    Map(MapOptions),
    /// Read the whole file into memory once; the matrices view that copy.
    Read,
}

impl EngineArgs {
    /// The engine with chapter 4's settings `generation`, mapping the file and repacking its
    /// matrices, for chapter 4's architectures.
    pub fn new(generation: Args) -> EngineArgs {
        EngineArgs {
            generation,
            no_mmap: false,
            advice: None,
            populate: false,
            mlock: false,
            no_repack: false,
            gpu: false,
            archs: ch04::architectures(),
            cache: CacheTypes::F32,
            files: Arc::new(GgufFiles),
        }
    }

    /// Chapter 8's matrices, on `--threads` threads, repacked unless `--no-repack`.
    pub fn fast_loader(&self) -> FastLoader {
        let mut fast = FastLoader::new(new_pool(PoolKind::Spin, self.generation.threads()));
        fast.pack = !self.no_repack;
        fast
    }

    /// Whether the matrices will be repacked: not `--no-repack`, and the CPU has chapter 8's
    /// micro-kernel.
    pub fn repacks(&self) -> bool {
        !self.no_repack && ch08::fast_matrix::packs(&ch08::kernels::KernelSet::detect())
    }

    pub fn load_mode(&self) -> LoadMode {
        if self.no_mmap {
            LoadMode::Read
        } else {
            let chosen = if self.repacks() {
                PageAdvice::WillNeed
            } else {
                PageAdvice::Normal
            };
            LoadMode::Map(MapOptions {
                advice: self.advice.unwrap_or(chosen),
                populate: self.populate,
                lock: self.mlock,
            })
        }
    }
}
