//! Files that parse but lie, and what the finished engine does with them: a clear error (exit
//! code 1 from the binary, a typed error from the library) or a normal run — never a panic, an
//! abort, a hang or garbage — within a bounded time and a bounded amount of memory.
//!
//! Every hostile file is the default model cut to its first [`LAYERS`] layers (a valid, smaller
//! model that runs) with one thing changed: a metadata value, a weight, the header.

use ch01::config::{Config, ConfigError};
use ch01::gguf::ValueType;
use ch01::{GgmlType, GgufFile, TensorInfo, Value};
use ch06::gguf_write::GgufWriter;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Layers kept from the default model: enough to be a real transformer, few enough that every
/// variant is small to write and fast to run.
const LAYERS: usize = 2;

/// Longest a hostile run may take. A normal run of the cut model takes well under a second;
/// the bound is generous for a loaded CI machine, and far below "hangs".
const MAX_SECONDS: u64 = 30;

/// Most memory (peak resident set) a hostile run may use. The cut model maps about 36 MB, and
/// its 4096-position KV cache of 2 layers takes 6 MiB in f16, the engine's default (12 MiB in
/// f32); a run that sized anything by a hostile number would take gigabytes or abort.
const MAX_RSS_BYTES: u64 = 512 << 20;

fn model() -> PathBuf {
    shared::default_model_path().unwrap_or_else(|e| panic!("{e}"))
}

/// The default model cut to [`LAYERS`] layers, with `edit` applied to its metadata and tensor
/// list and `patch` to each tensor's bytes, written to `dir/name.gguf`.
fn variant(
    dir: &Path,
    name: &str,
    edit: impl FnOnce(&mut GgufWriter),
    patch: impl Fn(&TensorInfo, &mut Vec<u8>),
) -> PathBuf {
    let src = GgufFile::open(model()).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in &src.gguf.metadata {
        w.set(k, v.clone()).unwrap();
    }
    w.set("llama.block_count", Value::U32(LAYERS as u32))
        .unwrap();
    let kept = |n: &str| {
        n.strip_prefix("blk.")
            .and_then(|r| r.split('.').next())
            .and_then(|l| l.parse::<usize>().ok())
            .is_none_or(|l| l < LAYERS)
    };
    for t in src.gguf.tensors.iter().filter(|t| kept(&t.name)) {
        w.add_tensor(&t.name, &t.dims, t.ggml_type).unwrap();
    }
    edit(&mut w);
    let path = dir.join(format!("{name}.gguf"));
    w.write_file(&path, |t| {
        let mut bytes = src.tensor_bytes(&t.name)?.to_vec();
        patch(t, &mut bytes);
        Ok::<_, ch01::GgufError>(bytes)
    })
    .unwrap();
    path
}

fn set(key: &'static str, value: Value) -> impl FnOnce(&mut GgufWriter) {
    move |w| w.set(key, value).unwrap()
}

/// An f16 NaN: exponent all ones, a mantissa bit set.
const F16_NAN: u16 = 0x7e00;

fn no_patch(_: &TensorInfo, _: &mut Vec<u8>) {}

/// What a run of the binary did.
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    elapsed: Duration,
    max_rss: u64,
}

/// Run the engine's binary on `path` with `args`, greedy, 4 tokens, one thread; `stdin` fed
/// and closed. Asserts the bounds on time and memory.
// The child is reaped by wait4 (for its resource usage), which clippy does not see.
#[allow(clippy::zombie_processes)]
fn engine(path: &Path, args: &[&str], stdin: &str) -> Run {
    use std::io::{Read, Write};
    let t0 = Instant::now();
    let mut child = Command::new(engine_program())
        .arg("--model")
        .arg(path)
        .args(["--threads", "1", "--temp", "0"])
        .args(if args.contains(&"-n") {
            &[][..]
        } else {
            &["-n", "4"][..]
        })
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let _ = input.write_all(stdin.as_bytes());
    drop(input);
    // A watchdog: a hang would otherwise hang the test.
    let pid = child.id() as libc::pid_t;
    let watchdog = std::thread::spawn(move || {
        let deadline = t0 + Duration::from_secs(MAX_SECONDS);
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
            // SAFETY: signal 0 only checks that the process exists.
            if unsafe { libc::kill(pid, 0) } != 0 {
                return false;
            }
        }
        // SAFETY: `pid` is our child, not yet reaped (the main thread waits on it).
        unsafe { libc::kill(pid, libc::SIGKILL) };
        true
    });
    let (mut out, mut err) = (String::new(), String::new());
    let mut so = child.stdout.take().unwrap();
    let mut se = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = se.read_to_string(&mut s);
        s
    });
    let _ = so.read_to_string(&mut out);
    err.push_str(&reader.join().unwrap());
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it for our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our child and has not been reaped (Child::wait was never called).
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(r, pid, "wait4 failed");
    let killed = watchdog.join().unwrap();
    let run = Run {
        code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
        stdout: out,
        stderr: err,
        elapsed: t0.elapsed(),
        max_rss: usage.ru_maxrss as u64 * 1024,
    };
    assert!(!killed, "{args:?} ran past {MAX_SECONDS} s: {}", run.stderr);
    assert!(
        run.max_rss <= MAX_RSS_BYTES,
        "{args:?} used {} bytes of memory: {}",
        run.max_rss,
        run.stderr
    );
    run
}

/// The run failed with exit code 1 and a message containing every one of `want`.
#[track_caller]
fn fails_with(run: &Run, want: &[&str]) {
    assert_eq!(
        run.code,
        Some(1),
        "exit status {:?} after {:?}: {}",
        run.code,
        run.elapsed,
        run.stderr
    );
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    for w in want {
        assert!(run.stderr.contains(w), "{w:?} not in: {}", run.stderr);
    }
}

/// `Config::from_gguf` on `path` is `ConfigError::Invalid` for `key`.
#[track_caller]
fn config_rejects(path: &Path, key: &str) {
    let file = GgufFile::open(path).unwrap();
    match Config::from_gguf(&file.gguf, &["llama"]) {
        Err(ConfigError::Invalid { key: k, reason }) => assert_eq!(k, key, "{reason}"),
        other => panic!("{key}: expected ConfigError::Invalid, got {other:?}"),
    }
}

#[test]
fn the_cut_model_runs() {
    let dir = tempfile::tempdir().unwrap();
    let path = variant(dir.path(), "cut", |_| {}, no_patch);
    let run = engine(&path, &["--json", "Hello"], "");
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let json: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(json["ids"].as_array().unwrap().len(), 4, "{json}");
}

#[test]
fn a_huge_context_length_is_not_what_a_run_allocates() {
    let dir = tempfile::tempdir().unwrap();
    let huge = 1u64 << 40;
    let path = variant(
        dir.path(),
        "ctx",
        set("llama.context_length", Value::U64(huge)),
        no_patch,
    );
    // The default context is 4096 positions, whatever the file claims.
    let run = engine(&path, &["--json", "Hello"], "");
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    // Asking for the file's whole context is refused before anything is allocated, with the
    // bytes it would take.
    let ctx = huge.to_string();
    let run = engine(&path, &["--ctx", &ctx, "Hello"], "");
    fails_with(&run, &[&format!("--ctx {ctx}"), "needs", "bytes of memory"]);
}

#[test]
fn float_hyperparameters_out_of_their_domain_are_errors_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    for (key, value, shown) in [
        ("llama.attention.layer_norm_rms_epsilon", f32::NAN, "NaN"),
        ("llama.attention.layer_norm_rms_epsilon", -1e-5, "-0.00001"),
        ("llama.attention.layer_norm_rms_epsilon", 0.0, "0 is not"),
        ("llama.rope.freq_base", f32::INFINITY, "inf"),
        ("llama.rope.freq_base", -10000.0, "-10000"),
        ("llama.rope.freq_base", 0.5, "0.5"),
        ("llama.rope.scaling.factor", f32::NAN, "NaN"),
        ("llama.rope.scaling.factor", -2.0, "-2"),
    ] {
        let path = variant(dir.path(), "float", set(key, Value::F32(value)), no_patch);
        config_rejects(&path, key);
        let run = engine(&path, &["Hello"], "");
        fails_with(&run, &[key, shown]);
    }
}

#[test]
fn counts_that_disagree_with_the_tensors_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, Value, &[&str]); 6] = [
        // More layers than the file has: the first missing tensor is named.
        (
            "llama.block_count",
            Value::U32(1_000_000_000),
            &["blk.2.attn_norm.weight"],
        ),
        // Widths that would make huge products: the first tensor's shape says otherwise.
        (
            "llama.embedding_length",
            Value::U64(1 << 40),
            &["llama.rope.dimension_count", "head size 122167958641"],
        ),
        (
            "llama.attention.head_count",
            Value::U32(u32::MAX),
            // Its default head width, d_model / head_count, is then 0.
            &["llama.attention.key_length", "at least 1"],
        ),
        (
            "llama.feed_forward_length",
            Value::U64(1 << 40),
            &["blk.0.ffn_", "has dimensions [576, 1536]"],
        ),
        (
            "llama.vocab_size",
            Value::U32(7),
            &["llama.vocab_size", "49152 tokens"],
        ),
        ("llama.context_length", Value::U32(0), &["context_length"]),
    ];
    for (key, value, want) in cases {
        let path = variant(dir.path(), "count", set(key, value), no_patch);
        let run = engine(&path, &["Hello"], "");
        fails_with(&run, want);
    }
}

#[test]
fn a_nan_norm_weight_is_an_error_naming_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let path = variant(
        dir.path(),
        "nan",
        |_| {},
        |t, bytes| {
            if t.name == "blk.1.ffn_norm.weight" {
                assert_eq!(t.ggml_type, GgmlType::F32);
                bytes[4 * 7..4 * 8].copy_from_slice(&f32::NAN.to_le_bytes());
            }
        },
    );
    let run = engine(&path, &["Hello"], "");
    fails_with(&run, &["\"blk.1.ffn_norm.weight\" holds NaN at index 7"]);
}

#[test]
fn a_nan_in_a_matrix_is_an_error_naming_the_first_tensor_it_reaches() {
    let dir = tempfile::tempdir().unwrap();
    // The f16 scale of the first block of layer 1's FFN down-projection: a NaN that no check at
    // load sees (it would mean reading every block). Its output joins the residual stream, and
    // from there the NaN reaches everything.
    let path = variant(
        dir.path(),
        "nan",
        |_| {},
        |t, bytes| {
            if t.name == "blk.1.ffn_down.weight" {
                // Blocks that start with their f16 scale `d`.
                assert!(
                    [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0].contains(&t.ggml_type),
                    "{}",
                    t.ggml_type
                );
                bytes[0..2].copy_from_slice(&F16_NAN.to_le_bytes());
            }
        },
    );
    for extra in [&[][..], &["--json"][..], &["--no-repack"][..]] {
        let args: Vec<&str> = extra.iter().copied().chain(["Hello"]).collect();
        let run = engine(&path, &args, "");
        fails_with(&run, &["not finite", "\"ffn_out-1\""]);
        assert!(run.stdout.is_empty(), "{}", run.stdout);
    }
}

#[test]
fn an_inflated_tensor_count_is_an_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = variant(dir.path(), "count", |_| {}, no_patch);
    let mut bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[8..16].try_into().unwrap());
    bytes[8..16].copy_from_slice(&(n + 1_000_000).to_le_bytes());
    std::fs::write(&path, bytes).unwrap();
    let run = engine(&path, &["Hello"], "");
    fails_with(&run, &[&path.display().to_string(), "at byte"]);
}

#[test]
fn the_context_filling_up_ends_generation_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let path = variant(dir.path(), "cut", |_| {}, no_patch);
    // "Hello" is one token: a context of 8 holds it and 7 more, and the 8th is sampled from
    // the last position's logits.
    let run = engine(&path, &["--json", "--ctx", "8", "-n", "100", "Hello"], "");
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let json: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(json["stop"], "context", "{json}");
    assert_eq!(json["ids"].as_array().unwrap().len(), 8, "{json}");
    let run = engine(&path, &["--ctx", "8", "-n", "100", "Hello"], "");
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(run.stderr.contains("the context is full"), "{}", run.stderr);
}

#[test]
fn a_template_that_never_ends_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let looping =
        "{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}";
    let path = variant(
        dir.path(),
        "template",
        set("tokenizer.chat_template", Value::String(looping.into())),
        no_patch,
    );
    let run = engine(&path, &["--chat"], "Hi\n");
    fails_with(&run, &["template"]);
}

#[test]
fn a_huge_token_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = variant(
        dir.path(),
        "token",
        |w| {
            let Some(Value::Array(ValueType::String, tokens)) =
                w.get("tokenizer.ggml.tokens").cloned()
            else {
                panic!("the default model has a token list")
            };
            let mut tokens = tokens;
            tokens[1000] = Value::String("a".repeat(1 << 20));
            w.set(
                "tokenizer.ggml.tokens",
                Value::Array(ValueType::String, tokens),
            )
            .unwrap();
        },
        no_patch,
    );
    let run = engine(&path, &["Hello"], "");
    fails_with(&run, &["1000"]);
}

/// Chapter 10's engine (the `engine` example), built with the features this test was built with.
fn engine_program() -> std::path::PathBuf {
    let features: &[&str] = if cfg!(feature = "gpu") { &["gpu"] } else { &[] };
    testkit::program("ch10", testkit::Target::Example, "engine", features)
}
