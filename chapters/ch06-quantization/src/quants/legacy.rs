//! The first formats ggml had: one scale (and perhaps a min) per block of 32 weights.
//!
//! Each function is a port of the one with the same name in ggml's `ggml-quants.c`
//! (quantize, dequantize) or `ggml-cpu/quants.c` (the `_generic` dot products), with the float
//! operations in the same order so that the bytes and sums come out identical.

use super::blocks::*;
use half::f16;

// ANCHOR: q4_0
/// `quantize_row_q4_0_ref`: the weight of largest magnitude maps to code 0 (`d = max / -8`),
/// so its sign is kept exactly and the other side of zero gets one code more.
pub fn quantize_row_q4_0_ref(x: &[f32], y: &mut [BlockQ4_0]) {
    // ANCHOR: yours_quantize_q4_0
    assert_eq!(x.len(), y.len() * QK4_0, "quantize_row_q4_0_ref: lengths");
    for (xb, yb) in x.chunks_exact(QK4_0).zip(y) {
        let mut amax = 0.0f32; // absolute max
        let mut max = 0.0f32; // ... with its sign
        for &v in xb {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f16::from_f32(d);
        for j in 0..QK4_0 / 2 {
            let x0 = xb[j] * id;
            let x1 = xb[QK4_0 / 2 + j] * id;
            // C's `(int8_t)(x + 8.5f)` truncates: +8.5 then truncation rounds to nearest.
            let xi0 = ((x0 + 8.5) as i8).min(15) as u8;
            let xi1 = ((x1 + 8.5) as i8).min(15) as u8;
            yb.qs[j] = xi0 | (xi1 << 4);
        }
    }
    // ANCHOR_END: yours_quantize_q4_0
}

/// `dequantize_row_q4_0`.
pub fn dequantize_row_q4_0(x: &[BlockQ4_0], y: &mut [f32]) {
    // ANCHOR: yours_dequantize_q4_0
    assert_eq!(y.len(), x.len() * QK4_0, "dequantize_row_q4_0: lengths");
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK4_0)) {
        let d = xb.d.to_f32();
        for j in 0..QK4_0 / 2 {
            let x0 = (xb.qs[j] & 0x0F) as i32 - 8;
            let x1 = (xb.qs[j] >> 4) as i32 - 8;
            yb[j] = x0 as f32 * d;
            yb[j + QK4_0 / 2] = x1 as f32 * d;
        }
    }
    // ANCHOR_END: yours_dequantize_q4_0
}
// ANCHOR_END: q4_0

// ANCHOR: q4_0_dot
/// `ggml_vec_dot_q4_0_q8_0_generic`: integer products within a block, one float multiply-add
/// per block.
pub fn vec_dot_q4_0_q8_0(n: usize, x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
    let nb = check_dot("vec_dot_q4_0_q8_0", n, QK8_0, x.len(), y.len());
    // ANCHOR: yours_vec_dot_q4_0_q8_0
    let mut sumf = 0.0f32;
    for (xb, yb) in x[..nb].iter().zip(&y[..nb]) {
        let mut sumi0 = 0i32;
        let mut sumi1 = 0i32;
        for j in 0..QK8_0 / 2 {
            let v0 = (xb.qs[j] & 0x0F) as i32 - 8;
            let v1 = (xb.qs[j] >> 4) as i32 - 8;
            sumi0 += v0 * yb.qs[j] as i32;
            sumi1 += v1 * yb.qs[j + QK8_0 / 2] as i32;
        }
        let sumi = sumi0 + sumi1;
        sumf += sumi as f32 * xb.d.to_f32() * yb.d.to_f32();
    }
    sumf
    // ANCHOR_END: yours_vec_dot_q4_0_q8_0
}
// ANCHOR_END: q4_0_dot

/// Number of blocks in a dot product of `n` elements; panics on a violated precondition.
pub(crate) fn check_dot(name: &str, n: usize, qk: usize, nx: usize, ny: usize) -> usize {
    assert!(
        n.is_multiple_of(qk),
        "{name}: n = {n} is not a multiple of {qk}"
    );
    let nb = n / qk;
    assert!(
        nx == nb && ny == nb,
        "{name}: n = {n} needs {nb} blocks on each side, got {nx} and {ny}"
    );
    nb
}

// ANCHOR: q4_1
/// `quantize_row_q4_1_ref`: codes 0..16 span [min, max] of the block.
pub fn quantize_row_q4_1_ref(x: &[f32], y: &mut [BlockQ4_1]) {
    assert_eq!(x.len(), y.len() * QK4_1, "quantize_row_q4_1_ref: lengths");
    for (xb, yb) in x.chunks_exact(QK4_1).zip(y) {
        let mut min = f32::MAX;
        let mut max = -f32::MAX;
        for &v in xb {
            if v < min {
                min = v;
            }
            if v > max {
                max = v;
            }
        }
        let d = (max - min) / ((1 << 4) - 1) as f32;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f16::from_f32(d);
        yb.m = f16::from_f32(min);
        for j in 0..QK4_1 / 2 {
            let x0 = (xb[j] - min) * id;
            let x1 = (xb[QK4_1 / 2 + j] - min) * id;
            let xi0 = ((x0 + 0.5) as i8).min(15) as u8;
            let xi1 = ((x1 + 0.5) as i8).min(15) as u8;
            yb.qs[j] = xi0 | (xi1 << 4);
        }
    }
}

/// `dequantize_row_q4_1`.
pub fn dequantize_row_q4_1(x: &[BlockQ4_1], y: &mut [f32]) {
    assert_eq!(y.len(), x.len() * QK4_1, "dequantize_row_q4_1: lengths");
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK4_1)) {
        let d = xb.d.to_f32();
        let m = xb.m.to_f32();
        for j in 0..QK4_1 / 2 {
            let x0 = (xb.qs[j] & 0x0F) as i32;
            let x1 = (xb.qs[j] >> 4) as i32;
            yb[j] = x0 as f32 * d + m;
            yb[j + QK4_1 / 2] = x1 as f32 * d + m;
        }
    }
}
// ANCHOR_END: q4_1

// ANCHOR: q4_1_dot
/// `ggml_vec_dot_q4_1_q8_1_generic`: `sum (d*q + m) * (dy*qy) = d*dy * sum(q*qy) + m * s`,
/// where `s = dy * sum(qy)` was stored by `quantize_row_q8_1`.
pub fn vec_dot_q4_1_q8_1(n: usize, x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
    let nb = check_dot("vec_dot_q4_1_q8_1", n, QK8_1, x.len(), y.len());
    let mut sumf = 0.0f32;
    for (xb, yb) in x[..nb].iter().zip(&y[..nb]) {
        let mut sumi0 = 0i32;
        let mut sumi1 = 0i32;
        for j in 0..QK8_1 / 2 {
            let v0 = (xb.qs[j] & 0x0F) as i32;
            let v1 = (xb.qs[j] >> 4) as i32;
            sumi0 += v0 * yb.qs[j] as i32;
            sumi1 += v1 * yb.qs[j + QK8_1 / 2] as i32;
        }
        let sumi = sumi0 + sumi1;
        sumf += (xb.d.to_f32() * yb.d.to_f32()) * sumi as f32 + xb.m.to_f32() * yb.s.to_f32();
    }
    sumf
}
// ANCHOR_END: q4_1_dot

/// The fifth bit of each of the 32 codes, one bit per weight, as `BlockQ5_0::qh` stores it.
fn pack_high_bits(q: &[u8; 32]) -> [u8; 4] {
    let mut qh = 0u32;
    for j in 0..16 {
        qh |= ((q[j] as u32 & 0x10) >> 4) << j;
        qh |= ((q[j + 16] as u32 & 0x10) >> 4) << (j + 16);
    }
    qh.to_le_bytes()
}

/// `quantize_row_q5_0_ref`: as Q4_0 with codes 0..32 (`d = max / -16`).
pub fn quantize_row_q5_0_ref(x: &[f32], y: &mut [BlockQ5_0]) {
    assert_eq!(x.len(), y.len() * QK5_0, "quantize_row_q5_0_ref: lengths");
    for (xb, yb) in x.chunks_exact(QK5_0).zip(y) {
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &v in xb {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f16::from_f32(d);
        let mut q = [0u8; QK5_0];
        for j in 0..QK5_0 / 2 {
            let x0 = xb[j] * id;
            let x1 = xb[QK5_0 / 2 + j] * id;
            q[j] = ((x0 + 16.5) as i8).min(31) as u8;
            q[j + QK5_0 / 2] = ((x1 + 16.5) as i8).min(31) as u8;
            yb.qs[j] = (q[j] & 0x0F) | ((q[j + QK5_0 / 2] & 0x0F) << 4);
        }
        yb.qh = pack_high_bits(&q);
    }
}

/// `dequantize_row_q5_0`.
pub fn dequantize_row_q5_0(x: &[BlockQ5_0], y: &mut [f32]) {
    assert_eq!(y.len(), x.len() * QK5_0, "dequantize_row_q5_0: lengths");
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK5_0)) {
        let d = xb.d.to_f32();
        let qh = u32::from_le_bytes(xb.qh);
        for j in 0..QK5_0 / 2 {
            let xh_0 = (((qh >> j) << 4) & 0x10) as u8;
            let xh_1 = ((qh >> (j + 12)) & 0x10) as u8;
            let x0 = ((xb.qs[j] & 0x0F) | xh_0) as i32 - 16;
            let x1 = ((xb.qs[j] >> 4) | xh_1) as i32 - 16;
            yb[j] = x0 as f32 * d;
            yb[j + QK5_0 / 2] = x1 as f32 * d;
        }
    }
}

/// `ggml_vec_dot_q5_0_q8_0_generic`.
pub fn vec_dot_q5_0_q8_0(n: usize, x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 {
    let nb = check_dot("vec_dot_q5_0_q8_0", n, QK8_0, x.len(), y.len());
    let mut sumf = 0.0f32;
    for (xb, yb) in x[..nb].iter().zip(&y[..nb]) {
        let qh = u32::from_le_bytes(xb.qh);
        let mut sumi0 = 0i32;
        let mut sumi1 = 0i32;
        for j in 0..QK8_0 / 2 {
            let xh_0 = (((qh & (1 << j)) >> j) << 4) as u8;
            let xh_1 = ((qh & (1 << (j + 16))) >> (j + 12)) as u8;
            let x0 = ((xb.qs[j] & 0x0F) | xh_0) as i32 - 16;
            let x1 = ((xb.qs[j] >> 4) | xh_1) as i32 - 16;
            sumi0 += x0 * yb.qs[j] as i32;
            sumi1 += x1 * yb.qs[j + QK8_0 / 2] as i32;
        }
        let sumi = sumi0 + sumi1;
        sumf += (xb.d.to_f32() * yb.d.to_f32()) * sumi as f32;
    }
    sumf
}

/// `quantize_row_q5_1_ref`: as Q4_1 with codes 0..32.
pub fn quantize_row_q5_1_ref(x: &[f32], y: &mut [BlockQ5_1]) {
    assert_eq!(x.len(), y.len() * QK5_1, "quantize_row_q5_1_ref: lengths");
    for (xb, yb) in x.chunks_exact(QK5_1).zip(y) {
        let mut min = f32::MAX;
        let mut max = -f32::MAX;
        for &v in xb {
            if v < min {
                min = v;
            }
            if v > max {
                max = v;
            }
        }
        let d = (max - min) / ((1 << 5) - 1) as f32;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f16::from_f32(d);
        yb.m = f16::from_f32(min);
        let mut q = [0u8; QK5_1];
        for j in 0..QK5_1 / 2 {
            let x0 = (xb[j] - min) * id;
            let x1 = (xb[QK5_1 / 2 + j] - min) * id;
            // No clamp in ggml: (max - min) * id rounds to at most 31.
            q[j] = (x0 + 0.5) as u8;
            q[j + QK5_1 / 2] = (x1 + 0.5) as u8;
            yb.qs[j] = (q[j] & 0x0F) | ((q[j + QK5_1 / 2] & 0x0F) << 4);
        }
        yb.qh = pack_high_bits(&q);
    }
}

/// `dequantize_row_q5_1`.
pub fn dequantize_row_q5_1(x: &[BlockQ5_1], y: &mut [f32]) {
    assert_eq!(y.len(), x.len() * QK5_1, "dequantize_row_q5_1: lengths");
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK5_1)) {
        let d = xb.d.to_f32();
        let m = xb.m.to_f32();
        let qh = u32::from_le_bytes(xb.qh);
        for j in 0..QK5_1 / 2 {
            let xh_0 = (((qh >> j) << 4) & 0x10) as u8;
            let xh_1 = ((qh >> (j + 12)) & 0x10) as u8;
            let x0 = ((xb.qs[j] & 0x0F) | xh_0) as i32;
            let x1 = ((xb.qs[j] >> 4) | xh_1) as i32;
            yb[j] = x0 as f32 * d + m;
            yb[j + QK5_1 / 2] = x1 as f32 * d + m;
        }
    }
}

/// `ggml_vec_dot_q5_1_q8_1_generic`.
pub fn vec_dot_q5_1_q8_1(n: usize, x: &[BlockQ5_1], y: &[BlockQ8_1]) -> f32 {
    let nb = check_dot("vec_dot_q5_1_q8_1", n, QK8_1, x.len(), y.len());
    let mut sumf = 0.0f32;
    for (xb, yb) in x[..nb].iter().zip(&y[..nb]) {
        let qh = u32::from_le_bytes(xb.qh);
        let mut sumi0 = 0i32;
        let mut sumi1 = 0i32;
        for j in 0..QK8_1 / 2 {
            let xh_0 = (((qh >> j) << 4) & 0x10) as u8;
            let xh_1 = ((qh >> (j + 12)) & 0x10) as u8;
            let x0 = ((xb.qs[j] & 0x0F) | xh_0) as i32;
            let x1 = ((xb.qs[j] >> 4) | xh_1) as i32;
            sumi0 += x0 * yb.qs[j] as i32;
            sumi1 += x1 * yb.qs[j + QK8_1 / 2] as i32;
        }
        let sumi = sumi0 + sumi1;
        sumf += (xb.d.to_f32() * yb.d.to_f32()) * sumi as f32 + xb.m.to_f32() * yb.s.to_f32();
    }
    sumf
}

// ANCHOR: q8_0
/// `quantize_row_q8_0_ref`: symmetric, `d = amax / 127`, codes rounded half away from zero.
pub fn quantize_row_q8_0_ref(x: &[f32], y: &mut [BlockQ8_0]) {
    // ANCHOR: yours_quantize_q8_0
    assert_eq!(x.len(), y.len() * QK8_0, "quantize_row_q8_0_ref: lengths");
    for (xb, yb) in x.chunks_exact(QK8_0).zip(y) {
        let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let d = amax / ((1 << 7) - 1) as f32;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f16::from_f32(d);
        for (q, &v) in yb.qs.iter_mut().zip(xb) {
            *q = (v * id).round() as i8; // C's roundf: half away from zero, like f32::round
        }
    }
    // ANCHOR_END: yours_quantize_q8_0
}
// ANCHOR_END: q8_0

// ANCHOR: q8_0_dot
/// `dequantize_row_q8_0`.
pub fn dequantize_row_q8_0(x: &[BlockQ8_0], y: &mut [f32]) {
    assert_eq!(y.len(), x.len() * QK8_0, "dequantize_row_q8_0: lengths");
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK8_0)) {
        let d = xb.d.to_f32();
        for (v, &q) in yb.iter_mut().zip(&xb.qs) {
            *v = q as f32 * d;
        }
    }
}

/// `ggml_vec_dot_q8_0_q8_0_generic`.
pub fn vec_dot_q8_0_q8_0(n: usize, x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    let nb = check_dot("vec_dot_q8_0_q8_0", n, QK8_0, x.len(), y.len());
    let mut sumf = 0.0f32;
    for (xb, yb) in x[..nb].iter().zip(&y[..nb]) {
        let mut sumi = 0i32;
        for j in 0..QK8_0 {
            sumi += xb.qs[j] as i32 * yb.qs[j] as i32;
        }
        sumf += sumi as f32 * (xb.d.to_f32() * yb.d.to_f32());
    }
    sumf
}
// ANCHOR_END: q8_0_dot

/// `quantize_row_q8_1_ref`: Q8_0's codes, plus `s = d * sum(qs)` for the weights' min.
pub fn quantize_row_q8_1_ref(x: &[f32], y: &mut [BlockQ8_1]) {
    assert_eq!(x.len(), y.len() * QK8_1, "quantize_row_q8_1_ref: lengths");
    for (xb, yb) in x.chunks_exact(QK8_1).zip(y) {
        let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let d = amax / ((1 << 7) - 1) as f32;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f16::from_f32(d);
        let mut sum = 0i32;
        for j in 0..QK8_1 / 2 {
            yb.qs[j] = (xb[j] * id).round() as i8;
            yb.qs[QK8_1 / 2 + j] = (xb[QK8_1 / 2 + j] * id).round() as i8;
            sum += yb.qs[j] as i32;
            sum += yb.qs[QK8_1 / 2 + j] as i32;
        }
        yb.s = f16::from_f32(sum as f32 * d);
    }
}

/// `qs * d`. ggml has no `dequantize_row_q8_1` (Q8_1 only ever meets a dot product); this one
/// exists so tests can see what an activation row became.
pub fn dequantize_row_q8_1(x: &[BlockQ8_1], y: &mut [f32]) {
    assert_eq!(y.len(), x.len() * QK8_1, "dequantize_row_q8_1: lengths");
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK8_1)) {
        let d = xb.d.to_f32();
        for (v, &q) in yb.iter_mut().zip(&xb.qs) {
            *v = q as f32 * d;
        }
    }
}

/// `quantize_row_q8_0`: the activation quantizer (ggml-cpu's `from_float` for Q8_0), which in
/// its generic form is the reference. ggml-cpu's x86 SIMD version multiplies by `127 / amax`
/// and rounds ties to even, so on rare ties its codes differ from these by one.
pub fn quantize_row_q8_0(x: &[f32], y: &mut [BlockQ8_0]) {
    quantize_row_q8_0_ref(x, y)
}

/// `quantize_row_q8_1`: the activation quantizer for Q4_1 and Q5_1 weights (the reference, as
/// for [`quantize_row_q8_0`]).
pub fn quantize_row_q8_1(x: &[f32], y: &mut [BlockQ8_1]) {
    quantize_row_q8_1_ref(x, y)
}

macro_rules! impl_block {
    ($block:ty, $ty:ident, $qk:expr, $deq:ident, $q:ident) => {
        impl Block for $block {
            const TYPE: ch01::GgmlType = ch01::GgmlType::$ty;
            const BLOCK_SIZE: usize = $qk;
            fn dequantize_row(x: &[Self], y: &mut [f32]) {
                $deq(x, y)
            }
            fn quantize_row_ref(x: &[f32], y: &mut [Self]) {
                $q(x, y)
            }
        }
    };
}
pub(crate) use impl_block;

impl_block!(
    BlockQ4_0,
    Q4_0,
    QK4_0,
    dequantize_row_q4_0,
    quantize_row_q4_0_ref
);
impl_block!(
    BlockQ4_1,
    Q4_1,
    QK4_1,
    dequantize_row_q4_1,
    quantize_row_q4_1_ref
);
impl_block!(
    BlockQ5_0,
    Q5_0,
    QK5_0,
    dequantize_row_q5_0,
    quantize_row_q5_0_ref
);
impl_block!(
    BlockQ5_1,
    Q5_1,
    QK5_1,
    dequantize_row_q5_1,
    quantize_row_q5_1_ref
);
impl_block!(
    BlockQ8_0,
    Q8_0,
    QK8_0,
    dequantize_row_q8_0,
    quantize_row_q8_0_ref
);
impl_block!(
    BlockQ8_1,
    Q8_1,
    QK8_1,
    dequantize_row_q8_1,
    quantize_row_q8_1_ref
);
