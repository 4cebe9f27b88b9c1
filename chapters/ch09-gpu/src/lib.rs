//! Chapter 9: the forward pass on a GPU.
//!
//! Chapters 4 to 8 ran the model on the CPU. This chapter runs the same forward pass on a GPU
//! through wgpu (Vulkan, Metal or Direct3D 12), with compute kernels written in WGSL, and
//! plugs it into chapter 4's generation loop as a [`Session`](ch04::Session). What it adds:
//! - [`device`]: [`Gpu`] (an adapter and its device, any backend; when there is none, an
//!   error that lists what was seen), uploads, [`View`] (a range of a buffer), and
//!   [`Readback`] (results back to the host);
//! - [`gpu_kernels`]: the WGSL sources in `src/shaders/` — products on the file's blocks (F32,
//!   F16, Q8_0, Q4_0, Q4_1, Q4_K; `mul_mat_vec` for a few tokens, the tiled `mul_mat` for a
//!   batch), `get_rows`, RMSNorm, RoPE, `set_rows` into the KV cache, attention with an online
//!   softmax, SwiGLU, the residual add — compiled once, and [`Op`], one recorded launch;
//! - [`weights`]: [`GpuMatrix`], a tensor's blocks copied once into GPU memory;
//! - [`gpu_arch`]: chapter 4's architecture seam on the GPU: the [`GpuBlocks`] trait an
//!   architecture's layers implement (their weights, and the launches that run them), and
//!   [`GpuArchitectures`], the set [`GpuModel::load`] is given; a file of any other
//!   architecture is refused by name;
//! - [`gpu_llama`]: llama's blocks, chapter 4's layer launch for launch — this chapter's one
//!   GPU architecture ([`gpu_architectures`]);
//! - [`gpu_model`]: [`GpuModel`], the frame around the blocks (embeddings, final norm,
//!   output), all layers resident, activations and KV cache in a [`Pool`] allocated at load,
//!   one command encoder and one submit per forward call, only the logits read back.
//!
//! Every kernel is checked against the CPU code of earlier chapters (`tests/kernels.rs`), and
//! the whole model against llama.cpp (`tests/model.rs`). The GPU multiplies f32 activations by
//! dequantized weights — it does not quantize the activations to 8 bits as chapter 6's CPU
//! products do — so on the Q4_1 file it computes what llama.cpp computes on an F32 copy of it.
//!
//! Left for later: speed. The kernels are written to be read and checked, not tuned (no
//! subgroup operations, no f16 arithmetic, no integer dot products, no fusion); chapter 10's
//! engine runs on the CPU. And other families: chapter 13's Qwen2 and Gemma 3 run on the CPU
//! only; on the GPU each would be a [`GpuArchitecture`] value with its own blocks, in a
//! bigger set passed to [`GpuModel::load`].

pub mod device;
pub mod gpu_arch;
pub mod gpu_kernels;
pub mod gpu_llama;
pub mod gpu_model;
pub mod weights;

pub use device::{Gpu, GpuError, Readback, View};
pub use gpu_arch::{GpuArchitecture, GpuArchitectures, GpuBlocks, GpuCtx, LoadGpuBlocks};
pub use gpu_kernels::{Count, Grid, Kernel, Op, OpBuilder, Step};
pub use gpu_model::{GpuModel, GpuOptions, Pool};
pub use weights::GpuMatrix;

/// The architectures whose blocks this chapter runs on the GPU: llama.
pub fn gpu_architectures() -> GpuArchitectures {
    GpuArchitectures::new().with(gpu_llama::ARCHITECTURE)
}
