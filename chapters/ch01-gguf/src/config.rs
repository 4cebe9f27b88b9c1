//! The model's hyperparameters, read from GGUF metadata the way llama.cpp reads them.
//!
//! Keys are prefixed with the architecture: `llama.block_count`, `llama.embedding_length`. Where
//! a key is optional, the default is llama.cpp's (`llama-model.cpp`, `load_hparams`).

use crate::gguf::{Gguf, GgufError};
use std::fmt;

/// Positions a run holds when it does not ask for a context size: llama.cpp's default
/// (`--ctx-size 4096`), or the model's own context if that is shorter. A file's
/// `context_length` is what the model was trained on, not what a run needs; sizing the RoPE
/// table and the KV cache by it would let a file claiming a billion positions exhaust memory.
pub const DEFAULT_CONTEXT: usize = 4096;

// ANCHOR: config
/// Hyperparameters of a decoder-only transformer.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `general.architecture`.
    pub arch: String,
    /// Number of transformer blocks (`{arch}.block_count`).
    pub n_layer: usize,
    /// Width of the residual stream (`{arch}.embedding_length`).
    pub d_model: usize,
    /// Query heads per layer (`{arch}.attention.head_count`).
    pub n_head: usize,
    /// Key/value heads per layer; fewer than `n_head` means grouped-query attention
    /// (`{arch}.attention.head_count_kv`, default `n_head`).
    pub n_head_kv: usize,
    /// Width of one head (`{arch}.attention.key_length`, default `d_model / n_head`).
    pub head_dim: usize,
    /// Hidden width of the feed-forward network (`{arch}.feed_forward_length`).
    pub n_ff: usize,
    /// Number of tokens (`{arch}.vocab_size`, else the length of `tokenizer.ggml.tokens`).
    pub vocab_size: usize,
    /// Longest sequence the model was trained on (`{arch}.context_length`).
    pub context_length: usize,
    /// RoPE base θ (`{arch}.rope.freq_base`, default 10000).
    pub rope_freq_base: f32,
    /// How many dimensions of each head RoPE rotates (`{arch}.rope.dimension_count`, default
    /// `head_dim`).
    pub rope_dim: usize,
    /// Context extension, if the model was trained with one (`{arch}.rope.scaling.*`).
    pub rope_scaling: Option<RopeScaling>,
    /// A factor on RoPE's cosines and sines, so on every query and key
    /// (`{arch}.rope.scaling.attn_factor`, default 1).
    pub rope_attn_factor: f32,
    /// Which dimensions RoPE pairs up; fixed by the architecture.
    pub rope_style: RopeStyle,
    /// ε inside RMSNorm's square root (`{arch}.attention.layer_norm_rms_epsilon`).
    pub rms_norm_eps: f32,
    /// The output projection reuses the token embedding matrix (no `output.weight` tensor).
    pub tied_embeddings: bool,
    /// The factor on a query·key score before the softmax (`{arch}.attention.scale`, as
    /// llama.cpp's llama reads it); `None`, the usual case, is `1/√head_dim`.
    pub attention_scale: Option<f32>,
    /// The cap `c` of the output logits, each made `c·tanh(logit/c)`, where an architecture has
    /// one: no key of llama's, so `None` here; an architecture's loader sets it from its own.
    pub final_logit_softcapping: Option<f32>,
}
// ANCHOR_END: config

// ANCHOR: rope_types
/// RoPE context extension.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeScaling {
    pub kind: RopeScalingType,
    /// Context extension factor; positions are divided by it (for linear scaling).
    pub factor: f32,
    /// The context the model was trained on before the extension
    /// (`{arch}.rope.scaling.original_context_length`, default `context_length`): YaRN blends
    /// scaled and unscaled frequencies around the wavelengths that fit in it.
    pub original_context: usize,
}

/// `{arch}.rope.scaling.type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeScalingType {
    Linear,
    Yarn,
    LongRope,
}

/// How RoPE pairs the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs `(x[2i], x[2i+1])`: llama (ggml's `LLAMA_ROPE_TYPE_NORM`).
    Normal,
    /// Halves `(x[i], x[i + rope_dim/2])`: GPT-NeoX, Qwen, Phi (`LLAMA_ROPE_TYPE_NEOX`).
    Neox,
}
// ANCHOR_END: rope_types

/// Why a [`Config`] could not be built.
#[derive(Debug)]
pub enum ConfigError {
    /// `general.architecture` names an architecture outside the set the caller runs.
    UnsupportedArch {
        arch: String,
        /// The architectures the caller runs.
        supported: Vec<String>,
    },
    /// A required key is missing.
    MissingKey(String),
    /// A key has the wrong type, or a value out of range for it.
    BadValue(GgufError),
    /// Values that are each well-formed but do not make a model together.
    Invalid { key: String, reason: String },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::UnsupportedArch { arch, supported } => write!(
                f,
                "architecture {arch:?} is not supported (supported: {})",
                supported.join(", ")
            ),
            ConfigError::MissingKey(k) => write!(f, "required metadata key {k:?} is missing"),
            ConfigError::BadValue(e) => e.fmt(f),
            ConfigError::Invalid { key, reason } => write!(f, "metadata key {key:?}: {reason}"),
        }
    }
}

impl std::error::Error for ConfigError {}

impl From<GgufError> for ConfigError {
    fn from(e: GgufError) -> ConfigError {
        match e {
            GgufError::MissingKey(k) => ConfigError::MissingKey(k),
            e => ConfigError::BadValue(e),
        }
    }
}

/// A `{arch}.*` key reader that turns "absent" into a default where llama.cpp has one.
struct Keys<'a> {
    gguf: &'a Gguf,
    arch: &'a str,
}

impl Keys<'_> {
    fn key(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.arch)
    }

    fn usize(&self, suffix: &str) -> Result<usize, ConfigError> {
        let key = self.key(suffix);
        let v = self.gguf.get_u64(&key)?;
        usize::try_from(v).map_err(|_| ConfigError::Invalid {
            key,
            reason: format!("{v} does not fit in usize"),
        })
    }

    /// A required count of at least 1.
    fn count(&self, suffix: &str) -> Result<usize, ConfigError> {
        self.at_least_one(suffix, self.usize(suffix)?)
    }

    /// An optional count of at least 1, `default` when absent (a derived default such as
    /// `d_model / n_head` must be at least 1 too).
    fn count_or(&self, suffix: &str, default: usize) -> Result<usize, ConfigError> {
        match self.gguf.get(&self.key(suffix)) {
            None => self.at_least_one(suffix, default),
            Some(_) => self.count(suffix),
        }
    }

    /// An f32 that must be finite and satisfy `ok` (whose domain `domain` names, for the
    /// error); `default` when absent, or an error naming the key if there is none.
    fn f32(
        &self,
        suffix: &str,
        default: Option<f32>,
        domain: &str,
        ok: impl Fn(f32) -> bool,
    ) -> Result<f32, ConfigError> {
        let v = match (self.gguf.get(&self.key(suffix)), default) {
            (None, Some(d)) => return Ok(d),
            _ => self.gguf.get_f32(&self.key(suffix))?,
        };
        if !v.is_finite() || !ok(v) {
            return Err(ConfigError::Invalid {
                key: self.key(suffix),
                reason: format!("{v} is not {domain}"),
            });
        }
        Ok(v)
    }

    fn at_least_one(&self, suffix: &str, v: usize) -> Result<usize, ConfigError> {
        if v == 0 {
            return Err(ConfigError::Invalid {
                key: self.key(suffix),
                reason: "must be at least 1".into(),
            });
        }
        Ok(v)
    }
}

impl Config {
    // ANCHOR: from_gguf
    /// Read the hyperparameters from `gguf`'s metadata, if its architecture is one of
    /// `supported` (the caller's: chapter 1 reads `&["llama"]`, the engine passes the names of
    /// the architectures it can run). Every architecture names these keys as llama does
    /// (`{arch}.block_count`, …); one with keys of its own reads them on top. RoPE's style is
    /// left at `Normal`; an architecture that rotates halves sets it.
    pub fn from_gguf(gguf: &Gguf, supported: &[&str]) -> Result<Config, ConfigError> {
        let arch = gguf.architecture()?;
        if !supported.contains(&arch) {
            return Err(ConfigError::UnsupportedArch {
                arch: arch.to_string(),
                supported: supported.iter().map(|s| s.to_string()).collect(),
            });
        }
        Config::read(gguf, arch)
    }
    // ANCHOR_END: from_gguf

    // ANCHOR: read_counts
    fn read(gguf: &Gguf, arch: &str) -> Result<Config, ConfigError> {
        let k = Keys { gguf, arch };
        let invalid = |suffix: &str, reason: String| ConfigError::Invalid {
            key: k.key(suffix),
            reason,
        };

        let n_layer = k.count("block_count")?;
        let d_model = k.count("embedding_length")?;
        let n_head = k.count("attention.head_count")?;
        let n_head_kv = k.count_or("attention.head_count_kv", n_head)?;
        if !n_head.is_multiple_of(n_head_kv) {
            let why = format!("{n_head} query heads cannot share {n_head_kv} key/value heads");
            return Err(invalid("attention.head_count_kv", why));
        }
        let head_dim = k.count_or("attention.key_length", d_model / n_head)?;
        // Widths of all heads together: their products must fit, whatever the tensors say.
        for (suffix, heads) in [
            ("attention.head_count", n_head),
            ("attention.head_count_kv", n_head_kv),
        ] {
            if heads.checked_mul(head_dim).is_none() {
                let why = format!("{heads} heads of {head_dim} values overflow");
                return Err(invalid(suffix, why));
            }
        }
        let n_ff = k.count("feed_forward_length")?;
        let context_length = k.count("context_length")?;
        let n_tokens = gguf
            .get("tokenizer.ggml.tokens")
            .map(|_| gguf.get_array("tokenizer.ggml.tokens").map(|t| t.len()));
        let vocab_size = match (gguf.get(&k.key("vocab_size")), n_tokens) {
            (Some(_), n_tokens) => {
                let v = k.count("vocab_size")?;
                if let Some(n) = n_tokens.transpose()?
                    && n != v
                {
                    let why = format!("{v} differs from the {n} tokens of tokenizer.ggml.tokens");
                    return Err(invalid("vocab_size", why));
                }
                v
            }
            (None, Some(n)) => n?,
            (None, None) => return Err(ConfigError::MissingKey("tokenizer.ggml.tokens".into())),
        };
        if vocab_size == 0 {
            let why = "the vocabulary has no tokens".to_string();
            return Err(invalid("vocab_size", why));
        }
        // ANCHOR_END: read_counts

        // ANCHOR: read_floats
        // RoPE's frequencies base^(-2i/d) must fall with i, so the base is above 1.
        let rope_freq_base = k.f32("rope.freq_base", Some(10000.0), "above 1", |b| b > 1.0)?;
        let rope_dim = k.count_or("rope.dimension_count", head_dim)?;
        // llama.cpp insists on this for llama; RoPE rotates pairs, so it must also be even.
        if rope_dim != head_dim || !rope_dim.is_multiple_of(2) {
            let why = format!("{rope_dim} must be even and equal the head size {head_dim}");
            return Err(invalid("rope.dimension_count", why));
        }
        let rope_scaling = rope_scaling(&k, context_length)?;
        let rope_attn_factor = k.f32("rope.scaling.attn_factor", Some(1.0), "positive", |f| {
            f > 0.0
        })?;
        // ε keeps RMSNorm's division away from zero: positive, and small against the mean
        // square it is added to (real models use 1e-6 to 1e-5).
        let rms_norm_eps = k.f32(
            "attention.layer_norm_rms_epsilon",
            None,
            "between 0 and 1 (exclusive)",
            |e| e > 0.0 && e < 1.0,
        )?;
        let tied_embeddings = gguf.tensor("output.weight").is_none();
        let attention_scale = match gguf.get(&k.key("attention.scale")) {
            None => None,
            Some(_) => Some(k.f32("attention.scale", None, "positive", |s| s > 0.0)?),
        };

        Ok(Config {
            arch: arch.to_string(),
            n_layer,
            d_model,
            n_head,
            n_head_kv,
            head_dim,
            n_ff,
            vocab_size,
            context_length,
            rope_freq_base,
            rope_dim,
            rope_scaling,
            rope_attn_factor,
            rope_style: RopeStyle::Normal,
            rms_norm_eps,
            tied_embeddings,
            attention_scale,
            final_logit_softcapping: None,
        })
    }
    // ANCHOR_END: read_floats

    /// Query heads that share one key/value head.
    pub fn n_group(&self) -> usize {
        self.n_head / self.n_head_kv
    }

    /// Width of all key (or value) heads of a layer together.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Positions a run holds unless it asks for another size: [`DEFAULT_CONTEXT`], or the
    /// model's `context_length` if shorter.
    pub fn default_context(&self) -> usize {
        self.context_length.min(DEFAULT_CONTEXT)
    }
}

/// `rope.scaling.type` (default "linear", as in llama.cpp) with `rope.scaling.factor` (or the
/// older `rope.scale_linear`), and `rope.scaling.original_context_length` (default
/// `context_length`). A factor of 0 or 1 scales nothing, so it is `None`.
fn rope_scaling(k: &Keys, context_length: usize) -> Result<Option<RopeScaling>, ConfigError> {
    let type_key = k.key("rope.scaling.type");
    let kind = match k.gguf.get(&type_key) {
        None => Some(RopeScalingType::Linear),
        Some(_) => match k.gguf.get_str(&type_key)? {
            "none" => None,
            "linear" => Some(RopeScalingType::Linear),
            "yarn" => Some(RopeScalingType::Yarn),
            "longrope" => Some(RopeScalingType::LongRope),
            other => {
                return Err(ConfigError::Invalid {
                    key: type_key,
                    reason: format!("unknown RoPE scaling type {other:?}"),
                });
            }
        },
    };
    let factor_key = ["rope.scaling.factor", "rope.scale_linear"]
        .into_iter()
        .find(|s| k.gguf.get(&k.key(s)).is_some());
    // 0 means "not set" in llama.cpp; anything else divides positions, so it is positive.
    let factor = match factor_key {
        Some(s) => k.f32(s, None, "0 (unset) or positive", |f| f >= 0.0)?,
        None => 0.0,
    };
    let original_context = k.count_or("rope.scaling.original_context_length", context_length)?;
    Ok(match kind {
        Some(kind) if factor != 0.0 && factor != 1.0 => Some(RopeScaling {
            kind,
            factor,
            original_context,
        }),
        _ => None,
    })
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rows: [(&str, String); 16] = [
            ("arch", self.arch.clone()),
            ("n_layer", self.n_layer.to_string()),
            ("d_model", self.d_model.to_string()),
            ("n_head", self.n_head.to_string()),
            ("n_head_kv", self.n_head_kv.to_string()),
            ("head_dim", self.head_dim.to_string()),
            ("n_ff", self.n_ff.to_string()),
            ("vocab_size", self.vocab_size.to_string()),
            ("context_length", self.context_length.to_string()),
            ("rope_freq_base", self.rope_freq_base.to_string()),
            ("rope_dim", self.rope_dim.to_string()),
            ("rope_scaling", format!("{:?}", self.rope_scaling)),
            ("rope_attn_factor", self.rope_attn_factor.to_string()),
            ("rope_style", format!("{:?}", self.rope_style)),
            ("rms_norm_eps", format!("{:e}", self.rms_norm_eps)),
            ("tied_embeddings", self.tied_embeddings.to_string()),
        ];
        for (name, value) in rows {
            writeln!(f, "  {name:<16} {value}")?;
        }
        Ok(())
    }
}
