//! Generation with a KV cache: each step runs the model on the new tokens only.

use ch04::ch03::{KvStore, NoObserver};
use ch04::{Batch, ForwardError, Model, Session};

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
}

impl<'m> Cached<'m, crate::ContiguousCache> {
    /// A session with a contiguous cache of `n_ctx` positions (the model's context length when
    /// `None`) that refuses to overflow, and prefill chunks of 256 tokens: what the examples use.
    pub fn contiguous(model: &'m Model, n_ctx: Option<usize>) -> Self {
        let n_ctx = n_ctx.unwrap_or(model.config.context_length);
        let kv = crate::ContiguousCache::new(
            model.config.n_layer,
            model.attention.kv_dim(),
            n_ctx,
            crate::Overflow::Error,
        );
        Cached::new(model, kv, 256)
    }
}

impl<'m, K: KvStore> Cached<'m, K> {
    pub fn new(model: &'m Model, kv: K, chunk: usize) -> Self {
        Cached {
            model,
            kv,
            n_past: 0,
            chunk: chunk.max(1),
        }
    }
}

impl<K: KvStore> Session for Cached<'_, K> {
    fn next_logits(&mut self, tokens: &[u32], n_new: usize) -> Result<Vec<f32>, ForwardError> {
        let start = tokens.len() - n_new;
        if start != self.n_past {
            return Err(ForwardError::Kv(ch04::KvError::Gap {
                seq: 0,
                have: self.n_past,
                start,
            }));
        }
        let mut logits = Vec::new();
        for (i, chunk) in tokens[start..].chunks(self.chunk).enumerate() {
            let pos = start + i * self.chunk;
            let last = pos + chunk.len() == tokens.len();
            let mut batch = Batch::sequence(0, chunk, pos, false);
            if !last {
                batch.logits.fill(false); // only the prompt's last token needs logits
            }
            logits = self.model.forward(&batch, &mut self.kv, &mut NoObserver)?;
            self.n_past = pos + chunk.len();
        }
        Ok(logits)
    }
}
// ANCHOR_END: session
