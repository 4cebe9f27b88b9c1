//! Unquantized rows: F32, F16 and BF16, with ggml's scalar dot products.
//!
//! GGUF stores these little-endian, and a row's bytes in memory are only as aligned as the
//! buffer holding the file (a `Vec<u8>` promises 1 byte), so the byte-level functions decode
//! with `from_le_bytes` rather than casting.

use half::{bf16, f16};

/// `ggml_vec_dot_f32` without SIMD: f32 products summed in f64 (`ggml_float`), which keeps
/// long rows from losing the small terms.
pub fn vec_dot_f32(n: usize, x: &[f32], y: &[f32]) -> f32 {
    assert!(x.len() == n && y.len() == n, "vec_dot_f32: lengths");
    let mut sumf = 0.0f64;
    for (a, b) in x.iter().zip(y) {
        sumf += (a * b) as f64;
    }
    sumf as f32
}

/// `ggml_vec_dot_f16` without SIMD: each product in f32, summed in f64.
pub fn vec_dot_f16(n: usize, x: &[f16], y: &[f16]) -> f32 {
    assert!(x.len() == n && y.len() == n, "vec_dot_f16: lengths");
    let mut sumf = 0.0f64;
    for (a, b) in x.iter().zip(y) {
        sumf += (a.to_f32() * b.to_f32()) as f64;
    }
    sumf as f32
}

/// `ggml_vec_dot_bf16` without SIMD: each product in f32, summed in f64.
pub fn vec_dot_bf16(n: usize, x: &[bf16], y: &[bf16]) -> f32 {
    assert!(x.len() == n && y.len() == n, "vec_dot_bf16: lengths");
    let mut sumf = 0.0f64;
    for (a, b) in x.iter().zip(y) {
        sumf += (a.to_f32() * b.to_f32()) as f64;
    }
    sumf as f32
}

fn f32s(bytes: &[u8]) -> impl Iterator<Item = f32> + '_ {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
}

fn halves(bytes: &[u8]) -> impl Iterator<Item = [u8; 2]> + '_ {
    bytes.chunks_exact(2).map(|c| [c[0], c[1]])
}

fn check(name: &str, bytes: usize, width: usize, n: usize) {
    assert!(
        bytes == n * width,
        "{name}: {bytes} bytes for {n} values of {width} bytes"
    );
}

/// F32 bytes to floats.
pub fn f32_to_float(x: &[u8], y: &mut [f32]) {
    check("f32_to_float", x.len(), 4, y.len());
    for (v, f) in y.iter_mut().zip(f32s(x)) {
        *v = f;
    }
}

/// Floats to F32 bytes (ggml's `ggml_cpu_fp32_to_fp32`).
pub fn f32_from_float(x: &[f32], y: &mut [u8]) {
    check("f32_from_float", y.len(), 4, x.len());
    for (c, v) in y.chunks_exact_mut(4).zip(x) {
        c.copy_from_slice(&v.to_le_bytes());
    }
}

/// [`vec_dot_f32`] on bytes.
pub fn f32_vec_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check("f32_vec_dot", w.len(), 4, n);
    check("f32_vec_dot", a.len(), 4, n);
    let mut sumf = 0.0f64;
    for (x, y) in f32s(w).zip(f32s(a)) {
        sumf += (x * y) as f64;
    }
    sumf as f32
}

/// F16 bytes to floats (exact).
pub fn f16_to_float(x: &[u8], y: &mut [f32]) {
    check("f16_to_float", x.len(), 2, y.len());
    for (v, h) in y.iter_mut().zip(halves(x)) {
        *v = f16::from_le_bytes(h).to_f32();
    }
}

/// Floats to F16 bytes, rounding to nearest even like ggml's `GGML_FP32_TO_FP16` (the two
/// differ only in the payload bits of a NaN).
pub fn f16_from_float(x: &[f32], y: &mut [u8]) {
    check("f16_from_float", y.len(), 2, x.len());
    for (c, v) in y.chunks_exact_mut(2).zip(x) {
        c.copy_from_slice(&f16::from_f32(*v).to_le_bytes());
    }
}

/// [`vec_dot_f16`] on bytes.
pub fn f16_vec_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check("f16_vec_dot", w.len(), 2, n);
    check("f16_vec_dot", a.len(), 2, n);
    let mut sumf = 0.0f64;
    for (x, y) in halves(w).zip(halves(a)) {
        sumf += (f16::from_le_bytes(x).to_f32() * f16::from_le_bytes(y).to_f32()) as f64;
    }
    sumf as f32
}

/// BF16 bytes to floats (exact: the top half of an f32).
pub fn bf16_to_float(x: &[u8], y: &mut [f32]) {
    check("bf16_to_float", x.len(), 2, y.len());
    for (v, h) in y.iter_mut().zip(halves(x)) {
        *v = bf16::from_le_bytes(h).to_f32();
    }
}

/// Floats to BF16 bytes, rounding to nearest even and quieting NaNs like ggml's
/// `ggml_compute_fp32_to_bf16`.
pub fn bf16_from_float(x: &[f32], y: &mut [u8]) {
    check("bf16_from_float", y.len(), 2, x.len());
    for (c, v) in y.chunks_exact_mut(2).zip(x) {
        c.copy_from_slice(&fp32_to_bf16(*v).to_le_bytes());
    }
}

/// ggml's `ggml_compute_fp32_to_bf16`, bit for bit.
pub fn fp32_to_bf16(s: f32) -> u16 {
    let u = s.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        // NaN: keep the sign and top payload bits, force it quiet.
        return ((u >> 16) | 64) as u16;
    }
    ((u + (0x7fff + ((u >> 16) & 1))) >> 16) as u16
}

/// [`vec_dot_bf16`] on bytes.
pub fn bf16_vec_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    check("bf16_vec_dot", w.len(), 2, n);
    check("bf16_vec_dot", a.len(), 2, n);
    let mut sumf = 0.0f64;
    for (x, y) in halves(w).zip(halves(a)) {
        sumf += (bf16::from_le_bytes(x).to_f32() * bf16::from_le_bytes(y).to_f32()) as f64;
    }
    sumf as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even_and_quiets_nan() {
        // 1 + 2^-8 is halfway between two bf16 values: ties go to the even one (1.0).
        assert_eq!(fp32_to_bf16(1.0 + 1.0 / 256.0), 0x3f80);
        assert_eq!(fp32_to_bf16(1.0 + 3.0 / 256.0), 0x3f82);
        assert_eq!(fp32_to_bf16(f32::from_bits(0x7f80_0001)), 0x7fc0);
        assert_eq!(fp32_to_bf16(-2.0), 0xc000);
    }

    #[test]
    fn byte_dots_equal_typed_dots() {
        let x: Vec<f32> = (0..37).map(|i| (i as f32 * 0.7).sin()).collect();
        let y: Vec<f32> = (0..37).map(|i| (i as f32 * 1.3).cos()).collect();
        let (mut xb, mut yb) = (vec![0u8; 37 * 4], vec![0u8; 37 * 4]);
        f32_from_float(&x, &mut xb);
        f32_from_float(&y, &mut yb);
        assert_eq!(f32_vec_dot(37, &xb, &yb), vec_dot_f32(37, &x, &y));
        let (mut xh, mut yh) = (vec![0u8; 37 * 2], vec![0u8; 37 * 2]);
        f16_from_float(&x, &mut xh);
        f16_from_float(&y, &mut yh);
        let x16: Vec<f16> = x.iter().map(|&v| f16::from_f32(v)).collect();
        let y16: Vec<f16> = y.iter().map(|&v| f16::from_f32(v)).collect();
        assert_eq!(f16_vec_dot(37, &xh, &yh), vec_dot_f16(37, &x16, &y16));
    }
}
