//! Each way a GGUF file can be malformed gives an error that names the byte offset of the bad
//! field (and the key or tensor it belongs to), never a panic or a huge allocation.

mod common;

use ch01::gguf::{Context, ParseError, ParseErrorKind, Value, ValueType};
use ch01::{Config, GgmlType, Gguf, GgufError, GgufFile};
use common::{Builder, sample};

/// Parse `bytes`, which must fail; check that the message starts with the offset.
#[track_caller]
fn parse_err(bytes: &[u8]) -> ParseError {
    let e = Gguf::parse(bytes).expect_err("a malformed file parsed");
    let pe = e.parse_error().expect("a parse error").clone();
    let msg = e.to_string();
    assert!(
        msg.starts_with(&format!("at byte {}", pe.offset)),
        "message does not lead with the offset: {msg}"
    );
    pe
}

/// Overwrite 8 bytes at `at` with `v`.
fn put_u64(bytes: &mut [u8], at: u64, v: u64) {
    bytes[at as usize..at as usize + 8].copy_from_slice(&v.to_le_bytes());
}

fn put_u32(bytes: &mut [u8], at: u64, v: u32) {
    bytes[at as usize..at as usize + 4].copy_from_slice(&v.to_le_bytes());
}

fn one_tensor(dims: &[u64], ty: GgmlType) -> Builder {
    let n: u64 = dims.iter().product();
    let data = vec![0u8; ty.row_bytes(n).unwrap_or(0) as usize];
    Builder::new()
        .kv("general.architecture", Value::String("llama".into()))
        .tensor("t.weight", dims, ty, data)
}

#[test]
fn wrong_magic() {
    let mut bytes = sample().build();
    bytes[..4].copy_from_slice(b"GGML");
    let e = parse_err(&bytes);
    assert_eq!((e.offset, e.kind), (0, ParseErrorKind::BadMagic(*b"GGML")));
    assert!(
        parse_err(b"")
            .to_string()
            .contains("file ends inside the magic")
    );
}

#[test]
fn unsupported_versions() {
    for (v, needle) in [
        (1, "GGUF version 1 is not supported"),
        (4, "GGUF version 4 is not supported"),
        (0x0300_0000, "big-endian"),
    ] {
        let e = parse_err(&sample().version(v).build());
        assert_eq!(
            (e.offset, &e.kind),
            (4, &ParseErrorKind::UnsupportedVersion(v))
        );
        assert!(e.to_string().contains(needle), "{e}");
    }
}

#[test]
fn a_file_cut_anywhere_is_an_error_naming_where() {
    let bytes = sample().build();
    for len in 0..bytes.len() {
        let e = Gguf::parse(&bytes[..len]).expect_err("a truncated file parsed");
        let pe = e.parse_error().expect("a parse error");
        // Cut in the header: the error is at or before the cut; cut in the data section: the
        // tensor that no longer fits is named.
        assert!(pe.offset <= len as u64, "cut at {len}: {e}");
        assert!(e.to_string().starts_with("at byte"), "{e}");
    }
}

#[test]
fn truncated_field_says_what_it_needed() {
    // Few enough entries that the metadata count still fits what is left after the cut.
    let b = Builder::new()
        .kv("general.architecture", Value::String("llama".into()))
        .kv("b", Value::U8(1));
    let (bytes, layout) = b.build_with_layout();
    let cut = layout.kv[1] as usize + 3; // inside the length of the second key
    let e = parse_err(&bytes[..cut]);
    assert_eq!(e.offset, layout.kv[1]);
    assert_eq!(
        e.kind,
        ParseErrorKind::Truncated {
            what: "a metadata key",
            need: 8,
            left: 3
        }
    );
    assert_eq!(
        e.to_string(),
        format!(
            "at byte {}: file ends inside a metadata key: it needs 8 bytes, 3 are left",
            layout.kv[1]
        )
    );
}

#[test]
fn string_length_of_2_pow_63() {
    let (mut bytes, layout) = sample().build_with_layout();
    let at = layout.kv[0];
    put_u64(&mut bytes, at, 1 << 63);
    let e = parse_err(&bytes);
    let left = bytes.len() as u64 - at - 8;
    assert_eq!(e.offset, at);
    assert_eq!(
        e.to_string(),
        format!(
            "at byte {at}: string length 9223372036854775808 exceeds the {left} bytes left in \
             the file"
        )
    );
}

#[test]
fn string_value_too_long_names_its_key() {
    let (mut bytes, layout) = sample().build_with_layout();
    // general.name's value: after the key (8 + 12 bytes) and the type (4).
    let at = layout.kv[1] + 8 + "general.name".len() as u64 + 4;
    put_u64(&mut bytes, at, u64::MAX);
    let e = parse_err(&bytes);
    assert_eq!(e.offset, at);
    assert_eq!(e.context, Some(Context::Key("general.name".into())));
    assert!(matches!(
        e.kind,
        ParseErrorKind::StringTooLong { len: u64::MAX, .. }
    ));
}

#[test]
fn tensor_count_of_2_pow_40() {
    let mut bytes = sample().build();
    put_u64(&mut bytes, 8, 1 << 40);
    let e = parse_err(&bytes);
    assert_eq!(e.offset, 8);
    assert!(
        matches!(e.kind, ParseErrorKind::CountTooLarge { what: "tensor infos", count, min_each: 24, .. } if count == 1 << 40),
        "{e}"
    );
}

#[test]
fn metadata_count_of_2_pow_40() {
    let mut bytes = sample().build();
    put_u64(&mut bytes, 16, 1 << 40);
    let e = parse_err(&bytes);
    assert_eq!(e.offset, 16);
    assert!(
        e.to_string()
            .contains("1099511627776 metadata entries cannot fit"),
        "{e}"
    );
}

#[test]
fn array_of_2_pow_40_elements() {
    let b = Builder::new().kv("arr", Value::Array(ValueType::U8, vec![Value::U8(1)]));
    let (mut bytes, layout) = b.build_with_layout();
    let count_at = layout.kv[0] + 8 + 3 + 4 + 4;
    put_u64(&mut bytes, count_at, 1 << 40);
    let e = parse_err(&bytes);
    assert_eq!(e.offset, count_at);
    assert_eq!(e.context, Some(Context::Key("arr".into())));
    assert!(
        e.to_string()
            .contains("1099511627776 array elements cannot fit"),
        "{e}"
    );

    // Strings take at least their 8-byte length each, so 2 strings do not fit in 9 bytes.
    let b = Builder::new().kv(
        "s",
        Value::Array(ValueType::String, vec![Value::String("a".into())]),
    );
    let (mut bytes, layout) = b.build_with_layout();
    let count_at = layout.kv[0] + 8 + 1 + 4 + 4;
    put_u64(&mut bytes, count_at, 2);
    let e = parse_err(&bytes);
    assert!(
        matches!(
            e.kind,
            ParseErrorKind::CountTooLarge {
                count: 2,
                min_each: 8,
                left: 9,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn nested_arrays_are_read_but_not_too_deep() {
    let mut v = Value::Array(ValueType::U8, vec![Value::U8(7)]);
    for _ in 1..ch01::gguf::MAX_ARRAY_DEPTH {
        v = Value::Array(ValueType::Array, vec![v]);
    }
    let ok = Builder::new().kv("deep", v.clone()).build();
    assert_eq!(Gguf::parse(&ok).unwrap().get("deep"), Some(&v));

    let too_deep = Value::Array(ValueType::Array, vec![v]);
    let e = parse_err(&Builder::new().kv("deep", too_deep).build());
    assert_eq!(
        e.kind,
        ParseErrorKind::NestingTooDeep(ch01::gguf::MAX_ARRAY_DEPTH)
    );
    assert_eq!(e.context, Some(Context::Key("deep".into())));
}

#[test]
fn unknown_value_types() {
    let (mut bytes, layout) = sample().build_with_layout();
    let type_at = layout.kv[0] + 8 + "general.architecture".len() as u64;
    put_u32(&mut bytes, type_at, 13);
    let e = parse_err(&bytes);
    assert_eq!(
        (e.offset, &e.kind),
        (type_at, &ParseErrorKind::UnknownValueType(13))
    );
    assert_eq!(e.context, Some(Context::Key("general.architecture".into())));

    let b = Builder::new().kv("a", Value::Array(ValueType::U8, vec![]));
    let (mut bytes, layout) = b.build_with_layout();
    let elem_at = layout.kv[0] + 8 + 1 + 4;
    put_u32(&mut bytes, elem_at, 0xdead);
    let e = parse_err(&bytes);
    assert_eq!(
        (e.offset, e.kind),
        (elem_at, ParseErrorKind::UnknownValueType(0xdead))
    );
}

#[test]
fn invalid_utf8_and_empty_keys() {
    let (mut bytes, layout) = sample().build_with_layout();
    bytes[layout.kv[0] as usize + 8] = 0xff;
    let e = parse_err(&bytes);
    assert_eq!(
        (e.offset, e.kind),
        (layout.kv[0], ParseErrorKind::InvalidUtf8)
    );

    let e = parse_err(&Builder::new().kv("", Value::U32(1)).build());
    assert_eq!((e.offset, e.kind), (24, ParseErrorKind::EmptyKey));
}

#[test]
fn duplicate_key() {
    let b = sample().kv("test.u8", Value::U8(1));
    let (bytes, layout) = b.build_with_layout();
    let e = parse_err(&bytes);
    assert_eq!(e.offset, *layout.kv.last().unwrap());
    assert_eq!(e.kind, ParseErrorKind::DuplicateKey("test.u8".into()));
    assert!(
        e.to_string().contains("duplicate metadata key \"test.u8\""),
        "{e}"
    );
}

#[test]
fn duplicate_tensor_name() {
    let b = one_tensor(&[4], GgmlType::F32).tensor("t.weight", &[4], GgmlType::F32, vec![0; 16]);
    let (bytes, layout) = b.build_with_layout();
    let e = parse_err(&bytes);
    assert_eq!(e.offset, layout.tensor_info[1]);
    assert_eq!(e.kind, ParseErrorKind::DuplicateTensor("t.weight".into()));
}

#[test]
fn alignment_must_be_a_u32_power_of_two() {
    for a in [0, 3, 48] {
        let (bytes, layout) = Builder::new().alignment(a).build_with_layout();
        let e = parse_err(&bytes);
        assert_eq!(
            (e.offset, &e.kind),
            (layout.kv[0], &ParseErrorKind::BadAlignment(a.into()))
        );
        assert_eq!(e.context, Some(Context::Key("general.alignment".into())));
    }
    let bytes = Builder::new()
        .kv("general.alignment", Value::U64(32))
        .build();
    let e = parse_err(&bytes);
    assert!(e.to_string().contains("must be a u32, found u64 32"), "{e}");
}

#[test]
fn more_than_four_dimensions() {
    let (bytes, layout) = one_tensor(&[1, 1, 1, 1, 4], GgmlType::F32).build_with_layout();
    let e = parse_err(&bytes);
    assert_eq!(
        (e.offset, &e.kind),
        (layout.n_dims_field[0], &ParseErrorKind::TooManyDims(5))
    );
    assert_eq!(e.context, Some(Context::Tensor("t.weight".into())));
    assert!(e.to_string().contains("(tensor \"t.weight\")"), "{e}");
}

#[test]
fn dimensions_whose_product_overflows() {
    let b = Builder::new().tensor("t", &[1 << 32, 1 << 32], GgmlType::F32, vec![]);
    let (bytes, layout) = b.build_with_layout();
    let e = parse_err(&bytes);
    assert_eq!(e.offset, layout.n_dims_field[0]);
    assert_eq!(
        e.kind,
        ParseErrorKind::ShapeOverflow(vec![1 << 32, 1 << 32])
    );

    // The element count fits, but not the size in bytes (8 bytes each).
    let b = Builder::new().tensor("t", &[1 << 61], GgmlType::F64, vec![]);
    let e = parse_err(&b.build());
    assert!(matches!(e.kind, ParseErrorKind::ShapeOverflow(_)), "{e}");

    let b = Builder::new().tensor("t", &[u64::MAX], GgmlType::I8, vec![]);
    let (bytes, layout) = b.build_with_layout();
    let e = parse_err(&bytes);
    let dim_at = layout.n_dims_field[0] + 4;
    assert_eq!(
        (e.offset, e.kind),
        (dim_at, ParseErrorKind::DimTooLarge(u64::MAX))
    );
}

#[test]
fn unknown_and_removed_ggml_types() {
    for id in [4, 31, 43, 1000] {
        let (mut bytes, layout) = one_tensor(&[32], GgmlType::F32).build_with_layout();
        put_u32(&mut bytes, layout.type_field[0], id);
        let e = parse_err(&bytes);
        assert_eq!(
            (e.offset, &e.kind),
            (layout.type_field[0], &ParseErrorKind::UnknownGgmlType(id))
        );
    }
}

#[test]
fn rows_must_hold_whole_blocks() {
    let b = Builder::new().tensor("q", &[33], GgmlType::Q4_1, vec![0; 20]);
    let (bytes, layout) = b.build_with_layout();
    let e = parse_err(&bytes);
    assert_eq!(e.offset, layout.type_field[0]);
    assert_eq!(
        e.kind,
        ParseErrorKind::PartialBlock {
            ne0: 33,
            ggml_type: GgmlType::Q4_1
        }
    );
}

#[test]
fn offsets_outside_the_data_section() {
    let (mut bytes, layout) = one_tensor(&[8], GgmlType::F32).build_with_layout();
    put_u64(&mut bytes, layout.offset_field[0], 32);
    let e = parse_err(&bytes);
    assert_eq!(e.offset, layout.offset_field[0]);
    assert_eq!(
        e.kind,
        ParseErrorKind::OutOfBounds {
            offset: 32,
            n_bytes: 32,
            data_len: 32
        }
    );
    assert!(
        e.to_string()
            .contains("bytes 32..64 lie outside the 32-byte data"),
        "{e}"
    );

    // An offset near 2^64 must not wrap around to look valid.
    put_u64(&mut bytes, layout.offset_field[0], u64::MAX - 31);
    let e = parse_err(&bytes);
    assert!(matches!(e.kind, ParseErrorKind::OutOfBounds { .. }), "{e}");

    // The data section itself cut short: the last tensor no longer fits.
    // half.weight, the fourth tensor, has 12 bytes at data offset 160.
    let (bytes, layout) = sample().build_with_layout();
    let e = parse_err(&bytes[..(layout.data_offset + 171) as usize]);
    assert_eq!(e.offset, layout.offset_field[3]);
    assert_eq!(e.context, Some(Context::Tensor("half.weight".into())));
}

#[test]
fn data_section_past_the_end() {
    let (bytes, layout) = one_tensor(&[0], GgmlType::F32).build_with_layout();
    assert!(
        layout.data_offset > layout.end_of_infos,
        "the test needs padding"
    );
    let e = parse_err(&bytes[..layout.end_of_infos as usize]);
    assert_eq!(e.offset, layout.end_of_infos);
    assert!(
        matches!(e.kind, ParseErrorKind::DataSectionPastEnd { .. }),
        "{e}"
    );
}

#[test]
fn misaligned_offset() {
    let b = one_tensor(&[4], GgmlType::F32).tensor_at("u", &[4], GgmlType::F32, vec![0; 16], 48);
    let (bytes, layout) = b.build_with_layout();
    let e = parse_err(&bytes);
    assert_eq!(e.offset, layout.offset_field[1]);
    assert_eq!(
        e.kind,
        ParseErrorKind::Misaligned {
            offset: 48,
            alignment: 32
        }
    );
    assert_eq!(e.context, Some(Context::Tensor("u".into())));
}

#[test]
fn overlapping_tensors() {
    // a: bytes 0..64; b: 32..48, inside a; c: 64..80 touches a but does not overlap.
    let b = Builder::new()
        .tensor_at("a", &[16], GgmlType::F32, vec![0; 64], 0)
        .tensor_at("c", &[4], GgmlType::F32, vec![0; 16], 64)
        .tensor_at("b", &[4], GgmlType::F32, vec![0; 16], 32);
    let (bytes, layout) = b.build_with_layout();
    let e = parse_err(&bytes);
    assert_eq!(e.offset, layout.offset_field[2]);
    assert_eq!(e.context, Some(Context::Tensor("b".into())));
    assert_eq!(
        e.kind,
        ParseErrorKind::Overlap {
            other: "a".into(),
            other_offset: 0,
            other_bytes: 64,
            offset: 32
        }
    );
    // Touching is not overlapping: a ends where c starts.
    let b = Builder::new()
        .tensor_at("a", &[16], GgmlType::F32, vec![0; 64], 0)
        .tensor_at("c", &[4], GgmlType::F32, vec![0; 16], 64);
    assert!(Gguf::parse(&b.build()).is_ok());
    // Same start, and an empty tensor anywhere: the first overlaps, the second does not.
    let b = Builder::new()
        .tensor_at("a", &[8], GgmlType::F32, vec![0; 32], 0)
        .tensor_at("z", &[0], GgmlType::F32, vec![], 0)
        .tensor_at("b", &[8], GgmlType::F32, vec![0; 32], 0);
    let e = parse_err(&b.build());
    assert!(matches!(e.kind, ParseErrorKind::Overlap { .. }), "{e}");
    let b = Builder::new()
        .tensor_at("a", &[8], GgmlType::F32, vec![0; 32], 0)
        .tensor_at("z", &[0], GgmlType::F32, vec![], 0);
    assert!(Gguf::parse(&b.build()).is_ok());
}

#[test]
fn open_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.gguf");
    let e = GgufFile::open(&missing).err().unwrap();
    assert!(matches!(e, GgufError::Io { .. }));
    assert!(e.to_string().contains("missing.gguf"), "{e}");

    let bad = dir.path().join("bad.gguf");
    let mut bytes = sample().build();
    put_u64(&mut bytes, 8, 1 << 40);
    std::fs::write(&bad, &bytes).unwrap();
    let e = GgufFile::open(&bad).err().unwrap();
    let msg = e.to_string();
    assert!(
        msg.contains("bad.gguf: at byte 8: 1099511627776 tensor infos"),
        "{msg}"
    );
    assert_eq!(e.parse_error().map(|p| p.offset), Some(8));
}

#[test]
fn config_errors_name_the_key_or_architecture() {
    let g = Gguf::parse(&sample().build()).unwrap();
    let e = Config::from_gguf(&g, &["llama"]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "required metadata key \"llama.block_count\" is missing"
    );

    let qwen = Builder::new().kv("general.architecture", Value::String("qwen2".into()));
    let e = Config::from_gguf(&Gguf::parse(&qwen.build()).unwrap(), &["llama"]).unwrap_err();
    assert!(
        e.to_string()
            .contains("architecture \"qwen2\" is not supported"),
        "{e}"
    );

    let b = Builder::new()
        .kv("general.architecture", Value::String("llama".into()))
        .kv("llama.block_count", Value::String("thirty".into()));
    let e = Config::from_gguf(&Gguf::parse(&b.build()).unwrap(), &["llama"]).unwrap_err();
    assert!(
        e.to_string()
            .contains("\"llama.block_count\": expected an integer"),
        "{e}"
    );
}

#[test]
fn a_tensor_of_an_unsupported_type_cannot_be_dequantized() {
    let b = Builder::new().tensor("k", &[256], GgmlType::Q6_K, vec![0; 210]);
    let file = GgufFile::from_bytes(b.build()).unwrap();
    assert_eq!(file.tensor_bytes("k").unwrap().len(), 210);
    let e = file.tensor_f32("k").unwrap_err();
    assert!(
        e.to_string()
            .contains("tensor \"k\": dequantizing Q6_K is not supported"),
        "{e}"
    );
}
