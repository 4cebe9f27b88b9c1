//! `llm-rs run` and `llm-rs chat`: complete a prompt, or hold a conversation, with every
//! chapter's part in place. The flags are parsed once, into the settings of each part in
//! turn, read from top to bottom:
//!
//! 1. chapter 4's generation (the prompt, sampling, `--json`): [`ch04::cli::Args`];
//! 2. chapter 15's grammar, if any, as the generation's rule;
//! 3. chapter 10's engine (loading, the KV cache), with chapter 17's way of opening a path:
//!    [`EngineArgs`];
//! 4. chapter 14's memory budget in front: [`RunArgs`];
//! 5. chapter 16's speculation around the run: [`SpecArgs`], and [`ch16::runner::run`].

use crate::common::ModelFlags;
use ch04::cli::Args;
use ch04::{Architectures, IgnoreEos, MakeRule};
use ch10::engine::EngineArgs;
use ch10::mapped::PageAdvice;
use ch14::run::RunArgs;
use ch15::{Constraint, Source, compile};
use ch16::runner::{DRAFT_MAX, SpecArgs, SpecKind};
use clap::ValueEnum;
use clap::error::ErrorKind;
use std::path::PathBuf;
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
    // Chapter 14: the memory budget in front; chapter 16: guesses checked in one pass.
    let args = SpecArgs {
        run: RunArgs {
            engine,
            mem_budget: flags.mem_budget,
        },
        spec: match flags.spec {
            Spec::None => SpecKind::None,
            Spec::Ngram => SpecKind::Ngram,
            Spec::Draft => SpecKind::Draft,
        },
        draft_model: flags.draft_model,
        draft_max: flags.draft_max,
    };
    if let Err(e) = ch16::runner::run(&args) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

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
