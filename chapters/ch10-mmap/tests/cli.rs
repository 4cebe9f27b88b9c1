//! The engine's binary, run as a user runs it: a usage error without a prompt, the same tokens
//! mapped and read, a conversation that keeps its cache, and a bad file that is an error
//! naming it.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

fn model() -> PathBuf {
    shared::default_model_path().unwrap_or_else(|e| panic!("{e}"))
}

/// Run the engine with `args` (and `stdin`, if given), on one thread, with a 256-position
/// context unless `args` say otherwise.
fn engine(args: &[&str], stdin: Option<&str>) -> Output {
    let ctx: &[&str] = if args.contains(&"--ctx") {
        &[]
    } else {
        &["--ctx", "256"]
    };
    let mut child = Command::new(engine_program())
        .arg("--model")
        .arg(model())
        .args(if args.contains(&"--threads") {
            &[][..]
        } else {
            &["--threads", "1"][..]
        })
        .args(ctx)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    drop(input);
    child.wait_with_output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn no_prompt_is_a_usage_error() {
    let out = engine(&[], None);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains("give a PROMPT") && err.contains("Usage:"),
        "{err}"
    );
}

#[test]
fn flags_out_of_range_are_usage_errors_naming_flag_and_value() {
    for (args, want) in [
        (&["--temp", "nan"][..], "--temp is NaN"),
        (&["--top-p", "1.5"][..], "--top-p is 1.5"),
        (&["--min-p=-1"][..], "--min-p is -1"),
        (&["--repeat-penalty", "0"][..], "--repeat-penalty is 0"),
        (&["--threads", "0"][..], "--threads 0"),
    ] {
        let all: Vec<&str> = args.iter().copied().chain(["Hello"]).collect();
        let out = engine(&all, None);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

#[test]
fn mapped_and_read_runs_print_the_same_generation() {
    let args = [
        "--json",
        "--temp",
        "0",
        "-n",
        "8",
        "The capital of France is",
    ];
    // The default (mapped, repacked where the CPU has chapter 8's micro-kernel), read, and
    // mapped with every weight a view of the map.
    let runs: Vec<serde_json::Value> = [&[][..], &["--no-mmap"][..], &["--no-repack"][..]]
        .iter()
        .map(|extra| {
            let all: Vec<&str> = args.iter().chain(extra.iter()).copied().collect();
            let out = engine(&all, None);
            assert!(out.status.success(), "{}", text(&out.stderr));
            serde_json::from_slice(&out.stdout).unwrap()
        })
        .collect();
    assert_eq!(runs[0]["loader"], "mmap");
    assert_eq!(runs[1]["loader"], "read");
    assert_eq!(runs[2]["loader"], "mmap");
    assert_eq!(runs[2]["repacked"], false, "{}", runs[2]);
    assert_eq!(runs[0]["prompt_ids"], runs[1]["prompt_ids"]);
    assert_eq!(runs[0]["prompt_ids"], runs[2]["prompt_ids"]);
    // Mapped or read, the same matrices compute the same tokens.
    assert_eq!(runs[0]["ids"], runs[1]["ids"]);
    assert_eq!(runs[0]["ids"].as_array().unwrap().len(), 8);
    // Repacked or not, too: for the default model's types (Q4_1, Q8_0) chapter 8's
    // micro-kernel computes each block's sum and adds it in chapter 6's order, the same bits as
    // the row-at-a-time `vec_dot` the views use (chapter 8, "The same bits as chapter 6").
    assert_eq!(runs[0]["ids"], runs[2]["ids"], "repacked vs --no-repack");
    // Weights that stay views of the map are file-backed memory; read ones are private.
    let kib = |r: &serde_json::Value, k: &str| r["memory"][k].as_u64().unwrap();
    let weights = 90_000; // KiB: most of the 98 MB file
    assert!(kib(&runs[2], "rss_file_kib") > weights, "{}", runs[2]);
    assert!(kib(&runs[1], "rss_anon_kib") > weights, "{}", runs[1]);
    assert!(kib(&runs[1], "rss_file_kib") < weights, "{}", runs[1]);
}

#[test]
fn a_chat_keeps_its_cache_and_stops_at_exit() {
    let input = "Name three colors.\n\nAnd two animals?\n/exit\nNever read.\n";
    let out = engine(
        &[
            "--chat",
            "--temp",
            "0",
            "-n",
            "6",
            "--system",
            "Be concise.",
        ],
        Some(input),
    );
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    let turns: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("kept from the cache"))
        .collect();
    assert_eq!(turns.len(), 2, "{err}");
    assert!(turns[0].contains(", 0 kept"), "{}", turns[0]);
    assert!(!turns[1].contains(", 0 kept"), "{}", turns[1]);
    assert!(
        err.contains("prompt eval time") && err.contains("total time"),
        "{err}"
    );
}

#[test]
fn a_chat_that_outgrows_its_context_says_so() {
    let input = "Name three colors.\nAnd two animals?\nAnd one more?\n";
    let out = engine(
        &[
            "--chat",
            "--temp",
            "0",
            "-n",
            "16",
            "--system",
            "Be concise.",
            "--ctx",
            "48",
        ],
        Some(input),
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("--ctx 48") && err.contains("outgrew the context"),
        "{err}"
    );
}

#[test]
fn a_bad_file_is_an_error_naming_it() {
    let dir = std::env::temp_dir().join(format!("ch10-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("cut.gguf");
    let bytes = std::fs::read(model()).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let out = Command::new(engine_program())
        .arg("--model")
        .arg(&path)
        .arg("Hello")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with(&format!("error: {}: at byte", path.display())),
        "{err}"
    );
}

/// `--gpu` runs chapter 9's GPU model when the engine is built with the `gpu` feature (on
/// lavapipe where there is no GPU), and otherwise says how to build it.
#[test]
fn the_gpu_flag_runs_chapter_9_or_says_how_to_build_it() {
    let args = [
        "--gpu",
        "--json",
        "--temp",
        "0",
        "-n",
        "3",
        "The capital of France is",
    ];
    let out = engine(&args, None);
    let err = text(&out.stderr);
    if cfg!(feature = "gpu") {
        assert!(out.status.success(), "{err}");
        let run: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        // llama.cpp's first three greedy tokens: " Paris", ".", "\n".
        assert_eq!(run["ids"], serde_json::json!([7042, 30, 198]), "{run}");
        assert!(run["gpu"].is_string(), "{run}");
    } else {
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains("--features gpu"), "{err}");
    }
}

/// Chapter 10's engine (the `engine` example), built with the features this test was built with.
fn engine_program() -> std::path::PathBuf {
    let features: &[&str] = if cfg!(feature = "gpu") { &["gpu"] } else { &[] };
    testkit::program("ch10", testkit::Target::Example, "engine", features)
}
