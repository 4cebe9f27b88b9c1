//! llama.cpp's choice of type for every tensor, reproduced.
//!
//! `quant/variants.json` lists, for each file type llama.cpp quantized the default model to
//! (`testkit::refdata::QUANT_VARIANTS`), every tensor's name and type in the order of the file
//! llama.cpp wrote. The recipe must choose the same type for every tensor, and list them in the
//! same order. The other tests here check rules this model does not reach, on made-up tensors.

use ch01::gguf::ValueType;
use ch01::{GgmlType, Gguf, GgufFile, TensorInfo, Value};
use ch06::recipe::{LlamaFtype, Plan, TypeList, allows_quantization, fallback};
use testkit::assert_same_sequence;
use testkit::refdata::QUANT_VARIANTS;

/// Failures listed in a message: one root cause usually breaks many tensors alike.
const SHOW: usize = 10;

fn type_named(name: &str) -> GgmlType {
    GgmlType::from_name(name).unwrap_or_else(|| panic!("quant/variants.json: unknown type {name}"))
}

#[test]
fn the_recipe_chooses_llama_cpps_type_for_every_tensor() {
    let json = testkit::refdata::json("quant/variants.json").unwrap_or_else(|e| panic!("{e}"));
    let model = GgufFile::open(shared::default_model_path().unwrap()).unwrap();
    let (mut checked, mut variants) = (vec![], vec![]);
    for (variant, v) in json["variants"].as_object().expect("a `variants` object") {
        // The original Q4_1 file was made by another tool from the original weights.
        let Some(id) = v["ftype"].as_u64() else {
            continue;
        };
        let ftype = LlamaFtype::from_id(id as u32).unwrap_or_else(|| panic!("ftype {id}"));
        assert_eq!(ftype.name(), variant, "ftype {id} of variant {variant}");
        let want: Vec<(String, GgmlType)> = v["tensors"]
            .as_array()
            .expect("a `tensors` list")
            .iter()
            .map(|t| {
                (
                    t["name"].as_str().unwrap().to_string(),
                    type_named(t["type"].as_str().unwrap()),
                )
            })
            .collect();
        let plan = Plan::new(&model.gguf, ftype).unwrap();
        let differ: Vec<String> = want
            .iter()
            .filter(|(name, ty)| plan.get(name) != Some(*ty))
            .map(|(name, ty)| {
                format!(
                    "{variant}: {name}: llama.cpp {ty}, recipe {:?}",
                    plan.get(name)
                )
            })
            .collect();
        assert!(
            differ.is_empty(),
            "{} tensors differ; the first {}:\n{}",
            differ.len(),
            differ.len().min(SHOW),
            differ[..differ.len().min(SHOW)].join("\n")
        );
        assert_same_sequence(
            &format!("{variant}: same types, but not in llama.cpp's order"),
            &plan.tensors,
            &want,
        );
        checked.push(format!("{variant}: {:?}", plan.type_counts()));
        variants.push(variant.as_str());
    }
    let mut want = QUANT_VARIANTS.to_vec();
    want.sort();
    variants.sort();
    assert_eq!(variants, want, "the variants quant/variants.json holds");
    println!("{}", checked.join("\n"));
}

/// A llama-like header: `n_layer` layers of `d`-wide attention and MLP weights, tied or not.
fn model(n_layer: usize, d: u64, n_head: u32, n_head_kv: u32, tied: bool) -> Gguf {
    let mut tensors = vec![];
    let mut t = |name: String, dims: Vec<u64>| {
        tensors.push(TensorInfo {
            name,
            dims,
            ggml_type: GgmlType::F32,
            offset: 0,
        })
    };
    t("token_embd.weight".into(), vec![d, 1000]);
    t("output_norm.weight".into(), vec![d]);
    if !tied {
        t("output.weight".into(), vec![d, 1000]);
    }
    let kv = d / u64::from(n_head) * u64::from(n_head_kv);
    for l in 0..n_layer {
        t(format!("blk.{l}.attn_norm.weight"), vec![d]);
        t(format!("blk.{l}.attn_q.weight"), vec![d, d]);
        t(format!("blk.{l}.attn_k.weight"), vec![d, kv]);
        t(format!("blk.{l}.attn_v.weight"), vec![d, kv]);
        t(format!("blk.{l}.attn_output.weight"), vec![d, d]);
        t(format!("blk.{l}.ffn_norm.weight"), vec![d]);
        t(format!("blk.{l}.ffn_gate.weight"), vec![d, 3 * d]);
        t(format!("blk.{l}.ffn_up.weight"), vec![d, 3 * d]);
        t(format!("blk.{l}.ffn_down.weight"), vec![3 * d, d]);
    }
    let s = |x: &str| Value::String(x.into());
    Gguf::new(
        3,
        vec![
            ("general.architecture".into(), s("llama")),
            ("llama.block_count".into(), Value::U32(n_layer as u32)),
            ("llama.attention.head_count".into(), Value::U32(n_head)),
            (
                "llama.attention.head_count_kv".into(),
                Value::U32(n_head_kv),
            ),
        ],
        tensors,
        32,
        0,
    )
}

fn layers_with(plan: &Plan, kind: &str, ty: GgmlType) -> Vec<usize> {
    plan.tensors
        .iter()
        .filter(|(n, t)| n.ends_with(kind) && *t == ty)
        .map(|(n, _)| n.split('.').nth(1).unwrap().parse().unwrap())
        .collect()
}

#[test]
fn q4_k_m_spends_more_bits_on_attn_v_and_ffn_down_in_chosen_layers() {
    // Rows of 512 split into 256-weight blocks: no fallback hides the mix.
    let plan = Plan::new(&model(32, 512, 8, 8, false), LlamaFtype::Q4_K_M).unwrap();
    let more = [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31];
    assert_eq!(layers_with(&plan, "attn_v.weight", GgmlType::Q6_K), more);
    assert_eq!(layers_with(&plan, "ffn_down.weight", GgmlType::Q6_K), more);
    assert_eq!(
        layers_with(&plan, "ffn_down.weight", GgmlType::Q4_K).len(),
        32 - more.len()
    );
    assert_eq!(plan.get("output.weight"), Some(GgmlType::Q6_K));
    assert_eq!(plan.get("token_embd.weight"), Some(GgmlType::Q4_K)); // untied: the default
    assert_eq!(plan.get("blk.5.attn_q.weight"), Some(GgmlType::Q4_K));
    assert_eq!(plan.get("blk.5.attn_norm.weight"), Some(GgmlType::F32));
}

#[test]
fn other_mixes_follow_their_rules() {
    let m = model(32, 512, 8, 2, true);
    let plan = |f| Plan::new(&m, f).unwrap();
    let all: Vec<usize> = (0..32).collect();

    let q3 = plan(LlamaFtype::Q3_K_M);
    assert_eq!(layers_with(&q3, "attn_v.weight", GgmlType::Q5_K), [0, 1]);
    assert_eq!(
        layers_with(&q3, "attn_v.weight", GgmlType::Q4_K),
        (2..32).collect::<Vec<_>>()
    );
    assert_eq!(layers_with(&q3, "ffn_down.weight", GgmlType::Q5_K), [0, 1]);
    assert_eq!(layers_with(&q3, "attn_output.weight", GgmlType::Q4_K), all);
    assert_eq!(q3.get("token_embd.weight"), Some(GgmlType::Q6_K)); // tied: the output's type

    let q2 = plan(LlamaFtype::Q2_K); // n_gqa = 4: attn_v gets Q4_K
    assert_eq!(layers_with(&q2, "attn_v.weight", GgmlType::Q4_K), all);
    assert_eq!(layers_with(&q2, "ffn_down.weight", GgmlType::Q3_K), all);
    assert_eq!(layers_with(&q2, "attn_q.weight", GgmlType::Q2_K), all);

    let q4s = plan(LlamaFtype::Q4_K_S);
    assert_eq!(
        layers_with(&q4s, "attn_v.weight", GgmlType::Q5_K),
        [0, 1, 2, 3]
    );
    assert_eq!(
        layers_with(&q4s, "ffn_down.weight", GgmlType::Q5_K),
        [0, 1, 2, 3]
    );

    let q8 = plan(LlamaFtype::Q8_0);
    assert!(q8.tensors.iter().all(|(n, t)| *t
        == if n.contains("norm") {
            GgmlType::F32
        } else {
            GgmlType::Q8_0
        }));
    let f16 = plan(LlamaFtype::F16);
    assert_eq!(f16.get("token_embd.weight"), Some(GgmlType::F16));
    assert_eq!(f16.get("output_norm.weight"), Some(GgmlType::F32));
}

#[test]
fn k_quants_fall_back_when_rows_do_not_split_into_256() {
    use GgmlType::*;
    let t = |cols: u64| TensorInfo {
        name: "w".into(),
        dims: vec![cols, 8],
        ggml_type: F32,
        offset: 0,
    };
    for (target, want_576) in [
        (Q2_K, Q4_0),
        (Q3_K, Q4_0),
        (Q4_K, Q5_0),
        (Q5_K, Q5_1),
        (Q6_K, Q8_0),
    ] {
        assert_eq!(fallback(&t(576), target).unwrap(), want_576, "{target}");
        assert_eq!(fallback(&t(512), target).unwrap(), target, "{target}");
        assert_eq!(fallback(&t(48), target).unwrap(), F16, "{target}");
    }
    assert_eq!(fallback(&t(48), Q8_0).unwrap(), F16);
    assert_eq!(fallback(&t(64), Q8_0).unwrap(), Q8_0);
    let e = fallback(&t(48), IQ2_XXS).unwrap_err().to_string();
    assert!(e.contains("IQ2_XXS") && e.contains("\"w\""), "{e}");

    // The same through the recipe, on this model's width.
    let plan = Plan::new(&model(4, 576, 9, 3, true), LlamaFtype::Q4_K_M).unwrap();
    assert_eq!(plan.get("blk.2.attn_q.weight"), Some(Q5_0));
    assert_eq!(plan.get("token_embd.weight"), Some(Q8_0));
    // Rows of 3 × 576 = 1728: Q4_K falls back to Q5_0, and the use_more_bits layers' (2 and 3
    // of 4) Q6_K to Q8_0.
    assert_eq!(plan.get("blk.0.ffn_down.weight"), Some(Q5_0));
    assert_eq!(plan.get("blk.2.ffn_down.weight"), Some(Q8_0));
}

#[test]
fn only_weight_matrices_are_quantized() {
    let t = |name: &str, dims: Vec<u64>| TensorInfo {
        name: name.into(),
        dims,
        ggml_type: GgmlType::F32,
        offset: 0,
    };
    assert!(allows_quantization(&t("blk.0.attn_q.weight", vec![64, 64])));
    assert!(!allows_quantization(&t("blk.0.attn_norm.weight", vec![64])));
    assert!(!allows_quantization(&t(
        "blk.0.attn_q.weight",
        vec![64, 1, 1]
    ))); // 1-D in ggml's eyes
    assert!(!allows_quantization(&t("blk.0.attn_q.bias", vec![64, 64])));
    assert!(!allows_quantization(&t(
        "blk.0.ffn_gate_inp.weight",
        vec![64, 8]
    )));
    assert!(!allows_quantization(&t(
        "blk.0.post_attention_norm.weight",
        vec![64, 2]
    )));
}

#[test]
fn a_list_of_types_reproduces_a_mix_exactly() {
    let model = GgufFile::open(shared::default_model_path().unwrap()).unwrap();
    let q4km = Plan::new(&model.gguf, LlamaFtype::Q4_K_M).unwrap();
    let list = TypeList::parse(&q4km.to_list(), "q4_k_m.txt").unwrap();
    assert_eq!(list.entries.len(), model.gguf.tensors.len());
    // Starting from a plain Q8_0 plan, the list gives back every Q4_K_M type.
    let rebuilt = Plan::new(&model.gguf, LlamaFtype::Q8_0)
        .unwrap()
        .with_list(&model.gguf, &list)
        .unwrap();
    assert_same_sequence(
        "Q8_0 plan with the Q4_K_M list",
        &rebuilt.tensors,
        &q4km.tensors,
    );
}

#[test]
fn bad_lists_are_refused_with_the_line() {
    let model = GgufFile::open(shared::default_model_path().unwrap()).unwrap();
    let plan = || Plan::new(&model.gguf, LlamaFtype::Q8_0).unwrap();
    let err = |text: &str| match TypeList::parse(text, "types.txt") {
        Err(e) => e.to_string(),
        Ok(list) => plan()
            .with_list(&model.gguf, &list)
            .unwrap_err()
            .to_string(),
    };
    let ok = TypeList::parse(
        "# a comment\n\n  blk.0.attn_q.weight   q4_k # inline\n",
        "t",
    )
    .unwrap();
    assert_eq!(ok.entries[0].ty, GgmlType::Q4_K);
    assert_eq!(ok.entries[0].line, 3);

    let cases = [
        ("blk.0.attn_q.weight\n", "types.txt:1: expected `name TYPE`"),
        (
            "\nblk.0.attn_q.weight Q9_0\n",
            "types.txt:2: unknown ggml type \"Q9_0\"",
        ),
        (
            "blk.0.attn_q.weight IQ2_XXS\n",
            "no weight quantizer for IQ2_XXS",
        ),
        ("blk.0.attn_q.weight Q8_K\n", "no weight quantizer for Q8_K"),
        (
            "blk.0.attn_q.weight Q8_0\nblk.0.attn_q.weight Q4_0\n",
            "types.txt:2: \"blk.0.attn_q.weight\" is already given on line 1",
        ),
        (
            "blk.99.attn_q.weight Q4_0\n",
            "types.txt:1: the model has no tensor \"blk.99.attn_q.weight\"",
        ),
        (
            "blk.0.attn_q.weight Q4_K\n",
            "rows of 576 elements, not a whole number of Q4_K blocks",
        ),
    ];
    for (text, want) in cases {
        let got = err(text);
        assert!(got.contains(want), "{text:?}: {got}");
    }
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-dir").join("types.txt");
    let e = TypeList::read(&missing).unwrap_err().to_string();
    assert!(e.contains("types.txt"), "{e}");
}

#[test]
fn metadata_the_recipe_needs_is_named_when_missing() {
    let mut m = model(2, 512, 8, 8, true);
    m.metadata.retain(|(k, _)| k != "llama.block_count");
    let e = Plan::new(&m, LlamaFtype::Q4_K_M).unwrap_err().to_string();
    assert!(e.contains("llama.block_count"), "{e}");
    m.metadata[0].1 = Value::Array(ValueType::U8, vec![]);
    let e = Plan::new(&m, LlamaFtype::Q4_K_M).unwrap_err().to_string();
    assert!(e.contains("general.architecture"), "{e}");
}
