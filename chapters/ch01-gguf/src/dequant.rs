//! Turning stored tensor data into `f32`, for the types the default model uses and the plain
//! float types.
//!
//! This is the plainest correct form: read each block's fields from the bytes and apply
//! ggml's formula. Chapter 6 gives the blocks real types (`BlockQ4_1`), keeps weights
//! quantized and computes dot products on the blocks directly.

use crate::ggml_type::GgmlType;
use half::{bf16, f16};
use std::fmt;

/// Elements per `Q8_0` block.
pub const QK8_0: usize = 32;
/// Elements per `Q4_1` block.
pub const QK4_1: usize = 32;

/// Why data could not be dequantized.
#[derive(Debug, Clone, PartialEq)]
pub enum DequantError {
    /// This chapter does not dequantize this type.
    Unsupported(GgmlType),
    /// `n` is not a whole number of blocks.
    PartialBlock { ggml_type: GgmlType, n: usize },
    /// The byte count does not match `n` elements of the type.
    WrongLength {
        ggml_type: GgmlType,
        n: usize,
        expected: u64,
        got: usize,
    },
    /// More elements than this machine can address.
    TooLarge(u64),
}

impl fmt::Display for DequantError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DequantError::Unsupported(t) => write!(
                f,
                "dequantizing {t} is not supported (supported: F32, F16, BF16, Q8_0, Q4_1)"
            ),
            DequantError::PartialBlock { ggml_type, n } => write!(
                f,
                "{n} elements are not a whole number of {ggml_type} blocks of {}",
                ggml_type.block_size()
            ),
            DequantError::WrongLength {
                ggml_type,
                n,
                expected,
                got,
            } => write!(
                f,
                "{n} {ggml_type} elements take {expected} bytes, but {got} were given"
            ),
            DequantError::TooLarge(n) => write!(f, "{n} elements do not fit in memory"),
        }
    }
}

impl std::error::Error for DequantError {}

// ANCHOR: dequantize
/// Convert `n` elements of type `ty`, stored in `bytes`, to f32.
pub fn dequantize(ty: GgmlType, bytes: &[u8], n: usize) -> Result<Vec<f32>, DequantError> {
    let expected = ty
        .row_bytes(n as u64)
        .ok_or(DequantError::PartialBlock { ggml_type: ty, n })?;
    if bytes.len() as u64 != expected {
        return Err(DequantError::WrongLength {
            ggml_type: ty,
            n,
            expected,
            got: bytes.len(),
        });
    }
    let row = row_dequantizer(ty).ok_or(DequantError::Unsupported(ty))?;
    let mut out = vec![0.0f32; n];
    row(bytes, &mut out);
    Ok(out)
}
// ANCHOR_END: dequantize

/// Turns one row of whole blocks into f32 (ggml's `ggml_to_float_t`).
pub type RowDequantizer = fn(&[u8], &mut [f32]);

/// The function that turns one row of `ty` (whole blocks) into f32, for the types this chapter
/// dequantizes; `None` for the others.
pub fn row_dequantizer(ty: GgmlType) -> Option<RowDequantizer> {
    Some(match ty {
        GgmlType::F32 => dequantize_row_f32,
        GgmlType::F16 => dequantize_row_f16,
        GgmlType::BF16 => dequantize_row_bf16,
        GgmlType::Q8_0 => dequantize_row_q8_0,
        GgmlType::Q4_1 => dequantize_row_q4_1,
        _ => return None,
    })
}

/// Little-endian f32s.
pub fn dequantize_row_f32(x: &[u8], y: &mut [f32]) {
    for (y, b) in y.iter_mut().zip(x.chunks_exact(4)) {
        *y = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

/// IEEE half floats; every f16 is exactly an f32.
pub fn dequantize_row_f16(x: &[u8], y: &mut [f32]) {
    for (y, b) in y.iter_mut().zip(x.chunks_exact(2)) {
        *y = f16::from_le_bytes([b[0], b[1]]).to_f32();
    }
}

/// bfloat16: the top 16 bits of an f32.
pub fn dequantize_row_bf16(x: &[u8], y: &mut [f32]) {
    for (y, b) in y.iter_mut().zip(x.chunks_exact(2)) {
        *y = bf16::from_le_bytes([b[0], b[1]]).to_f32();
    }
}

// ANCHOR: q8_0
/// `Q8_0`: blocks of 32 weights as 34 bytes (8.5 bits per weight): an f16 scale `d`, then 32
/// signed bytes `q`. Weight `i` is `q[i] * d`.
pub fn dequantize_row_q8_0(x: &[u8], y: &mut [f32]) {
    const BLOCK_BYTES: usize = 2 + QK8_0;
    // ANCHOR: yours_dequantize_q8_0
    for (block, y) in x.chunks_exact(BLOCK_BYTES).zip(y.chunks_exact_mut(QK8_0)) {
        let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
        for (y, &q) in y.iter_mut().zip(&block[2..]) {
            *y = q as i8 as f32 * d;
        }
    }
    // ANCHOR_END: yours_dequantize_q8_0
}
// ANCHOR_END: q8_0

// ANCHOR: q4_1
/// `Q4_1`: blocks of 32 weights as 20 bytes (5 bits per weight): an f16 scale `d`, an f16
/// minimum `m`, then 16 bytes of 4-bit codes. Byte `j` holds weight `j` in its low nibble and
/// weight `j + 16` in its high nibble. Weight `i` is `q[i] * d + m`.
pub fn dequantize_row_q4_1(x: &[u8], y: &mut [f32]) {
    const BLOCK_BYTES: usize = 2 + 2 + QK4_1 / 2;
    // ANCHOR: yours_dequantize_q4_1
    for (block, y) in x.chunks_exact(BLOCK_BYTES).zip(y.chunks_exact_mut(QK4_1)) {
        let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
        let m = f16::from_le_bytes([block[2], block[3]]).to_f32();
        let (lo, hi) = y.split_at_mut(QK4_1 / 2);
        for (j, &q) in block[4..].iter().enumerate() {
            lo[j] = (q & 0x0f) as f32 * d + m;
            hi[j] = (q >> 4) as f32 * d + m;
        }
    }
    // ANCHOR_END: yours_dequantize_q4_1
}
// ANCHOR_END: q4_1

#[cfg(test)]
mod tests {
    use super::*;

    fn f16_bytes(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_le_bytes()
    }

    #[test]
    fn q8_0_block_by_hand() {
        let mut block = f16_bytes(0.5).to_vec();
        block.extend((0..32).map(|i| (i as i8 - 16) as u8));
        let y = dequantize(GgmlType::Q8_0, &block, 32).unwrap();
        let want: Vec<f32> = (0..32).map(|i| (i - 16) as f32 * 0.5).collect();
        assert_eq!(y, want);
    }

    #[test]
    fn q4_1_low_nibbles_come_first() {
        let mut block = [f16_bytes(2.0), f16_bytes(-1.0)].concat();
        // Byte j: low nibble j % 16, high nibble 15 - j % 16.
        block.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let y = dequantize(GgmlType::Q4_1, &block, 32).unwrap();
        for j in 0..16 {
            assert_eq!(y[j], j as f32 * 2.0 - 1.0, "low nibble {j}");
            assert_eq!(y[j + 16], (15 - j) as f32 * 2.0 - 1.0, "high nibble {j}");
        }
    }

    #[test]
    fn plain_floats_convert_exactly() {
        let f: Vec<u8> = [1.5f32, -0.0, f32::MAX]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let got = dequantize(GgmlType::F32, &f, 3).unwrap();
        assert_eq!(got, [1.5, -0.0, f32::MAX]);
        let h = [f16_bytes(0.1), f16_bytes(-65504.0)].concat();
        assert_eq!(
            dequantize(GgmlType::F16, &h, 2).unwrap(),
            [f16::from_f32(0.1).to_f32(), -65504.0]
        );
        // bf16 0x3fc0 is 1.5: the top half of the f32 0x3fc00000.
        assert_eq!(dequantize(GgmlType::BF16, &[0xc0, 0x3f], 1).unwrap(), [1.5]);
    }

    #[test]
    fn wrong_lengths_and_types_are_errors_naming_them() {
        let e = dequantize(GgmlType::Q4_1, &[0; 19], 32).unwrap_err();
        assert!(e.to_string().contains("20 bytes"), "{e}");
        let e = dequantize(GgmlType::Q4_1, &[0; 20], 31).unwrap_err();
        assert!(e.to_string().contains("31 elements"), "{e}");
        let e = dequantize(GgmlType::Q6_K, &[0; 210], 256).unwrap_err();
        assert_eq!(e, DequantError::Unsupported(GgmlType::Q6_K));
        assert!(e.to_string().contains("Q6_K"), "{e}");
    }
}
