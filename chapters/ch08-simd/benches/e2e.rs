//! The whole model on the default Q4_1 file: one decode step, a 128-token prompt, and the
//! cost of one fork and join of the thread pools.
//!
//! - `decode`: the forward pass of one token at position 64 (the KV cache holds 64 positions
//!   and is truncated back after each step); throughput in tokens.
//! - `prefill`: the forward pass of a 128-token prompt into an empty cache.
//!
//! Members: `scalar_1t` (chapter 6's engine: scalar kernels, one thread), `simd_1t` and
//! `simd_2t` (this chapter's: the detected kernel set for products, attention and norms,
//! packed rows where it can, our spin pool with one and two threads), and `simd_2t_rayon`
//! (the same on a rayon pool). Every engine's logits are compared with chapter 6's before
//! anything is timed.
//!
//! - `fork_join`: `Parallel::run` with one task per thread, each waiting until all have
//!   started: what a matrix product pays to wake the threads and wait for them, 211 times per
//!   decoded token.
//!
//! cargo bench -p ch08 --bench e2e [-- decode]

use ch01::GgufFile;
use ch03::NoObserver;
use ch04::{Batch, Model, sampling::argmax};
use ch05::ContiguousCache;
use ch06::QuantLoader;
use ch08::FastLoader;
use ch08::kernels::KernelSet;
use ch08::pool::{Parallel, RayonPool, SpinPool};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

const PREFILL: usize = 128;
const DECODE_AT: usize = 64;

fn tokens() -> Vec<u32> {
    (0..PREFILL as u32).map(|i| 1000 + 37 * i).collect()
}

fn engines(file: &GgufFile) -> Vec<(&'static str, Model)> {
    // This chapter's engine whole: packed products and its attention and norms
    // (`FastLoader::compute`), as `generate_simd` and the finished engine run it.
    let fast = |pool: Arc<dyn Parallel>| {
        let loader = FastLoader {
            kernels: KernelSet::detect(),
            pool,
            pack: true,
        };
        Model::load(file, &loader, &ch04::architectures())
            .unwrap()
            .with_compute(loader.compute())
    };
    vec![
        (
            "scalar_1t",
            Model::load(file, &QuantLoader, &ch04::architectures()).unwrap(),
        ),
        ("simd_1t", fast(Arc::new(SpinPool::new(1)))),
        ("simd_2t", fast(Arc::new(SpinPool::new(2)))),
        ("simd_2t_rayon", fast(Arc::new(RayonPool::new(2)))),
    ]
}

fn cache(model: &Model) -> ContiguousCache {
    ContiguousCache::for_model(model, PREFILL + 1)
}

fn e2e(c: &mut Criterion) {
    let file = GgufFile::open(shared::default_model_path().unwrap()).unwrap();
    let engines = engines(&file);
    let tokens = tokens();
    eprintln!("{}", KernelSet::detect().describe());

    // Validate first: every engine picks chapter 6's next token after the prompt (they are
    // bit-identical where all matrices are packed; tests/engine.rs checks that).
    let prefill = |m: &Model, kv: &mut ContiguousCache, n: usize| {
        kv.clear();
        m.forward(
            &Batch::sequence(0, &tokens[..n], 0, false),
            kv,
            &mut NoObserver,
        )
        .unwrap()
    };
    let want = argmax(&prefill(&engines[0].1, &mut cache(&engines[0].1), PREFILL));
    for (name, m) in &engines {
        let got = argmax(&prefill(m, &mut cache(m), PREFILL));
        assert_eq!(
            got, want,
            "{name}: next token after the prompt differs from chapter 6's"
        );
    }

    let mut g = c.benchmark_group("decode");
    g.throughput(Throughput::Elements(1));
    g.warm_up_time(Duration::from_secs(1));
    for (name, m) in &engines {
        let mut kv = cache(m);
        prefill(m, &mut kv, DECODE_AT);
        let next = [tokens[DECODE_AT]];
        g.bench_function(BenchmarkId::new(*name, DECODE_AT), |b| {
            b.iter(|| {
                kv.truncate(DECODE_AT);
                let batch = Batch::sequence(0, &next, DECODE_AT, false);
                black_box(m.forward(&batch, &mut kv, &mut NoObserver).unwrap())
            })
        });
    }
    g.finish();

    let mut g = c.benchmark_group("prefill");
    g.throughput(Throughput::Elements(PREFILL as u64));
    g.sample_size(10);
    g.warm_up_time(Duration::from_secs(1));
    for (name, m) in &engines {
        let mut kv = cache(m);
        g.bench_function(BenchmarkId::new(*name, PREFILL), |b| {
            b.iter(|| black_box(prefill(m, &mut kv, PREFILL)))
        });
    }
    g.finish();
}

fn fork_join(c: &mut Criterion) {
    let mut g = c.benchmark_group("fork_join");
    let pools: Vec<(&str, Box<dyn Parallel>)> = vec![
        ("spin", Box::new(SpinPool::new(2))),
        ("rayon", Box::new(RayonPool::new(2))),
    ];
    for (name, pool) in &pools {
        let n = pool.threads();
        g.bench_function(BenchmarkId::new(*name, n), |b| {
            b.iter(|| {
                // Every task waits until all have started, so each thread must take one: an
                // empty task would let the calling thread run them all when a worker is slow
                // to wake, and measure nothing.
                let started = AtomicUsize::new(0);
                pool.run(n, &|_| {
                    started.fetch_add(1, Ordering::SeqCst);
                    while started.load(Ordering::SeqCst) < n {
                        std::hint::spin_loop();
                    }
                })
            })
        });
    }
    g.finish();
}

criterion_group!(benches, e2e, fork_join);
criterion_main!(benches);
