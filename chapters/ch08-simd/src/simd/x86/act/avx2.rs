//! [`Avx2`]: the f32 kernels of [`F32Simd`] on eight lanes (AVX2 and FMA, with F16C for f16
//! rows). Attention's scores and weighted sums keep a 64- or 128-value query or accumulator in
//! registers; the rest are plain vector loops with a scalar tail.
//!
//! # Safety
//! Every function needs AVX2, FMA and F16C enabled by the caller.

use super::*;

/// AVX2 + FMA: eight f32 lanes.
pub struct Avx2;

/// Scores of `q` (`8·V` values, held in `V` registers) against each key row.
/// Four keys at a time, each with its own accumulator, so that one horizontal reduction
/// (three `hadd`s) serves four dot products.
///
/// # Safety
/// AVX2 and FMA are enabled; `q` holds `8·V` floats, every key row at least as many, and `s`
/// at least `keys.len()`.
#[inline(always)]
unsafe fn scores_regs<const V: usize>(q: &[f32], keys: &[&[f32]], scale: f32, s: &mut [f32]) {
    // SAFETY: the loads read `8·V` floats of `q` and of every key row, which the caller guarantees
    // they hold; each 4-float store goes to `s[j..j + 4]` with `j + 4 <= keys.len() <= s.len()`.
    // AVX2 and FMA are enabled by the caller.
    unsafe {
        let mut qr = [_mm256_setzero_ps(); V];
        for (i, r) in qr.iter_mut().enumerate() {
            *r = _mm256_loadu_ps(q.as_ptr().add(8 * i));
        }
        let vs = _mm_set1_ps(scale);
        let mut j = 0;
        while j + 4 <= keys.len() {
            let k = [
                keys[j].as_ptr(),
                keys[j + 1].as_ptr(),
                keys[j + 2].as_ptr(),
                keys[j + 3].as_ptr(),
            ];
            let mut acc = [_mm256_setzero_ps(); 4];
            for (i, q) in qr.iter().enumerate() {
                for (a, k) in acc.iter_mut().zip(k) {
                    *a = _mm256_fmadd_ps(*q, _mm256_loadu_ps(k.add(8 * i)), *a);
                }
            }
            // [k0 k0 k1 k1 | k0 k0 k1 k1] … → one lane per key.
            let h01 = _mm256_hadd_ps(acc[0], acc[1]);
            let h23 = _mm256_hadd_ps(acc[2], acc[3]);
            let h = _mm256_hadd_ps(h01, h23);
            let sum = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps::<1>(h));
            _mm_storeu_ps(s.as_mut_ptr().add(j), _mm_mul_ps(sum, vs));
            j += 4;
        }
        while j < keys.len() {
            let mut acc = _mm256_setzero_ps();
            for (i, q) in qr.iter().enumerate() {
                acc = _mm256_fmadd_ps(*q, _mm256_loadu_ps(keys[j].as_ptr().add(8 * i)), acc);
            }
            s[j] = hsum(acc) * scale;
            j += 1;
        }
    }
}

/// `acc += Σ p_j v_j` with `acc` (`8·V` values) held in `V` registers.
///
/// # Safety
/// AVX2 and FMA are enabled; `acc` holds `8·V` floats and every value row at least as many.
#[inline(always)]
unsafe fn weighted_sum_regs<const V: usize>(acc: &mut [f32], p: &[f32], vals: &[&[f32]]) {
    // SAFETY: the loads and stores of `acc` and the loads of each value row read `8·V` floats,
    // which the caller guarantees they hold; AVX2 and FMA are enabled by the caller.
    unsafe {
        let mut a = [_mm256_setzero_ps(); V];
        for (i, r) in a.iter_mut().enumerate() {
            *r = _mm256_loadu_ps(acc.as_ptr().add(8 * i));
        }
        for (&p, v) in p.iter().zip(vals) {
            let vp = _mm256_set1_ps(p);
            for (i, r) in a.iter_mut().enumerate() {
                *r = _mm256_fmadd_ps(vp, _mm256_loadu_ps(v.as_ptr().add(8 * i)), *r);
            }
        }
        for (i, r) in a.iter().enumerate() {
            _mm256_storeu_ps(acc.as_mut_ptr().add(8 * i), *r);
        }
    }
}

/// [`F32Simd::exp_sum`] from element `i` on, `sum` holding the eight lanes' sums of the
/// elements before it (`Avx512`'s sixteen-lane loop hands over here for the last eights and
/// the tail, so both give the same bits).
///
/// # Safety
/// AVX2 and FMA are enabled.
#[inline(always)]
pub(super) unsafe fn exp_sum_from(x: &mut [f32], m: f32, mut i: usize, mut sum: __m256) -> f32 {
    let n = x.len();
    let px = x.as_mut_ptr();
    // SAFETY: every load and store is at `i` with `i + 8 <= x.len()`, and the tail goes through
    // a local array of 8; AVX2 and FMA are enabled by the caller.
    unsafe {
        let vm = _mm256_set1_ps(m);
        while i + 8 <= n {
            let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(px.add(i)), vm));
            _mm256_storeu_ps(px.add(i), e);
            sum = _mm256_add_ps(sum, e);
            i += 8;
        }
        let mut s = hsum(sum);
        if i < n {
            // The tail through the same exp, so every element sees one formula.
            let mut buf = [f32::NEG_INFINITY; 8];
            buf[..n - i].copy_from_slice(&x[i..]);
            let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(buf.as_ptr()), vm));
            _mm256_storeu_ps(buf.as_mut_ptr(), e);
            x[i..].copy_from_slice(&buf[..n - i]);
            s += buf[..n - i].iter().sum::<f32>();
        }
        s
    }
}

impl F32Simd for Avx2 {
    #[inline(always)]
    unsafe fn scores(q: &[f32], keys: &[&[f32]], scale: f32, s: &mut [f32]) {
        // The register kernels read `q.len()` values of every key: the caller's rows are
        // slices of exactly one head (checked in debug builds; a short row would be read past).
        assert!(s.len() >= keys.len());
        debug_assert!(keys.iter().all(|k| k.len() == q.len()));
        // Register-resident kernels for the common head sizes; any other goes row by row.
        // SAFETY: for 64 and 128 values `q.len()` is the `8·V` of the register kernel, every key
        // row is as long as `q` (`F32Simd::scores`' contract) and `s` is long enough (asserted
        // above); `dot` reads only inside both slices. AVX2 and FMA are enabled by the caller.
        unsafe {
            match q.len() {
                64 => scores_regs::<8>(q, keys, scale, s),
                128 => scores_regs::<16>(q, keys, scale, s),
                _ => {
                    for (s, k) in s.iter_mut().zip(keys) {
                        *s = Self::dot(q, k) * scale;
                    }
                }
            }
        }
    }

    #[inline(always)]
    unsafe fn weighted_sum(acc: &mut [f32], p: &[f32], vals: &[&[f32]]) {
        assert!(p.len() >= vals.len());
        debug_assert!(vals.iter().all(|v| v.len() == acc.len()));
        // SAFETY: for 64 and 128 values `acc.len()` is the `8·V` of the register kernel and every
        // value row is as long (`F32Simd::weighted_sum`'s contract); `axpy` stays inside both
        // slices. AVX2 and FMA are enabled by the caller.
        unsafe {
            match acc.len() {
                64 => weighted_sum_regs::<8>(acc, p, vals),
                128 => weighted_sum_regs::<16>(acc, p, vals),
                _ => {
                    for (&p, v) in p.iter().zip(vals) {
                        Self::axpy(acc, p, v);
                    }
                }
            }
        }
    }

    #[inline(always)]
    unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        // SAFETY: every load is at `i + 8k`, with `i + 8k + 8 <= n`, and `n` is the shorter length;
        // the tail is indexed. AVX2 and FMA are enabled by the caller.
        unsafe {
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut i = 0;
            while i + 32 <= n {
                for (k, acc) in acc.iter_mut().enumerate() {
                    let x = _mm256_loadu_ps(pa.add(i + 8 * k));
                    let y = _mm256_loadu_ps(pb.add(i + 8 * k));
                    *acc = _mm256_fmadd_ps(x, y, *acc);
                }
                i += 32;
            }
            while i + 8 <= n {
                let x = _mm256_loadu_ps(pa.add(i));
                acc[0] = _mm256_fmadd_ps(x, _mm256_loadu_ps(pb.add(i)), acc[0]);
                i += 8;
            }
            let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
            let mut sum = hsum(v);
            while i < n {
                sum += a[i] * b[i];
                i += 1;
            }
            sum
        }
    }

    #[inline(always)]
    unsafe fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
        let n = y.len().min(x.len());
        let (py, px) = (y.as_mut_ptr(), x.as_ptr());
        // SAFETY: every load and store is at `i` with `i + 8 <= n`, and `n` is the shorter length;
        // AVX2 and FMA are enabled by the caller.
        unsafe {
            let va = _mm256_set1_ps(a);
            let mut i = 0;
            while i + 8 <= n {
                let v = _mm256_fmadd_ps(va, _mm256_loadu_ps(px.add(i)), _mm256_loadu_ps(py.add(i)));
                _mm256_storeu_ps(py.add(i), v);
                i += 8;
            }
            while i < n {
                y[i] += a * x[i];
                i += 1;
            }
        }
    }

    #[inline(always)]
    unsafe fn scale(y: &mut [f32], a: f32) {
        let n = y.len();
        let py = y.as_mut_ptr();
        // SAFETY: every load and store is at `i` with `i + 8 <= y.len()`; AVX is enabled with the
        // caller's AVX2.
        unsafe {
            let va = _mm256_set1_ps(a);
            let mut i = 0;
            while i + 8 <= n {
                _mm256_storeu_ps(py.add(i), _mm256_mul_ps(va, _mm256_loadu_ps(py.add(i))));
                i += 8;
            }
            while i < n {
                y[i] *= a;
                i += 1;
            }
        }
    }

    #[inline(always)]
    unsafe fn max(x: &[f32]) -> f32 {
        let n = x.len();
        let px = x.as_ptr();
        // SAFETY: every load is at `i` with `i + 8 <= x.len()`; AVX is enabled with the caller's
        // AVX2.
        unsafe {
            let mut m = _mm256_set1_ps(f32::NEG_INFINITY);
            let mut i = 0;
            while i + 8 <= n {
                m = _mm256_max_ps(m, _mm256_loadu_ps(px.add(i)));
                i += 8;
            }
            let mut r = hmax(m);
            while i < n {
                r = r.max(x[i]);
                i += 1;
            }
            r
        }
    }

    #[inline(always)]
    unsafe fn exp_sum(x: &mut [f32], m: f32) -> f32 {
        // SAFETY: AVX2 and FMA are enabled by the caller.
        unsafe { exp_sum_from(x, m, 0, _mm256_setzero_ps()) }
    }

    #[inline(always)]
    unsafe fn silu_mul(g: &mut [f32], u: &[f32]) {
        let n = g.len().min(u.len());
        let (pg, pu) = (g.as_mut_ptr(), u.as_ptr());
        // SAFETY: `silu_mul8` gets offsets `i` with `i + 8 <= n`, `n` the shorter length, or local
        // arrays of 8; AVX2 and FMA are enabled by the caller.
        unsafe {
            let mut i = 0;
            while i + 8 <= n {
                silu_mul8(pg.add(i), pu.add(i));
                i += 8;
            }
            if i < n {
                let (mut bg, mut bu) = ([0.0f32; 8], [0.0f32; 8]);
                bg[..n - i].copy_from_slice(&g[i..n]);
                bu[..n - i].copy_from_slice(&u[i..n]);
                silu_mul8(bg.as_mut_ptr(), bu.as_ptr());
                g[i..n].copy_from_slice(&bg[..n - i]);
            }
        }
    }

    #[inline(always)]
    unsafe fn sum_squares(x: &[f32]) -> f32 {
        // SAFETY: `dot` reads only inside `x`; AVX2 and FMA are enabled by the caller.
        unsafe { Self::dot(x, x) }
    }

    #[inline(always)]
    unsafe fn scale_mul(x: &[f32], s: f32, w: &[f32], out: &mut [f32]) {
        let n = x.len().min(w.len()).min(out.len());
        let (px, pw, po) = (x.as_ptr(), w.as_ptr(), out.as_mut_ptr());
        // SAFETY: every load and store is at `i` with `i + 8 <= n`, and `n` is the shortest length;
        // AVX is enabled with the caller's AVX2.
        unsafe {
            let vs = _mm256_set1_ps(s);
            let mut i = 0;
            while i + 8 <= n {
                let v = _mm256_mul_ps(_mm256_loadu_ps(px.add(i)), vs);
                _mm256_storeu_ps(po.add(i), _mm256_mul_ps(v, _mm256_loadu_ps(pw.add(i))));
                i += 8;
            }
            while i < n {
                out[i] = (x[i] * s) * w[i];
                i += 1;
            }
        }
    }

    #[inline(always)]
    unsafe fn add(x: &mut [f32], y: &[f32]) {
        let n = x.len().min(y.len());
        let (px, py) = (x.as_mut_ptr(), y.as_ptr());
        // SAFETY: every load and store is at `i` with `i + 8 <= n`, and `n` is the shorter length;
        // AVX is enabled with the caller's AVX2.
        unsafe {
            let mut i = 0;
            while i + 8 <= n {
                let v = _mm256_add_ps(_mm256_loadu_ps(px.add(i)), _mm256_loadu_ps(py.add(i)));
                _mm256_storeu_ps(px.add(i), v);
                i += 8;
            }
            while i < n {
                x[i] += y[i];
                i += 1;
            }
        }
    }

    #[inline(always)]
    unsafe fn f16_to_f32(x: &[u8], out: &mut [f32]) {
        let n = out.len().min(x.len() / 2);
        let (px, po) = (x.as_ptr(), out.as_mut_ptr());
        // SAFETY: every load reads the 16 bytes of eight f16 at `2i` and every store writes
        // eight f32 at `i`, with `i + 8 <= n` and `n` within both slices; F16C is enabled with
        // the caller's AVX2 (every entry point of this chapter enables them together).
        unsafe {
            let mut i = 0;
            while i + 8 <= n {
                let h = _mm_loadu_si128(px.add(2 * i) as *const __m128i);
                _mm256_storeu_ps(po.add(i), _mm256_cvtph_ps(h));
                i += 8;
            }
            while i < n {
                out[i] = half::f16::from_le_bytes([x[2 * i], x[2 * i + 1]]).to_f32();
                i += 1;
            }
        }
    }

    #[inline(always)]
    unsafe fn q8_0_to_f32(x: &[u8], out: &mut [f32]) {
        for (b, o) in x.chunks_exact(34).zip(out.chunks_exact_mut(32)) {
            let d = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
            // SAFETY: `b` is 34 bytes and `o` 32 floats: four loads of eight codes at `2 + 8j`
            // and four stores of eight floats at `8j`, `j < 4`, stay inside them. AVX2 is
            // enabled by the caller.
            unsafe {
                let vd = _mm256_set1_ps(d);
                for j in 0..4 {
                    let q = _mm_loadl_epi64(b.as_ptr().add(2 + 8 * j) as *const __m128i);
                    let f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
                    _mm256_storeu_ps(o.as_mut_ptr().add(8 * j), _mm256_mul_ps(f, vd));
                }
            }
        }
    }
}
