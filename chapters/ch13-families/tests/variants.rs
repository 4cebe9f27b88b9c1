//! Llama-family variants against llama.cpp, tensor by tensor, on synthetic models
//! (`reference-data/variants/`, made by `scripts/export-reference`): Llama 3's RoPE frequency
//! factors, YaRN scaling (with an attention factor and an untied output matrix), Qwen2's Q/K/V
//! biases with NeoX RoPE, Qwen3's per-head norms of the queries and keys, and Qwen3-MoE's
//! mixture of experts. Each model is built here from its recipe — the metadata of its family, a
//! real vocabulary, seeded F32 weights whose sha256 must match the pipeline's — so llama.cpp and
//! we run identical weights, and the checks are the F32 path's.

use ch01::{Gguf, GgufFile};
use ch02::Tokenizer;
use ch03::{DenseLoader, Recorder};
use ch04::llama::Llama;
use ch04::{Batch, Model};
use ch06::agreement::{GreedyStep, greedy_step_within};
use ch08::{FastLoader, PoolKind, new_pool};
use ch13::qwen3::QkNormed;
use ch13::qwen3moe::{Moe, route};
use ch13::synthetic;
use testkit::HIDDEN_TOL;
use testkit::refdata::{self, TensorFile};
use testkit::{Tolerance, assert_close};

/// Logits of the synthetic models: chapter 4's `LOGITS_TOL` reasoning (f32 sums in another
/// order, a 128-term dot product per vocabulary entry after two layers) with a larger relative
/// part, because random weights give logits up to about 20 where SmolLM2's stay near 10.
/// Observed: at most about 1e-5.
const VARIANT_LOGITS_TOL: Tolerance = Tolerance::new(1e-4, 1e-4);

/// Where the router's probabilities of a token's last chosen expert and the best one left out
/// are closer than this, either could be chosen: our probabilities differ from llama.cpp's by
/// summation order (about 1e-7 on these, see `HIDDEN_TOL`), so a wider gap is a real choice.
const ROUTER_TIE_MARGIN: f32 = 1e-4;

/// Where llama.cpp's greedy token and ours differ, our top two must be closer than this: the
/// f32 path differs from llama.cpp's only by summation order, a few units of 1e-5 on these
/// logits (above), so anything wider is a real difference.
const VARIANT_TIE_MARGIN: f32 = 1e-3;

struct Variant {
    id: String,
    model: Model,
    tokenizer: Tokenizer,
    recipe: serde_json::Value,
    /// Loaded as the finished engine runs it.
    engine: bool,
}

/// Variant `id` with f32 weights and chapter 3's scalar attention.
fn load(id: &str) -> Variant {
    load_with(id, false)
}

/// With `engine`, as the finished engine runs it: chapter 8's matrices and compute.
fn load_with(id: &str, engine: bool) -> Variant {
    let recipe =
        refdata::json(&format!("variants/{id}/model.json")).unwrap_or_else(|e| panic!("{e}"));
    let vocab_file = refdata::read(recipe["vocab"].as_str().unwrap()).unwrap();
    let vocab = Gguf::parse(&vocab_file).unwrap();
    let bytes = synthetic::build(&recipe, &vocab).unwrap_or_else(|e| panic!("{id}: {e}"));
    let file = GgufFile::from_bytes(bytes).unwrap();
    let model = if engine {
        let fast = FastLoader::new(new_pool(PoolKind::Spin, 2));
        let compute = fast.compute();
        Model::load(&file, &fast, &ch13::architectures()).map(|m| m.with_compute(compute))
    } else {
        Model::load(&file, &DenseLoader, &ch13::architectures())
    }
    .unwrap_or_else(|e| panic!("{id}: {e}"));
    let tokenizer = Tokenizer::from_gguf(&file.gguf).unwrap();
    Variant {
        id: id.to_string(),
        model,
        tokenizer,
        recipe,
        engine,
    }
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect()
}

/// Every intermediate tensor llama.cpp stored for the prompt, and the last position's logits.
fn check_prompt(v: &Variant) {
    let p = &v.recipe["prompt"];
    let want_ids = ids(&p["ids"]);
    assert_eq!(
        v.tokenizer.encode(p["text"].as_str().unwrap(), true, false),
        want_ids,
        "{}: the prompt's tokens",
        v.id
    );
    let refs = TensorFile::open(&format!("variants/{}/prompt.safetensors", v.id))
        .unwrap_or_else(|e| panic!("{e}"));
    let mut rec = Recorder::new();
    let batch = Batch::sequence(0, &want_ids, 0, false);
    let model = &v.model;
    model
        .forward(&batch, &mut model.new_kv(), &mut rec)
        .unwrap_or_else(|e| panic!("{}: {e}", v.id));
    let (mut checked, mut worst, mut logits) = (0, (0f32, String::new()), 0f32);
    for name in refs.names() {
        if name == "tokens" {
            continue;
        }
        let want = refs.f32(&name).unwrap();
        let (_, got) = rec.get(&name);
        // After the last layer's attention llama.cpp keeps the last position only.
        let got = &got[got.len() - want.data.len()..];
        let tol = if name == "result_output" {
            VARIANT_LOGITS_TOL
        } else {
            HIDDEN_TOL
        };
        let r = assert_close(
            &format!("{}: {name}", v.id),
            &want.shape,
            got,
            &want.data,
            tol,
        );
        if name == "result_output" {
            logits = r.max_abs;
        } else if r.max_abs > worst.0 {
            worst = (r.max_abs, name);
        }
        checked += 1;
    }
    eprintln!(
        "{}: {checked} tensors of {} prompt tokens; largest |diff| {:.1e} ({}), logits {:.1e}",
        v.id,
        want_ids.len(),
        worst.0,
        worst.1,
        logits
    );
    // 14 per layer (13 for qwen2, whose graph names no attn_out; 15 for qwen3, whose graph
    // names no attn_out and adds Qcur_normed, Kcur_normed; 15 for qwen3moe, whose graph names
    // no dense network and adds the router's tensors), the final norm, the logits.
    assert!(checked >= 28, "{}: only {checked} tensors compared", v.id);
}

/// llama.cpp's greedy continuation, fed back one token at a time through the KV cache: our
/// logits at its top 32 ids, and its choice unless our top two are a near-tie.
fn check_decode(v: &Variant) {
    let model = &v.model;
    let prompt = ids(&v.recipe["prompt"]["ids"]);
    let generated = ids(&v.recipe["generated"]);
    let refs = TensorFile::open(&format!("variants/{}/generation.safetensors", v.id)).unwrap();
    let (_, topk_ids) = refs.i64("topk_ids").unwrap();
    let topk_logits = refs.f32("topk_logits").unwrap();
    let k = topk_logits.shape[1];
    let mut kv = model.new_kv();
    let mut logits = model
        .forward(
            &Batch::sequence(0, &prompt, 0, false),
            &mut kv,
            &mut ch03::NoObserver,
        )
        .unwrap();
    let (mut worst_step, mut differ) = (0f32, 0);
    for (step, &tok) in generated.iter().enumerate() {
        let want_ids = &topk_ids[step * k..(step + 1) * k];
        let want = &topk_logits.data[step * k..(step + 1) * k];
        let got: Vec<f32> = want_ids.iter().map(|&i| logits[i as usize]).collect();
        assert_close(
            &format!("{}: step {step} top {k}", v.id),
            &[k],
            &got,
            want,
            VARIANT_LOGITS_TOL,
        );
        match greedy_step_within(&logits, tok as usize, VARIANT_TIE_MARGIN) {
            Ok(GreedyStep::Same) => {}
            Ok(GreedyStep::NearTie { .. }) => differ += 1,
            Err(m) => panic!("{}: step {step}: llama.cpp picked {tok}: {m}", v.id),
        }
        worst_step = worst_step.max(
            got.iter()
                .zip(want)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max),
        );
        let pos = prompt.len() + step;
        logits = model
            .forward(
                &Batch::sequence(0, &[tok], pos, false),
                &mut kv,
                &mut ch03::NoObserver,
            )
            .unwrap();
    }
    eprintln!(
        "{}: {} decode steps through the KV cache, top-{k} logits within {:.1e}, greedy tokens \
         {}{}",
        v.id,
        generated.len(),
        worst_step,
        if differ == 0 {
            "equal".to_string()
        } else {
            format!("equal but at {differ} near-ties")
        },
        if v.engine { " (engine)" } else { "" }
    );
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

/// llama.cpp's choice of experts for each prompt token, from its router probabilities
/// (`ffn_moe_probs`): ours, made by the same router step from our logits, must be the same set
/// in the same order wherever the choice is not a near-tie; and the tokens must spread over
/// the experts, or the variant would not test the routing.
fn check_experts(v: &Variant) {
    let refs = TensorFile::open(&format!("variants/{}/prompt.safetensors", v.id)).unwrap();
    let mut rec = Recorder::new();
    let prompt = ids(&v.recipe["prompt"]["ids"]);
    let model = &v.model;
    model
        .forward(
            &Batch::sequence(0, &prompt, 0, false),
            &mut model.new_kv(),
            &mut rec,
        )
        .unwrap();
    let blocks = model
        .blocks_as::<Llama<QkNormed, Moe>>()
        .expect("llama blocks with Qwen3's attention and a mixture of experts");
    let k = blocks.layers[0].ffn.n_used;
    let (mut compared, mut ties, mut used) = (0, 0, std::collections::BTreeSet::new());
    for l in 0..blocks.layers.len() {
        let want = refs.f32(&format!("ffn_moe_probs-{l}")).unwrap();
        let n_exp = want.shape[1];
        let (_, logits) = rec.get(&format!("ffn_moe_logits-{l}"));
        let logits = &logits[logits.len() - want.data.len()..];
        for (p, z) in want.data.chunks(n_exp).zip(logits.chunks(n_exp)) {
            let mut order: Vec<usize> = (0..n_exp).collect();
            order.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
            let (mut probs, mut chosen, mut weights) = (z.to_vec(), vec![0; k], vec![0.0; k]);
            route(&mut probs, &mut chosen, &mut weights);
            used.extend(chosen.iter().copied());
            let near = |i: usize| p[order[i]] - p[order[i + 1]] < ROUTER_TIE_MARGIN;
            if (0..k).any(near) {
                ties += 1;
                continue;
            }
            assert_eq!(chosen, order[..k], "{}: layer {l}: chosen experts", v.id);
            compared += 1;
        }
    }
    eprintln!(
        "{}: chosen experts equal to llama.cpp's for {compared} tokens ({ties} near-ties not \
         compared); {} of the experts used",
        v.id,
        used.len()
    );
    assert!(
        compared > 0 && used.len() >= 4,
        "{}: too little routing",
        v.id
    );
}

#[test]
fn qwen3moe_experts_match_llama_cpp() {
    let v = load("qwen3moe");
    let blocks = v
        .model
        .blocks_as::<Llama<QkNormed, Moe>>()
        .expect("llama blocks with Qwen3's attention and a mixture of experts");
    assert_eq!(blocks.layers[0].ffn.experts.len(), 8);
    assert_eq!(blocks.layers[0].ffn.n_used, 2);
    check_prompt(&v);
    check_experts(&v);
    check_decode(&v);
}

/// The finished engine's path (chapter 8's threaded SIMD products and attention) on every
/// variant: the same decode check.
#[test]
fn the_engine_runs_every_variant_as_llama_cpp_does() {
    for id in ["llama3", "yarn", "qwen2", "qwen3", "qwen3moe"] {
        check_decode(&load_with(id, true));
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

/// The error of loading `recipe` (which must fail).
fn refused(recipe: &serde_json::Value) -> String {
    let vocab = Gguf::parse(&refdata::read(recipe["vocab"].as_str().unwrap()).unwrap()).unwrap();
    let file = GgufFile::from_bytes(synthetic::build(recipe, &vocab).unwrap()).unwrap();
    Model::load(&file, &DenseLoader, &ch13::architectures())
        .err()
        .expect("loaded")
        .to_string()
}

/// A Qwen3-MoE file whose expert metadata disagree with themselves or with its tensors is
/// refused, naming the key or the tensor, before any matrix is loaded.
#[test]
fn bad_expert_metadata_is_refused_by_name() {
    let base = refdata::json("variants/qwen3moe/model.json").unwrap();
    let with = |key: &str, value: u64| {
        let mut r = base.clone();
        r["metadata"][key]["value"] = value.into();
        r
    };
    let err = refused(&with("qwen3moe.expert_count", 0));
    assert!(err.contains("qwen3moe.expert_count is 0"), "{err}");
    let err = refused(&with("qwen3moe.expert_used_count", 9));
    assert!(err.contains("qwen3moe.expert_used_count is 9"), "{err}");
    let err = refused(&with("qwen3moe.expert_used_count", 0));
    assert!(err.contains("qwen3moe.expert_used_count is 0"), "{err}");
    // Seven experts announced, eight in the tensors: the router is the first to disagree.
    let err = refused(&with("qwen3moe.expert_count", 7));
    assert!(err.contains("blk.0.ffn_gate_inp.weight"), "{err}");
    // A router of the wrong width (zeros, so its sha256 is known).
    let mut r = base.clone();
    let router = r["tensors"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|t| t["name"] == "blk.1.ffn_gate_inp.weight")
        .unwrap();
    let n = 64 * 8;
    let digest: String = <sha2::Sha256 as sha2::Digest>::digest(vec![0u8; n * 4])
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    *router = serde_json::json!({"name": "blk.1.ffn_gate_inp.weight", "ne": [64, 8],
        "values": vec![0.0; n], "sha256": digest});
    let err = refused(&r);
    assert!(err.contains("blk.1.ffn_gate_inp.weight"), "{err}");
}
