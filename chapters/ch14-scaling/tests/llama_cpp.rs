//! The generated 7–9B shapes, cut to two layers at full width, against llama.cpp.
//!
//! The reference pipeline had chapter 14's `make-model` write each file and ran llama.cpp on
//! it (`reference-data/large/`). Here the same recipe writes the file again into the model
//! cache: its sha256 must be the pipeline's (the generator, the quantizers and the writer are
//! deterministic), then our engine runs the prompt and llama.cpp's greedy continuation
//! teacher-forced, and chapter 6's rule judges the agreement — on the scalar path (chapter 6's
//! reference kernels) and on the fast one (chapter 8's packed kernels over chapter 10's map),
//! at full width: d 4096 or 3584, 4:1 or 7:1 grouped-query attention, vocabularies of 128k
//! and 152k tokens.

use ch14::agreement::{check_tie_fraction, teacher_forced};
use ch14::engine::{Engine, LoadMode};
use ch14::large::{self, Recipe};
use ch14::mapped::MapOptions;
use ch14::{FastLoader, GgufFile, Model, PoolKind, QuantLoader, new_pool};
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
                .logits_at_every_position(&all)
                .unwrap_or_else(|e| panic!("{e}"));
            let a = teacher_forced(&next.data, &ours[(prompt.len() - 1) * vocab..], &cont)
                .unwrap_or_else(|e| panic!("{id}, {path_name} path, vs llama.cpp: {e}"));
            eprintln!("{id} ({path_name}): {a}");
            steps += a.steps;
            near_ties += a.near_ties;
        }
    }
    check_tie_fraction(near_ties, steps).unwrap_or_else(|e| panic!("{e}"));
}
