//! `llm-rs`: the finished engine, put together from the chapters' parts in one place. One
//! binary runs every architecture the chapters know ([`ch13::architectures`]), from a GGUF file
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
//! [`common`] declares the settings `run` and `serve` share; each subcommand's flags are
//! declared once, in its module. `llm-rs SUBCOMMAND --help` lists them.

mod common;
mod convert;
mod inspect;
mod run;
mod serve;
/// Chapter 12's layering of a server's settings: flags, then `LLM_RS_<FLAG>`, then the TOML
/// file of `--config`. A module of chapter 12's programs (no library holds a command line),
/// included here as it is there.
#[path = "../../chapters/ch12-production/examples/common/settings.rs"]
mod settings;

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
    let archs = ch13::architectures();
    match Cli::parse().command {
        Command::Run(flags) => run::run("run", flags, archs),
        Command::Chat(mut flags) => {
            flags.chat = true;
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
