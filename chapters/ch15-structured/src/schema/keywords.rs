//! Types and keywords: the set of JSON types a schema allows, and what each keyword constrains,
//! for deciding whether leaving a keyword out loosens the grammar.

use super::json::Json;

/// A set of JSON types, one bit each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Types(u8);

impl Types {
    pub(super) const NONE: Types = Types(0);
    pub(super) const NULL: Types = Types(1);
    pub(super) const BOOLEAN: Types = Types(2);
    pub(super) const NUMBER: Types = Types(4);
    pub(super) const INTEGER: Types = Types(8);
    pub(super) const STRING: Types = Types(16);
    pub(super) const ARRAY: Types = Types(32);
    pub(super) const OBJECT: Types = Types(64);
    pub(super) const ALL: Types = Types(127);

    pub(super) fn or(self, o: Types) -> Types {
        Types(self.0 | o.0)
    }
    pub(super) fn and(self, o: Types) -> Types {
        Types(self.0 & o.0)
    }
    pub(super) fn within(self, o: Types) -> bool {
        self.0 & !o.0 == 0
    }

    /// The values `"type": name` allows (a number may be an integer).
    fn named(name: &str) -> Option<Types> {
        Some(match name {
            "null" => Types::NULL,
            "boolean" => Types::BOOLEAN,
            "number" => Types::NUMBER.or(Types::INTEGER),
            "integer" => Types::INTEGER,
            "string" => Types::STRING,
            "array" => Types::ARRAY,
            "object" => Types::OBJECT,
            _ => return None,
        })
    }

    /// The values a `type` keyword allows, or None when it is not a type name or a list of them.
    pub(super) fn declared(ty: &Json) -> Option<Types> {
        match ty {
            Json::Str(s) => Types::named(s),
            Json::Array(a) => a.iter().try_fold(Types::NONE, |acc, t| {
                Some(acc.or(Types::named(t.as_str()?)?))
            }),
            _ => None,
        }
    }

    /// The type of a value (a whole-numbered float counts as an integer too).
    pub(super) fn of(v: &Json) -> Types {
        match v {
            Json::Null => Types::NULL,
            Json::Bool(_) => Types::BOOLEAN,
            Json::Int(_) | Json::UInt(_) => Types::INTEGER,
            Json::Float(f) if f.fract() == 0.0 => Types::NUMBER.or(Types::INTEGER),
            Json::Float(_) => Types::NUMBER,
            Json::Str(_) => Types::STRING,
            Json::Array(_) => Types::ARRAY,
            Json::Object(_) => Types::OBJECT,
        }
    }

    /// Whether a value of type `self` is allowed by `declared`.
    pub(super) fn allowed_by(self, declared: Types) -> bool {
        self.and(declared) != Types::NONE
    }
}

// ANCHOR: keyword_class
/// What a keyword does, for deciding whether leaving it out loosens the grammar.
pub(super) enum KeywordClass {
    /// Says something about the schema, constrains nothing.
    Annotation,
    /// Constrains only values of these types.
    Typed(Types),
    /// Constrains values of every type.
    General,
    /// Not a keyword this converter knows.
    Unknown,
}

pub(super) fn keyword_class(key: &str) -> KeywordClass {
    use KeywordClass::*;
    match key {
        // `format` and the `content*` keywords annotate by default in JSON Schema 2020-12.
        "title" | "description" | "$schema" | "$id" | "$comment" | "examples" | "default"
        | "deprecated" | "readOnly" | "writeOnly" | "$anchor" | "$dynamicAnchor"
        | "$recursiveAnchor" | "$vocabulary" | "$defs" | "definitions" | "format"
        | "contentEncoding" | "contentMediaType" | "contentSchema" => Annotation,
        "minLength" | "maxLength" | "pattern" => Typed(Types::STRING),
        "minimum" | "maximum" | "exclusiveMinimum" | "exclusiveMaximum" | "multipleOf" => {
            Typed(Types::NUMBER.or(Types::INTEGER))
        }
        "items" | "prefixItems" | "additionalItems" | "minItems" | "maxItems" | "uniqueItems"
        | "contains" | "minContains" | "maxContains" | "unevaluatedItems" => Typed(Types::ARRAY),
        "properties"
        | "required"
        | "additionalProperties"
        | "patternProperties"
        | "propertyNames"
        | "minProperties"
        | "maxProperties"
        | "dependentRequired"
        | "dependentSchemas"
        | "dependencies"
        | "unevaluatedProperties" => Typed(Types::OBJECT),
        "type" | "enum" | "const" | "allOf" | "anyOf" | "oneOf" | "not" | "if" | "then"
        | "else" | "$ref" | "$dynamicRef" | "$recursiveRef" => General,
        _ => Unknown,
    }
}
// ANCHOR_END: keyword_class

pub(super) const NOT_ENFORCED: &str = "the grammar would not enforce it";
