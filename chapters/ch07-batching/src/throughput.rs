//! The measurement behind the chapter's throughput table (`benches/throughput.rs` and the
//! `throughput_table` example both run it): the same prompts one at a time, with chapter 5's
//! cached session through chapter 4's generation loop, and all at once through the scheduler.
//!
//! Besides wall-clock time, a run records the time its thread spent on a CPU (where the
//! operating system reports it): on a machine shared with other work, wall-clock time includes
//! waiting for a CPU, and on-CPU time does not.

use crate::request::Request;
use crate::scheduler::{BatchModel, Scheduler, SchedulerConfig, SchedulerError};
use ch02::Tokenizer;
use ch04::{ForwardError, GenParams, Model, SamplerParams, generate};
use ch05::Cached;
use std::time::{Duration, Instant};

/// Short prompts of different lengths, one per concurrent request.
pub const PROMPTS: [&str; 16] = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "The three primary colors are",
    "def fibonacci(n):",
    "The best way to learn a new language is",
    "Water boils at",
    "My favourite book is",
    "In 1969, the first humans to walk on the Moon",
    "The recipe for a good bread starts with",
    "Photosynthesis is the process by which",
    "Dear Sir or Madam,",
    "The largest planet in the solar system is",
    "A haiku about autumn:",
    "To install the package, run",
    "The main causes of the French Revolution were",
    "Rust's borrow checker",
];

/// The numbers of concurrent requests the table measures.
pub const CONCURRENCY: [usize; 5] = [1, 2, 4, 8, 16];

/// Tokens generated per prompt.
pub const N_GENERATE: usize = 16;

/// Greedy generation of [`N_GENERATE`] tokens, no stop strings.
pub fn params() -> GenParams {
    GenParams {
        max_tokens: N_GENERATE,
        sampler: SamplerParams::greedy(),
        stop: Vec::new(),
        rule: None,
    }
}

/// What a run produced, and how long it took.
#[derive(Debug, Clone)]
pub struct Run {
    /// Generated ids of each prompt, in prompt order.
    pub outputs: Vec<Vec<u32>>,
    /// Wall-clock time.
    pub elapsed: Duration,
    /// Time the thread spent on a CPU, where the system says (Linux).
    pub on_cpu: Option<Duration>,
}

impl Run {
    pub fn generated(&self) -> usize {
        self.outputs.iter().map(Vec::len).sum()
    }
    /// Generated tokens per wall-clock second, all requests together.
    pub fn tok_s(&self) -> f64 {
        self.generated() as f64 / self.elapsed.as_secs_f64()
    }
    /// Generated tokens per second on a CPU.
    pub fn tok_per_cpu_s(&self) -> Option<f64> {
        self.on_cpu
            .map(|t| self.generated() as f64 / t.as_secs_f64())
    }
}

/// Time the calling thread has spent on a CPU so far: the first field of Linux's
/// `schedstat`, in nanoseconds. `None` elsewhere.
pub fn thread_cpu_time() -> Option<Duration> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = s.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

/// Run `f`, timing it both ways.
fn timed<T, E>(f: impl FnOnce() -> Result<T, E>) -> Result<(T, Duration, Option<Duration>), E> {
    let (c0, t0) = (thread_cpu_time(), Instant::now());
    let out = f()?;
    let elapsed = t0.elapsed();
    let on_cpu = thread_cpu_time()
        .zip(c0)
        .map(|(c1, c0)| c1.saturating_sub(c0));
    Ok((out, elapsed, on_cpu))
}

/// Each prompt alone, one after the other: chapter 5's engine.
pub fn one_at_a_time(
    model: &Model,
    tok: &Tokenizer,
    prompts: &[Vec<u32>],
    params: &GenParams,
) -> Result<Run, ForwardError> {
    let (outputs, elapsed, on_cpu) = timed(|| -> Result<_, ForwardError> {
        let mut outputs = Vec::new();
        for p in prompts {
            let mut session = Cached::contiguous(model, Some(p.len() + params.max_tokens));
            outputs.push(generate(&mut session, tok, p, params, &mut |_| {})?.ids);
        }
        Ok(outputs)
    })?;
    Ok(Run {
        outputs,
        elapsed,
        on_cpu,
    })
}

/// The scheduler's configuration for `prompts`: all of them running at once, every prompt
/// read in one step, and a pool with room for all.
pub fn config_for(prompts: &[Vec<u32>], params: &GenParams) -> SchedulerConfig {
    let block_size = 16;
    let total: usize = prompts.iter().map(|p| p.len()).sum();
    let blocks: usize = prompts
        .iter()
        .map(|p| (p.len() + params.max_tokens).div_ceil(block_size))
        .sum();
    SchedulerConfig {
        max_batch_tokens: total.max(prompts.len()).max(1),
        max_running: prompts.len().max(1),
        block_size,
        n_blocks: blocks.max(1),
        prefix_cache: false,
        cache: Default::default(),
    }
}

// ANCHOR: batched
/// All prompts at once through the scheduler.
pub fn batched<M: BatchModel>(
    model: &M,
    tok: &Tokenizer,
    prompts: &[Vec<u32>],
    params: &GenParams,
    config: SchedulerConfig,
) -> Result<Run, SchedulerError> {
    let (mut done, elapsed, on_cpu) = timed(|| -> Result<_, SchedulerError> {
        let mut scheduler = Scheduler::new(model, tok, config)?;
        for p in prompts {
            scheduler.submit(Request {
                prompt: p.clone(),
                params: params.clone(),
            })?;
        }
        scheduler.run(&mut ())
    })?;
    done.sort_by_key(|f| f.id);
    Ok(Run {
        outputs: done.into_iter().map(|f| f.ids).collect(),
        elapsed,
        on_cpu,
    })
}
// ANCHOR_END: batched

/// The median of `runs` by `key` (`None` if any run lacks it).
fn median(runs: &[Run], key: impl Fn(&Run) -> Option<f64>) -> Option<f64> {
    let mut v: Vec<f64> = runs.iter().map(key).collect::<Option<_>>()?;
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

/// The throughput table of `model`: for each of [`CONCURRENCY`], the first that many of
/// [`PROMPTS`] one at a time and batched, `runs` times each, checking that batching changes
/// no token; Markdown rows of medians. With `on_cpu`, the speed-up is of tokens per second the
/// calling thread spent on a CPU (right for a single-threaded engine on a shared machine);
/// otherwise of wall-clock tokens per second.
pub fn table(
    model: &Model,
    tok: &Tokenizer,
    runs: usize,
    on_cpu: bool,
) -> Result<String, Box<dyn std::error::Error>> {
    let params = params();
    let show = |x: Option<f64>| x.map_or("n/a".to_string(), |x| format!("{x:.1}"));
    let basis = if on_cpu { "CPU time" } else { "wall clock" };
    let mut out = format!(
        "| concurrent requests | one at a time (tok/s on CPU) | batched (tok/s on CPU) | speed-up ({basis}) | one at a time (tok/s wall) | batched (tok/s wall) |\n|---:|---:|---:|---:|---:|---:|\n",
    );
    for n in CONCURRENCY {
        let prompts: Vec<Vec<u32>> = PROMPTS[..n]
            .iter()
            .map(|p| tok.encode(p, true, true))
            .collect();
        let config = config_for(&prompts, &params);
        let (mut alone, mut together) = (Vec::new(), Vec::new());
        for _ in 0..runs.max(1) {
            alone.push(one_at_a_time(model, tok, &prompts, &params)?);
            together.push(batched(model, tok, &prompts, &params, config.clone())?);
        }
        if alone
            .iter()
            .zip(&together)
            .any(|(a, b)| a.outputs != b.outputs)
        {
            return Err(format!("{n} requests: batched tokens differ from one at a time").into());
        }
        let cpu = |r: &[Run]| {
            if on_cpu {
                median(r, Run::tok_per_cpu_s)
            } else {
                None
            }
        };
        let wall = |r: &[Run]| median(r, |r| Some(r.tok_s()));
        let (a_cpu, b_cpu, a_wall, b_wall) =
            (cpu(&alone), cpu(&together), wall(&alone), wall(&together));
        let speedup = match (a_cpu.zip(b_cpu), a_wall.zip(b_wall)) {
            (Some((a, b)), _) | (None, Some((a, b))) => format!("{:.2}×", b / a),
            _ => "n/a".to_string(),
        };
        out += &format!(
            "| {n} | {} | {} | {speedup} | {} | {} |\n",
            show(a_cpu),
            show(b_cpu),
            show(a_wall),
            show(b_wall)
        );
    }
    Ok(out)
}

/// The name of this machine's CPU, for the caption of a table.
pub fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|n| n.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".to_string())
}
