//! Objects: the rule of an object's properties — required ones in order, then the optional
//! ones, then additional properties under a key that is none of theirs — and the object (or
//! the common enum values) an `allOf` combines.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;

use super::convert::Converter;
use super::json::Json;
use super::keywords::{NOT_ENFORCED, Types};
use super::syntax::{class_char, format_literal};
use super::tree::{Kind, NodeId};
use super::{MAX_GRAMMAR_BYTES, MAX_SCHEMA_DEPTH, SchemaError, unsupported};

impl Converter<'_, '_> {
    /// An object (or the values common to enums) from `allOf`, as llama.cpp combines them: the
    /// properties of every object part (those inside an `anyOf` part optional), no others.
    pub(super) fn visit_all_of(
        &mut self,
        id: NodeId,
        children: &[NodeId],
        name: &str,
        rule_name: &str,
        depth: usize,
    ) -> Result<String, SchemaError> {
        let doc = self.doc;
        let mut parts = AllOfParts::default();
        for &child in children {
            if let Kind::AnyOf(alts) = doc.kind(child) {
                for &alt in alts {
                    self.add_component(alt, false, &mut parts, depth + 1)?;
                }
            } else {
                self.add_component(child, true, &mut parts, depth + 1)?;
            }
        }
        let path = &doc.nodes[id].path;
        let declared = doc.nodes[id].declared;
        if !parts.enum_values.is_empty() {
            let common: Vec<&String> = parts
                .enum_values
                .iter()
                .filter(|(_, (count, _))| *count == children.len())
                .map(|(lit, _)| lit)
                .collect();
            if !common.is_empty() {
                let types = parts
                    .enum_values
                    .values()
                    .filter(|(count, _)| *count == children.len())
                    .fold(Types::NONE, |t, (_, ty)| t.or(*ty));
                if parts.objects > 0 {
                    self.warnings.report(unsupported(
                        path,
                        "allOf",
                        "its object parts are dropped for the values its enums share",
                    ))?;
                }
                if declared.is_some_and(|d| !types.within(d)) {
                    self.warnings
                        .report(unsupported(path, "type", NOT_ENFORCED))?;
                }
                let body = format!(
                    "({})",
                    common
                        .iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(" | ")
                );
                return self.add_rule(rule_name, &body);
            }
            self.warnings.report(unsupported(
                path,
                "allOf",
                "its enums share no value and are dropped",
            ))?;
        }
        let mut seen = HashSet::new();
        for (prop, _) in &parts.properties {
            if !seen.insert(prop.as_str()) {
                self.warnings.report(unsupported(
                    path,
                    "allOf",
                    format!("property `{prop}` is in more than one part, and only one part's schema would hold"),
                ))?;
            }
        }
        if declared.is_some_and(|d| !Types::OBJECT.within(d)) {
            self.warnings
                .report(unsupported(path, "type", NOT_ENFORCED))?;
        }
        let body = self.build_object_rule(&parts.properties, &parts.required, name, None, depth)?;
        self.add_rule(rule_name, &body)
    }

    fn add_component(
        &mut self,
        comp: NodeId,
        is_required: bool,
        parts: &mut AllOfParts,
        depth: usize,
    ) -> Result<(), SchemaError> {
        let doc = self.doc;
        let node = &doc.nodes[comp];
        if depth > MAX_SCHEMA_DEPTH {
            return Err(SchemaError::TooDeep {
                path: node.path.clone(),
                limit: MAX_SCHEMA_DEPTH,
            });
        }
        match &node.kind {
            Kind::Ref(r) => {
                if let Some(t) = doc.target(r) {
                    self.add_component(t, is_required, parts, depth + 1)?;
                }
            }
            Kind::Object { properties, .. } => {
                parts.objects += 1;
                for p in properties {
                    parts.properties.push((p.name.clone(), p.schema));
                    if is_required {
                        parts.required.insert(p.name.clone());
                    } else if p.required {
                        self.warnings.report(unsupported(
                            &node.path,
                            "required",
                            format!(
                                "`{}` is made optional by the enclosing allOf's anyOf",
                                p.name
                            ),
                        ))?;
                    }
                }
            }
            Kind::Enum(values) => {
                for v in values {
                    let e = parts
                        .enum_values
                        .entry(format_literal(&v.dumped()))
                        .or_insert((0, Types::of(v)));
                    e.0 += 1;
                }
            }
            Kind::Any => {}
            _ => self.warnings.report(unsupported(
                &node.path,
                "allOf",
                "only objects, enums and $refs to them can be combined; this part is dropped",
            ))?,
        }
        Ok(())
    }

    /// The body of an object rule: required properties in order, then the optional ones, each
    /// alternative starting at one of them and allowing those after it (llama.cpp's `-rest`
    /// rules), then additional properties.
    pub(super) fn build_object_rule(
        &mut self,
        properties: &[(String, NodeId)],
        required: &HashSet<String>,
        name: &str,
        additional: Option<NodeId>,
        depth: usize,
    ) -> Result<String, SchemaError> {
        let sep = if name.is_empty() { "" } else { "-" };
        let mut kv_rules: HashMap<&str, String> = HashMap::new();
        let mut required_props: Vec<&str> = Vec::new();
        let mut optional_props: Vec<&str> = Vec::new();
        let mut prop_names: Vec<&str> = Vec::new();
        for (prop, schema) in properties {
            let prop_rule = self.visit(*schema, &format!("{name}{sep}{prop}"), depth + 1)?;
            let kv = self.add_rule(
                &format!("{name}{sep}{prop}-kv"),
                &format!(
                    "{} space \":\" space {prop_rule}",
                    format_literal(&Json::Str(prop.clone()).dumped())
                ),
            )?;
            kv_rules.insert(prop, kv);
            if required.contains(prop) {
                required_props.push(prop);
            } else {
                optional_props.push(prop);
            }
            prop_names.push(prop);
        }
        // Optional entries: (kv rule, whether it is the additional properties' own, name).
        let mut optional: Vec<(String, bool, &str)> = optional_props
            .iter()
            .map(|p| (kv_rules[p].clone(), false, *p))
            .collect();
        if let Some(add) = additional {
            let sub_name = format!("{name}{sep}additional");
            let value_rule = if matches!(self.doc.kind(add), Kind::Any) {
                self.add_primitive("value", "value")?
            } else {
                self.visit(add, &format!("{sub_name}-value"), depth + 1)?
            };
            let key_rule = if prop_names.is_empty() {
                self.add_primitive("string", "string")?
            } else {
                let body = self.not_strings(&prop_names)?;
                self.add_rule(&format!("{sub_name}-k"), &body)?
            };
            let kv = self.add_rule(
                &format!("{sub_name}-kv"),
                &format!("{key_rule} \":\" space {value_rule}"),
            )?;
            optional.push((kv, true, "*"));
        }

        if required_props.is_empty() && optional.is_empty() {
            return Ok("\"{\" space \"}\"".to_string());
        }
        let mut rule = String::from("\"{\" space ");
        for (i, p) in required_props.iter().enumerate() {
            if i > 0 {
                rule.push_str(" \",\" space ");
            }
            rule.push_str(&kv_rules[p]);
        }
        if !optional.is_empty() {
            rule.push_str(" (");
            if !required_props.is_empty() {
                rule.push_str(" \",\" space ( ");
            }
            // rest[j]: the rule for "optionally the j-th entry, then the rest", named after the
            // entry before it; added last to first, the order llama.cpp's recursion adds them.
            let n = optional.len();
            let mut rest: Vec<String> = vec![String::new(); n + 1];
            for j in (1..n).rev() {
                let (kv, is_additional, _) = &optional[j];
                let mut body = format!(
                    "( \",\" space {kv} ){}",
                    if *is_additional { "*" } else { "?" }
                );
                if j + 1 < n {
                    body.push(' ');
                    body.push_str(&rest[j + 1]);
                }
                rest[j] =
                    self.add_rule(&format!("{name}{sep}{}-rest", optional[j - 1].2), &body)?;
            }
            for (i, (kv, is_additional, _)) in optional.iter().enumerate() {
                if i > 0 {
                    rule.push_str(" | ");
                }
                rule.push_str(kv);
                if *is_additional {
                    let _ = write!(rule, " ( \",\" space {kv} )*");
                }
                if i + 1 < n {
                    rule.push(' ');
                    rule.push_str(&rest[i + 1]);
                }
            }
            if !required_props.is_empty() {
                rule.push_str(" )");
            }
            rule.push_str(" )?");
        }
        rule.push_str(" space \"}\"");
        Ok(rule)
    }

    /// A JSON string that is none of `strings`, from a trie of them: at each node, one of its
    /// characters followed by more, or another character followed by anything.
    fn not_strings(&mut self, strings: &[&str]) -> Result<String, SchemaError> {
        // children[node]: (character, child) in character order; ends[node]: a string ends here.
        let mut children: Vec<BTreeMap<char, usize>> = vec![BTreeMap::new()];
        let mut ends = vec![false];
        for s in strings {
            let mut node = 0;
            for c in s.chars() {
                node = match children[node].get(&c) {
                    Some(&n) => n,
                    None => {
                        children.push(BTreeMap::new());
                        ends.push(false);
                        let n = children.len() - 1;
                        children[node].insert(c, n);
                        n
                    }
                };
            }
            ends[node] = true;
        }
        let children: Vec<Vec<(char, usize)>> = children
            .into_iter()
            .map(|m| m.into_iter().collect())
            .collect();

        let char_rule = self.add_primitive("char", "char")?;
        let mut out = String::from("[\"] ( ");
        // An explicit stack: property names may be longer than the call stack is deep.
        struct Frame {
            node: usize,
            next: usize,
            rejects: String,
        }
        let mut stack = vec![Frame {
            node: 0,
            next: 0,
            rejects: String::new(),
        }];
        while let Some(top) = stack.last_mut() {
            let kids = &children[top.node];
            if top.next < kids.len() {
                let (c, child) = kids[top.next];
                if top.next > 0 {
                    out.push_str(" | ");
                }
                top.next += 1;
                class_char(c, false, &mut top.rejects);
                out.push('[');
                class_char(c, true, &mut out);
                out.push(']');
                if children[child].is_empty() {
                    let _ = write!(out, " {char_rule}+");
                } else {
                    out.push_str(" (");
                    stack.push(Frame {
                        node: child,
                        next: 0,
                        rejects: String::new(),
                    });
                }
            } else {
                if !kids.is_empty() {
                    let _ = write!(out, " | [^\"{}] {char_rule}*", top.rejects);
                }
                stack.pop();
                if !stack.is_empty() {
                    out.push(')');
                }
            }
            if out.len() > MAX_GRAMMAR_BYTES {
                return Err(SchemaError::GrammarTooLarge {
                    limit: MAX_GRAMMAR_BYTES,
                });
            }
        }
        out.push_str(" )");
        if !ends[0] {
            out.push('?');
        }
        out.push_str(" [\"]");
        Ok(out)
    }
}

/// What an `allOf` gathers from its parts.
#[derive(Default)]
struct AllOfParts {
    properties: Vec<(String, NodeId)>,
    required: HashSet<String>,
    /// Each enum value's literal: how many parts list it, and its type.
    enum_values: BTreeMap<String, (usize, Types)>,
    objects: usize,
}
