//! The activation quantizers Q8_0, Q8_1 and Q8_K with AVX2, and Q8_0 and Q8_1 with AVX-512,
//! giving chapter 6's bytes exactly.
//!
//! Exactness comes from doing the same float operations in the same order: the same `amax`
//! (a maximum is exact in any order), the same divisions for the scale, the same product per
//! element, and the same rounding. Chapter 6 rounds Q8_0/Q8_1 codes half away from zero
//! (`f32::round`, C's `roundf`), which x86 has no instruction for: [`round_away`] truncates and
//! adds one where the dropped fraction is at least one half. (ggml's AVX2 version rounds half
//! to even instead, and multiplies by `127 / amax` rather than `1 / (amax / 127)`, so on rare
//! ties its codes differ from its own reference by one; these do not.) Q8_K uses ggml's
//! `nearest_int`, a float addition and two integer operations, done here lane by lane.
//!
//! Out-of-range inputs follow Rust's `as i8` like the scalar code: NaN becomes 0, infinities
//! saturate.
//!
//! # Safety
//! Every function needs AVX2, FMA and F16C enabled by the caller; those named `…512`, and
//! the row loops given [`Zmm`], also AVX-512 F.

use super::super::first_with_abs;
use super::*;
use ch06::quants::blocks::*;

/// `max(|v|)` over `v`, ignoring NaN like chapter 6's `f32::max` fold: `vmaxps` returns its
/// second operand when either is NaN, and the running maximum is kept second.
#[inline(always)]
unsafe fn amax(v: &[__m256]) -> f32 {
    // SAFETY: AVX on registers only, which comes with the caller's AVX2.
    unsafe {
        let sign = _mm256_set1_ps(-0.0);
        let mut m = _mm256_setzero_ps();
        for &x in v {
            m = _mm256_max_ps(_mm256_andnot_ps(sign, x), m);
        }
        hmax(m)
    }
}

/// `v.round() as i8` for 8 floats, as 32-bit lanes: round half away from zero, NaN to 0,
/// saturate to `-128..=127`.
#[inline(always)]
unsafe fn round_away(v: __m256) -> __m256i {
    // SAFETY: AVX on registers only, which comes with the caller's AVX2.
    unsafe {
        // `v - trunc(v)` is exact, so comparing it with 0.5 decides the rounding exactly.
        let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(v);
        let frac = _mm256_andnot_ps(_mm256_set1_ps(-0.0), _mm256_sub_ps(v, t));
        let up = _mm256_cmp_ps::<_CMP_GE_OQ>(frac, _mm256_set1_ps(0.5));
        let one = _mm256_or_ps(_mm256_set1_ps(1.0), _mm256_and_ps(v, _mm256_set1_ps(-0.0)));
        let r = _mm256_add_ps(t, _mm256_and_ps(up, one));
        let r = _mm256_and_ps(r, _mm256_cmp_ps::<_CMP_ORD_Q>(v, v));
        let r = _mm256_min_ps(
            _mm256_max_ps(r, _mm256_set1_ps(-128.0)),
            _mm256_set1_ps(127.0),
        );
        _mm256_cvtps_epi32(r)
    }
}

/// Four vectors of eight 32-bit codes in `-128..=127` → 32 bytes in element order.
#[inline(always)]
unsafe fn pack_i8(q: [__m256i; 4]) -> __m256i {
    // SAFETY: AVX2 on registers only, which the caller enables.
    unsafe {
        // The packs work within 128-bit halves; the permute puts the 4-byte groups back.
        let p = _mm256_packs_epi16(
            _mm256_packs_epi32(q[0], q[1]),
            _mm256_packs_epi32(q[2], q[3]),
        );
        _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
    }
}

/// One block of 32: the scale `d` and the codes as 32-bit lanes.
#[inline(always)]
unsafe fn q8_block(x: &[f32]) -> (f32, [__m256i; 4]) {
    // SAFETY: each load reads `x[8k..8k + 8]`, a bounds-checked slice of 8 floats, and `vmovups`
    // needs no alignment; the rest is AVX on registers, which comes with the caller's AVX2.
    unsafe {
        let mut v = [_mm256_setzero_ps(); 4];
        for (k, v) in v.iter_mut().enumerate() {
            *v = _mm256_loadu_ps(x[8 * k..8 * k + 8].as_ptr());
        }
        let d = amax(&v) / 127.0;
        let id = _mm256_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
        let mut q = [_mm256_setzero_si256(); 4];
        for (q, &v) in q.iter_mut().zip(&v) {
            *q = round_away(_mm256_mul_ps(v, id));
        }
        (d, q)
    }
}

/// One block of 32 floats as its scale and codes, with one register width: AVX2's eight floats
/// ([`Ymm`]) or AVX-512's sixteen ([`Zmm`]). The row loops below are written once for both.
pub(super) trait Q8Block {
    /// The block's scale `d`, its 32 codes written to `qs`, and (only when `SUM`) `Σ q`, an
    /// integer sum, exact in any order.
    ///
    /// # Safety
    /// The caller enables the width's instructions; `x` holds 32 floats.
    unsafe fn block<const SUM: bool>(x: &[f32], qs: &mut [i8; 32]) -> (f32, i32);
}

/// AVX2: four registers of eight.
pub(super) struct Ymm;
/// AVX-512: two registers of sixteen (needs AVX-512 F besides AVX2).
pub(super) struct Zmm;

impl Q8Block for Ymm {
    #[inline(always)]
    unsafe fn block<const SUM: bool>(x: &[f32], qs: &mut [i8; 32]) -> (f32, i32) {
        // SAFETY: `q8_block` gets a chunk of 32 floats; the store writes the 32 bytes of `qs`.
        // AVX2 is enabled by the caller.
        unsafe {
            let (d, q) = q8_block(x);
            _mm256_storeu_si256(qs.as_mut_ptr().cast(), pack_i8(q));
            let sum = if SUM {
                hsum_i32(_mm256_add_epi32(
                    _mm256_add_epi32(q[0], q[1]),
                    _mm256_add_epi32(q[2], q[3]),
                ))
            } else {
                0
            };
            (d, sum)
        }
    }
}

/// `quantize_row_q8_0`.
#[inline(always)]
pub(super) unsafe fn quantize_row_q8_0<B: Q8Block>(x: &[f32], y: &mut [BlockQ8_0]) {
    assert_eq!(x.len(), y.len() * QK8_0, "quantize_row_q8_0: lengths");
    // SAFETY: `block` gets a chunk of 32 floats and the block's 32 codes; the caller enables
    // `B`'s instructions and F16C.
    unsafe {
        for (x, y) in x.chunks_exact(QK8_0).zip(y) {
            let (d, _) = B::block::<false>(x, &mut y.qs);
            y.d = to_fp16(d);
        }
    }
}

/// `quantize_row_q8_1`: Q8_0's codes and `s = d · Σ q`.
#[inline(always)]
pub(super) unsafe fn quantize_row_q8_1<B: Q8Block>(x: &[f32], y: &mut [BlockQ8_1]) {
    assert_eq!(x.len(), y.len() * QK8_1, "quantize_row_q8_1: lengths");
    // SAFETY: as in `quantize_row_q8_0`.
    unsafe {
        for (x, y) in x.chunks_exact(QK8_1).zip(y) {
            let (d, sum) = B::block::<true>(x, &mut y.qs);
            y.d = to_fp16(d);
            y.s = to_fp16(sum as f32 * d);
        }
    }
}

/// `v.round() as i8` for 16 floats, as 32-bit lanes, by another route than [`round_away`]'s
/// to the same result: add ±0.49999997 (the largest float below one half, with `v`'s sign) and
/// truncate. Where `v`'s fraction is below one half the sum stays below the next integer; where
/// it is a half or more, the sum reaches it — at exactly one half only by the addition's
/// rounding, which goes to the even neighbour, the integer. Checked once for every float of
/// magnitude up to 10⁹ against `f32::round` (beyond, floats are integers and the sum rounds
/// back to them), and by the tests below on every half and its neighbours and a sweep of the
/// codes' range. NaN becomes 0 and the result saturates to `-128..=127` as before.
#[inline(always)]
unsafe fn round_away512(v: __m512) -> __m512i {
    // SAFETY: AVX-512 F on registers only, which the caller enables.
    unsafe {
        let below_half = _mm512_set1_epi32(0x3EFF_FFFF);
        // (v & sign bit) | 0.49999997: `vpternlogd` with the truth table of `(a & b) | c`.
        let h = _mm512_ternarylogic_epi32::<0xEA>(
            _mm512_castps_si512(v),
            _mm512_set1_epi32(i32::MIN),
            below_half,
        );
        let t = _mm512_add_ps(v, _mm512_castsi512_ps(h));
        let t = _mm512_maskz_max_ps(
            _mm512_cmp_ps_mask::<_CMP_ORD_Q>(v, v),
            t,
            _mm512_set1_ps(-128.0),
        );
        _mm512_cvttps_epi32(_mm512_min_ps(t, _mm512_set1_ps(127.0)))
    }
}

/// [`q8_block`] with AVX-512: a block of 32 in two registers of sixteen.
#[inline(always)]
unsafe fn q8_block512(x: &[f32]) -> (f32, [__m512i; 2]) {
    // SAFETY: each load reads a bounds-checked slice of 16 floats, and `vmovups` needs no
    // alignment; the rest is AVX-512 F on registers, which the caller enables.
    unsafe {
        let v = [
            _mm512_loadu_ps(x[..16].as_ptr()),
            _mm512_loadu_ps(x[16..32].as_ptr()),
        ];
        // As `amax`: the running maximum second, so that a NaN lane never enters it, and the
        // reduction meets no NaN (a maximum is exact in any order).
        let zero = _mm512_setzero_ps();
        let m = _mm512_max_ps(
            _mm512_abs_ps(v[1]),
            _mm512_max_ps(_mm512_abs_ps(v[0]), zero),
        );
        let d = _mm512_reduce_max_ps(m) / 127.0;
        let id = _mm512_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
        let q = [
            round_away512(_mm512_mul_ps(v[0], id)),
            round_away512(_mm512_mul_ps(v[1], id)),
        ];
        (d, q)
    }
}

/// Two registers of sixteen 32-bit codes in `-128..=127` into a block's 32 bytes.
#[inline(always)]
unsafe fn store_i8_512(qs: &mut [i8; 32], q: [__m512i; 2]) {
    // SAFETY: `vpmovdb` keeps each lane's low byte (exact: the codes fit), and the two stores
    // write bytes 0..16 and 16..32 of the 32-byte array. AVX-512 F, which the caller enables.
    unsafe {
        _mm_storeu_si128(qs.as_mut_ptr().cast(), _mm512_cvtepi32_epi8(q[0]));
        _mm_storeu_si128(qs.as_mut_ptr().add(16).cast(), _mm512_cvtepi32_epi8(q[1]));
    }
}

impl Q8Block for Zmm {
    #[inline(always)]
    unsafe fn block<const SUM: bool>(x: &[f32], qs: &mut [i8; 32]) -> (f32, i32) {
        // SAFETY: `q8_block512` gets a chunk of 32 floats, `store_i8_512` the block's 32 codes.
        // AVX-512 F is enabled by the caller.
        unsafe {
            let (d, q) = q8_block512(x);
            store_i8_512(qs, q);
            let sum = if SUM {
                _mm512_reduce_add_epi32(_mm512_add_epi32(q[0], q[1]))
            } else {
                0
            };
            (d, sum)
        }
    }
}

/// Q8_0 blocks (or, with `Q8_1`, Q8_1 blocks) of `x` written straight into a packed product's
/// activation panels, without the blocks in between: block `b`'s 32 codes at
/// `qs + 32·b·stride`, and at `b·stride` from `d`, `s` and `sums` its scale (the block's f16,
/// widened back to f32), Q8_1's `s` (likewise) and `Σq`. The same numbers as quantizing the
/// row with `quantize_row_q8_0`/`_1` and reading the blocks back.
///
/// # Safety
/// The caller enables AVX2, FMA, F16C and AVX-512 F; `x` holds whole blocks; every address
/// written is valid and written by nobody else meanwhile (`s` is not written unless `Q8_1`).
#[inline(always)]
pub(super) unsafe fn quantize_q8_panel<const Q8_1: bool>(
    x: &[f32],
    qs: *mut u8,
    d: *mut f32,
    s: *mut f32,
    sums: *mut i32,
    stride: usize,
) {
    // SAFETY: `block` gets a chunk of 32 floats and a local array; the writes are the caller's
    // addresses; the instructions are those the caller enables.
    unsafe {
        let widen = |h: f16| _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h.to_bits() as i32)));
        for (b, x) in x.chunks_exact(QK8_0).enumerate() {
            let mut codes = [0i8; 32];
            let (db, sum) = Zmm::block::<true>(x, &mut codes);
            (qs.add(32 * b * stride) as *mut [i8; 32]).write_unaligned(codes);
            *d.add(b * stride) = widen(to_fp16(db));
            if Q8_1 {
                *s.add(b * stride) = widen(to_fp16(sum as f32 * db));
            }
            *sums.add(b * stride) = sum;
        }
    }
}

/// ggml's `nearest_int` on 8 lanes: adding 1.5 · 2^23 leaves the rounded value (ties to even)
/// in the low mantissa bits.
#[inline(always)]
unsafe fn nearest_int(v: __m256) -> __m256i {
    // SAFETY: AVX2 on registers only, which the caller enables.
    unsafe {
        let bits = _mm256_castps_si256(_mm256_add_ps(v, _mm256_set1_ps(12582912.0)));
        _mm256_sub_epi32(
            _mm256_and_si256(bits, _mm256_set1_epi32(0x007f_ffff)),
            _mm256_set1_epi32(0x0040_0000),
        )
    }
}

/// Sums of 16 codes: for 4 registers of 32 codes, the 8 sums in group order.
#[inline(always)]
unsafe fn sums16(c: &[__m256i]) -> __m256i {
    // SAFETY: AVX2 on registers only, which the caller enables.
    unsafe {
        let ones8 = _mm256_set1_epi8(1);
        let ones16 = _mm256_set1_epi16(1);
        // Sums of 4: lanes 0..4 cover the register's first 16 codes, lanes 4..8 the rest.
        let mut s = [_mm256_setzero_si256(); 4];
        for (s, &c) in s.iter_mut().zip(c) {
            *s = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, c), ones16);
        }
        // Two rounds of pairwise adds leave [g0 g2 g4 g6 | g1 g3 g5 g7].
        let h = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
        _mm256_permutevar8x32_epi32(h, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
    }
}

/// `quantize_row_q8_K`.
#[inline(always)]
pub(super) unsafe fn quantize_row_q8_K(x: &[f32], y: &mut [BlockQ8_K]) {
    assert_eq!(x.len(), y.len() * QK_K, "quantize_row_q8_K: lengths");
    // SAFETY: each load reads a bounds-checked slice of 8 floats of a 256-float chunk; the stores
    // write 32 bytes at `qs[32k..]` (`k < 8`, inside the 256 codes) and the 32 bytes of `bsums`.
    // AVX2 is enabled by the caller.
    unsafe {
        for (x, y) in x.chunks_exact(QK_K).zip(y) {
            let mut v = [_mm256_setzero_ps(); 32];
            for (k, v) in v.iter_mut().enumerate() {
                *v = _mm256_loadu_ps(x[8 * k..8 * k + 8].as_ptr());
            }
            let amax = amax(&v);
            if amax == 0.0 {
                *y = BlockQ8_K {
                    d: 0.0,
                    qs: [0; QK_K],
                    bsums: [0; QK_K / 16],
                };
                continue;
            }
            let iscale = -127.0 / first_with_abs(x, amax);
            let vs = _mm256_set1_ps(iscale);
            let mut codes = [_mm256_setzero_si256(); 8];
            for (k, c) in codes.iter_mut().enumerate() {
                // `nearest_int(..).min(127) as i8`: the cast keeps the low byte.
                let mut q = [_mm256_setzero_si256(); 4];
                for (q, &v) in q.iter_mut().zip(&v[4 * k..4 * k + 4]) {
                    let n =
                        _mm256_min_epi32(nearest_int(_mm256_mul_ps(vs, v)), _mm256_set1_epi32(127));
                    *q = _mm256_and_si256(n, _mm256_set1_epi32(0xFF));
                }
                let p = _mm256_packus_epi16(
                    _mm256_packus_epi32(q[0], q[1]),
                    _mm256_packus_epi32(q[2], q[3]),
                );
                *c = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
                _mm256_storeu_si256(y.qs[32 * k..].as_mut_ptr().cast(), *c);
            }
            let (lo, hi) = (sums16(&codes[..4]), sums16(&codes[4..]));
            let b = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(lo, hi));
            _mm256_storeu_si256(y.bsums.as_mut_ptr().cast(), b);
            y.d = 1.0 / iscale;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the kernels must give: `v.round() as i8`, as an i32.
    fn want(v: f32) -> i32 {
        v.round() as i8 as i32
    }

    /// The floats the rounding is hard on: every half from -130.5 to 130.5 and the four floats
    /// on each side of it, every integer there and its neighbours, a sweep of the range by
    /// bit patterns, and the specials.
    fn hard_values() -> Vec<f32> {
        let mut v = Vec::new();
        for k in -261..=261 {
            let c = k as f32 / 2.0;
            let (mut up, mut down) = (c, c);
            v.push(c);
            for _ in 0..4 {
                up = up.next_up();
                down = down.next_down();
                v.extend([up, down]);
            }
        }
        let top = 131.0f32.to_bits();
        v.extend((0..top).step_by(997).flat_map(|b| {
            let x = f32::from_bits(b);
            [x, -x]
        }));
        v.extend([
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MAX,
            f32::MIN,
        ]);
        v.extend([f32::MIN_POSITIVE, 1e-40, 1e9, -1e9, 0.49999997, -0.49999997]);
        v
    }

    /// The rule itself, `trunc(v + copysign(0.49999997, v))` clamped, in plain Rust on any
    /// machine: the same integer as `f32::round` for every hard value.
    #[test]
    fn adding_just_under_a_half_and_truncating_rounds_half_away_from_zero() {
        let below_half = f32::from_bits(0x3EFF_FFFF);
        assert_eq!(below_half, 0.5f32.next_down());
        for x in hard_values() {
            let t = (x + below_half.copysign(x)).trunc();
            let got = if x.is_nan() {
                0
            } else {
                t.clamp(-128.0, 127.0) as i32
            };
            assert_eq!(got, want(x), "{x:e} ({:#010x})", x.to_bits());
        }
    }

    /// `round_away512` gives the rule's integers, lane by lane. It belongs to the AVX-512 set:
    /// a CPU without that set fails here unless `LLM_RS_ALLOW_MISSING_ISA` is set
    /// (`testkit::isa`; the rule itself is checked everywhere above).
    #[test]
    fn round_away512_equals_f32_round() {
        let isa = crate::kernels::Isa::Avx512;
        if !testkit::isa::require(isa.name(), &isa.missing_features()) {
            return;
        }
        #[target_feature(enable = "avx512f")]
        unsafe fn round16(x: &[f32; 16]) -> [i32; 16] {
            let mut out = [0i32; 16];
            // SAFETY: AVX-512 F is enabled here and present (checked by the caller); the
            // load and the store touch 16 floats and 16 integers of the arrays.
            unsafe {
                let r = round_away512(_mm512_loadu_ps(x.as_ptr()));
                _mm512_storeu_si512(out.as_mut_ptr().cast(), r);
            }
            out
        }
        let values = hard_values();
        for chunk in values.chunks(16) {
            let mut x = [0f32; 16];
            x[..chunk.len()].copy_from_slice(chunk);
            // SAFETY: the CPU has AVX-512 F, part of the AVX-512 set (checked above).
            let got = unsafe { round16(&x) };
            for (i, &v) in x.iter().enumerate() {
                assert_eq!(got[i], want(v), "{v:e} ({:#010x})", v.to_bits());
            }
        }
    }
}
