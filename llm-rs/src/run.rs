//! `llm-rs run` and `llm-rs chat`: complete a prompt, or hold a conversation, with every
//! chapter's part in place. The flags are parsed once; [`run`] turns them into each part's
//! settings and [`run_engine`] runs the parts, both read from top to bottom:
//!
//! 1. chapter 4's generation (the prompt, sampling, `--json`): [`ch04::cli::Args`], with
//!    chapter 15's grammar, if any, as its rule;
//! 2. chapter 10's engine (loading, the KV cache), with chapter 17's way of opening a path:
//!    [`EngineArgs`];
//! 3. chapter 14's memory budget, before anything loads;
//! 4. the model loaded (chapter 10), a runner — chapter 10's over chapter 7's scheduler, or
//!    chapter 16's that guesses — and chapter 4's command line driving it.

use crate::common::ModelFlags;
use ch04::cli::Args;
use ch04::cli::Runner;
use ch04::{Architectures, IgnoreEos, MakeRule};
use ch10::Scheduled;
use ch10::engine::{self, EngineArgs};
use ch10::mapped::PageAdvice;
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
    #[command(flatten)]
    pub model: ModelFlags,

    // Chapter 4: the prompt and its sampling.
    /// The prompt (or give it as the last argument).
    #[arg(long, short)]
    pub prompt: Option<String>,
    /// The prompt, as a positional argument.
    #[arg(value_name = "PROMPT", conflicts_with = "prompt")]
    pub prompt_arg: Option<String>,
    /// Number of tokens to generate.
    #[arg(short = 'n', long = "n-predict", default_value_t = Args::default().n)]
    pub n: usize,
    /// Temperature; 0 is greedy.
    #[arg(long, default_value_t = Args::default().temp)]
    pub temp: f32,
    #[arg(long, default_value_t = Args::default().top_k)]
    pub top_k: usize,
    #[arg(long, default_value_t = Args::default().top_p)]
    pub top_p: f32,
    #[arg(long, default_value_t = Args::default().min_p)]
    pub min_p: f32,
    #[arg(long, default_value_t = Args::default().repeat_penalty)]
    pub repeat_penalty: f32,
    /// Random seed (default: from the clock; printed so a run can be repeated).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Chat: the prompt (if any) is the first user message, then one message per line of
    /// stdin, each answered through the model's chat template; /exit or end of input stops.
    #[arg(long)]
    pub chat: bool,
    /// The system message of a --chat conversation (default: the template's own, if any).
    #[arg(long)]
    pub system: Option<String>,
    /// Stop when the text contains this (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Print one JSON object instead of streaming text (not with --chat).
    #[arg(long)]
    pub json: bool,
    /// Never end at an end-of-generation token: generate all -n tokens (for benchmarks).
    #[arg(long)]
    pub ignore_eos: bool,

    // Chapter 10: loading.
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
    /// Run the forward pass on a GPU (chapter 9), one sequence at a time: needs the engine
    /// built with the `gpu` feature.
    #[arg(long)]
    pub gpu: bool,

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
    // (`llm-rs chat` is `run` with --chat set, so these two are checked here, not by clap.)
    if flags.json && flags.chat {
        usage(
            ErrorKind::ArgumentConflict,
            "--json prints one completion: not with --chat".into(),
        );
    }
    if flags.system.is_some() && !flags.chat {
        usage(
            ErrorKind::MissingRequiredArgument,
            "--system is the system message of a --chat conversation: give --chat too".into(),
        );
    }
    // Chapter 4: what to generate, and how to pick each token.
    let mut generation = Args {
        model: flags.model.model.clone(),
        prompt: flags.prompt.or(flags.prompt_arg),
        n: flags.n,
        temp: flags.temp,
        top_k: flags.top_k,
        top_p: flags.top_p,
        min_p: flags.min_p,
        repeat_penalty: flags.repeat_penalty,
        seed: flags.seed,
        threads: flags.model.threads,
        ctx: flags.model.ctx,
        chat: flags.chat,
        system: flags.system,
        stop: flags.stop,
        json: flags.json,
        rule: flags
            .ignore_eos
            .then(|| Arc::new(IgnoreEos) as Arc<dyn MakeRule>),
    };
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
        && let Err(e) = ch04::cli::check(&generation)
    {
        usage(ErrorKind::MissingRequiredArgument, e.to_string());
    }
    // The default model (fetched on first use) if none is named.
    generation.model = match shared::model_or_default(generation.model) {
        Ok(path) => Some(path),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    // Chapter 10: the engine that loads the file and runs the scheduler; chapter 17 opens a
    // Hugging Face directory as a GGUF image.
    let engine = EngineArgs {
        generation,
        no_mmap: flags.no_mmap,
        advice: flags.advice.map(|a| match a {
            Advice::Normal => PageAdvice::Normal,
            Advice::WillNeed => PageAdvice::WillNeed,
            Advice::Sequential => PageAdvice::Sequential,
            Advice::Random => PageAdvice::Random,
        }),
        populate: flags.populate,
        mlock: flags.mlock,
        no_repack: flags.model.no_repack,
        gpu: flags.gpu,
        archs,
        cache: flags.model.cache(),
        files: Arc::new(flags.model.files()),
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
