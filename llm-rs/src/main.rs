//! `llm-rs`: the finished engine, at the top of the tower. One binary runs every architecture
//! the chapters know ([`ch16::architectures`]):
//!
//! - `llm-rs run [--model PATH] "PROMPT"`: complete a prompt (chapter 10's engine, its flags,
//!   behind chapter 14's memory budget: `--mem-budget` prints it; chapter 15's `--grammar` and
//!   `--json-schema` hold the output to a form; chapter 16's `--spec ngram|draft` guesses
//!   tokens ahead and checks them in one pass, the output unchanged);
//! - `llm-rs chat [--model PATH]`: a conversation, one message per line of standard input;
//! - `llm-rs serve [--port 8080] …`: the production server (chapter 12's, its flags,
//!   environment variables and configuration file), whose requests may ask for JSON
//!   (`response_format`) or a grammar (chapter 15's), and which guesses tokens ahead with
//!   `--spec ngram` (chapter 16's);
//! - `llm-rs inspect [PATH]`: what a GGUF file holds (chapter 1's summary, the configuration),
//!   and whether this engine runs its architecture.
//!
//! `llm-rs SUBCOMMAND --help` lists a subcommand's flags (the `flags` crate's). When a chapter
//! is added above chapter 16, this package depends on it instead and names its set of
//! architectures: one line in `Cargo.toml`, one in `main`.

use ch16::{Architectures, Config, GgufFile};
use clap::{Parser, Subcommand};
use std::error::Error;
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
    #[command(disable_help_flag = true)]
    Run {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
    /// Chat with the model through its chat template, one message per line of standard input.
    #[command(disable_help_flag = true)]
    Chat {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
    /// Serve OpenAI's API over HTTP, with metrics, logs and a graceful shutdown
    /// (`llm-rs serve --help`: the flags).
    #[command(disable_help_flag = true)]
    Serve {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
    /// Print what a GGUF file holds — metadata, tensors, configuration — and whether llm-rs
    /// runs it.
    Inspect {
        /// GGUF file (default: the default model, fetched on first use).
        path: Option<PathBuf>,
    },
}

/// The command line a chapter's own `main` parses: its name, then `args`.
fn argv(name: &str, first: &[&str], args: Vec<OsString>) -> Vec<OsString> {
    let mut v: Vec<OsString> = std::iter::once(name)
        .chain(first.iter().copied())
        .map(Into::into)
        .collect();
    v.extend(args);
    v
}

/// `llm-rs inspect`: chapter 1's summary of the file, its configuration, and whether `archs`
/// has its architecture.
fn inspect(path: Option<PathBuf>, archs: &Architectures) -> Result<(), Box<dyn Error>> {
    let path = match path {
        Some(p) => p,
        None => shared::default_model_path()?,
    };
    let file = GgufFile::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    print!("{}", ch16::ch01::inspect::summary(&file, &name));
    let arch = file
        .gguf
        .architecture()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    println!("\nconfig:");
    match Config::from_gguf(&file.gguf, &[arch]) {
        Ok(c) => print!("{c}"),
        Err(e) => println!("  (none: {e})"),
    }
    let names = archs.names().join(", ");
    match archs.get(arch) {
        Some(_) => println!("\nllm-rs runs architecture {arch:?} (it runs {names})"),
        None => println!("\nllm-rs does not run architecture {arch:?} (it runs {names})"),
    }
    Ok(())
}

fn main() {
    let archs = ch16::architectures();
    match Cli::parse().command {
        Command::Inspect { path } => {
            if let Err(e) = inspect(path, &archs) {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
        }
        Command::Run { args } => {
            flags::speculative::main_from(argv("llm-rs run", &[], args), archs)
        }
        Command::Chat { args } => {
            flags::speculative::main_from(argv("llm-rs chat", &["--chat"], args), archs)
        }
        Command::Serve { args } => {
            flags::speculative::serve_from(argv("llm-rs serve", &[], args), archs)
        }
    }
}
