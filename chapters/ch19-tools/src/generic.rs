//! Tools for a template that knows none (SmolLM2's ChatML, the default model's): this chapter
//! writes them into the system turn itself, with how to call them — Hermes's `<tool_call>`
//! tags around `{"name": …, "arguments": …}` — and writes earlier calls and their results into
//! the turns' text the same way. The parser and the grammars are then Hermes's.
//!
//! llama.cpp had such a fallback (its "generic" format, a JSON envelope held by a grammar from
//! the first token); the release this project checks against dropped it, and renders tools
//! only through templates that describe them. So this format is checked against its own
//! rules, not against llama.cpp.

use crate::conversation::{Tool, Turn};

/// The instructions and the tools' signatures, as Qwen 2.5's template words them.
pub fn system_text(tools: &[Tool]) -> String {
    let mut s = String::from(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
    );
    for t in tools {
        let name = serde_json::to_string(&t.name).expect("a string");
        let description = serde_json::to_string(&t.description).expect("a string");
        s.push_str(&format!(
            "\n{{\"type\": \"function\", \"function\": {{\"name\": {name}, \"description\": \
             {description}, \"parameters\": {}}}}}",
            t.parameters
        ));
    }
    s.push_str(
        "\n</tools>\n\nFor each function call, return a json object with function name and \
         arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": \
         <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
    );
    s
}

/// `turns` with the tools described in the system turn (added if there is none), each
/// earlier call written as its `<tool_call>` block after the assistant's text, and each tool
/// result inside `<tool_response>` tags.
pub fn rewrite(turns: &[Turn], tools: &[Tool]) -> Vec<Turn> {
    let mut out: Vec<Turn> = Vec::with_capacity(turns.len() + 1);
    let system = system_text(tools);
    match turns.first() {
        Some(t) if t.role == "system" => {
            let mut t = t.clone();
            t.content = format!("{}\n\n{system}", t.content);
            out.push(t);
        }
        _ => out.push(Turn {
            role: "system".into(),
            content: system,
            reasoning_content: String::new(),
            name: String::new(),
            tool_call_id: String::new(),
            tool_calls: Vec::new(),
        }),
    }
    let skip = usize::from(turns.first().is_some_and(|t| t.role == "system"));
    for t in &turns[skip..] {
        let mut t = t.clone();
        if !t.tool_calls.is_empty() {
            let mut text = t.content.clone();
            for c in std::mem::take(&mut t.tool_calls) {
                let name = serde_json::to_string(&c.name).expect("a string");
                if !text.is_empty() {
                    text.push('\n');
                }
                text.push_str(&format!(
                    "<tool_call>\n{{\"name\": {name}, \"arguments\": {}}}\n</tool_call>",
                    c.arguments
                ));
            }
            t.content = text;
        }
        if t.role == "tool" {
            t.content = format!("<tool_response>\n{}\n</tool_response>", t.content);
        }
        out.push(t);
    }
    out
}
