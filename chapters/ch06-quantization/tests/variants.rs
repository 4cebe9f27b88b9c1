//! Whole models quantized by llama.cpp, reproduced byte for byte.
//!
//! `quant/variants.json` records, for llama.cpp's Q8_0, Q4_0, Q4_K_M and Q6_K quantizations of
//! the default model's F32 copy (`llama_model_quantize`, no importance matrix), every tensor's
//! type, shape and the sha256 of its bytes. The F32 copy is the default Q4_1 model dequantized,
//! so quantizing each dequantized tensor to its recorded type, row by row, must give the same
//! hashes: this tests real quantized models without storing them.

use ch01::{GgmlType, GgufFile};
use ch06::quants::quantize_chunk;
use rayon::prelude::*;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Failures listed in a message: one root cause usually breaks many tensors alike.
const SHOW: usize = 10;

struct Tensor {
    name: String,
    ty: GgmlType,
    ne: Vec<usize>,
    sha256: String,
}

/// `(variant, tensors)` for every variant llama.cpp quantized from the F32 copy.
fn variants() -> Vec<(String, Vec<Tensor>)> {
    let json = testkit::refdata::json("quant/variants.json").unwrap_or_else(|e| panic!("{e}"));
    let bad = |what: &str| -> ! {
        panic!(
            "quant/variants.json: {what}\nhint: regenerate it with scripts/export-reference \
             (README.md, \"Reference data\")"
        )
    };
    let Some(variants) = json["variants"].as_object() else {
        bad("no `variants` object")
    };
    let mut out = vec![];
    for (name, v) in variants {
        // The original Q4_1 file was quantized from the original weights, not from the copy.
        if v["quantized_here"] != Value::Bool(true) {
            continue;
        }
        let Some(tensors) = v["tensors"].as_array() else {
            bad(&format!("variant {name} has no `tensors` list"))
        };
        let tensors = tensors
            .iter()
            .map(|t| {
                let field = |k: &str| t[k].as_str().unwrap_or_else(|| bad(&format!("{k} in {t}")));
                let ty_name = field("type");
                let ty = GgmlType::from_name(ty_name)
                    .unwrap_or_else(|| bad(&format!("unknown type {ty_name}")));
                let ne = t["ne"]
                    .as_array()
                    .and_then(|a| a.iter().map(|d| d.as_u64().map(|d| d as usize)).collect())
                    .unwrap_or_else(|| bad(&format!("ne in {t}")));
                Tensor {
                    name: field("name").to_string(),
                    ty,
                    ne,
                    sha256: field("sha256").to_string(),
                }
            })
            .collect();
        out.push((name.clone(), tensors));
    }
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn quantizing_the_dequantized_model_reproduces_llama_cpp_variants() {
    let variants = variants();
    let names: Vec<&str> = variants.iter().map(|(v, _)| v.as_str()).collect();
    for want in testkit::refdata::QUANT_VARIANTS {
        assert!(names.contains(&want), "quant/variants.json lacks {want}");
    }
    let path = shared::default_model_path().unwrap_or_else(|e| panic!("{e}"));
    let model = GgufFile::open(path).unwrap_or_else(|e| panic!("{e}"));

    // Dequantize each tensor once and quantize it for every variant, tensors in parallel.
    let tensor_names: Vec<&str> = variants[0].1.iter().map(|t| t.name.as_str()).collect();
    let failures: Vec<String> = tensor_names
        .par_iter()
        .flat_map_iter(|&name| {
            let x = model.tensor_f32(name).unwrap_or_else(|e| panic!("{e}"));
            variants
                .iter()
                .map(|(variant, tensors)| {
                    let Some(t) = tensors.iter().find(|t| t.name == name) else {
                        return Some(format!("{variant}: no tensor {name}"));
                    };
                    let n_per_row = t.ne[0];
                    let nrow = x.len() / n_per_row;
                    let row_bytes = t.ty.row_bytes(n_per_row as u64).unwrap_or(0) as usize;
                    let mut q = vec![0u8; nrow * row_bytes];
                    if let Err(e) = quantize_chunk(t.ty, &x, &mut q, nrow, n_per_row) {
                        return Some(format!("{variant}: {name} ({}): {e}", t.ty));
                    }
                    let got = hex(&Sha256::digest(&q));
                    (got != t.sha256).then(|| {
                        format!(
                            "{variant}: {name} as {} {:?}: sha256 {got}, llama.cpp's {}",
                            t.ty, t.ne, t.sha256
                        )
                    })
                })
                .collect::<Vec<_>>()
        })
        .flatten()
        .collect();

    let mut types: Vec<String> = variants
        .iter()
        .map(|(v, ts)| {
            let mut tys: Vec<&str> = ts.iter().map(|t| t.ty.name()).collect();
            tys.sort();
            tys.dedup();
            format!("{v}: {} tensors of {tys:?}", ts.len())
        })
        .collect();
    types.sort();
    println!("{}", types.join("\n"));
    assert!(
        failures.is_empty(),
        "{} tensors differ from llama.cpp's; the first {}:\n{}",
        failures.len(),
        failures.len().min(SHOW),
        failures[..failures.len().min(SHOW)].join("\n")
    );
}
