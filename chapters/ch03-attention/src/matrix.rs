//! Dense f32 matrices and the `Matrix` trait every weight of the model goes through.
//!
//! # Layout
//!
//! GGUF lists a tensor's dimensions innermost first: a weight with `ne = [576, 1536]` has rows of
//! 576 contiguous values, and 1536 of them. We store it the same way, row-major with shape
//! `(rows, cols) = (ne[1], ne[0])`, and multiply activations by it as `y = W x`: output `r` is
//! the dot product of row `r` with `x`. Activations for several tokens are stacked as rows too:
//! `x` is `(n_tokens, cols)` and `y` is `(n_tokens, rows)`. That is `y = x Wᵀ`, which is what
//! llama.cpp's `ggml_mul_mat(W, x)` computes.
//!
//! # The extension point
//!
//! The model never touches weight bytes directly: it calls [`Matrix::matmul`] and
//! [`Matrix::get_row`]. Here the only implementation is [`DenseMatrix`], f32 values dequantized
//! from the file. Chapter 6 adds a quantized matrix that keeps the file's blocks, and chapter 8
//! a threaded SIMD one; they plug in through [`MatrixLoader`], which decides how each tensor of
//! the file becomes a `Matrix`.

use ch01::{Gguf, GgufError, TensorInfo};
use std::fmt;

/// A weight matrix the model can multiply activations by.
pub trait Matrix: Send + Sync {
    /// Output features (`ne[1]`).
    fn rows(&self) -> usize;
    /// Input features (`ne[0]`).
    fn cols(&self) -> usize;
    /// `out = x Wᵀ`: `x` is `(n, cols)`, `out` is `(n, rows)`, for `n = x.len() / cols`.
    fn matmul(&self, x: &[f32], out: &mut [f32]);
    /// Row `r` as f32 (`cols` values): the embedding lookup, ggml's `get_rows`.
    fn get_row(&self, r: usize, out: &mut [f32]);
    /// A short description for diagnostics, e.g. `"F32 dense"` or `"Q4_1"`.
    fn describe(&self) -> String;

    /// Products that share one input: `outs[0] = x Wᵀ` for this matrix and `outs[i] = x Wᵢᵀ`
    /// for `others[i - 1]` — a layer's Q, K and V projections, its gate and up. By default each
    /// is a product of its own. A matrix type that can share the work done on the input
    /// overrides it: chapter 8 quantizes `x` once and computes every matrix's rows in one
    /// parallel job.
    fn matmul_fused(&self, others: &[&dyn Matrix], x: &[f32], outs: &mut [&mut [f32]]) {
        assert_eq!(
            outs.len(),
            others.len() + 1,
            "matmul_fused: one output per matrix"
        );
        self.matmul(x, outs[0]);
        for (w, out) in others.iter().zip(&mut outs[1..]) {
            w.matmul(x, out);
        }
    }

    /// This matrix as [`Any`](std::any::Any), so that an override of
    /// [`Matrix::matmul_fused`] can recognise matrices of its own kind among `others`. `None`
    /// (the default): it is not one of them.
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        None
    }
}

/// Why a tensor could not become a [`Matrix`].
#[derive(Debug)]
pub enum LoadError {
    /// The file lacks a tensor the model needs.
    MissingTensor(String),
    /// A tensor has the wrong number of dimensions or the wrong size.
    Shape {
        name: String,
        expected: Vec<u64>,
        found: Vec<u64>,
    },
    /// Reading or dequantizing the tensor failed.
    Gguf(String, GgufError),
    /// A weight that must be finite is not.
    NonFinite {
        name: String,
        index: usize,
        value: f32,
    },
    /// Anything else a loader rejects, e.g. a type it cannot compute with.
    Other(String),
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::MissingTensor(n) => write!(f, "the model file has no tensor {n:?}"),
            LoadError::Shape {
                name,
                expected,
                found,
            } => write!(
                f,
                "tensor {name:?} has dimensions {found:?} (ne order), expected {expected:?}"
            ),
            LoadError::Gguf(name, e) => write!(f, "tensor {name:?}: {e}"),
            LoadError::NonFinite { name, index, value } => {
                write!(f, "tensor {name:?} holds {value} at index {index}")
            }
            LoadError::Other(msg) => f.write_str(msg),
        }
    }
}

impl std::error::Error for LoadError {}

/// Turns a tensor of a GGUF file into a [`Matrix`]. The model loader asks it for every weight
/// matrix; chapter 6 supplies one that keeps quantized blocks, chapter 10 one that points into a
/// memory map instead of copying.
pub trait MatrixLoader {
    /// `bytes` are the tensor's raw bytes (`info.n_bytes()` of them), already bounds-checked.
    fn load(
        &self,
        gguf: &Gguf,
        info: &TensorInfo,
        bytes: &[u8],
    ) -> Result<Box<dyn Matrix>, LoadError>;

    /// A matrix the model only reads a row at a time ([`Matrix::get_row`]: the token
    /// embeddings, when the output projection is a matrix of its own). A loader may keep it in
    /// the form that suits lookups rather than products; by default it is loaded as any other.
    fn load_rows(
        &self,
        gguf: &Gguf,
        info: &TensorInfo,
        bytes: &[u8],
    ) -> Result<Box<dyn Matrix>, LoadError> {
        self.load(gguf, info, bytes)
    }
}

/// A matrix of f32 values, row-major.
pub struct DenseMatrix {
    data: Vec<f32>, // (rows, cols)
    rows: usize,
    cols: usize,
}

impl DenseMatrix {
    /// Wrap `data` as a `(rows, cols)` matrix. Panics if the length does not match: this is
    /// called by code that computed the shape itself.
    pub fn new(data: Vec<f32>, rows: usize, cols: usize) -> DenseMatrix {
        assert_eq!(
            data.len(),
            rows * cols,
            "DenseMatrix::new: data does not have rows * cols values"
        );
        DenseMatrix { data, rows, cols }
    }

    /// The values, row-major `(rows, cols)`.
    pub fn data(&self) -> &[f32] {
        &self.data
    }
}

// ANCHOR: matmul
/// The dot product of two equal-length slices.
///
/// Eight independent partial sums let the compiler keep eight multiply-adds in flight and use
/// SIMD registers; a single running sum would serialise every addition. (Floating-point addition
/// is not associative, so the compiler may not reorder a single sum by itself.)
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0.0f32; 8];
    let (ac, ar) = a.as_chunks::<8>();
    let (bc, br) = b.as_chunks::<8>();
    for (x, y) in ac.iter().zip(bc) {
        for k in 0..8 {
            acc[k] += x[k] * y[k];
        }
    }
    let mut sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in ar.iter().zip(br) {
        sum += x * y;
    }
    sum
}

/// `out = x Wᵀ` for a row-major `w` of shape `(rows, cols)`.
///
/// The weight row is the outer loop: each row is read from memory once and used for every
/// token while it sits in the L1 cache. With one token (decoding) the cost is reading the whole
/// matrix; with many tokens (a prompt) the same read serves them all.
pub fn matmul(w: &[f32], rows: usize, cols: usize, x: &[f32], out: &mut [f32]) {
    let n = x.len() / cols;
    assert!(w.len() == rows * cols && x.len() == n * cols && out.len() == n * rows);
    for (r, w_row) in w.chunks_exact(cols).enumerate() {
        for (t, x_row) in x.chunks_exact(cols).enumerate() {
            out[t * rows + r] = dot(w_row, x_row);
        }
    }
}
// ANCHOR_END: matmul

impl Matrix for DenseMatrix {
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
    fn matmul(&self, x: &[f32], out: &mut [f32]) {
        matmul(&self.data, self.rows, self.cols, x, out);
    }
    fn get_row(&self, r: usize, out: &mut [f32]) {
        out.copy_from_slice(&self.data[r * self.cols..(r + 1) * self.cols]);
    }
    fn describe(&self) -> String {
        "F32 dense".to_string()
    }
}

/// Loads every matrix as f32, dequantizing with chapter 1's plain dequantizer. This is how
/// chapters 3 to 5 run the model: simple, and 4× to 8× the memory of the file.
pub struct DenseLoader;

impl MatrixLoader for DenseLoader {
    fn load(
        &self,
        _gguf: &Gguf,
        info: &TensorInfo,
        bytes: &[u8],
    ) -> Result<Box<dyn Matrix>, LoadError> {
        let (cols, rows) = matrix_dims(info)?;
        let data = ch01::dequant::dequantize(info.ggml_type, bytes, rows * cols)
            .map_err(|e| LoadError::Other(format!("tensor {:?}: {e}", info.name)))?;
        Ok(Box::new(DenseMatrix::new(data, rows, cols)))
    }
}

/// `(cols, rows)` of a 2-D tensor (`ne = [cols, rows]`), or an error naming it.
pub fn matrix_dims(info: &TensorInfo) -> Result<(usize, usize), LoadError> {
    match info.dims[..] {
        [c, r] => Ok((c as usize, r as usize)),
        _ => Err(LoadError::Shape {
            name: info.name.clone(),
            expected: vec![0, 0],
            found: info.dims.clone(),
        }),
    }
}

/// Load tensor `name` as a `(rows, cols)` matrix through `loader`, checking its shape.
pub fn load_matrix<B: AsRef<[u8]>>(
    file: &ch01::GgufFile<B>,
    loader: &dyn MatrixLoader,
    name: &str,
    cols: usize,
    rows: usize,
) -> Result<Box<dyn Matrix>, LoadError> {
    let (info, bytes) = matrix_bytes(file, name, cols, rows)?;
    loader.load(&file.gguf, info, bytes)
}

/// Tensor `name` of `file`, which must be a `(rows, cols)` matrix (`ne = [cols, rows]`): its
/// info and its bytes, as stored. For a loader of another kind (chapter 9's GPU).
pub fn matrix_bytes<'f, B: AsRef<[u8]>>(
    file: &'f ch01::GgufFile<B>,
    name: &str,
    cols: usize,
    rows: usize,
) -> Result<(&'f TensorInfo, &'f [u8]), LoadError> {
    let info = file
        .gguf
        .tensor(name)
        .ok_or_else(|| LoadError::MissingTensor(name.to_string()))?;
    if info.dims != [cols as u64, rows as u64] {
        return Err(LoadError::Shape {
            name: name.to_string(),
            expected: vec![cols as u64, rows as u64],
            found: info.dims.clone(),
        });
    }
    let bytes = file
        .tensor_bytes(name)
        .map_err(|e| LoadError::Gguf(name.to_string(), e))?;
    Ok((info, bytes))
}

/// Load a 1-D f32 vector (a norm weight) of length `n`.
pub fn load_vector<B: AsRef<[u8]>>(
    file: &ch01::GgufFile<B>,
    name: &str,
    n: usize,
) -> Result<Vec<f32>, LoadError> {
    let info = file
        .gguf
        .tensor(name)
        .ok_or_else(|| LoadError::MissingTensor(name.to_string()))?;
    if info.dims != [n as u64] {
        return Err(LoadError::Shape {
            name: name.to_string(),
            expected: vec![n as u64],
            found: info.dims.clone(),
        });
    }
    let v = file
        .tensor_f32(name)
        .map_err(|e| LoadError::Gguf(name.to_string(), e))?;
    // A norm weight multiplies every activation of its layer: one NaN here poisons the whole
    // model, and a scan of `n` floats at load is nothing next to the matrices.
    if let Some((index, &value)) = v.iter().enumerate().find(|(_, x)| !x.is_finite()) {
        return Err(LoadError::NonFinite {
            name: name.to_string(),
            index,
            value,
        });
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_matches_the_definition() {
        let (rows, cols, n) = (5, 19, 3);
        let w: Vec<f32> = (0..rows * cols).map(|i| (i as f32 * 0.31).sin()).collect();
        let x: Vec<f32> = (0..n * cols).map(|i| (i as f32 * 0.17).cos()).collect();
        let mut out = vec![0.0; n * rows];
        matmul(&w, rows, cols, &x, &mut out);
        for t in 0..n {
            for r in 0..rows {
                let want: f64 = (0..cols)
                    .map(|c| w[r * cols + c] as f64 * x[t * cols + c] as f64)
                    .sum();
                assert!((out[t * rows + r] as f64 - want).abs() < 1e-5);
            }
        }
    }
}
