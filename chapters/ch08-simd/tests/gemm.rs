//! The fast matrix product against chapter 6's scalar one, on random matrices.
//!
//! For 32-weight blocks, the packed micro-kernel performs, in each lane, the operations of
//! chapter 6's scalar `vec_dot` in the same order, and so do the SIMD `vec_dot`s of the
//! row-at-a-time path; the activation quantizers of every kernel set give the scalar bytes. So
//! both layouts' products must equal chapter 6's exactly, for any number of tokens and threads.
//! The k-quant kernels add the same exact integer sums in another order; they are held to a
//! float-rounding tolerance.

use ch01::GgmlType;
use ch03::Matrix;
use ch06::{QMatrix, quantize_chunk};
use ch08::fast_matrix::{FastMatrix, Store};
use ch08::gemm::{PackedMatrix, PackedType};
use ch08::kernels::{Isa, KernelSet};
use ch08::pool::{Parallel, RayonPool, SpinPool};
use std::sync::Arc;

/// Reordered float sums of the same exact integer block sums: each reordered addition can
/// change the last bit (2^-24 relative) of a running sum, so over at most 48 blocks the error
/// stays within a few hundred ulps of the sum of |block terms|, which these random rows keep
/// within a factor of ~10 of |result| (or of 1 where the result is near zero).
const REORDERED_REL: f32 = 1e-4;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next() * scale).collect()
    }
}

fn quantized(ty: GgmlType, rows: usize, cols: usize, rng: &mut Rng) -> QMatrix {
    let w = rng.vec(rows * cols, 0.5);
    let row_bytes = ty.row_bytes(cols as u64).unwrap() as usize;
    let mut q = vec![0u8; rows * row_bytes];
    quantize_chunk(ty, &w, &mut q, rows, cols).unwrap();
    QMatrix::new("w", ty, rows, cols, q).unwrap()
}

fn pools() -> Vec<Arc<dyn Parallel>> {
    vec![
        Arc::new(SpinPool::new(1)),
        Arc::new(SpinPool::new(2)),
        Arc::new(SpinPool::new(3)),
        Arc::new(RayonPool::new(2)),
    ]
}

/// Whether the CPU has `isa`; where it is one this architecture is expected to have, its
/// absence fails the test unless `LLM_RS_ALLOW_MISSING_ISA` is set (`testkit::isa`).
fn has(isa: Isa) -> bool {
    testkit::isa::require(isa.name(), &isa.missing_features())
}

/// Scalar and every SIMD set of this architecture (each one the CPU must have, as [`has`]
/// says).
fn kernel_sets() -> Vec<KernelSet> {
    Isa::ALL
        .into_iter()
        .filter(|&isa| isa == Isa::Scalar || (testkit::isa::is_native(isa.name()) && has(isa)))
        .map(|isa| KernelSet::for_isa(isa).expect("the CPU has it"))
        .collect()
}

#[test]
fn packed_types_are_weight_types_and_map_back() {
    for p in PackedType::ALL {
        assert!(ch06::WEIGHT_TYPES.contains(&p.ggml_type()), "{p:?}");
        assert_eq!(PackedType::of(p.ggml_type()), Some(p));
    }
}

#[test]
fn packing_round_trips_every_row() {
    // Packing needs AVX-512 VNNI; without it FastMatrix keeps the rows.
    let packs = has(Isa::Avx512Vnni);
    let mut rng = Rng(7);
    for ty in PackedType::ALL.map(PackedType::ggml_type) {
        let shapes: &[(usize, usize)] = if ty.block_size() == 256 {
            &[(16, 256), (17, 512), (5, 1536)]
        } else {
            &[(16, 32), (17, 64), (5, 96), (48, 576)]
        };
        for &(rows, cols) in shapes {
            let q = quantized(ty, rows, cols, &mut rng);
            let Some(p) = PackedMatrix::pack(&q) else {
                assert!(!packs, "{ty}: not packed on a CPU with AVX-512 VNNI");
                continue;
            };
            assert_eq!(p.ty, PackedType::of(ty).unwrap());
            let mut row = vec![0u8; q.row_bytes];
            for r in 0..rows {
                p.row_blocks(r, &mut row);
                assert_eq!(row, q.row(r), "{ty} ({rows}, {cols}) row {r}");
            }
        }
    }
}

#[test]
fn fast_products_equal_chapter_6s() {
    let mut rng = Rng(42);
    // Every packed type, and F32 (which FastMatrix keeps as rows).
    let types = PackedType::ALL
        .map(PackedType::ggml_type)
        .into_iter()
        .chain([GgmlType::F32]);
    for ty in types {
        let cols_list: &[usize] = if ty.block_size() == 256 {
            &[256, 1536]
        } else {
            &[32, 96, 576]
        };
        for &cols in cols_list {
            for rows in [1, 16, 33, 100] {
                let q = quantized(ty, rows, cols, &mut rng);
                for n in [1, 2, 3, 6, 8, 9, 13, 17, 40] {
                    let x = rng.vec(n * cols, 2.0);
                    let mut want = vec![0.0; n * rows];
                    q.matmul(&x, &mut want);
                    for set in kernel_sets() {
                        for (pi, pool) in pools().into_iter().enumerate() {
                            // Only a few combinations with the slower pools, to stay fast.
                            if pi > 0 && n % 2 == 0 {
                                continue;
                            }
                            // Packed where the type and the CPU allow, and the file's rows.
                            for pack in [true, false] {
                                let data = q.data.clone();
                                let qm = QMatrix::new("w", ty, rows, cols, data).unwrap();
                                let m = FastMatrix::new("w", qm, &set, pool.clone(), pack).unwrap();
                                let mut got = vec![f32::NAN; n * rows];
                                m.matmul(&x, &mut got);
                                let exact = set.isa == Isa::Scalar || ty.block_size() == 32;
                                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                                    let ok = if exact {
                                        g.to_bits() == w.to_bits()
                                    } else {
                                        (g - w).abs() <= REORDERED_REL * w.abs().max(1.0)
                                    };
                                    assert!(
                                        ok,
                                        "{ty} ({rows}, {cols}) × {n} tokens, {}: out[{}][{}] = {g}, scalar {w}",
                                        m.describe(),
                                        i / rows,
                                        i % rows
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A fused product (chapter 3's `matmul_fused`: one input, several matrices — a layer's Q, K
/// and V) must give each matrix exactly what its own product gives, whether the matrices fuse
/// (the same activation type: Q4_0 with Q4_0, Q4_K with Q6_K, which both take Q8_K) or not
/// (Q4_0 with Q4_1, whose activations differ), packed or kept as rows, for a decoded token and
/// for enough tokens that the activations are quantized in parallel.
#[test]
fn fused_products_equal_separate_ones_bit_for_bit() {
    use GgmlType::{Q4_0, Q4_1, Q4_K, Q6_K};
    let mut rng = Rng(5);
    // The types, the width, and whether the matrices fuse.
    let groups: [(&[GgmlType], usize, bool); 3] = [
        (&[Q4_0, Q4_0, Q4_0], 64, true),
        (&[Q4_K, Q6_K], 512, true),
        (&[Q4_0, Q4_1, Q4_0], 96, false),
    ];
    let rows = [48, 17, 33];
    for (types, cols, fuse) in groups {
        let qs: Vec<QMatrix> = types
            .iter()
            .zip(rows)
            .map(|(&ty, r)| quantized(ty, r, cols, &mut rng))
            .collect();
        for set in kernel_sets() {
            for pool in pools() {
                for pack in [true, false] {
                    let ms: Vec<FastMatrix> = qs
                        .iter()
                        .map(|q| {
                            let q = QMatrix::new("w", q.ty, q.rows, q.cols, q.data.clone());
                            FastMatrix::new("w", q.unwrap(), &set, pool.clone(), pack).unwrap()
                        })
                        .collect();
                    // Fused or not, the outputs below must be the same; this says which path
                    // they came from.
                    let fuses = ms[1..].iter().all(|m| ms[0].sharing_input(m).is_some());
                    assert_eq!(fuses, fuse, "{types:?}, {}", ms[0].describe());
                    for n in [1, 3, 20] {
                        let x = rng.vec(n * cols, 2.0);
                        let want: Vec<Vec<f32>> = ms
                            .iter()
                            .map(|m| {
                                let mut out = vec![0.0; n * m.rows];
                                m.matmul(&x, &mut out);
                                out
                            })
                            .collect();
                        let mut got: Vec<Vec<f32>> =
                            ms.iter().map(|m| vec![f32::NAN; n * m.rows]).collect();
                        let others: Vec<&dyn Matrix> =
                            ms[1..].iter().map(|m| m as &dyn Matrix).collect();
                        let mut outs: Vec<&mut [f32]> =
                            got.iter_mut().map(|g| g.as_mut_slice()).collect();
                        ms[0].matmul_fused(&others, &x, &mut outs);
                        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                            let same = g.iter().zip(w).all(|(g, w)| g.to_bits() == w.to_bits());
                            assert!(
                                same,
                                "{types:?} × {n} tokens, {}: matrix {i} differs when fused",
                                ms[0].describe()
                            );
                        }
                    }
                }
            }
        }
    }
}

/// A matrix large enough for huge pages (2 MiB and more packed), packed with and without them,
/// with the kernels prefetching and not: where the bytes sit and whether lines are asked for
/// ahead must never change a product, which stays chapter 6's exactly (Q8_0, 32-weight
/// blocks) for a decoded token and for a tile of tokens.
#[test]
fn huge_pages_and_prefetching_change_no_product() {
    let mut rng = Rng(11);
    let (rows, cols) = (4099, 640); // 2.8 MB of Q8_0 blocks; a last group of 3 rows
    let q = quantized(GgmlType::Q8_0, rows, cols, &mut rng);
    if !has(Isa::Avx512Vnni) {
        return;
    }
    let set = KernelSet::for_isa(Isa::Avx512Vnni).expect("the CPU has it");
    for n in [1, 8] {
        let x = rng.vec(n * cols, 2.0);
        let mut want = vec![0.0; n * rows];
        q.matmul(&x, &mut want);
        for huge_pages in [false, true] {
            for prefetch in [0, ch08::gemm::PREFETCH, 1 << 20] {
                let mut p = PackedMatrix::pack_with(&q, huge_pages).expect("VNNI packs Q8_0");
                p.prefetch = prefetch;
                let m = FastMatrix {
                    store: Store::<Vec<u8>>::Packed(p),
                    ty: q.ty,
                    rows,
                    cols,
                    kernels: set.get(q.ty).unwrap(),
                    pool: Arc::new(SpinPool::new(2)),
                };
                let mut got = vec![f32::NAN; n * rows];
                m.matmul(&x, &mut got);
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(g, w)| g.to_bits() == w.to_bits());
                assert!(
                    same,
                    "{n} tokens, huge pages {huge_pages}, prefetch {prefetch}"
                );
            }
        }
    }
}
