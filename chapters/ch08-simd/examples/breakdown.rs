//! Where the time of a forward pass goes: matrix products, attention, and the rest.
//!
//! Both seams are wrapped with stopwatches: every matrix goes through a `MatrixLoader` that
//! times its products, and the model's `Compute` through one that times each operation. Then
//! a prompt is prefilled and tokens are decoded one by one, and the totals are printed per
//! decoded token and for the prompt — with this chapter's vector kernels, or (`--scalar`) with
//! the scalar reference of chapters 3 and 4.
//!
//! It also measures how fast this machine streams memory with the same threads, reading it as
//! the packed kernels read weights (on huge pages, asking for lines ahead), and sets that
//! against the bytes a decoded token must read (every weight once, plus the KV cache so far):
//! the ceiling no decoder can pass (a roofline).
//!
//! cargo run --release -p ch08 --example breakdown -- --threads 2 [--prompt-tokens 124] [--decode 128] [--scalar] [--json]

use ch01::GgufFile;
use ch01::{Gguf, TensorInfo};
use ch03::AttentionOps;
use ch03::matrix::{LoadError, Matrix, MatrixLoader};
use ch03::{Attention, KvView, RopeTable, TokenPos};
use ch04::{Activation, Compute, Model, Session};
use ch05::ContiguousCache;
use ch08::FastLoader;
use ch08::gemm::{PREFETCH, prefetch_line, zeroed_lines};
use ch08::pool::{PoolKind, new_pool};
use clap::Parser;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

#[derive(Parser)]
struct Cli {
    /// GGUF model file (default: the default model).
    #[arg(long)]
    model: Option<std::path::PathBuf>,
    /// Threads (default: the physical cores).
    #[arg(long, short = 't', default_value_t = ch04::cli::default_threads())]
    threads: usize,
    /// Prompt length in tokens (a repeated sentence).
    #[arg(long, default_value_t = 124)]
    prompt_tokens: usize,
    /// Decode steps to time after the prompt.
    #[arg(long, default_value_t = 128)]
    decode: usize,
    /// Use the scalar reference for attention, norms and SwiGLU.
    #[arg(long)]
    scalar: bool,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// Nanoseconds spent, by category.
#[derive(Default)]
struct Clock {
    products: AtomicU64,
    attention: AtomicU64, // scores, softmax, weighted values
    rope: AtomicU64,
    norms: AtomicU64,
    swiglu: AtomicU64,
    add: AtomicU64,
}

impl Clock {
    fn time<R>(c: &AtomicU64, f: impl FnOnce() -> R) -> R {
        let t0 = Instant::now();
        let r = f();
        c.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        r
    }
    fn take(&self) -> [f64; 6] {
        [
            &self.products,
            &self.attention,
            &self.rope,
            &self.norms,
            &self.swiglu,
            &self.add,
        ]
        .map(|c| c.swap(0, Ordering::Relaxed) as f64 / 1e6)
    }
}

struct TimedMatrix(Box<dyn Matrix>, Arc<Clock>);
impl Matrix for TimedMatrix {
    fn rows(&self) -> usize {
        self.0.rows()
    }
    fn cols(&self) -> usize {
        self.0.cols()
    }
    fn matmul(&self, x: &[f32], out: &mut [f32]) {
        Clock::time(&self.1.products, || self.0.matmul(x, out))
    }
    /// The products a layer fuses (Q, K and V; gate and up) stay fused: the inner matrices
    /// of timed `others` are handed on.
    fn matmul_fused(&self, others: &[&dyn Matrix], x: &[f32], outs: &mut [&mut [f32]]) {
        let mut inners = [&*self.0; 3]; // a layer fuses at most three: Q, K and V
        for (i, &m) in inners.iter_mut().zip(others) {
            *i = match m.as_any().and_then(|a| a.downcast_ref::<Self>()) {
                Some(t) => &*t.0,
                None => m,
            };
        }
        let inners = &inners[..others.len().min(inners.len())];
        assert_eq!(
            inners.len(),
            others.len(),
            "breakdown: at most 3 other matrices"
        );
        Clock::time(&self.1.products, || self.0.matmul_fused(inners, x, outs))
    }
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
    fn get_row(&self, r: usize, out: &mut [f32]) {
        self.0.get_row(r, out)
    }
    fn describe(&self) -> String {
        self.0.describe()
    }
}

struct TimedLoader(FastLoader, Arc<Clock>);
impl MatrixLoader for TimedLoader {
    fn load(&self, g: &Gguf, i: &TensorInfo, b: &[u8]) -> Result<Box<dyn Matrix>, LoadError> {
        Ok(Box::new(TimedMatrix(self.0.load(g, i, b)?, self.1.clone())))
    }
}

struct TimedCompute(Arc<dyn Compute>, Arc<Clock>);
impl AttentionOps for TimedCompute {
    fn rope(&self, rope: &RopeTable, x: &mut [f32], hd: usize, tokens: &[TokenPos]) {
        Clock::time(&self.1.rope, || self.0.rope(rope, x, hd, tokens))
    }
    fn attend(&self, a: &Attention, q: &[f32], t: &[TokenPos], kv: &dyn KvView, o: &mut [f32]) {
        Clock::time(&self.1.attention, || self.0.attend(a, q, t, kv, o))
    }
}
impl Compute for TimedCompute {
    fn rms_norm(&self, x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
        Clock::time(&self.1.norms, || self.0.rms_norm(x, w, eps, out))
    }
    fn glu(&self, act: Activation, gate: &mut [f32], up: &[f32]) {
        Clock::time(&self.1.swiglu, || self.0.glu(act, gate, up))
    }
    fn add(&self, x: &mut [f32], y: &[f32]) {
        Clock::time(&self.1.add, || self.0.add(x, y))
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cli = Cli::parse();
    let path = match cli.model {
        Some(p) => p,
        None => shared::default_model_path()?,
    };
    let file = GgufFile::open(&path)?;
    let clock = Arc::new(Clock::default());
    let fast_pool = new_pool(PoolKind::Spin, cli.threads);
    let fast = FastLoader::new(fast_pool.clone());
    let compute: Arc<dyn Compute> = if cli.scalar {
        Arc::new(ch03::Scalar)
    } else {
        fast.compute()
    };
    let model = Model::load(
        &file,
        &TimedLoader(fast, clock.clone()),
        &ch04::architectures(),
    )?
    .with_compute(Arc::new(TimedCompute(compute.clone(), clock.clone())));
    let n_ctx = cli.prompt_tokens + cli.decode + 1;
    let kv = ContiguousCache::for_model(&model, n_ctx);
    let mut session = ch05::Cached::new(&model, kv, 256);
    // A prompt of distinct-enough tokens: ids walking through the vocabulary.
    let mut tokens: Vec<u32> = (0..cli.prompt_tokens as u32)
        .map(|i| 1000 + (i * 37) % 20_000)
        .collect();

    let names = ["products", "attention", "rope", "norms", "swiglu", "add"];
    let t0 = Instant::now();
    session.next_logits(&tokens, tokens.len())?;
    let prompt_ms = t0.elapsed().as_secs_f64() * 1e3;
    let prompt_parts = clock.take();

    let t0 = Instant::now();
    for i in 0..cli.decode {
        tokens.push(1000 + (i as u32 * 91) % 20_000);
        session.next_logits(&tokens, 1)?;
    }
    let per = 1.0 / cli.decode.max(1) as f64;
    let token_ms = t0.elapsed().as_secs_f64() * 1e3 * per;
    let token_parts = clock.take().map(|v| v * per);

    // The roofline: bytes a decoded token reads, against streaming bandwidth.
    let weight_bytes: u64 = file.gguf.tensors.iter().map(|t| t.n_bytes()).sum();
    let mid = cli.prompt_tokens + cli.decode / 2;
    let kv_bytes = (2 * model.config.n_layer * model.attention.kv_dim() * 4 * mid) as u64;
    // Stream as many bytes as a token reads, so the probe's data sits where the weights sit
    // (in memory, or in a last-level cache large enough to hold the model).
    let gbs = bandwidth(&*fast_pool, (weight_bytes + kv_bytes) as usize);
    let ceiling = gbs * 1e9 / (weight_bytes + kv_bytes) as f64;
    let decode_tok_s = 1e3 / token_ms;

    if cli.json {
        let obj = |total: f64, p: [f64; 6]| {
            let mut m = serde_json::Map::new();
            m.insert("total_ms".into(), total.into());
            for (n, v) in names.iter().zip(p) {
                m.insert(format!("{n}_ms"), v.into());
            }
            m.insert("other_ms".into(), (total - p.iter().sum::<f64>()).into());
            serde_json::Value::Object(m)
        };
        let j = serde_json::json!({
            "model": path.file_name().unwrap_or_default().to_string_lossy(),
            "threads": cli.threads,
            "compute": compute.describe(),
            "prompt_tokens": cli.prompt_tokens,
            "prompt": obj(prompt_ms, prompt_parts),
            "decode_positions": [cli.prompt_tokens, cli.prompt_tokens + cli.decode],
            "token": obj(token_ms, token_parts),
            "weight_bytes": weight_bytes,
            "kv_bytes_per_token": kv_bytes,
            "bandwidth_gb_s": gbs,
            "ceiling_tok_s": ceiling,
            "decode_tok_s": decode_tok_s,
        });
        println!("{j}");
        return Ok(());
    }
    println!(
        "{} on {} thread(s), {}",
        path.file_name().unwrap_or_default().to_string_lossy(),
        cli.threads,
        compute.describe()
    );
    report(
        &format!("prompt of {} tokens", tokens.len() - cli.decode),
        prompt_ms,
        prompt_parts,
        &names,
    );
    report(
        &format!(
            "one decoded token (mean over positions {}..{})",
            cli.prompt_tokens,
            cli.prompt_tokens + cli.decode
        ),
        token_ms,
        token_parts,
        &names,
    );
    println!(
        "a decoded token reads {:.1} MB of weights and {:.1} MB of KV cache; streaming that many \
         bytes with {} thread(s) runs at {gbs:.1} GB/s, so decode cannot pass {ceiling:.0} tok/s: \
         measured {decode_tok_s:.0} tok/s, {:.0} % of that",
        weight_bytes as f64 / 1e6,
        kv_bytes as f64 / 1e6,
        cli.threads,
        100.0 * decode_tok_s / ceiling
    );
    Ok(())
}

/// Read bandwidth in GB/s: the fastest of eight passes summing `bytes` of memory (after one pass
/// to place it), split over the pool's threads (the same threads that run the products). The
/// fastest, because other programs on the machine can only slow a pass down, and a ceiling is
/// what the hardware allows. The memory is read the way the packed kernels read weights: on
/// huge pages, asking for lines `PREFETCH` bytes ahead; a plain loop over 4 KiB pages is slower
/// than the kernels and would be no ceiling.
fn bandwidth(pool: &dyn ch08::Parallel, bytes: usize) -> f64 {
    let mut data = zeroed_lines(bytes / 64, true);
    for (i, line) in data.iter_mut().enumerate() {
        line.0[0] = i as u8;
    }
    let chunk = 1 << 13; // lines per task
    let ahead = PREFETCH / 64;
    let n_tasks = data.len().div_ceil(chunk);
    let sink = AtomicU64::new(0);
    let mut runs: Vec<f64> = (0..9)
        .map(|_| {
            let t0 = Instant::now();
            pool.run(n_tasks, &|i| {
                let part = &data[i * chunk..((i + 1) * chunk).min(data.len())];
                // Eight independent sums, so the loop is limited by loads, not by additions.
                let mut acc = [0u64; 8];
                for (j, line) in part.iter().enumerate() {
                    if let Some(next) = part.get(j + ahead) {
                        prefetch_line(next);
                    }
                    for (k, w) in line.0.chunks_exact(8).enumerate() {
                        acc[k] = acc[k].wrapping_add(u64::from_ne_bytes(w.try_into().unwrap()));
                    }
                }
                sink.fetch_add(
                    acc.iter().fold(0, |a, &b| a.wrapping_add(b)),
                    Ordering::Relaxed,
                );
            });
            bytes as f64 / t0.elapsed().as_secs_f64() / 1e9
        })
        .collect();
    std::hint::black_box(sink.load(Ordering::Relaxed));
    runs.remove(0); // the first pass brings the data to where it will stay
    runs.into_iter().fold(0.0, f64::max)
}
fn report(what: &str, total: f64, parts: [f64; 6], names: &[&str]) {
    let known: f64 = parts.iter().sum();
    print!("{what}: {total:.3} ms =");
    for (n, v) in names.iter().zip(parts) {
        print!(" {n} {v:.3} +");
    }
    println!(
        " other {:.3} (non-product {:.3} ms)",
        total - known,
        total - parts[0]
    );
}
