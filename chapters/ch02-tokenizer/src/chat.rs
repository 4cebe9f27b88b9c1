//! Chat templates: turning a conversation into the one string the model was trained on.
//!
//! A chat model never sees "messages"; it sees text with markers, for SmolLM2 ChatML:
//!
//! ```text
//! <|im_start|>user
//! Hi!<|im_end|>
//! <|im_start|>assistant
//! ```
//!
//! The model file carries the recipe as a Jinja template (`tokenizer.chat_template`), written
//! for Hugging Face transformers. Rendering it with a Jinja engine configured the way
//! transformers configures its own (`trim_blocks`, `lstrip_blocks`) gives the same string
//! for any template, where hand-written concatenation would cover one format at a time.

use crate::{Tokenizer, TokenizerError};
use std::ops::Range;

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// `"system"`, `"user"` or `"assistant"`.
    pub role: String,
    pub content: String,
    /// The turn's other fields, for templates that read them, in order: whatever a later
    /// stage gives the template besides the role and the content (a template sees them as
    /// `message.NAME`). Empty for the plain turns of this chapter.
    pub fields: Vec<(String, minijinja::Value)>,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Message {
        Message {
            role: role.to_string(),
            content: content.to_string(),
            fields: Vec::new(),
        }
    }

    /// The message as the template sees it: `role`, `content`, then its other fields.
    fn to_value(&self) -> minijinja::Value {
        let head = [
            (
                "role".to_string(),
                minijinja::Value::from(self.role.as_str()),
            ),
            (
                "content".to_string(),
                minijinja::Value::from(self.content.as_str()),
            ),
        ];
        let rest = self
            .fields
            .iter()
            .filter(|(k, _)| k != "role" && k != "content");
        object(head.into_iter().chain(rest.cloned()))
    }
}

/// A template's map (a Python dict) of `entries`, in their order.
pub fn object<K: Into<String>>(
    entries: impl IntoIterator<Item = (K, minijinja::Value)>,
) -> minijinja::Value {
    let map: indexmap::IndexMap<minijinja::Value, minijinja::Value> = entries
        .into_iter()
        .map(|(k, v)| (minijinja::Value::from(k.into()), v))
        .collect();
    minijinja::Value::from_object(map)
}

/// A template's variables besides `messages`, `add_generation_prompt`, `bos_token` and
/// `eos_token`: what a later stage hands the template (a template reads `NAME`).
pub type Vars<'a> = &'a [(String, minijinja::Value)];

/// A compiled chat template.
pub struct ChatTemplate {
    env: minijinja::Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
}

const NAME: &str = "chat_template";

/// The most minijinja instructions ("fuel") one render may run. A template is code from the
/// model file, and `{% for a in range(100000) %}{% for b in range(100000) %}` would run for
/// hours. Real templates need few, in proportion to the conversation: for 100 messages,
/// SmolLM2's template runs 2 313 instructions, and the costliest of the 42 real templates
/// (llama.cpp's collection and GGUF files) that render with this context, DeepSeek V4's,
/// 8 119; 800 119 for 10 000 messages (`examples/template_fuel.rs` measures them). 20 M is
/// 2 400 times that 100-message cost: 250 000 messages, far past any context window; a
/// runaway loop stops after about a second.
pub const MAX_TEMPLATE_FUEL: u64 = 20_000_000;

/// The longest rendered conversation, in bytes. A prompt must fit the model's context window:
/// 1 M tokens, the longest of today's open models, is about 4 MiB of text, and twice that
/// leaves room for scripts that take more bytes per token. A template that writes without end
/// stops here: the output is never held past this size.
pub const MAX_RENDERED_BYTES: usize = 8 << 20;

// ANCHOR: template
impl ChatTemplate {
    /// Compile `source`. `bos_token` and `eos_token` are the texts templates may refer to as
    /// `{{ bos_token }}` and `{{ eos_token }}`.
    pub fn new(
        source: &str,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<ChatTemplate, TokenizerError> {
        let mut env = minijinja::Environment::new();
        // transformers renders with trim_blocks and lstrip_blocks: a newline after a block tag
        // and the indentation before one are not output.
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()?,
        );
        env.set_fuel(Some(MAX_TEMPLATE_FUEL));
        // Templates call `raise_exception('...')` to reject a conversation they cannot render.
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    msg,
                ))
            },
        );
        // Python's string and dict methods (`.strip()`, `.startswith()`, `.items()`, …), which
        // templates written for transformers call; and `tojson` as Python writes JSON.
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", crate::template_json::tojson);
        env.add_template_owned(NAME, source.to_string())?;
        Ok(ChatTemplate {
            env,
            source: source.to_string(),
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }
    // ANCHOR_END: template

    /// The template's text: later stages read from it how a family writes what the template
    /// describes (its tool calls, say).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The template in `tokenizer.chat_template`, with the BOS and EOS token texts.
    pub fn from_gguf(gguf: &ch01::Gguf) -> Result<ChatTemplate, TokenizerError> {
        ChatTemplate::with_tokens_of(gguf, gguf.get_str("tokenizer.chat_template")?)
    }

    /// Compile `source` with the BOS and EOS token texts of `gguf`'s vocabulary: for a file
    /// without a template of its own, whose model family has a known one (chapter 13).
    pub fn with_tokens_of(gguf: &ch01::Gguf, source: &str) -> Result<ChatTemplate, TokenizerError> {
        let tokens = gguf.get_str_array("tokenizer.ggml.tokens")?;
        let text = |key: &'static str| -> Result<String, TokenizerError> {
            if gguf.get(key).is_none() {
                return Ok(String::new());
            }
            let id = gguf.get_u32(key)?;
            tokens.get(id as usize).map(|t| t.to_string()).ok_or(
                TokenizerError::SpecialIdOutOfRange {
                    key,
                    id,
                    n_tokens: tokens.len(),
                },
            )
        };
        ChatTemplate::new(
            source,
            &text("tokenizer.ggml.bos_token_id")?,
            &text("tokenizer.ggml.eos_token_id")?,
        )
    }

    // ANCHOR: render
    /// Render `messages`. With `add_generation_prompt` the text ends with the header of an
    /// assistant turn, so that what the model writes next is the answer. A template that runs
    /// more than [`MAX_TEMPLATE_FUEL`] instructions or writes more than [`MAX_RENDERED_BYTES`]
    /// is stopped with an error.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        self.render_counted(messages, add_generation_prompt)
            .map(|(text, _)| text)
    }

    /// [`ChatTemplate::render`], also returning the fuel the render used: how close a
    /// conversation comes to [`MAX_TEMPLATE_FUEL`].
    pub fn render_counted(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<(String, u64), TokenizerError> {
        self.render_with(messages, add_generation_prompt, &[])
    }

    // ANCHOR_END: render

    // ANCHOR: render_with
    /// [`ChatTemplate::render_counted`] with the variables `vars` besides the messages (a
    /// variable of the same name as one of the four is given instead of it).
    pub fn render_with(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        vars: Vars,
    ) -> Result<(String, u64), TokenizerError> {
        let template = self.env.get_template(NAME)?;
        let messages: Vec<minijinja::Value> = messages.iter().map(Message::to_value).collect();
        let base = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        };
        let extra = object(vars.iter().cloned());
        let context = minijinja::context! { ..extra, ..base };
        // minijinja writes its output in pieces; the writer refuses the piece that would pass
        // the limit, so the text never grows past it.
        let mut out = BoundedWriter {
            bytes: Vec::new(),
            limit: MAX_RENDERED_BYTES,
            overflowed: false,
        };
        let rendered = template.render_captured_to(context, &mut out);
        if out.overflowed {
            return Err(TokenizerError::TemplateOutputTooLong {
                limit: MAX_RENDERED_BYTES,
            });
        }
        let fuel = match rendered {
            Ok(captured) => captured.state().fuel_levels().map_or(0, |(used, _)| used),
            Err(e) if e.kind() == minijinja::ErrorKind::OutOfFuel => {
                return Err(TokenizerError::TemplateOutOfFuel {
                    limit: MAX_TEMPLATE_FUEL,
                });
            }
            Err(e) => return Err(e.into()),
        };
        // minijinja writes whole `str`s and the writer takes each whole or not at all.
        let text = String::from_utf8(out.bytes)
            .map_err(|e| TokenizerError::Template(format!("rendered text: {e}")))?;
        Ok((text, fuel))
    }
}
// ANCHOR_END: render_with

/// A rendered conversation, and where the messages' content lies in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    pub text: String,
    /// Byte ranges of `text` that are messages' content, in order; `None` when the template
    /// changes content beyond trimming it, so that it cannot be found.
    pub content: Option<Vec<Range<usize>>>,
}

// ANCHOR: encode_chat
impl ChatTemplate {
    /// The token ids of `messages` as the model reads them: the template's own text with its
    /// markers parsed as control tokens, the content of the messages taken literally. A user
    /// who types `<|im_end|><|im_start|>system` gets those characters, not a forged turn.
    /// Without such text the ids are those of `tokenizer.encode(&render(..), true, true)`.
    pub fn encode(
        &self,
        tokenizer: &Tokenizer,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        self.encode_with(tokenizer, messages, add_generation_prompt, &[])
    }

    /// [`ChatTemplate::encode`] with the variables `vars`. The messages' other fields and the
    /// variables are written among the template's markers, where they cannot be told apart
    /// from its text: text in them that spells a control token is refused.
    pub fn encode_with(
        &self,
        tokenizer: &Tokenizer,
        messages: &[Message],
        add_generation_prompt: bool,
        vars: Vars,
    ) -> Result<Vec<u32>, TokenizerError> {
        // A role is the template's input, written among its markers: it must be plain.
        for (i, m) in messages.iter().enumerate() {
            if let Some(id) = tokenizer.control_token_in(&m.role) {
                return Err(forged(i, "role", tokenizer, id));
            }
            for (name, v) in &m.fields {
                if let Some(id) = control_token_in_value(tokenizer, v) {
                    return Err(forged(i, name, tokenizer, id));
                }
            }
        }
        for (name, v) in vars {
            if let Some(id) = control_token_in_value(tokenizer, v) {
                return Err(TokenizerError::Template(format!(
                    "`{name}` contains the control token {:?} (id {id}), which the chat \
                     template's output would not keep apart from its own markers",
                    tokenizer.token_text(id).unwrap_or("")
                )));
            }
        }
        let rendered = self.render_marked_with(messages, add_generation_prompt, vars)?;
        match rendered.content {
            Some(literal) => Ok(tokenizer.encode_literal(&rendered.text, true, &literal)),
            None => {
                // The content cannot be told from the template's text: harmless unless it
                // holds a control token's text, and then refused rather than parsed.
                for (i, m) in messages.iter().enumerate() {
                    if let Some(id) = tokenizer.control_token_in(&m.content) {
                        return Err(forged(i, "content", tokenizer, id));
                    }
                }
                Ok(tokenizer.encode(&rendered.text, true, true))
            }
        }
    }
    // ANCHOR_END: encode_chat

    // ANCHOR: render_marked
    /// Render `messages`, and find where each message's content landed: render once more with
    /// every content replaced by a placeholder, which cuts the template's own text into the
    /// pieces around the contents, then walk the real text piece by piece. A template may
    /// write a content as it is or trimmed.
    pub fn render_marked(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<Rendered, TokenizerError> {
        self.render_marked_with(messages, add_generation_prompt, &[])
    }

    /// [`ChatTemplate::render_marked`] with the variables `vars`.
    pub fn render_marked_with(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        vars: Vars,
    ) -> Result<Rendered, TokenizerError> {
        let (text, _) = self.render_with(messages, add_generation_prompt, vars)?;
        // Placeholders: private-use characters around a tag that no role or content contains.
        let mut nonce = 0u32;
        let taken = |tag: &str| {
            messages
                .iter()
                .any(|m| m.role.contains(tag) || m.content.contains(tag))
        };
        while taken(&format!("\u{E000}{nonce}:")) {
            nonce += 1;
        }
        let open = format!("\u{E000}{nonce}:");
        let marked: Vec<Message> = messages
            .iter()
            .enumerate()
            .map(|(i, m)| Message {
                content: format!("{open}{i}\u{E001}"),
                ..m.clone()
            })
            .collect();
        let Ok((skeleton, _)) = self.render_with(&marked, add_generation_prompt, vars) else {
            return Ok(Rendered {
                text,
                content: None,
            });
        };
        let content = align(&text, &skeleton, &open, messages);
        Ok(Rendered { text, content })
    }
}
// ANCHOR_END: render_marked

fn forged(i: usize, field: &str, tokenizer: &Tokenizer, id: u32) -> TokenizerError {
    TokenizerError::Template(format!(
        "message {i}: its {field} contains the control token {:?} (id {id}), which the chat \
         template's output would not keep apart from its own markers",
        tokenizer.token_text(id).unwrap_or("")
    ))
}

/// The first control token spelled in any text of `v` (its strings, its keys, at any depth).
fn control_token_in_value(tokenizer: &Tokenizer, v: &minijinja::Value) -> Option<u32> {
    use minijinja::value::ValueKind;
    match v.kind() {
        ValueKind::String => tokenizer.control_token_in(v.as_str().unwrap_or("")),
        ValueKind::Seq | ValueKind::Map | ValueKind::Iterable => {
            let items: Vec<minijinja::Value> = v.try_iter().ok()?.collect();
            items.iter().find_map(|k| {
                control_token_in_value(tokenizer, k).or_else(|| {
                    (v.kind() == ValueKind::Map)
                        .then(|| v.get_item(k).ok())
                        .flatten()
                        .and_then(|x| control_token_in_value(tokenizer, &x))
                })
            })
        }
        _ => None,
    }
}

/// The ranges of `text` where the contents of `messages` are, given `skeleton`, the same
/// render with content `i` replaced by `{open}{i}\u{E001}`. `None` if `text` does not
/// follow the skeleton.
fn align(
    text: &str,
    skeleton: &str,
    open: &str,
    messages: &[Message],
) -> Option<Vec<Range<usize>>> {
    // The skeleton as pieces of the template's text around placeholders.
    let mut pieces = Vec::new();
    let mut order = Vec::new();
    let mut rest = skeleton;
    while let Some(at) = rest.find(open) {
        pieces.push(&rest[..at]);
        let after = &rest[at + open.len()..];
        let end = after.find('\u{E001}')?;
        order.push(
            after[..end]
                .parse::<usize>()
                .ok()
                .filter(|&i| i < messages.len())?,
        );
        rest = &after[end + '\u{E001}'.len_utf8()..];
    }
    pieces.push(rest);

    let mut pos = text.strip_prefix(pieces[0]).map(|_| pieces[0].len())?;
    let mut ranges = Vec::new();
    for (k, &i) in order.iter().enumerate() {
        let c = messages[i].content.as_str();
        let next = pieces[k + 1];
        let last = k + 2 == pieces.len();
        let fits = |cand: &str| {
            let after = text[pos..].strip_prefix(cand)?;
            let ok = if last {
                after == next
            } else {
                after.starts_with(next)
            };
            ok.then_some(cand.len())
        };
        let len = [c, c.trim(), c.trim_start(), c.trim_end()]
            .into_iter()
            .find_map(fits)?;
        if len > 0 {
            ranges.push(pos..pos + len);
        }
        pos += len + next.len();
    }
    (pos == text.len()).then_some(ranges)
}

/// Collects rendered text, failing a write that would take it past `limit` bytes.
struct BoundedWriter {
    bytes: Vec<u8>,
    limit: usize,
    overflowed: bool,
}

impl std::io::Write for BoundedWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if buf.len() > self.limit - self.bytes.len() {
            self.overflowed = true;
            return Err(std::io::Error::other(format!(
                "rendered text passes {} bytes",
                self.limit
            )));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trim_and_lstrip_blocks_as_in_transformers() {
        let source = "{% for m in messages %}\n    {{ m.role }}: {{ m.content }}\n{% endfor %}";
        let t = ChatTemplate::new(source, "<s>", "</s>").unwrap();
        let got = t.render(
            &[Message::new("user", "hi"), Message::new("assistant", "yo")],
            false,
        );
        assert_eq!(got.unwrap(), "    user: hi\n    assistant: yo\n");
    }

    #[test]
    fn raise_exception_and_syntax_errors_are_errors() {
        let t = ChatTemplate::new("{{ raise_exception('no system role') }}", "", "").unwrap();
        let e = t.render(&[], true).unwrap_err().to_string();
        assert!(e.contains("no system role"), "{e}");
        assert!(ChatTemplate::new("{% for %}", "", "").is_err());
    }

    #[test]
    fn endless_recursion_is_an_error() {
        let source = "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}";
        let t = ChatTemplate::new(source, "", "").unwrap();
        let e = t.render(&[], true).unwrap_err().to_string();
        assert!(e.contains("recursion limit"), "{e}");
    }
}
