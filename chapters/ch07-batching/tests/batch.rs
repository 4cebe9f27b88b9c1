//! The scheduler on the real default model: every request's logits and tokens, batched with
//! others, equal those of the request run alone with chapter 5's cached session — with prompts
//! of different lengths, prompt chunks mixed with decodes in one batch, requests joining and
//! leaving mid-way, requests preempted and recomputed, and prefixes taken from the prefix cache.
//!
//! The model is loaded with f32 weights (`DenseLoader`): chapter 3's f32 products are several
//! times faster than chapter 6's scalar integer dot products, which keeps these tests quick.
//! Both compute every row of a batch on its own, so the exactness argued below holds for both.

use ch01::GgufFile;
use ch02::Tokenizer;
use ch03::DenseLoader;
use ch04::{GenParams, Model, SamplerParams, Session, StopReason, generate};
use ch05::{Cached, ContiguousCache, Overflow};
use ch07::{Finished, Request, RequestId, Scheduler, SchedulerConfig, Sink};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use testkit::{Tolerance, assert_close};

/// Batched and alone must agree bit for bit. In this engine a token's row is computed by the
/// same arithmetic whatever else is in the batch: each matrix product quantizes and multiplies
/// each activation row with each weight row on its own, norms and RoPE are per row, and
/// attention reads the token's own sequence in position order, whether its keys come from this
/// step, an earlier one, or a block the prefix cache kept.
const BATCH_TOL: Tolerance = Tolerance::EXACT;

const N_GEN: usize = 16;

struct Engine {
    model: Model,
    tok: Tokenizer,
}

fn engine() -> &'static Engine {
    static E: OnceLock<Engine> = OnceLock::new();
    E.get_or_init(|| {
        let file = GgufFile::open(shared::default_model_path().unwrap()).unwrap();
        Engine {
            model: Model::load(&file, &DenseLoader, &ch04::architectures()).unwrap(),
            tok: Tokenizer::from_gguf(&file.gguf).unwrap(),
        }
    })
}

fn params(max_tokens: usize) -> GenParams {
    GenParams {
        max_tokens,
        sampler: SamplerParams::greedy(),
        stop: Vec::new(),
        rule: None,
    }
}

/// Records the logits of every step of a session.
struct Recording<S> {
    inner: S,
    logits: Vec<Vec<f32>>,
}

impl<S: Session> Session for Recording<S> {
    type Error = S::Error;

    fn next_logits(&mut self, tokens: &[u32], n_new: usize) -> Result<&[f32], S::Error> {
        let l = self.inner.next_logits(tokens, n_new)?.to_vec();
        self.logits.push(l);
        Ok(self.logits.last().expect("just pushed"))
    }
}

/// A request alone: chapter 5's cached session on a contiguous cache, chapter 4's loop.
struct Alone {
    ids: Vec<u32>,
    text: String,
    stop: StopReason,
    logits: Vec<Vec<f32>>,
}

fn alone(prompt: &[u32], params: &GenParams) -> Arc<Alone> {
    // Several tests compare with the same request alone: compute it once.
    type Key = (Vec<u32>, usize);
    static DONE: OnceLock<Mutex<HashMap<Key, Arc<Alone>>>> = OnceLock::new();
    let done = DONE.get_or_init(Default::default);
    let key = (prompt.to_vec(), params.max_tokens);
    if let Some(a) = done.lock().unwrap().get(&key) {
        return a.clone();
    }
    let e = engine();
    let (n_layer, kv_dim) = (e.model.config.n_layer, e.model.attention.kv_dim());
    let kv = ContiguousCache::new(
        n_layer,
        kv_dim,
        prompt.len() + params.max_tokens,
        Overflow::Error,
    );
    let mut session = Recording {
        inner: Cached::new(&e.model, kv, prompt.len()),
        logits: Vec::new(),
    };
    let g = generate(&mut session, &e.tok, prompt, params, &mut |_| {}).unwrap();
    let a = Arc::new(Alone {
        ids: g.ids,
        text: g.text,
        stop: g.stop,
        logits: session.logits,
    });
    done.lock().unwrap().insert(key, a.clone());
    a
}

/// Every request's sampled tokens, their logits, and its streamed text.
#[derive(Default)]
struct Collect {
    tokens: HashMap<usize, Vec<(u32, Vec<f32>)>>,
    text: HashMap<usize, String>,
}

impl Sink for Collect {
    fn text(&mut self, id: usize, text: &str) {
        self.text.entry(id).or_default().push_str(text);
    }
    fn token(&mut self, id: usize, token: u32, logits: &[f32]) {
        self.tokens
            .entry(id)
            .or_default()
            .push((token, logits.to_vec()));
    }
}

fn check_against_alone(name: &str, id: usize, got: &Collect, want: &Alone) {
    let steps = &got.tokens[&id];
    assert_eq!(
        steps.len(),
        want.logits.len(),
        "{name}: request {id}: number of tokens"
    );
    for (i, ((_, l), w)) in steps.iter().zip(&want.logits).enumerate() {
        assert_close(
            &format!("{name}: request {id}, logits of token {i}"),
            &[w.len()],
            l,
            w,
            BATCH_TOL,
        );
    }
    let ids: Vec<u32> = steps.iter().map(|(t, _)| *t).collect();
    testkit::assert_same_sequence(&format!("{name}: request {id}: tokens"), &ids, &want.ids);
    assert_eq!(
        got.text.get(&id).map_or("", |s| s.as_str()),
        want.text,
        "{name}: request {id}: text"
    );
}

/// The scheduler reported every submitted request finished, once, with the tokens, text and
/// stop reason it has alone.
fn check_finished(name: &str, done: &[Finished], want: &[(RequestId, Arc<Alone>)]) {
    let mut got: Vec<RequestId> = done.iter().map(|f| f.id).collect();
    got.sort_unstable();
    let mut submitted: Vec<RequestId> = want.iter().map(|(id, _)| *id).collect();
    submitted.sort_unstable();
    assert_eq!(got, submitted, "{name}: the requests reported finished");
    for (id, alone) in want {
        let f = done.iter().find(|f| f.id == *id).expect("checked above");
        testkit::assert_same_sequence(
            &format!("{name}: request {id}: finished tokens"),
            &f.ids,
            &alone.ids,
        );
        assert_eq!(f.text, alone.text, "{name}: request {id}: finished text");
        assert_eq!(f.stop, alone.stop, "{name}: request {id}: why it stopped");
    }
}

fn prompts() -> Vec<Vec<u32>> {
    let tok = &engine().tok;
    [
        "The capital of France is",
        "Here is a short story about a lighthouse keeper who finds a message in a bottle. It begins on a stormy night,",
        "1, 2, 3, 4,",
        "The recipe for pancakes needs flour, milk and",
    ]
    .iter()
    .map(|p| tok.encode(p, true, true))
    .collect()
}

/// Four requests, three slots, a budget of 12 tokens: the long prompt is read in chunks
/// alongside the others' decodes, request 1 stops early and leaves, request 3 waits for a slot
/// and joins when it does, request 2 arrives after four steps.
#[test]
fn every_sequence_in_a_batch_computes_what_it_computes_alone() {
    let e = engine();
    let prompts = prompts();
    let max_tokens = [N_GEN, 6, N_GEN, N_GEN];
    let arrival = [0, 0, 4, 0];
    let config = SchedulerConfig {
        max_batch_tokens: 12,
        max_running: 3,
        block_size: 16,
        n_blocks: 16,
        prefix_cache: false,
        cache: Default::default(),
    };
    let mut s = Scheduler::new(&e.model, &e.tok, config).unwrap();
    let mut sink = Collect::default();
    let mut ids = [usize::MAX; 4];
    let mut done = Vec::new();
    let (mut mixed_steps, mut max_seqs) = (0, 0);
    while ids.contains(&usize::MAX) || !s.is_idle() {
        for r in 0..4 {
            if ids[r] == usize::MAX && arrival[r] <= s.stats().steps {
                let req = Request {
                    prompt: prompts[r].clone(),
                    params: params(max_tokens[r]),
                };
                ids[r] = s.submit(req).unwrap();
            }
        }
        let report = s.step(&mut sink).unwrap();
        mixed_steps += usize::from(report.n_decode > 0 && report.n_tokens > report.n_seqs);
        max_seqs = max_seqs.max(report.n_seqs);
        done.extend(report.finished);
    }
    assert!(mixed_steps > 0, "no step mixed a prompt chunk with decodes");
    assert_eq!(max_seqs, 3);
    let want: Vec<(RequestId, Arc<Alone>)> = (0..4)
        .map(|r| (ids[r], alone(&prompts[r], &params(max_tokens[r]))))
        .collect();
    // Request 1 leaves early because it asked for fewer tokens, not because of an end of text.
    assert_eq!(want[1].1.stop, StopReason::MaxTokens);
    assert_eq!(want[1].1.ids.len(), max_tokens[1]);
    check_finished("batched", &done, &want);
    for (id, alone) in &want {
        check_against_alone("batched", *id, &sink, alone);
    }
}

/// A pool too small for all three requests at once: the newest is preempted, recomputed later,
/// and still writes exactly what it writes alone.
#[test]
fn a_preempted_request_is_recomputed_exactly() {
    let e = engine();
    let prompts = &prompts()[..3];
    let config = SchedulerConfig {
        max_batch_tokens: 64,
        max_running: 3,
        block_size: 4,
        // The longest request needs 24 + 15 = 39 positions, 10 blocks of 4; all three need 22.
        n_blocks: 13,
        prefix_cache: true,
        cache: Default::default(),
    };
    let mut s = Scheduler::new(&e.model, &e.tok, config).unwrap();
    let want: Vec<(RequestId, Arc<Alone>)> = prompts
        .iter()
        .map(|p| {
            let req = Request {
                prompt: p.clone(),
                params: params(N_GEN),
            };
            (s.submit(req).unwrap(), alone(p, &params(N_GEN)))
        })
        .collect();
    let mut sink = Collect::default();
    let done = s.run(&mut sink).unwrap();
    assert!(
        s.stats().preemptions > 0,
        "the pool was meant to be too small"
    );
    check_finished("preempted", &done, &want);
    for (id, alone) in &want {
        check_against_alone("preempted", *id, &sink, alone);
    }
    s.clear_prefix_cache();
    assert_eq!(s.kv().allocator.n_free(), 13);
}

/// A second request that shares a system prompt with a first one attaches its blocks, computes
/// only the rest, and writes exactly what it writes cold.
#[test]
fn a_prefix_cache_hit_computes_less_and_changes_nothing() {
    let e = engine();
    let system = "<|im_start|>system\nYou are a helpful assistant. You answer every question in one short, friendly sentence, in plain English, without lists, tables or code, and you never repeat the question.<|im_end|>\n";
    let chat = |q: &str| {
        e.tok.encode(
            &format!("{system}<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"),
            true,
            true,
        )
    };
    let (first, second) = (
        chat("What is the capital of France?"),
        chat("Why is the sky blue?"),
    );
    let common = first
        .iter()
        .zip(&second)
        .take_while(|(a, b)| a == b)
        .count();
    let config = SchedulerConfig {
        max_batch_tokens: 128,
        max_running: 2,
        block_size: 16,
        n_blocks: 16,
        prefix_cache: true,
        cache: Default::default(),
    };
    let mut s = Scheduler::new(&e.model, &e.tok, config).unwrap();
    let mut sink = Collect::default();
    let want_cold = s
        .submit(Request {
            prompt: first.clone(),
            params: params(N_GEN),
        })
        .unwrap();
    let want_cold = (want_cold, alone(&first, &params(N_GEN)));
    let done = s.run(&mut sink).unwrap();
    check_finished("cold", &done, std::slice::from_ref(&want_cold));
    let cold = done.into_iter().next().expect("checked above");
    assert_eq!(cold.cached_tokens, 0);
    let want_warm = s
        .submit(Request {
            prompt: second.clone(),
            params: params(N_GEN),
        })
        .unwrap();
    let want_warm = (want_warm, alone(&second, &params(N_GEN)));
    let done = s.run(&mut sink).unwrap();
    check_finished("prefix hit", &done, std::slice::from_ref(&want_warm));
    let warm = done.into_iter().next().expect("checked above");

    let hit = common / 16 * 16;
    assert!(
        hit >= 32,
        "the shared system prompt should fill two blocks ({common} tokens shared)"
    );
    assert_eq!(warm.cached_tokens, hit);
    // Computed: the prompt after the cached blocks, then one token per decode step.
    assert_eq!(
        warm.computed_tokens,
        second.len() - hit + warm.ids.len() - 1
    );
    assert_eq!(cold.computed_tokens, first.len() + cold.ids.len() - 1);
    check_against_alone("cold", cold.id, &sink, &want_cold.1);
    check_against_alone("prefix hit", warm.id, &sink, &want_warm.1);
    assert_ne!(warm.stop, StopReason::StopString);
}
