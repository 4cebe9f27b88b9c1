//! Llama-family variants against llama.cpp, tensor by tensor, on synthetic models
//! (`reference-data/variants/`, made by `scripts/export-reference`): Llama 3's RoPE frequency
//! factors, YaRN scaling (with an attention factor and an untied output matrix), Qwen2's Q/K/V
//! biases with NeoX RoPE, and Qwen3's per-head norms of the queries and keys. Each model is
//! built here from its recipe — the metadata of its family, a real vocabulary, seeded F32
//! weights whose sha256 must match the pipeline's — so llama.cpp and we run identical weights,
//! and the checks are the F32 path's.

#[path = "common/variants.rs"]
mod checks;

use ch01::{Gguf, GgufFile};
use ch03::DenseLoader;
use ch04::Model;
use ch13::synthetic;
use checks::{Variant, check_decode, check_prompt, load_with};
use testkit::refdata::{self, TensorFile};

/// Variant `id` with f32 weights and chapter 3's scalar attention.
fn load(id: &str) -> Variant {
    load_with(id, false, &ch13::architectures())
}

#[test]
fn llama3_rope_frequency_factors_match_llama_cpp() {
    let v = load("llama3");
    let s = &v.model.attention.rope;
    assert!(
        s.scale().freq_factors.is_some(),
        "rope_freqs.weight not read"
    );
    check_prompt(&v);
    check_decode(&v);
}

#[test]
fn yarn_scaling_matches_llama_cpp() {
    let v = load("yarn");
    assert_eq!(v.model.attention.rope.scale().ext_factor, 1.0);
    check_prompt(&v);
    check_decode(&v);
}

#[test]
fn qwen2_biases_and_neox_rope_match_llama_cpp() {
    let v = load("qwen2");
    assert!(
        v.model
            .blocks_as::<ch04::llama::Llama>()
            .expect("llama blocks")
            .layers[0]
            .attn
            .bias
            .q
            .is_some()
    );
    check_prompt(&v);
    check_decode(&v);
}

#[test]
fn qwen3_query_and_key_norms_match_llama_cpp() {
    let v = load("qwen3");
    let blocks = v
        .model
        .blocks_as::<ch04::llama::Llama<ch13::qwen3::QkNormed>>()
        .expect("llama blocks with Qwen3's attention");
    assert_eq!(blocks.attention.layers.len(), 2);
    assert!(blocks.layers[0].attn.bias.q.is_none());
    let refs = TensorFile::open("variants/qwen3/prompt.safetensors").unwrap();
    assert!(
        refs.names().iter().any(|n| n == "Qcur_normed-1"),
        "no normed queries stored"
    );
    check_prompt(&v);
    check_decode(&v);
}

/// The finished engine's path (chapter 8's threaded SIMD products and attention) on every
/// variant: the same decode check.
#[test]
fn the_engine_runs_every_variant_as_llama_cpp_does() {
    for id in ["llama3", "yarn", "qwen2", "qwen3"] {
        check_decode(&load_with(id, true, &ch13::architectures()));
    }
}

/// A file with a tensor llama's blocks do not use is refused, naming it (llama.cpp refuses it
/// too: it counts the tensors it loaded).
#[test]
fn an_unused_tensor_is_refused_by_name() {
    let mut recipe = refdata::json("variants/yarn/model.json").unwrap();
    let extra = serde_json::json!({"name": "blk.0.ffn_up.bias", "ne": [384], "values": vec![0.0; 384],
        "sha256": "placeholder"});
    let tensors = recipe["tensors"].as_array_mut().unwrap();
    tensors.push(extra);
    // The recipe's sha256 of the new tensor: that of 384 zero floats.
    let zeros = vec![0u8; 384 * 4];
    let digest: String = <sha2::Sha256 as sha2::Digest>::digest(&zeros)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    tensors.last_mut().unwrap()["sha256"] = digest.into();
    let vocab = Gguf::parse(&refdata::read(recipe["vocab"].as_str().unwrap()).unwrap()).unwrap();
    let file = GgufFile::from_bytes(synthetic::build(&recipe, &vocab).unwrap()).unwrap();
    let err = Model::load(&file, &DenseLoader, &ch13::architectures())
        .err()
        .expect("loaded")
        .to_string();
    assert!(err.contains("blk.0.ffn_up.bias"), "{err}");
}

/// A Qwen3 file without one of its norms is refused, naming the tensor.
#[test]
fn a_qwen3_file_without_a_key_norm_is_refused_by_name() {
    let mut recipe = refdata::json("variants/qwen3/model.json").unwrap();
    let tensors = recipe["tensors"].as_array_mut().unwrap();
    tensors.retain(|t| t["name"] != "blk.1.attn_k_norm.weight");
    let vocab = Gguf::parse(&refdata::read(recipe["vocab"].as_str().unwrap()).unwrap()).unwrap();
    let file = GgufFile::from_bytes(synthetic::build(&recipe, &vocab).unwrap()).unwrap();
    let err = Model::load(&file, &DenseLoader, &ch13::architectures())
        .err()
        .expect("loaded")
        .to_string();
    assert!(err.contains("blk.1.attn_k_norm.weight"), "{err}");
}
