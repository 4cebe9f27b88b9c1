//! Chapter 19's worked examples.
//!
//!     cargo run -p ch19 --example stream-trace             an answer, token by token, parsed
//!     cargo run -p ch19 --example stream-trace -- --prompt a conversation with tools, rendered
//!
//! The first cuts a Qwen-style answer (reasoning, a sentence, a call) into the default model's
//! tokens and feeds the parser one token at a time, printing what each token makes known. The
//! second renders a conversation with a call and its result through Qwen 2.5's template (the
//! copy in reference-data/tools/), as llama-server renders it.

use ch01::GgufFile;
use ch02::{ChatTemplate, Tokenizer};
use ch19::conversation::{Caps, read_messages, read_tools, render};
use ch19::format::Format;
use ch19::parse::{Options, Parser};

const ANSWER: &str = "<think>\nThe user wants Paris's weather.\n</think>\n\nLet me check.\n\
<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

const TOOLS: &str = r#"[{"type": "function", "function": {"name": "get_weather",
  "description": "The current weather in a city.",
  "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                 "required": ["city"]}}}]"#;

const MESSAGES: &str = r#"[
  {"role": "user", "content": "What is the weather in Paris?"},
  {"role": "assistant", "content": null, "tool_calls": [{"id": "call00001", "type": "function",
    "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
  {"role": "tool", "tool_call_id": "call00001", "content": "Sunny, 21 C"}]"#;

fn main() {
    let path = shared::default_model_path().unwrap_or_else(|e| panic!("{e}"));
    let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{e}"));
    if std::env::args().any(|a| a == "--prompt") {
        prompt();
    } else {
        let tokenizer = Tokenizer::from_gguf(&file.gguf).unwrap_or_else(|e| panic!("{e}"));
        trace(&tokenizer);
    }
}

/// The answer's tokens, and the deltas each one completes.
fn trace(tokenizer: &Tokenizer) {
    let qwen = template("Qwen-Qwen2.5-7B-Instruct");
    let format = Format {
        think: Some(("<think>", "</think>")),
        ..Format::detect(qwen.source(), Caps::probe(&qwen))
    };
    let options = Options {
        reasoning: true,
        calls: true,
        thinking_open: false,
    };
    let mut parser = Parser::new(format, options);
    println!(
        "format: {} ({:?}), reasoning between {:?}",
        format.name, format.calls, format.think
    );
    let ids = tokenizer.encode(ANSWER, false, false);
    for id in ids {
        let piece = String::from_utf8_lossy(&tokenizer.token_to_piece(id)).into_owned();
        let deltas = parser.push(&piece);
        println!("{:>22}  {}", format!("{piece:?}"), describe(&deltas));
    }
    println!("{:>22}  {}", "(end)", describe(&parser.finish()));
    let p = parser.parsed();
    println!("\nreasoning: {:?}\ncontent:   {:?}", p.reasoning, p.content);
    for c in &p.calls {
        println!("call:      {} {}", c.name, c.arguments);
    }
}

fn describe(deltas: &[ch19::parse::Delta]) -> String {
    use ch19::parse::Delta;
    if deltas.is_empty() {
        return "·".into();
    }
    let parts: Vec<String> = deltas
        .iter()
        .map(|d| match d {
            Delta::Content(t) => format!("content {t:?}"),
            Delta::Reasoning(t) => format!("reasoning {t:?}"),
            Delta::Call { index, name, .. } => format!("call {index} {name}"),
            Delta::Arguments { index, text } => format!("arguments {index} {text:?}"),
        })
        .collect();
    parts.join(", ")
}

/// A reference template, with the BOS and EOS texts llama-server rendered it with.
fn template(name: &str) -> ChatTemplate {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../reference-data/tools/templates");
    let source = std::fs::read_to_string(root.join(format!("{name}.jinja")))
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    ChatTemplate::new(&source, "<|im_start|>", "<|im_end|>").unwrap_or_else(|e| panic!("{e}"))
}

/// The conversation with a call and its result, as Qwen 2.5's template writes it.
fn prompt() {
    let qwen = template("Qwen-Qwen2.5-7B-Instruct");
    let caps = Caps::probe(&qwen);
    println!("{caps:?}\n");
    let turns = read_messages(MESSAGES).unwrap_or_else(|e| panic!("{e}"));
    let tools = read_tools(TOOLS).unwrap_or_else(|e| panic!("{e}"));
    let text = render(&qwen, caps, &turns, &tools, &[]).unwrap_or_else(|e| panic!("{e}"));
    print!("{text}");
}
