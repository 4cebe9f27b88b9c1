//! The cost of producing token n, without and with a KV cache, on the default model.
//!
//! Uncached (chapter 4), token n costs a forward pass over all n tokens: the total for n tokens
//! grows as n². Cached, it costs one token's forward pass plus attention over n cached
//! positions: nearly constant per token, so the total grows as n.
//!
//! cargo bench -p ch05

use ch01::GgufFile;
use ch03::{DenseLoader, NoObserver};
use ch04::{Batch, Model, Session, Uncached};
use ch05::{Cached, ContiguousCache};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use std::hint::black_box;

fn token_n(c: &mut Criterion) {
    let file = GgufFile::open(shared::default_model_path().unwrap()).unwrap();
    let model = Model::load(&file, &DenseLoader, &ch04::architectures()).unwrap();
    let tokens: Vec<u32> = (0..256).map(|i| 1000 + 7 * i).collect();
    let mut g = c.benchmark_group("token_n");
    g.sample_size(10);
    for n in [8usize, 16, 32, 64, 128, 256] {
        let seq = &tokens[..n];
        // Validate before timing: both ways give the same logits for token n.
        let uncached = Uncached::new(&model).next_logits(seq, n).unwrap().to_vec();
        let kv = ContiguousCache::for_model(&model, 256);
        let mut cached = Cached::new(&model, kv, 256);
        cached.next_logits(&seq[..n - 1], n - 1).unwrap();
        let last = cached.next_logits(seq, 1).unwrap().to_vec();
        assert_eq!(
            uncached, last,
            "cached and uncached logits differ at n = {n}"
        );

        g.bench_with_input(BenchmarkId::new("uncached", n), &n, |b, _| {
            let mut session = Uncached::new(&model);
            b.iter(|| black_box(session.next_logits(seq, n).unwrap()[0]))
        });
        g.bench_with_input(BenchmarkId::new("cached", n), &n, |b, _| {
            b.iter(|| {
                // the cache holds n - 1 positions; compute token n and forget it again
                cached.kv.truncate(n - 1);
                let batch = Batch::sequence(0, &seq[n - 1..], n - 1, false);
                black_box(
                    model
                        .forward(&batch, &mut cached.kv, &mut NoObserver)
                        .unwrap(),
                )
            })
        });
    }
    g.finish();
}

criterion_group!(benches, token_n);
criterion_main!(benches);
