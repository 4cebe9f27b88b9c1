//! One weight row · one activation row, and one activation row quantized, for every kernel
//! and every instruction set this CPU has.
//!
//! Each group is one kernel (`vec_dot_q4_0_q8_0`, `quantize_row_q8_K`, …); its members are the
//! instruction sets (`scalar`, `avx2`, `avx512`, `avx512vnni`, `neon`, `neondotprod`). Sizes:
//! a 4096-element row (a 7B model's hidden size) and the default model's rows, 576 elements
//! (`d_model`), or 1536 (`n_ff`) for the k-quants, whose 256-weight super-blocks do not divide
//! 576. Every result is checked against the scalar one before it is timed.
//!
//! Every kernel this CPU can run is a member, including those no set uses (such as
//! `avx512vnni_ymm` beside `avx512vnni` for the legacy types): the measurements are what
//! chose between them (see the table in `src/kernels/table.rs`). `cargo bench -p ch08 --bench
//! kernels -- vec_dot_q4_0` runs one group.
//!
//! Where the CPU has AVX-512 VNNI, one more group, `mul_mat_packed_4096x4096`: the packed
//! micro-kernels of `gemm/avx512.rs` on one thread, a 4096 × 4096 matrix of each packed type
//! times 1 token (a decode step) and 64 (a prompt), in multiply-adds per second: what each
//! type's tile costs against the others (a Q4_K product as fast as a Q4_0 one, Q6_K's a little
//! slower: a byte per 6-bit code to read).
//!
//! And `attend_decode_16x230`: the attention of one decode step of 16 sequences, each with
//! 230 positions cached, over SmolLM2-135M's 30 layers (9 query heads, 3 KV heads of 64) in a
//! paged f16 or f32 cache: chapter 3's scalar reference, and [`SimdCompute`] on 1 and 2
//! threads. Each step reads all 16 caches once, 85 MB in f16, so it shows how much of such a
//! step is memory and how much arithmetic. Checked against the scalar reference first.

use ch01::GgmlType;
use ch01::config::RopeStyle;
use ch03::{Attention, AttentionOps, KvStore, RopeTable, Scalar, TokenPos};
use ch06::QMatrix;
use ch06::quants::WEIGHT_TYPES;
use ch06::quants::{FromFloat, type_traits};
use ch08::gemm::{ActPanels, OutPtr, PackedMatrix, PackedType};
use ch08::kernels::{Isa, KernelSet, TypeKernels, dot_kernels};
use ch08::{PoolKind, SimdCompute, new_pool};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use std::hint::black_box;
use std::time::Duration;

/// Relative to Σ|w_i · a_i| of the dequantized rows: far above the float-order differences
/// the tests bound (about 2^-23 per block added), far below what a wrong code or a lost block
/// costs.
const CHECK_TOL: f64 = 1e-4;

/// ggml's spelling of a kernel: `vec_dot_q4_K_q8_K`, `vec_dot_f32`.
fn dot_name(k: &TypeKernels) -> String {
    let lower = |t: GgmlType| t.name().to_lowercase().replace("_k", "_K");
    if k.ty == k.act_ty {
        format!("vec_dot_{}", lower(k.ty))
    } else {
        format!("vec_dot_{}_{}", lower(k.ty), lower(k.act_ty))
    }
}

fn sizes(ty: GgmlType) -> [usize; 2] {
    if ty.block_size() == 256 {
        [4096, 1536]
    } else {
        [4096, 576]
    }
}

/// Weights and activations as a model has them: smooth values, quantized by chapter 6.
fn rows(k: &TypeKernels, n: usize) -> (Vec<u8>, Vec<u8>, f64) {
    let w: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 0.05).collect();
    let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
    let bytes = |t: GgmlType| n / t.block_size() as usize * t.type_size() as usize;
    let (tw, ta) = (type_traits(k.ty).unwrap(), type_traits(k.act_ty).unwrap());
    let (mut qw, mut qa) = (vec![0u8; bytes(k.ty)], vec![0u8; bytes(k.act_ty)]);
    (tw.from_float)(&w, &mut qw);
    (ta.from_float)(&a, &mut qa);
    let (mut dw, mut da) = (vec![0f32; n], vec![0f32; n]);
    (tw.to_float)(&qw, &mut dw);
    (ta.to_float)(&qa, &mut da);
    let magnitude = dw.iter().zip(&da).map(|(x, y)| (x * y).abs() as f64).sum();
    (qw, qa, magnitude)
}

/// The activation quantizers for `ty`'s activations: one per instruction set that has its own.
fn quantizers(ty: GgmlType) -> Vec<(Isa, FromFloat)> {
    let mut out: Vec<(Isa, FromFloat)> = Vec::new();
    for set in KernelSet::available() {
        let k = set.get(ty).unwrap();
        if !out.iter().any(|(isa, _)| *isa == k.act_isa) {
            out.push((k.act_isa, k.quantize_act));
        }
    }
    out
}

fn vec_dot(c: &mut Criterion) {
    eprintln!("{}", KernelSet::detect().describe());
    for ty in WEIGHT_TYPES {
        let scalar = KernelSet::SCALAR.get(ty).unwrap();
        let mut group = c.benchmark_group(dot_name(&scalar));
        for n in sizes(ty) {
            let (w, a, magnitude) = rows(&scalar, n);
            let want = (scalar.vec_dot)(n, &w, &a) as f64;
            group.throughput(Throughput::Elements(n as u64));
            for k in dot_kernels(ty) {
                let (name, dot) = (k.name, k.vec_dot);
                let got = dot(n, &w, &a) as f64;
                assert!(
                    (got - want).abs() <= CHECK_TOL * magnitude,
                    "{ty} {name}: {got}, scalar {want}"
                );
                group.bench_function(BenchmarkId::new(name, n), |b| {
                    b.iter(|| dot(black_box(n), black_box(&w), black_box(&a)))
                });
            }
        }
        group.finish();
    }
}

fn quantize(c: &mut Criterion) {
    // One weight type per activation format.
    for (ty, name) in [
        (GgmlType::Q4_0, "quantize_row_q8_0"),
        (GgmlType::Q4_1, "quantize_row_q8_1"),
        (GgmlType::Q4_K, "quantize_row_q8_K"),
    ] {
        let scalar = KernelSet::SCALAR.get(ty).unwrap();
        let mut group = c.benchmark_group(name);
        for n in sizes(ty) {
            let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
            let size = n / scalar.act_ty.block_size() as usize * scalar.act_ty.type_size() as usize;
            let mut want = vec![0u8; size];
            (scalar.quantize_act)(&x, &mut want);
            group.throughput(Throughput::Elements(n as u64));
            for (isa, quantize) in quantizers(ty) {
                let mut out = vec![0u8; size];
                quantize(&x, &mut out);
                assert!(out == want, "{name} {isa}: bytes differ from scalar");
                group.bench_function(BenchmarkId::new(isa.name(), n), |b| {
                    b.iter(|| quantize(black_box(&x), black_box(&mut out)))
                });
            }
        }
        group.finish();
    }
}

fn packed(c: &mut Criterion) {
    let Some(set) = KernelSet::for_isa(Isa::Avx512Vnni) else {
        eprintln!("mul_mat_packed: this CPU has no AVX-512 VNNI, the packed kernels' set");
        return;
    };
    const N: usize = 4096;
    let mut group = c.benchmark_group(format!("mul_mat_packed_{N}x{N}"));
    for p in PackedType::ALL {
        let ty = p.ggml_type();
        let k = set.get(ty).unwrap();
        // Every row the same smooth row: the products differ only by the activations.
        let (row, qa, magnitude) = rows(&k, N);
        let weights = QMatrix::new("w", ty, N, N, row.repeat(N)).unwrap();
        let packed = PackedMatrix::pack(&weights).unwrap();
        for tokens in [1, 64] {
            let x: Vec<f32> = (0..tokens * N).map(|i| (i as f32 * 0.11).cos()).collect();
            let mut acts = ActPanels::new();
            acts.fill(&k, &x, N);
            let mut out = vec![0f32; tokens * N];
            let run = |out: &mut [f32]| {
                // SAFETY: `out` holds `tokens` rows of N floats, and this thread alone
                // writes it.
                unsafe { packed.gemm_groups(&acts, 0..packed.groups, OutPtr(out.as_mut_ptr())) }
            };
            run(&mut out);
            // Row 0 of token 0 (the activations of `rows`) against chapter 6's scalar kernel.
            let want = (KernelSet::SCALAR.get(ty).unwrap().vec_dot)(N, &row, &qa) as f64;
            assert!(
                (out[0] as f64 - want).abs() <= CHECK_TOL * magnitude,
                "{ty} packed × {tokens}: {}, scalar {want}",
                out[0]
            );
            group.throughput(Throughput::Elements((N * N * tokens) as u64));
            group.bench_function(BenchmarkId::new(ty.name(), tokens), |b| {
                b.iter(|| run(&mut out))
            });
        }
    }
    group.finish();
}

/// Largest difference allowed between the SIMD and the scalar attention output, relative to
/// the output's largest magnitude: f32 sums in another order (tiles, an online softmax, vector
/// lanes) differ by a few units of 2^-23 per term; a wrong key, weight or head differs by the
/// values themselves.
const ATTEND_TOL: f32 = 1e-4;

fn attend_decode(c: &mut Criterion) {
    const SEQS: usize = 16;
    const CTX: usize = 230;
    const LAYERS: usize = 30;
    const BLOCK: usize = 16;
    let (n_head, n_head_kv, hd) = (9, 3, 64);
    let kvd = n_head_kv * hd;
    let attn = Attention {
        n_head,
        n_head_kv,
        head_dim: hd,
        rope: RopeTable::new(hd, 10000.0, 1.0, RopeStyle::Normal, 2048),
        window: None,
        kq_scale: Attention::standard_scale(hd),
    };
    let value = |i: usize| ((i as f32) * 0.37).sin() * 2.0;
    // The last position of each sequence decodes: one query row each.
    let tokens: Vec<TokenPos> = (0..SEQS)
        .flat_map(|s| TokenPos::run(s, CTX - 1, 1))
        .collect();
    let q: Vec<f32> = (0..SEQS * n_head * hd).map(|i| value(i * 7 + 1)).collect(); // (SEQS, n_head, hd)
    let mut group = c.benchmark_group(format!("attend_decode_{SEQS}x{CTX}"));
    group.sample_size(10);
    group.throughput(Throughput::Elements((SEQS * CTX * LAYERS) as u64));
    for (cache, types) in [
        ("f16", ch05::CacheTypes::F16),
        ("f32", ch05::CacheTypes::F32),
    ] {
        // Blocks handed out a position of every sequence at a time, as a server's steps do:
        // each sequence's blocks lie all over the pool.
        let blocks = SEQS * CTX.div_ceil(BLOCK);
        let mut kv = ch05::PagedCache::try_typed(LAYERS, kvd, BLOCK, blocks, types).unwrap();
        for p in 0..CTX {
            for s in 0..SEQS {
                kv.reserve(s, p..p + 1).unwrap();
                for l in 0..LAYERS {
                    // (n_head_kv, hd) each
                    let k: Vec<f32> = (0..kvd).map(|i| value((p * 31 + l) * kvd + i)).collect();
                    let v: Vec<f32> = (0..kvd)
                        .map(|i| value((p * 17 + s) * kvd + i + 5))
                        .collect();
                    kv.store(l, s, p, &k, &v);
                }
            }
        }
        let step = |ops: &dyn AttentionOps, out: &mut [f32]| {
            for l in 0..LAYERS {
                ops.attend_batch(&attn, l, &q, &tokens, &kv, out);
            }
        };
        let mut want = vec![0f32; q.len()]; // (SEQS, n_head, hd)
        step(&Scalar, &mut want);
        let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
        // (name, threads, attention)
        let mut members: Vec<(String, usize, Box<dyn AttentionOps>)> =
            vec![(format!("scalar_{cache}"), 1, Box::new(Scalar))];
        for threads in [1, 2] {
            let pool = new_pool(PoolKind::Spin, threads);
            let simd = SimdCompute::new(&KernelSet::best(), pool);
            members.push((format!("simd_{cache}"), threads, Box::new(simd)));
        }
        for (name, threads, ops) in &members {
            let mut out = vec![0f32; q.len()];
            step(ops.as_ref(), &mut out);
            let worst = out
                .iter()
                .zip(&want)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                worst <= ATTEND_TOL * scale,
                "{name}: off by {worst} (of {scale})"
            );
            group.bench_function(BenchmarkId::new(name, threads), |b| {
                b.iter(|| step(ops.as_ref(), &mut out))
            });
        }
    }
    group.finish();
}

criterion_group! {
    name = benches;
    // Kernels take nanoseconds to microseconds: two seconds a member are plenty, and keep
    // the whole run to a few minutes.
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = vec_dot, quantize, packed, attend_decode
}
criterion_main!(benches);
