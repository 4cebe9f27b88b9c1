//! The rest of the layer at SIMD speed, on the thread pool: chapter 4's [`Compute`] seam.
//!
//! Once the products are fast, the work between them is what is left: at 2 threads on
//! SmolLM2-135M, chapter 3's scalar attention, RMSNorm, SwiGLU and the residual adds were
//! about half of every decoded token and more than half of a prompt, on one thread (the
//! `breakdown` example measures it). [`SimdCompute`] runs all of it with vector kernels and
//! spreads it over the same pool as the products:
//!
//! - **Attention** is tiled, as flash attention does it: a unit of work is the queries of one
//!   KV head (its whole group of query heads, so each key is read once for all of them) for a
//!   block of [`Q_ROWS`] query rows, against the keys in tiles of [`KEY_TILE`]. Each tile's
//!   scores are turned into weights with an *online* softmax — a running maximum `m`, a running
//!   sum `l` and an output accumulator that is rescaled by `e^(m_old - m_new)` when the maximum
//!   grows — so the `(n, n_kv)` score matrix is never built, and a 1024-token prompt needs no
//!   more scratch than a short one.
//! - **Decode** has one query row, so one unit per KV head: too few for the threads. The keys
//!   are then also split into ranges (flash-decoding): each unit leaves its partial `(m, l,
//!   acc)`, and a merge combines them, weighting each by `e^(m_s - M)`.
//! - **A batch of sequences** (chapter 7's decode step: one token each of 16 sequences) is one
//!   call, [`AttentionOps::attend_batch`]: every sequence's units go into one pool job, each
//!   unit reading its own sequence's keys through the store, so a layer's attention is one
//!   parallel region whatever the number of sequences. The rows of a decode step come from all
//!   over the cache, once each: a unit asks for them two tiles ahead (`prefetcht1`), and chapter
//!   5's buffers sit on huge pages.
//! - **A q8_0 cache** is scored in integers where the set can (AVX-512 with VNNI), as
//!   llama.cpp scores it: the queries rounded to q8_0, each tile's keys packed a key per lane,
//!   `vpdpbusd` for the blocks' dot products (`F32Simd::keys_q8_0`).
//! - **RMSNorm, SwiGLU, the residual add** are vector loops; for a prompt their rows are split
//!   over the threads. SwiGLU's `e^-x` uses a vector `exp` (`simd::x86::act`).
//! - **RoPE** is the reference's own code, split over tokens: it is exact and cheap.
//!
//! Every kernel is written once, generic over [`F32Simd`] (the lane operations), and compiled
//! for each instruction set: [`Portable`] (plain Rust, which the compiler vectorises as it can:
//! the fallback, e.g. on AArch64), AVX2 with FMA, and AVX-512 for attention's two
//! arithmetic-bound kernels. Buffers are kept per thread of the pool and reused, so nothing is
//! allocated per token.
//!
//! # The files
//!
//! - this one: [`SimdCompute`], the seam's implementation — which kernels run, on which
//!   threads — with RMSNorm, SwiGLU and the residual add;
//! - `isa.rs`: [`Portable`] and [`F32Isa`], the instruction sets the kernels are compiled for;
//! - `plan.rs`: one attention call cut into units of work, run on the pool, and the merge of
//!   the key segments;
//! - `unit.rs`: one unit: the tiles of keys, the online softmax and the weighted values;
//! - `gather.rs`: reading a tile's keys and values from the cache, and asking for them ahead.

use crate::kernels::KernelSet;
use crate::pool::Parallel;
pub use crate::simd::F32Simd;
use ch03::AttentionOps;
use ch03::{Attention, KvDyn, KvView, RopeTable, TokenPos};
use ch04::compute::geglu;
use ch04::{Activation, Compute};
use plan::RunPlan;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use unit::Tile;
#[cfg(target_arch = "x86_64")]
use unit::{AttendJob, Dest};

pub use isa::{F32Isa, Portable};

/// Query rows in one unit of attention work. With SmolLM2's 3 query heads per KV head that is
/// 48 query vectors (12 KiB) and their accumulators (12 KiB). Each tile's keys are gathered,
/// asked for ahead and (for a q8_0 cache) packed once per unit, so more rows share that work:
/// the finished engine's prefill of an 8,100-token prompt (`llm-rs run --json`, 2 threads) ran
/// 1.11× faster with 16 rows than with 8 with a q8_0 cache and 1.07× with an f16 one, on an
/// Intel Xeon with a 48 KiB L1 (a tile's keys and values stay in L1 while the rows take them
/// in turn; the rows' own buffers pass through it).
pub const Q_ROWS: usize = 16;
/// Keys per tile: the online softmax updates its running max and sum once per tile. Every
/// query vector of a unit reads the tile's keys and values again, so they must stay in L1:
/// 32 keys of 64 values are 8 KiB of keys and 8 KiB of values, which with the queries,
/// accumulators and scores (3 KiB) fits a 32 KiB L1; 64 keys measured slower on a 48 KiB one.
pub const KEY_TILE: usize = 32;
/// Keys per segment of attention work: each segment of a query's keys is a unit of its own,
/// merged with the others at the end. Segments start at multiples of this (a multiple of
/// [`KEY_TILE`]) whatever the batch, so results do not depend on the batch. 256 keeps a
/// decoded token's attention on several threads from position 256 on (earlier it is a small
/// part of the step), and a 256-token prompt chunk at position 4096 in 16 segments, whose
/// partials take 10 MB.
pub const KEY_SEGMENT: usize = 256;

/// Attention's units are handed to the threads in this many runs of consecutive units per
/// thread: enough to even out runs of unequal length, few enough that each unit but a run's
/// first has its keys asked for while the one before it runs.
const UNIT_TASKS_PER_THREAD: usize = 4;

/// Rows (tokens) below which RMSNorm and RoPE run on the calling thread: waking the pool costs
/// more than the work.
const PAR_ROWS: usize = 16;
/// Elements below which SwiGLU and the residual add run on the calling thread.
const PAR_ELEMS: usize = 1 << 15;

/// Writes from several threads into disjoint parts of one buffer.
#[derive(Clone, Copy)]
struct Out(*mut f32);
// SAFETY: an `Out` is only a pointer: moving one to another thread gives no access by itself.
// Every access goes through the unsafe `slice`, whose callers write disjoint ranges of a
// buffer that outlives the pool job.
unsafe impl Send for Out {}
// SAFETY: sharing an `Out` between the pool's threads is what it is for; as for `Send`, each
// thread reaches only its own, disjoint range, through `slice`.
unsafe impl Sync for Out {}
impl Out {
    /// The pointer (a method, so that a closure captures the whole `Sync` wrapper).
    fn ptr(&self) -> *mut f32 {
        self.0
    }

    /// `len` values at `at`.
    ///
    /// # Safety
    /// `at..at + len` is inside the buffer and no other thread touches it meanwhile.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slice(&self, at: usize, len: usize) -> &mut [f32] {
        // SAFETY: the caller promises that `at..at + len` lies inside the buffer this pointer was
        // taken from, which outlives the pool job, and that no other thread reads or writes it
        // meanwhile: the slice is valid and not aliased.
        unsafe { std::slice::from_raw_parts_mut(self.ptr().add(at), len) }
    }
}

// The entry points: each kernel compiled for each instruction set. (Paths from the crate's
// root, so that `plan.rs` calls it as this file does.)
macro_rules! for_isa {
    ($isa:expr, $f:ident :: <S> ($($arg:expr),*)) => {
        match $isa {
            // SAFETY: a `SimdCompute` holds `F32Isa::Avx2` only where the CPU has AVX2 and FMA
            // (`with_isa` checks); the call's other conditions are stated where it is made.
            #[cfg(target_arch = "x86_64")]
            $crate::simd_compute::F32Isa::Avx2 => unsafe {
                $crate::simd_compute::avx2::$f($($arg),*)
            },
            // SAFETY: as above, `F32Isa::Avx512` only where the CPU has AVX-512 F, AVX2 and FMA.
            #[cfg(target_arch = "x86_64")]
            $crate::simd_compute::F32Isa::Avx512 => unsafe {
                $crate::simd_compute::avx512::$f($($arg),*)
            },
            // SAFETY: `Portable` is plain Rust; the call's other conditions are stated where it
            // is made.
            _ => unsafe { $f::<$crate::simd_compute::Portable>($($arg),*) },
        }
    };
}

mod gather;
mod isa;
mod plan;
#[cfg(test)]
mod tests;
mod unit;

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use crate::simd::x86::act::Avx2;

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn attend_unit(
        j: &AttendJob,
        kvh: usize,
        rows: Range<usize>,
        keys: Range<usize>,
        t: &mut Tile,
        dst: Dest,
    ) {
        // SAFETY: this function enables AVX2, FMA and F16C, which `Avx2` needs; the rest of
        // `attend_unit`'s contract is this function's own, passed on by its caller.
        unsafe { unit::attend_unit::<Avx2>(j, kvh, rows, keys, t, dst) }
    }
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn rms_norm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
        // SAFETY: this function enables AVX2 and FMA, which `Avx2` needs; `rms_norm_rows` stays
        // inside its slices.
        unsafe { super::rms_norm_rows::<Avx2>(x, w, eps, out) }
    }
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn silu_mul(g: &mut [f32], u: &[f32]) {
        // SAFETY: this function enables AVX2 and FMA, which `Avx2` needs; `silu_mul` stays inside
        // its slices.
        unsafe { <Avx2 as F32Simd>::silu_mul(g, u) }
    }
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn add(x: &mut [f32], y: &[f32]) {
        // SAFETY: this function enables AVX2 and FMA, which `Avx2` needs; `add` stays inside its
        // slices.
        unsafe { <Avx2 as F32Simd>::add(x, y) }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::*;
    use crate::simd::x86::act::Avx512;

    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(super) unsafe fn attend_unit(
        j: &AttendJob,
        kvh: usize,
        rows: Range<usize>,
        keys: Range<usize>,
        t: &mut Tile,
        dst: Dest,
    ) {
        // SAFETY: this function enables AVX-512 F, AVX2, FMA and F16C, which `Avx512` needs; the
        // rest of `attend_unit`'s contract is this function's own, passed on by its caller.
        unsafe { unit::attend_unit::<Avx512>(j, kvh, rows, keys, t, dst) }
    }
    // The rest is AVX2's: sixteen lanes buy nothing on loops bound by memory.
    pub(super) use super::avx2::{add, rms_norm_rows, silu_mul};
}

/// RMSNorm of the rows of `x`, the reference's formula with a vector sum of squares.
#[inline(always)]
unsafe fn rms_norm_rows<S: F32Simd>(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let d = w.len();
    for (row, o) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        // SAFETY: `S`'s instructions are enabled (the caller's contract); `sum_squares` reads only
        // `row`.
        let sum = unsafe { S::sum_squares(row) } as f64;
        let mean = (sum / d as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        // SAFETY: `S`'s instructions are enabled; `scale_mul` stays inside its three slices.
        unsafe { S::scale_mul(row, scale, w, o) };
    }
}

#[inline(always)]
unsafe fn silu_mul<S: F32Simd>(g: &mut [f32], u: &[f32]) {
    // SAFETY: `S`'s instructions are enabled (the caller's contract); `silu_mul` stays inside its
    // slices.
    unsafe { S::silu_mul(g, u) }
}

#[inline(always)]
unsafe fn add<S: F32Simd>(x: &mut [f32], y: &[f32]) {
    // SAFETY: `S`'s instructions are enabled (the caller's contract); `add` stays inside its
    // slices.
    unsafe { S::add(x, y) }
}

// ANCHOR: simd_compute
/// Chapter 4's [`Compute`] with vector kernels, spread over a thread pool.
pub struct SimdCompute {
    isa: F32Isa,
    pool: Arc<dyn Parallel>,
    /// Partial results of split attention, `(splits, n, n_head, 2 + head_dim)`: kept, so that
    /// decoding allocates nothing.
    partials: Mutex<Vec<f32>>,
    /// The runs of the current attention call, kept for their capacity.
    plans: Mutex<Vec<RunPlan>>,
    /// One tile of buffers per thread. Not thread-locals: these are sized by the calling
    /// thread before the work is shared out, so a worker's first unit allocates nothing either.
    tiles: Box<[Mutex<Tile>]>,
}
// ANCHOR_END: simd_compute

impl SimdCompute {
    /// Kernels for `kernels`' instruction set, work on `pool` (share it with the matrices).
    pub fn new(kernels: &KernelSet, pool: Arc<dyn Parallel>) -> SimdCompute {
        SimdCompute::with_isa(F32Isa::for_kernels(kernels), pool)
    }

    /// The portable kernels (for tests and benchmarks), or those of a kernel set.
    ///
    /// Panics if this CPU lacks `isa`'s instructions: every kernel call relies on them.
    pub fn with_isa(isa: F32Isa, pool: Arc<dyn Parallel>) -> SimdCompute {
        assert!(
            isa.is_available(),
            "SimdCompute: this CPU lacks the instructions of the {isa:?} kernels"
        );
        let tiles = (0..pool.threads().max(1))
            .map(|_| Mutex::new(Tile::default()))
            .collect();
        SimdCompute {
            isa,
            pool,
            partials: Mutex::new(Vec::new()),
            plans: Mutex::new(Vec::new()),
            tiles,
        }
    }

    /// A free tile. At most `threads` units run at once, so one is always free; the loop only
    /// guards against a pool that runs more.
    fn with_tile(&self, f: impl FnOnce(&mut Tile)) {
        loop {
            for t in self.tiles.iter() {
                if let Ok(mut t) = t.try_lock() {
                    return f(&mut t);
                }
            }
            std::thread::yield_now();
        }
    }

    /// `f(range)` for ranges of `0..n` in chunks of `chunk` (a multiple of 8, so vector loops
    /// split on lane boundaries), on the pool when `n >= min_par`.
    fn split(&self, n: usize, chunk: usize, min_par: usize, f: &(dyn Fn(Range<usize>) + Sync)) {
        if n < min_par || self.pool.threads() == 1 {
            f(0..n);
        } else {
            self.pool.run(n.div_ceil(chunk), &|i| {
                f(i * chunk..((i + 1) * chunk).min(n))
            });
        }
    }
}

// ANCHOR: attention_ops
impl AttentionOps for SimdCompute {
    fn rope(&self, rope: &RopeTable, x: &mut [f32], head_dim: usize, tokens: &[TokenPos]) {
        let n = tokens.len();
        let width = x.len() / n.max(1);
        let out = Out(x.as_mut_ptr());
        self.split(n, 1, PAR_ROWS, &|r| {
            for i in r {
                // SAFETY: token i's row, `i·width..(i + 1)·width` with `i < n` and
                // `n·width <= x.len()`, is inside `x` and written by this task only.
                let row = unsafe { out.slice(i * width, width) };
                rope.apply(row, head_dim, tokens[i].pos);
            }
        });
    }

    fn attend(
        &self,
        attn: &Attention,
        q: &[f32],
        tokens: &[TokenPos],
        kv: &dyn KvView,
        out: &mut [f32],
    ) {
        let plans = self.plan(attn, tokens, [(0, 0..tokens.len(), kv.first())]);
        self.attend_plans(attn, q, tokens, &plans, &|_, f| f(kv), out);
    }
    // ANCHOR_END: attention_ops

    // ANCHOR: attend_batch
    fn attend_batch(
        &self,
        attn: &Attention,
        layer: usize,
        q: &[f32],
        tokens: &[TokenPos],
        kv: &dyn KvDyn,
        out: &mut [f32],
    ) {
        // Every sequence's units in one pool job: a decode step over 16 sequences is one
        // parallel region per layer, not 16 small ones that leave threads idle at each join.
        let first = |seq: usize| {
            let mut first = 0;
            kv.with_view(layer, seq, &mut |view| first = view.first());
            first
        };
        let runs = TokenPos::seq_runs(tokens).map(|(seq, rows)| (seq, rows, first(seq)));
        let plans = self.plan(attn, tokens, runs);
        let view = |p: &RunPlan, f: &mut dyn FnMut(&dyn KvView)| kv.with_view(layer, p.seq, f);
        self.attend_plans(attn, q, tokens, &plans, &view, out);
    }
    // ANCHOR_END: attend_batch

    fn describe(&self) -> String {
        format!(
            "attention, norms and SwiGLU: {} kernels on a {}",
            match self.isa {
                F32Isa::Portable => "portable",
                F32Isa::Avx2 => "avx2",
                F32Isa::Avx512 => "avx512",
            },
            self.pool.describe()
        )
    }
}

// ANCHOR: compute_impl
impl Compute for SimdCompute {
    fn rms_norm(&self, x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
        let d = weight.len();
        // As many rows as both sides hold, as the reference's `zip` does.
        let rows = x.len().min(out.len()) / d;
        let dst = Out(out.as_mut_ptr());
        self.split(rows, 4, PAR_ROWS, &|r| {
            let x = &x[r.start * d..r.end * d];
            // SAFETY: rows `r` of `out`, inside its `rows · d` values, are written by this
            // task only.
            let o = unsafe { dst.slice(r.start * d, r.len() * d) };
            for_isa!(self.isa, rms_norm_rows::<S>(x, weight, eps, o))
        });
    }

    fn glu(&self, act: Activation, gate: &mut [f32], up: &[f32]) {
        let g = Out(gate.as_mut_ptr());
        self.split(gate.len(), 4096, PAR_ELEMS, &|r| {
            // SAFETY: `r` lies inside `0..gate.len()`, and its elements are written by this
            // task only.
            let g = unsafe { g.slice(r.start, r.len()) };
            match act {
                Activation::Silu => for_isa!(self.isa, silu_mul::<S>(g, &up[r])),
                // ggml's GELU is a lookup in an f16 table: the reference's own loop (the same
                // bits), on each thread's share.
                Activation::GeluTanh => geglu(g, &up[r]),
            }
        });
    }

    fn add(&self, x: &mut [f32], y: &[f32]) {
        let px = Out(x.as_mut_ptr());
        self.split(x.len(), 4096, PAR_ELEMS, &|r| {
            // SAFETY: `r` lies inside `0..x.len()`, and its elements are written by this task
            // only.
            let x = unsafe { px.slice(r.start, r.len()) };
            for_isa!(self.isa, add::<S>(x, &y[r]))
        });
    }
}
// ANCHOR_END: compute_impl
