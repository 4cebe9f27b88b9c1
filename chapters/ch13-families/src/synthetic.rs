//! Synthetic models: a GGUF file built from a recipe, to check a family no small real model
//! of which can be fetched.
//!
//! A recipe (`reference-data/variants/<id>/model.json`, written by the reference pipeline)
//! lists the file's metadata and every tensor: its shape, and either its values or a seeded
//! generator with the sha256 of the bytes it makes. The pipeline built the same file with
//! gguf-py for llama.cpp; [`build`] builds it here, so both engines run identical weights, and
//! a generator that drifted from the pipeline's is caught by the sha256 before any number is
//! compared. The vocabulary is a real one: every `tokenizer.*` key of the vocabulary file the
//! recipe names is copied.

use ch01::{GgmlType, Gguf, Value};
use ch06::gguf_write::GgufWriter;
use serde_json::Value as Json;
use sha2::{Digest, Sha256};

/// Value `index` of the generator seeded with `seed`: `offset + scale * (2u - 1)` in f32, `u`
/// the top 24 bits of splitmix64(`seed + index`) over 2^24 (exact in f32, as in the pipeline's
/// numpy code).
pub fn generated(seed: u64, index: u64, scale: f32, offset: f32) -> f32 {
    let mut z = seed.wrapping_add(index).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    let u = (z >> 40) as f32 * 2f32.powi(-24);
    scale * (2.0 * u - 1.0) + offset
}

/// Why a recipe could not be built.
#[derive(Debug)]
pub struct RecipeError(pub String);

impl std::fmt::Display for RecipeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "synthetic model recipe: {}", self.0)
    }
}

impl std::error::Error for RecipeError {}

fn bad(what: impl Into<String>) -> RecipeError {
    RecipeError(what.into())
}

/// The f32 values of one tensor of the recipe, checked against its sha256.
fn tensor_values(t: &Json) -> Result<(String, Vec<u64>, Vec<f32>), RecipeError> {
    let name = t["name"]
        .as_str()
        .ok_or_else(|| bad("a tensor without a name"))?;
    let ne: Vec<u64> = t["ne"]
        .as_array()
        .ok_or_else(|| bad(format!("{name}: no ne")))?
        .iter()
        .map(|d| d.as_u64().ok_or_else(|| bad(format!("{name}: bad ne"))))
        .collect::<Result<_, _>>()?;
    let n = ne.iter().product::<u64>();
    let values: Vec<f32> = match (t.get("values"), t.get("seed")) {
        (Some(v), _) => v
            .as_array()
            .ok_or_else(|| bad(format!("{name}: bad values")))?
            .iter()
            .map(|x| x.as_f64().map(|x| x as f32))
            .collect::<Option<_>>()
            .ok_or_else(|| bad(format!("{name}: a value is not a number")))?,
        (None, Some(seed)) => {
            let seed = seed
                .as_u64()
                .ok_or_else(|| bad(format!("{name}: bad seed")))?;
            let num = |k: &str| {
                t[k].as_f64()
                    .map(|x| x as f32)
                    .ok_or_else(|| bad(format!("{name}: no {k}")))
            };
            let (scale, offset) = (num("scale")?, num("offset")?);
            (0..n).map(|i| generated(seed, i, scale, offset)).collect()
        }
        (None, None) => return Err(bad(format!("{name}: neither values nor a seed"))),
    };
    if values.len() as u64 != n {
        return Err(bad(format!(
            "{name}: {} values for ne {ne:?}",
            values.len()
        )));
    }
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let digest: String = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    if t["sha256"].as_str() != Some(digest.as_str()) {
        return Err(bad(format!(
            "{name}: the values made here have sha256 {digest}, the recipe says {}",
            t["sha256"]
        )));
    }
    Ok((name.to_string(), ne, values))
}

/// The GGUF file of `recipe`, with the tokenizer of `vocab` (the parsed vocabulary file).
pub fn build(recipe: &Json, vocab: &Gguf) -> Result<Vec<u8>, RecipeError> {
    let err = |e: &dyn std::fmt::Display| bad(e.to_string());
    let mut w = GgufWriter::new();
    let arch = recipe["arch"].as_str().ok_or_else(|| bad("no arch"))?;
    w.set("general.architecture", Value::String(arch.into()))
        .map_err(|e| err(&e))?;
    let meta = recipe["metadata"]
        .as_object()
        .ok_or_else(|| bad("no metadata"))?;
    for (key, m) in meta {
        let v = &m["value"];
        let value = match m["type"].as_str() {
            Some("u32") => v
                .as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .map(Value::U32),
            Some("f32") => v.as_f64().map(|x| Value::F32(x as f32)),
            Some("str") => v.as_str().map(|s| Value::String(s.into())),
            _ => None,
        }
        .ok_or_else(|| bad(format!("metadata {key}: bad type or value {m}")))?;
        w.set(key, value).map_err(|e| err(&e))?;
    }
    for (key, value) in &vocab.metadata {
        if key.starts_with("tokenizer.") {
            w.set(key, value.clone()).map_err(|e| err(&e))?;
        }
    }
    let tensors = recipe["tensors"]
        .as_array()
        .ok_or_else(|| bad("no tensors"))?
        .iter()
        .map(tensor_values)
        .collect::<Result<Vec<_>, _>>()?;
    for (name, ne, _) in &tensors {
        w.add_tensor(name, ne, GgmlType::F32).map_err(|e| err(&e))?;
    }
    let mut out = Vec::with_capacity(w.file_size() as usize);
    let mut next = tensors.iter();
    w.write(&mut out, |_| {
        let (_, _, values) = next.next().ok_or("more tensor infos than tensors")?;
        Ok::<_, &str>(
            values
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>(),
        )
    })
    .map_err(|e| err(&e))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// splitmix64 from state 0 (Vigna's reference) gives 0xE220A8397B1DCDAF,
    /// 0x6E789E6AA1B965F4, 0x06C45D188009454F: its k-th output mixes k · 0x9E3779B97F4A7C15,
    /// which is index 0 of the generator seeded with (k - 1) · 0x9E3779B97F4A7C15.
    #[test]
    fn the_generator_mixes_as_splitmix64() {
        let golden = 0x9E37_79B9_7F4A_7C15u64;
        let outputs = [
            0xE220A8397B1DCDAFu64,
            0x6E789E6AA1B965F4,
            0x06C45D188009454F,
        ];
        for (k, z) in outputs.iter().enumerate() {
            let u = (z >> 40) as f32 * 2f32.powi(-24);
            let seed = golden.wrapping_mul(k as u64);
            assert_eq!(generated(seed, 0, 0.5, 0.25), 0.5 * (2.0 * u - 1.0) + 0.25);
        }
        // Counter-based: index i of seed s is index 0 of seed s + i.
        assert_eq!(generated(7, 5, 1.0, 0.0), generated(12, 0, 1.0, 0.0));
    }
}
