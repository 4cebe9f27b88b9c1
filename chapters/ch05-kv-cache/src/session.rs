//! Generation with a KV cache: each step runs the model on the new tokens only.

use ch04::ch03::{KvStore, NoObserver};
use ch04::{Batch, ForwardError, Model, Scratch, Session};

// ANCHOR: session
/// A [`Session`] that keeps keys and values in `kv` between calls, so each call computes only
/// the tokens that are new. The prompt is processed in chunks of at most `chunk` tokens
/// (chunked prefill): peak memory for activations stays bounded however long the prompt is.
pub struct Cached<'m, K: KvStore> {
    pub model: &'m Model,
    pub kv: K,
    /// Positions already in `kv` for sequence 0.
    pub n_past: usize,
    pub chunk: usize,
    /// The batch and the activations, kept from call to call: a decode step allocates nothing.
    batch: Batch,
    scratch: Scratch,
}

impl<K: KvStore> Session for Cached<'_, K> {
    type Error = ForwardError;

    fn next_logits(&mut self, tokens: &[u32], n_new: usize) -> Result<&[f32], ForwardError> {
        let start = tokens.len() - n_new;
        if start != self.n_past {
            return Err(ForwardError::Kv(ch04::KvError::Gap {
                seq: 0,
                have: self.n_past,
                start,
            }));
        }
        for (i, chunk) in tokens[start..].chunks(self.chunk).enumerate() {
            let pos = start + i * self.chunk;
            // Only the prompt's last token needs logits.
            let last = pos + chunk.len() == tokens.len();
            self.batch.set_sequence(0, chunk, pos, false);
            if !last {
                self.batch.logits.fill(false);
            }
            self.model.forward_with(
                &self.batch,
                &mut self.kv,
                &mut NoObserver,
                &mut self.scratch,
            )?;
            self.n_past = pos + chunk.len();
        }
        Ok(&self.scratch.logits)
    }
}
// ANCHOR_END: session

// ANCHOR: session_new
impl<'m> Cached<'m, crate::ContiguousCache> {
    /// A session with a contiguous cache of `n_ctx` positions (the model's run context,
    /// [`Model::n_ctx`], when `None`, and never more) that refuses to overflow, and prefill
    /// chunks of 256 tokens: what the examples use.
    pub fn contiguous(model: &'m Model, n_ctx: Option<usize>) -> Self {
        let n_ctx = n_ctx.map_or(model.n_ctx(), |n| n.min(model.n_ctx()));
        Cached::new(model, crate::ContiguousCache::for_model(model, n_ctx), 256)
    }
}

impl<'m, K: KvStore> Cached<'m, K> {
    pub fn new(model: &'m Model, kv: K, chunk: usize) -> Self {
        Cached {
            model,
            kv,
            n_past: 0,
            chunk: chunk.max(1),
            batch: Batch::default(),
            scratch: Scratch::default(),
        }
    }
}
// ANCHOR_END: session_new

impl<K: KvStore> Cached<'_, K> {
    /// The logits of the last call.
    pub fn logits(&self) -> &[f32] {
        &self.scratch.logits
    }
}
