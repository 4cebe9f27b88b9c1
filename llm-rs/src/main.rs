//! `llm-rs`: the finished engine, at the top of the tower. One binary runs every architecture
//! the chapters know ([`ch13::architectures`]), from a GGUF file or a Hugging Face directory
//! (chapter 17's; `--quantize TYPE` stores a directory's matrices as a chapter 6 file type):
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
//! - `llm-rs inspect [PATH]`: what a GGUF file (or the GGUF image of a Hugging Face
//!   directory) holds — chapter 1's summary, the configuration — and whether this engine runs
//!   its architecture;
//! - `llm-rs convert DIR OUT.gguf [TYPE]`: write a Hugging Face directory as a GGUF file
//!   (chapter 17's), its matrices in their own type or as file type `TYPE`.
//!
//! `llm-rs SUBCOMMAND --help` lists a subcommand's flags (the `flags` crate's). When a chapter
//! is added above chapter 17, this package depends on it instead and names its set of
//! architectures: one line in `Cargo.toml`, one in `main`.

use ch01::{Config, GgufFile};
use ch04::Architectures;
use ch06::recipe::LlamaFtype;
use ch17::Checkpoint;
use clap::{Parser, Subcommand};
use std::error::Error;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

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
        #[arg(value_parser = |s: &str| LlamaFtype::from_name(s).map_err(|e| e.to_string()))]
        file_type: Option<LlamaFtype>,
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
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let gguf = if ch17::files::is_checkpoint(&path) {
        let (file, _) = ch10::mapped::held_gguf(&path, Checkpoint::open(&path)?.image(None)?)?;
        print!("{}", ch01::inspect::summary(&file, &name));
        file.gguf
    } else {
        let file = GgufFile::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        print!("{}", ch01::inspect::summary(&file, &name));
        file.gguf
    };
    let file = &gguf;
    let arch = file
        .architecture()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    println!("\nconfig:");
    match Config::from_gguf(file, &[arch]) {
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

/// `llm-rs convert`: the checkpoint in `dir` written to `out` as a GGUF file.
fn convert(dir: &Path, out: &Path, ftype: Option<LlamaFtype>) -> Result<(), Box<dyn Error>> {
    let ckpt = Checkpoint::open(dir)?;
    let bytes = ckpt.write_gguf(out, ftype)?;
    let kind = ftype.map_or("its own types".to_string(), |f| f.name().to_string());
    eprintln!(
        "{}: {} {} model, {} tensors ({kind}) → {} ({:.1} MB)",
        dir.display(),
        ckpt.family.hf_architectures[0],
        ckpt.family.arch,
        ckpt.tensors.len(),
        out.display(),
        bytes as f64 / 1e6
    );
    Ok(())
}

fn main() {
    let archs = ch13::architectures();
    match Cli::parse().command {
        Command::Inspect { path } => {
            if let Err(e) = inspect(path, &archs) {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
        }
        Command::Convert {
            dir,
            out,
            file_type,
        } => {
            if let Err(e) = convert(&dir, &out, file_type) {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
        }
        Command::Run { args } => {
            flags::checkpoints::main_from(argv("llm-rs run", &[], args), archs)
        }
        Command::Chat { args } => {
            flags::checkpoints::main_from(argv("llm-rs chat", &["--chat"], args), archs)
        }
        Command::Serve { args } => {
            flags::checkpoints::serve_from(argv("llm-rs serve", &[], args), archs)
        }
    }
}
