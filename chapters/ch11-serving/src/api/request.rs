//! The bodies of the two endpoints ([`ChatRequest`], [`CompletionRequest`]) and the checks
//! of their own fields: a chat's messages become chapter 2's messages, a completion's prompt
//! one text or token ids. The fields they share are [`Sampling`]'s.

use super::{ApiError, Sampling, echo};
use ch02::Message;
use serde::Deserialize;
use serde_json::Value;

/// `POST /v1/chat/completions`.
#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessage>,
    #[serde(flatten)]
    pub sampling: Sampling,
}

#[derive(Debug, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    /// A string, a list of parts (`{"type": "text", "text": …}`), or null (only in an
    /// assistant turn, which may have called tools instead).
    #[serde(default)]
    pub content: Option<Content>,
    /// A participant's name: refused, since the chat templates have no place for it.
    #[serde(default)]
    pub name: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Deserialize)]
pub struct Part {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

/// `POST /v1/completions`.
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub prompt: Prompt,
    #[serde(default)]
    pub echo: bool,
    pub suffix: Option<String>,
    #[serde(flatten)]
    pub sampling: Sampling,
}

/// `prompt`: a string, a list of one string, or token ids.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
}

/// The roles a message may have. The role is written among the template's markers, so it is
/// never free text.
pub const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

impl ChatRequest {
    /// The conversation as chapter 2's messages: at least one, each checked by
    /// [`ChatMessage::to_message`].
    pub fn messages(&self) -> Result<Vec<Message>, ApiError> {
        if self.messages.is_empty() {
            return Err(ApiError::invalid(
                "messages",
                "`messages` must not be empty",
            ));
        }
        self.messages
            .iter()
            .enumerate()
            .map(|(i, m)| m.to_message(i))
            .collect()
    }
}

// ANCHOR: message
impl ChatMessage {
    /// Message `i` of a conversation as chapter 2's message, or a 400 naming what is wrong: a
    /// role outside [`ROLES`] (`developer` is OpenAI's newer name for `system`), a participant's
    /// name, no content outside an assistant's turn, a part that is not text.
    pub fn to_message(&self, i: usize) -> Result<Message, ApiError> {
        // ANCHOR: yours_message
        if !ROLES.contains(&self.role.as_str()) {
            return Err(ApiError::invalid(
                "messages",
                format!(
                    "messages[{i}].role is {:?}; expected one of {}",
                    echo(&self.role),
                    ROLES.join(", ")
                ),
            ));
        }
        let role = if self.role == "developer" {
            "system"
        } else {
            &self.role
        };
        if self.name.as_ref().is_some_and(|n| !n.is_null()) {
            return Err(ApiError::invalid(
                "messages",
                format!(
                    "messages[{i}].name is not supported: the chat template has no place for a \
                     participant's name"
                ),
            ));
        }
        let content = match &self.content {
            None if self.role == "assistant" => String::new(),
            None => {
                return Err(ApiError::invalid(
                    "messages",
                    format!(
                        "messages[{i}].content is missing or null; only an assistant message may \
                         have none"
                    ),
                ));
            }
            Some(c) => c.text(i)?,
        };
        Ok(Message::new(role, &content))
        // ANCHOR_END: yours_message
    }
}
// ANCHOR_END: message

impl Content {
    /// The text of message `i`'s content: a string as it is, or its text parts joined (a part
    /// of another type is a 400).
    pub fn text(&self, i: usize) -> Result<String, ApiError> {
        let parts = match self {
            Content::Text(t) => return Ok(t.clone()),
            Content::Parts(parts) => parts,
        };
        let mut text = String::new();
        for (j, p) in parts.iter().enumerate() {
            match (p.kind.as_str(), &p.text) {
                ("text", Some(t)) => text.push_str(t),
                (kind, _) => {
                    return Err(ApiError::invalid(
                        "messages",
                        format!(
                            "messages[{i}].content[{j}] is of type {:?}: this model reads text \
                             parts only",
                            echo(kind)
                        ),
                    ));
                }
            }
        }
        Ok(text)
    }
}

impl CompletionRequest {
    /// The prompt: text to tokenize, or token ids as given.
    pub fn prompt(&self) -> Result<Prompt, ApiError> {
        if self.echo {
            return Err(ApiError::invalid("echo", "`echo` is not supported"));
        }
        if self.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::invalid("suffix", "`suffix` is not supported"));
        }
        match &self.prompt {
            Prompt::Texts(t) if t.len() != 1 => Err(ApiError::invalid(
                "prompt",
                format!(
                    "`prompt` is a list of {} strings; this server completes one prompt per request",
                    t.len()
                ),
            )),
            Prompt::Texts(t) => Ok(Prompt::Text(t[0].clone())),
            Prompt::Text(t) => Ok(Prompt::Text(t.clone())),
            Prompt::Tokens(t) => Ok(Prompt::Tokens(t.clone())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_message_needs_content_unless_it_is_the_assistants_and_has_no_name() {
        for (message, expect) in [
            (
                json!({"role": "user", "content": null}),
                "messages[0].content",
            ),
            (json!({"role": "system"}), "messages[0].content"),
            (
                json!({"role": "user", "content": "Hi", "name": "bob"}),
                "messages[0].name",
            ),
        ] {
            let r: ChatRequest = serde_json::from_value(json!({ "messages": [message] })).unwrap();
            let e = r.messages().unwrap_err();
            assert_eq!(e.param, Some("messages"));
            assert!(e.message.contains(expect), "{}", e.message);
        }
        // What clients send that must pass: a name that is JSON null (some clients write every
        // field), and an assistant's turn with no content.
        for message in [
            json!({"role": "user", "content": "Hi", "name": null}),
            json!({"role": "assistant"}),
            json!({"role": "assistant", "content": null, "name": null}),
        ] {
            let r: ChatRequest =
                serde_json::from_value(json!({ "messages": [message.clone()] })).unwrap();
            let m = r
                .messages()
                .unwrap_or_else(|e| panic!("{message} refused: {}", e.message));
            assert_eq!(m.len(), 1, "{message}");
        }
    }

    #[test]
    fn messages_take_text_parts_and_refuse_unknown_roles() {
        let r: ChatRequest = serde_json::from_value(json!({"messages": [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "!"}]},
            {"role": "assistant", "content": null},
        ]}))
        .unwrap();
        let m = r.messages().unwrap();
        assert_eq!(m[0], Message::new("system", "Be brief."));
        assert_eq!(m[1], Message::new("user", "Hi!"));
        assert_eq!(m[2], Message::new("assistant", ""));
        let r: ChatRequest =
            serde_json::from_value(json!({"messages": [{"role": "<|im_start|>", "content": ""}]}))
                .unwrap();
        assert!(
            r.messages()
                .unwrap_err()
                .message
                .contains("messages[0].role")
        );
    }
}
