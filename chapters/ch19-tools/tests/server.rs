//! Tool calls served: the finished engine's server (`llm-rs serve`) on 127.0.0.1, at a port
//! the system picks, asked by OpenAI's official Python client (`tests/tools_client.py`):
//! calls held to `tool_choice` streamed and not, an agent loop, and the 400s; then, by the
//! same server, the Responses API through OpenAI's client and the Messages API through
//! Anthropic's (`tests/apis_client.py`).

use std::path::Path;
use std::time::Duration;

/// The server loads the model before it is ready; on a busy machine that may take a while.
const START_TIMEOUT: Duration = Duration::from_secs(120);

#[test]
fn official_clients_call_tools() {
    let (_server, base) = testkit::serve::llm_rs_serve(
        &["--ctx", "2048", "--threads", "2", "--parallel", "2"],
        START_TIMEOUT,
    );
    let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    testkit::python::run_client(&tests.join("tools_client.py"), &base);
    testkit::python::run_client(&tests.join("apis_client.py"), &base);
}
