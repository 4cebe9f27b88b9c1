//! The finished engine's decode step allocates nothing in its forward pass: the mapped model,
//! chapter 8's kernels and `SimdCompute`, on the paged KV cache chapter 7's scheduler runs.
//! (`shared`'s counting allocator counts every thread; this file holds one test.)

use ch04::{Batch, Scratch};
use ch05::PagedCache;
use ch07::BatchModel;
use ch08::pool::SpinPool;
use ch10::{Engine, LoadMode, MapOptions};
use std::sync::Arc;
use testkit::alloc::allocations;

#[global_allocator]
static GLOBAL: testkit::alloc::Counting = testkit::alloc::Counting;

#[test]
fn a_decode_step_of_the_finished_engine_allocates_nothing() {
    let path = shared::default_model_path().unwrap_or_else(|e| panic!("{e}"));
    let fast = ch08::FastLoader::new(Arc::new(SpinPool::new(2)));
    let e = Engine::load(
        &path,
        LoadMode::Map(MapOptions::default()),
        fast,
        &ch04::architectures(),
    )
    .unwrap();
    let c = &e.model.config;
    let block = ch10::engine::BLOCK_SIZE;
    let mut kv = PagedCache::new(c.n_layer, e.model.attention.kv_dim(), block, 8);
    let (mut batch, mut scratch) = (Batch::default(), Scratch::default());
    let prompt = e
        .tokenizer
        .encode("The history of the printing press", true, true);
    batch.set_sequence(0, &prompt, 0, false);
    e.model
        .forward_batch(&batch, &mut kv, &mut scratch)
        .unwrap();
    let mut pos = prompt.len();
    let mut step = |i: u32, pos: &mut usize| {
        batch.set_sequence(0, &[300 + i], *pos, false);
        e.model
            .forward_batch(&batch, &mut kv, &mut scratch)
            .unwrap();
        *pos += 1;
    };
    for i in 0..4 {
        step(i, &mut pos);
    }
    // The steps measured cross block boundaries: taking a new block allocates nothing either.
    let before = allocations();
    for i in 0..32 {
        step(100 + i, &mut pos);
    }
    let n = allocations() - before;
    assert!(
        pos - 32 < 2 * block && pos > 2 * block,
        "the steps cross no block boundary"
    );
    assert_eq!(n, 0, "32 decode steps made {n} allocations");
}
