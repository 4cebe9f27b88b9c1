//! The finished engine's decode step allocates nothing: the mapped model, chapter 8's kernels
//! and `SimdCompute`, and the chat session that keeps its cache between turns.
//! (`shared`'s counting allocator counts every thread; this file holds one test.)

use ch10::pool::SpinPool;
use ch10::{Engine, LoadMode, MapOptions, PrefixSession, Session};
use shared::alloc::allocations;
use std::sync::Arc;

#[global_allocator]
static GLOBAL: shared::alloc::Counting = shared::alloc::Counting;

#[test]
fn a_decode_step_of_the_finished_engine_allocates_nothing() {
    let path = shared::default_model_path().unwrap_or_else(|e| panic!("{e}"));
    let fast = ch10::FastLoader::new(Arc::new(SpinPool::new(2)));
    let e = Engine::load(&path, LoadMode::Map(MapOptions::default()), fast).unwrap();
    let mut session = PrefixSession::new(&e.model, 256);
    let mut tokens = e
        .tokenizer
        .encode("The history of the printing press", true, true);
    tokens.reserve(64);
    session.next_logits(&tokens, tokens.len()).unwrap();
    for i in 0..4 {
        tokens.push(300 + i);
        session.next_logits(&tokens, 1).unwrap();
    }
    let before = allocations();
    for i in 0..32 {
        tokens.push(400 + i);
        session.next_logits(&tokens, 1).unwrap();
    }
    let n = allocations() - before;
    assert_eq!(n, 0, "32 decode steps made {n} allocations");
}
