//! Memory: the weights are resident once, the budget printed before loading bounds what a run
//! holds, and a run that cannot fit is refused before anything is allocated.
//!
//! Each check runs the finished engine (`llm-rs run`) as a process of its own on the cut
//! Llama-3-8B-shaped Q4_0 model, and reads the resident set it reports with `--json` (from
//! `/proc/self/status`): a test process's own memory would mix in every other test's.

use ch14::budget::Budget;
use ch14::large::{self, Recipe};
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

fn model() -> PathBuf {
    let recipe = Recipe::named("llama3-8b", "Q4_0")
        .and_then(|r| r.with_layers(2))
        .unwrap_or_else(|e| panic!("{e}"));
    large::ensure_made(&recipe, &mut |_, _| {}).unwrap_or_else(|e| panic!("{e}"))
}

fn llm_rs(args: &[&str]) -> std::process::Output {
    Command::new(testkit::program(
        "llm-rs",
        testkit::Target::Bin,
        "llm-rs",
        &[],
    ))
    .args(args)
    .output()
    .expect("running llm-rs")
}

/// `llm-rs run --json` on `model` with `extra` flags: the report.
fn run_json(model: &str, extra: &[&str]) -> Value {
    let mut args = vec!["run", "--model", model, "--json", "-n", "2", "--temp", "0"];
    args.extend(extra);
    args.push("The capital of France is");
    let out = llm_rs(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "llm-rs {args:?}: {stderr}");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {stderr}"))
}

fn kib(report: &Value, key: &str) -> u64 {
    report["memory"][key]
        .as_u64()
        .unwrap_or_else(|| panic!("no memory.{key}"))
        * 1024
}

/// A budget line's bytes, from `--mem-budget`'s table: `  what    1.23 GB`.
fn budget_line(table: &str, what: &str) -> u64 {
    let line = table
        .lines()
        .find(|l| l.trim_start().starts_with(what))
        .unwrap_or_else(|| panic!("no line {what:?} in\n{table}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    let gb: f64 = words
        .windows(2)
        .find(|w| w[1] == "GB")
        .and_then(|w| w[0].parse().ok())
        .unwrap_or_else(|| panic!("no size in {line:?}"));
    (gb * 1e9) as u64
}

/// The budget's estimates are in GB with two decimals: 5 MB either way.
const ROUNDING: u64 = 5_000_000;

#[test]
fn repacked_weights_are_resident_once_and_within_the_budget() {
    let path = model();
    let m = path.to_str().unwrap();
    let file_size = std::fs::metadata(&path).unwrap().len();
    let report = run_json(m, &[]);
    let budget = llm_rs(&["run", "--model", m, "--mem-budget"]);
    let table = String::from_utf8_lossy(&budget.stdout).to_string();
    assert!(budget.status.success(), "{table}");
    let peak = kib(&report, "peak_rss_kib");
    let file_pages = kib(&report, "rss_file_kib");
    if report["repacked"] == Value::Bool(true) {
        // The repacked matrices' file pages were released: what stays mapped is the token
        // embeddings' touched rows, the program and its libraries — not the weights.
        assert!(
            file_pages < file_size / 10,
            "{file_pages} bytes of file pages resident after repacking a {file_size}-byte model"
        );
        let repacked = budget_line(&table, "weights repacked");
        assert!(
            kib(&report, "rss_anon_kib") + ROUNDING >= repacked,
            "the repacked weights ({repacked} bytes) are not all resident: {report}"
        );
    }
    // Whatever the CPU: the run never holds more than the budget said it would (the KV cache
    // is counted full; a two-token run touches little of it; loading may peak higher).
    let mut bound = budget_line(&table, "resident at");
    if table.contains("peak, while loading") {
        bound = bound.max(budget_line(&table, "peak, while loading"));
    }
    assert!(
        peak <= bound + ROUNDING,
        "peak resident {peak} bytes, budget {bound}:\n{table}"
    );
    assert!(
        peak < file_size + file_size / 4 + (256 << 20),
        "peak resident {peak} bytes for a {file_size}-byte file: the weights are held twice"
    );
}

#[test]
fn a_context_that_cannot_fit_is_refused_before_loading() {
    let path = model();
    let out = llm_rs(&[
        "run",
        "--model",
        path.to_str().unwrap(),
        "--ctx",
        "100000000",
        "hi",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a 100M-position context ran: {stderr}"
    );
    assert!(
        stderr.contains("KV cache") && stderr.contains("--ctx") && stderr.contains("available"),
        "{stderr}"
    );
    // Refused from the header: no load, no timing lines.
    assert!(!stderr.contains("load time"), "{stderr}");
    // A context whose cache overflows 64 bits is refused the same way, not wrapped around.
    let out = llm_rs(&[
        "run",
        "--model",
        path.to_str().unwrap(),
        "--ctx",
        &u64::MAX.to_string(),
        "hi",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("--ctx"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn the_budget_of_the_full_shapes_matches_their_arithmetic() {
    // Planned from the header alone: the full Llama-3-8B shape's layout, no file written.
    let recipe = Recipe::named("llama3-8b", "Q4_0").unwrap();
    let vocab = large::vocab_file(&recipe.shape).unwrap();
    let (w, _) = large::layout(&recipe, &vocab).unwrap();
    let gguf = ch01::Gguf::new(3, w.metadata().to_vec(), w.tensors().to_vec(), 32, 0);
    let config = ch01::Config::from_gguf(&gguf, &["llama"]).unwrap();
    let holding = ch14::budget::Holding {
        mapped: true,
        repack: true,
    };
    let b = Budget::plan(&gguf, &config, 8192, ch05::CacheTypes::F32, holding);
    // 32 layers × 8192 positions × (8 heads × 128) × K and V × 4 bytes.
    assert_eq!(b.kv_cache, 32 * 8192 * 1024 * 2 * 4);
    // In f16, 2 bytes a value; in q8_0, 34 bytes for each block of 32 values.
    let kv = |t| Budget::plan(&gguf, &config, 8192, t, holding).kv_cache;
    assert_eq!(kv(ch05::CacheTypes::F16), 32 * 8192 * 1024 * 2 * 2);
    let q8 = ch05::CacheTypes {
        k: ch06::cache::ROW_Q8_0,
        v: ch06::cache::ROW_Q8_0,
    };
    assert_eq!(kv(q8), 32 * 8192 * (1024 / 32 * 34) * 2);
    // Every matrix but the embeddings is repacked: 4.36 GB of the file's 4.66, a little more
    // once laid out for the micro-kernel.
    let matrices = w.file_size() - w.header().len() as u64 - b.mapped_rows;
    assert!(
        b.repacked >= matrices && b.repacked < matrices + matrices / 20,
        "{b:?}"
    );
    assert_eq!(b.mapped_read, 0);
}
