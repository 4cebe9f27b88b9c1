//! Tests whose subject needs an instruction set (chapter 8's SIMD kernels): [`require`] says
//! whether such a test can run here, and a missing set is a failure, not a quiet pass.
//!
//! A test asks for a set by chapter 8's name (`Isa::name`: `avx2`, `avx512`, `avx512vnni`,
//! `neon`, `neondotprod`) with the CPU features it lacks (`Isa::missing_features`). Where the
//! CPU has the set, the test runs. Where a set this architecture is expected to have is missing,
//! the test fails with a message naming it, unless [`ALLOW_MISSING_ISA`] is set: then it says
//! on the terminal what was not covered and returns. The switch is chapter 9's
//! `LLM_RS_REQUIRE_GPU` turned around: strict by default, because CI's machine has every x86-64
//! set, and a pass on a machine without one would claim kernels that never ran.

use std::io::Write;
use std::sync::Mutex;

/// Set (to anything but `0`) where a missing instruction set may leave its tests uncovered: on
/// a machine without AVX-512, say. Each test then prints what it did not cover.
pub const ALLOW_MISSING_ISA: &str = "LLM_RS_ALLOW_MISSING_ISA";

/// Chapter 8's SIMD sets of this architecture, and whether a CPU that runs the tests is
/// expected to have each. On x86-64 all of them: CI's machine has AVX-512 VNNI. On AArch64
/// NEON, which every AArch64 CPU has; the dot-product extension is newer, and
/// `scripts/test-neon` checks itself that its emulated CPU has it.
#[cfg(target_arch = "x86_64")]
const SETS: &[(&str, bool)] = &[("avx2", true), ("avx512", true), ("avx512vnni", true)];
#[cfg(target_arch = "aarch64")]
const SETS: &[(&str, bool)] = &[("neon", true), ("neondotprod", false)];
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const SETS: &[(&str, bool)] = &[];

/// Whether `set` is one of this architecture's SIMD sets (a test of "every set" covers these).
pub fn is_native(set: &str) -> bool {
    SETS.iter().any(|&(s, _)| s == set)
}

/// Whether a test whose subject needs the instruction set `set`, which lacks the CPU features
/// `missing` here (none: the CPU has it), can run. A set this architecture is expected to have
/// and the CPU lacks fails the test, unless [`ALLOW_MISSING_ISA`] is set; a set the CPU need
/// not have (another architecture's, an optional one, or any under Miri, whose CPU reports
/// only what the build enables) is a note. Either way the note says what was not covered.
pub fn require(set: &str, missing: &[&str]) -> bool {
    if missing.is_empty() {
        return true;
    }
    let expected = !cfg!(miri) && SETS.iter().any(|&(s, e)| s == set && e);
    uncovered(set, &format!("lacks {}", missing.join(", ")), expected);
    false
}

/// Whether a test of every set this CPU has found any (`count`): none means the test cannot
/// run anything, which fails as a missing expected set does ([`require`]), except where this
/// architecture has no set it is expected to have, or under Miri.
pub fn require_any(what: &str, count: usize) -> bool {
    if count > 0 {
        return true;
    }
    let expected = !cfg!(miri) && SETS.iter().any(|&(_, e)| e);
    uncovered(what, "has none", expected);
    false
}

/// Fails for a set that was `expected` unless [`ALLOW_MISSING_ISA`] is set; otherwise says once
/// per process that `set` was not covered, and why.
fn uncovered(set: &str, why: &str, expected: bool) {
    let allowed = std::env::var(ALLOW_MISSING_ISA).is_ok_and(|v| !v.is_empty() && v != "0");
    let note = verdict(set, why, expected, allowed).unwrap_or_else(|failure| panic!("{failure}"));
    static SAID: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut said = SAID.lock().unwrap_or_else(|e| e.into_inner());
    if !said.iter().any(|s| s == set) {
        said.push(set.to_string());
        // Past the test harness's capture, so that it shows in a plain `cargo test`.
        let _ = writeln!(std::io::stderr(), "{note}");
    }
}

/// The note to print for an uncovered `set`, or the failure where it was `expected` and
/// missing sets are not `allowed`.
fn verdict(set: &str, why: &str, expected: bool, allowed: bool) -> Result<String, String> {
    let reason = match (expected, allowed) {
        (true, false) => {
            return Err(format!(
                "{set} cannot be tested: this CPU {why} (set {ALLOW_MISSING_ISA}=1 to leave it \
                 uncovered on this machine)"
            ));
        }
        (true, true) => format!("{ALLOW_MISSING_ISA} is set"),
        (false, _) if cfg!(miri) => "not expected under Miri".to_string(),
        (false, _) => "not expected on this architecture".to_string(),
    };
    Ok(format!(
        "not covered on this CPU: {set} (the CPU {why}; {reason})"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_the_cpu_has_runs() {
        assert!(require("avx512vnni", &[]));
        assert!(require_any("kernel sets", 1));
    }

    #[test]
    fn a_missing_expected_set_fails_unless_allowed() {
        let failure = verdict("avx512vnni", "lacks avx512vnni", true, false).unwrap_err();
        assert!(
            failure.contains("avx512vnni") && failure.contains(ALLOW_MISSING_ISA),
            "{failure}"
        );
        let note = verdict("avx512vnni", "lacks avx512vnni", true, true).unwrap();
        assert!(
            note.starts_with("not covered on this CPU: avx512vnni"),
            "{note}"
        );
        // A set no CPU here is expected to have is a note even in the strict default.
        let note = verdict("sse9", "lacks sse9", false, false).unwrap();
        assert!(
            note.contains("sse9") && note.contains("not expected"),
            "{note}"
        );
        assert!(!require("sse9", &["sse9"]));
    }
}
