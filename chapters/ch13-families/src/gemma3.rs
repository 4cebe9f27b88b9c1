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
//! KV cache, scheduler, server) is the llama path's.

use ch12::ch03::matrix::{load_matrix, load_vector};
use ch12::{
    Attention, Batch, Config, Family, FamilyInfo, GgufFile, KvDyn, LoadError, Matrix, MatrixLoader,
    Model, Observer, RopeStyle, RopeTable, Scalar, Scratch, Weights, check_context,
};
use std::sync::{Arc, OnceLock};

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

/// How the family is registered with chapter 4's [`Model::load`].
pub const INFO: FamilyInfo = FamilyInfo {
    arch: ARCH,
    load,
    chat_template: Some(CHAT_TEMPLATE),
};

// ANCHOR: weights
/// The weights of one Gemma 3 block.
pub struct Block {
    pub attn_norm: Vec<f32>,      // (d_model)
    pub wq: Box<dyn Matrix>,      // (n_head * head_dim, d_model)
    pub wk: Box<dyn Matrix>,      // (n_head_kv * head_dim, d_model)
    pub wv: Box<dyn Matrix>,      // (n_head_kv * head_dim, d_model)
    pub q_norm: Vec<f32>,         // (head_dim)
    pub k_norm: Vec<f32>,         // (head_dim)
    pub wo: Box<dyn Matrix>,      // (d_model, n_head * head_dim)
    pub post_attn_norm: Vec<f32>, // (d_model)
    pub ffn_norm: Vec<f32>,       // (d_model)
    pub gate: Box<dyn Matrix>,    // (n_ff, d_model)
    pub up: Box<dyn Matrix>,      // (n_ff, d_model)
    pub down: Box<dyn Matrix>,    // (d_model, n_ff)
    pub post_ffn_norm: Vec<f32>,  // (d_model)
    /// Whether this layer attends through the sliding window.
    pub local: bool,
}

/// Gemma 3's blocks, and the attention of its sliding-window layers; the global layers use
/// the model's own (`Model::attention`, with Gemma's score scale).
pub struct Gemma3 {
    pub blocks: Vec<Block>,
    /// Sliding-window layers: window `n_swa`, RoPE base [`SWA_ROPE_BASE`] (or the file's).
    pub local: Attention,
    /// The factor on the scores: `1/√head_dim` (`1/√(d_model/n_head)` for the 27B model).
    pub kq_scale: f32,
    pub swa_rope_base: f32,
    pub n_swa: Option<usize>,
    /// `tanh`-cap of the logits (`final_logit_softcapping`), if the file sets one.
    pub softcap: Option<f32>,
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

/// Which layers use the sliding window: `gemma3.attention.sliding_window_pattern` as one bool
/// per layer, or as a period `p` (the last layer of every `p` is global), default [`PATTERN`].
fn swa_layers(file: &GgufFile<&[u8]>, n_layer: usize) -> Result<Vec<bool>, LoadError> {
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
}

/// The attention of the sliding-window layers for a run of `n_ctx` positions: chapter 3's,
/// with a window and a RoPE table of their own base (never scaled: llama.cpp's
/// `rope_freq_scale_train_swa` is 1).
fn local_attention(
    cfg: &Config,
    n_ctx: usize,
    base: f32,
    window: Option<usize>,
    kq_scale: f32,
) -> Attention {
    Attention {
        n_head: cfg.n_head,
        n_head_kv: cfg.n_head_kv,
        head_dim: cfg.head_dim,
        rope: RopeTable::new(cfg.rope_dim, base, 1.0, cfg.rope_style, n_ctx),
        window,
        kq_scale,
    }
}

// ANCHOR: load
/// Build a Gemma 3 model from `file`, its matrices made by `loader`: chapter 4's `Model` with
/// the llama blocks left empty and a [`Gemma3`] family holding these.
pub fn load(file: &GgufFile<&[u8]>, loader: &dyn MatrixLoader) -> Result<Model, LoadError> {
    let other = |e: &dyn std::fmt::Display| LoadError::Other(e.to_string());
    let mut config = Config::from_gguf_any(&file.gguf).map_err(|e| other(&e))?;
    if config.arch != ARCH {
        return Err(LoadError::Other(format!(
            "the Gemma 3 loader was given architecture {:?}",
            config.arch
        )));
    }
    config.rope_style = RopeStyle::Neox;
    let (d, hd, vocab) = (config.d_model, config.head_dim, config.vocab_size);
    let (qd, kvd, ff) = (config.n_head * hd, config.kv_dim(), config.n_ff);
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
    let softcap = get_f32(file, "final_logit_softcapping")?;
    // llama.cpp: the 27B model (62 layers) scales by 1/√(d_model / n_head), the others by
    // 1/√head_dim (gemma_pytorch's `query_pre_attn_scalar`).
    let kq_scale = if config.n_layer == 62 {
        1.0 / ((d / config.n_head).max(1) as f32).sqrt()
    } else {
        Attention::standard_scale(hd)
    };

    let blocks = local_layers
        .iter()
        .enumerate()
        .map(|(l, &local)| {
            let name = |t: &str| format!("blk.{l}.{t}.weight");
            let m = |t: &str, cols, rows| load_matrix(file, loader, &name(t), cols, rows);
            let v = |t: &str, n| load_vector(file, &name(t), n);
            Ok(Block {
                attn_norm: v("attn_norm", d)?,
                wq: m("attn_q", d, qd)?,
                wk: m("attn_k", d, kvd)?,
                wv: m("attn_v", d, kvd)?,
                q_norm: v("attn_q_norm", hd)?,
                k_norm: v("attn_k_norm", hd)?,
                wo: m("attn_output", qd, d)?,
                post_attn_norm: v("post_attention_norm", d)?,
                ffn_norm: v("ffn_norm", d)?,
                gate: m("ffn_gate", d, ff)?,
                up: m("ffn_up", d, ff)?,
                down: m("ffn_down", ff, d)?,
                post_ffn_norm: v("post_ffw_norm", d)?,
                local,
            })
        })
        .collect::<Result<Vec<_>, LoadError>>()?;
    let weights = Weights {
        token_embd: load_matrix(file, loader, "token_embd.weight", d, vocab)?,
        layers: Vec::new(),
        output_norm: load_vector(file, "output_norm.weight", d)?,
        output: if config.tied_embeddings {
            None
        } else {
            Some(load_matrix(file, loader, "output.weight", d, vocab)?)
        },
    };
    let n_ctx = config.default_context();
    check_context(&config, n_ctx).map_err(|e| other(&e))?;
    // The global layers use the model's attention, with Gemma's scale.
    let mut attention = Attention::new(&config, n_ctx)?;
    attention.kq_scale = kq_scale;
    let family = Gemma3 {
        blocks,
        local: local_attention(&config, n_ctx, swa_rope_base, n_swa, kq_scale),
        kq_scale,
        swa_rope_base,
        n_swa,
        softcap,
    };
    Ok(Model {
        config,
        attention,
        weights,
        compute: Arc::new(Scalar),
        family: Some(Box::new(family)),
    })
}
// ANCHOR_END: load

// ANCHOR: gelu
/// GELU, tanh approximation: `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`.
pub fn gelu(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const GELU_COEF_A: f32 = 0.044715;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)).tanh())
}

/// ggml's GELU on the CPU: a table of `gelu` at every f16 value, stored as f16, indexed by the
/// input rounded to f16 (`GGML_GELU_FP16`); inputs at or beyond ±10 are exact (0 or `x`).
/// 128 KiB once, and the same numbers as llama.cpp to the bit.
fn gelu_table() -> &'static [f32] {
    static TABLE: OnceLock<Vec<f32>> = OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|bits| {
                let x = half::f16::from_bits(bits).to_f32();
                half::f16::from_f32(gelu(x)).to_f32()
            })
            .collect()
    })
}

/// The GELU gate in place: `gate = gelu(gate) ⊙ up` (ggml's `geglu`), both `(n, n_ff)`.
pub fn geglu(gate: &mut [f32], up: &[f32]) {
    let table = gelu_table();
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        *g = if x <= -10.0 {
            0.0
        } else if x >= 10.0 {
            x * u
        } else {
            table[half::f16::from_f32(x).to_bits() as usize] * u
        };
    }
}
// ANCHOR_END: gelu

// ANCHOR: blocks
impl Family for Gemma3 {
    fn blocks(
        &self,
        model: &Model,
        batch: &Batch,
        kv: &mut dyn KvDyn,
        obs: &mut dyn Observer,
        s: &mut Scratch,
    ) {
        let (cfg, ops) = (&model.config, &*model.compute);
        let (n, d, eps) = (batch.len(), cfg.d_model, cfg.rms_norm_eps);
        let (hd, ff) = (cfg.head_dim, cfg.n_ff);
        let seen = |obs: &mut dyn Observer, name: &str, l: usize, shape: &[usize], x: &[f32]| {
            if obs.enabled() {
                obs.observe(&format!("{name}-{l}"), shape, x);
            }
        };
        // (1) Embeddings scaled by √d_model (ggml_scale: one f32 product each).
        let scale = (d as f32).sqrt();
        s.x.iter_mut().for_each(|v| *v *= scale);
        if obs.enabled() {
            obs.observe("inp_scaled", &[n, d], &s.x);
        }
        s.gate.resize(n * ff, 0.0); // (n, n_ff)
        s.up.resize(n * ff, 0.0); // (n, n_ff)
        for (l, w) in self.blocks.iter().enumerate() {
            let attn = if w.local {
                &self.local
            } else {
                &model.attention
            };
            let (qd, kvd) = (attn.q_dim(), attn.kv_dim());
            ops.rms_norm(&s.x, &w.attn_norm, eps, &mut s.h);
            seen(obs, "attn_norm", l, &[n, d], &s.h);

            // Attention: projections, (2) per-head norms of Q and K, RoPE.
            let a = &mut s.attn;
            a.fit(attn, n);
            w.wq.matmul(&s.h, &mut a.q); // (n, n_head, head_dim)
            w.wk.matmul(&s.h, &mut a.k); // (n, n_head_kv, head_dim)
            w.wv.matmul(&s.h, &mut a.v); // (n, n_head_kv, head_dim)
            s.tmp.resize(n * qd, 0.0);
            ops.rms_norm(&a.q, &w.q_norm, eps, &mut s.tmp);
            std::mem::swap(&mut a.q, &mut s.tmp);
            seen(obs, "Qcur_normed", l, &[n, cfg.n_head, hd], &a.q);
            s.tmp.resize(n * kvd, 0.0);
            ops.rms_norm(&a.k, &w.k_norm, eps, &mut s.tmp);
            std::mem::swap(&mut a.k, &mut s.tmp);
            seen(obs, "Kcur_normed", l, &[n, cfg.n_head_kv, hd], &a.k);
            ops.rope(&attn.rope, &mut a.q, hd, &batch.at);
            ops.rope(&attn.rope, &mut a.k, hd, &batch.at);
            seen(obs, "Qcur", l, &[n, cfg.n_head, hd], &a.q);
            seen(obs, "Kcur", l, &[n, cfg.n_head_kv, hd], &a.k);
            seen(obs, "Vcur", l, &[n, cfg.n_head_kv, hd], &a.v);
            for (i, t) in batch.at.iter().enumerate() {
                let r = i * kvd..(i + 1) * kvd;
                kv.store_kv(l, t.seq, t.pos, &a.k[r.clone()], &a.v[r]);
            }
            // (3) One call per run of tokens of one sequence; `attn` is local or global.
            let mut i = 0;
            while i < n {
                let seq = batch.at[i].seq;
                let j = i + batch.at[i..].iter().take_while(|t| t.seq == seq).count();
                let (q, out) = (&a.q[i * qd..j * qd], &mut a.attn[i * qd..j * qd]);
                kv.with_view(l, seq, &mut |view| {
                    ops.attend(attn, q, &batch.at[i..j], view, out)
                });
                i = j;
            }
            seen(obs, "kqv_out", l, &[n, qd], &a.attn);
            w.wo.matmul(&a.attn, &mut s.y);
            // (4) Norm after attention, then the residual add.
            ops.rms_norm(&s.y, &w.post_attn_norm, eps, &mut s.h);
            seen(obs, "attn_post_norm", l, &[n, d], &s.h);
            ops.add(&mut s.x, &s.h);
            seen(obs, "sa_out", l, &[n, d], &s.x);

            // Feed-forward: (5) GELU-gated, then (4) its own norm after it.
            ops.rms_norm(&s.x, &w.ffn_norm, eps, &mut s.h);
            seen(obs, "ffn_norm", l, &[n, d], &s.h);
            w.gate.matmul(&s.h, &mut s.gate);
            w.up.matmul(&s.h, &mut s.up);
            geglu(&mut s.gate, &s.up);
            w.down.matmul(&s.gate, &mut s.y);
            seen(obs, "ffn_out", l, &[n, d], &s.y);
            ops.rms_norm(&s.y, &w.post_ffn_norm, eps, &mut s.h);
            seen(obs, "ffn_post_norm", l, &[n, d], &s.h);
            ops.add(&mut s.x, &s.h);
            seen(obs, "l_out", l, &[n, d], &s.x);
        }
    }

    fn set_context(
        &mut self,
        config: &Config,
        n_ctx: usize,
        attention: &mut Attention,
    ) -> Result<(), LoadError> {
        attention.kq_scale = self.kq_scale;
        self.local = local_attention(config, n_ctx, self.swa_rope_base, self.n_swa, self.kq_scale);
        Ok(())
    }

    fn finish_logits(&self, logits: &mut [f32]) {
        if let Some(cap) = self.softcap {
            logits.iter_mut().for_each(|v| *v = (*v / cap).tanh() * cap);
        }
    }

    fn describe(&self) -> String {
        format!("gemma3, {}", self.blocks[0].wq.describe())
    }
}
// ANCHOR_END: blocks

#[cfg(test)]
mod tests {
    use super::*;
    use ch12::{ChatTemplate, Message};

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

    #[test]
    fn gelu_table_matches_the_formula_to_f16_precision() {
        for x in [-3.0f32, -0.5, 0.0, 0.1, 1.0, 2.5, 9.9] {
            let (mut g, u) = ([x], [1.0]);
            geglu(&mut g, &u);
            assert!((g[0] - gelu(x)).abs() <= gelu(x).abs() * 2e-3 + 1e-4, "{x}");
        }
    }
}
