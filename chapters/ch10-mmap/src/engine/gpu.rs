//! `--gpu`: chapter 9's model on the GPU, one sequence at a time (`run_gpu` and its
//! `GpuRunner`), or, built without the `gpu` feature, an error saying how to get it.

use super::EngineArgs;
use std::error::Error;
use std::path::Path;
use std::time::Instant;
#[cfg(feature = "gpu")]
use {
    super::open::{arch_template, in_file},
    super::{MAX_BATCH_TOKENS, Opened},
    ch01::GgufFile,
    ch02::{ChatTemplate, Tokenizer},
    ch04::cli::{self, ContextFull, Report, Runner},
    ch04::{GenParams, Generation},
    std::sync::Arc,
};

/// `--gpu` in an engine built without the `gpu` feature.
#[cfg(not(feature = "gpu"))]
pub(super) fn run_gpu(_: &EngineArgs, _: &Path, _: Instant) -> Result<(), Box<dyn Error>> {
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
pub(super) fn run_gpu(args: &EngineArgs, path: &Path, t0: Instant) -> Result<(), Box<dyn Error>> {
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
    // Chapter 9's GPU architectures: a file of another one is refused by name.
    let archs = ch09::gpu_architectures();
    let model = ch09::GpuModel::load(gpu, file, &archs, opts).map_err(|e| in_file(path, e))?;
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
