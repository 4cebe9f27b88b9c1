//! Speculation served: `llm-rs serve --spec ngram` on 127.0.0.1, at a port the system picks.
//! Requests that guess and requests that do not (`"speculative.n_max": 0`) run at once, in
//! the same continuous batch; each pair gets the same text, greedy and sampled with a seed.
//! The guesses that held are in each response's `usage` and in the metrics.

use reqwest::blocking::Client;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// The server loads the model before it is ready; on a busy machine that may take a while.
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// Every request ends within this (a few seconds here): a hung server fails the test.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(120);
/// Tokens per request: long enough for the copying prompts to copy.
const TOKENS: u64 = 40;
/// Guesses that held, over all the requests that guess: the copying prompts copy tens of
/// tokens each, so an identity test that accepted fewer would prove little.
const MIN_ACCEPTED: u64 = 10;

/// Prompts: two that copy from themselves, one that does not.
const PROMPTS: [&str; 3] = [
    "Repeat the list: red, orange, yellow, green, blue, indigo, violet. The list again: red,",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    "Once upon a time, in a small village by the sea,",
];

fn completion(client: &Client, base: &str, body: &Value) -> Value {
    let r = client
        .post(format!("{base}/v1/completions"))
        .json(body)
        .send()
        .unwrap_or_else(|e| panic!("POST {body}: {e}"));
    assert_eq!(r.status(), 200, "{body}");
    r.json().unwrap()
}

/// The sum of a counter's series in `/metrics`.
fn counter(client: &Client, base: &str, name: &str) -> u64 {
    let text = client
        .get(format!("{base}/metrics"))
        .send()
        .unwrap()
        .text()
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[test]
fn guessing_and_plain_requests_share_the_batch_and_get_the_same_text() {
    let args = [
        "--ctx",
        "1024",
        "--threads",
        "2",
        "--parallel",
        "6",
        "--spec",
        "ngram",
    ];
    // Six requests a step make the default model's steps arithmetic-bound, where guesses that
    // hold half the time do not pay: --draft-min has some checked anyway.
    let guesses = ["--draft-max", "8", "--draft-min", "4"];
    let (_server, base) =
        testkit::serve::llm_rs_serve(&[&args[..], &guesses].concat(), START_TIMEOUT);
    let client = Client::builder().timeout(CLIENT_TIMEOUT).build().unwrap();

    // Each prompt greedy and sampled, once guessing and once not: all at once.
    let mut bodies = Vec::new();
    for prompt in PROMPTS {
        for sampling in [
            json!({"temperature": 0}),
            json!({"temperature": 0.8, "seed": 7}),
        ] {
            for n_max in [None, Some(0)] {
                let mut body = json!({"prompt": prompt, "max_tokens": TOKENS});
                body.as_object_mut()
                    .unwrap()
                    .extend(sampling.as_object().unwrap().clone());
                if let Some(n) = n_max {
                    body["speculative.n_max"] = json!(n);
                }
                bodies.push(body);
            }
        }
    }
    let answers: Vec<Value> = std::thread::scope(|s| {
        let running: Vec<_> = bodies
            .iter()
            .map(|b| s.spawn(|| completion(&client, &base, b)))
            .collect();
        running.into_iter().map(|h| h.join().unwrap()).collect()
    });

    let mut accepted = 0;
    for (pair, bodies) in answers.chunks(2).zip(bodies.chunks(2)) {
        let (guessing, plain) = (&pair[0], &pair[1]);
        assert_eq!(
            guessing["choices"][0]["text"], plain["choices"][0]["text"],
            "{}",
            bodies[0]
        );
        assert_eq!(
            guessing["usage"]["completion_tokens"],
            plain["usage"]["completion_tokens"]
        );
        assert!(
            plain["usage"].get("completion_tokens_details").is_none(),
            "a request that does not guess reports no guesses: {}",
            plain["usage"]
        );
        if let Some(d) = guessing["usage"].get("completion_tokens_details") {
            let held = d["accepted_prediction_tokens"].as_u64().unwrap();
            let rejected = d["rejected_prediction_tokens"].as_u64().unwrap();
            // Each guess that held is a token: never more than were generated.
            let completion = guessing["usage"]["completion_tokens"].as_u64().unwrap();
            assert!(held < completion.max(1), "{}", guessing["usage"]);
            accepted += held;
            assert!(held + rejected > 0, "{}", guessing["usage"]);
        }
    }
    println!("{accepted} guesses held");
    assert!(
        accepted >= MIN_ACCEPTED,
        "only {accepted} guesses held over all requests"
    );

    // The metrics count the same guesses; the engine records a step just after answering.
    let deadline = Instant::now() + CLIENT_TIMEOUT;
    while counter(&client, &base, "llmrs_spec_accepted_tokens_total") != accepted {
        assert!(
            Instant::now() < deadline,
            "llmrs_spec_accepted_tokens_total never reached {accepted}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(counter(&client, &base, "llmrs_spec_draft_tokens_total") >= accepted);
}
