//! A decode step allocates nothing: every buffer of the forward pass lives in the session's
//! `Scratch`, the matrices' and `SimdCompute`'s per-thread buffers, or the KV cache, all sized
//! during the first steps.
//!
//! `shared`'s counting global allocator counts every allocation of the process (the pool's
//! workers included). This file holds one test, so no other test allocates meanwhile.

use ch01::GgufFile;
use ch04::{Model, Session};
use ch05::{Cached, ContiguousCache};
use ch08::FastLoader;
use ch08::pool::SpinPool;
use std::sync::Arc;
use testkit::alloc::allocations;

#[global_allocator]
static GLOBAL: testkit::alloc::Counting = testkit::alloc::Counting;

#[test]
fn a_decode_step_allocates_nothing_after_warm_up() {
    let file = GgufFile::open(shared::default_model_path().unwrap_or_else(|e| panic!("{e}")))
        .unwrap_or_else(|e| panic!("{e}"));
    // Two threads, so that attention splits its keys and the pool's workers run too.
    let fast = FastLoader::new(Arc::new(SpinPool::new(2)));
    let model = Model::load(&file, &fast, &ch04::architectures())
        .unwrap()
        .with_compute(fast.compute());
    let kv = ContiguousCache::for_model(&model, 512);
    let mut session = Cached::new(&model, kv, 64);
    let mut tokens: Vec<u32> = (0..300).map(|i| 100 + i * 7).collect();
    tokens.reserve(64);
    // Warm up: a prompt (five chunks) and a few decode steps size every buffer.
    session.next_logits(&tokens, tokens.len()).unwrap();
    for i in 0..4 {
        tokens.push(200 + i);
        session.next_logits(&tokens, 1).unwrap();
    }
    let before = allocations();
    for i in 0..32 {
        tokens.push(300 + i);
        session.next_logits(&tokens, 1).unwrap();
    }
    let n = allocations() - before;
    assert_eq!(n, 0, "32 decode steps made {n} allocations");
}
