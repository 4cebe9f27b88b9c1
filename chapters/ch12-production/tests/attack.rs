//! The production server under attack, from loopback: connections that send nothing, a flood
//! of connections, bodies that lie about their size or are too large to be a prompt the
//! model can run, and requests a browser could be tricked into sending. Each attack must be
//! refused by the limit meant for it, and the server must go on serving.

mod common;

use common::{DEADLINE_SLACK, SETTLE, chat, flags, start, wait_until};
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

fn with(extra: &[&str]) -> Vec<String> {
    let mut f = flags();
    f.extend(extra.iter().map(|s| s.to_string()));
    f
}

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
    c.set_read_timeout(Some(SETTLE)).unwrap();
    c.write_all(request).unwrap();
    let mut answer = Vec::new();
    let _ = c.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).into_owned()
}

const HEALTH: &[u8] = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";

#[test]
fn connections_that_send_nothing_or_stop_early_are_closed_at_their_deadline() {
    let (first, idle) = (Duration::from_secs(2), Duration::from_secs(1));
    let s = start(
        &with(&["--header-timeout", "2", "--idle-timeout", "1"]),
        &[],
    );
    // Silent; one byte; HTTP/2's preface alone; the preface and an empty SETTINGS frame.
    let preface: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let settings: &[u8] = &[0, 0, 0, 4, 0, 0, 0, 0, 0];
    let opened = Instant::now();
    let mut conns = Vec::new();
    for what in [&b""[..], b"P", preface, &[preface, settings].concat()] {
        for _ in 0..8 {
            let mut c = connect(s.port);
            c.write_all(what).unwrap();
            conns.push(c);
        }
    }
    // Each is closed at its deadline: not before it (each opened after `opened`), and not
    // long after.
    for c in &mut conns {
        let left = (first + DEADLINE_SLACK).saturating_sub(opened.elapsed());
        assert!(
            closed_within(c, left.max(Duration::from_millis(1))),
            "a connection is still open {:?} after it opened",
            opened.elapsed()
        );
        assert!(
            opened.elapsed() >= first,
            "closed after {:?}",
            opened.elapsed()
        );
    }

    // A keep-alive connection after its answer: closed once idle for the limit. The server's
    // idle clock starts when its answer ends, after the request was sent: so the limit is
    // measured from the send.
    let mut c = connect(s.port);
    let sent = Instant::now();
    c.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut buf = [0u8; 4096];
    c.set_read_timeout(Some(SETTLE)).unwrap();
    let n = c.read(&mut buf).unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    assert!(closed_within(&mut c, idle + DEADLINE_SLACK));
    assert!(sent.elapsed() >= idle, "closed after {:?}", sent.elapsed());

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
    // Hold every place with connections that send nothing. The server accepts connections
    // in the order they were made, so every later one finds the places taken.
    let holders: Vec<TcpStream> = (0..CAP).map(|_| connect(s.port)).collect();
    // A probe still answers, on a connection of its own past the cap.
    let health = raw(s.port, HEALTH);
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
    // silent one, which is closed, so the flood cannot keep a probe out (the newest keep
    // their places until the probes' deadline, 2 s).
    let mut flood: Vec<TcpStream> = (0..64).map(|_| connect(s.port)).collect();
    let health = raw(s.port, HEALTH);
    assert!(
        health.starts_with("HTTP/1.1 200"),
        "during the flood: {health}"
    );
    let deadline = ch12::serve::PROBE_DEADLINE + DEADLINE_SLACK;
    for (i, c) in flood.iter_mut().enumerate() {
        assert!(
            closed_within(c, deadline),
            "flood connection {i} still open"
        );
    }
    drop(flood);
    let health = raw(s.port, HEALTH);
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    wait_until("the cap logged", || s.logged("connection cap reached"));
    // Places come back when connections close: once the server has seen the holders go,
    // work is served again.
    drop(holders);
    wait_until("a place back", || s.get("/v1/models").status() == 200);
    let r = s.ok("/v1/chat/completions", &chat("Hi", 2));
    assert_eq!(r["usage"]["completion_tokens"], 2);
}

#[test]
fn headers_alone_refuse_a_lying_length_a_missing_host_and_a_body_that_is_not_json() {
    // A body may take an hour: a server that waited for one would not answer within the test.
    let s = start(&with(&["--body-timeout", "3600"]), &[]);
    // A declared length of 100 MB with one byte sent, and the rest never: 413, from the
    // headers alone.
    let answer = raw(
        s.port,
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
          Content-Length: 100000000\r\n\r\n{",
    );
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");

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
            "--fault-injection",
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
    // goes on. Alice's first is held at its first token until she leaves.
    let stream = s
        .client
        .post(s.url("/v1/completions"))
        .bearer_auth("sk-alice")
        .header("x-fault", "hold-until-close")
        .json(
            &json!({"prompt": "Once upon a time", "max_tokens": 100, "temperature": 0,
                      "stream": true}),
        )
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

/// A stalled completion sent on a raw connection, which the test drops to leave.
fn leaving(port: u16) -> TcpStream {
    let body = stalled().to_string();
    let mut c = connect(port);
    let request = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    c.write_all(request.as_bytes()).unwrap();
    c
}

// ANCHOR: stalled_compiles
#[test]
fn a_compiling_request_holds_its_place_and_is_given_up_by_its_client_and_its_time() {
    // One running and one waiting: two places in all. A request's time is 3 s.
    const TIME_LIMIT: Duration = Duration::from_secs(3);
    let s = start(
        &with(&[
            "--fault-injection",
            "--parallel",
            "1",
            "--queue",
            "1",
            "--timeout",
            &TIME_LIMIT.as_secs().to_string(),
        ]),
        &[],
    );
    // Two compile until their clients leave.
    let mut clients = vec![leaving(s.port), leaving(s.port)];
    wait_until("two requests compiling", || in_flight(&s) == 2.0);
    // Compiling, they hold both places: a third request is refused at once.
    let r = s.post("/v1/chat/completions", &chat("Hi", 4));
    let status = r.status();
    let e: Value = r.json().unwrap();
    assert_eq!(status, 503, "{e}: {:?}", s.logs());
    assert_eq!(e["error"]["code"], "server_busy", "{e}");
    // The probes answer: compiles run off the threads that serve HTTP (two compiles on them
    // would keep this from being answered at all).
    assert_eq!(s.get("/health").status(), 200);
    // ANCHOR_END: stalled_compiles
    // ANCHOR: stalled_compiles_given_up
    // A client that leaves gives its place back, and its compile stops.
    for n in [1, 2] {
        drop(clients.pop());
        wait_until("a compile given up", || given_up(&s) == n);
        wait_until("its place given back", || in_flight(&s) == 2.0 - n as f64);
    }
    // One that stays is given up at its time limit (not before it, nor long after), with a
    // 503 that says so.
    let sent = Instant::now();
    let r = s.post("/v1/completions", &stalled());
    let waited = sent.elapsed();
    let (status, e) = (r.status().as_u16(), r.json::<Value>().unwrap());
    assert_eq!(
        (status, e["error"]["code"].as_str()),
        (503, Some("timeout"))
    );
    assert!(
        waited >= TIME_LIMIT && waited < TIME_LIMIT + DEADLINE_SLACK,
        "{waited:?}"
    );
    wait_until("the third compile given up", || given_up(&s) == 3);
    wait_until("every place given back", || in_flight(&s) == 0.0);
    // And the server goes on.
    let a = s.ok("/v1/chat/completions", &chat("Hi", 4));
    assert!(a["usage"]["completion_tokens"].as_u64().unwrap() > 0);
}
// ANCHOR_END: stalled_compiles_given_up

#[test]
fn sigterm_while_requests_compile_answers_them_503_and_exits_without_waiting_for_them() {
    // A drain limit of a day: a server that waited for the compiles would not exit within
    // the test.
    let mut s = start(
        &with(&["--fault-injection", "--drain-timeout", "86400"]),
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
    // With nothing left in flight the drain ends, and the process exits 0.
    let status = s.wait(SETTLE).expect("the server did not exit");
    assert!(status.success(), "{status:?}: {:?}", s.logs());
    assert!(
        s.logged("drained: every request finished"),
        "{:?}",
        s.logs()
    );
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
    let status = s.wait(SETTLE).expect("the server did not exit");
    assert!(status.success(), "{status:?}: {:?}", s.logs());
    let logs = s.logs().join("\n");
    assert!(
        logs.contains("SIGHUP") && logs.contains("stopped"),
        "{logs}"
    );
}
