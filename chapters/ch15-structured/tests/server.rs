//! Structured output served: the finished engine's server (`llm-rs serve`) on 127.0.0.1, at a
//! port the system picks, asked by OpenAI's official Python client
//! (`tests/structured_client.py`): a pydantic model through `chat.completions.parse`,
//! `json_object`, a streamed `json_schema`, llama-server's `grammar`, and the 400s of what
//! cannot be compiled.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// The server loads the model before it is ready; on a busy machine that may take a while.
const START_TIMEOUT: Duration = Duration::from_secs(120);

#[test]
fn openais_client_gets_structured_output() {
    let (py, path) = testkit::python::openai();
    let (_server, base) = testkit::serve::llm_rs_serve(
        &["--ctx", "1024", "--threads", "2", "--parallel", "2"],
        START_TIMEOUT,
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/structured_client.py");
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
        "structured_client.py failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("all checks passed"), "{stdout}");
}
