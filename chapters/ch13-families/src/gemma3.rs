//! Gemma 3 (`general.architecture = "gemma3"`): llama's skeleton with five changes, in the
//! order llama.cpp's graph (`src/models/gemma3.cpp`) applies them.
//!
//! 1. The token embeddings are multiplied by `√d_model` before the first block.
//! 2. Queries and keys are RMS-normalised per head (`attn_q_norm`, `attn_k_norm`, `(head_dim)`
//!    weights) before RoPE, which rotates halves (NeoX style).
//! 3. Five of every six layers attend through a sliding window of 512 positions, with a RoPE
//!    base of 10,000; every sixth layer attends globally with a base of 1,000,000 (and the
//!    file's RoPE scaling, if any).
//! 4. Each sub-block's output is RMS-normalised again before the residual add
//!    (`post_attention_norm`, `post_ffw_norm`): a "sandwich" of norms.
//! 5. The feed-forward gate is GELU (tanh approximation), not SiLU: `down(gelu(gate·x) ⊙ up·x)`.
//!
//! Gemma's RMSNorm multiplies by `1 + w`; the GGUF converter stores `1 + w`, so the norm here
//! is chapter 4's. Everything around the blocks (embeddings lookup, final norm, tied output,
//! KV cache, scheduler, server) is the model's frame, as for llama; inside them, attention is
//! chapter 3's steps with the norms between two of them, and the feed-forward network is chapter
//! 4's with GELU as its gate.

use ch01::config::RopeStyle;
use ch01::{Config, GgufFile};
use ch03::matrix::{load_matrix, load_vector};
use ch03::{Attention, AttentionWeights, KvDyn, LoadError, MatrixLoader, Observer, RopeTable};
use ch04::layer::FeedForward;
use ch04::{Activation, Architecture, Batch, Blocks, Compute, Ctx, Scratch};

/// The architecture name in `general.architecture`.
pub const ARCH: &str = "gemma3";

/// Layers per group of the default sliding-window pattern: `PATTERN - 1` local layers, then
/// one global (llama.cpp's `load_swa_pattern(ml, 6)`).
pub const PATTERN: usize = 6;

/// RoPE base of the sliding-window layers when the file does not say
/// (`gemma3.rope.freq_base_swa`; llama.cpp's `rope_freq_base_train_swa`).
pub const SWA_ROPE_BASE: f32 = 10_000.0;

// ANCHOR: template
/// Gemma's chat template, for files without `tokenizer.chat_template` (Gemma 3's GGUF files
/// carry none). It renders what llama.cpp's built-in `gemma` template does: the assistant is
/// called `model`, a system message is merged into the first user turn, contents are trimmed.
/// No BOS text: tokenizing the prompt adds BOS (`tokenizer.ggml.add_bos_token`).
pub const CHAT_TEMPLATE: &str = "{%- set ns = namespace(system='') -%}\
{%- for message in messages -%}\
{%- if message['role'] == 'system' -%}\
{%- set ns.system = ns.system + (message['content'] | trim) -%}\
{%- else -%}\
{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}\
{{ '<start_of_turn>' + role + '\n' }}\
{%- if ns.system != '' and role != 'model' -%}\
{{ ns.system + '\n\n' }}{%- set ns.system = '' -%}\
{%- endif -%}\
{{ (message['content'] | trim) + '<end_of_turn>\n' }}\
{%- endif -%}\
{%- endfor -%}\
{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}";
// ANCHOR_END: template

/// Gemma 3 in a set of [`Architectures`](ch04::Architectures).
pub const ARCHITECTURE: Architecture = Architecture {
    name: ARCH,
    load,
    chat_template: Some(CHAT_TEMPLATE),
};

// ANCHOR: weights
/// The weights of one Gemma 3 block.
pub struct Block {
    pub attn_norm: Vec<f32>, // (d_model)
    /// The projections `attn_q`, `attn_k`, `attn_v`, `attn_output`.
    pub attn: AttentionWeights,
    pub q_norm: Vec<f32>,         // (head_dim)
    pub k_norm: Vec<f32>,         // (head_dim)
    pub post_attn_norm: Vec<f32>, // (d_model)
    pub ffn_norm: Vec<f32>,       // (d_model)
    /// Gate, up and down, with GELU as the gate's activation.
    pub ffn: FeedForward,
    pub post_ffn_norm: Vec<f32>, // (d_model)
    /// Whether this layer attends through the sliding window.
    pub local: bool,
}

/// Gemma 3's blocks, and the attention of its sliding-window layers; the global layers use
/// the model's own. (Both scale the scores by the configuration's `attention_scale`, which the
/// loader sets.)
pub struct Gemma3 {
    pub blocks: Vec<Block>,
    /// Sliding-window layers: window `n_swa`, RoPE base [`SWA_ROPE_BASE`] (or the file's).
    pub local: Attention,
    pub swa_rope_base: f32,
    pub n_swa: Option<usize>,
}
// ANCHOR_END: weights

/// A `u32` key of `gguf` under the architecture's prefix, if present.
fn get_u32(file: &GgufFile<&[u8]>, suffix: &str) -> Result<Option<u32>, LoadError> {
    let key = format!("{ARCH}.{suffix}");
    match file.gguf.get(&key) {
        None => Ok(None),
        Some(_) => file
            .gguf
            .get_u32(&key)
            .map(Some)
            .map_err(|e| LoadError::Other(e.to_string())),
    }
}

/// A positive, finite `f32` key, if present.
fn get_f32(file: &GgufFile<&[u8]>, suffix: &str) -> Result<Option<f32>, LoadError> {
    let key = format!("{ARCH}.{suffix}");
    if file.gguf.get(&key).is_none() {
        return Ok(None);
    }
    let v = file
        .gguf
        .get_f32(&key)
        .map_err(|e| LoadError::Other(e.to_string()))?;
    if !(v.is_finite() && v > 0.0) {
        return Err(LoadError::Other(format!(
            "metadata key {key:?}: {v} is not a positive number"
        )));
    }
    Ok(Some(v))
}

// ANCHOR: swa_layers
/// Which layers use the sliding window: `gemma3.attention.sliding_window_pattern` as one bool
/// per layer, or as a period `p` (the last layer of every `p` is global), default [`PATTERN`].
fn swa_layers(file: &GgufFile<&[u8]>, n_layer: usize) -> Result<Vec<bool>, LoadError> {
    // ANCHOR: yours_swa_layers
    let key = format!("{ARCH}.attention.sliding_window_pattern");
    let period = match file.gguf.get(&key) {
        None => PATTERN,
        Some(_) => {
            if let Ok(flags) = file.gguf.get_array(&key) {
                let flags: Vec<bool> = flags
                    .iter()
                    .map(|v| v.as_bool())
                    .collect::<Option<_>>()
                    .ok_or_else(|| {
                        LoadError::Other(format!("metadata key {key:?}: not an array of bools"))
                    })?;
                if flags.len() != n_layer {
                    return Err(LoadError::Other(format!(
                        "metadata key {key:?}: {} flags for {n_layer} layers",
                        flags.len()
                    )));
                }
                return Ok(flags);
            }
            get_u32(file, "attention.sliding_window_pattern")?.unwrap_or(PATTERN as u32) as usize
        }
    };
    Ok((0..n_layer)
        .map(|l| period == 0 || l % period < period - 1)
        .collect())
    // ANCHOR_END: yours_swa_layers
}
// ANCHOR_END: swa_layers

/// The attention of the sliding-window layers for a run of `n_ctx` positions: chapter 3's,
/// with a window and a RoPE table of their own base (never scaled: llama.cpp's
/// `rope_freq_scale_train_swa` is 1), and the configuration's score scale.
fn local_attention(cfg: &Config, n_ctx: usize, base: f32, window: Option<usize>) -> Attention {
    Attention {
        n_head: cfg.n_head,
        n_head_kv: cfg.n_head_kv,
        head_dim: cfg.head_dim,
        rope: RopeTable::new(cfg.rope_dim, base, 1.0, cfg.rope_style, n_ctx),
        window,
        kq_scale: cfg
            .attention_scale
            .unwrap_or_else(|| Attention::standard_scale(cfg.head_dim)),
    }
}

// ANCHOR: load
/// Read a Gemma 3 file's configuration and build its blocks, their matrices made by `loader`;
/// chapter 4's [`Model::load`](ch04::Model::load) loads the frame around them.
pub fn load(
    file: &GgufFile<&[u8]>,
    loader: &dyn MatrixLoader,
) -> Result<(Config, Box<dyn Blocks>), LoadError> {
    let other = |e: &dyn std::fmt::Display| LoadError::Other(e.to_string());
    let mut config = Config::from_gguf(&file.gguf, &[ARCH]).map_err(|e| other(&e))?;
    config.rope_style = RopeStyle::Neox;
    let (d, hd, ff) = (config.d_model, config.head_dim, config.n_ff);
    if let Some(v) = get_u32(file, "attention.value_length")?
        && v as usize != hd
    {
        return Err(LoadError::Other(format!(
            "metadata key \"{ARCH}.attention.value_length\": {v} differs from the key length {hd}"
        )));
    }
    let n_swa = get_u32(file, "attention.sliding_window")?
        .filter(|&w| w > 0)
        .map(|w| w as usize);
    let local_layers = match n_swa {
        Some(_) => swa_layers(file, config.n_layer)?,
        None => vec![false; config.n_layer],
    };
    let swa_rope_base = get_f32(file, "rope.freq_base_swa")?.unwrap_or(SWA_ROPE_BASE);
    // Chapter 4's frame caps the logits, chapter 3's attention scales the scores, as the
    // configuration says. llama.cpp: the 27B model (62 layers) scales by 1/√(d_model / n_head),
    // the others by 1/√head_dim (gemma_pytorch's `query_pre_attn_scalar`), whatever the file.
    config.final_logit_softcapping = get_f32(file, "final_logit_softcapping")?;
    config.attention_scale = Some(if config.n_layer == 62 {
        1.0 / ((d / config.n_head).max(1) as f32).sqrt()
    } else {
        Attention::standard_scale(hd)
    });
    // ANCHOR_END: load

    // ANCHOR: load_blocks
    let blocks = local_layers
        .iter()
        .enumerate()
        .map(|(l, &local)| {
            let name = |t: &str| format!("blk.{l}.{t}.weight");
            let m = |t: &str, cols, rows| load_matrix(file, loader, &name(t), cols, rows);
            let v = |t: &str, n| load_vector(file, &name(t), n);
            Ok(Block {
                attn_norm: v("attn_norm", d)?,
                attn: AttentionWeights::load(file, loader, &config, l)?,
                q_norm: v("attn_q_norm", hd)?,
                k_norm: v("attn_k_norm", hd)?,
                post_attn_norm: v("post_attention_norm", d)?,
                ffn_norm: v("ffn_norm", d)?,
                ffn: FeedForward {
                    gate: m("ffn_gate", d, ff)?,
                    up: m("ffn_up", d, ff)?,
                    down: m("ffn_down", ff, d)?,
                    act: Activation::GeluTanh,
                },
                post_ffn_norm: v("post_ffw_norm", d)?,
                local,
            })
        })
        .collect::<Result<Vec<_>, LoadError>>()?;
    let gemma = Gemma3 {
        blocks,
        // Sized for the run's context by `set_context`, which the model calls once assembled.
        local: local_attention(&config, 1, swa_rope_base, n_swa),
        swa_rope_base,
        n_swa,
    };
    Ok((config, Box::new(gemma)))
}
// ANCHOR_END: load_blocks

// ANCHOR: norm_heads
/// RMS-normalise every head of `x` (`(n, heads, head_dim)`) by `weight` (`(head_dim)`) — every
/// run of `weight.len()` values: a wider weight norms several heads at once — through `spare`
/// (the norm cannot write over its own input), grown if it is shorter than `x`: no buffer is
/// allocated once it has grown. Qwen3 normalises its heads with it too.
pub(crate) fn norm_heads(
    ops: &dyn Compute,
    x: &mut [f32],
    weight: &[f32],
    eps: f32,
    spare: &mut Vec<f32>,
) {
    if spare.len() < x.len() {
        spare.resize(x.len(), 0.0);
    }
    let out = &mut spare[..x.len()];
    ops.rms_norm(x, weight, eps, out);
    x.copy_from_slice(out);
}
// ANCHOR_END: norm_heads

// ANCHOR: forward
impl Blocks for Gemma3 {
    fn forward(
        &self,
        ctx: &Ctx<'_>,
        batch: &Batch,
        kv: &mut dyn KvDyn,
        obs: &mut dyn Observer,
        s: &mut Scratch,
    ) {
        let (cfg, ops) = (ctx.config, ctx.compute);
        let (n, d, eps) = (batch.len(), cfg.d_model, cfg.rms_norm_eps);
        let hd = cfg.head_dim;
        let seen = |obs: &mut dyn Observer, name: &str, l: usize, shape: &[usize], x: &[f32]| {
            if obs.enabled() {
                obs.observe(&format!("{name}-{l}"), shape, x);
            }
        };
        // ANCHOR: yours_embed_scale
        // (1) Embeddings scaled by √d_model (ggml_scale: one f32 product each).
        let scale = (d as f32).sqrt();
        s.x.iter_mut().for_each(|v| *v *= scale);
        if obs.enabled() {
            obs.observe("inp_scaled", &[n, d], &s.x);
        }
        // ANCHOR_END: yours_embed_scale
        for (l, w) in self.blocks.iter().enumerate() {
            // ANCHOR_END: forward
            // ANCHOR: forward_layer
            // ANCHOR: yours_layer
            // (3) The sliding-window layers' attention, or the model's for the global ones.
            let attn = if w.local { &self.local } else { ctx.attention };
            s.h.resize(n * d, 0.0);
            ops.rms_norm(&s.x, &w.attn_norm, eps, &mut s.h);
            seen(obs, "attn_norm", l, &[n, d], &s.h);

            // Chapter 3's steps, with (2) the per-head norms of Q and K before RoPE; `s.h` is
            // free once projected, and lends its buffer to the norms.
            let a = &mut s.attn;
            attn.project(&w.attn, &s.h, n, a);
            norm_heads(ops, &mut a.q, &w.q_norm, eps, &mut s.h);
            seen(obs, "Qcur_normed", l, &[n, cfg.n_head, hd], &a.q);
            norm_heads(ops, &mut a.k, &w.k_norm, eps, &mut s.h);
            seen(obs, "Kcur_normed", l, &[n, cfg.n_head_kv, hd], &a.k);
            attn.rotate(ops, a, &batch.at);
            attn.store(l, &batch.at, a, kv);
            attn.attend_runs(ops, l, &batch.at, a, kv, obs);
            attn.project_out(&w.attn, a, &mut s.y);
            attn.observe(l, a, &s.y, obs);
            // (4) Norm after attention, then the residual add.
            s.h.resize(n * d, 0.0);
            ops.rms_norm(&s.y, &w.post_attn_norm, eps, &mut s.h);
            seen(obs, "attn_post_norm", l, &[n, d], &s.h);
            ops.add(&mut s.x, &s.h);
            seen(obs, "sa_out", l, &[n, d], &s.x);

            // Feed-forward: (5) GELU-gated, then (4) its own norm after it.
            ops.rms_norm(&s.x, &w.ffn_norm, eps, &mut s.h);
            seen(obs, "ffn_norm", l, &[n, d], &s.h);
            w.ffn
                .forward_with(ops, &mut s.ffn.gate, &mut s.ffn.up, l, &s.h, obs, &mut s.y);
            seen(obs, "ffn_out", l, &[n, d], &s.y);
            ops.rms_norm(&s.y, &w.post_ffn_norm, eps, &mut s.h);
            seen(obs, "ffn_post_norm", l, &[n, d], &s.h);
            ops.add(&mut s.x, &s.h);
            seen(obs, "l_out", l, &[n, d], &s.x);
            // ANCHOR_END: yours_layer
        }
    }
    // ANCHOR_END: forward_layer

    // ANCHOR: blocks_rest

    fn set_context(&mut self, config: &Config, n_ctx: usize) -> Result<(), LoadError> {
        self.local = local_attention(config, n_ctx, self.swa_rope_base, self.n_swa);
        Ok(())
    }

    fn describe(&self) -> String {
        match self.blocks.first() {
            Some(b) => format!("gemma3, {}", b.attn.wq.describe()),
            None => "gemma3, no layers".to_string(),
        }
    }
}
// ANCHOR_END: blocks_rest

#[cfg(test)]
mod tests {
    use super::*;
    use ch01::Value;
    use ch01::gguf::ValueType;
    use ch02::{ChatTemplate, Message};
    use ch06::gguf_write::GgufWriter;

    /// `swa_layers` of a file whose only metadata is `pattern`, if any, as
    /// `gemma3.attention.sliding_window_pattern`.
    fn layers_of(pattern: Option<Value>, n_layer: usize) -> Result<Vec<bool>, LoadError> {
        let mut w = GgufWriter::new();
        if let Some(v) = pattern {
            w.set(&format!("{ARCH}.attention.sliding_window_pattern"), v)
                .unwrap();
        }
        let header = w.header();
        swa_layers(&GgufFile::from_bytes(&header[..]).unwrap(), n_layer)
    }

    /// The key's three forms, as llama.cpp reads them (`llama_hparams::set_swa_pattern`): absent
    /// (a period of 6), a period `p` (the last layer of every `p` is global; 0: none is), and one
    /// flag per layer (`true`: sliding window), whose count must be the number of layers. The
    /// default model file has no such key, so only this test sees the other two.
    #[test]
    fn the_sliding_window_pattern_is_a_period_or_one_flag_per_layer() {
        let (t, f) = (true, false);
        assert_eq!(layers_of(None, 8).unwrap(), [t, t, t, t, t, f, t, t]);
        assert_eq!(
            layers_of(Some(Value::U32(3)), 7).unwrap(),
            [t, t, f, t, t, f, t]
        );
        assert_eq!(layers_of(Some(Value::U32(1)), 3).unwrap(), [f, f, f]);
        assert_eq!(layers_of(Some(Value::U32(0)), 3).unwrap(), [t, t, t]);
        let flags =
            |v: &[bool]| Value::Array(ValueType::Bool, v.iter().map(|&b| Value::Bool(b)).collect());
        assert_eq!(
            layers_of(Some(flags(&[f, t, t, f])), 4).unwrap(),
            [f, t, t, f]
        );
        let err = layers_of(Some(flags(&[t, f])), 4).unwrap_err().to_string();
        assert!(err.contains("2 flags for 4 layers"), "{err}");
    }

    /// What llama.cpp's built-in `gemma` template (`llama-chat.cpp`) writes for the same
    /// conversation: system merged into the first user turn, contents trimmed.
    #[test]
    fn chat_template_renders_as_llama_cpps_gemma_template() {
        let t = ChatTemplate::new(CHAT_TEMPLATE, "<bos>", "<eos>").unwrap();
        let m = [
            Message::new("system", " Be concise. "),
            Message::new("user", "Name three colors.\n"),
            Message::new("assistant", "Red, green, blue."),
            Message::new("user", "More?"),
        ];
        assert_eq!(
            t.render(&m, true).unwrap(),
            "<start_of_turn>user\nBe concise.\n\nName three colors.<end_of_turn>\n\
             <start_of_turn>model\nRed, green, blue.<end_of_turn>\n\
             <start_of_turn>user\nMore?<end_of_turn>\n<start_of_turn>model\n"
        );
    }
}
