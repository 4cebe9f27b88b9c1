//! Files written by the test writer parse back to what was written, in both GGUF versions.

mod common;

use ch01::gguf::{Value, ValueType};
use ch01::{GgmlType, Gguf, GgufError, GgufFile};
use common::{Builder, f32_bytes, sample};

#[test]
fn every_value_type_round_trips_in_versions_2_and_3() {
    for version in [2, 3] {
        let b = sample().version(version);
        let bytes = b.build();
        let g = Gguf::parse(&bytes).unwrap();
        assert_eq!(g.version, version);
        assert_eq!(g.metadata, b.kvs, "version {version}");
        assert_eq!(g.alignment, 32);
    }
}

#[test]
fn tensor_infos_and_data_come_back() {
    let b = sample();
    let (bytes, layout) = b.build_with_layout();
    let file = GgufFile::from_bytes(bytes.as_slice()).unwrap();
    assert_eq!(file.data_offset, layout.data_offset);
    assert_eq!(file.data_offset % 32, 0);
    assert_eq!(file.tensors.len(), b.tensors.len());
    for (t, spec) in file.tensors.iter().zip(&b.tensors) {
        assert_eq!(
            (&t.name, &t.dims, t.ggml_type),
            (&spec.name, &spec.dims, spec.ty)
        );
        assert_eq!(t.n_bytes(), spec.data.len() as u64, "{}", t.name);
        assert_eq!(file.tensor_bytes(&t.name).unwrap(), spec.data, "{}", t.name);
    }
    let embd = file.tensor("embd.weight").unwrap();
    assert_eq!((embd.n_elements(), embd.shape()), (64, vec![2, 32]));

    assert_eq!(
        file.tensor_f32("norm.weight").unwrap(),
        [1.0, -2.0, 0.5, 3.25]
    );
    let q8 = file.tensor_f32("embd.weight").unwrap();
    assert_eq!((q8[0], q8[31], q8[32], q8[63]), (-4.0, 3.75, -8.0, 7.5));
    let q4 = file.tensor_f32("proj.weight").unwrap();
    assert_eq!((q4[0], q4[15], q4[16], q4[31]), (-2.0, 5.5, 5.5, -2.0));
    assert_eq!(
        file.tensor_f32("half.weight").unwrap(),
        [-2.5, -1.5, -0.5, 0.5, 1.5, 2.5]
    );
    assert_eq!(file.tensor_f32("empty.weight").unwrap(), Vec::<f32>::new());
}

#[test]
fn getters_convert_what_fits_and_name_what_does_not() {
    let g = Gguf::parse(&sample().build()).unwrap();
    assert_eq!(g.get_u32("test.u8").unwrap(), 200);
    assert_eq!(g.get_u32("test.u16").unwrap(), 60000);
    assert_eq!(g.get_u64("test.u64").unwrap(), 1 << 40);
    assert_eq!(g.get_f32("test.f32").unwrap(), 1e-5);
    assert_eq!(g.get_f32("test.f64").unwrap(), -0.125);
    assert!(g.get_bool("test.bool").unwrap());
    assert_eq!(g.get_str("general.name").unwrap(), "tiny ✓");
    assert_eq!(
        g.get_str_array("test.strings").unwrap(),
        ["a", "", "Ġthe", "<|im_end|>"]
    );
    assert_eq!(g.get_i32_array("test.i32s").unwrap(), [-1, 7]);
    assert_eq!(g.get_array("test.nested").unwrap().len(), 3);
    assert_eq!(g.get("test.i8"), Some(&Value::I8(-100)));
    assert_eq!(g.architecture().unwrap(), "llama");

    let msg = |e: GgufError| e.to_string();
    let e = msg(g.get_u32("test.i8").unwrap_err());
    assert!(
        e.contains("test.i8") && e.contains("u32") && e.contains("i8 -100"),
        "{e}"
    );
    let e = msg(g.get_u32("test.u64").unwrap_err());
    assert!(e.contains("u64 1099511627776"), "{e}");
    let e = msg(g.get_str("test.bool").unwrap_err());
    assert!(e.contains("expected string, found bool true"), "{e}");
    let e = msg(g.get_str_array("test.i32s").unwrap_err());
    assert!(e.contains("found array of i32 (2 elements)"), "{e}");
    let e = msg(g.get_f32_array("test.strings").unwrap_err());
    assert!(e.contains("array of f32"), "{e}");
    match g.get_u32("no.such.key") {
        Err(GgufError::MissingKey(k)) => assert_eq!(k, "no.such.key"),
        other => panic!("expected MissingKey, got {other:?}"),
    }
}

#[test]
fn alignment_comes_from_general_alignment() {
    let b = Builder::new()
        .alignment(64)
        .tensor("a", &[3], GgmlType::F32, f32_bytes(&[1.0, 2.0, 3.0]))
        .tensor("b", &[1], GgmlType::F32, f32_bytes(&[4.0]));
    let (bytes, layout) = b.build_with_layout();
    let file = GgufFile::from_bytes(bytes).unwrap();
    assert_eq!(file.alignment, 64);
    assert_eq!(file.data_offset, layout.data_offset);
    assert_eq!(file.data_offset % 64, 0);
    assert_eq!(file.tensor("b").unwrap().offset, 64);
    assert_eq!(file.tensor_f32("b").unwrap(), [4.0]);
}

#[test]
fn a_file_without_tensors_has_its_data_section_at_the_end_of_the_header() {
    let b = Builder::new().kv("k", Value::Array(ValueType::Bool, vec![Value::Bool(false)]));
    let bytes = b.build();
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!(g.data_offset, bytes.len() as u64);
    assert!(g.tensors.is_empty());
}

#[test]
fn asking_for_a_missing_tensor_names_it() {
    let file = GgufFile::from_bytes(sample().build()).unwrap();
    let e = file.tensor_bytes("nope.weight").unwrap_err();
    assert!(e.to_string().contains("nope.weight"), "{e}");
}
