//! The k-quants: super-blocks of 256 weights split into sub-blocks of 16 or 32, whose scales
//! (and mins) are themselves quantized against one f16 super-block scale.
//!
//! Ports of ggml's `quantize_row_q*_K_ref` and `dequantize_row_q*_K` (`ggml-quants.c`) and of
//! the `ggml_vec_dot_q*_K_q8_K_generic` dot products (`ggml-cpu/quants.c`), with ggml's float
//! operations in ggml's order.

use super::blocks::*;
use super::legacy::{check_dot, impl_block};
use super::search::{
    GROUP_MAX_EPS, get_scale_min_k4, make_q3_quants, make_qkx2_quants, make_qx_quants, nearest_int,
};
use half::f16;

/// Pack 2-bit codes as Q2_K and Q3_K store them: byte `l` of each 32-byte group holds codes
/// `l`, `l + 32`, `l + 64`, `l + 96` of its 128 weights, lowest bits first.
fn pack_2bit(l: &[u8; QK_K], qs: &mut [u8; QK_K / 4]) {
    for j in (0..QK_K).step_by(128) {
        for i in 0..32 {
            qs[j / 4 + i] =
                l[j + i] | (l[j + i + 32] << 2) | (l[j + i + 64] << 4) | (l[j + i + 96] << 6);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Q2_K

/// `quantize_row_q2_K_ref`.
pub fn quantize_row_q2_K_ref(x: &[f32], y: &mut [BlockQ2_K]) {
    assert_eq!(x.len(), y.len() * QK_K, "quantize_row_q2_K_ref: lengths");
    const Q4SCALE: f32 = 15.0;
    let mut l = [0u8; QK_K];
    let mut weights = [0f32; 16];
    let mut mins = [0f32; QK_K / 16];
    let mut scales = [0f32; QK_K / 16];
    for (x, y) in x.chunks_exact(QK_K).zip(y) {
        let mut max_scale = 0.0f32; // the min is subtracted, so scales are never negative
        let mut max_min = 0.0f32;
        for j in 0..QK_K / 16 {
            let xs = &x[16 * j..16 * (j + 1)];
            for (w, v) in weights.iter_mut().zip(xs) {
                *w = v.abs();
            }
            let ls = &mut l[16 * j..16 * (j + 1)];
            (scales[j], mins[j]) = make_qkx2_quants(3, xs, &weights, ls, -0.5, 0.1, 15, true);
            if scales[j] > max_scale {
                max_scale = scales[j];
            }
            if mins[j] > max_min {
                max_min = mins[j];
            }
        }

        if max_scale > 0.0 {
            let iscale = Q4SCALE / max_scale;
            for j in 0..QK_K / 16 {
                y.scales[j] = nearest_int(iscale * scales[j]) as u8;
            }
            y.d = f16::from_f32(max_scale / Q4SCALE);
        } else {
            y.scales = [0; QK_K / 16];
            y.d = f16::from_f32(0.0);
        }
        if max_min > 0.0 {
            let iscale = Q4SCALE / max_min;
            for j in 0..QK_K / 16 {
                y.scales[j] |= (nearest_int(iscale * mins[j]) << 4) as u8;
            }
            y.dmin = f16::from_f32(max_min / Q4SCALE);
        } else {
            y.dmin = f16::from_f32(0.0);
        }
        // Re-round every weight against the scales as stored, not as computed.
        for j in 0..QK_K / 16 {
            let d = y.d.to_f32() * (y.scales[j] & 0xF) as f32;
            if d == 0.0 {
                continue;
            }
            let dm = y.dmin.to_f32() * (y.scales[j] >> 4) as f32;
            for ii in 0..16 {
                l[16 * j + ii] = nearest_int((x[16 * j + ii] + dm) / d).clamp(0, 3) as u8;
            }
        }
        pack_2bit(&l, &mut y.qs);
    }
}

/// `dequantize_row_q2_K`.
pub fn dequantize_row_q2_K(x: &[BlockQ2_K], y: &mut [f32]) {
    assert_eq!(y.len(), x.len() * QK_K, "dequantize_row_q2_K: lengths");
    for (x, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = x.d.to_f32();
        let min = x.dmin.to_f32();
        let mut out = 0;
        let mut is = 0;
        for n in (0..QK_K).step_by(128) {
            let q = &x.qs[n / 4..n / 4 + 32];
            for shift in [0, 2, 4, 6] {
                for half in [0, 16] {
                    let sc = x.scales[is];
                    is += 1;
                    let dl = d * (sc & 0xF) as f32;
                    let ml = min * (sc >> 4) as f32;
                    for l in 0..16 {
                        y[out] = dl * ((q[l + half] >> shift) & 3) as f32 - ml;
                        out += 1;
                    }
                }
            }
        }
    }
}

/// `ggml_vec_dot_q2_K_q8_K_generic`: the mins meet the activations only through `bsums`.
pub fn vec_dot_q2_K_q8_K(n: usize, x: &[BlockQ2_K], y: &[BlockQ8_K]) -> f32 {
    let nb = check_dot("vec_dot_q2_K_q8_K", n, QK_K, x.len(), y.len());
    let mut sumf = 0.0f32;
    for (x, y) in x[..nb].iter().zip(&y[..nb]) {
        let sc = &x.scales;
        let mut summs = 0i32;
        for j in 0..16 {
            summs += y.bsums[j] as i32 * (sc[j] >> 4) as i32;
        }
        let dall = y.d * x.d.to_f32();
        let dmin = y.d * x.dmin.to_f32();

        let mut isum = 0i32;
        let mut is = 0;
        let mut q8 = 0;
        for k in 0..QK_K / 128 {
            let q2 = &x.qs[32 * k..32 * (k + 1)];
            for shift in [0, 2, 4, 6] {
                for half in [0, 16] {
                    let d = (sc[is] & 0xF) as i32;
                    is += 1;
                    let mut isuml = 0i32;
                    for l in half..half + 16 {
                        isuml += y.qs[q8 + l] as i32 * ((q2[l] >> shift) & 3) as i32;
                    }
                    isum += d * isuml;
                }
                q8 += 32;
            }
        }
        sumf += dall * isum as f32 - dmin * summs as f32;
    }
    sumf
}

// ---------------------------------------------------------------------------------------------
// Q3_K

/// Signed 6-bit scale `j` of a `BlockQ3_K`: low four bits in `scales[0..8]` (two per byte),
/// top two bits in `scales[8..12]` (four per byte).
pub fn q3_K_scale(scales: &[u8; 12], j: usize) -> i32 {
    let low = if j < 8 {
        scales[j] & 0xF
    } else {
        scales[j - 8] >> 4
    };
    let high = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
    (low | (high << 4)) as i32 - 32
}

/// `quantize_row_q3_K_ref`.
pub fn quantize_row_q3_K_ref(x: &[f32], y: &mut [BlockQ3_K]) {
    assert_eq!(x.len(), y.len() * QK_K, "quantize_row_q3_K_ref: lengths");
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; QK_K / 16];
    for (x, y) in x.chunks_exact(QK_K).zip(y) {
        let mut max_scale = 0.0f32;
        let mut amax = 0.0f32;
        for j in 0..QK_K / 16 {
            scales[j] = make_q3_quants(4, &x[16 * j..16 * (j + 1)], &mut l[16 * j..16 * (j + 1)]);
            let scale = scales[j].abs();
            if scale > amax {
                amax = scale;
                max_scale = scales[j];
            }
        }

        y.scales = [0; 12];
        if max_scale != 0.0 {
            let iscale = -32.0 / max_scale;
            for j in 0..QK_K / 16 {
                // C stores nearest_int's result in an int8_t before clamping.
                let lj = ((nearest_int(iscale * scales[j]) as i8).clamp(-32, 31) + 32) as u8;
                if j < 8 {
                    y.scales[j] = lj & 0xF;
                } else {
                    y.scales[j - 8] |= (lj & 0xF) << 4;
                }
                y.scales[j % 4 + 8] |= (lj >> 4) << (2 * (j / 4));
            }
            y.d = f16::from_f32(1.0 / iscale);
        } else {
            y.d = f16::from_f32(0.0);
        }

        for j in 0..QK_K / 16 {
            let d = y.d.to_f32() * q3_K_scale(&y.scales, j) as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                let li = nearest_int(x[16 * j + ii] / d).clamp(-4, 3);
                l[16 * j + ii] = (li + 4) as i8;
            }
        }

        // The high bit of codes 0-31 goes to bit 0 of hmask[0..32], of codes 32-63 to bit 1,
        // and so on.
        y.hmask = [0; QK_K / 8];
        let mut m = 0;
        let mut hm = 1u8;
        for lj in l.iter_mut() {
            if *lj > 3 {
                y.hmask[m] |= hm;
                *lj -= 4;
            }
            m += 1;
            if m == QK_K / 8 {
                m = 0;
                hm <<= 1;
            }
        }
        let l: [u8; QK_K] = l.map(|v| v as u8);
        pack_2bit(&l, &mut y.qs);
    }
}

/// `dequantize_row_q3_K`.
pub fn dequantize_row_q3_K(x: &[BlockQ3_K], y: &mut [f32]) {
    assert_eq!(y.len(), x.len() * QK_K, "dequantize_row_q3_K: lengths");
    for (x, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d_all = x.d.to_f32();
        let mut m = 1u8;
        let mut out = 0;
        let mut is = 0;
        for n in (0..QK_K).step_by(128) {
            let q = &x.qs[n / 4..n / 4 + 32];
            for shift in [0, 2, 4, 6] {
                for half in [0, 16] {
                    let dl = d_all * q3_K_scale(&x.scales, is) as f32;
                    is += 1;
                    for l in half..half + 16 {
                        let high = if x.hmask[l] & m != 0 { 0 } else { 4 };
                        y[out] = dl * (((q[l] >> shift) & 3) as i32 - high) as f32;
                        out += 1;
                    }
                }
                m <<= 1;
            }
        }
    }
}

/// `ggml_vec_dot_q3_K_q8_K_generic`: codes are expanded to `aux8`, multiplied in 8 lanes of
/// i32 (`aux32`) and the lanes scaled into 8 float sums, as ggml lays it out for
/// auto-vectorization; the final sum adds the 8 lanes in order.
pub fn vec_dot_q3_K_q8_K(n: usize, x: &[BlockQ3_K], y: &[BlockQ8_K]) -> f32 {
    let nb = check_dot("vec_dot_q3_K_q8_K", n, QK_K, x.len(), y.len());
    let mut sums = [0f32; 8];
    for (x, y) in x[..nb].iter().zip(&y[..nb]) {
        let mut aux8 = [0i8; QK_K];
        let mut m = 1u8;
        let mut a = 0;
        for j in (0..QK_K).step_by(128) {
            let q3 = &x.qs[j / 4..j / 4 + 32];
            for shift in [0, 2, 4, 6] {
                for l in 0..32 {
                    let high = if x.hmask[l] & m != 0 { 0 } else { 4 };
                    aux8[a + l] = ((q3[l] >> shift) & 3) as i8 - high;
                }
                a += 32;
                m <<= 1;
            }
        }
        let mut aux32 = [0i32; 8];
        accumulate_lanes(&aux8, &y.qs, 16, |j| q3_K_scale(&x.scales, j), &mut aux32);
        let d = x.d.to_f32() * y.d;
        for l in 0..8 {
            sums[l] += d * aux32[l] as f32;
        }
    }
    sums.iter().fold(0.0f32, |s, &v| s + v)
}

/// The integer core shared by the generic Q3_K..Q6_K dot products: for each group of `group`
/// codes with scale `scale(g)`, add `scale * a[i] * q8[i]` into lane `i % 8`.
fn accumulate_lanes(
    a: &[i8; QK_K],
    q8: &[i8; QK_K],
    group: usize,
    scale: impl Fn(usize) -> i32,
    aux32: &mut [i32; 8],
) {
    for g in 0..QK_K / group {
        let s = scale(g);
        for i in (g * group..(g + 1) * group).step_by(8) {
            for l in 0..8 {
                // ggml keeps the product in an int16_t; |a * q8| <= 64 * 128 always fits.
                let aux16 = (q8[i + l] as i32 * a[i + l] as i32) as i16;
                aux32[l] += s * aux16 as i32;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Q4_K

/// Write 6-bit scales and mins into the 12 bytes that [`get_scale_min_k4`] reads.
fn pack_scale_min_k4(ls: &[u8; 8], lm: &[u8; 8], q: &mut [u8; 12]) {
    for j in 0..8 {
        if j < 4 {
            q[j] = ls[j];
            q[j + 4] = lm[j];
        } else {
            q[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4);
            q[j - 4] |= (ls[j] >> 4) << 6;
            q[j] |= (lm[j] >> 4) << 6;
        }
    }
}

/// The sub-block scales and mins of Q4_K and Q5_K: `make_qkx2_quants` per 32 weights, then both
/// sets quantized to 6 bits against their maxima. Returns the per-sub-block codes in `l`.
fn quantize_scales_k4(
    x: &[f32],
    nmax: i32,
    rmin: f32,
    nstep: i32,
    l: &mut [u8; QK_K],
) -> (f16, f16, [u8; 12]) {
    let mut mins = [0f32; QK_K / 32];
    let mut scales = [0f32; QK_K / 32];
    let mut weights = [0f32; 32];
    let mut max_scale = 0.0f32; // the min is subtracted, so scales are never negative
    let mut max_min = 0.0f32;
    for j in 0..QK_K / 32 {
        let xs = &x[32 * j..32 * (j + 1)];
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        let ls = &mut l[32 * j..32 * (j + 1)];
        (scales[j], mins[j]) = make_qkx2_quants(nmax, xs, &weights, ls, rmin, 0.1, nstep, false);
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut ls = [0u8; 8];
    let mut lm = [0u8; 8];
    for j in 0..QK_K / 32 {
        // C assigns nearest_int's result to a uint8_t, then clamps.
        ls[j] = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        lm[j] = (nearest_int(inv_min * mins[j]) as u8).min(63);
    }
    let mut packed = [0u8; 12];
    pack_scale_min_k4(&ls, &lm, &mut packed);
    (
        f16::from_f32(max_scale / 63.0),
        f16::from_f32(max_min / 63.0),
        packed,
    )
}

/// Re-round every weight against the 6-bit scales and mins as stored: `(x + dm) / d`.
fn requantize_k4(x: &[f32], d: f16, dmin: f16, scales: &[u8; 12], nmax: i32, l: &mut [u8]) {
    for j in 0..QK_K / 32 {
        let (sc, m) = get_scale_min_k4(j, scales);
        let d = d.to_f32() * sc as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin.to_f32() * m as f32;
        for ii in 0..32 {
            l[32 * j + ii] = nearest_int((x[32 * j + ii] + dm) / d).clamp(0, nmax) as u8;
        }
    }
}

// ANCHOR: q4_K
/// `quantize_row_q4_K_ref`.
pub fn quantize_row_q4_K_ref(x: &[f32], y: &mut [BlockQ4_K]) {
    assert_eq!(x.len(), y.len() * QK_K, "quantize_row_q4_K_ref: lengths");
    let mut l = [0u8; QK_K];
    for (x, y) in x.chunks_exact(QK_K).zip(y) {
        (y.d, y.dmin, y.scales) = quantize_scales_k4(x, 15, -1.0, 20, &mut l);
        requantize_k4(x, y.d, y.dmin, &y.scales, 15, &mut l);
        // Byte i of each 32-byte group: code i in the low nibble, code i + 32 in the high one.
        for j in (0..QK_K).step_by(64) {
            for i in 0..32 {
                y.qs[j / 2 + i] = l[j + i] | (l[j + i + 32] << 4);
            }
        }
    }
}
// ANCHOR_END: q4_K

// ANCHOR: dequantize_q4_K
/// `dequantize_row_q4_K`: `w = d · sc · q − dmin · m`, with sub-block `s`'s 6-bit scale `sc` and
/// min `m` from [`get_scale_min_k4`].
pub fn dequantize_row_q4_K(x: &[BlockQ4_K], y: &mut [f32]) {
    assert_eq!(y.len(), x.len() * QK_K, "dequantize_row_q4_K: lengths");
    // ANCHOR: yours_dequantize_q4_K
    for (x, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = x.d.to_f32();
        let min = x.dmin.to_f32();
        for (is, j) in (0..QK_K).step_by(64).enumerate() {
            let q = &x.qs[j / 2..j / 2 + 32];
            let (sc, m) = get_scale_min_k4(2 * is, &x.scales);
            let (d1, m1) = (d * sc as f32, min * m as f32);
            let (sc, m) = get_scale_min_k4(2 * is + 1, &x.scales);
            let (d2, m2) = (d * sc as f32, min * m as f32);
            for l in 0..32 {
                y[j + l] = d1 * (q[l] & 0xF) as f32 - m1;
                y[j + 32 + l] = d2 * (q[l] >> 4) as f32 - m2;
            }
        }
    }
    // ANCHOR_END: yours_dequantize_q4_K
}
// ANCHOR_END: dequantize_q4_K

// ANCHOR: q4_K_dot
/// `ggml_vec_dot_q4_K_q8_K_generic`.
pub fn vec_dot_q4_K_q8_K(n: usize, x: &[BlockQ4_K], y: &[BlockQ8_K]) -> f32 {
    let nb = check_dot("vec_dot_q4_K_q8_K", n, QK_K, x.len(), y.len());
    let mut sums = [0f32; 8];
    let mut sumf = 0.0f32;
    for (x, y) in x[..nb].iter().zip(&y[..nb]) {
        let mut aux8 = [0i8; QK_K];
        for j in (0..QK_K).step_by(64) {
            for l in 0..32 {
                aux8[j + l] = (x.qs[j / 2 + l] & 0xF) as i8;
                aux8[j + 32 + l] = (x.qs[j / 2 + l] >> 4) as i8;
            }
        }
        let (scales, mins) = scales_mins_k4(&x.scales);
        let mut sumi = 0i32;
        for j in 0..QK_K / 16 {
            sumi += y.bsums[j] as i32 * mins[j / 2] as i32;
        }
        let mut aux32 = [0i32; 8];
        accumulate_lanes(&aux8, &y.qs, 32, |j| scales[j] as i32, &mut aux32);
        let d = x.d.to_f32() * y.d;
        for l in 0..8 {
            sums[l] += d * aux32[l] as f32;
        }
        let dmin = x.dmin.to_f32() * y.d;
        sumf -= dmin * sumi as f32;
    }
    for s in sums {
        sumf += s;
    }
    sumf
}
// ANCHOR_END: q4_K_dot

/// All eight scales and mins of a Q4_K/Q5_K block.
fn scales_mins_k4(q: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let mut scales = [0u8; 8];
    let mut mins = [0u8; 8];
    for j in 0..8 {
        (scales[j], mins[j]) = get_scale_min_k4(j, q);
    }
    (scales, mins)
}

// ---------------------------------------------------------------------------------------------
// Q5_K

/// `quantize_row_q5_K_ref`.
pub fn quantize_row_q5_K_ref(x: &[f32], y: &mut [BlockQ5_K]) {
    assert_eq!(x.len(), y.len() * QK_K, "quantize_row_q5_K_ref: lengths");
    let mut l = [0u8; QK_K];
    for (x, y) in x.chunks_exact(QK_K).zip(y) {
        (y.d, y.dmin, y.scales) = quantize_scales_k4(x, 31, -0.5, 15, &mut l);
        requantize_k4(x, y.d, y.dmin, &y.scales, 31, &mut l);
        // Low nibbles as in Q4_K; the fifth bit of code j + 64 * k (+ 32) goes to bit 2k (2k + 1)
        // of qh[j].
        y.qh = [0; QK_K / 8];
        let (mut m1, mut m2) = (1u8, 2u8);
        for n in (0..QK_K).step_by(64) {
            for j in 0..32 {
                let mut l1 = l[n + j];
                if l1 > 15 {
                    l1 -= 16;
                    y.qh[j] |= m1;
                }
                let mut l2 = l[n + j + 32];
                if l2 > 15 {
                    l2 -= 16;
                    y.qh[j] |= m2;
                }
                y.qs[n / 2 + j] = l1 | (l2 << 4);
            }
            m1 <<= 2;
            m2 <<= 2;
        }
    }
}

/// `dequantize_row_q5_K`.
pub fn dequantize_row_q5_K(x: &[BlockQ5_K], y: &mut [f32]) {
    assert_eq!(y.len(), x.len() * QK_K, "dequantize_row_q5_K: lengths");
    for (x, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = x.d.to_f32();
        let min = x.dmin.to_f32();
        let (mut u1, mut u2) = (1u8, 2u8);
        for (is, j) in (0..QK_K).step_by(64).enumerate() {
            let ql = &x.qs[j / 2..j / 2 + 32];
            let (sc, m) = get_scale_min_k4(2 * is, &x.scales);
            let (d1, m1) = (d * sc as f32, min * m as f32);
            let (sc, m) = get_scale_min_k4(2 * is + 1, &x.scales);
            let (d2, m2) = (d * sc as f32, min * m as f32);
            for l in 0..32 {
                let h1 = if x.qh[l] & u1 != 0 { 16 } else { 0 };
                let h2 = if x.qh[l] & u2 != 0 { 16 } else { 0 };
                y[j + l] = d1 * ((ql[l] & 0xF) + h1) as f32 - m1;
                y[j + 32 + l] = d2 * ((ql[l] >> 4) + h2) as f32 - m2;
            }
            u1 <<= 2;
            u2 <<= 2;
        }
    }
}

/// `ggml_vec_dot_q5_K_q8_K_generic`.
pub fn vec_dot_q5_K_q8_K(n: usize, x: &[BlockQ5_K], y: &[BlockQ8_K]) -> f32 {
    let nb = check_dot("vec_dot_q5_K_q8_K", n, QK_K, x.len(), y.len());
    let mut sums = [0f32; 8];
    let mut sumf = 0.0f32;
    for (x, y) in x[..nb].iter().zip(&y[..nb]) {
        let mut aux8 = [0i8; QK_K];
        let mut m = 1u8;
        for j in (0..QK_K).step_by(64) {
            for l in 0..32 {
                let h = if x.qh[l] & m != 0 { 16 } else { 0 };
                aux8[j + l] = (x.qs[j / 2 + l] & 0xF) as i8 + h;
            }
            m <<= 1;
            for l in 0..32 {
                let h = if x.qh[l] & m != 0 { 16 } else { 0 };
                aux8[j + 32 + l] = (x.qs[j / 2 + l] >> 4) as i8 + h;
            }
            m <<= 1;
        }
        let (scales, mins) = scales_mins_k4(&x.scales);
        let mut sumi = 0i32;
        for j in 0..QK_K / 16 {
            sumi += y.bsums[j] as i32 * mins[j / 2] as i32;
        }
        let mut aux32 = [0i32; 8];
        accumulate_lanes(&aux8, &y.qs, 32, |j| scales[j] as i32, &mut aux32);
        let d = x.d.to_f32() * y.d;
        for l in 0..8 {
            sums[l] += d * aux32[l] as f32;
        }
        let dmin = x.dmin.to_f32() * y.d;
        sumf -= dmin * sumi as f32;
    }
    for s in sums {
        sumf += s;
    }
    sumf
}

// ---------------------------------------------------------------------------------------------
// Q6_K

// ANCHOR: q6_K
/// `quantize_row_q6_K_ref`: `make_qx_quants` per 16 weights, then the 16 scales to signed 8
/// bits against the one of largest magnitude.
pub fn quantize_row_q6_K_ref(x: &[f32], y: &mut [BlockQ6_K]) {
    assert_eq!(x.len(), y.len() * QK_K, "quantize_row_q6_K_ref: lengths");
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; QK_K / 16];
    for (x, y) in x.chunks_exact(QK_K).zip(y) {
        let mut max_scale = 0.0f32;
        let mut max_abs_scale = 0.0f32;
        for ib in 0..QK_K / 16 {
            let r = 16 * ib..16 * (ib + 1);
            scales[ib] = make_qx_quants(32, &x[r.clone()], &mut l[r], None);
            if scales[ib].abs() > max_abs_scale {
                max_abs_scale = scales[ib].abs();
                max_scale = scales[ib];
            }
        }
        if max_abs_scale < GROUP_MAX_EPS {
            *y = bytemuck::Zeroable::zeroed();
            continue;
        }

        let iscale = -128.0 / max_scale;
        y.d = f16::from_f32(1.0 / iscale);
        for ib in 0..QK_K / 16 {
            y.scales[ib] = nearest_int(iscale * scales[ib]).min(127) as i8;
        }
        for j in 0..QK_K / 16 {
            let d = y.d.to_f32() * y.scales[j] as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                let li = nearest_int(x[16 * j + ii] / d).clamp(-32, 31);
                l[16 * j + ii] = (li + 32) as i8;
            }
        }

        // Per 128 weights: ql byte i holds codes i (low) and i + 64 (high), ql byte 32 + i
        // codes i + 32 and i + 96; qh byte i holds the top two bits of all four.
        for j in (0..QK_K).step_by(128) {
            let (ql, qh) = (&mut y.ql[j / 2..j / 2 + 64], &mut y.qh[j / 4..j / 4 + 32]);
            for i in 0..32 {
                let q = [0, 32, 64, 96].map(|o| l[j + i + o] as u8);
                ql[i] = (q[0] & 0xF) | ((q[2] & 0xF) << 4);
                ql[i + 32] = (q[1] & 0xF) | ((q[3] & 0xF) << 4);
                qh[i] = (q[0] >> 4) | ((q[1] >> 4) << 2) | ((q[2] >> 4) << 4) | ((q[3] >> 4) << 6);
            }
        }
    }
}
// ANCHOR_END: q6_K

// ANCHOR: q6_K_dot
/// `dequantize_row_q6_K`.
pub fn dequantize_row_q6_K(x: &[BlockQ6_K], y: &mut [f32]) {
    assert_eq!(y.len(), x.len() * QK_K, "dequantize_row_q6_K: lengths");
    for (x, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = x.d.to_f32();
        for (k, n) in (0..QK_K).step_by(128).enumerate() {
            let ql = &x.ql[n / 2..n / 2 + 64];
            let qh = &x.qh[n / 4..n / 4 + 32];
            let sc = &x.scales[8 * k..8 * k + 8];
            for l in 0..32 {
                let is = l / 16;
                let q = q6_K_codes(ql, qh, l);
                y[n + l] = d * sc[is] as f32 * q[0] as f32;
                y[n + l + 32] = d * sc[is + 2] as f32 * q[1] as f32;
                y[n + l + 64] = d * sc[is + 4] as f32 * q[2] as f32;
                y[n + l + 96] = d * sc[is + 6] as f32 * q[3] as f32;
            }
        }
    }
}

/// Codes `l`, `l + 32`, `l + 64`, `l + 96` of a 128-weight half of a `BlockQ6_K`, minus 32.
fn q6_K_codes(ql: &[u8], qh: &[u8], l: usize) -> [i8; 4] {
    [
        ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 - 32,
        ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32,
        ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32,
        ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32,
    ]
}

/// `ggml_vec_dot_q6_K_q8_K_generic`.
pub fn vec_dot_q6_K_q8_K(n: usize, x: &[BlockQ6_K], y: &[BlockQ8_K]) -> f32 {
    let nb = check_dot("vec_dot_q6_K_q8_K", n, QK_K, x.len(), y.len());
    let mut sums = [0f32; 8];
    for (x, y) in x[..nb].iter().zip(&y[..nb]) {
        let mut aux8 = [0i8; QK_K];
        for j in (0..QK_K).step_by(128) {
            let ql = &x.ql[j / 2..j / 2 + 64];
            let qh = &x.qh[j / 4..j / 4 + 32];
            for l in 0..32 {
                let q = q6_K_codes(ql, qh, l);
                for (k, &v) in q.iter().enumerate() {
                    aux8[j + l + 32 * k] = v;
                }
            }
        }
        let mut aux32 = [0i32; 8];
        accumulate_lanes(&aux8, &y.qs, 16, |j| x.scales[j] as i32, &mut aux32);
        let d = x.d.to_f32() * y.d;
        for l in 0..8 {
            sums[l] += d * aux32[l] as f32;
        }
    }
    sums.iter().fold(0.0f32, |s, &v| s + v)
}
// ANCHOR_END: q6_K_dot

// ---------------------------------------------------------------------------------------------
// Q8_K

/// `quantize_row_q8_K_ref`: the activation format for k-quant weights. `d = max / -127` in
/// f32 (no f16 rounding) and the sums of each 16 codes are kept for the weights' mins.
pub fn quantize_row_q8_K_ref(x: &[f32], y: &mut [BlockQ8_K]) {
    assert_eq!(x.len(), y.len() * QK_K, "quantize_row_q8_K_ref: lengths");
    for (x, y) in x.chunks_exact(QK_K).zip(y) {
        let mut max = 0.0f32;
        let mut amax = 0.0f32;
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            y.d = 0.0;
            y.qs = [0; QK_K];
            // ggml leaves bsums as they were; zero is what they must be.
            y.bsums = [0; QK_K / 16];
            continue;
        }
        // -127 rather than -128 keeps every code in -127..=127 (ggml needs that for IQ2_XXS).
        let iscale = -127.0 / max;
        for (q, &v) in y.qs.iter_mut().zip(x) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for (j, s) in y.bsums.iter_mut().enumerate() {
            *s = y.qs[16 * j..16 * (j + 1)].iter().map(|&q| q as i16).sum();
        }
        y.d = 1.0 / iscale;
    }
}

/// `dequantize_row_q8_K`.
pub fn dequantize_row_q8_K(x: &[BlockQ8_K], y: &mut [f32]) {
    assert_eq!(y.len(), x.len() * QK_K, "dequantize_row_q8_K: lengths");
    for (x, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        for (v, &q) in y.iter_mut().zip(&x.qs) {
            *v = x.d * q as f32;
        }
    }
}

/// `quantize_row_q8_K`: ggml-cpu's activation quantizer for k-quant weights.
pub fn quantize_row_q8_K(x: &[f32], y: &mut [BlockQ8_K]) {
    quantize_row_q8_K_ref(x, y)
}

impl_block!(
    BlockQ2_K,
    Q2_K,
    QK_K,
    dequantize_row_q2_K,
    quantize_row_q2_K_ref
);
impl_block!(
    BlockQ3_K,
    Q3_K,
    QK_K,
    dequantize_row_q3_K,
    quantize_row_q3_K_ref
);
impl_block!(
    BlockQ4_K,
    Q4_K,
    QK_K,
    dequantize_row_q4_K,
    quantize_row_q4_K_ref
);
impl_block!(
    BlockQ5_K,
    Q5_K,
    QK_K,
    dequantize_row_q5_K,
    quantize_row_q5_K_ref
);
impl_block!(
    BlockQ6_K,
    Q6_K,
    QK_K,
    dequantize_row_q6_K,
    quantize_row_q6_K_ref
);
impl_block!(
    BlockQ8_K,
    Q8_K,
    QK_K,
    dequantize_row_q8_K,
    quantize_row_q8_K_ref
);
