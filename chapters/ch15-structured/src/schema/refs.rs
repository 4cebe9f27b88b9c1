//! `$ref`s: followed into the same document as the schema is read (a JSON pointer, `#/$defs/x`),
//! refused where a cycle of them would make a left-recursive grammar, and converted into the
//! `ref-…` rules they stand for.

use super::convert::Converter;
use super::json::{Json, get};
use super::keywords::Types;
use super::read::Builder;
use super::syntax::rule_name_of;
use super::tree::{Document, Kind, NodeId};
use super::{SchemaError, invalid};

/// Objects with more entries than this get an index of their keys when a `$ref` leads through
/// them; reading a few entries is quicker than hashing.
const INDEXED_OBJECT_ENTRIES: usize = 16;

impl<'j> Builder<'j, '_> {
    pub(super) fn build_ref(
        &mut self,
        obj: &'j [(String, Json)],
        r: &'j Json,
        path: &str,
        depth: usize,
    ) -> Result<NodeId, SchemaError> {
        let Json::Str(reference) = r else {
            return Err(invalid(path, "$ref must be a string"));
        };
        if !reference.starts_with("#/") {
            return Err(SchemaError::Ref {
                path: path.to_string(),
                reference: reference.clone(),
                reason: "only references into the same document (`#/…`) are followed; nothing \
                         is fetched"
                    .to_string(),
            });
        }
        if !self.refs.contains_key(reference) {
            self.refs.insert(reference.clone(), None);
            let target = self.resolve(reference, path)?;
            let id = self.build_node(target, reference, depth + 1, None)?;
            self.refs.insert(reference.clone(), Some(id));
        }
        let declared = self.declared_type(obj, path)?;
        self.check_rest(obj, &["$ref", "type"], Types::ALL, path)?;
        self.add(Kind::Ref(reference.clone()), path, declared)
    }

    /// The value a `#/a/b/0` pointer names (segments as written, as llama.cpp reads them).
    fn resolve(&mut self, reference: &str, path: &str) -> Result<&'j Json, SchemaError> {
        let mut target = self.root;
        for sel in reference[1..].split('/').skip(1) {
            let fail = |what: &str| SchemaError::Ref {
                path: path.to_string(),
                reference: reference.to_string(),
                reason: format!("`{sel}` {what}"),
            };
            target = match target {
                Json::Object(o) if o.len() > INDEXED_OBJECT_ENTRIES => {
                    let keys = self.keys.entry(o.as_ptr() as usize).or_insert_with(|| {
                        // Keys are unique: the reader keeps one entry per key.
                        o.iter().map(|(k, v)| (k.as_str(), v)).collect()
                    });
                    keys.get(sel).copied().ok_or_else(|| fail("not found"))?
                }
                Json::Object(o) => get(o, sel).ok_or_else(|| fail("not found"))?,
                Json::Array(a) => sel
                    .parse::<usize>()
                    .ok()
                    .and_then(|i| a.get(i))
                    .ok_or_else(|| fail("is out of range"))?,
                _ => return Err(fail("not found")),
            };
        }
        Ok(target)
    }
}

/// A cycle of `$ref`s and alternatives matches no text before coming back to where it started:
/// its grammar would be left-recursive. Found by an iterative depth-first walk.
pub(super) fn check_left_recursion(doc: &Document) -> Result<(), SchemaError> {
    let edges = |id: NodeId| -> Vec<NodeId> {
        match doc.kind(id) {
            Kind::Ref(r) => doc.target(r).into_iter().collect(),
            Kind::AnyOf(c) => c.clone(),
            _ => Vec::new(),
        }
    };
    // 0 = not seen, 1 = on the current walk, 2 = done.
    let mut state = vec![0u8; doc.nodes.len()];
    for start in 0..doc.nodes.len() {
        if state[start] != 0 {
            continue;
        }
        let mut stack = vec![(start, edges(start), 0usize)];
        state[start] = 1;
        while let Some((node, next, i)) = stack.last_mut() {
            if *i >= next.len() {
                state[*node] = 2;
                stack.pop();
                continue;
            }
            let child = next[*i];
            *i += 1;
            match state[child] {
                0 => {
                    state[child] = 1;
                    stack.push((child, edges(child), 0));
                }
                1 => {
                    let reference = stack
                        .iter()
                        .map(|f| f.0)
                        .skip_while(|&n| n != child)
                        .find_map(|n| match doc.kind(n) {
                            Kind::Ref(r) => Some(r.clone()),
                            _ => None,
                        })
                        .unwrap_or_default();
                    return Err(SchemaError::LeftRecursion { reference });
                }
                _ => {}
            }
        }
    }
    Ok(())
}

impl Converter<'_, '_> {
    /// The rule a `$ref` stands for: `ref-` and its pointer, built on first use.
    pub(super) fn resolve_ref(
        &mut self,
        reference: &str,
        depth: usize,
    ) -> Result<String, SchemaError> {
        let fragment = reference.split_once('#').map_or(reference, |(_, f)| f);
        let mut ref_name = format!("ref{}", rule_name_of(fragment));
        if !self.rules.contains_key(&ref_name) && !self.refs_being_resolved.contains(reference) {
            let Some(target) = self.doc.target(reference) else {
                return Err(SchemaError::Ref {
                    path: String::new(),
                    reference: reference.to_string(),
                    reason: "unresolved".to_string(),
                });
            };
            self.refs_being_resolved.insert(reference.to_string());
            ref_name = self.visit(target, &ref_name, depth + 1)?;
            self.refs_being_resolved.remove(reference);
        }
        Ok(ref_name)
    }
}
