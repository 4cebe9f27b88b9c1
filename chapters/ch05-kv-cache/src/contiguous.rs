//! A contiguous KV cache: one preallocated buffer of keys and one of values, holding every
//! layer of one sequence.
//!
//! Memory per token: 2 (K and V) × n_layer × n_head_kv × head_dim × 4 bytes. For SmolLM2-135M:
//! 2 × 30 × 3 × 64 × 4 = 46,080 bytes, so its full 8,192-token context takes 377 MB. Grouped-
//! query attention is why that is affordable: with one KV head per query head (9 instead of 3) it
//! would be three times as much. Kept in f16 ([`CacheTypes::F16`], llama.cpp's default) it
//! is half that.

use crate::rows::{CacheTypes, RowBuf, kv_buffers};
use ch03::kv::{KvError, KvRows, KvStore, KvView};

/// What happens when the cache is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overflow {
    /// Refuse the batch with [`KvError::Full`]; the cache is left unchanged. The default.
    Error,
    /// Keep only the newest `capacity` positions, overwriting the oldest (a ring buffer). The
    /// model then sees a window of recent tokens and forgets the rest — including the start of
    /// the prompt, which attention tends to lean on ("attention sinks"), so quality drops once
    /// the window starts sliding. Positions keep counting up, so RoPE stays consistent.
    SlidingWindow,
}

// ANCHOR: contiguous
/// Keys and values of one sequence, in preallocated buffers.
pub struct ContiguousCache {
    n_layer: usize,
    kv_dim: usize,   // n_head_kv * head_dim
    capacity: usize, // positions the buffers hold
    overflow: Overflow,
    types: CacheTypes,
    k: RowBuf,  // (n_layer, capacity, kv_dim) in types.k
    v: RowBuf,  // (n_layer, capacity, kv_dim) in types.v
    len: usize, // positions stored so far (the next position to write)
}
// ANCHOR_END: contiguous

impl ContiguousCache {
    /// A cache shaped for `model` (its layers, its key and value width) holding `n_ctx`
    /// positions, refusing to overflow: what sessions and benches of a whole model use.
    pub fn for_model(model: &ch04::Model, n_ctx: usize) -> ContiguousCache {
        ContiguousCache::new(
            model.config.n_layer,
            model.attention.kv_dim(),
            n_ctx,
            Overflow::Error,
        )
    }

    /// A cache of `capacity` positions of `n_layer` layers of keys and values `kv_dim` wide.
    ///
    /// # Panics
    /// If the size overflows or exceeds the machine's memory: sizes from a file or a flag go
    /// through [`ContiguousCache::try_new`] (or `Model::set_context`) first.
    pub fn new(
        n_layer: usize,
        kv_dim: usize,
        capacity: usize,
        overflow: Overflow,
    ) -> ContiguousCache {
        Self::try_new(n_layer, kv_dim, capacity, overflow).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`ContiguousCache::new`], with the size checked (for overflow and against the
    /// machine's memory) before anything is allocated.
    pub fn try_new(
        n_layer: usize,
        kv_dim: usize,
        capacity: usize,
        overflow: Overflow,
    ) -> Result<ContiguousCache, KvError> {
        Self::try_typed(n_layer, kv_dim, capacity, overflow, CacheTypes::F32)
    }

    // ANCHOR: contiguous_new
    /// [`ContiguousCache::try_new`] keeping keys and values in `types`.
    pub fn try_typed(
        n_layer: usize,
        kv_dim: usize,
        capacity: usize,
        overflow: Overflow,
        types: CacheTypes,
    ) -> Result<ContiguousCache, KvError> {
        let (k, v) = kv_buffers(
            &format!("a KV cache of {capacity} positions"),
            &[("layers", n_layer), ("positions", capacity)],
            kv_dim,
            types,
            false,
        )?;
        Ok(ContiguousCache {
            n_layer,
            kv_dim,
            capacity,
            overflow,
            types,
            k,
            v,
            len: 0,
        })
    }
    // ANCHOR_END: contiguous_new

    /// A cache for `model` holding `n_ctx` positions in `types`, refusing to overflow; an
    /// error if the types cannot hold the model's heads or the size does not fit.
    pub fn for_model_typed(
        model: &ch04::Model,
        n_ctx: usize,
        types: CacheTypes,
    ) -> Result<ContiguousCache, KvError> {
        types.check_head_dim(model.attention.head_dim)?;
        Self::try_typed(
            model.config.n_layer,
            model.attention.kv_dim(),
            n_ctx,
            Overflow::Error,
            types,
        )
    }

    /// The types keys and values are kept in.
    pub fn types(&self) -> CacheTypes {
        self.types
    }

    /// Positions stored (or, with a sliding window, seen) so far.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes held by the buffers.
    pub fn bytes(&self) -> usize {
        self.k.bytes() + self.v.bytes()
    }

    /// Forget everything (keeps the buffers).
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Forget positions from `pos` on, e.g. to regenerate from there.
    pub fn truncate(&mut self, pos: usize) {
        self.len = self.len.min(pos);
    }

    // ANCHOR: slot
    /// The row of `pos` in `layer`.
    fn slot(&self, layer: usize, pos: usize) -> usize {
        // ANCHOR: yours_slot
        layer * self.capacity + pos % self.capacity
        // ANCHOR_END: yours_slot
    }
    // ANCHOR_END: slot
}

/// A view of one layer.
pub struct ContiguousView<'a> {
    cache: &'a ContiguousCache,
    layer: usize,
}

impl KvView for ContiguousView<'_> {
    fn first(&self) -> usize {
        self.cache.len.saturating_sub(self.cache.capacity)
    }
    fn key_run(&self, pos: usize, max: usize) -> KvRows<'_> {
        let (s, k) = self.run(pos, max);
        self.cache.k.run(s, k, self.cache.kv_dim)
    }
    fn value_run(&self, pos: usize, max: usize) -> KvRows<'_> {
        let (s, k) = self.run(pos, max);
        self.cache.v.run(s, k, self.cache.kv_dim)
    }
}

impl ContiguousView<'_> {
    /// Where the run of positions from `pos` starts, and its length: up to `max` positions,
    /// but not past the end of the ring (a sliding window wraps around).
    fn run(&self, pos: usize, max: usize) -> (usize, usize) {
        let c = self.cache;
        let k = max.min(c.capacity - pos % c.capacity).max(1);
        (c.slot(self.layer, pos), k)
    }
}

// ANCHOR: contiguous_store
impl KvStore for ContiguousCache {
    type View<'a> = ContiguousView<'a>;

    fn reserve(&mut self, seq: usize, positions: std::ops::Range<usize>) -> Result<(), KvError> {
        if seq != 0 {
            return Err(KvError::Other(format!(
                "a contiguous cache holds one sequence (0), not sequence {seq}"
            )));
        }
        if positions.start > self.len {
            return Err(KvError::Gap {
                seq,
                have: self.len,
                start: positions.start,
            });
        }
        let n_new = positions.len();
        match self.overflow {
            Overflow::Error if positions.end > self.capacity => {
                return Err(KvError::Full {
                    seq,
                    needed: positions.end,
                    capacity: self.capacity,
                });
            }
            // A batch larger than the ring would overwrite its own first tokens' context.
            Overflow::SlidingWindow if n_new > self.capacity => {
                return Err(KvError::Full {
                    seq,
                    needed: n_new,
                    capacity: self.capacity,
                });
            }
            _ => {}
        }
        self.len = positions.end.max(self.len);
        Ok(())
    }

    fn store(&mut self, layer: usize, _seq: usize, pos: usize, k: &[f32], v: &[f32]) {
        debug_assert!(layer < self.n_layer);
        let s = self.slot(layer, pos);
        self.k.write(s, k);
        self.v.write(s, v);
    }

    fn view(&self, layer: usize, _seq: usize) -> ContiguousView<'_> {
        ContiguousView { cache: self, layer }
    }
}
// ANCHOR_END: contiguous_store
