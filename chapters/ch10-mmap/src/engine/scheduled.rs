//! The engine's runner: [`Scheduled`], chapter 4's `Runner` on chapter 7's scheduler with its
//! paged cache ([`BLOCK_SIZE`]) and prefix cache, and [`report_engine`], the engine's fields of
//! the `--json` report.

use super::{Engine, LoadMode, memory_stats};
use ch04::cli::{ContextFull, Report, Runner};
use ch04::{GenParams, Generation, Model, StopReason};
use ch05::CacheTypes;
use ch07::{Finished, Request, RequestId, Scheduler, SchedulerConfig, Sink};
use std::error::Error;

// ANCHOR: scheduled
/// Positions per block of the paged KV cache (vLLM's default). The prefix cache keeps whole
/// blocks, so a conversation recomputes at most 15 positions of its prefix per turn; attention
/// reads keys in runs that end at a block's end, which measured no slower than 64-position
/// blocks or chapter 5's contiguous cache (900-token prompt, 100 tokens, 2 threads).
pub const BLOCK_SIZE: usize = 16;

/// Most tokens in one forward pass: a prompt is computed in chunks of this many (chunked
/// prefill), as chapter 5's sessions do.
pub const MAX_BATCH_TOKENS: usize = 256;

/// The engine's [`Runner`]: every prompt is a request to chapter 7's scheduler, whose paged
/// cache holds `n_ctx` positions and whose prefix cache keeps what earlier prompts computed.
pub struct Scheduled<'m> {
    pub scheduler: Scheduler<'m, Model>,
    pub n_ctx: usize,
    engine: &'m Engine,
}
// ANCHOR_END: scheduled

// ANCHOR: scheduled_new
impl<'m> Scheduled<'m> {
    /// A scheduler over `engine`'s model with room for `n_ctx` positions, at most the
    /// model's run context ([`Model::n_ctx`], which `--ctx` sets), running up to `parallel`
    /// requests at once.
    pub fn new(engine: &'m Engine, n_ctx: usize, parallel: usize) -> Result<Self, Box<dyn Error>> {
        Self::with_cache(engine, n_ctx, parallel, CacheTypes::F32)
    }

    /// [`Scheduled::new`] with the cache keeping keys and values in `cache`.
    pub fn with_cache(
        engine: &'m Engine,
        n_ctx: usize,
        parallel: usize,
        cache: CacheTypes,
    ) -> Result<Self, Box<dyn Error>> {
        let model_ctx = engine.model.n_ctx();
        if n_ctx == 0 || n_ctx > model_ctx {
            return Err(format!(
                "a pool of {n_ctx} positions: it must be between 1 and the model's run context \
                 of {model_ctx} positions"
            )
            .into());
        }
        let config = SchedulerConfig {
            max_batch_tokens: MAX_BATCH_TOKENS.max(parallel),
            max_running: parallel.max(1),
            block_size: BLOCK_SIZE,
            n_blocks: n_ctx.div_ceil(BLOCK_SIZE),
            prefix_cache: true,
            cache,
        };
        Ok(Scheduled {
            scheduler: Scheduler::new(&engine.model, &engine.tokenizer, config)?,
            n_ctx,
            engine,
        })
    }
}
// ANCHOR_END: scheduled_new

// ANCHOR: one_request
/// Streams the text of one request.
struct OneRequest<'f> {
    id: RequestId,
    on_text: &'f mut dyn FnMut(&str),
}

impl Sink for OneRequest<'_> {
    fn text(&mut self, id: RequestId, text: &str) {
        if id == self.id {
            (self.on_text)(text)
        }
    }
}
// ANCHOR_END: one_request

// ANCHOR: generate
impl Runner for Scheduled<'_> {
    fn generate(
        &mut self,
        prompt: &[u32],
        params: &GenParams,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Generation, Box<dyn Error>> {
        let n_ctx = self.n_ctx;
        if prompt.len() > n_ctx {
            return Err(ContextFull {
                prompt: prompt.len(),
                n_ctx,
            }
            .into());
        }
        // Generation stops when the context is full: the last token takes no position.
        let mut params = params.clone();
        let requested = params.max_tokens;
        params.max_tokens = params.max_tokens.min(n_ctx - prompt.len() + 1);
        let capped = params.max_tokens < requested;
        let id = self.scheduler.submit(Request {
            prompt: prompt.to_vec(),
            params,
        })?;
        let mut sink = OneRequest { id, on_text };
        let done: Finished = loop {
            let mut report = self
                .scheduler
                .step(&mut sink)
                .map_err(|e| self.engine.explain_step(e))?;
            if let Some(i) = report.finished.iter().position(|f| f.id == id) {
                break report.finished.swap_remove(i);
            }
        };
        let stop = match done.stop {
            StopReason::MaxTokens if capped => StopReason::ContextFull,
            stop => stop,
        };
        Ok(Generation {
            prompt_ids: prompt.to_vec(),
            text: done.text,
            stop,
            reused: done.cached_tokens.min(prompt.len()),
            prefill: done.ttft,
            decode: done.latency.saturating_sub(done.ttft),
            decode_calls: done.ids.len().saturating_sub(1),
            ids: done.ids,
        })
    }
    // ANCHOR_END: generate

    // ANCHOR: report
    fn report(&self, report: &mut Report) {
        report_engine(self.engine, report);
    }
}

/// The engine's fields of the `--json` report: how the weights were loaded, and the
/// process's memory.
pub fn report_engine(engine: &Engine, report: &mut Report) {
    let loader = match engine.mode {
        LoadMode::Map(_) => "mmap",
        LoadMode::Read => "read",
    };
    report.add("loader", loader);
    report.add("repacked", engine.repacked);
    let memory = memory_stats().map(|m| {
        let mut r = Report::default();
        r.add("peak_rss_kib", m.peak_rss)
            .add("rss_kib", m.rss)
            .add("rss_anon_kib", m.rss_anon)
            .add("rss_file_kib", m.rss_file);
        r
    });
    report.add("memory", memory);
}
// ANCHOR_END: report
