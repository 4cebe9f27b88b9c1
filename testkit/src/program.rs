//! A program of the workspace — a chapter's example, or the `llm-rs` binary — for a test that
//! runs it as a process: its exit status, its output, its signals.
//!
//! Cargo gives an integration test the paths of its own package's binaries
//! (`CARGO_BIN_EXE_<name>`), but not of examples or of another package's binaries, and builds
//! examples only when no single test is named. So [`program`] asks cargo to build the program
//! with the profile the test was built with (`test`, or `bench` under `--release`, which is
//! what `cargo test` builds examples with), selecting the packages the test's own build
//! selected: after a plain `cargo test` (or `cargo test --workspace`) that is a no-op, after
//! `cargo test --test NAME` it is the build the test needs, and after an edit it is the
//! rebuild — a test never runs a stale program.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

/// Which target of a package.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    Example,
    Bin,
}

/// Set (to anything) when a test's own build selected the `workspace-hack` package beside its
/// package (`cargo test -p workspace-hack -p chNN`): [`program`] then builds with that
/// selection too, so the program's dependencies are the ones that build compiled.
pub const WITH_WORKSPACE_HACK: &str = "LLM_RS_WITH_WORKSPACE_HACK";

/// The path of `package`'s example or binary `name`, built with the features `features` (each
/// program built once per test process).
pub fn program(package: &str, target: Target, name: &str, features: &[&str]) -> PathBuf {
    static BUILT: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    let key = format!("{package}/{target:?}/{name}/{}", features.join(","));
    // One build at a time: tests run on threads, and cargo would wait on its lock anyway.
    let mut built = BUILT.get_or_init(Default::default).lock().unwrap();
    if let Some(p) = built.get(&key) {
        return p.clone();
    }
    let path = build(package, target, name, features);
    built.insert(key, path.clone());
    path
}

fn build(package: &str, target: Target, name: &str, features: &[&str]) -> PathBuf {
    // This test runs from TARGET/PROFILE/deps/.
    let exe = std::env::current_exe().expect("the test's own path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("a test runs from TARGET/PROFILE/deps");
    let target_dir = profile_dir.parent().expect("TARGET/PROFILE");
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("release") => "bench",
        _ => "test",
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testkit is in the workspace root");
    let (flag, dir) = match target {
        Target::Example => ("--example", profile_dir.join("examples")),
        Target::Bin => ("--bin", profile_dir.to_path_buf()),
    };
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| env!("CARGO").into()));
    cmd.arg("build")
        .arg("--quiet")
        .arg("--manifest-path")
        .arg(root.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(target_dir)
        .args(["--profile", profile, flag, name]);
    // Cargo resolves the features of every dependency, proc-macros included, for the packages
    // a command selects and the dev-dependencies of their targets: `-p ch11` alone and the
    // whole workspace give different builds of tokio, serde and the rest, each compiled once.
    // Under `cargo test --workspace` this crate is one of the selected packages, and a build
    // that selects the same (the workspace, every package's tests) is the one already made.
    // (An example's name is then looked up across the workspace: no two packages may share
    // one, as they would share its file in `examples/` anyway.)
    // The variable is read first, when the test runs: `CARGO_PRIMARY_PACKAGE` is fixed when
    // this crate is compiled, and cargo reuses that build under a command that selects fewer
    // packages (CI's `-p workspace-hack -p ch10 --features ch10/gpu`, the workbenches'). Built
    // with `--workspace --tests` there, the program would compile every test of the workspace
    // again, for a feature only `package` needs.
    let workspace = option_env!("CARGO_PRIMARY_PACKAGE").is_some();
    let named = || -> Vec<String> { features.iter().map(|f| format!("{package}/{f}")).collect() };
    if std::env::var_os(WITH_WORKSPACE_HACK).is_some() {
        // The test's build selected workspace-hack beside `package` (CI does, see
        // workspace-hack/Cargo.toml): select the same, and the dependencies are that build's.
        cmd.args(["-p", "workspace-hack", "-p", package]);
        if !features.is_empty() {
            cmd.args(["--features", &named().join(",")]);
        }
    } else if workspace {
        cmd.args(["--workspace", "--tests"]);
        if !features.is_empty() {
            cmd.args(["--features", &named().join(",")]);
        }
    } else {
        cmd.args(["-p", package]);
        if !features.is_empty() {
            cmd.args(["--features", &features.join(",")]);
        }
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run cargo to build {package}'s {name}: {e}"));
    assert!(
        out.status.success(),
        "cargo could not build {package}'s {name}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        path.is_file(),
        "cargo built {package}'s {name}, but {} is not there",
        path.display()
    );
    path
}

/// `llm-rs run --model DEFAULT ARGS…`: the finished engine on the default model, run to the
/// end, its output kept.
pub fn llm_rs_run(args: &[&str]) -> std::process::Output {
    std::process::Command::new(program("llm-rs", Target::Bin, "llm-rs", &[]))
        .arg("run")
        .arg("--model")
        .arg(shared::default_model_path().unwrap_or_else(|e| panic!("{e}")))
        .args(args)
        .output()
        .expect("llm-rs runs")
}

/// The one JSON object a `--json` run printed; a failed run panics with what it said.
pub fn json_printed(out: &std::process::Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("--json prints one JSON object")
}
