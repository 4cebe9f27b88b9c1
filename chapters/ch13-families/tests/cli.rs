//! `llm-rs`, the finished engine's command line: its subcommands on the default model, its
//! usage errors, and the architecture set that decides what it runs.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

fn default_model() -> PathBuf {
    shared::default_model_path().unwrap_or_else(|e| panic!("{e}"))
}

/// `llm-rs ARGS`, with `stdin` written to it (or none).
fn llm_rs(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(testkit::program(
        "llm-rs",
        testkit::Target::Bin,
        "llm-rs",
        &[],
    ))
    .args(args)
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("start llm-rs");
    let mut input = child.stdin.take().unwrap();
    if let Some(s) = stdin {
        input.write_all(s.as_bytes()).unwrap();
    }
    drop(input);
    child.wait_with_output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn no_subcommand_is_a_usage_error_that_lists_them() {
    let out = llm_rs(&[], None);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    for sub in ["run", "chat", "serve"] {
        assert!(err.contains(sub), "{sub} missing from: {err}");
    }
    let out = llm_rs(&["quantise"], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("quantise"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn each_subcommand_has_its_chapters_flags() {
    let out = llm_rs(&["run", "--help"], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let help = text(&out.stdout);
    assert!(
        help.contains("--threads") && help.contains("physical cores"),
        "{help}"
    );
    assert!(help.contains("--no-mmap"), "chapter 10's flags: {help}");
    let out = llm_rs(&["serve", "--help"], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let help = text(&out.stdout);
    assert!(
        help.contains("--parallel") && help.contains("--drain-timeout"),
        "{help}"
    );
    // A flag of another subcommand is refused, naming it.
    let out = llm_rs(&["run", "--parallel", "4", "Hi"], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--parallel"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn run_and_chat_generate_with_the_default_model() {
    let model = default_model();
    let model = model.to_str().unwrap();
    let out = llm_rs(
        &[
            "run",
            "--model",
            model,
            "--temp",
            "0",
            "-n",
            "8",
            "--json",
            "The capital of France is",
        ],
        None,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["ids"].as_array().map(Vec::len), Some(8), "{json}");
    let out = llm_rs(
        &["chat", "--model", model, "--temp", "0", "-n", "4"],
        Some("Hello\n/exit\n"),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!text(&out.stdout).trim().is_empty(), "no answer");
}

#[test]
fn an_architecture_outside_the_set_is_refused_by_name() {
    // Chapter 12's set (chapter 4's: llama) does not run Gemma 3; this chapter's does.
    let file = ch01::GgufFile::open(shared::ensure_cached(&shared::GEMMA3_MODEL).unwrap()).unwrap();
    let err = ch04::Model::load(&file, &ch06::QuantLoader, &ch04::architectures())
        .err()
        .expect("chapter 12's set has no gemma3");
    assert_eq!(
        err.to_string(),
        "architecture \"gemma3\" is not supported (supported: llama)"
    );
    assert_eq!(
        ch13::architectures().names(),
        ["llama", "gemma3", "qwen2", "qwen3"]
    );
}

#[test]
fn inspect_says_what_a_file_holds_and_whether_it_runs() {
    let model = default_model();
    let out = llm_rs(&["inspect", model.to_str().unwrap()], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    for want in [
        "llama.block_count",
        "token_embd.weight",
        "config:",
        "llm-rs runs architecture \"llama\" (it runs llama, gemma3, qwen2, qwen3",
    ] {
        assert!(s.contains(want), "{want:?} missing from:\n{s}");
    }
    let out = llm_rs(&["inspect", "no-such-file.gguf"], None);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("no-such-file.gguf"),
        "{}",
        text(&out.stderr)
    );
}

/// A Qwen3 file (the synthetic variant of `tests/variants.rs`, written out): `inspect` says the
/// engine runs it, and `run` continues its prompt greedily with llama.cpp's tokens.
#[test]
fn inspect_and_run_take_a_qwen3_file() {
    use testkit::refdata;
    let recipe = refdata::json("variants/qwen3/model.json").unwrap_or_else(|e| panic!("{e}"));
    let vocab = refdata::read(recipe["vocab"].as_str().unwrap()).unwrap();
    let vocab = ch01::Gguf::parse(&vocab).unwrap();
    let bytes = ch13::synthetic::build(&recipe, &vocab).unwrap_or_else(|e| panic!("{e}"));
    let path = std::env::temp_dir().join(format!("llm-rs-cli-qwen3-{}.gguf", std::process::id()));
    std::fs::write(&path, bytes).unwrap();
    let file = path.to_str().unwrap();
    let inspect = llm_rs(&["inspect", file], None);
    let prompt = recipe["prompt"]["text"].as_str().unwrap();
    let n = recipe["generated"].as_array().unwrap().len().to_string();
    let run = llm_rs(
        &[
            "run", "--model", file, "--temp", "0", "-n", &n, "--json", prompt,
        ],
        None,
    );
    std::fs::remove_file(&path).unwrap();
    assert!(inspect.status.success(), "{}", text(&inspect.stderr));
    let s = text(&inspect.stdout);
    for want in [
        "qwen3.block_count",
        "blk.0.attn_q_norm.weight",
        "llm-rs runs architecture \"qwen3\"",
    ] {
        assert!(s.contains(want), "{want:?} missing from:\n{s}");
    }
    assert!(run.status.success(), "{}", text(&run.stderr));
    let json: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    assert_eq!(json["ids"], recipe["generated"], "{json}");
}
