//! A [`MatrixLoader`] whose matrices view the file's bytes instead of copying them.
//!
//! Chapter 6's `QuantLoader` copies each tensor into a `Vec<u8>` of its own; with the file also
//! read into memory, the weights exist twice while loading. [`ViewLoader`] hands each matrix a
//! [`SharedBytes`] view of the one buffer the file lives in — the memory map
//! ([`MappedLoader`]), or the file read once into aligned memory (the `--no-mmap` path) — so the
//! weights exist once, and with a map they are the page cache's own pages.
//!
//! # Alignment
//!
//! The kernels read a tensor's bytes as ggml's block structs (`BlockQ4_1` is two f16 and
//! sixteen bytes of codes: it needs 2-byte alignment; the `f32` scale of `BlockQ8_K` needs 4).
//! A map starts on a page boundary, the data section on a multiple of `general.alignment`
//! (32 unless the file says otherwise) and every tensor on a multiple of it inside the data
//! section, so tensor bytes are 32-byte aligned in memory and the views always qualify. A file
//! may legally say `general.alignment = 1`, though. Then a tensor can start at an odd address,
//! and a view would make every dot product fall back to copying its row into an aligned buffer
//! first. Instead, such a tensor is copied once, at load, into aligned memory (the one copy the
//! loader ever makes), and [`ViewLoader::copied`] lists it. `examples/alignment.rs` measures
//! both ways.

use crate::mapped::{AlignedBuf, MappedFile, ReleasePages, SharedBytes};
use ch01::{GgmlType, Gguf, TensorInfo};
use ch03::matrix::{LoadError, Matrix, MatrixLoader};
use ch06::quants::*;
use ch08::FastLoader;
use ch08::fast_matrix::Store;
use std::cell::RefCell;
use std::mem::align_of;

// ANCHOR: tensor_bytes
/// The bytes a matrix computes on: a view of the file, or a private aligned copy of a tensor
/// whose view is not aligned for its blocks.
pub enum TensorBytes<O> {
    View(SharedBytes<O>),
    Copy(AlignedBuf),
}

impl<O: AsRef<[u8]>> AsRef<[u8]> for TensorBytes<O> {
    fn as_ref(&self) -> &[u8] {
        match self {
            TensorBytes::View(v) => v.as_ref(),
            TensorBytes::Copy(c) => c.as_ref(),
        }
    }
}
// ANCHOR_END: tensor_bytes

// ANCHOR: view_or_copy
impl<O: AsRef<[u8]>> ViewLoader<O> {
    /// What tensor `info`'s matrix computes on: its `view` of the file, or an aligned copy when
    /// the view does not start on a multiple of its blocks' alignment (then its name goes into
    /// `copied`). `bytes`, what the model's loader passed, must be that view's very bytes.
    fn view_or_copy(
        &self,
        view: SharedBytes<O>,
        info: &TensorInfo,
        bytes: &[u8],
    ) -> Result<TensorBytes<O>, LoadError> {
        // ANCHOR: yours_view_or_copy
        if !std::ptr::eq(view.as_ref(), bytes) {
            return Err(LoadError::Other(format!(
                "tensor {:?}: the bytes given are not this loader's file (a view loader serves \
                 the file it was made for)",
                info.name
            )));
        }
        let address = view.as_ref().as_ptr() as usize;
        if address.is_multiple_of(block_align(info.ggml_type)) {
            Ok(TensorBytes::View(view))
        } else {
            self.copied.borrow_mut().push(info.name.clone());
            Ok(TensorBytes::Copy(AlignedBuf::copy_of(view.as_ref())))
        }
        // ANCHOR_END: yours_view_or_copy
    }
}
// ANCHOR_END: view_or_copy

/// The alignment the kernels need for the bytes of a `ty` tensor: the alignment of ggml's
/// block struct. Float rows are decoded with `from_le_bytes`, so any address serves them.
pub fn block_align(ty: GgmlType) -> usize {
    use GgmlType::*;
    match ty {
        Q4_0 => align_of::<BlockQ4_0>(),
        Q4_1 => align_of::<BlockQ4_1>(),
        Q5_0 => align_of::<BlockQ5_0>(),
        Q5_1 => align_of::<BlockQ5_1>(),
        Q8_0 => align_of::<BlockQ8_0>(),
        Q8_1 => align_of::<BlockQ8_1>(),
        Q2_K => align_of::<BlockQ2_K>(),
        Q3_K => align_of::<BlockQ3_K>(),
        Q4_K => align_of::<BlockQ4_K>(),
        Q5_K => align_of::<BlockQ5_K>(),
        Q6_K => align_of::<BlockQ6_K>(),
        Q8_K => align_of::<BlockQ8_K>(),
        _ => 1,
    }
}

// ANCHOR: view_loader
/// Makes each matrix over a view of the buffer the file lives in, as chapter 8's fast matrix
/// (its kernels, threads and packing are `fast`'s). One loader serves one file: it checks that
/// the bytes it is given are that file's.
pub struct ViewLoader<O> {
    file: SharedBytes<O>, // the whole file image
    pub fast: FastLoader,
    copied: RefCell<Vec<String>>,
    /// Called after each matrix with (bytes of the file loaded so far, the file's size).
    progress: Option<Box<dyn Fn(u64, u64)>>,
    loaded: std::cell::Cell<u64>,
}

/// The loader of a memory-mapped file.
pub type MappedLoader = ViewLoader<MappedFile>;
// ANCHOR_END: view_loader

// ANCHOR: view
impl<O: AsRef<[u8]> + ReleasePages + Send + Sync + 'static> ViewLoader<O> {
    /// A loader for the file whose whole image is `file`, making matrices as `fast` does.
    pub fn new(file: SharedBytes<O>, fast: FastLoader) -> ViewLoader<O> {
        ViewLoader {
            file,
            fast,
            copied: RefCell::new(Vec::new()),
            progress: None,
            loaded: std::cell::Cell::new(0),
        }
    }

    /// The same loader, calling `progress(bytes loaded, file size)` after each matrix.
    pub fn with_progress(mut self, progress: Box<dyn Fn(u64, u64)>) -> ViewLoader<O> {
        self.progress = Some(progress);
        self
    }

    /// The bytes of tensor `info`, as a view: they start at `data_offset + info.offset`.
    pub fn view(&self, gguf: &Gguf, info: &TensorInfo) -> Result<SharedBytes<O>, LoadError> {
        // ANCHOR: yours_view
        let start = gguf.data_offset.checked_add(info.offset);
        start
            .and_then(|s| self.file.slice(s, info.n_bytes()))
            .ok_or_else(|| {
                LoadError::Other(format!(
                    "tensor {:?}: bytes {}+{}..+{} lie outside the {}-byte file",
                    info.name,
                    gguf.data_offset,
                    info.offset,
                    info.n_bytes(),
                    self.file.as_ref().len()
                ))
            })
        // ANCHOR_END: yours_view
    }

    /// Names of the tensors copied because their bytes were not aligned for their blocks.
    pub fn copied(&self) -> Vec<String> {
        self.copied.borrow().clone()
    }
}
// ANCHOR_END: view

// ANCHOR: matrix_loader
impl<O: AsRef<[u8]> + ReleasePages + Send + Sync + 'static> MatrixLoader for ViewLoader<O> {
    fn load(
        &self,
        gguf: &Gguf,
        info: &TensorInfo,
        bytes: &[u8],
    ) -> Result<Box<dyn Matrix>, LoadError> {
        self.make(gguf, info, bytes, true)
    }

    /// The token embeddings: a view of the file, never packed, so only the rows a prompt
    /// looks up are ever read.
    fn load_rows(
        &self,
        gguf: &Gguf,
        info: &TensorInfo,
        bytes: &[u8],
    ) -> Result<Box<dyn Matrix>, LoadError> {
        self.make(gguf, info, bytes, false)
    }
}
// ANCHOR_END: matrix_loader

// ANCHOR: make
impl<O: AsRef<[u8]> + ReleasePages + Send + Sync + 'static> ViewLoader<O> {
    /// The matrix of `info` over a view of the file, packed if `pack` (and the fast loader)
    /// says so.
    fn make(
        &self,
        gguf: &Gguf,
        info: &TensorInfo,
        bytes: &[u8],
        pack: bool,
    ) -> Result<Box<dyn Matrix>, LoadError> {
        let view = self.view(gguf, info)?;
        let range = view.offset()..view.offset() + view.as_ref().len();
        let data = self.view_or_copy(view, info, bytes)?;
        let matrix = self.fast.matrix_packed_if(info, data, pack)?;
        // ANCHOR: release
        // A repacked matrix keeps a copy of its own: the file's pages of it are read no more
        // (unless the tensor is also read as rows, as tied embeddings are, which fault them
        // in again), so they leave the resident set — the weights are in memory once.
        if matches!(matrix.store, Store::Packed(_)) {
            self.file.owner().release(range);
        }
        // ANCHOR_END: release
        if let Some(progress) = &self.progress {
            self.loaded.set(self.loaded.get() + info.n_bytes());
            progress(self.loaded.get(), self.file.as_ref().len() as u64);
        }
        Ok(Box::new(matrix))
    }
}
// ANCHOR_END: make

#[cfg(test)]
mod tests {
    use super::*;
    use ch06::gguf_write::GgufWriter;
    use ch08::{PoolKind, new_pool};
    use std::sync::Arc;

    /// A file of one `Q8_0` matrix (two rows of one block) with `general.alignment` set to
    /// `alignment`, its header made odd in length with `pad` when needed.
    fn one_matrix(alignment: u32, pad: &str) -> (Vec<u8>, Gguf) {
        let mut w = GgufWriter::new();
        w.set("general.alignment", ch01::Value::U32(alignment))
            .unwrap();
        w.set("test.pad", ch01::Value::String(pad.into())).unwrap();
        w.add_tensor("m", &[32, 2], GgmlType::Q8_0).unwrap();
        let data: Vec<u8> = (0..68).map(|i| i as u8).collect();
        let mut bytes = Vec::new();
        w.write(&mut bytes, |_| Ok::<_, String>(&data)).unwrap();
        let gguf = Gguf::parse(&bytes).unwrap();
        (bytes, gguf)
    }

    fn loader(bytes: &[u8]) -> ViewLoader<AlignedBuf> {
        let file = SharedBytes::whole(Arc::new(AlignedBuf::copy_of(bytes)));
        ViewLoader::new(file, FastLoader::new(new_pool(PoolKind::Spin, 1)))
    }

    #[test]
    fn aligned_tensors_are_viewed_and_misaligned_ones_copied() {
        // Aligned: the matrix's bytes are the file's own, and nothing is copied.
        let (bytes, gguf) = one_matrix(32, "");
        let l = loader(&bytes);
        let view = l.view(&gguf, &gguf.tensors[0]).unwrap();
        let at = view.as_ref().as_ptr();
        // A clone of a view shares its bytes: the loader's own, as a model's loader passes.
        let data = l.view_or_copy(view.clone(), &gguf.tensors[0], view.as_ref());
        match data.unwrap() {
            TensorBytes::View(v) => assert_eq!(v.as_ref().as_ptr(), at),
            TensorBytes::Copy(_) => panic!("an aligned tensor was copied"),
        }
        assert!(l.copied().is_empty());

        // Alignment 1 and an odd header: the tensor starts at an odd address, which no Q8_0
        // block (two-byte aligned) accepts, so it is copied, once, to aligned memory.
        let (bytes, gguf) = [one_matrix(1, ""), one_matrix(1, "x")]
            .into_iter()
            .find(|(_, g)| g.data_offset % 2 == 1)
            .unwrap();
        let l = loader(&bytes);
        let view = l.view(&gguf, &gguf.tensors[0]).unwrap();
        assert_eq!(view.as_ref().as_ptr() as usize % 2, 1);
        let want = view.as_ref().to_vec();
        // A clone of a view shares its bytes: the loader's own, as a model's loader passes.
        let data = l.view_or_copy(view.clone(), &gguf.tensors[0], view.as_ref());
        match data.unwrap() {
            TensorBytes::Copy(c) => {
                assert_eq!(c.as_ref(), &want[..]);
                assert_eq!(
                    c.as_ref().as_ptr() as usize % block_align(GgmlType::Q8_0),
                    0
                );
            }
            TensorBytes::View(_) => panic!("a misaligned tensor was viewed"),
        }
        assert_eq!(l.copied(), ["m"]);
    }

    #[test]
    fn bytes_from_another_buffer_are_refused() {
        let (bytes, gguf) = one_matrix(32, "");
        let l = loader(&bytes);
        let view = l.view(&gguf, &gguf.tensors[0]).unwrap();
        // Equal bytes, another place: not the file this loader serves.
        let elsewhere = view.as_ref().to_vec();
        let e = l
            .view_or_copy(view, &gguf.tensors[0], &elsewhere)
            .err()
            .expect("bytes from another buffer accepted");
        assert!(e.to_string().contains("not this loader's file"), "{e}");
    }
}
