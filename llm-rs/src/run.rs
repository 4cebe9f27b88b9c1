//! `llm-rs run` and `llm-rs chat`: complete a prompt, or hold a conversation, with every
//! chapter's part in place. The flags are parsed once; [`run`] turns them into each part's
//! settings and [`run_engine`] runs the parts, both read from top to bottom:
//!
//! 1. chapter 10's engine (loading, the KV cache) with chapter 4's generation inside it (the
//!    prompt, sampling, `--json`), from chapter 10's command line ([`EngineArgs`]); chapter
//!    17's way of opening a path; chapter 15's grammar, if any, as the generation's rule;
//! 2. chapter 14's memory budget, before anything loads;
//! 3. the model loaded (chapter 10), a runner — chapter 10's over chapter 7's scheduler, or
//!    chapter 16's that guesses — and chapter 4's command line driving it.

use crate::common::Quantize;
use crate::engine_flags::Engine;
use ch04::cli::Runner;
use ch04::{Architectures, MakeRule};
use ch10::Scheduled;
use ch10::engine::{self, EngineArgs};
use ch15::{Constraint, Source, compile};
use ch16::runner::{self, DRAFT_MAX, SpecKind, SpecRunner};
use clap::ValueEnum;
use clap::error::ErrorKind;
use std::error::Error;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Run a GGUF model or a Hugging Face directory: complete a prompt, or chat (--chat);
/// --grammar or --json-schema holds the output to a form; --spec guesses tokens ahead (same
/// output, fewer passes over the weights).
#[derive(clap::Args, Debug, Clone)]
pub struct Flags {
    /// Chapter 10's command line (its `engine` example's): chapter 4's flags — model, prompt,
    /// sampling, context size, --json — and those of loading and the KV cache.
    #[command(flatten)]
    pub engine: Engine,
    /// Chapter 17's `--quantize`.
    #[command(flatten)]
    pub quantize: Quantize,

    // Chapter 14.
    /// Print what the run will hold in memory (weights, KV cache, the rest) and exit.
    #[arg(long)]
    pub mem_budget: bool,

    // Chapter 15.
    /// A GBNF grammar the output must follow (root rule `root`).
    #[arg(long, group = "form", conflicts_with = "ignore_eos")]
    pub grammar: Option<String>,
    /// A file holding the GBNF grammar.
    #[arg(long, group = "form", conflicts_with = "ignore_eos")]
    pub grammar_file: Option<PathBuf>,
    /// A JSON Schema the output must be an instance of, e.g. '{"type": "object"}' ('{}': any
    /// JSON).
    #[arg(long, short = 'j', group = "form", conflicts_with = "ignore_eos")]
    pub json_schema: Option<String>,
    /// A file holding the JSON Schema.
    #[arg(long, group = "form", conflicts_with = "ignore_eos")]
    pub json_schema_file: Option<PathBuf>,

    // Chapter 16.
    /// Speculative decoding: guess tokens and check them in one pass over the weights. ngram:
    /// find the last tokens earlier in the prompt or output and guess what followed; draft: a
    /// smaller model with the same vocabulary (--draft-model). The output does not change.
    /// (llama.cpp: --spec-type ngram-simple|draft-simple.)
    #[arg(long, visible_alias = "spec-type", value_enum, default_value = "none")]
    pub spec: Spec,
    /// The draft model's GGUF file, for --spec draft (llama.cpp: --spec-draft-model, -md).
    #[arg(long, visible_aliases = ["spec-draft-model", "model-draft"])]
    pub draft_model: Option<PathBuf>,
    /// Most tokens guessed per pass; fewer are guessed while guesses fail (llama.cpp:
    /// --spec-draft-n-max).
    #[arg(long, visible_alias = "spec-draft-n-max", default_value_t = DRAFT_MAX)]
    pub draft_max: usize,
}

/// `--spec`: chapter 16's [`SpecKind`], by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Spec {
    None,
    #[value(alias = "ngram-simple")]
    Ngram,
    #[value(alias = "draft-simple")]
    Draft,
}

/// `llm-rs run` (and `chat`, which is `run --chat`): `flags` for the architectures `archs`;
/// a command line that cannot run exits 2 with the usage of `subcommand`, a failure exits 1.
pub fn run(subcommand: &str, flags: Flags, archs: Architectures) {
    let usage = |kind, message| crate::usage_error(subcommand, kind, message);
    // Chapter 10's settings, chapter 4's inside them, from chapter 10's flags; chapter 17
    // opens a Hugging Face directory as a GGUF image.
    let mut engine = flags.engine.args(archs);
    engine.files = Arc::new(flags.quantize.files());
    // (`llm-rs chat` is `run` with --chat set after parsing: clap cannot refuse its --json.)
    let generation = &mut engine.generation;
    if generation.json && generation.chat {
        usage(
            ErrorKind::ArgumentConflict,
            "--json prints one completion: not with --chat".into(),
        );
    }
    // Chapter 15: the tokens that may come next, held to a grammar.
    let form = (
        flags.grammar,
        flags.grammar_file,
        flags.json_schema,
        flags.json_schema_file,
    );
    match grammar(form) {
        Err(e) => usage(ErrorKind::ValueValidation, e),
        Ok(None) => {}
        Ok(Some(rule)) => generation.rule = Some(rule),
    }
    if !flags.mem_budget
        && let Err(e) = ch04::cli::check(generation)
    {
        usage(ErrorKind::MissingRequiredArgument, e.to_string());
    }
    // The default model (fetched on first use) if none is named.
    generation.model = match shared::model_or_default(generation.model.take()) {
        Ok(path) => Some(path),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    let spec = match flags.spec {
        Spec::None => SpecKind::None,
        Spec::Ngram => SpecKind::Ngram,
        Spec::Draft => SpecKind::Draft,
    };
    let draft = (flags.draft_model.as_deref(), flags.draft_max);
    if let Err(e) = run_engine(&engine, flags.mem_budget, spec, draft) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

// ANCHOR: run_engine
/// Run the engine `e` describes: chapter 14's budget first (with `mem_budget`, only that),
/// then the model loaded and chapter 4's command line over a runner — chapter 16's, guessing
/// as `spec` and `(draft model, most guesses per pass)` say, or chapter 10's.
fn run_engine(
    e: &EngineArgs,
    mem_budget: bool,
    spec: SpecKind,
    (draft_model, draft_max): (Option<&Path>, usize),
) -> Result<(), Box<dyn Error>> {
    runner::check(spec, e.gpu, draft_model, draft_max)?;
    // Chapter 14: what the run will hold, from the file's header; refused if it cannot fit.
    if !ch14::run::plan(e, mem_budget)? {
        return Ok(());
    }
    // Chapter 9: on a GPU, one sequence at a time, chapter 10's own path.
    if e.gpu {
        return engine::run(e);
    }
    // Chapter 10: the file mapped, the matrices chapter 8's; a draft model on the same
    // threads.
    let fast = e.fast_loader();
    let (target, t0) = engine::load(e, fast.clone())?;
    let draft = match draft_model {
        Some(path) => Some(runner::open_draft(e, path, fast)?),
        None => None,
    };
    // Chapter 16's runner guesses and checks; without --spec, chapter 10's runs every
    // prompt through chapter 7's scheduler.
    let mut runner: Box<dyn Runner + '_> = match spec {
        SpecKind::None => Box::new(Scheduled::with_cache(
            &target,
            target.model.n_ctx(),
            1,
            e.cache,
        )?),
        kind => {
            let proposer = runner::proposer(&target, draft.as_ref())?;
            let mut r = SpecRunner::new(&target, proposer, kind, draft_max, e.cache)?;
            r.announce = !e.generation.json;
            Box::new(r)
        }
    };
    // Chapter 4: one prompt, or a conversation.
    engine::drive(e, &target, t0, &mut *runner)
}
// ANCHOR_END: run_engine

/// The rule `--grammar`, `--grammar-file`, `--json-schema` or `--json-schema-file` asks for
/// (at most one is given), compiled; an error names the flag and what is wrong.
fn grammar(
    form: (
        Option<String>,
        Option<PathBuf>,
        Option<String>,
        Option<PathBuf>,
    ),
) -> Result<Option<Arc<dyn MakeRule>>, String> {
    let read = |flag: &str, p: &PathBuf| {
        std::fs::read_to_string(p).map_err(|e| format!("{flag} {}: {e}", p.display()))
    };
    let (flag, source) = match form {
        (Some(g), ..) => ("--grammar", Source::Grammar(g)),
        (_, Some(p), ..) => (
            "--grammar-file",
            Source::Grammar(read("--grammar-file", &p)?),
        ),
        (_, _, Some(j), _) => ("--json-schema", Source::JsonSchema(j)),
        (.., Some(p)) => (
            "--json-schema-file",
            Source::JsonSchema(read("--json-schema-file", &p)?),
        ),
        _ => return Ok(None),
    };
    let grammar = compile(&source).map_err(|e| format!("{flag}: {e}"))?;
    Ok(Some(Arc::new(Constraint::new(grammar))))
}
