//! Every SIMD kernel against chapter 6's scalar reference, for every instruction set this CPU
//! has, on random data and on every block count that ends a loop differently (bugs live in
//! the tails): 1, 2, 3, 5, 7, 8, 9, 15, 16, 17, … up to about 1023 blocks of 32.
//!
//! - Dot products on *exact* data (scales ±1, small integer codes) must equal the scalar ones
//!   bit for bit: every partial sum is then an integer below 2^24, which f32 holds exactly, so
//!   the order of the additions cannot matter and any difference is a wrong code or a lost
//!   block.
//! - Dot products on realistic random data must agree within [`sum_order_tolerance`]: the
//!   integer parts are exact, so only the order of the float additions differs. For the types
//!   with blocks of 32 the order is chapter 6's too ([`same_order`]), and the tolerance is
//!   zero: a model's logits must not depend on which kernel ran.
//! - The activation quantizers must give the scalar bytes exactly, ties, NaNs and infinities
//!   included.
//! - The dispatch gives what the CPU has, and only that.
//!
//! `PROPTEST_CASES` sets the number of random cases (fewer under an emulator).

// ggml's names in test names too: `quantize_row_q8_K`.
#![allow(non_snake_case)]

use ch01::GgmlType;
use ch06::quants::WEIGHT_TYPES;
use ch06::quants::blocks::*;
use ch06::quants::type_traits;
use ch08::kernels::{DotKernel, Isa, KERNELS_ENV, KernelSet, TypeKernels, dot_kernels};
use half::f16;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError};
use std::mem::{offset_of, size_of};

// ---------------------------------------------------------------------------------------------
// Tolerance

/// Besides the additions, the float operations one term of a dot product passes through:
/// the scale products (`d_x · d_y`, then `· sum`), int-to-float conversions, the final sums of
/// up to 16 lanes (four levels), chapter 6's sum of 8 lanes for Q3_K/Q6_K (eight), and Q4_1's
/// f16 `s` against the sum it approximates (2^-11 relative, far below one block's share).
const SUM_ORDER_SLACK: usize = 16;

/// How far a SIMD dot product may be from the scalar one: `(chain + 16) · ε · M`.
///
/// Both sides form the same exact integer sums per block (per group of 8 or 16 for some
/// k-quants) and add the float terms `d · sum` in different orders, the SIMD side in 8 or 16
/// lanes and with fused multiply-adds. Each float operation rounds by at most 2^-24 of its
/// result, and no partial sum of any order exceeds `M`, the sum of the magnitudes of all the
/// elementary terms (`|d_x d_y q_x q_y|`, and `|m · a|` for the mins). A term passes through at
/// most `chain` additions (the blocks of a row for the scalar side; fewer in SIMD lanes) plus
/// [`SUM_ORDER_SLACK`] other operations, so each side is within `(chain + 16) · 2^-24 · M` of
/// the exact sum, and the two within twice that: `(chain + 16) · ε · M` with `ε = 2^-23`.
fn sum_order_tolerance(chain: usize, magnitude: f64) -> f64 {
    (chain + SUM_ORDER_SLACK) as f64 * f32::EPSILON as f64 * magnitude
}

/// Whether the SIMD kernels of `ty` add in chapter 6's order, so that they must equal it bit for
/// bit on any data: the types with blocks of 32 (each block's integer sum whole, its float
/// expression, one running sum). Their products feed activation quantizers, which turn a
/// last-bit difference into a flipped code now and then; the packed micro-kernel keeps the same
/// order, so the row and packed layouts give a model the same logits.
fn same_order(ty: GgmlType) -> bool {
    !is_float(ty) && ty.block_size() == 32
}

// ---------------------------------------------------------------------------------------------
// Sizes and configuration

/// Block counts for the types with blocks of 32: loop tails around 1, 2, 4, 8, 16 and 32.
#[cfg(not(miri))]
const LEGACY_BLOCKS: [usize; 20] = [
    1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 255, 511, 1023,
];
/// Super-block counts for the k-quants (256 weights each), up to 128 (32768 weights).
#[cfg(not(miri))]
const K_BLOCKS: [usize; 19] = [
    1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128,
];
/// Element counts for F32, F16 and BF16 rows (no blocks: any length).
#[cfg(not(miri))]
const FLOAT_ELEMS: [usize; 26] = [
    1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 257, 511, 1023,
    4095, 4096, 32735,
];
// Miri interprets every operation, thousands of times slower: every kind of tail, on short
// rows (float kernels take 32 vectors of 8 or 16 lanes a step, hence the longer counts).
#[cfg(miri)]
const LEGACY_BLOCKS: [usize; 9] = [1, 2, 3, 5, 7, 8, 9, 17, 33];
#[cfg(miri)]
const K_BLOCKS: [usize; 4] = [1, 2, 3, 5];
#[cfg(miri)]
const FLOAT_ELEMS: [usize; 17] = [
    1, 2, 3, 5, 7, 8, 9, 15, 17, 31, 33, 65, 129, 255, 257, 513, 1031,
];

fn config(default_cases: u32) -> Config {
    let mut c = Config::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        c.cases = default_cases;
    }
    // A failure already names the smallest failing block count; shrinking rows of thousands
    // of bytes would take long and teach little. (A workbench sets no shrinking at all.)
    if std::env::var_os("PROPTEST_MAX_SHRINK_ITERS").is_none() {
        c.max_shrink_iters = 16;
    }
    c
}

/// The sets to test: every SIMD set of this architecture. One the CPU lacks fails the test
/// where it is expected here (every x86-64 set, NEON on AArch64), and so does finding none at
/// all, unless `LLM_RS_ALLOW_MISSING_ISA` is set; then a note says what was not covered
/// (`testkit::isa`).
fn simd_sets() -> Vec<KernelSet> {
    let sets: Vec<_> = Isa::ALL
        .into_iter()
        .filter(|&isa| testkit::isa::is_native(isa.name()))
        .filter(|&isa| testkit::isa::require(isa.name(), &isa.missing_features()))
        .map(|isa| KernelSet::for_isa(isa).expect("the CPU has it"))
        .collect();
    eprintln!(
        "testing kernel sets: {:?}",
        sets.iter().map(|s| s.isa.name()).collect::<Vec<_>>()
    );
    testkit::isa::require_any("any SIMD kernel set", sets.len());
    sets
}

/// The dot products to test for `ty`: every SIMD kernel of the sets [`simd_sets`] tests,
/// whether a set uses it or not.
fn simd_dots(ty: GgmlType) -> Vec<DotKernel> {
    let sets = simd_sets();
    dot_kernels(ty)
        .into_iter()
        .filter(|k| sets.iter().any(|s| s.isa == k.isa))
        .collect()
}

/// The counts to test for `ty` (blocks for quantized types, elements for float ones) and the
/// number of elements per count unit.
fn counts(ty: GgmlType) -> (&'static [usize], usize) {
    match ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => (&FLOAT_ELEMS, 1),
        GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => {
            (&K_BLOCKS, QK_K)
        }
        _ => (&LEGACY_BLOCKS, 32),
    }
}

/// The longest chain of additions in either kernel: one per block, or for float rows one per
/// 8 elements (the fewest lanes any SIMD set accumulates in).
fn chain(ty: GgmlType, n: usize) -> usize {
    match ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => n / 8,
        _ => n / ty.block_size() as usize,
    }
}

// ---------------------------------------------------------------------------------------------
// Block layouts: where the float scales sit

/// Byte offsets of a weight block's f16 fields: all of them, and those that are mins.
fn f16_fields(ty: GgmlType) -> (&'static [usize], &'static [usize]) {
    use GgmlType::*;
    const Q4_1_M: usize = offset_of!(BlockQ4_1, m);
    const Q5_1_M: usize = offset_of!(BlockQ5_1, m);
    const Q2_K_D: usize = offset_of!(BlockQ2_K, d);
    const Q2_K_DMIN: usize = offset_of!(BlockQ2_K, dmin);
    const Q3_K_D: usize = offset_of!(BlockQ3_K, d);
    const Q4_K_DMIN: usize = offset_of!(BlockQ4_K, dmin);
    const Q5_K_DMIN: usize = offset_of!(BlockQ5_K, dmin);
    const Q6_K_D: usize = offset_of!(BlockQ6_K, d);
    match ty {
        Q4_0 | Q5_0 | Q8_0 => (&[0], &[]),
        Q4_1 => (&[0, Q4_1_M], &[Q4_1_M]),
        Q5_1 => (&[0, Q5_1_M], &[Q5_1_M]),
        Q2_K => (&[Q2_K_D, Q2_K_DMIN], &[Q2_K_DMIN]),
        Q3_K => (&[Q3_K_D], &[]),
        Q4_K => (&[0, Q4_K_DMIN], &[Q4_K_DMIN]),
        Q5_K => (&[0, Q5_K_DMIN], &[Q5_K_DMIN]),
        Q6_K => (&[Q6_K_D], &[]),
        _ => (&[], &[]),
    }
}

fn is_float(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

fn row_bytes(ty: GgmlType, n: usize) -> usize {
    n / ty.block_size() as usize * ty.type_size() as usize
}

/// Random weight blocks with their f16 fields replaced by `scale(i)` for the i-th field.
fn weight_blocks(ty: GgmlType, raw: &[u8], mut scale: impl FnMut(usize) -> f16) -> Vec<u8> {
    let mut w = raw.to_vec();
    let (fields, _) = f16_fields(ty);
    let size = ty.type_size() as usize;
    let mut i = 0;
    for block in w.chunks_exact_mut(size) {
        for &off in fields {
            block[off..off + 2].copy_from_slice(&scale(i).to_le_bytes());
            i += 1;
        }
    }
    w
}

/// `bytes` with the f16 fields at `fields` of every block set to zero.
fn zero_fields(ty: GgmlType, bytes: &[u8], fields: &[usize]) -> Vec<u8> {
    let mut w = bytes.to_vec();
    for block in w.chunks_exact_mut(ty.type_size() as usize) {
        for &off in fields {
            block[off..off + 2].fill(0);
        }
    }
    w
}

fn dequantize(ty: GgmlType, bytes: &[u8], n: usize) -> Vec<f64> {
    let mut y = vec![0f32; n];
    (type_traits(ty).unwrap().to_float)(bytes, &mut y);
    y.into_iter().map(f64::from).collect()
}

/// `M` of [`sum_order_tolerance`]: Σ |elementary terms|. Weights with mins are split into
/// their scaled codes (mins zeroed) and their mins (scales zeroed), so that a min cancelling a
/// code within one weight still counts both.
fn magnitude(ty: GgmlType, w: &[u8], act_ty: GgmlType, a: &[u8], n: usize) -> f64 {
    let a = dequantize(act_ty, a, n);
    let parts: Vec<Vec<f64>> = if is_float(ty) {
        vec![dequantize(ty, w, n)]
    } else {
        let (fields, mins) = f16_fields(ty);
        let scales: Vec<usize> = fields
            .iter()
            .copied()
            .filter(|f| !mins.contains(f))
            .collect();
        let mut parts = vec![dequantize(ty, &zero_fields(ty, w, mins), n)];
        if !mins.is_empty() {
            parts.push(dequantize(ty, &zero_fields(ty, w, &scales), n));
        }
        parts
    };
    parts
        .iter()
        .map(|p| p.iter().zip(&a).map(|(x, y)| (x * y).abs()).sum::<f64>())
        .sum()
}

// ---------------------------------------------------------------------------------------------
// Activations

/// Exact activation blocks of type `act`: codes in `-2..=2`, scales ±1, and the derived
/// fields (`s`, `bsums`) as the quantizers compute them.
fn exact_activations(act: GgmlType, codes: &[i8], negative: &[bool]) -> Vec<u8> {
    let sign = |i: usize| {
        if negative[i % negative.len()] {
            -1.0f32
        } else {
            1.0
        }
    };
    let mut out = Vec::new();
    match act {
        GgmlType::Q8_0 | GgmlType::Q8_1 => {
            for (i, q) in codes.chunks_exact(32).enumerate() {
                let d = sign(i);
                out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
                if act == GgmlType::Q8_1 {
                    let sum: i32 = q.iter().map(|&v| v as i32).sum();
                    out.extend_from_slice(&f16::from_f32(d * sum as f32).to_le_bytes());
                }
                out.extend(q.iter().map(|&v| v as u8));
            }
        }
        GgmlType::Q8_K => {
            for (i, q) in codes.chunks_exact(QK_K).enumerate() {
                out.extend_from_slice(&sign(i).to_le_bytes());
                out.extend(q.iter().map(|&v| v as u8));
                for g in q.chunks_exact(16) {
                    let s: i16 = g.iter().map(|&v| v as i16).sum();
                    out.extend_from_slice(&s.to_le_bytes());
                }
            }
        }
        _ => unreachable!("{act} is not an activation format"),
    }
    out
}

/// A float row of `ty` (F32, F16 or BF16) holding `values` exactly or rounded.
fn float_row(ty: GgmlType, values: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; row_bytes(ty, values.len())];
    (type_traits(ty).unwrap().from_float)(values, &mut out);
    out
}

/// The activation row a model would give: `x` quantized by chapter 6's scalar quantizer.
fn quantized_activations(act: GgmlType, x: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; row_bytes(act, x.len())];
    (type_traits(act).unwrap().from_float)(x, &mut out);
    out
}

// ---------------------------------------------------------------------------------------------
// The dot-product checks

fn scalar(ty: GgmlType) -> TypeKernels {
    KernelSet::SCALAR.get(ty).unwrap()
}

/// SIMD equals scalar bit for bit on a row of exact data, for every count whose terms stay
/// below 2^24 (at least the first few: one block's worst case is far below it).
fn check_exact(ty: GgmlType, w: &[u8], a: &[u8]) -> Result<(), TestCaseError> {
    let reference = scalar(ty);
    let act = reference.act_ty;
    let (counts, unit) = counts(ty);
    for k in simd_dots(ty) {
        for &c in counts {
            let n = c * unit;
            let (wn, an) = (&w[..row_bytes(ty, n)], &a[..row_bytes(act, n)]);
            if magnitude(ty, wn, act, an, n) >= (1 << 24) as f64 {
                prop_assert!(
                    c > 4,
                    "{ty}: the exact data is too large even for {c} blocks"
                );
                break;
            }
            let want = (reference.vec_dot)(n, wn, an);
            let got = (k.vec_dot)(n, wn, an);
            prop_assert!(
                got.to_bits() == want.to_bits(),
                "{ty} with {}: n = {n}: got {got}, scalar {want}",
                k.name
            );
        }
    }
    Ok(())
}

/// SIMD within [`sum_order_tolerance`] of scalar on a row of realistic data: bit for bit where
/// the order is the same ([`same_order`]).
fn check_close(ty: GgmlType, w: &[u8], a: &[u8]) -> Result<(), TestCaseError> {
    let reference = scalar(ty);
    let act = reference.act_ty;
    let (counts, unit) = counts(ty);
    for k in simd_dots(ty) {
        for &c in counts {
            let n = c * unit;
            let (wn, an) = (&w[..row_bytes(ty, n)], &a[..row_bytes(act, n)]);
            let want = (reference.vec_dot)(n, wn, an);
            let got = (k.vec_dot)(n, wn, an);
            if same_order(ty) {
                prop_assert!(
                    got.to_bits() == want.to_bits(),
                    "{ty} with {}: n = {n}: got {got:e}, scalar {want:e}: chapter 6's order \
                     gives the same bits",
                    k.name
                );
                continue;
            }
            let (want, got) = (want as f64, got as f64);
            let tol = sum_order_tolerance(chain(ty, n), magnitude(ty, wn, act, an, n));
            prop_assert!(
                (got - want).abs() <= tol,
                "{ty} with {}: n = {n}: got {got}, scalar {want}, |diff| {:e} > {tol:e}",
                k.name,
                (got - want).abs()
            );
        }
    }
    Ok(())
}

/// The largest row any count of `ty` needs, in elements.
fn max_elems(ty: GgmlType) -> usize {
    let (counts, unit) = counts(ty);
    counts.iter().max().unwrap() * unit
}

/// Exact data for `ty`: raw weight bytes, the signs of their ±1 scales, activation codes in
/// `-2..=2` and the signs of their scales; floats are small integers instead.
fn exact_case(ty: GgmlType) -> impl Strategy<Value = (Vec<u8>, Vec<u8>)> {
    let n = max_elems(ty);
    let act = type_traits(ty).unwrap().vec_dot_type;
    if is_float(ty) {
        (
            prop::collection::vec(-8i8..=8, n),
            prop::collection::vec(-8i8..=8, n),
        )
            .prop_map(move |(w, a)| {
                let f = |v: Vec<i8>| v.into_iter().map(f32::from).collect::<Vec<_>>();
                (float_row(ty, &f(w)), float_row(act, &f(a)))
            })
            .boxed()
    } else {
        (
            prop::collection::vec(any::<u8>(), row_bytes(ty, n)),
            prop::collection::vec(any::<bool>(), 64),
            prop::collection::vec(-2i8..=2, n),
            prop::collection::vec(any::<bool>(), 64),
        )
            .prop_map(move |(raw, w_neg, codes, a_neg)| {
                let one = |neg: bool| f16::from_f32(if neg { -1.0 } else { 1.0 });
                let w = weight_blocks(ty, &raw, |i| one(w_neg[i % w_neg.len()]));
                (w, exact_activations(act, &codes, &a_neg))
            })
            .boxed()
    }
}

/// Realistic data for `ty`: random codes with scales of ordinary sizes (2^-14 … 2^-2, either
/// sign), and activations quantized from random floats; floats are random in (-1, 1).
fn random_case(ty: GgmlType) -> impl Strategy<Value = (Vec<u8>, Vec<u8>)> {
    let n = max_elems(ty);
    let act = type_traits(ty).unwrap().vec_dot_type;
    let xs = prop::collection::vec(-1.0f32..1.0, n);
    if is_float(ty) {
        (xs.clone(), xs)
            .prop_map(move |(w, a)| (float_row(ty, &w), float_row(act, &a)))
            .boxed()
    } else {
        (
            prop::collection::vec(any::<u8>(), row_bytes(ty, n)),
            prop::collection::vec((1.0f32..2.0, -14i32..=-2, any::<bool>()), 256),
            xs,
        )
            .prop_map(move |(raw, scales, x)| {
                let w = weight_blocks(ty, &raw, |i| {
                    let (m, e, neg) = scales[i % scales.len()];
                    f16::from_f32(if neg { -1.0 } else { 1.0 } * m * (e as f32).exp2())
                });
                (w, quantized_activations(act, &x))
            })
            .boxed()
    }
}

macro_rules! dot_tests {
    ($($module:ident: $ty:ident),* $(,)?) => {$(
        mod $module {
            use super::*;

            proptest! {
                #![proptest_config(config(8))]

                #[test]
                fn exact_sums_equal_scalar((w, a) in exact_case(GgmlType::$ty)) {
                    check_exact(GgmlType::$ty, &w, &a)?;
                }

                #[test]
                fn random_sums_within_sum_order_tolerance((w, a) in random_case(GgmlType::$ty)) {
                    check_close(GgmlType::$ty, &w, &a)?;
                }
            }
        }
    )*};
}

dot_tests! {
    f32_: F32,
    f16_: F16,
    bf16: BF16,
    q4_0: Q4_0,
    q4_1: Q4_1,
    q5_0: Q5_0,
    q5_1: Q5_1,
    q8_0: Q8_0,
    q2_k: Q2_K,
    q3_k: Q3_K,
    q4_k: Q4_K,
    q5_k: Q5_K,
    q6_k: Q6_K,
}

// ---------------------------------------------------------------------------------------------
// Activation quantizers

/// A row of `blocks · qk` floats that stresses rounding: ordinary values of a random
/// magnitude; every third block made of exact halves with a maximum of ±127 (so that codes
/// land exactly on ties); and, in some rows, rare zeros, infinities, quiet NaNs with random
/// payloads, subnormals and huge values.
fn hard_row(blocks: usize, qk: usize) -> impl Strategy<Value = Vec<f32>> {
    let n = blocks * qk;
    (
        prop::collection::vec((-1.0f32..1.0, any::<u32>(), any::<u8>()), n),
        -30i32..30,
        any::<bool>(),
    )
        .prop_map(move |(v, exp, specials)| {
            let scale = (exp as f32).exp2();
            let mut x: Vec<f32> = v
                .iter()
                .enumerate()
                .map(|(i, &(u, bits, kind))| {
                    if (i / qk) % 3 == 2 {
                        // A tie block: halves in -127..=127.
                        return (bits % 509) as f32 / 2.0 - 127.0;
                    }
                    if specials && kind == 0 {
                        let sign = if bits & 1 == 0 { 1.0f32 } else { -1.0 };
                        return match (bits >> 1) % 7 {
                            0 => 0.0 * sign,
                            1 => f32::INFINITY * sign,
                            2 => f32::from_bits(0x7fc0_0000 | (bits & 0x803f_ffff)),
                            3 => f32::from_bits((bits & 0x807f_ffff) | 1),
                            4 => f32::MAX * sign,
                            5 => 1e-40 * sign,
                            _ => 3e38 * sign,
                        };
                    }
                    u * scale
                })
                .collect();
            for (b, block) in x.chunks_exact_mut(qk).enumerate() {
                if b % 3 == 2 {
                    block[b % qk] = if b % 2 == 0 { 127.0 } else { -127.0 };
                }
            }
            x
        })
}

/// Every SIMD quantizer for `act` gives the scalar bytes, for every block count up to
/// `blocks` (prefixes of the row).
fn check_quantizer(weight: GgmlType, x: &[f32], qk: usize) -> Result<(), TestCaseError> {
    let reference = scalar(weight);
    let act = reference.act_ty;
    for set in simd_sets() {
        let k = set.get(weight).unwrap();
        prop_assert!(
            k.act_isa != Isa::Scalar,
            "{}: no SIMD quantizer for {act}",
            set.isa
        );
        for nb in 1..=x.len() / qk {
            let xs = &x[..nb * qk];
            let mut want = vec![0u8; row_bytes(act, xs.len())];
            let mut got = vec![0xAAu8; want.len()];
            (reference.quantize_act)(xs, &mut want);
            (k.quantize_act)(xs, &mut got);
            if let Some(i) = (0..want.len()).find(|&i| got[i] != want[i]) {
                let b = i / act.type_size() as usize;
                let block = &xs[b * qk..(b + 1) * qk];
                prop_assert!(
                    false,
                    "{act} with {} ({}): {nb} blocks: first different byte {i} (block {b}, \
                     offset {}): got {:#04x}, scalar {:#04x}; block input {block:?}",
                    set.isa,
                    k.act_isa,
                    i % act.type_size() as usize,
                    got[i],
                    want[i]
                );
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(16))]

    #[test]
    fn quantize_row_q8_0_gives_scalar_bytes(x in hard_row(33, 32)) {
        check_quantizer(GgmlType::Q4_0, &x, 32)?;
    }

    #[test]
    fn quantize_row_q8_1_gives_scalar_bytes(x in hard_row(33, 32)) {
        check_quantizer(GgmlType::Q4_1, &x, 32)?;
    }

    #[test]
    fn quantize_row_q8_K_gives_scalar_bytes(x in hard_row(9, QK_K)) {
        check_quantizer(GgmlType::Q4_K, &x, QK_K)?;
    }
}

// ---------------------------------------------------------------------------------------------
// Dispatch

#[test]
fn for_isa_is_some_exactly_when_the_cpu_has_the_features() {
    for isa in Isa::ALL {
        let expected = match isa {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => {
                KernelSet::for_isa(Isa::Avx512).is_some() && is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            #[cfg(target_arch = "aarch64")]
            Isa::NeonDotprod => {
                std::arch::is_aarch64_feature_detected!("neon")
                    && std::arch::is_aarch64_feature_detected!("dotprod")
            }
            // Another architecture's instruction set is never available.
            _ => false,
        };
        assert_eq!(KernelSet::for_isa(isa).is_some(), expected, "{isa}");
        if !expected {
            assert!(
                !isa.missing_features().is_empty() || isa == Isa::Scalar,
                "{isa}"
            );
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        assert_eq!(KernelSet::for_isa(Isa::Neon), None);
        assert_eq!(KernelSet::for_isa(Isa::NeonDotprod), None);
    }
    #[cfg(target_arch = "aarch64")]
    {
        assert_eq!(KernelSet::for_isa(Isa::Avx2), None);
        assert_eq!(KernelSet::for_isa(Isa::Avx512Vnni), None);
    }
}

#[test]
fn every_simd_set_has_simd_kernels_for_every_type() {
    for set in simd_sets() {
        for ty in WEIGHT_TYPES {
            let k = set.get(ty).unwrap();
            assert_ne!(k.isa, Isa::Scalar, "{}: {ty} falls back to scalar", set.isa);
            if !is_float(ty) {
                assert_ne!(k.act_isa, Isa::Scalar, "{}: {ty}'s activations", set.isa);
            }
            // A set uses its own kernels or those of a set it includes, never another's.
            let includes: &[Isa] = match set.isa {
                Isa::Avx512Vnni => &[Isa::Avx512Vnni, Isa::Avx512, Isa::Avx2],
                Isa::Avx512 => &[Isa::Avx512, Isa::Avx2],
                Isa::NeonDotprod => &[Isa::NeonDotprod, Isa::Neon],
                other => &[other],
            };
            assert!(
                includes.contains(&k.isa),
                "{}: {ty} uses {}",
                set.isa,
                k.isa
            );
            assert!(
                includes.contains(&k.act_isa) || k.act_isa == Isa::Scalar,
                "{ty}"
            );
        }
    }
}

#[test]
fn every_kernel_is_listed_once_under_its_instruction_set() {
    for ty in WEIGHT_TYPES {
        let kernels = dot_kernels(ty);
        assert_eq!(kernels[0].isa, Isa::Scalar, "{ty}: scalar first");
        for (i, k) in kernels.iter().enumerate() {
            assert_eq!(k.ty, ty);
            assert!(k.name.starts_with(k.isa.name()), "{ty}: {k:?}");
            assert!(
                KernelSet::for_isa(k.isa).is_some(),
                "{ty}: {k:?} is not runnable here"
            );
            assert!(
                kernels[..i].iter().all(|o| o.name != k.name),
                "{ty}: {} twice",
                k.name
            );
        }
        // What a set gets is one of them, and a set adopts at most one per type.
        for set in KernelSet::available() {
            let got = set.get(ty).unwrap();
            assert!(
                kernels
                    .iter()
                    .any(|k| k.name == got.variant && k.isa == got.isa),
                "{ty}: {} uses {}, which is not listed",
                set.isa,
                got.variant
            );
            let own = kernels
                .iter()
                .filter(|k| k.used_by == Some(set.isa))
                .count();
            assert!(own <= 1, "{ty}: {} adopts {own} kernels", set.isa);
        }
    }
}

#[test]
fn the_scalar_set_is_chapter_6() {
    let x: Vec<f32> = (0..1024).map(|i| (i as f32 * 0.37).sin()).collect();
    let y: Vec<f32> = (0..1024).map(|i| (i as f32 * 0.11).cos()).collect();
    for ty in WEIGHT_TYPES {
        let k = KernelSet::SCALAR.get(ty).unwrap();
        let t = type_traits(ty).unwrap();
        assert_eq!((k.isa, k.act_isa), (Isa::Scalar, Isa::Scalar), "{ty}");
        assert_eq!(k.act_ty, t.vec_dot_type, "{ty}");
        let w = float_row_or_quantized(ty, &x);
        let (mut a, mut a_ref) = (vec![0u8; row_bytes(k.act_ty, 1024)], vec![0u8; 0]);
        a_ref.resize(a.len(), 0);
        (k.quantize_act)(&y, &mut a);
        (type_traits(k.act_ty).unwrap().from_float)(&y, &mut a_ref);
        assert_eq!(a, a_ref, "{ty}");
        let got = (k.vec_dot)(1024, &w, &a);
        let want = (t.vec_dot.unwrap())(1024, &w, &a);
        assert_eq!(got.to_bits(), want.to_bits(), "{ty}");
    }
}

fn float_row_or_quantized(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let mut w = vec![0u8; row_bytes(ty, x.len())];
    (type_traits(ty).unwrap().from_float)(x, &mut w);
    w
}

#[test]
fn detect_picks_an_available_set() {
    let detected = KernelSet::detect();
    assert!(KernelSet::for_isa(detected.isa).is_some(), "{detected:?}");
    assert_eq!(KernelSet::detect(), detected, "decided once");
    if std::env::var_os(KERNELS_ENV).is_none() {
        assert_eq!(detected, KernelSet::best());
    }
    // The best set is the first available one in order of preference.
    let order = [
        Isa::Avx512Vnni,
        Isa::Avx512,
        Isa::Avx2,
        Isa::NeonDotprod,
        Isa::Neon,
        Isa::Scalar,
    ];
    let first = order.into_iter().find(|&i| KernelSet::for_isa(i).is_some());
    assert_eq!(Some(KernelSet::best().isa), first);
    eprintln!("{}", detected.describe());
}

#[test]
fn the_environment_variable_overrides_detection() {
    let best = KernelSet::best();
    assert_eq!(KernelSet::from_env_value(None), (best, None));
    assert_eq!(KernelSet::from_env_value(Some("")), (best, None));
    assert_eq!(
        KernelSet::from_env_value(Some("scalar")),
        (KernelSet::SCALAR, None)
    );
    assert_eq!(
        KernelSet::from_env_value(Some("Scalar ")),
        (KernelSet::SCALAR, None)
    );
    let (set, warning) = KernelSet::from_env_value(Some("sse9"));
    assert_eq!(set, best);
    let w = warning.expect("a warning for an unknown name");
    assert!(
        w.contains("sse9") && w.contains("avx512vnni") && w.contains("neon"),
        "{w}"
    );
    for isa in Isa::ALL {
        let (set, warning) = KernelSet::from_env_value(Some(isa.name()));
        match KernelSet::for_isa(isa) {
            Some(s) => assert_eq!((set, warning), (s, None), "{isa}"),
            None => {
                assert_eq!(set, best, "{isa}");
                let w = warning.expect("a warning for a missing instruction set");
                let missing = isa.missing_features();
                assert!(w.contains(isa.name()) && w.contains(missing[0]), "{w}");
            }
        }
    }
}

#[test]
fn describe_names_the_set_of_every_type() {
    for set in KernelSet::available() {
        let d = set.describe();
        assert!(d.starts_with(&format!("kernels: {}", set.isa)), "{d}");
        for ty in WEIGHT_TYPES {
            let k = set.get(ty).unwrap();
            let line = d
                .lines()
                .find(|l| l.split_whitespace().next() == Some(ty.name()))
                .unwrap_or_else(|| panic!("no line for {ty} in\n{d}"));
            assert!(
                line.contains(k.variant) && line.contains(k.act_isa.name()),
                "{line}"
            );
        }
    }
}

#[test]
fn unaligned_rows_give_the_same_results() {
    let x: Vec<f32> = (0..512).map(|i| (i as f32 * 0.37).sin()).collect();
    for set in KernelSet::available() {
        for ty in WEIGHT_TYPES {
            let k = set.get(ty).unwrap();
            let w = float_row_or_quantized(ty, &x);
            let mut a = vec![0u8; row_bytes(k.act_ty, 512)];
            (k.quantize_act)(&x, &mut a);
            // One byte in: no block type allows that alignment.
            let mut wb = vec![0u8; w.len() + 1];
            wb[1..].copy_from_slice(&w);
            let mut ab = vec![0u8; a.len() + 1];
            (k.quantize_act)(&x, &mut ab[1..]);
            assert_eq!(
                &ab[1..],
                &a[..],
                "{} {ty}: quantize into unaligned bytes",
                set.isa
            );
            let want = (k.vec_dot)(512, &w, &a);
            let got = (k.vec_dot)(512, &wb[1..], &ab[1..]);
            assert_eq!(got.to_bits(), want.to_bits(), "{} {ty}", set.isa);
        }
    }
}

#[test]
fn wrong_lengths_are_refused_with_a_message() {
    for set in KernelSet::available() {
        for ty in [GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::F32] {
            let k = set.get(ty).unwrap();
            let w = vec![0u8; row_bytes(ty, 512)];
            let a = vec![0u8; row_bytes(k.act_ty, 512)];
            let err = std::panic::catch_unwind(|| (k.vec_dot)(256, &w, &a)).unwrap_err();
            let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
            assert!(msg.contains("256"), "{} {ty}: {msg:?}", set.isa);
        }
    }
}

#[test]
fn size_of_blocks_is_what_the_tests_assume() {
    // `f16_fields` relies on these layouts.
    assert_eq!(size_of::<BlockQ2_K>(), GgmlType::Q2_K.type_size() as usize);
    assert_eq!(offset_of!(BlockQ4_0, d), 0);
    assert_eq!(offset_of!(BlockQ4_K, d), 0);
    assert_eq!(offset_of!(BlockQ5_K, d), 0);
}
