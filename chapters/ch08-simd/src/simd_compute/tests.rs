//! Unit tests of [`SimdCompute`](super::SimdCompute): stores that break `KvView`'s promise are
//! refused, every instruction set reads f16 and q8_0 caches as chapter 3's reference does, and a
//! query's result does not depend on its batch or the threads.

use super::*;
use crate::pool::SpinPool;
use ch01::config::RopeStyle;
use ch03::{KvRows, TokenPos};

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
    heads_of(64, 1024)
}

/// Two query heads of `hd` values on one KV head, RoPE for `n_ctx` positions.
fn heads_of(hd: usize, n_ctx: usize) -> Attention {
    Attention {
        n_head: 2,
        n_head_kv: 1,
        head_dim: hd,
        rope: RopeTable::new(hd, 10000.0, 1.0, RopeStyle::Normal, n_ctx),
        window: None,
        kq_scale: Attention::standard_scale(hd),
    }
}

/// The head sizes the tests below take: every size some instruction set has kernels of its
/// own for (64, 128, 256), and one none has (40).
const HEAD_SIZES: [usize; 4] = [64, 128, 256, 40];

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

/// Keys and values of `n` positions, pseudo-random, one KV head of `.2` values.
struct Store(Vec<f32>, Vec<f32>, usize);

impl Store {
    fn new(n: usize, hd: usize) -> Store {
        let mut x = 1u64;
        let mut next = move || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
        };
        Store(
            (0..n * hd).map(|_| next()).collect(),
            (0..n * hd).map(|_| next()).collect(),
            hd,
        )
    }
}

impl KvView for Store {
    fn key_run(&self, pos: usize, _max: usize) -> KvRows<'_> {
        KvRows::F32(&self.0[pos * self.2..(pos + 1) * self.2])
    }
    fn value_run(&self, pos: usize, _max: usize) -> KvRows<'_> {
        KvRows::F32(&self.1[pos * self.2..(pos + 1) * self.2])
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
    for (hd, t) in HEAD_SIZES
        .into_iter()
        .flat_map(|hd| [(hd, RowType::F16), (hd, ROW_Q8_0)])
    {
        if hd % 32 != 0 && t == ROW_Q8_0 {
            continue; // q8_0's blocks of 32 cannot hold such a head
        }
        let a = heads_of(hd, 1024);
        let n = 300;
        let rows = Store::new(n, hd);
        let q: Vec<f32> = Store::new(2 * n, hd).1.iter().map(|v| v * 0.7).collect();
        let types = CacheTypes { k: t, v: t };
        let mut kv = ContiguousCache::try_typed(1, hd, n, Overflow::Error, types).unwrap();
        kv.reserve(0, 0..n).unwrap();
        for p in 0..n {
            let (k, v) = (&rows.0[p * hd..][..hd], &rows.1[p * hd..][..hd]);
            kv.store(0, 0, p, k, v);
        }
        let view = kv.view(0, 0);
        let tokens = TokenPos::run(0, n - 40, 40);
        let q = &q[(n - 40) * a.q_dim()..n * a.q_dim()];
        let mut exact = vec![0.0; 40 * a.q_dim()];
        Scalar.attend(&a, q, &tokens, &view, &mut exact);
        // Where a set takes integer dot products with a q8_0 cache's keys, the queries are
        // rounded to q8_0 first, as llama.cpp rounds them: the reference given the rounded
        // queries computes the same scores in f32.
        let mut rounded = vec![0.0; 40 * a.q_dim()];
        Scalar.attend(&a, &rounded_q8_0(q), &tokens, &view, &mut rounded);
        for isa in [F32Isa::Portable, F32Isa::Avx2, F32Isa::Avx512] {
            if !isa.is_available() {
                continue;
            }
            #[cfg(target_arch = "x86_64")]
            let integer =
                isa == F32Isa::Avx512 && <crate::simd::x86::act::Avx512 as F32Simd>::keys_q8_0(hd);
            #[cfg(not(target_arch = "x86_64"))]
            let integer = false;
            let want = if t == ROW_Q8_0 && integer {
                &rounded
            } else {
                &exact
            };
            let c = SimdCompute::with_isa(isa, Arc::new(SpinPool::new(2)));
            let mut got = vec![0.0; want.len()];
            c.attend(&a, q, &tokens, &view, &mut got);
            for (i, (w, g)) in want.iter().zip(&got).enumerate() {
                assert!(
                    (w - g).abs() <= CLOSE,
                    "{t} cache, heads of {hd}, {isa:?}, value {i}: {w} vs {g}"
                );
            }
        }
    }
}

/// `x` rounded to q8_0 and back, as attention's integer path rounds its queries.
fn rounded_q8_0(x: &[f32]) -> Vec<f32> {
    use ch06::quants::{BlockQ8_0, dequantize_row_q8_0, quantize_row_q8_0};
    let zero = BlockQ8_0 {
        d: half::f16::ZERO,
        qs: [0; 32],
    };
    let mut blocks = vec![zero; x.len() / 32];
    quantize_row_q8_0(x, &mut blocks);
    let mut out = vec![0.0; x.len()];
    dequantize_row_q8_0(&blocks, &mut out);
    out
}

/// A query's attention is the same bits whether it comes alone (a decode step) or among
/// others (a prompt chunk of any length), on one thread or several: the key segments are
/// fixed positions, and every path a unit takes (an f16 cache read in place or decoded, a q8_0
/// cache's integer scores) gives the same bits. A server relies on it for a request to answer
/// the same in any batch. On an f32 cache, and on f16 and q8_0 ones.
#[test]
fn a_querys_result_does_not_depend_on_its_batch_or_the_threads() {
    for hd in HEAD_SIZES.into_iter().filter(|hd| hd % 32 == 0) {
        batch_and_threads_keep_the_bits(hd);
    }
}

/// [`a_querys_result_does_not_depend_on_its_batch_or_the_threads`] for heads of `hd` values.
fn batch_and_threads_keep_the_bits(hd: usize) {
    use ch03::KvStore;
    use ch05::{CacheTypes, ContiguousCache, Overflow, RowType};
    let a = heads_of(hd, 1024);
    let (n, qd) = (700, a.q_dim());
    let store = Store::new(n, hd);
    let q: Vec<f32> = Store::new(2 * n, hd).1.iter().map(|v| v * 0.7).collect(); // (n, 2, hd)
    let encoded = |t: RowType| {
        let types = CacheTypes { k: t, v: t };
        let mut kv = ContiguousCache::try_typed(1, hd, n, Overflow::Error, types).unwrap();
        kv.reserve(0, 0..n).unwrap();
        for p in 0..n {
            kv.store(0, 0, p, &store.0[p * hd..][..hd], &store.1[p * hd..][..hd]);
        }
        kv
    };
    let (f16, q8_0) = (encoded(RowType::F16), encoded(ch06::cache::ROW_Q8_0));
    let caches: [(&str, &dyn KvView); 3] = [
        ("f32", &store),
        ("f16", &f16.view(0, 0)),
        ("q8_0", &q8_0.view(0, 0)),
    ];
    for (name, kv) in caches {
        let run = |threads: usize, rows: std::ops::Range<usize>| {
            let c = SimdCompute::new(&KernelSet::best(), Arc::new(SpinPool::new(threads)));
            let mut out = vec![0.0; rows.len() * qd];
            let tokens = TokenPos::run(0, rows.start, rows.len());
            c.attend(
                &a,
                &q[rows.start * qd..rows.end * qd],
                &tokens,
                kv,
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
                "{name} cache, heads of {hd}, row {row}: threads"
            );
            assert_eq!(
                bits(&alone),
                bits(&chunk[i * qd..(i + 1) * qd]),
                "{name} cache, heads of {hd}, row {row}: batch"
            );
        }
    }
}

#[test]
fn rms_norm_writes_only_the_rows_both_sides_hold() {
    let (x, w) = (vec![2.0; 3 * 8], vec![1.0; 8]);
    let mut out = vec![0.0; 2 * 8];
    compute().rms_norm(&x, &w, 0.0, &mut out);
    assert!(out.iter().all(|&v| (v - 1.0).abs() < 1e-6), "{out:?}");
}

/// The online softmax, fed a row of scores a tile at a time (tiles of uneven lengths, the
/// maximum growing at some tiles and not at others), ends where one softmax over the whole
/// row does: `m` the largest score, `l = Σ e^(s − m)` and `acc = Σ e^(s − m)·v`, the values
/// weighted by what each step leaves in its tile, as `attend_unit` weights them.
#[test]
fn online_softmax_tile_by_tile_is_one_softmax() {
    use super::unit::online_softmax;
    // The vector `exp` is within 3e-7 of the true one (`EXP_REL` in tests/compute.rs), and
    // `l` and `acc` are f32 sums of 100 such terms, rescaled at most five times: a few parts
    // in 10⁶. A missing rescale or a weight taken against the wrong maximum is off by e^2 or
    // more here.
    const ONLINE_REL: f64 = 1e-5;
    let hd = 8;
    let tiles = [3, 32, 7, 32, 26];
    let n: usize = tiles.iter().sum();
    let kv = Store::new(n, 64);
    // Scores in [-2, 2] plus a ramp that starts low, so that later tiles raise the maximum;
    // the third tile is pushed down, so that one tile's maximum stays below the running one.
    let scores: Vec<f32> = (0..n)
        .map(|i| kv.0[i * 64] + 0.1 * i as f32 - if (35..42).contains(&i) { 8.0 } else { 0.0 })
        .collect();
    let value = |i: usize| &kv.1[i * 64..i * 64 + hd];
    let (mut m, mut l, mut acc) = (f32::NEG_INFINITY, 0.0f32, vec![0.0f32; hd]);
    let mut at = 0;
    for len in tiles {
        let mut s = scores[at..at + len].to_vec();
        // SAFETY: the portable kernels need no instruction beyond the baseline.
        unsafe { online_softmax::<Portable>(&mut s, &mut m, &mut l, &mut acc) };
        for (j, w) in s.iter().enumerate() {
            for (a, v) in acc.iter_mut().zip(value(at + j)) {
                *a += w * v;
            }
        }
        at += len;
    }
    let max = scores.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    assert_eq!(m, max, "m is the largest score");
    let w: Vec<f64> = scores
        .iter()
        .map(|&s| (s as f64 - max as f64).exp())
        .collect();
    let want_l: f64 = w.iter().sum();
    assert!(
        (l as f64 - want_l).abs() <= ONLINE_REL * want_l,
        "l = {l}, one softmax gives {want_l}"
    );
    for (d, &got) in acc.iter().enumerate() {
        let want: f64 = (0..n).map(|i| w[i] * value(i)[d] as f64).sum();
        let scale: f64 = (0..n).map(|i| w[i] * (value(i)[d] as f64).abs()).sum();
        assert!(
            (got as f64 - want).abs() <= ONLINE_REL * scale,
            "acc[{d}] = {got}, one softmax gives {want}"
        );
    }
}
