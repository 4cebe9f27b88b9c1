//! How a family writes a tool call, and its reasoning: the markers the parser looks for, the
//! grammar is triggered by and held to. Read from the template's own text, as llama.cpp tells
//! its formats apart.

use crate::conversation::Caps;

/// Where a call's parts are in the text a model writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Calls {
    /// Each call a JSON object `{"name": …, "arguments": {…}}` between two tags: Hermes 2 and
    /// 3, Qwen 2.5 and 3, QwQ, SmolLM3 — `<tool_call>` and `</tool_call>` — and this chapter's
    /// generic format for templates that know no tools.
    Tagged {
        open: &'static str,
        close: &'static str,
    },
    /// A marker, then every call of the turn as one JSON list of
    /// `{"name": …, "arguments": {…}, "id": …}`: Mistral's `[TOOL_CALLS]`.
    Listed { marker: &'static str },
    /// The whole answer one JSON object `{"name": …, "parameters": {…}}`: Llama 3.x's custom
    /// tools (one call per turn). Told `Environment: ipython`, the model may write `tag` first
    /// (`<|python_tag|>`), and writes a built-in tool's call in Python's form after it:
    /// `<|python_tag|>brave_search.call(query="…")`.
    Bare { tag: &'static str },
    /// DeepSeek R1's: `<｜tool▁calls▁begin｜>`, then per call `<｜tool▁call▁begin｜>function
    /// <｜tool▁sep｜>NAME` and the arguments in a ```` ```json ```` block, `<｜tool▁call▁end｜>`.
    DeepSeek,
}

/// DeepSeek R1's markers.
pub mod deepseek {
    pub const CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
    pub const CALLS_END: &str = "<｜tool▁calls▁end｜>";
    pub const CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
    pub const CALL_END: &str = "<｜tool▁call▁end｜>";
    pub const SEP: &str = "<｜tool▁sep｜>";
}

/// A family's format: how it calls tools, and how it marks its reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Format {
    /// A short name, for logs and the book: `hermes`, `mistral`, `llama3`, `deepseek-r1`,
    /// `generic`.
    pub name: &'static str,
    pub calls: Calls,
    /// The key of a call's arguments in its JSON (`arguments`; Llama 3.x's `parameters`).
    pub arguments_key: &'static str,
    /// Reasoning between these two markers (`<think>`, `</think>`), if the family reasons.
    pub think: Option<(&'static str, &'static str)>,
    /// The template does not describe tools: this chapter writes them into the system turn
    /// ([`generic::system_text`](crate::generic::system_text)).
    pub describe_tools: bool,
}

pub const HERMES: Format = Format {
    name: "hermes",
    calls: Calls::Tagged {
        open: "<tool_call>",
        close: "</tool_call>",
    },
    arguments_key: "arguments",
    think: None,
    describe_tools: false,
};

pub const MISTRAL: Format = Format {
    name: "mistral",
    calls: Calls::Listed {
        marker: "[TOOL_CALLS]",
    },
    arguments_key: "arguments",
    think: None,
    describe_tools: false,
};

pub const LLAMA3: Format = Format {
    name: "llama3",
    calls: Calls::Bare {
        tag: "<|python_tag|>",
    },
    arguments_key: "parameters",
    think: None,
    describe_tools: false,
};

pub const DEEPSEEK_R1: Format = Format {
    name: "deepseek-r1",
    calls: Calls::DeepSeek,
    arguments_key: "arguments",
    think: Some(("<think>", "</think>")),
    describe_tools: false,
};

/// This chapter's format for a template that knows no tools (SmolLM2's ChatML, say): Hermes's
/// tags, with the tools described in the system turn.
pub const GENERIC: Format = Format {
    name: "generic",
    describe_tools: true,
    ..HERMES
};

impl Format {
    /// The format of the template whose text is `source` and whose probes gave `caps`.
    pub fn detect(source: &str, caps: Caps) -> Format {
        let think = source
            .contains("<think>")
            .then_some(("<think>", "</think>"));
        let found = if source.contains(deepseek::CALLS_BEGIN) {
            DEEPSEEK_R1
        } else if source.contains("[TOOL_CALLS]") {
            MISTRAL
        } else if source.contains("<tool_call>") && caps.tools {
            HERMES
        } else if source.contains("<|start_header_id|>")
            && source.contains("\"parameters\"")
            && caps.tools
        {
            LLAMA3
        } else {
            GENERIC
        };
        Format {
            think: found.think.or(think),
            ..found
        }
    }
}
