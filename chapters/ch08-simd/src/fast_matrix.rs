//! The fast matrix: chapter 6's quantized rows, products split across threads, SIMD kernels,
//! and a packed layout with a tiled micro-kernel where there is one.
//!
//! [`FastMatrix`] implements chapter 3's `Matrix` trait, so the model and its forward pass do
//! not change: [`FastLoader`] makes one from each tensor, as chapter 6's `QuantLoader` made a
//! `QMatrix`. A product `out = x Wᵀ`
//! 1. quantizes the activation rows once, into the weight type's `vec_dot_type`, with the
//!    kernel set's `quantize_act` (tokens split across threads when there are several);
//! 2. splits the weight rows into tasks that the pool's threads take in turn; each task
//!    computes its rows for every token, so each weight row is read from memory once per
//!    product, whatever the number of tokens.
//!
//! Products that share an input (chapter 3's `Matrix::matmul_fused`: a layer's Q, K and V, its
//! gate and up) are one such product when the matrices take the same activation type: the
//! input quantized once, all their row groups in one parallel job.
//!
//! Rows are stored in one of two ways. [`Store::Packed`]: 16 rows interleaved for the
//! micro-kernels of [`crate::gemm`] (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K and Q6_K, on CPUs with
//! AVX-512 VNNI).
//! [`Store::Rows`]: the file's own rows, kept in any `S: AsRef<[u8]>` (a memory map in chapter
//! 10), multiplied with the kernel set's `vec_dot` one row and one token at a time, tokens in
//! tiles so a weight row is used for several tokens while it is in L1.

use crate::gemm::{ActPanels, GROUP, OutPtr, PackedMatrix, block_size, pack_checked};
use crate::kernels::{KernelSet, TypeKernels};
use crate::pool::Parallel;
use ch01::{GgmlType, Gguf, TensorInfo};
use ch03::matrix::{LoadError, Matrix, MatrixLoader, matrix_dims};
use ch06::qmatrix::QMatrix;
use ch06::quants::VecDot;
use ch06::quants::type_traits;
use std::cell::RefCell;
use std::sync::Arc;

/// Tasks per thread a product is cut into. More than one, so a thread that was descheduled
/// for a moment (the machine is shared) leaves its remaining tasks to the others; not many
/// more, because each task starts a new stream of weights that the memory system must find
/// first. Measured by timing decode steps on the default model, 2 threads, rounds of
/// each build in turn: 2 rather than 4 made a 16-token prompt chunk 6 % cheaper and an
/// 88-token prompt 5 %, with no change at 8B.
const TASKS_PER_THREAD: usize = 2;
/// Tokens whose activation rows one thread quantizes in one task.
const QUANT_CHUNK: usize = 8;
/// Tokens the row-at-a-time path computes per weight row while the row is in L1.
const ROW_TILE: usize = 16;
/// The most matrices one fused product takes (a layer's Q, K and V are three).
const MAX_FUSED: usize = 4;

/// How a [`FastMatrix`] keeps its weights.
pub enum Store<S> {
    /// The file's rows of blocks.
    Rows(QMatrix<S>),
    /// Interleaved rows for the micro-kernel (a copy: the file's bytes are not kept).
    Packed(PackedMatrix),
}

/// A quantized weight matrix whose products run on a kernel set and a thread pool.
pub struct FastMatrix<S = Vec<u8>> {
    pub store: Store<S>,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub kernels: TypeKernels,
    pub pool: Arc<dyn Parallel>,
}

/// Where threads write their own, disjoint parts of a buffer.
#[derive(Clone, Copy)]
struct SharedMut<T>(*mut T);
// SAFETY: a `SharedMut` is only a pointer, used for writes to disjoint indices of a buffer
// that outlives the pool job; each write is an unsafe block that says why its index is its own.
// Values of a `Send` type may be written from another thread.
unsafe impl<T: Send> Send for SharedMut<T> {}
// SAFETY: as for `Send`: the threads sharing it write disjoint indices.
unsafe impl<T: Send> Sync for SharedMut<T> {}

impl<T> SharedMut<T> {
    /// The pointer. (A method, so that a closure captures the whole `Sync` wrapper rather
    /// than its raw-pointer field.)
    fn ptr(&self) -> *mut T {
        self.0
    }
}

thread_local! {
    /// Scratch for the activations of a product, reused from call to call.
    static PANELS: RefCell<ActPanels> = RefCell::new(ActPanels::new());
    static ACTS: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// One token's quantized row, for whichever thread quantizes it.
    static ROW: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl<S: AsRef<[u8]> + Send + Sync + 'static> FastMatrix<S> {
    /// Wrap `q`, packing its rows when `pack` is set and its type and the CPU allow it.
    pub fn new(
        name: &str,
        q: QMatrix<S>,
        kernels: &KernelSet,
        pool: Arc<dyn Parallel>,
        pack: bool,
    ) -> Result<FastMatrix<S>, LoadError> {
        let k = kernels.get(q.ty).ok_or_else(|| {
            LoadError::Other(format!(
                "tensor {name:?}: type {} has no kernels",
                q.ty.name()
            ))
        })?;
        let (ty, rows, cols) = (q.ty, q.rows, q.cols);
        // The micro-kernel uses the kernel set's activation quantizer: only with a set that
        // has the instruction set the micro-kernel needs.
        let packed = if pack && packs(kernels) {
            pack_checked(name, &q)?
        } else {
            None
        };
        let store = match packed {
            Some(p) => Store::Packed(p),
            None => Store::Rows(q),
        };
        Ok(FastMatrix {
            store,
            ty,
            rows,
            cols,
            kernels: k,
            pool,
        })
    }

    fn n_tasks(&self, units: usize) -> usize {
        units.min(self.pool.threads() * TASKS_PER_THREAD).max(1)
    }

    /// The range of `units` that task `i` of `n` takes.
    fn task_range(units: usize, n: usize, i: usize) -> std::ops::Range<usize> {
        (units * i / n)..(units * (i + 1) / n)
    }

    /// The units (row groups) that task `i` of `n` takes of parts of `units` units each, as
    /// `(part, range of its units)`: the parts' units side by side, cut into `n` even ranges.
    fn part_ranges(
        units: &[usize],
        n: usize,
        i: usize,
    ) -> impl Iterator<Item = (usize, std::ops::Range<usize>)> {
        let r = Self::task_range(units.iter().sum(), n, i);
        let mut base = 0;
        units.iter().enumerate().filter_map(move |(part, &u)| {
            let (lo, hi) = (r.start.max(base), r.end.min(base + u));
            let at = base;
            base += u;
            (lo < hi).then(|| (part, lo - at..hi - at))
        })
    }

    // ANCHOR: matmul_packed
    /// `out = x Wᵀ` for every part `(W, out)` — one matrix, or several that share the input
    /// `x` and its activation type (a layer's Q, K and V): the activations are quantized once,
    /// and every part's row groups are one parallel job.
    fn matmul_packed(&self, parts: &[(&PackedMatrix, OutPtr)], x: &[f32]) {
        let n = x.len() / self.cols;
        let k = &self.kernels;
        PANELS.with_borrow_mut(|acts| {
            // 1. Quantize the activations, tokens spread over the threads.
            acts.resize(n, self.cols, block_size(k.act_ty));
            if n < 2 * QUANT_CHUNK || self.pool.threads() == 1 {
                acts.fill(k, x, self.cols);
            } else {
                let w = acts.writer();
                let cols = self.cols;
                self.pool.run(n.div_ceil(QUANT_CHUNK), &|i| {
                    ROW.with_borrow_mut(|row| {
                        for t in i * QUANT_CHUNK..((i + 1) * QUANT_CHUNK).min(n) {
                            // SAFETY: each token is quantized by one task; the panels are
                            // borrowed, not resized, for the whole call.
                            unsafe { w.quantize_token(k, &x[t * cols..(t + 1) * cols], t, row) };
                        }
                    })
                });
            }
            // 2. Each task computes a range of the parts' row groups for all tokens.
            let mut units = [0; MAX_FUSED];
            for (u, (p, _)) in units.iter_mut().zip(parts) {
                *u = p.groups;
            }
            let units = &units[..parts.len()];
            let tasks = self.n_tasks(units.iter().sum());
            let acts = &*acts;
            self.pool.run(tasks, &|i| {
                for (part, groups) in Self::part_ranges(units, tasks, i) {
                    let (p, dst) = parts[part];
                    // SAFETY: each part's `out` holds (n, rows) floats (checked by the
                    // caller, `checked_n`); tasks take disjoint ranges of each part's groups.
                    unsafe { p.gemm_groups(acts, groups, dst) };
                }
            });
        });
    }
    // ANCHOR_END: matmul_packed

    /// As [`FastMatrix::matmul_packed`], for rows kept as the file's blocks: each part is
    /// multiplied with its own `vec_dot`.
    fn matmul_rows(&self, parts: &[(&QMatrix<S>, VecDot, SharedMut<f32>)], x: &[f32]) {
        let n = x.len() / self.cols;
        let k = &self.kernels;
        let arb = parts[0].0.act_row_bytes();
        ACTS.with_borrow_mut(|acts| {
            acts.resize(n * arb, 0);
            if n < 2 * QUANT_CHUNK || self.pool.threads() == 1 {
                for (xr, qr) in x.chunks_exact(self.cols).zip(acts.chunks_exact_mut(arb)) {
                    (k.quantize_act)(xr, qr);
                }
            } else {
                let a = SharedMut(acts.as_mut_ptr());
                let cols = self.cols;
                self.pool.run(n.div_ceil(QUANT_CHUNK), &|i| {
                    for t in i * QUANT_CHUNK..((i + 1) * QUANT_CHUNK).min(n) {
                        // SAFETY: token t < n's `arb` bytes at `t · arb` are inside `acts`
                        // (`n · arb` bytes) and written by this task only.
                        let qr =
                            unsafe { std::slice::from_raw_parts_mut(a.ptr().add(t * arb), arb) };
                        (k.quantize_act)(&x[t * cols..(t + 1) * cols], qr);
                    }
                });
            }
            let acts = &acts[..];
            let mut units = [0; MAX_FUSED];
            for (u, (q, _, _)) in units.iter_mut().zip(parts) {
                *u = q.rows.div_ceil(GROUP);
            }
            let units = &units[..parts.len()];
            let tasks = self.n_tasks(units.iter().sum());
            self.pool.run(tasks, &|i| {
                for (part, r) in Self::part_ranges(units, tasks, i) {
                    let (q, vec_dot, dst) = &parts[part];
                    let (rows, cols) = (q.rows, q.cols);
                    let r = r.start * GROUP..(r.end * GROUP).min(rows);
                    for t0 in (0..n).step_by(ROW_TILE) {
                        let t1 = (t0 + ROW_TILE).min(n);
                        for row in r.clone() {
                            let w = q.row(row);
                            for t in t0..t1 {
                                let y = vec_dot(cols, w, &acts[t * arb..(t + 1) * arb]);
                                // SAFETY: `t < n` and `row < rows`, and the part's `out`
                                // holds `n · rows` floats (checked by the caller,
                                // `checked_n`); only this task writes `row`.
                                unsafe { *dst.ptr().add(t * rows + row) = y };
                            }
                        }
                    }
                }
            });
        });
    }

    /// The number of tokens of `x`, after checking that `x` and `out` fit this matrix and that
    /// its store is the shape its public fields say: the products write `out` through raw
    /// pointers sized by the store's own shape.
    fn checked_n(&self, x: &[f32], out: &[f32]) -> usize {
        let n = x.len() / self.cols;
        assert!(
            x.len() == n * self.cols && out.len() == n * self.rows,
            "matmul: x has {} values, out {}, for a ({}, {}) matrix",
            x.len(),
            out.len(),
            self.rows,
            self.cols
        );
        let shape = match &self.store {
            Store::Packed(p) => (p.rows, p.cols),
            Store::Rows(q) => (q.rows, q.cols),
        };
        assert_eq!(
            shape,
            (self.rows, self.cols),
            "matmul: the matrix's rows are stored as {shape:?}, not ({}, {})",
            self.rows,
            self.cols
        );
        n
    }

    /// `other` as a fast matrix that can share a product's input with this one (the same
    /// input width, the same activation quantizer, rows stored the same way, the same pool),
    /// or `None`.
    pub fn sharing_input<'a>(&self, other: &'a dyn Matrix) -> Option<&'a FastMatrix<S>> {
        let o = other.as_any()?.downcast_ref::<FastMatrix<S>>()?;
        let shares = self.cols == o.cols
            && self.kernels.act_ty == o.kernels.act_ty
            && self.kernels.act_isa == o.kernels.act_isa
            && Arc::ptr_eq(&self.pool, &o.pool)
            && matches!(
                (&self.store, &o.store),
                (Store::Packed(_), Store::Packed(_)) | (Store::Rows(_), Store::Rows(_))
            );
        shares.then_some(o)
    }
}

/// Whether matrices are packed for the micro-kernel with this kernel set.
pub fn packs(kernels: &KernelSet) -> bool {
    kernels.isa == crate::kernels::Isa::Avx512Vnni && crate::gemm::vnni_available()
}

impl<S: AsRef<[u8]> + Send + Sync + 'static> Matrix for FastMatrix<S> {
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
    fn matmul(&self, x: &[f32], out: &mut [f32]) {
        if self.checked_n(x, out) == 0 {
            return;
        }
        match &self.store {
            Store::Packed(p) => self.matmul_packed(&[(p, OutPtr(out.as_mut_ptr()))], x),
            Store::Rows(q) => {
                let part = (q, self.kernels.vec_dot, SharedMut(out.as_mut_ptr()));
                self.matmul_rows(&[part], x)
            }
        }
    }
    // ANCHOR: matmul_fused
    /// One product for all of `self` and `others` when they are fast matrices that share the
    /// input's quantization ([`FastMatrix::sharing_input`]); otherwise each its own product.
    fn matmul_fused(&self, others: &[&dyn Matrix], x: &[f32], outs: &mut [&mut [f32]]) {
        assert_eq!(
            outs.len(),
            others.len() + 1,
            "matmul_fused: one output per matrix"
        );
        // All the matrices, if every one of `others` can share the input with this one.
        let mut ms = [self; MAX_FUSED];
        let fused = others.len() < MAX_FUSED
            && others
                .iter()
                .zip(&mut ms[1..])
                .all(|(&o, m)| self.sharing_input(o).map(|f| *m = f).is_some());
        if !fused {
            self.matmul(x, outs[0]);
            for (w, out) in others.iter().zip(&mut outs[1..]) {
                w.matmul(x, out);
            }
            return;
        }
        let ms = &ms[..outs.len()];
        let mut n = 0;
        for (m, out) in ms.iter().zip(outs.iter()) {
            n = m.checked_n(x, out);
        }
        if n == 0 {
            return;
        }
        let outs = outs.iter_mut().map(|o| o.as_mut_ptr());
        match &self.store {
            Store::Packed(p) => {
                let mut parts = [(p, OutPtr(std::ptr::null_mut())); MAX_FUSED];
                for ((part, m), out) in parts.iter_mut().zip(ms).zip(outs) {
                    let Store::Packed(p) = &m.store else {
                        unreachable!("sharing_input: every part is packed")
                    };
                    *part = (p, OutPtr(out));
                }
                self.matmul_packed(&parts[..ms.len()], x);
            }
            Store::Rows(q) => {
                let mut parts =
                    [(q, self.kernels.vec_dot, SharedMut(std::ptr::null_mut())); MAX_FUSED];
                for ((part, m), out) in parts.iter_mut().zip(ms).zip(outs) {
                    let Store::Rows(q) = &m.store else {
                        unreachable!("sharing_input: every part is rows")
                    };
                    *part = (q, m.kernels.vec_dot, SharedMut(out));
                }
                self.matmul_rows(&parts[..ms.len()], x);
            }
        }
    }
    // ANCHOR_END: matmul_fused
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
    fn get_row(&self, r: usize, out: &mut [f32]) {
        match &self.store {
            Store::Rows(q) => q.get_row(r, out),
            Store::Packed(p) => {
                let t = type_traits(self.ty).expect("packed types have traits");
                ROW.with_borrow_mut(|row| {
                    row.resize(self.cols / t.block_size * t.type_size, 0);
                    p.row_blocks(r, row);
                    (t.to_float)(row, out);
                });
            }
        }
    }
    fn describe(&self) -> String {
        // The pool is the loader's, the same for every matrix: see `FastLoader::describe`.
        match self.store {
            Store::Packed(_) => format!("{} packed ×16 (avx512vnni micro-kernel)", self.ty.name()),
            Store::Rows(_) => format!("{} rows ({} vec_dot)", self.ty.name(), self.kernels.isa),
        }
    }
}

// ANCHOR: loader
/// Makes a [`FastMatrix`] of every tensor: the kernel set, the pool its products run on, and
/// whether to pack rows for the micro-kernel.
#[derive(Clone)]
pub struct FastLoader {
    pub kernels: KernelSet,
    pub pool: Arc<dyn Parallel>,
    pub pack: bool,
}

impl FastLoader {
    /// The best kernels for this CPU, packing on, products on `pool`.
    pub fn new(pool: Arc<dyn Parallel>) -> FastLoader {
        FastLoader {
            kernels: KernelSet::detect(),
            pool,
            pack: true,
        }
    }

    /// The kernel set and the pool, for diagnostics.
    pub fn describe(&self) -> String {
        format!(
            "products on a {}{}\n{}",
            self.pool.describe(),
            if self.pack { "" } else { ", rows not packed" },
            self.kernels.describe()
        )
    }

    /// The rest of the layer on the same kernels' instruction set and the same pool: give it
    /// to [`Model::with_compute`](ch04::Model::with_compute).
    pub fn compute(&self) -> Arc<dyn ch04::Compute> {
        Arc::new(crate::simd_compute::SimdCompute::new(
            &self.kernels,
            self.pool.clone(),
        ))
    }
}
// ANCHOR_END: loader

// ANCHOR: loader_matrix
impl FastLoader {
    /// A matrix over `data` (rows of `info`'s type): how chapter 10 hands in mapped bytes.
    pub fn matrix<S: AsRef<[u8]> + Send + Sync + 'static>(
        &self,
        info: &TensorInfo,
        data: S,
    ) -> Result<FastMatrix<S>, LoadError> {
        self.matrix_packed_if(info, data, self.pack)
    }

    /// As [`FastLoader::matrix`], packing only if `pack` (and the loader) says so.
    pub fn matrix_packed_if<S: AsRef<[u8]> + Send + Sync + 'static>(
        &self,
        info: &TensorInfo,
        data: S,
        pack: bool,
    ) -> Result<FastMatrix<S>, LoadError> {
        let (cols, rows) = matrix_dims(info)?;
        let q = QMatrix::new(&info.name, info.ggml_type, rows, cols, data)?;
        FastMatrix::new(
            &info.name,
            q,
            &self.kernels,
            self.pool.clone(),
            pack && self.pack,
        )
    }
}
// ANCHOR_END: loader_matrix

// ANCHOR: matrix_loader
impl MatrixLoader for FastLoader {
    fn load(
        &self,
        _gguf: &Gguf,
        info: &TensorInfo,
        bytes: &[u8],
    ) -> Result<Box<dyn Matrix>, LoadError> {
        Ok(Box::new(self.matrix(info, bytes.to_vec())?))
    }

    /// Rows are looked up one at a time: kept in the file's layout, never packed (a packed
    /// copy would only be unpacked again, row by row).
    fn load_rows(
        &self,
        _gguf: &Gguf,
        info: &TensorInfo,
        bytes: &[u8],
    ) -> Result<Box<dyn Matrix>, LoadError> {
        Ok(Box::new(self.matrix_packed_if(
            info,
            bytes.to_vec(),
            false,
        )?))
    }
}
// ANCHOR_END: matrix_loader
