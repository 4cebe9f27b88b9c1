//! `llm-rs`: the finished engine, put together from the chapters' parts in one place. One
//! binary runs every architecture the chapters know ([`ch18::architectures`]), from a GGUF file
//! or a Hugging Face directory (chapter 17's; `--quantize TYPE` stores a directory's matrices as
//! a chapter 6 file type). One module per subcommand, each read from top to bottom:
//!
//! - [`run`]: `llm-rs run [--model PATH] "PROMPT"` completes a prompt, and `llm-rs chat` holds
//!   a conversation, one message per line of standard input;
//! - [`serve`]: `llm-rs serve [--port 8080] …`, the production server;
//! - [`inspect`]: `llm-rs inspect [PATH]`, what a model file holds and whether this engine runs
//!   it;
//! - [`convert`]: `llm-rs convert DIR OUT.gguf [TYPE]`, a Hugging Face directory written as a
//!   GGUF file.
//!
//! `run` and `serve` take the command lines of chapters 10 and 12's programs (their
//! `examples/common/` files, included here) and add what later chapters offer; [`common`]
//! holds what both add. `llm-rs SUBCOMMAND --help` lists the flags.

mod common;
mod convert;
/// Chapter 10's command line, which `run` extends: a module of chapter 10's `engine` example
/// (no library holds a command line), included here as it is there.
#[path = "../../chapters/ch10-mmap/examples/common/engine_flags.rs"]
mod engine_flags;
mod inspect;
/// Chapter 12's command line, which `serve` extends, with its layering of settings (flags,
/// then `LLM_RS_<FLAG>`, then the TOML file of `--config`): a module of chapter 12's examples,
/// included here as it is there.
#[path = "../../chapters/ch12-production/examples/common/production_flags.rs"]
mod production_flags;
mod run;
mod serve;

use ch06::recipe::LlamaFtype;
use clap::error::ErrorKind;
use clap::{CommandFactory, Parser, Subcommand};
use std::ffi::OsString;
use std::path::PathBuf;

/// Run GGUF models: complete a prompt, chat, or serve OpenAI's API.
#[derive(Parser)]
#[command(name = "llm-rs", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Complete a prompt: `llm-rs run [--model PATH] "PROMPT"` (`llm-rs run --help`: the flags).
    Run(run::Flags),
    /// Chat with the model through its chat template, one message per line of standard input.
    // `run` with --chat set: its flags, less those that --chat already settles.
    #[command(
        mut_arg("chat", |a| a.hide(true)),
        mut_arg("system", |a| a.requires(clap::builder::Resettable::Reset)),
        mut_arg("json", |a| a.hide(true))
    )]
    Chat(run::Flags),
    /// Serve OpenAI's API over HTTP, with metrics, logs and a graceful shutdown
    /// (`llm-rs serve --help`: the flags).
    #[command(disable_help_flag = true)]
    Serve {
        /// The server's flags, parsed with its environment variables and configuration file.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
    /// Print what a GGUF file (or a Hugging Face directory, as the GGUF file it converts to)
    /// holds — metadata, tensors, configuration — and whether llm-rs runs it.
    Inspect {
        /// GGUF file or Hugging Face directory (default: the default model, fetched on first
        /// use).
        path: Option<PathBuf>,
    },
    /// Convert a Hugging Face directory (config.json, *.safetensors, tokenizer.json) into a
    /// GGUF file that llm-rs and llama.cpp run.
    Convert {
        /// The directory (or its config.json).
        dir: PathBuf,
        /// The GGUF file to write.
        out: PathBuf,
        /// Store the matrices as this file type (F32, F16, BF16, Q8_0, Q4_0, Q4_K_M, …);
        /// by default each keeps the checkpoint's type.
        #[arg(value_parser = common::ftype)]
        file_type: Option<LlamaFtype>,
    },
}

/// A command line that parsed but cannot run: clap's message with the usage of `subcommand`,
/// and exit 2.
fn usage_error(subcommand: &str, kind: ErrorKind, message: String) -> ! {
    let mut cli = Cli::command();
    cli.build();
    match cli.find_subcommand_mut(subcommand) {
        Some(sub) => sub.error(kind, message).exit(),
        None => cli.error(kind, message).exit(),
    }
}

/// Exit 1 with the error of a subcommand that failed.
fn or_exit(result: Result<(), Box<dyn std::error::Error>>) {
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn main() {
    // Every architecture the chapters know: chapter 13's set.
    let archs = ch18::architectures();
    match Cli::parse().command {
        Command::Run(flags) => run::run("run", flags, archs),
        Command::Chat(mut flags) => {
            flags.engine.generation.chat = true;
            run::run("chat", flags, archs)
        }
        Command::Serve { args } => serve::serve(args, archs),
        Command::Inspect { path } => or_exit(inspect::inspect(path, &archs)),
        Command::Convert {
            dir,
            out,
            file_type,
        } => or_exit(convert::convert(&dir, &out, file_type)),
    }
}
