//! The generated 7–9B shapes, cut to two layers at full width, against llama.cpp.
//!
//! The reference pipeline had chapter 14's `make-model` write each file and ran llama.cpp on
//! it (`reference-data/large/`). Here the same recipe writes the file again into the model
//! cache: its sha256 must be the pipeline's (the generator, the quantizers and the writer are
//! deterministic), then our engine runs the prompt and llama.cpp's greedy continuation
//! teacher-forced, and chapter 6's rule judges the agreement — on the scalar path (chapter 6's
//! reference kernels) and on the fast one (chapter 8's packed kernels over chapter 10's map),
//! at full width: d 4096 or 3584, 4:1 or 7:1 grouped-query attention, vocabularies of 128k
//! and 152k tokens. Then again with the KV cache in f16 (llama.cpp's default) and in q8_0,
//! against llama.cpp's runs with the same cache types.

use ch14::agreement::{check_tie_fraction, teacher_forced};
use ch14::cache::ROW_Q8_0;
use ch14::engine::{Engine, LoadMode};
use ch14::large::{self, Recipe};
use ch14::mapped::MapOptions;
use ch14::{
    CacheTypes, ContiguousCache, FastLoader, GgufFile, Model, PagedCache, PoolKind, QuantLoader,
    RowType, new_pool,
};
use std::path::PathBuf;
use testkit::refdata::{self, TensorFile};

/// The recipe of reference model `id`, built into the model cache, checked against the
/// pipeline's sha256.
fn built(id: &str, m: &serde_json::Value) -> PathBuf {
    let s = |k: &str| m[k].as_str().unwrap_or_else(|| panic!("{id}: no {k}"));
    let layers = m["layers"].as_u64().expect("layers") as usize;
    let mut recipe = Recipe::named(s("shape"), s("ftype"))
        .and_then(|r| r.with_layers(layers))
        .unwrap_or_else(|e| panic!("{id}: {e}"));
    recipe.seed = m["seed"].as_u64().expect("seed");
    let path = large::ensure_made(&recipe, &mut |_, _| {}).unwrap_or_else(|e| panic!("{e}"));
    let sha = shared::sha256_file(&path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        sha,
        s("sha256"),
        "{}: this recipe now writes other bytes than the file llama.cpp ran (the generator, a \
         quantizer or the writer changed): fix it, or bump RECIPE_VERSION and re-run \
         scripts/export-reference",
        path.display()
    );
    path
}

fn ids(t: &TensorFile, name: &str) -> Vec<u32> {
    let (_, v) = t.i64(name).unwrap_or_else(|e| panic!("{e}"));
    v.into_iter().map(|i| i as u32).collect()
}

#[test]
fn generated_large_models_agree_with_llama_cpp_on_both_paths() {
    let json = refdata::json("large/models.json").unwrap_or_else(|e| panic!("{e}"));
    let models = json["models"].as_object().expect("models");
    assert!(
        models.len() >= 3,
        "reference-data/large/models.json lists too few models"
    );
    let archs = ch14::architectures();
    let (mut steps, mut near_ties) = (0, 0);
    for (id, m) in models {
        let path = built(id, m);
        let want =
            TensorFile::open(&format!("large/{id}.safetensors")).unwrap_or_else(|e| panic!("{e}"));
        let prompt = ids(&want, "tokens");
        let cont = ids(&want, "generated");
        let next = want.f32("next_logits").unwrap_or_else(|e| panic!("{e}"));
        let all: Vec<u32> = prompt.iter().chain(&cont).copied().collect();

        // The scalar path: chapter 6's kernels on the file's rows.
        let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{e}"));
        let scalar = Model::load(&file, &QuantLoader, &archs).unwrap_or_else(|e| panic!("{e}"));
        drop(file);
        // The fast path, as the engine loads it: mapped, repacked where the CPU can.
        let fast = FastLoader::new(new_pool(PoolKind::Spin, 2));
        let engine = Engine::load(&path, LoadMode::Map(MapOptions::default()), fast, &archs)
            .unwrap_or_else(|e| panic!("{e}"));
        for (path_name, model) in [("scalar", &scalar), ("fast", &engine.model)] {
            let vocab = model.config.vocab_size;
            assert_eq!(vocab, next.data.len(), "{id}: vocabulary size");
            let ours = model
                .logits_from(&all, prompt.len() - 1)
                .unwrap_or_else(|e| panic!("{e}"));
            let a = teacher_forced(&next.data, &ours, &cont)
                .unwrap_or_else(|e| panic!("{id}, {path_name} path, vs llama.cpp: {e}"));
            eprintln!("{id} ({path_name}): {a}, {} close", a.close);
            steps += a.steps;
            near_ties += a.near_ties;
        }
    }
    check_tie_fraction(near_ties, steps).unwrap_or_else(|e| panic!("{e}"));
}

/// The cache types llama.cpp's runs in `reference-data/large/` used besides f32, by the names
/// the safetensors prefix their tensors with.
const CACHES: [(&str, RowType); 2] = [("f16", RowType::F16), ("q8_0", ROW_Q8_0)];

/// With a smaller cache both engines round keys and values, each its own way (llama.cpp also
/// rounds the queries to the cache's type), so more close steps flip than in f32: chapter 6's
/// bound on near-ties among all steps gives way to [`large::MAX_TIE_FRACTION_OF_CLOSE`].
#[test]
fn generated_large_models_agree_with_llama_cpp_with_f16_and_q8_0_caches() {
    let json = refdata::json("large/models.json").unwrap_or_else(|e| panic!("{e}"));
    let models = json["models"].as_object().expect("models");
    let archs = ch14::architectures();
    let (mut close, mut near_ties) = (0, 0);
    for (i, (id, m)) in models.iter().enumerate() {
        let path = built(id, m);
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
            let all: Vec<u32> = prompt.iter().chain(&cont).copied().collect();
            let paths = [("fast", Some(&engine.model)), ("scalar", scalar.as_ref())];
            for (path_name, model) in paths.into_iter().filter_map(|(n, m)| Some((n, m?))) {
                // Both of chapter 5's stores: f16 in a contiguous one, q8_0 in the paged one
                // the engine and the server use (blocks of 16 positions).
                let ours = if name == "f16" {
                    let mut kv = ContiguousCache::for_model_typed(model, all.len(), types)
                        .unwrap_or_else(|e| panic!("{e}"));
                    model.logits_from_in(&all, prompt.len() - 1, &mut kv)
                } else {
                    let (n_layer, kv_dim) = (model.config.n_layer, model.attention.kv_dim());
                    let blocks = all.len().div_ceil(16);
                    let mut kv = PagedCache::try_typed(n_layer, kv_dim, 16, blocks, types)
                        .unwrap_or_else(|e| panic!("{e}"));
                    model.logits_from_in(&all, prompt.len() - 1, &mut kv)
                }
                .unwrap_or_else(|e| panic!("{e}"));
                let a = teacher_forced(&next.data, &ours, &cont).unwrap_or_else(|e| {
                    panic!("{id}, {name} cache, {path_name} path, vs llama.cpp: {e}")
                });
                eprintln!("{id} ({name} cache, {path_name}): {a}, {} close", a.close);
                close += a.close;
                near_ties += a.near_ties;
            }
        }
    }
    large::check_close_ties(near_ties, close).unwrap_or_else(|e| panic!("{e}"));
}
