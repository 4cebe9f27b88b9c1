//! One weight row · one quantized activation row, 4096 elements, for every weight type.
//!
//! Each group is one type; the scalar reference is its first member, and chapter 8 adds its
//! SIMD versions to the same groups. The result is checked against the f64 dot product of the
//! dequantized values before anything is timed.

use ch06::quants::{WEIGHT_TYPES, type_traits};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use std::hint::black_box;

const N: usize = 4096;

/// Relative to the sum of |products|: f32 rounding, and Q8_1's f16 `s` (2^-11).
const CHECK_TOL: f64 = 1e-3;

fn vec_dot(c: &mut Criterion) {
    let w: Vec<f32> = (0..N).map(|i| (i as f32 * 0.37).sin() * 0.05).collect();
    let a: Vec<f32> = (0..N).map(|i| (i as f32 * 0.11).cos()).collect();
    for ty in WEIGHT_TYPES {
        let t = type_traits(ty).unwrap();
        let act = type_traits(t.vec_dot_type).unwrap();
        let mut qw = vec![0u8; N / t.block_size * t.type_size];
        let mut qa = vec![0u8; N / act.block_size * act.type_size];
        (t.from_float)(&w, &mut qw);
        (act.from_float)(&a, &mut qa);
        let dot = t.vec_dot.unwrap();

        let (mut dw, mut da) = (vec![0f32; N], vec![0f32; N]);
        (t.to_float)(&qw, &mut dw);
        (act.to_float)(&qa, &mut da);
        let want: f64 = dw.iter().zip(&da).map(|(&x, &y)| x as f64 * y as f64).sum();
        let got = dot(N, &qw, &qa) as f64;
        let magnitude: f64 = dw.iter().zip(&da).map(|(x, y)| (x * y).abs() as f64).sum();
        assert!(
            (got - want).abs() <= CHECK_TOL * magnitude,
            "{ty}: vec_dot {got}, dequantized dot {want}"
        );

        // ggml's spelling: vec_dot_q4_0, vec_dot_q4_K.
        let name = ty.name().to_lowercase().replace("_k", "_K");
        let mut group = c.benchmark_group(format!("vec_dot_{name}"));
        group.throughput(Throughput::Elements(N as u64));
        group.bench_function(BenchmarkId::new("scalar", N), |b| {
            b.iter(|| dot(black_box(N), black_box(&qw), black_box(&qa)))
        });
        group.finish();
    }
}

criterion_group!(benches, vec_dot);
criterion_main!(benches);
