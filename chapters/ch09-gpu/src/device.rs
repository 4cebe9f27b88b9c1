//! The GPU: finding one, and moving bytes to it and back.
//!
//! [`Gpu::new`] asks wgpu for an adapter on any backend it was built with (Vulkan, Metal,
//! Direct3D 12), preferring a discrete GPU. A software adapter is accepted: Mesa's lavapipe
//! runs Vulkan on the CPU, which is how the tests run on machines without a GPU. When there is
//! none at all the error lists every adapter wgpu saw, so that "no GPU" can be told apart
//! from "a GPU wgpu would not use".

use ch03::LoadError;
use ch04::{ForwardError, StepError};
use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use wgpu::util::DeviceExt;

/// Polls to wait for a staging buffer's map callback before giving up: each poll waits for the
/// device to finish, so more than one is needed only when the callback is late.
const MAX_MAP_POLLS: usize = 1000;
/// What can go wrong on the GPU path.
#[derive(Debug)]
pub enum GpuError {
    /// wgpu found no adapter it could use; `seen` lists every adapter it enumerated.
    NoAdapter { seen: Vec<String> },
    /// The device refused a request, or failed: creating it, compiling a kernel, reading back.
    Device(String),
    /// A tensor, shape or setting the GPU path cannot run, named.
    Unsupported(String),
    /// Reading the model's weights or configuration failed.
    Load(LoadError),
    /// The batch cannot run (chapter 4's checks: token ids, positions, room in the cache).
    Forward(ForwardError),
}

impl fmt::Display for GpuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuError::NoAdapter { seen } if seen.is_empty() => write!(
                f,
                "no GPU adapter found: wgpu saw no adapter at all. Install a driver for your \
                 GPU, or on Linux Mesa's software Vulkan driver lavapipe \
                 (Debian/Ubuntu: apt-get install mesa-vulkan-drivers)"
            ),
            GpuError::NoAdapter { seen } => write!(
                f,
                "no usable GPU adapter found; adapters seen: {}",
                seen.join("; ")
            ),
            GpuError::Device(msg) => write!(f, "GPU: {msg}"),
            GpuError::Unsupported(msg) => write!(f, "the GPU path cannot run this: {msg}"),
            GpuError::Load(e) => e.fmt(f),
            GpuError::Forward(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for GpuError {}

impl From<LoadError> for GpuError {
    fn from(e: LoadError) -> Self {
        GpuError::Load(e)
    }
}

impl From<ForwardError> for GpuError {
    fn from(e: ForwardError) -> Self {
        GpuError::Forward(e)
    }
}

impl StepError for GpuError {
    fn context_full(&self) -> bool {
        matches!(self, GpuError::Forward(e) if e.context_full())
    }
}

/// One adapter as the error message shows it: `"llvmpipe (LLVM 15.0.6, 256 bits)" (Vulkan, Cpu)`.
fn describe_adapter(info: &wgpu::AdapterInfo) -> String {
    format!(
        "{:?} ({:?}, {:?})",
        info.name, info.backend, info.device_type
    )
}

/// An open device and its queue, and the compiled kernels (compiled on first use).
pub struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    pub limits: wgpu::Limits,
    pub(crate) pipelines: Mutex<Vec<(String, wgpu::ComputePipeline)>>,
}

impl Gpu {
    /// Open the best adapter wgpu finds: a discrete GPU if there is one, else whatever there
    /// is (an integrated GPU, or a CPU implementation such as lavapipe).
    pub fn new() -> Result<Gpu, GpuError> {
        let instance =
            wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
        let seen: Vec<String> = adapters
            .iter()
            .map(|a| describe_adapter(&a.get_info()))
            .collect();
        let adapter = pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            force_fallback_adapter: false,
            compatible_surface: None,
            ..Default::default()
        }))
        .map_err(|_| GpuError::NoAdapter { seen })?;
        let info = adapter.get_info();
        // Everything the adapter allows: the largest buffers and bindings it offers (the
        // defaults are WebGPU's portable minimums, 128 MiB per binding).
        let limits = adapter.limits();
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("llm-rs"),
            required_features: wgpu::Features::empty(),
            required_limits: limits.clone(),
            ..Default::default()
        }))
        .map_err(|e| GpuError::Device(format!("{}: {e}", describe_adapter(&info))))?;
        Ok(Gpu {
            device,
            queue,
            info,
            limits,
            pipelines: Mutex::new(Vec::new()),
        })
    }

    /// One GPU for the whole process, opened on first use (the tests share it).
    pub fn shared() -> Result<Arc<Gpu>, String> {
        static GPU: OnceLock<Result<Arc<Gpu>, String>> = OnceLock::new();
        GPU.get_or_init(|| Gpu::new().map(Arc::new).map_err(|e| e.to_string()))
            .clone()
    }

    /// The adapter, for diagnostics: its name, backend and kind.
    pub fn describe(&self) -> String {
        describe_adapter(&self.info)
    }

    /// A storage buffer holding `bytes`, padded to whole 4-byte words (kernels read words).
    pub fn upload(&self, label: &str, bytes: &[u8]) -> Result<View, GpuError> {
        let size = bytes.len().next_multiple_of(4).max(4) as u64;
        self.check_binding(label, size)?;
        let buffer = if bytes.len() as u64 == size {
            self.device
                .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: Some(label),
                    contents: bytes,
                    usage: STORAGE,
                })
        } else {
            let mut padded = bytes.to_vec();
            padded.resize(size as usize, 0);
            self.device
                .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: Some(label),
                    contents: &padded,
                    usage: STORAGE,
                })
        };
        Ok(View {
            buffer,
            offset: 0,
            size,
        })
    }

    /// [`Gpu::upload`] of f32 values.
    pub fn upload_f32(&self, label: &str, values: &[f32]) -> Result<View, GpuError> {
        self.upload(label, bytemuck::cast_slice(values))
    }

    /// A zeroed storage buffer of `size` bytes.
    pub fn zeros(&self, label: &str, size: u64) -> Result<View, GpuError> {
        let size = size.next_multiple_of(4).max(4);
        self.check_binding(label, size)?;
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: STORAGE,
            mapped_at_creation: false,
        });
        Ok(View {
            buffer,
            offset: 0,
            size,
        })
    }

    /// Refuse a binding larger than the device allows, naming it.
    pub(crate) fn check_binding(&self, label: &str, size: u64) -> Result<(), GpuError> {
        let max = self
            .limits
            .max_storage_buffer_binding_size
            .min(self.limits.max_buffer_size);
        if size > max {
            return Err(GpuError::Unsupported(format!(
                "{label}: {size} bytes in one buffer, the device allows {max}"
            )));
        }
        Ok(())
    }

    /// Read `view` back as f32 values: a copy into a staging buffer, one submit, a wait. For
    /// tests and diagnostics; the model reads its logits through a [`Readback`] it keeps.
    pub fn read_f32(&self, view: &View) -> Result<Vec<f32>, GpuError> {
        let readback = Readback::new(self, view.size);
        let mut out = vec![0.0f32; (view.size / 4) as usize];
        let mut enc = self.device.create_command_encoder(&Default::default());
        readback.copy_from(&mut enc, view, view.size);
        self.queue.submit([enc.finish()]);
        readback.read(self, &mut out)?;
        Ok(out)
    }
}

/// Storage buffers: read and written by kernels, written from the host, copied from.
pub(crate) const STORAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_DST)
    .union(wgpu::BufferUsages::COPY_SRC);

/// A byte range of a GPU buffer: what a kernel binds.
#[derive(Clone, Debug)]
pub struct View {
    pub buffer: wgpu::Buffer,
    pub offset: u64,
    pub size: u64,
}

impl View {
    pub(crate) fn binding(&self) -> wgpu::BindingResource<'_> {
        wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer: &self.buffer,
            offset: self.offset,
            size: wgpu::BufferSize::new(self.size),
        })
    }

    /// `len` bytes from `offset` within this view.
    pub fn sub(&self, offset: u64, len: u64) -> View {
        debug_assert!(offset + len <= self.size);
        View {
            buffer: self.buffer.clone(),
            offset: self.offset + offset,
            size: len,
        }
    }
}

/// A host-visible staging buffer that results are copied into, then mapped and read.
pub struct Readback {
    buffer: wgpu::Buffer,
    /// 0: mapping pending, 1: mapped, 2: failed. Set by the map callback.
    state: Arc<AtomicU8>,
}

impl Readback {
    pub fn new(gpu: &Gpu, size: u64) -> Readback {
        Readback {
            buffer: gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("readback"),
                size: size.next_multiple_of(4).max(4),
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
            state: Arc::new(AtomicU8::new(0)),
        }
    }

    /// Record the copy of the first `len` bytes of `src`.
    pub fn copy_from(&self, enc: &mut wgpu::CommandEncoder, src: &View, len: u64) {
        enc.copy_buffer_to_buffer(&src.buffer, src.offset, &self.buffer, 0, len);
    }

    /// Wait for the submitted work, then copy `out.len()` values out of the staging buffer.
    pub fn read(&self, gpu: &Gpu, out: &mut [f32]) -> Result<(), GpuError> {
        let len = (out.len() * 4) as u64;
        if len == 0 {
            return Ok(());
        }
        self.state.store(0, Ordering::Release);
        let state = Arc::clone(&self.state);
        self.buffer
            .map_async(wgpu::MapMode::Read, 0..len, move |r| {
                state.store(if r.is_ok() { 1 } else { 2 }, Ordering::Release);
            });
        // The callback runs inside a poll; should a poll return before it has run, poll
        // again rather than read a buffer that is not mapped (a read on lavapipe under load
        // once failed here).
        for _ in 0..MAX_MAP_POLLS {
            gpu.device
                .poll(wgpu::PollType::wait_indefinitely())
                .map_err(|e| GpuError::Device(format!("waiting for the results: {e}")))?;
            if self.state.load(Ordering::Acquire) != 0 {
                break;
            }
            std::thread::yield_now();
        }
        match self.state.load(Ordering::Acquire) {
            1 => {}
            0 => {
                return Err(GpuError::Device(format!(
                    "the results were not mapped for reading after {MAX_MAP_POLLS} polls"
                )));
            }
            _ => {
                return Err(GpuError::Device(
                    "mapping the results for reading failed".into(),
                ));
            }
        }
        {
            let view = self
                .buffer
                .get_mapped_range(0..len)
                .map_err(|e| GpuError::Device(format!("reading the results: {e}")))?;
            out.copy_from_slice(bytemuck::cast_slice(&view));
        }
        self.buffer.unmap();
        Ok(())
    }
}
