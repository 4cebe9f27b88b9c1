//! Property tests of the paged cache and its block allocator: random sequences of appends,
//! forks, truncations and frees never hand a block out twice, never lose one, never let a reference count go
//! below zero, and every sequence reads back exactly what was written for it.

use ch03::{KvRows, KvStore, KvView};
use ch05::PagedCache;
use proptest::prelude::*;
use std::collections::HashMap;

const N_LAYER: usize = 2;
const KV_DIM: usize = 3;

#[derive(Debug, Clone)]
enum Op {
    Append { seq: usize, n: usize },
    Fork { src: usize, dst: usize, frac: f64 },
    Truncate { seq: usize, frac: f64 },
    Free { seq: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0usize..6, 1usize..12).prop_map(|(seq, n)| Op::Append { seq, n }),
        2 => (0usize..6, 0usize..6, 0.0f64..=1.0).prop_map(|(src, dst, frac)| Op::Fork { src, dst, frac }),
        2 => (0usize..6, 0.0f64..=1.0).prop_map(|(seq, frac)| Op::Truncate { seq, frac }),
        1 => (0usize..6).prop_map(|seq| Op::Free { seq }),
    ]
}

/// The value written for (token, layer, component) so reads can be checked; `token` is a
/// globally unique id, since forked sequences share their prefix's tokens.
fn value(token: u64, layer: usize, c: usize) -> f32 {
    (token * 100 + layer as u64 * 10 + c as u64) as f32
}

/// One stored row, as f32.
fn read(rows: KvRows) -> Vec<f32> {
    let mut out = vec![0.0; KV_DIM];
    rows.axpy(KV_DIM, 0, 0..KV_DIM, 1.0, &mut out);
    out
}

fn check_invariants(
    cache: &PagedCache,
    model: &HashMap<usize, Vec<u64>>,
) -> Result<(), TestCaseError> {
    // Every block's reference count equals the number of tables that list it.
    let mut uses = vec![0u32; cache.allocator.n_blocks()];
    for &seq in model.keys() {
        let t = cache.table(seq).expect("live sequence has a table");
        prop_assert_eq!(t.len, model[&seq].len());
        prop_assert_eq!(t.blocks.len(), t.len.div_ceil(cache.block_size()));
        for &b in &t.blocks {
            uses[b as usize] += 1;
        }
    }
    let mut free = 0;
    for (b, &u) in uses.iter().enumerate() {
        prop_assert_eq!(cache.allocator.ref_count(b as u32), u, "block {}", b);
        free += usize::from(u == 0);
    }
    prop_assert_eq!(
        cache.allocator.n_free(),
        free,
        "free list must hold exactly the unused blocks"
    );
    // Every sequence reads back its own tokens.
    for (&seq, toks) in model {
        for layer in 0..N_LAYER {
            let view = cache.view(layer, seq);
            for (pos, &tok) in toks.iter().enumerate() {
                let want: Vec<f32> = (0..KV_DIM).map(|c| value(tok, layer, c)).collect();
                prop_assert_eq!(read(view.key(pos)), want.clone(), "seq {} pos {}", seq, pos);
                let want: Vec<f32> = want.iter().map(|v| -v).collect();
                prop_assert_eq!(
                    read(view.value(pos)),
                    want,
                    "value: seq {} pos {}",
                    seq,
                    pos
                );
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_appends_forks_and_frees_keep_the_pool_consistent(
        ops in prop::collection::vec(op(), 1..60), block_size in 1usize..6, n_blocks in 4usize..24
    ) {
        let mut cache = PagedCache::new(N_LAYER, KV_DIM, block_size, n_blocks);
        let mut model: HashMap<usize, Vec<u64>> = HashMap::new(); // seq -> token ids it holds
        let mut next_token = 0u64;
        for op in ops {
            match op {
                Op::Append { seq, n } => {
                    let have = model.get(&seq).map_or(0, |t| t.len());
                    let free_before = cache.allocator.n_free();
                    match cache.reserve(seq, have..have + n) {
                        Ok(()) => {
                            let toks = model.entry(seq).or_default();
                            for pos in have..have + n {
                                for layer in 0..N_LAYER {
                                    let k: Vec<f32> = (0..KV_DIM).map(|c| value(next_token, layer, c)).collect();
                                    let v: Vec<f32> = k.iter().map(|x| -x).collect();
                                    cache.store(layer, seq, pos, &k, &v);
                                }
                                toks.push(next_token);
                                next_token += 1;
                            }
                        }
                        Err(_) => {
                            // A refused reservation takes nothing.
                            prop_assert_eq!(cache.allocator.n_free(), free_before);
                        }
                    }
                }
                Op::Fork { src, dst, frac } => {
                    if let (Some(toks), false) = (model.get(&src).cloned(), model.contains_key(&dst)) {
                        let n = (toks.len() as f64 * frac) as usize;
                        cache.fork(src, dst, n).unwrap();
                        model.insert(dst, toks[..n].to_vec());
                    } else {
                        prop_assert!(cache.fork(src, dst, 0).is_err());
                    }
                }
                Op::Truncate { seq, frac } => {
                    // A truncated sequence keeps its first n tokens; whoever shared the
                    // positions after them keeps reading its own.
                    if let Some(toks) = model.get_mut(&seq) {
                        let n = (toks.len() as f64 * frac) as usize;
                        cache.truncate(seq, n);
                        toks.truncate(n);
                    }
                }
                Op::Free { seq } => {
                    cache.free(seq);
                    model.remove(&seq);
                }
            }
            check_invariants(&cache, &model)?;
        }
        for seq in model.keys().copied().collect::<Vec<_>>() {
            cache.free(seq);
        }
        prop_assert_eq!(cache.allocator.n_free(), n_blocks, "freeing every sequence returns every block");
    }
}

/// A pool is usable to its last block: a reservation that needs exactly the free blocks is
/// granted, and the next one, which needs one more, is refused and takes nothing.
#[test]
fn a_reservation_may_take_the_last_free_block() {
    let mut cache = PagedCache::new(N_LAYER, KV_DIM, 4, 3);
    cache.reserve(0, 0..6).unwrap(); // 2 blocks
    cache.reserve(1, 0..4).unwrap(); // the last one
    assert_eq!(cache.allocator.n_free(), 0);
    assert!(
        cache.reserve(0, 6..9).is_err(),
        "a third block for sequence 0 from an empty pool"
    );
    assert_eq!(cache.allocator.n_free(), 0);
    assert_eq!(cache.table(0).unwrap().len, 6);
    cache.reserve(0, 6..8).unwrap(); // within its second block: no new one
}

#[test]
fn a_shared_prefix_is_stored_once() {
    let mut cache = PagedCache::new(N_LAYER, KV_DIM, 4, 8);
    cache.reserve(0, 0..10).unwrap(); // 3 blocks
    cache.fork(0, 1, 8).unwrap(); // shares the 2 full blocks
    assert_eq!(cache.allocator.n_free(), 5);
    cache.reserve(1, 8..9).unwrap(); // a new block for seq 1 only
    assert_eq!(cache.allocator.n_free(), 4);
    let (a, b) = (
        cache.table(0).unwrap().blocks.clone(),
        cache.table(1).unwrap().blocks.clone(),
    );
    assert_eq!(a[..2], b[..2]);
    assert_ne!(a[2], b[2]);
}
