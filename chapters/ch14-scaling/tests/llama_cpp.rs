//! The generated 7–9B shapes, cut to two layers at full width, against llama.cpp.
//!
//! The reference pipeline had chapter 14's `make-model` write each file and ran llama.cpp on
//! it (`reference-data/large/`). Here the same recipe writes the file again into the model
//! cache: its sha256 must be the pipeline's (the generator, the quantizers and the writer are
//! deterministic), then our engine runs the prompt and llama.cpp's greedy continuation
//! teacher-forced, and chapter 6's bounds judge every step: KL and mean |Δlogit| after the
//! prompt and after each continuation token ([`StepLogits`]), the greedy token within the tie
//! margin. Near-ties are bounded by what the measured noise predicts ([`check_near_ties`]) —
//! on the scalar path (chapter 6's reference kernels) and on the fast one (chapter 8's packed
//! kernels over chapter 10's map), at full width: d 4096 or 3584, 4:1 or 7:1 grouped-query
//! attention, Qwen2's biases and Qwen3's per-head norms, vocabularies of 128k and 152k tokens.
//! Then again with the KV cache in f16 (llama.cpp's default) and in q8_0, against llama.cpp's
//! runs with the same cache types. And the default model deep in its context, with the same
//! judge: a 4,000-token prompt, where attention is most of a token's work.

use ch01::GgufFile;
use ch04::Model;
use ch05::{CacheTypes, ContiguousCache, PagedCache, RowType};
use ch06::QuantLoader;
use ch06::agreement::Margins;
use ch06::cache::ROW_Q8_0;
use ch08::{FastLoader, PoolKind, new_pool};
use ch10::engine::{Engine, LoadMode};
use ch10::mapped::MapOptions;
use ch14::large::{self, check_near_ties};
use testkit::refdata::{self, TensorFile};

#[path = "common/large_checks.rs"]
mod large_checks;
use large_checks::{
    Scalar, Totals, built, check_both_paths, ids, judge, kept_steps, sample_stride,
};

#[test]
fn generated_large_models_agree_with_llama_cpp_on_both_paths() {
    let json = refdata::json("large/models.json").unwrap_or_else(|e| panic!("{e}"));
    let stride = sample_stride(&json);
    let ours = this_chapters(&json);
    assert!(
        ours.len() >= 4,
        "reference-data/large/models.json lists too few of chapter 14's models"
    );
    check_both_paths(
        &large::SHAPES,
        ours.into_iter(),
        stride,
        &ch13::architectures(),
        Scalar::OncePerType,
    );
}

/// The reference models of chapter 14's shapes (the file also lists chapter 18's).
fn this_chapters(json: &serde_json::Value) -> Vec<(&String, &serde_json::Value)> {
    let models = json["models"].as_object().expect("models");
    let ours = |m: &serde_json::Value| large::SHAPES.iter().any(|s| m["shape"] == s.id);
    models.iter().filter(|(_, m)| ours(m)).collect()
}

/// The cache types llama.cpp's runs in `reference-data/large/` used besides f32, by the names
/// the safetensors prefix their tensors with.
const CACHES: [(&str, RowType); 2] = [("f16", RowType::F16), ("q8_0", ROW_Q8_0)];

/// With a smaller cache both engines round keys and values (llama.cpp also rounds the queries
/// to the cache's type, and for q8_0 rotates keys and values before it quantizes them), so the
/// engines' logits differ by more noise than in f32: the near-tie rule measures it at each
/// step, and for q8_0 the bounds grow by what the rounding llama.cpp does elsewhere adds
/// ([`large::q8_0_margins`]).
#[test]
fn generated_large_models_agree_with_llama_cpp_with_f16_and_q8_0_caches() {
    let json = refdata::json("large/models.json").unwrap_or_else(|e| panic!("{e}"));
    let stride = sample_stride(&json);
    let archs = ch13::architectures();
    let mut totals = Totals::default();
    for (i, (id, m)) in this_chapters(&json).into_iter().enumerate() {
        let path = built(&large::SHAPES, id, m);
        let want =
            TensorFile::open(&format!("large/{id}.safetensors")).unwrap_or_else(|e| panic!("{e}"));
        let prompt = ids(&want, "tokens");
        // The scalar path on the first model only: chapter 3's reference reads an encoded cache
        // a piece at a time, and chapter 8's tests hold its kernels to that reference.
        let scalar = (i == 0).then(|| {
            let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{e}"));
            Model::load(&file, &QuantLoader, &archs).unwrap_or_else(|e| panic!("{e}"))
        });
        let fast = FastLoader::new(new_pool(PoolKind::Spin, 2));
        let engine = Engine::load(&path, LoadMode::Map(MapOptions::default()), fast, &archs)
            .unwrap_or_else(|e| panic!("{e}"));
        for (name, t) in CACHES {
            let types = CacheTypes { k: t, v: t };
            let cont = ids(&want, &format!("{name}.generated"));
            let next = want
                .f32(&format!("{name}.next_logits"))
                .unwrap_or_else(|e| panic!("{e}"));
            let steps = kept_steps(&want, &format!("{name}."), stride);
            let all: Vec<u32> = prompt.iter().chain(&cont).copied().collect();
            let paths = [("fast", Some(&engine.model)), ("scalar", scalar.as_ref())];
            for (path_name, model) in paths.into_iter().filter_map(|(n, m)| Some((n, m?))) {
                let (ours, margins) = with_cache(model, &all, prompt.len() - 1, types);
                let what = format!("{id} ({name} cache, {path_name})");
                judge(
                    &what,
                    &next.data,
                    &steps,
                    &ours,
                    &cont,
                    &*margins,
                    &mut totals,
                );
            }
        }
    }
    check_near_ties(totals.near_ties, totals.expected)
        .unwrap_or_else(|e| panic!("{e}, in {} steps", totals.steps));
}

/// Our logits for `all` from position `from` on, with the KV cache in `types` — a q8_0 one in
/// chapter 5's paged store, as the engine and the server keep it (blocks of 16 positions), any
/// other in a contiguous one, so that both stores are checked — and the bounds of each step
/// against llama.cpp's run with the same cache type: chapter 6's, and for a q8_0 cache raised
/// by what one rounding of it does to our logits (llama.cpp rounds other vectors than ours: it
/// rotates them first), measured against the same tokens with an f32 cache.
pub fn with_cache(
    model: &Model,
    all: &[u32],
    from: usize,
    types: CacheTypes,
) -> (Vec<f32>, Box<dyn Fn(usize) -> Margins>) {
    let q8_0 = types.k == ROW_Q8_0;
    let ours = if q8_0 {
        let (n_layer, kv_dim) = (model.config.n_layer, model.attention.kv_dim());
        let blocks = all.len().div_ceil(16);
        let mut kv = PagedCache::try_typed(n_layer, kv_dim, 16, blocks, types)
            .unwrap_or_else(|e| panic!("{e}"));
        model.logits_from_in(all, from, &mut kv)
    } else {
        let mut kv = ContiguousCache::for_model_typed(model, all.len(), types)
            .unwrap_or_else(|e| panic!("{e}"));
        model.logits_from_in(all, from, &mut kv)
    }
    .unwrap_or_else(|e| panic!("{e}"));
    let vocab = model.config.vocab_size;
    let margins: Box<dyn Fn(usize) -> Margins> = if q8_0 {
        let f32_cache = model
            .logits_from(all, from)
            .unwrap_or_else(|e| panic!("{e}"));
        let q8 = ours.clone();
        Box::new(move |step| {
            large::q8_0_margins(
                &f32_cache[step * vocab..][..vocab],
                &q8[step * vocab..][..vocab],
            )
        })
    } else {
        Box::new(|_| Margins::QUANTIZED)
    };
    (ours, margins)
}

/// The default model 4,000 tokens deep in its context (`reference-data/depth/`): the last
/// queries of the prompt and every continuation token attend over thousands of keys, through
/// chapter 8's key segments, their merge and the online softmax across 125 tiles, and through
/// chapter 5's stores with f32, f16 and q8_0 rows. Every step is judged as the large models'
/// are, against llama.cpp's run with the same cache type; the near-ties against what the noise
/// measured at each step predicts.
#[test]
fn the_default_model_deep_in_its_context_agrees_with_llama_cpp() {
    let json = refdata::json("depth/depth.json").unwrap_or_else(|e| panic!("{e}"));
    let stride = json["steps"]["sample_stride"]
        .as_u64()
        .expect("reference-data/depth/depth.json: steps.sample_stride") as usize;
    let path = shared::default_model_path().unwrap_or_else(|e| panic!("{e}"));
    let sha = shared::sha256_file(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(
        json["model_sha256"].as_str(),
        Some(sha.as_str()),
        "{}: not the file llama.cpp ran at depth (is LLM_RS_MODEL set?)",
        path.display()
    );
    let want = TensorFile::open("depth/smollm2.safetensors").unwrap_or_else(|e| panic!("{e}"));
    let prompt = ids(&want, "tokens");
    let archs = ch13::architectures();
    let fast = FastLoader::new(new_pool(PoolKind::Spin, 2));
    let engine = Engine::load(&path, LoadMode::Map(MapOptions::default()), fast, &archs)
        .unwrap_or_else(|e| panic!("{e}"));
    let model = &engine.model;
    let mut totals = Totals::default();
    for (name, t) in [
        ("f32", RowType::F32),
        ("f16", RowType::F16),
        ("q8_0", ROW_Q8_0),
    ] {
        let types = CacheTypes { k: t, v: t };
        let cont = ids(&want, &format!("{name}.generated"));
        let next = want
            .f32(&format!("{name}.next_logits"))
            .unwrap_or_else(|e| panic!("{e}"));
        let steps = kept_steps(&want, &format!("{name}."), stride);
        let all: Vec<u32> = prompt.iter().chain(&cont).copied().collect();
        let (ours, margins) = with_cache(model, &all, prompt.len() - 1, types);
        let what = format!(
            "the default model, {} tokens deep ({name} cache)",
            prompt.len()
        );
        judge(
            &what,
            &next.data,
            &steps,
            &ours,
            &cont,
            &*margins,
            &mut totals,
        );
    }
    check_near_ties(totals.near_ties, totals.expected)
        .unwrap_or_else(|e| panic!("{e}, in {} steps", totals.steps));
}
