//! `llm-rs`: the finished engine, at the top of the tower. One binary runs every architecture
//! the chapters know ([`ch13::architectures`]):
//!
//! - `llm-rs run [--model PATH] "PROMPT"`: complete a prompt (chapter 10's engine, its flags);
//! - `llm-rs chat [--model PATH]`: a conversation, one message per line of standard input;
//! - `llm-rs serve [--port 8080] …`: the production server (chapter 12's, its flags,
//!   environment variables and configuration file).
//!
//! `llm-rs SUBCOMMAND --help` lists a subcommand's flags. When a chapter is added above this
//! one, this file moves up to it and names that chapter's set of architectures instead.

use clap::{Parser, Subcommand};
use std::ffi::OsString;

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

fn main() {
    let archs = ch13::architectures();
    match Cli::parse().command {
        Command::Run { args } => ch13::engine::main_from(argv("llm-rs run", &[], args), archs),
        Command::Chat { args } => {
            ch13::engine::main_from(argv("llm-rs chat", &["--chat"], args), archs)
        }
        Command::Serve { args } => ch13::ch12::main_from(argv("llm-rs serve", &[], args), archs),
    }
}
