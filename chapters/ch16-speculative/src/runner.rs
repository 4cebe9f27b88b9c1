//! The finished engine with speculation: `llm-rs run --spec ngram` (prompt lookup) or
//! `--spec draft --draft-model FILE`, one sequence on chapter 5's contiguous cache.

use crate::propose::{DraftLength, DraftModel, PromptLookup};
use crate::speculate::{SpecStats, speculate};
use ch04::cli::{ContextFull, Runner};
use ch04::{ForwardError, GenParams, Generation};
use ch05::{Cached, ContiguousCache};
use ch07::Proposer;
use ch10::engine::{self, Engine, report_engine};
use ch14::run::{self, RunArgs};
use serde_json::{Map, Value, json};
use std::error::Error;
use std::path::PathBuf;

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

/// Chapter 14's settings, and how to speculate.
#[derive(Debug, Clone)]
pub struct SpecArgs {
    pub run: RunArgs,
    pub spec: SpecKind,
    /// The draft model's file, for [`SpecKind::Draft`].
    pub draft_model: Option<PathBuf>,
    /// Most guesses per pass (`--draft-max`).
    pub draft_max: usize,
}

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

    fn report(&self, json: &mut Map<String, Value>) {
        report_engine(self.engine, json);
        let s = &self.stats;
        json.insert(
            "speculative".into(),
            json!({
                "kind": self.kind.name(),
                "draft_max": self.draft_max,
                "passes": s.passes,
                "proposed": s.proposed,
                "accepted": s.accepted,
                "acceptance": s.acceptance(),
                "tokens_per_pass": s.tokens_per_pass(),
            }),
        );
    }
}

// ANCHOR: run
/// Run the finished engine as `args` say: chapter 14's budget first; without `--spec`,
/// chapter 14's engine; with it, a [`SpecRunner`] over the model (and the draft model, which
/// shares the model's threads).
pub fn run(args: &SpecArgs) -> Result<(), Box<dyn Error>> {
    if args.spec == SpecKind::None {
        return run::run(&args.run);
    }
    let e = &args.run.engine;
    if e.gpu {
        return Err("--spec: speculation runs on the CPU; leave out --gpu".into());
    }
    if args.draft_max == 0 {
        return Err("--draft-max 0: speculation needs at least one guess per pass".into());
    }
    let draft_path = match (args.spec, &args.draft_model) {
        (SpecKind::Draft, None) => return Err("--spec draft needs --draft-model FILE".into()),
        (SpecKind::Draft, Some(p)) => Some(p),
        (_, Some(_)) => return Err("--draft-model is for --spec draft".into()),
        (_, None) => None,
    };
    if !run::plan(&args.run)? {
        return Ok(());
    }
    let fast = e.fast_loader();
    let (target, t0) = engine::load(e, fast.clone())?;
    let draft = match draft_path {
        Some(p) => Some(
            Engine::open(
                &*e.files,
                p,
                e.load_mode(),
                fast,
                &e.archs,
                Box::new(|_, _| {}),
            )
            .map_err(|err| format!("--draft-model {}: {err}", p.display()))?,
        ),
        None => None,
    };
    let proposer: Box<dyn Proposer> = match &draft {
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
    };
    let mut runner = SpecRunner::new(&target, proposer, args.spec, args.draft_max, e.cache)?;
    runner.announce = !e.generation.json;
    engine::drive(e, &target, t0, &mut runner)
}
// ANCHOR_END: run
