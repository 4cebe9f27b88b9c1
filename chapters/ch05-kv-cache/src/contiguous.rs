//! A contiguous KV cache: one preallocated buffer per layer, for one sequence.
//!
//! Memory per token: 2 (K and V) × n_layer × n_head_kv × head_dim × 4 bytes. For SmolLM2-135M:
//! 2 × 30 × 3 × 64 × 4 = 46,080 bytes, so its full 8,192-token context takes 377 MB. Grouped-
//! query attention is why that is affordable: with one KV head per query head (9 instead of 3) it
//! would be three times as much.

use crate::kv_floats;
use ch04::ch03::kv::{KvError, KvStore, KvView};

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
    k: Vec<f32>, // (n_layer, capacity, kv_dim)
    v: Vec<f32>, // (n_layer, capacity, kv_dim)
    len: usize,  // positions stored so far (the next position to write)
}

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
        let n = kv_floats(
            &format!("a KV cache of {capacity} positions"),
            &[
                ("layers", n_layer),
                ("positions", capacity),
                ("kv width", kv_dim),
            ],
        )?;
        Ok(ContiguousCache {
            n_layer,
            kv_dim,
            capacity,
            overflow,
            k: vec![0.0; n],
            v: vec![0.0; n],
            len: 0,
        })
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
        2 * self.k.len() * size_of::<f32>()
    }

    /// Forget everything (keeps the buffers).
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Forget positions from `pos` on, e.g. to regenerate from there.
    pub fn truncate(&mut self, pos: usize) {
        self.len = self.len.min(pos);
    }

    fn slot(&self, layer: usize, pos: usize) -> usize {
        // ANCHOR: yours_slot
        (layer * self.capacity + pos % self.capacity) * self.kv_dim
        // ANCHOR_END: yours_slot
    }
}
// ANCHOR_END: contiguous

/// A view of one layer.
pub struct ContiguousView<'a> {
    cache: &'a ContiguousCache,
    layer: usize,
}

impl KvView for ContiguousView<'_> {
    fn key(&self, pos: usize) -> &[f32] {
        let s = self.cache.slot(self.layer, pos);
        &self.cache.k[s..s + self.cache.kv_dim]
    }
    fn value(&self, pos: usize) -> &[f32] {
        let s = self.cache.slot(self.layer, pos);
        &self.cache.v[s..s + self.cache.kv_dim]
    }
    fn first(&self) -> usize {
        self.cache.len.saturating_sub(self.cache.capacity)
    }
    fn key_run(&self, pos: usize, max: usize) -> &[f32] {
        let (s, k) = self.run(pos, max);
        &self.cache.k[s..s + k * self.cache.kv_dim]
    }
    fn value_run(&self, pos: usize, max: usize) -> &[f32] {
        let (s, k) = self.run(pos, max);
        &self.cache.v[s..s + k * self.cache.kv_dim]
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
        self.k[s..s + self.kv_dim].copy_from_slice(k);
        self.v[s..s + self.kv_dim].copy_from_slice(v);
    }

    fn view(&self, layer: usize, _seq: usize) -> ContiguousView<'_> {
        ContiguousView { cache: self, layer }
    }
}
