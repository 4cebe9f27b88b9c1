//! [`MemoryStats`]: the process's memory, read from Linux's `/proc/self/status` by
//! [`memory_stats`].

/// The process's memory as Linux reports it in `/proc/self/status`, in KiB.
#[derive(Debug, Clone, Copy, Default)]
pub struct MemoryStats {
    /// Peak resident set size (`VmHWM`).
    pub peak_rss: u64,
    /// Resident now (`VmRSS`) = anonymous + file-backed + shared memory.
    pub rss: u64,
    /// Resident private memory (`RssAnon`): heap, stacks, the KV cache, a read-in model.
    pub rss_anon: u64,
    /// Resident pages of mapped files (`RssFile`): a mapped model, shared with the page cache.
    pub rss_file: u64,
}

/// This process's [`MemoryStats`]; `None` where `/proc/self/status` does not exist.
pub fn memory_stats() -> Option<MemoryStats> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    };
    Some(MemoryStats {
        peak_rss: kib("VmHWM")?,
        rss: kib("VmRSS")?,
        rss_anon: kib("RssAnon")?,
        rss_file: kib("RssFile")?,
    })
}
