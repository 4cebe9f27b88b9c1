//! Model::load on small generated llama models whose metadata and tensors are randomly
//! damaged — values of the wrong type or out of their domain, keys missing, tensors missing or
//! misshapen, random bytes as weights (NaN and infinite scales included) — loads or fails with
//! a typed error, never panics; a model that loads runs a forward pass and a short generation
//! that end in logits or an error, never a panic.
//!
//! Failures persist in `fuzz_load.proptest-regressions`, so a case found becomes a regression
//! test.

use ch01::gguf::ValueType;
use ch01::{GgmlType, GgufFile, Value};
use ch02::Tokenizer;
use ch03::{DenseLoader, NoObserver};
use ch04::{Batch, GenParams, Model, SamplerParams, generate};
use ch05::Cached;
use ch06::QuantLoader;
use ch06::gguf_write::GgufWriter;
use proptest::prelude::*;

/// Cases per run: each builds, loads and runs a model of a few kilobytes, so 128 take a few
/// seconds.
const CASES: u32 = 128;

/// The shape of a small, valid llama model.
#[derive(Debug, Clone)]
struct Shape {
    n_layer: u32,
    n_head: u32,
    n_head_kv: u32,
    head_dim: u32,
    n_ff: u64,
    vocab: usize,
}

fn shape() -> impl Strategy<Value = Shape> {
    (1..3u32, 0..3usize, 1..3u32, 1..3u32, 8..40usize).prop_map(
        |(n_layer, heads, group, ff, vocab)| {
            let n_head_kv = [1, 2, 4][heads];
            Shape {
                n_layer,
                n_head: n_head_kv * group,
                n_head_kv,
                head_dim: 32,
                n_ff: 32 * u64::from(ff),
                vocab,
            }
        },
    )
}

/// A random metadata value of any scalar type, hostile floats and integers included.
fn any_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<u32>().prop_map(Value::U32),
        any::<u64>().prop_map(Value::U64),
        any::<i32>().prop_map(Value::I32),
        Just(Value::U32(0)),
        prop_oneof![
            Just(f32::NAN),
            Just(f32::INFINITY),
            Just(-1.0f32),
            Just(0.0f32),
            any::<f32>()
        ]
        .prop_map(Value::F32),
        any::<f64>().prop_map(Value::F64),
        ".{0,8}".prop_map(Value::String),
        any::<bool>().prop_map(Value::Bool),
    ]
}

/// One thing done to a generated model.
#[derive(Debug, Clone)]
enum Damage {
    /// Set the `i`-th llama key (of [`KEYS`]) to a random value.
    SetKey(usize, Value),
    /// Remove the `i`-th llama key.
    RemoveKey(usize),
    /// Remove the `i`-th tensor.
    DropTensor(usize),
    /// Give the `i`-th tensor another first dimension (a multiple of 32, applied where its
    /// type's blocks still fit).
    Reshape(usize, u64),
    /// Store the `i`-th matrix as another type, with random bytes.
    Retype(usize, usize, u64),
}

const KEYS: &[&str] = &[
    "llama.block_count",
    "llama.embedding_length",
    "llama.attention.head_count",
    "llama.attention.head_count_kv",
    "llama.attention.key_length",
    "llama.feed_forward_length",
    "llama.context_length",
    "llama.vocab_size",
    "llama.rope.freq_base",
    "llama.rope.dimension_count",
    "llama.rope.scaling.type",
    "llama.rope.scaling.factor",
    "llama.attention.layer_norm_rms_epsilon",
];

/// Types a damaged matrix may be stored as: random bytes of each are random scales and quants.
const TYPES: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
];

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        (0..KEYS.len(), any_value()).prop_map(|(i, v)| Damage::SetKey(i, v)),
        (0..KEYS.len()).prop_map(Damage::RemoveKey),
        any::<usize>().prop_map(Damage::DropTensor),
        (any::<usize>(), 0..4u64).prop_map(|(i, d)| Damage::Reshape(i, 32 * d)),
        (any::<usize>(), 0..TYPES.len(), any::<u64>())
            .prop_map(|(i, t, s)| Damage::Retype(i, t, s)),
    ]
}

/// A small deterministic generator for weights and random bytes.
fn bytes(n: usize, mut seed: u64) -> Vec<u8> {
    (0..n)
        .map(|_| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) as u8
        })
        .collect()
}

/// Small f32 weights, as bytes.
fn weights(n: u64, seed: u64) -> Vec<u8> {
    bytes(n as usize, seed)
        .iter()
        .flat_map(|&b| ((f32::from(b) - 127.5) / 512.0).to_le_bytes())
        .collect()
}

/// The model as GGUF bytes: metadata and tensors, damaged.
fn build(s: &Shape, damages: &[Damage]) -> Vec<u8> {
    let mut w = GgufWriter::new();
    let d = u64::from(s.n_head * s.head_dim);
    let kv = u64::from(s.n_head_kv * s.head_dim);
    let mut set = |k: &str, v: Value| w.set(k, v).unwrap();
    set("general.architecture", Value::String("llama".into()));
    set("llama.block_count", Value::U32(s.n_layer));
    set("llama.embedding_length", Value::U64(d));
    set("llama.attention.head_count", Value::U32(s.n_head));
    set("llama.attention.head_count_kv", Value::U32(s.n_head_kv));
    set("llama.feed_forward_length", Value::U64(s.n_ff));
    set("llama.context_length", Value::U32(64));
    set("llama.rope.freq_base", Value::F32(10000.0));
    set("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5));
    set("tokenizer.ggml.model", Value::String("gpt2".into()));
    set("tokenizer.ggml.pre", Value::String("smollm".into()));
    // "a", "b", "ab" and one merge that makes the third of the first two, then "t0", "t1", …
    let tokens = ["a", "b", "ab"]
        .into_iter()
        .map(String::from)
        .chain((0..s.vocab - 3).map(|i| format!("t{i}")))
        .map(Value::String)
        .collect();
    set(
        "tokenizer.ggml.tokens",
        Value::Array(ValueType::String, tokens),
    );
    set(
        "tokenizer.ggml.merges",
        Value::Array(ValueType::String, vec![Value::String("a b".into())]),
    );
    let vocab = s.vocab as u64;
    let mut tensors: Vec<(String, Vec<u64>, GgmlType)> = vec![
        ("token_embd.weight".into(), vec![d, vocab], GgmlType::F32),
        ("output_norm.weight".into(), vec![d], GgmlType::F32),
    ];
    for l in 0..s.n_layer {
        let mut t = |n: &str, dims: Vec<u64>| {
            tensors.push((format!("blk.{l}.{n}.weight"), dims, GgmlType::F32))
        };
        t("attn_norm", vec![d]);
        t("attn_q", vec![d, d]);
        t("attn_k", vec![d, kv]);
        t("attn_v", vec![d, kv]);
        t("attn_output", vec![d, d]);
        t("ffn_norm", vec![d]);
        t("ffn_gate", vec![d, s.n_ff]);
        t("ffn_up", vec![d, s.n_ff]);
        t("ffn_down", vec![s.n_ff, d]);
    }
    let mut seeds = vec![0u64; tensors.len()];
    for dmg in damages {
        let n = tensors.len();
        match dmg {
            Damage::SetKey(i, v) => w.set(KEYS[*i], v.clone()).unwrap(),
            Damage::RemoveKey(i) => {
                w.remove(KEYS[*i]);
            }
            Damage::DropTensor(i) if n > 0 => {
                tensors.remove(i % n);
                seeds.remove(i % n);
            }
            // Only to a first dimension the tensor's blocks still fit: a matrix that an
            // earlier damage made Q4_K or Q6_K takes rows of whole 256-weight blocks (a file
            // that cannot be written is not a damaged model).
            Damage::Reshape(i, d0) if n > 0 && d0.is_multiple_of(tensors[i % n].2.block_size()) => {
                tensors[i % n].1[0] = *d0
            }
            Damage::Retype(i, t, seed) if n > 0 => {
                let t = TYPES[*t];
                if tensors[i % n].1[0].is_multiple_of(t.block_size()) {
                    tensors[i % n].2 = t;
                    seeds[i % n] = seed | 1;
                }
            }
            _ => {}
        }
    }
    for (name, dims, ty) in &tensors {
        w.add_tensor(name, dims, *ty).unwrap();
    }
    let mut out = Vec::new();
    let mut i = 0;
    w.write(&mut out, |t| {
        let seed = seeds[i];
        i += 1;
        let data = if seed == 0 {
            weights(t.n_elements(), i as u64)
        } else {
            bytes(t.n_bytes() as usize, seed)
        };
        Ok::<_, String>(data)
    })
    .unwrap();
    out
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: CASES,
        ..ProptestConfig::default()
    })]

    #[test]
    fn damaged_models_load_or_fail_cleanly_and_run_or_fail_cleanly(
        s in shape(),
        damages in proptest::collection::vec(damage(), 0..4),
        prompt in proptest::collection::vec(any::<u32>(), 1..6),
    ) {
        let file = GgufFile::from_bytes(build(&s, &damages)).unwrap();
        for quantized in [false, true] {
            let loaded = if quantized {
                Model::load(&file, &QuantLoader, &ch04::architectures())
            } else {
                Model::load(&file, &DenseLoader, &ch04::architectures())
            };
            let Ok(mut model) = loaded else {
                // A typed error; its message must say something.
                prop_assert!(!loaded.err().unwrap().to_string().is_empty());
                continue;
            };
            // What loaded is consistent: a context inside the model's, finite ε.
            prop_assert!(model.n_ctx() >= 1 && model.n_ctx() <= model.config.context_length);
            prop_assert!(model.config.rms_norm_eps.is_finite());
            let _ = model.set_context(model.config.context_length.min(16) + 1000);
            prop_assert!(model.set_context(8).is_ok());
            let tokens: Vec<u32> = prompt.iter().map(|t| t % 64).collect();
            let batch = Batch::sequence(0, &tokens, 0, false);
            let _ = model.forward(&batch, &mut model.new_kv(), &mut NoObserver);
            if let Ok(tok) = Tokenizer::from_gguf(&file.gguf) {
                let ids: Vec<u32> = tokens.iter().map(|t| t % model.config.vocab_size as u32).collect();
                let params = GenParams {
                    max_tokens: 16,
                    sampler: SamplerParams { temp: 0.0, ..SamplerParams::default() },
                    stop: vec![],
                    rule: None,
                };
                let mut session = Cached::contiguous(&model, None);
                let _ = generate(&mut session, &tok, &ids, &params, &mut |_| {});
            }
        }
    }
}

/// The generator is not vacuous: undamaged, every shape loads, and generation runs into the
/// context's end (8 positions) with a clean stop.
#[test]
fn undamaged_models_load_and_stop_at_the_context_end() {
    let s = Shape {
        n_layer: 2,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 32,
        n_ff: 64,
        vocab: 20,
    };
    let file = GgufFile::from_bytes(build(&s, &[])).unwrap();
    let mut model = Model::load(&file, &DenseLoader, &ch04::architectures()).unwrap();
    model.set_context(8).unwrap();
    let tok = Tokenizer::from_gguf(&file.gguf).unwrap();
    assert_eq!(tok.encode("ab", false, false), [2]);
    let params = GenParams {
        max_tokens: 100,
        sampler: SamplerParams {
            temp: 0.0,
            ..SamplerParams::default()
        },
        stop: vec![],
        rule: None,
    };
    let mut session = Cached::contiguous(&model, None);
    let g = generate(&mut session, &tok, &[1, 2, 3], &params, &mut |_| {}).unwrap();
    assert_eq!(g.stop, ch04::StopReason::ContextFull);
    assert_eq!(g.ids.len(), 8 - 3 + 1);
}
