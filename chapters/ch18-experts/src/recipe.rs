//! Mixtures of experts you can make (Qwen3-30B-A3B and OLMoE-1B-7B): chapter 14's recipes (a real checkpoint's shape, a real
//! vocabulary, seeded weights at trained scale, llama.cpp's file types) with this chapter's
//! feed-forward tensors and keys in place of the dense network's.
//!
//! The router is a matrix like any other, at gain 1: its logits over the experts have a
//! standard deviation of about 1 for a normalised token, so each token's softmax spreads its
//! probability over many experts, and a batch's tokens choose nearly all of them. A trained
//! router is skewed — a few experts chosen far more often than the rest — which a random one
//! cannot show (the chapter says what that changes).

use ch01::Value;
use ch14::large::{LayerTensor, Shape};

// ANCHOR: qwen3_30b_a3b
/// Qwen3-30B-A3B: 48 layers, d 2048, 32 query and 4 key/value heads of 128 (queries 4096
/// wide) with per-head norms, 128 experts of FFN 768 of which 8 run per token, no shared
/// expert, the qwen2 vocabulary (151,936 tokens), RoPE base 1,000,000. `n_ff` is the file's
/// `feed_forward_length`, which the experts do not use.
pub const QWEN3_30B_A3B: Shape = Shape {
    id: "qwen3-30b-a3b",
    arch: "qwen3moe",
    vocab: "qwen2",
    n_layer: 48,
    n_embd: 2048,
    n_head: 32,
    n_head_kv: 4,
    head_dim: 128,
    n_ff: 6144,
    n_ctx_train: 40960,
    rope_base: 1_000_000.0,
    rms_eps: 1e-6,
    qkv_bias: false,
    qk_norm: Some(ch14::large::per_head),
    ffn: qwen3_30b_a3b_experts,
    keys: qwen3_30b_a3b_keys,
};

/// Qwen3-30B-A3B's experts: `(n_expert, n_used, n_ff_exp)`.
pub const QWEN3_30B_A3B_EXPERTS: (usize, usize, usize) = (128, 8, 768);
// ANCHOR_END: qwen3_30b_a3b

// ANCHOR: olmoe_1b_7b
/// OLMoE-1B-7B: 16 layers, d 2048, 16 query and 16 key/value heads of 128 with norms across
/// the queries' and keys' whole widths, 64 experts of FFN 1024 (the file's
/// `feed_forward_length`: OLMoE files have no `expert_feed_forward_length`) of which 8 run per
/// token, the GPT-NeoX vocabulary (OLMoE's own is that one, padded), RoPE base 10,000.
pub const OLMOE_1B_7B: Shape = Shape {
    id: "olmoe-1b-7b",
    arch: "olmoe",
    vocab: "gpt-neox",
    n_layer: 16,
    n_embd: 2048,
    n_head: 16,
    n_head_kv: 16,
    head_dim: 128,
    n_ff: 1024,
    n_ctx_train: 4096,
    rope_base: 10_000.0,
    rms_eps: 1e-5,
    qkv_bias: false,
    qk_norm: Some(whole_width),
    ffn: olmoe_1b_7b_experts,
    keys: olmoe_1b_7b_keys,
};

/// OLMoE-1B-7B's experts: `(n_expert, n_used, n_ff_exp)`.
pub const OLMOE_1B_7B_EXPERTS: (usize, usize, usize) = (64, 8, 1024);

/// OLMoE's query and key norms: across all the queries and all the keys of a token.
pub fn whole_width(s: &Shape) -> (u64, u64) {
    let w = |heads: usize| (heads * s.head_dim) as u64;
    (w(s.n_head), w(s.n_head_kv))
}
// ANCHOR_END: olmoe_1b_7b

/// Every shape this chapter can make.
pub const SHAPES: [Shape; 2] = [QWEN3_30B_A3B, OLMOE_1B_7B];

// ANCHOR: expert_tensors
/// A mixture's feed-forward tensors for one layer of `s`: the router `(n_expert, n_embd)`, and
/// the experts' gate and up `(n_expert, n_ff_exp, n_embd)` and down `(n_expert, n_embd,
/// n_ff_exp)` as 3-D tensors (ggml's `ne` order: innermost first).
pub fn expert_tensors(
    s: &Shape,
    (n_expert, _, n_ff_exp): (usize, usize, usize),
) -> Vec<LayerTensor> {
    let (d, e, ff) = (s.n_embd as u64, n_expert as u64, n_ff_exp as u64);
    vec![
        ("ffn_gate_inp.weight", vec![d, e]),
        ("ffn_gate_exps.weight", vec![d, ff, e]),
        ("ffn_up_exps.weight", vec![d, ff, e]),
        ("ffn_down_exps.weight", vec![ff, d, e]),
    ]
}

/// The keys that say so: `{arch}.expert_count`, `expert_used_count` and
/// `expert_feed_forward_length`.
pub fn expert_keys(
    s: &Shape,
    (n_expert, n_used, n_ff_exp): (usize, usize, usize),
) -> Vec<(String, Value)> {
    let key = |k: &str| format!("{}.{k}", s.arch);
    vec![
        (key("expert_count"), Value::U32(n_expert as u32)),
        (key("expert_used_count"), Value::U32(n_used as u32)),
        (
            key("expert_feed_forward_length"),
            Value::U32(n_ff_exp as u32),
        ),
    ]
}
// ANCHOR_END: expert_tensors

fn qwen3_30b_a3b_experts(s: &Shape) -> Vec<LayerTensor> {
    expert_tensors(s, QWEN3_30B_A3B_EXPERTS)
}

fn qwen3_30b_a3b_keys(s: &Shape) -> Vec<(String, Value)> {
    expert_keys(s, QWEN3_30B_A3B_EXPERTS)
}

fn olmoe_1b_7b_experts(s: &Shape) -> Vec<LayerTensor> {
    expert_tensors(s, OLMOE_1B_7B_EXPERTS)
}

/// OLMoE's keys: the counts only; its experts are `feed_forward_length` wide.
fn olmoe_1b_7b_keys(s: &Shape) -> Vec<(String, Value)> {
    let mut keys = expert_keys(s, OLMOE_1B_7B_EXPERTS);
    keys.retain(|(k, _)| !k.ends_with("expert_feed_forward_length"));
    keys
}
