//! The compute seam of a whole layer, and the buffers a forward pass reuses.
//!
//! [`Compute`] extends chapter 3's [`AttentionOps`] with the per-token work this chapter adds:
//! RMSNorm, the feed-forward gate and the residual add. Its provided methods are this chapter's
//! scalar code (the reference: the functions of this module); [`Scalar`] uses them as they
//! are. A [`Model`](crate::Model) holds one `Compute`, so chapter 8 makes the whole layer fast by handing in its own, as it
//! hands in its own matrices through `MatrixLoader`, and the forward pass does not change.
//!
//! [`Scratch`] holds every activation buffer of a forward pass, sized by the largest batch it
//! has seen: a session keeps one, and a decode step allocates nothing.

use ch03::{AttentionOps, AttnScratch, Scalar};
use std::sync::OnceLock;

// ANCHOR: rms_norm
/// RMSNorm of every row of `x` (`(n, d)`), scaled by `weight` (`(d)`), into `out` (`(n, d)`):
///
/// ```text
/// y_i = x_i / sqrt(mean(x²) + eps) · w_i
/// ```
///
/// Unlike LayerNorm it does not subtract the mean: only the scale of the vector is normalised.
/// The sum of squares is accumulated in f64, as ggml does, so long rows lose no precision.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    // ANCHOR: yours_rms_norm
    let d = weight.len();
    for (row, o) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let sum: f64 = row.iter().map(|&v| (v * v) as f64).sum();
        let mean = (sum / d as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for ((o, &v), &w) in o.iter_mut().zip(row).zip(weight) {
            *o = (v * scale) * w;
        }
    }
    // ANCHOR_END: yours_rms_norm
}
// ANCHOR_END: rms_norm

// ANCHOR: activations
/// SiLU (also called swish): `x · sigmoid(x)`.
pub fn silu(x: f32) -> f32 {
    // ANCHOR: yours_silu
    x / (1.0 + (-x).exp())
    // ANCHOR_END: yours_silu
}

/// GELU, tanh approximation: `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`, the gate of some
/// architectures' feed-forward networks instead of SiLU.
pub fn gelu(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const GELU_COEF_A: f32 = 0.044715;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)).tanh())
}

/// ggml's GELU on the CPU: a table of `gelu` at every f16 value, stored as f16, indexed by the
/// input rounded to f16 (`GGML_GELU_FP16`); inputs at or beyond ±10 are exact (0 or `x`).
/// 256 KiB once, and the same numbers as llama.cpp to the bit.
pub fn gelu_f16(x: f32) -> f32 {
    gelu_lookup(gelu_table(), x)
}

/// The table of [`gelu_f16`], built on first use.
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

fn gelu_lookup(table: &[f32], x: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        table[half::f16::from_f32(x).to_bits() as usize]
    }
}
// ANCHOR_END: activations

/// The SwiGLU gate in place: `gate = silu(gate) ⊙ up` (ggml's `swiglu`).
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = silu(*g) * u;
    }
}

/// The GELU gate in place: `gate = gelu_f16(gate) ⊙ up` (ggml's `geglu` on the CPU). Chapter
/// 8's threads each run it on their share: it is a table lookup, not arithmetic to vectorise.
pub fn geglu(gate: &mut [f32], up: &[f32]) {
    let table = gelu_table();
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = gelu_lookup(table, *g) * u;
    }
}

/// The activation of a feed-forward gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// SiLU: llama's SwiGLU (ggml's `swiglu`).
    Silu,
    /// GELU, tanh approximation, as ggml computes it on the CPU ([`gelu_f16`], ggml's
    /// `geglu`).
    GeluTanh,
}

// ANCHOR: compute
/// The non-product work of a layer: chapter 3's attention operations plus the per-token ones.
pub trait Compute: AttentionOps {
    /// RMSNorm of every row of `x` (`(n, d)`) scaled by `weight` (`(d)`), into `out`.
    fn rms_norm(&self, x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
        rms_norm(x, weight, eps, out);
    }

    /// The feed-forward gate in place: `gate = act(gate) ⊙ up` (both `(n, n_ff)`).
    fn glu(&self, act: Activation, gate: &mut [f32], up: &[f32]) {
        match act {
            Activation::Silu => swiglu(gate, up),
            Activation::GeluTanh => geglu(gate, up),
        }
    }

    /// The residual connection: `x += y`.
    fn add(&self, x: &mut [f32], y: &[f32]) {
        for (a, b) in x.iter_mut().zip(y) {
            *a += b;
        }
    }
}
// ANCHOR_END: compute

impl Compute for Scalar {}

/// The buffers of a feed-forward sub-block, reused from call to call: llama's uses `gate` and
/// `up`; a feed-forward network of another kind may use the spare ones as it likes.
#[derive(Debug, Default, Clone)]
pub struct FfnScratch {
    pub gate: Vec<f32>, // (n, n_ff)
    pub up: Vec<f32>,   // (n, n_ff)
    pub spare: Vec<f32>,
    pub index: Vec<usize>,
}

/// The activations of a forward pass (llama2.c's `RunState`), sized by the largest batch seen.
#[derive(Debug, Default, Clone)]
pub struct Scratch {
    pub attn: AttnScratch,
    pub x: Vec<f32>, // (n, d_model): the residual stream
    pub h: Vec<f32>, // (n, d_model): normalised input of a sub-block
    pub y: Vec<f32>, // (n, d_model): output of a sub-block
    pub ffn: FfnScratch,
    /// Batch rows whose logits are wanted.
    pub rows: Vec<usize>,
    pub sel: Vec<f32>,    // (n_out, d_model): those rows of the residual stream
    pub normed: Vec<f32>, // (n_out, d_model)
    pub logits: Vec<f32>, // (n_out, vocab)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_gives_unit_root_mean_square() {
        let x: Vec<f32> = (0..64).map(|i| (i as f32 - 20.0) * 0.3).collect();
        let mut out = vec![0.0; 64];
        rms_norm(&x, &[1.0; 64], 0.0, &mut out);
        let ms: f32 = out.iter().map(|v| v * v).sum::<f32>() / 64.0;
        assert!((ms - 1.0).abs() < 1e-5, "{ms}");
    }

    #[test]
    fn silu_limits() {
        assert_eq!(silu(0.0), 0.0);
        assert!((silu(20.0) - 20.0).abs() < 1e-5);
        assert!(silu(-20.0).abs() < 1e-6);
    }

    /// The f16 table holds `gelu` rounded to f16 at inputs rounded to f16: within f16's
    /// relative precision (2⁻¹¹, about 5e-4) of the formula, twice over, plus a little near 0.
    const GELU_F16_TOL: f32 = 2e-3;

    #[test]
    fn gelu_table_matches_the_formula_to_f16_precision() {
        for x in [-12.0f32, -3.0, -0.5, 0.0, 0.1, 1.0, 2.5, 9.9, 12.0] {
            let (g, want) = (gelu_f16(x), gelu(x));
            assert!(
                (g - want).abs() <= want.abs() * GELU_F16_TOL + 1e-4,
                "{x}: {g} vs {want}"
            );
        }
        let mut gate = [1.0f32, -1.0];
        Scalar.glu(Activation::GeluTanh, &mut gate, &[2.0, 3.0]);
        assert_eq!(gate, [gelu_f16(1.0) * 2.0, gelu_f16(-1.0) * 3.0]);
    }
}
