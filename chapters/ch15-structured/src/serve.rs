//! Structured output in chapter 11's server (feature `serve`): a request's `response_format`
//! (OpenAI's `json_object` and `json_schema`) or `grammar` (llama-server's) read into a
//! [`Source`], compiled once by [`Structured`], and handed to the scheduler as chapter 4's
//! [`MakeRule`]. Everything else of this chapter builds without the server.

use crate::formats::{JSON_OBJECT_SCHEMA, Source, Structured};
use ch04::MakeRule;
use ch11::Formats;
use ch11::api::{ApiError, Cancel};
use serde_json::Value;
use serde_json::value::RawValue;
use std::sync::Arc;

/// The fields of a `response_format` this server reads. `schema` stays text, so that its
/// properties keep their order.
#[derive(serde::Deserialize)]
struct ResponseFormat<'a> {
    #[serde(rename = "type")]
    kind: String,
    #[serde(borrow)]
    json_schema: Option<JsonSchemaField<'a>>,
    /// llama-server's `{"type": "json_object", "schema": {…}}`.
    #[serde(borrow)]
    schema: Option<&'a RawValue>,
}

#[derive(serde::Deserialize)]
struct JsonSchemaField<'a> {
    #[serde(borrow)]
    schema: Option<&'a RawValue>,
}

// ANCHOR: formats_rule
impl Formats for Structured {
    fn rule(
        &self,
        response_format: Option<&RawValue>,
        grammar: Option<&Value>,
        cancel: &Cancel,
    ) -> Result<Option<Arc<dyn MakeRule>>, ApiError> {
        let bad_format = |m: String| ApiError::invalid("response_format", m);
        let from_format = match response_format.map(RawValue::get) {
            None | Some("null") => None,
            Some(text) => {
                let f: ResponseFormat = serde_json::from_str(text).map_err(|e| {
                    bad_format(format!(
                        "`response_format` must be an object with a `type`: {e}"
                    ))
                })?;
                match (f.kind.as_str(), f.json_schema, f.schema) {
                    ("text", _, _) => None,
                    ("json_object", _, None) => {
                        Some(Source::JsonSchema(JSON_OBJECT_SCHEMA.to_string()))
                    }
                    ("json_object", _, Some(s)) => Some(Source::JsonSchema(s.get().to_string())),
                    ("json_schema", Some(JsonSchemaField { schema: Some(s) }), _) => {
                        Some(Source::JsonSchema(s.get().to_string()))
                    }
                    ("json_schema", _, _) => {
                        return Err(bad_format(
                            "`response_format` of type `json_schema` needs \
                             `json_schema.schema`"
                                .into(),
                        ));
                    }
                    (other, _, _) => {
                        return Err(bad_format(format!(
                            "`response_format.type` is {:?}; this server knows `text`, \
                             `json_object` and `json_schema`",
                            ch11::api::echo(other)
                        )));
                    }
                }
            }
        };
        // ANCHOR_END: formats_rule
        // ANCHOR: formats_choice
        let from_grammar = match grammar {
            None | Some(Value::Null) => None,
            Some(Value::String(g)) => Some(Source::Grammar(g.clone())),
            Some(_) => {
                return Err(ApiError::invalid(
                    "grammar",
                    "`grammar` must be a string of GBNF",
                ));
            }
        };
        let (source, field) = match (from_format, from_grammar) {
            (None, None) => return Ok(None),
            (Some(_), Some(_)) => {
                return Err(ApiError::invalid(
                    "grammar",
                    "give either `grammar` or a `response_format` with a schema, not both",
                ));
            }
            (Some(s), None) => (s, "response_format"),
            (None, Some(g)) => (g, "grammar"),
        };
        // A grammar at the size limit compiles in tens of milliseconds (`cargo bench -p ch15
        // --bench compile`); a request cancelled meanwhile stops it, and its error goes nowhere.
        let c = self
            .constraint_until(source, &|| cancel.is_cancelled())
            .map_err(|e| ApiError::invalid(field, e.to_string()))?;
        Ok(Some(Arc::new(c)))
    }

    /// Build the vocabulary's trie now, not in the first constrained request's time to first
    /// token (15 ms on the default model, 134 ms on Gemma 3's 262k tokens).
    fn prepare(&self, tokenizer: &ch02::Tokenizer) {
        self.build_index(tokenizer);
    }
}
// ANCHOR_END: formats_choice
