//! The llama forward pass on the GPU: every layer resident, one submit per call.
//!
//! [`GpuModel::load`] uploads the weights once, allocates the memory pool ([`Pool`]: the
//! activations for the largest batch, the KV cache for `n_ctx` positions) and builds the list
//! of [`Op`]s of a forward pass — pipelines, bind groups, parameters — once. A forward call
//! then writes the token ids and the [`Step`] (two small uploads), records the ops into one
//! command encoder, copies the wanted logits into a staging buffer, submits, and waits for that
//! one read. Nothing else crosses the bus: the residual stream, the keys and values stay in
//! GPU memory.
//!
//! The model is also a chapter 4 [`Session`]: its KV cache lives on the GPU, so it remembers
//! the sequence between calls as chapter 5's cached session does, and chapter 4's `generate`
//! drives it unchanged.

use crate::device::{Gpu, GpuError, Readback, View};
use crate::gpu_kernels::{Count, Op, OpBuilder, Step};
use crate::weights::GpuMatrix;
use ch01::Config;
use ch01::GgufFile;
use ch01::config::RopeStyle;
use ch03::matrix::load_vector;
use ch03::{Attention, KvError, RopeTable};
use ch04::llama::{self, check_all_used};
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

/// A llama model on the GPU, with its KV cache: a [`Session`] over one sequence.
pub struct GpuModel {
    pub gpu: Arc<Gpu>,
    pub config: Config,
    pub n_ctx: usize,
    pub max_batch: usize,
    pub token_embd: GpuMatrix, // (vocab, d_model)
    pub layers: Vec<GpuLayer>,
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
    /// Load a llama-architecture model from `file` onto `gpu`.
    pub fn load<B: AsRef<[u8]>>(
        gpu: Arc<Gpu>,
        file: &GgufFile<B>,
        opts: GpuOptions,
    ) -> Result<GpuModel, GpuError> {
        // The architectures whose blocks these kernels run: chapter 4's llama.
        let cfg = Config::from_gguf(&file.gguf, &[llama::NAME])
            .map_err(|e| GpuError::Unsupported(format!("{e} on the GPU")))?;
        // Every tensor must be one llama's blocks use (chapter 4's rule), and the optional
        // biases are not run here: refuse them rather than compute another model.
        check_all_used(file, &cfg)?;
        if let Some(t) = file.gguf.tensors.iter().find(|t| t.name.ends_with(".bias")) {
            return Err(GpuError::Unsupported(format!(
                "tensor {:?}: the GPU forward pass has no biases (run without --gpu)",
                t.name
            )));
        }
        let n_ctx = opts.n_ctx.unwrap_or(cfg.default_context());
        check_context(&cfg, n_ctx).map_err(|e| GpuError::Unsupported(e.to_string()))?;
        if opts.max_batch == 0 {
            return Err(GpuError::Unsupported("a largest batch of 0 tokens".into()));
        }
        let max_batch = opts.max_batch.min(n_ctx);
        let (d, qd, kvd, ff, vocab) = (
            cfg.d_model,
            cfg.n_head * cfg.head_dim,
            cfg.kv_dim(),
            cfg.n_ff,
            cfg.vocab_size,
        );
        let matrix = |name: &str, cols, rows| GpuMatrix::load(&gpu, file, name, cols, rows);
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
        let token_embd = matrix("token_embd.weight", d, vocab)?;
        let output_norm = vector("output_norm.weight")?;
        let output = if cfg.tied_embeddings {
            None
        } else {
            Some(matrix("output.weight", d, vocab)?)
        };
        // Chapter 3's table, with the file's RoPE scaling and frequency factors.
        let attention = Attention::load(file, &cfg, n_ctx)?;
        let rope = gpu.upload_f32(
            "rope",
            &rope_cos_sin(&attention.rope, cfg.head_dim, cfg.rope_dim, cfg.rope_style),
        )?;
        let pool = Pool::new(&gpu, &cfg, n_ctx, max_batch)?;
        let builder = OpBuilder::new(&gpu);
        let ops = build_ops(
            &builder,
            &cfg,
            &attention,
            &token_embd,
            &layers,
            &output_norm,
            output.as_ref().unwrap_or(&token_embd),
            &rope,
            &pool,
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
            layers,
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
        let w = self.layers.first().map_or(&self.token_embd, |l| &l.wq);
        format!("{} on {}", w.ty.name(), self.gpu.describe())
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

/// The ops of a whole forward pass, in order.
#[allow(clippy::too_many_arguments)]
fn build_ops(
    b: &OpBuilder,
    cfg: &Config,
    attention: &Attention,
    token_embd: &GpuMatrix,
    layers: &[GpuLayer],
    output_norm: &View,
    output: &GpuMatrix,
    rope: &View,
    p: &Pool,
) -> Result<Vec<Op>, GpuError> {
    let (d, hd, eps) = (cfg.d_model, cfg.head_dim, cfg.rms_norm_eps);
    let (kvd, ff) = (cfg.kv_dim(), cfg.n_ff);
    let (n_rot, neox) = (cfg.rope_dim, cfg.rope_style == RopeStyle::Neox);
    let t = Count::Tokens;
    // ANCHOR: ops
    let mut ops = vec![b.get_rows(token_embd, &p.ids, &p.x)?];
    for (l, w) in layers.iter().enumerate() {
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
            attention.window,
            attention.kq_scale,
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
