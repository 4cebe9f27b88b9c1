//! One decoded token's product with a matrix larger than most CPUs' caches, the way a decoder
//! meets it: every weight byte read once, in order. The matrix has the shape and type of Gemma
//! 3's output table (262,144 × 640, Q8_0: 178 MB), the largest single read of a model with a
//! large vocabulary. (A server CPU's last-level cache can hold it: for a stream from memory on
//! any machine, see the `prefetch_distance` example, which reads a whole 8B model.)
//!
//! Members, for one and two threads: `plain` (neither of the two below), `prefetch` (the
//! kernels ask for lines [`PREFETCH`] bytes ahead), `huge_pages` (the packed bytes advised onto
//! 2 MiB pages) and `both` (the default). Throughput is the file's bytes per second: compare it
//! with what a plain loop streaming memory reaches on the machine (chapter 8's `breakdown`
//! example prints that). Every member's output is checked against `plain`'s before anything
//! is timed: prefetching and page size change where bytes come from, never the result.
//!
//! cargo bench -p ch08 --bench memory; `scripts/machine-tables ch08-memory` runs it and writes
//! the book's table.

use ch01::GgmlType;
use ch03::matrix::Matrix;
use ch06::QMatrix;
use ch08::FastMatrix;
use ch08::fast_matrix::Store;
use ch08::gemm::{PREFETCH, PackedMatrix};
use ch08::kernels::KernelSet;
use ch08::pool::{Parallel, SpinPool};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

const ROWS: usize = 262_144;
const COLS: usize = 640;

/// Q8_0 blocks of varied codes, each with the scale 2^-7: `(rows, cols / 32)` blocks of 34
/// bytes. Quantizing floats would take longer than the bench.
fn weights() -> QMatrix {
    let nb = COLS / 32;
    let mut bytes = vec![0u8; ROWS * nb * 34];
    let d = half::f16::from_f32(1.0 / 128.0).to_le_bytes();
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for blk in bytes.chunks_exact_mut(34) {
        blk[..2].copy_from_slice(&d);
        for q in &mut blk[2..] {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *q = x as u8;
        }
    }
    QMatrix::new("output.weight", GgmlType::Q8_0, ROWS, COLS, bytes).expect("a Q8_0 matrix")
}

fn product(c: &mut Criterion) {
    let q = weights();
    let bytes = q.data.len() as u64;
    let kernels = KernelSet::detect();
    let x: Vec<f32> = (0..COLS).map(|i| (i as f32 * 0.11).cos()).collect();
    let mut group = c.benchmark_group("mul_mat_vec_q8_0_262144x640");
    group.throughput(Throughput::Bytes(bytes));
    group.sample_size(20);
    group.measurement_time(Duration::from_secs(4));
    for threads in [1, 2] {
        let pool: Arc<dyn Parallel> = Arc::new(SpinPool::new(threads));
        let mut want: Option<Vec<f32>> = None;
        for (name, prefetch, huge_pages) in [
            ("plain", 0, false),
            ("prefetch", PREFETCH, false),
            ("huge_pages", 0, true),
            ("both", PREFETCH, true),
        ] {
            let Some(mut p) = PackedMatrix::pack_with(&q, huge_pages) else {
                eprintln!("no packed kernels on this CPU (AVX-512 VNNI): nothing to measure");
                return;
            };
            p.prefetch = prefetch;
            let m = FastMatrix {
                store: Store::<Vec<u8>>::Packed(p),
                ty: q.ty,
                rows: ROWS,
                cols: COLS,
                kernels: kernels.get(q.ty).expect("Q8_0 kernels"),
                pool: pool.clone(),
            };
            let mut out = vec![0f32; ROWS];
            m.matmul(&x, &mut out);
            match &want {
                None => want = Some(out.clone()),
                Some(w) => assert!(w == &out, "{name}: a different product than plain's"),
            }
            group.bench_function(BenchmarkId::new(name, threads), |b| {
                b.iter(|| m.matmul(black_box(&x), &mut out))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, product);
criterion_main!(benches);
