//! The error budget, layer by layer: how far each layer's output (`l_out-L`) is from
//! llama.cpp's, on chapter 4's f32 path and on this chapter's quantized one, for one reference
//! prompt. For `scripts/figures`.
//!
//! cargo run --release -p ch06 --example layer_error -- [PROMPT_ID]   (default: medium)
//!
//! llama.cpp ran the F32 copy of the default model (its Q4_1 weights dequantized). Chapter 4
//! loads the Q4_1 file dequantized to f32 — the same weights — so its error is only the order
//! of f32 sums. This chapter computes with the Q4_1 blocks and 8-bit activations, so its error
//! also holds the activations' rounding: the reason quantized paths are judged by their
//! predictions (KL, agreement with a tie margin) rather than element by element. Prints one JSON
//! line per path and layer: the largest absolute error, and the largest error in units of
//! chapter 4's `HIDDEN_TOL` (1 means at the tolerance).

use ch01::GgufFile;
use ch03::{DenseLoader, Recorder};
use ch04::{Batch, Model};
use ch06::QuantLoader;
use testkit::HIDDEN_TOL;
use testkit::refdata::{self, TensorFile};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let id = std::env::args().nth(1).unwrap_or_else(|| "medium".into());
    let manifest = refdata::manifest()?;
    let prompt = manifest["prompts"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["id"] == id.as_str()))
        .ok_or_else(|| format!("no reference prompt {id:?}"))?;
    let ids: Vec<u32> = prompt["ids"]
        .as_array()
        .ok_or("prompt without ids")?
        .iter()
        .filter_map(|v| Some(v.as_u64()? as u32))
        .collect();
    let refs = TensorFile::open(&format!("prompts/{id}.safetensors"))?;
    let file = GgufFile::open(shared::default_model_path()?)?;
    let paths: [(&str, Model); 2] = [
        (
            "f32",
            Model::load(&file, &DenseLoader, &ch04::architectures())?,
        ),
        (
            "q4_1",
            Model::load(&file, &QuantLoader, &ch04::architectures())?,
        ),
    ];
    for (path, model) in &paths {
        let mut rec = Recorder::new();
        let mut kv = model.new_kv();
        model.forward(&Batch::sequence(0, &ids, 0, false), &mut kv, &mut rec)?;
        for layer in 0..model.config.n_layer {
            let name = format!("l_out-{layer}");
            let want = refs.f32(&name)?;
            let (_, got) = rec.get(&name);
            let (mut max_abs, mut budget) = (0.0f32, 0.0f32);
            for (&g, &w) in got.iter().zip(&want.data) {
                let d = (g - w).abs();
                max_abs = max_abs.max(d);
                budget = budget.max(d / (HIDDEN_TOL.abs + HIDDEN_TOL.rel * w.abs()));
            }
            println!(
                "{}",
                serde_json::json!({"prompt": id, "path": path, "layer": layer,
                                   "max_abs": max_abs, "of_tolerance": budget})
            );
        }
    }
    Ok(())
}
