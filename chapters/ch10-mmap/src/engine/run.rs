//! The command line's entry points: [`run`] (load, then drive), [`load`] (with progress, as
//! `--ctx` and `--json` say) and [`drive`] (chapter 4's loop over a runner).

use super::gpu::run_gpu;
use super::{Engine, EngineArgs, LoadProgress, Scheduled};
use ch04::cli::{self, Runner};
use ch08::FastLoader;
use std::error::Error;
use std::path::PathBuf;
use std::time::Instant;

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
