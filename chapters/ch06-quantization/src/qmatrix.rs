//! A weight matrix that stays quantized: the model of chapters 4 and 5, run on the file's own
//! blocks.
//!
//! `QMatrix` implements chapter 3's [`Matrix`] trait, so the model does not change: only the
//! loader does. A product `y = W x` quantizes each activation row once into the weight type's
//! `vec_dot_type` (Q8_0 for Q4_0/Q5_0/Q8_0 weights, Q8_1 for Q4_1/Q5_1, Q8_K for the K-quants),
//! then takes one integer dot product per weight row — the weights are never expanded to f32.
//!
//! The bytes live in any `S: AsRef<[u8]>`: a `Vec<u8>` copied from the file here, a view into a
//! memory map in chapter 10.

use crate::quants::{TypeTraits, VecDot, quantize_chunk, type_traits};
use ch01::{GgmlType, Gguf, TensorInfo};
use ch03::matrix::{LoadError, Matrix, MatrixLoader, matrix_dims};

// ANCHOR: qmatrix
/// A `(rows, cols)` matrix stored as rows of quantized blocks.
pub struct QMatrix<S = Vec<u8>> {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub row_bytes: usize, // bytes of one row of blocks
    pub data: S,          // (rows, row_bytes)
    /// The weight type's kernels.
    pub traits: &'static TypeTraits,
    /// The activation type's kernels (its `from_float` quantizes `x`).
    pub act: &'static TypeTraits,
    vec_dot: VecDot,
}

impl<S: AsRef<[u8]> + Send + Sync> Matrix for QMatrix<S> {
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
    fn matmul(&self, x: &[f32], out: &mut [f32]) {
        let q = self.quantize_activations(x);
        let arb = self.act_row_bytes();
        for r in 0..self.rows {
            for (t, a) in q.chunks_exact(arb).enumerate() {
                out[t * self.rows + r] = self.dot(r, a);
            }
        }
    }
    fn get_row(&self, r: usize, out: &mut [f32]) {
        (self.traits.to_float)(self.row(r), out);
    }
    fn describe(&self) -> String {
        format!("{} quantized", self.ty.name())
    }
}
// ANCHOR_END: qmatrix

impl<S: AsRef<[u8]>> QMatrix<S> {
    // ANCHOR: qmatrix_new
    /// Wrap `data` (rows of `ty` blocks) as a `(rows, cols)` matrix, checking that `ty` has
    /// kernels, that `cols` is a whole number of blocks and that `data` has exactly the bytes.
    pub fn new(
        name: &str,
        ty: GgmlType,
        rows: usize,
        cols: usize,
        data: S,
    ) -> Result<QMatrix<S>, LoadError> {
        let unsupported = || {
            LoadError::Other(format!(
                "tensor {name:?}: type {} has no dot-product kernel here",
                ty.name()
            ))
        };
        let traits = type_traits(ty).ok_or_else(unsupported)?;
        let vec_dot = traits.vec_dot.ok_or_else(unsupported)?;
        let act = type_traits(traits.vec_dot_type).ok_or_else(unsupported)?;
        if !cols.is_multiple_of(traits.block_size) || !cols.is_multiple_of(act.block_size) {
            return Err(LoadError::Other(format!(
                "tensor {name:?}: {cols} columns are not a whole number of {} blocks",
                ty.name()
            )));
        }
        let row_bytes = cols / traits.block_size * traits.type_size;
        if data.as_ref().len() != rows * row_bytes {
            return Err(LoadError::Other(format!(
                "tensor {name:?}: {} bytes, expected {rows} rows of {row_bytes}",
                data.as_ref().len()
            )));
        }
        Ok(QMatrix {
            ty,
            rows,
            cols,
            row_bytes,
            data,
            traits,
            act,
            vec_dot,
        })
    }
    // ANCHOR_END: qmatrix_new

    // ANCHOR: qmatrix_dot
    /// Bytes of one activation row in the `vec_dot_type`.
    pub fn act_row_bytes(&self) -> usize {
        self.cols / self.act.block_size * self.act.type_size
    }

    /// Quantize the activation rows `x` (`(n, cols)`) for this matrix's dot product.
    pub fn quantize_activations(&self, x: &[f32]) -> Vec<u8> {
        let arb = self.act_row_bytes();
        let n = x.len() / self.cols;
        let mut q = vec![0u8; n * arb]; // (n, act_row_bytes)
        for (xr, qr) in x.chunks_exact(self.cols).zip(q.chunks_exact_mut(arb)) {
            (self.act.from_float)(xr, qr);
        }
        q
    }

    /// Row `r`'s bytes.
    pub fn row(&self, r: usize) -> &[u8] {
        &self.data.as_ref()[r * self.row_bytes..(r + 1) * self.row_bytes]
    }

    /// One weight row · one quantized activation row.
    pub fn dot(&self, r: usize, act: &[u8]) -> f32 {
        (self.vec_dot)(self.cols, self.row(r), act)
    }
    // ANCHOR_END: qmatrix_dot
}

/// Keeps every matrix in the file's own format (copied into memory; chapter 10 maps it).
pub struct QuantLoader;

impl MatrixLoader for QuantLoader {
    fn load(
        &self,
        _gguf: &Gguf,
        info: &TensorInfo,
        bytes: &[u8],
    ) -> Result<Box<dyn Matrix>, LoadError> {
        let (cols, rows) = matrix_dims(info)?;
        Ok(Box::new(QMatrix::new(
            &info.name,
            info.ggml_type,
            rows,
            cols,
            bytes.to_vec(),
        )?))
    }
}

/// Requantizes every matrix to the type `choose` picks for it, from its f32 values: how the
/// `quantize` example and the tests rebuild llama.cpp's quantized variants in memory.
pub struct RequantLoader<F: Fn(&TensorInfo) -> GgmlType> {
    pub choose: F,
}

impl<F: Fn(&TensorInfo) -> GgmlType> MatrixLoader for RequantLoader<F> {
    fn load(
        &self,
        _gguf: &Gguf,
        info: &TensorInfo,
        bytes: &[u8],
    ) -> Result<Box<dyn Matrix>, LoadError> {
        let (cols, rows) = matrix_dims(info)?;
        let target = (self.choose)(info);
        let data = requantize(info, bytes, target)?;
        Ok(Box::new(QMatrix::new(
            &info.name, target, rows, cols, data,
        )?))
    }
}

/// The bytes of tensor `info` (`bytes` in its own type) requantized to `target`, row by row
/// with the quantizer `llama_model_quantize` uses.
pub fn requantize(info: &TensorInfo, bytes: &[u8], target: GgmlType) -> Result<Vec<u8>, LoadError> {
    let err = |e: String| LoadError::Other(format!("tensor {:?}: {e}", info.name));
    let from = type_traits(info.ggml_type)
        .ok_or_else(|| err(format!("cannot dequantize {}", info.ggml_type.name())))?;
    let n_per_row = info.dims[0] as usize;
    let nrow = (info.n_elements() / info.dims[0].max(1)) as usize;
    let in_row = n_per_row / from.block_size * from.type_size;
    let mut f = vec![0.0f32; nrow * n_per_row]; // (nrow, n_per_row)
    for (src, dst) in bytes
        .chunks_exact(in_row)
        .zip(f.chunks_exact_mut(n_per_row))
    {
        (from.to_float)(src, dst);
    }
    let to =
        type_traits(target).ok_or_else(|| err(format!("cannot quantize to {}", target.name())))?;
    let mut out = vec![0u8; nrow * (n_per_row / to.block_size * to.type_size)];
    quantize_chunk(target, &f, &mut out, nrow, n_per_row).map_err(|e| err(e.to_string()))?;
    Ok(out)
}
