//! Qwen3-30B-A3B as its recipe makes it, cut to one layer at full width (d 2048, 128 experts of
//! 768, 8 used, the 152k vocabulary), and OLMoE-1B-7B cut to two (d 2048, 64 experts of 1024, 8
//! used, the 50k vocabulary), against llama.cpp's runs on the same files
//! (`reference-data/large/`): chapter 14's checks — the file's sha256, then chapter 6's bounds
//! at every step of llama.cpp's greedy continuation, teacher-forced — on the scalar path and on
//! the engine's fast one.

#[path = "../../ch14-scaling/tests/common/large_checks.rs"]
mod large_checks;

use ch18::recipe::SHAPES;
use testkit::refdata;

#[test]
fn the_generated_qwen3_30b_a3b_and_olmoe_agree_with_llama_cpp_on_both_paths() {
    let json = refdata::json("large/models.json").unwrap_or_else(|e| panic!("{e}"));
    let stride = large_checks::sample_stride(&json);
    let models = json["models"].as_object().expect("models");
    let ours: Vec<_> = models
        .iter()
        .filter(|(_, m)| SHAPES.iter().any(|s| m["shape"] == s.id))
        .collect();
    for shape in &SHAPES {
        assert!(
            ours.iter().any(|(_, m)| m["shape"] == shape.id),
            "reference-data/large/models.json has no model of {}",
            shape.id
        );
    }
    large_checks::check_both_paths(
        &SHAPES,
        ours.into_iter(),
        stride,
        &ch18::architectures(),
        large_checks::Scalar::Every,
    );
}
