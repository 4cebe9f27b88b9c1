//! The rest of a llama layer: the gated feed-forward block, and one block's weights.

use crate::arch::Ctx;
use crate::compute::{Activation, Compute, FfnScratch};
use crate::llama::FfnBlock;
use ch01::{Config, GgufFile};
use ch03::matrix::{LoadError, Matrix, MatrixLoader, load_matrix, load_vector};
use ch03::{AttentionWeights, Observer, Scalar};

// ANCHOR: ffn
/// The gated feed-forward block: `down(act(gate(x)) ⊙ up(x))`; with SiLU as `act` (llama's)
/// it is called SwiGLU.
pub struct FeedForward {
    pub gate: Box<dyn Matrix>, // (n_ff, d_model)
    pub up: Box<dyn Matrix>,   // (n_ff, d_model)
    pub down: Box<dyn Matrix>, // (d_model, n_ff)
    /// The gate's activation.
    pub act: Activation,
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
        self.gate
            .matmul_fused(&[&*self.up], x, &mut [&mut gate[..], &mut up[..]]);
        if obs.enabled() {
            obs.observe(&format!("ffn_gate-{layer}"), &[n, n_ff], gate);
            obs.observe(&format!("ffn_up-{layer}"), &[n, n_ff], up);
        }
        ops.glu(self.act, gate, up);
        if obs.enabled() {
            let name = match self.act {
                Activation::Silu => "ffn_swiglu",
                Activation::GeluTanh => "ffn_geglu",
            };
            obs.observe(&format!("{name}-{layer}"), &[n, n_ff], gate);
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

/// The weights of one transformer block, with its feed-forward network `F` (llama's
/// [`FeedForward`] unless the blocks say otherwise).
pub struct LayerWeights<F = FeedForward> {
    pub attn_norm: Vec<f32>, // (d_model)
    pub attn: AttentionWeights,
    pub ffn_norm: Vec<f32>, // (d_model)
    pub ffn: F,
}

impl FeedForward {
    /// Layer `layer`'s SwiGLU network (`ffn_gate`, `ffn_up`, `ffn_down`).
    pub fn load<B: AsRef<[u8]>>(
        file: &GgufFile<B>,
        loader: &dyn MatrixLoader,
        cfg: &Config,
        layer: usize,
    ) -> Result<FeedForward, LoadError> {
        let (d, ff) = (cfg.d_model, cfg.n_ff);
        let name = |t: &str| format!("blk.{layer}.{t}.weight");
        Ok(FeedForward {
            gate: load_matrix(file, loader, &name("ffn_gate"), d, ff)?,
            up: load_matrix(file, loader, &name("ffn_up"), d, ff)?,
            down: load_matrix(file, loader, &name("ffn_down"), ff, d)?,
            act: Activation::Silu,
        })
    }
}

impl FfnBlock for FeedForward {
    fn forward(
        &self,
        ctx: &Ctx<'_>,
        s: &mut FfnScratch,
        layer: usize,
        x: &[f32],
        obs: &mut dyn Observer,
        out: &mut [f32],
    ) {
        self.forward_with(ctx.compute, &mut s.gate, &mut s.up, layer, x, obs, out);
    }

    fn layer_tensors() -> &'static [&'static str] {
        &["ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"]
    }
}

impl LayerWeights {
    /// Layer `layer` of a llama file: its attention and its SwiGLU network.
    pub fn load<B: AsRef<[u8]>>(
        file: &GgufFile<B>,
        loader: &dyn MatrixLoader,
        cfg: &Config,
        layer: usize,
    ) -> Result<LayerWeights, LoadError> {
        LayerWeights::load_with(file, loader, cfg, layer, || {
            FeedForward::load(file, loader, cfg, layer)
        })
    }
}

impl<F> LayerWeights<F> {
    /// Layer `layer`'s norms and attention, and the feed-forward network `ffn` reads.
    pub fn load_with<B: AsRef<[u8]>>(
        file: &GgufFile<B>,
        loader: &dyn MatrixLoader,
        cfg: &Config,
        layer: usize,
        ffn: impl FnOnce() -> Result<F, LoadError>,
    ) -> Result<LayerWeights<F>, LoadError> {
        let name = |t: &str| format!("blk.{layer}.{t}.weight");
        Ok(LayerWeights {
            attn_norm: load_vector(file, &name("attn_norm"), cfg.d_model)?,
            attn: AttentionWeights::load(file, loader, cfg, layer)?,
            ffn_norm: load_vector(file, &name("ffn_norm"), cfg.d_model)?,
            ffn: ffn()?,
        })
    }
}
