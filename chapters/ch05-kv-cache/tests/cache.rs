//! The KV cache changes how much is computed, not what: cached logits equal chapter 4's
//! uncached ones at every step, for both caches and several prefill chunk sizes; and the
//! generation matches llama.cpp's, step by step.

use ch01::GgufFile;
use ch03::{DenseLoader, KvError, KvStore, KvView, NoObserver};
use ch04::sampling::argmax;
use ch04::{Batch, ForwardError, Model, Session};
use ch05::{Cached, ContiguousCache, Overflow, PagedCache};
use std::sync::OnceLock;
use testkit::refdata::{self, TensorFile};
use testkit::{Tolerance, assert_close, assert_same_sequence};

/// Exact: in this engine every token's row is computed by the same arithmetic whatever else is
/// in the batch (each output is one dot product, attention reads the same stored keys), so
/// caching must not change a single bit. Chapter 8's kernels will be allowed to differ.
const CACHED_TOL: Tolerance = Tolerance::EXACT;
/// Against llama.cpp: chapter 4's f32 logits tolerance (30 layers of f32 rounding in another
/// order; about 2.4e-5 observed), applied to every decode step.
const LOGITS_TOL: Tolerance = Tolerance::new(1e-4, 1e-4);
const STEPS: usize = 64;

fn load() -> Model {
    let file = GgufFile::open(shared::default_model_path().unwrap()).unwrap();
    Model::load(&file, &DenseLoader, &ch04::architectures()).unwrap()
}

fn model() -> &'static Model {
    static M: OnceLock<Model> = OnceLock::new();
    M.get_or_init(load)
}

/// The reference prompt with the longest greedy continuation (the others end early with an
/// end-of-generation token), and that continuation.
fn reference() -> (String, Vec<u32>, Vec<u32>) {
    let m = refdata::manifest().unwrap_or_else(|e| panic!("{e}"));
    let p = m["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .max_by_key(|p| p["generated"].as_u64().unwrap())
        .unwrap();
    let ids = |v: &serde_json::Value| {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect::<Vec<_>>()
    };
    let id = p["id"].as_str().unwrap().to_string();
    let g = refdata::json(&format!("prompts/{id}.generation.json")).unwrap();
    (id, ids(&p["ids"]), ids(&g["ids"]))
}

/// Greedy generation of `STEPS` tokens through `session`, returning every step's logits.
fn run(
    session: &mut dyn Session<Error = ForwardError>,
    prompt: &[u32],
) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut tokens = prompt.to_vec();
    let (mut out, mut all) = (Vec::new(), Vec::new());
    let mut n_new = prompt.len();
    for _ in 0..STEPS {
        let logits = session.next_logits(&tokens, n_new).unwrap().to_vec();
        let next = argmax(&logits) as u32;
        all.push(logits);
        out.push(next);
        tokens.push(next);
        n_new = 1;
    }
    (out, all)
}

#[test]
fn cached_logits_equal_uncached_at_every_step() {
    let model = model();
    let (_, prompt, _) = reference();
    // Uncached reference: one pass over the whole final sequence with logits everywhere gives,
    // at row L-1, exactly what chapter 4's uncached session computes at length L (rows do not
    // depend on later tokens; checked below for one step against the real Uncached session).
    let (greedy, _) = run(&mut Cached::new(model, model.new_kv(), 512), &prompt);
    let all: Vec<u32> = prompt.iter().chain(&greedy).copied().collect();
    let uncached = model.logits_at_every_position(&all).unwrap();
    let vocab = model.config.vocab_size;
    let row = |step: usize| &uncached[(prompt.len() - 1 + step) * vocab..][..vocab];
    let real = ch04::Uncached::new(model)
        .next_logits(&all[..prompt.len() + 3], 1)
        .unwrap()
        .to_vec();
    assert_close(
        "uncached session, step 3",
        &[vocab],
        &real,
        row(3),
        CACHED_TOL,
    );

    let n_ctx = prompt.len() + STEPS;
    let kv_dim = model.attention.kv_dim();
    let n_layer = model.config.n_layer;
    let variants: Vec<(String, Box<dyn Session<Error = ForwardError>>)> = vec![
        (
            "contiguous, chunk 1".into(),
            Box::new(Cached::new(
                model,
                ContiguousCache::new(n_layer, kv_dim, n_ctx, Overflow::Error),
                1,
            )),
        ),
        (
            "contiguous, chunk 3".into(),
            Box::new(Cached::new(
                model,
                ContiguousCache::new(n_layer, kv_dim, n_ctx, Overflow::Error),
                3,
            )),
        ),
        (
            "contiguous, whole prompt".into(),
            Box::new(Cached::new(
                model,
                ContiguousCache::new(n_layer, kv_dim, n_ctx, Overflow::Error),
                512,
            )),
        ),
        (
            "paged 16, chunk 2".into(),
            Box::new(Cached::new(
                model,
                PagedCache::new(n_layer, kv_dim, 16, n_ctx.div_ceil(16)),
                2,
            )),
        ),
        (
            "paged 5, whole prompt".into(),
            Box::new(Cached::new(
                model,
                PagedCache::new(n_layer, kv_dim, 5, n_ctx.div_ceil(5)),
                512,
            )),
        ),
    ];
    for (name, mut session) in variants {
        let (ids, logits) = run(session.as_mut(), &prompt);
        assert_same_sequence(&format!("{name}: greedy token ids, by step"), &ids, &greedy);
        for (step, l) in logits.iter().enumerate() {
            assert_close(
                &format!("{name}: step {step}"),
                &[vocab],
                l,
                row(step),
                CACHED_TOL,
            );
        }
    }
}

#[test]
fn decode_steps_and_greedy_continuation_match_llama_cpp() {
    let model = model();
    let vocab = model.config.vocab_size;
    let (id, prompt, want) = reference();
    assert!(
        want.len() >= STEPS,
        "{id}: reference has {} generated tokens",
        want.len()
    );
    let kv = ContiguousCache::new(
        model.config.n_layer,
        model.attention.kv_dim(),
        prompt.len() + STEPS,
        Overflow::Error,
    );
    let (got, logits) = run(&mut Cached::new(model, kv, 512), &prompt);
    assert_same_sequence(
        &format!("{id}: greedy continuation (llama.cpp's is the reference)"),
        &got,
        &want[..STEPS],
    );

    let refs = TensorFile::open(&format!("prompts/{id}.decode.safetensors"))
        .unwrap_or_else(|e| panic!("{e}"));
    let full = refs.f32("logits_full").unwrap();
    for (step, want) in full.data.chunks_exact(vocab).enumerate() {
        assert_close(
            &format!("{id}: decode step {step}"),
            &[vocab],
            &logits[step],
            want,
            LOGITS_TOL,
        );
    }
    // Every step: the logits of llama.cpp's top-32 tokens.
    let (shape, top_ids) = refs.i64("topk_ids").unwrap();
    let top = refs.f32("topk_logits").unwrap();
    let k = shape[1];
    for step in 0..shape[0].min(STEPS) {
        let got: Vec<f32> = (0..k)
            .map(|j| logits[step][top_ids[step * k + j] as usize])
            .collect();
        assert_close(
            &format!("{id}: decode step {step}, top-{k}"),
            &[k],
            &got,
            &top.data[step * k..(step + 1) * k],
            LOGITS_TOL,
        );
    }
}

#[test]
fn a_full_cache_is_an_error_and_leaves_the_cache_unchanged() {
    let model = model();
    let mut kv = ContiguousCache::new(
        model.config.n_layer,
        model.attention.kv_dim(),
        4,
        Overflow::Error,
    );
    let mut s = Cached::new(model, kv, 512);
    s.next_logits(&[1, 2, 3], 3).unwrap();
    let err = s.next_logits(&[1, 2, 3, 4, 5], 2).unwrap_err();
    assert_eq!(
        err,
        ch04::ForwardError::Kv(KvError::Full {
            seq: 0,
            needed: 5,
            capacity: 4
        })
    );
    assert_eq!(s.kv.len(), 3);
    // Still usable: one more token fits.
    s.next_logits(&[1, 2, 3, 4], 1).unwrap();
    kv = s.kv;
    assert_eq!(kv.len(), 4);
}

/// A ring buffer of `cap` positions gives the same logits as attention limited to a window of
/// `cap` positions: the cache forgets exactly what the window hides.
#[test]
fn sliding_window_cache_equals_windowed_attention() {
    let cap = 8;
    let tokens: Vec<u32> = (0..20).map(|i| 100 + 37 * i).collect();
    let model = model();
    let vocab = model.config.vocab_size;
    let mut kv = ContiguousCache::new(
        model.config.n_layer,
        model.attention.kv_dim(),
        cap,
        Overflow::SlidingWindow,
    );
    let mut ring = Vec::new();
    for (i, &t) in tokens.iter().enumerate() {
        ring.extend(
            model
                .forward(&Batch::sequence(0, &[t], i, true), &mut kv, &mut NoObserver)
                .unwrap(),
        );
        assert_eq!(kv.view(0, 0).first(), (i + 1).saturating_sub(cap));
    }
    let mut windowed = load();
    windowed.attention.window = Some(cap);
    let want = windowed.logits_at_every_position(&tokens).unwrap();
    assert_close(
        "ring buffer vs window mask",
        &[tokens.len(), vocab],
        &ring,
        &want,
        CACHED_TOL,
    );
}

/// Several rows of logits in one call equal the rows one call each would give, and a rewound
/// session recomputes exactly what it computed before.
#[test]
fn last_rows_in_one_call_and_rewinding_change_nothing() {
    let (_, prompt, generated) = reference();
    let model = model();
    let continuation = &generated[..8];
    let mut tokens = prompt.clone();
    tokens.extend_from_slice(continuation);

    // One call per token: the logits after each token of the continuation.
    let mut one = Cached::contiguous(model, Some(256));
    let mut expected = Vec::new();
    for n in prompt.len()..=tokens.len() {
        let n_new = if n == prompt.len() { n } else { 1 };
        expected.push(one.next_logits(&tokens[..n], n_new).unwrap().to_vec());
    }

    // The prompt, then the whole continuation in one call.
    let mut many = Cached::new(model, ContiguousCache::for_model(model, 256), 16);
    let vocab = model.config.vocab_size;
    many.next_logits(&prompt, prompt.len()).unwrap();
    let rows = many
        .last_logits(&tokens, continuation.len(), continuation.len())
        .unwrap()
        .to_vec();
    assert_eq!(rows.len(), continuation.len() * vocab);
    for (i, want) in expected[1..].iter().enumerate() {
        assert_close(
            &format!("row {i} of one call"),
            &[vocab],
            &rows[i * vocab..(i + 1) * vocab],
            want,
            CACHED_TOL,
        );
    }
    // Rewound to before the prompt's last token, the same call gives the prompt's row too.
    many.rewind(prompt.len() - 1);
    let again = many
        .last_logits(&tokens, continuation.len() + 1, continuation.len() + 1)
        .unwrap();
    for (i, want) in expected.iter().enumerate() {
        assert_close(
            &format!("row {i} of one call after rewinding"),
            &[vocab],
            &again[i * vocab..(i + 1) * vocab],
            want,
            CACHED_TOL,
        );
    }
    assert_eq!(many.n_past, tokens.len());
}

/// A run of stored rows (`key_run`, `value_run`: what a fast attention reads, several positions
/// at a time) holds the rows of those positions in order, in every layer, also once a sliding
/// window has wrapped around the ring: rows laid out layer by layer, each layer's positions
/// side by side.
#[test]
fn a_run_of_rows_holds_consecutive_positions_of_one_layer() {
    let (n_layer, kv_dim, cap, n) = (3, 2, 5, 12);
    let row = |layer: usize, pos: usize, sign: f32| -> Vec<f32> {
        (0..kv_dim)
            .map(|c| sign * (pos * 100 + layer * 10 + c) as f32)
            .collect()
    };
    let mut kv = ContiguousCache::new(n_layer, kv_dim, cap, Overflow::SlidingWindow);
    for pos in 0..n {
        kv.reserve(0, pos..pos + 1).unwrap();
        for layer in 0..n_layer {
            kv.store(layer, 0, pos, &row(layer, pos, 1.0), &row(layer, pos, -1.0));
        }
        for layer in 0..n_layer {
            let view = kv.view(layer, 0);
            for start in view.first()..=pos {
                let max = pos + 1 - start; // the positions stored from `start` on
                let (keys, values) = (view.key_run(start, max), view.value_run(start, max));
                let k = keys.len(kv_dim);
                assert!(
                    (1..=max).contains(&k),
                    "a run of {k} rows from position {start}"
                );
                for i in 0..k {
                    for (rows, sign, what) in [(keys, 1.0, "key"), (values, -1.0, "value")] {
                        let mut got = vec![0.0; kv_dim];
                        rows.axpy(kv_dim, i, 0..kv_dim, 1.0, &mut got);
                        assert_eq!(
                            got,
                            row(layer, start + i, sign),
                            "{pos} stored: layer {layer}, the run from {start}, its {what} {i}"
                        );
                    }
                }
            }
        }
    }
}
