//! The compute seam of attention: how RoPE and the attention of a batch of queries are run.
//!
//! [`Matrix`](crate::Matrix) lets a later chapter swap how the products are computed without
//! touching the model. [`AttentionOps`] does the same for the rest of the attention block: the
//! rotation of queries and keys, and scores → softmax → weighted sum of values for a batch of
//! queries against a [`KvView`]. Its provided methods are this chapter's scalar code, which
//! stays the reference; [`Scalar`] is the implementation that uses them as they are. Chapter 4
//! extends the trait with the per-token work of a layer (RMSNorm, the SwiGLU gate, the residual
//! add), and chapter 8 implements all of it with SIMD kernels spread over its thread pool.
//!
//! The operations take whole batches — every query of a sequence in one call, every token's
//! rotation in one call — so an implementation decides how to cut the work: by heads, by
//! query rows, by tiles of keys, or as one kernel launch on a GPU.

use crate::attention::{Attention, TokenPos};
use crate::kv::{KvDyn, KvView};
use crate::rope::RopeTable;

// ANCHOR: ops
/// The non-product work of attention. Every method has the scalar reference as its default.
pub trait AttentionOps: Send + Sync {
    /// Rotate `x` (`(n, n_heads, head_dim)`, one row per token of `tokens`) by each token's
    /// position.
    fn rope(&self, rope: &RopeTable, x: &mut [f32], head_dim: usize, tokens: &[TokenPos]) {
        let width = x.len() / tokens.len().max(1);
        for (row, t) in x.chunks_exact_mut(width).zip(tokens) {
            rope.apply(row, head_dim, t.pos);
        }
    }

    /// Attention of the queries `q` (`(n, n_head, head_dim)`), tokens `tokens` of one sequence
    /// whose keys and values are already in `kv`, into `out` (`(n, n_head, head_dim)`). Each
    /// query sees the positions [`Attention::visible`] allows.
    fn attend(
        &self,
        attn: &Attention,
        q: &[f32],
        tokens: &[TokenPos],
        kv: &dyn KvView,
        out: &mut [f32],
    ) {
        let qd = attn.q_dim();
        // Scratch for one token's attention weights. The reference allocates it per call;
        // chapter 8 keeps per-thread buffers instead.
        let mut probs = Vec::new(); // (n_head, n_visible)
        for (i, t) in tokens.iter().enumerate() {
            let visible = attn.visible(t.pos, kv.first());
            probs.resize(attn.n_head * visible.len(), 0.0);
            attn.attend(
                &q[i * qd..(i + 1) * qd],
                kv,
                visible,
                &mut probs,
                &mut out[i * qd..(i + 1) * qd],
            );
        }
    }
    // ANCHOR_END: ops

    // ANCHOR: ops_batch
    /// Attention of a batch's queries `q` (`(n, n_head, head_dim)`) into `out`
    /// (`(n, n_head, head_dim)`): tokens `tokens` of any number of sequences, each sequence's
    /// tokens side by side (a prompt, or chapter 7's batch of sequences), whose keys and values
    /// are in `kv` at `layer`. The default calls [`AttentionOps::attend`] once per run of one
    /// sequence's tokens; an implementation may run them all as one piece of work (chapter 8
    /// does, so that a decode step over many sequences is one parallel region, not one each).
    /// Either way a token's result must not depend on the other sequences of the batch.
    fn attend_batch(
        &self,
        attn: &Attention,
        layer: usize,
        q: &[f32],
        tokens: &[TokenPos],
        kv: &dyn KvDyn,
        out: &mut [f32],
    ) {
        let qd = attn.q_dim();
        for (seq, rows) in TokenPos::seq_runs(tokens) {
            let (q, out) = (
                &q[rows.start * qd..rows.end * qd],
                &mut out[rows.start * qd..],
            );
            kv.with_view(layer, seq, &mut |view| {
                self.attend(
                    attn,
                    q,
                    &tokens[rows.clone()],
                    view,
                    &mut out[..rows.len() * qd],
                )
            });
        }
    }

    /// A short description for diagnostics.
    fn describe(&self) -> String {
        "scalar reference".to_string()
    }
}
// ANCHOR_END: ops_batch

/// The scalar reference: this chapter's code, one thread.
#[derive(Debug, Clone, Copy, Default)]
pub struct Scalar;

impl AttentionOps for Scalar {}

/// Buffers of one attention block, sized by the largest batch seen and reused by every layer
/// and every forward pass, so a decode step allocates nothing (llama2.c's `RunState`).
#[derive(Debug, Default, Clone)]
pub struct AttnScratch {
    pub q: Vec<f32>,    // (n, n_head, head_dim)
    pub k: Vec<f32>,    // (n, n_head_kv, head_dim)
    pub v: Vec<f32>,    // (n, n_head_kv, head_dim)
    pub attn: Vec<f32>, // (n, n_head * head_dim): the heads' outputs side by side
    /// `(seq, first pos, end pos)` of each sequence of a batch, for reserving KV room.
    pub spans: Vec<(usize, usize, usize)>,
}

impl AttnScratch {
    /// Make room for a batch of `n` tokens. `Vec::resize` keeps its capacity when it shrinks,
    /// so after the largest batch has been seen this never allocates again.
    pub fn fit(&mut self, attn: &Attention, n: usize) {
        self.q.resize(n * attn.q_dim(), 0.0);
        self.k.resize(n * attn.kv_dim(), 0.0);
        self.v.resize(n * attn.kv_dim(), 0.0);
        self.attn.resize(n * attn.q_dim(), 0.0);
    }
}
