//! One mixture-of-experts layer at Qwen3-30B-A3B's width (d_model 2048, 128 experts of 768, 8
//! used per token), its experts in Q4_0, on chapter 8's packed matrices and two threads: token
//! by token (`Moe::forward_tokens`, each expert read once per token that chose it) against
//! expert by expert (`Moe::forward_grouped`, each chosen expert read once per batch), for a
//! decode step (1 token) and prompts of 16 and 64 tokens.
//!
//! One token reads 8 of the 128 experts, 8 × 3 × 0.84 MiB = 20 MiB of the layer's 324 MiB.
//! Sixty-four tokens choose 512 times among 128 experts: token by token that is 512 expert
//! reads, grouped at most 128, so the grouped form reads each weight once where the other
//! reads it about four times, and runs each expert's products on several rows at once.
//!
//! The experts share one matrix's bytes (copied, so each is its own memory): quantizing 384
//! distinct matrices would take longer than the measurement, and the router, random, spreads
//! the tokens as evenly either way. `cargo bench -p ch18`.

use ch01::{GgmlType, TensorInfo};
use ch03::{Matrix, Observer};
use ch04::layer::FeedForward;
use ch04::{Activation, FfnScratch};
use ch06::quants::type_traits;
use ch08::{FastLoader, PoolKind, new_pool};
use ch18::moe::Moe;
use ch18::router::Weights;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use std::hint::black_box;
use std::time::Duration;

const D_MODEL: usize = 2048;
const N_FF_EXP: usize = 768;
const N_EXPERT: usize = 128;
const N_USED: usize = 8;

/// Smooth seeded values of about a trained model's size.
fn values(n: usize, seed: f32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as f32 * 0.618 + seed) * 12.9898).sin() * 0.05)
        .collect()
}

fn info(name: &str, cols: usize, rows: usize, ty: GgmlType) -> TensorInfo {
    TensorInfo {
        name: name.into(),
        dims: vec![cols as u64, rows as u64],
        ggml_type: ty,
        offset: 0,
    }
}

/// One layer: a router in F32, experts in Q4_0.
fn layer(fast: &FastLoader) -> Moe {
    let q4 = type_traits(GgmlType::Q4_0).unwrap();
    let quantize = |rows: usize, cols: usize, seed: f32| {
        let mut q = vec![0u8; rows * cols / 32 * 18];
        (q4.from_float)(&values(rows * cols, seed), &mut q);
        q
    };
    let (gate, up, down) = (
        quantize(N_FF_EXP, D_MODEL, 1.0),
        quantize(N_FF_EXP, D_MODEL, 2.0),
        quantize(D_MODEL, N_FF_EXP, 3.0),
    );
    let matrix = |name: &str, cols, rows, bytes: &Vec<u8>| -> Box<dyn Matrix> {
        let i = info(name, cols, rows, GgmlType::Q4_0);
        Box::new(fast.matrix(&i, bytes.clone()).unwrap())
    };
    let experts = (0..N_EXPERT)
        .map(|_| FeedForward {
            gate: matrix("gate", D_MODEL, N_FF_EXP, &gate),
            up: matrix("up", D_MODEL, N_FF_EXP, &up),
            down: matrix("down", N_FF_EXP, D_MODEL, &down),
            act: Activation::Silu,
        })
        .collect();
    // Logits a few units apart, so the tokens spread over the experts.
    let router_bytes: Vec<u8> = values(N_EXPERT * D_MODEL, 4.0)
        .iter()
        .flat_map(|v| (v * 20.0).to_le_bytes())
        .collect();
    let router = info("router", D_MODEL, N_EXPERT, GgmlType::F32);
    Moe {
        router: Box::new(fast.matrix(&router, router_bytes).unwrap()),
        experts,
        n_used: N_USED,
        weights: Weights::Normalised,
    }
}

fn bench(c: &mut Criterion) {
    let fast = FastLoader::new(new_pool(PoolKind::Spin, 2));
    let compute = fast.compute();
    let moe = layer(&fast);
    let mut g = c.benchmark_group("moe_layer_30b_a3b_q4_0");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    for n in [1, 16, 64] {
        let x = values(n * D_MODEL, n as f32);
        let (mut a, mut b) = (vec![0.0; n * D_MODEL], vec![0.0; n * D_MODEL]);
        let mut s = FfnScratch::default();
        moe.forward_tokens(&*compute, &x, &mut a);
        moe.forward_grouped(&*compute, &mut s, 0, &x, &mut ch03::NoObserver, &mut b);
        let worst = a
            .iter()
            .zip(&b)
            .map(|(p, q)| (p - q).abs())
            .fold(0f32, f32::max);
        let scale = a.iter().map(|v| v.abs()).fold(0f32, f32::max);
        assert!(
            worst <= 1e-5 * scale.max(1.0),
            "grouped and token by token differ at {n} tokens"
        );
        g.throughput(Throughput::Elements(n as u64));
        g.bench_with_input(BenchmarkId::new("tokens", n), &n, |bch, _| {
            bch.iter(|| moe.forward_tokens(&*compute, black_box(&x), &mut a))
        });
        g.bench_with_input(BenchmarkId::new("grouped", n), &n, |bch, _| {
            bch.iter(|| {
                let obs: &mut dyn Observer = &mut ch03::NoObserver;
                moe.forward_grouped(&*compute, &mut s, 0, black_box(&x), obs, &mut b)
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
