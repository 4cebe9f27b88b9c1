//! The finished engine: load a model (mapped by default) with chapter 8's kernels, and run
//! every prompt through chapter 7's scheduler on a paged KV cache with its prefix cache — one
//! sequence is the simplest batch, and a conversation finds its earlier turns in the prefix
//! cache. The command line around it is chapter 4's.

use crate::loader::ViewLoader;
use crate::mapped::{
    AlignedBuf, MapOptions, MappedBytes, MappedFile, PageAdvice, ReleasePages, SharedBytes,
    held_gguf, map_gguf,
};
use ch01::{Gguf, GgufFile};
use ch02::{ChatTemplate, Tokenizer};
use ch04::cli::{self, Args, ContextFull, Report, Runner};
use ch04::{Architectures, ForwardError, GenParams, Generation, Model, StopReason};
use ch05::CacheTypes;
use ch07::{Finished, Request, RequestId, Scheduler, SchedulerConfig, SchedulerError, Sink};
use ch08::{FastLoader, PoolKind, new_pool};
use std::error::Error;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

// ANCHOR: args
/// What the engine is asked to do: chapter 4's settings, and how the model loads.
#[derive(Debug, Clone)]
pub struct EngineArgs {
    /// Chapter 4's settings: model, prompt, sampling, context size, `--json`.
    pub generation: Args,
    /// Read the file into memory instead of mapping it (llama.cpp's `--no-mmap`).
    pub no_mmap: bool,
    /// `madvise` hint for the mapped file; `None` chooses: `WillNeed` when the matrices are
    /// repacked (the load reads every page anyway, and reading ahead of the packer made a cold
    /// 8B load 1.7× faster, chapter 14's table), no hint otherwise.
    pub advice: Option<PageAdvice>,
    /// Read every page of the file while mapping it (`MAP_POPULATE`), before the first token.
    pub populate: bool,
    /// Lock the model's pages in memory (`mlock`): read now, never evicted.
    pub mlock: bool,
    /// Keep every weight a view of the file: no repacking for chapter 8's micro-kernel, which
    /// by default interleaves the matrices where the CPU has one (faster products, but the
    /// packed weights are a private copy, no longer the mapped pages).
    pub no_repack: bool,
    /// Run the forward pass on a GPU (chapter 9), one sequence at a time: needs the engine
    /// built with the `gpu` feature.
    pub gpu: bool,
    /// The architectures the engine loads: chapter 4's, unless a later chapter hands in a
    /// bigger set.
    pub archs: Architectures,
    /// What the KV cache keeps keys and values in (chapter 5's f32 or f16, chapter 6's Q8_0;
    /// llama.cpp's `--cache-type-k`, `--cache-type-v`). The GPU path keeps its own f32 cache.
    pub cache: CacheTypes,
    /// How `--model PATH` becomes the GGUF image the engine loads: GGUF files ([`GgufFiles`]),
    /// unless a later chapter hands in a value that reads other formats too.
    pub files: Arc<dyn ModelFiles>,
}
// ANCHOR_END: args

// ANCHOR: model_files
/// How a model path becomes what the engine loads: a parsed GGUF header and the bytes its
/// tensors live in. This chapter's [`GgufFiles`] opens GGUF files; a later chapter passes a
/// value that also turns other formats into a GGUF image.
pub trait ModelFiles: Send + Sync + std::fmt::Debug {
    /// The model at `path` as a GGUF image, mapped if `mode` says so and the format allows.
    fn open(&self, path: &Path, mode: LoadMode) -> Result<Opened, Box<dyn Error>>;

    /// The header of the model at `path` (metadata and tensor descriptions), reading as
    /// little as it can: what chapter 14 plans a run's memory from.
    fn header(&self, path: &Path) -> Result<Gguf, Box<dyn Error>>;
}

/// A model opened as a GGUF image: a GGUF file mapped (which can tell, when something fails,
/// whether the file changed underneath), or an image held by anything else — a file read with
/// `--no-mmap`, or what another format was turned into.
pub enum Opened {
    Mapped(GgufFile<MappedBytes>, MappedBytes),
    Held(GgufFile<SharedBytes<Image>>, SharedBytes<Image>),
}

// ANCHOR_END: model_files

// ANCHOR: image
/// What holds the bytes of an image: any buffer the matrices may view.
pub trait ImageBytes: AsRef<[u8]> + ReleasePages + Send + Sync {}
impl<T: AsRef<[u8]> + ReleasePages + Send + Sync> ImageBytes for T {}

/// The bytes of an image, whatever holds them: memory read from a file, maps assembled by
/// another format.
pub struct Image(pub Box<dyn ImageBytes>);

impl AsRef<[u8]> for Image {
    fn as_ref(&self) -> &[u8] {
        (*self.0).as_ref()
    }
}

impl ReleasePages for Image {
    fn release(&self, range: std::ops::Range<usize>) {
        self.0.release(range)
    }
}

impl Opened {
    /// The GGUF file `image` holds, parsed (errors name `path`).
    pub fn held(path: &Path, image: Image) -> Result<Opened, Box<dyn Error>> {
        let (file, bytes) = held_gguf(path, image)?;
        Ok(Opened::Held(file, bytes))
    }

    /// The parsed header.
    pub fn gguf(&self) -> &Gguf {
        match self {
            Opened::Mapped(f, _) => &f.gguf,
            Opened::Held(f, _) => &f.gguf,
        }
    }
}

// ANCHOR_END: image

// ANCHOR: gguf_files
/// GGUF files: mapped, or read into memory with [`LoadMode::Read`].
#[derive(Debug, Clone, Copy, Default)]
pub struct GgufFiles;

impl ModelFiles for GgufFiles {
    fn open(&self, path: &Path, mode: LoadMode) -> Result<Opened, Box<dyn Error>> {
        Ok(match mode {
            LoadMode::Map(opts) => {
                let (file, bytes) = map_gguf(path, &opts)?;
                Opened::Mapped(file, bytes)
            }
            LoadMode::Read => Opened::held(path, Image(Box::new(AlignedBuf::read_file(path)?)))?,
        })
    }

    /// Only the header's pages of the map are read.
    fn header(&self, path: &Path) -> Result<Gguf, Box<dyn Error>> {
        Ok(map_gguf(path, &MapOptions::default())?.0.gguf)
    }
}
// ANCHOR_END: gguf_files

/// How the weights get from the file into the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadMode {
    /// Memory-map the file; the matrices view the mapped pages.
    Map(MapOptions),
    /// Read the whole file into memory once; the matrices view that copy.
    Read,
}

impl EngineArgs {
    /// The engine with chapter 4's settings `generation`, mapping the file and repacking its
    /// matrices, for chapter 4's architectures.
    pub fn new(generation: Args) -> EngineArgs {
        EngineArgs {
            generation,
            no_mmap: false,
            advice: None,
            populate: false,
            mlock: false,
            no_repack: false,
            gpu: false,
            archs: ch04::architectures(),
            cache: CacheTypes::F32,
            files: Arc::new(GgufFiles),
        }
    }

    /// Chapter 8's matrices, on `--threads` threads, repacked unless `--no-repack`.
    pub fn fast_loader(&self) -> FastLoader {
        let mut fast = FastLoader::new(new_pool(PoolKind::Spin, self.generation.threads()));
        fast.pack = !self.no_repack;
        fast
    }

    /// Whether the matrices will be repacked: not `--no-repack`, and the CPU has chapter 8's
    /// micro-kernel.
    pub fn repacks(&self) -> bool {
        !self.no_repack && ch08::fast_matrix::packs(&ch08::kernels::KernelSet::detect())
    }

    pub fn load_mode(&self) -> LoadMode {
        if self.no_mmap {
            LoadMode::Read
        } else {
            let chosen = if self.repacks() {
                PageAdvice::WillNeed
            } else {
                PageAdvice::Normal
            };
            LoadMode::Map(MapOptions {
                advice: self.advice.unwrap_or(chosen),
                populate: self.populate,
                lock: self.mlock,
            })
        }
    }
}

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
fn arch_template(gguf: &Gguf, archs: &Architectures) -> Option<ChatTemplate> {
    let source = archs.get(gguf.architecture().ok()?)?.chat_template?;
    ChatTemplate::with_tokens_of(gguf, source).ok()
}

fn in_file(path: &Path, e: impl std::fmt::Display) -> Box<dyn Error> {
    format!("{}: {e}", path.display()).into()
}

/// How long a load runs before it shows its progress: a load faster than this shows nothing.
pub const PROGRESS_AFTER: Duration = Duration::from_millis(1500);

/// A line on standard error saying how much of the model is loaded, once loading has run for
/// [`PROGRESS_AFTER`] (an 8B model repacks for seconds), rewritten in place and cleared when
/// the load ends. Only on a terminal: a log gets no progress lines.
pub struct LoadProgress {
    shown: std::rc::Rc<std::cell::Cell<bool>>,
    enabled: bool,
}

impl LoadProgress {
    /// Progress on standard error if `wanted` and it is a terminal.
    pub fn on_terminal(wanted: bool) -> LoadProgress {
        use std::io::IsTerminal;
        LoadProgress {
            shown: Default::default(),
            enabled: wanted && std::io::stderr().is_terminal(),
        }
    }

    /// The callback [`Engine::load_reporting`] calls.
    pub fn reporter(&self) -> Box<dyn Fn(u64, u64)> {
        let (shown, enabled, start) = (self.shown.clone(), self.enabled, Instant::now());
        let last = std::cell::Cell::new(u64::MAX); // the percentage shown last
        Box::new(move |done, total| {
            let percent = done * 100 / total.max(1);
            if enabled && percent != last.get() && start.elapsed() >= PROGRESS_AFTER {
                let gb = |b: u64| b as f64 / 1e9;
                eprint!(
                    "\rloading: {percent:>3}% ({:.1} of {:.1} GB)",
                    gb(done),
                    gb(total)
                );
                last.set(percent);
                shown.set(true);
            }
        })
    }

    /// Clear the line, if one was shown.
    pub fn finish(&self) {
        if self.shown.get() {
            eprint!("\r\x1b[K");
        }
    }
}

/// The process's memory as Linux reports it in `/proc/self/status`, in KiB.
#[derive(Debug, Clone, Copy, Default)]
pub struct MemoryStats {
    /// Peak resident set size (`VmHWM`).
    pub peak_rss: u64,
    /// Resident now (`VmRSS`) = anonymous + file-backed + shared memory.
    pub rss: u64,
    /// Resident private memory (`RssAnon`): heap, stacks, the KV cache, a read-in model.
    pub rss_anon: u64,
    /// Resident pages of mapped files (`RssFile`): a mapped model, shared with the page cache.
    pub rss_file: u64,
}

/// This process's [`MemoryStats`]; `None` where `/proc/self/status` does not exist.
pub fn memory_stats() -> Option<MemoryStats> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    };
    Some(MemoryStats {
        peak_rss: kib("VmHWM")?,
        rss: kib("VmRSS")?,
        rss_anon: kib("RssAnon")?,
        rss_file: kib("RssFile")?,
    })
}

// ANCHOR: scheduled
/// Positions per block of the paged KV cache (vLLM's default). The prefix cache keeps whole
/// blocks, so a conversation recomputes at most 15 positions of its prefix per turn; attention
/// reads keys in runs that end at a block's end, which measured no slower than 64-position
/// blocks or chapter 5's contiguous cache (900-token prompt, 100 tokens, 2 threads).
pub const BLOCK_SIZE: usize = 16;

/// Most tokens in one forward pass: a prompt is computed in chunks of this many (chunked
/// prefill), as chapter 5's sessions do.
pub const MAX_BATCH_TOKENS: usize = 256;

/// The engine's [`Runner`]: every prompt is a request to chapter 7's scheduler, whose paged
/// cache holds `n_ctx` positions and whose prefix cache keeps what earlier prompts computed.
pub struct Scheduled<'m> {
    pub scheduler: Scheduler<'m, Model>,
    pub n_ctx: usize,
    engine: &'m Engine,
}
// ANCHOR_END: scheduled

// ANCHOR: scheduled_new
impl<'m> Scheduled<'m> {
    /// A scheduler over `engine`'s model with room for `n_ctx` positions, at most the
    /// model's run context ([`Model::n_ctx`], which `--ctx` sets), running up to `parallel`
    /// requests at once.
    pub fn new(engine: &'m Engine, n_ctx: usize, parallel: usize) -> Result<Self, Box<dyn Error>> {
        Self::with_cache(engine, n_ctx, parallel, CacheTypes::F32)
    }

    /// [`Scheduled::new`] with the cache keeping keys and values in `cache`.
    pub fn with_cache(
        engine: &'m Engine,
        n_ctx: usize,
        parallel: usize,
        cache: CacheTypes,
    ) -> Result<Self, Box<dyn Error>> {
        let model_ctx = engine.model.n_ctx();
        if n_ctx == 0 || n_ctx > model_ctx {
            return Err(format!(
                "a pool of {n_ctx} positions: it must be between 1 and the model's run context \
                 of {model_ctx} positions"
            )
            .into());
        }
        let config = SchedulerConfig {
            max_batch_tokens: MAX_BATCH_TOKENS.max(parallel),
            max_running: parallel.max(1),
            block_size: BLOCK_SIZE,
            n_blocks: n_ctx.div_ceil(BLOCK_SIZE),
            prefix_cache: true,
            cache,
        };
        Ok(Scheduled {
            scheduler: Scheduler::new(&engine.model, &engine.tokenizer, config)?,
            n_ctx,
            engine,
        })
    }
}
// ANCHOR_END: scheduled_new

// ANCHOR: one_request
/// Streams the text of one request.
struct OneRequest<'f> {
    id: RequestId,
    on_text: &'f mut dyn FnMut(&str),
}

impl Sink for OneRequest<'_> {
    fn text(&mut self, id: RequestId, text: &str) {
        if id == self.id {
            (self.on_text)(text)
        }
    }
}
// ANCHOR_END: one_request

// ANCHOR: generate
impl Runner for Scheduled<'_> {
    fn generate(
        &mut self,
        prompt: &[u32],
        params: &GenParams,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Generation, Box<dyn Error>> {
        let n_ctx = self.n_ctx;
        if prompt.len() > n_ctx {
            return Err(ContextFull {
                prompt: prompt.len(),
                n_ctx,
            }
            .into());
        }
        // Generation stops when the context is full: the last token takes no position.
        let mut params = params.clone();
        let requested = params.max_tokens;
        params.max_tokens = params.max_tokens.min(n_ctx - prompt.len() + 1);
        let capped = params.max_tokens < requested;
        let id = self.scheduler.submit(Request {
            prompt: prompt.to_vec(),
            params,
        })?;
        let mut sink = OneRequest { id, on_text };
        let done: Finished = loop {
            let mut report = self
                .scheduler
                .step(&mut sink)
                .map_err(|e| self.engine.explain_step(e))?;
            if let Some(i) = report.finished.iter().position(|f| f.id == id) {
                break report.finished.swap_remove(i);
            }
        };
        let stop = match done.stop {
            StopReason::MaxTokens if capped => StopReason::ContextFull,
            stop => stop,
        };
        Ok(Generation {
            prompt_ids: prompt.to_vec(),
            text: done.text,
            stop,
            reused: done.cached_tokens.min(prompt.len()),
            prefill: done.ttft,
            decode: done.latency.saturating_sub(done.ttft),
            decode_calls: done.ids.len().saturating_sub(1),
            ids: done.ids,
        })
    }
    // ANCHOR_END: generate

    // ANCHOR: report
    fn report(&self, report: &mut Report) {
        report_engine(self.engine, report);
    }
}

/// The engine's fields of the `--json` report: how the weights were loaded, and the
/// process's memory.
pub fn report_engine(engine: &Engine, report: &mut Report) {
    let loader = match engine.mode {
        LoadMode::Map(_) => "mmap",
        LoadMode::Read => "read",
    };
    report.add("loader", loader);
    report.add("repacked", engine.repacked);
    let memory = memory_stats().map(|m| {
        let mut r = Report::default();
        r.add("peak_rss_kib", m.peak_rss)
            .add("rss_kib", m.rss)
            .add("rss_anon_kib", m.rss_anon)
            .add("rss_file_kib", m.rss_file);
        r
    });
    report.add("memory", memory);
}
// ANCHOR_END: report

// ANCHOR: run
/// Run the engine as `args` say: chapter 4's command line with this chapter's loading and
/// chapter 7's scheduler. The flags are checked before the model loads.
pub fn run(args: &EngineArgs) -> Result<(), Box<dyn Error>> {
    cli::check(&args.generation)?;
    if args.gpu {
        return run_gpu(args, &args.generation.model_path()?, Instant::now());
    }
    let (engine, t0) = load(args, args.fast_loader())?;
    let mut runner = Scheduled::with_cache(&engine, engine.model.n_ctx(), 1, args.cache)?;
    drive(args, &engine, t0, &mut runner)
}

/// Load the model `args` name with `fast`'s kernels and pool, showing progress on a terminal,
/// its context set by `--ctx`, and say what was loaded (unless `--json`). Returns the engine
/// and when loading started.
pub fn load(args: &EngineArgs, fast: FastLoader) -> Result<(Engine, Instant), Box<dyn Error>> {
    let g = &args.generation;
    let path: PathBuf = g.model_path()?;
    let t0 = Instant::now();
    let progress = LoadProgress::on_terminal(!g.json);
    let engine = Engine::open(
        &*args.files,
        &path,
        args.load_mode(),
        fast,
        &args.archs,
        progress.reporter(),
    );
    progress.finish();
    let mut engine = engine?;
    cli::set_context(&mut engine.model, g.ctx)?;
    if !g.json {
        eprintln!("{}", engine.describe(&path));
    }
    Ok((engine, t0))
}

/// Chapter 4's command line over `runner`, for `engine` loaded since `t0`: one prompt, or a
/// conversation.
pub fn drive(
    args: &EngineArgs,
    engine: &Engine,
    t0: Instant,
    runner: &mut dyn Runner,
) -> Result<(), Box<dyn Error>> {
    cli::drive(
        &args.generation,
        &engine.tokenizer,
        engine.template.as_ref(),
        (t0, engine.load_time),
        runner,
    )
    .map_err(|e| engine.explain(e))
}
// ANCHOR_END: run

/// `--gpu` in an engine built without the `gpu` feature.
#[cfg(not(feature = "gpu"))]
fn run_gpu(_: &EngineArgs, _: &Path, _: Instant) -> Result<(), Box<dyn Error>> {
    Err(
        "--gpu: this engine was built without GPU support; build it with the `gpu` feature \
         (cargo run --release -p ch10 --features gpu --example engine -- --gpu PROMPT)"
            .into(),
    )
}

/// `--gpu`: chapter 9's model on the GPU `Gpu::new` picks (an error listing the adapters it
/// saw when there is none), driven by chapter 4's loop: one sequence at a time, each prompt
/// (in a chat, the whole conversation) computed anew. The file is mapped or read as without
/// `--gpu`; the weights are copied from it into GPU memory once.
#[cfg(feature = "gpu")]
fn run_gpu(args: &EngineArgs, path: &Path, t0: Instant) -> Result<(), Box<dyn Error>> {
    match args.files.open(path, args.load_mode())? {
        Opened::Mapped(file, _) => run_gpu_on(args, path, &file, t0),
        Opened::Held(file, _) => run_gpu_on(args, path, &file, t0),
    }
}

#[cfg(feature = "gpu")]
fn run_gpu_on<B: AsRef<[u8]>>(
    args: &EngineArgs,
    path: &Path,
    file: &GgufFile<B>,
    t0: Instant,
) -> Result<(), Box<dyn Error>> {
    let g = &args.generation;
    let tokenizer = Tokenizer::from_gguf(&file.gguf).map_err(|e| in_file(path, e))?;
    let template = ChatTemplate::from_gguf(&file.gguf)
        .ok()
        .or_else(|| arch_template(&file.gguf, &args.archs));
    let gpu = Arc::new(ch09::Gpu::new()?);
    let opts = ch09::GpuOptions {
        n_ctx: g.ctx,
        max_batch: MAX_BATCH_TOKENS,
    };
    let model = ch09::GpuModel::load(gpu, file, opts).map_err(|e| in_file(path, e))?;
    let load_time = t0.elapsed();
    if !g.json {
        eprintln!(
            "model: {} ({} layers, d_model {}, {}; loaded in {:.1} ms)",
            path.display(),
            model.config.n_layer,
            model.config.d_model,
            model.describe(),
            load_time.as_secs_f64() * 1e3
        );
    }
    let mut runner = GpuRunner {
        model,
        tokenizer: &tokenizer,
    };
    cli::drive(
        g,
        &tokenizer,
        template.as_ref(),
        (t0, load_time),
        &mut runner,
    )
}

/// Chapter 4's `generate` over chapter 9's GPU model, a [`Session`](ch04::Session) whose KV
/// cache is in GPU memory.
#[cfg(feature = "gpu")]
struct GpuRunner<'t> {
    model: ch09::GpuModel,
    tokenizer: &'t Tokenizer,
}

#[cfg(feature = "gpu")]
impl Runner for GpuRunner<'_> {
    fn generate(
        &mut self,
        prompt: &[u32],
        params: &GenParams,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Generation, Box<dyn Error>> {
        let n_ctx = self.model.n_ctx;
        if prompt.len() > n_ctx {
            return Err(ContextFull {
                prompt: prompt.len(),
                n_ctx,
            }
            .into());
        }
        self.model.reset();
        Ok(ch04::generate(
            &mut self.model,
            self.tokenizer,
            prompt,
            params,
            on_text,
        )?)
    }

    fn report(&self, report: &mut Report) {
        report.add("gpu", self.model.gpu.describe());
    }
}
