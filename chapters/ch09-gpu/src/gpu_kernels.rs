//! The kernels: WGSL sources, compiled pipelines, and [`Op`], one recorded kernel launch.
//!
//! A kernel that reads weights is written once and combined with the weight type's
//! `dequant8` (in `shaders/<type>.wgsl`) when it is compiled: the source is `step.wgsl`
//! (the per-call [`Step`]), `blocks.wgsl` (the weights binding and byte readers), the type's
//! file, then the kernel. WGSL has no generics; concatenating sources is how ggml's Vulkan
//! backend does the same, with a preprocessor.
//!
//! An [`Op`] is built once, when the model loads: its pipeline, its bind group (the buffers it
//! reads and writes, and a small uniform buffer with its fixed parameters) and how its grid of
//! workgroups follows the batch ([`Grid`]). A forward pass only writes the [`Step`] and
//! replays the list of ops into one command encoder.

use crate::device::{Gpu, GpuError, View};
use crate::weights::{GpuMatrix, supported_types, type_source};
use ch01::GgmlType;
use wgpu::util::DeviceExt;

const STEP: &str = include_str!("shaders/step.wgsl");
const BLOCKS: &str = include_str!("shaders/blocks.wgsl");

/// Every kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// `y = x Wᵀ` for a few tokens: a workgroup per 8 weight rows and token.
    MulMatVec,
    /// `y = x Wᵀ` for a batch: tiles of 32 rows by 16 tokens.
    MulMat,
    /// Rows of a weight matrix, dequantized: the embedding lookup.
    GetRows,
    RmsNorm,
    Rope,
    /// Store a batch's keys and values in the cache.
    SetRows,
    Attention,
    SwiGlu,
    Add,
}

impl Kernel {
    fn name(self) -> &'static str {
        match self {
            Kernel::MulMatVec => "mul_mat_vec",
            Kernel::MulMat => "mul_mat",
            Kernel::GetRows => "get_rows",
            Kernel::RmsNorm => "rms_norm",
            Kernel::Rope => "rope",
            Kernel::SetRows => "set_rows",
            Kernel::Attention => "attention",
            Kernel::SwiGlu => "swiglu",
            Kernel::Add => "add",
        }
    }

    fn source(self) -> &'static str {
        match self {
            Kernel::MulMatVec => include_str!("shaders/mul_mat_vec.wgsl"),
            Kernel::MulMat => include_str!("shaders/mul_mat.wgsl"),
            Kernel::GetRows => include_str!("shaders/get_rows.wgsl"),
            Kernel::RmsNorm => include_str!("shaders/rms_norm.wgsl"),
            Kernel::Rope => include_str!("shaders/rope.wgsl"),
            Kernel::SetRows => include_str!("shaders/set_rows.wgsl"),
            Kernel::Attention => include_str!("shaders/attention.wgsl"),
            Kernel::SwiGlu => include_str!("shaders/swiglu.wgsl"),
            Kernel::Add => include_str!("shaders/add.wgsl"),
        }
    }
}

impl Gpu {
    /// The pipeline of `kernel` (for weights of type `ty`, if it reads weights), compiled on
    /// first use and kept.
    pub fn pipeline(
        &self,
        kernel: Kernel,
        ty: Option<GgmlType>,
    ) -> Result<wgpu::ComputePipeline, GpuError> {
        let key = match ty {
            Some(t) => format!("{}_{}", kernel.name(), t.name()),
            None => kernel.name().to_string(),
        };
        let mut cache = self.pipelines.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, p)) = cache.iter().find(|(k, _)| *k == key) {
            return Ok(p.clone());
        }
        let source = match ty {
            Some(t) => {
                let dequant = type_source(t).ok_or_else(|| {
                    GpuError::Unsupported(format!(
                        "no GPU kernel reads type {} (supported: {})",
                        t.name(),
                        supported_types()
                    ))
                })?;
                format!("{STEP}\n{BLOCKS}\n{dequant}\n{}", kernel.source())
            }
            None => format!("{STEP}\n{}", kernel.source()),
        };
        // A kernel that does not compile is a bug here, not bad input; it is reported as an
        // error all the same, with the compiler's message, rather than a panic in wgpu.
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = self
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(&key),
                source: wgpu::ShaderSource::Wgsl(source.into()),
            });
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(&key),
                layout: None,
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(GpuError::Device(format!("kernel {key}: {e}")));
        }
        cache.push((key, pipeline.clone()));
        Ok(pipeline)
    }
}

// ANCHOR: step
/// What changes from one forward call to the next; `shaders/step.wgsl` declares the same.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Step {
    pub n_tokens: u32,
    pub start_pos: u32,
    /// Rows whose logits are wanted (0: none, for a prompt chunk that is not the last).
    pub n_out: u32,
    /// The first of them.
    pub out_row0: u32,
}
// ANCHOR_END: step

/// Which count of rows a kernel follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Count {
    /// The batch's tokens.
    Tokens = 0,
    /// The rows whose logits are wanted.
    Out = 1,
}

impl Count {
    fn of(self, step: &Step) -> u32 {
        match self {
            Count::Tokens => step.n_tokens,
            Count::Out => step.n_out,
        }
    }
}

/// How many workgroups a launch takes, given the [`Step`].
#[derive(Clone, Copy, Debug)]
pub enum Grid {
    /// One thread per element of `(n, width)`, 64 per workgroup.
    Elements { count: Count, width: u32 },
    /// One workgroup per 8 rows of the weights and per token (`mul_mat_vec`).
    MatVec { count: Count, rows: u32 },
    /// One workgroup per tile of 32 rows by 16 tokens (`mul_mat`).
    MatMat { count: Count, rows: u32 },
    /// One workgroup per row of activations (`rms_norm`).
    Rows { count: Count },
    /// One workgroup per query head and token (attention).
    Heads { n_head: u32 },
}

/// Workgroups per dimension of a grid; beyond it a grid is spread over y.
const MAX_GROUPS: u32 = 65535;

fn spread(groups: u32) -> (u32, u32) {
    if groups <= MAX_GROUPS {
        (groups, 1)
    } else {
        (MAX_GROUPS, groups.div_ceil(MAX_GROUPS))
    }
}

impl Grid {
    /// `(x, y, z)` workgroups for `step`; any of them 0 means nothing to do.
    pub fn groups(&self, step: &Step) -> [u32; 3] {
        match *self {
            Grid::Elements { count, width } => {
                let (x, y) = spread((count.of(step) * width).div_ceil(64));
                [x, y, 1]
            }
            Grid::MatVec { count, rows } => {
                let (x, y) = spread(rows.div_ceil(MMV_ROWS));
                [x, y, count.of(step)]
            }
            Grid::MatMat { count, rows } => [rows.div_ceil(32), count.of(step).div_ceil(16), 1],
            Grid::Rows { count } => [count.of(step), 1, 1],
            Grid::Heads { n_head } => [n_head, step.n_tokens, 1],
        }
    }
}

/// Weight rows one `mul_mat_vec` workgroup computes (`RPW` in its source): fewer, larger
/// workgroups than one per row, which matters where launching a workgroup costs much (lavapipe).
const MMV_ROWS: u32 = 8;

/// Up to this many rows of activations a product runs `mul_mat_vec`, a launch per token
/// over the same weights (which a GPU's cache serves after the first); above it the tiled
/// `mul_mat`, which reuses each weight it reads for 16 tokens from workgroup memory.
pub const MMV_MAX_ROWS: u32 = 8;

/// One kernel launch with everything bound.
pub struct Dispatch {
    pipeline: wgpu::ComputePipeline,
    bind_group: wgpu::BindGroup,
    grid: Grid,
}

/// A step of a forward pass: one launch, or for a product the choice between the
/// matrix-vector and the tiled kernel, made per call by the number of rows.
pub struct Op {
    pub label: String,
    small: Dispatch,
    /// The kernel for more than [`MMV_MAX_ROWS`] rows, when it differs.
    large: Option<Dispatch>,
}

impl Op {
    /// Record this op for `step` into `pass`.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, step: &Step) {
        let d = match &self.large {
            Some(large) if Self::rows(&self.small.grid, step) > MMV_MAX_ROWS => large,
            _ => &self.small,
        };
        let [x, y, z] = d.grid.groups(step);
        if x == 0 || y == 0 || z == 0 {
            return;
        }
        pass.set_pipeline(&d.pipeline);
        pass.set_bind_group(0, &d.bind_group, &[]);
        pass.dispatch_workgroups(x, y, z);
    }

    fn rows(grid: &Grid, step: &Step) -> u32 {
        match *grid {
            Grid::MatVec { count, .. } | Grid::MatMat { count, .. } => count.of(step),
            _ => 0,
        }
    }
}

/// Builds [`Op`]s that share one [`Step`] buffer.
pub struct OpBuilder<'g> {
    pub gpu: &'g Gpu,
    /// The uniform every op reads at binding 0.
    pub step: wgpu::Buffer,
}

/// Fixed parameters of one launch: up to eight 32-bit values (f32 as their bits), in the
/// order of the kernel's `Params` struct.
pub type Params = [u32; 8];

impl<'g> OpBuilder<'g> {
    pub fn new(gpu: &'g Gpu) -> OpBuilder<'g> {
        let step = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("step"),
            size: size_of::<Step>() as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        OpBuilder { gpu, step }
    }

    /// Write the step of the next submission.
    pub fn write_step(&self, step: &Step) {
        self.gpu
            .queue
            .write_buffer(&self.step, 0, bytemuck::bytes_of(step));
    }

    fn dispatch(
        &self,
        kernel: Kernel,
        ty: Option<GgmlType>,
        params: Params,
        buffers: &[&View],
        grid: Grid,
    ) -> Result<Dispatch, GpuError> {
        let pipeline = self.gpu.pipeline(kernel, ty)?;
        let params = self
            .gpu
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(kernel.name()),
                contents: bytemuck::cast_slice(&params),
                usage: wgpu::BufferUsages::UNIFORM,
            });
        let mut entries = vec![
            wgpu::BindGroupEntry {
                binding: 0,
                resource: self.step.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 1,
                resource: params.as_entire_binding(),
            },
        ];
        for (i, b) in buffers.iter().enumerate() {
            entries.push(wgpu::BindGroupEntry {
                binding: 2 + i as u32,
                resource: b.binding(),
            });
        }
        let scope = self
            .gpu
            .device
            .push_error_scope(wgpu::ErrorFilter::Validation);
        let bind_group = self
            .gpu
            .device
            .create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(kernel.name()),
                layout: &pipeline.get_bind_group_layout(0),
                entries: &entries,
            });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(GpuError::Device(format!(
                "binding the buffers of {}: {e}",
                kernel.name()
            )));
        }
        Ok(Dispatch {
            pipeline,
            bind_group,
            grid,
        })
    }

    fn single(&self, label: String, d: Dispatch) -> Op {
        Op {
            label,
            small: d,
            large: None,
        }
    }

    // ANCHOR: mul_mat_op
    /// `y = x Wᵀ`: `x` is `(n, cols)`, `y` `(n, rows)`, `n` the step's `count`. The kernel is
    /// chosen per call: `mul_mat_vec` up to [`MMV_MAX_ROWS`] rows, the tiled `mul_mat` above;
    /// `only` forces one of them (for tests).
    pub fn mul_mat(
        &self,
        w: &GpuMatrix,
        x: &View,
        y: &View,
        count: Count,
        only: Option<Kernel>,
    ) -> Result<Op, GpuError> {
        let params = [
            w.rows as u32,
            w.cols as u32,
            w.row_bytes as u32,
            count as u32,
            0,
            0,
            0,
            0,
        ];
        let buffers = [&w.data, x, y];
        let rows = w.rows as u32;
        let vec = || {
            self.dispatch(
                Kernel::MulMatVec,
                Some(w.ty),
                params,
                &buffers,
                Grid::MatVec { count, rows },
            )
        };
        let tiled = || {
            self.dispatch(
                Kernel::MulMat,
                Some(w.ty),
                params,
                &buffers,
                Grid::MatMat { count, rows },
            )
        };
        let label = format!("mul_mat {}", w.name);
        Ok(match only {
            Some(Kernel::MulMatVec) => self.single(label, vec()?),
            Some(Kernel::MulMat) => self.single(label, tiled()?),
            _ => Op {
                label,
                small: vec()?,
                large: Some(tiled()?),
            },
        })
    }
    // ANCHOR_END: mul_mat_op

    /// Rows `ids` (`(n)` u32) of `w`, dequantized into `out` (`(n, cols)`).
    pub fn get_rows(&self, w: &GpuMatrix, ids: &View, out: &View) -> Result<Op, GpuError> {
        let params = [w.cols as u32, w.row_bytes as u32, 0, 0, 0, 0, 0, 0];
        let grid = Grid::Elements {
            count: Count::Tokens,
            width: (w.cols / 8) as u32,
        };
        let d = self.dispatch(
            Kernel::GetRows,
            Some(w.ty),
            params,
            &[&w.data, ids, out],
            grid,
        )?;
        Ok(self.single(format!("get_rows {}", w.name), d))
    }

    /// RMSNorm of the rows of `x` (`(n, d)`) times `weight` (`(d)`) into `out` (`(n, d)`).
    /// With `count` [`Count::Out`] the rows are the output's: from `out_row0` of `x`.
    pub fn rms_norm(
        &self,
        x: &View,
        weight: &View,
        out: &View,
        d: usize,
        eps: f32,
        count: Count,
    ) -> Result<Op, GpuError> {
        let from_out = (count == Count::Out) as u32;
        let params = [d as u32, count as u32, from_out, eps.to_bits(), 0, 0, 0, 0];
        let disp = self.dispatch(
            Kernel::RmsNorm,
            None,
            params,
            &[x, weight, out],
            Grid::Rows { count },
        )?;
        Ok(self.single("rms_norm".into(), disp))
    }

    /// RoPE in place on `x` (`(n, n_heads, head_dim)`) at positions `start_pos..`, with the
    /// angles of `cos_sin` (`(n_ctx, n_rot / 2, 2)`).
    pub fn rope(
        &self,
        x: &View,
        cos_sin: &View,
        n_heads: usize,
        head_dim: usize,
        n_rot: usize,
        neox: bool,
    ) -> Result<Op, GpuError> {
        let params = [
            n_heads as u32,
            head_dim as u32,
            n_rot as u32,
            neox as u32,
            0,
            0,
            0,
            0,
        ];
        let grid = Grid::Elements {
            count: Count::Tokens,
            width: (n_heads * n_rot / 2) as u32,
        };
        let d = self.dispatch(Kernel::Rope, None, params, &[x, cos_sin], grid)?;
        Ok(self.single("rope".into(), d))
    }

    /// Rows of `k` and `v` (`(n, width)`) into rows `start_pos..` of the caches.
    pub fn set_rows(
        &self,
        k: &View,
        v: &View,
        k_cache: &View,
        v_cache: &View,
        width: usize,
    ) -> Result<Op, GpuError> {
        let params = [width as u32, 0, 0, 0, 0, 0, 0, 0];
        let grid = Grid::Elements {
            count: Count::Tokens,
            width: width as u32,
        };
        let d = self.dispatch(
            Kernel::SetRows,
            None,
            params,
            &[k, v, k_cache, v_cache],
            grid,
        )?;
        Ok(self.single("set_rows".into(), d))
    }

    /// Attention of the queries `q` (`(n, n_head, head_dim)`, positions `start_pos..`) over
    /// the caches, into `out` (`(n, n_head, head_dim)`).
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &self,
        q: &View,
        k_cache: &View,
        v_cache: &View,
        out: &View,
        n_head: usize,
        n_head_kv: usize,
        head_dim: usize,
        window: Option<usize>,
        kq_scale: f32,
    ) -> Result<Op, GpuError> {
        if head_dim > 256 || n_head_kv == 0 || !n_head.is_multiple_of(n_head_kv) {
            return Err(GpuError::Unsupported(format!(
                "attention with {n_head} heads, {n_head_kv} KV heads of {head_dim} dims \
                 (the kernel takes at most 256 dims and whole groups of heads)"
            )));
        }
        let params = [
            n_head as u32,
            n_head_kv as u32,
            head_dim as u32,
            window.unwrap_or(0) as u32,
            kq_scale.to_bits(),
            0,
            0,
            0,
        ];
        let grid = Grid::Heads {
            n_head: n_head as u32,
        };
        let d = self.dispatch(
            Kernel::Attention,
            None,
            params,
            &[q, k_cache, v_cache, out],
            grid,
        )?;
        Ok(self.single("attention".into(), d))
    }

    /// `gate = silu(gate) ⊙ up`, both `(n, width)`.
    pub fn swiglu(&self, gate: &View, up: &View, width: usize) -> Result<Op, GpuError> {
        let params = [width as u32, 0, 0, 0, 0, 0, 0, 0];
        let grid = Grid::Elements {
            count: Count::Tokens,
            width: width as u32,
        };
        let d = self.dispatch(Kernel::SwiGlu, None, params, &[gate, up], grid)?;
        Ok(self.single("swiglu".into(), d))
    }

    /// `x += y`, both `(n, width)`.
    pub fn add(&self, x: &View, y: &View, width: usize) -> Result<Op, GpuError> {
        let params = [width as u32, 0, 0, 0, 0, 0, 0, 0];
        let grid = Grid::Elements {
            count: Count::Tokens,
            width: width as u32,
        };
        let d = self.dispatch(Kernel::Add, None, params, &[x, y], grid)?;
        Ok(self.single("add".into(), d))
    }

    /// Write `step`, record `ops` in one compute pass, submit: what a forward pass does, for
    /// tests of a few ops. The model records its ops itself, with the logits' readback.
    pub fn run(&self, ops: &[Op], step: &Step) {
        self.write_step(step);
        let mut enc = self.gpu.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            for op in ops {
                op.record(&mut pass, step);
            }
        }
        self.gpu.queue.submit([enc.finish()]);
    }
}
