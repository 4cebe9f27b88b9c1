//! The production server as an operator runs it: the `ch12` binary in a process of its own, on
//! 127.0.0.1 at a port the system picks, its log lines collected; and a blocking HTTP client.

#![allow(dead_code)]

pub mod soak;

pub use soak::Metrics;

use reqwest::blocking::{Client, Response};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Every request of the tests ends within this; a hung server fails the test, not hangs it.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(120);
/// Loading the default model takes about a second; this allows for a busy machine (and the
/// first fetch of the model happens before any server starts, in [`model`]).
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a test waits for a state the server reaches by itself — a gauge set after a
/// step, a log line written, a process exited after its drain — asking again every [`POLL`].
/// Each takes milliseconds on an idle machine; this bounds the wait on a broken server, far
/// above what a two-core machine shared with another test run needs, and is never what a
/// test judges.
pub const SETTLE: Duration = Duration::from_secs(60);

/// How often a test asks again while it waits.
pub const POLL: Duration = Duration::from_millis(20);

/// How late after its deadline a connection may be closed, or a request given up, when the
/// deadline is what a test judges. The server looks at its connections' deadlines every
/// 250 ms and its timers fire on time, but on a two-core machine shared with another test run
/// the thread that acts may wait seconds for a core. 5 s allows for that, and stays below
/// the next limit a server that ignored the test's would keep (its defaults: 10 s for
/// headers, 30 s for a body, 60 s idle).
pub const DEADLINE_SLACK: Duration = Duration::from_secs(5);

/// The default model, fetched if needed.
pub fn model() -> String {
    let p = shared::default_model_path().unwrap_or_else(|e| panic!("{e}"));
    p.to_string_lossy().into_owned()
}

pub struct Server {
    pub child: Child,
    pub base: String,
    pub port: u16,
    /// Every log line so far (standard error).
    pub logs: Arc<Mutex<Vec<String>>>,
    /// The thread that collects them, until the process closes its standard error.
    reader: Option<std::thread::JoinHandle<()>>,
    pub client: Client,
}

/// Wait until `done` holds, asking every [`POLL`]; a server that never gets there fails the
/// test after [`SETTLE`].
pub fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < SETTLE, "{what}: not within {SETTLE:?}");
        std::thread::sleep(POLL);
    }
}

/// The flags every test server has: the default model, two threads, a small context.
pub fn flags() -> Vec<String> {
    [
        "--model",
        &model(),
        "--port",
        "0",
        "--threads",
        "2",
        "--ctx",
        "1024",
    ]
    .map(str::to_string)
    .to_vec()
}

/// Start `ch12` with `args` and `env`; wait until it is ready.
pub fn start(args: &[String], env: &[(&str, &str)]) -> Server {
    let mut cmd = Command::new(testkit::program(
        "ch12",
        testkit::Target::Example,
        "production",
        &[],
    ));
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("start ch12");
    let logs = Arc::new(Mutex::new(Vec::new()));
    let (port_tx, port_rx) = channel();
    let stderr = child.stderr.take().unwrap();
    let sink = Arc::clone(&logs);
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if let Some(rest) = line.split("listening on http://127.0.0.1:").nth(1) {
                let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
                let _ = port_tx.send(digits.parse::<u16>().unwrap());
            }
            sink.lock().unwrap().push(line);
        }
    });
    let port = match port_rx.recv_timeout(START_TIMEOUT) {
        Ok(p) => p,
        Err(_) => {
            let _ = child.kill();
            panic!("ch12 did not listen: {:?}", logs.lock().unwrap());
        }
    };
    let server = Server {
        child,
        base: format!("http://127.0.0.1:{port}"),
        port,
        logs,
        reader: Some(reader),
        client: Client::builder().timeout(CLIENT_TIMEOUT).build().unwrap(),
    };
    let started = Instant::now();
    while server.get("/ready").status() != 200 {
        assert!(
            started.elapsed() < START_TIMEOUT,
            "not ready: {:?}",
            server.logs()
        );
        std::thread::sleep(POLL);
    }
    server
}

impl Server {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn post(&self, path: &str, body: &Value) -> Response {
        self.client
            .post(self.url(path))
            .json(body)
            .send()
            .unwrap_or_else(|e| panic!("POST {path}: {e}"))
    }

    /// POST, expecting 200 and JSON.
    pub fn ok(&self, path: &str, body: &Value) -> Value {
        let r = self.post(path, body);
        let status = r.status();
        let text = r.text().unwrap();
        assert_eq!(status, 200, "POST {path} {body}: {text}");
        serde_json::from_str(&text).unwrap()
    }

    pub fn get(&self, path: &str) -> Response {
        self.client
            .get(self.url(path))
            .send()
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
    }

    pub fn logs(&self) -> Vec<String> {
        self.logs.lock().unwrap().clone()
    }

    /// Whether a log line so far contains `text`.
    pub fn logged(&self, text: &str) -> bool {
        self.logs.lock().unwrap().iter().any(|l| l.contains(text))
    }

    /// The index of the first log line that contains `text`.
    pub fn log_line(&self, text: &str) -> Option<usize> {
        self.logs
            .lock()
            .unwrap()
            .iter()
            .position(|l| l.contains(text))
    }

    /// The metrics now, parsed.
    pub fn metrics(&self) -> Metrics {
        let text = self.get("/metrics").text().unwrap();
        Metrics::parse(&text)
    }

    /// Send SIGTERM, as an orchestrator does.
    pub fn terminate(&self) {
        let ok = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -TERM failed");
    }

    /// Wait for the process to exit, at most `limit`; once it has, every line it logged has
    /// been collected.
    pub fn wait(&mut self, limit: Duration) -> Option<ExitStatus> {
        let started = Instant::now();
        while started.elapsed() < limit {
            if let Some(s) = self.child.try_wait().unwrap() {
                if let Some(r) = self.reader.take() {
                    let _ = r.join();
                }
                return Some(s);
            }
            std::thread::sleep(POLL);
        }
        None
    }

    /// Resident memory of the server process, in KiB.
    pub fn rss_kib(&self) -> u64 {
        soak::rss_kib(self.child.id())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A chat request of one user message, greedy.
pub fn chat(content: &str, max_tokens: usize) -> Value {
    serde_json::json!({
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
    })
}

/// The `data:` payloads of an SSE stream, one at a time, read on a thread of its own so that a
/// test can wait on several streams with a time limit.
pub struct Stream {
    pub rx: Receiver<Option<String>>,
}

impl Stream {
    pub fn open(response: Response) -> Stream {
        assert_eq!(response.status(), 200);
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(response);
            let mut line = String::new();
            loop {
                line.clear();
                match reader.read_line(&mut line) {
                    Ok(0) | Err(_) => {
                        let _ = tx.send(None);
                        return;
                    }
                    Ok(_) => {
                        if let Some(d) = line.trim_end().strip_prefix("data: ")
                            && tx.send(Some(d.to_string())).is_err()
                        {
                            return;
                        }
                    }
                }
            }
        });
        Stream { rx }
    }

    /// The next payload; `None` when the stream has ended.
    pub fn next(&self, limit: Duration) -> Option<String> {
        match self.rx.recv_timeout(limit) {
            Ok(d) => d,
            Err(RecvTimeoutError::Timeout) => panic!("no event within {limit:?}"),
            Err(RecvTimeoutError::Disconnected) => None,
        }
    }
}
