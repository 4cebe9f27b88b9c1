//! The file seam: [`ModelFiles`], how a model path becomes a GGUF image ([`Opened`]: mapped, or
//! held by an [`Image`] of any [`ImageBytes`]), and this chapter's [`GgufFiles`].

use super::LoadMode;
use crate::mapped::{
    AlignedBuf, MapOptions, MappedBytes, ReleasePages, SharedBytes, held_gguf, map_gguf,
};
use ch01::{Gguf, GgufFile};
use std::error::Error;
use std::path::Path;

// ANCHOR: model_files
/// How a model path becomes what the engine loads: a parsed GGUF header and the bytes its
/// tensors live in. This chapter's [`GgufFiles`] opens GGUF files; a later chapter passes a
/// value that also turns other formats into a GGUF image.
pub trait ModelFiles: Send + Sync + std::fmt::Debug {
    /// The model at `path` as a GGUF image, mapped if `mode` says so and the format allows.
    fn open(&self, path: &Path, mode: LoadMode) -> Result<Opened, Box<dyn Error>>;

    /// The header of the model at `path` (metadata and tensor descriptions), reading as
    /// little as it can: enough to plan a run's memory before anything is mapped.
    fn header(&self, path: &Path) -> Result<Gguf, Box<dyn Error>>;
}

/// A model opened as a GGUF image: a GGUF file mapped (which can tell, when something fails,
/// whether the file changed underneath), or an image held by anything else — a file read with
/// `--no-mmap`, or what another format was turned into.
pub enum Opened {
    Mapped(GgufFile<MappedBytes>, MappedBytes),
    Held(GgufFile<SharedBytes<Image>>, SharedBytes<Image>),
}

// ANCHOR_END: model_files

// ANCHOR: image
/// What holds the bytes of an image: any buffer the matrices may view.
pub trait ImageBytes: AsRef<[u8]> + ReleasePages + Send + Sync {}
impl<T: AsRef<[u8]> + ReleasePages + Send + Sync> ImageBytes for T {}

/// The bytes of an image, whatever holds them: memory read from a file, maps assembled by
/// another format.
pub struct Image(pub Box<dyn ImageBytes>);

impl AsRef<[u8]> for Image {
    fn as_ref(&self) -> &[u8] {
        (*self.0).as_ref()
    }
}

impl ReleasePages for Image {
    fn release(&self, range: std::ops::Range<usize>) {
        self.0.release(range)
    }
}

impl Opened {
    /// The GGUF file `image` holds, parsed (errors name `path`).
    pub fn held(path: &Path, image: Image) -> Result<Opened, Box<dyn Error>> {
        let (file, bytes) = held_gguf(path, image)?;
        Ok(Opened::Held(file, bytes))
    }

    /// The parsed header.
    pub fn gguf(&self) -> &Gguf {
        match self {
            Opened::Mapped(f, _) => &f.gguf,
            Opened::Held(f, _) => &f.gguf,
        }
    }
}

// ANCHOR_END: image

// ANCHOR: gguf_files
/// GGUF files: mapped, or read into memory with [`LoadMode::Read`].
#[derive(Debug, Clone, Copy, Default)]
pub struct GgufFiles;

impl ModelFiles for GgufFiles {
    fn open(&self, path: &Path, mode: LoadMode) -> Result<Opened, Box<dyn Error>> {
        Ok(match mode {
            LoadMode::Map(opts) => {
                let (file, bytes) = map_gguf(path, &opts)?;
                Opened::Mapped(file, bytes)
            }
            LoadMode::Read => Opened::held(path, Image(Box::new(AlignedBuf::read_file(path)?)))?,
        })
    }

    /// Only the header's pages of the map are read.
    fn header(&self, path: &Path) -> Result<Gguf, Box<dyn Error>> {
        Ok(map_gguf(path, &MapOptions::default())?.0.gguf)
    }
}
// ANCHOR_END: gguf_files
