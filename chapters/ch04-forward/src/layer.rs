//! The rest of a llama layer: RMSNorm and the SwiGLU feed-forward block.

use crate::compute::Compute;
use ch03::matrix::{LoadError, Matrix, MatrixLoader, load_matrix, load_vector};
use ch03::{AttentionWeights, Config, GgufFile, Observer, Scalar};

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

// ANCHOR: ffn
/// SiLU (also called swish): `x · sigmoid(x)`.
pub fn silu(x: f32) -> f32 {
    // ANCHOR: yours_silu
    x / (1.0 + (-x).exp())
    // ANCHOR_END: yours_silu
}

/// The feed-forward block: `down(silu(gate(x)) ⊙ up(x))`, SwiGLU.
pub struct FeedForward {
    pub gate: Box<dyn Matrix>, // (n_ff, d_model)
    pub up: Box<dyn Matrix>,   // (n_ff, d_model)
    pub down: Box<dyn Matrix>, // (d_model, n_ff)
}

impl FeedForward {
    /// `x` is `(n, d_model)`; `out` receives `(n, d_model)`. The gate runs through `ops`;
    /// `gate` and `up` are buffers reused from call to call.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_with(
        &self,
        ops: &dyn Compute,
        gate: &mut Vec<f32>,
        up: &mut Vec<f32>,
        layer: usize,
        x: &[f32],
        obs: &mut dyn Observer,
        out: &mut [f32],
    ) {
        let n_ff = self.gate.rows();
        let n = x.len() / self.gate.cols();
        gate.resize(n * n_ff, 0.0); // (n, n_ff)
        up.resize(n * n_ff, 0.0); // (n, n_ff)
        // ANCHOR: yours_ffn
        self.gate.matmul(x, gate);
        self.up.matmul(x, up);
        if obs.enabled() {
            obs.observe(&format!("ffn_gate-{layer}"), &[n, n_ff], gate);
            obs.observe(&format!("ffn_up-{layer}"), &[n, n_ff], up);
        }
        ops.swiglu(gate, up);
        if obs.enabled() {
            obs.observe(&format!("ffn_swiglu-{layer}"), &[n, n_ff], gate);
        }
        self.down.matmul(gate, out);
        // ANCHOR_END: yours_ffn
    }

    /// [`FeedForward::forward_with`] on the scalar reference, with buffers of its own.
    pub fn forward(&self, layer: usize, x: &[f32], obs: &mut dyn Observer, out: &mut [f32]) {
        let (mut gate, mut up) = (Vec::new(), Vec::new());
        self.forward_with(&Scalar, &mut gate, &mut up, layer, x, obs, out);
    }
}
// ANCHOR_END: ffn

/// The weights of one transformer block.
pub struct LayerWeights {
    pub attn_norm: Vec<f32>, // (d_model)
    pub attn: AttentionWeights,
    pub ffn_norm: Vec<f32>, // (d_model)
    pub ffn: FeedForward,
}

impl LayerWeights {
    pub fn load<B: AsRef<[u8]>>(
        file: &GgufFile<B>,
        loader: &dyn MatrixLoader,
        cfg: &Config,
        layer: usize,
    ) -> Result<LayerWeights, LoadError> {
        let (d, ff) = (cfg.d_model, cfg.n_ff);
        let name = |t: &str| format!("blk.{layer}.{t}.weight");
        Ok(LayerWeights {
            attn_norm: load_vector(file, &name("attn_norm"), d)?,
            attn: AttentionWeights::load(file, loader, cfg, layer)?,
            ffn_norm: load_vector(file, &name("ffn_norm"), d)?,
            ffn: FeedForward {
                gate: load_matrix(file, loader, &name("ffn_gate"), d, ff)?,
                up: load_matrix(file, loader, &name("ffn_up"), d, ff)?,
                down: load_matrix(file, loader, &name("ffn_down"), ff, d)?,
            },
        })
    }
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
}
