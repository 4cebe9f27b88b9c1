//! Speculation changes how many passes a generation takes, not what it generates: on the
//! finished engine's model, greedy output with guesses — right, wrong, or right for a while —
//! is token for token the output without them, and so is sampled output for the same seed.

use ch04::{ForwardError, GenParams, SamplerParams, generate};
use ch05::{Cached, ContiguousCache};
use ch08::{FastLoader, PoolKind, new_pool};
use ch10::engine::{Engine, LoadMode};
use ch10::mapped::MapOptions;
use ch16::Proposer;
use ch16::{DraftLength, DraftModel, PromptLookup, SpecStats, speculate};
use proptest::prelude::*;
use std::sync::OnceLock;

/// Tokens generated per run: long enough for copying to start and stop, short enough that the
/// proptest's cases take seconds.
const TOKENS: usize = 40;
/// Positions of the test caches.
const N_CTX: usize = 512;

fn engine() -> &'static Engine {
    static E: OnceLock<Engine> = OnceLock::new();
    E.get_or_init(|| {
        let path = shared::default_model_path().unwrap_or_else(|e| panic!("{e}"));
        Engine::load(
            &path,
            LoadMode::Map(MapOptions::default()),
            FastLoader::new(new_pool(PoolKind::Spin, 2)),
            &ch13::architectures(),
        )
        .unwrap_or_else(|e| panic!("{e}"))
    })
}

fn session() -> Cached<'static, ContiguousCache> {
    let model = &engine().model;
    Cached::new(model, ContiguousCache::for_model(model, N_CTX), 256)
}

/// Prompts the default model continues: two that copy from themselves, two that do not.
const PROMPTS: [&str; 4] = [
    "Repeat the list: red, orange, yellow, green, blue, indigo, violet. The list again: red,",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
];

fn prompt(i: usize) -> Vec<u32> {
    engine().tokenizer.encode(PROMPTS[i], true, false)
}

fn params(sampler: SamplerParams) -> GenParams {
    GenParams {
        max_tokens: TOKENS,
        sampler,
        stop: Vec::new(),
        rule: None,
    }
}

/// Sampled as llama.cpp samples by default, with a fixed seed.
fn sampled(seed: u64) -> SamplerParams {
    SamplerParams {
        seed,
        ..SamplerParams::default()
    }
}

/// Plain decoding, one token per pass: the ids and the text.
fn plain(prompt: &[u32], params: &GenParams) -> (Vec<u32>, String) {
    let e = engine();
    let g = generate(&mut session(), &e.tokenizer, prompt, params, &mut |_| {}).unwrap();
    (g.ids, g.text)
}

/// Decoding with `proposer`'s guesses: the ids, the text as streamed, and the statistics.
fn guessed(
    prompt: &[u32],
    params: &GenParams,
    proposer: &mut dyn Proposer,
) -> (Vec<u32>, String, SpecStats) {
    let e = engine();
    let mut streamed = String::new();
    let (g, stats) = speculate(
        &mut session(),
        proposer,
        &mut DraftLength::new(8),
        &e.tokenizer,
        prompt,
        params,
        &mut |t| streamed.push_str(t),
    )
    .unwrap();
    assert_eq!(
        streamed, g.text,
        "the streamed text is the generation's text"
    );
    (g.ids, streamed, stats)
}

/// Guesses taken from a known continuation, some made wrong on purpose: `plan[call]` is how
/// many of that call's guesses to give and which one (if any) to replace by another token.
struct Scripted {
    truth: Vec<u32>,
    plan: Vec<(usize, Option<usize>)>,
    call: usize,
}

impl Proposer for Scripted {
    fn propose(
        &mut self,
        tokens: &[u32],
        max: usize,
        out: &mut Vec<u32>,
    ) -> Result<(), ForwardError> {
        let (n, wrong) = self.plan.get(self.call).copied().unwrap_or((max, None));
        self.call += 1;
        let start = out.len();
        out.extend(self.truth.iter().skip(tokens.len()).take(n.min(max)));
        if let Some(w) = wrong.filter(|&w| start + w < out.len()) {
            out[start + w] = (out[start + w] + 1) % 1000;
        }
        Ok(())
    }
}

#[test]
fn greedy_output_is_unchanged_by_prompt_lookup() {
    let mut copied = 0;
    for i in 0..PROMPTS.len() {
        let p = prompt(i);
        let params = params(SamplerParams::greedy());
        let (want, text) = plain(&p, &params);
        let (got, streamed, stats) = guessed(&p, &params, &mut PromptLookup::default());
        testkit::assert_same_sequence(&format!("prompt {i}: ids"), &got, &want);
        assert_eq!(streamed, text, "prompt {i}");
        copied += stats.accepted;
    }
    // The copying prompts do copy: a test of identity that never accepted would prove little.
    assert!(
        copied >= 10,
        "only {copied} guesses accepted over all prompts"
    );
}

#[test]
fn sampled_output_is_unchanged_for_the_same_seed() {
    for (i, seed) in [(0, 7), (1, 11), (3, 42)] {
        let p = prompt(i);
        let params = params(sampled(seed));
        let (want, _) = plain(&p, &params);
        let (got, _, _) = guessed(&p, &params, &mut PromptLookup::default());
        testkit::assert_same_sequence(&format!("prompt {i}, seed {seed}"), &got, &want);
        // Guesses that are the sampled continuation itself are all accepted.
        let mut truth = p.clone();
        truth.extend_from_slice(&want);
        let mut oracle = Scripted {
            truth,
            plan: Vec::new(),
            call: 0,
        };
        let (got, _, stats) = guessed(&p, &params, &mut oracle);
        testkit::assert_same_sequence(&format!("prompt {i}, seed {seed}, oracle"), &got, &want);
        assert_eq!(
            stats.accepted, stats.proposed,
            "prompt {i}: the right guesses all held"
        );
    }
}

#[test]
fn a_draft_model_identical_to_the_target_is_almost_always_right() {
    let e = engine();
    for i in [0, 2] {
        let p = prompt(i);
        let params = params(SamplerParams::greedy());
        let (want, _) = plain(&p, &params);
        let mut draft = DraftModel::new(&e.model, &e.tokenizer, &e.tokenizer, N_CTX).unwrap();
        let (got, _, stats) = guessed(&p, &params, &mut draft);
        testkit::assert_same_sequence(&format!("prompt {i}: ids"), &got, &want);
        // The draft computes one token a pass and the check several: their logits may differ
        // in the last bits, so a near-tie can go the other way. Anything much below all means
        // the draft's cache lost track of the sequence.
        assert!(
            stats.acceptance() >= MIN_SELF_ACCEPTANCE,
            "prompt {i}: acceptance {:.2} ({stats:?})",
            stats.acceptance()
        );
    }
}

/// Acceptance of a draft that is the target itself: near-ties aside, every guess holds.
const MIN_SELF_ACCEPTANCE: f64 = 0.9;

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, failure_persistence: None, ..ProptestConfig::default() })]

    /// Any pattern of right and wrong guesses — all right, none, the first few, one wrong in
    /// the middle — leaves greedy and sampled output as it was.
    #[test]
    fn any_pattern_of_guesses_leaves_the_output_unchanged(
        which in 0..PROMPTS.len(),
        seed in proptest::option::of(0u64..1000),
        plan in proptest::collection::vec((0usize..10, proptest::option::of(0usize..10)), 0..24),
    ) {
        let p = prompt(which);
        let params = params(seed.map_or_else(SamplerParams::greedy, sampled));
        let (want, text) = plain(&p, &params);
        let mut truth = p.clone();
        truth.extend_from_slice(&want);
        let mut scripted = Scripted { truth, plan, call: 0 };
        let (got, streamed, stats) = guessed(&p, &params, &mut scripted);
        prop_assert_eq!(&got, &want);
        prop_assert_eq!(streamed, text);
        prop_assert!(stats.accepted <= stats.proposed);
    }
}

/// Draws of the statistical test: one per seed.
const DRAWS: u64 = 800;
/// The chi-square test's threshold, as a standard normal quantile: a right sampler fails it
/// with chance 1 in 1000. The seeds are fixed, so the test passes or fails the same way on
/// every run.
const CHI2_Z: f64 = 3.09;

/// The chance of each of the `top_k` likeliest tokens of `logits` at temperature 1.
fn top_k_probs(logits: &[f32], k: usize) -> Vec<(u32, f64)> {
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    order.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
    order.truncate(k);
    let top = f64::from(logits[order[0] as usize]);
    let w: Vec<f64> = order
        .iter()
        .map(|&t| (f64::from(logits[t as usize]) - top).exp())
        .collect();
    let sum: f64 = w.iter().sum();
    order.into_iter().zip(w.iter().map(|w| w / sum)).collect()
}

/// The statistical check of the sampling rule, on a small vocabulary (top-k 4): the first two
/// tokens sampled with a guess for the first — taken when the model samples it, the second then
/// drawn from the guess's row — follow the model's own joint distribution of two tokens,
/// computed exactly from its logits, by a chi-square test over `DRAWS` seeds.
#[test]
fn sampled_tokens_with_guesses_follow_the_models_distribution() {
    let e = engine();
    let p = prompt(2);
    let k = 4;
    let logits = |tokens: &[u32]| {
        let mut s = session();
        ch04::Session::next_logits(&mut s, tokens, tokens.len())
            .unwrap()
            .to_vec()
    };
    // The exact chance of every pair (t1, t2).
    let mut exact = Vec::new();
    for (t1, p1) in top_k_probs(&logits(&p), k) {
        let after = [p.as_slice(), &[t1]].concat();
        for (t2, p2) in top_k_probs(&logits(&after), k) {
            exact.push(((t1, t2), p1 * p2));
        }
    }
    // The likeliest first token is guessed: held about as often as it is sampled.
    let guess = exact[0].0.0;
    let params = |seed| GenParams {
        max_tokens: 2,
        sampler: SamplerParams {
            temp: 1.0,
            top_k: k,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            seed,
            ..SamplerParams::default()
        },
        stop: Vec::new(),
        rule: None,
    };
    let mut session = session();
    let mut counts = std::collections::HashMap::new();
    let mut held = 0;
    for seed in 0..DRAWS {
        let mut scripted = Scripted {
            truth: [p.as_slice(), &[guess]].concat(),
            plan: Vec::new(),
            call: 0,
        };
        let (g, stats) = speculate(
            &mut session,
            &mut scripted,
            &mut DraftLength::new(1),
            &e.tokenizer,
            &p,
            &params(seed),
            &mut |_| {},
        )
        .unwrap();
        held += stats.accepted;
        *counts.entry((g.ids[0], g.ids[1])).or_insert(0u64) += 1;
    }
    assert!(
        held > 0 && (held as u64) < DRAWS,
        "the guess must hold sometimes and fail sometimes ({held} of {DRAWS})"
    );
    // Pairs expected fewer than 5 times are pooled, as a chi-square test needs.
    let n = DRAWS as f64;
    let (mut chi2, mut cells, mut pooled) = (0.0, 0, (0.0, 0u64));
    for &(pair, prob) in &exact {
        let seen = counts.remove(&pair).unwrap_or(0);
        if prob * n >= 5.0 {
            chi2 += (seen as f64 - prob * n).powi(2) / (prob * n);
            cells += 1;
        } else {
            pooled = (pooled.0 + prob * n, pooled.1 + seen);
        }
    }
    assert!(counts.is_empty(), "pairs outside the top {k}: {counts:?}");
    if pooled.0 > 0.0 {
        chi2 += (pooled.1 as f64 - pooled.0).powi(2) / pooled.0;
        cells += 1;
    }
    // Wilson–Hilferty: the chi-square quantile for `cells - 1` degrees of freedom.
    let df = (cells - 1) as f64;
    let limit = df * (1.0 - 2.0 / (9.0 * df) + CHI2_Z * (2.0 / (9.0 * df)).sqrt()).powi(3);
    println!(
        "chi-square {chi2:.1} over {cells} cells (limit {limit:.1}); the guess held {held} times"
    );
    assert!(
        chi2 < limit,
        "chi-square {chi2:.1} ≥ {limit:.1} over {cells} cells"
    );
}
