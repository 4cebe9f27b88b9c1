//! The finished engine on a Qwen3-MoE file (the synthetic variant of `tests/experts.rs`, written
//! out): `inspect` reports its experts and what a token reads; `run` continues its prompt
//! greedily with llama.cpp's tokens, and with the same tokens when it speculates (chapter 16);
//! a grammar (chapter 15) holds its output to the rule.

use ch18::report::ExpertReport;
use std::process::{Command, Output};

fn llm_rs(args: &[&str]) -> Output {
    Command::new(testkit::program(
        "llm-rs",
        testkit::Target::Bin,
        "llm-rs",
        &[],
    ))
    .args(args)
    .output()
    .expect("start llm-rs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn inspect_reports_the_experts_and_run_takes_the_file() {
    let recipe =
        testkit::refdata::json("variants/qwen3moe/model.json").unwrap_or_else(|e| panic!("{e}"));
    let vocab = testkit::refdata::read(recipe["vocab"].as_str().unwrap()).unwrap();
    let vocab = ch01::Gguf::parse(&vocab).unwrap();
    let bytes = ch13::synthetic::build(&recipe, &vocab).unwrap_or_else(|e| panic!("{e}"));
    // What a token reads: 2 layers of 3 expert tensors (8 experts of 64 × 128 f32), a quarter
    // of them (2 of 8 used), and everything else, the tied embeddings included: they are also
    // the output matrix, read whole for every token's logits.
    let report = ExpertReport::of(&ch01::Gguf::parse(&bytes).unwrap(), "qwen3moe").unwrap();
    let experts = 2 * 3 * 8 * 64 * 128 * 4;
    assert_eq!((report.n_expert, report.n_used), (8, 2));
    assert_eq!(report.expert_bytes, experts);
    assert_eq!(report.dense_bytes, 78_589_440);
    assert_eq!(report.active_bytes(), 78_589_440 + experts / 4);

    let path =
        std::env::temp_dir().join(format!("llm-rs-cli-qwen3moe-{}.gguf", std::process::id()));
    std::fs::write(&path, bytes).unwrap();
    let file = path.to_str().unwrap();
    let inspect = llm_rs(&["inspect", file]);
    let prompt = recipe["prompt"]["text"].as_str().unwrap();
    let n = recipe["generated"].as_array().unwrap().len().to_string();
    let run = llm_rs(&[
        "run", "--model", file, "--temp", "0", "-n", &n, "--json", prompt,
    ]);
    let spec = llm_rs(&[
        "run", "--model", file, "--temp", "0", "-n", &n, "--spec", "ngram", "--json", prompt,
    ]);
    let digits = llm_rs(&[
        "run",
        "--model",
        file,
        "--temp",
        "0",
        "-n",
        "6",
        "--grammar",
        "root ::= [0-9]+",
        "--json",
        prompt,
    ]);
    std::fs::remove_file(&path).unwrap();
    assert!(inspect.status.success(), "{}", text(&inspect.stderr));
    let s = text(&inspect.stdout);
    for want in [
        "blk.0.ffn_gate_exps.weight",
        "experts: 8 per layer, 2 used per token",
        "a decoded token reads 75.3 MiB of weights",
        "llm-rs runs architecture \"qwen3moe\" (it runs llama, gemma3, qwen2, qwen3, qwen3moe, olmoe)",
    ] {
        assert!(s.contains(want), "{want:?} missing from:\n{s}");
    }
    assert!(run.status.success(), "{}", text(&run.stderr));
    let json: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    assert_eq!(json["ids"], recipe["generated"], "{json}");
    assert!(spec.status.success(), "{}", text(&spec.stderr));
    let json: serde_json::Value = serde_json::from_slice(&spec.stdout).unwrap();
    assert_eq!(json["ids"], recipe["generated"], "speculating: {json}");
    assert!(digits.status.success(), "{}", text(&digits.stderr));
    let json: serde_json::Value = serde_json::from_slice(&digits.stdout).unwrap();
    let out = json["text"].as_str().unwrap();
    assert!(
        !out.is_empty() && out.chars().all(|c| c.is_ascii_digit()),
        "the grammar's output: {json}"
    );
}
