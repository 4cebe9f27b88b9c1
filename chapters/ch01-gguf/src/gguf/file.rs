//! A parsed GGUF header together with the bytes its tensors live in.

use super::error::{Context, GgufError, ParseError, ParseErrorKind};
use super::{Gguf, TensorInfo};
use crate::dequant;
use std::ops::Deref;
use std::path::Path;

// ANCHOR: gguf_file
/// A GGUF file: the parsed [`Gguf`] and the file's bytes. `B` is whatever holds them: a
/// `Vec<u8>` read into memory here, a memory map in a later chapter.
pub struct GgufFile<B: AsRef<[u8]> = Vec<u8>> {
    pub gguf: Gguf,
    bytes: B,
}

impl GgufFile<Vec<u8>> {
    /// Read the file at `path` into memory and parse it. Errors name the file.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile<Vec<u8>>, GgufError> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        GgufFile::from_bytes(bytes).map_err(|e| GgufError::InFile {
            path: path.to_path_buf(),
            source: Box::new(e),
        })
    }
}
// ANCHOR_END: gguf_file

// ANCHOR: tensor_access
impl<B: AsRef<[u8]>> GgufFile<B> {
    /// Parse the GGUF file image `bytes`.
    pub fn from_bytes(bytes: B) -> Result<GgufFile<B>, GgufError> {
        let gguf = Gguf::parse(bytes.as_ref())?;
        Ok(GgufFile { gguf, bytes })
    }

    /// A file from a header made in memory ([`Gguf::new`]) and the bytes its tensors live in
    /// (tensor `t` at `data_offset + t.offset`): for an image assembled from another format.
    /// Every tensor must lie inside `bytes`.
    pub fn from_header(gguf: Gguf, bytes: B) -> Result<GgufFile<B>, GgufError> {
        let file = GgufFile { gguf, bytes };
        for t in &file.gguf.tensors {
            file.bytes_of(t)?;
        }
        Ok(file)
    }

    /// The same file over a borrow of its bytes: a `GgufFile<&[u8]>`, one type whatever `B` is,
    /// for code that cannot be generic (a loader chosen at run time). The header is cloned.
    pub fn borrowed(&self) -> GgufFile<&[u8]> {
        GgufFile {
            gguf: self.gguf.clone(),
            bytes: self.bytes.as_ref(),
        }
    }

    /// The raw bytes of tensor `name`, as stored (quantized blocks for a quantized type).
    pub fn tensor_bytes(&self, name: &str) -> Result<&[u8], GgufError> {
        let info = self
            .gguf
            .tensor(name)
            .ok_or_else(|| GgufError::MissingTensor(name.to_string()))?;
        self.bytes_of(info)
    }

    /// Tensor `name` converted to f32, in ggml order (`dims[0]` varies fastest).
    pub fn tensor_f32(&self, name: &str) -> Result<Vec<f32>, GgufError> {
        let info = self
            .gguf
            .tensor(name)
            .ok_or_else(|| GgufError::MissingTensor(name.to_string()))?;
        let bytes = self.bytes_of(info)?;
        let dequant_error = |source| GgufError::Dequant {
            tensor: name.to_string(),
            source,
        };
        let n = usize::try_from(info.n_elements())
            .map_err(|_| dequant_error(dequant::DequantError::TooLarge(info.n_elements())))?;
        dequant::dequantize(info.ggml_type, bytes, n).map_err(dequant_error)
    }
    // ANCHOR_END: tensor_access

    /// The bytes of the tensor `info` describes.
    pub fn bytes_of(&self, info: &TensorInfo) -> Result<&[u8], GgufError> {
        let bytes = self.bytes.as_ref();
        // `parse` checked every tensor, but `gguf` is public and may have been edited since.
        let start = self.gguf.data_offset.checked_add(info.offset);
        let end = start.and_then(|s| s.checked_add(info.n_bytes()));
        let range = start.zip(end).and_then(|(s, e)| {
            let (s, e) = (usize::try_from(s).ok()?, usize::try_from(e).ok()?);
            bytes.get(s..e)
        });
        range.ok_or_else(|| {
            GgufError::Parse(ParseError {
                offset: self.gguf.data_offset.saturating_add(info.offset),
                context: Some(Context::Tensor(info.name.clone())),
                kind: ParseErrorKind::OutOfBounds {
                    offset: info.offset,
                    n_bytes: info.n_bytes(),
                    data_len: (bytes.len() as u64).saturating_sub(self.gguf.data_offset),
                },
            })
        })
    }

    /// The whole file image.
    pub fn bytes(&self) -> &[u8] {
        self.bytes.as_ref()
    }

    /// The parsed header and the bytes, taken apart.
    pub fn into_parts(self) -> (Gguf, B) {
        (self.gguf, self.bytes)
    }
}

/// A `GgufFile` reads like its [`Gguf`]: `file.get_u32("llama.block_count")`.
impl<B: AsRef<[u8]>> Deref for GgufFile<B> {
    type Target = Gguf;

    fn deref(&self) -> &Gguf {
        &self.gguf
    }
}
