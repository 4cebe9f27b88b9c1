//! The quantizers and dequantizers against the bytes and floats of the reference tools, on rows
//! chosen to hit the corner cases (zeros, all-equal rows, tiny and huge scales, outliers):
//! - `quant/blocks-ggml.safetensors`: ggml's `ggml_quantize_chunk` (what `llama-quantize`
//!   runs) for the legacy and k-quant types;
//! - `quant/blocks.safetensors`: gguf-py's numpy quantizers (what the conversion scripts run)
//!   for the types it implements.

use ch06::ch01::GgmlType;
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
