//! One unit of attention work: the query heads of one KV head, for a block of query rows,
//! against one range of keys, taken a tile of [`KEY_TILE`] keys at a time with an online
//! softmax. The unit writes its rows of the output, or its partial `(m, l, acc)` when the keys
//! were split and the results are merged afterwards (`plan.rs`).

use super::gather::{gather, gather_encoded, prefetch_kv};
use super::{KEY_TILE, Out};
use crate::simd::{F32Simd, KEYS_Q8_0, packed_q8_0_bytes};
use ch01::GgmlType;
use ch03::{Attention, KvRows, KvView, TokenPos};
use ch06::quants::blocks::BlockQ8_0;
use std::ops::Range;

// ANCHOR: attend_job
/// What every unit of one attention call shares.
pub(super) struct AttendJob<'a> {
    pub(super) attn: &'a Attention,
    pub(super) q: &'a [f32], // (n, n_head, head_dim)
    pub(super) tokens: &'a [TokenPos],
    pub(super) kv: &'a dyn KvView,
    pub(super) first: usize, // first position the store holds
}

/// The buffers of a unit, reused from call to call: one per thread of the pool.
#[derive(Default)]
pub(super) struct Tile {
    s: Vec<f32>,              // (n_qv, KEY_TILE): scores, then weights, of one tile
    m: Vec<f32>,              // (n_qv): running maximum
    l: Vec<f32>,              // (n_qv): running sum of weights
    acc: Vec<f32>,            // (n_qv, head_dim): running weighted sum of values
    vis: Vec<(usize, usize)>, // (rows): the keys each row sees, within the unit's range
    kdec: Vec<f32>,           // (KEY_TILE, head_dim): a tile's keys, decoded from an f16/q8_0 cache
    vdec: Vec<f32>,           // (KEY_TILE, head_dim): its values, likewise
    q8: Vec<BlockQ8_0>,       // (n_qv, head_dim / 32): the queries rounded, for a q8_0 cache
    kt8: Vec<u8>,             // a tile's q8_0 keys packed for the set's integer dot products
    dk: Vec<f32>,             // (head_dim / 32, KEY_TILE): their block scales
}

// The integer kernels pack a whole tile of keys at a time.
const _: () = assert!(KEY_TILE == KEYS_Q8_0);
// ANCHOR_END: attend_job

impl Tile {
    /// Capacity for units of up to `nq` query vectors of `hd` values and `rows` rows, so that
    /// the unit itself never allocates.
    pub(super) fn reserve(&mut self, nq: usize, hd: usize, rows: usize) {
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
        at_least(&mut self.q8, nq * hd.div_ceil(32));
        at_least(&mut self.kt8, packed_q8_0_bytes(hd));
        at_least(&mut self.dk, hd.div_ceil(32) * KEY_TILE);
    }
}

/// Where a unit writes: the final output rows, or its partial `(m, l, acc)` for a merge.
#[derive(Clone, Copy)]
pub(super) enum Dest {
    /// `out`, `(n, n_head, head_dim)`.
    Out(Out),
    /// This split's part of the partials, `(n, n_head, 2 + head_dim)`.
    Partial(Out),
}

// ANCHOR: attend_unit
/// One unit: query heads `kvh·group..(kvh+1)·group` of rows `rows`, against keys `keys`.
///
/// # Safety
/// `S`'s instructions are available; `dst` is valid for this unit's rows and heads, which no
/// other unit writes.
#[inline(always)]
pub(super) unsafe fn attend_unit<S: F32Simd>(
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

    // ANCHOR: attend_q8
    // A q8_0 key cache, where the set takes integer dot products: the queries rounded to q8_0
    // once for the unit, as llama.cpp rounds them, and each tile's keys packed once for all
    // its rows (`F32Simd::keys_q8_0`).
    let q8 = lo < hi
        && S::keys_q8_0(hd)
        && matches!(
            j.kv.key_run(lo, 1),
            KvRows::Encoded {
                ty: GgmlType::Q8_0,
                ..
            }
        );
    let nb = hd / 32;
    if q8 {
        let zero = BlockQ8_0 {
            d: half::f16::ZERO,
            qs: [0; 32],
        };
        t.q8.clear();
        t.q8.resize(nq * nb, zero);
        t.kt8.resize(packed_q8_0_bytes(hd), 0);
        t.dk.resize(nb * KEY_TILE, 0.0);
        for r in 0..nr {
            // SAFETY: `S`'s instructions are enabled (this function's contract).
            unsafe {
                S::quantize_q8_0(q_group(r), &mut t.q8[r * group * nb..(r + 1) * group * nb])
            };
        }
    }
    // ANCHOR_END: attend_q8

    // ANCHOR: attend_tile
    // Ask for the keys and values ahead of use, two tiles ahead: a decode step reads every
    // sequence's cache once, rows of one KV head a few lines apart, which the hardware does
    // not guess soon enough. Into L2 (`prefetcht1`): L1 keeps the decoded tile. The unit's
    // first two tiles were asked for before it began (`ahead` in `attend_plans`).
    let head = kvh * hd..(kvh + 1) * hd;
    let ahead = |keys: Range<usize>| prefetch_kv(j.kv, keys, head.clone(), kvd);
    // An f16 cache is read in place where the kernels convert its rows as they load them
    // (AVX-512, heads of 64, 128 or 256 values): no decoded copy of the tile to write and read
    // back.
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
        let mut khalf: [&[u8]; KEY_TILE] = [&[]; KEY_TILE]; // f16 rows, or q8_0 ones to pack
        let mut vhalf: [&[u8]; KEY_TILE] = [&[]; KEY_TILE];
        // ANCHOR_END: attend_tile
        // ANCHOR: attend_gather
        if in_place {
            gather_encoded(
                GgmlType::F16,
                j0,
                j1,
                head.clone(),
                kvd,
                |p, m| j.kv.key_run(p, m),
                &mut khalf,
            );
            gather_encoded(
                GgmlType::F16,
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
                if q8 {
                    let key_run = |p, m| j.kv.key_run(p, m);
                    gather_encoded(
                        GgmlType::Q8_0,
                        j0,
                        j1,
                        head.clone(),
                        kvd,
                        key_run,
                        &mut khalf,
                    );
                    S::pack_keys_q8_0(&khalf[..j1 - j0], hd, &mut t.kt8, &mut t.dk);
                } else {
                    gather::<S>(
                        j0,
                        j1,
                        kvh * hd..(kvh + 1) * hd,
                        kvd,
                        |p, m| j.kv.key_run(p, m),
                        &mut kdec,
                        &mut krows,
                    );
                }
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
        // The rows in runs that see the same keys of the tile (all of them, but for the tiles
        // on the diagonal): each row's scores and weights, then the run's weighted values in
        // one call, each value row read once for several rows' query vectors.
        let seen = |r: usize| {
            let (vlo, vhi) = t.vis[r];
            (vlo.clamp(j0, j1) - j0, vhi.clamp(j0, j1) - j0)
        };
        let mut r = 0;
        while r < nr {
            // The keys of the tile this row sees, as indices into the tile.
            let (a, b) = seen(r);
            if a >= b {
                r += 1;
                continue; // this row sees none of the tile's keys
            }
            let mut run_end = r + 1;
            while run_end < nr && seen(run_end) == (a, b) {
                run_end += 1;
            }
            for r in r..run_end {
                // The row's query vectors of this KV head's group: side by side in `q`, their
                // scores `KEY_TILE` apart in `t.s`, their accumulators side by side in `t.acc`.
                let s0 = r * group * KEY_TILE;
                // Scores for all of them, each key read once for the group.
                let q = q_group(r);
                // SAFETY: `S`'s instructions are enabled (this function's contract); the
                // gathers filled rows `a..b` of the tile with `hd`-value rows of the keys, as
                // the kernels need, and `t.s` holds `KEY_TILE` scores for every query vector
                // of the unit.
                unsafe {
                    let s = &mut t.s[s0..];
                    let q8 = q8.then(|| &t.q8[r * group * nb..(r + 1) * group * nb]);
                    match (in_place, q8) {
                        (true, _) => {
                            S::scores_heads_f16(q, hd, &khalf[a..b], scale, &mut s[a..], KEY_TILE)
                        }
                        (_, Some(q8)) => {
                            S::scores_heads_q8_0(q8, hd, &t.kt8, &t.dk, a..b, scale, s, KEY_TILE)
                        }
                        _ => S::scores_heads(q, hd, &krows[a..b], scale, &mut s[a..], KEY_TILE),
                    }
                };
                // ANCHOR_END: attend_softmax
                // ANCHOR: attend_weights
                for g in 0..group {
                    // The online softmax: rescale what was accumulated if the maximum grew,
                    // and turn this tile's scores into weights.
                    let qv = r * group + g;
                    let s = &mut t.s[qv * KEY_TILE + a..qv * KEY_TILE + b];
                    let acc = &mut t.acc[qv * hd..(qv + 1) * hd];
                    // SAFETY: `S`'s instructions are enabled (this function's contract).
                    unsafe { online_softmax::<S>(s, &mut t.m[qv], &mut t.l[qv], acc) };
                }
            }
            // The weighted values for the run's query vectors (each its weights `KEY_TILE`
            // apart, as for one row), each value row read once for as many as the kernels
            // take at a time.
            let acc = &mut t.acc[r * group * hd..run_end * group * hd];
            let p = &t.s[r * group * KEY_TILE + a..];
            // SAFETY: `S`'s instructions are enabled; `acc` holds `hd` values for each of the
            // run's query vectors and the gathers filled rows `a..b` of the tile with
            // `hd`-value rows of the values, as the kernels need.
            unsafe {
                match in_place {
                    true => S::weighted_sum_heads_f16(acc, hd, p, KEY_TILE, &vhalf[a..b]),
                    false => S::weighted_sum_heads(acc, hd, p, KEY_TILE, &vrows[a..b]),
                }
            };
            r = run_end;
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

// ANCHOR: online_softmax
/// One tile's step of the online softmax for one query vector: `s` holds its scores for the
/// tile's keys, `m` is the largest score before this tile, `l` the sum of `e^(score − m)` and
/// `acc` the sum of `e^(score − m) · value` (the values come after, weighted by what this
/// leaves in `s`). Afterwards `m` is the largest score including the tile's, `l` and `acc` are
/// as if that had been the maximum from the start, and `s` holds the tile's weights
/// `e^(score − m)`, their sum added to `l`.
///
/// # Safety
/// `S`'s instructions are available.
#[inline(always)]
pub(super) unsafe fn online_softmax<S: F32Simd>(
    s: &mut [f32],
    m: &mut f32,
    l: &mut f32,
    acc: &mut [f32],
) {
    // ANCHOR: yours_online_softmax
    // SAFETY: `S`'s instructions are enabled; `max` reads only inside its slice.
    let tile_max = unsafe { S::max(s) };
    let m_new = m.max(tile_max);
    if m_new > *m {
        let corr = (*m - m_new).exp(); // 0 on the first tile: m = -inf
        *l *= corr;
        // SAFETY: `S`'s instructions are enabled; `scale` writes only inside its slice.
        unsafe { S::scale(acc, corr) };
        *m = m_new;
    }
    // SAFETY: `S`'s instructions are enabled; `exp_sum` stays inside its slice.
    *l += unsafe { S::exp_sum(s, m_new) };
    // ANCHOR_END: yours_online_softmax
}
// ANCHOR_END: online_softmax
