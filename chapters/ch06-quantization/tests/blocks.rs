//! The quantizers and dequantizers against the bytes and floats of the reference tools, on rows
//! chosen to hit the corner cases (zeros, all-equal rows, tiny and huge scales, outliers):
//! - `quant/blocks-ggml.safetensors`: ggml's `ggml_quantize_chunk` (what `llama-quantize`
//!   runs) for the legacy and k-quant types;
//! - `quant/blocks.safetensors`: gguf-py's numpy quantizers (what the conversion scripts run)
//!   for the types it implements.

use ch01::GgmlType;
use ch06::quants::type_traits;
use testkit::refdata::TensorFile;
use testkit::{Tolerance, assert_close};

/// Both sides dequantize with the same float operations in the same order.
const DEQUANT_TOL: Tolerance = Tolerance::EXACT;

fn check_file(rel: &str, required: &[GgmlType]) {
    let file = TensorFile::open(rel).unwrap_or_else(|e| panic!("{e}"));
    let mut checked = vec![];
    for ty in GgmlType::ALL {
        let name = ty.name();
        let Some(t) = type_traits(ty) else { continue };
        if !file.contains(&format!("{name}.input")) {
            assert!(!required.contains(&ty), "{rel} has no {name}.input");
            continue;
        }
        let input = file.f32(&format!("{name}.input")).unwrap();
        let (qshape, want_q) = file.bytes(&format!("{name}.quantized")).unwrap();
        let want_deq = file.f32(&format!("{name}.dequantized")).unwrap();
        let (rows, n) = (input.shape[0], input.shape[1]);
        let row_bytes = n / t.block_size * t.type_size;
        assert_eq!(qshape, [rows, row_bytes], "{rel}: {name}.quantized shape");

        let mut got_q = vec![0u8; rows * row_bytes];
        for (x, q) in input.data.chunks(n).zip(got_q.chunks_mut(row_bytes)) {
            (t.from_float)(x, q);
        }
        for (r, (got, want)) in got_q
            .chunks(row_bytes)
            .zip(want_q.chunks(row_bytes))
            .enumerate()
        {
            if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
                panic!(
                    "{rel}: {name} row {r} differs from byte {i} (block {}, byte {} of {}): \
                     got {:02x?}, want {:02x?}",
                    i / t.type_size,
                    i % t.type_size,
                    t.type_size,
                    &got[i..(i + 8).min(row_bytes)],
                    &want[i..(i + 8).min(row_bytes)]
                );
            }
        }

        let mut got_deq = vec![0f32; rows * n];
        (t.to_float)(&want_q, &mut got_deq);
        assert_close(
            &format!("{name}.dequantized"),
            &want_deq.shape,
            &got_deq,
            &want_deq.data,
            DEQUANT_TOL,
        );
        checked.push(name);
    }
    println!("{rel}: bit-exact quantization and exact dequantization of {checked:?}");
}

#[test]
fn quantizers_match_ggml_byte_for_byte() {
    use GgmlType::*;
    check_file(
        "quant/blocks-ggml.safetensors",
        &[Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K],
    );
}

#[test]
fn quantizers_match_gguf_py_byte_for_byte() {
    use GgmlType::*;
    check_file(
        "quant/blocks.safetensors",
        &[F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0],
    );
}

/// The codes `from_float` gives a block of `x` (32 weights), one per weight: `Q8_0`'s signed
/// bytes, or `Q4_0`'s nibbles (weight `j` in the low nibble of byte `j`, `j + 16` in its high).
fn codes(ty: GgmlType, x: &[f32]) -> Vec<i32> {
    let t = type_traits(ty).unwrap();
    let mut q = vec![0u8; t.type_size];
    (t.from_float)(x, &mut q);
    let qs = &q[2..]; // after the f16 scale
    match ty {
        GgmlType::Q8_0 => qs.iter().map(|&b| b as i8 as i32).collect(),
        _ => (0..32)
            .map(|i| {
                (if i < 16 {
                    qs[i] & 0x0f
                } else {
                    qs[i - 16] >> 4
                }) as i32
            })
            .collect(),
    }
}

/// ggml's rounding at exact halves, which rows of real weights rarely hit: `Q8_0` rounds
/// `x / d` half away from zero (C's `roundf`). The block's largest weight is 127, so `d` is 1,
/// `1 / d` exact, and each `x / d` the half written here.
#[test]
fn q8_0_rounds_halves_away_from_zero() {
    let mut x = vec![0.0f32; 32];
    x[..9].copy_from_slice(&[127.0, 2.5, -2.5, 0.5, -0.5, 1.5, -1.5, 126.5, -126.5]);
    assert_eq!(
        codes(GgmlType::Q8_0, &x)[..9],
        [127, 3, -3, 1, -1, 2, -2, 127, -127]
    );
}

/// `Q4_0` takes the code of `x / d` as C's `(int8_t)(x / d + 8.5f)`: a truncation toward
/// zero of a value that is never negative, so halves round up, and 16 is clamped to 15. The
/// block's largest weight in magnitude is -8, so `d` is 1 and each `x / d` is exact.
#[test]
fn q4_0_truncates_x_plus_8_5_as_c_does() {
    let mut x = vec![0.0f32; 32];
    x[..7].copy_from_slice(&[-8.0, -2.5, -0.5, 0.5, 2.5, 6.5, 7.0]);
    x[16..19].copy_from_slice(&[7.5, -1.5, -7.5]);
    let got = codes(GgmlType::Q4_0, &x);
    assert_eq!(got[..7], [0, 6, 8, 9, 11, 15, 15], "weights 0..7");
    assert_eq!(got[16..19], [15, 7, 1], "weights 16..19");
    assert_eq!(got[7..16], [8; 9], "zeros");
}
