//! The forward pass on the GPU: every layer resident, one submit per call.
//!
//! [`GpuModel::load`] finds the file's architecture in the [`GpuArchitectures`] it is given
//! (refusing one that is not there, by name), lets that architecture upload its
//! [`GpuBlocks`], uploads the frame around them (embeddings, final norm, output), allocates
//! the memory pool ([`Pool`]: the activations for the largest batch, the KV cache for `n_ctx`
//! positions) and builds the list of [`Op`]s of a forward pass — pipelines, bind groups,
//! parameters — once: the frame's, with the blocks' in the middle. A forward call then writes
//! the token ids and the [`Step`] (two small uploads), records the ops into one command
//! encoder, copies the wanted logits into a staging buffer, submits, and waits for that one
//! read. Nothing else crosses the bus: the residual stream, the keys and values stay in GPU
//! memory.
//!
//! The model is also a chapter 4 [`Session`]: its KV cache lives on the GPU, so it remembers
//! the sequence between calls as chapter 5's cached session does, and chapter 4's `generate`
//! drives it unchanged.

use crate::device::{Gpu, GpuError, Readback, View};
use crate::gpu_arch::{GpuArchitectures, GpuBlocks, GpuCtx};
use crate::gpu_kernels::{Count, Op, OpBuilder, Step};
use crate::weights::GpuMatrix;
use ch01::Config;
use ch01::GgufFile;
use ch01::config::RopeStyle;
use ch03::matrix::load_vector;
use ch03::{Attention, KvError, RopeTable};
use ch04::{ForwardError, Session, check_context};
use std::sync::Arc;

/// How much a [`GpuModel`] holds.
#[derive(Debug, Clone, Copy)]
pub struct GpuOptions {
    /// Positions of the KV cache and the RoPE table; the model's default context when `None`.
    pub n_ctx: Option<usize>,
    /// The largest batch of tokens one forward call takes (longer prompts go in chunks).
    pub max_batch: usize,
}

impl Default for GpuOptions {
    fn default() -> Self {
        GpuOptions {
            n_ctx: None,
            max_batch: 256,
        }
    }
}

// ANCHOR: pool
/// Every activation of a forward pass and the KV cache: allocated once, at load, sized by the
/// largest batch and the context. Each is a buffer of its own: within one dispatch WebGPU
/// lets a buffer be bound either read-only or writable, as a whole, so a kernel that reads `h`
/// and writes `q` cannot have both in one buffer. The cache is one buffer per layer for K and
/// one for V.
pub struct Pool {
    pub x: View,            // (max_batch, d_model): the residual stream
    pub h: View,            // (max_batch, d_model): normalised input of a sub-block
    pub y: View,            // (max_batch, d_model): output of a sub-block
    pub q: View,            // (max_batch, n_head * head_dim)
    pub k: View,            // (max_batch, n_head_kv * head_dim)
    pub v: View,            // (max_batch, n_head_kv * head_dim)
    pub attn: View,         // (max_batch, n_head * head_dim)
    pub gate: View,         // (max_batch, n_ff)
    pub up: View,           // (max_batch, n_ff)
    pub normed: View,       // (max_batch, d_model): final norm of the rows whose logits are wanted
    pub logits: View,       // (max_batch, vocab)
    pub ids: View,          // (max_batch) u32: the batch's token ids
    pub k_cache: Vec<View>, // n_layer × (n_ctx, n_head_kv * head_dim)
    pub v_cache: Vec<View>, // n_layer × (n_ctx, n_head_kv * head_dim)
    /// Bytes of GPU memory the pool takes.
    pub bytes: u64,
}
// ANCHOR_END: pool

impl Pool {
    fn new(gpu: &Gpu, cfg: &Config, n_ctx: usize, max_batch: usize) -> Result<Pool, GpuError> {
        let (d, qd, kvd) = (cfg.d_model, cfg.n_head * cfg.head_dim, cfg.kv_dim());
        let b = max_batch as u64;
        let sizes = [
            ("x", b * d as u64),
            ("h", b * d as u64),
            ("y", b * d as u64),
            ("q", b * qd as u64),
            ("k", b * kvd as u64),
            ("v", b * kvd as u64),
            ("attn", b * qd as u64),
            ("gate", b * cfg.n_ff as u64),
            ("up", b * cfg.n_ff as u64),
            ("normed", b * d as u64),
            ("logits", b * cfg.vocab_size as u64),
            ("ids", b),
        ];
        let mut total = 0u64;
        let mut v = Vec::with_capacity(sizes.len());
        for (name, n) in sizes {
            v.push(gpu.zeros(name, 4 * n)?);
            total += 4 * n;
        }
        let cache_bytes = (n_ctx * kvd * 4) as u64;
        let mut k_cache = Vec::with_capacity(cfg.n_layer);
        let mut v_cache = Vec::with_capacity(cfg.n_layer);
        for l in 0..cfg.n_layer {
            k_cache.push(gpu.zeros(&format!("k_cache-{l}"), cache_bytes)?);
            v_cache.push(gpu.zeros(&format!("v_cache-{l}"), cache_bytes)?);
        }
        let mut it = v.into_iter();
        let mut next = || it.next().expect("one view per size");
        Ok(Pool {
            x: next(),
            h: next(),
            y: next(),
            q: next(),
            k: next(),
            v: next(),
            attn: next(),
            gate: next(),
            up: next(),
            normed: next(),
            logits: next(),
            ids: next(),
            k_cache,
            v_cache,
            bytes: total + 2 * cfg.n_layer as u64 * cache_bytes,
        })
    }
}

/// The RoPE angles of chapter 3's table for heads of `head_dim` with `n_rot` rotated dims,
/// `(n_pos, n_rot / 2, 2)`: cos, sin. They are read out of the [`RopeTable`] by rotating unit
/// vectors (`(1, 0)` turns into `(cos θ, sin θ)` exactly), so the GPU uses chapter 3's angles
/// to the last bit.
pub fn rope_cos_sin(rope: &RopeTable, head_dim: usize, n_rot: usize, style: RopeStyle) -> Vec<f32> {
    let half = n_rot / 2;
    let pair = |i: usize| match style {
        RopeStyle::Normal => (2 * i, 2 * i + 1),
        RopeStyle::Neox => (i, i + half),
    };
    let mut head = vec![0.0f32; head_dim]; // (head_dim): one head
    let mut table = Vec::with_capacity(rope.n_pos() * half * 2);
    for pos in 0..rope.n_pos() {
        head.fill(0.0);
        for i in 0..half {
            head[pair(i).0] = 1.0;
        }
        rope.apply(&mut head, head_dim, pos);
        for i in 0..half {
            let (a, b) = pair(i);
            table.push(head[a]);
            table.push(head[b]);
        }
    }
    table
}

/// A model on the GPU, with its KV cache: a [`Session`] over one sequence.
pub struct GpuModel {
    pub gpu: Arc<Gpu>,
    pub config: Config,
    pub n_ctx: usize,
    pub max_batch: usize,
    pub token_embd: GpuMatrix, // (vocab, d_model)
    /// The architecture's layers, between the embeddings and the output.
    pub blocks: Box<dyn GpuBlocks>,
    pub output_norm: View, // (d_model) f32
    /// `(vocab, d_model)`; `None` when tied to `token_embd`.
    pub output: Option<GpuMatrix>,
    pub rope: View, // (n_ctx, n_rot / 2, 2) f32
    pub pool: Pool,
    builder_step: wgpu::Buffer,
    ops: Vec<Op>,
    readback: Readback,
    logits: Vec<f32>, // (max_batch, vocab): the last call's logits, on the host
    /// Positions of the sequence already in the KV cache.
    pub n_past: usize,
}

impl GpuModel {
    /// Load the model of `file`, whose architecture must be one of `archs`, onto `gpu`: the
    /// architecture's loader reads the configuration and uploads the blocks, and the frame is
    /// loaded around them.
    pub fn load<B: AsRef<[u8]>>(
        gpu: Arc<Gpu>,
        file: &GgufFile<B>,
        archs: &GpuArchitectures,
        opts: GpuOptions,
    ) -> Result<GpuModel, GpuError> {
        // Refused by name, in chapter 4's words.
        let arch = archs
            .of(&file.gguf)
            .map_err(|e| GpuError::Unsupported(e.to_string()))?;
        if opts.max_batch == 0 {
            return Err(GpuError::Unsupported("a largest batch of 0 tokens".into()));
        }
        let (cfg, blocks) = (arch.load)(&gpu, &file.borrowed())?;
        // After the blocks, as on the CPU: their shapes have confirmed the widths the
        // metadata states, which size the pool with the context.
        let n_ctx = opts.n_ctx.unwrap_or(cfg.default_context());
        check_context(&cfg, n_ctx).map_err(|e| GpuError::Unsupported(e.to_string()))?;
        let max_batch = opts.max_batch.min(n_ctx);
        let (d, vocab) = (cfg.d_model, cfg.vocab_size);
        let matrix = |name: &str| GpuMatrix::load(&gpu, file, name, d, vocab);
        let token_embd = matrix("token_embd.weight")?;
        let output_norm = gpu.upload_f32(
            "output_norm.weight",
            &load_vector(file, "output_norm.weight", d)?,
        )?;
        let output = if cfg.tied_embeddings {
            None
        } else {
            Some(matrix("output.weight")?)
        };
        // Chapter 3's table, with the file's RoPE scaling and frequency factors.
        let attention = Attention::load(file, &cfg, n_ctx)?;
        let rope = gpu.upload_f32(
            "rope",
            &rope_cos_sin(&attention.rope, cfg.head_dim, cfg.rope_dim, cfg.rope_style),
        )?;
        let pool = Pool::new(&gpu, &cfg, n_ctx, max_batch)?;
        let builder = OpBuilder::new(&gpu);
        let ctx = GpuCtx {
            config: &cfg,
            attention: &attention,
            rope: &rope,
            pool: &pool,
        };
        let output_matrix = output.as_ref().unwrap_or(&token_embd);
        let ops = build_ops(
            &builder,
            &ctx,
            &*blocks,
            &token_embd,
            &output_norm,
            output_matrix,
        )?;
        let readback = Readback::new(&gpu, pool.logits.size);
        let builder_step = builder.step;
        Ok(GpuModel {
            logits: vec![0.0; max_batch * vocab],
            gpu,
            config: cfg,
            n_ctx,
            max_batch,
            token_embd,
            blocks,
            output_norm,
            output,
            rope,
            pool,
            builder_step,
            ops,
            readback,
            n_past: 0,
        })
    }

    /// The weights' types and the adapter, for diagnostics.
    pub fn describe(&self) -> String {
        format!("{} on {}", self.blocks.describe(), self.gpu.describe())
    }

    /// Forget the sequence: the next call starts at position 0.
    pub fn reset(&mut self) {
        self.n_past = 0;
    }

    fn check(&self, tokens: &[u32], start_pos: usize) -> Result<(), GpuError> {
        if tokens.is_empty() || tokens.len() > self.max_batch {
            return Err(GpuError::Unsupported(format!(
                "a batch of {} tokens: one call takes 1 to {}",
                tokens.len(),
                self.max_batch
            )));
        }
        ForwardError::check_tokens(tokens, self.config.vocab_size)?;
        let end = start_pos + tokens.len();
        if end > self.n_ctx {
            return Err(ForwardError::Kv(KvError::Full {
                seq: 0,
                needed: end,
                capacity: self.n_ctx,
            })
            .into());
        }
        Ok(())
    }

    // ANCHOR: forward
    /// Run `tokens` at positions `start_pos..`, their keys and values stored in the cache (which
    /// must hold the positions before `start_pos`). Returns the logits of the last token
    /// (`(vocab)`), or of every token when `all_logits` (`(n, vocab)`).
    pub fn forward(
        &mut self,
        tokens: &[u32],
        start_pos: usize,
        all_logits: bool,
    ) -> Result<&[f32], GpuError> {
        self.check(tokens, start_pos)?;
        let n = tokens.len() as u32;
        let step = Step {
            n_tokens: n,
            start_pos: start_pos as u32,
            n_out: if all_logits { n } else { 1 },
            out_row0: if all_logits { 0 } else { n - 1 },
        };
        let out_len = step.n_out as usize * self.config.vocab_size;
        self.submit(tokens, &step)?;
        self.readback.read(&self.gpu, &mut self.logits[..out_len])?;
        Ok(&self.logits[..out_len])
    }

    /// Write the ids and the step, record every op into one compute pass, copy the logits
    /// out, submit.
    fn submit(&mut self, tokens: &[u32], step: &Step) -> Result<(), GpuError> {
        let queue = &self.gpu.queue;
        queue.write_buffer(
            &self.pool.ids.buffer,
            self.pool.ids.offset,
            bytemuck::cast_slice(tokens),
        );
        queue.write_buffer(&self.builder_step, 0, bytemuck::bytes_of(step));
        let mut enc = self.gpu.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            for op in &self.ops {
                op.record(&mut pass, step);
            }
        }
        let out_bytes = (step.n_out as usize * self.config.vocab_size * 4) as u64;
        if out_bytes > 0 {
            self.readback
                .copy_from(&mut enc, &self.pool.logits, out_bytes);
        }
        queue.submit([enc.finish()]);
        Ok(())
    }
    // ANCHOR_END: forward

    /// Run `tokens` (any number) at `start_pos..` in chunks of the largest batch; the logits
    /// of the last token.
    pub fn prefill(&mut self, tokens: &[u32], start_pos: usize) -> Result<&[f32], GpuError> {
        let (mut pos, n) = (start_pos, tokens.len());
        for chunk in tokens.chunks(self.max_batch) {
            if pos + chunk.len() == start_pos + n {
                break;
            }
            self.check(chunk, pos)?;
            let step = Step {
                n_tokens: chunk.len() as u32,
                start_pos: pos as u32,
                n_out: 0,
                out_row0: 0,
            };
            self.submit(chunk, &step)?;
            pos += chunk.len();
        }
        let last = &tokens[pos - start_pos..];
        self.forward(last, pos, false)
    }
}

/// The ops of a whole forward pass, in order: the frame's, with the blocks' between.
fn build_ops(
    b: &OpBuilder,
    ctx: &GpuCtx<'_>,
    blocks: &dyn GpuBlocks,
    token_embd: &GpuMatrix,
    output_norm: &View,
    output: &GpuMatrix,
) -> Result<Vec<Op>, GpuError> {
    let (p, d, eps) = (ctx.pool, ctx.config.d_model, ctx.config.rms_norm_eps);
    // ANCHOR: ops
    let mut ops = vec![b.get_rows(token_embd, &p.ids, &p.x)?];
    blocks.build_ops(b, ctx, &mut ops)?;
    // Only the rows whose logits are wanted: the last token's, or all.
    ops.push(b.rms_norm(&p.x, output_norm, &p.normed, d, eps, Count::Out)?);
    ops.push(b.mul_mat(output, &p.normed, &p.logits, Count::Out, None)?);
    // ANCHOR_END: ops
    Ok(ops)
}

// ANCHOR: session
impl Session for GpuModel {
    /// The GPU's own failures (a lost device, a failed submission) beside chapter 4's.
    type Error = GpuError;

    fn next_logits(&mut self, tokens: &[u32], n_new: usize) -> Result<&[f32], GpuError> {
        let start = tokens.len() - n_new;
        if start != self.n_past {
            return Err(ForwardError::Kv(KvError::Gap {
                seq: 0,
                have: self.n_past,
                start,
            })
            .into());
        }
        self.prefill(&tokens[start..], start)?;
        self.n_past = tokens.len();
        Ok(&self.logits[..self.config.vocab_size])
    }
}
// ANCHOR_END: session
