//! Reading a schema document into the tree (llama.cpp's `common_chat_schema_from_json`): each
//! keyword used, an annotation, or unable to apply to the node's type — otherwise reported
//! (an error when strict, a warning like llama.cpp's otherwise).

use std::collections::{HashMap, HashSet};

use super::decimals::NumBound;
use super::json::{Json, get, has};
use super::keywords::{KeywordClass, NOT_ENFORCED, Types, keyword_class};
use super::refs::check_left_recursion;
use super::tree::{Document, Format, Kind, Node, NodeId, Property};
use super::{
    MAX_SCHEMA_DEPTH, MAX_SCHEMA_NODES, MAX_VISITS, SchemaError, Stop, Strictness, Warnings,
    invalid, unsupported,
};

/// Reads a schema into a [`Document`] (llama.cpp's `common_chat_schema_from_json`), checking
/// each keyword is used, an annotation, or cannot apply.
pub(super) struct Builder<'j, 'w> {
    pub(super) root: &'j Json,
    nodes: Vec<Node>,
    /// Each `$ref` built once; None while its target is being built (a cycle stops there).
    pub(super) refs: HashMap<String, Option<NodeId>>,
    /// The keys of the large objects `$ref`s lead through (`$defs` with thousands of
    /// entries), by the object's address: found by a hash, not by reading the entries before.
    pub(super) keys: HashMap<usize, HashMap<&'j str, &'j Json>>,
    warnings: &'w mut Warnings,
    stop: Stop<'w>,
}

impl<'j, 'w> Builder<'j, 'w> {
    pub(super) fn build(
        root: &'j Json,
        warnings: &'w mut Warnings,
        stop: Stop<'w>,
    ) -> Result<Document, SchemaError> {
        let mut b = Builder {
            root,
            nodes: Vec::new(),
            refs: HashMap::new(),
            keys: HashMap::new(),
            warnings,
            stop,
        };
        let root_id = b.build_node(root, "#", 0, None)?;
        let refs = b
            .refs
            .iter()
            .filter_map(|(k, v)| v.map(|id| (k.clone(), id)))
            .collect::<HashMap<_, _>>();
        let doc = Document {
            nodes: std::mem::take(&mut b.nodes),
            refs,
            root: root_id,
        };
        check_left_recursion(&doc)?;
        // A `type` next to `$ref` or `anyOf` is left out: it must hold for every alternative.
        let mut budget = MAX_VISITS;
        for (id, node) in doc.nodes.iter().enumerate() {
            let Some(declared) = node.declared else {
                continue;
            };
            if matches!(node.kind, Kind::Ref(_) | Kind::AnyOf(_)) {
                let types = doc.value_types(id, &mut HashSet::new(), 0, &mut budget)?;
                if !types.within(declared) {
                    b.warnings.report(unsupported(
                        &node.path,
                        "type",
                        "some alternative allows another type, and the grammar would not \
                         enforce `type`",
                    ))?;
                }
            }
        }
        Ok(doc)
    }

    pub(super) fn add(
        &mut self,
        kind: Kind,
        path: &str,
        declared: Option<Types>,
    ) -> Result<NodeId, SchemaError> {
        if self.nodes.len() >= MAX_SCHEMA_NODES {
            return Err(SchemaError::TooManyNodes {
                limit: MAX_SCHEMA_NODES,
            });
        }
        self.nodes.push(Node {
            kind,
            path: path.to_string(),
            declared,
        });
        Ok(self.nodes.len() - 1)
    }

    /// Report every keyword of `obj` that is neither used (`used`), an annotation, nor unable
    /// to apply to the values the node allows (`types`).
    pub(super) fn check_rest(
        &mut self,
        obj: &[(String, Json)],
        used: &[&str],
        types: Types,
        path: &str,
    ) -> Result<(), SchemaError> {
        for (key, value) in obj {
            if used.contains(&key.as_str()) {
                continue;
            }
            match keyword_class(key) {
                KeywordClass::Annotation => {}
                KeywordClass::Typed(t) if !t.allowed_by(types) => {}
                KeywordClass::Unknown => self.warnings.report(unsupported(
                    path,
                    key,
                    "not a JSON Schema keyword this converter knows",
                ))?,
                _ if key == "additionalProperties" && *value == Json::Bool(true) => {}
                _ => self.warnings.report(unsupported(path, key, NOT_ENFORCED))?,
            }
        }
        Ok(())
    }

    /// Build the node of `schema`. `type_override` is one entry of a `type` list being
    /// expanded, `outer` what the whole list allows.
    pub(super) fn build_node(
        &mut self,
        schema: &'j Json,
        path: &str,
        depth: usize,
        type_override: Option<(&'j Json, Option<Types>)>,
    ) -> Result<NodeId, SchemaError> {
        if depth > MAX_SCHEMA_DEPTH {
            return Err(SchemaError::TooDeep {
                path: path.to_string(),
                limit: MAX_SCHEMA_DEPTH,
            });
        }
        self.stop.step()?;
        let Json::Object(obj) = schema else {
            return Err(invalid(path, "schema must be an object"));
        };
        if let Some(r) = get(obj, "$ref") {
            return self.build_ref(obj, r, path, depth);
        }
        if has(obj, "oneOf") || has(obj, "anyOf") {
            let key = if has(obj, "oneOf") { "oneOf" } else { "anyOf" };
            let children =
                self.build_list(get(obj, key).unwrap_or(&Json::Null), path, key, depth)?;
            let declared = self.declared_type(obj, path)?;
            self.check_rest(obj, &[key, "type"], Types::ALL, path)?;
            return self.add(Kind::AnyOf(children), path, declared);
        }

        let (ty, outer) = match type_override {
            Some((t, outer)) => (Some(t), outer),
            None => (get(obj, "type"), None),
        };
        if let Some(Json::Array(types)) = ty {
            if types.is_empty() {
                return Err(invalid(path, "type must not be empty"));
            }
            let outer = Types::declared(ty.unwrap_or(&Json::Null));
            let mut children = Vec::with_capacity(types.len());
            for (i, t) in types.iter().enumerate() {
                let p = format!("{path}/type/{i}");
                children.push(self.build_node(schema, &p, depth, Some((t, outer)))?);
            }
            return self.add(Kind::AnyOf(children), path, None);
        }
        if let Some(v) = get(obj, "const") {
            self.check_value_types(std::slice::from_ref(v), ty, outer, path)?;
            self.check_rest(obj, &["const", "type"], Types::of(v), path)?;
            return self.add(Kind::Const(v.clone()), path, None);
        }
        if let Some(values) = get(obj, "enum") {
            let Json::Array(values) = values else {
                return Err(invalid(path, "enum must be a non-empty array"));
            };
            if values.is_empty() {
                return Err(invalid(path, "enum must be a non-empty array"));
            }
            self.check_value_types(values, ty, outer, path)?;
            let types = values.iter().fold(Types::NONE, |t, v| t.or(Types::of(v)));
            self.check_rest(obj, &["enum", "type"], types, path)?;
            return self.add(Kind::Enum(values.clone()), path, None);
        }
        let type_name = match ty {
            None | Some(Json::Null) => "",
            Some(Json::Str(s)) => s.as_str(),
            Some(_) => {
                return Err(invalid(
                    path,
                    "type must be a string or an array of strings",
                ));
            }
        };
        let has_properties = has(obj, "properties")
            || get(obj, "additionalProperties").is_some_and(|a| *a != Json::Bool(true));

        match type_name {
            "" => {
                if has_properties {
                    self.build_object(obj, path, depth)
                } else if has(obj, "allOf") {
                    self.build_all_of(obj, path, depth, None)
                } else if has(obj, "items") || has(obj, "prefixItems") {
                    self.build_array(obj, path, depth)
                } else if has(obj, "pattern")
                    || has(obj, "minLength")
                    || has(obj, "maxLength")
                    || get_format(obj, path)? != Format::None
                {
                    self.build_string(obj, path)
                } else {
                    self.check_rest(obj, &[], Types::ALL, path)?;
                    self.add(Kind::Any, path, None)
                }
            }
            "object" => {
                if !has_properties && has(obj, "allOf") {
                    self.build_all_of(obj, path, depth, Some(Types::OBJECT))
                } else {
                    self.build_object(obj, path, depth)
                }
            }
            "string" => {
                if has(obj, "allOf") {
                    self.build_all_of(obj, path, depth, Some(Types::STRING))
                } else {
                    self.build_string(obj, path)
                }
            }
            "array" => self.build_array(obj, path, depth),
            "integer" => self.build_integer(obj, path),
            "number" => self.build_number(obj, path),
            "boolean" => self.simple(obj, path, Kind::Boolean, Types::BOOLEAN),
            "null" => self.simple(obj, path, Kind::Null, Types::NULL),
            other => Err(invalid(path, format!("unrecognized type {other}"))),
        }
    }

    fn simple(
        &mut self,
        obj: &[(String, Json)],
        path: &str,
        kind: Kind,
        types: Types,
    ) -> Result<NodeId, SchemaError> {
        self.check_rest(obj, &["type"], types, path)?;
        self.add(kind, path, None)
    }

    /// The `type` next to a keyword that leaves it out, for a later check.
    pub(super) fn declared_type(
        &mut self,
        obj: &[(String, Json)],
        path: &str,
    ) -> Result<Option<Types>, SchemaError> {
        let Some(ty) = get(obj, "type") else {
            return Ok(None);
        };
        match Types::declared(ty) {
            Some(t) => Ok(Some(t)),
            None => {
                self.warnings.report(unsupported(
                    path,
                    "type",
                    "not a type name or a list of them",
                ))?;
                Ok(None)
            }
        }
    }

    /// `const` and `enum` leave `type` out: each value must be of the declared type.
    fn check_value_types(
        &mut self,
        values: &[Json],
        ty: Option<&Json>,
        outer: Option<Types>,
        path: &str,
    ) -> Result<(), SchemaError> {
        let Some(ty) = ty else { return Ok(()) };
        let Some(declared) = outer.or_else(|| Types::declared(ty)) else {
            return self.warnings.report(unsupported(
                path,
                "type",
                "not a type name or a list of them",
            ));
        };
        for v in values {
            if !Types::of(v).allowed_by(declared) {
                return self.warnings.report(unsupported(
                    path,
                    "type",
                    format!(
                        "the value {} is not of this type, and the grammar would allow it",
                        v.dumped()
                    ),
                ));
            }
        }
        Ok(())
    }

    fn build_list(
        &mut self,
        alts: &'j Json,
        path: &str,
        key: &str,
        depth: usize,
    ) -> Result<Vec<NodeId>, SchemaError> {
        let p = format!("{path}/{key}");
        let Json::Array(alts) = alts else {
            return Err(invalid(&p, "must be an array of schemas"));
        };
        if alts.is_empty() {
            return Err(invalid(&p, "must not be empty"));
        }
        let mut children = Vec::with_capacity(alts.len());
        for (i, alt) in alts.iter().enumerate() {
            children.push(self.build_node(alt, &format!("{p}/{i}"), depth + 1, None)?);
        }
        Ok(children)
    }

    fn build_all_of(
        &mut self,
        obj: &'j [(String, Json)],
        path: &str,
        depth: usize,
        declared: Option<Types>,
    ) -> Result<NodeId, SchemaError> {
        let children = self.build_list(
            get(obj, "allOf").unwrap_or(&Json::Null),
            path,
            "allOf",
            depth,
        )?;
        self.check_rest(obj, &["allOf", "type"], Types::ALL, path)?;
        self.add(Kind::AllOf(children), path, declared)
    }

    fn build_object(
        &mut self,
        obj: &'j [(String, Json)],
        path: &str,
        depth: usize,
    ) -> Result<NodeId, SchemaError> {
        let mut required: Vec<&str> = Vec::new();
        match get(obj, "required") {
            Some(Json::Array(names)) => {
                for n in names {
                    match n {
                        Json::Str(s) => required.push(s),
                        _ => self.warnings.report(unsupported(
                            path,
                            "required",
                            format!("{} is not a property name", n.dumped()),
                        ))?,
                    }
                }
            }
            Some(_) => self
                .warnings
                .report(unsupported(path, "required", "not an array"))?,
            None => {}
        }

        let mut properties = Vec::new();
        let required_set: HashSet<&str> = required.iter().copied().collect();
        let mut names: HashSet<&str> = HashSet::new();
        if let Some(props) = get(obj, "properties") {
            let Json::Object(props) = props else {
                return Err(invalid(path, "properties must be an object"));
            };
            for (name, prop) in props {
                let p = format!("{path}/properties/{name}");
                let schema = self.build_node(prop, &p, depth + 1, None)?;
                properties.push(Property {
                    name: name.clone(),
                    schema,
                    required: required_set.contains(name.as_str()),
                });
                names.insert(name);
            }
        }
        for name in &required {
            if !names.contains(name) {
                self.warnings.report(unsupported(
                    path,
                    "required",
                    format!(
                        "`{name}` is not among `properties`, and the grammar would not require it"
                    ),
                ))?;
            }
        }

        let additional = match get(obj, "additionalProperties") {
            Some(Json::Bool(true)) => Some(self.add(Kind::Any, path, None)?),
            Some(Json::Bool(false)) => None,
            Some(a @ Json::Object(_)) => Some(self.build_node(
                a,
                &format!("{path}/additionalProperties"),
                depth + 1,
                None,
            )?),
            Some(_) => {
                return Err(invalid(
                    path,
                    "additionalProperties must be a boolean or a schema",
                ));
            }
            // `{"type": "object"}` on its own allows any object; with `properties`, llama.cpp
            // allows no others.
            None if !has(obj, "properties") => Some(self.add(Kind::Any, path, None)?),
            None => None,
        };
        self.check_rest(
            obj,
            &["type", "properties", "required", "additionalProperties"],
            Types::OBJECT,
            path,
        )?;
        self.add(
            Kind::Object {
                properties,
                additional,
            },
            path,
            None,
        )
    }

    fn build_array(
        &mut self,
        obj: &'j [(String, Json)],
        path: &str,
        depth: usize,
    ) -> Result<NodeId, SchemaError> {
        let key = if has(obj, "items") {
            "items"
        } else if has(obj, "prefixItems") {
            "prefixItems"
        } else {
            ""
        };
        if key == "items" && has(obj, "prefixItems") {
            self.warnings.report(unsupported(
                path,
                "prefixItems",
                "`items` is there too and is used instead (as in llama.cpp)",
            ))?;
        }
        if let Some(Json::Array(items)) = get(obj, key) {
            let mut ids = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                ids.push(self.build_node(item, &format!("{path}/{key}/{i}"), depth + 1, None)?);
            }
            // A tuple has exactly its items: bounds that allow that many add nothing.
            let n = items.len() as u64;
            let mut used = vec!["type", key, "prefixItems"];
            if count_ok(obj, "minItems").is_some_and(|m| m <= n) {
                used.push("minItems");
            }
            if count_ok(obj, "maxItems").is_some_and(|m| m >= n) {
                used.push("maxItems");
            }
            if get(obj, "additionalItems") == Some(&Json::Bool(false)) {
                used.push("additionalItems");
            }
            self.check_rest(obj, &used, Types::ARRAY, path)?;
            return self.add(Kind::Tuple(ids), path, None);
        }
        let items = match get(obj, key) {
            Some(item) => self.build_node(item, &format!("{path}/{key}"), depth + 1, None)?,
            None => self.add(Kind::Any, path, None)?,
        };
        let min_items = get_count(obj, "minItems", path)?.unwrap_or(0);
        let max_items = get_count(obj, "maxItems", path)?;
        self.check_rest(
            obj,
            &["type", "items", "prefixItems", "minItems", "maxItems"],
            Types::ARRAY,
            path,
        )?;
        self.add(
            Kind::Array {
                items,
                min_items,
                max_items,
            },
            path,
            None,
        )
    }

    fn build_string(&mut self, obj: &[(String, Json)], path: &str) -> Result<NodeId, SchemaError> {
        let pattern = match get(obj, "pattern") {
            Some(Json::Str(p)) => p.clone(),
            Some(_) => return Err(invalid(path, "pattern must be a string")),
            None => String::new(),
        };
        let format = get_format(obj, path)?;
        if format == Format::None
            && let Some(Json::Str(f)) = get(obj, "format")
        {
            // A format the grammar cannot spell out would let any string through.
            self.warnings.report(unsupported(
                path,
                "format",
                format!("format `{f}` (the grammar knows date, time, date-time and uuid)"),
            ))?;
        }
        let min_length = get_count(obj, "minLength", path)?;
        let max_length = get_count(obj, "maxLength", path)?;
        // The pattern wins over a format, which wins over the lengths.
        let mut used = vec!["type", "pattern"];
        if pattern.is_empty() && format == Format::None {
            used.extend(["minLength", "maxLength"]);
        }
        self.check_rest(obj, &used, Types::STRING, path)?;
        let kind = Kind::String {
            pattern,
            format,
            min_length: min_length.unwrap_or(0),
            max_length,
        };
        self.add(kind, path, None)
    }

    /// A number: strictly, its bounds are enforced (llama.cpp enforces an integer's only, and
    /// converting like it a number's bounds are reported and left out).
    fn build_number(&mut self, obj: &[(String, Json)], path: &str) -> Result<NodeId, SchemaError> {
        let types = Types::NUMBER.or(Types::INTEGER);
        if self.warnings.strictness != Strictness::Strict {
            let unbounded = Kind::Number {
                min: None,
                max: None,
            };
            return self.simple(obj, path, unbounded, types);
        }
        let value = |key: &str| match get(obj, key) {
            None => Ok(None),
            Some(Json::Int(i)) => Ok(Some(*i as f64)),
            Some(Json::UInt(u)) => Ok(Some(*u as f64)),
            Some(Json::Float(f)) => Ok(Some(*f)),
            Some(_) => Err(invalid(path, format!("{key} must be a number"))),
        };
        let bound = |key: &str, exclusive: bool| {
            value(key).map(|v| v.map(|value| NumBound { value, exclusive }))
        };
        let mut min = None;
        for b in [bound("minimum", false)?, bound("exclusiveMinimum", true)?] {
            min = b.map(|b| NumBound::tighter_min(min, b)).or(min);
        }
        let mut max = None;
        for b in [bound("maximum", false)?, bound("exclusiveMaximum", true)?] {
            max = b.map(|b| NumBound::tighter_max(max, b)).or(max);
        }
        self.check_rest(obj, &RANGE_KEYWORDS, types, path)?;
        self.add(Kind::Number { min, max }, path, None)
    }

    fn build_integer(&mut self, obj: &[(String, Json)], path: &str) -> Result<NodeId, SchemaError> {
        let strict = self.warnings.strictness == Strictness::Strict;
        // llama.cpp reads `minimum` and only without it `exclusiveMinimum`; strictly, both
        // apply and the tighter one wins.
        let mut min = i64::MIN;
        if has(obj, "minimum") {
            min = get_bound(obj, "minimum", path, true)?;
        }
        if has(obj, "exclusiveMinimum") {
            if has(obj, "minimum") && !strict {
                self.warnings.report(unsupported(
                    path,
                    "exclusiveMinimum",
                    "`minimum` is used instead (as in llama.cpp)",
                ))?;
            } else {
                let b = get_bound(obj, "exclusiveMinimum", path, false)?;
                let b = b
                    .checked_add(1)
                    .ok_or_else(|| invalid(path, "exclusiveMinimum is too large"))?;
                min = min.max(b);
            }
        }
        let mut max = i64::MAX;
        if has(obj, "maximum") {
            max = get_bound(obj, "maximum", path, false)?;
        }
        if has(obj, "exclusiveMaximum") {
            if has(obj, "maximum") && !strict {
                self.warnings.report(unsupported(
                    path,
                    "exclusiveMaximum",
                    "`maximum` is used instead (as in llama.cpp)",
                ))?;
            } else {
                let b = get_bound(obj, "exclusiveMaximum", path, true)?;
                let b = b
                    .checked_sub(1)
                    .ok_or_else(|| invalid(path, "exclusiveMaximum is too small"))?;
                max = max.min(b);
            }
        }
        if min > max {
            return Err(invalid(
                path,
                format!("no integer lies between {min} and {max}"),
            ));
        }
        self.check_rest(obj, &RANGE_KEYWORDS, Types::INTEGER, path)?;
        self.add(Kind::Integer { min, max }, path, None)
    }
}

/// What a number's or an integer's node reads: its type and its range.
const RANGE_KEYWORDS: [&str; 5] = [
    "type",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
];

/// A non-negative integer keyword (`minItems`, `maxLength`, …), or an error naming it.
fn get_count(obj: &[(String, Json)], key: &str, path: &str) -> Result<Option<u64>, SchemaError> {
    match get(obj, key) {
        None => Ok(None),
        Some(v) => count_of(v)
            .map(Some)
            .ok_or_else(|| invalid(path, format!("{key} must be a non-negative integer"))),
    }
}

fn count_ok(obj: &[(String, Json)], key: &str) -> Option<u64> {
    get(obj, key).and_then(count_of)
}

fn count_of(v: &Json) -> Option<u64> {
    match v {
        Json::Int(i) => u64::try_from(*i).ok(),
        Json::UInt(u) => Some(*u),
        _ => None,
    }
}

/// An integer bound; a fractional one is rounded inwards, to the integers it still allows.
fn get_bound(
    obj: &[(String, Json)],
    key: &str,
    path: &str,
    round_up: bool,
) -> Result<i64, SchemaError> {
    let out_of_range = || invalid(path, format!("{key} is out of the 64-bit integer range"));
    match get(obj, key) {
        Some(Json::Int(i)) => Ok(*i),
        Some(Json::UInt(u)) => i64::try_from(*u).map_err(|_| out_of_range()),
        Some(Json::Float(f)) => {
            let r = if round_up { f.ceil() } else { f.floor() };
            // 2^63 is the first double past i64::MAX.
            if (-9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0).contains(&r) {
                Ok(r as i64)
            } else {
                Err(out_of_range())
            }
        }
        _ => Err(invalid(path, format!("{key} must be a number"))),
    }
}

fn get_format(obj: &[(String, Json)], path: &str) -> Result<Format, SchemaError> {
    let Some(f) = get(obj, "format") else {
        return Ok(Format::None);
    };
    let Json::Str(f) = f else {
        return Err(invalid(path, "format must be a string"));
    };
    Ok(match f.as_str() {
        "date" => Format::Date,
        "time" => Format::Time,
        "date-time" => Format::DateTime,
        "uuid" | "uuid1" | "uuid2" | "uuid3" | "uuid4" | "uuid5" => Format::Uuid,
        _ => Format::None,
    })
}
