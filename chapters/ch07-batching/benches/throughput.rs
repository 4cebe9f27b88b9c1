//! Generated tokens per second for 1, 2, 4 and 8 concurrent requests: one at a time (chapter
//! 5's engine) against batched through the scheduler, on the default model with its quantized
//! weights. Every iteration generates 16 tokens for each request; both ways are validated to
//! produce the same tokens before anything is timed.
//!
//! cargo bench -p ch07
//!
//! Each iteration is a whole run (seconds), so the group takes ten samples of one iteration
//! each: several minutes in all. `cargo run --release -p ch07 --example throughput_table`
//! prints the same comparison as a table, faster.

use ch01::GgufFile;
use ch02::Tokenizer;
use ch04::Model;
use ch06::QuantLoader;
use ch07::throughput::{self, PROMPTS};
use criterion::{
    BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group, criterion_main,
};
use std::hint::black_box;
use std::time::Duration;

fn throughput(c: &mut Criterion) {
    let file = GgufFile::open(shared::default_model_path().unwrap()).unwrap();
    let tok = Tokenizer::from_gguf(&file.gguf).unwrap();
    let model = Model::load(&file, &QuantLoader, &ch04::architectures()).unwrap();
    let params = throughput::params();

    let mut g = c.benchmark_group("throughput");
    g.sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(1))
        .measurement_time(Duration::from_secs(1));
    for n in [1usize, 2, 4, 8] {
        let prompts: Vec<Vec<u32>> = PROMPTS[..n]
            .iter()
            .map(|p| tok.encode(p, true, true))
            .collect();
        let config = throughput::config_for(&prompts, &params);
        // Validate before timing: batching changes no token.
        let alone = throughput::one_at_a_time(&model, &tok, &prompts, &params).unwrap();
        let batched = throughput::batched(&model, &tok, &prompts, &params, config.clone()).unwrap();
        assert_eq!(
            alone.outputs, batched.outputs,
            "{n} requests: batched tokens differ"
        );
        g.throughput(Throughput::Elements(alone.generated() as u64));

        g.bench_with_input(BenchmarkId::new("one_at_a_time", n), &n, |b, _| {
            b.iter(|| {
                black_box(throughput::one_at_a_time(&model, &tok, &prompts, &params).unwrap())
            })
        });
        g.bench_with_input(BenchmarkId::new("batched", n), &n, |b, _| {
            b.iter(|| {
                black_box(
                    throughput::batched(&model, &tok, &prompts, &params, config.clone()).unwrap(),
                )
            })
        });
    }
    g.finish();
}

criterion_group!(benches, throughput);
criterion_main!(benches);
