//! What the server counts, in Prometheus's text format at `GET /metrics`.
//!
//! Three kinds of numbers, each where it is cheapest to know:
//! - per HTTP request (the layer in front of the routes): requests by endpoint, status and
//!   variant, and how long they took;
//! - per token and per step (chapter 11's [`Observer`], called on the engine thread): time to
//!   first token, the gap between tokens, tokens in, out and from the prefix cache, the size and
//!   length of every step;
//! - the state now (read when Prometheus scrapes): requests waiting and running, KV blocks by
//!   use, the prefix cache's hit ratio.
//!
//! Names follow Prometheus's conventions: a `llmrs_` prefix, base units (`_seconds`), `_total`
//! on counters. Every series has a `variant` label, `a` or `b` (see [`crate::app`]).

use ch07::StepReport;
use ch11::AppState;
use ch11::worker::{Observer, Outcome, PoolStatus};
use prometheus::{
    Encoder, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGaugeVec, Opts, Registry, TextEncoder,
};
use std::time::Duration;

/// Buckets for the time to first token, in seconds: a prompt read in a few milliseconds, up to
/// a long wait in the queue.
const TTFT_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Buckets for the gap between two tokens of a request, in seconds: one decode step alone
/// (~5 ms for the default model on two cores) up to a step that also reads long prompts.
const ITL_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28,
];
/// Buckets for a step's tokens: powers of two up to the largest `--batch-tokens` in use.
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0];
/// Buckets for a whole request, in seconds.
const REQUEST_BUCKETS: &[f64] = &[
    0.001, 0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// Every metric the server exports.
pub struct Metrics {
    pub registry: Registry,
    requests: IntCounterVec,
    request_seconds: HistogramVec,
    prompt_tokens: IntCounterVec,
    cached_tokens: IntCounterVec,
    generated_tokens: IntCounterVec,
    draft_tokens: IntCounterVec,
    accepted_tokens: IntCounterVec,
    ttft: HistogramVec,
    itl: HistogramVec,
    step_seconds: HistogramVec,
    batch_tokens: HistogramVec,
    batch_sequences: HistogramVec,
    failures: IntCounterVec,
    queue_depth: IntGaugeVec,
    running: IntGaugeVec,
    in_flight: IntGaugeVec,
    kv_blocks: IntGaugeVec,
    hit_ratio: GaugeVec,
    load_seconds: GaugeVec,
}

fn histogram(name: &str, help: &str, buckets: &[f64], labels: &[&str]) -> HistogramVec {
    HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        labels,
    )
    .expect("a valid histogram")
}

fn counter(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    IntCounterVec::new(Opts::new(name, help), labels).expect("a valid counter")
}

fn gauge(name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    IntGaugeVec::new(Opts::new(name, help), labels).expect("a valid gauge")
}

impl Metrics {
    pub fn new() -> Metrics {
        let v = &["variant"];
        let m = Metrics {
            registry: Registry::new(),
            requests: counter(
                "llmrs_requests_total",
                "HTTP requests answered, by endpoint, status code and variant.",
                &["endpoint", "status", "variant"],
            ),
            request_seconds: histogram(
                "llmrs_request_duration_seconds",
                "Time from a request's arrival to the end of its response (streams included).",
                REQUEST_BUCKETS,
                &["endpoint", "variant"],
            ),
            prompt_tokens: counter(
                "llmrs_prompt_tokens_total",
                "Prompt tokens of finished requests.",
                v,
            ),
            cached_tokens: counter(
                "llmrs_prompt_tokens_cached_total",
                "Prompt tokens of finished requests read from the prefix cache instead of computed.",
                v,
            ),
            generated_tokens: counter("llmrs_generated_tokens_total", "Tokens generated.", v),
            draft_tokens: counter(
                "llmrs_spec_draft_tokens_total",
                "Tokens fed ahead of decode tokens (speculative decoding, predicted outputs) and checked by the model.",
                v,
            ),
            accepted_tokens: counter(
                "llmrs_spec_accepted_tokens_total",
                "Tokens fed ahead that the model agreed with (each generated without a step).",
                v,
            ),
            ttft: histogram(
                "llmrs_time_to_first_token_seconds",
                "Time from a request reaching the engine to its first generated token.",
                TTFT_BUCKETS,
                v,
            ),
            itl: histogram(
                "llmrs_inter_token_latency_seconds",
                "Time between two consecutive tokens of a request.",
                ITL_BUCKETS,
                v,
            ),
            step_seconds: histogram(
                "llmrs_step_duration_seconds",
                "Time of one scheduler step (one forward pass of the batch).",
                ITL_BUCKETS,
                v,
            ),
            batch_tokens: histogram(
                "llmrs_batch_tokens",
                "Tokens in one step's batch: decodes and prompt chunks together.",
                BATCH_BUCKETS,
                v,
            ),
            batch_sequences: histogram(
                "llmrs_batch_sequences",
                "Sequences in one step's batch.",
                BATCH_BUCKETS,
                v,
            ),
            failures: counter(
                "llmrs_engine_failures_total",
                "Requests failed by a failed or panicking step.",
                v,
            ),
            queue_depth: gauge(
                "llmrs_queue_depth",
                "Requests waiting for a sequence slot.",
                v,
            ),
            running: gauge(
                "llmrs_running_sequences",
                "Requests holding a sequence slot.",
                v,
            ),
            in_flight: gauge(
                "llmrs_in_flight_requests",
                "Requests holding a place in the server: tokenizing, waiting, running or streaming.",
                v,
            ),
            kv_blocks: gauge(
                "llmrs_kv_blocks",
                "KV-cache blocks: used by running sequences, held only by the prefix cache, free.",
                &["variant", "state"],
            ),
            hit_ratio: GaugeVec::new(
                Opts::new(
                    "llmrs_prefix_cache_hit_ratio",
                    "Share of finished requests' prompt tokens read from the prefix cache.",
                ),
                v,
            )
            .expect("a valid gauge"),
            load_seconds: GaugeVec::new(
                Opts::new(
                    "llmrs_model_load_seconds",
                    "Time taken to load the model and start its engine.",
                ),
                v,
            )
            .expect("a valid gauge"),
        };
        let all: Vec<Box<dyn prometheus::core::Collector>> = vec![
            Box::new(m.requests.clone()),
            Box::new(m.request_seconds.clone()),
            Box::new(m.prompt_tokens.clone()),
            Box::new(m.cached_tokens.clone()),
            Box::new(m.generated_tokens.clone()),
            Box::new(m.draft_tokens.clone()),
            Box::new(m.accepted_tokens.clone()),
            Box::new(m.ttft.clone()),
            Box::new(m.itl.clone()),
            Box::new(m.step_seconds.clone()),
            Box::new(m.batch_tokens.clone()),
            Box::new(m.batch_sequences.clone()),
            Box::new(m.failures.clone()),
            Box::new(m.queue_depth.clone()),
            Box::new(m.running.clone()),
            Box::new(m.in_flight.clone()),
            Box::new(m.kv_blocks.clone()),
            Box::new(m.hit_ratio.clone()),
            Box::new(m.load_seconds.clone()),
        ];
        for c in all {
            m.registry.register(c).expect("distinct metric names");
        }
        m
    }

    /// An HTTP request answered.
    pub fn request(&self, endpoint: &str, status: u16, variant: &str, took: Duration) {
        self.requests
            .with_label_values(&[endpoint, &status.to_string(), variant])
            .inc();
        self.request_seconds
            .with_label_values(&[endpoint, variant])
            .observe(took.as_secs_f64());
    }

    pub fn model_loaded(&self, variant: &str, took: Duration) {
        self.load_seconds
            .with_label_values(&[variant])
            .set(took.as_secs_f64());
    }

    /// The observer for `variant`'s engine thread, with its series resolved once.
    pub fn observer(&self, variant: &str) -> EngineMetrics {
        let v = &[variant];
        EngineMetrics {
            prompt_tokens: self.prompt_tokens.with_label_values(v),
            cached_tokens: self.cached_tokens.with_label_values(v),
            generated_tokens: self.generated_tokens.with_label_values(v),
            draft_tokens: self.draft_tokens.with_label_values(v),
            accepted_tokens: self.accepted_tokens.with_label_values(v),
            ttft: self.ttft.with_label_values(v),
            itl: self.itl.with_label_values(v),
            step_seconds: self.step_seconds.with_label_values(v),
            batch_tokens: self.batch_tokens.with_label_values(v),
            batch_sequences: self.batch_sequences.with_label_values(v),
            failures: self.failures.with_label_values(v),
        }
    }

    /// Set the gauges of the state now from `variant`'s server.
    pub fn sample(&self, variant: &str, state: &AppState) {
        let v = &[variant];
        self.in_flight
            .with_label_values(v)
            .set(state.in_flight() as i64);
        let Some(l) = state.loaded.get() else { return };
        let s: PoolStatus = l.worker.status();
        self.queue_depth.with_label_values(v).set(s.waiting as i64);
        self.running.with_label_values(v).set(s.running as i64);
        let held = s.kv_blocks.saturating_sub(s.kv_blocks_free);
        let cached_only = held.saturating_sub(s.sequence_blocks);
        for (state, n) in [
            ("used", s.sequence_blocks),
            ("cached", cached_only),
            ("free", s.kv_blocks_free),
        ] {
            self.kv_blocks
                .with_label_values(&[variant, state])
                .set(n as i64);
        }
        let prompt = self.prompt_tokens.with_label_values(v).get();
        let cached = self.cached_tokens.with_label_values(v).get();
        if prompt > 0 {
            self.hit_ratio
                .with_label_values(v)
                .set(cached as f64 / prompt as f64);
        }
    }

    /// Everything, as Prometheus text.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("text encoding of valid metrics");
        String::from_utf8(out).expect("Prometheus text is UTF-8")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

// ANCHOR: observer
/// One variant's engine metrics: chapter 11's [`Observer`], called on its engine thread.
pub struct EngineMetrics {
    prompt_tokens: IntCounter,
    cached_tokens: IntCounter,
    generated_tokens: IntCounter,
    draft_tokens: IntCounter,
    accepted_tokens: IntCounter,
    ttft: Histogram,
    itl: Histogram,
    step_seconds: Histogram,
    batch_tokens: Histogram,
    batch_sequences: Histogram,
    failures: IntCounter,
}

impl Observer for EngineMetrics {
    fn step(&self, report: &StepReport, took: Duration, _status: &PoolStatus) {
        self.step_seconds.observe(took.as_secs_f64());
        self.batch_tokens.observe(report.n_tokens as f64);
        self.batch_sequences.observe(report.n_seqs as f64);
        self.draft_tokens.inc_by(report.fed_ahead as u64);
        self.accepted_tokens.inc_by(report.kept_ahead as u64);
    }

    fn token(&self, _label: &str, first: bool, gap: Duration) {
        self.generated_tokens.inc();
        if first {
            self.ttft.observe(gap.as_secs_f64());
        } else {
            self.itl.observe(gap.as_secs_f64());
        }
    }

    fn done(&self, _label: &str, o: &Outcome) {
        self.prompt_tokens.inc_by(o.prompt_tokens as u64);
        self.cached_tokens.inc_by(o.cached_tokens as u64);
    }

    fn failed(&self, _label: &str, _message: &str) {
        self.failures.inc();
    }
}
// ANCHOR_END: observer
