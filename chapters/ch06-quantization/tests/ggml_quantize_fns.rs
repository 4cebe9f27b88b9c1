//! ggml's own unit test of its quantization functions (`tests/test-quantize-fns.cpp`), ported:
//! the same synthetic data, the same error measures and the same named bounds. A kernel that
//! passes here passes where ggml's does.

use ch01::GgmlType;
use ch06::quants::{TypeTraits, WEIGHT_TYPES, type_traits};

// ggml's bounds, with ggml's names and values.
const MAX_QUANTIZATION_REFERENCE_ERROR: f32 = 0.0001;
const MAX_QUANTIZATION_TOTAL_ERROR: f32 = 0.002;
const MAX_QUANTIZATION_TOTAL_ERROR_2BITS: f32 = 0.0075;
const MAX_QUANTIZATION_TOTAL_ERROR_3BITS: f32 = 0.0040;
const MAX_DOT_PRODUCT_ERROR: f32 = 0.02;
const MAX_DOT_PRODUCT_ERROR_LOWBIT: f32 = 0.04;

/// ggml's `test_size`: 128 blocks of 32.
const TEST_SIZE: usize = 32 * 128;

/// ggml's `generate_data`: `0.1 + amplitude * cos(i + offset)`, the sum taken in double.
fn generate_data(offset: f32, n: usize, amplitude: f32) -> Vec<f32> {
    (0..n)
        .map(|i| (0.1 + (amplitude * (i as f32 + offset).cos()) as f64) as f32)
        .collect()
}

/// ggml's `array_rmse`, which (despite its name) divides the root of the sum by `n`.
fn array_rmse(a: &[f32], b: &[f32]) -> f32 {
    let sum: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| {
            let d = (x - y) as f64;
            d * d
        })
        .sum();
    (sum.sqrt() as f32) / a.len() as f32
}

fn dot_product(a: &[f32], b: &[f32]) -> f32 {
    let mut sum = 0.0f64;
    for (&x, &y) in a.iter().zip(b) {
        sum += (x * y) as f64;
    }
    sum as f32
}

fn row_bytes(t: &TypeTraits, n: usize) -> usize {
    n / t.block_size * t.type_size
}

fn total_quantization_error(t: &TypeTraits, data: &[f32]) -> f32 {
    let mut q = vec![0u8; row_bytes(t, data.len())];
    let mut out = vec![0f32; data.len()];
    (t.from_float)(data, &mut q);
    (t.to_float)(&q, &mut out);
    array_rmse(data, &out)
}

fn dot_product_error(t: &TypeTraits, x: &[f32], y: &[f32]) -> f32 {
    let act = type_traits(t.vec_dot_type).expect("activation type has kernels");
    let mut qx = vec![0u8; row_bytes(t, x.len())];
    let mut qy = vec![0u8; row_bytes(act, y.len())];
    (t.from_float)(x, &mut qx);
    (act.from_float)(y, &mut qy);
    let result = (t.vec_dot.expect("weight type has a vec_dot"))(x.len(), &qx, &qy);
    (result - dot_product(x, y)).abs() / x.len() as f32
}

#[test]
fn quantization_and_dot_product_errors_are_within_ggml_bounds() {
    let data = generate_data(0.0, TEST_SIZE, 2.0);
    let data2 = generate_data(1.0, TEST_SIZE, 2.0);
    let mut report = String::new();
    let mut failed = vec![];
    for ty in WEIGHT_TYPES {
        let t = type_traits(ty).unwrap();
        let max_quantization_error = match ty {
            GgmlType::Q2_K => MAX_QUANTIZATION_TOTAL_ERROR_2BITS,
            GgmlType::Q3_K => MAX_QUANTIZATION_TOTAL_ERROR_3BITS,
            _ => MAX_QUANTIZATION_TOTAL_ERROR,
        };
        let total_error = total_quantization_error(t, &data);
        let max_dot_error = match ty {
            GgmlType::Q2_K => MAX_DOT_PRODUCT_ERROR_LOWBIT,
            _ => MAX_DOT_PRODUCT_ERROR,
        };
        let dot_error = dot_product_error(t, &data, &data2);
        report += &format!(
            "{:5} absolute quantization error {total_error:.6} (< {max_quantization_error}), \
             dot product error {dot_error:.6} (< {max_dot_error})\n",
            ty.name()
        );
        // As in ggml, a NaN error fails.
        let ok = total_error < max_quantization_error && dot_error < max_dot_error;
        if !ok {
            failed.push(ty.name());
        }
    }
    println!("{report}");
    assert!(
        failed.is_empty(),
        "outside ggml's bounds: {failed:?}\n{report}"
    );
}

#[test]
fn f32_vec_dot_is_within_the_reference_error_for_every_tail_length() {
    let t = type_traits(GgmlType::F32).unwrap();
    for n in [
        1, 2, 3, 5, 7, 8, 15, 16, 17, 31, 33, 63, 67, 127, 129, 193, 255, 1023,
    ] {
        let a = generate_data(0.0, n, 2.0);
        let b = generate_data(1.0, n, 2.0);
        let (mut qa, mut qb) = (vec![0u8; 4 * n], vec![0u8; 4 * n]);
        (t.from_float)(&a, &mut qa);
        (t.from_float)(&b, &mut qb);
        let result = (t.vec_dot.unwrap())(n, &qa, &qb);
        let error = (result - dot_product(&a, &b)).abs() / n as f32;
        assert!(
            error < MAX_QUANTIZATION_REFERENCE_ERROR,
            "f32 vec_dot n={n}: error {error}"
        );
    }
}
