//! How much of the chat-template budget a long conversation uses: the numbers behind
//! `MAX_TEMPLATE_FUEL`.
//!
//! ```text
//! cargo run --release -q -p ch02 --example template_fuel                  # the default model
//! cargo run --release -q -p ch02 --example template_fuel -- --messages 1000 a.jinja b.gguf
//! ```
//!
//! Each file is a Jinja template or a GGUF file with `tokenizer.chat_template`. The
//! conversation is a system prompt, then user and assistant turns in turn; templates that
//! refuse a system prompt get the same conversation without it.

use ch01::GgufFile;
use ch02::chat::MAX_TEMPLATE_FUEL;
use ch02::{ChatTemplate, Message};
use clap::Parser;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser)]
#[command(about = "Print the fuel (minijinja instructions) each chat template uses")]
struct Args {
    /// Number of messages in the conversation.
    #[arg(long, default_value_t = 100)]
    messages: usize,
    /// Templates (.jinja) or GGUF files (default: the default model).
    files: Vec<PathBuf>,
}

fn template(path: &Path) -> Result<ChatTemplate, Box<dyn std::error::Error>> {
    if path.extension().is_some_and(|e| e == "gguf") {
        Ok(ChatTemplate::from_gguf(&GgufFile::open(path)?.gguf)?)
    } else {
        Ok(ChatTemplate::new(
            &std::fs::read_to_string(path)?,
            "<s>",
            "</s>",
        )?)
    }
}

fn conversation(n: usize, system: bool) -> Vec<Message> {
    let mut messages = Vec::with_capacity(n);
    if system {
        messages.push(Message::new("system", "You are a helpful assistant."));
    }
    // Turns alternate, the user's first.
    let first = messages.len();
    while messages.len() < n {
        let role = if (messages.len() - first) % 2 == 0 {
            "user"
        } else {
            "assistant"
        };
        let content = format!("This is message {} of the conversation.", messages.len());
        messages.push(Message::new(role, &content));
    }
    messages
}

fn main() -> ExitCode {
    let args = Args::parse();
    let files = if args.files.is_empty() {
        match shared::default_model_path() {
            Ok(p) => vec![p],
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        args.files
    };
    let mut most: Option<(u64, String)> = None;
    for path in &files {
        let name = path.file_name().map_or(path.display().to_string(), |n| {
            n.to_string_lossy().into_owned()
        });
        let t = match template(path) {
            Ok(t) => t,
            Err(e) => {
                println!("{name}: {e}");
                continue;
            }
        };
        let rendered = t
            .render_counted(&conversation(args.messages, true), true)
            .or_else(|_| t.render_counted(&conversation(args.messages, false), true));
        match rendered {
            Ok((text, fuel)) => {
                println!(
                    "{name}: {fuel} fuel ({} a message), {} bytes",
                    fuel / args.messages.max(1) as u64,
                    text.len()
                );
                if most.as_ref().is_none_or(|(f, _)| fuel > *f) {
                    most = Some((fuel, name));
                }
            }
            Err(e) => println!("{name}: {e}"),
        }
    }
    if let Some((fuel, name)) = most {
        println!(
            "most: {fuel} fuel ({name}) for {} messages; MAX_TEMPLATE_FUEL is {MAX_TEMPLATE_FUEL}, \
             {:.0} times more",
            args.messages,
            MAX_TEMPLATE_FUEL as f64 / fuel.max(1) as f64
        );
    }
    ExitCode::SUCCESS
}
