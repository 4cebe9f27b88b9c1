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
pub use ch01::config::RopeStyle;

// ANCHOR: rope
/// Precomputed `cos θ` and `sin θ` for every position and pair.
pub struct RopeTable {
    n_rot: usize, // rotated dimensions per head (the rest pass through)
    style: RopeStyle,
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
        // ANCHOR: yours_rope_table
        assert!(
            n_rot.is_multiple_of(2),
            "RoPE rotates pairs: n_rot must be even"
        );
        // llama.cpp computes θ by repeated multiplication in f32, not with a power per pair;
        // we do the same so that our angles, and so our Q and K, match it to the last bits.
        let theta_scale = base.powf(-2.0 / n_rot as f32);
        let mut cos_sin = Vec::with_capacity(n_pos * n_rot);
        for p in 0..n_pos {
            let mut theta = p as f32;
            for _ in 0..n_rot / 2 {
                let t = freq_scale * theta;
                cos_sin.push(t.cos());
                cos_sin.push(t.sin());
                theta *= theta_scale;
            }
        }
        RopeTable {
            n_rot,
            style,
            cos_sin,
        }
        // ANCHOR_END: yours_rope_table
    }

    /// Number of positions the table covers.
    pub fn n_pos(&self) -> usize {
        self.cos_sin.len() / self.n_rot.max(1)
    }

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
// ANCHOR_END: rope
