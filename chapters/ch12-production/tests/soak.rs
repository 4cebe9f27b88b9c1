//! The soak, as CI runs it: 60 seconds of mixed requests against the production server —
//! normal, streamed, cancelled, malformed, oversized, unknown, and hostile: silent connections,
//! lying lengths, wrong keys — and then the verdict: nothing lost, nothing failed, resident
//! memory grown by no more than a bound.

mod common;

use common::soak::{self, Config};
use common::{flags, start, wait_until};
use std::time::Duration;

/// How long CI soaks: long enough for thousands of requests of every kind, short enough for
/// its time budget. `scripts/soak` runs the same for longer.
const SOAK: Duration = Duration::from_secs(60);

/// The warm-up before the start's memory is read: the same mix, until the prefix cache's
/// blocks and the allocator's arenas have been through their first rounds.
const WARM_UP: Duration = Duration::from_secs(10);

/// Resident memory may grow this much from the end of the warm-up to the end of the soak.
/// After the warm-up the prefix cache's blocks and the allocator's per-thread arenas (each
/// runtime and blocking thread that tokenizes gets its own) still settle: `scripts/soak`'s
/// 180-second run went from 414 to 412 MiB, a shorter warm-up saw +23 MiB in the first
/// minute. A leak of 32 KiB per request — a response's worth — over the ~1,500 requests of a
/// minute (48 MiB) would exceed it.
const MAX_RSS_GROWTH_KIB: u64 = 32 * 1024;

/// The server's body limit in this test, so that the oversized requests are cheap to send.
const BODY_LIMIT: usize = 64 * 1024;

/// The server's header timeout in this test: each silent connection holds a client this long.
const HEADER_TIMEOUT: Duration = Duration::from_secs(2);

/// The server's API key in this test (from the environment, as a deployment gives it).
const API_KEY: &str = "sk-soak-test";

#[test]
fn a_minute_of_mixed_requests_loses_nothing_and_memory_stays_bounded() {
    let mut args = flags();
    args.extend(
        [
            "--parallel",
            "8",
            "--queue",
            "32",
            "--body-limit",
            &BODY_LIMIT.to_string(),
            "--header-timeout",
            &HEADER_TIMEOUT.as_secs().to_string(),
        ]
        .map(str::to_string),
    );
    // The per-request lines stay out of the test's memory; the "listening" line is needed.
    let s = start(
        &args,
        &[
            ("RUST_LOG", "warn,ch12=info,ch12::app=warn"),
            ("LLM_RS_API_KEY", API_KEY),
        ],
    );
    let config = |duration, max_requests| Config {
        base: s.base.clone(),
        clients: 8,
        duration,
        max_requests,
        body_limit: BODY_LIMIT,
        max_tokens: 16,
        api_key: API_KEY.into(),
        header_timeout: HEADER_TIMEOUT,
    };
    // Warm-up: every kind once or more, so that the start's memory is a working server's.
    let warm = soak::run(&config(WARM_UP, 1_000_000), |_| {});
    assert_eq!(
        (warm.total.failed, warm.total.lost),
        (0, 0),
        "{:?}",
        warm.problems
    );
    let rss_start = s.rss_kib();
    let report = soak::run(&config(SOAK, 1_000_000), |_| {});
    let rss_end = s.rss_kib();
    println!(
        "soak: {:.0} s, {} served, {} failed, {} lost; RSS {} KiB -> {} KiB; {:?}",
        report.seconds,
        report.total.served,
        report.total.failed,
        report.total.lost,
        rss_start,
        rss_end,
        report.by_kind
    );
    assert_eq!(report.total.lost, 0, "{:?}", report.problems);
    assert_eq!(report.total.failed, 0, "{:?}", report.problems);
    // Every kind of request met the server, and got its answer.
    for kind in soak::KINDS {
        let served = report.by_kind.get(kind).map_or(0, |t| t.served);
        assert!(served > 0, "no {kind} request was served: {report:?}");
    }
    assert!(
        rss_end <= rss_start + MAX_RSS_GROWTH_KIB,
        "RSS grew from {rss_start} KiB to {rss_end} KiB"
    );
    // After the soak the server comes to rest: nothing left running or holding blocks. (The
    // gauges are set after the step that sent a request's last token, and a dropped stream
    // leaves at the next step: each may come just after its client has gone.)
    wait_until("the server at rest", || {
        let m = s.metrics();
        m.sum("llmrs_running_sequences", &[]) == 0.0
            && m.sum("llmrs_in_flight_requests", &[]) == 0.0
            && m.sum("llmrs_kv_blocks", &[("state", "used")]) == 0.0
    });
}
