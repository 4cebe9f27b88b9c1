//! A memory budget before chapter 10's engine loads: what the run will hold is computed from
//! the header and printed, and a run that cannot fit is refused before anything is allocated.
//! (`llm-rs run` calls [`plan`] before it loads the model.)

use crate::budget::{Budget, Holding, available_memory, gb};
use ch01::Config;
use ch10::engine::EngineArgs;
use std::error::Error;

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
/// The budget of the run `args` ask for, before it loads: printed, and `false` (nothing to
/// run), with `mem_budget` (`--mem-budget`); else checked against the memory available (an
/// error if the run cannot fit), summed up on standard error unless `--json`, and `true`.
pub fn plan(args: &EngineArgs, mem_budget: bool) -> Result<bool, Box<dyn Error>> {
    let budget = budget_of(args)?;
    let available = available_memory();
    if mem_budget {
        print!("{budget}");
        if let Some(a) = available {
            println!("  {:<40} {:>9}", "available now", gb(a));
        }
        return Ok(false);
    }
    if let Some(a) = available {
        budget.check(a)?;
    }
    if !args.generation.json {
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
