//! Where attention finds the keys and values of earlier positions.
//!
//! Every token's key and value vectors are stored by layer, sequence and position; a query
//! reads them back through a [`KvView`]. This chapter needs only the simplest store,
//! [`VecKv`], which grows as positions arrive and is thrown away after one pass over a sequence.
//! The traits are what later chapters build on: chapter 5 keeps a store across calls (the KV
//! cache) and adds a paged one; chapter 7 puts several sequences in one store and one batch.

use std::fmt;
use std::ops::Range;

// ANCHOR: traits
/// Read access to the stored keys and values of one layer of one sequence. `Sync`, so that
/// several threads may read one view at once (chapter 8 spreads attention over threads).
pub trait KvView: Sync {
    /// Key of position `pos`, all KV heads: `(n_head_kv, head_dim)` flattened.
    fn key(&self, pos: usize) -> &[f32];
    /// Value of position `pos`, all KV heads: `(n_head_kv, head_dim)` flattened.
    fn value(&self, pos: usize) -> &[f32];
    /// The first position still stored. Zero unless a store dropped old positions (chapter 5's
    /// sliding window).
    fn first(&self) -> usize {
        0
    }
    /// Keys of positions `pos..pos + k` as one slice `(k, n_head_kv * head_dim)`, for some
    /// `1 <= k <= max` (`max >= 1`): as many as the store keeps side by side. A fast attention
    /// reads keys a run at a time instead of one call per position; by default a run is one
    /// position.
    fn key_run(&self, pos: usize, max: usize) -> &[f32] {
        let _ = max;
        self.key(pos)
    }
    /// Values of positions `pos..pos + k`, `k` as [`KvView::key_run`] gives for the same
    /// arguments.
    fn value_run(&self, pos: usize, max: usize) -> &[f32] {
        let _ = max;
        self.value(pos)
    }
}

/// A store of keys and values for any number of sequences and layers.
pub trait KvStore {
    type View<'a>: KvView
    where
        Self: 'a;
    /// Make room for `positions` of sequence `seq`. A forward pass calls this for every sequence
    /// before it computes anything, so a full store fails fast and nothing is left half-written.
    fn reserve(&mut self, seq: usize, positions: Range<usize>) -> Result<(), KvError>;
    /// Store the key and value (each `(n_head_kv, head_dim)` flattened) of `pos`.
    fn store(&mut self, layer: usize, seq: usize, pos: usize, k: &[f32], v: &[f32]);
    /// Read access to `seq` at `layer`.
    fn view(&self, layer: usize, seq: usize) -> Self::View<'_>;
}
// ANCHOR_END: traits

/// [`KvStore`] as a trait object: `store` and a view lent to a callback instead of returned (a
/// view's type differs per store). Every `KvStore` is one. Attention's steps take the store
/// this way, so that code behind a trait object — a model's blocks, whose methods cannot be
/// generic over the store — can pass whichever store it is given.
pub trait KvDyn {
    /// [`KvStore::store`].
    fn store_kv(&mut self, layer: usize, seq: usize, pos: usize, k: &[f32], v: &[f32]);
    /// Call `f` with [`KvStore::view`] of `seq` at `layer`.
    fn with_view(&self, layer: usize, seq: usize, f: &mut dyn FnMut(&dyn KvView));
}

impl<K: KvStore> KvDyn for K {
    fn store_kv(&mut self, layer: usize, seq: usize, pos: usize, k: &[f32], v: &[f32]) {
        self.store(layer, seq, pos, k, v);
    }
    fn with_view(&self, layer: usize, seq: usize, f: &mut dyn FnMut(&dyn KvView)) {
        f(&self.view(layer, seq));
    }
}

/// Why a store could not take more positions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvError {
    /// The store is full: `needed` positions for sequence `seq`, room for `capacity`.
    Full {
        seq: usize,
        needed: usize,
        capacity: usize,
    },
    /// Positions must arrive in order: `seq` holds `have`, the batch starts at `start`.
    Gap {
        seq: usize,
        have: usize,
        start: usize,
    },
    /// Anything else a store rejects.
    Other(String),
}

impl fmt::Display for KvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KvError::Full {
                seq,
                needed,
                capacity,
            } => write!(
                f,
                "the KV cache is full: sequence {seq} needs {needed} positions, it holds {capacity}"
            ),
            KvError::Gap { seq, have, start } => write!(
                f,
                "sequence {seq} holds positions 0..{have}, but the batch starts at position {start}"
            ),
            KvError::Other(msg) => f.write_str(msg),
        }
    }
}

impl std::error::Error for KvError {}

/// The simplest store: one growable buffer per layer and sequence.
pub struct VecKv {
    n_layer: usize,
    kv_dim: usize,           // n_head_kv * head_dim
    seqs: Vec<Vec<LayerKv>>, // [seq][layer]
}

#[derive(Clone, Default)]
struct LayerKv {
    k: Vec<f32>, // (n_pos, kv_dim)
    v: Vec<f32>, // (n_pos, kv_dim)
}

impl VecKv {
    pub fn new(n_layer: usize, kv_dim: usize) -> VecKv {
        VecKv {
            n_layer,
            kv_dim,
            seqs: Vec::new(),
        }
    }

    /// Positions stored for `seq`.
    pub fn len(&self, seq: usize) -> usize {
        self.seqs.get(seq).map_or(0, |l| l[0].k.len() / self.kv_dim)
    }
}

/// A view of one layer of one sequence of a [`VecKv`].
pub struct VecKvView<'a> {
    k: &'a [f32], // (n_pos, kv_dim)
    v: &'a [f32], // (n_pos, kv_dim)
    kv_dim: usize,
}

impl KvView for VecKvView<'_> {
    fn key(&self, pos: usize) -> &[f32] {
        &self.k[pos * self.kv_dim..(pos + 1) * self.kv_dim]
    }
    fn value(&self, pos: usize) -> &[f32] {
        &self.v[pos * self.kv_dim..(pos + 1) * self.kv_dim]
    }
    fn key_run(&self, pos: usize, max: usize) -> &[f32] {
        let end = (pos + max).min(self.k.len() / self.kv_dim);
        &self.k[pos * self.kv_dim..end * self.kv_dim]
    }
    fn value_run(&self, pos: usize, max: usize) -> &[f32] {
        let end = (pos + max).min(self.v.len() / self.kv_dim);
        &self.v[pos * self.kv_dim..end * self.kv_dim]
    }
}

impl KvStore for VecKv {
    type View<'a> = VecKvView<'a>;

    fn reserve(&mut self, seq: usize, positions: Range<usize>) -> Result<(), KvError> {
        let have = self.len(seq);
        if positions.start > have {
            return Err(KvError::Gap {
                seq,
                have,
                start: positions.start,
            });
        }
        if self.seqs.len() <= seq {
            self.seqs
                .resize(seq + 1, vec![LayerKv::default(); self.n_layer]);
        }
        let n = positions.end.max(have) * self.kv_dim;
        for layer in &mut self.seqs[seq] {
            layer.k.resize(n, 0.0);
            layer.v.resize(n, 0.0);
        }
        Ok(())
    }

    fn store(&mut self, layer: usize, seq: usize, pos: usize, k: &[f32], v: &[f32]) {
        let d = self.kv_dim;
        let l = &mut self.seqs[seq][layer];
        l.k[pos * d..(pos + 1) * d].copy_from_slice(k);
        l.v[pos * d..(pos + 1) * d].copy_from_slice(v);
    }

    fn view(&self, layer: usize, seq: usize) -> VecKvView<'_> {
        let l = &self.seqs[seq][layer];
        VecKvView {
            k: &l.k,
            v: &l.v,
            kv_dim: self.kv_dim,
        }
    }
}
