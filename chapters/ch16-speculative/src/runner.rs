//! The finished engine's runner with speculation: `llm-rs run --spec ngram` (prompt lookup) or
//! `--spec draft --draft-model FILE`, one sequence on chapter 5's contiguous cache. `llm-rs
//! run` checks the flags ([`check`]), opens the draft model ([`open_draft`]) and builds a
//! [`SpecRunner`] with its [`proposer`].

use crate::propose::Proposer;
use crate::propose::{DraftLength, DraftModel, PromptLookup};
use crate::speculate::{SpecStats, speculate};
use ch04::cli::{ContextFull, Report, Runner};
use ch04::{ForwardError, GenParams, Generation};
use ch05::{Cached, ContiguousCache};
use ch08::FastLoader;
use ch10::engine::{self, Engine, EngineArgs, report_engine};
use std::error::Error;
use std::path::Path;

/// Who guesses: `--spec`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecKind {
    /// No speculation: chapter 14's engine, every request through chapter 7's scheduler.
    None,
    /// Prompt lookup ([`PromptLookup`]).
    Ngram,
    /// A draft model ([`DraftModel`], `--draft-model`).
    Draft,
}

impl SpecKind {
    pub fn name(self) -> &'static str {
        match self {
            SpecKind::None => "none",
            SpecKind::Ngram => "ngram",
            SpecKind::Draft => "draft",
        }
    }
}

/// Guesses checked per pass at most, by default. Longer than llama.cpp's default of 3: the
/// guess length adapts ([`DraftLength`]), so a long maximum costs little where guesses fail,
/// and lets a long copy go in few passes.
pub const DRAFT_MAX: usize = 16;

// ANCHOR: runner
/// Chapter 4's [`Runner`] with guesses: [`speculate`] on a contiguous cache of the model's run
/// context. A conversation's turns share their beginning: the cache keeps it and each turn
/// computes only what is new.
pub struct SpecRunner<'e> {
    engine: &'e Engine,
    session: Cached<'e, ContiguousCache>,
    /// The tokens in the cache (the last prompt and what was generated from it).
    cached: Vec<u32>,
    proposer: Box<dyn Proposer + 'e>,
    kind: SpecKind,
    draft_max: usize,
    /// How the guesses of the last generation fared.
    pub stats: SpecStats,
    /// Say so on standard error after each generation (not with `--json`, which reports it).
    pub announce: bool,
}

impl<'e> SpecRunner<'e> {
    /// A runner over `engine`'s model with a cache of its run context, in `cache` types.
    pub fn new(
        engine: &'e Engine,
        proposer: Box<dyn Proposer + 'e>,
        kind: SpecKind,
        draft_max: usize,
        cache: ch05::CacheTypes,
    ) -> Result<SpecRunner<'e>, Box<dyn Error>> {
        let model = &engine.model;
        let kv = ContiguousCache::for_model_typed(model, model.n_ctx(), cache)?;
        Ok(SpecRunner {
            engine,
            session: Cached::new(model, kv, engine::MAX_BATCH_TOKENS),
            cached: Vec::new(),
            proposer,
            kind,
            draft_max,
            stats: SpecStats::default(),
            announce: false,
        })
    }
}

// ANCHOR_END: runner

// ANCHOR: runner_generate
impl Runner for SpecRunner<'_> {
    fn generate(
        &mut self,
        prompt: &[u32],
        params: &GenParams,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Generation, Box<dyn Error>> {
        let n_ctx = self.session.kv.capacity();
        if prompt.is_empty() {
            return Err("the prompt has no tokens: there is nothing to predict from".into());
        }
        if prompt.len() > n_ctx {
            return Err(ContextFull {
                prompt: prompt.len(),
                n_ctx,
            }
            .into());
        }
        let shared = self.cached.iter().zip(prompt).take_while(|(a, b)| a == b);
        self.session.rewind(shared.count());
        let mut length = DraftLength::new(self.draft_max);
        let (generation, stats) = speculate(
            &mut self.session,
            &mut *self.proposer,
            &mut length,
            &self.engine.tokenizer,
            prompt,
            params,
            on_text,
        )
        .map_err(|e| match e {
            ForwardError::NonFinite(e) => e.locate(&self.engine.model).to_string().into(),
            e => self.engine.explain(e.into()),
        })?;
        self.cached.clear();
        self.cached.extend_from_slice(prompt);
        self.cached.extend_from_slice(&generation.ids);
        self.cached.truncate(self.session.n_past);
        self.stats = stats;
        if self.announce {
            eprintln!(
                "\nspeculative ({}): {} tokens in {} passes after the prompt's ({:.2} per pass), \
                 {} of {} guesses held",
                self.kind.name(),
                generation.ids.len(),
                stats.passes,
                stats.tokens_per_pass(),
                stats.accepted,
                stats.proposed
            );
        }
        Ok(generation)
    }
    // ANCHOR_END: runner_generate

    fn report(&self, report: &mut Report) {
        report_engine(self.engine, report);
        let s = &self.stats;
        let mut spec = Report::default();
        spec.add("kind", self.kind.name())
            .add("draft_max", self.draft_max)
            .add("passes", s.passes)
            .add("proposed", s.proposed)
            .add("accepted", s.accepted)
            .add("acceptance", s.acceptance())
            .add("tokens_per_pass", s.tokens_per_pass());
        report.add("speculative", spec);
    }
}

// ANCHOR: run
/// What `--spec` needs, checked before anything loads: the CPU, at least one guess per pass,
/// and a draft model for `draft` (and only for it).
pub fn check(
    spec: SpecKind,
    gpu: bool,
    draft_model: Option<&Path>,
    draft_max: usize,
) -> Result<(), Box<dyn Error>> {
    if spec == SpecKind::None {
        return Ok(());
    }
    if gpu {
        return Err("--spec: speculation runs on the CPU; leave out --gpu".into());
    }
    if draft_max == 0 {
        return Err("--draft-max 0: speculation needs at least one guess per pass".into());
    }
    match (spec, draft_model) {
        (SpecKind::Draft, None) => Err("--spec draft needs --draft-model FILE".into()),
        (SpecKind::Ngram, Some(_)) => Err("--draft-model is for --spec draft".into()),
        _ => Ok(()),
    }
}

/// The draft model at `path`, opened as the engine `e` describes opens its model, on the
/// target's threads (`fast`).
pub fn open_draft(e: &EngineArgs, path: &Path, fast: FastLoader) -> Result<Engine, Box<dyn Error>> {
    Engine::open(
        &*e.files,
        path,
        e.load_mode(),
        fast,
        &e.archs,
        Box::new(|_, _| {}),
    )
    .map_err(|err| format!("--draft-model {}: {err}", path.display()).into())
}

/// Who guesses for `target`: the `draft` model if there is one, else prompt lookup.
pub fn proposer<'e>(
    target: &'e Engine,
    draft: Option<&'e Engine>,
) -> Result<Box<dyn Proposer + 'e>, Box<dyn Error>> {
    Ok(match draft {
        Some(d) => Box::new(
            DraftModel::new(
                &d.model,
                &d.tokenizer,
                &target.tokenizer,
                target.model.n_ctx(),
            )
            .map_err(|err| format!("--draft-model: {err}"))?,
        ),
        None => Box::new(PromptLookup::default()),
    })
}
// ANCHOR_END: run
