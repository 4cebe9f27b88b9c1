//! The finished engine's model files: GGUF files as chapter 10 opens them, and Hugging Face
//! directories converted into a GGUF image in memory.

use crate::convert::Precision;
use crate::files::{Checkpoint, is_checkpoint};
use ch01::{Gguf, GgufFile};
use ch10::engine::{GgufFiles, Image, LoadMode, ModelFiles, Opened};
use ch10::mapped::SharedBytes;
use std::error::Error;
use std::path::Path;
use std::sync::Arc;

// ANCHOR: checkpoints
/// Chapter 10's [`ModelFiles`] that also reads Hugging Face directories: a directory with a
/// `config.json` (or that file) becomes a GGUF image, its matrices at `precision`
/// (`--quantize`) — mapped over the shards where the engine maps files (`assemble`), else
/// the converted file built in memory ([`Checkpoint::image`], as `--no-mmap` reads a GGUF
/// file); anything else is a GGUF file.
#[derive(Debug, Clone, Copy, Default)]
pub struct Checkpoints {
    pub precision: Precision,
}

impl ModelFiles for Checkpoints {
    fn open(&self, path: &Path, mode: LoadMode) -> Result<Opened, Box<dyn Error>> {
        // A directory is a checkpoint or nothing: say what it lacks.
        if !path.is_dir() && !is_checkpoint(path) {
            if self.precision.is_some() {
                return Err(format!(
                    "{}: --quantize converts a Hugging Face directory; a GGUF file is quantized \
                     with chapter 6's quantize example",
                    path.display()
                )
                .into());
            }
            return GgufFiles.open(path, mode);
        }
        let ckpt = Checkpoint::open(path)?;
        #[cfg(unix)]
        if let LoadMode::Map(opts) = mode {
            let planned = ckpt.plan(self.precision)?;
            let (gguf, image) = crate::assemble::assemble(&ckpt, &planned)?;
            image.advise(opts.advice);
            let bytes = SharedBytes::whole(Arc::new(Image(Box::new(image))));
            let file = GgufFile::from_header(gguf, bytes.clone())?;
            return Ok(Opened::Held(file, bytes));
        }
        Opened::held(path, Image(Box::new(ckpt.image(self.precision)?)))
    }

    /// A directory's header is planned without reading a tensor.
    fn header(&self, path: &Path) -> Result<Gguf, Box<dyn Error>> {
        if !path.is_dir() && !is_checkpoint(path) {
            return GgufFiles.header(path);
        }
        let planned = Checkpoint::open(path)?.plan(self.precision)?;
        let w = &planned.writer;
        Ok(Gguf::new(
            3,
            w.metadata().to_vec(),
            w.tensors().to_vec(),
            w.alignment(),
            0,
        ))
    }
}
// ANCHOR_END: checkpoints
