//! The checks of a synthetic variant against llama.cpp (`reference-data/variants/`, made by
//! `scripts/export-reference`): every intermediate tensor of its prompt, and its greedy decode
//! through the KV cache. Chapter 13's variants use them, and chapter 18's mixture of experts
//! (which includes this file).

#![allow(dead_code)]

use ch01::{Gguf, GgufFile};
use ch02::Tokenizer;
use ch03::{DenseLoader, Recorder};
use ch04::{Architectures, Batch, Model};
use ch06::agreement::{GreedyStep, greedy_step_within};
use ch08::{FastLoader, PoolKind, new_pool};
use ch13::synthetic;
use testkit::HIDDEN_TOL;
use testkit::refdata::{self, TensorFile};
use testkit::{Tolerance, assert_close};

/// Logits of the synthetic models: chapter 4's `LOGITS_TOL` reasoning (f32 sums in another
/// order, a 128-term dot product per vocabulary entry after two layers) with a larger relative
/// part, because random weights give logits up to about 20 where SmolLM2's stay near 10.
/// Observed: at most about 1e-5.
pub const VARIANT_LOGITS_TOL: Tolerance = Tolerance::new(1e-4, 1e-4);

/// Where llama.cpp's greedy token and ours differ, our top two must be closer than this: the
/// f32 path differs from llama.cpp's only by summation order, a few units of 1e-5 on these
/// logits (above), so anything wider is a real difference.
pub const VARIANT_TIE_MARGIN: f32 = 1e-3;

pub struct Variant {
    pub id: String,
    pub model: Model,
    pub tokenizer: Tokenizer,
    pub recipe: serde_json::Value,
    /// Loaded as the finished engine runs it.
    pub engine: bool,
}

/// Variant `id`, loaded through `archs`: with `engine`, as the finished engine runs it (chapter
/// 8's matrices and compute); otherwise f32 weights and chapter 3's scalar attention.
pub fn load_with(id: &str, engine: bool, archs: &Architectures) -> Variant {
    let recipe =
        refdata::json(&format!("variants/{id}/model.json")).unwrap_or_else(|e| panic!("{e}"));
    let vocab_file = refdata::read(recipe["vocab"].as_str().unwrap()).unwrap();
    let vocab = Gguf::parse(&vocab_file).unwrap();
    let bytes = synthetic::build(&recipe, &vocab).unwrap_or_else(|e| panic!("{id}: {e}"));
    let file = GgufFile::from_bytes(bytes).unwrap();
    let model = if engine {
        let fast = FastLoader::new(new_pool(PoolKind::Spin, 2));
        let compute = fast.compute();
        Model::load(&file, &fast, archs).map(|m| m.with_compute(compute))
    } else {
        Model::load(&file, &DenseLoader, archs)
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

pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect()
}

/// Every intermediate tensor llama.cpp stored for the prompt, and the last position's logits.
pub fn check_prompt(v: &Variant) {
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
pub fn check_decode(v: &Variant) {
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
