//! Sizes checked before they are allocated.
//!
//! A model file states its own sizes: layers, widths, context length. A hostile or mistaken
//! file (or flag) can make their product enormous, and `vec![0.0; n]` with an enormous `n`
//! aborts the process with `memory allocation of … bytes failed`. [`checked_bytes`] multiplies
//! the factors without overflow and compares the product with the machine's memory first, so
//! the caller can refuse with an error that names what was asked for.

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
