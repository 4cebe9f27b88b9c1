//! The conversion (llama.cpp's `common_chat_schema_converter`): the tree visited from its root,
//! each node adding the rule that derives the JSON text it allows, under a name that is free.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;

use super::decimals::NumRange;
use super::integers::IntRange;
use super::primitives::{SPACE_RULE, is_reserved_name, primitive};
use super::syntax::{build_repetition, format_literal, rule_name_of};
use super::tree::{Document, Format, Kind, NodeId};
use super::{
    MAX_GRAMMAR_BYTES, MAX_RULES, MAX_SCHEMA_DEPTH, MAX_VISITS, SchemaError, Stop, Strictness,
    Warnings,
};

pub(super) struct Converter<'d, 'w> {
    pub(super) doc: &'d Document,
    pub(super) warnings: &'w mut Warnings,
    pub(super) stop: Stop<'w>,
    pub(super) rules: BTreeMap<String, String>,
    /// What `add_rule` learnt of the numbered names of each name taken by another body.
    pub(super) numbered: HashMap<String, Numbered>,
    /// Bytes the grammar text will have.
    pub(super) bytes: usize,
    visits: usize,
    /// Rules added since a pattern's conversion began, to take back if it fails.
    pub(super) journal: Option<Vec<String>>,
    pub(super) refs_being_resolved: HashSet<String>,
}

/// The names `name0`, `name1`, … that `add_rule` found taken, for one `name`.
#[derive(Default)]
pub(super) struct Numbered {
    /// `name0` up to `name{taken - 1}` are all rules.
    taken: usize,
    /// The first of those numbers that has each body.
    bodies: HashMap<String, usize>,
}

impl<'d, 'w> Converter<'d, 'w> {
    pub(super) fn new(doc: &'d Document, warnings: &'w mut Warnings, stop: Stop<'w>) -> Self {
        let mut c = Converter {
            doc,
            warnings,
            stop,
            rules: BTreeMap::new(),
            numbered: HashMap::new(),
            bytes: 0,
            visits: 0,
            journal: None,
            refs_being_resolved: HashSet::new(),
        };
        c.bytes = "space".len() + " ::= ".len() + SPACE_RULE.len() + 1;
        c.rules.insert("space".to_string(), SPACE_RULE.to_string());
        c
    }

    pub(super) fn format_grammar(&self) -> String {
        let mut out = String::with_capacity(self.bytes);
        for (name, body) in &self.rules {
            let _ = writeln!(out, "{name} ::= {body}");
        }
        out
    }

    /// Add a rule under `name` (made a valid rule name), or under `name0`, `name1`, … when the
    /// name is taken by another body; the name it got.
    pub(super) fn add_rule(&mut self, name: &str, body: &str) -> Result<String, SchemaError> {
        let esc = rule_name_of(name);
        let key = match self.rules.get(&esc) {
            None => esc,
            Some(b) if b == body => return Ok(esc),
            Some(_) => {
                // llama.cpp's name is the first `esc{i}` that is free or has this body. Many
                // names can make the same `esc` (every property named with one letter of
                // another script makes `-`), so what was tried is kept: the numbers before
                // `taken` are not tried again, and the bodies found there are looked up.
                let numbered = self.numbered.entry(esc.clone()).or_default();
                if let Some(&i) = numbered.bodies.get(body) {
                    return Ok(format!("{esc}{i}"));
                }
                loop {
                    let key = format!("{esc}{}", numbered.taken);
                    match self.rules.get(&key) {
                        Some(b) => {
                            numbered.bodies.entry(b.clone()).or_insert(numbered.taken);
                            numbered.taken += 1;
                            if b == body {
                                return Ok(key);
                            }
                        }
                        None => break key,
                    }
                }
            }
        };
        if self.rules.len() >= MAX_RULES {
            return Err(SchemaError::TooManyRules { limit: MAX_RULES });
        }
        self.bytes += key.len() + " ::= ".len() + body.len() + 1;
        if self.bytes > MAX_GRAMMAR_BYTES {
            return Err(SchemaError::GrammarTooLarge {
                limit: MAX_GRAMMAR_BYTES,
            });
        }
        if let Some(j) = &mut self.journal {
            j.push(key.clone());
        }
        self.rules.insert(key.clone(), body.to_string());
        Ok(key)
    }

    /// Add a primitive rule under `name`, and the primitives it uses under their own names.
    pub(super) fn add_primitive(
        &mut self,
        name: &str,
        primitive_name: &str,
    ) -> Result<String, SchemaError> {
        let (body, deps) = primitive(primitive_name).unwrap_or(("", &[]));
        let n = self.add_rule(name, body)?;
        for dep in deps {
            if !self.rules.contains_key(*dep) {
                self.add_primitive(dep, dep)?;
            }
        }
        Ok(n)
    }

    fn visit_primitive(&mut self, rule_name: &str, ty: &str) -> Result<String, SchemaError> {
        self.add_primitive(if rule_name == "root" { "root" } else { ty }, ty)
    }

    /// The rule that derives the values node `id` allows, named after `name`.
    pub(super) fn visit(
        &mut self,
        id: NodeId,
        name: &str,
        depth: usize,
    ) -> Result<String, SchemaError> {
        let doc = self.doc;
        let path = &doc.nodes[id].path;
        if depth > MAX_SCHEMA_DEPTH {
            return Err(SchemaError::TooDeep {
                path: path.clone(),
                limit: MAX_SCHEMA_DEPTH,
            });
        }
        self.visits += 1;
        if self.visits > MAX_VISITS {
            return Err(SchemaError::TooMuchWork { limit: MAX_VISITS });
        }
        self.stop.step()?;
        let rule_name = if is_reserved_name(name) {
            format!("{name}-")
        } else if name.is_empty() {
            "root".to_string()
        } else {
            name.to_string()
        };
        let sub_name = if name.is_empty() {
            String::new()
        } else {
            format!("{name}-")
        };

        match doc.kind(id) {
            Kind::Ref(r) => {
                let body = self.resolve_ref(r, depth)?;
                self.add_rule(&rule_name, &body)
            }
            Kind::AnyOf(alts) => {
                let mut rules = Vec::with_capacity(alts.len());
                for (i, &alt) in alts.iter().enumerate() {
                    let n = if name.is_empty() {
                        format!("alternative-{i}")
                    } else {
                        format!("{name}-{i}")
                    };
                    rules.push(self.visit(alt, &n, depth + 1)?);
                }
                self.add_rule(&rule_name, &rules.join(" | "))
            }
            Kind::AllOf(children) => self.visit_all_of(id, children, name, &rule_name, depth),
            Kind::Const(v) => self.add_rule(&rule_name, &format_literal(&v.dumped())),
            Kind::Enum(values) => {
                let alts: Vec<String> =
                    values.iter().map(|v| format_literal(&v.dumped())).collect();
                self.add_rule(&rule_name, &format!("({})", alts.join(" | ")))
            }
            Kind::Object {
                properties,
                additional,
            } => {
                if properties.is_empty()
                    && additional.is_some_and(|a| matches!(doc.kind(a), Kind::Any))
                {
                    let object = self.add_primitive("object", "object")?;
                    return self.add_rule(&rule_name, &object);
                }
                let props: Vec<(String, NodeId)> = properties
                    .iter()
                    .map(|p| (p.name.clone(), p.schema))
                    .collect();
                let required: HashSet<String> = properties
                    .iter()
                    .filter(|p| p.required)
                    .map(|p| p.name.clone())
                    .collect();
                let body = self.build_object_rule(&props, &required, name, *additional, depth)?;
                self.add_rule(&rule_name, &body)
            }
            Kind::Tuple(items) => {
                let mut rule = String::from("\"[\" space ");
                for (i, &item) in items.iter().enumerate() {
                    if i > 0 {
                        rule.push_str(" \",\" space ");
                    }
                    rule.push_str(&self.visit(item, &format!("{sub_name}tuple-{i}"), depth + 1)?);
                }
                rule.push_str(" space \"]\"");
                self.add_rule(&rule_name, &rule)
            }
            Kind::Array {
                items,
                min_items,
                max_items,
            } => {
                if matches!(doc.kind(*items), Kind::Any) && *min_items == 0 && max_items.is_none() {
                    return self.visit_primitive(&rule_name, "array");
                }
                let item = self.visit(*items, &format!("{sub_name}item"), depth + 1)?;
                let rep = build_repetition(&item, *min_items, *max_items, "\",\" space", path)?;
                self.add_rule(&rule_name, &format!("\"[\" space {rep} space \"]\""))
            }
            Kind::String {
                pattern,
                format,
                min_length,
                max_length,
            } => {
                if !pattern.is_empty() {
                    return self.visit_pattern(pattern, &rule_name, path);
                }
                match format {
                    Format::Uuid => return self.visit_primitive(&rule_name, "uuid"),
                    Format::Date | Format::Time | Format::DateTime => {
                        let prim = match format {
                            Format::Date => "date-string",
                            Format::Time => "time-string",
                            _ => "date-time-string",
                        };
                        let r = self.add_primitive(prim, prim)?;
                        return self.add_rule(&rule_name, &r);
                    }
                    Format::None => {}
                }
                if *min_length > 0 || max_length.is_some() {
                    let char_rule = self.add_primitive("char", "char")?;
                    let rep = build_repetition(&char_rule, *min_length, *max_length, "", path)?;
                    return self.add_rule(&rule_name, &format!("\"\\\"\" {rep} \"\\\"\""));
                }
                self.visit_primitive(&rule_name, "string")
            }
            Kind::Integer { min, max } => {
                if *min == i64::MIN && *max == i64::MAX {
                    return self.visit_primitive(&rule_name, "integer");
                }
                let mut out = String::from("(");
                let exact = self.warnings.strictness == Strictness::Strict;
                IntRange {
                    out: &mut out,
                    path,
                    exact,
                }
                .build(*min, *max, 16, true)?;
                out.push(')');
                self.add_rule(&rule_name, &out)
            }
            Kind::Number {
                min: None,
                max: None,
            } => self.visit_primitive(&rule_name, "number"),
            Kind::Number { min, max } => {
                let mut out = String::from("(");
                NumRange {
                    out: &mut out,
                    path,
                }
                .build(*min, *max)?;
                out.push(')');
                self.add_rule(&rule_name, &out)
            }
            Kind::Boolean => self.visit_primitive(&rule_name, "boolean"),
            Kind::Null => self.visit_primitive(&rule_name, "null"),
            Kind::Any => {
                let value = self.add_primitive("value", "value")?;
                self.add_rule(&rule_name, &value)
            }
        }
    }
}
