//! The server with OpenAI's official Python client (`openai`, pinned), the way a user's
//! program talks to it: the server binary on a free loopback port, and
//! `tests/openai_client.py` against it. The package is installed on first use with pip into a
//! directory of the cache directory.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The `openai` package the check runs with.
const OPENAI_VERSION: &str = "3.54.0";
/// Loading the model and listening takes about a second; far more on a loaded machine.
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// `python3`, and a directory holding `openai` at [`OPENAI_VERSION`] for its `PYTHONPATH`,
/// installed there with pip if missing (pip is what fetching the model needs already; a
/// virtual environment would also need Debian's `python3-venv`).
fn python() -> (PathBuf, PathBuf) {
    let dir = shared::cache_dir()
        .unwrap_or_else(|e| panic!("{e}"))
        .join(format!("openai-{OPENAI_VERSION}"));
    let py = PathBuf::from("python3");
    let has = || {
        Command::new(&py)
            .env("PYTHONPATH", &dir)
            .args([
                "-c",
                &format!("import openai, sys; sys.exit(openai.__version__ != {OPENAI_VERSION:?})"),
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
            .status()
            .unwrap_or_else(|e| panic!("python3 -m pip install openai: {e}"));
        assert!(
            s.success(),
            "installing openai {OPENAI_VERSION} with pip failed"
        );
        assert!(
            has(),
            "openai {OPENAI_VERSION} is not importable after installing it"
        );
    }
    (py, dir)
}

/// The server process, killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Start the server binary on a free port; its base URL once `/health` answers 200.
fn start() -> (Server, String) {
    let model = shared::default_model_path().unwrap_or_else(|e| panic!("{e}"));
    let mut child = Command::new(testkit::program(
        "ch11",
        testkit::Target::Example,
        "server",
        &[],
    ))
    .arg("--model")
    .arg(&model)
    .args([
        "--port",
        "0",
        "--ctx",
        "1024",
        "--threads",
        "2",
        "--parallel",
        "2",
    ])
    .stderr(Stdio::piped())
    .spawn()
    .expect("the server binary starts");
    let stderr = child.stderr.take().unwrap();
    let server = Server(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("server: {line}");
            if let Some(url) = line.strip_prefix("listening on ") {
                let _ = tx.send(url.to_string());
            }
        }
    });
    let base = rx
        .recv_timeout(START_TIMEOUT)
        .expect("the server says where it listens");
    let t0 = Instant::now();
    let client = reqwest::blocking::Client::new();
    while !client
        .get(format!("{base}/health"))
        .send()
        .is_ok_and(|r| r.status() == 200)
    {
        assert!(
            t0.elapsed() < START_TIMEOUT,
            "the server never became ready"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    (server, base)
}

#[test]
fn openais_python_client_works() {
    let (py, path) = python();
    let (_server, base) = start();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openai_client.py");
    let out = Command::new(py)
        .env("PYTHONPATH", path)
        .arg(script)
        .arg(&base)
        .output()
        .expect("python runs");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    println!("{stdout}");
    assert!(
        out.status.success(),
        "openai_client.py failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("all checks passed"), "{stdout}");
}
