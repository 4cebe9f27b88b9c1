//! ggml's block formats, byte for byte (`ggml-common.h`), and safe views of GGUF bytes as blocks.
//!
//! A quantized row is a sequence of fixed-size blocks. Each block stores a few floats (scales,
//! minimums) and many small integer codes; a weight is `scale * code` or `scale * code + min`.
//! The structs below have ggml's field names and order, so `size_of` equals ggml's
//! `sizeof(block_*)` and a slice of them can be laid over the bytes of a GGUF tensor.

use bytemuck::{Pod, PodCastError, Zeroable};
use ch01::GgmlType;
use half::f16;
use std::fmt;
use std::mem::{align_of, size_of};

/// Weights per block of the "legacy" formats (one scale per 32 weights).
pub const QK4_0: usize = 32;
pub const QK4_1: usize = 32;
pub const QK5_0: usize = 32;
pub const QK5_1: usize = 32;
pub const QK8_0: usize = 32;
pub const QK8_1: usize = 32;
/// Weights per super-block of the k-quants.
pub const QK_K: usize = 256;
/// Bytes of packed 6-bit scales and mins in `BlockQ4_K` and `BlockQ5_K`.
pub const K_SCALE_SIZE: usize = 12;

// ANCHOR: legacy_blocks
/// 4.5 bits per weight: `w = d * (q - 8)`, q in 0..16.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ4_0 {
    pub d: f16,              // delta
    pub qs: [u8; QK4_0 / 2], // weight j in the low nibble of qs[j], weight j + 16 in the high one
}
const _: () = assert!(size_of::<BlockQ4_0>() == 18);

/// 5 bits per weight: `w = d * q + m`, q in 0..16.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ4_1 {
    pub d: f16,              // delta
    pub m: f16,              // min
    pub qs: [u8; QK4_1 / 2], // nibbles, laid out as in BlockQ4_0
}
const _: () = assert!(size_of::<BlockQ4_1>() == 20);

/// 5.5 bits per weight: `w = d * (q - 16)`, q in 0..32.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ5_0 {
    pub d: f16,              // delta
    pub qh: [u8; 4],         // fifth bit of weight j is bit j of this little-endian u32
    pub qs: [u8; QK5_0 / 2], // low four bits, laid out as in BlockQ4_0
}
const _: () = assert!(size_of::<BlockQ5_0>() == 22);

/// 6 bits per weight: `w = d * q + m`, q in 0..32.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ5_1 {
    pub d: f16,              // delta
    pub m: f16,              // min
    pub qh: [u8; 4],         // fifth bits, as in BlockQ5_0
    pub qs: [u8; QK5_1 / 2], // low four bits
}
const _: () = assert!(size_of::<BlockQ5_1>() == 24);

/// 8.5 bits per weight: `w = d * q`, q in -127..=127.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ8_0 {
    pub d: f16,          // delta
    pub qs: [i8; QK8_0], // quants
}
const _: () = assert!(size_of::<BlockQ8_0>() == 34);

/// 9 bits per weight; only for activations: like `BlockQ8_0` plus `s = d * sum(qs)`, which
/// lets a dot product with a `BlockQ4_1`/`BlockQ5_1` add the weights' min in one multiply.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ8_1 {
    pub d: f16,          // delta
    pub s: f16,          // d * sum(qs[i])
    pub qs: [i8; QK8_1], // quants
}
const _: () = assert!(size_of::<BlockQ8_1>() == 36);
// ANCHOR_END: legacy_blocks

// ANCHOR: block_q4_K
/// 4.5 bits per weight: 8 sub-blocks of 32, `w = d * sc * q - dmin * m`, q in 0..16, with
/// 6-bit `sc` and `m` per sub-block.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ4_K {
    pub d: f16,                     // super-block scale for the quantized scales
    pub dmin: f16,                  // super-block scale for the quantized mins
    pub scales: [u8; K_SCALE_SIZE], // 8 scales and 8 mins of 6 bits
    pub qs: [u8; QK_K / 2],         // 4-bit quants
}
const _: () = assert!(size_of::<BlockQ4_K>() == 144);
// ANCHOR_END: block_q4_K

// ANCHOR: k_blocks
/// 2.625 bits per weight: 16 sub-blocks of 16, `w = d * sc * q - dmin * m`, q in 0..4, with
/// 4-bit `sc` and `m` per sub-block.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ2_K {
    pub scales: [u8; QK_K / 16], // sub-block scale in the low nibble, min in the high one
    pub qs: [u8; QK_K / 4],      // 2-bit quants, four per byte
    pub d: f16,                  // super-block scale for the quantized scales
    pub dmin: f16,               // super-block scale for the quantized mins
}
const _: () = assert!(size_of::<BlockQ2_K>() == 84);

/// 3.4375 bits per weight: 16 sub-blocks of 16, `w = d * (sc - 32) * (q - 4)`, q in 0..8,
/// with 6-bit `sc` per sub-block.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ3_K {
    pub hmask: [u8; QK_K / 8], // high bit of the quants
    pub qs: [u8; QK_K / 4],    // low two bits of the quants
    pub scales: [u8; 12],      // 16 scales of 6 bits
    pub d: f16,                // super-block scale
}
const _: () = assert!(size_of::<BlockQ3_K>() == 110);

/// 5.5 bits per weight: as `BlockQ4_K` with a fifth bit per quant, q in 0..32.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ5_K {
    pub d: f16,                     // super-block scale for the quantized scales
    pub dmin: f16,                  // super-block scale for the quantized mins
    pub scales: [u8; K_SCALE_SIZE], // 8 scales and 8 mins of 6 bits
    pub qh: [u8; QK_K / 8],         // high bit of the quants
    pub qs: [u8; QK_K / 2],         // low four bits of the quants
}
const _: () = assert!(size_of::<BlockQ5_K>() == 176);

/// 6.5625 bits per weight: 16 sub-blocks of 16, `w = d * sc * (q - 32)`, q in 0..64, with an
/// 8-bit signed `sc` per sub-block.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ6_K {
    pub ql: [u8; QK_K / 2],      // low four bits of the quants
    pub qh: [u8; QK_K / 4],      // upper two bits of the quants
    pub scales: [i8; QK_K / 16], // sub-block scales
    pub d: f16,                  // super-block scale
}
const _: () = assert!(size_of::<BlockQ6_K>() == 210);
// ANCHOR_END: k_blocks

// ANCHOR: block_q8_K
/// 9.125 bits per weight; only for activations of k-quant dot products. The scale is a full
/// f32 and `bsums` holds each 16-quant group's sum, so a weight block's mins are applied once
/// per group rather than once per weight.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ8_K {
    pub d: f32,                  // delta
    pub qs: [i8; QK_K],          // quants
    pub bsums: [i16; QK_K / 16], // sum of the quants in groups of 16
}
const _: () = assert!(size_of::<BlockQ8_K>() == 292);
// ANCHOR_END: block_q8_K

/// A quantization block: its ggml type, how many weights it holds, and its two reference
/// conversions (ggml's `to_float` and `from_float_ref`).
pub trait Block: Pod {
    const TYPE: GgmlType;
    /// Weights per block (ggml's `blck_size`); `size_of::<Self>()` is ggml's `type_size`.
    const BLOCK_SIZE: usize;
    /// `dequantize_row_*`: `y.len()` must be `x.len() * BLOCK_SIZE`.
    fn dequantize_row(x: &[Self], y: &mut [f32]);
    /// `quantize_row_*_ref`: `x.len()` must be `y.len() * BLOCK_SIZE`.
    fn quantize_row_ref(x: &[f32], y: &mut [Self]);
}

/// Why bytes cannot be viewed as blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CastError {
    /// The byte count is not a whole number of blocks.
    Length {
        ty: GgmlType,
        len: usize,
        type_size: usize,
    },
    /// The bytes start at an address the block type cannot be read from.
    Alignment {
        ty: GgmlType,
        addr: usize,
        align: usize,
    },
}

impl fmt::Display for CastError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CastError::Length { ty, len, type_size } => write!(
                f,
                "{len} bytes are not a whole number of {} blocks ({type_size} bytes each)",
                ty.name()
            ),
            CastError::Alignment { ty, addr, align } => write!(
                f,
                "{} blocks need {align}-byte alignment, but the data starts at address {addr:#x}",
                ty.name()
            ),
        }
    }
}

impl std::error::Error for CastError {}

fn cast_error<B: Block>(e: PodCastError, bytes: *const u8, len: usize) -> CastError {
    match e {
        PodCastError::TargetAlignmentGreaterAndInputNotAligned => CastError::Alignment {
            ty: B::TYPE,
            addr: bytes as usize,
            align: align_of::<B>(),
        },
        _ => CastError::Length {
            ty: B::TYPE,
            len,
            type_size: size_of::<B>(),
        },
    }
}

// ANCHOR: cast
/// View `bytes` as blocks, without copying. GGUF aligns tensor data to 32 bytes from the start
/// of the file and blocks need at most 4, so a tensor's bytes qualify when the file's first
/// byte is aligned in memory (a memory map is page-aligned; a `Vec<u8>` promises only 1). The
/// address is checked, never trusted.
pub fn blocks<B: Block>(bytes: &[u8]) -> Result<&[B], CastError> {
    bytemuck::try_cast_slice(bytes).map_err(|e| cast_error::<B>(e, bytes.as_ptr(), bytes.len()))
}
// ANCHOR_END: cast

/// [`blocks`] for writing.
pub fn blocks_mut<B: Block>(bytes: &mut [u8]) -> Result<&mut [B], CastError> {
    let (ptr, len) = (bytes.as_ptr(), bytes.len());
    bytemuck::try_cast_slice_mut(bytes).map_err(|e| cast_error::<B>(e, ptr, len))
}

/// The bytes of `blocks`, as a GGUF file stores them (all fields are little-endian on the
/// targets this crate builds for).
pub fn as_bytes<B: Block>(blocks: &[B]) -> &[u8] {
    bytemuck::cast_slice(blocks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn struct_layouts_match_ggml_type_sizes() {
        fn check<B: Block>() {
            assert_eq!(B::TYPE.type_size() as usize, size_of::<B>(), "{}", B::TYPE);
            assert_eq!(B::TYPE.block_size() as usize, B::BLOCK_SIZE, "{}", B::TYPE);
        }
        check::<BlockQ4_0>();
        check::<BlockQ4_1>();
        check::<BlockQ5_0>();
        check::<BlockQ5_1>();
        check::<BlockQ8_0>();
        check::<BlockQ8_1>();
        check::<BlockQ2_K>();
        check::<BlockQ3_K>();
        check::<BlockQ4_K>();
        check::<BlockQ5_K>();
        check::<BlockQ6_K>();
        check::<BlockQ8_K>();
    }

    #[test]
    fn casts_check_length_and_alignment() {
        let buf = vec![0u32; 160];
        let bytes: &[u8] = bytemuck::cast_slice(&buf);
        assert_eq!(blocks::<BlockQ4_0>(&bytes[..36]).unwrap().len(), 2);
        let e = blocks::<BlockQ4_0>(&bytes[..35]).unwrap_err();
        assert!(e.to_string().contains("35 bytes"), "{e}");
        let e = blocks::<BlockQ4_0>(&bytes[1..37]).unwrap_err();
        assert!(matches!(e, CastError::Alignment { align: 2, .. }), "{e}");
        assert!(e.to_string().contains("Q4_0"), "{e}");
        // The f32 scale of Q8_K needs 4-byte alignment; 2 is not enough.
        assert_eq!(
            blocks::<BlockQ8_K>(&bytes[4..4 + 2 * 292]).unwrap().len(),
            2
        );
        let e = blocks::<BlockQ8_K>(&bytes[2..2 + 2 * 292]).unwrap_err();
        assert!(matches!(e, CastError::Alignment { align: 4, .. }), "{e}");
    }
}
