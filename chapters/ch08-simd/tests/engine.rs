//! The whole model through the fast path: against llama.cpp, and against chapter 6's scalar
//! engine.
//!
//! Against llama.cpp the checks are chapter 6's (`chapters/ch06-quantization/tests/model.rs`
//! explains them): activations are quantized to 8 bits before every product, a last-bit
//! difference flips a code now and then and the flip cascades, so what is compared is the
//! next-token distribution (KL divergence, mean |Δlogit|) and the greedy token at every step
//! of llama.cpp's continuation, except where two candidates are closer than that noise.
//!
//! Against chapter 6 the fast path is exact where it can be: the packed micro-kernel repeats
//! the scalar kernel's operations lane by lane and the SIMD quantizers give the scalar bytes,
//! so a model whose matrices are all packed (the default Q4_1 file) gives chapter 6's logits
//! bit for bit — whatever the threads, and whether the tokens come in one batch or one by one.

use ch08::ch01::{GgmlType, Gguf, GgufFile, TensorInfo};
use ch08::ch03::matrix::{LoadError, Matrix, MatrixLoader, matrix_dims};
use ch08::kernels::{Isa, KernelSet};
use ch08::matrix::FastMatrix;
use ch08::pool::{Parallel, RayonPool, SpinPool};
use ch08::sampling::argmax;
use ch08::{
    Batch, ContiguousCache, FastLoader, Model, NoObserver, Overflow, QMatrix, QuantLoader,
    requantize,
};
use shared::refdata::{self, TensorFile};
use shared::{Tolerance, assert_close};
use std::collections::HashMap;
use std::sync::Arc;

/// KL(P_llama.cpp || P_ours) after the prompt: chapter 6 observed up to 2.2e-2 (Q4_0) with its
/// scalar engine; a wrong scale, layout or activation format gives KL of order 1 or more.
const MAX_KL: f64 = 0.05;
/// Mean |logit difference| over the vocabulary: chapter 6 observed 0.14–0.34.
const MAX_MEAN_ABS_LOGIT: f32 = 0.5;
/// Greedy steps where our top token and llama.cpp's are closer than this in our logits may
/// disagree: the noise of one flipped activation code moves the gap by up to 0.4 (chapter 6).
const TIE_MARGIN: f32 = 0.4;
/// At most this fraction of greedy steps may disagree within the margin.
const MAX_TIE_FRACTION: f64 = 0.05;

/// `SimdCompute` vs the scalar reference on f32 weights, logits: the attention, norms and
/// SwiGLU outputs differ by ~1e-6 relative (see `tests/compute.rs`), and 30 layers carry that
/// to logits of size ~10–20 (observed 2.9e-5); without quantized activations no code flips.
/// A wrong mask, scale, head mapping or split merge gives errors of order 1.
const SIMD_COMPUTE_VS_SCALAR: Tolerance = Tolerance {
    abs: 2e-4,
    rel: 1e-5,
};

/// Fast path vs chapter 6 when every matrix is packed: the same operations in the same order.
const PACKED_VS_SCALAR: Tolerance = Tolerance::EXACT;
/// The same model, prefill vs decode, or any number of threads: every (row, token) product is
/// computed by the same code whatever the tile or task it falls in.
const BATCH_INVARIANT: Tolerance = Tolerance::EXACT;

fn model_file() -> GgufFile {
    GgufFile::open(shared::default_model_path().unwrap_or_else(|e| panic!("{e}")))
        .unwrap_or_else(|e| panic!("{e}"))
}

fn loader(kernels: KernelSet, pool: Arc<dyn Parallel>) -> FastLoader {
    FastLoader {
        kernels,
        pool,
        pack: true,
    }
}

/// Requantizes each tensor to the type llama.cpp's variant gave it, then makes a fast matrix.
struct FastRequant {
    fast: FastLoader,
    types: HashMap<String, GgmlType>,
}

impl MatrixLoader for FastRequant {
    fn load(
        &self,
        _: &Gguf,
        info: &TensorInfo,
        bytes: &[u8],
    ) -> Result<Box<dyn Matrix>, LoadError> {
        let ty = self.types[&info.name];
        let (cols, rows) = matrix_dims(info)?;
        let q = QMatrix::new(&info.name, ty, rows, cols, requantize(info, bytes, ty)?)?;
        let m = FastMatrix::new(
            &info.name,
            q,
            &self.fast.kernels,
            self.fast.pool.clone(),
            true,
        )?;
        Ok(Box::new(m))
    }
}

fn variant_types(v: &serde_json::Value) -> HashMap<String, GgmlType> {
    v["tensors"]
        .as_array()
        .expect("quant/variants.json: a variant without `tensors`")
        .iter()
        .map(|t| {
            let ty = t["type"].as_str().unwrap();
            let ty = GgmlType::ALL
                .into_iter()
                .find(|g| g.name() == ty)
                .unwrap_or_else(|| panic!("quant/variants.json: unknown type {ty}"));
            (t["name"].as_str().unwrap().to_string(), ty)
        })
        .collect()
}

fn ids(x: &serde_json::Value) -> Vec<u32> {
    x.as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_u64().unwrap() as u32)
        .collect()
}

fn softmax(l: &[f32]) -> Vec<f64> {
    let m = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f64> = l.iter().map(|&x| ((x - m) as f64).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|x| x / s).collect()
}

/// KL(P || Q) of the distributions two rows of logits give, `want` being P.
fn kl_divergence(want: &[f32], got: &[f32]) -> f64 {
    let (p, q) = (softmax(want), softmax(got));
    p.iter()
        .zip(&q)
        .filter(|(a, _)| **a > 0.0)
        .map(|(a, b)| a * (a / b).ln())
        .sum()
}

/// Logits of every position of `tokens`, in one batch.
fn all_logits(model: &Model, tokens: &[u32]) -> Vec<f32> {
    model
        .forward(
            &Batch::sequence(0, tokens, 0, true),
            &mut model.new_kv(),
            &mut NoObserver,
        )
        .unwrap()
}

#[test]
fn the_fast_path_matches_llama_cpp() {
    let file = model_file();
    let json = refdata::json("quant/variants.json").unwrap_or_else(|e| panic!("{e}"));
    let want_logits =
        TensorFile::open("quant/logits.safetensors").unwrap_or_else(|e| panic!("{e}"));
    let fast = loader(KernelSet::detect(), Arc::new(SpinPool::new(2)));
    let (mut steps, mut ties) = (0, 0);
    // The original file, and one variant rebuilt in memory that mixes packed types (Q5_0, Q8_0)
    // with k-quants on the row-at-a-time path (Q4_K, Q6_K).
    for name in ["Q4_1", "Q4_K_M"] {
        let v = &json["variants"][name];
        assert!(v.is_object(), "quant/variants.json has no variant {name}");
        // The whole fast path: chapter 8's matrices and its `SimdCompute` for the rest.
        let model = if v["quantized_here"] == serde_json::Value::Bool(true) {
            let requant = FastRequant {
                fast: fast.clone(),
                types: variant_types(v),
            };
            Model::load(&file, &requant).unwrap()
        } else {
            Model::load(&file, &fast).unwrap()
        }
        .with_compute(fast.compute());
        let vocab = model.config.vocab_size;
        let prompt = ids(&v["prompt_ids"]);
        let cont = ids(&v["continuation"]["ids"]);
        // Teacher forcing: our logits at every greedy step, given llama.cpp's choices so far.
        let all: Vec<u32> = prompt.iter().chain(&cont).copied().collect();
        let ours = all_logits(&model, &all);
        let row = |step: usize| &ours[(prompt.len() - 1 + step) * vocab..][..vocab];

        let want = want_logits.f32(name).unwrap();
        let kl = kl_divergence(&want.data, row(0));
        let mean = row(0)
            .iter()
            .zip(&want.data)
            .map(|(a, b)| (a - b).abs())
            .sum::<f32>()
            / vocab as f32;
        assert!(
            kl < MAX_KL,
            "{name}: KL(llama.cpp || ours) = {kl:.3e} exceeds {MAX_KL}"
        );
        assert!(
            mean < MAX_MEAN_ABS_LOGIT,
            "{name}: mean |logit difference| {mean:.3} exceeds {MAX_MEAN_ABS_LOGIT}"
        );
        for (step, &t) in cont.iter().enumerate() {
            let r = row(step);
            let best = argmax(r);
            steps += 1;
            if best as u32 != t {
                let gap = r[best] - r[t as usize];
                assert!(
                    gap < TIE_MARGIN,
                    "{name}: greedy step {step}: we pick {best}, llama.cpp picked {t}, {gap:.3} logits apart"
                );
                ties += 1;
            }
        }
        eprintln!(
            "{name}: KL {kl:.2e}, mean |dlogit| {mean:.3}, {} greedy steps; {}",
            cont.len(),
            model.weights.layers[0].ffn.down.describe()
        );
    }
    assert!(
        (ties as f64) <= MAX_TIE_FRACTION * steps as f64,
        "{ties} of {steps} greedy steps disagree within the noise margin"
    );
}

/// A prompt of 40 tokens: long enough for several tiles of tokens and both quantization
/// paths of a product (one thread, and tokens spread over threads).
fn prompt(file: &GgufFile) -> Vec<u32> {
    let tok = ch08::Tokenizer::from_gguf(&file.gguf).unwrap();
    let ids = tok.encode(
        "The history of the printing press begins in the fifteenth century, when Johannes \
         Gutenberg developed a system of movable metal type in Mainz, and within fifty years",
        true,
        true,
    );
    assert!(ids.len() >= 30, "{}", ids.len());
    ids
}

#[test]
fn fast_logits_equal_chapter_6s_for_any_threads() {
    let file = model_file();
    let tokens = prompt(&file);
    let scalar = Model::load(&file, &QuantLoader).unwrap();
    let want = all_logits(&scalar, &tokens);
    let vocab = scalar.config.vocab_size;
    let pools: Vec<Arc<dyn Parallel>> = vec![
        Arc::new(SpinPool::new(1)),
        Arc::new(SpinPool::new(2)),
        Arc::new(RayonPool::new(2)),
    ];
    let kernels = KernelSet::detect();
    for pool in pools {
        let what = format!("{:?} kernels, {}", kernels.isa, pool.describe());
        let model = Model::load(&file, &loader(kernels, pool)).unwrap();
        let got = all_logits(&model, &tokens);
        let packed = model.weights.layers[0]
            .attn
            .wq
            .describe()
            .contains("packed");
        if packed {
            assert_close(
                &format!("logits, {what}"),
                &[tokens.len(), vocab],
                &got,
                &want,
                PACKED_VS_SCALAR,
            );
        } else {
            // The row-at-a-time path adds block results in the SIMD kernels' order; compare
            // the greedy choices, which survive that noise everywhere but at near-ties.
            for t in 0..tokens.len() {
                let (g, w) = (&got[t * vocab..][..vocab], &want[t * vocab..][..vocab]);
                let (bg, bw) = (argmax(g), argmax(w));
                assert!(
                    bg == bw || w[bw] - w[bg] < TIE_MARGIN,
                    "{what}: position {t}: fast path picks {bg}, chapter 6 {bw}"
                );
            }
        }
    }
}

#[test]
fn simd_compute_matches_the_scalar_reference_on_f32_weights() {
    // f32 weights (chapter 3's dense loader, dequantizing the file): no activation is
    // quantized, so the difference between the two computes is not hidden behind code flips.
    let file = model_file();
    let tokens = prompt(&file);
    let scalar = Model::load(&file, &ch08::DenseLoader).unwrap();
    let (n_layer, kv_dim, vocab) = (
        scalar.config.n_layer,
        scalar.attention.kv_dim(),
        scalar.config.vocab_size,
    );
    let want = all_logits(&scalar, &tokens);
    // Decode steps after the prompt too: with 2 threads one query row splits its keys, and
    // the split results are merged.
    let decode = |model: &Model| {
        let mut kv = ContiguousCache::new(n_layer, kv_dim, 64, Overflow::Error);
        let (head, tail) = tokens.split_at(tokens.len() - 4);
        model
            .forward(
                &Batch::sequence(0, head, 0, false),
                &mut kv,
                &mut NoObserver,
            )
            .unwrap();
        let mut out = Vec::new();
        for (i, &t) in tail.iter().enumerate() {
            let b = Batch::sequence(0, &[t], head.len() + i, true);
            out.extend(model.forward(&b, &mut kv, &mut NoObserver).unwrap());
        }
        out
    };
    let want_decode = decode(&scalar);
    let kernels = KernelSet::detect();
    let mut model = scalar;
    for pool in [
        Arc::new(SpinPool::new(1)) as Arc<dyn Parallel>,
        Arc::new(SpinPool::new(2)),
    ] {
        model = model.with_compute(Arc::new(ch08::SimdCompute::new(&kernels, pool.clone())));
        let what = format!("{:?} kernels, {}", kernels.isa, pool.describe());
        let got = all_logits(&model, &tokens);
        let r = assert_close(
            &format!("prefill logits, {what}"),
            &[tokens.len(), vocab],
            &got,
            &want,
            SIMD_COMPUTE_VS_SCALAR,
        );
        let d = assert_close(
            &format!("decode logits, {what}"),
            &[4, vocab],
            &decode(&model),
            &want_decode,
            SIMD_COMPUTE_VS_SCALAR,
        );
        eprintln!(
            "SimdCompute vs scalar, {what}: max |Δlogit| {:.2e} (prefill), {:.2e} (decode)",
            r.max_abs, d.max_abs
        );
    }
}

#[test]
fn simd_compute_agrees_with_the_reference_at_long_context() {
    // A 1000-token prompt (many tiles of keys, many row blocks; logits of its last position),
    // then decode steps at positions 1000-1007 on two threads (the keys split and merged). Same quantized matrices on both
    // sides, so what differs is only the compute; on quantized weights that is judged as
    // chapter 6 judges a quantized model (the next-token distribution and the greedy choice).
    let file = model_file();
    let fast = loader(KernelSet::detect(), Arc::new(SpinPool::new(2)));
    let reference = Model::load(&file, &fast).unwrap();
    let (n_layer, kv_dim, vocab) = (
        reference.config.n_layer,
        reference.attention.kv_dim(),
        reference.config.vocab_size,
    );
    let tok = ch08::Tokenizer::from_gguf(&file.gguf).unwrap();
    let text = "The history of the printing press begins in the fifteenth century, when \
                Johannes Gutenberg developed a system of movable metal type in Mainz. ";
    let mut tokens = tok.encode(&text.repeat(40), true, true);
    tokens.truncate(1008);
    assert_eq!(tokens.len(), 1008);
    let run = |model: &Model| {
        let mut kv = ContiguousCache::new(n_layer, kv_dim, 1024, Overflow::Error);
        let mut out = model
            .forward(
                &Batch::sequence(0, &tokens[..1000], 0, false),
                &mut kv,
                &mut NoObserver,
            )
            .unwrap();
        for p in 1000..1008 {
            let b = Batch::sequence(0, &tokens[p..p + 1], p, true);
            out.extend(model.forward(&b, &mut kv, &mut NoObserver).unwrap());
        }
        out
    };
    let want = run(&reference);
    let model = reference.with_compute(fast.compute());
    let got = run(&model);
    for (step, (g, w)) in got
        .chunks_exact(vocab)
        .zip(want.chunks_exact(vocab))
        .enumerate()
    {
        let kl = kl_divergence(w, g);
        assert!(kl < MAX_KL, "position {}: KL {kl:.3e}", 999 + step);
        let (bg, bw) = (argmax(g), argmax(w));
        assert!(
            bg == bw || w[bw] - w[bg] < TIE_MARGIN,
            "position {}: SimdCompute picks {bg}, the reference {bw}",
            999 + step
        );
    }
}

#[test]
fn prefill_and_decode_give_the_same_logits() {
    let file = model_file();
    let tokens = prompt(&file);
    // Every SIMD kernel set this CPU has (the packed path and the row-at-a-time path), or the
    // scalar one on a CPU without any.
    let mut sets: Vec<KernelSet> = Isa::ALL
        .into_iter()
        .filter(|&i| i != Isa::Scalar)
        .filter_map(KernelSet::for_isa)
        .collect();
    if sets.is_empty() {
        sets.push(KernelSet::SCALAR);
    }
    for kernels in sets {
        let model = Model::load(&file, &loader(kernels, Arc::new(SpinPool::new(2)))).unwrap();
        let (n_layer, kv_dim) = (model.config.n_layer, model.attention.kv_dim());
        let cache = || ContiguousCache::new(n_layer, kv_dim, 64, Overflow::Error);
        let prefill = model
            .forward(
                &Batch::sequence(0, &tokens, 0, true),
                &mut cache(),
                &mut NoObserver,
            )
            .unwrap();
        let mut kv = cache();
        let mut decode = Vec::new();
        for (pos, &t) in tokens.iter().enumerate() {
            let l = model
                .forward(
                    &Batch::sequence(0, &[t], pos, true),
                    &mut kv,
                    &mut NoObserver,
                )
                .unwrap();
            decode.extend(l);
        }
        assert_close(
            &format!("logits, prefill vs decode, {:?} kernels", kernels.isa),
            &[tokens.len(), model.config.vocab_size],
            &decode,
            &prefill,
            BATCH_INVARIANT,
        );
    }
}
