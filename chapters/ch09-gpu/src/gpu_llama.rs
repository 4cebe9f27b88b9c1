//! Llama's blocks on the GPU: chapter 4's [`Llama`](ch04::llama::Llama), launch for launch.
//!
//! Each block is pre-norm attention and a pre-norm SwiGLU feed-forward network, each added back
//! to the residual stream, as on the CPU:
//!
//! ```text
//! h = x + attention(rms_norm(x))
//! x = h + ffn(rms_norm(h))
//! ```
//!
//! The file is held to chapter 4's rule (every tensor one these blocks or the frame use), and
//! the optional biases of the attention projections, which chapter 3 runs on the CPU and no
//! kernel here does, are refused rather than dropped.

use crate::device::{Gpu, GpuError, View};
use crate::gpu_arch::{GpuArchitecture, GpuBlocks, GpuCtx};
use crate::gpu_kernels::{Count, Op, OpBuilder};
use crate::weights::GpuMatrix;
use ch01::config::RopeStyle;
use ch01::{Config, GgufFile};
use ch03::matrix::{LoadError, load_vector};
use ch04::llama::{self, check_all_used};

/// Llama in a set of [`GpuArchitectures`](crate::GpuArchitectures).
pub const ARCHITECTURE: GpuArchitecture = GpuArchitecture {
    name: llama::NAME,
    load,
};

/// The weights of one block, on the GPU.
pub struct GpuLayer {
    pub attn_norm: View, // (d_model) f32
    pub wq: GpuMatrix,   // (n_head * head_dim, d_model)
    pub wk: GpuMatrix,   // (n_head_kv * head_dim, d_model)
    pub wv: GpuMatrix,   // (n_head_kv * head_dim, d_model)
    pub wo: GpuMatrix,   // (d_model, n_head * head_dim)
    pub ffn_norm: View,  // (d_model) f32
    pub gate: GpuMatrix, // (n_ff, d_model)
    pub up: GpuMatrix,   // (n_ff, d_model)
    pub down: GpuMatrix, // (d_model, n_ff)
}

/// Llama's blocks on the GPU: `n_layer` of them.
pub struct GpuLlama {
    pub layers: Vec<GpuLayer>,
}

/// Read a llama file's configuration and upload its blocks.
pub fn load(gpu: &Gpu, file: &GgufFile<&[u8]>) -> Result<(Config, Box<dyn GpuBlocks>), GpuError> {
    let config = Config::from_gguf(&file.gguf, &[llama::NAME])
        .map_err(|e| LoadError::Other(e.to_string()))?;
    let blocks = GpuLlama::load(gpu, file, &config)?;
    Ok((config, Box::new(blocks)))
}

impl GpuLlama {
    /// Llama's blocks for `config`, uploaded from `file`: llama itself, or an architecture
    /// that differs from it only in its metadata. Checked before anything is uploaded.
    pub fn load<B: AsRef<[u8]>>(
        gpu: &Gpu,
        file: &GgufFile<B>,
        cfg: &Config,
    ) -> Result<GpuLlama, GpuError> {
        // Every tensor must be one llama's blocks use (chapter 4's rule), and the optional
        // biases are not run here: refuse them rather than compute another model.
        check_all_used(file, cfg)?;
        if let Some(t) = file.gguf.tensors.iter().find(|t| t.name.ends_with(".bias")) {
            return Err(GpuError::Unsupported(format!(
                "tensor {:?}: the GPU forward pass has no biases (run without --gpu)",
                t.name
            )));
        }
        let (d, qd, kvd, ff) = (
            cfg.d_model,
            cfg.n_head * cfg.head_dim,
            cfg.kv_dim(),
            cfg.n_ff,
        );
        let matrix = |name: &str, cols, rows| GpuMatrix::load(gpu, file, name, cols, rows);
        let vector = |name: &str| -> Result<View, GpuError> {
            gpu.upload_f32(name, &load_vector(file, name, d)?)
        };
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for l in 0..cfg.n_layer {
            let n = |t: &str| format!("blk.{l}.{t}.weight");
            layers.push(GpuLayer {
                attn_norm: vector(&n("attn_norm"))?,
                wq: matrix(&n("attn_q"), d, qd)?,
                wk: matrix(&n("attn_k"), d, kvd)?,
                wv: matrix(&n("attn_v"), d, kvd)?,
                wo: matrix(&n("attn_output"), qd, d)?,
                ffn_norm: vector(&n("ffn_norm"))?,
                gate: matrix(&n("ffn_gate"), d, ff)?,
                up: matrix(&n("ffn_up"), d, ff)?,
                down: matrix(&n("ffn_down"), ff, d)?,
            });
        }
        Ok(GpuLlama { layers })
    }
}

impl GpuBlocks for GpuLlama {
    /// Sixteen launches per block: the GPU's version of chapter 4's llama layer.
    fn build_ops(
        &self,
        b: &OpBuilder,
        ctx: &GpuCtx<'_>,
        ops: &mut Vec<Op>,
    ) -> Result<(), GpuError> {
        let (cfg, p, rope) = (ctx.config, ctx.pool, ctx.rope);
        let (d, hd, eps) = (cfg.d_model, cfg.head_dim, cfg.rms_norm_eps);
        let (kvd, ff) = (cfg.kv_dim(), cfg.n_ff);
        let (n_rot, neox) = (cfg.rope_dim, cfg.rope_style == RopeStyle::Neox);
        let (window, kq_scale) = (ctx.attention.window, ctx.attention.kq_scale);
        let t = Count::Tokens;
        // ANCHOR: ops
        for (l, w) in self.layers.iter().enumerate() {
            ops.push(b.rms_norm(&p.x, &w.attn_norm, &p.h, d, eps, t)?);
            ops.push(b.mul_mat(&w.wq, &p.h, &p.q, t, None)?);
            ops.push(b.mul_mat(&w.wk, &p.h, &p.k, t, None)?);
            ops.push(b.mul_mat(&w.wv, &p.h, &p.v, t, None)?);
            ops.push(b.rope(&p.q, rope, cfg.n_head, hd, n_rot, neox)?);
            ops.push(b.rope(&p.k, rope, cfg.n_head_kv, hd, n_rot, neox)?);
            ops.push(b.set_rows(&p.k, &p.v, &p.k_cache[l], &p.v_cache[l], kvd)?);
            ops.push(b.attention(
                &p.q,
                &p.k_cache[l],
                &p.v_cache[l],
                &p.attn,
                cfg.n_head,
                cfg.n_head_kv,
                hd,
                window,
                kq_scale,
            )?);
            ops.push(b.mul_mat(&w.wo, &p.attn, &p.y, t, None)?);
            ops.push(b.add(&p.x, &p.y, d)?); // residual connection
            ops.push(b.rms_norm(&p.x, &w.ffn_norm, &p.h, d, eps, t)?);
            ops.push(b.mul_mat(&w.gate, &p.h, &p.gate, t, None)?);
            ops.push(b.mul_mat(&w.up, &p.h, &p.up, t, None)?);
            ops.push(b.swiglu(&p.gate, &p.up, ff)?);
            ops.push(b.mul_mat(&w.down, &p.gate, &p.y, t, None)?);
            ops.push(b.add(&p.x, &p.y, d)?); // residual connection
        }
        // ANCHOR_END: ops
        Ok(())
    }

    fn describe(&self) -> String {
        match self.layers.first() {
            Some(l) => l.wq.ty.name().to_string(),
            None => "no layers".to_string(),
        }
    }
}
