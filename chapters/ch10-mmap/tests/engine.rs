//! The finished engine, as the binary loads it, against llama.cpp: chapter 6's check
//! (`ch06::agreement`: KL divergence, mean |Δlogit|, teacher-forced greedy steps with near-ties
//! allowed) on the default file, mapped and repacked (the default), read (`--no-mmap`), and
//! mapped without repacking (`--no-repack`), on the paged KV cache the scheduler runs; and the
//! engine's compute on the F32 copy of the model against llama.cpp's greedy continuations.

use ch04::sampling::argmax;
use ch04::{Batch, Scratch};
use ch05::PagedCache;
use ch06::agreement::{check_tie_fraction, teacher_forced};
use ch07::BatchModel;
use ch08::FastLoader;
use ch08::pool::SpinPool;
use ch10::{Engine, LoadMode, MapOptions};
use std::sync::Arc;
use testkit::refdata::{self, TensorFile};

fn ids(x: &serde_json::Value) -> Vec<u32> {
    x.as_array()
        .expect("an array of ids")
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

/// Logits at every position of `all` with `fast`'s matrices loaded `mode`, on the engine's
/// paged cache: teacher forcing in one pass.
fn all_logits(mode: LoadMode, fast: FastLoader, all: &[u32]) -> Vec<f32> {
    let path = shared::default_model_path().unwrap_or_else(|e| panic!("{e}"));
    let e = Engine::load(&path, mode, fast, &ch04::architectures()).unwrap();
    let c = &e.model.config;
    let block = ch10::engine::BLOCK_SIZE;
    let mut kv = PagedCache::new(
        c.n_layer,
        e.model.attention.kv_dim(),
        block,
        all.len().div_ceil(block),
    );
    let mut scratch = Scratch::default();
    e.model
        .forward_batch(&Batch::sequence(0, all, 0, true), &mut kv, &mut scratch)
        .unwrap()
        .to_vec()
}

#[test]
fn the_engine_agrees_with_llama_cpp_mapped_read_and_not_repacked() {
    let json = refdata::json("quant/variants.json").unwrap_or_else(|e| panic!("{e}"));
    let v = &json["variants"]["Q4_1"];
    assert!(v.is_object(), "quant/variants.json has no variant Q4_1");
    let want = TensorFile::open("quant/logits.safetensors")
        .and_then(|t| t.f32("Q4_1"))
        .unwrap_or_else(|e| panic!("{e}"));
    let (prompt, cont) = (ids(&v["prompt_ids"]), ids(&v["continuation"]["ids"]));
    let all: Vec<u32> = prompt.iter().chain(&cont).copied().collect();
    let from = (prompt.len() - 1) * want.data.len();
    let (mut steps, mut near_ties) = (0, 0);
    for (name, mode, repack) in [
        (
            "mapped, repacked",
            LoadMode::Map(MapOptions::default()),
            true,
        ),
        ("read", LoadMode::Read, true),
        (
            "mapped, not repacked",
            LoadMode::Map(MapOptions::default()),
            false,
        ),
    ] {
        let mut fast = FastLoader::new(Arc::new(SpinPool::new(2)));
        fast.pack = repack;
        let ours = all_logits(mode, fast, &all);
        let a = teacher_forced(&want.data, &ours[from..], &cont)
            .unwrap_or_else(|m| panic!("{name}: {m}"));
        eprintln!("{name}: {a}");
        steps += a.steps;
        near_ties += a.near_ties;
    }
    check_tie_fraction(near_ties, steps).unwrap_or_else(|m| panic!("{m}"));
}

/// llama.cpp's prompts and greedy continuations on the F32 copy of the default model.
fn f32_references() -> Vec<(String, Vec<u32>, Vec<u32>)> {
    let m = refdata::manifest().unwrap_or_else(|e| panic!("{e}"));
    m["prompts"]
        .as_array()
        .expect("the manifest lists prompts")
        .iter()
        .map(|p| {
            let id = p["id"].as_str().unwrap().to_string();
            let g = refdata::json(&format!("prompts/{id}.generation.json"))
                .unwrap_or_else(|e| panic!("{e}"));
            (id, ids(&p["ids"]), ids(&g["ids"]))
        })
        .collect()
}

#[test]
fn the_engine_continues_the_f32_copy_as_llama_cpp_does() {
    // llama.cpp ran an F32 copy made by dequantizing the default file; chapter 3's dense loader
    // gives the same f32 weights. Everything else is the engine's: chapter 8's `SimdCompute` on
    // the paged cache. Nothing is quantized, so its greedy tokens must be llama.cpp's, every
    // one, as chapter 4's are: its f32 sums run in another order, which moves a logit by
    // chapter 8's bound of 2e-4 — far less than any lead of the top token in these
    // continuations (the smallest is printed).
    let path = shared::default_model_path().unwrap_or_else(|e| panic!("{e}"));
    let file = ch01::GgufFile::open(&path).unwrap();
    let fast = FastLoader::new(Arc::new(SpinPool::new(2)));
    let model = ch04::Model::load(&file, &ch03::DenseLoader, &ch04::architectures())
        .unwrap()
        .with_compute(fast.compute());
    let (mut steps, mut smallest_lead) = (0, f32::INFINITY);
    for (id, prompt, cont) in f32_references() {
        let all: Vec<u32> = prompt.iter().chain(&cont).copied().collect();
        let block = ch10::engine::BLOCK_SIZE;
        let mut kv = PagedCache::new(
            model.config.n_layer,
            model.attention.kv_dim(),
            block,
            all.len().div_ceil(block),
        );
        let mut scratch = Scratch::default();
        let logits = model
            .forward_batch(&Batch::sequence(0, &all, 0, true), &mut kv, &mut scratch)
            .unwrap();
        let vocab = model.config.vocab_size;
        for (i, &want) in cont.iter().enumerate() {
            let row = &logits[(prompt.len() - 1 + i) * vocab..][..vocab];
            let pick = argmax(row);
            assert_eq!(
                pick, want as usize,
                "{id}: generated token {i}: we pick {pick}, llama.cpp {want}"
            );
            let runner_up = (0..vocab)
                .filter(|&t| t != pick)
                .map(|t| row[t])
                .fold(f32::NEG_INFINITY, f32::max);
            smallest_lead = smallest_lead.min(row[pick] - runner_up);
            steps += 1;
        }
    }
    eprintln!("{steps} greedy steps, all llama.cpp's; the smallest lead {smallest_lead:.4}");
}
