//! Hugging Face checkpoints made from GGUF files, for the tests: what a model's publisher
//! would have uploaded before llama.cpp's converter made the GGUF file.
//!
//! Weights are written with Hugging Face's `safetensors` library, in Hugging Face's names and
//! layout (the query and key rows back in `rotate_half` order, Gemma's norms minus one), and
//! the tokenizer with Hugging Face's `tokenizers` library: `tokenizer.json` is built as the
//! Hugging Face pipelines of these families are (byte-level BPE with the family's regexes;
//! SentencePiece-style BPE with merges ranked by score, as `transformers` extracts them from a
//! SentencePiece model), parsed and written back by the library. Beside the directory, a GGUF
//! file in F32 holds the values the directory stores, in llama.cpp's layout: what converting
//! the directory must give, bit for bit.
#![allow(dead_code)]

use ch01::{GgmlType, GgufFile, Value};
use ch02::Vocab;
use ch02::vocab::{TokenAttr, VocabKind};
use ch06::gguf_write::GgufWriter;
use safetensors::tensor::{Dtype, TensorView};
use serde_json::{Map, Value as Json, json};
use std::collections::HashMap;
use std::path::Path;

/// Hugging Face's regexes for the Llama 3 and Qwen2 pre-tokenizers, as their
/// `tokenizer.json` files spell them.
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How to make a checkpoint.
pub struct Recipe {
    /// Layers kept (the first ones); `None`: all.
    pub layers: Option<usize>,
    pub dtype: Dtype,
    /// Shards the tensors are split into (1: one `model.safetensors`, no index).
    pub shards: usize,
    /// `config.json`'s `rope_scaling`, when the GGUF file keeps it as a tensor (Llama 3).
    pub rope_scaling: Option<Json>,
    /// The reference file keeps the matrices in `dtype` (what converting at the checkpoint's
    /// own precision gives), not in F32.
    pub reference_in_dtype: bool,
}

/// Hugging Face's name of GGUF tensor `name` in an `arch` model.
pub fn hf_name(arch: &str, name: &str) -> String {
    match name {
        "token_embd.weight" => return "model.embed_tokens.weight".into(),
        "output_norm.weight" => return "model.norm.weight".into(),
        "output.weight" => return "lm_head.weight".into(),
        _ => {}
    }
    let rest = name.strip_prefix("blk.").expect("a layer tensor");
    let (layer, rest) = rest.split_once('.').unwrap();
    let (stem, kind) = rest.rsplit_once('.').unwrap();
    let hf = match (stem, arch) {
        ("attn_norm", _) => "input_layernorm",
        ("attn_q", _) => "self_attn.q_proj",
        ("attn_k", _) => "self_attn.k_proj",
        ("attn_v", _) => "self_attn.v_proj",
        ("attn_output", _) => "self_attn.o_proj",
        ("attn_q_norm", _) => "self_attn.q_norm",
        ("attn_k_norm", _) => "self_attn.k_norm",
        ("ffn_norm", "gemma3") => "pre_feedforward_layernorm",
        ("ffn_norm", _) => "post_attention_layernorm",
        ("post_attention_norm", _) => "post_attention_layernorm",
        ("post_ffw_norm", _) => "post_feedforward_layernorm",
        ("ffn_gate", _) => "mlp.gate_proj",
        ("ffn_up", _) => "mlp.up_proj",
        ("ffn_down", _) => "mlp.down_proj",
        _ => panic!("no Hugging Face name for {name}"),
    };
    format!("model.layers.{layer}.{hf}.{kind}")
}

/// Rows of `values` (`rows × cols`) in `heads` heads between llama.cpp's order and Hugging
/// Face's: row `2i + j` of a head is Hugging Face's row `j · d/2 + i` (`to_hf`), or the other
/// way (llama.cpp's `permute`).
fn reorder(values: &[f32], heads: usize, cols: usize, to_hf: bool) -> Vec<f32> {
    let rows = values.len() / cols;
    let (d, half) = (rows / heads, rows / heads / 2);
    let mut out = vec![0.0; values.len()];
    for h in 0..heads {
        for i in 0..half {
            for j in 0..2 {
                let (ours, theirs) = (h * d + 2 * i + j, h * d + j * half + i);
                let (from, to) = if to_hf {
                    (ours, theirs)
                } else {
                    (theirs, ours)
                };
                out[to * cols..(to + 1) * cols]
                    .copy_from_slice(&values[from * cols..(from + 1) * cols]);
            }
        }
    }
    out
}

fn encode(values: &[f32], dtype: Dtype) -> Vec<u8> {
    match dtype {
        Dtype::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        Dtype::F16 => values
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect(),
        Dtype::BF16 => values
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect(),
        d => panic!("no test checkpoints in {d:?}"),
    }
}

/// The stored values back as f32: chapter 17's own decoding (what converting them does).
fn decode(bytes: &[u8], dtype: Dtype) -> Vec<f32> {
    ch17::convert::to_f32(bytes, dtype)
}

/// Tensor `t` of `src` in f32, by chapter 6's dequantizers (chapter 1's know fewer types).
fn dequantize(src: &GgufFile<impl AsRef<[u8]>>, t: &ch01::TensorInfo) -> Vec<f32> {
    let traits = ch06::type_traits(t.ggml_type).expect("a type chapter 6 knows");
    let bytes = src.bytes_of(t).unwrap();
    let cols = t.dims[0] as usize;
    let row = cols / traits.block_size * traits.type_size;
    let mut out = vec![0.0f32; t.n_elements() as usize];
    for (b, o) in bytes.chunks_exact(row).zip(out.chunks_exact_mut(cols)) {
        (traits.to_float)(b, o);
    }
    out
}

fn u32_of(src: &GgufFile<impl AsRef<[u8]>>, key: &str) -> Option<u32> {
    src.gguf.get_u32(key).ok()
}

fn f32_of(src: &GgufFile<impl AsRef<[u8]>>, key: &str) -> Option<f32> {
    match src.gguf.get(key) {
        Some(Value::F32(v)) => Some(*v),
        _ => None,
    }
}

/// Write the checkpoint of `src` into `dir` as `recipe` says; returns the GGUF file (F32) of
/// the values the directory stores, in llama.cpp's layout and names, with `src`'s metadata.
pub fn make(src: &GgufFile<impl AsRef<[u8]>>, recipe: &Recipe, dir: &Path) -> Vec<u8> {
    let arch = src.gguf.architecture().unwrap().to_string();
    let key = |k: &str| format!("{arch}.{k}");
    let n_layer = u32_of(src, &key("block_count")).unwrap() as usize;
    let keep = recipe.layers.unwrap_or(n_layer).min(n_layer);
    let n_head = u32_of(src, &key("attention.head_count")).unwrap() as usize;
    let n_head_kv = u32_of(src, &key("attention.head_count_kv")).map_or(n_head, |v| v as usize);
    let (permutes, shift) = match arch.as_str() {
        "llama" => (true, 0.0),
        "gemma3" => (false, 1.0),
        _ => (false, 0.0),
    };
    let mut hf: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut reference = GgufWriter::new();
    for (k, v) in &src.gguf.metadata {
        reference.set(k, v.clone()).unwrap();
    }
    reference
        .set(&key("block_count"), Value::U32(keep as u32))
        .unwrap();
    // Hugging Face's configuration has no field for llama.cpp's own attention factor.
    reference.remove(&key("rope.scaling.attn_factor"));
    reference.set("general.file_type", Value::U32(0)).unwrap();
    let mut ref_data: HashMap<String, Vec<u8>> = HashMap::new();
    for t in &src.gguf.tensors {
        let layer = t
            .name
            .strip_prefix("blk.")
            .and_then(|r| r.split('.').next());
        if layer.is_some_and(|l| l.parse::<usize>().unwrap() >= keep) {
            continue;
        }
        let values = dequantize(src, t);
        let cols = t.dims[0] as usize;
        if t.name == "rope_freqs.weight" {
            // Hugging Face keeps the configuration; the converter computes the tensor.
            reference
                .add_tensor(&t.name, &t.dims, GgmlType::F32)
                .unwrap();
            ref_data.insert(t.name.clone(), encode(&values, Dtype::F32));
            continue;
        }
        let stem = t.name.rsplit('.').nth(1).unwrap_or("");
        let heads = match stem {
            "attn_q" => n_head,
            "attn_k" => n_head_kv,
            _ => 0,
        };
        let per_row = if t.dims.len() < 2 { 1 } else { cols };
        let is_norm = t.name.ends_with("norm.weight");
        let mut theirs = if permutes && heads > 0 {
            reorder(&values, heads, per_row, true)
        } else {
            values
        };
        if is_norm && shift != 0.0 {
            theirs.iter_mut().for_each(|v| *v -= shift);
        }
        let stored = encode(&theirs, recipe.dtype);
        let mut back = decode(&stored, recipe.dtype);
        if is_norm && shift != 0.0 {
            back.iter_mut().for_each(|v| *v += shift);
        }
        let ours = if permutes && heads > 0 {
            reorder(&back, heads, per_row, false)
        } else {
            back
        };
        let (ty, dtype) = match recipe.dtype {
            Dtype::BF16 if recipe.reference_in_dtype && t.dims.len() >= 2 => {
                (GgmlType::BF16, Dtype::BF16)
            }
            Dtype::F16 if recipe.reference_in_dtype && t.dims.len() >= 2 => {
                (GgmlType::F16, Dtype::F16)
            }
            _ => (GgmlType::F32, Dtype::F32),
        };
        reference.add_tensor(&t.name, &t.dims, ty).unwrap();
        ref_data.insert(t.name.clone(), encode(&ours, dtype));
        let shape: Vec<usize> = t.dims.iter().rev().map(|&d| d as usize).collect();
        hf.push((hf_name(&arch, &t.name), shape, stored));
    }
    std::fs::create_dir_all(dir).unwrap();
    write_shards(&hf, recipe, dir);
    let vocab = Vocab::from_gguf(&src.gguf).unwrap();
    let n_vocab = src.gguf.tensor("token_embd.weight").unwrap().dims[1];
    let config = config_json(src, &arch, keep, n_vocab, recipe, &vocab);
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(&config).unwrap(),
    )
    .unwrap();
    write_tokenizer(src, &vocab, dir);
    let mut out = Vec::new();
    reference
        .write(&mut out, |t| Ok::<_, String>(ref_data[&t.name].clone()))
        .unwrap();
    out
}

/// The tensors in `recipe.shards` files (with an index when more than one), by Hugging
/// Face's `safetensors`.
fn write_shards(hf: &[(String, Vec<usize>, Vec<u8>)], recipe: &Recipe, dir: &Path) {
    let n = recipe.shards.max(1);
    let per = hf.len().div_ceil(n);
    let meta: HashMap<String, String> = [("format".to_string(), "pt".to_string())].into();
    let mut weight_map = Map::new();
    for (i, chunk) in hf.chunks(per).enumerate() {
        let file = if n == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{:05}.safetensors", i + 1, n)
        };
        let views: Vec<(String, TensorView)> = chunk
            .iter()
            .map(|(name, shape, bytes)| {
                weight_map.insert(name.clone(), json!(file));
                (
                    name.clone(),
                    TensorView::new(recipe.dtype, shape.clone(), bytes).unwrap(),
                )
            })
            .collect();
        safetensors::serialize_to_file(views, Some(meta.clone()), &dir.join(&file)).unwrap();
    }
    if n > 1 {
        let total: usize = hf.iter().map(|t| t.2.len()).sum();
        let index = json!({"metadata": {"total_size": total}, "weight_map": weight_map});
        std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    }
}

/// `config.json` as `transformers` writes it for the family.
fn config_json(
    src: &GgufFile<impl AsRef<[u8]>>,
    arch: &str,
    layers: usize,
    n_vocab: u64,
    recipe: &Recipe,
    vocab: &Vocab,
) -> Json {
    let key = |k: &str| format!("{arch}.{k}");
    let u = |k: &str| u32_of(src, &key(k));
    let d = u("embedding_length").unwrap();
    let n_head = u("attention.head_count").unwrap();
    let (architecture, model_type, act) = match arch {
        "llama" => ("LlamaForCausalLM", "llama", "silu"),
        "qwen2" => ("Qwen2ForCausalLM", "qwen2", "silu"),
        "gemma3" => ("Gemma3ForCausalLM", "gemma3_text", "gelu_pytorch_tanh"),
        a => panic!("no configuration for {a}"),
    };
    let dtype = match recipe.dtype {
        Dtype::F32 => "float32",
        Dtype::F16 => "float16",
        _ => "bfloat16",
    };
    let mut c = json!({
        "architectures": [architecture],
        "model_type": model_type,
        "hidden_act": act,
        "hidden_size": d,
        "intermediate_size": u("feed_forward_length").unwrap(),
        "num_hidden_layers": layers,
        "num_attention_heads": n_head,
        "num_key_value_heads": u("attention.head_count_kv").unwrap_or(n_head),
        "head_dim": u("attention.key_length").unwrap_or(d / n_head),
        "max_position_embeddings": u("context_length").unwrap(),
        "rms_norm_eps": f32_of(src, &key("attention.layer_norm_rms_epsilon")).unwrap() as f64,
        "rope_theta": f32_of(src, &key("rope.freq_base")).unwrap_or(10000.0) as f64,
        "vocab_size": n_vocab,
        "tie_word_embeddings": src.gguf.tensor("output.weight").is_none(),
        "torch_dtype": dtype,
        "bos_token_id": vocab.special.bos,
        "eos_token_id": vocab.special.eos,
        "attention_bias": arch == "qwen2",
    });
    let scaling = src.gguf.get_str(&key("rope.scaling.type")).ok();
    if let Some(r) = &recipe.rope_scaling {
        c["rope_scaling"] = r.clone();
    } else if scaling == Some("yarn") {
        c["rope_scaling"] = json!({
            "rope_type": "yarn",
            "factor": f32_of(src, &key("rope.scaling.factor")).unwrap() as f64,
            "original_max_position_embeddings": u("rope.scaling.original_context_length").unwrap(),
        });
    }
    if arch == "gemma3" {
        c["sliding_window"] = json!(u("attention.sliding_window"));
        c["sliding_window_pattern"] = json!(6);
        c["rope_local_base_freq"] = json!(10000.0);
        c["query_pre_attn_scalar"] = json!(u("attention.key_length"));
        c["final_logit_softcapping"] = Json::Null;
    }
    c
}

/// `transformers`' `SentencePieceExtractor`: for every piece, each split into two pieces of
/// the vocabulary is a merge; merges rank by the piece's score, then the left part's length,
/// then the right's, highest first.
fn spm_merges(vocab: &Vocab) -> Vec<(String, String)> {
    let normal = |i: usize| vocab.attrs[i].has(TokenAttr::NORMAL | TokenAttr::USER_DEFINED);
    let ids: HashMap<&str, usize> = (0..vocab.tokens.len())
        .filter(|&i| normal(i))
        .map(|i| (vocab.tokens[i].as_str(), i))
        .collect();
    let mut order: Vec<usize> = (0..vocab.tokens.len()).filter(|&i| normal(i)).collect();
    order.sort_by(|&a, &b| vocab.scores[b].total_cmp(&vocab.scores[a]));
    let mut merges: Vec<(String, String, f32, usize, usize)> = Vec::new();
    for i in order {
        let piece = &vocab.tokens[i];
        let mut local = Vec::new();
        for (at, _) in piece.char_indices().skip(1) {
            let (l, r) = piece.split_at(at);
            if let (Some(&a), Some(&b)) = (ids.get(l), ids.get(r)) {
                local.push((l.to_string(), r.to_string(), vocab.scores[i], a, b));
            }
        }
        local.sort_by_key(|m| (m.3, m.4));
        merges.extend(local);
    }
    let len = |s: &str| s.chars().count();
    merges.sort_by(|a, b| {
        (b.2, len(&b.0), len(&b.1))
            .partial_cmp(&(a.2, len(&a.0), len(&a.1)))
            .unwrap()
    });
    merges.into_iter().map(|m| (m.0, m.1)).collect()
}

/// `tokenizer.json` (built here, then parsed and written by `tokenizers`) and
/// `tokenizer_config.json`.
fn write_tokenizer(src: &GgufFile<impl AsRef<[u8]>>, vocab: &Vocab, dir: &Path) {
    let mut model_vocab = Map::new();
    let mut added = Vec::new();
    for (id, text) in vocab.tokens.iter().enumerate() {
        let a = vocab.attrs[id];
        if !model_vocab.contains_key(text) {
            model_vocab.insert(text.clone(), json!(id));
        }
        // Hugging Face lists the unknown token among the special ones, as the others.
        if a.has(TokenAttr::CONTROL | TokenAttr::USER_DEFINED | TokenAttr::UNKNOWN) {
            added.push(json!({
                "id": id, "content": text, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false,
                "special": a.has(TokenAttr::CONTROL | TokenAttr::UNKNOWN),
            }));
        }
    }
    let special = |id: Option<u32>| id.map(|i| vocab.tokens[i as usize].clone());
    let bos = special(vocab.special.bos);
    let template = |add: bool| match (&bos, add) {
        (Some(b), true) => json!({
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": b, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": b, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": b, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {b: {"id": b, "ids": [vocab.special.bos], "tokens": [b]}},
        }),
        _ => Json::Null,
    };
    let tokenizer = match vocab.kind {
        VocabKind::Bpe(_) => {
            let pre_name = src.gguf.get_str("tokenizer.ggml.pre").unwrap_or("default");
            let byte_level = |regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": regex});
            let split = |r: &str| json!({"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": false});
            let pre = match pre_name {
                "smollm" | "starcoder" => json!({"type": "Sequence", "pretokenizers": [
                    {"type": "Digits", "individual_digits": true}, byte_level(true)]}),
                "llama-bpe" | "llama3" => {
                    json!({"type": "Sequence", "pretokenizers": [split(LLAMA3_SPLIT), byte_level(false)]})
                }
                "qwen2" => {
                    json!({"type": "Sequence", "pretokenizers": [split(QWEN2_SPLIT), byte_level(false)]})
                }
                "gpt-2" => byte_level(true),
                p => panic!("no Hugging Face pre-tokenizer written for {p:?}"),
            };
            let merges: Vec<Json> = vocab.merges.iter().map(|(a, b)| json!([a, b])).collect();
            let post = match template(vocab.add_bos) {
                Json::Null => {
                    json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true})
                }
                t => t,
            };
            json!({
                "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
                "normalizer": null, "pre_tokenizer": pre, "post_processor": post,
                "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
                "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                          "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                          "ignore_merges": vocab.ignore_merges, "vocab": model_vocab, "merges": merges},
            })
        }
        VocabKind::Spm => {
            let mut normalizers =
                vec![json!({"type": "Replace", "pattern": {"String": " "}, "content": "▁"})];
            if vocab.add_space_prefix {
                normalizers.insert(0, json!({"type": "Prepend", "prepend": "▁"}));
            }
            let merges: Vec<Json> = spm_merges(vocab)
                .into_iter()
                .map(|(a, b)| json!([a, b]))
                .collect();
            json!({
                "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
                "normalizer": {"type": "Sequence", "normalizers": normalizers},
                "pre_tokenizer": null, "post_processor": template(vocab.add_bos),
                "decoder": {"type": "Sequence", "decoders": [
                    {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                    {"type": "ByteFallback"}, {"type": "Fuse"},
                    {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
                "model": {"type": "BPE", "dropout": null, "unk_token": special(vocab.special.unk),
                          "continuing_subword_prefix": null, "end_of_word_suffix": null,
                          "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                          "vocab": model_vocab, "merges": merges},
            })
        }
        k => panic!("no Hugging Face tokenizer written for {k:?}"),
    };
    let parsed: tokenizers::Tokenizer = tokenizer
        .to_string()
        .parse()
        .unwrap_or_else(|e| panic!("tokenizers does not read the tokenizer.json made here: {e}"));
    parsed.save(dir.join("tokenizer.json"), false).unwrap();
    let mut config = json!({
        "add_bos_token": vocab.add_bos,
        "add_eos_token": vocab.add_eos,
        "clean_up_tokenization_spaces": vocab.clean_spaces,
        "model_max_length": 131072,
        "tokenizer_class": "PreTrainedTokenizerFast",
    });
    for (key, id) in [
        ("bos_token", vocab.special.bos),
        ("eos_token", vocab.special.eos),
        ("unk_token", vocab.special.unk),
        ("pad_token", vocab.special.pad),
    ] {
        if let Some(t) = special(id) {
            config[key] = json!(t);
        }
    }
    if let Ok(t) = src.gguf.get_str("tokenizer.chat_template") {
        config["chat_template"] = json!(t);
    }
    std::fs::write(
        dir.join("tokenizer_config.json"),
        serde_json::to_string_pretty(&config).unwrap(),
    )
    .unwrap();
}
