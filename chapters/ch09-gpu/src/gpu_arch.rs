//! Architectures on the GPU as values: chapter 4's seam, for the GPU's forward pass.
//!
//! Chapter 4 split a model into a frame that every decoder-only model shares (token
//! embeddings in, the final norm and the output projection out) and the [`Blocks`] between,
//! which differ by family; a loader is given the set of [`Architectures`] it may build. The
//! GPU path is split the same way:
//!
//! - [`GpuBlocks`]: the weights of an architecture's layers in GPU memory, and the launches
//!   ([`Op`]s) that run them over the residual stream. They are appended once, at load, to the
//!   model's list of ops, between the embedding lookup and the output;
//! - [`GpuArchitecture`]: a `general.architecture` name and the loader that reads that
//!   architecture's configuration and uploads its blocks;
//! - [`GpuArchitectures`]: the set [`GpuModel::load`](crate::GpuModel::load) is given. A file
//!   of an architecture outside it is refused by name, before anything is uploaded.
//!
//! [`GpuModel`](crate::GpuModel) keeps the frame: the embedding lookup, the final norm and the
//! output product, the RoPE table and the [`Pool`] of activations and KV cache. This
//! chapter's set is [`gpu_architectures()`](crate::gpu_architectures): llama
//! ([`crate::gpu_llama`]), whose blocks are chapter 4's, launch for launch. Another family
//! adds its blocks by building a bigger set and passing it in, without editing the model.
//!
//! [`Blocks`]: ch04::Blocks
//! [`Architectures`]: ch04::Architectures

use crate::device::{Gpu, GpuError, View};
use crate::gpu_kernels::{Op, OpBuilder};
use crate::gpu_model::Pool;
use ch01::{Config, GgufFile};
use ch03::Attention;
use ch04::{ArchSet, Named};

/// What the blocks of a GPU model need from the model around them when they build their ops.
pub struct GpuCtx<'a> {
    pub config: &'a Config,
    /// The model's attention hyperparameters (window, score scale), as on the CPU.
    pub attention: &'a Attention,
    pub rope: &'a View, // (n_ctx, n_rot / 2, 2) f32: chapter 3's angles
    /// The activations and the KV cache, allocated by the model at load.
    pub pool: &'a Pool,
}

// ANCHOR: blocks
/// The blocks of an architecture on the GPU: its layers' weights, in GPU memory, and the
/// launches that run them.
pub trait GpuBlocks: Send + Sync {
    /// Append to `ops` the launches of every block over the residual stream `ctx.pool.x`
    /// (`(n_tokens, d_model)`, the token embeddings on entry), in place, with keys and values
    /// stored in the pool's caches. Called once, at load; the list runs on every forward call.
    fn build_ops(&self, b: &OpBuilder, ctx: &GpuCtx<'_>, ops: &mut Vec<Op>)
    -> Result<(), GpuError>;

    /// The weights' types, for diagnostics, e.g. `"Q4_1"`.
    fn describe(&self) -> String;
}

/// Reads an architecture's configuration from a file and uploads its blocks to `gpu`. The
/// model's frame is loaded around them by [`GpuModel::load`](crate::GpuModel::load).
pub type LoadGpuBlocks =
    fn(&Gpu, &GgufFile<&[u8]>) -> Result<(Config, Box<dyn GpuBlocks>), GpuError>;

/// One architecture the GPU path can run.
#[derive(Clone, Copy)]
pub struct GpuArchitecture {
    /// `general.architecture`, e.g. `"llama"`.
    pub name: &'static str,
    pub load: LoadGpuBlocks,
}

/// A set of GPU architectures, passed to [`GpuModel::load`](crate::GpuModel::load) as a value:
/// chapter 4's set of architectures, by name, of GPU ones.
pub type GpuArchitectures = ArchSet<GpuArchitecture>;

impl Named for GpuArchitecture {
    fn name(&self) -> &'static str {
        self.name
    }
}
// ANCHOR_END: blocks
