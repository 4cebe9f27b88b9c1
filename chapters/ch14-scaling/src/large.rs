//! Large models you can make: 7–9B-shaped GGUF files written from a recipe.
//!
//! No 7–9B model can be fetched from where this project fetches, so it writes them: the shape
//! of a real checkpoint (layers, widths, heads, the family's metadata), a real vocabulary
//! (every `tokenizer.*` key of one of llama.cpp's vocabulary files), and seeded random weights
//! at the scale trained ones have. The file is quantized to one of llama.cpp's file types by
//! chapter 6's recipe ([`Plan`]: Q4_K_M gets Q6_K for the output and half the `ffn_down`, as
//! `llama-quantize` gives it) and chapter 6's quantizers, and streamed through chapter 6's
//! writer one tensor at a time, so writing a 4.7 GB file needs one tensor's memory.
//!
//! The same recipe, seed and type give the same bytes on every machine: every value is a pure
//! function of (tensor seed, index) — chapter 13's counter-based generator — and quantization
//! is deterministic, whatever the number of threads. [`Recipe::layers`] cuts the model to a
//! few layers at full width: the tests run those, the benches the full files.
//!
//! # What random weights can and cannot show
//!
//! Memory and speed depend on shapes and types only, so a generated file is a faithful subject
//! for both: the bytes per token, the bandwidth, the KV cache, loading. Agreement with
//! llama.cpp is checked on the same file, so it too is meaningful: both engines compute the
//! same function. What such a model cannot show is anything about language: its text is
//! noise, its next-token distribution is flatter than a trained model's, and quantization error
//! measured on it says nothing about a real checkpoint's perplexity.

use ch01::{GgmlType, Gguf, TensorInfo, Value};
use ch06::agreement::{
    Margins, kl_divergence, kl_divergence_of_log_probs, log_softmax, mean_abs_diff,
};
use ch06::gguf_write::{GgufWriter, WriteError};
use ch06::quants::quantize_chunk;
use ch06::recipe::{GGML_QNT_VERSION, LlamaFtype, Plan};
use ch13::synthetic::generated;
use rayon::prelude::*;
use std::path::Path;

/// A tensor of every layer: its name in the layer (`ffn_up.weight`) and its `ne`.
pub type LayerTensor = (&'static str, Vec<u64>);

/// The widths `(q, k)` of a shape's query and key norms.
pub type NormWidths = fn(&Shape) -> (u64, u64);

// ANCHOR: shape
/// The shape of a real checkpoint, and what its family's GGUF metadata says.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// What the recipe is called on the command line and in file names.
    pub id: &'static str,
    /// `general.architecture`.
    pub arch: &'static str,
    /// llama.cpp's vocabulary test file whose tokenizer the model gets
    /// (`reference-data/tokenizer/ggml-vocab-<vocab>.gguf`); its token count is the model's.
    pub vocab: &'static str,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    /// Each head's width: `n_embd / n_head` for most, wider in Qwen3 (queries of 4096 on a
    /// 2048-wide stream in Qwen3-30B-A3B).
    pub head_dim: usize,
    pub n_ff: usize,
    pub n_ctx_train: u32,
    pub rope_base: f32,
    pub rms_eps: f32,
    /// Biases on the query, key and value projections (Qwen2).
    pub qkv_bias: bool,
    /// RMS norms of the queries and keys, and their widths `(q, k)`: [`per_head`] for Qwen3,
    /// `None` for a family without them.
    pub qk_norm: Option<NormWidths>,
    /// Each layer's feed-forward tensors, `(name in the layer, ne)`: [`dense_ffn`], llama's
    /// SwiGLU, for this chapter's shapes; another network brings its own.
    pub ffn: fn(&Shape) -> Vec<LayerTensor>,
    /// Metadata the family has beyond the keys every shape writes: [`no_keys`] for this
    /// chapter's shapes.
    pub keys: fn(&Shape) -> Vec<(String, Value)>,
}

/// Llama 3 8B: 32 layers, d 4096, 32 query and 8 key/value heads of 128, FFN 14336, the
/// 128,256-token llama-bpe vocabulary, RoPE base 500,000.
pub const LLAMA3_8B: Shape = Shape {
    id: "llama3-8b",
    arch: "llama",
    vocab: "llama-bpe",
    n_layer: 32,
    n_embd: 4096,
    n_head: 32,
    n_head_kv: 8,
    head_dim: 128,
    n_ff: 14336,
    n_ctx_train: 8192,
    rope_base: 500_000.0,
    rms_eps: 1e-5,
    qkv_bias: false,
    qk_norm: None,
    ffn: dense_ffn,
    keys: no_keys,
};

// ANCHOR_END: shape

/// Llama's feed-forward tensors: gate and up `(n_ff, n_embd)`, down `(n_embd, n_ff)`.
pub fn dense_ffn(s: &Shape) -> Vec<LayerTensor> {
    let (d, ff) = (s.n_embd as u64, s.n_ff as u64);
    vec![
        ("ffn_gate.weight", vec![d, ff]),
        ("ffn_up.weight", vec![d, ff]),
        ("ffn_down.weight", vec![ff, d]),
    ]
}

/// Qwen3's query and key norms: one head wide, applied to every head.
pub fn per_head(s: &Shape) -> (u64, u64) {
    (s.head_dim as u64, s.head_dim as u64)
}

/// No keys beyond every shape's.
pub fn no_keys(_: &Shape) -> Vec<(String, Value)> {
    Vec::new()
}

/// Qwen2 7B: 28 layers, d 3584, 28 query and 4 key/value heads of 128, FFN 18944, biases on
/// Q/K/V, the 151,936-token qwen2 vocabulary, RoPE base 1,000,000.
pub const QWEN2_7B: Shape = Shape {
    id: "qwen2-7b",
    arch: "qwen2",
    vocab: "qwen2",
    n_layer: 28,
    n_embd: 3584,
    n_head: 28,
    n_head_kv: 4,
    head_dim: 128,
    n_ff: 18944,
    n_ctx_train: 32768,
    rope_base: 1_000_000.0,
    rms_eps: 1e-6,
    qkv_bias: true,
    qk_norm: None,
    ffn: dense_ffn,
    keys: no_keys,
};

/// Qwen3 8B: 36 layers, d 4096, 32 query and 8 key/value heads of 128 with per-head norms of
/// queries and keys, FFN 12288, no biases, the qwen2 vocabulary, RoPE base 1,000,000.
pub const QWEN3_8B: Shape = Shape {
    id: "qwen3-8b",
    arch: "qwen3",
    vocab: "qwen2",
    n_layer: 36,
    n_embd: 4096,
    n_head: 32,
    n_head_kv: 8,
    head_dim: 128,
    n_ff: 12288,
    n_ctx_train: 40960,
    rope_base: 1_000_000.0,
    rms_eps: 1e-6,
    qkv_bias: false,
    qk_norm: Some(per_head),
    ffn: dense_ffn,
    keys: no_keys,
};

/// Every shape this chapter can make.
pub const SHAPES: [Shape; 3] = [LLAMA3_8B, QWEN2_7B, QWEN3_8B];

/// The file types a recipe may be written in.
pub const FTYPES: [LlamaFtype; 4] = [
    LlamaFtype::Q4_0,
    LlamaFtype::Q4_K_M,
    LlamaFtype::Q8_0,
    LlamaFtype::F16,
];

/// The most probability a kept step may leave to the tokens it does not keep. The KL over the
/// kept ones is then short by at most about 2 % of itself (see [`StepLogits`]): a KL read as
/// under chapter 6's `MAX_KL` is truly under it, or within 2 % of it.
pub const MAX_REST_MASS: f64 = 0.02;

// ANCHOR: step_logits
/// What the reference keeps of llama.cpp's logits after one token of its continuation. A whole
/// row is 128k–152k values, and a row per step, model and cache type would be 74 MB; judging
/// the step by chapter 6's bounds needs less:
///
/// - KL(P_reference ‖ P_ours) needs the tokens that carry the probability: the `k` largest
///   logits and the probability of all the others together. [`StepLogits::kl`] is the KL of
///   the two distributions over those `k` tokens and "the rest" as one outcome; by the chain
///   rule that is the whole vocabulary's KL less `rest_mass` times the KL within the rest.
///   The recipe's output rows are independent of the token, so the logits of the rest differ
///   between the engines as the others do, and the KL within the rest is about the whole's:
///   the KL is short by about `rest_mass` of itself, at most [`MAX_REST_MASS`].
/// - mean |Δlogit| is a mean over the vocabulary: [`StepLogits::mean_abs_diff`] takes it over
///   every `stride`-th token, a uniform sample for the same reason. Over n ≈ 4000 tokens (a
///   stride of 32) its standard error is the spread of |Δ| — about its mean — over √n ≈ 63:
///   the mean within a few percent of the whole's.
#[derive(Debug, Clone, PartialEq)]
pub struct StepLogits {
    pub top_ids: Vec<u32>,    // (k): the reference's largest logits' tokens
    pub top_logits: Vec<f32>, // (k): those logits
    pub rest_mass: f64,       // the probability the reference gives every other token
    pub sampled: Vec<f32>,    // (ceil(vocab / stride)): logits of tokens 0, stride, 2·stride, …
    pub stride: usize,
}

impl StepLogits {
    /// KL(P_reference ‖ P_ours) over the top tokens and the rest as one outcome.
    pub fn kl(&self, ours: &[f32]) -> f64 {
        let log_q = log_softmax(ours);
        let mut rest = vec![true; ours.len()];
        let mut lq = Vec::with_capacity(self.top_ids.len() + 1);
        for &i in &self.top_ids {
            rest[i as usize] = false;
            lq.push(log_q[i as usize]);
        }
        let q_rest: f64 = log_q
            .iter()
            .zip(&rest)
            .filter(|(_, r)| **r)
            .map(|(l, _)| l.exp())
            .sum();
        lq.push(q_rest.ln());
        // The top tokens share 1 − rest_mass as their logits say.
        let top = (1.0 - self.rest_mass).ln();
        let mut lp: Vec<f64> = log_softmax(&self.top_logits)
            .iter()
            .map(|l| l + top)
            .collect();
        lp.push(self.rest_mass.ln());
        kl_divergence_of_log_probs(&lp, &lq)
    }

    /// Mean |Δlogit| over the sampled tokens.
    pub fn mean_abs_diff(&self, ours: &[f32]) -> f64 {
        mean_abs_diff(&self.sampled, &self.ours_sampled(ours))
    }
    // ANCHOR_END: step_logits

    /// Our logits at the sampled tokens.
    fn ours_sampled(&self, ours: &[f32]) -> Vec<f32> {
        ours.iter().step_by(self.stride).copied().collect()
    }

    /// The standard deviation of the logits' differences over the sampled tokens: how much
    /// the two engines' logits move apart, token by token, at this step (a shift of every
    /// logit by the same amount changes no probability and is not counted).
    pub fn noise(&self, ours: &[f32]) -> f64 {
        let d: Vec<f64> = self
            .sampled
            .iter()
            .zip(self.ours_sampled(ours))
            .map(|(&a, b)| a as f64 - b as f64)
            .collect();
        let mean = d.iter().sum::<f64>() / d.len() as f64;
        (d.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / d.len() as f64).sqrt()
    }
}

// ANCHOR: q8_0_points
/// How many q8_0 roundings of the keys and values apart our engine and llama.cpp are when both
/// keep a q8_0 cache. llama.cpp rotates each head's keys (and queries) by a 128-point and its
/// values by 64-point Walsh–Hadamard transforms before it quantizes them, and rotates the
/// output back; ours quantizes the rows as they are. The rotation is orthonormal, so both
/// compute the same attention up to rounding, but each rounds a different vector: the two
/// rounding errors are independent rather than shared, and the engines' logits differ by the
/// effect of one q8_0 rounding on each side on top of what they differ by with shared rounding
/// points. KL(P ‖ Q) ≈ ½ Var_P(Δlogit) for small differences, and independent differences add
/// their variances, so each rounding adds its own KL; mean |Δlogit| grows by at most each
/// rounding's own (the triangle inequality). One rounding's effect is measured on our engine:
/// the KL and mean |Δlogit| between its logits with an f32 cache and with the q8_0 one.
pub const Q8_0_ROUNDINGS_APART: f64 = 2.0;

/// Chapter 6's bounds for one step of a q8_0-cache run against llama.cpp's: each raised by
/// [`Q8_0_ROUNDINGS_APART`] times what one q8_0 rounding does to our logits at that step
/// (`f32_cache` and `q8_0_cache`: our logits of the step with each cache).
pub fn q8_0_margins(f32_cache: &[f32], q8_0_cache: &[f32]) -> Margins {
    let m = Margins::QUANTIZED;
    Margins {
        max_kl: m.max_kl + Q8_0_ROUNDINGS_APART * kl_divergence(f32_cache, q8_0_cache),
        max_mean_abs_logit: m.max_mean_abs_logit
            + Q8_0_ROUNDINGS_APART * mean_abs_diff(f32_cache, q8_0_cache),
        tie: m.tie,
    }
}
// ANCHOR_END: q8_0_points

// ANCHOR: near_ties
/// The chance that a step whose logits are ours flips to another token in the other engine's,
/// when the engines' logits differ by independent noise of standard deviation `sigma` per
/// token: a token `gap` below our best overtakes it when the difference of the two tokens'
/// noise, of standard deviation √2·σ, exceeds `gap`, with chance ½·erfc(gap / 2σ). Summed over
/// every other token (the chance that one of them does is at most that sum) and capped at 1.
pub fn flip_chance(ours: &[f32], sigma: f64) -> f64 {
    let best = ours.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let mut seen_best = false;
    let mut p = 0.0;
    for &v in ours {
        let gap = best - v as f64;
        if gap == 0.0 && !seen_best {
            seen_best = true; // our best itself
            continue;
        }
        // erfc(6) is 2e-17: further tokens add nothing a 128k-token sum could show.
        if gap < 12.0 * sigma {
            p += 0.5 * erfc(gap / (2.0 * sigma));
        }
    }
    p.min(1.0)
}

/// How far the near-ties may exceed the number the measured noise predicts, in standard
/// deviations of that number. The steps flip independently, each with its [`flip_chance`], so
/// their count has mean `expected` = Σ chances and a variance of at most `expected` (a sum of
/// Bernoulli variances p(1 − p)). Three of those standard deviations are exceeded by chance
/// about once in 300 runs (a Poisson count of mean 1 reaches 5 with chance 0.4 %, of mean 6
/// reaches 14 with chance 0.4 %); an error that tips close steps one way exceeds them.
pub const NEAR_TIE_SIGMAS: f64 = 3.0;

/// `near_ties` disagreements within the tie margin, where the steps' [`flip_chance`]s sum to
/// `expected`: at most [`NEAR_TIE_SIGMAS`] standard deviations more.
pub fn check_near_ties(near_ties: usize, expected: f64) -> Result<(), String> {
    let bound = expected + NEAR_TIE_SIGMAS * expected.sqrt();
    if near_ties as f64 <= bound {
        Ok(())
    } else {
        Err(format!(
            "{near_ties} greedy steps disagree within the noise margin, where the measured \
             noise gives {expected:.2} on average (at most {bound:.2} allowed)"
        ))
    }
}
// ANCHOR_END: near_ties

/// erfc(x) for x ≥ 0 (Abramowitz and Stegun 7.1.26; absolute error below 1.5e-7, and relative
/// to e^(−x²) for large x).
fn erfc(x: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.327_591_1 * x);
    let poly = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    poly * (-x * x).exp()
}

/// Bump when the generator or the weights' scales change: it is part of every file name, so
/// a file made by an older recipe is never mistaken for this one's.
pub const RECIPE_VERSION: u32 = 1;

/// A shape, cut to `layers` layers or whole, in a file type, from a seed.
#[derive(Debug, Clone, Copy)]
pub struct Recipe {
    pub shape: Shape,
    pub ftype: LlamaFtype,
    /// Fewer layers than the shape's (full width): the tests' models.
    pub layers: Option<usize>,
    pub seed: u64,
}

/// Why a recipe could not be made.
#[derive(Debug, thiserror::Error)]
pub enum MakeError {
    #[error("unknown model shape {0:?} (known: {1})")]
    Shape(String, String),
    #[error("file type {0} is not one this chapter writes (it writes {known})",
        known = FTYPES.map(|f| f.name()).join(", "))]
    Ftype(String),
    #[error("--layers {0}: a {1} model has 1 to {2} layers")]
    Layers(usize, &'static str, usize),
    #[error("the vocabulary file {0}: {1}")]
    Vocab(String, String),
    #[error(transparent)]
    Recipe(#[from] ch06::recipe::RecipeError),
    #[error(transparent)]
    Write(#[from] WriteError),
    #[error(transparent)]
    Cache(#[from] shared::model::FetchError),
}

impl Recipe {
    /// The recipe named `id` (a [`Shape::id`]) in file type `ftype` (llama.cpp's name).
    pub fn named(id: &str, ftype: &str) -> Result<Recipe, MakeError> {
        Recipe::named_in(&SHAPES, id, ftype)
    }

    /// The recipe named `id` among `shapes`, in file type `ftype`.
    pub fn named_in(shapes: &[Shape], id: &str, ftype: &str) -> Result<Recipe, MakeError> {
        let shape = *shapes.iter().find(|s| s.id == id).ok_or_else(|| {
            MakeError::Shape(
                id.into(),
                shapes.iter().map(|s| s.id).collect::<Vec<_>>().join(", "),
            )
        })?;
        let ftype = LlamaFtype::from_name(ftype)?;
        if !FTYPES.contains(&ftype) {
            return Err(MakeError::Ftype(ftype.name().into()));
        }
        Ok(Recipe {
            shape,
            ftype,
            layers: None,
            seed: 0,
        })
    }

    /// The same recipe cut to `n` layers.
    pub fn with_layers(mut self, n: usize) -> Result<Recipe, MakeError> {
        if n == 0 || n > self.shape.n_layer {
            return Err(MakeError::Layers(n, self.shape.id, self.shape.n_layer));
        }
        self.layers = (n < self.shape.n_layer).then_some(n);
        Ok(self)
    }

    pub fn n_layer(&self) -> usize {
        self.layers.unwrap_or(self.shape.n_layer)
    }

    /// The file's name in the model cache: shape, layers, type, seed and recipe version.
    pub fn file_name(&self) -> String {
        let layers = self.layers.map(|n| format!("-{n}L")).unwrap_or_default();
        let seed = if self.seed == 0 {
            String::new()
        } else {
            format!("-s{}", self.seed)
        };
        format!(
            "{}{layers}{seed}.v{RECIPE_VERSION}.{}.gguf",
            self.shape.id,
            self.ftype.name()
        )
    }
}

// ANCHOR: scales
/// How large a tensor's values are: what a trained checkpoint's per-row norms look like, to
/// the extent that activations behave (stay finite and of order one through every layer).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scale {
    /// A matrix: row r has standard deviation `gain_r / sqrt(cols)`, `gain_r` drawn
    /// uniformly from [0.5, 1.5] — so `x Wᵀ` keeps `x`'s size, and rows differ in norm as a
    /// trained matrix's do (which is what a quantizer's per-block scales see).
    Matrix { gain: f32 },
    /// A norm's weights: `1 ± spread`.
    Norm { spread: f32 },
    /// A bias: uniform in `±half_width`.
    Bias { half_width: f32 },
}

/// The scale of tensor `name`: matrices at gain 1, except the output projection at gain 4
/// (logits with a standard deviation of about 4, a peaked distribution as a trained model's
/// is, rather than a near-uniform one full of near-ties).
pub fn scale_of(name: &str) -> Scale {
    if name.ends_with("_norm.weight") {
        Scale::Norm { spread: 0.1 }
    } else if name.ends_with(".bias") {
        Scale::Bias { half_width: 0.5 }
    } else if name == "output.weight" {
        Scale::Matrix { gain: 4.0 }
    } else {
        Scale::Matrix { gain: 1.0 }
    }
}

/// The uniform half-width that gives standard deviation `std`: `std · √3`.
fn half_width(std: f32) -> f32 {
    std * 3f32.sqrt()
}

/// Rows `rows` of a tensor with `cols` values per row, seeded `seed`: `(rows.len(), cols)`
/// values written into `out`. Value `i` of row `r` is value `r · cols + i` of the tensor's
/// stream, so any range of rows comes out the same whichever call fills it.
fn fill_rows(seed: u64, scale: Scale, cols: usize, rows: std::ops::Range<usize>, out: &mut [f32]) {
    // ANCHOR: yours_fill_rows
    for (r, row) in rows.zip(out.chunks_exact_mut(cols)) {
        let base = (r * cols) as u64;
        let (a, offset) = match scale {
            Scale::Matrix { gain } => {
                // The row's gain from a second stream of the same generator.
                let g = generated(seed ^ 0x005E_ED0F_B0A5, r as u64, 0.5, 1.0);
                (half_width(gain * g / (cols as f32).sqrt()), 0.0)
            }
            Scale::Norm { spread } => (spread, 1.0),
            Scale::Bias { half_width } => (half_width, 0.0),
        };
        for (i, v) in row.iter_mut().enumerate() {
            *v = generated(seed, base + i as u64, a, offset);
        }
    }
    // ANCHOR_END: yours_fill_rows
}
// ANCHOR_END: scales

/// The tensors of the model, `(name, ne)`, in the order the file lists them.
pub fn tensors(shape: &Shape, n_layer: usize, n_vocab: usize) -> Vec<(String, Vec<u64>)> {
    let d = shape.n_embd as u64;
    let (head, q) = (
        shape.head_dim as u64,
        (shape.head_dim * shape.n_head) as u64,
    );
    let kv = head * shape.n_head_kv as u64;
    let mut t = vec![("token_embd.weight".to_string(), vec![d, n_vocab as u64])];
    for l in 0..n_layer {
        let mut add = |name: &str, ne: Vec<u64>| t.push((format!("blk.{l}.{name}"), ne));
        add("attn_norm.weight", vec![d]);
        add("attn_q.weight", vec![d, q]);
        add("attn_k.weight", vec![d, kv]);
        add("attn_v.weight", vec![d, kv]);
        if shape.qkv_bias {
            add("attn_q.bias", vec![q]);
            add("attn_k.bias", vec![kv]);
            add("attn_v.bias", vec![kv]);
        }
        if let Some(widths) = shape.qk_norm {
            let (q_norm, k_norm) = widths(shape);
            add("attn_q_norm.weight", vec![q_norm]);
            add("attn_k_norm.weight", vec![k_norm]);
        }
        add("attn_output.weight", vec![q, d]);
        add("ffn_norm.weight", vec![d]);
        for (name, ne) in (shape.ffn)(shape) {
            add(name, ne);
        }
    }
    t.push(("output_norm.weight".to_string(), vec![d]));
    t.push(("output.weight".to_string(), vec![d, n_vocab as u64]));
    t
}

/// The seed of tensor number `i`: distinct per tensor and per recipe seed.
fn tensor_seed(recipe_seed: u64, i: usize) -> u64 {
    recipe_seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add((i as u64 + 1) << 40)
}

/// The metadata of the model: the family's keys, then every `tokenizer.*` key of `vocab`.
fn metadata(recipe: &Recipe, vocab: &Gguf) -> Result<GgufWriter, MakeError> {
    let s = &recipe.shape;
    let mut w = GgufWriter::new();
    let a = s.arch;
    let u = |x: usize| Value::U32(x as u32);
    let head = s.head_dim;
    let mut kvs: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(a.into())),
        (
            "general.name".into(),
            Value::String(format!("{} (generated, seed {})", s.id, recipe.seed)),
        ),
        (format!("{a}.block_count"), u(recipe.n_layer())),
        (format!("{a}.context_length"), Value::U32(s.n_ctx_train)),
        (format!("{a}.embedding_length"), u(s.n_embd)),
        (format!("{a}.feed_forward_length"), u(s.n_ff)),
        (format!("{a}.attention.head_count"), u(s.n_head)),
        (format!("{a}.attention.head_count_kv"), u(s.n_head_kv)),
        (format!("{a}.attention.key_length"), u(head)),
        (format!("{a}.attention.value_length"), u(head)),
        (format!("{a}.rope.dimension_count"), u(head)),
        (format!("{a}.rope.freq_base"), Value::F32(s.rope_base)),
        (
            format!("{a}.attention.layer_norm_rms_epsilon"),
            Value::F32(s.rms_eps),
        ),
        (
            "general.quantization_version".into(),
            Value::U32(GGML_QNT_VERSION),
        ),
        ("general.file_type".into(), Value::U32(recipe.ftype.id())),
    ];
    kvs.extend((s.keys)(s));
    for (k, v) in kvs {
        w.set(&k, v)?;
    }
    for (key, value) in &vocab.metadata {
        if key.starts_with("tokenizer.") {
            w.set(key, value.clone())?;
        }
    }
    Ok(w)
}

/// The number of tokens of a vocabulary file.
fn vocab_size(vocab: &Gguf, name: &str) -> Result<usize, MakeError> {
    vocab
        .get_array("tokenizer.ggml.tokens")
        .map(|t| t.len())
        .map_err(|e| MakeError::Vocab(name.into(), e.to_string()))
}

/// The file the recipe makes, before a byte of data exists: its writer (metadata and tensor
/// infos, each tensor in the type chapter 6's recipe gives it) and each tensor's seed.
pub fn layout(recipe: &Recipe, vocab: &Gguf) -> Result<(GgufWriter, Vec<u64>), MakeError> {
    let n_vocab = vocab_size(vocab, recipe.shape.vocab)?;
    let list = tensors(&recipe.shape, recipe.n_layer(), n_vocab);
    // The types: llama.cpp's recipe for the file type, planned on the model as F32.
    let mut f32_file = metadata(recipe, vocab)?;
    for (name, ne) in &list {
        f32_file.add_tensor(name, ne, GgmlType::F32)?;
    }
    let as_f32 = Gguf::new(
        3,
        f32_file.metadata().to_vec(),
        f32_file.tensors().to_vec(),
        f32_file.alignment(),
        0,
    );
    let plan = Plan::new(&as_f32, recipe.ftype)?;
    let mut w = metadata(recipe, vocab)?;
    for (name, ne) in &list {
        w.add_tensor(name, ne, plan.get(name).expect("planned from this list"))?;
    }
    let seeds = (0..list.len())
        .map(|i| tensor_seed(recipe.seed, i))
        .collect();
    Ok((w, seeds))
}

/// Rows generated and quantized per task: enough to keep a task's overhead small, few enough
/// that the f32 rows of every thread fit in a few megabytes.
const ROWS_PER_TASK: usize = 16;

// ANCHOR: tensor_bytes
/// The bytes of tensor `t` (its type is the plan's), generated from `seed`: rows in parallel,
/// each generated in f32 and quantized at once — never the whole tensor in f32.
pub fn tensor_bytes(t: &TensorInfo, seed: u64) -> Result<Vec<u8>, String> {
    // ANCHOR: yours_tensor_bytes
    let cols = t.dims[0] as usize;
    let rows = (t.n_elements() / t.dims[0]) as usize;
    let row_bytes = (t.n_bytes() / rows as u64) as usize;
    let scale = scale_of(&t.name);
    let mut out = vec![0u8; t.n_bytes() as usize]; // (rows, row_bytes)
    out.par_chunks_mut(ROWS_PER_TASK * row_bytes)
        .enumerate()
        .try_for_each_init(Vec::new, |f, (i, dst)| {
            let r0 = i * ROWS_PER_TASK;
            let n = dst.len() / row_bytes;
            f.resize(n * cols, 0.0); // (n, cols)
            fill_rows(seed, scale, cols, r0..r0 + n, f);
            quantize_chunk(t.ggml_type, f, dst, n, cols)
                .map(|_| ())
                .map_err(|e| format!("{}: {e}", t.name))
        })?;
    Ok(out)
    // ANCHOR_END: yours_tensor_bytes
}
// ANCHOR_END: tensor_bytes

/// Write the recipe's file at `path` (through a temporary file renamed when complete), with
/// the tokenizer of `vocab`; `progress(done, total)` is called with bytes after each tensor.
/// Returns the file's size.
pub fn make(
    recipe: &Recipe,
    vocab: &Gguf,
    path: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<u64, MakeError> {
    let (w, seeds) = layout(recipe, vocab)?;
    let total = w.file_size();
    let mut done = w.header().len() as u64;
    let mut seeds = seeds.into_iter();
    let size = w.write_file(path, |t| {
        let bytes = tensor_bytes(t, seeds.next().expect("a seed per tensor"));
        done += t.n_bytes();
        progress(done, total);
        bytes
    })?;
    Ok(size)
}

/// The vocabulary file of `shape`: llama.cpp's vocabulary test model, in this repository's
/// `reference-data/tokenizer/`.
pub fn vocab_file(shape: &Shape) -> Result<Gguf, MakeError> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../reference-data/tokenizer")
        .join(format!("ggml-vocab-{}.gguf", shape.vocab));
    let bytes = std::fs::read(&path)
        .map_err(|e| MakeError::Vocab(path.display().to_string(), e.to_string()))?;
    Gguf::parse(&bytes).map_err(|e| MakeError::Vocab(path.display().to_string(), e.to_string()))
}

/// The recipe's file in the model cache, made there first if it is not (one process makes
/// it; others running at the same time wait for it).
pub fn ensure_made(
    recipe: &Recipe,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<std::path::PathBuf, MakeError> {
    shared::model::ensure_made(&recipe.file_name(), |_, dest| {
        let vocab = vocab_file(&recipe.shape)?;
        make(recipe, &vocab, dest, progress).map(|_| ())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_say_shape_layers_type_and_version() {
        let r = Recipe::named("llama3-8b", "q4_k_m").unwrap();
        assert_eq!(r.file_name(), "llama3-8b.v1.Q4_K_M.gguf");
        let r = r.with_layers(2).unwrap();
        assert_eq!(r.file_name(), "llama3-8b-2L.v1.Q4_K_M.gguf");
        assert_eq!(r.with_layers(32).unwrap().layers, None);
    }

    #[test]
    fn bad_names_are_errors_naming_them() {
        let e = Recipe::named("llama9", "Q4_0").unwrap_err().to_string();
        assert!(e.contains("llama9") && e.contains("llama3-8b"), "{e}");
        let e = Recipe::named("qwen2-7b", "Q2_K").unwrap_err().to_string();
        assert!(e.contains("Q2_K") && e.contains("Q4_K_M"), "{e}");
        let r = Recipe::named("qwen2-7b", "Q8_0").unwrap();
        let e = r.with_layers(29).unwrap_err().to_string();
        assert!(e.contains("29") && e.contains("28"), "{e}");
        assert!(r.with_layers(0).is_err());
    }

    /// Seeded logits of order 4, as the recipe's output gives.
    fn logits(seed: u64, n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| generated(seed, i as u64, 7.0, 0.0))
            .collect()
    }

    /// What the pipeline keeps of `want`: its `k` largest logits, the rest's probability and
    /// every `stride`-th logit.
    fn kept(want: &[f32], k: usize, stride: usize) -> StepLogits {
        let mut order: Vec<usize> = (0..want.len()).collect();
        order.sort_by(|&a, &b| want[b].total_cmp(&want[a]));
        let lp = log_softmax(want);
        let rest_mass = order[k..].iter().map(|&i| lp[i].exp()).sum();
        StepLogits {
            top_ids: order[..k].iter().map(|&i| i as u32).collect(),
            top_logits: order[..k].iter().map(|&i| want[i]).collect(),
            rest_mass,
            sampled: want.iter().step_by(stride).copied().collect(),
            stride,
        }
    }

    #[test]
    fn kept_rows_give_chapter_6s_measures_when_nothing_is_left_out() {
        let want = logits(1, 1000);
        let ours: Vec<f32> = want
            .iter()
            .zip(logits(2, 1000))
            .map(|(w, n)| w + 0.05 * n)
            .collect();
        let all = kept(&want, 1000, 1);
        let kl = kl_divergence(&want, &ours);
        assert!(
            (all.kl(&ours) - kl).abs() < 1e-9 * kl.max(1.0),
            "{} vs {kl}",
            all.kl(&ours)
        );
        assert_eq!(all.mean_abs_diff(&ours), mean_abs_diff(&want, &ours));
    }

    #[test]
    fn the_kl_over_the_top_tokens_is_the_whole_kl_less_the_kl_within_the_rest() {
        let want = logits(3, 4000);
        let noise = logits(4, 4000);
        let k = 1000;
        let top = kept(&want, k, 7);
        // Noise on every logit: the lumped rest (3 % of the probability: the logits are
        // uniform in ±7) hides what differs within it, and never adds.
        let ours: Vec<f32> = want.iter().zip(&noise).map(|(w, n)| w + 0.05 * n).collect();
        let (coarse, full) = (top.kl(&ours), kl_divergence(&want, &ours));
        assert!(
            coarse <= full + 1e-12 && coarse > 0.5 * full,
            "{coarse} vs {full}"
        );
        // Noise on the top tokens only (and one shift of the rest): nothing differs within the
        // rest, so nothing is lost.
        let mut ours = want.clone();
        for (i, v) in ours.iter_mut().enumerate() {
            *v += if top.top_ids.contains(&(i as u32)) {
                0.05 * noise[i]
            } else {
                0.3
            };
        }
        let (coarse, full) = (top.kl(&ours), kl_divergence(&want, &ours));
        assert!((coarse - full).abs() < 1e-9 * full, "{coarse} vs {full}");
    }

    #[test]
    fn the_noise_is_the_spread_of_the_differences_not_their_shift() {
        let want = logits(5, 999);
        let top = kept(&want, 10, 3);
        let shifted: Vec<f32> = want.iter().map(|w| w + 2.0).collect();
        assert!(top.noise(&shifted) < 1e-6);
        // Differences of ±0.25 on alternate sampled tokens: a spread of 0.25.
        let ours: Vec<f32> = want
            .iter()
            .enumerate()
            .map(|(i, w)| w + if (i / 3) % 2 == 0 { 0.25 } else { -0.25 })
            .collect();
        assert!(
            (top.noise(&ours) - 0.25).abs() < 1e-3,
            "{}",
            top.noise(&ours)
        );
        assert!((top.mean_abs_diff(&ours) - 0.25).abs() < 1e-6);
    }

    #[test]
    fn erfc_matches_known_values() {
        for (x, want) in [
            (0.0, 1.0),
            (0.5, 0.479_500_122),
            (1.0, 0.157_299_207),
            (2.0, 0.004_677_735),
        ] {
            assert!((erfc(x) - want).abs() < 2e-7, "erfc({x}) = {}", erfc(x));
        }
        assert!(erfc(6.0) < 1e-15);
    }

    #[test]
    fn flip_chance_grows_with_the_noise_and_a_tie_flips_half_the_time() {
        let l = [3.0f32, 2.9, 0.0, -1.0];
        let (small, large) = (flip_chance(&l, 0.01), flip_chance(&l, 0.2));
        // Gap 0.1 against 2σ = 0.02: five standard units; against 0.4, a quarter.
        assert!(
            small < 1e-10 && large > 0.3 && large < 0.5,
            "{small} {large}"
        );
        assert!((flip_chance(&[1.0, 1.0, -30.0], 0.1) - 0.5).abs() < 1e-6);
        assert_eq!(flip_chance(&[1.0, 0.0], 0.0), 0.0);
        assert_eq!(flip_chance(&[1.0; 5], 0.1), 1.0);
    }

    #[test]
    fn near_ties_may_exceed_the_expected_number_by_three_standard_deviations() {
        assert!(check_near_ties(0, 0.0).is_ok());
        assert!(check_near_ties(1, 0.0).is_err());
        assert!(check_near_ties(4, 1.0).is_ok());
        assert!(check_near_ties(5, 1.0).is_err());
        let e = check_near_ties(14, 6.0).unwrap_err();
        assert!(
            e.contains("14") && e.contains("6.00") && e.contains("13.35"),
            "{e}"
        );
    }

    /// Rows differ in norm as a trained matrix's do: gains drawn from [0.5, 1.5] put the
    /// largest of 64 rows' spreads about 2.8 times the smallest; one gain for every row would
    /// put them within a few percent of each other.
    const MIN_SPREAD_RATIO: f32 = 2.0;

    #[test]
    fn matrix_rows_have_the_planned_spread() {
        let cols = 4096;
        let mut f = vec![0.0; 64 * cols];
        fill_rows(7, Scale::Matrix { gain: 1.0 }, cols, 0..64, &mut f);
        let unit = 1.0 / (cols as f32).sqrt();
        let stds: Vec<f32> = f
            .chunks_exact(cols)
            .map(|row| (row.iter().map(|v| v * v).sum::<f32>() / cols as f32).sqrt())
            .collect();
        for std in &stds {
            // Gains are in [0.5, 1.5]; 4096 samples put the estimate within a few percent.
            assert!(*std > 0.45 * unit && *std < 1.55 * unit, "row std {std}");
        }
        let (lo, hi) = stds
            .iter()
            .fold((f32::MAX, 0f32), |(l, h), &s| (l.min(s), h.max(s)));
        assert!(
            hi > MIN_SPREAD_RATIO * lo,
            "row spreads {lo} to {hi}: every row has the same gain"
        );
    }

    #[test]
    fn norms_and_biases_have_their_planned_ranges() {
        let cols = 4096;
        let mut f = vec![0.0; cols];
        fill_rows(8, Scale::Norm { spread: 0.1 }, cols, 0..1, &mut f);
        let mean = f.iter().sum::<f32>() / cols as f32;
        // Uniform in 1 ± 0.1: a mean within 0.01 of 1 (its standard error is 0.001).
        assert!((mean - 1.0).abs() < 0.01, "norm weights' mean {mean}");
        assert!(
            f.iter().all(|v| (0.9..=1.1).contains(v)),
            "a norm weight outside 1 ± 0.1"
        );
        fill_rows(8, Scale::Bias { half_width: 0.5 }, cols, 0..1, &mut f);
        assert!(f.iter().all(|v| v.abs() <= 0.5), "a bias outside ±0.5");
        assert!(f.iter().any(|v| v.abs() > 0.45) && f.iter().any(|&v| v < 0.0));
    }

    #[test]
    fn any_range_of_rows_comes_out_the_same() {
        let (cols, scale) = (64, Scale::Matrix { gain: 1.0 });
        let mut whole = vec![0.0; 40 * cols];
        fill_rows(3, scale, cols, 0..40, &mut whole);
        let mut parts = vec![0.0; 40 * cols];
        let (a, b) = parts.split_at_mut(7 * cols);
        fill_rows(3, scale, cols, 0..7, a);
        fill_rows(3, scale, cols, 7..40, b);
        assert!(
            whole == parts,
            "rows 7..40 differ when filled apart from rows 0..7"
        );
        assert!(
            whole[..cols] != whole[cols..2 * cols],
            "rows 0 and 1 are the same"
        );
    }

    #[test]
    fn a_tensor_is_its_rows_quantized_in_order_on_any_number_of_threads() {
        // Two whole tasks and part of a third.
        let (rows, cols) = (2 * ROWS_PER_TASK + 8, 512);
        for ty in [GgmlType::Q4_0, GgmlType::Q6_K] {
            let t = TensorInfo {
                name: "blk.0.ffn_down.weight".into(),
                dims: vec![cols as u64, rows as u64],
                ggml_type: ty,
                offset: 0,
            };
            let mut f = vec![0.0; rows * cols];
            fill_rows(9, scale_of(&t.name), cols, 0..rows, &mut f);
            let mut want = vec![0u8; t.n_bytes() as usize];
            quantize_chunk(ty, &f, &mut want, rows, cols).unwrap();
            for threads in [1, 3] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let got = pool.install(|| tensor_bytes(&t, 9)).unwrap();
                assert!(
                    got == want,
                    "{ty:?} on {threads} threads: not the rows in order"
                );
            }
        }
    }
}
