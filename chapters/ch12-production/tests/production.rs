//! The production server from outside: the `ch12` binary over loopback, as an orchestrator,
//! Prometheus and clients meet it.

mod common;

use common::{DEADLINE_SLACK, SETTLE, Stream, chat, flags, start, wait_until};
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

fn with(extra: &[&str]) -> Vec<String> {
    let mut f = flags();
    f.extend(extra.iter().map(|s| s.to_string()));
    f
}

#[test]
fn metrics_move_as_requests_are_served_and_parse_as_prometheus_text() {
    let s = start(&flags(), &[]);
    let before = s.metrics();
    assert!(before.sum("llmrs_model_load_seconds", &[("variant", "a")]) > 0.0);
    for (name, kind) in [
        ("llmrs_requests_total", "counter"),
        ("llmrs_time_to_first_token_seconds", "histogram"),
        ("llmrs_inter_token_latency_seconds", "histogram"),
        ("llmrs_queue_depth", "gauge"),
        ("llmrs_kv_blocks", "gauge"),
    ] {
        assert!(
            before.types.contains(&(name.to_string(), kind.to_string())),
            "{name} is not a {kind}"
        );
    }

    let a = s.ok("/v1/chat/completions", &chat("Name a colour.", 12));
    let mut streamed = chat("Name a fruit.", 12);
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let r = s.post("/v1/chat/completions", &streamed);
    let stream = Stream::open(r);
    let mut usage = Value::Null;
    while let Some(d) = stream.next(SETTLE) {
        if d != "[DONE]" {
            let v: Value = serde_json::from_str(&d).unwrap();
            if !v["usage"].is_null() {
                usage = v["usage"].clone();
            }
        }
    }
    let b_tokens = usage["completion_tokens"].as_f64().unwrap();
    let a_tokens = a["usage"]["completion_tokens"].as_f64().unwrap();
    let prompts =
        a["usage"]["prompt_tokens"].as_f64().unwrap() + usage["prompt_tokens"].as_f64().unwrap();

    let m = s.metrics();
    let ok = [
        ("endpoint", "/v1/chat/completions"),
        ("status", "200"),
        ("variant", "a"),
    ];
    assert_eq!(m.sum("llmrs_requests_total", &ok), 2.0);
    let v = [("variant", "a")];
    assert_eq!(
        m.sum("llmrs_generated_tokens_total", &v),
        a_tokens + b_tokens
    );
    assert_eq!(m.sum("llmrs_prompt_tokens_total", &v), prompts);
    assert_eq!(m.sum("llmrs_time_to_first_token_seconds_count", &v), 2.0);
    assert_eq!(
        m.sum("llmrs_inter_token_latency_seconds_count", &v),
        a_tokens + b_tokens - 2.0
    );
    assert!(m.sum("llmrs_batch_tokens_count", &v) >= a_tokens.max(b_tokens));
    assert!(m.sum("llmrs_step_duration_seconds_sum", &v) > 0.0);
    // The blocks are all accounted for, and nothing runs now. The gauges are set after the
    // engine step that sent the last token, which may end just after the client has read it:
    // wait for the server to say so.
    let mut m = m;
    wait_until("no blocks used", || {
        m = s.metrics();
        m.sum("llmrs_kv_blocks", &[("state", "used")]) == 0.0
    });
    assert!(m.sum("llmrs_kv_blocks", &v) > 0.0);
    assert_eq!(m.sum("llmrs_running_sequences", &v), 0.0);
    assert_eq!(m.sum("llmrs_queue_depth", &v), 0.0);
    // The second prompt shares the template's system prompt with the first.
    assert!(m.sum("llmrs_prefix_cache_hit_ratio", &v) > 0.0);
    // A 404 is counted under `other`, never under the path the client made up.
    assert_eq!(s.get("/made/up").status(), 404);
    let m = s.metrics();
    assert_eq!(
        m.sum(
            "llmrs_requests_total",
            &[("endpoint", "other"), ("status", "404")]
        ),
        1.0
    );
    assert!(
        !m.samples
            .iter()
            .any(|(_, l, _)| l.iter().any(|(_, v)| v == "/made/up"))
    );
}

#[test]
fn request_ids_round_trip_and_name_the_log_lines() {
    let s = start(&with(&["--log-format", "json"]), &[]);
    let send = |id: Option<&str>| {
        let mut r = s
            .client
            .post(s.url("/v1/completions"))
            .json(&json!({"prompt": "Hello", "max_tokens": 3, "temperature": 0}));
        if let Some(id) = id {
            r = r.header("x-request-id", id);
        }
        let r = r.send().unwrap();
        assert_eq!(r.status(), 200);
        // The request layer leaves a whole response whole: its length is known up front.
        assert!(
            r.headers().contains_key("content-length"),
            "{:?}",
            r.headers()
        );
        r.headers()["x-request-id"].to_str().unwrap().to_string()
    };
    assert_eq!(send(Some("trace-42.a:b")), "trace-42.a:b");
    let fresh = send(None);
    assert!(fresh.len() == 16 && fresh.bytes().all(|b| b.is_ascii_hexdigit()));
    let long = "x".repeat(200);
    for bad in [long.as_str(), "a b", "<script>"] {
        let got = send(Some(bad));
        assert!(
            got != bad && got.len() == 16,
            "{bad:?} came back as {got:?}"
        );
    }
    // Every log line is a JSON object; the request's lines carry its id. Each line is written
    // before its response is sent, and reaches this test through a pipe: wait for the five
    // requests' lines.
    wait_until("the five requests' lines", || {
        let answered = |l: &&String| {
            l.contains(r#""message":"answered""#) && l.contains(r#""path":"/v1/completions""#)
        };
        s.logs().iter().filter(answered).count() == 5
    });
    let logs = s.logs();
    let lines: Vec<Value> = logs
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let answered = lines
        .iter()
        .find(|l| l["fields"]["message"] == "answered" && l["span"]["id"] == "trace-42.a:b");
    assert!(answered.is_some(), "{logs:?}");
    assert_eq!(answered.unwrap()["fields"]["status"], 200);
    let generated = lines.iter().find(|l| {
        l["fields"]["message"] == "generated" && l["fields"]["request_id"] == "trace-42.a:b"
    });
    assert_eq!(
        generated.expect("the engine's line")["fields"]["completion_tokens"],
        3
    );
}

// ANCHOR: sigterm_test
#[test]
fn sigterm_during_8_streams_drains_and_exits_0_within_the_limit() {
    /// The drain limit of this test. Four short streams are held at their first token until
    /// the drain begins: then they need fewer than `SHORT` steps of eight sequences, a
    /// fraction of a second on two idle cores; 10 s leaves room for a machine shared with
    /// another test run. Four long ones are held until the server ends them at the limit:
    /// they take a step only with a request that is not held — each later one's first, the
    /// short ones' after the signal — fewer than 8 + `SHORT` in all, so `LONG` tokens are
    /// out of their reach however fast the machine (and within it, were they not held).
    const DRAIN: u64 = 10;
    const SHORT: usize = 16;
    const LONG: usize = 64;
    let mut s = start(
        &with(&[
            "--fault-injection",
            "--parallel",
            "8",
            "--drain-timeout",
            &DRAIN.to_string(),
        ]),
        &[],
    );
    // The long ones first: each later request's first step moves the earlier ones on a token.
    let streams: Vec<(usize, Stream)> = (0..8)
        .map(|i| {
            let (n, hold) = if i < 4 {
                (LONG, "hold-until-close")
            } else {
                (SHORT, "hold-until-drain")
            };
            // Counting: a greedy model goes on counting, it does not stop by itself.
            let prompt = format!("{}, {}, {}, {},", i, i + 1, i + 2, i + 3);
            let body = json!({"prompt": prompt, "max_tokens": n, "temperature": 0, "stream": true});
            let r = s
                .client
                .post(s.url("/v1/completions"))
                .header("x-fault", hold);
            (n, Stream::open(r.json(&body).send().unwrap()))
        })
        .collect();
    // Every stream has started (it has sent a token) and is held: all eight are in flight,
    // and stay so until the signal.
    for (_, st) in &streams {
        assert!(st.next(SETTLE).is_some());
    }
    let in_flight = s.metrics().sum("llmrs_in_flight_requests", &[]);
    assert_eq!(in_flight, 8.0);
    let signalled = Instant::now();
    s.terminate();
    // ANCHOR_END: sigterm_test
    // ANCHOR: sigterm_checks
    // Each stream ends with [DONE]: the short ones, let go by the drain, after their finish
    // reason; the long ones, ended at the drain limit (not before it) short of their tokens,
    // after a `shutting_down` error (their text is cut short: a finish reason would say
    // otherwise).
    // All by the drain limit, give or take a busy machine's delay: one deadline for all eight,
    // so that a server that does not end them fails the test once, not once per stream.
    let by = signalled + Duration::from_secs(DRAIN) + SETTLE;
    for (n, st) in &streams {
        let (mut finish, mut error, mut done) = (None, None, false);
        while let Some(d) = st.next(by.saturating_duration_since(Instant::now())) {
            assert!(!done, "an event after [DONE]: {d}");
            if d == "[DONE]" {
                done = true;
                continue;
            }
            let v: Value = serde_json::from_str(&d).unwrap();
            if let Some(code) = v["error"]["code"].as_str() {
                error = Some(code.to_string());
                assert!(signalled.elapsed() >= Duration::from_secs(DRAIN));
            }
            if let Some(f) = v["choices"][0]["finish_reason"].as_str() {
                finish = Some(f.to_string());
            }
        }
        assert!(done, "a stream of {n} ended without [DONE]");
        if *n == LONG {
            assert_eq!((finish, error.as_deref()), (None, Some("shutting_down")));
        } else {
            assert_eq!((finish.as_deref(), error), (Some("length"), None));
        }
    }
    // The process exits 0 once the final events are out, within the 2 s it promises past
    // the drain limit (FLUSH_GRACE and the runtime's), give or take a busy machine's delay.
    let promised = Duration::from_secs(DRAIN + 2);
    let status = s.wait(promised + SETTLE).expect("the server did not exit");
    assert!(status.success(), "{status:?}: {:?}", s.logs());
    let took = signalled.elapsed();
    assert!(took < promised + DEADLINE_SLACK, "{took:?}");
    // In this order, and every final event reached its client within the grace.
    let line = |text| {
        s.log_line(text)
            .unwrap_or_else(|| panic!("{text}: {:?}", s.logs()))
    };
    let (drain, limit) = (line("shutting down"), line("drain limit reached"));
    assert!(drain < limit && limit < line("stopped"));
    assert!(!s.logged("connections still open"), "{:?}", s.logs());
    // Nothing listens any more.
    assert!(TcpStream::connect(("127.0.0.1", s.port)).is_err());
}
// ANCHOR_END: sigterm_checks

#[test]
fn sigterm_with_nothing_in_flight_exits_0_at_once() {
    // A drain limit of a day: a server that waited for it would not exit within the test.
    let mut s = start(&with(&["--drain-timeout", "86400"]), &[]);
    s.ok("/v1/completions", &json!({"prompt": "Hi", "max_tokens": 2}));
    s.terminate();
    let status = s.wait(SETTLE).expect("the server did not exit");
    assert!(status.success());
    assert!(
        s.logged("drained: every request finished"),
        "{:?}",
        s.logs()
    );
    assert!(!s.logged("drain limit reached"), "{:?}", s.logs());
}

#[test]
fn an_injected_panic_fails_its_request_with_500_and_the_next_succeeds() {
    let s = start(&with(&["--fault-injection"]), &[]);
    for fault in ["panic-in-step", "panic-in-handler"] {
        let r = s
            .client
            .post(s.url("/v1/chat/completions"))
            .header("x-fault", fault)
            .json(&chat("Hello", 8))
            .send()
            .unwrap();
        assert_eq!(r.status(), 500, "{fault}");
        let body: Value = r.json().unwrap();
        assert_eq!(body["error"]["type"], "server_error", "{body}");
        let next = s.ok("/v1/chat/completions", &chat("Hello", 8));
        assert_eq!(next["usage"]["completion_tokens"], 8);
    }
    let m = s.metrics();
    assert_eq!(m.sum("llmrs_engine_failures_total", &[]), 1.0);
    assert_eq!(m.sum("llmrs_requests_total", &[("status", "500")]), 2.0);
    assert_eq!(s.get("/health").status(), 200);

    // Without the switch, the header does nothing.
    let plain = start(&flags(), &[]);
    let r = plain
        .client
        .post(plain.url("/v1/chat/completions"))
        .header("x-fault", "panic-in-step")
        .json(&chat("Hello", 4))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[test]
fn a_dead_engine_thread_makes_the_process_exit_non_zero() {
    let mut s = start(&with(&["--fault-injection"]), &[]);
    let _ = s
        .client
        .post(s.url("/v1/completions"))
        .header("x-fault", "kill-engine")
        .json(&json!({"prompt": "Hello", "max_tokens": 4}))
        .send();
    let status = s.wait(SETTLE).expect("the server went on");
    assert_eq!(status.code(), Some(ch12::EXIT_ENGINE_DIED));
}

#[test]
fn malformed_oversized_and_slow_requests_get_their_answer_and_the_server_goes_on() {
    let s = start(
        &with(&[
            "--body-limit",
            "4096",
            "--header-timeout",
            "1",
            "--body-timeout",
            "1",
        ]),
        &[],
    );
    let raw = |body: &str| {
        s.client
            .post(s.url("/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .unwrap()
    };
    assert_eq!(raw("{\"messages\": [").status(), 400);
    assert_eq!(raw(&" ".repeat(5000)).status(), 413);

    // Headers that never end: the connection is closed at the header limit (1 s), neither
    // before it nor much after.
    let limit = Duration::from_secs(1);
    let started = Instant::now();
    let mut slow = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    slow.set_read_timeout(Some(SETTLE)).unwrap();
    slow.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let mut buf = Vec::new();
    let closed = slow.read_to_end(&mut buf);
    let waited = started.elapsed();
    let timed_out = |e: &std::io::Error| {
        matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        )
    };
    assert!(
        !closed.as_ref().is_err_and(timed_out),
        "still open after {waited:?}"
    );
    assert!(
        waited >= limit && waited < limit + DEADLINE_SLACK,
        "{waited:?}"
    );

    // A body that never ends: 408 at the body limit (1 s).
    let started = Instant::now();
    let mut slow = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    slow.set_read_timeout(Some(SETTLE)).unwrap();
    slow.write_all(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
          Content-Length: 100\r\n\r\n{\"prompt\": ",
    )
    .unwrap();
    let mut answer = String::new();
    let _ = slow.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    let waited = started.elapsed();
    assert!(
        waited >= limit && waited < limit + DEADLINE_SLACK,
        "{waited:?}"
    );

    let r = s.ok("/v1/completions", &json!({"prompt": "Hi", "max_tokens": 2}));
    assert_eq!(r["usage"]["completion_tokens"], 2);
}

#[test]
fn ready_and_health_say_what_an_orchestrator_needs() {
    let s = start(&flags(), &[]);
    let ready: Value = s.get("/ready").json().unwrap();
    assert_eq!(ready["status"], "ready");
    assert_eq!(ready["variants"]["a"]["scheduler"]["running"], 0);
    let health: Value = s.get("/health").json().unwrap();
    assert_eq!(health["status"], "ok");
}

#[test]
fn ab_routes_by_name_and_by_share_and_counts_per_variant() {
    let model = common::model();
    let s = start(
        &with(&[
            "--model-b",
            &model,
            "--alias-b",
            "smol-b",
            "--split-b",
            "0.5",
            "--parallel",
            "2",
        ]),
        &[],
    );
    let models: Value = s.get("/v1/models").json().unwrap();
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 2);
    assert_eq!(ids[1], "smol-b");

    let ask = |id: &str, model: Option<&str>| {
        let mut body = json!({"prompt": "Hi", "max_tokens": 2, "temperature": 0});
        if let Some(m) = model {
            body["model"] = json!(m);
        }
        let r = s
            .client
            .post(s.url("/v1/completions"))
            .header("x-request-id", id)
            .json(&body)
            .send()
            .unwrap();
        let status = r.status().as_u16();
        let v: Value = r.json().unwrap();
        (status, v)
    };
    // By name.
    for (name, _) in [(ids[0], "a"), ("smol-b", "b")] {
        let (status, v) = ask(&format!("named-{name}"), Some(name));
        assert_eq!((status, v["model"].as_str()), (200, Some(name)));
    }
    let (status, v) = ask("unknown", Some("gpt-9"));
    assert_eq!(status, 404);
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains(ids[0]) && msg.contains("smol-b"), "{msg}");
    // By share: both variants get some of 16 requests; the same id always the same one.
    let mut to_b = 0;
    for i in 0..16 {
        let id = format!("split-{i}");
        let (_, first) = ask(&id, None);
        let (_, again) = ask(&id, None);
        assert_eq!(first["model"], again["model"], "{id}");
        to_b += usize::from(first["model"] == "smol-b");
    }
    assert!((2..=14).contains(&to_b), "{to_b} of 16 went to b");
    let m = s.metrics();
    let count = |v: &str| m.sum("llmrs_requests_total", &[("variant", v), ("status", "200")]);
    assert_eq!(count("a"), (1 + 2 * (16 - to_b)) as f64);
    assert_eq!(count("b"), (1 + 2 * to_b) as f64);
    assert!(m.sum("llmrs_generated_tokens_total", &[("variant", "b")]) > 0.0);
}

#[test]
fn configuration_comes_from_flags_environment_and_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("server.toml");
    std::fs::write(&file, "parallel = 3\nalias = \"from-file\"\nqueue = 5\n").unwrap();
    let file = file.to_str().unwrap().to_string();
    let s = start(
        &with(&["--config", &file, "--queue", "7"]),
        &[("LLM_RS_ALIAS", "from-env")],
    );
    let models: Value = s.get("/v1/models").json().unwrap();
    let m = &models["data"][0];
    assert_eq!(m["id"], "from-env", "the environment beats the file");
    assert_eq!(m["meta"]["parallel"], 3, "the file beats the default");
    drop(s);

    // A bad file is refused before anything starts, naming the file and the key.
    std::fs::write(dir.path().join("bad.toml"), "paralel = 3\n").unwrap();
    let bad = dir.path().join("bad.toml");
    let out = std::process::Command::new(testkit::program(
        "ch12",
        testkit::Target::Example,
        "production",
        &[],
    ))
    .args(["--config", bad.to_str().unwrap()])
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("bad.toml") && err.contains("\"paralel\""),
        "{err}"
    );

    // --help names every variable.
    let help = std::process::Command::new(testkit::program(
        "ch12",
        testkit::Target::Example,
        "production",
        &[],
    ))
    .arg("--help")
    .output()
    .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for v in [
        "LLM_RS_PORT",
        "LLM_RS_DRAIN_TIMEOUT",
        "LLM_RS_CONFIG",
        "LLM_RS_MODEL_B",
    ] {
        assert!(help.contains(v), "{v} missing from --help");
    }
    assert!(
        !help.contains("--fault-injection"),
        "the test switch is hidden"
    );

    // Bad values of the new flags are refused by name.
    for (flag, value) in [("--split-b", "1.5"), ("--header-timeout", "0")] {
        let out = std::process::Command::new(testkit::program(
            "ch12",
            testkit::Target::Example,
            "production",
            &[],
        ))
        .args([flag, value])
        .output()
        .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(flag), "{err}");
    }
}

/// The `production` example run to its end with `args`: its exit code (`None`: a signal) and
/// standard error. One still running after [`common::START_TIMEOUT`] fails the test.
fn run_to_end(args: &[&str]) -> (Option<i32>, String) {
    let mut child = std::process::Command::new(testkit::program(
        "ch12",
        testkit::Target::Example,
        "production",
        &[],
    ))
    .args(args)
    .stdin(std::process::Stdio::null())
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > common::START_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{args:?} still ran: {}", reader.join().unwrap());
        }
        std::thread::sleep(common::POLL);
    };
    (status.code(), reader.join().unwrap())
}

#[test]
fn absurd_threads_and_a_key_given_twice_are_refused_before_anything_starts() {
    // Starting 100,000 threads would fail part way, and the process abort (134); it is a usage
    // error instead, naming the flag and the bound.
    let (code, err) = run_to_end(&["--threads", "100000", "--port", "0"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--threads 100000 is more than") && err.contains("per hardware thread"),
        "{err}"
    );
    // The same key twice would be two tenants for one key.
    let (code, err) = run_to_end(&["--api-key", "k1", "--api-key", "k1", "--port", "0"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("--api-key #1") && err.contains("--api-key #2") && err.contains("same key"),
        "{err}"
    );
}

#[test]
fn every_api_key_is_served_and_key_names_reach_metrics_only_when_asked() {
    let post = |s: &common::Server, key: &str| {
        s.client
            .post(s.url("/v1/chat/completions"))
            .bearer_auth(key)
            .json(&chat("Hi", 1))
            .send()
            .unwrap()
            .status()
    };
    // Two --api-key flags: both keys are let in, and /metrics counts them together.
    let s = start(&with(&["--api-key", "sk-one", "--api-key", "sk-two"]), &[]);
    assert_eq!(post(&s, "sk-one"), 200);
    assert_eq!(post(&s, "sk-two"), 200);
    assert_eq!(post(&s, "sk-three"), 401);
    // Anthropic's clients send their key as `x-api-key`.
    let x_api_key = |key: &str| {
        let r = s.client.post(s.url("/v1/chat/completions"));
        let r = r.header("x-api-key", key).json(&chat("Hi", 1));
        r.send().unwrap().status()
    };
    assert_eq!(x_api_key("sk-one"), 200);
    assert_eq!(x_api_key("sk-three"), 401);
    let m = s.get("/metrics").text().unwrap();
    assert!(
        m.contains(r#"llmrs_key_requests_total{key="all",status="ok"} 3"#),
        "{m}"
    );
    assert!(!m.contains("api-key-"), "a key's name is in /metrics:\n{m}");
    drop(s);

    // The same keys from a configuration file, with a series per name asked for.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("server.toml");
    std::fs::write(
        &file,
        "api-key = [\"sk-one\", \"sk-two\"]\nmetrics-per-key = true\n",
    )
    .unwrap();
    let s = start(&with(&["--config", file.to_str().unwrap()]), &[]);
    assert_eq!(post(&s, "sk-two"), 200);
    assert_eq!(post(&s, "sk-two"), 200);
    let m = s.get("/metrics").text().unwrap();
    assert!(
        m.contains(r#"llmrs_key_requests_total{key="api-key-2",status="ok"} 2"#),
        "{m}"
    );
    assert!(!m.contains("sk-two"), "a key is in /metrics");
}
