//! The engine of chapter 10, with a memory budget first: what the run will hold is computed
//! from the header and printed, and a run that cannot fit is refused before anything is
//! allocated.

use crate::budget::{Budget, Holding, available_memory, gb};
use ch01::Config;
use ch10::engine::{self, EngineArgs};
use std::error::Error;

/// Chapter 10's settings, and whether to stop after printing the budget.
#[derive(Debug, Clone)]
pub struct RunArgs {
    pub engine: EngineArgs,
    /// Print the memory budget and exit (`--mem-budget`).
    pub mem_budget: bool,
}

/// The budget of the run `args` asks for, from the file's header alone (a map of which only
/// the header's pages are read).
pub fn budget_of(args: &EngineArgs) -> Result<Budget, Box<dyn Error>> {
    let path = args.generation.model_path()?;
    let gguf = args.files.header(&path)?;
    let config = Config::from_gguf(&gguf, &args.archs.names())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let n_ctx = args
        .generation
        .ctx
        .unwrap_or_else(|| config.default_context());
    let holding = Holding {
        mapped: !args.no_mmap,
        repack: args.repacks(),
    };
    args.cache.check_head_dim(config.head_dim)?;
    Ok(Budget::plan(&gguf, &config, n_ctx, args.cache, holding))
}

// ANCHOR: run
/// Run chapter 10's engine once the budget says the run fits; with `mem_budget`, print the
/// budget and stop.
pub fn run(args: &RunArgs) -> Result<(), Box<dyn Error>> {
    if plan(args)? {
        engine::run(&args.engine)?;
    }
    Ok(())
}

/// The budget before a run: printed, and `false` (nothing to run), with `mem_budget`; else
/// checked against the memory available (an error if the run cannot fit), summed up on
/// standard error unless `--json`, and `true`.
pub fn plan(args: &RunArgs) -> Result<bool, Box<dyn Error>> {
    let budget = budget_of(&args.engine)?;
    let available = available_memory();
    if args.mem_budget {
        print!("{budget}");
        if let Some(a) = available {
            println!("  {:<40} {:>9}", "available now", gb(a));
        }
        return Ok(false);
    }
    if let Some(a) = available {
        budget.check(a)?;
    }
    if !args.engine.generation.json {
        eprintln!(
            "memory: {} resident at {} positions ({} weights, {} KV cache in {})",
            gb(budget.resident()),
            budget.n_ctx,
            gb(budget.weights()),
            gb(budget.kv_cache),
            budget.cache
        );
    }
    Ok(true)
}
// ANCHOR_END: run
