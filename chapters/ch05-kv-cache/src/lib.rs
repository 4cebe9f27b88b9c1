//! Chapter 5: the KV cache — stop recomputing the past.
//!
//! Chapter 4 recomputed every earlier token's keys and values for each new token: O(n²) work
//! for n tokens. Keys and values of a position never change once computed (a token only attends
//! to the past), so we keep them. What this chapter adds:
//! - [`contiguous`]: a preallocated per-layer cache for one sequence, with a clear error when
//!   it is full, or an explicit sliding window ([`Overflow`]).
//! - [`paged`]: a paged cache — fixed-size blocks, a block table per sequence, an allocator with
//!   a free list and reference counts, copy-free sharing of a common prefix. Chapter 7 batches
//!   many sequences on it.
//! - [`rows`]: what the caches keep keys and values in — f32, or f16 at half the memory
//!   ([`CacheTypes`]).
//! - [`session`]: a [`Session`](ch04::Session) that feeds only new tokens, with chunked prefill.
//!
//! Both caches implement chapter 3's [`KvStore`](ch03::KvStore) trait, so the forward pass
//! of chapter 4 runs on them unchanged.

pub mod contiguous;
pub mod paged;
pub mod rows;
pub mod session;

pub use contiguous::{ContiguousCache, Overflow};
pub use paged::{BlockAllocator, BlockId, BlockTable, PagedCache};
pub use rows::{CacheTypes, RowType};
pub use session::Cached;
