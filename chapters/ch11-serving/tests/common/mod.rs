//! A server on loopback for the tests: the default model, a port the system picks, its own
//! engine thread and runtime, and a blocking HTTP client.

#![allow(dead_code)]

use ch11::worker::{Observer, Outcome};
use ch11::{AppState, ServeArgs};
use reqwest::blocking::{Client, Response};
use serde_json::Value;
use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Every request of the tests ends within this (the slowest, 16 streams at once on two
/// cores, takes a few seconds): a hung server fails the test instead of hanging it.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(120);

pub struct TestServer {
    pub base: String,
    pub state: Arc<AppState>,
    pub client: Client,
}

/// The flags of a test server: the default model, on the machine's cores.
pub fn args() -> ServeArgs {
    ServeArgs {
        model: Some(shared::default_model_path().unwrap_or_else(|e| panic!("{e}"))),
        alias: None,
        host: "127.0.0.1".into(),
        port: 0,
        parallel: 4,
        queue: 16,
        ctx: Some(1024),
        kv_size: None,
        threads: 2,
        batch_tokens: ch11::SERVE_BATCH_TOKENS,
        timeout: 600,
        body_limit: 1 << 20,
        no_repack: false,
        // The flags' default, llama-server's: keys and values in f16.
        cache: ch05::CacheTypes::F16,
        archs: ch04::architectures(),
        files: std::sync::Arc::new(ch10::GgufFiles),
        formats: std::sync::Arc::new(ch11::TextOnly),
        lookaheads: std::sync::Arc::new(ch11::Predicted),
        chats: std::sync::Arc::new(ch11::PlainChats),
        endpoints: std::sync::Arc::new(ch11::server::OpenAi),
    }
}

/// A server as `args` say, loaded and listening.
pub fn start(args: ServeArgs) -> TestServer {
    start_with(args, |_| {})
}

/// [`start`], with `adjust` applied to the state's limits before it serves.
pub fn start_with(args: ServeArgs, adjust: impl FnOnce(&mut ch11::Limits)) -> TestServer {
    start_observed(args, adjust, Arc::new(()))
}

/// [`start_with`], with `observer` told what the engine thread does (and asked whether to
/// hold it).
pub fn start_observed(
    args: ServeArgs,
    adjust: impl FnOnce(&mut ch11::Limits),
    observer: Arc<dyn Observer>,
) -> TestServer {
    let mut limits = args.limits();
    adjust(&mut limits);
    let state = AppState::new(limits);
    let loaded = ch11::load_observed(&args, observer).unwrap_or_else(|e| panic!("{e}"));
    assert!(state.loaded.set(loaded).is_ok());
    let base = serve(Arc::clone(&state));
    TestServer {
        base,
        state,
        client: Client::builder().timeout(CLIENT_TIMEOUT).build().unwrap(),
    }
}

/// Serve `state` on 127.0.0.1 at a free port, on a runtime of its own; the base URL.
pub fn serve(state: Arc<AppState>) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            ch11::server::serve(
                listener,
                state,
                Arc::new(ch11::server::OpenAi),
                std::future::pending(),
            )
            .await
            .unwrap();
        });
    });
    format!("http://{}", rx.recv().unwrap())
}

impl TestServer {
    pub fn post(&self, path: &str, body: &Value) -> Response {
        self.client
            .post(format!("{}{path}", self.base))
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
            .get(format!("{}{path}", self.base))
            .send()
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
    }

    /// The scheduler's state from `/health`.
    pub fn scheduler(&self) -> Value {
        let v: Value = self.get("/health").json().unwrap();
        v["scheduler"].clone()
    }

    /// Open a stream: the response, whose body is read with [`Events`].
    pub fn stream(&self, path: &str, body: &Value) -> Events {
        let r = self.post(path, body);
        assert_eq!(r.status(), 200, "{body}");
        assert_eq!(r.headers()["content-type"], "text/event-stream");
        Events(BufReader::new(r))
    }
}

/// The `data:` payloads of an SSE stream, one at a time.
pub struct Events(pub BufReader<Response>);

impl Events {
    /// The next payload; `None` at the end of the stream.
    pub fn next_data(&mut self) -> Option<String> {
        let mut line = String::new();
        loop {
            line.clear();
            if self.0.read_line(&mut line).unwrap() == 0 {
                return None;
            }
            if let Some(d) = line.trim_end().strip_prefix("data: ") {
                return Some(d.to_string());
            }
        }
    }

    /// Every chunk up to `[DONE]` (which must come, and come last).
    pub fn collect(mut self) -> Vec<Value> {
        let mut chunks = Vec::new();
        loop {
            match self.next_data() {
                Some(d) if d == "[DONE]" => {
                    assert!(self.next_data().is_none(), "data after [DONE]");
                    return chunks;
                }
                Some(d) => chunks.push(serde_json::from_str(&d).unwrap()),
                None => panic!("the stream ended without [DONE] after {chunks:?}"),
            }
        }
    }
}

/// The text of a stream's chunks, chat (`delta.content`) or completion (`text`).
pub fn streamed_text(chunks: &[Value]) -> String {
    chunks
        .iter()
        .filter_map(|c| {
            let choice = c["choices"].get(0)?;
            choice["delta"]["content"]
                .as_str()
                .or(choice["text"].as_str())
                .map(str::to_string)
        })
        .collect()
}

/// The finish reason of a stream: its only non-null one.
pub fn streamed_finish(chunks: &[Value]) -> String {
    let reasons: Vec<&str> = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0)?["finish_reason"].as_str())
        .collect();
    assert_eq!(reasons.len(), 1, "{chunks:?}");
    reasons[0].to_string()
}

/// A chat request of one user message.
pub fn chat(content: &str, max_tokens: usize) -> Value {
    serde_json::json!({
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
    })
}

/// An observer that holds the engine thread ([`Observer::hold`]) as a test asks, so that the
/// test sees requests in the state it needs however fast this machine decodes: every request
/// from its first token on, until its client leaves or its time is up (`hold_started`); or
/// every request until the engine has `gather` of them at once (then it lets go for good).
#[derive(Default)]
pub struct Holding {
    /// Requests that have sampled a token and not ended.
    started: Mutex<HashSet<String>>,
    pub hold_started: AtomicBool,
    pub gather: AtomicUsize,
}

impl Holding {
    /// Holding every request from its first token.
    pub fn started() -> Arc<Holding> {
        let h = Holding::default();
        h.hold_started.store(true, Ordering::SeqCst);
        Arc::new(h)
    }

    fn ended(&self, label: &str) {
        self.started.lock().unwrap().remove(label);
    }
}

impl Observer for Holding {
    fn token(&self, label: &str, first: bool, _gap: Duration) {
        if first {
            self.started.lock().unwrap().insert(label.to_string());
        }
    }

    fn done(&self, label: &str, _outcome: &Outcome) {
        self.ended(label);
    }

    fn failed(&self, label: &str, _message: &str) {
        self.ended(label);
    }

    fn hold(&self, labels: &mut dyn Iterator<Item = &str>) -> bool {
        let started = self.started.lock().unwrap();
        let (mut n, mut any_started) = (0, false);
        for l in labels {
            n += 1;
            any_started |= started.contains(l);
        }
        let gather = self.gather.load(Ordering::SeqCst);
        if n >= gather {
            self.gather.store(0, Ordering::SeqCst);
        }
        (self.hold_started.load(Ordering::SeqCst) && any_started) || n < gather
    }
}
