//! Sizes checked before they are allocated.
//!
//! A model file states its own sizes: layers, widths, context length. A hostile or mistaken
//! file (or flag) can make their product enormous, and `vec![0.0; n]` with an enormous `n`
//! aborts the process with `memory allocation of … bytes failed`. [`checked_bytes`] multiplies
//! the factors without overflow and compares the product with the machine's memory first, so
//! the caller can refuse with an error that names what was asked for.
//!
//! Large buffers that are read over and over (packed weights, the KV cache) can also ask to be
//! backed by 2 MiB pages ([`advise_huge_pages`]).

use std::fmt;

/// A size that overflows, or that the machine cannot hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooLarge {
    /// What would have been allocated: "the KV cache for --ctx 1000000".
    pub what: String,
    /// The factors, as `name × name × …` with their values.
    pub formula: String,
    /// The product in bytes, `None` if it overflows 64 bits.
    pub bytes: Option<u64>,
    /// The limit it was checked against.
    pub limit: u64,
}

impl fmt::Display for TooLarge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Self {
            what,
            formula,
            bytes,
            limit,
        } = self;
        match bytes {
            Some(b) => write!(
                f,
                "{what} needs {b} bytes ({formula}), more than the {limit} bytes of memory this \
                 machine has"
            ),
            None => write!(f, "{what} needs more than 2^64 bytes ({formula})"),
        }
    }
}

impl std::error::Error for TooLarge {}

/// Bytes of physical memory: `MemTotal` of `/proc/meminfo` on Linux; elsewhere, or when it
/// cannot be read, the most a Rust allocation may take (`isize::MAX`).
pub fn memory_limit() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            kib.checked_mul(1024)
        })
        .unwrap_or(isize::MAX as u64)
        .min(isize::MAX as u64)
}

/// The product of `factors` (`(name, value)` pairs; the last is usually the element size in
/// bytes), checked for overflow and against [`memory_limit`].
pub fn checked_bytes(what: &str, factors: &[(&str, u64)]) -> Result<u64, TooLarge> {
    let bytes = factors
        .iter()
        .try_fold(1u64, |acc, &(_, v)| acc.checked_mul(v));
    let limit = memory_limit();
    match bytes {
        Some(b) if b <= limit => Ok(b),
        bytes => Err(TooLarge {
            what: what.to_string(),
            formula: factors
                .iter()
                .map(|(name, v)| format!("{name} {v}"))
                .collect::<Vec<_>>()
                .join(" × "),
            bytes,
            limit,
        }),
    }
}

/// Buffers at least this large are worth huge pages: one 2 MiB page.
pub const HUGE_PAGE: usize = 2 << 20;

/// Advise the kernel to back the whole pages of `region` with 2 MiB pages (Linux's transparent
/// huge pages in `madvise` mode): one TLB entry then covers 2 MiB instead of 4 KiB, and a loop
/// that streams the buffer stops missing the TLB every 64 lines. Call it before the pages are
/// first written (a fresh `vec![0; n]` of this size is not touched yet, nor is a `Vec`'s spare
/// capacity), so that they are huge from the start. Regions under [`HUGE_PAGE`] are left
/// alone; elsewhere than Linux, or where the kernel says no, nothing changes.
pub fn advise_huge_pages<T>(region: &mut [T]) {
    let len = std::mem::size_of_val(region);
    #[cfg(target_os = "linux")]
    if len >= HUGE_PAGE {
        // The whole pages inside the region: `madvise` takes page-aligned ranges, and pages
        // shared with other allocations are not ours to advise.
        let page = 4096;
        let start = (region.as_mut_ptr() as usize).next_multiple_of(page);
        let end = (region.as_mut_ptr() as usize + len) / page * page;
        if end > start {
            // SAFETY: `[start, end)` lies inside `region`, which the caller lends us mutably.
            // MADV_HUGEPAGE changes how the kernel backs the pages, never their contents; if it
            // fails (a kernel without THP) nothing changed.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = len;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_sizes_pass_and_huge_ones_are_named() {
        assert_eq!(checked_bytes("x", &[("a", 3), ("b", 4)]), Ok(12));
        let e = checked_bytes("the cache", &[("positions", 1 << 40), ("bytes", 1 << 30)]);
        let e = e.unwrap_err();
        assert_eq!(e.bytes, None);
        assert!(e.to_string().contains("the cache"), "{e}");
        let e = checked_bytes("the cache", &[("positions", 1 << 40), ("bytes", 1 << 20)]);
        let e = e.unwrap_err();
        assert_eq!(e.bytes, Some(1 << 60));
        assert!(
            e.to_string()
                .contains("positions 1099511627776 × bytes 1048576"),
            "{e}"
        );
    }
}
