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
//! - [`session`]: a [`Session`](ch04::Session) that feeds only new tokens, with chunked prefill.
//!
//! Both caches implement chapter 3's [`KvStore`](ch04::ch03::KvStore) trait, so the forward pass
//! of chapter 4 runs on them unchanged.

pub mod contiguous;
pub mod paged;
pub mod session;

pub use contiguous::{ContiguousCache, Overflow};
pub use paged::{BlockAllocator, BlockId, BlockTable, PagedCache};
pub use session::Cached;

/// Floats in each of a cache's K and V buffers: the product of `dims`, checked for overflow and
/// against the machine's memory (both buffers counted) before anything is allocated.
pub(crate) fn kv_floats(what: &str, dims: &[(&str, usize)]) -> Result<usize, ch04::KvError> {
    let mut factors: Vec<(&str, u64)> = dims.iter().map(|&(n, v)| (n, v as u64)).collect();
    factors.extend([("K and V", 2), ("bytes", size_of::<f32>() as u64)]);
    let bytes = shared::memory::checked_bytes(what, &factors)
        .map_err(|e| ch04::KvError::Other(e.to_string()))?;
    Ok((bytes / 2 / size_of::<f32>() as u64) as usize)
}

/// Everything earlier chapters offer, so `ch05` reads as "the engine as of chapter 5".
pub use ch04::{self, *};
