//! The soak: many clients for a set time, mixing the requests a public server meets — normal
//! ones, streamed or not; streams the client drops after two events; malformed JSON; bodies
//! over the limit; unknown paths — and the hostile ones: connections that send nothing, a
//! declared length of 100 MB, a wrong API key — and checking that each gets its answer. Shared by
//! `tests/soak.rs` (60 s in CI) and `examples/soak.rs` (`scripts/soak`, any length).
//!
//! Every request is one of:
//! - served: the answer it should get (a 200 with a whole completion, or the error status its
//!   fault deserves);
//! - failed: a whole answer, but the wrong one (an unexpected status or shape);
//! - lost: no whole answer (the connection broke, or a stream ended without its final event).
//!
//! Bounded: it stops at its duration or its request count, whichever comes first, and only
//! ever talks to the address it is given.

#![allow(dead_code)]

use reqwest::blocking::Client;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub struct Config {
    pub base: String,
    pub clients: usize,
    pub duration: Duration,
    pub max_requests: usize,
    /// The server's `--body-limit`: the oversized requests send one byte more.
    pub body_limit: usize,
    /// Tokens each normal request asks for.
    pub max_tokens: usize,
    /// The server's API key, which every request but the wrong-key ones carries.
    pub api_key: String,
    /// The server's `--header-timeout`: a silent connection must be closed by then.
    pub header_timeout: Duration,
}

/// How late a silent connection may be closed after the header timeout: the server looks at
/// its connections' deadlines every 250 ms, and under the soak's own load on a two-core
/// machine shared with another test run, the thread that closes it may wait seconds for a
/// core. 5 s allows for that and stays below the default header timeout (10 s), which a
/// server that ignored the soak's would keep.
const CLOSE_SLACK: Duration = Duration::from_secs(5);

/// What became of the requests of one kind.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct Tally {
    pub served: usize,
    pub failed: usize,
    pub lost: usize,
}

#[derive(Debug, Default, serde::Serialize)]
pub struct Report {
    pub seconds: f64,
    pub total: Tally,
    pub by_kind: BTreeMap<&'static str, Tally>,
    /// The first few failures and losses, for the test's message.
    pub problems: Vec<String>,
}

enum Verdict {
    Served,
    Failed(String),
    Lost(String),
}

/// The kinds of request, in the order the clients take them (the streamed chat twice, the
/// cancelled stream twice, as a public server sees them more often).
pub const KINDS: [&str; 13] = [
    "chat",
    "chat-stream",
    "completion",
    "completion-stream",
    "chat-stream",
    "cancelled",
    "cancelled",
    "malformed",
    "oversized",
    "unknown-path",
    "silent",
    "lying-length",
    "wrong-key",
];

/// The server's port, from `cfg.base` (`http://127.0.0.1:PORT`; 0 if it has none, which no
/// connection reaches).
fn port(cfg: &Config) -> u16 {
    cfg.base
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or(0)
}

/// A connection that sends nothing: served if the server closes it by its header timeout.
fn silent(cfg: &Config) -> Verdict {
    let started = Instant::now();
    let mut c = match std::net::TcpStream::connect(("127.0.0.1", port(cfg))) {
        Ok(c) => c,
        Err(e) => return Verdict::Lost(format!("silent: connect: {e}")),
    };
    let _ = c.set_read_timeout(Some(cfg.header_timeout + CLOSE_SLACK));
    let mut buf = [0u8; 256];
    match std::io::Read::read(&mut c, &mut buf) {
        Ok(0) => Verdict::Served,
        Err(e) if e.kind() != std::io::ErrorKind::WouldBlock => Verdict::Served,
        _ => Verdict::Failed(format!("silent: still open after {:?}", started.elapsed())),
    }
}

/// A declared length of 100 MB with one byte sent: served if answered 413, from the headers
/// alone — a server that waited for the body would answer 408 at its body timeout (30 s by
/// default), after the read below has given up.
fn lying_length(cfg: &Config) -> Verdict {
    let Ok(mut c) = std::net::TcpStream::connect(("127.0.0.1", port(cfg))) else {
        return Verdict::Lost("lying-length: connect".into());
    };
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Authorization: Bearer {}\r\nContent-Length: 100000000\r\n\r\n{{",
        cfg.api_key
    );
    let _ = c.set_read_timeout(Some(Duration::from_secs(10)));
    if std::io::Write::write_all(&mut c, head.as_bytes()).is_err() {
        return Verdict::Lost("lying-length: write".into());
    }
    let mut answer = Vec::new();
    let _ = std::io::Read::read_to_end(&mut c, &mut answer);
    if !answer.starts_with(b"HTTP/1.1 413") {
        let text = String::from_utf8_lossy(&answer[..answer.len().min(80)]).into_owned();
        return Verdict::Failed(format!("lying-length: {text:?}"));
    }
    Verdict::Served
}

fn prompt(i: usize) -> String {
    // Half the requests share a start (prefix-cache hits), all differ in the end.
    if i.is_multiple_of(2) {
        format!("You are a helpful assistant. Request {i}: name a colour.")
    } else {
        format!("Request {i}: write one sentence about the sea.")
    }
}

/// Whether a stream reaches its finish reason and `[DONE]`.
fn read_stream(r: reqwest::blocking::Response, drop_after: Option<usize>) -> Verdict {
    if r.status() != 200 {
        return Verdict::Failed(format!("stream answered {}", r.status()));
    }
    let mut reader = BufReader::new(r);
    let mut line = String::new();
    let (mut events, mut finished) = (0, false);
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) => {
                return Verdict::Lost(format!("stream ended after {events} events without [DONE]"));
            }
            Err(e) => return Verdict::Lost(format!("stream broke after {events} events: {e}")),
            Ok(_) => {}
        }
        let Some(data) = line.trim_end().strip_prefix("data: ") else {
            continue;
        };
        events += 1;
        if drop_after == Some(events) {
            return Verdict::Served; // the client leaves; the server must cope
        }
        if data == "[DONE]" {
            return if finished {
                Verdict::Served
            } else {
                Verdict::Failed("[DONE] without a finish reason".into())
            };
        }
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            return Verdict::Failed(format!("not JSON: {data}"));
        };
        if v.get("error").is_some() {
            return Verdict::Failed(format!("error event: {data}"));
        }
        if v["choices"][0]["finish_reason"].is_string() {
            finished = true;
        }
    }
}

fn one(client: &Client, cfg: &Config, i: usize) -> (&'static str, Verdict) {
    let kind = KINDS[i % KINDS.len()];
    let base = &cfg.base;
    let chat = |stream: bool, n: usize| {
        json!({"messages": [{"role": "user", "content": prompt(i)}], "max_tokens": n,
               "temperature": 0.7, "seed": i, "stream": stream})
    };
    let completion = |stream: bool| json!({"prompt": prompt(i), "max_tokens": cfg.max_tokens, "temperature": 0, "stream": stream});
    let key = &cfg.api_key;
    let send = |path: &str, body: &Value| {
        client
            .post(format!("{base}{path}"))
            .bearer_auth(key)
            .json(body)
            .send()
    };
    let expect_status = |r: reqwest::Result<reqwest::blocking::Response>, want: u16| match r {
        Err(e) => Verdict::Lost(format!("{kind}: {e}")),
        Ok(r) => {
            let status = r.status().as_u16();
            match r.json::<Value>() {
                Err(e) => Verdict::Lost(format!("{kind}: body: {e}")),
                Ok(_) if status == want => Verdict::Served,
                Ok(v) => Verdict::Failed(format!("{kind}: {status} {v}")),
            }
        }
    };
    let whole = |r: reqwest::Result<reqwest::blocking::Response>| match r {
        Err(e) => Verdict::Lost(format!("{kind}: {e}")),
        Ok(r) => {
            let status = r.status().as_u16();
            match r.json::<Value>() {
                Err(e) => Verdict::Lost(format!("{kind}: body: {e}")),
                Ok(v) if status == 200 && v["choices"][0]["finish_reason"].is_string() => {
                    Verdict::Served
                }
                Ok(v) => Verdict::Failed(format!("{kind}: {status} {v}")),
            }
        }
    };
    let stream = |r: reqwest::Result<reqwest::blocking::Response>, drop_after| match r {
        Err(e) => Verdict::Lost(format!("{kind}: {e}")),
        Ok(r) => match read_stream(r, drop_after) {
            Verdict::Served => Verdict::Served,
            Verdict::Failed(m) => Verdict::Failed(format!("{kind}: {m}")),
            Verdict::Lost(m) => Verdict::Lost(format!("{kind}: {m}")),
        },
    };
    let verdict = match kind {
        "chat" => whole(send("/v1/chat/completions", &chat(false, cfg.max_tokens))),
        "chat-stream" => stream(
            send("/v1/chat/completions", &chat(true, cfg.max_tokens)),
            None,
        ),
        "completion" => whole(send("/v1/completions", &completion(false))),
        "completion-stream" => stream(send("/v1/completions", &completion(true)), None),
        "cancelled" => stream(send("/v1/chat/completions", &chat(true, 400)), Some(3)),
        "malformed" => {
            let r = client
                .post(format!("{base}/v1/chat/completions"))
                .bearer_auth(key)
                .header("content-type", "application/json")
                .body(format!(
                    "{{\"messages\": [{{\"role\": \"user\", \"content\": \"{i}"
                ))
                .send();
            expect_status(r, 400)
        }
        "oversized" => {
            let r = client
                .post(format!("{base}/v1/completions"))
                .bearer_auth(key)
                .header("content-type", "application/json")
                .body(vec![b' '; cfg.body_limit + 1])
                .send();
            expect_status(r, 413)
        }
        "silent" => silent(cfg),
        "lying-length" => lying_length(cfg),
        "wrong-key" => expect_status(
            client
                .post(format!("{base}/v1/chat/completions"))
                .bearer_auth(format!("{key}-{i}"))
                .json(&chat(false, 1))
                .send(),
            401,
        ),
        _ => expect_status(
            client
                .get(format!("{base}/v1/nothing-{i}"))
                .bearer_auth(key)
                .send(),
            404,
        ),
    };
    (kind, verdict)
}

/// Run the soak as `cfg` says; `sample` is called about once a second on another thread
/// (for the dashboard) until the soak ends.
pub fn run(cfg: &Config, mut sample: impl FnMut(f64) + Send) -> Report {
    let client = Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let next = AtomicUsize::new(0);
    let report = Mutex::new(Report::default());
    let started = Instant::now();
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(Ordering::SeqCst) {
                sample(started.elapsed().as_secs_f64());
                let tick = Instant::now();
                while tick.elapsed() < Duration::from_secs(1) && !done.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        });
        let workers: Vec<_> = (0..cfg.clients)
            .map(|_| {
                s.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        if i >= cfg.max_requests || started.elapsed() >= cfg.duration {
                            return;
                        }
                        let (kind, verdict) = one(&client, cfg, i);
                        let mut r = report.lock().unwrap();
                        let t = r.by_kind.entry(kind).or_default();
                        let problem = match verdict {
                            Verdict::Served => {
                                t.served += 1;
                                None
                            }
                            Verdict::Failed(m) => {
                                t.failed += 1;
                                Some(format!("failed: {m}"))
                            }
                            Verdict::Lost(m) => {
                                t.lost += 1;
                                Some(format!("lost: {m}"))
                            }
                        };
                        if let Some(p) = problem
                            && r.problems.len() < 10
                        {
                            r.problems.push(p);
                        }
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        done.store(true, Ordering::SeqCst);
    });
    let mut r = report.into_inner().unwrap();
    r.seconds = started.elapsed().as_secs_f64();
    r.total = r.by_kind.values().fold(Tally::default(), |a, t| Tally {
        served: a.served + t.served,
        failed: a.failed + t.failed,
        lost: a.lost + t.lost,
    });
    r
}

/// Resident memory of process `pid`, in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// One line of Prometheus text: the metric's name, its labels, its value.
pub type Sample = (String, Vec<(String, String)>, f64);

/// Metrics parsed from Prometheus's text format, strictly: a line that is not a comment, a
/// blank, or `name{labels} value` fails the test.
pub struct Metrics {
    pub samples: Vec<Sample>,
    /// `# TYPE` of each metric family.
    pub types: Vec<(String, String)>,
}

impl Metrics {
    pub fn parse(text: &str) -> Metrics {
        let mut samples = Vec::new();
        let mut types = Vec::new();
        let valid_name = |n: &str| {
            !n.is_empty()
                && n.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
                && !n.starts_with(|c: char| c.is_ascii_digit())
        };
        for line in text.lines() {
            if line.is_empty() || line.starts_with("# HELP ") {
                continue;
            }
            if let Some(t) = line.strip_prefix("# TYPE ") {
                let (name, kind) = t.split_once(' ').expect(line);
                assert!(valid_name(name), "{line}");
                assert!(
                    ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                    "{line}"
                );
                types.push((name.to_string(), kind.to_string()));
                continue;
            }
            assert!(!line.starts_with('#'), "unknown comment: {line}");
            let (series, value) = line.rsplit_once(' ').expect(line);
            let value: f64 = match value {
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                v => v.parse().unwrap_or_else(|_| panic!("value of {line}")),
            };
            let (name, labels) = match series.split_once('{') {
                None => (series, Vec::new()),
                Some((name, rest)) => {
                    let inner = rest.strip_suffix('}').expect(line);
                    let labels = inner
                        .split(',')
                        .filter(|p| !p.is_empty())
                        .map(|p| {
                            let (k, v) = p.split_once('=').expect(line);
                            assert!(valid_name(k), "{line}");
                            let v = v.strip_prefix('"').and_then(|v| v.strip_suffix('"'));
                            (k.to_string(), v.expect(line).to_string())
                        })
                        .collect();
                    (name, labels)
                }
            };
            assert!(valid_name(name), "{line}");
            samples.push((name.to_string(), labels, value));
        }
        Metrics { samples, types }
    }

    /// The sum of `name`'s samples whose labels include all of `labels`.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|(n, l, _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v))
            })
            .map(|(_, _, v)| v)
            .sum()
    }
}
