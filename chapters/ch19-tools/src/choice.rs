//! `tool_choice`: whether the model may call, must call, or must call one function — and the
//! grammar that holds its calls to the tools' JSON Schemas (chapter 15), from the start of the
//! answer (`required`, a named function) or from the moment the model opens a call (`auto`: a
//! lazy grammar, [`Lazy`](crate::lazy::Lazy)).

use crate::conversation::{FieldError, Tool, shorten};
use crate::format::{Calls, Format, deepseek};
use crate::lazy::{LazyGrammar, Trigger};
use ch04::MakeRule;
use ch15::schema::{Strictness, convert_text};
use ch15::{Constraint, Source, compile};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::sync::Arc;

/// What the request allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// No calls: the tools are in the prompt, the answer is text.
    None,
    /// The model chooses; a call it opens is held to the schemas.
    Auto,
    /// At least one call, held to the schemas from the first token.
    Required,
    /// One call of this function.
    Named(String),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum WireChoice {
    Mode(String),
    Function {
        #[serde(rename = "type")]
        kind: String,
        function: Option<NamedFunction>,
    },
}

#[derive(Deserialize)]
struct NamedFunction {
    name: String,
}

/// OpenAI's `tool_choice` (its JSON text; absent: `auto` with tools, `none` without):
/// `"none"`, `"auto"`, `"required"` or `{"type": "function", "function": {"name": …}}` naming
/// one of `tools`.
pub fn read_tool_choice(text: Option<&RawValue>, tools: &[Tool]) -> Result<ToolChoice, FieldError> {
    let bad = |m: String| FieldError::new("tool_choice", "tool_choice", m);
    let Some(text) = text.map(RawValue::get).filter(|t| *t != "null") else {
        return Ok(if tools.is_empty() {
            ToolChoice::None
        } else {
            ToolChoice::Auto
        });
    };
    let choice = match serde_json::from_str::<WireChoice>(text) {
        Ok(WireChoice::Mode(m)) => match m.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(bad(format!(
                    "is {:?}; expected \"none\", \"auto\", \"required\" or a function",
                    shorten(other)
                )));
            }
        },
        Ok(WireChoice::Function {
            kind,
            function: Some(f),
        }) if kind == "function" => ToolChoice::Named(f.name),
        _ => {
            return Err(bad(
                "must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \
                 \"function\": {\"name\": …}}"
                    .into(),
            ));
        }
    };
    match &choice {
        ToolChoice::Named(name) if !tools.iter().any(|t| &t.name == name) => Err(bad(format!(
            "names the function {:?}, which is not among `tools`",
            shorten(name)
        ))),
        ToolChoice::Required | ToolChoice::Named(_) if tools.is_empty() => {
            Err(bad("asks for a call, but `tools` offers none".into()))
        }
        _ => Ok(choice),
    }
}

/// The sampler rule for `choice`: `None` where the answer is free (no tools, `none`, or a
/// format whose calls have no grammar here).
pub fn rule(
    format: Format,
    tools: &[Tool],
    choice: &ToolChoice,
    parallel: bool,
    thinking_open: bool,
) -> Result<Option<Arc<dyn MakeRule>>, FieldError> {
    let chosen: Vec<&Tool> = match choice {
        ToolChoice::None => return Ok(None),
        ToolChoice::Named(name) => tools.iter().filter(|t| &t.name == name).collect(),
        ToolChoice::Auto | ToolChoice::Required => tools.iter().collect(),
    };
    if chosen.is_empty() {
        return Ok(None);
    }
    let parallel = parallel && !matches!(choice, ToolChoice::Named(_));
    let calls = calls_grammar(format, &chosen, parallel)?;
    let lazy = *choice == ToolChoice::Auto;
    let root = if lazy {
        "root ::= calls\n".to_string()
    } else {
        // Reasoning may come first: text without `<` up to the closing marker, after the
        // opening one unless the prompt already opened it.
        match format.think {
            Some((_, close)) if thinking_open => {
                format!("root ::= [^<]* {} [ \\n]* calls\n", gbnf_literal(close))
            }
            Some((open, close)) => format!(
                "root ::= ({} [^<]* {} [ \\n]*)? calls\n",
                gbnf_literal(open),
                gbnf_literal(close)
            ),
            None => "root ::= calls\n".to_string(),
        }
    };
    let text = root + &calls;
    let grammar = compile(&Source::Grammar(text)).map_err(|e| {
        FieldError::new(
            "tools",
            "tools",
            format!("the grammar of the tools' calls: {e}"),
        )
    })?;
    let constraint = Constraint::new(grammar);
    if lazy {
        let trigger = match format.calls {
            Calls::Tagged { open, .. } => Trigger::Word(open),
            Calls::Listed { marker } => Trigger::Word(marker),
            // The tag is a control token: chapter 15 sees no text in it, so the call's `{` is
            // still the first it sees.
            Calls::Bare { .. } => Trigger::Start("{"),
            Calls::DeepSeek => Trigger::Word(deepseek::CALLS_BEGIN),
        };
        Ok(Some(Arc::new(LazyGrammar::new(trigger, constraint))))
    } else {
        Ok(Some(Arc::new(constraint)))
    }
}

/// The GBNF of a turn's calls in `format` (rule `calls`, and the rules it uses). Each tool's
/// call is converted on its own, its rules prefixed with the tool's number, so that one tool's
/// `$defs` cannot meet another's; `call` is any of them.
fn calls_grammar(format: Format, tools: &[&Tool], parallel: bool) -> Result<String, FieldError> {
    let mut rules = String::new();
    let mut alternatives = Vec::with_capacity(tools.len());
    for (i, t) in tools.iter().enumerate() {
        // DeepSeek R1 writes the name outside the JSON: its arguments are the object.
        let schema = match format.calls {
            Calls::DeepSeek => t.parameters.clone(),
            _ => call_schema(format, t),
        };
        let converted = convert_text(&schema, Strictness::Strict)
            .or_else(|_| convert_text(&schema, Strictness::LikeLlamaCpp))
            .map_err(|e| {
                FieldError::new(
                    "tools",
                    "tools",
                    format!(
                        "the parameters of {:?} cannot be held to: {e}",
                        shorten(&t.name)
                    ),
                )
            })?;
        let prefix = format!("t{i}");
        rules.push_str(&prefix_rules(&converted.grammar, &prefix));
        alternatives.push(match format.calls {
            Calls::DeepSeek => format!(
                "{} \"function\" {} {} \"\\n```json\\n\" {prefix}-root \"\\n```\" {}",
                gbnf_literal(deepseek::CALL_BEGIN),
                gbnf_literal(deepseek::SEP),
                gbnf_literal(&t.name),
                gbnf_literal(deepseek::CALL_END)
            ),
            _ => format!("{prefix}-root"),
        });
    }
    let call = format!("call ::= {}\n", alternatives.join(" | "));
    let calls = match format.calls {
        Calls::Tagged { open, close } => {
            let one = format!(
                "{} \"\\n\"? call \"\\n\"? {}",
                gbnf_literal(open),
                gbnf_literal(close)
            );
            if parallel {
                format!("calls ::= {one} (\"\\n\" {one})*\n")
            } else {
                format!("calls ::= {one}\n")
            }
        }
        Calls::Listed { marker } => {
            let more = if parallel { " (\", \" call)*" } else { "" };
            format!(
                "calls ::= {} \"[\" call{more} \"]\"\n",
                gbnf_literal(marker)
            )
        }
        Calls::Bare { .. } => "calls ::= call\n".to_string(),
        Calls::DeepSeek => {
            let more = if parallel { " call*" } else { "" };
            format!(
                "calls ::= {} call{more} {}\n",
                gbnf_literal(deepseek::CALLS_BEGIN),
                gbnf_literal(deepseek::CALLS_END)
            )
        }
    };
    Ok(calls + &call + &rules)
}

/// The JSON Schema of one call of `t` in `format`: its name a `const`, its parameters as the
/// arguments (Mistral's calls also carry a nine-character id). The parameters' `$defs` and
/// `definitions` move to the call's root, so that their `#/$defs/…` references still resolve
/// (pydantic writes its models' schemas so).
fn call_schema(format: Format, t: &Tool) -> String {
    let params: std::collections::BTreeMap<String, &RawValue> =
        serde_json::from_str(&t.parameters).unwrap_or_default();
    let key = |k: &str| serde_json::to_string(k).expect("a string");
    let (defs, rest): (Vec<_>, Vec<_>) = params
        .iter()
        .partition(|(k, _)| *k == "$defs" || *k == "definitions");
    let object = |entries: &[(&String, &&RawValue)]| {
        let items: Vec<String> = entries
            .iter()
            .map(|(k, v)| format!("{}: {}", key(k), v.get()))
            .collect();
        format!("{{{}}}", items.join(", "))
    };
    let arguments = object(&rest);
    let name = key(&t.name);
    let listed = matches!(format.calls, Calls::Listed { .. });
    let (id, required) = if listed {
        (
            r#", "id": {"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"}"#,
            format!(r#"["name", "{}", "id"]"#, format.arguments_key),
        )
    } else {
        ("", format!(r#"["name", "{}"]"#, format.arguments_key))
    };
    let hoisted: String = defs
        .iter()
        .map(|(k, v)| format!("{}: {}, ", key(k), v.get()))
        .collect();
    format!(
        r#"{{{hoisted}"type": "object", "properties": {{"name": {{"const": {name}}}, "{}": {arguments}{id}}}, "required": {required}, "additionalProperties": false}}"#,
        format.arguments_key
    )
}

/// `text` as a GBNF string literal.
fn gbnf_literal(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `grammar` with every rule's name (in definitions and references) prefixed with `prefix-`:
/// names are everything outside literals, character classes, repetition counts and comments.
fn prefix_rules(grammar: &str, prefix: &str) -> String {
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'-' || b == b'_';
    let bytes = grammar.as_bytes();
    let mut out = String::with_capacity(grammar.len() * 2);
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        // A literal or a class, copied whole (escapes included).
        let close = match c {
            b'"' => Some(b'"'),
            b'[' => Some(b']'),
            b'{' => Some(b'}'),
            b'#' => Some(b'\n'),
            _ => None,
        };
        if let Some(close) = close {
            let start = i;
            i += 1;
            while i < bytes.len() && bytes[i] != close {
                i += if bytes[i] == b'\\' { 2 } else { 1 };
            }
            i = (i + 1).min(bytes.len());
            out.push_str(&grammar[start..i]);
            continue;
        }
        if ident(c) {
            let start = i;
            while i < bytes.len() && ident(bytes[i]) {
                i += 1;
            }
            out.push_str(prefix);
            out.push('-');
            out.push_str(&grammar[start..i]);
            continue;
        }
        // Anything else: one character (a multi-byte one whole).
        let n = grammar[i..].chars().next().map_or(1, char::len_utf8);
        out.push_str(&grammar[i..i + n]);
        i += n;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_names_are_prefixed_and_nothing_else() {
        let g =
            "root ::= \"root\" my-root [r-o] x{2,3} root # root\nmy-root ::= [^\\]] \"\\\"a\"\n";
        assert_eq!(
            prefix_rules(g, "t0"),
            "t0-root ::= \"root\" t0-my-root [r-o] t0-x{2,3} t0-root # root\n\
             t0-my-root ::= [^\\]] \"\\\"a\"\n"
        );
    }

    #[test]
    fn a_tools_defs_are_hoisted_so_its_references_resolve() {
        // pydantic's shape: a model referring to another, and to itself.
        let params = r##"{"$defs": {"Node": {"type": "object", "properties": {"label": {"type": "string", "maxLength": 8},
            "kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}, "maxItems": 2}}, "required": ["label"]}},
            "type": "object", "properties": {"root": {"$ref": "#/$defs/Node"}}, "required": ["root"]}"##;
        let tree = Tool {
            name: "tree".into(),
            description: String::new(),
            parameters: params.into(),
        };
        let flat = Tool {
            name: "flat".into(),
            description: String::new(),
            parameters: "{}".into(),
        };
        let text = calls_grammar(crate::format::HERMES, &[&flat, &tree], false).unwrap();
        let g = ch15::Grammar::parse(&format!("root ::= calls\n{text}"), "root")
            .unwrap_or_else(|e| panic!("{e}\n{text}"));
        let call = r#"<tool_call>{"name": "tree", "arguments": {"root": {"label": "a", "kids": [{"label": "b"}]}}}</tool_call>"#;
        assert!(g.matches(call.as_bytes()), "{call}\n{text}");
        assert!(g.matches(br#"<tool_call>{"name": "flat", "arguments": {}}</tool_call>"#));
        let too_long = call.replace("\"b\"", "\"abcdefghi\"");
        assert!(!g.matches(too_long.as_bytes()));
    }

    #[test]
    fn deepseeks_calls_name_the_function_outside_the_json() {
        let tool = Tool {
            name: "get_weather".into(),
            description: String::new(),
            parameters: r#"{"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"], "additionalProperties": false}"#
                .into(),
        };
        let text = calls_grammar(crate::format::DEEPSEEK_R1, &[&tool], true).unwrap();
        let g = ch15::Grammar::parse(&format!("root ::= calls\n{text}"), "root")
            .unwrap_or_else(|e| panic!("{e}\n{text}"));
        let call = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n\
                    {\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>";
        let calls = |n: usize| {
            format!(
                "<｜tool▁calls▁begin｜>{}<｜tool▁calls▁end｜>",
                call.repeat(n)
            )
        };
        assert!(g.matches(calls(1).as_bytes()), "{}\n{text}", calls(1));
        assert!(g.matches(calls(2).as_bytes()), "two calls, parallel");
        assert!(!g.matches(calls(0).as_bytes()), "no call");
        assert!(!g.matches(calls(1).replace("get_weather", "launch").as_bytes()));
        assert!(!g.matches(calls(1).replace("Paris", "\"").as_bytes()));
    }
}
