//! The seam for model families: how an architecture other than llama plugs into [`Model`].
//!
//! Llama's blocks are this chapter's forward pass, and stay as they are. Another architecture
//! (chapter 13 adds Gemma 3) differs inside the blocks — extra norms, another activation,
//! sliding-window layers — but shares what is around them: token embeddings, the final norm,
//! the output projection, the KV cache, the scheduler, the server. So a family supplies two
//! things, as llama.cpp's per-architecture graph builders do:
//!
//! - a [`Family`]: its own layer weights and the code that runs them over the residual stream,
//!   called by [`Model::forward_with`] in place of llama's loop;
//! - a [`FamilyInfo`] in the registry: the loader that builds a [`Model`] with that `Family`
//!   from a GGUF file whose `general.architecture` it names, and a default chat template for
//!   files that carry none. [`Model::load`] looks the architecture up here, so every later
//!   chapter (the engine, the server) runs the family once it is registered.

use crate::compute::Scratch;
use crate::model::{Batch, Model};
use ch03::matrix::{LoadError, MatrixLoader};
use ch03::{Attention, Config, GgufFile, KvDyn, Observer};
use std::sync::RwLock;

// ANCHOR: family
/// The blocks of an architecture other than llama.
pub trait Family: Send + Sync {
    /// Run every block over the residual stream `s.x` (`(n, d_model)`, the token embeddings
    /// on entry), in place, for the tokens of `batch`: keys and values go to `kv`, which has
    /// room for them. The other buffers of `s` are the family's to use.
    fn blocks(
        &self,
        model: &Model,
        batch: &Batch,
        kv: &mut dyn KvDyn,
        obs: &mut dyn Observer,
        s: &mut Scratch,
    );

    /// Rebuild what depends on the run's context of `n_ctx` positions (RoPE tables).
    /// `attention` is the model's, its RoPE table just resized to `n_ctx` positions: the
    /// family adjusts it if its layers use it differently.
    fn set_context(
        &mut self,
        config: &Config,
        n_ctx: usize,
        attention: &mut Attention,
    ) -> Result<(), LoadError>;

    /// Change the logits `(n_out, vocab)` after the output projection (Gemma's soft cap);
    /// nothing by default.
    fn finish_logits(&self, logits: &mut [f32]) {
        let _ = logits;
    }

    /// The weights' types, for diagnostics, e.g. `"Q5_0"`.
    fn describe(&self) -> String;
}
// ANCHOR_END: family

/// Builds a model of one family from a GGUF file (its tensors read through `loader`).
pub type LoadFamily = fn(&GgufFile<&[u8]>, &dyn MatrixLoader) -> Result<Model, LoadError>;

/// A registered family: the architecture it runs, its loader and a chat template for files
/// that lack `tokenizer.chat_template`.
#[derive(Clone, Copy)]
pub struct FamilyInfo {
    /// `general.architecture`, e.g. `"gemma3"`.
    pub arch: &'static str,
    pub load: LoadFamily,
    /// Jinja source of the family's chat template, used when the file has none.
    pub chat_template: Option<&'static str>,
}

static FAMILIES: RwLock<Vec<FamilyInfo>> = RwLock::new(Vec::new());

/// Make `info`'s architecture loadable by [`Model::load`] (replacing an earlier registration
/// of the same architecture).
pub fn register(info: FamilyInfo) {
    let mut families = FAMILIES.write().unwrap_or_else(|e| e.into_inner());
    families.retain(|f| f.arch != info.arch);
    families.push(info);
}

/// The registered family of `arch`, if any.
pub fn lookup(arch: &str) -> Option<FamilyInfo> {
    let families = FAMILIES.read().unwrap_or_else(|e| e.into_inner());
    families.iter().find(|f| f.arch == arch).copied()
}

/// Every architecture [`Model::load`] runs: llama and the registered families.
pub fn supported() -> Vec<&'static str> {
    let families = FAMILIES.read().unwrap_or_else(|e| e.into_inner());
    let mut archs = vec!["llama"];
    archs.extend(families.iter().map(|f| f.arch));
    archs
}
