//! `Config::from_gguf` applies llama.cpp's defaults and rejects values that do not make a model.

mod common;

use ch01::config::{ConfigError, RopeScaling, RopeScalingType, RopeStyle};
use ch01::gguf::{Value, ValueType};
use ch01::{Config, GgmlType, Gguf};
use common::Builder;

/// The keys llama.cpp requires for a llama model, and nothing optional.
fn minimal() -> Builder {
    Builder::new()
        .kv("general.architecture", Value::String("llama".into()))
        .kv("llama.block_count", Value::U32(2))
        .kv("llama.embedding_length", Value::U32(64))
        .kv("llama.attention.head_count", Value::U32(4))
        .kv("llama.feed_forward_length", Value::U64(128))
        .kv("llama.context_length", Value::U32(256))
        .kv("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-6))
        .kv(
            "tokenizer.ggml.tokens",
            Value::Array(
                ValueType::String,
                ["a", "b", "c"].map(|s| Value::String(s.into())).to_vec(),
            ),
        )
}

fn config(b: Builder) -> Result<Config, ConfigError> {
    Config::from_gguf(&Gguf::parse(&b.build()).unwrap(), &["llama"])
}

#[test]
fn optional_keys_take_llama_cpp_defaults() {
    let c = config(minimal()).unwrap();
    assert_eq!(
        c,
        Config {
            arch: "llama".into(),
            n_layer: 2,
            d_model: 64,
            n_head: 4,
            n_head_kv: 4,
            head_dim: 16,
            n_ff: 128,
            vocab_size: 3,
            context_length: 256,
            rope_freq_base: 10000.0,
            rope_dim: 16,
            rope_scaling: None,
            rope_attn_factor: 1.0,
            rope_style: RopeStyle::Normal,
            rms_norm_eps: 1e-6,
            tied_embeddings: true,
            attention_scale: None,
            final_logit_softcapping: None,
        }
    );
    assert_eq!((c.n_group(), c.kv_dim()), (1, 64));
}

#[test]
fn explicit_keys_override_the_defaults() {
    let b = minimal()
        .kv("llama.attention.head_count_kv", Value::U32(2))
        .kv("llama.attention.key_length", Value::U32(32))
        .kv("llama.rope.dimension_count", Value::U32(32))
        .kv("llama.rope.freq_base", Value::F32(500000.0))
        // Equal to the token list's length, as it must be.
        .kv("llama.vocab_size", Value::U32(3))
        .kv("llama.rope.scaling.type", Value::String("yarn".into()))
        .kv("llama.rope.scaling.factor", Value::F32(4.0))
        .kv("llama.rope.scaling.original_context_length", Value::U32(64))
        .kv("llama.rope.scaling.attn_factor", Value::F32(1.25))
        .kv("llama.attention.scale", Value::F32(0.125))
        .tensor(
            "output.weight",
            &[64, 3],
            GgmlType::F32,
            vec![0; 64 * 3 * 4],
        );
    let c = config(b).unwrap();
    assert_eq!((c.n_head_kv, c.head_dim, c.rope_dim), (2, 32, 32));
    assert_eq!((c.rope_freq_base, c.vocab_size), (500000.0, 3));
    assert_eq!(
        c.rope_scaling,
        Some(RopeScaling {
            kind: RopeScalingType::Yarn,
            factor: 4.0,
            original_context: 64,
        })
    );
    assert_eq!(c.rope_attn_factor, 1.25);
    assert_eq!(c.attention_scale, Some(0.125));
    assert!(!c.tied_embeddings);
    assert_eq!((c.n_group(), c.kv_dim()), (2, 64));
}

#[test]
fn a_scaling_factor_of_one_or_type_none_scales_nothing() {
    let linear_1 = minimal().kv("llama.rope.scaling.factor", Value::F32(1.0));
    assert_eq!(config(linear_1).unwrap().rope_scaling, None);
    let none = minimal()
        .kv("llama.rope.scaling.type", Value::String("none".into()))
        .kv("llama.rope.scaling.factor", Value::F32(8.0));
    assert_eq!(config(none).unwrap().rope_scaling, None);
    // The older key name still counts.
    let old = minimal().kv("llama.rope.scale_linear", Value::F32(2.0));
    assert_eq!(
        config(old).unwrap().rope_scaling,
        Some(RopeScaling {
            kind: RopeScalingType::Linear,
            factor: 2.0,
            original_context: 256,
        })
    );
}

#[test]
fn inconsistent_values_name_their_key() {
    let cases = [
        (
            minimal().kv("llama.attention.head_count_kv", Value::U32(3)),
            "llama.attention.head_count_kv",
        ),
        (
            minimal().kv("llama.rope.dimension_count", Value::U32(8)),
            "llama.rope.dimension_count",
        ),
        (
            minimal().kv("llama.rope.scaling.type", Value::String("ntk".into())),
            "llama.rope.scaling.type",
        ),
        (
            minimal().kv("llama.attention.head_count_kv", Value::U32(0)),
            "llama.attention.head_count_kv",
        ),
        (
            minimal().kv("llama.rope.scaling.attn_factor", Value::F32(-1.0)),
            "llama.rope.scaling.attn_factor",
        ),
        (
            minimal().kv("llama.rope.scaling.original_context_length", Value::U32(0)),
            "llama.rope.scaling.original_context_length",
        ),
    ];
    for (b, key) in cases {
        match config(b) {
            Err(e @ ConfigError::Invalid { .. }) => {
                assert!(e.to_string().contains(key), "{e}")
            }
            other => panic!("{key}: expected Invalid, got {other:?}"),
        }
    }
}

#[test]
fn missing_required_keys_are_named() {
    for key in [
        "llama.block_count",
        "llama.embedding_length",
        "llama.attention.head_count",
        "llama.feed_forward_length",
        "llama.context_length",
        "llama.attention.layer_norm_rms_epsilon",
        "general.architecture",
    ] {
        let mut b = minimal();
        b.kvs.retain(|(k, _)| k != key);
        match config(b) {
            Err(ConfigError::MissingKey(k)) => assert_eq!(k, key),
            other => panic!("{key}: expected MissingKey, got {other:?}"),
        }
    }
    let mut b = minimal();
    b.kvs.retain(|(k, _)| k != "tokenizer.ggml.tokens");
    assert!(matches!(config(b), Err(ConfigError::MissingKey(k)) if k == "tokenizer.ggml.tokens"));
}

#[test]
fn values_of_the_wrong_type_are_errors() {
    let b = minimal().kv("llama.rope.freq_base", Value::String("1e4".into()));
    let e = config(b).unwrap_err();
    assert!(matches!(e, ConfigError::BadValue(_)));
    assert!(
        e.to_string()
            .contains("\"llama.rope.freq_base\": expected f32, found string"),
        "{e}"
    );
}

#[test]
fn float_values_outside_their_domain_name_key_and_value() {
    for (key, value) in [
        ("llama.attention.layer_norm_rms_epsilon", f32::NAN),
        ("llama.attention.layer_norm_rms_epsilon", 0.0),
        ("llama.attention.layer_norm_rms_epsilon", 1.5),
        ("llama.rope.freq_base", f32::INFINITY),
        ("llama.rope.freq_base", 1.0),
        ("llama.rope.freq_base", -10000.0),
        ("llama.rope.scaling.factor", f32::NAN),
        ("llama.rope.scaling.factor", -4.0),
        ("llama.attention.scale", 0.0),
        ("llama.attention.scale", f32::NAN),
    ] {
        let mut b = minimal();
        b.kvs.retain(|(k, _)| k != key);
        match config(b.kv(key, Value::F32(value))) {
            Err(e @ ConfigError::Invalid { .. }) => {
                let msg = e.to_string();
                assert!(
                    msg.contains(key) && msg.contains(&value.to_string()),
                    "{msg}"
                );
            }
            other => panic!("{key} = {value}: expected Invalid, got {other:?}"),
        }
    }
}

#[test]
fn counts_that_contradict_each_other_name_their_key() {
    let b = minimal().kv("llama.vocab_size", Value::U32(4));
    let e = config(b).unwrap_err();
    assert!(
        e.to_string().contains("llama.vocab_size") && e.to_string().contains("3 tokens"),
        "{e}"
    );
    let mut b = minimal();
    b.kvs.retain(|(k, _)| k != "llama.context_length");
    let e = config(b.kv("llama.context_length", Value::U32(0))).unwrap_err();
    assert!(e.to_string().contains("llama.context_length"), "{e}");
    let b = minimal()
        .kv("llama.attention.key_length", Value::U64(1 << 62))
        .kv("llama.rope.dimension_count", Value::U64(1 << 62));
    let e = config(b).unwrap_err();
    assert!(e.to_string().contains("overflow"), "{e}");
}

mod fuzz {
    use super::*;
    use proptest::prelude::*;

    /// Keys `Config::from_gguf` reads.
    const KEYS: &[&str] = &[
        "general.architecture",
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
        "llama.rope.scale_linear",
        "llama.attention.layer_norm_rms_epsilon",
        "tokenizer.ggml.tokens",
    ];

    fn value() -> impl Strategy<Value = Option<Value>> {
        let float = prop_oneof![
            Just(f32::NAN),
            Just(f32::NEG_INFINITY),
            Just(0.0f32),
            Just(1.0f32),
            Just(1e-6f32),
            any::<f32>()
        ];
        proptest::option::weighted(
            0.8,
            prop_oneof![
                (0..300u32).prop_map(Value::U32),
                any::<u64>().prop_map(Value::U64),
                any::<i64>().prop_map(Value::I64),
                float.prop_map(Value::F32),
                any::<f64>().prop_map(Value::F64),
                prop_oneof![
                    Just("llama"),
                    Just("linear"),
                    Just("yarn"),
                    Just("none"),
                    Just("")
                ]
                .prop_map(|s| Value::String(s.into())),
                (0..5usize).prop_map(|n| Value::Array(
                    ValueType::String,
                    vec![Value::String("t".into()); n]
                )),
            ],
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        /// Any values under the keys `Config` reads, starting from a valid configuration:
        /// an error, or a configuration whose every value is in its domain. Never a panic.
        #[test]
        fn any_metadata_gives_a_valid_config_or_an_error(
            changes in proptest::collection::vec((0..KEYS.len(), value()), 1..6)
        ) {
            let mut b = minimal();
            for (i, v) in changes {
                b.kvs.retain(|(k, _)| k != KEYS[i]);
                if let Some(v) = v {
                    b.kvs.push((KEYS[i].to_string(), v));
                }
            }
            let Ok(g) = Gguf::parse(&b.build()) else { return Ok(()) };
            match Config::from_gguf(&g, &["llama"]) {
                Err(e) => prop_assert!(!e.to_string().is_empty()),
                Ok(c) => {
                    prop_assert!(c.n_layer >= 1 && c.d_model >= 1 && c.n_ff >= 1);
                    prop_assert!(c.n_head >= 1 && c.n_head % c.n_head_kv == 0);
                    prop_assert!(c.n_head.checked_mul(c.head_dim).is_some());
                    prop_assert!(c.context_length >= 1 && c.vocab_size >= 1);
                    prop_assert!(c.default_context() >= 1);
                    prop_assert!(c.default_context() <= ch01::config::DEFAULT_CONTEXT);
                    prop_assert!(c.rope_freq_base.is_finite() && c.rope_freq_base > 1.0);
                    prop_assert!(c.rms_norm_eps > 0.0 && c.rms_norm_eps < 1.0);
                    if let Some(s) = c.rope_scaling {
                        prop_assert!(s.factor.is_finite() && s.factor > 0.0);
                    }
                }
            }
        }
    }
}

/// Found by the coverage-guided `config` fuzz target (`scripts/fuzz`): heads and head width of
/// 2^32 each, whose product overflowed in `Config::kv_dim`. Now refused where it is read.
#[test]
fn fuzz_regression_head_width_products_that_overflow() {
    let bytes = include_bytes!("../../../fuzz/regressions/config/kv-dim-overflow");
    let e = Config::from_gguf(&Gguf::parse(bytes).unwrap(), &["llama"]).unwrap_err();
    assert!(e.to_string().contains("overflow"), "{e}");
}
