//! The compute seam of a whole layer, and the buffers a forward pass reuses.
//!
//! [`Compute`] extends chapter 3's [`AttentionOps`] with the per-token work this chapter adds:
//! RMSNorm, the SwiGLU gate and the residual add. Its provided methods are this chapter's
//! scalar code (the reference); [`Scalar`] uses them as they are. A [`Model`](crate::Model)
//! holds one `Compute`, so chapter 8 makes the whole layer fast by handing in its own, as it
//! hands in its own matrices through `MatrixLoader`, and the forward pass does not change.
//!
//! [`Scratch`] holds every activation buffer of a forward pass, sized by the largest batch it
//! has seen: a session keeps one, and a decode step allocates nothing.

use crate::layer::{rms_norm, silu};
use ch03::{AttentionOps, AttnScratch, Scalar};

// ANCHOR: compute
/// The non-product work of a layer: chapter 3's attention operations plus the per-token ones.
pub trait Compute: AttentionOps {
    /// RMSNorm of every row of `x` (`(n, d)`) scaled by `weight` (`(d)`), into `out`.
    fn rms_norm(&self, x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
        rms_norm(x, weight, eps, out);
    }

    /// The SwiGLU gate in place: `gate = silu(gate) ⊙ up` (both `(n, n_ff)`).
    fn swiglu(&self, gate: &mut [f32], up: &[f32]) {
        for (g, u) in gate.iter_mut().zip(up) {
            *g = silu(*g) * u;
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

/// The activations of a forward pass (llama2.c's `RunState`), sized by the largest batch seen.
#[derive(Debug, Default, Clone)]
pub struct Scratch {
    pub attn: AttnScratch,
    pub x: Vec<f32>,    // (n, d_model): the residual stream
    pub h: Vec<f32>,    // (n, d_model): normalised input of a sub-block
    pub y: Vec<f32>,    // (n, d_model): output of a sub-block
    pub gate: Vec<f32>, // (n, n_ff)
    pub up: Vec<f32>,   // (n, n_ff)
    /// Batch rows whose logits are wanted.
    pub rows: Vec<usize>,
    pub sel: Vec<f32>,    // (n_out, d_model): those rows of the residual stream
    pub normed: Vec<f32>, // (n_out, d_model)
    pub logits: Vec<f32>, // (n_out, vocab)
    /// Spare room for a model family's blocks (chapter 13), e.g. a normalised copy.
    pub tmp: Vec<f32>,
}
