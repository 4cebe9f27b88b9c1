//! Qwen3 (dense): Qwen2 without the Q/K/V biases, and with each head's query and key
//! RMS-normalised before RoPE.
//!
//! llama.cpp's `qwen3` graph (`src/models/qwen3.cpp`) is llama's block with one step added to
//! its attention: after the projections, every head's query and every head's key go through an
//! RMSNorm of their own, with `(head_dim)` weights shared by the heads (`attn_q_norm`,
//! `attn_k_norm`) and the model's epsilon (`qwen3.attention.layer_norm_rms_epsilon`); then
//! RoPE rotates them, in halves (NeoX style) as for Qwen2. Gemma 3 has the same step among its
//! five changes; Qwen3 has nothing else, so it keeps chapter 4's llama blocks and gives them
//! its own attention ([`QkNormed`]) through their [`AttentionBlock`] seam.
//!
//! The files carry no biases, but llama.cpp reads Q/K/V biases if a file has them, and so do
//! chapter 3's projections. Queries may be wider than the residual stream (Qwen3 0.6B: 16 heads
//! of 128 over a stream of 1024), which the projections' shapes already allow.

use crate::gemma3::norm_heads;
use ch01::config::RopeStyle;
use ch01::{Config, GgufFile};
use ch03::matrix::{LoadError, MatrixLoader, load_vector};
use ch03::{AttentionWeights, AttnScratch, KvDyn, Observer, TokenPos};
use ch04::llama::{AttentionBlock, Llama};
use ch04::{Architecture, Blocks, Ctx};

/// `general.architecture` of Qwen3 files.
pub const ARCH: &str = "qwen3";

/// Qwen3 in a set of [`Architectures`](ch04::Architectures). Qwen3 files carry their own chat
/// template.
pub const ARCHITECTURE: Architecture = Architecture {
    name: ARCH,
    load,
    chat_template: None,
};

/// The norms of one layer's queries and keys, each applied to every head.
pub struct QkNorm {
    pub q: Vec<f32>, // (head_dim), or the width QkNormed::load_widths was given
    pub k: Vec<f32>, // (head_dim), likewise
}

/// Qwen3's attention: chapter 3's steps, with the per-head norms between projecting and
/// rotating.
pub struct QkNormed {
    pub layers: Vec<QkNorm>,
}

// ANCHOR: load
/// Read a Qwen3 file's configuration and build its blocks: llama's, rotating halves, with
/// [`QkNormed`] attention.
pub fn load(
    file: &GgufFile<&[u8]>,
    loader: &dyn MatrixLoader,
) -> Result<(Config, Box<dyn Blocks>), LoadError> {
    let mut config =
        Config::from_gguf(&file.gguf, &[ARCH]).map_err(|e| LoadError::Other(e.to_string()))?;
    config.rope_style = RopeStyle::Neox;
    let blocks = Llama::load_with(file, loader, &config, QkNormed::load(file, &config)?)?;
    Ok((config, Box::new(blocks)))
}
// ANCHOR_END: load

impl QkNormed {
    /// Every layer's `attn_q_norm` and `attn_k_norm`, one head wide: each head normalised on
    /// its own.
    pub fn load<B: AsRef<[u8]>>(file: &GgufFile<B>, config: &Config) -> Result<Self, LoadError> {
        let hd = config.head_dim;
        QkNormed::load_widths(file, config, hd, hd)
    }

    /// The same norms `q_width` and `k_width` wide. A norm normalises each run of its width
    /// on its own: a head's width norms each head, the queries' whole width each token's
    /// queries at once.
    pub fn load_widths<B: AsRef<[u8]>>(
        file: &GgufFile<B>,
        config: &Config,
        q_width: usize,
        k_width: usize,
    ) -> Result<Self, LoadError> {
        let norm = |l: usize, t: &str, n| load_vector(file, &format!("blk.{l}.{t}.weight"), n);
        let layers = (0..config.n_layer)
            .map(|l| {
                Ok(QkNorm {
                    q: norm(l, "attn_q_norm", q_width)?,
                    k: norm(l, "attn_k_norm", k_width)?,
                })
            })
            .collect::<Result<Vec<_>, LoadError>>()?;
        Ok(QkNormed { layers })
    }
}

// ANCHOR: attention
impl AttentionBlock for QkNormed {
    fn forward(
        &self,
        ctx: &Ctx<'_>,
        s: &mut AttnScratch,
        w: &AttentionWeights,
        layer: usize,
        x: &[f32],
        tokens: &[TokenPos],
        kv: &mut dyn KvDyn,
        obs: &mut dyn Observer,
        out: &mut [f32],
    ) {
        let (attn, ops, eps) = (ctx.attention, ctx.compute, ctx.config.rms_norm_eps);
        let (n, hd, norm) = (tokens.len(), attn.head_dim, &self.layers[layer]);
        attn.project(w, x, n, s);
        // The heads' outputs `s.attn` are written only by attending: until then the buffer
        // (as wide as the queries) holds the norms' outputs.
        norm_heads(ops, &mut s.q, &norm.q, eps, &mut s.attn);
        norm_heads(ops, &mut s.k, &norm.k, eps, &mut s.attn);
        if obs.enabled() {
            obs.observe(&format!("Qcur_normed-{layer}"), &[n, attn.n_head, hd], &s.q);
            obs.observe(
                &format!("Kcur_normed-{layer}"),
                &[n, attn.n_head_kv, hd],
                &s.k,
            );
        }
        attn.rotate(ops, s, tokens);
        attn.store(layer, tokens, s, kv);
        attn.attend_runs(ops, layer, tokens, s, kv, obs);
        attn.project_out(w, s, out);
        attn.observe(layer, s, out, obs);
    }

    fn layer_tensors(&self) -> &'static [&'static str] {
        &["attn_q_norm.weight", "attn_k_norm.weight"]
    }
}
// ANCHOR_END: attention
