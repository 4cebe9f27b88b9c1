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
//!
//! A second group, `skewed`, gives the router `HOT` hot experts, as a trained router has: the
//! inputs share a direction (a constant added to every value) and the hot experts' router rows
//! point along it, which lifts their logits by about `HOT_LIFT` for every token. The same tokens
//! then choose among fewer experts, and the grouped form reads fewer of them.

use ch01::{GgmlType, TensorInfo};
use ch03::{Matrix, Observer};
use ch04::layer::FeedForward;
use ch04::{Activation, FfnScratch};
use ch06::quants::type_traits;
use ch08::{FastLoader, PoolKind, new_pool};
use ch18::moe::Moe;
use ch18::router::{Weights, route};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use std::hint::black_box;
use std::time::Duration;

const D_MODEL: usize = 2048;
const N_FF_EXP: usize = 768;
const N_EXPERT: usize = 128;
const N_USED: usize = 8;
/// The skewed router's hot experts, and how far their logits are lifted: about twice the
/// spread of the router's logits (a standard deviation of about 36 here), so hot experts win
/// most choices but not all.
const HOT: usize = 16;
const HOT_LIFT: f32 = 80.0;
/// The constant the skewed group's inputs share (the size of the values themselves).
const SHARED: f32 = 0.05;

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

/// One layer: a router in F32 (its first `hot` experts lifted along the shared direction),
/// experts in Q4_0.
fn layer(fast: &FastLoader, hot: usize) -> Moe {
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
    // Logits tens of units apart (a standard deviation of about 36): each token's softmax is
    // nearly all on its top few experts, and the tokens spread over the experts. A hot expert's row
    // gains `lift` in every column: `HOT_LIFT` more on an input whose values share `SHARED`.
    let lift = HOT_LIFT / (D_MODEL as f32 * SHARED);
    let router_bytes: Vec<u8> = values(N_EXPERT * D_MODEL, 4.0)
        .iter()
        .enumerate()
        .map(|(i, v)| v * 20.0 + if i / D_MODEL < hot { lift } else { 0.0 })
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let router = info("router", D_MODEL, N_EXPERT, GgmlType::F32);
    Moe {
        router: Box::new(fast.matrix(&router, router_bytes).unwrap()),
        experts,
        n_used: N_USED,
        weights: Weights::Normalised,
    }
}

/// How many distinct experts `moe`'s router chooses for the tokens `x` (`(n, d_model)`).
fn experts_chosen(moe: &Moe, x: &[f32]) -> usize {
    let n = x.len() / D_MODEL;
    let mut probs = vec![0.0; n * N_EXPERT];
    moe.router.matmul(x, &mut probs);
    let (mut chosen, mut weights) = (vec![0; N_USED], vec![0.0; N_USED]);
    let mut used = [false; N_EXPERT];
    for p in probs.chunks_exact_mut(N_EXPERT) {
        route(p, &mut chosen, &mut weights, Weights::Normalised);
        chosen.iter().for_each(|&e| used[e] = true);
    }
    used.iter().filter(|&&u| u).count()
}

fn bench(c: &mut Criterion) {
    let fast = FastLoader::new(new_pool(PoolKind::Spin, 2));
    let compute = fast.compute();
    for (group, hot, shared) in [
        ("moe_layer_30b_a3b_q4_0", 0, 0.0),
        ("moe_layer_30b_a3b_q4_0_skewed", HOT, SHARED),
    ] {
        run_group(c, &fast, &*compute, group, hot, shared);
    }
}

fn run_group(
    c: &mut Criterion,
    fast: &FastLoader,
    compute: &dyn ch04::Compute,
    group: &str,
    hot: usize,
    shared: f32,
) {
    let moe = layer(fast, hot);
    let mut g = c.benchmark_group(group);
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    for n in [1, 16, 64] {
        let x: Vec<f32> = values(n * D_MODEL, n as f32)
            .iter()
            .map(|v| v + shared)
            .collect();
        eprintln!(
            "{group}: {n} token(s) choose {} of the {N_EXPERT} experts",
            experts_chosen(&moe, &x)
        );
        let (mut a, mut b) = (vec![0.0; n * D_MODEL], vec![0.0; n * D_MODEL]);
        let mut s = FfnScratch::default();
        moe.forward_tokens(compute, &x, &mut a);
        moe.forward_grouped(compute, &mut s, 0, &x, &mut ch03::NoObserver, &mut b);
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
            bch.iter(|| moe.forward_tokens(compute, black_box(&x), &mut a))
        });
        g.bench_with_input(BenchmarkId::new("grouped", n), &n, |bch, _| {
            bch.iter(|| {
                let obs: &mut dyn Observer = &mut ch03::NoObserver;
                moe.forward_grouped(compute, &mut s, 0, black_box(&x), obs, &mut b)
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
