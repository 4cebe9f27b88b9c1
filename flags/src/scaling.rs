//! Chapter 14's engine: chapter 10's flags and `--mem-budget`, turned into chapter 14's
//! [`RunArgs`].

use crate::engine::Engine;
use ch04::Architectures;
use ch04::MakeRule;
use ch14::run::{self, RunArgs};
use clap::{CommandFactory, Parser};
use std::ffi::OsString;
use std::sync::Arc;

/// Run a GGUF model: complete a prompt, or chat.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "engine",
    about = "Run a GGUF model: complete a prompt, or chat (--chat)."
)]
pub struct Scaling {
    /// Chapter 10's flags: model, prompt, sampling, context size, loading.
    #[command(flatten)]
    pub engine: Engine,
    /// Print what the run will hold in memory (weights, KV cache, the rest) and exit.
    #[arg(long)]
    pub mem_budget: bool,
}

/// [`crate::engine::main_from`] with chapter 14's memory budget in front.
pub fn main_from(argv: Vec<OsString>, archs: Architectures) {
    main_with(Scaling::parse_from(argv), archs, None)
}

/// [`main_from`] on parsed flags, the tokens that may come next decided by `rule` if any (a
/// later chapter's).
pub fn main_with(flags: Scaling, archs: Architectures, rule: Option<Arc<dyn MakeRule>>) {
    let args = checked(flags, archs, rule);
    if let Err(e) = run::run(&args) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// The settings `flags` give for `archs`, the output ruled by `rule` if any; a usage error
/// (and exit) when they cannot run.
pub fn checked(flags: Scaling, archs: Architectures, rule: Option<Arc<dyn MakeRule>>) -> RunArgs {
    let mut args = RunArgs {
        engine: flags.engine.args(archs),
        mem_budget: flags.mem_budget,
    };
    if rule.is_some() {
        args.engine.generation.rule = rule;
    }
    if !args.mem_budget
        && let Err(e) = ch04::cli::check(&args.engine.generation)
    {
        Scaling::command()
            .error(
                clap::error::ErrorKind::MissingRequiredArgument,
                e.to_string(),
            )
            .exit();
    }
    args
}
