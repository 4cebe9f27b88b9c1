//! Python with OpenAI's and Anthropic's official clients, for the tests that talk to a server
//! the way a user's program does.

use std::path::PathBuf;
use std::process::Command;

/// The `openai` package the checks run with.
pub const OPENAI_VERSION: &str = "3.54.0";
/// The `anthropic` package the checks run with.
pub const ANTHROPIC_VERSION: &str = "2.17.0";
/// `python3`, and a directory holding `openai` at [`OPENAI_VERSION`] and `anthropic` at
/// [`ANTHROPIC_VERSION`] for its `PYTHONPATH`, installed there with pip if missing (pip is what
/// fetching the model needs already; a virtual environment would also need Debian's
/// `python3-venv`).
pub fn clients() -> (PathBuf, PathBuf) {
    let dir = shared::cache_dir()
        .unwrap_or_else(|e| panic!("{e}"))
        .join(format!(
            "openai-{OPENAI_VERSION}-anthropic-{ANTHROPIC_VERSION}"
        ));
    let py = PathBuf::from("python3");
    let has = || {
        Command::new(&py)
            .env("PYTHONPATH", &dir)
            .args([
                "-c",
                &format!(
                    "import anthropic, openai, sys; sys.exit(openai.__version__ != \
                     {OPENAI_VERSION:?} or anthropic.__version__ != {ANTHROPIC_VERSION:?})"
                ),
            ])
            .status()
            .is_ok_and(|s| s.success())
    };
    if !has() {
        let s = Command::new(&py)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--target",
            ])
            .arg(&dir)
            .arg(format!("openai=={OPENAI_VERSION}"))
            .arg(format!("anthropic=={ANTHROPIC_VERSION}"))
            .status()
            .unwrap_or_else(|e| panic!("python3 -m pip install openai anthropic: {e}"));
        assert!(
            s.success(),
            "installing openai {OPENAI_VERSION} and anthropic {ANTHROPIC_VERSION} with pip failed"
        );
        assert!(
            has(),
            "openai {OPENAI_VERSION} or anthropic {ANTHROPIC_VERSION} is not importable after \
             installing them"
        );
    }
    (py, dir)
}

/// Run the Python `script` with the clients ([`clients`]) against the server at `base`, which
/// is ready (its model loaded: the caller waited for it), print what it printed, and fail the
/// test unless it exits 0 having printed `all checks passed` (so a script that stops early
/// cannot pass).
pub fn run_client(script: &std::path::Path, base: &str) {
    let (py, path) = clients();
    let out = Command::new(py)
        .env("PYTHONPATH", path)
        .arg(script)
        .arg(base)
        .output()
        .expect("python runs");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    println!("{stdout}");
    let name = script.file_name().map_or_else(
        || script.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    assert!(out.status.success(), "{name} failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("all checks passed"), "{stdout}");
}
