//! A paged KV cache, in the spirit of vLLM's PagedAttention.
//!
//! Memory is a pool of fixed-size blocks, each holding the keys and values of `block_size`
//! positions for every layer. A sequence owns a block table: the list of its blocks in
//! position order, so position `p` lives in block `table[p / block_size]` at row
//! `p % block_size`. Like an operating system's page table, this lets sequences grow one block at
//! a time without reserving their maximum length up front, and lets two sequences share blocks:
//! a common prompt prefix is stored once, with a reference count per block.
//!
//! ```text
//!   seq 0 table: [ 4 ][ 7 ][ 2 ]        pool: [0][1][2][3][4][5][6][7] …
//!   seq 1 table: [ 4 ][ 7 ][ 5 ]                      ^        ^     ^
//!                  └──┴── shared (refcount 2)          └─ seq 0's and seq 1's own last blocks
//! ```
//!
//! A shared block is never written: when a sequence must write into a block someone else also
//! uses (its last, partly filled block after a fork), it first gets a private copy
//! (copy-on-write). Full shared blocks are never copied.

use crate::rows::{CacheTypes, RowBuf, kv_buffers};
use ch03::kv::{KvError, KvRows, KvStore, KvView};

/// Index of a block in the pool.
pub type BlockId = u32;

// ANCHOR: allocator
/// Hands out blocks from a free list and counts their users.
#[derive(Debug, Clone)]
pub struct BlockAllocator {
    free: Vec<BlockId>,
    refs: Vec<u32>, // (n_blocks): users of each block; 0 = free
}

impl BlockAllocator {
    pub fn new(n_blocks: usize) -> BlockAllocator {
        // Reversed so that blocks are handed out 0, 1, 2, …: easier to read in a debugger.
        BlockAllocator {
            free: (0..n_blocks as BlockId).rev().collect(),
            refs: vec![0; n_blocks],
        }
    }

    /// A free block, now with one user; `None` when the pool is exhausted.
    pub fn allocate(&mut self) -> Option<BlockId> {
        // ANCHOR: yours_allocate
        let b = self.free.pop()?;
        self.refs[b as usize] = 1;
        Some(b)
        // ANCHOR_END: yours_allocate
    }

    /// One more user of an allocated block.
    pub fn retain(&mut self, b: BlockId) {
        assert!(self.refs[b as usize] > 0, "retain of free block {b}");
        self.refs[b as usize] += 1;
    }

    /// One user fewer; the block returns to the free list when it has none.
    pub fn release(&mut self, b: BlockId) {
        // ANCHOR: yours_release
        let r = &mut self.refs[b as usize];
        assert!(*r > 0, "release of free block {b}");
        *r -= 1;
        if *r == 0 {
            self.free.push(b);
        }
        // ANCHOR_END: yours_release
    }

    pub fn ref_count(&self, b: BlockId) -> u32 {
        self.refs[b as usize]
    }

    pub fn n_free(&self) -> usize {
        self.free.len()
    }

    pub fn n_blocks(&self) -> usize {
        self.refs.len()
    }
}
// ANCHOR_END: allocator

// ANCHOR: paged
/// A sequence's blocks and length.
#[derive(Debug, Clone, Default)]
pub struct BlockTable {
    pub blocks: Vec<BlockId>,
    pub len: usize, // positions stored
}

/// Keys and values of many sequences in one pool of blocks.
pub struct PagedCache {
    n_layer: usize,
    kv_dim: usize,
    block_size: usize,
    types: CacheTypes,
    k: RowBuf, // (n_blocks, n_layer, block_size, kv_dim) in types.k
    v: RowBuf, // (n_blocks, n_layer, block_size, kv_dim) in types.v
    pub allocator: BlockAllocator,
    tables: Vec<Option<BlockTable>>, // by sequence id
}
// ANCHOR_END: paged

impl PagedCache {
    /// A pool of `n_blocks` blocks of `block_size` positions.
    ///
    /// # Panics
    /// If the size overflows or exceeds the machine's memory: sizes from a file or a flag go
    /// through [`PagedCache::try_new`] first.
    pub fn new(n_layer: usize, kv_dim: usize, block_size: usize, n_blocks: usize) -> PagedCache {
        Self::try_new(n_layer, kv_dim, block_size, n_blocks).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`PagedCache::new`], with the size checked (for overflow and against the machine's
    /// memory) before anything is allocated.
    pub fn try_new(
        n_layer: usize,
        kv_dim: usize,
        block_size: usize,
        n_blocks: usize,
    ) -> Result<PagedCache, KvError> {
        Self::try_typed(n_layer, kv_dim, block_size, n_blocks, CacheTypes::F32)
    }

    /// [`PagedCache::try_new`] keeping keys and values in `types`.
    pub fn try_typed(
        n_layer: usize,
        kv_dim: usize,
        block_size: usize,
        n_blocks: usize,
        types: CacheTypes,
    ) -> Result<PagedCache, KvError> {
        let (k, v) = kv_buffers(
            &format!("a paged KV cache of {n_blocks} blocks"),
            &[
                ("blocks", n_blocks),
                ("layers", n_layer),
                ("block size", block_size),
            ],
            kv_dim,
            types,
            true,
        )?;
        Ok(PagedCache {
            n_layer,
            kv_dim,
            block_size,
            types,
            k,
            v,
            allocator: BlockAllocator::new(n_blocks),
            tables: Vec::new(),
        })
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The types keys and values are kept in.
    pub fn types(&self) -> CacheTypes {
        self.types
    }

    /// Bytes held by the pool.
    pub fn bytes(&self) -> usize {
        self.k.bytes() + self.v.bytes()
    }

    /// The block table of `seq`, if it exists.
    pub fn table(&self, seq: usize) -> Option<&BlockTable> {
        self.tables.get(seq).and_then(|t| t.as_ref())
    }

    /// Positions stored for `seq`.
    pub fn len(&self, seq: usize) -> usize {
        self.table(seq).map_or(0, |t| t.len)
    }

    // ANCHOR: fork
    /// Start `dst` as a copy of `src`'s first `n` positions without copying anything: the
    /// blocks are shared and their reference counts go up. `dst` must not exist.
    pub fn fork(&mut self, src: usize, dst: usize, n: usize) -> Result<(), KvError> {
        let t = self
            .table(src)
            .ok_or_else(|| KvError::Other(format!("fork: no sequence {src}")))?;
        if n > t.len {
            return Err(KvError::Other(format!(
                "fork: sequence {src} has {} positions, not {n}",
                t.len
            )));
        }
        if self.table(dst).is_some() {
            return Err(KvError::Other(format!(
                "fork: sequence {dst} already exists"
            )));
        }
        let blocks = t.blocks[..n.div_ceil(self.block_size)].to_vec();
        self.attach(dst, &blocks, n)
    }
    // ANCHOR_END: fork

    /// Start sequence `seq` from existing `blocks` holding `n` positions (retaining each): how
    /// a prefix cache hands cached blocks to a new request.
    pub fn attach(&mut self, seq: usize, blocks: &[BlockId], n: usize) -> Result<(), KvError> {
        if self.table(seq).is_some() {
            return Err(KvError::Other(format!(
                "attach: sequence {seq} already exists"
            )));
        }
        if blocks.len() != n.div_ceil(self.block_size) {
            return Err(KvError::Other(format!(
                "attach: {} blocks cannot hold exactly {n} positions",
                blocks.len()
            )));
        }
        for &b in blocks {
            self.allocator.retain(b);
        }
        if self.tables.len() <= seq {
            self.tables.resize(seq + 1, None);
        }
        self.tables[seq] = Some(BlockTable {
            blocks: blocks.to_vec(),
            len: n,
        });
        Ok(())
    }

    // ANCHOR: truncate
    /// Forget `seq`'s positions from `n` on, releasing the blocks past the one that holds
    /// position `n - 1`; nothing is copied. A block other sequences share only loses this
    /// sequence's reference, and if the new last block is shared, the next write to it copies
    /// it first ([`reserve`](KvStore::reserve)'s copy-on-write), so what they read never
    /// changes: one sequence goes back to an earlier position (to generate again from there)
    /// without touching the others.
    pub fn truncate(&mut self, seq: usize, n: usize) {
        let bs = self.block_size;
        if let Some(t) = self.tables.get_mut(seq).and_then(|t| t.as_mut()) {
            t.len = t.len.min(n);
            for b in t.blocks.drain(t.len.div_ceil(bs)..) {
                self.allocator.release(b);
            }
        }
    }
    // ANCHOR_END: truncate

    /// Drop sequence `seq`, releasing its blocks.
    pub fn free(&mut self, seq: usize) {
        if let Some(t) = self.tables.get_mut(seq).and_then(|t| t.take()) {
            for b in t.blocks {
                self.allocator.release(b);
            }
        }
    }

    // ANCHOR: offset
    /// The row of position `row` of `block` in `layer`.
    fn offset(&self, block: BlockId, layer: usize, row: usize) -> usize {
        // ANCHOR: yours_offset
        (block as usize * self.n_layer + layer) * self.block_size + row
        // ANCHOR_END: yours_offset
    }

    fn copy_block(&mut self, from: BlockId, to: BlockId) {
        let n = self.n_layer * self.block_size; // rows per block
        let (f, t) = (from as usize * n, to as usize * n);
        self.k.copy_rows(f, t, n, self.kv_dim);
        self.v.copy_rows(f, t, n, self.kv_dim);
    }
    // ANCHOR_END: offset
}

/// A view of one layer of one sequence.
pub struct PagedView<'a> {
    cache: &'a PagedCache,
    blocks: &'a [BlockId],
    layer: usize,
}

impl KvView for PagedView<'_> {
    fn key_run(&self, pos: usize, max: usize) -> KvRows<'_> {
        let (o, k) = self.run(pos, max);
        self.cache.k.run(o, k, self.cache.kv_dim)
    }
    fn value_run(&self, pos: usize, max: usize) -> KvRows<'_> {
        let (o, k) = self.run(pos, max);
        self.cache.v.run(o, k, self.cache.kv_dim)
    }
}

impl PagedView<'_> {
    /// Where the run of positions from `pos` starts, and its length: up to `max` positions,
    /// but not past the end of `pos`'s block.
    fn run(&self, pos: usize, max: usize) -> (usize, usize) {
        let c = self.cache;
        let row = pos % c.block_size;
        let o = c.offset(self.blocks[pos / c.block_size], self.layer, row);
        (o, max.min(c.block_size - row).max(1))
    }
}

impl KvStore for PagedCache {
    type View<'a> = PagedView<'a>;

    // ANCHOR: reserve
    /// Grow `seq`'s block table to cover `positions`, copying a shared last block before it is
    /// written (copy-on-write). All blocks are found before any is taken, so a full pool leaves
    /// the cache unchanged.
    fn reserve(&mut self, seq: usize, positions: std::ops::Range<usize>) -> Result<(), KvError> {
        // ANCHOR: yours_reserve
        let bs = self.block_size;
        let (len, n_blocks, last_shared) = match self.table(seq) {
            Some(t) => {
                let last = t.blocks.last().copied();
                let partial = t.len % bs != 0;
                (
                    t.len,
                    t.blocks.len(),
                    last.filter(|&b| partial && self.allocator.ref_count(b) > 1),
                )
            }
            None => (0, 0, None),
        };
        if positions.start > len {
            return Err(KvError::Gap {
                seq,
                have: len,
                start: positions.start,
            });
        }
        let end = positions.end.max(len);
        let needed =
            end.div_ceil(bs) - n_blocks + usize::from(last_shared.is_some() && positions.end > len);
        if needed > self.allocator.n_free() {
            return Err(KvError::Full {
                seq,
                needed: end,
                capacity: len + self.allocator.n_free() * bs,
            });
        }
        if self.tables.len() <= seq {
            self.tables.resize(seq + 1, None);
        }
        let mut table = self.tables[seq].take().unwrap_or_default();
        if let Some(shared) = last_shared.filter(|_| positions.end > len) {
            let private = self.allocator.allocate().expect("counted above");
            self.copy_block(shared, private);
            self.allocator.release(shared);
            *table.blocks.last_mut().expect("has a last block") = private;
        }
        while table.blocks.len() < end.div_ceil(bs) {
            table
                .blocks
                .push(self.allocator.allocate().expect("counted above"));
        }
        table.len = end;
        self.tables[seq] = Some(table);
        Ok(())
        // ANCHOR_END: yours_reserve
    }
    // ANCHOR_END: reserve

    fn store(&mut self, layer: usize, seq: usize, pos: usize, k: &[f32], v: &[f32]) {
        let t = self.tables[seq].as_ref().expect("reserved");
        let o = self.offset(
            t.blocks[pos / self.block_size],
            layer,
            pos % self.block_size,
        );
        self.k.write(o, k);
        self.v.write(o, v);
    }

    fn view(&self, layer: usize, seq: usize) -> PagedView<'_> {
        let blocks = self.table(seq).map_or(&[][..], |t| &t.blocks[..]);
        PagedView {
            cache: self,
            blocks,
            layer,
        }
    }
}
