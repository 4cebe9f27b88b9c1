//! What a cache keeps its keys and values in: f32, or half the bytes.
//!
//! A key or value is computed in f32, but nothing says it must be stored that way. llama.cpp
//! keeps both in f16 by default (`--cache-type-k`, `--cache-type-v`): half the memory and half
//! the bytes attention reads per position, for a rounding error (11 significant bits) far below
//! what a quantized model already carries. A [`RowType`] is such a choice as a value: the ggml
//! type of the stored rows and the function that encodes an f32 row into it. This chapter
//! offers [`RowType::F32`] and [`RowType::F16`]; chapter 6, which teaches quantization, adds
//! `Q8_0`. Attention reads the rows back through chapter 3's [`KvRows`], which decodes them.

use ch01::GgmlType;
use ch03::kv::{KvError, KvRows};
use half::f16;
use half::slice::HalfFloatSliceExt;
use std::fmt;

// ANCHOR: row_type
/// The type a cache keeps rows of keys or of values in, and how an f32 row becomes one.
#[derive(Clone, Copy)]
pub struct RowType {
    /// The ggml type of a stored row; chapter 3's readers decode it.
    pub ty: GgmlType,
    /// Encode `x` (whole blocks of `ty`) into `ty.row_bytes(x.len())` bytes.
    pub encode: fn(x: &[f32], out: &mut [u8]),
}

impl RowType {
    /// Plain f32: what the model computed, bit for bit.
    pub const F32: RowType = RowType {
        ty: GgmlType::F32,
        encode: encode_f32,
    };
    /// IEEE half floats, rounded to nearest: llama.cpp's default cache type.
    pub const F16: RowType = RowType {
        ty: GgmlType::F16,
        encode: encode_f16,
    };

    /// Bytes of a row of `n` values, `None` when `n` is not whole blocks of the type.
    pub fn row_bytes(&self, n: usize) -> Option<usize> {
        self.ty.row_bytes(n as u64).map(|b| b as usize)
    }
}
// ANCHOR_END: row_type

fn encode_f32(x: &[f32], out: &mut [u8]) {
    for (o, x) in out.chunks_exact_mut(4).zip(x) {
        o.copy_from_slice(&x.to_le_bytes());
    }
}

fn encode_f16(x: &[f32], out: &mut [u8]) {
    // Converted a slice at a time: `half` uses the CPU's conversion instructions (F16C) where
    // it has them.
    let mut buf = [f16::ZERO; 64];
    for (x, out) in x.chunks(64).zip(out.chunks_mut(128)) {
        let h = &mut buf[..x.len()];
        h.convert_from_f32_slice(x);
        for (o, h) in out.chunks_exact_mut(2).zip(h.iter()) {
            o.copy_from_slice(&h.to_le_bytes());
        }
    }
}

impl fmt::Debug for RowType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.ty)
    }
}

impl fmt::Display for RowType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // llama.cpp's spelling on its command line: f32, f16, q8_0.
        write!(f, "{}", self.ty.to_string().to_lowercase())
    }
}

impl PartialEq for RowType {
    fn eq(&self, other: &Self) -> bool {
        self.ty == other.ty
    }
}
impl Eq for RowType {}

/// The row types of a cache's keys and of its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheTypes {
    pub k: RowType,
    pub v: RowType,
}

impl CacheTypes {
    /// Both in f32: this chapter's caches unless told otherwise.
    pub const F32: CacheTypes = CacheTypes {
        k: RowType::F32,
        v: RowType::F32,
    };
    /// Both in f16: llama.cpp's default.
    pub const F16: CacheTypes = CacheTypes {
        k: RowType::F16,
        v: RowType::F16,
    };

    /// Bytes one position takes in one layer: a key row and a value row of `kv_dim` values.
    /// `None` when `kv_dim` is not whole blocks of both types.
    pub fn position_bytes(&self, kv_dim: usize) -> Option<usize> {
        self.k
            .row_bytes(kv_dim)?
            .checked_add(self.v.row_bytes(kv_dim)?)
    }

    /// Whether attention can read one head of `head_dim` values out of a row: a block of the
    /// type must not straddle two heads (Q8_0's blocks of 32 need `head_dim` a multiple of 32,
    /// as llama.cpp requires too).
    pub fn check_head_dim(&self, head_dim: usize) -> Result<(), KvError> {
        for (which, t) in [("K", self.k), ("V", self.v)] {
            if t.row_bytes(head_dim).is_none() {
                return Err(KvError::Other(format!(
                    "a {t} {which} cache needs heads of whole {t} blocks ({} values), but a head \
                     has {head_dim} values: choose another cache type",
                    t.ty.block_size()
                )));
            }
        }
        Ok(())
    }
}

impl Default for CacheTypes {
    fn default() -> Self {
        CacheTypes::F32
    }
}

impl fmt::Display for CacheTypes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.k == self.v {
            write!(f, "{}", self.k)
        } else {
            write!(f, "K {}, V {}", self.k, self.v)
        }
    }
}

/// Rows of one type in one buffer: f32 kept as f32 (read back without a copy), anything else
/// as bytes.
pub(crate) enum RowBuf {
    F32(Vec<f32>),
    Encoded {
        ty: RowType,
        row_bytes: usize,
        data: Vec<u8>,
    },
}

impl RowBuf {
    /// `rows` rows of `width` values; the caller has checked the size (`kv_buffers`). With
    /// `huge`, the buffer asks for huge pages (see [`kv_buffers`]).
    pub(crate) fn new(ty: RowType, rows: usize, width: usize, huge: bool) -> RowBuf {
        match ty.ty {
            GgmlType::F32 => {
                let mut data = vec![0.0; rows * width];
                if huge {
                    ch04::memory::advise_huge_pages(&mut data);
                }
                RowBuf::F32(data)
            }
            _ => {
                let row_bytes = ty.row_bytes(width).expect("checked by kv_buffers");
                let mut data = vec![0u8; rows * row_bytes];
                if huge {
                    ch04::memory::advise_huge_pages(&mut data);
                }
                RowBuf::Encoded {
                    ty,
                    row_bytes,
                    data,
                }
            }
        }
    }

    /// Store `x` (`width` values) as row `row`.
    pub(crate) fn write(&mut self, row: usize, x: &[f32]) {
        match self {
            RowBuf::F32(d) => d[row * x.len()..(row + 1) * x.len()].copy_from_slice(x),
            RowBuf::Encoded {
                ty,
                row_bytes,
                data,
            } => (ty.encode)(x, &mut data[row * *row_bytes..(row + 1) * *row_bytes]),
        }
    }

    /// Rows `row..row + n` of `width` values.
    pub(crate) fn run(&self, row: usize, n: usize, width: usize) -> KvRows<'_> {
        match self {
            RowBuf::F32(d) => KvRows::F32(&d[row * width..(row + n) * width]),
            RowBuf::Encoded {
                ty,
                row_bytes,
                data,
            } => KvRows::Encoded {
                ty: ty.ty,
                bytes: &data[row * row_bytes..(row + n) * row_bytes],
            },
        }
    }

    /// Copy rows `from..from + n` to `to..` (`width` values each).
    pub(crate) fn copy_rows(&mut self, from: usize, to: usize, n: usize, width: usize) {
        match self {
            RowBuf::F32(d) => d.copy_within(from * width..(from + n) * width, to * width),
            RowBuf::Encoded {
                row_bytes, data, ..
            } => {
                let b = *row_bytes;
                data.copy_within(from * b..(from + n) * b, to * b)
            }
        }
    }

    /// Bytes held.
    pub(crate) fn bytes(&self) -> usize {
        match self {
            RowBuf::F32(d) => d.len() * size_of::<f32>(),
            RowBuf::Encoded { data, .. } => data.len(),
        }
    }
}

/// A cache's K and V buffers of `dims` rows (their product) of `kv_dim` values in `types`,
/// the size checked for overflow and against the machine's memory (a K row and a V row per
/// row counted) before anything is allocated.
///
/// `fills_in_order`: the rows are used from the start of the buffer on (a paged pool's
/// blocks), so the buffers ask for huge pages. A fresh zeroed buffer is not touched yet:
/// asked now, it gets them as the cache fills, and attention, which reads every sequence's
/// rows once per decode step from all over the buffer, stops missing the TLB every few rows.
/// A buffer whose outer dimension is the layer (a contiguous cache) touches the start of
/// every layer's region at once: there each huge page would hold a few rows, and a short
/// conversation would take 2 MiB per layer for K and for V.
pub(crate) fn kv_buffers(
    what: &str,
    dims: &[(&str, usize)],
    kv_dim: usize,
    types: CacheTypes,
    fills_in_order: bool,
) -> Result<(RowBuf, RowBuf), KvError> {
    let per_row = types.position_bytes(kv_dim).ok_or_else(|| {
        KvError::Other(format!(
            "{what}: rows of {kv_dim} values are not whole blocks of its cache type ({types})"
        ))
    })?;
    let mut factors: Vec<(&str, u64)> = dims.iter().map(|&(n, v)| (n, v as u64)).collect();
    factors.push(("bytes per K and V row", per_row as u64));
    ch04::memory::checked_bytes(what, &factors).map_err(|e| KvError::Other(e.to_string()))?;
    let rows = dims.iter().map(|d| d.1).product(); // no overflow: checked above
    Ok((
        RowBuf::new(types.k, rows, kv_dim, fills_in_order),
        RowBuf::new(types.v, rows, kv_dim, fills_in_order),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_f16_row_reads_back_within_half_precision() {
        let x: Vec<f32> = (0..96).map(|i| (i as f32 - 40.0) * 0.173).collect();
        let mut buf = RowBuf::new(RowType::F16, 2, 96, false);
        buf.write(1, &x);
        let rows = buf.run(1, 1, 96);
        let mut back = vec![0.0; 96];
        rows.axpy(96, 0, 0..96, 1.0, &mut back);
        for (a, b) in x.iter().zip(&back) {
            // f16 keeps 11 significant bits: a relative error of at most 2^-11.
            assert!((a - b).abs() <= a.abs() * 2f32.powi(-11), "{a} became {b}");
        }
    }

    #[test]
    fn f32_and_f16_rows_take_heads_of_any_size() {
        for types in [CacheTypes::F32, CacheTypes::F16] {
            for head_dim in [1, 48, 64, 80, 256] {
                assert!(types.check_head_dim(head_dim).is_ok());
            }
        }
        assert_eq!(CacheTypes::F16.position_bytes(192), Some(2 * 192 * 2));
    }
}
