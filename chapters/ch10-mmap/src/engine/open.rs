//! Loading: [`Engine`] (model, tokenizer and chat template) and [`Engine::open`], which opens
//! the model through a [`ModelFiles`] and builds chapter 8's matrices over views of its bytes.

use super::{GgufFiles, LoadMode, ModelFiles, Opened};
use crate::loader::ViewLoader;
use crate::mapped::{MappedFile, PageAdvice, ReleasePages, SharedBytes};
use ch01::{Gguf, GgufFile};
use ch02::{ChatTemplate, Tokenizer};
use ch04::{Architectures, ForwardError, Model};
use ch07::SchedulerError;
use ch08::FastLoader;
use std::error::Error;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A loaded model with its tokenizer and chat template. It needs nothing more of the file
/// object: the matrices hold the map (or the read buffer) alive themselves.
pub struct Engine {
    pub model: Model,
    pub tokenizer: Tokenizer,
    /// `None` when the file has no `tokenizer.chat_template`.
    pub template: Option<ChatTemplate>,
    /// Open to ready: mapping (or reading), parsing, tokenizer, matrices.
    pub load_time: Duration,
    pub mode: LoadMode,
    /// Whether the matrices were repacked for chapter 8's micro-kernel (a private copy).
    pub repacked: bool,
    /// The mapped file, when mapped: asked whether it changed when something goes wrong.
    pub mapped: Option<Arc<MappedFile>>,
}

// ANCHOR: load
impl Engine {
    /// Load the model at `path`, of one of the architectures `archs`, its matrices made by
    /// `fast` over the file's bytes.
    pub fn load(
        path: &Path,
        mode: LoadMode,
        fast: FastLoader,
        archs: &Architectures,
    ) -> Result<Engine, Box<dyn Error>> {
        Engine::load_reporting(path, mode, fast, archs, Box::new(|_, _| {}))
    }

    /// As [`Engine::load`], calling `progress(bytes loaded, file size)` after each matrix.
    pub fn load_reporting(
        path: &Path,
        mode: LoadMode,
        fast: FastLoader,
        archs: &Architectures,
        progress: Box<dyn Fn(u64, u64)>,
    ) -> Result<Engine, Box<dyn Error>> {
        Engine::open(&GgufFiles, path, mode, fast, archs, progress)
    }

    // ANCHOR_END: load

    // ANCHOR: open
    /// As [`Engine::load_reporting`], the model at `path` opened by `files`.
    pub fn open(
        files: &dyn ModelFiles,
        path: &Path,
        mode: LoadMode,
        fast: FastLoader,
        archs: &Architectures,
        progress: Box<dyn Fn(u64, u64)>,
    ) -> Result<Engine, Box<dyn Error>> {
        let t0 = Instant::now();
        let repacked = fast.pack && ch08::fast_matrix::packs(&fast.kernels);
        let (model, gguf, mapped, mode) = match files.open(path, mode)? {
            Opened::Mapped(file, bytes) => {
                let mapped = Arc::clone(bytes.owner());
                // A file rewritten while we read it explains a failure better than the
                // failure itself does.
                let (model, gguf) = build(path, file, bytes, fast, archs, progress)
                    .map_err(|e| mapped.check_unchanged().map_or_else(|c| c.into(), |()| e))?;
                (model, gguf, Some(mapped), mode)
            }
            Opened::Held(file, bytes) => {
                let (model, gguf) = build(path, file, bytes, fast, archs, progress)?;
                (model, gguf, None, mode)
            }
        };
        let tokenizer = Tokenizer::from_gguf(&gguf).map_err(|e| in_file(path, e))?;
        let template = ChatTemplate::from_gguf(&gguf)
            .ok()
            .or_else(|| arch_template(&gguf, archs));
        Ok(Engine {
            model,
            tokenizer,
            template,
            load_time: t0.elapsed(),
            mode,
            repacked,
            mapped,
        })
    }
    // ANCHOR_END: open

    /// `e`, or — if the mapped file changed since it was mapped, the likelier cause — that.
    pub fn explain(&self, e: Box<dyn Error>) -> Box<dyn Error> {
        match self.mapped.as_ref().map(|m| m.check_unchanged()) {
            Some(Err(changed)) => changed.into(),
            _ => e,
        }
    }

    /// A failed scheduler step, explained: non-finite logits are traced to the first tensor
    /// that went bad, and a mapped file that changed is named as the likelier cause.
    pub fn explain_step(&self, e: SchedulerError) -> Box<dyn Error> {
        let e: Box<dyn Error> = match e {
            SchedulerError::Forward(ForwardError::NonFinite(e)) => {
                e.locate(&self.model).to_string().into()
            }
            e => e.into(),
        };
        self.explain(e)
    }

    /// One line saying what was loaded and how.
    pub fn describe(&self, path: &Path) -> String {
        let c = &self.model.config;
        let how = match self.mode {
            LoadMode::Read => "read into memory".to_string(),
            LoadMode::Map(o) => {
                let mut s = "memory-mapped".to_string();
                if o.advice != PageAdvice::Normal {
                    s += &format!(", madvise {:?}", o.advice);
                }
                if o.populate {
                    s += ", populated";
                }
                if o.lock {
                    s += ", locked";
                }
                s
            }
        };
        format!(
            "model: {} ({how}; {} layers, d_model {}, {}; loaded in {:.1} ms)",
            path.display(),
            c.n_layer,
            c.d_model,
            self.model.describe_weights(),
            self.load_time.as_secs_f64() * 1e3
        )
    }
}

/// The model over views of `bytes` (the image of `file`), and the header for the tokenizer.
fn build<O: AsRef<[u8]> + ReleasePages + Send + Sync + 'static>(
    path: &Path,
    file: GgufFile<SharedBytes<O>>,
    bytes: SharedBytes<O>,
    fast: FastLoader,
    archs: &Architectures,
    progress: Box<dyn Fn(u64, u64)>,
) -> Result<(Model, Gguf), Box<dyn Error>> {
    let compute = fast.compute();
    let loader = ViewLoader::new(bytes, fast).with_progress(progress);
    let model = Model::load(&file, &loader, archs)
        .map_err(|e| in_file(path, e))?
        .with_compute(compute);
    Ok((model, file.gguf))
}

/// The chat template of the file's architecture, for a file without `tokenizer.chat_template`
/// (Gemma 3's GGUF files carry none; llama.cpp falls back to a built-in one the same way).
pub(super) fn arch_template(gguf: &Gguf, archs: &Architectures) -> Option<ChatTemplate> {
    let source = archs.get(gguf.architecture().ok()?)?.chat_template?;
    ChatTemplate::with_tokens_of(gguf, source).ok()
}

pub(super) fn in_file(path: &Path, e: impl std::fmt::Display) -> Box<dyn Error> {
    format!("{}: {e}", path.display()).into()
}
