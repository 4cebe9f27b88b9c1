//! Architectures as values: what a model's blocks are, and the set of architectures a loader
//! knows.
//!
//! Every decoder-only model this book runs has the same frame — token embeddings in, the
//! final norm and the output projection out, a KV cache, a scheduler, a server around it —
//! and differs inside the blocks between: which norms, which activation, which attention.
//! So an architecture is two things:
//!
//! - its [`Blocks`]: the weights of its layers and the code that runs them over the residual
//!   stream. [`Model::forward_with`](crate::Model::forward_with) calls them between the
//!   embeddings and the output, handing in what they need ([`Ctx`]: the configuration, the
//!   attention hyperparameters with their RoPE table, the compute seam);
//! - an [`Architecture`]: its `general.architecture` name, the loader that reads its
//!   configuration and builds its blocks, and a chat template for files that carry none.
//!
//! [`Model::load`](crate::Model::load) is given an [`Architectures`] value — the set it may
//! load — and builds the model of whichever one the file names. This chapter's set is
//! [`architectures()`](crate::architectures): llama ([`crate::llama`]), the only one so far.
//! A trait with one implementation costs a virtual call per forward pass and buys this: a
//! later chapter adds an architecture by building a bigger set and passing it in, without
//! editing this one.

use crate::batch::Batch;
use crate::compute::{Compute, Scratch};
use ch01::{Config, Gguf, GgufFile};
use ch03::matrix::{LoadError, MatrixLoader};
use ch03::{Attention, KvDyn, Observer};
use std::any::Any;

/// What the blocks of a model need from the model around them.
pub struct Ctx<'a> {
    pub config: &'a Config,
    /// The model's attention hyperparameters and RoPE table.
    pub attention: &'a Attention,
    /// How the non-product work runs.
    pub compute: &'a dyn Compute,
}

// ANCHOR: blocks
/// The blocks of an architecture: its layers' weights and how they run.
pub trait Blocks: Any + Send + Sync {
    /// Run every block over the residual stream `s.x` (`(n, d_model)`, the token embeddings
    /// on entry), in place, for the tokens of `batch`: keys and values go to `kv`, which has
    /// room for them. The other buffers of `s` are the blocks' to use.
    fn forward(
        &self,
        ctx: &Ctx<'_>,
        batch: &Batch,
        kv: &mut dyn KvDyn,
        obs: &mut dyn Observer,
        s: &mut Scratch,
    );

    /// The run's context is now `n_ctx` positions, and the model's attention has a RoPE
    /// table of that size: rebuild whatever else of the blocks' own depends on it (a second
    /// table, say). Also called once when the model is assembled. Nothing by default.
    fn set_context(&mut self, config: &Config, n_ctx: usize) -> Result<(), LoadError> {
        let _ = (config, n_ctx);
        Ok(())
    }

    /// The weights' types, for diagnostics, e.g. `"Q4_1"`.
    fn describe(&self) -> String;
}
// ANCHOR_END: blocks

// ANCHOR: architecture
/// Reads an architecture's configuration from a file and builds its blocks, their matrices
/// made by the loader. The model's frame (embeddings, final norm, output) is loaded around
/// them by [`Model::load`](crate::Model::load).
pub type LoadBlocks =
    fn(&GgufFile<&[u8]>, &dyn MatrixLoader) -> Result<(Config, Box<dyn Blocks>), LoadError>;

/// One architecture a loader can build.
#[derive(Clone, Copy)]
pub struct Architecture {
    /// `general.architecture`, e.g. `"llama"`.
    pub name: &'static str,
    pub load: LoadBlocks,
    /// Jinja source of the architecture's chat template, for files without
    /// `tokenizer.chat_template`.
    pub chat_template: Option<&'static str>,
}

/// A set of architectures, passed to [`Model::load`](crate::Model::load) as a value.
pub type Architectures = ArchSet<Architecture>;
// ANCHOR_END: architecture

/// What a set of architectures finds its members by: `general.architecture`.
pub trait Named {
    fn name(&self) -> &'static str;
}

impl Named for Architecture {
    fn name(&self) -> &'static str {
        self.name
    }
}

/// A set of architectures of any kind, by name: chapter 4's [`Architectures`], and any other
/// loader's (a GPU's, say) that builds something else per architecture.
#[derive(Clone)]
pub struct ArchSet<A>(Vec<A>);

impl<A> Default for ArchSet<A> {
    fn default() -> Self {
        ArchSet(Vec::new())
    }
}

impl<A: Named> std::fmt::Debug for ArchSet<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.names()).finish()
    }
}

// ANCHOR: architecture_set
impl<A: Named> ArchSet<A> {
    /// The empty set.
    pub fn new() -> ArchSet<A> {
        ArchSet(Vec::new())
    }

    /// This set with `arch` added (replacing one of the same name).
    pub fn with(mut self, arch: A) -> ArchSet<A> {
        self.0.retain(|a| a.name() != arch.name());
        self.0.push(arch);
        self
    }

    /// The architecture named `name`, if the set has it.
    pub fn get(&self, name: &str) -> Option<&A> {
        self.0.iter().find(|a| a.name() == name)
    }

    /// The names in the set, in the order they were added.
    pub fn names(&self) -> Vec<&'static str> {
        self.0.iter().map(|a| a.name()).collect()
    }

    /// The architecture `gguf` names: an error naming it and the set when it is not there.
    pub fn of(&self, gguf: &Gguf) -> Result<&A, LoadError> {
        let name = gguf
            .architecture()
            .map_err(|e| LoadError::Other(e.to_string()))?;
        self.get(name).ok_or_else(|| {
            LoadError::Other(format!(
                "architecture {name:?} is not supported (supported: {})",
                self.names().join(", ")
            ))
        })
    }
}
// ANCHOR_END: architecture_set

impl dyn Blocks {
    /// These blocks as their concrete type `B`, if they are one (for tests and diagnostics
    /// that look inside a layer).
    pub fn downcast_ref<B: Blocks>(&self) -> Option<&B> {
        (self as &dyn Any).downcast_ref()
    }
}
