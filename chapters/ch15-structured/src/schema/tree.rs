//! The schema tree (llama.cpp's `common_chat_schema`): the part of a schema the conversion
//! understands, one node per subschema, with the `$ref`s it holds resolved.

use std::collections::{HashMap, HashSet};

use super::decimals::NumBound;
use super::json::Json;
use super::keywords::Types;
use super::{MAX_SCHEMA_DEPTH, MAX_VISITS, SchemaError};

pub(super) type NodeId = usize;

/// The string formats llama.cpp has rules for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Format {
    None,
    Uuid,
    Date,
    Time,
    DateTime,
}

#[derive(Debug, Clone)]
pub(super) struct Property {
    pub(super) name: String,
    pub(super) schema: NodeId,
    pub(super) required: bool,
}

/// One node of the schema tree: the part of a schema the conversion understands.
#[derive(Debug, Clone)]
pub(super) enum Kind {
    /// Any JSON value.
    Any,
    /// A `$ref` into the document; the target is in [`Document::refs`].
    Ref(String),
    /// `anyOf`, `oneOf`, or a `type` list (one alternative per type).
    AnyOf(Vec<NodeId>),
    AllOf(Vec<NodeId>),
    Const(Json),
    Enum(Vec<Json>),
    Null,
    Boolean,
    /// Bounds of a number (strict conversion only; like llama.cpp, none).
    Number {
        min: Option<NumBound>,
        max: Option<NumBound>,
    },
    /// Inclusive bounds; `i64::MIN` / `i64::MAX` for none.
    Integer {
        min: i64,
        max: i64,
    },
    String {
        /// Empty when absent (as in llama.cpp, an empty pattern constrains nothing).
        pattern: String,
        format: Format,
        min_length: u64,
        max_length: Option<u64>,
    },
    Array {
        items: NodeId,
        min_items: u64,
        max_items: Option<u64>,
    },
    Tuple(Vec<NodeId>),
    Object {
        properties: Vec<Property>,
        /// None when no other properties are allowed.
        additional: Option<NodeId>,
    },
}

#[derive(Debug, Clone)]
pub(super) struct Node {
    pub(super) kind: Kind,
    /// JSON pointer of the schema this node came from, for messages.
    pub(super) path: String,
    /// A `type` next to `$ref`, `anyOf` or `allOf`, which the conversion leaves out: checked to
    /// add nothing (the alternatives' types already fall within it).
    pub(super) declared: Option<Types>,
}

pub(super) struct Document {
    pub(super) nodes: Vec<Node>,
    pub(super) refs: HashMap<String, NodeId>,
    pub(super) root: NodeId,
}

impl Document {
    pub(super) fn kind(&self, id: NodeId) -> &Kind {
        &self.nodes[id].kind
    }

    pub(super) fn target(&self, reference: &str) -> Option<NodeId> {
        self.refs.get(reference).copied()
    }

    /// The types of the values a node allows, as llama.cpp computes them (a `$ref` cycle adds
    /// nothing).
    pub(super) fn value_types(
        &self,
        id: NodeId,
        visiting: &mut HashSet<NodeId>,
        depth: usize,
        budget: &mut usize,
    ) -> Result<Types, SchemaError> {
        *budget = budget
            .checked_sub(1)
            .ok_or(SchemaError::TooMuchWork { limit: MAX_VISITS })?;
        if depth > MAX_SCHEMA_DEPTH {
            return Err(SchemaError::TooDeep {
                path: self.nodes[id].path.clone(),
                limit: MAX_SCHEMA_DEPTH,
            });
        }
        Ok(match self.kind(id) {
            Kind::Any => Types::ALL,
            Kind::Null => Types::NULL,
            Kind::Boolean => Types::BOOLEAN,
            Kind::Number { .. } => Types::NUMBER.or(Types::INTEGER),
            Kind::Integer { .. } => Types::INTEGER,
            Kind::String { .. } => Types::STRING,
            Kind::Array { .. } | Kind::Tuple(_) => Types::ARRAY,
            Kind::Object { .. } => Types::OBJECT,
            Kind::Const(v) => Types::of(v),
            Kind::Enum(vs) => vs.iter().fold(Types::NONE, |t, v| t.or(Types::of(v))),
            Kind::Ref(r) => {
                let Some(t) = self.target(r) else {
                    return Ok(Types::NONE);
                };
                if !visiting.insert(t) {
                    return Ok(Types::NONE);
                }
                let types = self.value_types(t, visiting, depth + 1, budget)?;
                visiting.remove(&t);
                types
            }
            Kind::AnyOf(children) => {
                let mut types = Types::NONE;
                for &c in children {
                    types = types.or(self.value_types(c, visiting, depth + 1, budget)?);
                }
                types
            }
            Kind::AllOf(children) => {
                let mut types = Types::ALL;
                for &c in children {
                    types = types.and(self.value_types(c, visiting, depth + 1, budget)?);
                }
                types
            }
        })
    }
}
