//! Generation with a KV cache: each step runs the model on the new tokens only.

use ch03::{KvStore, NoObserver};
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
        self.last_logits(tokens, n_new, 1)
    }
}

// ANCHOR_END: session

// ANCHOR: last_logits
impl<K: KvStore> Cached<'_, K> {
    /// Logits `(n_rows, vocab)` of the last `n_rows` of `tokens`, each row predicting the token
    /// after its own: [`Session::next_logits`] is the case `n_rows == 1`. The last `n_new` of
    /// `tokens` are new (`1 <= n_rows <= n_new`, and `n_rows <= chunk`, so that the rows are
    /// computed in one batch). Several rows give the prediction after each of several new
    /// tokens from one pass over the weights.
    pub fn last_logits(
        &mut self,
        tokens: &[u32],
        n_new: usize,
        n_rows: usize,
    ) -> Result<&[f32], ForwardError> {
        assert!(
            (1..=n_new.min(self.chunk)).contains(&n_rows) && n_new <= tokens.len(),
            "last_logits: {n_rows} rows of {n_new} new tokens (chunk {})",
            self.chunk
        );
        let (start, end) = (tokens.len() - n_new, tokens.len());
        if start != self.n_past {
            return Err(ForwardError::Kv(ch03::KvError::Gap {
                seq: 0,
                have: self.n_past,
                start,
            }));
        }
        let rows_from = end - n_rows; // the first token whose logits are wanted
        let mut pos = start;
        while pos < end {
            let mut n = (end - pos).min(self.chunk);
            // A chunk that would split the rows stops before them: they go in one batch.
            if pos < rows_from && pos + n > rows_from && pos + n < end {
                n = rows_from - pos;
            }
            self.batch.clear();
            for (i, &t) in tokens[pos..pos + n].iter().enumerate() {
                self.batch.push(t, 0, pos + i, pos + i >= rows_from);
            }
            self.model.forward_with(
                &self.batch,
                &mut self.kv,
                &mut NoObserver,
                &mut self.scratch,
            )?;
            self.n_past = pos + n;
            pos += n;
        }
        Ok(&self.scratch.logits)
    }
}
// ANCHOR_END: last_logits

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

impl Cached<'_, crate::ContiguousCache> {
    /// Forget the positions from `n` on: the next call continues from position `n`, writing
    /// over what was there (tokens that turned out not to follow, say). The cache must not be
    /// a sliding window that has wrapped around, which no longer holds the positions before.
    pub fn rewind(&mut self, n: usize) {
        self.kv.truncate(n);
        self.n_past = self.n_past.min(n);
    }
}

impl<K: KvStore> Cached<'_, K> {
    /// The logits of the last call.
    pub fn logits(&self) -> &[f32] {
        &self.scratch.logits
    }
}
