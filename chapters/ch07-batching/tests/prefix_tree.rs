//! Property tests of the prefix cache's radix tree against a plain map from cached prefixes to
//! blocks: random inserts (sequences that share beginnings), lookups and evictions, with some
//! blocks held by "running sequences" so that eviction must leave them alone.

use ch05::{BlockAllocator, BlockId};
use ch07::PrefixCache;
use proptest::prelude::*;
use std::collections::{HashMap, HashSet};

#[derive(Debug, Clone)]
enum Op {
    /// A sequence of these tokens computed its keys and values and offers its blocks.
    Insert(Vec<u32>),
    /// A request with these tokens looks for a cached prefix; `hold` keeps the blocks found
    /// (it runs on), else it lets them go at once.
    Lookup(Vec<u32>, bool),
    Evict(usize),
}

fn tokens() -> impl Strategy<Value = Vec<u32>> {
    // Two symbols: long shared beginnings, splits in the middle of edges.
    prop::collection::vec(0u32..2, 0..24)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => tokens().prop_map(Op::Insert),
        2 => (tokens(), any::<bool>()).prop_map(|(t, h)| Op::Lookup(t, h)),
        1 => (0usize..6).prop_map(Op::Evict),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn the_tree_caches_exactly_what_was_inserted_and_not_evicted(
        ops in prop::collection::vec(op(), 1..40), block_size in 1usize..4,
    ) {
        let mut alloc = BlockAllocator::new(400);
        let mut tree = PrefixCache::new(block_size);
        // Cached prefix (a whole number of blocks) -> the block holding its last block.
        let mut want: HashMap<Vec<u32>, BlockId> = HashMap::new();
        let mut held: Vec<BlockId> = Vec::new(); // references of "running sequences"
        for op in ops {
            match op {
                Op::Insert(t) => {
                    let n = t.len() / block_size;
                    let blocks: Vec<BlockId> = (0..n).map(|_| alloc.allocate().unwrap()).collect();
                    let added = tree.insert(0, &t, &blocks, &mut alloc);
                    let mut new = 0;
                    for k in 1..=n {
                        if let std::collections::hash_map::Entry::Vacant(e) = want.entry(t[..k * block_size].to_vec()) {
                            e.insert(blocks[k - 1]);
                            new += 1;
                        }
                    }
                    prop_assert_eq!(added, new);
                    for b in blocks {
                        alloc.release(b); // the sequence ends; the tree keeps what it took
                    }
                }
                Op::Lookup(t, hold) => {
                    let found = tree.lookup(0, &t);
                    let mut expect = Vec::new();
                    while let Some(&b) = t.get(..(expect.len() + 1) * block_size).and_then(|p| want.get(p)) {
                        expect.push(b);
                    }
                    prop_assert_eq!(&found, &expect);
                    if hold {
                        for &b in &found {
                            alloc.retain(b);
                        }
                        held.extend(found);
                    }
                }
                Op::Evict(n) => {
                    let free_before = alloc.n_free();
                    let freed = tree.evict(n, &mut alloc);
                    prop_assert_eq!(alloc.n_free(), free_before + freed);
                    let now: HashMap<Vec<u32>, BlockId> = tree.entries().into_iter().collect();
                    let gone: Vec<&Vec<u32>> = want.keys().filter(|p| !now.contains_key(*p)).collect();
                    prop_assert_eq!(gone.len(), freed);
                    for p in gone {
                        // Only unused blocks go, and never a prefix whose extension stays.
                        prop_assert!(!held.contains(&want[p]), "evicted a block in use");
                        prop_assert!(!now.keys().any(|q| q.starts_with(p)), "evicted a prefix of something cached");
                    }
                    want = now;
                    if freed < n {
                        // It stopped early only because everything left is in use.
                        prop_assert_eq!(tree.n_evictable(&alloc), 0);
                    }
                }
            }
            prop_assert!(tree.is_well_formed());
            let entries: HashMap<Vec<u32>, BlockId> = tree.entries().into_iter().collect();
            prop_assert_eq!(&entries, &want);
            prop_assert_eq!(tree.n_blocks(), want.len());
            let distinct: HashSet<BlockId> = want.values().copied().collect();
            prop_assert_eq!(distinct.len(), want.len(), "a block cached twice");
        }
        for b in held {
            alloc.release(b);
        }
        tree.clear(&mut alloc);
        prop_assert_eq!(alloc.n_free(), 400);
    }
}

/// A sequence with tokens `t` offers its blocks to the tree and ends.
fn offer(tree: &mut PrefixCache, alloc: &mut BlockAllocator, t: &[u32]) {
    offer_in(tree, alloc, 0, t)
}

/// [`offer`], in `partition`.
fn offer_in(tree: &mut PrefixCache, alloc: &mut BlockAllocator, partition: u64, t: &[u32]) {
    let blocks: Vec<BlockId> = (0..t.len() / tree.block_size())
        .map(|_| alloc.allocate().unwrap())
        .collect();
    tree.insert(partition, t, &blocks, alloc);
    for b in blocks {
        alloc.release(b);
    }
}

/// Eviction takes the least recently used leaf first, from its end, and a parent left with
/// one child absorbs it.
#[test]
fn the_least_recently_used_prefix_goes_first() {
    let mut alloc = BlockAllocator::new(16);
    let mut tree = PrefixCache::new(2);
    offer(&mut tree, &mut alloc, &[1, 1, 2, 2, 3, 3]); // blocks 0 1 2
    offer(&mut tree, &mut alloc, &[1, 1, 5, 5]); // [1 1] is cached: only block 4 is kept
    let drawn = tree.draw(&|t| format!("{t:?}"));
    assert_eq!(
        drawn,
        "(root)\n└─ \"[1, 1]\"  blocks [0]\n   ├─ \"[2, 2, 3, 3]\"  blocks [1, 2]\n   └─ \"[5, 5]\"  blocks [4]\n"
    );
    tree.lookup(0, &[1, 1, 2, 2, 3, 3, 9]); // the first prompt is used again
    assert_eq!(tree.evict(1, &mut alloc), 1);
    assert_eq!(
        tree.lookup(0, &[1, 1, 5, 5]),
        vec![0],
        "the older leaf went first"
    );
    assert_eq!(
        tree.draw(&|t| format!("{t:?}")),
        "(root)\n└─ \"[1, 1, 2, 2, 3, 3]\"  blocks [0, 1, 2]\n"
    );
    assert_eq!(tree.evict(1, &mut alloc), 1);
    assert_eq!(
        tree.lookup(0, &[1, 1, 2, 2, 3, 3]),
        vec![0, 1],
        "then the other's last block"
    );
    assert_eq!(alloc.n_free(), 14);
}

/// A prefix cached in one partition is found in that partition only; each partition's tree
/// evicts like the one tree, and a partition whose tree empties leaves nothing behind.
#[test]
fn a_prefix_cached_in_one_partition_is_found_in_no_other() {
    let mut alloc = BlockAllocator::new(32);
    let mut tree = PrefixCache::new(2);
    let secret = [7, 7, 8, 8, 9, 9];
    offer_in(&mut tree, &mut alloc, 41, &secret);
    assert!(tree.is_well_formed());
    assert_eq!(tree.lookup(41, &secret).len(), 3);
    assert!(
        tree.lookup(0, &secret).is_empty(),
        "found outside its partition"
    );
    assert!(
        tree.lookup(42, &secret).is_empty(),
        "found in another partition"
    );
    // The same prompt in another partition is cached again, in blocks of its own.
    offer_in(&mut tree, &mut alloc, 42, &secret);
    offer(&mut tree, &mut alloc, &secret);
    let (a, b, c) = (
        tree.lookup(41, &secret),
        tree.lookup(42, &secret),
        tree.lookup(0, &secret),
    );
    assert_eq!((a.len(), b.len(), c.len()), (3, 3, 3));
    assert!(
        a.iter().all(|x| !b.contains(x) && !c.contains(x)),
        "{a:?} {b:?} {c:?}"
    );
    assert!(tree.is_well_formed());
    assert_eq!(tree.n_blocks(), 9);
    // Evicting everything empties every tree; the partitions' roots go with them.
    assert_eq!(tree.evict(100, &mut alloc), 9);
    assert!(tree.is_well_formed());
    assert!(tree.entries().is_empty());
    assert_eq!(alloc.n_free(), 32);
    offer_in(&mut tree, &mut alloc, 41, &secret);
    assert!(tree.is_well_formed());
    assert_eq!(tree.lookup(41, &secret).len(), 3);
}
