//! The KV cache in Q8_0: chapter 5's [`RowType`] with this chapter's block format.
//!
//! Chapter 5 keeps keys and values in f32 or f16. A Q8_0 row is a quarter of f32 and a bit more
//! than half of f16 (34 bytes per 32 values: 8.5 bits a value), quantized as llama.cpp does it
//! when a cache is `--cache-type-k q8_0`: blocks of 32 values, a scale `d = amax / 127` per
//! block, codes rounded to the nearest integer. Attention reads the blocks back through
//! chapter 3's [`KvRows`](ch03::KvRows), which decodes them.

use crate::quants::blocks::{BlockQ8_0, QK8_0};
use crate::quants::legacy::quantize_row_q8_0_ref;
use ch01::GgmlType;
use ch05::RowType;

// ANCHOR: q8_0_rows
/// Keys or values in Q8_0.
pub const ROW_Q8_0: RowType = RowType {
    ty: GgmlType::Q8_0,
    encode: encode_q8_0,
};

/// `x` (whole blocks of 32) as Q8_0 blocks, one block at a time on the stack.
fn encode_q8_0(x: &[f32], out: &mut [u8]) {
    let mut block = [BlockQ8_0 {
        d: half::f16::ZERO,
        qs: [0; QK8_0],
    }];
    for (x, out) in x
        .chunks_exact(QK8_0)
        .zip(out.chunks_exact_mut(size_of::<BlockQ8_0>()))
    {
        quantize_row_q8_0_ref(x, &mut block);
        out.copy_from_slice(bytemuck::bytes_of(&block[0]));
    }
}
// ANCHOR_END: q8_0_rows

/// The types a cache may keep its rows in, by llama.cpp's names.
pub const CACHE_ROW_TYPES: [RowType; 3] = [RowType::F32, RowType::F16, ROW_Q8_0];

/// The cache row type llama.cpp's `--cache-type-k`/`--cache-type-v` call `name` (`f32`,
/// `f16`, `q8_0`; any case).
pub fn cache_row_type(name: &str) -> Result<RowType, String> {
    CACHE_ROW_TYPES
        .into_iter()
        .find(|t| t.to_string().eq_ignore_ascii_case(name))
        .ok_or_else(|| {
            let names: Vec<String> = CACHE_ROW_TYPES.iter().map(|t| t.to_string()).collect();
            format!(
                "unknown KV cache type {name:?} (this engine keeps: {})",
                names.join(", ")
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ch03::KvRows;

    #[test]
    fn a_q8_0_row_is_what_the_reference_quantizer_writes_and_reads_back_within_a_step() {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 64) as f32 - 31.5) * 0.05)
            .collect();
        let mut bytes = vec![0u8; 2 * 34];
        (ROW_Q8_0.encode)(&x, &mut bytes);
        let rows = KvRows::Encoded {
            ty: GgmlType::Q8_0,
            bytes: &bytes,
        };
        let mut back = vec![0.0; 64];
        rows.axpy(64, 0, 0..64, 1.0, &mut back);
        for (b, (x, y)) in x.chunks(32).zip(back.chunks(32)).enumerate() {
            let d = x.iter().fold(0.0f32, |m, v| m.max(v.abs())) / 127.0;
            for (a, c) in x.iter().zip(y) {
                // Rounded to the nearest code: at most half a step (d/2), plus the f16
                // rounding of d itself (2^-11 of it, times up to 127 steps).
                assert!(
                    (a - c).abs() <= d * (0.5 + 127.0 / 2048.0),
                    "block {b}: {a} → {c}"
                );
            }
        }
    }

    #[test]
    fn a_q8_0_cache_refuses_heads_that_split_its_blocks() {
        let q8 = ch05::CacheTypes {
            k: ROW_Q8_0,
            v: RowType::F16,
        };
        assert!(q8.check_head_dim(64).is_ok());
        let e = q8.check_head_dim(48).unwrap_err().to_string();
        assert!(e.contains("48") && e.contains("q8_0 K"), "{e}");
        assert_eq!(q8.position_bytes(64), Some(2 * 34 + 64 * 2));
        assert_eq!(q8.position_bytes(48), None);
    }

    #[test]
    fn cache_types_are_named_as_llama_cpp_names_them() {
        assert_eq!(cache_row_type("q8_0").unwrap(), ROW_Q8_0);
        assert_eq!(cache_row_type("F16").unwrap(), RowType::F16);
        let e = cache_row_type("q4_0").unwrap_err();
        assert!(e.contains("q4_0") && e.contains("f32, f16, q8_0"), "{e}");
    }
}
