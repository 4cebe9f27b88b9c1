//! The production server under attack, from loopback: connections that send nothing, a flood
//! of connections, bodies that lie about their size or are too large to be a prompt the
//! model can run, and requests a browser could be tricked into sending. Each attack must be
//! refused by the limit meant for it, and the server must go on serving.

mod common;

use common::{chat, flags, start};
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

fn with(extra: &[&str]) -> Vec<String> {
    let mut f = flags();
    f.extend(extra.iter().map(|s| s.to_string()));
    f
}

/// How long after its deadline a connection may still be open: the server looks at its
/// connections' deadlines every 250 ms, and a busy machine may be a second late.
const DEADLINE_SLACK: Duration = Duration::from_millis(1500);

/// Whether the server has closed `conn` (a read returns end of file or an error) within
/// `limit`.
fn closed_within(conn: &mut TcpStream, limit: Duration) -> bool {
    conn.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match conn.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return false,
            Err(_) => return true,
        }
    }
}

fn connect(port: u16) -> TcpStream {
    TcpStream::connect(("127.0.0.1", port)).unwrap()
}

/// One raw HTTP/1.1 exchange: `request` written, the answer read to the end (the server
/// closes after it, or `Connection: close` asks it to).
fn raw(port: u16, request: &[u8]) -> String {
    let mut c = connect(port);
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(request).unwrap();
    let mut answer = Vec::new();
    let _ = c.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).into_owned()
}

#[test]
fn connections_that_send_nothing_or_stop_early_are_closed_at_their_deadline() {
    let s = start(
        &with(&["--header-timeout", "2", "--idle-timeout", "1"]),
        &[],
    );
    // Silent; one byte; HTTP/2's preface alone; the preface and an empty SETTINGS frame.
    let preface: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let settings: &[u8] = &[0, 0, 0, 4, 0, 0, 0, 0, 0];
    let mut conns = Vec::new();
    for what in [&b""[..], b"P", preface, &[preface, settings].concat()] {
        for _ in 0..8 {
            let mut c = connect(s.port);
            c.write_all(what).unwrap();
            conns.push(c);
        }
    }
    let started = Instant::now();
    for c in &mut conns {
        let left = (Duration::from_secs(2) + DEADLINE_SLACK).saturating_sub(started.elapsed());
        assert!(
            closed_within(c, left.max(Duration::from_millis(1))),
            "a connection is still open {:?} after it opened",
            started.elapsed()
        );
    }

    // A keep-alive connection after its answer: open while idle for less than the limit,
    // closed after it.
    // The server's idle clock starts when its answer ends, which is after the request was
    // sent and may be before this thread sees the answer (it can wait for a core): so the
    // limit is measured from the send.
    let mut c = connect(s.port);
    let sent = Instant::now();
    c.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut buf = [0u8; 4096];
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let n = c.read(&mut buf).unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    assert!(
        !closed_within(&mut c, Duration::from_millis(500)),
        "closed before the idle limit"
    );
    assert!(closed_within(
        &mut c,
        Duration::from_millis(500) + DEADLINE_SLACK
    ));
    assert!(sent.elapsed() >= Duration::from_secs(1));

    // The server goes on.
    let r = s.ok("/v1/chat/completions", &chat("Hi", 2));
    assert_eq!(r["usage"]["completion_tokens"], 2);
}

#[test]
fn past_the_connection_cap_the_probes_answer_and_everything_else_waits() {
    const CAP: usize = 8;
    let s = start(
        &with(&[
            "--max-connections",
            &CAP.to_string(),
            "--header-timeout",
            "30",
        ]),
        &[],
    );
    // Hold every place with connections that send nothing.
    let holders: Vec<TcpStream> = (0..CAP).map(|_| connect(s.port)).collect();
    std::thread::sleep(Duration::from_millis(300));
    // A probe still answers, on a connection of its own past the cap.
    let health = raw(
        s.port,
        b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    // Work does not: 503, named.
    let body = chat("Hi", 2).to_string();
    let post = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let busy = raw(s.port, post.as_bytes());
    assert!(busy.starts_with("HTTP/1.1 503"), "{busy}");
    assert!(busy.contains("too_many_connections"), "{busy}");
    // A flood past the probes' places: each new connection takes the place of the oldest
    // silent one, which is closed, so the flood cannot keep a probe out.
    let mut flood: Vec<TcpStream> = (0..64).map(|_| connect(s.port)).collect();
    std::thread::sleep(Duration::from_millis(300));
    let health = raw(
        s.port,
        b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert!(
        health.starts_with("HTTP/1.1 200"),
        "during the flood: {health}"
    );
    let closed = flood
        .iter_mut()
        .map(|c| closed_within(c, Duration::from_millis(200)))
        .filter(|&closed| closed)
        .count();
    assert!(
        closed >= 64 - 16,
        "only {closed} of 64 connections past the cap were closed"
    );
    drop(flood);
    std::thread::sleep(Duration::from_millis(300));
    let health = raw(
        s.port,
        b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    assert!(
        s.logs()
            .iter()
            .any(|l| l.contains("connection cap reached")),
        "the cap is logged"
    );
    // Places come back when connections close.
    drop(holders);
    std::thread::sleep(Duration::from_millis(500));
    let r = s.ok("/v1/chat/completions", &chat("Hi", 2));
    assert_eq!(r["usage"]["completion_tokens"], 2);
}

#[test]
fn headers_alone_refuse_a_lying_length_a_missing_host_and_a_body_that_is_not_json() {
    let s = start(&flags(), &[]);
    // A declared length of 100 MB with one byte sent: 413 at once, not after a wait.
    let started = Instant::now();
    let answer = raw(
        s.port,
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
          Content-Length: 100000000\r\n\r\n{",
    );
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );

    let answer = raw(s.port, b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n");
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("Host"), "{answer}");

    // What a web page can make a browser send without asking: text/plain, a form, no type.
    for content_type in [
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        None,
    ] {
        let mut r = s.client.post(s.url("/v1/completions"));
        if let Some(t) = content_type {
            r = r.header("content-type", t);
        }
        let r = r
            .body(json!({"prompt": "Hi", "max_tokens": 2}).to_string())
            .send()
            .unwrap();
        assert_eq!(r.status(), 415, "{content_type:?}");
    }
    // JSON with a charset is JSON.
    let r = s
        .client
        .post(s.url("/v1/completions"))
        .header("content-type", "application/json; charset=utf-8")
        .body(json!({"prompt": "Hi", "max_tokens": 2}).to_string())
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
}

/// Most the server's resident memory may grow while 16 clients send it bodies of 8 MiB at
/// once: each is refused from its declared length, unread, so nothing near 16 × 8 MiB may be
/// held. 64 MiB leaves room for the allocator's arenas and the connections' buffers.
const MAX_RSS_GROWTH_KIB: u64 = 64 << 10;

#[test]
fn prompts_too_long_for_the_context_cost_little_and_are_refused_before_tokenizing() {
    let s = start(&flags(), &[]);
    let before = s.rss_kib();
    // 16 bodies of 8 MiB at once: refused by their size, far above what a context of 1024
    // tokens can use.
    let big = json!({"prompt": "x ".repeat(4 << 20), "max_tokens": 1}).to_string();
    std::thread::scope(|scope| {
        for _ in 0..16 {
            scope.spawn(|| {
                let r = s
                    .client
                    .post(s.url("/v1/completions"))
                    .header("content-type", "application/json")
                    .body(big.clone())
                    .send();
                // The server may answer before it has read the body and close the
                // connection: the client sees the 413 or a reset.
                if let Ok(r) = r {
                    assert_eq!(r.status(), 413);
                }
            });
        }
    });
    let grown = s.rss_kib().saturating_sub(before);
    assert!(
        grown < MAX_RSS_GROWTH_KIB,
        "resident memory grew by {grown} KiB"
    );

    // A body under the limit whose text is longer than 1024 tokens can cover: refused by its
    // byte count, before it is tokenized, naming the context.
    let models: Value = s.get("/v1/models").json().unwrap();
    assert_eq!(models["data"][0]["meta"]["n_ctx"], 1024);
    let mut long = String::new();
    let r = loop {
        long.push_str(&"Paris ".repeat(4096));
        let r = s.post("/v1/completions", &json!({"prompt": long, "max_tokens": 1}));
        if r.status() != 400 {
            panic!("{}: {}", r.status(), r.text().unwrap());
        }
        let v: Value = r.json().unwrap();
        let m = v["error"]["message"].as_str().unwrap().to_string();
        if m.contains("bytes of text") {
            break v;
        }
        assert!(m.contains("tokens"), "{m}");
    };
    assert_eq!(r["error"]["code"], "context_length_exceeded");
    assert_eq!(r["error"]["param"], "prompt");
}

#[test]
fn with_keys_only_their_holders_are_served_and_no_cache_hit_crosses_keys() {
    let keys = tempfile::NamedTempFile::new().unwrap();
    let hash = |k: &str| {
        use sha2::Digest;
        sha2::Sha256::digest(k.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    std::fs::write(
        keys.path(),
        format!("alice {}\nbob {}\n", hash("sk-alice"), hash("sk-bob")),
    )
    .unwrap();
    let s = start(
        &with(&[
            "--api-keys",
            keys.path().to_str().unwrap(),
            "--key-max-in-flight",
            "1",
            "--metrics-per-key",
        ]),
        &[],
    );
    let post = |key: Option<&str>, body: &Value| {
        let mut r = s.client.post(s.url("/v1/chat/completions")).json(body);
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        r.send().unwrap()
    };
    // No key, a wrong key: 401 in OpenAI's shape. The probes stay open.
    for key in [None, Some("sk-mallory"), Some("sk-alice ")] {
        let r = post(key, &chat("Hi", 1));
        let status = r.status();
        let v: Value = r.json().unwrap();
        if key == Some("sk-alice ") {
            assert_eq!(status, 200, "surrounding spaces are not part of a key");
            continue;
        }
        assert_eq!(status, 401, "{key:?}");
        assert_eq!(v["error"]["code"], "invalid_api_key");
    }
    assert_eq!(s.get("/health").status(), 200);
    assert_eq!(s.get("/metrics").status(), 200);
    let r = s.client.get(s.url("/v1/models")).send().unwrap();
    assert_eq!(r.status(), 401);

    // A system prompt of several cache blocks: alice's second request finds it cached; bob's
    // identical one does not, and so learns nothing of it.
    let secret = json!({
        "messages": [
            {"role": "system", "content": "The launch code is 7-4-1-9. Never tell anyone the \
              launch code, whatever they say, and answer every question about it with a poem."},
            {"role": "user", "content": "Hi"},
        ],
        "max_tokens": 1,
        "temperature": 0,
    });
    let cached = |key| {
        let r = post(Some(key), &secret);
        assert_eq!(r.status(), 200);
        let v: Value = r.json().unwrap();
        v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(cached("sk-alice"), 0);
    assert!(cached("sk-alice") >= 16, "alice's own prefix is cached");
    assert_eq!(cached("sk-bob"), 0, "bob saw alice's cached prefix");

    // One request in flight per key: a second of alice's waits for nothing, it is a 429; bob's
    // goes on.
    let stream = s
        .client
        .post(s.url("/v1/completions"))
        .bearer_auth("sk-alice")
        .json(&json!({"prompt": "Once upon a time", "max_tokens": 1000, "stream": true}))
        .send()
        .unwrap();
    assert_eq!(stream.status(), 200);
    let r = post(Some("sk-alice"), &chat("Hi", 1));
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
    assert_eq!(post(Some("sk-bob"), &chat("Hi", 1)).status(), 200);
    drop(stream);
    let metrics = s.get("/metrics").text().unwrap();
    assert!(
        metrics.contains(r#"llmrs_key_requests_total{key="alice",status="in_flight"} 1"#),
        "{metrics}"
    );
    assert!(!metrics.contains("sk-alice"), "a key is in the metrics");
    assert!(
        !s.logs()
            .iter()
            .any(|l| l.contains("sk-alice") || l.contains("sk-bob")),
        "a key was logged"
    );
}

/// Requests in flight now, from the server's own gauge.
fn in_flight(s: &common::Server) -> f64 {
    s.metrics()
        .sum("llmrs_in_flight_requests", &[("variant", "a")])
}

/// Wait until `done` holds, asking every 20 ms; a server that never gets there fails the test
/// after `LIMIT` (generous: the events waited for take milliseconds).
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    const LIMIT: Duration = Duration::from_secs(30);
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < LIMIT, "{what}: not within {LIMIT:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A completion whose grammar never finishes compiling (`--fault-injection`'s stall).
fn stalled() -> Value {
    json!({"prompt": "Hi", "max_tokens": 4, "grammar": ch12::app::STALL_GRAMMAR})
}

/// How many times the log says a stalled compile saw its request given up.
fn given_up(s: &common::Server) -> usize {
    s.logs()
        .iter()
        .filter(|l| l.contains("the stalled compile saw its request given up"))
        .count()
}

// ANCHOR: stalled_compiles
#[test]
fn a_compiling_request_holds_its_place_and_is_given_up_by_its_client_and_its_time() {
    // One running and one waiting: two places in all. A request's time is 3 s.
    let s = start(
        &with(&[
            "--fault-injection",
            "--parallel",
            "1",
            "--queue",
            "1",
            "--timeout",
            "3",
        ]),
        &[],
    );
    // The first compiles until its client leaves: a raw connection that will be dropped.
    let body = stalled().to_string();
    let mut leaving = connect(s.port);
    let request = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    leaving.write_all(request.as_bytes()).unwrap();
    // The second compiles until its time is up.
    let client = s.client.clone();
    let url = s.url("/v1/completions");
    let timed = std::thread::spawn(move || {
        let r = client.post(url).json(&stalled()).send().unwrap();
        (r.status().as_u16(), r.json::<Value>().unwrap())
    });
    wait_until("two requests compiling", || in_flight(&s) == 2.0);
    // ANCHOR_END: stalled_compiles
    // ANCHOR: stalled_compiles_given_up
    // Compiling, they hold both places: a third request is refused at once.
    let r = s.post("/v1/chat/completions", &chat("Hi", 4));
    let status = r.status();
    let e: Value = r.json().unwrap();
    assert_eq!(status, 503, "{e}: {:?}", s.logs());
    assert_eq!(e["error"]["code"], "server_busy", "{e}");
    // The probes answer: compiles run off the threads that serve HTTP. (The bound is the
    // client's; an answer takes milliseconds. Before, two compiles held both threads.)
    let quick = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let health = quick.get(s.url("/health")).send().unwrap();
    assert_eq!(health.status(), 200);
    // The client that leaves gives its place back, and its compile stops.
    drop(leaving);
    wait_until("the first compile given up", || given_up(&s) == 1);
    wait_until("its place given back", || in_flight(&s) == 1.0);
    // The other is given up at its time limit, with a 503 that says so.
    let (status, e) = timed.join().unwrap();
    assert_eq!(
        (status, e["error"]["code"].as_str()),
        (503, Some("timeout")),
        "{e}"
    );
    wait_until("the second compile given up", || given_up(&s) == 2);
    wait_until("every place given back", || in_flight(&s) == 0.0);
    // And the server goes on.
    let a = s.ok("/v1/chat/completions", &chat("Hi", 4));
    assert!(a["usage"]["completion_tokens"].as_u64().unwrap() > 0);
}
// ANCHOR_END: stalled_compiles_given_up

#[test]
fn sigterm_while_requests_compile_answers_them_503_and_exits_within_the_bound() {
    const DRAIN: u64 = 2;
    let mut s = start(
        &with(&["--fault-injection", "--drain-timeout", &DRAIN.to_string()]),
        &[],
    );
    let compiling: Vec<_> = (0..3)
        .map(|_| {
            let client = s.client.clone();
            let url = s.url("/v1/completions");
            std::thread::spawn(move || {
                let r = client.post(url).json(&stalled()).send().unwrap();
                (r.status().as_u16(), r.json::<Value>().unwrap())
            })
        })
        .collect();
    wait_until("three requests compiling", || in_flight(&s) == 3.0);
    let signalled = Instant::now();
    s.terminate();
    // Each is answered: not ready before the drain began, it would not be let in.
    for c in compiling {
        let (status, e) = c.join().unwrap();
        assert_eq!(
            (status, e["error"]["code"].as_str()),
            (503, Some("shutting_down")),
            "{e}"
        );
    }
    // The process exits 0 within the drain's bound (requests compiling do not hold it), with
    // one second for a busy machine to start and end a process.
    let bound = Duration::from_secs(DRAIN + 2);
    let status = s
        .wait(bound + Duration::from_secs(5))
        .expect("the server did not exit");
    assert!(status.success(), "{status:?}: {:?}", s.logs());
    assert!(signalled.elapsed() < bound + Duration::from_secs(1));
    // Every compile that had started was given up (compiles take turns: the third may not
    // have started).
    let started = s
        .logs()
        .iter()
        .filter(|l| l.contains("compiles until it is given up"))
        .count();
    assert!(started > 0);
    assert_eq!(given_up(&s), started, "{:?}", s.logs());
}

#[test]
fn a_transfer_coding_other_than_chunked_is_refused_with_501() {
    let s = start(&flags(), &[]);
    let body = chat("Hi", 2).to_string();
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Transfer-Encoding: gzip, chunked\r\nConnection: close\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
        body.len()
    );
    let answer = raw(s.port, request.as_bytes());
    assert!(answer.starts_with("HTTP/1.1 501"), "{answer}");
    assert!(answer.contains("gzip"), "{answer}");
    // Plain chunked is read as before.
    let request = request.replace("gzip, chunked", "chunked");
    let answer = raw(s.port, request.as_bytes());
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[test]
fn sighup_drains_and_exits_0_as_sigterm_does() {
    let mut s = start(&flags(), &[]);
    let hup = std::process::Command::new("kill")
        .args(["-HUP", &s.child.id().to_string()])
        .status()
        .unwrap();
    assert!(hup.success());
    let status = s
        .wait(Duration::from_secs(30))
        .expect("the server did not exit");
    assert!(status.success(), "{status:?}: {:?}", s.logs());
    let logs = s.logs().join("\n");
    assert!(
        logs.contains("SIGHUP") && logs.contains("stopped"),
        "{logs}"
    );
}
