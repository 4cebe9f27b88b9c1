//! Chapter 8's `SimdCompute` against the scalar reference of chapters 3 and 4, on random data
//! and odd sizes: the lane kernels one by one, then attention, RMSNorm, SwiGLU and the residual
//! add through the `Compute` seam, on one thread and several.
//!
//! Nothing here is bit-exact, and each tolerance says why:
//! - the vector `exp` is a polynomial, not libm's `expf`;
//! - sums are added in another order (eight lanes, then across them), and the tiled
//!   attention adds its softmax denominator in f32 tile by tile where the reference adds it in
//!   f64 in one go, and rescales as the running maximum grows.

use ch01::config::RopeStyle;
use ch03::{Attention, AttentionOps, KvStore, RopeTable, Scalar, TokenPos, VecKv};
use ch04::{Activation, Compute};
use ch05::{ContiguousCache, Overflow};
use ch08::kernels::{Isa, KernelSet};
use ch08::pool::{Parallel, RayonPool, SpinPool};
use ch08::simd_compute::{F32Isa, SimdCompute};
use std::sync::Arc;
use testkit::{Tolerance, assert_close};

/// Vector `exp` against `f64::exp`, relative: a degree-7 polynomial on |r| <= ln 2 / 2 is
/// exact to ~5e-9, and the range reduction and Horner steps add a few f32 roundings (each
/// 6e-8); 3e-7 is about five of them. (The lane kernels are compared on x86 only.)
#[cfg(target_arch = "x86_64")]
const EXP_REL: f64 = 3e-7;
/// Lane kernels (dot, SwiGLU, RMSNorm) against the portable ones: the same products summed in
/// another order, plus `exp`'s error for SwiGLU. For sums of up to 1023 terms of size ~1 the
/// reordering error is ~1e-6 absolute.
const LANES_TOL: Tolerance = Tolerance {
    abs: 2e-5,
    rel: 1e-5,
};
/// Attention against the reference: outputs are weighted means of values in [-1, 1]. The
/// weights differ by `exp`'s error and the reordered sums (relative ~1e-7 each), so the
/// outputs differ by ~1e-6 (observed 5.4e-7 over every case below). A wrong mask, scale or
/// merge gives errors of order 0.1.
const ATTN_TOL: Tolerance = Tolerance {
    abs: 5e-6,
    rel: 1e-5,
};

/// Deterministic values in [-1, 1).
fn noise(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// Whether the CPU has `isa`; where it is one this architecture is expected to have, its
/// absence fails the test unless `LLM_RS_ALLOW_MISSING_ISA` is set (`testkit::isa`).
fn has(isa: Isa) -> bool {
    testkit::isa::require(isa.name(), &isa.missing_features())
}

/// Every set of f32 kernels of this architecture's instruction sets (each one the CPU must
/// have, as [`has`] says), portable first.
fn vector_isas() -> Vec<F32Isa> {
    let mut v = vec![F32Isa::Portable];
    let sets = Isa::ALL
        .into_iter()
        .filter(|&isa| testkit::isa::is_native(isa.name()) && has(isa))
        .map(|isa| KernelSet::for_isa(isa).expect("the CPU has it"));
    for k in sets {
        let isa = F32Isa::for_kernels(&k);
        if !v.contains(&isa) {
            v.push(isa);
        }
    }
    v
}

fn pools() -> Vec<Arc<dyn Parallel>> {
    vec![
        Arc::new(SpinPool::new(1)),
        Arc::new(SpinPool::new(2)),
        Arc::new(RayonPool::new(3)),
    ]
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use ch08::simd::x86::act::{Avx2, Avx512};
    use ch08::simd_compute::{F32Simd, Portable};
    use proptest::prelude::*;

    /// The bits of each float: equal only where every operation was the same.
    fn bits(x: &[f32]) -> Vec<u32> {
        x.iter().map(|v| v.to_bits()).collect()
    }

    /// The odd lengths where tails go wrong, and some long ones.
    fn lengths() -> impl Strategy<Value = usize> {
        prop_oneof![
            1usize..40,
            Just(63),
            Just(64),
            Just(65),
            Just(127),
            Just(1023)
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn lane_kernels_match_the_portable_ones(n in lengths(), seed in any::<u64>()) {
            if !has(Isa::Avx2) {
                return Ok(());
            }
            let (a, b) = (noise(n, seed), noise(n, seed ^ 1));
            // SAFETY: the CPU has AVX2 and FMA (checked above).
            unsafe {
                let (x, y) = (Avx2::dot(&a, &b), Portable::dot(&a, &b));
                assert_close("dot", &[1], &[x], &[y], LANES_TOL);

                let (mut x, mut y) = (a.clone(), a.clone());
                Avx2::silu_mul(&mut x, &b);
                Portable::silu_mul(&mut y, &b);
                assert_close("silu_mul", &[n], &x, &y, LANES_TOL);

                let (mut x, mut y) = (a.clone(), a.clone());
                Avx2::axpy(&mut x, 0.37, &b);
                Portable::axpy(&mut y, 0.37, &b);
                assert_close("axpy", &[n], &x, &y, LANES_TOL);

                let (mut x, mut y) = (a.clone(), a.clone());
                Avx2::add(&mut x, &b);
                Portable::add(&mut y, &b);
                assert_close("add", &[n], &x, &y, Tolerance::EXACT);

                assert_eq!(Avx2::max(&a), Portable::max(&a));

                let (mut x, mut y) = (vec![0.0; n], vec![0.0; n]);
                Avx2::scale_mul(&a, 1.7, &b, &mut x);
                Portable::scale_mul(&a, 1.7, &b, &mut y);
                assert_close("scale_mul", &[n], &x, &y, Tolerance::EXACT);
            }
        }

        #[test]
        fn vector_exp_is_accurate(n in lengths(), seed in any::<u64>()) {
            if !has(Isa::Avx2) {
                return Ok(());
            }
            // Arguments as softmax gives them: from -87 (the smallest normal result) to 0.
            let x: Vec<f32> = noise(n, seed).iter().map(|v| (v - 1.0) * 43.5).collect();
            let mut e = x.clone();
            // SAFETY: as above.
            let sum = unsafe { Avx2::exp_sum(&mut e, 0.0) };
            let mut want_sum = 0.0f64;
            for (&x, &e) in x.iter().zip(&e) {
                let want = (x as f64).exp();
                want_sum += want;
                let rel = (e as f64 - want).abs() / want;
                prop_assert!(rel < EXP_REL, "exp({x}) = {e}, want {want}: rel {rel:.2e}");
            }
            prop_assert!(((sum as f64) - want_sum).abs() <= 1e-6 * want_sum.max(1e-30));

            // AVX-512's sixteen lanes give the eight lanes' bits, values and sum, so that a
            // query's result does not depend on which of the two a kernel took.
            if has(Isa::Avx512) {
                let (mut e8, mut e16) = (x.clone(), x.clone());
                // SAFETY: the CPU has AVX-512 F (checked), and AVX2 and FMA (checked above).
                let (s8, s16) = unsafe { (Avx2::exp_sum(&mut e8, -0.5), Avx512::exp_sum(&mut e16, -0.5)) };
                prop_assert_eq!(s8.to_bits(), s16.to_bits());
                prop_assert_eq!(bits(&e8), bits(&e16));
            }
        }

        #[test]
        fn score_and_value_kernels_match_row_by_row(
            hd in prop_oneof![Just(64usize), Just(128), Just(256), Just(40), Just(8)],
            nk in 1usize..70,
            seed in any::<u64>(),
        ) {
            if !has(Isa::Avx2) {
                return Ok(());
            }
            let q = noise(hd, seed);
            let kv = noise(nk * hd, seed ^ 7);
            let rows: Vec<&[f32]> = kv.chunks_exact(hd).collect();
            let (mut s1, mut s2) = (vec![0.0; nk], vec![0.0; nk]);
            let p = noise(nk, seed ^ 9);
            let (mut a1, mut a2) = (noise(hd, seed ^ 3), noise(hd, seed ^ 3));
            // SAFETY: as above.
            unsafe {
                Avx2::scores(&q, &rows, 0.125, &mut s1);
                Portable::scores(&q, &rows, 0.125, &mut s2);
                Avx2::weighted_sum(&mut a1, &p, &rows);
                Portable::weighted_sum(&mut a2, &p, &rows);
            }
            assert_close("scores", &[nk], &s1, &s2, LANES_TOL);
            assert_close("weighted_sum", &[hd], &a1, &a2, LANES_TOL);
            if has(Isa::Avx512) {
                let mut a3 = noise(hd, seed ^ 3);
                // SAFETY: the CPU has AVX-512 F (checked).
                unsafe {
                    Avx512::scores(&q, &rows, 0.125, &mut s1);
                    Avx512::weighted_sum(&mut a3, &p, &rows);
                }
                assert_close("scores, avx512", &[nk], &s1, &s2, LANES_TOL);
                assert_close("weighted_sum, avx512", &[hd], &a3, &a2, LANES_TOL);
            }
        }

        #[test]
        fn a_groups_kernels_give_each_head_its_own_bits(
            hd in prop_oneof![Just(64usize), Just(128), Just(256), Just(40)],
            group in 1usize..9,
            nk in 1usize..70,
            seed in any::<u64>(),
        ) {
            if !has(Isa::Avx512) {
                return Ok(());
            }
            // `group` query heads against the same keys and values, scores `STRIDE` apart: the
            // group calls (which load each row once for several heads where a kernel exists:
            // scores of 64-value heads in threes, weighted sums in sixes, 128-value ones in twos,
            // 256-value ones alone;
            // the sums of sixteen keys at a time) against one call per head.
            const STRIDE: usize = 80;
            let q = noise(group * hd, seed); // (group, hd)
            let kv = noise(nk * hd, seed ^ 7); // (nk, hd)
            let rows: Vec<&[f32]> = kv.chunks_exact(hd).collect();
            let p = noise(group * STRIDE, seed ^ 9); // (group, STRIDE)
            let (mut s1, mut s2) = (vec![0.0; group * STRIDE], vec![0.0; group * STRIDE]);
            let (mut a1, mut a2) = (noise(group * hd, seed ^ 3), noise(group * hd, seed ^ 3));
            // SAFETY: the CPU has AVX-512 F (checked); every row holds `hd` values.
            unsafe {
                Avx512::scores_heads(&q, hd, &rows, 0.125, &mut s1, STRIDE);
                Avx512::weighted_sum_heads(&mut a1, hd, &p, STRIDE, &rows);
                for g in 0..group {
                    let s = &mut s2[g * STRIDE..g * STRIDE + nk];
                    Avx512::scores(&q[g * hd..(g + 1) * hd], &rows, 0.125, s);
                    let p = &p[g * STRIDE..g * STRIDE + nk];
                    Avx512::weighted_sum(&mut a2[g * hd..(g + 1) * hd], p, &rows);
                }
            }
            prop_assert_eq!(bits(&s1), bits(&s2));
            prop_assert_eq!(bits(&a1), bits(&a2));

            // The same rows kept in f16 and read in place: where the set has kernels of its own
            // (`heads_f16`), the bits of the rows decoded first; elsewhere the default, a row at
            // a time, close to them.
            let halves: Vec<u8> = kv
                .iter()
                .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
                .collect();
            let hrows: Vec<&[u8]> = halves.chunks_exact(2 * hd).collect();
            let decoded: Vec<f32> = halves
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect();
            let drows: Vec<&[f32]> = decoded.chunks_exact(hd).collect();
            let (mut s3, mut s4) = (vec![0.0; group * STRIDE], vec![0.0; group * STRIDE]);
            let (mut a3, mut a4) = (noise(group * hd, seed ^ 3), noise(group * hd, seed ^ 3));
            // SAFETY: as above; every f16 row holds `2·hd` bytes.
            unsafe {
                Avx512::scores_heads_f16(&q, hd, &hrows, 0.125, &mut s3, STRIDE);
                Avx512::weighted_sum_heads_f16(&mut a3, hd, &p, STRIDE, &hrows);
                Avx512::scores_heads(&q, hd, &drows, 0.125, &mut s4, STRIDE);
                Avx512::weighted_sum_heads(&mut a4, hd, &p, STRIDE, &drows);
            }
            if Avx512::heads_f16(hd, group) {
                prop_assert_eq!(bits(&s3), bits(&s4));
                prop_assert_eq!(bits(&a3), bits(&a4));
            } else {
                assert_close("scores_heads_f16", &[group * STRIDE], &s3, &s4, LANES_TOL);
                assert_close("weighted_sum_heads_f16", &[group * hd], &a3, &a4, LANES_TOL);
            }
        }

        #[test]
        fn q8_0_key_kernels_give_the_plain_loops_bits(
            hd in prop_oneof![Just(64usize), Just(128), Just(256)],
            group in 1usize..4,
            nk in 1usize..=32,
            cut in (0usize..32, 0usize..32),
            seed in any::<u64>(),
        ) {
            if !has(Isa::Avx512Vnni) {
                return Ok(());
            }
            use ch06::quants::{BlockQ8_0, quantize_row_q8_0};
            use ch08::simd::{KEYS_Q8_0, pack_keys_q8_0_rows, packed_q8_0_bytes};
            use ch08::simd::scores_heads_q8_0_rows;
            const STRIDE: usize = 40;
            let nb = hd / 32;
            let zero = BlockQ8_0 { d: half::f16::ZERO, qs: [0; 32] };
            // Keys and queries as a cache and attention hold them: q8_0 blocks.
            let quantized = |x: &[f32]| {
                let mut b = vec![zero; x.len() / 32];
                quantize_row_q8_0(x, &mut b);
                b
            };
            let keys = quantized(&noise(nk * hd, seed ^ 5));
            let bytes: &[u8] = bytemuck::cast_slice(&keys);
            let rows: Vec<&[u8]> = bytes.chunks_exact(34 * nb).collect();
            let q = quantized(&noise(group * hd, seed));
            // Any run of the keys, as a row of a prompt sees a tile (empty ones too).
            let (a, b) = ((cut.0 % nk).min(cut.1 % (nk + 1)), cut.1 % (nk + 1));
            let (mut kt1, mut kt2) = (vec![0u8; packed_q8_0_bytes(hd)], vec![0u8; packed_q8_0_bytes(hd)]);
            let (mut d1, mut d2) = (vec![0.0; nb * KEYS_Q8_0], vec![0.0; nb * KEYS_Q8_0]);
            let (mut s1, mut s2) = (vec![0.0; group * STRIDE], vec![0.0; group * STRIDE]);
            // SAFETY: the CPU has AVX-512 F and VNNI (checked above); the rows hold `hd / 32`
            // blocks each.
            unsafe {
                Avx512::pack_keys_q8_0(&rows, hd, &mut kt1, &mut d1);
                Avx512::scores_heads_q8_0(&q, hd, &kt1, &d1, a..b, 0.125, &mut s1, STRIDE);
            }
            pack_keys_q8_0_rows(&rows, hd, &mut kt2, &mut d2);
            scores_heads_q8_0_rows(&q, hd, &kt2, &d2, a..b, 0.125, &mut s2, STRIDE);
            for g in 0..group {
                let r = g * STRIDE + a..g * STRIDE + b;
                prop_assert_eq!(bits(&s1[r.clone()]), bits(&s2[r]), "query {}", g);
            }
            // And the plain loops' scores are the dot products of what the blocks hold.
            for g in 0..group {
                for j in a..b {
                    let deq = |x: &[BlockQ8_0]| -> Vec<f64> {
                        x.iter()
                            .flat_map(|b| b.qs.map(|c| c as f64 * b.d.to_f32() as f64))
                            .collect()
                    };
                    let (k, qg) = (deq(&keys[j * nb..(j + 1) * nb]), deq(&q[g * nb..(g + 1) * nb]));
                    let want = 0.125 * k.iter().zip(&qg).map(|(a, b)| a * b).sum::<f64>();
                    let got = s2[g * STRIDE + j] as f64;
                    prop_assert!((got - want).abs() <= 1e-5 * (1.0 + want.abs()), "{} vs {}", got, want);
                }
            }
        }
    }
}

/// An `Attention` with `n_head` query heads, `n_head_kv` KV heads of `hd` dimensions.
fn attention(n_head: usize, n_head_kv: usize, hd: usize, window: Option<usize>) -> Attention {
    Attention {
        n_head,
        n_head_kv,
        head_dim: hd,
        rope: RopeTable::new(hd, 10000.0, 1.0, RopeStyle::Normal, 2048),
        window,
        kq_scale: Attention::standard_scale(hd),
    }
}

/// Attention of `n` new tokens after `past` stored ones, through `ops`, on the store `kv`.
fn attend_with<K: KvStore>(
    ops: &dyn AttentionOps,
    a: &Attention,
    kv: &mut K,
    past: usize,
    n: usize,
    seed: u64,
) -> Vec<f32> {
    let kvd = a.kv_dim();
    let total = past + n;
    kv.reserve(0, 0..total).unwrap();
    let k = noise(total * kvd, seed);
    let v = noise(total * kvd, seed ^ 5);
    for p in 0..total {
        kv.store(0, 0, p, &k[p * kvd..][..kvd], &v[p * kvd..][..kvd]);
    }
    let tokens = TokenPos::run(0, past, n);
    // Queries scaled up so that the softmax is peaked, as in a real model.
    let q: Vec<f32> = noise(n * a.q_dim(), seed ^ 11)
        .iter()
        .map(|x| x * 4.0)
        .collect();
    let mut out = vec![f32::NAN; n * a.q_dim()];
    ops.attend(a, &q, &tokens, &kv.view(0, 0), &mut out);
    out
}

#[test]
fn tiled_attention_matches_the_reference() {
    let shapes = [(9, 3, 64), (4, 4, 32), (8, 2, 128), (6, 2, 40), (2, 1, 8)];
    let cases = [
        (0, 1),
        (0, 9),
        (5, 3),
        (130, 1),
        (0, 33),
        (64, 64),
        (300, 2),
        (1000, 1),
    ];
    let mut worst = 0.0f32;
    for isa in vector_isas() {
        for pool in pools() {
            let simd = SimdCompute::with_isa(isa, pool.clone());
            for (si, &(nh, nkv, hd)) in shapes.iter().enumerate() {
                for window in [None, Some(5), Some(100)] {
                    let a = attention(nh, nkv, hd, window);
                    for &(past, n) in &cases {
                        let seed = (si * 1000 + past * 7 + n) as u64;
                        let mut kv1 = VecKv::new(1, a.kv_dim());
                        let mut kv2 = VecKv::new(1, a.kv_dim());
                        let want = attend_with(&Scalar, &a, &mut kv1, past, n, seed);
                        let got = attend_with(&simd, &a, &mut kv2, past, n, seed);
                        let r = assert_close(
                            &format!(
                                "attention {isa:?}, {}, heads {nh}/{nkv}×{hd}, window {window:?}, {n} after {past}",
                                pool.describe()
                            ),
                            &[n, nh * hd],
                            &got,
                            &want,
                            ATTN_TOL,
                        );
                        worst = worst.max(r.max_abs);
                    }
                }
            }
        }
    }
    eprintln!("tiled attention vs reference: max abs error {worst:.2e}");
}

#[test]
fn attention_reads_a_wrapped_ring_and_a_paged_cache() {
    // A sliding-window cache whose ring has wrapped (runs of keys end at the ring's end), and
    // a paged cache (runs end at block ends): the same result as a plain store.
    // The window (40) leaves room in the ring (48) for the batch's own 5 new positions.
    let a = attention(9, 3, 64, Some(40));
    let simd = SimdCompute::with_isa(*vector_isas().last().unwrap(), Arc::new(SpinPool::new(2)));
    let (past, n) = (90, 5);
    let want = attend_with(&Scalar, &a, &mut VecKv::new(1, a.kv_dim()), past, n, 3);
    let mut ring = ContiguousCache::new(1, a.kv_dim(), 48, Overflow::SlidingWindow);
    // Fill it position by position, as decoding does, so that it wraps.
    let kvd = a.kv_dim();
    let (k, v) = (noise((past + n) * kvd, 3), noise((past + n) * kvd, 3 ^ 5));
    for p in 0..past + n {
        ring.reserve(0, p..p + 1).unwrap();
        ring.store(0, 0, p, &k[p * kvd..][..kvd], &v[p * kvd..][..kvd]);
    }
    let q: Vec<f32> = noise(n * a.q_dim(), 3 ^ 11)
        .iter()
        .map(|x| x * 4.0)
        .collect();
    let tokens = TokenPos::run(0, past, n);
    let mut got = vec![0.0; n * a.q_dim()];
    simd.attend(&a, &q, &tokens, &ring.view(0, 0), &mut got);
    assert_close(
        "attention on a wrapped ring",
        &[n, a.q_dim()],
        &got,
        &want,
        ATTN_TOL,
    );

    let mut paged = ch05::PagedCache::new(1, kvd, 7, 32);
    let got = attend_with(&simd, &a, &mut paged, past, n, 3);
    assert_close(
        "attention on a paged cache",
        &[n, a.q_dim()],
        &got,
        &want,
        ATTN_TOL,
    );
}

#[test]
fn a_batch_of_sequences_attends_as_each_alone() {
    // Chapter 7's batches put several sequences in one call, as one parallel region: a decode
    // step of many (one token each, some past KEY_SEGMENT so that their keys are split) and
    // prompt chunks (several rows, more than Q_ROWS). Each sequence's result must be the bits
    // it gets alone (chapter 11 relies on it), in an f32 and an f16 paged cache, and close to
    // the scalar reference's batch.
    let a = attention(9, 3, 64, None);
    let kvd = a.kv_dim();
    // (sequence, positions already stored, new tokens)
    let seqs = [
        (3, 40, 1),
        (0, 300, 1),
        (5, 7, 12),
        (1, 0, 1),
        (2, 600, 1),
        (4, 250, 20),
    ];
    for types in [ch05::CacheTypes::F32, ch05::CacheTypes::F16] {
        let mut kv = ch05::PagedCache::try_typed(1, kvd, 16, 160, types).unwrap();
        let mut tokens = Vec::new();
        for &(seq, past, n) in &seqs {
            kv.reserve(seq, 0..past + n).unwrap();
            let (k, v) = (
                noise((past + n) * kvd, seq as u64),
                noise((past + n) * kvd, !seq as u64),
            );
            for p in 0..past + n {
                kv.store(0, seq, p, &k[p * kvd..][..kvd], &v[p * kvd..][..kvd]);
            }
            tokens.extend(TokenPos::run(seq, past, n));
        }
        let q: Vec<f32> = noise(tokens.len() * a.q_dim(), 77)
            .iter()
            .map(|x| x * 4.0)
            .collect();
        let qd = a.q_dim();
        let mut want = vec![f32::NAN; tokens.len() * qd];
        Scalar.attend_batch(&a, 0, &q, &tokens, &kv, &mut want);
        for isa in vector_isas() {
            for pool in pools() {
                let simd = SimdCompute::with_isa(isa, pool.clone());
                let mut got = vec![f32::NAN; tokens.len() * qd];
                simd.attend_batch(&a, 0, &q, &tokens, &kv, &mut got);
                let what = format!("{isa:?}, {}, {types}", pool.describe());
                let mut i = 0;
                for &(seq, _, n) in &seqs {
                    let rows = i * qd..(i + n) * qd;
                    let mut alone = vec![f32::NAN; n * qd];
                    simd.attend(
                        &a,
                        &q[rows.clone()],
                        &tokens[i..i + n],
                        &kv.view(0, seq),
                        &mut alone,
                    );
                    assert!(
                        alone
                            .iter()
                            .zip(&got[rows])
                            .all(|(x, y)| x.to_bits() == y.to_bits()),
                        "{what}: sequence {seq} in the batch differs from sequence {seq} alone"
                    );
                    i += n;
                }
                assert_close(
                    &format!("batched attention, {what}"),
                    &[tokens.len(), qd],
                    &got,
                    &want,
                    ATTN_TOL,
                );
            }
        }
    }
}

#[test]
fn norms_gate_and_residual_match_the_reference() {
    for isa in vector_isas() {
        for pool in pools() {
            let simd = SimdCompute::with_isa(isa, pool.clone());
            let what = format!("{isa:?}, {}", pool.describe());
            for (rows, d) in [(1, 576), (3, 7), (40, 576), (17, 33)] {
                let x = noise(rows * d, d as u64);
                let w = noise(d, 99);
                let (mut a, mut b) = (vec![0.0; rows * d], vec![0.0; rows * d]);
                simd.rms_norm(&x, &w, 1e-5, &mut a);
                Scalar.rms_norm(&x, &w, 1e-5, &mut b);
                assert_close(&format!("rms_norm {what}"), &[rows, d], &a, &b, LANES_TOL);
            }
            for n in [1, 7, 1536, 40 * 1536 + 3] {
                let (g, u) = (
                    noise(n, 1).iter().map(|x| x * 8.0).collect::<Vec<_>>(),
                    noise(n, 2),
                );
                let (mut a, mut b) = (g.clone(), g.clone());
                simd.glu(Activation::Silu, &mut a, &u);
                Scalar.glu(Activation::Silu, &mut b, &u);
                assert_close(&format!("swiglu {what}"), &[n], &a, &b, LANES_TOL);
                // GELU is the reference's own table lookup on every thread: the same bits.
                let (mut a, mut b) = (g.clone(), g.clone());
                simd.glu(Activation::GeluTanh, &mut a, &u);
                Scalar.glu(Activation::GeluTanh, &mut b, &u);
                assert_close(&format!("geglu {what}"), &[n], &a, &b, Tolerance::EXACT);
                let (mut a, mut b) = (g.clone(), g);
                simd.add(&mut a, &u);
                Scalar.add(&mut b, &u);
                assert_close(&format!("add {what}"), &[n], &a, &b, Tolerance::EXACT);
            }
        }
    }
}

#[test]
fn rope_through_the_pool_is_the_reference() {
    let rope = RopeTable::new(64, 10000.0, 1.0, RopeStyle::Normal, 512);
    let tokens = TokenPos::run(0, 100, 40);
    let x = noise(40 * 12 * 64, 4);
    let (mut a, mut b) = (x.clone(), x);
    SimdCompute::with_isa(F32Isa::Portable, Arc::new(SpinPool::new(2)))
        .rope(&rope, &mut a, 64, &tokens);
    Scalar.rope(&rope, &mut b, 64, &tokens);
    assert_close("rope", &[40, 12 * 64], &a, &b, Tolerance::EXACT);
}
