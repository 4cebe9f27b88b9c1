//! One attention call as a plan of units of work: each run of a sequence's tokens cut into
//! units (query heads of one KV head × a block of [`Q_ROWS`] rows × a segment of keys), all
//! the call's units handed to the pool as one job, and the partial results of split keys
//! merged at the end.

use super::gather::prefetch_kv;
use super::unit::{AttendJob, Dest, attend_unit};
use super::{KEY_SEGMENT, KEY_TILE, Out, Q_ROWS, SimdCompute, UNIT_TASKS_PER_THREAD};
use ch03::{Attention, KvView, TokenPos};
use std::ops::Range;

// ANCHOR: run_plan
/// One run of an attention call — the consecutive tokens of one sequence — and how its work is
/// cut into units: query heads of one KV head × a block of [`Q_ROWS`] rows × a segment of
/// keys. The cut depends on the run alone, never on the rest of the call, so a query's result
/// is the same bits alone or in any batch.
pub(super) struct RunPlan {
    pub(super) seq: usize,
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

impl SimdCompute {
    // ANCHOR: plan_runs
    /// The plans of `runs` (sequence, its tokens' indices in `tokens`, the first position its
    /// store holds), their units numbered and their partials placed one after another: in the
    /// buffer this compute keeps, so that a call allocates nothing once it has seen its size.
    pub(super) fn plan(
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
    pub(super) fn attend_plans(
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
            // The KV head varies fastest: a task's consecutive units read the same keys'
            // rows, each its own part of them (a cache row holds every KV head of a position
            // side by side), so what the hardware fetched ahead along the page for one unit is
            // the next unit's.
            // (With the split varying fastest instead, a token decoded 4k positions deep took
            // 1.14× as long, on 2 threads.)
            let (kvh, rest) = (u % n_kvh, u / n_kvh);
            let (s, rb) = (rest % p.splits, rest / p.splits);
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
