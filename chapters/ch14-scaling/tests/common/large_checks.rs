//! The checks of a generated model, cut to a few layers at full width, against what the reference
//! pipeline kept of llama.cpp's run on the same file (`reference-data/large/`). Chapter 14's
//! tests use them on its shapes; chapter 18's (which includes this file) on its mixtures.

#![allow(dead_code)]

use ch01::GgufFile;
use ch04::{Architectures, Model};
use ch06::QuantLoader;
use ch06::agreement::{Margins, teacher_forced_with};
use ch08::{FastLoader, PoolKind, new_pool};
use ch10::engine::{Engine, LoadMode};
use ch10::mapped::MapOptions;
use ch14::large::{self, Recipe, Shape, StepLogits, check_near_ties};
use std::path::PathBuf;
use testkit::refdata::TensorFile;

/// The recipe of reference model `id`, one of `shapes`, built into the model cache, checked
/// against the pipeline's sha256.
pub fn built(shapes: &[Shape], id: &str, m: &serde_json::Value) -> PathBuf {
    let s = |k: &str| m[k].as_str().unwrap_or_else(|| panic!("{id}: no {k}"));
    let layers = m["layers"].as_u64().expect("layers") as usize;
    let mut recipe = Recipe::named_in(shapes, s("shape"), s("ftype"))
        .and_then(|r| r.with_layers(layers))
        .unwrap_or_else(|e| panic!("{id}: {e}"));
    recipe.seed = m["seed"].as_u64().expect("seed");
    let path = large::ensure_made(&recipe, &mut |_, _| {}).unwrap_or_else(|e| panic!("{e}"));
    let sha = sha256_stamped(&path);
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

/// The sha256 of `path`, read from the stamp beside it (`FILE.sha256`: size, modification
/// time, digest) when the file's size and time are still the stamp's, else computed and
/// stamped. Hashing a cut 8B file takes about 4 s, and each of these files is checked by
/// several tests in one `cargo test` (both paths, the KV-cache types, chapter 18's): once per
/// file written is enough, and a file written again gets a new time.
fn sha256_stamped(path: &std::path::Path) -> String {
    let meta = std::fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let nanos = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    let key = format!("{} {nanos}", meta.len());
    let stamp = path.with_extension("gguf.sha256");
    if let Ok(text) = std::fs::read_to_string(&stamp)
        && let Some((k, sha)) = text.trim().rsplit_once(' ')
        && k == key
    {
        return sha.to_string();
    }
    let sha = shared::sha256_file(path).unwrap_or_else(|e| panic!("{e}"));
    // Written whole or not at all (a test beside this one may read it), and a stamp that
    // cannot be written only costs the next test the hash.
    let tmp = stamp.with_extension(format!("sha256.{}", std::process::id()));
    if std::fs::write(&tmp, format!("{key} {sha}\n")).is_ok() {
        let _ = std::fs::rename(&tmp, &stamp);
    }
    sha
}

pub fn ids(t: &TensorFile, name: &str) -> Vec<u32> {
    let (_, v) = t.i64(name).unwrap_or_else(|e| panic!("{e}"));
    v.into_iter().map(|i| i as u32).collect()
}

/// What the pipeline kept of llama.cpp's logits after each continuation token of the run whose
/// tensors are prefixed `prefix` (`""`, `"f16."`, `"q8_0."`).
pub fn kept_steps(t: &TensorFile, prefix: &str, stride: usize) -> Vec<StepLogits> {
    let f = |name: &str| {
        t.f32(&format!("{prefix}steps.{name}"))
            .unwrap_or_else(|e| panic!("{e} (re-run scripts/export-reference --only large)"))
    };
    let (shape, ids) = t
        .i64(&format!("{prefix}steps.top_ids"))
        .unwrap_or_else(|e| panic!("{e} (re-run scripts/export-reference --only large)"));
    let (logits, rest, sampled) = (f("top_logits"), f("rest_mass"), f("sampled_logits"));
    let (steps, k) = (shape[0], shape[1]);
    let per = sampled.data.len() / steps;
    (0..steps)
        .map(|s| StepLogits {
            top_ids: ids[s * k..][..k].iter().map(|&i| i as u32).collect(),
            top_logits: logits.data[s * k..][..k].to_vec(),
            rest_mass: rest.data[s] as f64,
            sampled: sampled.data[s * per..][..per].to_vec(),
            stride,
        })
        .collect()
}

/// What one run gave, summed over the runs of a test.
#[derive(Default)]
pub struct Totals {
    pub steps: usize,
    pub near_ties: usize,
    /// The near-ties the measured noise predicts: the steps' [`large::flip_chance`]s summed.
    pub expected: f64,
}

/// Judges our logits `ours` (after the prompt and after each continuation token, one row of
/// `vocab` per step) against llama.cpp's: chapter 6's `teacher_forced` (KL and mean |Δlogit|
/// after the prompt, every greedy step within the tie margin), the same two bounds at every
/// later step against what the pipeline kept, and each step's chance of a flip at the noise
/// measured there.
///
/// `margins(step)` gives the bounds of each step: chapter 6's, or for a q8_0 cache
/// [`large::q8_0_margins`].
pub fn judge(
    what: &str,
    next: &[f32],
    steps: &[StepLogits],
    ours: &[f32],
    cont: &[u32],
    margins: &dyn Fn(usize) -> Margins,
    totals: &mut Totals,
) {
    let vocab = next.len();
    let a = teacher_forced_with(&margins(0), next, ours, cont)
        .unwrap_or_else(|e| panic!("{what} vs llama.cpp: {e}"));
    assert_eq!(steps.len() + 1, cont.len(), "{what}: kept steps");
    let (mut kl, mut mean, mut expected) = (a.kl, a.mean_abs_logit, 0.0);
    // The largest fraction of its bound a step's KL or mean |Δlogit| reached.
    let m0 = margins(0);
    let mut used = (a.kl / m0.max_kl).max(a.mean_abs_logit / m0.max_mean_abs_logit);
    // The row after the prompt is kept whole (chapter 6's check above reads it); sampled as the
    // later ones are, for the noise at that step.
    let after_prompt = StepLogits {
        top_ids: Vec::new(),
        top_logits: Vec::new(),
        rest_mass: 1.0,
        sampled: next.iter().step_by(steps[0].stride).copied().collect(),
        stride: steps[0].stride,
    };
    for (step, want) in std::iter::once(&after_prompt).chain(steps).enumerate() {
        let row = &ours[step * vocab..][..vocab];
        if step > 0 {
            assert!(
                want.rest_mass <= large::MAX_REST_MASS,
                "{what}, after continuation token {step}: the kept tokens leave {} of the \
                 probability to the others (at most {} for the KL over them to count)",
                want.rest_mass,
                large::MAX_REST_MASS
            );
            let (k, m) = (want.kl(row), want.mean_abs_diff(row));
            let Margins {
                max_kl,
                max_mean_abs_logit,
                ..
            } = margins(step);
            // NaN fails too.
            assert!(
                k < max_kl && m < max_mean_abs_logit,
                "{what}, after continuation token {step}: KL {k:.3e} (bound {max_kl}), mean \
                 |dlogit| {m:.3} (bound {max_mean_abs_logit})"
            );
            (kl, mean) = (kl.max(k), mean.max(m));
            used = used.max(k / max_kl).max(m / max_mean_abs_logit);
        }
        expected += large::flip_chance(row, want.noise(row));
    }
    eprintln!(
        "{what}: {} steps, {} near-ties ({expected:.2} expected), {} close; largest KL \
         {kl:.2e}, mean |dlogit| {mean:.3}; at most {:.0} % of a bound",
        a.steps,
        a.near_ties,
        a.close,
        100.0 * used
    );
    totals.steps += a.steps;
    totals.near_ties += a.near_ties;
    totals.expected += expected;
}

/// Every how many tokens the pipeline sampled llama.cpp's logits after each continuation token.
pub fn sample_stride(json: &serde_json::Value) -> usize {
    json["steps"]["sample_stride"].as_u64().expect(
        "reference-data/large/models.json has no steps.sample_stride: re-run \
         scripts/export-reference --only large",
    ) as usize
}

/// Which models run on the scalar path too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scalar {
    Every,
    /// The first model of each file type: the scalar path's kernels are chapter 6's reference
    /// ones, the same for every model of a type (chapter 8's tests hold the fast kernels to
    /// them), and the architectures' own parts (biases, norms) run the same code on both
    /// paths. Full-width scalar runs were most of this check's time.
    OncePerType,
}

/// Every model of `models` (reference ids and their entries in `large/models.json`), made from
/// its recipe among `shapes`, against llama.cpp on chapter 6's scalar path and on the engine's
/// fast one (mapped, repacked), loaded through `archs`; then the near-ties over all of them
/// against what the measured noise predicts.
pub fn check_both_paths<'a>(
    shapes: &[Shape],
    models: impl Iterator<Item = (&'a String, &'a serde_json::Value)>,
    stride: usize,
    archs: &Architectures,
    scalar: Scalar,
) {
    let mut totals = Totals::default();
    let mut scalar_types = std::collections::HashSet::new();
    for (id, m) in models {
        let path = built(shapes, id, m);
        let first_of_type = scalar_types.insert(m["ftype"].as_str().unwrap_or("").to_string());
        let scalar_too = match scalar {
            Scalar::Every => true,
            Scalar::OncePerType => first_of_type,
        };
        let want =
            TensorFile::open(&format!("large/{id}.safetensors")).unwrap_or_else(|e| panic!("{e}"));
        let prompt = ids(&want, "tokens");
        let cont = ids(&want, "generated");
        let next = want.f32("next_logits").unwrap_or_else(|e| panic!("{e}"));
        let steps = kept_steps(&want, "", stride);
        let all: Vec<u32> = prompt.iter().chain(&cont).copied().collect();

        // The scalar path: chapter 6's kernels on the file's rows.
        let scalar = scalar_too.then(|| {
            let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{e}"));
            Model::load(&file, &QuantLoader, archs).unwrap_or_else(|e| panic!("{e}"))
        });
        // The fast path, as the engine loads it: mapped, repacked where the CPU can.
        let fast = FastLoader::new(new_pool(PoolKind::Spin, 2));
        let engine = Engine::load(&path, LoadMode::Map(MapOptions::default()), fast, archs)
            .unwrap_or_else(|e| panic!("{e}"));
        let paths = [("scalar", scalar.as_ref()), ("fast", Some(&engine.model))];
        for (path_name, model) in paths.into_iter().filter_map(|(n, m)| Some((n, m?))) {
            let vocab = model.config.vocab_size;
            assert_eq!(vocab, next.data.len(), "{id}: vocabulary size");
            let ours = model
                .logits_from(&all, prompt.len() - 1)
                .unwrap_or_else(|e| panic!("{e}"));
            let what = format!("{id} ({path_name})");
            let margins = |_| Margins::QUANTIZED;
            judge(
                &what,
                &next.data,
                &steps,
                &ours,
                &cont,
                &margins,
                &mut totals,
            );
        }
    }
    check_near_ties(totals.near_ties, totals.expected)
        .unwrap_or_else(|e| panic!("{e}, in {} steps", totals.steps));
}
