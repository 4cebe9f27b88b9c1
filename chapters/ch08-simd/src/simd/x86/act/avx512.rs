//! [`Avx512`]: attention's two arithmetic-bound kernels, scores and weighted sums, on sixteen
//! lanes (AVX-512 F) — for one query, and for the query heads of one KV head at once, each key
//! and value row loaded once for all of them, read from f32 rows or converted from f16 as it is
//! loaded — and softmax's `exp` (`exp16`, [`exp8`]'s operations on sixteen lanes, the same
//! bits). Everything else is [`Avx2`]'s.
//!
//! # Safety
//! Every function needs AVX2, FMA, F16C and AVX-512 F enabled by the caller.

use super::*;
use crate::simd::{KEYS_Q8_0, packed_q8_0_bytes};
use ch06::quants::blocks::BlockQ8_0;

/// AVX-512 F: the attention kernels on sixteen lanes; everything else as [`Avx2`] (which an
/// AVX-512 CPU also has).
pub struct Avx512;

/// The head sizes the kernels keep in registers (`V` = 4, 8, 16 of them per query or
/// accumulator): 64 (SmolLM2, Llama 3.2 1B), 128 (most 7–8B models), 256 (Gemma 2 and 3).
/// Any other size goes a row at a time through [`Avx2`]'s kernels.
const HEADS: [usize; 3] = [64, 128, 256];

/// [`scores_regs`](super::avx2::scores_regs) with `q` in `V` 16-lane registers.
///
/// # Safety
/// As for [`scores_regs`](super::avx2::scores_regs) with `16·V` floats, and AVX-512 F is
/// enabled too.
#[inline(always)]
unsafe fn scores_regs512<const V: usize>(q: &[f32], keys: &[&[f32]], scale: f32, s: &mut [f32]) {
    // SAFETY: as in `scores_regs`, with `16·V` floats per row; AVX-512 F, AVX2 and FMA are enabled
    // by the caller.
    unsafe {
        let mut qr = [_mm512_setzero_ps(); V];
        for (i, r) in qr.iter_mut().enumerate() {
            *r = _mm512_loadu_ps(q.as_ptr().add(16 * i));
        }
        // Sixteen lanes to eight: add the register's halves.
        let half = |v: __m512| {
            _mm256_add_ps(
                _mm512_castps512_ps256(v),
                _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))),
            )
        };
        let vs = _mm_set1_ps(scale);
        let mut j = 0;
        while j + 4 <= keys.len() {
            let k = [
                keys[j].as_ptr(),
                keys[j + 1].as_ptr(),
                keys[j + 2].as_ptr(),
                keys[j + 3].as_ptr(),
            ];
            let mut acc = [_mm512_setzero_ps(); 4];
            for (i, q) in qr.iter().enumerate() {
                for (a, k) in acc.iter_mut().zip(k) {
                    *a = _mm512_fmadd_ps(*q, _mm512_loadu_ps(k.add(16 * i)), *a);
                }
            }
            let h01 = _mm256_hadd_ps(half(acc[0]), half(acc[1]));
            let h23 = _mm256_hadd_ps(half(acc[2]), half(acc[3]));
            let h = _mm256_hadd_ps(h01, h23);
            let sum = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps::<1>(h));
            _mm_storeu_ps(s.as_mut_ptr().add(j), _mm_mul_ps(sum, vs));
            j += 4;
        }
        while j < keys.len() {
            let mut acc = _mm512_setzero_ps();
            for (i, q) in qr.iter().enumerate() {
                acc = _mm512_fmadd_ps(*q, _mm512_loadu_ps(keys[j].as_ptr().add(16 * i)), acc);
            }
            s[j] = _mm512_reduce_add_ps(acc) * scale;
            j += 1;
        }
    }
}

/// [`weighted_sum_regs`](super::avx2::weighted_sum_regs) with `acc` in `V` 16-lane registers.
///
/// # Safety
/// As for [`weighted_sum_regs`](super::avx2::weighted_sum_regs) with `16·V` floats, and
/// AVX-512 F is enabled too.
#[inline(always)]
unsafe fn weighted_sum_regs512<const V: usize>(acc: &mut [f32], p: &[f32], vals: &[&[f32]]) {
    // SAFETY: as in `weighted_sum_regs`, with `16·V` floats per row; AVX-512 F is enabled by the
    // caller.
    unsafe {
        let mut a = [_mm512_setzero_ps(); V];
        for (i, r) in a.iter_mut().enumerate() {
            *r = _mm512_loadu_ps(acc.as_ptr().add(16 * i));
        }
        for (&p, v) in p.iter().zip(vals) {
            let vp = _mm512_set1_ps(p);
            for (i, r) in a.iter_mut().enumerate() {
                *r = _mm512_fmadd_ps(vp, _mm512_loadu_ps(v.as_ptr().add(16 * i)), *r);
            }
        }
        for (i, r) in a.iter().enumerate() {
            _mm512_storeu_ps(acc.as_mut_ptr().add(16 * i), *r);
        }
    }
}

/// A key or value row as the group kernels read it, sixteen floats at a time: f32 rows as they
/// are, f16 rows converted as they are loaded (`vcvtph2ps`, exact), so that one kernel serves
/// both with the same arithmetic.
trait Lanes16 {
    /// Values `16·i..16·i + 16` of the row.
    ///
    /// # Safety
    /// The row holds them; AVX-512 F (and F16C, which every caller enables with it) are enabled.
    unsafe fn lanes16(&self, i: usize) -> __m512;
}

impl Lanes16 for &[f32] {
    #[inline(always)]
    unsafe fn lanes16(&self, i: usize) -> __m512 {
        // SAFETY: the caller's contract: floats `16i..16i + 16` are in the row.
        unsafe { _mm512_loadu_ps(self.as_ptr().add(16 * i)) }
    }
}

impl Lanes16 for &[u8] {
    #[inline(always)]
    unsafe fn lanes16(&self, i: usize) -> __m512 {
        // SAFETY: the caller's contract: halves `16i..16i + 16`, bytes `32i..32i + 32`, are in
        // the row.
        unsafe {
            _mm512_cvtph_ps(_mm256_loadu_si256(
                self.as_ptr().add(32 * i) as *const __m256i
            ))
        }
    }
}

/// [`scores_regs512`] for the `G` query vectors of `q` (side by side, `16·V` floats each)
/// against the same keys, f32 or f16 rows ([`Lanes16`]): each key's `V` registers are loaded
/// once and used by every query.
/// Query `g`'s scores go to `s[g·stride..]`, the bits `scores_regs512` gives it alone (the
/// same multiply-adds and sums, in the same order).
///
/// # Safety
/// As for [`scores_regs512`]; `q` holds `G·16·V` floats and `s` at least
/// `(G - 1)·stride + keys.len()`.
#[inline(always)]
unsafe fn scores_heads512<const V: usize, const G: usize, K: Lanes16>(
    q: &[f32],
    keys: &[K],
    scale: f32,
    s: &mut [f32],
    stride: usize,
) {
    assert!(q.len() >= G * 16 * V && s.len() >= (G - 1) * stride + keys.len());
    // SAFETY: the loads read `16·V` values of every key row (the caller's contract) and of each
    // query (asserted above); every store is at `g·stride + j` with `j + 4 <= keys.len()` or
    // `j < keys.len()`, inside `s` (asserted). AVX-512 F, AVX2 and FMA are enabled by the caller.
    unsafe {
        let mut qr = [[_mm512_setzero_ps(); V]; G];
        for (g, qg) in qr.iter_mut().enumerate() {
            for (i, r) in qg.iter_mut().enumerate() {
                *r = _mm512_loadu_ps(q.as_ptr().add(16 * (g * V + i)));
            }
        }
        let half = |v: __m512| {
            _mm256_add_ps(
                _mm512_castps512_ps256(v),
                _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))),
            )
        };
        let vs = _mm_set1_ps(scale);
        let out = s.as_mut_ptr();
        let mut j = 0;
        // Sixteen keys at a time: the same sums as the four-key step below, taken for four
        // keys at once in each step of the tree ([`sum_tree16`]).
        let vs16 = _mm512_set1_ps(scale);
        while j + 16 <= keys.len() {
            let mut e = [[_mm512_setzero_ps(); 2]; G]; // (G, 2): keys j..j + 8, j + 8..j + 16
            for (h, eh) in [0, 8].into_iter().enumerate() {
                let mut d = [[_mm512_setzero_ps(); 2]; G]; // (G, 2): fours of keys
                for (b, j4) in [j + eh, j + eh + 4].into_iter().enumerate() {
                    let acc = dots4(&qr, &keys[j4..j4 + 4]);
                    for (dg, a) in d.iter_mut().zip(&acc) {
                        dg[b] = tree_pairs(tree_halves(a[0], a[1]), tree_halves(a[2], a[3]));
                    }
                }
                for (eg, dg) in e.iter_mut().zip(&d) {
                    eg[h] = tree_pairs(dg[0], dg[1]);
                }
            }
            for (g, eg) in e.iter().enumerate() {
                let sums = sum_tree16(eg[0], eg[1]);
                _mm512_storeu_ps(out.add(g * stride + j), _mm512_mul_ps(sums, vs16));
            }
            j += 16;
        }
        while j + 4 <= keys.len() {
            let acc = dots4(&qr, &keys[j..j + 4]);
            for (g, a) in acc.iter().enumerate() {
                let h01 = _mm256_hadd_ps(half(a[0]), half(a[1]));
                let h23 = _mm256_hadd_ps(half(a[2]), half(a[3]));
                let h = _mm256_hadd_ps(h01, h23);
                let sum = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps::<1>(h));
                _mm_storeu_ps(out.add(g * stride + j), _mm_mul_ps(sum, vs));
            }
            j += 4;
        }
        while j < keys.len() {
            for (g, qg) in qr.iter().enumerate() {
                let mut acc = _mm512_setzero_ps();
                for (i, q) in qg.iter().enumerate() {
                    acc = _mm512_fmadd_ps(*q, keys[j].lanes16(i), acc);
                }
                *out.add(g * stride + j) = _mm512_reduce_add_ps(acc) * scale;
            }
            j += 1;
        }
    }
}

/// The lane-wise dot products of `G` queries (`V` registers each) with four key rows: for query
/// `g` and key `kk`, sixteen lanes of partial sums, each key's registers loaded once for every
/// query, the multiply-adds in the order of the registers.
///
/// # Safety
/// Every key row holds `16·V` values; AVX-512 F and FMA (and F16C for f16 rows) are enabled.
#[inline(always)]
unsafe fn dots4<const V: usize, const G: usize, K: Lanes16>(
    qr: &[[__m512; V]; G],
    keys: &[K],
) -> [[__m512; 4]; G] {
    // SAFETY: the caller's contract: each of the four rows holds `16·V` values, and the
    // instructions are enabled.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); 4]; G];
        for i in 0..V {
            for (kk, kp) in keys[..4].iter().enumerate() {
                let kv = kp.lanes16(i);
                for (a, qg) in acc.iter_mut().zip(qr) {
                    a[kk] = _mm512_fmadd_ps(qg[i], kv, a[kk]);
                }
            }
        }
        acc
    }
}

/// [`exp8`] on sixteen lanes: the same operations in the same order, so every lane gets
/// `exp8`'s bits.
///
/// # Safety
/// AVX-512 F is enabled.
#[inline(always)]
unsafe fn exp16(x: __m512) -> __m512 {
    // SAFETY: AVX-512 F on registers only, which the caller enables (this function's contract).
    unsafe {
        // `min(88, x)` returns x when x is NaN, so NaN propagates.
        let x = _mm512_min_ps(_mm512_set1_ps(EXP_MAX), x);
        let underflow = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(EXP_UNDERFLOW));
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
        );
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
        let mut p = _mm512_set1_ps(EXP_POLY[0]);
        for c in &EXP_POLY[1..] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(*c));
        }
        let e = _mm512_slli_epi32::<23>(_mm512_add_epi32(
            _mm512_cvtps_epi32(n),
            _mm512_set1_epi32(127),
        ));
        _mm512_maskz_mov_ps(!underflow, _mm512_mul_ps(p, _mm512_castsi512_ps(e)))
    }
}

/// The first step of a score's sum, for two keys at once: each key's sixteen lanes to eight,
/// lane `l` plus lane `l + 8` (as `half` adds a register's halves). Out: `x`'s eight sums, then
/// `y`'s.
///
/// # Safety
/// AVX-512 F is enabled.
#[inline(always)]
unsafe fn tree_halves(x: __m512, y: __m512) -> __m512 {
    // SAFETY: registers only; the caller enables AVX-512 F.
    unsafe {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x44>(x, y), // blocks 0, 1 of x, then of y
            _mm512_shuffle_f32x4::<0xEE>(x, y), // blocks 2, 3 of each
        )
    }
}

/// The next steps of the sum, as `_mm256_hadd_ps` takes them: in every 128-bit block, lanes
/// 0 + 1 and 2 + 3 of `x`, then of `y`.
///
/// # Safety
/// AVX-512 F is enabled.
#[inline(always)]
unsafe fn tree_pairs(x: __m512, y: __m512) -> __m512 {
    // SAFETY: registers only; the caller enables AVX-512 F.
    unsafe {
        _mm512_add_ps(
            _mm512_shuffle_ps::<0x88>(x, y),
            _mm512_shuffle_ps::<0xDD>(x, y),
        )
    }
}

/// The last step for sixteen keys, and the sums put in key order. After [`tree_halves`] on
/// pairs of keys, [`tree_pairs`] on fours and again on eights, `e0` (keys 0..8) holds in its
/// blocks the two halves of the sum of keys 0, 2, 4, 6 (blocks 0 and 1) and of 1, 3, 5, 7
/// (blocks 2 and 3); `e1` the same for keys 8..16. Adding each block pair is the four-key
/// step's `lo + hi`: every score is the same sum of the same partial sums, so the bits are the
/// same, with about half the shuffles of four keys at a time.
///
/// # Safety
/// AVX-512 F is enabled.
#[inline(always)]
unsafe fn sum_tree16(e0: __m512, e1: __m512) -> __m512 {
    // SAFETY: registers only; the caller enables AVX-512 F.
    unsafe {
        let f = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x88>(e0, e1), // blocks 0, 2 of e0, then of e1
            _mm512_shuffle_f32x4::<0xDD>(e0, e1), // blocks 1, 3
        );
        // Lanes of `f`: keys 0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15.
        let order = _mm512_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15);
        _mm512_permutexvar_ps(order, f)
    }
}

/// [`weighted_sum_regs512`] for the `G` accumulators of `acc` (side by side, `16·V` floats
/// each) over the same value rows, f32 or f16 ([`Lanes16`]): each row's `V` registers are
/// loaded once and used by every accumulator. Accumulator `g` takes the weights
/// `p[g·stride..]` and gets the bits `weighted_sum_regs512` gives it alone.
///
/// # Safety
/// As for [`weighted_sum_regs512`]; `acc` holds `G·16·V` floats and `p` at least
/// `(G - 1)·stride + vals.len()`.
#[inline(always)]
unsafe fn weighted_sum_heads512<const V: usize, const G: usize, R: Lanes16>(
    acc: &mut [f32],
    p: &[f32],
    stride: usize,
    vals: &[R],
) {
    assert!(acc.len() >= G * 16 * V && p.len() >= (G - 1) * stride + vals.len());
    // SAFETY: the loads and stores of `acc` stay inside its `G·16·V` floats (asserted), the
    // weight at `g·stride + j` with `j < vals.len()` inside `p` (asserted), and the loads of
    // each value row read `16·V` values (the caller's contract). AVX-512 F is enabled by the
    // caller.
    unsafe {
        let mut a = [[_mm512_setzero_ps(); V]; G];
        for (g, ag) in a.iter_mut().enumerate() {
            for (i, r) in ag.iter_mut().enumerate() {
                *r = _mm512_loadu_ps(acc.as_ptr().add(16 * (g * V + i)));
            }
        }
        for (j, v) in vals.iter().enumerate() {
            let mut vr = [_mm512_setzero_ps(); V];
            for (i, r) in vr.iter_mut().enumerate() {
                *r = v.lanes16(i);
            }
            for (g, ag) in a.iter_mut().enumerate() {
                let vp = _mm512_set1_ps(*p.get_unchecked(g * stride + j));
                for (r, x) in ag.iter_mut().zip(&vr) {
                    *r = _mm512_fmadd_ps(vp, *x, *r);
                }
            }
        }
        for (g, ag) in a.iter().enumerate() {
            for (i, r) in ag.iter().enumerate() {
                _mm512_storeu_ps(acc.as_mut_ptr().add(16 * (g * V + i)), *r);
            }
        }
    }
}

/// Transposes sixteen rows of sixteen lanes in registers: lane `j` of `r[i]` becomes lane `i`
/// of `r[j]`. Four rounds of sixteen shuffles: pairs of rows interleaved, then fours, then
/// 128-bit lanes exchanged twice.
///
/// # Safety
/// AVX-512 F is enabled.
#[inline(always)]
unsafe fn transpose16(r: &mut [__m512; 16]) {
    // SAFETY: registers only; the caller enables AVX-512 F.
    unsafe {
        let mut t = [_mm512_setzero_ps(); 16];
        for i in 0..8 {
            // In each 128-bit lane k: rows 2i and 2i + 1 at columns 4k, 4k + 1 (lo), 4k + 2,
            // 4k + 3 (hi).
            t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        for q in 0..4 {
            // Register 4q + c, lane k: column 4k + c of rows 4q..4q + 4.
            let t = &t[4 * q..4 * q + 4];
            r[4 * q] = _mm512_shuffle_ps::<0x44>(t[0], t[2]);
            r[4 * q + 1] = _mm512_shuffle_ps::<0xEE>(t[0], t[2]);
            r[4 * q + 2] = _mm512_shuffle_ps::<0x44>(t[1], t[3]);
            r[4 * q + 3] = _mm512_shuffle_ps::<0xEE>(t[1], t[3]);
        }
        for c in 0..4 {
            for h in [0, 8] {
                // Lanes: columns c and 8 + c (0x88), 4 + c and 12 + c (0xDD), of rows h..h + 8.
                t[h + c] = _mm512_shuffle_f32x4::<0x88>(r[h + c], r[h + 4 + c]);
                t[h + 4 + c] = _mm512_shuffle_f32x4::<0xDD>(r[h + c], r[h + 4 + c]);
            }
        }
        for c in 0..4 {
            for d in [0, 4] {
                r[c + d] = _mm512_shuffle_f32x4::<0x88>(t[c + d], t[8 + c + d]);
                r[8 + c + d] = _mm512_shuffle_f32x4::<0xDD>(t[c + d], t[8 + c + d]);
            }
        }
    }
}

/// [`F32Simd::pack_keys_q8_0`] for heads of `32·NB` values (`NB` even): each key's codes read
/// 64 at a time (two blocks, past their scales), made unsigned by flipping their top bit, and
/// the groups of 4 of sixteen keys transposed ([`transpose16`]).
///
/// # Safety
/// AVX-512 F and F16C are enabled.
#[inline(always)]
unsafe fn pack_keys_q8_0_512<const NB: usize>(keys: &[&[u8]], kt: &mut [u8], dk: &mut [f32]) {
    let hd = 32 * NB;
    assert!(NB.is_multiple_of(2) && keys.len() <= KEYS_Q8_0);
    assert!(kt.len() >= packed_q8_0_bytes(hd) && dk.len() >= NB * KEYS_Q8_0);
    assert!(keys.iter().all(|k| k.len() >= 34 * NB));
    // SAFETY: each load reads 32 codes of block `2c` or `2c + 1 < NB` of a row of `34·NB` bytes
    // (asserted); each store writes 64 bytes at group `t < hd / 4` of a block of 16 keys of the
    // tile, inside `kt` (asserted). AVX-512 F is enabled by the caller.
    unsafe {
        let flip = _mm512_set1_epi8(i8::MIN);
        for b16 in (0..keys.len()).step_by(16) {
            let n = (keys.len() - b16).min(16);
            for c in 0..NB / 2 {
                let mut r = [_mm512_setzero_ps(); 16];
                for (r, k) in r.iter_mut().zip(&keys[b16..b16 + n]) {
                    let lo = _mm256_loadu_si256(k.as_ptr().add(2 * c * 34 + 2) as *const __m256i);
                    let hi =
                        _mm256_loadu_si256(k.as_ptr().add((2 * c + 1) * 34 + 2) as *const __m256i);
                    let v = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
                    *r = _mm512_castsi512_ps(_mm512_xor_si512(v, flip));
                }
                // Now lane j of r[l] is key j's codes 64c + 4l..64c + 4l + 4.
                transpose16(&mut r);
                for (l, r) in r.iter().enumerate() {
                    let at = ((b16 / 16) * (hd / 4) + 16 * c + l) * 64;
                    _mm512_storeu_ps(kt.as_mut_ptr().add(at) as *mut f32, *r);
                }
            }
            for (j, k) in keys[b16..b16 + n].iter().enumerate() {
                for b in 0..NB {
                    let d = half::f16::from_le_bytes([k[34 * b], k[34 * b + 1]]);
                    dk[b * KEYS_Q8_0 + b16 + j] = d.to_f32();
                }
            }
        }
    }
}

/// [`F32Simd::scores_heads_q8_0`] for `G` queries of `32·NB` values, sixteen keys at a time,
/// one per lane: `vpdpbusd` multiplies four of the keys' unsigned codes by four of a query's and
/// adds them to the key's lane, eight times a block; `128·Σ q` taken away leaves each key's
/// exact integer dot product with the block, and [`score_q8_0`](crate::simd::score_q8_0)'s
/// float steps follow, lane by lane. The `G·NB` sums are independent, so that the multiply-adds
/// of one do not wait for another's: each packed row of codes is loaded once for all `G`.
///
/// # Safety
/// AVX-512 F and VNNI are enabled (this function's own).
#[target_feature(enable = "avx512f,avx512vnni")]
#[allow(clippy::too_many_arguments)]
unsafe fn scores_q8_0_vnni<const NB: usize, const G: usize>(
    q: &[BlockQ8_0],
    kt: &[u8],
    dk: &[f32],
    keys: &std::ops::Range<usize>,
    scale: f32,
    s: &mut [f32],
    stride: usize,
) {
    let hd = 32 * NB;
    assert!(q.len() >= G * NB && kt.len() >= packed_q8_0_bytes(hd) && dk.len() >= NB * KEYS_Q8_0);
    assert!(keys.end <= KEYS_Q8_0 && s.len() >= (G - 1) * stride + KEYS_Q8_0);
    // Per query and block: the codes four at a time, broadcast, and 128 times their sum.
    let mut q4 = [[[_mm512_setzero_si512(); 8]; NB]; G];
    let mut corr = [[_mm512_setzero_si512(); NB]; G];
    let mut dq = [[0.0f32; NB]; G];
    for g in 0..G {
        for b in 0..NB {
            let qb = &q[g * NB + b];
            for (i, c) in qb.qs.chunks_exact(4).enumerate() {
                let w = i32::from_le_bytes([c[0] as u8, c[1] as u8, c[2] as u8, c[3] as u8]);
                q4[g][b][i] = _mm512_set1_epi32(w);
            }
            let sum = qb.qs.iter().map(|&c| c as i32).sum::<i32>();
            corr[g][b] = _mm512_set1_epi32(128 * sum);
            dq[g][b] = qb.d.to_f32();
        }
    }
    let vs = _mm512_set1_ps(scale);
    for blk in keys.start / 16..keys.end.div_ceil(16) {
        let at = 16 * blk;
        let (lo, hi) = (
            keys.start.clamp(at, at + 16) - at,
            keys.end.clamp(at, at + 16) - at,
        );
        let mask: __mmask16 = ((1u32 << hi) - (1u32 << lo)) as __mmask16;
        let mut acc = [[_mm512_setzero_si512(); NB]; G];
        for b in 0..NB {
            for i in 0..8 {
                // SAFETY: group `8b + i < hd / 4` of key block `blk < 2` lies inside `kt`
                // (asserted).
                let k = unsafe {
                    let at = (blk * (hd / 4) + 8 * b + i) * 64;
                    _mm512_loadu_si512(kt.as_ptr().add(at) as *const __m512i)
                };
                for (acc, q4) in acc.iter_mut().zip(&q4) {
                    acc[b] = _mm512_dpbusd_epi32(acc[b], k, q4[b][i]);
                }
            }
        }
        for g in 0..G {
            let mut sum = _mm512_setzero_ps();
            for b in 0..NB {
                // The keys' codes carry +128: take away 128 times the query's codes' sum.
                let f = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[g][b], corr[g][b]));
                // SAFETY: the scales of block `b` of keys `at..at + 16 <= KEYS_Q8_0` lie inside
                // `dk` (asserted).
                let d = unsafe { _mm512_loadu_ps(dk.as_ptr().add(b * KEYS_Q8_0 + at)) };
                let d = _mm512_mul_ps(d, _mm512_set1_ps(dq[g][b]));
                sum = match b {
                    0 => _mm512_mul_ps(f, d),
                    _ => _mm512_fmadd_ps(f, d, sum),
                };
            }
            // SAFETY: lanes `at + lo..at + hi` of row `g < G` lie inside `s` (asserted); the
            // masked-off lanes are not touched.
            unsafe {
                let out = s.as_mut_ptr().add(g * stride + at);
                _mm512_mask_storeu_ps(out, mask, _mm512_mul_ps(sum, vs));
            }
        }
    }
}

/// [`scores_q8_0_vnni`] over any number of queries, four at a time (two for 256-value heads,
/// whose `G·NB` accumulators would not fit the registers).
///
/// # Safety
/// AVX-512 F and VNNI are enabled (this function's own).
#[target_feature(enable = "avx512f,avx512vnni")]
#[allow(clippy::too_many_arguments)]
unsafe fn scores_q8_0_vnni_any<const NB: usize>(
    q: &[BlockQ8_0],
    kt: &[u8],
    dk: &[f32],
    keys: std::ops::Range<usize>,
    scale: f32,
    s: &mut [f32],
    stride: usize,
) {
    let n = q.len() / NB;
    let most = if NB > 4 { 2 } else { 4 };
    for g0 in (0..n).step_by(most) {
        let (q, s) = (&q[g0 * NB..], &mut s[g0 * stride..]);
        // SAFETY: this function's features; the kernel checks its slices.
        unsafe {
            match (n - g0).min(most) {
                1 => scores_q8_0_vnni::<NB, 1>(q, kt, dk, &keys, scale, s, stride),
                2 => scores_q8_0_vnni::<NB, 2>(q, kt, dk, &keys, scale, s, stride),
                3 => scores_q8_0_vnni::<NB, 3>(q, kt, dk, &keys, scale, s, stride),
                _ => scores_q8_0_vnni::<NB, 4>(q, kt, dk, &keys, scale, s, stride),
            }
        }
    }
}

/// The heads `0..g` of `hd` values in runs of at most `most`, the rest one run shorter.
#[inline(always)]
fn runs_of(most: usize, g: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    (0..g).step_by(most).map(move |h| h..(h + most).min(g))
}

/// The runs the score kernels take: threes of 64 values (twelve query registers), twos of 128
/// (sixteen), ones of 256 (sixteen: Gemma's heads); `None` for any other head size.
#[inline(always)]
fn head_runs(hd: usize, g: usize) -> Option<impl Iterator<Item = std::ops::Range<usize>>> {
    match hd {
        64 => Some(runs_of(3, g)),
        128 => Some(runs_of(2, g)),
        256 => Some(runs_of(1, g)),
        _ => None,
    }
}

/// The runs the weighted-sum kernels take: sixes of 64 values (twenty-four accumulator
/// registers), twos of 128 (sixteen), ones of 256 (sixteen). A caller that has the weights of
/// several rows' heads (the rows of a prompt that see the same keys) gives them in one call,
/// and each value row is loaded once for six 64-value heads.
#[inline(always)]
fn sum_runs(hd: usize, g: usize) -> Option<impl Iterator<Item = std::ops::Range<usize>>> {
    match hd {
        64 => Some(runs_of(6, g)),
        128 => Some(runs_of(2, g)),
        256 => Some(runs_of(1, g)),
        _ => None,
    }
}

/// [`scores_heads512`] over any number of heads of 64, 128 or 256 values, in the runs of
/// [`head_runs`]. `false`, having done nothing, for any other head size.
///
/// # Safety
/// As for [`scores_heads512`], with `hd`-value rows.
#[inline(always)]
unsafe fn scores_heads_any<K: Lanes16>(
    q: &[f32],
    hd: usize,
    keys: &[K],
    scale: f32,
    s: &mut [f32],
    stride: usize,
) -> bool {
    let Some(runs) = head_runs(hd, q.len() / hd) else {
        return false;
    };
    for h in runs {
        let (q, s) = (&q[h.start * hd..h.end * hd], &mut s[h.start * stride..]);
        // SAFETY: the caller's contract; the kernels check `q` and `s` themselves.
        unsafe {
            match (hd, h.len()) {
                (64, 3) => scores_heads512::<4, 3, _>(q, keys, scale, s, stride),
                (64, 2) => scores_heads512::<4, 2, _>(q, keys, scale, s, stride),
                (64, _) => scores_heads512::<4, 1, _>(q, keys, scale, s, stride),
                (128, 2) => scores_heads512::<8, 2, _>(q, keys, scale, s, stride),
                (128, _) => scores_heads512::<8, 1, _>(q, keys, scale, s, stride),
                _ => scores_heads512::<16, 1, _>(q, keys, scale, s, stride),
            }
        }
    }
    true
}

/// [`weighted_sum_heads512`] over any number of heads of 64, 128 or 256 values, in the runs of
/// [`sum_runs`]; `false`, having done nothing, for any other head size.
///
/// # Safety
/// As for [`weighted_sum_heads512`], with `hd`-value rows.
#[inline(always)]
unsafe fn weighted_sum_heads_any<R: Lanes16>(
    acc: &mut [f32],
    hd: usize,
    p: &[f32],
    stride: usize,
    vals: &[R],
) -> bool {
    let Some(runs) = sum_runs(hd, acc.len() / hd) else {
        return false;
    };
    for h in runs {
        let (a, p) = (&mut acc[h.start * hd..h.end * hd], &p[h.start * stride..]);
        // SAFETY: the caller's contract; the kernels check `a` and `p` themselves.
        unsafe {
            match (hd, h.len()) {
                (64, 6) => weighted_sum_heads512::<4, 6, _>(a, p, stride, vals),
                (64, 5) => weighted_sum_heads512::<4, 5, _>(a, p, stride, vals),
                (64, 4) => weighted_sum_heads512::<4, 4, _>(a, p, stride, vals),
                (64, 3) => weighted_sum_heads512::<4, 3, _>(a, p, stride, vals),
                (64, 2) => weighted_sum_heads512::<4, 2, _>(a, p, stride, vals),
                (64, _) => weighted_sum_heads512::<4, 1, _>(a, p, stride, vals),
                (128, 2) => weighted_sum_heads512::<8, 2, _>(a, p, stride, vals),
                (128, _) => weighted_sum_heads512::<8, 1, _>(a, p, stride, vals),
                _ => weighted_sum_heads512::<16, 1, _>(a, p, stride, vals),
            }
        }
    }
    true
}

impl F32Simd for Avx512 {
    #[inline(always)]
    unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        // SAFETY: `Avx2` needs AVX2 and FMA, which every caller of `Avx512` enables with AVX-512 F.
        unsafe { Avx2::dot(a, b) }
    }
    #[inline(always)]
    unsafe fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
        // SAFETY: as in `dot`.
        unsafe { Avx2::axpy(y, a, x) }
    }
    #[inline(always)]
    unsafe fn scale(y: &mut [f32], a: f32) {
        // SAFETY: as in `dot`.
        unsafe { Avx2::scale(y, a) }
    }
    #[inline(always)]
    unsafe fn max(x: &[f32]) -> f32 {
        // SAFETY: as in `dot`.
        unsafe { Avx2::max(x) }
    }
    #[inline(always)]
    unsafe fn exp_sum(x: &mut [f32], m: f32) -> f32 {
        // Sixteen lanes at a time through `exp16`, each half added to the eight-lane sum as
        // `Avx2::exp_sum` adds its eights, so the sum and every value are `Avx2`'s bits; the
        // last eights and the tail through `Avx2`'s own loop, continued.
        let n = x.len();
        let px = x.as_mut_ptr();
        // SAFETY: every load and store is at `i` with `i + 16 <= n`; the rest goes to
        // `exp_sum_from`, which stays inside `x`. AVX-512 F, AVX2 and FMA are enabled by the
        // caller.
        unsafe {
            let vm = _mm512_set1_ps(m);
            let mut sum = _mm256_setzero_ps();
            let mut i = 0;
            while i + 16 <= n {
                let e = exp16(_mm512_sub_ps(_mm512_loadu_ps(px.add(i)), vm));
                _mm512_storeu_ps(px.add(i), e);
                sum = _mm256_add_ps(sum, _mm512_castps512_ps256(e));
                sum = _mm256_add_ps(
                    sum,
                    _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(e))),
                );
                i += 16;
            }
            super::avx2::exp_sum_from(x, m, i, sum)
        }
    }
    #[inline(always)]
    unsafe fn silu_mul(g: &mut [f32], u: &[f32]) {
        // SAFETY: as in `dot`.
        unsafe { Avx2::silu_mul(g, u) }
    }
    #[inline(always)]
    unsafe fn sum_squares(x: &[f32]) -> f32 {
        // SAFETY: as in `dot`.
        unsafe { Avx2::sum_squares(x) }
    }
    #[inline(always)]
    unsafe fn scale_mul(x: &[f32], s: f32, w: &[f32], out: &mut [f32]) {
        // SAFETY: as in `dot`.
        unsafe { Avx2::scale_mul(x, s, w, out) }
    }
    #[inline(always)]
    unsafe fn add(x: &mut [f32], y: &[f32]) {
        // SAFETY: as in `dot`.
        unsafe { Avx2::add(x, y) }
    }
    #[inline(always)]
    unsafe fn f16_to_f32(x: &[u8], out: &mut [f32]) {
        // SAFETY: as in `dot`, with the F16C every caller enables too.
        unsafe { Avx2::f16_to_f32(x, out) }
    }
    #[inline(always)]
    unsafe fn q8_0_to_f32(x: &[u8], out: &mut [f32]) {
        // SAFETY: as in `dot`.
        unsafe { Avx2::q8_0_to_f32(x, out) }
    }

    #[inline(always)]
    unsafe fn scores(q: &[f32], keys: &[&[f32]], scale: f32, s: &mut [f32]) {
        assert!(s.len() >= keys.len());
        debug_assert!(keys.iter().all(|k| k.len() == q.len()));
        // SAFETY: as in `Avx2::scores`, with the `16·V` floats of the AVX-512 register kernels;
        // AVX-512 F is enabled by the caller.
        unsafe {
            match q.len() {
                64 => scores_regs512::<4>(q, keys, scale, s),
                128 => scores_regs512::<8>(q, keys, scale, s),
                256 => scores_regs512::<16>(q, keys, scale, s),
                _ => Avx2::scores(q, keys, scale, s),
            }
        }
    }

    #[inline(always)]
    unsafe fn weighted_sum(acc: &mut [f32], p: &[f32], vals: &[&[f32]]) {
        assert!(p.len() >= vals.len());
        debug_assert!(vals.iter().all(|v| v.len() == acc.len()));
        // SAFETY: as in `Avx2::weighted_sum`, with the `16·V` floats of the AVX-512 register
        // kernels; AVX-512 F is enabled by the caller.
        unsafe {
            match acc.len() {
                64 => weighted_sum_regs512::<4>(acc, p, vals),
                128 => weighted_sum_regs512::<8>(acc, p, vals),
                256 => weighted_sum_regs512::<16>(acc, p, vals),
                _ => Avx2::weighted_sum(acc, p, vals),
            }
        }
    }

    #[inline(always)]
    unsafe fn scores_heads(
        q: &[f32],
        hd: usize,
        keys: &[&[f32]],
        scale: f32,
        s: &mut [f32],
        stride: usize,
    ) {
        debug_assert!(keys.iter().all(|k| k.len() == hd));
        // SAFETY: for the sizes of `HEADS` a key row holds the `16·V` floats the group kernels
        // read (`scores_heads`' contract), and they check `q` and `s` themselves; otherwise each
        // query goes through `scores`, as the trait's default does. AVX-512 F is enabled by the
        // caller.
        unsafe {
            if !scores_heads_any(q, hd, keys, scale, s, stride) {
                crate::simd::scores_heads_rows::<Self>(q, hd, keys, scale, s, stride);
            }
        }
    }

    #[inline(always)]
    unsafe fn quantize_q8_0(x: &[f32], y: &mut [BlockQ8_0]) {
        // SAFETY: the CPU has AVX2, FMA and F16C, which every caller of `Avx512` enables with
        // AVX-512 F; the quantizer gives chapter 6's bytes (`tests/kernels.rs`).
        unsafe { crate::simd::x86::avx2::quantize_row_q8_0(x, y) }
    }
    fn keys_q8_0(hd: usize) -> bool {
        HEADS.contains(&hd) && std::is_x86_feature_detected!("avx512vnni")
    }
    #[inline(always)]
    unsafe fn pack_keys_q8_0(keys: &[&[u8]], hd: usize, kt: &mut [u8], dk: &mut [f32]) {
        // SAFETY: AVX-512 F and F16C are enabled by the caller; the kernel checks its slices.
        unsafe {
            match hd {
                64 => pack_keys_q8_0_512::<2>(keys, kt, dk),
                128 => pack_keys_q8_0_512::<4>(keys, kt, dk),
                256 => pack_keys_q8_0_512::<8>(keys, kt, dk),
                _ => crate::simd::pack_keys_q8_0_rows(keys, hd, kt, dk),
            }
        }
    }
    #[inline(always)]
    unsafe fn scores_heads_q8_0(
        q: &[BlockQ8_0],
        hd: usize,
        kt: &[u8],
        dk: &[f32],
        keys: std::ops::Range<usize>,
        scale: f32,
        s: &mut [f32],
        stride: usize,
    ) {
        // The kernel needs VNNI besides this set's AVX-512 F: checked here, so that the call is
        // sound whatever `keys_q8_0` said (the check is one load of a cached flag).
        if !std::is_x86_feature_detected!("avx512vnni") || !HEADS.contains(&hd) {
            return crate::simd::scores_heads_q8_0_rows(q, hd, kt, dk, keys, scale, s, stride);
        }
        // SAFETY: the CPU has AVX-512 F (this set's contract) and VNNI (checked above); the
        // kernel checks its slices.
        unsafe {
            match hd {
                64 => scores_q8_0_vnni_any::<2>(q, kt, dk, keys, scale, s, stride),
                128 => scores_q8_0_vnni_any::<4>(q, kt, dk, keys, scale, s, stride),
                _ => scores_q8_0_vnni_any::<8>(q, kt, dk, keys, scale, s, stride),
            }
        }
    }
    fn heads_f16(hd: usize, _group: usize) -> bool {
        HEADS.contains(&hd)
    }
    #[inline(always)]
    unsafe fn scores_heads_f16(
        q: &[f32],
        hd: usize,
        keys: &[&[u8]],
        scale: f32,
        s: &mut [f32],
        stride: usize,
    ) {
        debug_assert!(keys.iter().all(|k| k.len() == 2 * hd));
        // SAFETY: for the sizes of `HEADS` a key row holds the `32·V` bytes the group kernels
        // read (this method's contract), and they check `q` and `s` themselves; any other shape
        // goes a row at a time, as the trait's default does. AVX-512 F and F16C are enabled by
        // the caller.
        unsafe {
            if !scores_heads_any(q, hd, keys, scale, s, stride) {
                crate::simd::scores_heads_f16_rows::<Self>(q, hd, keys, scale, s, stride);
            }
        }
    }
    #[inline(always)]
    unsafe fn weighted_sum_heads_f16(
        acc: &mut [f32],
        hd: usize,
        p: &[f32],
        stride: usize,
        vals: &[&[u8]],
    ) {
        debug_assert!(vals.iter().all(|v| v.len() == 2 * hd));
        // SAFETY: as in `scores_heads_f16`, for the value rows; the group kernels check `acc`
        // and `p` themselves.
        unsafe {
            if !weighted_sum_heads_any(acc, hd, p, stride, vals) {
                crate::simd::weighted_sum_heads_f16_rows::<Self>(acc, hd, p, stride, vals);
            }
        }
    }
    #[inline(always)]
    unsafe fn weighted_sum_heads(
        acc: &mut [f32],
        hd: usize,
        p: &[f32],
        stride: usize,
        vals: &[&[f32]],
    ) {
        debug_assert!(vals.iter().all(|v| v.len() == hd));
        // SAFETY: as in `scores_heads`, for the value rows; the group kernels check `acc` and
        // `p` themselves.
        unsafe {
            if !weighted_sum_heads_any(acc, hd, p, stride, vals) {
                crate::simd::weighted_sum_heads_rows::<Self>(acc, hd, p, stride, vals);
            }
        }
    }
}
