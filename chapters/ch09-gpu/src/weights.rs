//! Weight matrices in GPU memory, in the file's own block format.
//!
//! As chapter 6 keeps a tensor's blocks on the CPU and multiplies without expanding them, a
//! [`GpuMatrix`] is the tensor's bytes copied once into a GPU buffer; the kernels dequantize
//! as they read. Only the types that have a `dequant8` in `shaders/` load; any other is an
//! error that names the tensor and its type.

use crate::device::{Gpu, GpuError, View};
use ch01::{GgmlType, GgufFile};
use ch03::matrix::matrix_bytes;

/// The weight types the GPU reads, each with its `dequant8`: the WGSL that reads one block of
/// the type (the kernels that take weights are compiled once per type, with it).
pub const GPU_TYPES: [(GgmlType, &str); 6] = [
    (GgmlType::F32, include_str!("shaders/f32.wgsl")),
    (GgmlType::F16, include_str!("shaders/f16.wgsl")),
    (GgmlType::Q8_0, include_str!("shaders/q8_0.wgsl")),
    (GgmlType::Q4_0, include_str!("shaders/q4_0.wgsl")),
    (GgmlType::Q4_1, include_str!("shaders/q4_1.wgsl")),
    (GgmlType::Q4_K, include_str!("shaders/q4_k.wgsl")),
];

/// The source of a weight type's `dequant8`, or `None` when the GPU path has no kernel for it.
pub fn type_source(ty: GgmlType) -> Option<&'static str> {
    GPU_TYPES.iter().find(|(t, _)| *t == ty).map(|(_, s)| *s)
}

/// Names of the weight types the kernels read, for error messages.
pub fn supported_types() -> String {
    GPU_TYPES
        .iter()
        .map(|(t, _)| t.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// A `(rows, cols)` weight matrix on the GPU, rows of blocks as in the file.
pub struct GpuMatrix {
    pub name: String,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    /// Bytes of one row of blocks.
    pub row_bytes: usize,
    pub data: View, // (rows, row_bytes), padded to whole words
}

impl GpuMatrix {
    /// Upload `bytes`, `rows` rows of `cols` weights of type `ty`, checking that the kernels
    /// read `ty`, that a row is whole blocks (and groups of eight), and the length.
    pub fn upload(
        gpu: &Gpu,
        name: &str,
        ty: GgmlType,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<GpuMatrix, GpuError> {
        if type_source(ty).is_none() {
            return Err(GpuError::Unsupported(format!(
                "tensor {name:?} has type {}, which no GPU kernel reads (supported: {})",
                ty.name(),
                supported_types()
            )));
        }
        let block = ty.block_size() as usize;
        // Kernels take weights eight at a time; every block holds a multiple of eight.
        if cols == 0 || !cols.is_multiple_of(block) || !cols.is_multiple_of(8) {
            return Err(GpuError::Unsupported(format!(
                "tensor {name:?}: rows of {cols} {} weights are not whole blocks of {block}",
                ty.name()
            )));
        }
        let row_bytes = (cols / block) * ty.type_size() as usize;
        if bytes.len() != rows * row_bytes {
            return Err(GpuError::Unsupported(format!(
                "tensor {name:?}: {} bytes, expected {rows} rows of {row_bytes}",
                bytes.len()
            )));
        }
        // Offsets into the buffer are computed in u32.
        if bytes.len() > u32::MAX as usize - 8 {
            return Err(GpuError::Unsupported(format!(
                "tensor {name:?}: {} bytes, the kernels address at most 4 GiB",
                bytes.len()
            )));
        }
        Ok(GpuMatrix {
            name: name.to_string(),
            ty,
            rows,
            cols,
            row_bytes,
            data: gpu.upload(name, bytes)?,
        })
    }

    /// Tensor `name` of `file`, which must be a `(rows, cols)` matrix (`ne = [cols, rows]`).
    pub fn load<B: AsRef<[u8]>>(
        gpu: &Gpu,
        file: &GgufFile<B>,
        name: &str,
        cols: usize,
        rows: usize,
    ) -> Result<GpuMatrix, GpuError> {
        let (info, bytes) = matrix_bytes(file, name, cols, rows)?;
        GpuMatrix::upload(gpu, name, info.ggml_type, rows, cols, bytes)
    }

    /// A short description, e.g. `"Q4_1 on the GPU"`.
    pub fn describe(&self) -> String {
        format!("{} on the GPU", self.ty.name())
    }
}
