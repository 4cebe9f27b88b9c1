//! Structured output served: the finished engine's server (`llm-rs serve`) on 127.0.0.1, at a
//! port the system picks, asked by OpenAI's official Python client
//! (`tests/structured_client.py`): a pydantic model through `chat.completions.parse`,
//! `json_object`, a streamed `json_schema`, llama-server's `grammar`, and the 400s of what
//! cannot be compiled.

use std::path::Path;
use std::time::Duration;

/// The server loads the model before it is ready; on a busy machine that may take a while.
const START_TIMEOUT: Duration = Duration::from_secs(120);

#[test]
fn openais_client_gets_structured_output() {
    let (_server, base) = testkit::serve::llm_rs_serve(
        &["--ctx", "1024", "--threads", "2", "--parallel", "2"],
        START_TIMEOUT,
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/structured_client.py");
    testkit::python::run_client(&script, &base);
}

/// One HTTP/1.1 exchange over a fresh connection (`Connection: close`): the status and the
/// body. `limit` bounds the whole exchange (the test's subject where it is short).
fn exchange(base: &str, method: &str, path: &str, body: &str, limit: Duration) -> (u16, String) {
    use std::io::{Read, Write};
    let addr = base.strip_prefix("http://").expect("an http:// address");
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(limit)).unwrap();
    s.set_write_timeout(Some(limit)).unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body.as_bytes()).unwrap();
    let mut answer = Vec::new();
    s.read_to_end(&mut answer)
        .unwrap_or_else(|e| panic!("{method} {path}: no whole answer within {limit:?}: {e}"));
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer[9..12].parse().expect("a status line");
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, body.to_string())
}

/// A completion request asking for `grammar`.
fn with_grammar(grammar: &str, max_tokens: usize) -> String {
    serde_json::json!({
        "prompt": "Write something.",
        "max_tokens": max_tokens,
        "temperature": 0,
        "grammar": grammar,
    })
    .to_string()
}

// ANCHOR: grammar_flood
#[test]
fn big_grammars_compile_off_the_servers_threads_and_inside_its_limits() {
    /// How long `/health` and a small chat may take while big grammars compile. They take
    /// milliseconds when compiles run off the threads that serve HTTP; a compile on those
    /// threads would hold them for its whole time. The margin is for a loaded two-core
    /// machine.
    const HEALTH_LIMIT: Duration = Duration::from_secs(1);
    const CHAT_LIMIT: Duration = Duration::from_secs(5);
    let (_server, base) = testkit::serve::llm_rs_serve(
        &[
            "--ctx",
            "1024",
            "--threads",
            "2",
            "--parallel",
            "2",
            "--queue",
            "8",
        ],
        START_TIMEOUT,
    );
    // Two grammars of a million bytes each, different so that neither is cached: a literal
    // and a class, the shapes whose compile was quadratic.
    let literal = format!("root ::= \"{}\"", "ab".repeat(500_000));
    let class = format!("root ::= [{}]", "a-c".repeat(333_000));
    let compiling: Vec<_> = [literal, class]
        .into_iter()
        .map(|g| {
            let base = base.clone();
            std::thread::spawn(move || {
                exchange(
                    &base,
                    "POST",
                    "/v1/completions",
                    &with_grammar(&g, 1),
                    CLIENT_LIMIT,
                )
            })
        })
        .collect();
    let (status, _) = exchange(&base, "GET", "/health", "", HEALTH_LIMIT);
    assert_eq!(status, 200);
    let chat = serde_json::json!({
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0,
    });
    let (status, body) = exchange(
        &base,
        "POST",
        "/v1/chat/completions",
        &chat.to_string(),
        CHAT_LIMIT,
    );
    assert_eq!(status, 200, "{body}");
    for c in compiling {
        let (status, body) = c.join().unwrap();
        assert_eq!(status, 200, "{}", &body[..body.len().min(300)]);
    }
    // ANCHOR_END: grammar_flood
    // ANCHOR: grammar_flood_queue

    // Twenty requests with grammars, at once: two run, eight wait, the rest are refused
    // (503), whatever their grammars cost — a request holds its place while it compiles.
    let answers: Vec<_> = (0..20)
        .map(|i| {
            let base = base.clone();
            // Each its own grammar (nothing cached), each long to generate.
            let g = format!("root ::= \"{i}\" [a-z ]{{200}}");
            std::thread::spawn(move || {
                exchange(
                    &base,
                    "POST",
                    "/v1/completions",
                    &with_grammar(&g, 200),
                    CLIENT_LIMIT,
                )
            })
        })
        .collect();
    let statuses: Vec<u16> = answers.into_iter().map(|a| a.join().unwrap().0).collect();
    let ok = statuses.iter().filter(|&&s| s == 200).count();
    let busy = statuses.iter().filter(|&&s| s == 503).count();
    assert_eq!(ok + busy, 20, "{statuses:?}");
    assert!(ok <= 10 && busy >= 10, "{statuses:?}");
}
// ANCHOR_END: grammar_flood_queue

/// Every request of these tests ends within this; a hung server fails the test, not hangs it.
const CLIENT_LIMIT: Duration = Duration::from_secs(300);
