//! Property tests of the scheduler with a fake model: random requests arriving at random
//! steps, random token budgets, slot limits, block sizes and pool sizes (often too small, so
//! that requests are preempted and the prefix cache is evicted), with the prefix cache on or off.
//!
//! The fake model is fast but not trivial: it writes each token's id and position into the KV
//! cache as its key, and computes the logits of a token from the keys it reads back for its
//! sequence. Logits are therefore right only if the scheduler's cache holds exactly the
//! sequence's tokens — after chunked prefill, prefix-cache hits, preemption and recomputation.
//! The reference is chapter 4's `generate` on the same logits function, one request alone.
//!
//! Checked after every step: the model never sees more than the token budget or more than
//! `max_running` sequences, every block's reference count equals its users (block tables and
//! the prefix cache), and the prefix cache is a well-formed radix tree. At the end: every
//! request's tokens and text equal the reference, every request finished within the starvation
//! bound of the policy, and once the prefix cache is cleared every block is free.
//!
//! Some requests feed tokens ahead: an oracle that knows the reference feeds a random number
//! of the next tokens, some of them made wrong on purpose. The same promises hold for them,
//! with the cache truncated past every token not kept (the fake model checks every position
//! it reads).

use ch01::GgufFile;
use ch02::Tokenizer;
use ch03::attention::reserve_batch;
use ch03::{KvStore, KvView};
use ch04::{Batch, ForwardError, GenParams, SamplerParams, Session, StopReason, generate};
use ch05::PagedCache;
use ch07::{
    BatchModel, Known, Lookahead, Request, Scheduler, SchedulerConfig, Sink, StepRows, Submit,
};
use proptest::prelude::*;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// Token ids 0..VOCAB of the real vocabulary: control tokens (0 and 2 end generation) and
/// single characters, so generations end early sometimes and stop strings can match.
const VOCAB: usize = 64;

fn tokenizer() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let file = GgufFile::open(shared::default_model_path().unwrap()).unwrap();
        Tokenizer::from_gguf(&file.gguf).unwrap()
    })
}

fn mix(mut x: u64) -> u64 {
    // splitmix64's finaliser
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d049bb133111eb);
    x ^ (x >> 31)
}

/// The fake model's logits after `history`: pseudo-random, a function of every token.
fn logits_after(history: &[u32]) -> Vec<f32> {
    let h = history
        .iter()
        .fold(0x5eed_u64, |h, &t| mix(h ^ u64::from(t)));
    (0..VOCAB as u64)
        .map(|v| (mix(h ^ (v << 32)) >> 40) as f32 / (1 << 21) as f32)
        .collect()
}

/// What the model was asked to do at each step: (tokens, distinct sequences).
#[derive(Default)]
struct FakeModel {
    batches: RefCell<Vec<(usize, usize)>>,
}

impl BatchModel for FakeModel {
    type Scratch = Vec<f32>;
    fn n_layer(&self) -> usize {
        1
    }
    fn kv_dim(&self) -> usize {
        2
    }
    fn head_dim(&self) -> usize {
        2
    }
    fn vocab_size(&self) -> usize {
        VOCAB
    }
    fn n_ctx(&self) -> usize {
        1 << 16
    }
    fn forward_batch<'s>(
        &self,
        batch: &Batch,
        kv: &mut PagedCache,
        out: &'s mut Vec<f32>,
    ) -> Result<&'s [f32], ForwardError> {
        reserve_batch(kv, &batch.at)?;
        for (&t, at) in batch.tokens.iter().zip(&batch.at) {
            kv.store(0, at.seq, at.pos, &[t as f32, at.pos as f32], &[0.0, 0.0]);
        }
        let mut seqs: Vec<usize> = batch.at.iter().map(|a| a.seq).collect();
        seqs.sort();
        seqs.dedup();
        self.batches.borrow_mut().push((batch.len(), seqs.len()));
        out.clear();
        for (i, at) in batch
            .at
            .iter()
            .enumerate()
            .filter(|(i, _)| batch.logits[*i])
        {
            let view = kv.view(0, at.seq);
            let history: Vec<u32> = (0..=at.pos)
                .map(|p| {
                    let ch03::KvRows::F32(k) = view.key(p) else {
                        panic!("the pool keeps f32 unless told otherwise")
                    };
                    assert_eq!(
                        k[1], p as f32,
                        "batch row {i}: position {p} holds another position's key"
                    );
                    k[0] as u32
                })
                .collect();
            out.extend(logits_after(&history));
        }
        Ok(out)
    }
}

/// Chapter 4's loop on the fake model's logits: the reference.
struct FakeSession(Vec<f32>);

impl Session for FakeSession {
    type Error = ForwardError;

    fn next_logits(&mut self, tokens: &[u32], _n_new: usize) -> Result<&[f32], ForwardError> {
        self.0 = logits_after(tokens);
        Ok(&self.0)
    }
}

#[derive(Debug, Clone)]
struct Req {
    prompt: Vec<u32>,
    params: GenParams,
    arrival: usize, // steps run before it is submitted
    /// Tokens fed ahead by an [`Oracle`] with this seed, if any, and how often (in 8) one is
    /// wrong.
    ahead: Option<(u64, u64)>,
}

/// Feeds the next tokens of the reference output (`want`: prompt and reference ids), a
/// pseudo-random number of them each step, each one made wrong with a chance of `wrong` in 8;
/// past the reference's end, anything (counted in `beyond`).
struct Oracle {
    want: Vec<u32>,
    state: u64,
    wrong: u64,
    beyond: Arc<AtomicUsize>,
}

impl Lookahead for Oracle {
    fn ahead(
        &mut self,
        tokens: &[u32],
        max: usize,
        _: StepRows,
        out: &mut Vec<u32>,
    ) -> Result<(), ForwardError> {
        assert_eq!(
            tokens,
            &self.want[..tokens.len()],
            "the scheduler's tokens are the reference's"
        );
        self.state = mix(self.state);
        let n = (self.state % (max as u64 + 1)) as usize;
        for j in 0..n {
            self.state = mix(self.state);
            let right = self.want.get(tokens.len() + j).copied().unwrap_or_else(|| {
                self.beyond.fetch_add(1, Ordering::Relaxed);
                17
            });
            let wrong = self.state % 8 < self.wrong;
            out.push(if wrong {
                (right + 1) % VOCAB as u32
            } else {
                right
            });
        }
        Ok(())
    }
}

fn req() -> impl Strategy<Value = Req> {
    // Prompts share beginnings often (a few fixed heads), so the prefix cache gets hits.
    let head = prop_oneof![
        Just(vec![]),
        Just(vec![20u32, 21, 22, 23, 24, 25, 26, 27]),
        Just(vec![20u32, 21, 22, 23, 30, 31, 32, 33, 34, 35, 36]),
    ];
    let tail = prop::collection::vec(17u32..VOCAB as u32, 0..14);
    let stop = prop_oneof![
        4 => Just(vec![]),
        1 => Just(vec!["A".to_string()]),
        1 => Just(vec!["B".to_string(), "%&".to_string()]),
    ];
    let sampler = prop_oneof![
        Just(SamplerParams::greedy()),
        (0u64..1000).prop_map(|seed| SamplerParams {
            temp: 1.0,
            seed,
            ..SamplerParams::default()
        }),
    ];
    let ahead = prop_oneof![Just(None), (0u64..1000, 0u64..=8).prop_map(Some)];
    (head, tail, 0usize..12, stop, sampler, 0usize..12, ahead).prop_map(
        |(head, tail, max_tokens, stop, sampler, arrival, ahead)| {
            let mut prompt = [head, tail].concat();
            if prompt.is_empty() {
                prompt.push(40);
            }
            Req {
                prompt,
                params: GenParams {
                    max_tokens,
                    sampler,
                    stop,
                    rule: None,
                },
                arrival,
                ahead,
            }
        },
    )
}

#[derive(Default)]
struct Collect {
    text: HashMap<usize, String>,
}

impl Sink for Collect {
    fn text(&mut self, id: usize, text: &str) {
        self.text.entry(id).or_default().push_str(text);
    }
}

/// Every block's reference count is its number of users: block tables of running sequences,
/// and the prefix cache. Free blocks are exactly the unused ones.
fn check_references(s: &Scheduler<FakeModel>) -> Result<(), TestCaseError> {
    let kv = s.kv();
    let mut users = vec![0u32; kv.allocator.n_blocks()];
    for (_, slot) in s.running_slots() {
        for &b in &kv
            .table(slot)
            .expect("running sequences have a table")
            .blocks
        {
            users[b as usize] += 1;
        }
    }
    for b in s.prefix_cache().blocks() {
        users[b as usize] += 1;
    }
    for (b, &u) in users.iter().enumerate() {
        prop_assert_eq!(kv.allocator.ref_count(b as u32), u, "block {}", b);
    }
    let unused = users.iter().filter(|&&u| u == 0).count();
    prop_assert_eq!(kv.allocator.n_free(), unused);
    prop_assert!(s.prefix_cache().is_well_formed());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn the_scheduler_keeps_its_promises(
        mut reqs in prop::collection::vec(req(), 1..9),
        budget in 1usize..24,
        running in 1usize..7,
        block_size in 1usize..6,
        spare_blocks in 0usize..16,
        prefix_cache: bool,
    ) {
        reqs.sort_by_key(|r| r.arrival);
        let tok = tokenizer();
        let max_running = running.min(budget);
        let need = |r: &Req| (r.prompt.len() + r.params.max_tokens).div_ceil(block_size);
        let n_blocks = reqs.iter().map(need).max().unwrap() + spare_blocks;
        let config = SchedulerConfig { max_batch_tokens: budget, max_running, block_size, n_blocks, prefix_cache, cache: Default::default() };
        let model = FakeModel::default();
        let mut s = Scheduler::new(&model, tok, config).unwrap();
        let mut sink = Collect::default();
        let mut finished = HashMap::new();
        let mut submitted = 0;
        let beyond: Vec<Arc<AtomicUsize>> = reqs.iter().map(|_| Arc::default()).collect();
        let wants: Vec<_> = reqs.iter().map(|r| generate(&mut FakeSession(Vec::new()), tok, &r.prompt, &r.params, &mut |_| {}).unwrap()).collect();
        while submitted < reqs.len() || !s.is_idle() {
            while submitted < reqs.len() && reqs[submitted].arrival <= s.stats().steps {
                let r = &reqs[submitted];
                let request = Request { prompt: r.prompt.clone(), params: r.params.clone() };
                let id = match r.ahead {
                    None => s.submit(request),
                    Some((seed, wrong)) => {
                        let want = [r.prompt.as_slice(), &wants[submitted].ids].concat();
                        let beyond = Arc::clone(&beyond[submitted]);
                        let oracle = Oracle { want, state: seed, wrong, beyond };
                        let lookahead = Some(Box::new(oracle) as Box<dyn Lookahead + Send>);
                        s.submit_with(request, Submit { lookahead, ..Submit::default() })
                    }
                }.unwrap();
                prop_assert_eq!(id, submitted);
                submitted += 1;
            }
            let report = s.step(&mut sink).unwrap();
            prop_assert!(report.n_tokens <= budget);
            prop_assert!(report.n_seqs <= max_running);
            for f in report.finished {
                finished.insert(f.id, (f, s.stats().steps));
            }
            check_references(&s)?;
        }
        // What the model saw, not only what the scheduler says it sent.
        for &(n, seqs) in model.batches.borrow().iter() {
            prop_assert!(n <= budget && seqs <= max_running, "a batch of {} tokens from {} sequences", n, seqs);
        }

        let mut bound = 0;
        for (id, r) in reqs.iter().enumerate() {
            let (f, done_at) = &finished[&id];
            let want = &wants[id];
            prop_assert!(f.kept_ahead <= f.fed_ahead);
            if r.ahead.is_none() {
                prop_assert_eq!(f.fed_ahead, 0);
            }
            if r.ahead.is_some_and(|(_, wrong)| wrong == 0) {
                // Every token fed within the reference is kept; only those offered after its
                // end (fed or not: the scheduler feeds fewer at its token limit) can fail.
                let beyond = beyond[id].load(Ordering::Relaxed);
                prop_assert!(f.fed_ahead - f.kept_ahead <= beyond, "request {}: a right token was not kept", id);
            }
            prop_assert_eq!(&f.ids, &want.ids, "request {}: tokens", id);
            prop_assert_eq!(&f.text, &want.text, "request {}: text", id);
            prop_assert_eq!(f.stop, want.stop);
            prop_assert_eq!(sink.text.get(&id).map_or("", |t| t.as_str()), want.text.as_str(), "request {}: streamed text", id);
            // No starvation: within the policy's bound (see the scheduler's docs).
            bound += r.prompt.len() + r.params.max_tokens;
            prop_assert!(*done_at <= r.arrival + bound, "request {} done at step {}, bound {}", id, done_at, r.arrival + bound);
        }

        s.clear_prefix_cache();
        prop_assert_eq!(s.kv().allocator.n_free(), n_blocks, "every block is free at the end");
    }
}

/// A request the pool could never hold, or the model never read, is refused when submitted.
#[test]
fn impossible_requests_are_refused_up_front() {
    let model = FakeModel::default();
    let config = SchedulerConfig {
        max_batch_tokens: 8,
        max_running: 2,
        block_size: 4,
        n_blocks: 3,
        prefix_cache: true,
        cache: Default::default(),
    };
    let mut s = Scheduler::new(&model, tokenizer(), config.clone()).unwrap();
    let params = |max_tokens| GenParams {
        max_tokens,
        sampler: SamplerParams::greedy(),
        stop: vec![],
        rule: None,
    };
    let err = |prompt: Vec<u32>, max_tokens| {
        let r = Request {
            prompt,
            params: params(max_tokens),
        };
        Scheduler::new(&model, tokenizer(), config.clone())
            .unwrap()
            .submit(r)
            .unwrap_err()
            .to_string()
    };
    assert_eq!(err(vec![], 4), "the request's prompt has no tokens");
    assert_eq!(
        err(vec![20, 99], 4),
        "prompt token 99 at index 1 is not below the vocabulary size 64"
    );
    // 10 prompt tokens + 5 generated - 1 = 14 positions: 4 blocks of 4, the pool has 3.
    assert_eq!(
        err(vec![20; 10], 5),
        "prompt and max_tokens need 4 KV blocks, the pool has 3"
    );
    // One request's bad sampling settings are refused before they reach a shared batch.
    let mut nan = params(2);
    nan.sampler.temp = f32::NAN;
    let e = s
        .submit(Request {
            prompt: vec![20],
            params: nan,
        })
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "the request's sampling settings: temp is NaN; it must be a finite number (0 or less is greedy)"
    );
    assert!(
        s.submit(Request {
            prompt: vec![20; 10],
            params: params(3)
        })
        .is_ok()
    );
    let bad = SchedulerConfig {
        max_running: 9,
        ..config
    };
    assert!(Scheduler::new(&model, tokenizer(), bad).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Cancelling requests at any moment — waiting, mid-prompt, decoding — frees their slots
    /// and blocks at once and changes nothing for the others.
    #[test]
    fn cancelled_requests_free_their_blocks_and_change_nobody_else(
        mut reqs in prop::collection::vec(req(), 1..9),
        cancel_at in prop::collection::vec(prop::option::of(0usize..12), 9),
        budget in 1usize..24,
        running in 1usize..7,
        block_size in 1usize..6,
        spare_blocks in 0usize..16,
    ) {
        reqs.sort_by_key(|r| r.arrival);
        let tok = tokenizer();
        let need = |r: &Req| (r.prompt.len() + r.params.max_tokens).div_ceil(block_size);
        let n_blocks = reqs.iter().map(need).max().unwrap() + spare_blocks;
        let config = SchedulerConfig {
            max_batch_tokens: budget,
            max_running: running.min(budget),
            block_size,
            n_blocks,
            prefix_cache: true,
            cache: Default::default(),
        };
        let model = FakeModel::default();
        let mut s = Scheduler::new(&model, tok, config).unwrap();
        let mut sink = Collect::default();
        let mut finished = HashMap::new();
        let mut cancelled = HashMap::new();
        let mut submitted = 0;
        while submitted < reqs.len() || !s.is_idle() {
            while submitted < reqs.len() && reqs[submitted].arrival <= s.stats().steps {
                let r = &reqs[submitted];
                s.submit(Request { prompt: r.prompt.clone(), params: r.params.clone() }).unwrap();
                submitted += 1;
            }
            for id in 0..submitted {
                let due = cancel_at[id].is_some_and(|at| reqs[id].arrival + at <= s.stats().steps);
                if due && !finished.contains_key(&id) && !cancelled.contains_key(&id) {
                    let f = s.cancel(id).expect("an unfinished request can be cancelled");
                    // One that had already stopped (max_tokens 0) keeps its reason.
                    prop_assert!(f.stop == StopReason::Cancelled || reqs[id].params.max_tokens == 0);
                    prop_assert!(!s.running_slots().iter().any(|&(r, _)| r == id));
                    check_references(&s)?;
                    cancelled.insert(id, f);
                }
            }
            for f in s.step(&mut sink).unwrap().finished {
                finished.insert(f.id, f);
            }
            check_references(&s)?;
        }
        prop_assert!(s.cancel(0).is_none(), "nothing is left to cancel");
        for (id, r) in reqs.iter().enumerate() {
            let want = generate(&mut FakeSession(Vec::new()), tok, &r.prompt, &r.params, &mut |_| {}).unwrap();
            if let Some(f) = cancelled.get(&id) {
                // What it made before it was cancelled is the beginning of what it would make.
                prop_assert!(want.ids.starts_with(&f.ids), "request {}: tokens", id);
            } else {
                prop_assert_eq!(&finished[&id].ids, &want.ids, "request {}: tokens", id);
            }
        }
        s.clear_prefix_cache();
        prop_assert_eq!(s.kv().allocator.n_free(), n_blocks, "every block is free at the end");
    }
}

/// A known continuation that is the request's own answer is kept whole: the same tokens, in
/// two steps (the prompt, then one decode with the rest fed ahead) instead of one per token;
/// one that turns out wrong changes nothing but the steps.
#[test]
fn a_known_answer_is_replayed_in_two_steps() {
    let tok = tokenizer();
    let mut checked = 0;
    for start in 20u32..40 {
        let prompt = vec![start, 21, 22, 23];
        let params = GenParams {
            max_tokens: 12,
            sampler: SamplerParams::greedy(),
            stop: vec![],
            rule: None,
        };
        let want = generate(
            &mut FakeSession(Vec::new()),
            tok,
            &prompt,
            &params,
            &mut |_| {},
        )
        .unwrap();
        let run = |known: Option<Known>| {
            let model = FakeModel::default();
            let mut s = Scheduler::new(&model, tok, SchedulerConfig::default()).unwrap();
            let lookahead = known.map(|k| Box::new(k) as Box<dyn Lookahead + Send>);
            let request = Request {
                prompt: prompt.clone(),
                params: params.clone(),
            };
            let with = Submit {
                lookahead,
                ..Submit::default()
            };
            s.submit_with(request, with).unwrap();
            let done = s.run(&mut ()).unwrap();
            (done[0].clone(), s.stats().steps)
        };
        let (plain, plain_steps) = run(None);
        assert_eq!(plain.ids, want.ids);
        assert_eq!(plain_steps, want.ids.len().max(1));
        let (replayed, steps) = run(Some(Known::new(prompt.len(), want.ids.clone())));
        assert_eq!(replayed.ids, want.ids, "prompt {prompt:?}");
        assert_eq!(steps, want.ids.len().min(2), "prompt {prompt:?}");
        assert_eq!(replayed.fed_ahead, replayed.kept_ahead);
        // A wrong answer from its second token on: only the first is kept at the decode
        // step; then nothing more is fed, and the request goes on a token a step.
        let mut wrong = want.ids.clone();
        if wrong.len() >= 3 {
            wrong[2] = (wrong[2] + 1) % VOCAB as u32;
            let (r, steps) = run(Some(Known::new(prompt.len(), wrong)));
            assert_eq!(r.ids, want.ids, "prompt {prompt:?}");
            assert_eq!(
                (r.kept_ahead, steps),
                (1, want.ids.len() - 1),
                "prompt {prompt:?}"
            );
            checked += 1;
        }
    }
    assert!(
        checked > 5,
        "only {checked} prompts generated 3 tokens or more"
    );
}
