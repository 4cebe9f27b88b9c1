//! The server with OpenAI's official Python client (`openai`, pinned), the way a user's
//! program talks to it: the server binary on a free loopback port, and
//! `tests/openai_client.py` against it. The package is installed on first use with pip into a
//! directory of the cache directory.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Loading the model and listening takes about a second; far more on a loaded machine.
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// Start the server binary on a free port; its base URL once `/health` answers 200.
fn start() -> (testkit::serve::Served, String) {
    let model = shared::default_model_path().unwrap_or_else(|e| panic!("{e}"));
    let (server, base) = testkit::serve::serve(
        Command::new(testkit::program(
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
        ]),
        START_TIMEOUT,
    );
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
    let (_server, base) = start();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openai_client.py");
    testkit::python::run_client(&script, &base);
}
