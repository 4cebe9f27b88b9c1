//! Properties of every kernel on random data and odd block counts (bugs live in the tails):
//! the integer dot product equals the float dot product of the dequantized values, and
//! quantizing to the activation format is the identity on its own dequantized values.

use ch01::GgmlType;
use ch06::quants::{TypeTraits, WEIGHT_TYPES, type_traits};
use proptest::prelude::*;

// ggml's bound (`tests/test-quantize-fns.cpp`) on `|dot - reference| / n`.
const MAX_DOT_PRODUCT_ERROR: f32 = 0.02;

/// The tight check: the integer kernels add in f32 what the f64 reference adds exactly, so
/// their error is a few f32 roundings (2^-24 each) per block, relative to the magnitude of the
/// terms they add. 1e-5 leaves room for ~150 blocks of rounding.
const DOT_ROUNDING_TOL: f64 = 1e-5;
/// Q8_1 stores `s = d * sum(q)` as f16 (2^-11 relative rounding), and Q4_1/Q5_1 dot products
/// multiply it by the block's min.
const DOT_ROUNDING_TOL_Q8_1: f64 = 1e-3;
/// f16's smallest normal value, and the spacing of its subnormals.
const F16_MIN_NORMAL: f64 = 6.103515625e-5; // 2^-14
const F16_SUBNORMAL_STEP: f64 = 5.960464477539063e-8; // 2^-24

/// Re-quantizing dequantized activations: Q8_0/Q8_1 land on the same f16 scale exactly; Q8_K's
/// f32 scale is recomputed from a rounded product, a few ulps away.
const REQUANT_TOL: f32 = 1e-6;

fn quantize(t: &TypeTraits, x: &[f32]) -> Vec<u8> {
    let mut q = vec![0u8; x.len() / t.block_size * t.type_size];
    (t.from_float)(x, &mut q);
    q
}

fn dequantize(t: &TypeTraits, q: &[u8], n: usize) -> Vec<f32> {
    let mut y = vec![0f32; n];
    (t.to_float)(q, &mut y);
    y
}

/// `n` values of magnitude up to `scale`, mostly small, with some exact zeros and outliers.
fn row_of_scale(n: usize, scale: f32) -> impl Strategy<Value = Vec<f32>> {
    proptest::collection::vec((-1.0f32..1.0, 0u8..20), n).prop_map(move |v| {
        v.into_iter()
            .map(|(x, k)| match k {
                0 => 0.0,
                1 => x * scale,
                _ => x * x * x.signum() * scale / 8.0,
            })
            .collect()
    })
}

/// A row of any scale from 1e-3 to 1e4.
fn row(n: usize) -> impl Strategy<Value = Vec<f32>> {
    (-3.0f32..4.0).prop_flat_map(move |exp| row_of_scale(n, 10f32.powf(exp)))
}

/// A type, and a count of blocks: odd and even counts of 32 (1, 2, 3, 5, 7, 8 ... 31), and
/// 1, 2 or 3 super-blocks of 256.
fn type_and_len() -> impl Strategy<Value = (GgmlType, usize)> {
    (
        proptest::sample::select(WEIGHT_TYPES.to_vec()),
        proptest::sample::select(vec![1usize, 2, 3, 5, 7, 8, 9, 16, 31]),
    )
        .prop_map(|(ty, blocks)| {
            let block = type_traits(ty).unwrap().block_size.max(32);
            let nb = if block == 256 { blocks.min(3) } else { blocks };
            (ty, nb * block)
        })
}

/// Weights and activations at the scale of ggml's test data (`0.1 + 2 cos(i)`).
fn ggml_scale_case() -> impl Strategy<Value = (GgmlType, Vec<f32>, Vec<f32>)> {
    type_and_len().prop_flat_map(|(ty, n)| (Just(ty), row_of_scale(n, 2.1), row_of_scale(n, 2.1)))
}

fn any_scale_case() -> impl Strategy<Value = (GgmlType, Vec<f32>, Vec<f32>)> {
    type_and_len().prop_flat_map(|(ty, n)| (Just(ty), row(n), row(n)))
}

/// `vec_dot` on the quantized rows, and the f64 dot product of their dequantized values.
fn dots(ty: GgmlType, w: &[f32], a: &[f32]) -> (f64, f64, Vec<f32>, Vec<f32>) {
    let n = w.len();
    let t = type_traits(ty).unwrap();
    let act = type_traits(t.vec_dot_type).unwrap();
    let (qw, qa) = (quantize(t, w), quantize(act, a));
    let (dw, da) = (dequantize(t, &qw, n), dequantize(act, &qa, n));
    let got = (t.vec_dot.unwrap())(n, &qw, &qa) as f64;
    let want: f64 = dw.iter().zip(&da).map(|(&x, &y)| x as f64 * y as f64).sum();
    (got, want, dw, da)
}

proptest! {
    // Failures print the minimal input; nothing is written into the source tree.
    // Miri interprets every operation, thousands of times slower: a few cases there.
    #![proptest_config(ProptestConfig {
        cases: if cfg!(miri) { 4 } else { 400 },
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn vec_dot_is_within_ggml_bound_of_the_dequantized_dot((ty, w, a) in ggml_scale_case()) {
        let (got, want, _, _) = dots(ty, &w, &a);
        let error = ((got - want).abs() / w.len() as f64) as f32;
        prop_assert!(error < MAX_DOT_PRODUCT_ERROR, "{ty} n={}: error {error}", w.len());
    }

    #[test]
    fn vec_dot_equals_the_dequantized_dot_up_to_rounding((ty, w, a) in any_scale_case()) {
        rounding_check(ty, &w, &a)?;
    }

    #[test]
    fn activation_formats_reproduce_their_own_dequantized_values(
        ty in proptest::sample::select(vec![GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8_K]),
        x in row(768),
    ) {
        // Dequantized Q8 values are exactly d * q; quantizing them again must find the same
        // codes (the scale is recomputed from the largest value, which is d * 127 or -127).
        let t = type_traits(ty).unwrap();
        let q = quantize(t, &x);
        let y = dequantize(t, &q, x.len());
        let q2 = quantize(t, &y);
        let y2 = dequantize(t, &q2, x.len());
        for (i, (a, b)) in y.iter().zip(&y2).enumerate() {
            let tol = REQUANT_TOL * a.abs().max(f32::MIN_POSITIVE);
            prop_assert!((a - b).abs() <= tol, "{ty} [{i}] {a} vs {b}");
        }
    }
}

/// `vec_dot` equals the f64 dot product of the dequantized rows up to the roundings its
/// format allows (the property below, and its regression cases).
fn rounding_check(ty: GgmlType, w: &[f32], a: &[f32]) -> Result<(), TestCaseError> {
    let (got, want, dw, da) = dots(ty, w, a);
    // A weight is `scale * code - min`, and the kernels add the two parts separately, so
    // the terms they round are bounded by |w| plus the largest |w| of its block (which
    // bounds the block's min), times |a|.
    let t = type_traits(ty).unwrap();
    let mut magnitude = 0.0f64;
    for (wb, ab) in dw.chunks(t.block_size).zip(da.chunks(t.block_size)) {
        let wmax = wb.iter().fold(0.0f64, |m, &v| m.max(v.abs() as f64));
        for (&x, &y) in wb.iter().zip(ab) {
            magnitude += (x.abs() as f64 + 2.0 * wmax) * y.abs() as f64;
        }
    }
    let tol = if t.vec_dot_type == GgmlType::Q8_1 {
        DOT_ROUNDING_TOL_Q8_1
    } else {
        DOT_ROUNDING_TOL
    };
    // Q8_1 keeps `s = d·Σq` in f16 beside `d` in f16. When `d` is below f16's smallest
    // normal (2^-14), its rounding is absolute (half of 2^-24), not relative, so the
    // reference's `d_f16·Σq` and the kernel's `s` differ by up to 2^-25·|Σq| — times the
    // block's min, which |w|'s largest value bounds.
    let mut subnormal = 0.0f64;
    if t.vec_dot_type == GgmlType::Q8_1 {
        for (wb, ab) in w.chunks(t.block_size).zip(a.chunks(t.block_size)) {
            let amax = ab.iter().fold(0.0f64, |m, &v| m.max(v.abs() as f64));
            if amax / 127.0 < F16_MIN_NORMAL {
                let wmax = wb.iter().fold(0.0f64, |m, &v| m.max(v.abs() as f64));
                subnormal += F16_SUBNORMAL_STEP / 2.0 * 127.0 * ab.len() as f64 * wmax;
            }
        }
    }
    let bound = tol * magnitude + subnormal;
    prop_assert!(
        (got - want).abs() <= bound,
        "{ty} n={}: vec_dot {got} vs {want}: |diff| {} > {bound} (tol * magnitude + f16 subnormal rounding)",
        w.len(),
        (got - want).abs()
    );
    Ok(())
}

/// A case proptest found: an activation block so small that Q8_1's scale is an f16 subnormal.
#[test]
fn vec_dot_rounding_with_a_subnormal_activation_scale() {
    let (mut w, mut a) = (vec![0.0f32; 32], vec![0.0f32; 32]);
    w[0] = -0.8827476;
    a[0] = 0.0004124979;
    rounding_check(GgmlType::Q4_1, &w, &a).unwrap();
}
