//! Qwen3-MoE and OLMoE against llama.cpp on synthetic models (`reference-data/variants/qwen3moe`
//! and `olmoe`, made by `scripts/export-reference`: each family's attention, 8 experts 64 wide, 2
//! used per token): every intermediate tensor including the router's, the experts each token
//! chose, greedy decode on the scalar and engine paths; the batch run expert by expert against
//! the token-by-token reference; and files whose expert metadata disagree, refused by name.

#[path = "../../ch13-families/tests/common/variants.rs"]
mod checks;

use ch01::{Gguf, GgufFile};
use ch03::{DenseLoader, Recorder};
use ch04::llama::Llama;
use ch04::{Batch, Model};
use ch13::qwen3::QkNormed;
use ch13::synthetic;
use ch18::moe::Moe;
use ch18::router::{Weights, route};
use checks::{Variant, check_decode, check_prompt, ids, load_with};
use testkit::refdata::{self, TensorFile};
use testkit::{Tolerance, assert_close};

/// Where the router's probabilities of a token's last chosen expert and the best one left out
/// are closer than this, either could be chosen: our probabilities differ from llama.cpp's by
/// summation order (about 1e-7 on these, see `HIDDEN_TOL`), so a wider gap is a real choice.
const ROUTER_TIE_MARGIN: f32 = 1e-4;

/// The batch run expert by expert against token by token: the same products of the same rows,
/// summed in the same order, so equal to the last bit on the scalar path; chapter 8's kernels
/// may block a matrix product differently for one row than for several (a different f32 order
/// inside each dot product), a few units in the last place of these outputs (|y| < 10).
const GROUPED_TOL: Tolerance = Tolerance::new(1e-5, 1e-5);

fn load(id: &str, engine: bool) -> Variant {
    load_with(id, engine, &ch18::architectures())
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
            route(
                &mut probs,
                &mut chosen,
                &mut weights,
                blocks.layers[l].ffn.weights,
            );
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
    let v = load("qwen3moe", false);
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

/// OLMoE: norms across the queries' and keys' whole width, and the chosen experts weighted by
/// their probabilities as the softmax gave them (not renormalised).
#[test]
fn olmoe_experts_match_llama_cpp() {
    let v = load("olmoe", false);
    let blocks = v
        .model
        .blocks_as::<Llama<QkNormed, Moe>>()
        .expect("llama blocks with query and key norms and a mixture of experts");
    assert_eq!(
        blocks.attention.layers[0].q.len(),
        128,
        "a norm across the width"
    );
    assert_eq!(blocks.layers[0].ffn.weights, Weights::Probabilities);
    check_prompt(&v);
    check_experts(&v);
    check_decode(&v);
}

/// The error of loading `recipe` (which must fail).
fn refused(recipe: &serde_json::Value) -> String {
    let vocab = Gguf::parse(&refdata::read(recipe["vocab"].as_str().unwrap()).unwrap()).unwrap();
    let file = GgufFile::from_bytes(synthetic::build(recipe, &vocab).unwrap()).unwrap();
    Model::load(&file, &DenseLoader, &ch18::architectures())
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

#[test]
fn the_engine_runs_both_families_as_llama_cpp_does() {
    for id in ["qwen3moe", "olmoe"] {
        check_decode(&load(id, true));
    }
}

/// Every layer of both variants, on a batch of its prompt's hidden states: the grouped forward
/// (the block as the model runs it) against `Moe::forward_tokens`, on the scalar and the engine
/// paths.
#[test]
fn grouping_by_expert_changes_no_number() {
    for (id, engine) in [
        ("qwen3moe", false),
        ("qwen3moe", true),
        ("olmoe", false),
        ("olmoe", true),
    ] {
        let v = load(id, engine);
        let blocks = v
            .model
            .blocks_as::<Llama<QkNormed, Moe>>()
            .expect("llama blocks with Qwen3's attention and a mixture of experts");
        let prompt = ids(&v.recipe["prompt"]["ids"]);
        let mut rec = Recorder::new();
        v.model
            .forward(
                &Batch::sequence(0, &prompt, 0, false),
                &mut v.model.new_kv(),
                &mut rec,
            )
            .unwrap();
        let compute = &*v.model.compute;
        for (l, layer) in blocks.layers.iter().enumerate() {
            // The block's input: the normalised residual stream llama.cpp calls ffn_inp-normed.
            let (shape, x) = rec.get(&format!("ffn_norm-{l}"));
            let (_, grouped) = rec.get(&format!("ffn_moe_out-{l}"));
            let mut tokens = vec![0.0; x.len()];
            layer.ffn.forward_tokens(compute, x, &mut tokens);
            let name = format!("{id}: layer {l}, engine {engine}");
            assert_close(&name, shape, grouped, &tokens, GROUPED_TOL);
            if !engine {
                assert_eq!(grouped, &tokens[..], "{name}: the scalar path differs");
            }
        }
    }
}
