//! A prefix cache in the spirit of SGLang's RadixAttention: keys and values of prompts that
//! were computed before, found again by their token ids.
//!
//! Many requests start alike: the same system prompt, the same chat template, the same
//! few-shot examples, the conversation so far. Their keys and values are the same too (a
//! position's K and V depend only on the tokens up to it), so a request whose prompt starts with
//! a cached prefix can attach those blocks and compute only the rest.
//!
//! The cache is a radix tree over token ids. Each edge is labelled with a run of tokens and
//! owns the KV blocks that hold them; a path from the root spells a cached prefix. Edges are
//! whole blocks: the tree never holds a partly filled block, because a partly filled block is
//! still being written by the sequence that owns it. (SGLang's tree is token-granular; with
//! blocks of 16 tokens we give up at most 15 tokens of each hit.)
//!
//! ```text
//!   (root)
//!     └─ "<|im_start|>system⏎You are a helpful…"   blocks [0 1]
//!          ├─ "…user⏎What is the capital…"        blocks [2]
//!          └─ "…user⏎Write a poem…"               blocks [5 6]
//! ```
//!
//! Sharing goes through the block allocator's reference counts: the tree holds one reference
//! to each of its blocks, and every running sequence that attached them holds one more. A
//! block only the tree holds (reference count 1) can be evicted; the least recently used leaf
//! gives up its last block first, so a prefix is never evicted before its extensions.
//!
//! A cache hit is visible from outside: a request that finds its prefix cached is answered
//! sooner, and a server that reports cached tokens says so outright. So the cache can be
//! *partitioned*: a tree per partition, each from a root of its own, and a prefix cached in
//! one partition is never found in another. Requests that must not learn what the others sent
//! go in partitions of their own; partition 0 is everyone else's.

use ch05::{BlockAllocator, BlockId};
use std::collections::HashMap;

/// Index of a node in the tree's arena.
type NodeId = usize;
const ROOT: NodeId = 0;

#[derive(Debug, Default)]
struct Node {
    tokens: Vec<u32>, // (n_blocks * block_size): the edge's label, from the parent to here
    blocks: Vec<BlockId>, // (n_blocks): the keys and values of `tokens`
    parent: NodeId,
    /// Children by the first block of their label: two children never share a first block.
    children: HashMap<Vec<u32>, NodeId>,
    last_used: u64,
}

// ANCHOR: prefix_cache
/// A radix tree over token ids whose edges own KV blocks.
#[derive(Debug)]
pub struct PrefixCache {
    block_size: usize,
    nodes: Vec<Node>, // arena; nodes[ROOT] (partition 0) and each partition's root: no label
    /// The root of each partition's tree but 0's (which is `ROOT`); a root is its own parent.
    roots: HashMap<u64, NodeId>,
    free_nodes: Vec<NodeId>,
    clock: u64, // ticks on every lookup and insert: the LRU order
    n_blocks: usize,
}
// ANCHOR_END: prefix_cache

impl PrefixCache {
    pub fn new(block_size: usize) -> PrefixCache {
        PrefixCache {
            block_size: block_size.max(1),
            nodes: vec![Node::default()],
            roots: HashMap::new(),
            free_nodes: Vec::new(),
            clock: 0,
            n_blocks: 0,
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks the tree holds a reference to.
    pub fn n_blocks(&self) -> usize {
        self.n_blocks
    }

    /// Every block the tree holds a reference to.
    pub fn blocks(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.live()
            .flat_map(|n| self.nodes[n].blocks.iter().copied())
    }

    /// Blocks that only the tree holds, so evicting them would free them.
    pub fn n_evictable(&self, alloc: &BlockAllocator) -> usize {
        self.blocks().filter(|&b| alloc.ref_count(b) == 1).count()
    }

    fn live(&self) -> impl Iterator<Item = NodeId> + '_ {
        // A freed node has an empty label; only the roots are live with one.
        (1..self.nodes.len()).filter(|&n| !self.nodes[n].blocks.is_empty())
    }

    /// The root of `partition`'s tree, if it has one.
    fn root(&self, partition: u64) -> Option<NodeId> {
        match partition {
            0 => Some(ROOT),
            s => self.roots.get(&s).copied(),
        }
    }

    fn is_root(&self, id: NodeId) -> bool {
        self.nodes[id].parent == id
    }

    /// How many whole blocks of `edge` (a node's label) equal the start of `tokens`.
    fn matching_blocks(&self, edge: &[u32], tokens: &[u32]) -> usize {
        let bs = self.block_size;
        edge.chunks_exact(bs)
            .zip(tokens.chunks_exact(bs))
            .take_while(|(a, b)| a == b)
            .count()
    }

    // ANCHOR: lookup
    /// The blocks of the longest prefix of `tokens` cached in `partition`, in whole blocks: they
    /// hold the keys and values of `tokens[..blocks.len() * block_size]`. Marks the path as
    /// recently used. The caller must retain the blocks (e.g. with `PagedCache::attach`)
    /// before anything can be evicted.
    pub fn lookup(&mut self, partition: u64, tokens: &[u32]) -> Vec<BlockId> {
        // ANCHOR: yours_lookup
        let bs = self.block_size;
        self.clock += 1;
        let mut found = Vec::new();
        let Some(mut node) = self.root(partition) else {
            return found;
        };
        loop {
            self.nodes[node].last_used = self.clock;
            let rest = &tokens[found.len() * bs..];
            let Some(&child) = rest
                .get(..bs)
                .and_then(|k| self.nodes[node].children.get(k))
            else {
                return found;
            };
            let c = &self.nodes[child];
            let j = self.matching_blocks(&c.tokens, rest);
            found.extend_from_slice(&c.blocks[..j]);
            if j < c.blocks.len() {
                self.nodes[child].last_used = self.clock;
                return found;
            }
            node = child;
        }
        // ANCHOR_END: yours_lookup
    }
    // ANCHOR_END: lookup

    // ANCHOR: insert
    /// Cache the whole blocks of `tokens` in `partition`, their keys and values in `blocks` (a
    /// sequence's block table; a partly filled last block is ignored). Parts already cached
    /// keep their blocks; the tree takes a reference to each block it adds. Returns how many
    /// it added.
    pub fn insert(
        &mut self,
        partition: u64,
        tokens: &[u32],
        blocks: &[BlockId],
        alloc: &mut BlockAllocator,
    ) -> usize {
        let bs = self.block_size;
        let n = (tokens.len() / bs).min(blocks.len());
        if n == 0 {
            return 0;
        }
        let (tokens, blocks) = (&tokens[..n * bs], &blocks[..n]);
        self.clock += 1;
        let root = match self.root(partition) {
            Some(r) => r,
            None => {
                let id = self.new_node(Node::default());
                self.nodes[id].parent = id;
                self.roots.insert(partition, id);
                id
            }
        };
        // ANCHOR_END: insert
        // ANCHOR: insert_walk
        let (mut node, mut i) = (root, 0); // i: blocks of `tokens` matched so far
        loop {
            self.nodes[node].last_used = self.clock;
            if i == n {
                return 0;
            }
            let key = &tokens[i * bs..(i + 1) * bs];
            let Some(&child) = self.nodes[node].children.get(key) else {
                // The rest is new: the tree takes one reference to each of its blocks.
                for &b in &blocks[i..] {
                    alloc.retain(b);
                }
                self.n_blocks += n - i;
                if !self.is_root(node) && self.nodes[node].children.is_empty() {
                    // A leaf grows longer (a node with one child would not be a radix tree).
                    let leaf = &mut self.nodes[node];
                    leaf.tokens.extend_from_slice(&tokens[i * bs..]);
                    leaf.blocks.extend_from_slice(&blocks[i..]);
                    return n - i;
                }
                let leaf = self.new_node(Node {
                    tokens: tokens[i * bs..].to_vec(),
                    blocks: blocks[i..].to_vec(),
                    parent: node,
                    children: HashMap::new(),
                    last_used: self.clock,
                });
                self.nodes[node].children.insert(key.to_vec(), leaf);
                return n - i;
            };
            let edge_blocks = self.nodes[child].blocks.len();
            let j = self.matching_blocks(&self.nodes[child].tokens, &tokens[i * bs..]);
            if j < edge_blocks && i + j < n {
                // The tokens leave this edge in the middle: split it where they part.
                node = self.split(child, j);
            } else {
                node = child;
            }
            i += j;
        }
    }
    // ANCHOR_END: insert_walk

    /// Cut `child`'s label after `j` blocks (0 < j < its length): a new node takes the first
    /// part and becomes `child`'s parent. Returns the new node.
    fn split(&mut self, child: NodeId, j: usize) -> NodeId {
        let bs = self.block_size;
        let c = &mut self.nodes[child];
        let tokens: Vec<u32> = c.tokens.drain(..j * bs).collect();
        let blocks: Vec<BlockId> = c.blocks.drain(..j).collect();
        let (parent, last_used) = (c.parent, c.last_used);
        let lower_key = c.tokens[..bs].to_vec();
        let upper_key = tokens[..bs].to_vec();
        let upper = self.new_node(Node {
            tokens,
            blocks,
            parent,
            children: HashMap::from([(lower_key, child)]),
            last_used,
        });
        self.nodes[child].parent = upper;
        self.nodes[parent].children.insert(upper_key, upper);
        upper
    }

    fn new_node(&mut self, node: Node) -> NodeId {
        match self.free_nodes.pop() {
            Some(id) => {
                self.nodes[id] = node;
                id
            }
            None => {
                self.nodes.push(node);
                self.nodes.len() - 1
            }
        }
    }

    // ANCHOR: evict
    /// Free up to `n` blocks that only the tree holds, least recently used leaf first, each
    /// leaf from its end. Returns how many were freed (fewer when the rest is in use).
    pub fn evict(&mut self, n: usize, alloc: &mut BlockAllocator) -> usize {
        // ANCHOR: yours_evict
        let mut freed = 0;
        while freed < n {
            let victim = self
                .live()
                .filter(|&id| {
                    let node = &self.nodes[id];
                    node.children.is_empty() && alloc.ref_count(*node.blocks.last().unwrap()) == 1
                })
                .min_by_key(|&id| self.nodes[id].last_used);
            let Some(leaf) = victim else { break };
            let b = self.nodes[leaf]
                .blocks
                .pop()
                .expect("live nodes have blocks");
            alloc.release(b);
            self.n_blocks -= 1;
            freed += 1;
            let bs = self.block_size;
            let node = &mut self.nodes[leaf];
            let key = node.tokens[..bs].to_vec();
            node.tokens.truncate(node.tokens.len() - bs);
            if node.blocks.is_empty() {
                self.remove_leaf(leaf, &key);
            }
        }
        freed
        // ANCHOR_END: yours_evict
    }
    // ANCHOR_END: evict

    /// Unlink an emptied leaf (`key`: its former first block). A parent left with a single
    /// child absorbs it, so every inner node keeps at least two children (a radix tree).
    fn remove_leaf(&mut self, leaf: NodeId, key: &[u32]) {
        let parent = self.nodes[leaf].parent;
        self.nodes[parent].children.remove(key);
        self.nodes[leaf] = Node::default();
        self.free_nodes.push(leaf);
        if parent != ROOT && self.is_root(parent) && self.nodes[parent].children.is_empty() {
            // A partition's tree emptied: its root goes too, so partitions that come and go leave
            // nothing.
            self.roots.retain(|_, &mut r| r != parent);
            self.nodes[parent] = Node::default();
            self.free_nodes.push(parent);
            return;
        }
        if !self.is_root(parent) && self.nodes[parent].children.len() == 1 {
            let (_, &only) = self.nodes[parent].children.iter().next().unwrap();
            let child = std::mem::take(&mut self.nodes[only]);
            for &grandchild in child.children.values() {
                self.nodes[grandchild].parent = parent;
            }
            let p = &mut self.nodes[parent];
            p.tokens.extend(child.tokens);
            p.blocks.extend(child.blocks);
            p.children = child.children;
            p.last_used = p.last_used.max(child.last_used);
            self.free_nodes.push(only);
        }
    }

    /// Release every block and forget everything.
    pub fn clear(&mut self, alloc: &mut BlockAllocator) {
        for b in self.blocks().collect::<Vec<_>>() {
            alloc.release(b);
        }
        *self = PrefixCache::new(self.block_size);
    }

    /// Every cached prefix that ends a block, with the block holding its last `block_size`
    /// tokens, in depth-first order: what the tree means, independent of its shape.
    pub fn entries(&self) -> Vec<(Vec<u32>, BlockId)> {
        let mut out = Vec::new();
        let mut roots: Vec<(u64, NodeId)> = self.roots.iter().map(|(&s, &r)| (s, r)).collect();
        roots.sort_unstable();
        let mut stack: Vec<(NodeId, Vec<u32>)> =
            roots.iter().rev().map(|&(_, r)| (r, Vec::new())).collect();
        stack.push((ROOT, Vec::new()));
        while let Some((id, prefix)) = stack.pop() {
            let node = &self.nodes[id];
            let mut p = prefix;
            for (chunk, &b) in node.tokens.chunks_exact(self.block_size).zip(&node.blocks) {
                p.extend_from_slice(chunk);
                out.push((p.clone(), b));
            }
            let mut kids: Vec<NodeId> = node.children.values().copied().collect();
            kids.sort_by_key(|&k| std::cmp::Reverse(self.nodes[k].tokens.clone()));
            stack.extend(kids.into_iter().map(|k| (k, p.clone())));
        }
        out
    }

    /// Whether the tree is a proper radix tree: children's first blocks are their keys, parent
    /// links agree, labels are whole blocks, and no inner node but the root has one child.
    pub fn is_well_formed(&self) -> bool {
        let bs = self.block_size;
        let mut reached = 0;
        let mut stack: Vec<NodeId> = self.roots.values().copied().collect();
        stack.push(ROOT);
        while let Some(id) = stack.pop() {
            reached += 1;
            let node = &self.nodes[id];
            if id != ROOT && self.is_root(id) && node.children.is_empty() {
                return false; // an emptied partition's root is removed
            }
            if !self.is_root(id)
                && (node.blocks.is_empty()
                    || node.tokens.len() != node.blocks.len() * bs
                    || node.children.len() == 1)
            {
                return false;
            }
            for (key, &child) in &node.children {
                let c = &self.nodes[child];
                if c.parent != id || c.tokens.get(..bs) != Some(&key[..]) {
                    return false;
                }
                stack.push(child);
            }
        }
        reached == self.live().count() + 1 + self.roots.len()
            && self.n_blocks
                == self
                    .live()
                    .map(|n| self.nodes[n].blocks.len())
                    .sum::<usize>()
    }

    /// The tree as indented text, each label shown by `label` (e.g. detokenized), with its
    /// blocks: how the book draws it.
    pub fn draw(&self, label: &dyn Fn(&[u32]) -> String) -> String {
        let mut out = String::from("(root)\n");
        self.draw_children(ROOT, "", label, &mut out);
        out
    }

    fn draw_children(
        &self,
        id: NodeId,
        indent: &str,
        label: &dyn Fn(&[u32]) -> String,
        out: &mut String,
    ) {
        let mut kids: Vec<NodeId> = self.nodes[id].children.values().copied().collect();
        kids.sort_by_key(|&k| self.nodes[k].blocks[0]);
        for (i, &k) in kids.iter().enumerate() {
            let last = i + 1 == kids.len();
            let node = &self.nodes[k];
            out.push_str(&format!(
                "{indent}{} {:?}  blocks {:?}\n",
                if last { "└─" } else { "├─" },
                label(&node.tokens),
                node.blocks
            ));
            let deeper = format!("{indent}{}", if last { "   " } else { "│  " });
            self.draw_children(k, &deeper, label, out);
        }
    }
}
