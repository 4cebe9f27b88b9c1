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
//! - **RMSNorm, SwiGLU, the residual add** are vector loops; for a prompt their rows are split
//!   over the threads. SwiGLU's `e^-x` uses a vector `exp` (`simd::x86::act`).
//! - **RoPE** is the reference's own code, split over tokens: it is exact and cheap.
//!
//! Every kernel is written once, generic over [`F32Simd`] (the lane operations), and compiled
//! for each instruction set: [`Portable`] (plain Rust, which the compiler vectorises as it can:
//! the fallback, e.g. on AArch64), AVX2 with FMA, and AVX-512 for attention's two
//! arithmetic-bound kernels. Buffers are kept per thread of the pool and reused, so nothing is
//! allocated per token.

use crate::kernels::{Isa, KernelSet};
use crate::pool::Parallel;
pub use crate::simd::F32Simd;
use ch01::GgmlType;
use ch01::dequant::row_dequantizer;
use ch03::AttentionOps;
use ch03::{Attention, KvDyn, KvRows, KvView, RopeTable, TokenPos};
use ch04::compute::geglu;
use ch04::{Activation, Compute};
use std::ops::Range;
use std::sync::{Arc, Mutex};

/// Query rows in one unit of attention work. With SmolLM2's 3 query heads per KV head that is
/// 24 query vectors (6 KiB) and their accumulators (6 KiB).
pub const Q_ROWS: usize = 8;
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

/// Plain Rust: the fallback on CPUs without a vector set here, and the reference the vector
/// versions are tested against.
pub struct Portable;

impl F32Simd for Portable {
    #[inline(always)]
    unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        ch03::matrix::dot(a, b)
    }
    #[inline(always)]
    unsafe fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
        for (y, x) in y.iter_mut().zip(x) {
            *y += a * x;
        }
    }
    #[inline(always)]
    unsafe fn scale(y: &mut [f32], a: f32) {
        y.iter_mut().for_each(|y| *y *= a);
    }
    #[inline(always)]
    unsafe fn max(x: &[f32]) -> f32 {
        x.iter().copied().fold(f32::NEG_INFINITY, f32::max)
    }
    #[inline(always)]
    unsafe fn exp_sum(x: &mut [f32], m: f32) -> f32 {
        let mut sum = 0.0;
        for v in x.iter_mut() {
            *v = (*v - m).exp();
            sum += *v;
        }
        sum
    }
    #[inline(always)]
    unsafe fn silu_mul(g: &mut [f32], u: &[f32]) {
        for (g, u) in g.iter_mut().zip(u) {
            *g = ch04::compute::silu(*g) * u;
        }
    }
    #[inline(always)]
    unsafe fn sum_squares(x: &[f32]) -> f32 {
        // SAFETY: `Portable::dot` is plain Rust.
        unsafe { Self::dot(x, x) }
    }
    #[inline(always)]
    unsafe fn scale_mul(x: &[f32], s: f32, w: &[f32], out: &mut [f32]) {
        for ((o, &v), &w) in out.iter_mut().zip(x).zip(w) {
            *o = (v * s) * w;
        }
    }
    #[inline(always)]
    unsafe fn add(x: &mut [f32], y: &[f32]) {
        for (a, b) in x.iter_mut().zip(y) {
            *a += b;
        }
    }
}

/// Which implementation of [`F32Simd`] the kernels are compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum F32Isa {
    Portable,
    /// x86-64 AVX2 + FMA + F16C (every kernel set from AVX2 up has all three).
    Avx2,
    /// [`F32Isa::Avx2`], with AVX-512 F for attention's scores and weighted sums.
    Avx512,
}

impl F32Isa {
    /// The one a kernel set can run: a set exists only for an instruction set the CPU has.
    pub fn for_kernels(k: &KernelSet) -> F32Isa {
        match k.isa {
            Isa::Avx2 if cfg!(target_arch = "x86_64") => F32Isa::Avx2,
            Isa::Avx512 | Isa::Avx512Vnni if cfg!(target_arch = "x86_64") => F32Isa::Avx512,
            _ => F32Isa::Portable,
        }
    }

    /// Whether this CPU has the instructions the kernels are compiled for.
    pub fn is_available(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        let (avx2, avx512) = (
            is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c"),
            is_x86_feature_detected!("avx512f"),
        );
        #[cfg(not(target_arch = "x86_64"))]
        let (avx2, avx512) = (false, false);
        match self {
            F32Isa::Portable => true,
            F32Isa::Avx2 => avx2,
            F32Isa::Avx512 => avx2 && avx512,
        }
    }
}

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

// ANCHOR: attend_job
/// What every unit of one attention call shares.
struct AttendJob<'a> {
    attn: &'a Attention,
    q: &'a [f32], // (n, n_head, head_dim)
    tokens: &'a [TokenPos],
    kv: &'a dyn KvView,
    first: usize, // first position the store holds
}

/// The buffers of a unit, reused from call to call: one per thread of the pool.
#[derive(Default)]
struct Tile {
    s: Vec<f32>,              // (n_qv, KEY_TILE): scores, then weights, of one tile
    m: Vec<f32>,              // (n_qv): running maximum
    l: Vec<f32>,              // (n_qv): running sum of weights
    acc: Vec<f32>,            // (n_qv, head_dim): running weighted sum of values
    vis: Vec<(usize, usize)>, // (rows): the keys each row sees, within the unit's range
    kdec: Vec<f32>,           // (KEY_TILE, head_dim): a tile's keys, decoded from an f16/q8_0 cache
    vdec: Vec<f32>,           // (KEY_TILE, head_dim): its values, likewise
}
// ANCHOR_END: attend_job

impl Tile {
    /// Capacity for units of up to `nq` query vectors of `hd` values and `rows` rows, so that
    /// the unit itself never allocates.
    fn reserve(&mut self, nq: usize, hd: usize, rows: usize) {
        fn at_least<T>(v: &mut Vec<T>, n: usize) {
            v.reserve(n.saturating_sub(v.len()));
        }
        at_least(&mut self.s, nq * KEY_TILE);
        at_least(&mut self.m, nq);
        at_least(&mut self.l, nq);
        at_least(&mut self.acc, nq * hd);
        at_least(&mut self.vis, rows);
        at_least(&mut self.kdec, KEY_TILE * hd);
        at_least(&mut self.vdec, KEY_TILE * hd);
    }
}

/// Where a unit writes: the final output rows, or its partial `(m, l, acc)` for a merge.
#[derive(Clone, Copy)]
enum Dest {
    /// `out`, `(n, n_head, head_dim)`.
    Out(Out),
    /// This split's part of the partials, `(n, n_head, 2 + head_dim)`.
    Partial(Out),
}

// ANCHOR: run_plan
/// One run of an attention call — the consecutive tokens of one sequence — and how its work is
/// cut into units: query heads of one KV head × a block of [`Q_ROWS`] rows × a segment of
/// keys. The cut depends on the run alone, never on the rest of the call, so a query's result
/// is the same bits alone or in any batch.
struct RunPlan {
    seq: usize,
    rows: Range<usize>, // its tokens, indices into the call's
    first: usize,       // the first position its store holds
    keys: Range<usize>, // the keys any of its queries sees
    // The keys are cut into segments at fixed positions, multiples of KEY_SEGMENT, each segment
    // a unit of work of its own (flash-decoding): a decoded token's keys keep several threads
    // busy. Fixed positions, not a split chosen by how busy the threads are, so that a query's
    // result never depends on the other queries of the call, on how its prompt was chunked, or
    // on the number of threads: a request computes the same bits alone or in any batch
    // (chapter 11 relies on it).
    first_seg: usize,    // its first segment
    splits: usize,       // its segments: with one, units write the output directly
    units: Range<usize>, // its units, numbered across the call's runs
    parts: Range<usize>, // where its partials lie when split: `splits` parts of `stride`
    stride: usize,       // one split's partials, `(rows, n_head, 2 + head_dim)`
}
// ANCHOR_END: run_plan

/// Lends a run's keys and values to a callback: the one view of a single sequence, or its own
/// sequence's view from the store.
type LendView<'a> = dyn Fn(&RunPlan, &mut dyn FnMut(&dyn KvView)) + Sync + 'a;

// ANCHOR: run_plan_new
impl RunPlan {
    /// The plan of `tokens[rows]` (of sequence `seq`, whose store starts at `first`), its units
    /// numbered from `units` and its partials placed at `parts`.
    fn new(
        attn: &Attention,
        tokens: &[TokenPos],
        seq: usize,
        rows: Range<usize>,
        first: usize,
        units: usize,
        parts: usize,
    ) -> RunPlan {
        let (lo, hi) = tokens[rows.clone()]
            .iter()
            .fold((usize::MAX, 0), |(lo, hi), t| {
                let v = attn.visible(t.pos, first);
                (lo.min(v.start), hi.max(v.end))
            });
        let first_seg = lo / KEY_SEGMENT;
        let splits = if hi > lo {
            hi.div_ceil(KEY_SEGMENT) - first_seg
        } else {
            1
        };
        let n_units = attn.n_head_kv * rows.len().div_ceil(Q_ROWS) * splits;
        let stride = rows.len() * attn.n_head * (2 + attn.head_dim);
        let n_parts = if splits > 1 { splits * stride } else { 0 };
        RunPlan {
            seq,
            rows,
            first,
            keys: lo..hi,
            first_seg,
            splits,
            units: units..units + n_units,
            parts: parts..parts + n_parts,
            stride,
        }
    }
}
// ANCHOR_END: run_plan_new

// ANCHOR: attend_unit
/// One unit: query heads `kvh·group..(kvh+1)·group` of rows `rows`, against keys `keys`.
///
/// # Safety
/// `S`'s instructions are available; `dst` is valid for this unit's rows and heads, which no
/// other unit writes.
#[inline(always)]
unsafe fn attend_unit<S: F32Simd>(
    j: &AttendJob,
    kvh: usize,
    rows: Range<usize>,
    keys: Range<usize>,
    t: &mut Tile,
    dst: Dest,
) {
    let a = j.attn;
    let (hd, group, qd, kvd) = (a.head_dim, a.n_head / a.n_head_kv, a.q_dim(), a.kv_dim());
    let scale = a.kq_scale;
    let (nr, nq) = (rows.len(), rows.len() * group); // query vectors: row-major, heads inner
    t.s.resize(nq * KEY_TILE, 0.0);
    t.m.clear();
    t.m.resize(nq, f32::NEG_INFINITY);
    t.l.clear();
    t.l.resize(nq, 0.0);
    t.acc.clear();
    t.acc.resize(nq * hd, 0.0);
    t.vis.clear();
    let (mut lo, mut hi) = (usize::MAX, 0);
    for tok in &j.tokens[rows.clone()] {
        let v = a.visible(tok.pos, j.first);
        let (vlo, vhi) = (v.start.max(keys.start), v.end.min(keys.end));
        t.vis.push((vlo, vhi.max(vlo)));
        if vlo < vhi {
            (lo, hi) = (lo.min(vlo), hi.max(vhi));
        }
    }
    // Row `r`'s query vectors of this KV head's group, side by side: `(group, head_dim)`.
    let q_group = |r: usize| {
        let at = (rows.start + r) * qd + kvh * group * hd;
        &j.q[at..at + group * hd]
    };
    // Where a tile of an f16 or q8_0 cache is decoded: taken out of the tile for the loop (so
    // the rows can borrow it while the rest of the tile is written) and put back after.
    let (mut kdec, mut vdec) = (std::mem::take(&mut t.kdec), std::mem::take(&mut t.vdec));
    kdec.resize(KEY_TILE * hd, 0.0);
    vdec.resize(KEY_TILE * hd, 0.0);
    // ANCHOR_END: attend_unit

    // ANCHOR: attend_tile
    // Ask for the keys and values ahead of use, two tiles ahead: a decode step reads every
    // sequence's cache once, rows of one KV head a few lines apart, which the hardware does
    // not guess soon enough. Into L2 (`prefetcht1`): L1 keeps the decoded tile. The unit's
    // first two tiles were asked for before it began (`ahead` in `attend_plans`).
    let head = kvh * hd..(kvh + 1) * hd;
    let ahead = |keys: Range<usize>| prefetch_kv(j.kv, keys, head.clone(), kvd);
    // An f16 cache is read in place where the kernels convert its rows as they load them
    // (AVX-512, 64- and 128-value heads): no decoded copy of the tile to write and read back.
    let f16 = |r: KvRows| {
        matches!(
            r,
            KvRows::Encoded {
                ty: GgmlType::F16,
                ..
            }
        )
    };
    let in_place = lo < hi
        && S::heads_f16(hd, group)
        && f16(j.kv.key_run(lo, 1))
        && f16(j.kv.value_run(lo, 1));
    let mut j0 = lo;
    while j0 < hi {
        let j1 = (j0 + KEY_TILE).min(hi);
        ahead((j1 + KEY_TILE).min(hi)..(j1 + 2 * KEY_TILE).min(hi));
        // The key and value rows of the tile, this KV head's part of each: read in place from
        // an f32 cache (or an f16 one, above), decoded once for the whole group of query
        // vectors from any other.
        let mut krows: [&[f32]; KEY_TILE] = [&[]; KEY_TILE];
        let mut vrows: [&[f32]; KEY_TILE] = [&[]; KEY_TILE];
        let mut khalf: [&[u8]; KEY_TILE] = [&[]; KEY_TILE];
        let mut vhalf: [&[u8]; KEY_TILE] = [&[]; KEY_TILE];
        // ANCHOR_END: attend_tile
        // ANCHOR: attend_gather
        if in_place {
            gather_f16(
                j0,
                j1,
                head.clone(),
                kvd,
                |p, m| j.kv.key_run(p, m),
                &mut khalf,
            );
            gather_f16(
                j0,
                j1,
                head.clone(),
                kvd,
                |p, m| j.kv.value_run(p, m),
                &mut vhalf,
            );
        } else {
            // SAFETY: `S`'s instructions are enabled (this function's contract).
            unsafe {
                gather::<S>(
                    j0,
                    j1,
                    kvh * hd..(kvh + 1) * hd,
                    kvd,
                    |p, m| j.kv.key_run(p, m),
                    &mut kdec,
                    &mut krows,
                );
                gather::<S>(
                    j0,
                    j1,
                    kvh * hd..(kvh + 1) * hd,
                    kvd,
                    |p, m| j.kv.value_run(p, m),
                    &mut vdec,
                    &mut vrows,
                );
            }
        }
        // ANCHOR_END: attend_gather
        // ANCHOR: attend_softmax
        for r in 0..nr {
            // The keys of the tile this row sees, as indices into the tile.
            let (vlo, vhi) = t.vis[r];
            let (a, b) = (vlo.clamp(j0, j1) - j0, vhi.clamp(j0, j1) - j0);
            if a >= b {
                continue; // this row sees none of the tile's keys
            }
            // The row's query vectors of this KV head's group: side by side in `q`, their
            // scores `KEY_TILE` apart in `t.s`, their accumulators side by side in `t.acc`.
            let s0 = r * group * KEY_TILE;
            // Scores for all of them, each key read once for the group.
            let (q, s) = (q_group(r), &mut t.s[s0 + a..]);
            // SAFETY: `S`'s instructions are enabled (this function's contract); the gathers
            // filled rows `a..b` of the tile with `hd`-value rows of the keys, as the kernels
            // need, and `t.s` holds `KEY_TILE` scores for every query vector of the unit.
            unsafe {
                match in_place {
                    true => S::scores_heads_f16(q, hd, &khalf[a..b], scale, s, KEY_TILE),
                    false => S::scores_heads(q, hd, &krows[a..b], scale, s, KEY_TILE),
                }
            };
            // ANCHOR_END: attend_softmax
            // ANCHOR: attend_weights
            for g in 0..group {
                // The online softmax: rescale what was accumulated if the maximum grew, and
                // turn this tile's scores into weights.
                let qv = r * group + g;
                let s = &mut t.s[qv * KEY_TILE + a..qv * KEY_TILE + b];
                // SAFETY: `S`'s instructions are enabled; `max` reads only inside its slice.
                let tile_max = unsafe { S::max(s) };
                let acc = &mut t.acc[qv * hd..(qv + 1) * hd];
                let m_new = t.m[qv].max(tile_max);
                if m_new > t.m[qv] {
                    let corr = (t.m[qv] - m_new).exp(); // 0 on the first tile: m = -inf
                    t.l[qv] *= corr;
                    // SAFETY: `S`'s instructions are enabled; `scale` writes only inside its slice.
                    unsafe { S::scale(acc, corr) };
                    t.m[qv] = m_new;
                }
                // SAFETY: `S`'s instructions are enabled; `exp_sum` stays inside its slice.
                t.l[qv] += unsafe { S::exp_sum(s, m_new) };
            }
            // The weighted values, each value row read once for the group.
            let acc = &mut t.acc[r * group * hd..(r + 1) * group * hd];
            let p = &t.s[s0 + a..];
            // SAFETY: `S`'s instructions are enabled; `acc` holds `hd` values for each of the
            // group's query vectors and the gathers filled rows `a..b` of the tile with
            // `hd`-value rows of the values, as the kernels need.
            unsafe {
                match in_place {
                    true => S::weighted_sum_heads_f16(acc, hd, p, KEY_TILE, &vhalf[a..b]),
                    false => S::weighted_sum_heads(acc, hd, p, KEY_TILE, &vrows[a..b]),
                }
            };
        }
        j0 = j1;
    }
    (t.kdec, t.vdec) = (kdec, vdec);
    // ANCHOR_END: attend_weights

    // ANCHOR: attend_finish
    for r in 0..nr {
        for g in 0..group {
            let (qv, h) = (r * group + g, kvh * group + g);
            let acc = &mut t.acc[qv * hd..(qv + 1) * hd];
            let i = rows.start + r;
            match dst {
                Dest::Out(out) => {
                    let inv = if t.l[qv] > 0.0 { 1.0 / t.l[qv] } else { 0.0 };
                    // SAFETY: `S`'s instructions are enabled; `scale` writes only inside its slice.
                    unsafe { S::scale(acc, inv) };
                    // SAFETY: row i < n and head h < n_head are inside `out` (`dst`'s contract),
                    // and this unit is the only one to write them.
                    unsafe { out.slice(i * qd + h * hd, hd) }.copy_from_slice(acc);
                }
                Dest::Partial(part) => {
                    let w = 2 + hd;
                    // SAFETY: as above, in this split's part of the partials.
                    let o = unsafe { part.slice((i * a.n_head + h) * w, w) };
                    o[0] = t.m[qv];
                    o[1] = t.l[qv];
                    o[2..].copy_from_slice(acc);
                }
            }
        }
    }
}
// ANCHOR_END: attend_finish

/// Ask for part `head` (of rows of `width` values) of the keys and values of positions `keys`
/// to be brought into the cache.
#[inline(always)]
fn prefetch_kv(kv: &dyn KvView, keys: Range<usize>, head: Range<usize>, width: usize) {
    prefetch_rows(keys.clone(), head.clone(), width, |p, m| kv.key_run(p, m));
    prefetch_rows(keys, head, width, |p, m| kv.value_run(p, m));
}

/// Ask for part `head` of the rows of positions `keys` to be brought into the cache, read a run
/// at a time with `run(pos, max)` as [`gather`] reads them.
#[inline(always)]
fn prefetch_rows<'a>(
    keys: Range<usize>,
    head: Range<usize>,
    width: usize,
    run: impl Fn(usize, usize) -> KvRows<'a>,
) {
    let mut p = keys.start;
    while p < keys.end {
        let r = run(p, keys.end - p);
        let n = r.len(width).clamp(1, keys.end - p);
        // The rows' start, the bytes of a row, and the head's bytes within one.
        let (base, row, part) = match r {
            KvRows::F32(x) => (
                x.as_ptr() as *const u8,
                4 * width,
                4 * head.start..4 * head.end,
            ),
            KvRows::Encoded { ty, bytes } => {
                let at = |n: usize| ty.row_bytes(n as u64).unwrap_or(0) as usize;
                (bytes.as_ptr(), at(width), at(head.start)..at(head.end))
            }
        };
        for k in 0..n {
            let mut o = k * row + part.start;
            while o < k * row + part.end {
                prefetch(base.wrapping_add(o));
                o += 64;
            }
        }
        p += n;
    }
}

/// `prefetcht1` of the line at `at`: a hint, which never faults (nothing on other CPUs).
#[inline(always)]
fn prefetch(at: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing architecturally and never faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(at as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

/// Fill `rows[..j1 - j0]` with part `head` of the rows of positions `j0..j1`, read a run at a
/// time with `run(pos, max)` (rows of `width` values side by side): f32 rows in place, encoded
/// rows (f16, q8_0) decoded into `dec` (`(KEY_TILE, head.len())`).
///
/// # Safety
/// `S`'s instructions are available.
#[inline(always)]
unsafe fn gather<'a, S: F32Simd>(
    j0: usize,
    j1: usize,
    head: Range<usize>,
    width: usize,
    run: impl Fn(usize, usize) -> KvRows<'a>,
    dec: &'a mut [f32],
    rows: &mut [&'a [f32]; KEY_TILE],
) {
    let hd = head.len();
    let mut decoded = [false; KEY_TILE];
    let mut p = j0;
    while p < j1 {
        let r = run(p, j1 - p);
        let n = r.len(width).min(j1 - p);
        // The kernels read a whole head of every row of the tile, so each position must get
        // one: a run of less than one row (which `KvView` promises never to return) would
        // leave a row empty.
        assert!(
            n >= 1,
            "attention: the KV store returned less than one row of {width} values at position {p}"
        );
        match r {
            KvRows::F32(x) => {
                for (k, row) in x.chunks_exact(width).take(n).enumerate() {
                    rows[p - j0 + k] = &row[head.clone()];
                }
            }
            KvRows::Encoded { ty, bytes } => {
                let at = |n: usize| {
                    ty.row_bytes(n as u64).unwrap_or_else(|| {
                        panic!("attention: {n} values are not whole {ty} blocks")
                    }) as usize
                };
                let (rb, b0, b1) = (at(width), at(head.start), at(head.end));
                for k in 0..n {
                    let (src, i) = (&bytes[k * rb..][b0..b1], p - j0 + k);
                    let out = &mut dec[i * hd..(i + 1) * hd];
                    match ty {
                        // SAFETY: `S`'s instructions are enabled (this function's contract); the
                        // decoder stays inside its slices.
                        GgmlType::F16 => unsafe { S::f16_to_f32(src, out) },
                        // SAFETY: as for F16.
                        GgmlType::Q8_0 => unsafe { S::q8_0_to_f32(src, out) },
                        other => row_dequantizer(other)
                            .unwrap_or_else(|| panic!("attention: no decoder for {other} rows"))(
                            src, out,
                        ),
                    }
                    decoded[i] = true;
                }
            }
        }
        p += n;
    }
    let dec: &'a [f32] = dec;
    for (i, row) in rows.iter_mut().enumerate().take(j1 - j0) {
        if decoded[i] {
            *row = &dec[i * hd..(i + 1) * hd];
        }
    }
}

/// Fill `rows[..j1 - j0]` with part `head` of the f16 rows of positions `j0..j1` (`2·head.len()`
/// bytes each), in place, read a run at a time with `run(pos, max)` as [`gather`] reads them.
fn gather_f16<'a>(
    j0: usize,
    j1: usize,
    head: Range<usize>,
    width: usize,
    run: impl Fn(usize, usize) -> KvRows<'a>,
    rows: &mut [&'a [u8]; KEY_TILE],
) {
    let mut p = j0;
    while p < j1 {
        let r = run(p, j1 - p);
        let n = r.len(width).min(j1 - p);
        // As in `gather`: a store that gives less than a row, or changes its rows' type within
        // a call, breaks `KvView`'s promise; refused before any kernel reads.
        let KvRows::Encoded {
            ty: GgmlType::F16,
            bytes,
        } = r
        else {
            panic!(
                "attention: the KV store's rows at position {p} are not the f16 rows it began with"
            )
        };
        assert!(
            n >= 1,
            "attention: the KV store returned less than one row of {width} values at position {p}"
        );
        let (rb, b0, b1) = (2 * width, 2 * head.start, 2 * head.end);
        for k in 0..n {
            rows[p - j0 + k] = &bytes[k * rb + b0..k * rb + b1];
        }
        p += n;
    }
}

// ANCHOR: merge
/// Combine the splits' partial results of query vector `(i, h)` into `out`.
fn merge(parts: &[f32], splits: usize, stride: usize, idx: usize, out: &mut [f32]) {
    let w = out.len() + 2;
    let part = |s: usize| &parts[s * stride + idx * w..s * stride + (idx + 1) * w];
    let m = (0..splits)
        .map(|s| part(s)[0])
        .fold(f32::NEG_INFINITY, f32::max);
    out.fill(0.0);
    let mut l = 0.0;
    for s in 0..splits {
        let p = part(s);
        if p[1] == 0.0 {
            continue; // this split saw none of the query's keys
        }
        let c = (p[0] - m).exp();
        l += p[1] * c;
        for (o, a) in out.iter_mut().zip(&p[2..]) {
            *o += c * a;
        }
    }
    let inv = if l > 0.0 { 1.0 / l } else { 0.0 };
    out.iter_mut().for_each(|o| *o *= inv);
}
// ANCHOR_END: merge

// The entry points: each kernel compiled for each instruction set.
macro_rules! for_isa {
    ($isa:expr, $f:ident :: <S> ($($arg:expr),*)) => {
        match $isa {
            // SAFETY: a `SimdCompute` holds `F32Isa::Avx2` only where the CPU has AVX2 and FMA
            // (`with_isa` checks); the call's other conditions are stated where it is made.
            #[cfg(target_arch = "x86_64")]
            F32Isa::Avx2 => unsafe { avx2::$f($($arg),*) },
            // SAFETY: as above, `F32Isa::Avx512` only where the CPU has AVX-512 F, AVX2 and FMA.
            #[cfg(target_arch = "x86_64")]
            F32Isa::Avx512 => unsafe { avx512::$f($($arg),*) },
            // SAFETY: `Portable` is plain Rust; the call's other conditions are stated where it
            // is made.
            _ => unsafe { $f::<Portable>($($arg),*) },
        }
    };
}

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
        unsafe { super::attend_unit::<Avx2>(j, kvh, rows, keys, t, dst) }
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
        unsafe { super::attend_unit::<Avx512>(j, kvh, rows, keys, t, dst) }
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

    // ANCHOR: plan_runs
    /// The plans of `runs` (sequence, its tokens' indices in `tokens`, the first position its
    /// store holds), their units numbered and their partials placed one after another: in the
    /// buffer this compute keeps, so that a call allocates nothing once it has seen its size.
    fn plan(
        &self,
        attn: &Attention,
        tokens: &[TokenPos],
        runs: impl IntoIterator<Item = (usize, Range<usize>, usize)>,
    ) -> std::sync::MutexGuard<'_, Vec<RunPlan>> {
        let mut plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        plans.clear();
        let (mut units, mut parts) = (0, 0);
        for (seq, rows, first) in runs {
            let p = RunPlan::new(attn, tokens, seq, rows, first, units, parts);
            (units, parts) = (p.units.end, p.parts.end);
            plans.push(p);
        }
        plans
    }
    // ANCHOR_END: plan_runs

    // ANCHOR: attend_plans
    /// Attention of the runs `plans` (each the consecutive tokens of one sequence of `tokens`)
    /// as one pool job: every unit of every run, then the merge of the runs whose keys were
    /// split. `view(plan, f)` lends `f` the keys and values of a run's sequence.
    fn attend_plans(
        &self,
        attn: &Attention,
        q: &[f32],
        tokens: &[TokenPos],
        plans: &[RunPlan],
        view: &LendView,
        out: &mut [f32],
    ) {
        let n = tokens.len();
        let Some(last) = plans.last() else { return };
        // The units write `out` through a raw pointer: its length is checked here, once.
        let (qd, hd, n_kvh) = (attn.q_dim(), attn.head_dim, attn.n_head_kv);
        assert!(
            q.len() >= n * qd && out.len() >= n * qd,
            "attend: {n} tokens of {qd} values need that many queries and outputs, got {} and {}",
            q.len(),
            out.len()
        );
        for t in self.tiles.iter() {
            let mut t = t.lock().unwrap_or_else(|e| e.into_inner());
            t.reserve(Q_ROWS * (attn.n_head / n_kvh), hd, Q_ROWS);
        }
        let mut parts = self.partials.lock().unwrap_or_else(|e| e.into_inner());
        {
            // Room for this call's partials, and at least for a decoded token's at the end of
            // the context, so that a single sequence's decode steps never allocate.
            let decode = attn.rope.n_pos().div_ceil(KEY_SEGMENT) * attn.n_head * (2 + hd);
            let most = last.parts.end.max(decode);
            let have = parts.len();
            parts.reserve(most.saturating_sub(have));
            parts.resize(last.parts.end, 0.0);
        }
        let (dst_out, dst_parts) = (Out(out.as_mut_ptr()), Out(parts.as_mut_ptr()));
        // ANCHOR_END: attend_plans
        // ANCHOR: attend_locate
        // Where unit `u` is: its run, key split, KV head, rows (of the run) and keys.
        type Located<'p> = (&'p RunPlan, usize, usize, Range<usize>, Range<usize>);
        let locate = |u: usize| -> Located<'_> {
            let p = &plans[plans.partition_point(|p| p.units.end <= u)];
            let u = u - p.units.start;
            let (s, rest) = (u % p.splits, u / p.splits);
            let (kvh, rb) = (rest % n_kvh, rest / n_kvh);
            let rows = rb * Q_ROWS..((rb + 1) * Q_ROWS).min(p.rows.len());
            let seg = p.first_seg + s;
            let keys =
                (seg * KEY_SEGMENT).max(p.keys.start)..((seg + 1) * KEY_SEGMENT).min(p.keys.end);
            (p, s, kvh, rows, keys)
        };
        // Ask for the first two tiles of a unit's keys and values: issued while the unit
        // before it runs (a task's first unit: just before it), so that a unit does not begin
        // by waiting for memory. (A decode step's units are short: one row, a few tiles of
        // keys of another sequence each.)
        let ahead = |(p, _, kvh, rows, keys): &Located| {
            let lo = attn
                .visible(tokens[p.rows.start + rows.start].pos, p.first)
                .start;
            // Empty when the row sees none of the unit's keys (`prefetch_rows` then asks for
            // nothing).
            let lo = lo.max(keys.start);
            let first = lo..(lo + 2 * KEY_TILE).min(keys.end);
            let head = kvh * hd..(kvh + 1) * hd;
            view(p, &mut |kv| {
                prefetch_kv(kv, first.clone(), head.clone(), attn.kv_dim())
            });
        };
        // Tasks of consecutive units, so that each knows the unit it does next.
        let n_units = last.units.end;
        let tasks = n_units
            .min(self.pool.threads() * UNIT_TASKS_PER_THREAD)
            .max(1);
        // ANCHOR_END: attend_locate
        // ANCHOR: attend_units
        self.pool.run(tasks, &|i| {
            let mine = n_units * i / tasks..n_units * (i + 1) / tasks;
            if mine.is_empty() {
                return;
            }
            let mut unit = locate(mine.start);
            ahead(&unit);
            for u in mine.clone() {
                let next = (u + 1 < mine.end).then(|| locate(u + 1));
                if let Some(next) = &next {
                    ahead(next);
                }
                let (p, s, kvh, rows, keys) = unit;
                // Each unit writes rows `rows` of its run and heads `kvh·group..(kvh+1)·group`:
                // in `out` (which holds `n` rows, checked above) when the run's keys are not
                // split, in split `s`'s part of the run's partials otherwise (`plans` placed each
                // run's parts inside `parts`, resized above). No two units share a row, head and
                // split.
                let dst = if p.splits == 1 {
                    // SAFETY: the run's rows start inside `out`.
                    Dest::Out(Out(unsafe { dst_out.ptr().add(p.rows.start * qd) }))
                } else {
                    // SAFETY: split `s` of the run's partials starts inside `parts`.
                    Dest::Partial(Out(unsafe {
                        dst_parts.ptr().add(p.parts.start + s * p.stride)
                    }))
                };
                view(p, &mut |kv| {
                    let job = AttendJob {
                        attn,
                        q: &q[p.rows.start * qd..p.rows.end * qd],
                        tokens: &tokens[p.rows.clone()],
                        kv,
                        first: p.first,
                    };
                    self.with_tile(|t| {
                        for_isa!(
                            self.isa,
                            attend_unit::<S>(&job, kvh, rows.clone(), keys.clone(), t, dst)
                        )
                    });
                });
                match next {
                    Some(next) => unit = next,
                    None => break,
                }
            }
        });
        for p in plans.iter().filter(|p| p.splits > 1) {
            let out = &mut out[p.rows.start * qd..p.rows.end * qd];
            for (idx, o) in out.chunks_exact_mut(hd).enumerate() {
                merge(&parts[p.parts.clone()], p.splits, p.stride, idx, o);
            }
        }
    }
    // ANCHOR_END: attend_units

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::SpinPool;
    use ch01::config::RopeStyle;
    use ch03::TokenPos;

    /// A KV store that breaks `KvView`'s promise: its runs of keys and values are empty.
    struct EmptyRuns;

    impl KvView for EmptyRuns {
        fn key_run(&self, _pos: usize, _max: usize) -> KvRows<'_> {
            KvRows::F32(&[])
        }
        fn value_run(&self, _pos: usize, _max: usize) -> KvRows<'_> {
            KvRows::F32(&[])
        }
    }

    fn attention() -> Attention {
        Attention {
            n_head: 2,
            n_head_kv: 1,
            head_dim: 64,
            rope: RopeTable::new(64, 10000.0, 1.0, RopeStyle::Normal, 64),
            window: None,
            kq_scale: Attention::standard_scale(64),
        }
    }

    /// The fastest kernels this CPU has: the ones that read whole rows through pointers.
    fn compute() -> SimdCompute {
        SimdCompute::new(&KernelSet::best(), Arc::new(SpinPool::new(1)))
    }

    #[test]
    #[should_panic(expected = "less than one row")]
    fn a_store_returning_no_rows_is_refused_before_any_kernel_reads() {
        let a = attention();
        let tokens = TokenPos::run(0, 0, 3);
        let q = vec![1.0; 3 * a.q_dim()];
        let mut out = vec![0.0; 3 * a.q_dim()];
        compute().attend(&a, &q, &tokens, &EmptyRuns, &mut out);
    }

    #[test]
    #[should_panic(expected = "need that many queries and outputs")]
    fn a_short_output_is_refused() {
        let a = attention();
        let tokens = TokenPos::run(0, 0, 3);
        let q = vec![1.0; 3 * a.q_dim()];
        let mut out = vec![0.0; 2 * a.q_dim()];
        compute().attend(&a, &q, &tokens, &EmptyRuns, &mut out);
    }

    /// Keys and values of `n` positions, pseudo-random, one KV head of 64.
    struct Store(Vec<f32>, Vec<f32>);

    impl Store {
        fn new(n: usize) -> Store {
            let mut x = 1u64;
            let mut next = move || {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((x >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
            };
            Store(
                (0..n * 64).map(|_| next()).collect(),
                (0..n * 64).map(|_| next()).collect(),
            )
        }
    }

    impl KvView for Store {
        fn key_run(&self, pos: usize, _max: usize) -> KvRows<'_> {
            KvRows::F32(&self.0[pos * 64..(pos + 1) * 64])
        }
        fn value_run(&self, pos: usize, _max: usize) -> KvRows<'_> {
            KvRows::F32(&self.1[pos * 64..(pos + 1) * 64])
        }
    }

    /// Attention over an f16 or q8_0 cache: every instruction set's kernels (which decode a
    /// tile at a time) give what chapter 3's scalar reference gives (which decodes a piece at
    /// a time), to f32 rounding.
    #[test]
    fn every_isa_reads_f16_and_q8_0_caches_as_the_reference_does() {
        use ch03::{AttentionOps, KvStore, Scalar};
        use ch05::{CacheTypes, ContiguousCache, Overflow, RowType};
        use ch06::cache::ROW_Q8_0;
        // Attention outputs are averages of values of magnitude ~2: summation order moves
        // them by a few f32 roundings of that.
        const CLOSE: f32 = 1e-5;
        let a = Attention {
            rope: RopeTable::new(64, 10000.0, 1.0, RopeStyle::Normal, 1024),
            ..attention()
        };
        let n = 300;
        let rows = Store::new(n);
        let q: Vec<f32> = Store::new(2 * n).1.iter().map(|v| v * 0.7).collect();
        for t in [RowType::F16, ROW_Q8_0] {
            let types = CacheTypes { k: t, v: t };
            let mut kv = ContiguousCache::try_typed(1, 64, n, Overflow::Error, types).unwrap();
            kv.reserve(0, 0..n).unwrap();
            for p in 0..n {
                let (k, v) = (&rows.0[p * 64..][..64], &rows.1[p * 64..][..64]);
                kv.store(0, 0, p, k, v);
            }
            let view = kv.view(0, 0);
            let tokens = TokenPos::run(0, n - 40, 40);
            let q = &q[(n - 40) * a.q_dim()..n * a.q_dim()];
            let mut want = vec![0.0; 40 * a.q_dim()];
            Scalar.attend(&a, q, &tokens, &view, &mut want);
            for isa in [F32Isa::Portable, F32Isa::Avx2, F32Isa::Avx512] {
                if !isa.is_available() {
                    continue;
                }
                let c = SimdCompute::with_isa(isa, Arc::new(SpinPool::new(2)));
                let mut got = vec![0.0; want.len()];
                c.attend(&a, q, &tokens, &view, &mut got);
                for (i, (w, g)) in want.iter().zip(&got).enumerate() {
                    assert!(
                        (w - g).abs() <= CLOSE,
                        "{t} cache, {isa:?}, value {i}: {w} vs {g}"
                    );
                }
            }
        }
    }

    /// A query's attention is the same bits whether it comes alone (a decode step) or among
    /// others (a prompt chunk of any length), on one thread or several: the key segments are
    /// fixed positions. A server relies on it for a request to answer the same in any batch.
    #[test]
    fn a_querys_result_does_not_depend_on_its_batch_or_the_threads() {
        let a = Attention {
            rope: RopeTable::new(64, 10000.0, 1.0, RopeStyle::Normal, 1024),
            ..attention()
        };
        let (n, qd) = (700, a.q_dim());
        let kv = Store::new(n);
        let q: Vec<f32> = Store::new(2 * n).1.iter().map(|v| v * 0.7).collect(); // (n, 2 heads, 64)
        let run = |threads: usize, rows: std::ops::Range<usize>| {
            let c = SimdCompute::new(&KernelSet::best(), Arc::new(SpinPool::new(threads)));
            let mut out = vec![0.0; rows.len() * qd];
            let tokens = TokenPos::run(0, rows.start, rows.len());
            c.attend(
                &a,
                &q[rows.start * qd..rows.end * qd],
                &tokens,
                &kv,
                &mut out,
            );
            out
        };
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let chunk = run(2, 600..700);
        for (i, row) in [(0, 600), (50, 650), (99, 699)] {
            let alone = run(1, row..row + 1);
            assert_eq!(
                bits(&alone),
                bits(&run(2, row..row + 1)),
                "row {row}: threads"
            );
            assert_eq!(
                bits(&alone),
                bits(&chunk[i * qd..(i + 1) * qd]),
                "row {row}: batch"
            );
        }
    }

    #[test]
    fn rms_norm_writes_only_the_rows_both_sides_hold() {
        let (x, w) = (vec![2.0; 3 * 8], vec![1.0; 8]);
        let mut out = vec![0.0; 2 * 8];
        compute().rms_norm(&x, &w, 0.0, &mut out);
        assert!(out.iter().all(|&v| (v - 1.0).abs() < 1e-6), "{out:?}");
    }
}
