//! Where attention finds the keys and values of earlier positions.
//!
//! Every token's key and value vectors are stored by layer, sequence and position; a query
//! reads them back through a [`KvView`]. This chapter needs only the simplest store,
//! [`VecKv`], which grows as positions arrive and is thrown away after one pass over a sequence.
//! The traits are what later chapters build on: chapter 5 keeps a store across calls (the KV
//! cache) and adds a paged one; chapter 7 puts several sequences in one store and one batch.

use ch01::GgmlType;
use ch01::dequant::row_dequantizer;
use std::fmt;
use std::ops::Range;

// ANCHOR: rows
/// Stored rows of keys or values, as the store keeps them: plain f32 (every store of this
/// chapter), or encoded in a ggml type (F16, Q8_0: chapter 5's smaller caches) that a reader
/// decodes as it goes.
#[derive(Debug, Clone, Copy)]
pub enum KvRows<'a> {
    /// Rows of f32 values side by side.
    F32(&'a [f32]),
    /// Rows of `ty`, each `ty.row_bytes(width)` bytes, side by side.
    Encoded { ty: GgmlType, bytes: &'a [u8] },
}

impl<'a> KvRows<'a> {
    /// How many rows of `width` values this run holds.
    pub fn len(&self, width: usize) -> usize {
        match self {
            KvRows::F32(x) => x.len() / width.max(1),
            KvRows::Encoded { ty, bytes } => bytes.len() / row_bytes(*ty, width).max(1),
        }
    }

    /// `q · x`, where `x` is values `cols` of row `i` (rows `width` values wide): the score of
    /// a query against one head of a stored key. Encoded rows are decoded a piece at a time
    /// (no buffer the size of a row); `cols` must start and end on the type's block boundaries
    /// (a store checks that its heads do when it is made).
    pub fn dot(&self, width: usize, i: usize, cols: Range<usize>, q: &[f32]) -> f32 {
        match *self {
            KvRows::F32(x) => crate::matrix::dot(q, &x[i * width..][cols]),
            KvRows::Encoded { ty, bytes } => {
                let mut sum = 0.0;
                decode_pieces(ty, bytes, width, i, cols, |at, x| {
                    sum += crate::matrix::dot(&q[at..at + x.len()], x)
                });
                sum
            }
        }
    }

    /// `out += a · x`, `x` as in [`KvRows::dot`]: a weighted value added to a head's output.
    pub fn axpy(&self, width: usize, i: usize, cols: Range<usize>, a: f32, out: &mut [f32]) {
        let mut add = |at: usize, x: &[f32]| {
            for (o, x) in out[at..at + x.len()].iter_mut().zip(x) {
                *o += a * x;
            }
        };
        match *self {
            KvRows::F32(x) => add(0, &x[i * width..][cols]),
            KvRows::Encoded { ty, bytes } => decode_pieces(ty, bytes, width, i, cols, add),
        }
    }
}
// ANCHOR_END: rows

// ANCHOR: decode_pieces
/// Values per piece an encoded row is decoded in: a multiple of every block size a store
/// keeps (1 for F16, 32 for Q8_0), small enough for the stack.
const PIECE: usize = 32;

/// Call `f(offset, values)` for values `cols` of row `i` of encoded rows, [`PIECE`] at a time.
fn decode_pieces(
    ty: GgmlType,
    bytes: &[u8],
    width: usize,
    i: usize,
    cols: Range<usize>,
    mut f: impl FnMut(usize, &[f32]),
) {
    let decode = row_dequantizer(ty).unwrap_or_else(|| panic!("KV rows of {ty}: no decoder"));
    let row = &bytes[i * row_bytes(ty, width)..];
    let mut buf = [0.0f32; PIECE];
    let mut c = cols.start;
    while c < cols.end {
        let n = PIECE.min(cols.end - c);
        decode(&row[row_bytes(ty, c)..row_bytes(ty, c + n)], &mut buf[..n]);
        f(c - cols.start, &buf[..n]);
        c += n;
    }
}

/// Bytes of `n` values of `ty`: `n` must be whole blocks.
fn row_bytes(ty: GgmlType, n: usize) -> usize {
    ty.row_bytes(n as u64)
        .unwrap_or_else(|| panic!("{n} values are not whole {ty} blocks")) as usize
}
// ANCHOR_END: decode_pieces

// ANCHOR: traits
/// Read access to the stored keys and values of one layer of one sequence. `Sync`, so that
/// several threads may read one view at once (chapter 8 spreads attention over threads).
pub trait KvView: Sync {
    /// Keys of positions `pos..pos + k`, rows of `(n_head_kv, head_dim)` side by side, for
    /// some `1 <= k <= max` (`max >= 1`): as many as the store keeps side by side. A fast
    /// attention reads keys a run at a time instead of one call per position.
    fn key_run(&self, pos: usize, max: usize) -> KvRows<'_>;
    /// Values of positions `pos..pos + k`, `k` as [`KvView::key_run`] gives for the same
    /// arguments.
    fn value_run(&self, pos: usize, max: usize) -> KvRows<'_>;
    /// Key of position `pos`, all KV heads: `(n_head_kv, head_dim)` flattened.
    fn key(&self, pos: usize) -> KvRows<'_> {
        self.key_run(pos, 1)
    }
    /// Value of position `pos`, all KV heads: `(n_head_kv, head_dim)` flattened.
    fn value(&self, pos: usize) -> KvRows<'_> {
        self.value_run(pos, 1)
    }
    /// The first position still stored. Zero unless a store dropped old positions (chapter 5's
    /// sliding window).
    fn first(&self) -> usize {
        0
    }
}

/// A store of keys and values for any number of sequences and layers. `Sync`, as its views
/// are: chapter 8 reads several sequences' views from several threads at once.
pub trait KvStore: Sync {
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
pub trait KvDyn: Sync {
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
    fn key_run(&self, pos: usize, max: usize) -> KvRows<'_> {
        let end = (pos + max.max(1)).min(self.k.len() / self.kv_dim);
        KvRows::F32(&self.k[pos * self.kv_dim..end * self.kv_dim])
    }
    fn value_run(&self, pos: usize, max: usize) -> KvRows<'_> {
        let end = (pos + max.max(1)).min(self.v.len() / self.kv_dim);
        KvRows::F32(&self.v[pos * self.kv_dim..end * self.kv_dim])
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
