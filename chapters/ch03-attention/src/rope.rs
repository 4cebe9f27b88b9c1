//! Rotary position embeddings (RoPE).
//!
//! RoPE encodes a token's position by rotating pairs of its query and key values: pair `i` of a
//! head at position `p` turns by the angle `θ_i = p · base^(-2i/d)`, where `d` is the number of
//! rotated dimensions. A rotation preserves length, and the dot product of a query rotated by
//! `p` with a key rotated by `q` depends only on `p - q`: attention sees relative positions.
//!
//! Which values form a pair differs between model families:
//! - [`RopeStyle::Normal`] (llama.cpp's `GGML_ROPE_TYPE_NORMAL`): adjacent values
//!   `(x[2i], x[2i+1])`. Llama-architecture GGUF files use it.
//! - [`RopeStyle::Neox`] (GPT-NeoX, and Hugging Face's `rotate_half`): the two halves
//!   `(x[i], x[i + d/2])`.
//!
//! Hugging Face's Llama code uses the halves convention, yet llama.cpp rotates adjacent pairs.
//! The GGUF converter reconciles them by permuting the rows of `W_q` and `W_k` when it writes the
//! file, so that the values Hugging Face pairs as `(i, i + d/2)` land next to each other at
//! `(2i, 2i + 1)`. Same model, same numbers, different memory order — which is why a GGUF llama
//! must be run with `Normal`, and why copying weights from a safetensors checkpoint without the
//! permutation silently gives garbage.

/// Which values of a head are rotated together; chapter 1's `Config` reads it from the file.
use ch01::config::RopeStyle;

// ANCHOR: rope
/// Precomputed `cos θ` and `sin θ` for every position and pair.
pub struct RopeTable {
    n_rot: usize, // rotated dimensions per head (the rest pass through)
    base: f32,
    style: RopeStyle,
    scale: RopeScale,
    cos_sin: Vec<f32>, // (n_pos, n_rot / 2, 2): cos, sin
}

impl RopeTable {
    /// `n_rot` rotated dimensions, frequency `base`, `freq_scale` = 1 / linear scaling factor
    /// (1.0 without scaling), positions `0..n_pos`.
    pub fn new(
        n_rot: usize,
        base: f32,
        freq_scale: f32,
        style: RopeStyle,
        n_pos: usize,
    ) -> RopeTable {
        RopeTable::scaled(n_rot, base, style, RopeScale::linear(freq_scale), n_pos)
    }

    /// The table with any of llama.cpp's position scalings ([`RopeScale`]).
    pub fn scaled(
        n_rot: usize,
        base: f32,
        style: RopeStyle,
        scale: RopeScale,
        n_pos: usize,
    ) -> RopeTable {
        assert!(
            n_rot.is_multiple_of(2),
            "RoPE rotates pairs: n_rot must be even"
        );
        let mut table = RopeTable {
            n_rot,
            base,
            style,
            scale,
            cos_sin: Vec::new(),
        };
        table.resize(n_pos);
        table
    }
    // ANCHOR_END: rope

    // ANCHOR: rope_resize
    /// Recompute the table for positions `0..n_pos`, with the same rotation.
    pub fn resize(&mut self, n_pos: usize) {
        let (n_rot, base, scale) = (self.n_rot, self.base, &self.scale);
        let cos_sin = &mut self.cos_sin;
        cos_sin.clear();
        cos_sin.reserve_exact(n_pos * n_rot);
        // ANCHOR: yours_rope_table
        // llama.cpp computes θ by repeated multiplication in f32, not with a power per pair;
        // we do the same so that our angles, and so our Q and K, match it to the last bits.
        let theta_scale = base.powf(-2.0 / n_rot as f32);
        for p in 0..n_pos {
            let mut theta = p as f32;
            for i in 0..n_rot / 2 {
                // Without scaling: cos θ and sin θ of `freq_scale · θ`.
                let (cos, sin) = scale.cos_sin(theta, i);
                cos_sin.push(cos);
                cos_sin.push(sin);
                theta *= theta_scale;
            }
        }
        // ANCHOR_END: yours_rope_table
    }
    // ANCHOR_END: rope_resize

    /// The position scaling the table was built with.
    pub fn scale(&self) -> &RopeScale {
        &self.scale
    }

    /// Number of positions the table covers.
    pub fn n_pos(&self) -> usize {
        self.cos_sin.len() / self.n_rot.max(1)
    }

    // ANCHOR: rope_apply
    /// Rotate every head of `x` (`(n_heads, head_dim)`, one token) for position `pos`.
    pub fn apply(&self, x: &mut [f32], head_dim: usize, pos: usize) {
        // ANCHOR: yours_rope_apply
        let half = self.n_rot / 2;
        let cs = &self.cos_sin[pos * self.n_rot..(pos + 1) * self.n_rot];
        for head in x.chunks_exact_mut(head_dim) {
            for i in 0..half {
                let (cos, sin) = (cs[2 * i], cs[2 * i + 1]);
                let (a, b) = match self.style {
                    RopeStyle::Normal => (2 * i, 2 * i + 1),
                    RopeStyle::Neox => (i, i + half),
                };
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0 * cos - x1 * sin;
                head[b] = x0 * sin + x1 * cos;
            }
        }
        // ANCHOR_END: yours_rope_apply
    }
}
// ANCHOR_END: rope_apply

// ANCHOR: rope_scale
/// How positions are scaled before they are turned into angles: the parameters of llama.cpp's
/// `ggml_rope_ext`, precomputed. Models trained for long contexts (YaRN) use all of it; a plain
/// llama uses only `freq_scale` (1 without scaling).
#[derive(Debug, Clone, PartialEq)]
pub struct RopeScale {
    /// Linear interpolation: every angle times this (1 / the scaling factor).
    pub freq_scale: f32,
    /// Llama 3's `rope_freqs.weight`: pair `i`'s angle divided by `freq_factors[i]`
    /// (`n_rot / 2` values; 1 for the fast pairs, up to the scaling factor for the slow ones).
    pub freq_factors: Option<Vec<f32>>,
    /// YaRN's share of extrapolation: 0 turns YaRN off, 1 is full YaRN.
    pub ext_factor: f32,
    /// Multiplies every cosine and sine, so every query and key (YaRN's attention temperature).
    pub attn_factor: f32,
    /// YaRN's ramp, in pairs: below `corr_dims[0]` the pair keeps its unscaled angle
    /// (extrapolation), above `corr_dims[1]` it takes the scaled one (interpolation).
    pub corr_dims: [f32; 2],
}

impl RopeScale {
    /// Linear scaling only (`freq_scale` 1: none).
    pub fn linear(freq_scale: f32) -> RopeScale {
        RopeScale {
            freq_scale,
            freq_factors: None,
            ext_factor: 0.0,
            attn_factor: 1.0,
            corr_dims: [0.0, 0.0],
        }
    }
    // ANCHOR_END: rope_scale

    // ANCHOR: rope_yarn
    /// YaRN for a model whose context of `n_ctx_orig` positions was extended `factor` times,
    /// with ggml's default ramp (`beta_fast` 32, `beta_slow` 1 rotations) and llama.cpp's
    /// attention factor: `llama_context`'s `get_mscale(factor) / (1 + 0.1 ln factor)` — 1 up
    /// to rounding, since [`RopeScale::cos_sin`] multiplies by `1 + 0.1 ln factor` itself.
    pub fn yarn(n_rot: usize, base: f32, factor: f32, n_ctx_orig: usize) -> RopeScale {
        let freq_scale = 1.0 / factor;
        let factor = 1.0 / freq_scale; // llama.cpp's own round trip, bit for bit
        let mscale = if factor <= 1.0 {
            1.0
        } else {
            0.1 * factor.ln() + 1.0
        };
        let (beta_fast, beta_slow) = (32.0, 1.0);
        // ggml_rope_yarn_corr_dim: the pair whose wavelength turns `n_rot` times in `n_ctx_orig`.
        let corr_dim = |rotations: f32| {
            n_rot as f32 * (n_ctx_orig as f32 / (rotations * 2.0 * std::f32::consts::PI)).ln()
                / (2.0 * base.ln())
        };
        let low = corr_dim(beta_fast).floor().max(0.0);
        let high = corr_dim(beta_slow).ceil().min(n_rot as f32 - 1.0);
        RopeScale {
            freq_scale,
            freq_factors: None,
            ext_factor: 1.0,
            attn_factor: mscale * (1.0 / (1.0 + 0.1 * factor.ln())),
            corr_dims: [low, high],
        }
    }
    // ANCHOR_END: rope_yarn

    // ANCHOR: rope_cos_sin
    /// `(cos, sin)` of pair `i` for the unscaled angle `theta` (ggml's `rope_yarn`).
    pub fn cos_sin(&self, theta: f32, i: usize) -> (f32, f32) {
        let theta_extrap = match &self.freq_factors {
            Some(f) => theta / f[i],
            None => theta,
        };
        let theta_interp = self.freq_scale * theta_extrap;
        let (mut theta, mut mscale) = (theta_interp, self.attn_factor);
        if self.ext_factor != 0.0 {
            // Fast pairs (below the ramp) keep their angle, slow ones are interpolated.
            let [low, high] = self.corr_dims;
            let y = (i as f32 - low) / (high - low).max(0.001);
            let ramp_mix = (1.0 - y.clamp(0.0, 1.0)) * self.ext_factor;
            theta = theta_interp * (1.0 - ramp_mix) + theta_extrap * ramp_mix;
            mscale *= 1.0 + 0.1 * (1.0 / self.freq_scale).ln();
        }
        (theta.cos() * mscale, theta.sin() * mscale)
    }
}
// ANCHOR_END: rope_cos_sin
