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

use crate::TokenizerError;

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// `"system"`, `"user"` or `"assistant"`.
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Message {
        Message {
            role: role.to_string(),
            content: content.to_string(),
        }
    }
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: minijinja::Environment<'static>,
    bos_token: String,
    eos_token: String,
}

const NAME: &str = "chat_template";

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
        env.add_template_owned(NAME, source.to_string())?;
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }

    /// The template in `tokenizer.chat_template`, with the BOS and EOS token texts.
    pub fn from_gguf(gguf: &ch01::Gguf) -> Result<ChatTemplate, TokenizerError> {
        let source = gguf.get_str("tokenizer.chat_template")?;
        let tokens = gguf.get_str_array("tokenizer.ggml.tokens")?;
        let text = |key: &str| -> Result<String, TokenizerError> {
            if gguf.get(key).is_none() {
                return Ok(String::new());
            }
            let id = gguf.get_u32(key)?;
            tokens
                .get(id as usize)
                .map(|t| t.to_string())
                .ok_or(TokenizerError::TokenOutOfRange {
                    id,
                    n_vocab: tokens.len(),
                })
        };
        ChatTemplate::new(
            source,
            &text("tokenizer.ggml.bos_token_id")?,
            &text("tokenizer.ggml.eos_token_id")?,
        )
    }

    /// Render `messages`. With `add_generation_prompt` the text ends with the header of an
    /// assistant turn, so that what the model writes next is the answer.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        let template = self.env.get_template(NAME)?;
        let messages: Vec<minijinja::Value> = messages
            .iter()
            .map(|m| minijinja::context! { role => &m.role, content => &m.content })
            .collect();
        Ok(template.render(minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        })?)
    }
}
// ANCHOR_END: template

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
}
