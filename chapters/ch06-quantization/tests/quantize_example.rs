//! The `quantize` example's library function writes llama.cpp's file.
//!
//! llama.cpp quantized an F32 copy of the default model, which holds exactly the Q4_1 model's
//! weights dequantized; quantizing the Q4_1 model tensor by tensor from its dequantized values
//! must therefore give llama.cpp's bytes. `quant/variants.json` records the sha256 of each of
//! its tensors and of its whole file: the file written here must match both, and parse.

use ch01::{GgmlType, GgufFile};
use ch06::recipe::{LlamaFtype, Plan, quantize_gguf};
use sha2::{Digest, Sha256};

/// Failures listed in a message: one root cause usually breaks many tensors alike.
const SHOW: usize = 10;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn quantizing_to_q8_0_writes_llama_cpps_file() {
    let json = testkit::refdata::json("quant/variants.json").unwrap_or_else(|e| panic!("{e}"));
    let want = &json["variants"]["Q8_0"];
    assert_eq!(
        want["ftype"].as_u64(),
        Some(7),
        "quant/variants.json: Q8_0 is LLAMA_FTYPE_MOSTLY_Q8_0"
    );

    let input = GgufFile::open(shared::default_model_path().unwrap()).unwrap();
    // Removed when the test ends, pass or fail.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("model.Q8_0.gguf");
    let plan = Plan::new(&input.gguf, LlamaFtype::Q8_0).unwrap();
    let report = quantize_gguf(&input, &plan, &out).unwrap();

    // It parses, with the input's metadata and llama.cpp's file type.
    let written =
        GgufFile::open(&out).unwrap_or_else(|e| panic!("the written file does not parse: {e}"));
    assert_eq!(written.get_u32("general.file_type").unwrap(), 7);
    for (key, value) in &input.metadata {
        if key != "general.file_type" {
            assert_eq!(written.get(key), Some(value), "metadata {key}");
        }
    }
    assert_eq!(written.metadata.len(), input.metadata.len());
    assert_eq!(report.file_size, written.bytes().len() as u64);

    // Every tensor has llama.cpp's type, shape and bytes.
    let tensors = want["tensors"].as_array().unwrap();
    assert_eq!(written.tensors.len(), tensors.len());
    let mut differ = vec![];
    for t in tensors {
        let name = t["name"].as_str().unwrap();
        let info = written
            .tensor(name)
            .unwrap_or_else(|| panic!("no tensor {name}"));
        let ne: Vec<u64> = t["ne"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap())
            .collect();
        assert_eq!(
            (info.ggml_type.name(), &info.dims),
            (t["type"].as_str().unwrap(), &ne),
            "{name}"
        );
        let got = hex(&Sha256::digest(written.bytes_of(info).unwrap()));
        if got != t["sha256"].as_str().unwrap() {
            differ.push(format!(
                "{name} ({}): sha256 {got}, llama.cpp's {}",
                info.ggml_type, t["sha256"]
            ));
        }
    }
    assert!(
        differ.is_empty(),
        "{} tensors differ; the first {}:\n{}",
        differ.len(),
        differ.len().min(SHOW),
        differ[..differ.len().min(SHOW)].join("\n")
    );

    // And, metadata order and padding included, the whole file is llama.cpp's.
    assert_eq!(
        written.bytes().len() as u64,
        want["size"].as_u64().unwrap(),
        "file size"
    );
    assert_eq!(
        hex(&Sha256::digest(written.bytes())),
        want["sha256"].as_str().unwrap(),
        "file sha256"
    );

    // 8.5 bits per weight: a Q8_0 block is 32 one-byte codes and an f16 scale.
    assert_eq!(report.bits_per_weight(), 8.5);
    assert!(
        written
            .tensors
            .iter()
            .all(|t| t.ggml_type != GgmlType::Q4_1)
    );
}
