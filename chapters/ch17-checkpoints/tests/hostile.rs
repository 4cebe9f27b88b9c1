//! Bad directories: each is a tiny valid checkpoint with one thing broken, and must be refused
//! with an error naming the file and what in it is wrong — never a panic, and never an
//! allocation sized by a number the file made up.

use ch08::{FastLoader, PoolKind, new_pool};
use ch10::{Engine, LoadMode};
use ch17::{Checkpoint, Checkpoints};
use safetensors::tensor::{Dtype, TensorView};
use serde_json::{Value as Json, json};
use std::path::Path;

const D: usize = 8;
const FF: usize = 16;

/// A tiny llama checkpoint: one layer of width 8, a byte-level BPE tokenizer of 4 tokens.
fn config() -> Json {
    json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": D, "intermediate_size": FF, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 2, "max_position_embeddings": 64,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "vocab_size": 4,
        "tie_word_embeddings": true,
    })
}

fn tokenizer() -> Json {
    json!({
        "version": "1.0", "added_tokens": [], "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null, "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "Ġ": 3}, "merges": ["a b"]},
    })
}

/// The tensors: (name, shape, dtype).
fn tensors() -> Vec<(String, Vec<usize>, Dtype)> {
    let mut t = vec![
        (
            "model.embed_tokens.weight".to_string(),
            vec![4, D],
            Dtype::F32,
        ),
        ("model.norm.weight".into(), vec![D], Dtype::F32),
    ];
    for (name, shape) in [
        ("input_layernorm", vec![D]),
        ("self_attn.q_proj", vec![D, D]),
        ("self_attn.k_proj", vec![D, D]),
        ("self_attn.v_proj", vec![D, D]),
        ("self_attn.o_proj", vec![D, D]),
        ("post_attention_layernorm", vec![D]),
        ("mlp.gate_proj", vec![FF, D]),
        ("mlp.up_proj", vec![FF, D]),
        ("mlp.down_proj", vec![D, FF]),
    ] {
        t.push((format!("model.layers.0.{name}.weight"), shape, Dtype::F32));
    }
    t
}

fn write_tensors(path: &Path, tensors: &[(String, Vec<usize>, Dtype)]) {
    let data: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, shape, dtype)| {
            let n: usize = shape.iter().product();
            (0..n * dtype.bitsize() / 8)
                .map(|i| (i % 7) as u8 * 3)
                .collect()
        })
        .collect();
    let views: Vec<(String, TensorView)> = tensors
        .iter()
        .zip(&data)
        .map(|((name, shape, dtype), d)| {
            (
                name.clone(),
                TensorView::new(*dtype, shape.clone(), d).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// A directory of the tiny checkpoint, after `change` has had its way with the parts.
fn checkpoint(
    change: impl FnOnce(&mut Json, &mut Json, &mut Vec<(String, Vec<usize>, Dtype)>),
) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let (mut c, mut t, mut ts) = (config(), tokenizer(), tensors());
    change(&mut c, &mut t, &mut ts);
    std::fs::write(dir.path().join("config.json"), c.to_string()).unwrap();
    std::fs::write(dir.path().join("tokenizer.json"), t.to_string()).unwrap();
    write_tensors(&dir.path().join("model.safetensors"), &ts);
    dir
}

fn load(dir: &Path) -> Result<Engine, String> {
    let fast = FastLoader::new(new_pool(PoolKind::Spin, 1));
    let archs = ch13::architectures();
    Engine::open(
        &Checkpoints::default(),
        dir,
        LoadMode::Read,
        fast,
        &archs,
        Box::new(|_, _| {}),
    )
    .map_err(|e| e.to_string())
}

/// `dir` must be refused with an error mentioning every one of `words`.
#[track_caller]
fn refused(dir: &Path, words: &[&str]) {
    let err = match load(dir) {
        Ok(_) => panic!(
            "{}: loaded, but should be refused ({words:?})",
            dir.display()
        ),
        Err(e) => e,
    };
    for w in words {
        assert!(err.contains(w), "the error does not say {w:?}: {err}");
    }
}

#[test]
fn the_tiny_checkpoint_loads_and_runs() {
    let dir = checkpoint(|_, _, _| {});
    let engine = load(dir.path()).unwrap();
    let logits = engine.model.logits_at_every_position(&[0, 1, 2]).unwrap();
    assert!(logits.iter().all(|x| x.is_finite()));
    assert_eq!(engine.tokenizer.encode("ab a", false, false), vec![2, 3, 0]);
}

#[test]
fn a_directory_without_its_files_is_refused_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    refused(dir.path(), &["config.json"]);
    let dir = checkpoint(|_, _, _| {});
    std::fs::remove_file(dir.path().join("tokenizer.json")).unwrap();
    refused(dir.path(), &["tokenizer.json"]);
    let dir = checkpoint(|_, _, _| {});
    std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    refused(dir.path(), &["safetensors"]);
    let dir = checkpoint(|_, _, _| {});
    std::fs::write(dir.path().join("config.json"), "{\"hidden_size\": ").unwrap();
    refused(dir.path(), &["config.json", "not valid JSON"]);
}

#[test]
fn a_bad_configuration_is_refused_naming_the_key() {
    let cases: [(&str, Json, &[&str]); 5] = [
        (
            "architectures",
            json!(["MambaForCausalLM"]),
            &["architectures", "MambaForCausalLM"],
        ),
        ("num_attention_heads", json!(0), &["num_attention_heads"]),
        ("num_attention_heads", json!(3), &["do not split"]),
        ("hidden_size", json!(-4), &["hidden_size"]),
        (
            "vocab_size",
            json!(1_000_000_000_000u64),
            &["rows", "tokens"],
        ),
    ];
    for (key, value, words) in cases {
        let dir = checkpoint(|c, _, _| c[key] = value.clone());
        refused(dir.path(), words);
    }
    let dir =
        checkpoint(|c, _, _| c["rope_scaling"] = json!({"rope_type": "dynamic", "factor": 2.0}));
    refused(dir.path(), &["config.json", "rope_type", "dynamic"]);
}

#[test]
fn bad_tensors_are_refused_naming_them() {
    let dir = checkpoint(|_, _, t| t[2].2 = Dtype::I32);
    refused(
        dir.path(),
        &["model.layers.0.input_layernorm.weight", "I32"],
    );
    let dir = checkpoint(|_, _, t| {
        t.push((
            "model.layers.0.mlp.experts.0.w1.weight".into(),
            vec![2],
            Dtype::F32,
        ))
    });
    refused(dir.path(), &["model.layers.0.mlp.experts.0.w1.weight"]);
    let dir = checkpoint(|_, _, t| {
        t.push((
            "model.layers.5.input_layernorm.weight".into(),
            vec![D],
            Dtype::F32,
        ))
    });
    refused(
        dir.path(),
        &["model.layers.5.input_layernorm.weight", "num_hidden_layers"],
    );
    // A tensor the model needs and the directory lacks: chapter 4's loader names it.
    let dir = checkpoint(|_, _, t| t.retain(|t| !t.0.contains("down_proj")));
    refused(dir.path(), &["blk.0.ffn_down.weight"]);
}

#[test]
fn a_broken_safetensors_file_is_refused_before_its_bytes_are_read() {
    let dir = checkpoint(|_, _, _| {});
    let path = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 5]).unwrap();
    refused(
        dir.path(),
        &["model.safetensors", "not a valid safetensors file"],
    );
    // A header length of 2^64 - 1: refused, not allocated.
    let mut huge = u64::MAX.to_le_bytes().to_vec();
    huge.extend_from_slice(b"{}");
    std::fs::write(&path, huge).unwrap();
    refused(
        dir.path(),
        &["model.safetensors", "not a valid safetensors file"],
    );
}

#[test]
fn a_shard_index_may_only_name_files_beside_it_holding_what_it_says() {
    let dir = checkpoint(|_, _, _| {});
    let index = |map: Json| json!({"metadata": {}, "weight_map": map}).to_string();
    let idx = dir.path().join("model.safetensors.index.json");
    std::fs::write(
        &idx,
        index(json!({"model.norm.weight": "../model.safetensors"})),
    )
    .unwrap();
    refused(dir.path(), &["model.safetensors.index.json", "weight_map"]);
    std::fs::write(
        &idx,
        index(json!({"model.norm.weight": "other.safetensors"})),
    )
    .unwrap();
    refused(dir.path(), &["other.safetensors"]);
    write_tensors(
        &dir.path().join("other.safetensors"),
        &[("x.weight".into(), vec![2], Dtype::F32)],
    );
    std::fs::write(
        &idx,
        index(json!({"model.norm.weight": "other.safetensors", "x.weight": "other.safetensors"})),
    )
    .unwrap();
    refused(dir.path(), &["weight_map", "model.norm.weight"]);
}

#[test]
fn a_tokenizer_the_engine_cannot_run_exactly_is_refused() {
    let dir = checkpoint(|_, t, _| t["model"]["type"] = json!("Unigram"));
    refused(dir.path(), &["tokenizer.json", "model.type", "Unigram"]);
    let dir = checkpoint(|_, t, _| {
        t["pre_tokenizer"] = json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "[a-z]+"}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "use_regex": false}]});
    });
    refused(dir.path(), &["tokenizer.json", "[a-z]+"]);
    let dir = checkpoint(|_, t, _| t["model"]["vocab"]["a"] = json!(5_000_000));
    refused(dir.path(), &["tokenizer.json", "5000000"]);
    let dir = checkpoint(|_, t, _| t["pre_tokenizer"] = json!({"type": "Whitespace"}));
    refused(dir.path(), &["tokenizer.json", "Whitespace"]);
    let dir = checkpoint(|_, t, _| t["normalizer"] = json!({"type": "Lowercase"}));
    refused(dir.path(), &["tokenizer.json", "normalizer", "Lowercase"]);
    // Qwen2's NFC is what llama.cpp's converter drops too.
    let dir = checkpoint(|_, t, _| t["normalizer"] = json!({"type": "NFC"}));
    assert!(load(dir.path()).is_ok());
}

#[test]
fn opening_reads_only_the_headers() {
    // Planning the GGUF file reads no tensor: its header is all chapter 14 needs.
    let dir = checkpoint(|_, _, _| {});
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let planned = ckpt.plan(None).unwrap();
    let names: Vec<&str> = planned
        .writer
        .tensors()
        .iter()
        .map(|t| t.name.as_str())
        .collect();
    assert!(names.contains(&"blk.0.attn_q.weight") && names.contains(&"token_embd.weight"));
    assert!(
        !names.contains(&"output.weight"),
        "tied embeddings need no output matrix"
    );
}
