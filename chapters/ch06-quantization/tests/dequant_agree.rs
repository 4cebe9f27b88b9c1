//! Chapter 1's dequantizers and chapter 6's give the same floats, bit for bit, for every type
//! both implement.
//!
//! Chapter 1 reads the bytes field by field (`ch01::dequant`); chapter 6 casts them to ggml's
//! block structs (`quants::blocks`). Both port ggml's `dequantize_row_*`, so any difference is
//! a bug in one of them. The bytes are edge cases (scales that are zero, negative, subnormal,
//! the largest f16, infinite or NaN; codes all 0 or all 1) and random blocks.
//!
//! Chapter 1 implements only what the default model stores and the plain floats; the list of
//! types only chapter 6 implements is written out below, so that a type added to either
//! chapter fails here until it is compared (or listed as intended).

use ch01::GgmlType;
use ch01::dequant::{self, DequantError};
use ch06::type_traits;
use proptest::prelude::*;

/// Types chapter 6 dequantizes and chapter 1 does not, by design: chapter 1 reads the default
/// model (Q4_1 matrices, a Q8_0 embedding, f32 norms) and the plain float types, and leaves
/// ggml's other formats, and the activation formats Q8_1 and Q8_K, to chapter 6.
const ONLY_CHAPTER_6: [GgmlType; 10] = {
    use GgmlType::*;
    [Q4_0, Q5_0, Q5_1, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K]
};

fn chapter_1_supports(ty: GgmlType) -> bool {
    let block = vec![0u8; ty.type_size() as usize];
    match dequant::dequantize(ty, &block, ty.block_size() as usize) {
        Ok(_) => true,
        Err(DequantError::Unsupported(_)) => false,
        Err(e) => panic!("chapter 1, one zero block of {ty}: {e}"),
    }
}

fn chapter_6_supports(ty: GgmlType) -> bool {
    type_traits(ty).is_some()
}

/// The types both chapters dequantize.
fn shared_types() -> Vec<GgmlType> {
    GgmlType::ALL
        .into_iter()
        .filter(|&t| chapter_1_supports(t) && chapter_6_supports(t))
        .collect()
}

#[test]
fn each_type_is_in_both_chapters_or_listed_as_chapter_6_only() {
    let mut wrong = vec![];
    for ty in GgmlType::ALL {
        let listed = ONLY_CHAPTER_6.contains(&ty);
        match (chapter_1_supports(ty), chapter_6_supports(ty)) {
            (true, false) => wrong.push(format!("{ty}: chapter 1 dequantizes it, chapter 6 not")),
            (false, true) if !listed => wrong.push(format!(
                "{ty}: only chapter 6 dequantizes it; add it to chapter 1 or to ONLY_CHAPTER_6"
            )),
            (true, true) if listed => wrong.push(format!(
                "{ty}: both chapters dequantize it; remove it from ONLY_CHAPTER_6"
            )),
            (false, false) if listed => wrong.push(format!("{ty}: neither chapter dequantizes it")),
            _ => {}
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // The comparisons below are not vacuous: the default model's types are among them.
    let shared = shared_types();
    for ty in [GgmlType::F32, GgmlType::Q8_0, GgmlType::Q4_1] {
        assert!(shared.contains(&ty), "{ty} is not compared: {shared:?}");
    }
}

/// Dequantizes `bytes` (whole blocks of `ty`) with both chapters; `Err` names the first
/// element that differs.
fn compare(ty: GgmlType, bytes: &[u8]) -> Result<(), String> {
    let n = bytes.len() / ty.type_size() as usize * ty.block_size() as usize;
    let ch1 = dequant::dequantize(ty, bytes, n).map_err(|e| format!("chapter 1: {e}"))?;
    let mut ch6 = vec![0f32; n];
    (type_traits(ty).unwrap().to_float)(bytes, &mut ch6);
    for (i, (&a, &b)) in ch1.iter().zip(&ch6).enumerate() {
        // The plain floats are conversions: every bit, NaN payloads included, must survive.
        // A quantized value is arithmetic (`q * d + m`), and Rust leaves the payload of a NaN
        // result unspecified: there, NaN must meet NaN.
        let same = a.to_bits() == b.to_bits() || (ty.is_quantized() && a.is_nan() && b.is_nan());
        if !same {
            let block = i / ty.block_size() as usize;
            let size = ty.type_size() as usize;
            return Err(format!(
                "{ty} element {i}: chapter 1 {a:e} ({:#010x}), chapter 6 {b:e} ({:#010x}); \
                 block bytes {:02x?}",
                a.to_bits(),
                b.to_bits(),
                &bytes[block * size..][..size]
            ));
        }
    }
    Ok(())
}

/// f16 bit patterns for scales and mins: zeros, subnormals (smallest, largest, negative), the
/// smallest normal, ±1, the largest finite, infinities and NaNs.
const F16_EDGES: [u16; 14] = [
    0x0000, 0x8000, 0x0001, 0x03ff, 0x8001, 0x83ff, 0x0400, 0x3c00, 0xbc00, 0x7bff, 0xfbff, 0x7c00,
    0xfc00, 0x7e01,
];

/// Code bytes: every bit 0, every bit 1, each nibble alone, the i8 extremes, a ramp.
fn code_patterns(len: usize) -> Vec<Vec<u8>> {
    let mut p: Vec<Vec<u8>> = [0x00, 0xff, 0x0f, 0xf0, 0x80, 0x7f, 0x01]
        .iter()
        .map(|&b| vec![b; len])
        .collect();
    p.push((0..len).map(|i| (i * 37 + 11) as u8).collect());
    p
}

/// Edge-case blocks of `ty`: every combination of the edge scales with every code pattern.
/// A type without a case here fails, so a type both chapters gain gets its edge cases.
fn edge_blocks(ty: GgmlType) -> Vec<u8> {
    let mut out = vec![];
    let h = |x: u16| x.to_le_bytes();
    match ty {
        GgmlType::F32 => {
            for x in [
                0u32,
                0x8000_0000,
                1,
                0x007f_ffff,
                0x8000_0001,
                0x0080_0000,
                0x3f80_0000,
                0x7f7f_ffff,
                0xff7f_ffff,
                0x7f80_0000,
                0xff80_0000,
                0x7fc0_0000,
                0x7f80_0001,
                0xffff_ffff,
            ] {
                out.extend(x.to_le_bytes());
            }
        }
        GgmlType::F16 | GgmlType::BF16 => {
            for x in F16_EDGES
                .into_iter()
                .chain([0x7f80, 0xff80, 0xffff, 0x0080])
            {
                out.extend(h(x));
            }
        }
        GgmlType::Q8_0 => {
            for d in F16_EDGES {
                for qs in code_patterns(32) {
                    out.extend(h(d));
                    out.extend(qs);
                }
            }
        }
        GgmlType::Q4_1 => {
            for d in F16_EDGES {
                for m in F16_EDGES {
                    for qs in code_patterns(16) {
                        out.extend(h(d));
                        out.extend(h(m));
                        out.extend(qs);
                    }
                }
            }
        }
        other => panic!("no edge cases for {other}: write them here"),
    }
    out
}

#[test]
fn edge_case_blocks_dequantize_to_the_same_bits() {
    for ty in shared_types() {
        let bytes = edge_blocks(ty);
        assert_eq!(bytes.len() % ty.type_size() as usize, 0, "{ty}");
        compare(ty, &bytes).unwrap_or_else(|e| panic!("{e}"));
    }
}

/// A type both chapters dequantize, and the bytes of 1 to 8 random blocks of it.
fn random_blocks() -> impl Strategy<Value = (GgmlType, Vec<u8>)> {
    proptest::sample::select(shared_types()).prop_flat_map(|ty| {
        let size = ty.type_size() as usize;
        (
            Just(ty),
            (1..=8usize).prop_flat_map(move |n| proptest::collection::vec(any::<u8>(), n * size)),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_blocks_dequantize_to_the_same_bits((ty, bytes) in random_blocks()) {
        compare(ty, &bytes).map_err(TestCaseError::fail)?;
    }
}
